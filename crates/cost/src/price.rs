//! A price per hour with its currency: `price_per_hour = 0.34` (with `currency`, default USD)
//! or `price_per_hour = "0.34 EUR"`.

use std::fmt;

/// What one instance of a shape costs per hour.
#[derive(Debug, Clone, PartialEq)]
pub struct Price {
    /// Amount per hour, finite and not negative.
    pub per_hour: f64,
    /// ISO 4217 code, upper case (`USD`).
    pub currency: String,
}

/// Why a price cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    /// Negative, infinite or not a number.
    #[error("{0}: expected a price of 0 or more per hour, such as 0.34 or \"0.34 EUR\"")]
    NotAPrice(String),
    /// A text price without a currency code.
    #[error(
        "{0:?}: a price written as text names its currency, such as \"0.34 EUR\"; or write the number alone"
    )]
    NoCurrency(String),
    /// A currency that is not three letters.
    #[error("{0:?}: expected a three-letter currency code such as USD or EUR")]
    BadCurrency(String),
}

/// The currency prices are in when config.toml names none.
pub const DEFAULT_CURRENCY: &str = "USD";

impl Price {
    /// A price from a number and an optional `currency` key.
    pub fn from_number(per_hour: f64, currency: Option<&str>) -> Result<Price, PriceError> {
        if !per_hour.is_finite() || per_hour < 0.0 {
            return Err(PriceError::NotAPrice(per_hour.to_string()));
        }
        Ok(Price {
            per_hour,
            currency: currency_code(currency.unwrap_or(DEFAULT_CURRENCY))?,
        })
    }

    /// A price from text: `"0.34 EUR"`.
    pub fn parse(text: &str) -> Result<Price, PriceError> {
        let mut parts = text.split_whitespace();
        let (Some(amount), currency, None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(PriceError::NotAPrice(format!("{text:?}")));
        };
        let per_hour: f64 = amount
            .parse()
            .map_err(|_| PriceError::NotAPrice(format!("{text:?}")))?;
        let Some(currency) = currency else {
            return Err(PriceError::NoCurrency(text.to_owned()));
        };
        Price::from_number(per_hour, Some(currency))
    }

    /// Per second.
    pub fn per_second(&self) -> f64 {
        self.per_hour / 3600.0
    }
}

fn currency_code(c: &str) -> Result<String, PriceError> {
    if c.len() == 3 && c.chars().all(|ch| ch.is_ascii_alphabetic()) {
        Ok(c.to_ascii_uppercase())
    } else {
        Err(PriceError::BadCurrency(c.to_owned()))
    }
}

impl fmt::Display for Price {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/h", Money::new(self.per_hour, &self.currency))
    }
}

/// An amount in a currency, shown with enough digits for a job's few cents.
#[derive(Debug, Clone, PartialEq)]
pub struct Money {
    /// The amount.
    pub amount: f64,
    /// ISO 4217 code.
    pub currency: String,
}

impl Money {
    /// `amount` of `currency`.
    pub fn new(amount: f64, currency: &str) -> Money {
        Money {
            amount,
            currency: currency.to_owned(),
        }
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Cents for amounts of a unit or more; four decimals below, where jobs' costs live.
        if self.amount.abs() >= 1.0 {
            write!(f, "{:.2} {}", self.amount, self.currency)
        } else {
            write!(f, "{:.4} {}", self.amount, self.currency)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_take_the_currency_key_and_text_names_its_own() {
        assert_eq!(
            Price::from_number(0.34, None).unwrap(),
            Price {
                per_hour: 0.34,
                currency: "USD".into()
            }
        );
        assert_eq!(
            Price::from_number(1.5, Some("eur")).unwrap().currency,
            "EUR"
        );
        let p = Price::parse("0.0928 EUR").unwrap();
        assert_eq!((p.per_hour, p.currency.as_str()), (0.0928, "EUR"));
        assert_eq!(p.to_string(), "0.0928 EUR/h");
        assert!((p.per_second() - 0.0928 / 3600.0).abs() < 1e-12);
        assert_eq!(Price::from_number(0.0, None).unwrap().per_hour, 0.0);
    }

    #[test]
    fn bad_prices_say_what_was_expected() {
        let e = Price::from_number(-1.0, None).unwrap_err().to_string();
        assert!(e.contains("-1: expected a price of 0 or more"), "{e}");
        assert!(Price::from_number(f64::NAN, None).is_err());
        let e = Price::parse("0.34").unwrap_err().to_string();
        assert!(e.contains("names its currency"), "{e}");
        let e = Price::parse("cheap USD").unwrap_err().to_string();
        assert!(e.contains("expected a price"), "{e}");
        let e = Price::parse("0.34 dollars").unwrap_err().to_string();
        assert!(e.contains("three-letter currency code"), "{e}");
        assert!(Price::parse("1 USD extra").is_err());
    }

    #[test]
    fn money_shows_cents_or_the_fractions_a_job_costs() {
        assert_eq!(Money::new(12.345, "USD").to_string(), "12.35 USD");
        assert_eq!(Money::new(0.00123, "EUR").to_string(), "0.0012 EUR");
    }
}
