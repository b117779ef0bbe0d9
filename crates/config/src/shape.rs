//! `[[runners.autoscaler.shape]]`: instance groups of different sizes, and the amounts
//! (`4`, `1.5`, `500m`, `16GiB`) they declare.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::problem::Report;

/// `[[runners.autoscaler.shape]]`: one instance group, what each instance offers and costs.
/// Keys not set here come from `[runners.autoscaler]`; `plugin_config` is merged over it.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ShapeConfig {
    /// Name, unique within the runner.
    pub name: String,
    /// CPUs of one instance (`4`, `1.5`, `500m`).
    pub cpu: Option<Amount>,
    /// Memory of one instance (`16GiB`, `512Mi`, bytes).
    pub memory: Option<Amount>,
    /// GPUs of one instance.
    pub gpu: u32,
    /// Relative cost of one instance per hour, to place jobs on the cheapest shape that fits
    /// (default: `price_per_hour`, else 1).
    pub cost: Option<f64>,
    /// What one instance costs per hour: `0.34` (in the runner's `currency`) or `"0.34 EUR"`.
    /// Without it the shape's costs are unknown.
    pub price_per_hour: Option<crate::PriceValue>,
    /// Overrides `capacity_per_instance`.
    pub capacity_per_instance: Option<u32>,
    /// Overrides `max_instances`.
    pub max_instances: Option<u32>,
    /// Overrides `max_use_count`.
    pub max_use_count: Option<u32>,
    /// Merged over the runner's `plugin_config` (e.g. another instance type).
    pub plugin_config: toml::Table,
    /// Spot (preemptible) capacity: shown as such, and expected to be refused at times.
    pub spot: bool,
    /// Another shape that takes this one's new capacity while its provider refuses new
    /// instances for lack of capacity.
    pub fallback: Option<String>,
    /// Refusals for this long send new capacity to `fallback` (default 1m).
    #[serde(with = "crate::de::duration")]
    pub fallback_after: Duration,
    /// No refusal for this long brings new capacity back from `fallback` (default 10m).
    #[serde(with = "crate::de::duration")]
    pub return_after: Duration,
}

impl Default for ShapeConfig {
    fn default() -> Self {
        ShapeConfig {
            name: String::new(),
            cpu: None,
            memory: None,
            gpu: 0,
            cost: None,
            price_per_hour: None,
            capacity_per_instance: None,
            max_instances: None,
            max_use_count: None,
            plugin_config: toml::Table::new(),
            spot: false,
            fallback: None,
            fallback_after: Duration::from_secs(60),
            return_after: Duration::from_secs(600),
        }
    }
}

/// A resource amount written as a number or a string with a unit.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Amount {
    /// `4`.
    Int(i64),
    /// `1.5`.
    Float(f64),
    /// `500m`, `16GiB`.
    Text(String),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Int(v) => write!(f, "{v}"),
            Amount::Float(v) => write!(f, "{v}"),
            Amount::Text(v) => write!(f, "{v}"),
        }
    }
}

impl ShapeConfig {
    /// What one instance offers, or the key and the problem.
    pub fn resources(&self) -> Result<slipway_taskscaler::Resources, (&'static str, String)> {
        use slipway_taskscaler::Resources;
        let cpu = match &self.cpu {
            Some(a) => Resources::parse_cpu(&a.to_string()).map_err(|e| ("cpu", e.to_string()))?,
            None => 0,
        };
        let memory = match &self.memory {
            Some(Amount::Text(t)) => {
                Resources::parse_memory(t).map_err(|e| ("memory", e.to_string()))?
            }
            // A bare number of memory is ambiguous (bytes? GiB?): ask for a unit.
            Some(a) => {
                return Err((
                    "memory",
                    format!("{a}: expected an amount with a unit, such as \"16GiB\" or \"512Mi\""),
                ));
            }
            None => 0,
        };
        Ok(Resources {
            cpu_millis: cpu,
            memory_bytes: memory,
            gpus: self.gpu,
        })
    }
}

