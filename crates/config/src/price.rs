//! `price_per_hour` as config.toml writes it: a number (in `currency`, default USD) or text with
//! its currency (`"0.34 EUR"`).

use serde::Deserialize;
use slipway_cost::{Price, PriceError};

use crate::problem::Report;

/// A price per hour as written.
#[derive(Debug, Clone, PartialEq)]
pub enum PriceValue {
    /// `0.34`.
    Float(f64),
    /// `1`.
    Int(i64),
    /// `"0.34 EUR"`.
    Text(String),
}

impl<'de> Deserialize<'de> for PriceValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Float(f64),
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Float(v)) => Ok(PriceValue::Float(v)),
            Ok(Raw::Int(v)) => Ok(PriceValue::Int(v)),
            Ok(Raw::Text(t)) => Ok(PriceValue::Text(t)),
            Err(_) => Err(serde::de::Error::custom(
                "expected a price per hour such as 0.34 or \"0.34 EUR\"",
            )),
        }
    }
}

impl PriceValue {
    /// The price, a number taking `currency` (default USD).
    pub fn price(&self, currency: Option<&str>) -> Result<Price, PriceError> {
        match self {
            PriceValue::Float(v) => Price::from_number(*v, currency),
            // Prices are small numbers: the conversion is exact.
            #[allow(clippy::cast_precision_loss)]
            PriceValue::Int(v) => Price::from_number(*v as f64, currency),
            PriceValue::Text(t) => Price::parse(t),
        }
    }
}

/// Check the prices of a runner's section and shapes (`report` is at `[runners.autoscaler]`):
/// each must read as a price, and all must be in one currency (their costs add up).
pub(crate) fn validate(
    own: Option<&PriceValue>,
    shapes: &[(usize, Option<&PriceValue>)],
    currency: Option<&str>,
    report: &mut Report<'_>,
) {
    if let Some(c) = currency
        && let Err(e) = Price::from_number(0.0, Some(c))
    {
        report.error(&["currency"], e.to_string());
    }
    let mut seen: Option<String> = None;
    let mut check = |price: &PriceValue, report: &mut Report<'_>, at: Option<usize>| {
        let problem = match price.price(currency) {
            Ok(p) => match &seen {
                Some(c) if *c != p.currency => Some(format!(
                    "priced in {}, another price of this runner in {c}: a runner's prices share one currency",
                    p.currency
                )),
                Some(_) => None,
                None => {
                    seen = Some(p.currency);
                    None
                }
            },
            Err(e) => Some(e.to_string()),
        };
        if let Some(problem) = problem {
            match at {
                Some(j) => report
                    .element("shape", j)
                    .error(&["price_per_hour"], problem),
                None => report.error(&["price_per_hour"], problem),
            }
        }
    };
    if let Some(p) = own {
        check(p, report, None);
    }
    for (j, p) in shapes {
        if let Some(p) = p {
            check(p, report, Some(*j));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::check::parse;
    use crate::testing::{GOOD, errors};

    /// The valid config with `keys` in `[runners.autoscaler]` (from line 10) and `shapes` after.
    fn config(keys: &str, shapes: &str) -> String {
        let good = GOOD.replace(
            "    plugin = \"local\"\n",
            &format!("    plugin = \"local\"\n{keys}"),
        );
        format!("{good}{shapes}")
    }

    #[test]
    fn prices_are_read_per_runner_and_shape() {
        let text = config(
            "    price_per_hour = 0.1\n    currency = \"eur\"\n    billing_minimum = \"30s\"\n",
            r#"
    [[runners.autoscaler.shape]]
      name = "small"
      cpu = 2
      price_per_hour = "0.0928 EUR"
    [[runners.autoscaler.shape]]
      name = "large"
      cpu = 8
"#,
        );
        let loaded = parse(&text, "config.toml").expect("valid");
        let a = loaded.config.runners[0]
            .autoscaler
            .as_ref()
            .expect("autoscaler");
        let own = a
            .price_per_hour
            .as_ref()
            .unwrap()
            .price(a.currency.as_deref())
            .unwrap();
        assert_eq!((own.per_hour, own.currency.as_str()), (0.1, "EUR"));
        let small = a.shape[0]
            .price_per_hour
            .as_ref()
            .unwrap()
            .price(None)
            .unwrap();
        assert_eq!(small.per_hour, 0.0928);
        assert!(
            a.shape[1].price_per_hour.is_none(),
            "unpriced: unknown, not zero"
        );
        assert_eq!(a.billing_minimum, std::time::Duration::from_secs(30));
    }

    #[test]
    fn bad_prices_name_the_key_and_line() {
        let text = config(
            "    price_per_hour = -0.5\n    currency = \"dollars\"\n",
            r#"
    [[runners.autoscaler.shape]]
      name = "a"
      cpu = 2
      price_per_hour = "0.34"
    [[runners.autoscaler.shape]]
      name = "b"
      cpu = 2
      price_per_hour = "0.34 GBP"
    [[runners.autoscaler.shape]]
      name = "c"
      cpu = 2
      price_per_hour = true
"#,
        );
        let e = errors(&text);
        let has = |s: &str| e.iter().any(|l| l.contains(s));
        assert!(
            has("config.toml:10: runners[0].autoscaler.price_per_hour: -0.5: expected a price"),
            "{e:?}"
        );
        assert!(
            has("autoscaler.currency: \"dollars\": expected a three-letter currency code"),
            "{e:?}"
        );
        assert!(
            has("shape[0].price_per_hour: \"0.34\": a price written as text names its currency"),
            "{e:?}"
        );
        assert!(
            has("shape[2].price_per_hour: expected a price per hour such as 0.34"),
            "{e:?}"
        );
    }

    #[test]
    fn a_runners_prices_share_one_currency() {
        let text = config(
            "    price_per_hour = 0.1\n",
            r#"
    [[runners.autoscaler.shape]]
      name = "a"
      cpu = 2
      price_per_hour = "0.34 EUR"
"#,
        );
        let e = errors(&text);
        assert!(
            e.iter().any(|l| l.contains(
                "shape[0].price_per_hour: priced in EUR, another price of this runner in USD"
            )),
            "{e:?}"
        );
    }
}
