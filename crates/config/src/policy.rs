//! `[[runners.autoscaler.policy]]`: when to keep how much idle capacity.

use std::time::Duration;

use serde::Deserialize;

use crate::problem::Report;

/// `[[runners.autoscaler.policy]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    /// 5-field cron expressions marking when the policy applies.
    pub periods: Vec<String>,
    /// IANA time zone of `periods` (GitLab: the system's; here empty = UTC).
    pub timezone: String,
    /// Target idle slots.
    pub idle_count: u32,
    /// How long an instance may stay idle.
    #[serde(with = "crate::de::duration")]
    pub idle_time: Duration,
    /// Extra idle capacity as a multiple of in-use capacity.
    pub scale_factor: f64,
    /// Cap on what `scale_factor` yields.
    pub scale_factor_limit: u32,
    /// Request jobs only with confirmed idle capacity (default: `idle_count > 0`).
    pub preemptive_mode: Option<bool>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            periods: vec!["* * * * *".into()],
            timezone: String::new(),
            idle_count: 0,
            idle_time: Duration::ZERO,
            scale_factor: 0.0,
            scale_factor_limit: 0,
            preemptive_mode: None,
        }
    }
}

impl PolicyConfig {
    /// As the taskscaler's policy.
    pub fn to_policy(&self) -> slipway_taskscaler::Policy {
        slipway_taskscaler::Policy {
            periods: self.periods.clone(),
            timezone: self.timezone.clone(),
            idle_count: self.idle_count,
            idle_time: self.idle_time,
            scale_factor: self.scale_factor,
            scale_factor_limit: self.scale_factor_limit,
            preemptive_mode: self.preemptive_mode,
        }
    }
}

/// The first period or time zone the taskscaler refuses, then every negative `scale_factor`
/// (`report` is at `[runners.autoscaler]`).
pub(crate) fn validate(policies: &[PolicyConfig], report: &mut Report<'_>) {
    use slipway_taskscaler::policy::PolicyError;
    let compiled: Vec<slipway_taskscaler::Policy> =
        policies.iter().map(PolicyConfig::to_policy).collect();
    if let Err(e) = slipway_taskscaler::policy::compile(&compiled) {
        let (index, field) = match &e {
            PolicyError::Period { index, .. } => (*index, "periods"),
            PolicyError::Timezone { index, .. } => (*index, "timezone"),
        };
        // The taskscaler's message names the policy; the key path does here.
        let message = e.to_string();
        let message = message
            .split_once(": ")
            .map_or(message.as_str(), |(_, m)| m)
            .to_string();
        report.element("policy", index).error(&[field], message);
    }
    for (j, p) in policies.iter().enumerate() {
        if p.scale_factor < 0.0 || !p.scale_factor.is_finite() {
            report
                .element("policy", j)
                .error(&["scale_factor"], "must be a number of 0 or more");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{GOOD, errors};

    #[test]
    fn bad_policy_period_names_policy_line_and_value() {
        let text = GOOD.replace(
            "idle_count = 1\n",
            "idle_count = 1\n      periods = [\"* 25 * * *\"]\n",
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:18: runners[0].autoscaler.policy[0].periods: "),
            "{e:?}"
        );
        assert!(e[0].contains("\"* 25 * * *\""), "{e:?}");
    }
}