/// Every shape named once, declaring what it offers at a positive cost, with a fallback that
/// is another shape without one of its own (`report` is at `[runners.autoscaler]`; a job waits
/// for a slot up to `acquire_timeout`).
pub(crate) fn validate(shapes: &[ShapeConfig], acquire_timeout: Duration, report: &mut Report<'_>) {
    let mut names = HashSet::new();
    for (j, shape) in shapes.iter().enumerate() {
        let Some(to) = &shape.fallback else { continue };
        let mut at = report.element("shape", j);
        match shapes.iter().find(|s| s.name == *to) {
            None => at.error(
                &["fallback"],
                format!(
                    "{to:?} is not a shape of this runner; expected one of {}",
                    crate::problem::quoted(
                        &shapes
                            .iter()
                            .filter(|s| s.name != shape.name)
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                    )
                ),
            ),
            Some(_) if *to == shape.name => {
                at.error(&["fallback"], "a shape cannot fall back to itself")
            }
            Some(other) if other.fallback.is_some() => at.error(
                &["fallback"],
                format!("shape {to:?} has a fallback of its own; a fallback shape must not"),
            ),
            Some(_) => {}
        }
        if shape.fallback_after.is_zero() {
            at.error(&["fallback_after"], "must be longer than 0s");
        } else if shape.fallback_after >= acquire_timeout {
            at.warning(
                &["fallback_after"],
                format!(
                    "{:?} is not shorter than instance_acquire_timeout ({acquire_timeout:?}): a \
                     job waiting on this shape times out before it can move to the fallback",
                    shape.fallback_after
                ),
            );
        }
        if shape.return_after.is_zero() {
            at.error(&["return_after"], "must be longer than 0s");
        }
    }
    for (j, shape) in shapes.iter().enumerate() {
        let mut at = report.element("shape", j);
        if shape.name.trim().is_empty() {
            at.error(&["name"], "missing; every shape needs a name");
        } else if !names.insert(shape.name.as_str()) {
            at.error(&["name"], format!("shape {:?} is named twice", shape.name));
        }
        match shape.resources() {
            Err((field, message)) => at.error(&[field], message),
            Ok(r) if r.is_empty() => at.error(
                &["cpu"],
                "a shape must declare what one instance offers: cpu, memory or gpu",
            ),
            Ok(_) => {}
        }
        if shape.cost.is_some_and(|c| !c.is_finite() || c <= 0.0) {
            at.error(&["cost"], "must be a positive number");
        }
        if shape.capacity_per_instance == Some(0) {
            at.error(&["capacity_per_instance"], "must be at least 1");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::check::parse;
    use crate::testing::{GOOD, errors};

    #[test]
    fn shapes_declare_resources_and_override_keys() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "small"
      cpu = 2
      memory = "4GiB"
      cost = 1.0
    [[runners.autoscaler.shape]]
      name = "gpu"
      cpu = "8"
      memory = "32GiB"
      gpu = 1
      cost = 6.5
      capacity_per_instance = 1
      [runners.autoscaler.shape.plugin_config]
        instance_type = "g5.2xlarge"
"#
        );
        let loaded = parse(&text, "config.toml").expect("valid");
        let a = loaded.config.runners[0]
            .autoscaler
            .as_ref()
            .expect("autoscaler");
        assert_eq!(a.shape.len(), 2);
        let gpu = a.shape[1].resources().expect("resources");
        assert_eq!(gpu.cpu_millis, 8000);
        assert_eq!(gpu.memory_bytes, 32 << 30);
        assert_eq!(gpu.gpus, 1);
        assert_eq!(a.shape[1].capacity_per_instance, Some(1));
        assert_eq!(
            a.shape[1].plugin_config["instance_type"].as_str(),
            Some("g5.2xlarge")
        );
    }

    #[test]
    fn bad_shapes_name_the_shape_key_and_line() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "a"
      cpu = "lots"
    [[runners.autoscaler.shape]]
      name = "a"
      memory = 16
"#
        );
        let e = errors(&text);
        assert!(
            e.iter().any(|l| l.starts_with(
                "config.toml:22: runners[0].autoscaler.shape[0].cpu: cpu \"lots\": expected"
            )),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.starts_with(
                "config.toml:24: runners[0].autoscaler.shape[1].name: shape \"a\" is named twice"
            )),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.contains("shape[1].memory: 16: expected an amount with a unit")),
            "{e:?}"
        );
    }

    #[test]
    fn a_spot_shape_falls_back_to_another_shape() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "spot"
      cpu = 2
      spot = true
      fallback = "on-demand"
      fallback_after = "20s"
    [[runners.autoscaler.shape]]
      name = "on-demand"
      cpu = 2
"#
        );
        let loaded = parse(&text, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let a = loaded.config.runners[0]
            .autoscaler
            .as_ref()
            .expect("autoscaler");
        assert!(a.shape[0].spot);
        assert_eq!(a.shape[0].fallback.as_deref(), Some("on-demand"));
        assert_eq!(
            a.shape[0].fallback_after,
            std::time::Duration::from_secs(20)
        );
        assert_eq!(a.shape[0].return_after, std::time::Duration::from_secs(600));
        assert!(!a.shape[1].spot && a.shape[1].fallback.is_none());
    }

    #[test]
    fn bad_fallbacks_name_the_shape_and_what_was_expected() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "spot"
      cpu = 2
      fallback = "ondemand"
      return_after = "0s"
    [[runners.autoscaler.shape]]
      name = "self"
      cpu = 2
      fallback = "self"
    [[runners.autoscaler.shape]]
      name = "chain"
      cpu = 2
      fallback = "spot"
"#
        );
        let e = errors(&text);
        let has = |s: &str| e.iter().any(|l| l.contains(s));
        assert!(
            has(
                "shape[0].fallback: \"ondemand\" is not a shape of this runner; expected one of \"self\", \"chain\""
            ),
            "{e:?}"
        );
        assert!(
            has("shape[0].return_after: must be longer than 0s"),
            "{e:?}"
        );
        assert!(
            has("shape[1].fallback: a shape cannot fall back to itself"),
            "{e:?}"
        );
        assert!(
            has("shape[2].fallback: shape \"spot\" has a fallback of its own"),
            "{e:?}"
        );
    }

    #[test]
    fn a_fallback_after_beyond_the_acquire_timeout_is_a_warning() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "spot"
      cpu = 2
      fallback = "on-demand"
      fallback_after = "5m"
    [[runners.autoscaler.shape]]
      name = "on-demand"
      cpu = 2
"#
        );
        let loaded = parse(&text, "config.toml").expect("valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert!(
            w.iter().any(|l| l.contains(
                "shape[0].fallback_after: 300s is not shorter than instance_acquire_timeout (60s)"
            )),
            "{w:?}"
        );
    }
}
