//! `[[runners.autoscaler.policy]]`: idle capacity targets that apply during cron periods.
//!
//! Each policy marks time ranges with 5-field cron expressions in a time zone; the last policy
//! whose periods match the current minute wins, as in GitLab. With none matching, no idle
//! capacity is kept.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Timelike, Utc};
use croner::Cron;

/// One policy, as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// 5-field cron expressions; a policy is active in any minute one of them matches.
    pub periods: Vec<String>,
    /// IANA time zone of `periods` (empty = UTC).
    pub timezone: String,
    /// Target idle capacity in job slots.
    pub idle_count: u32,
    /// How long an instance may stay idle before removal.
    pub idle_time: Duration,
    /// Extra idle capacity as a multiple of in-use capacity.
    pub scale_factor: f64,
    /// Cap on what `scale_factor` yields (0 = no cap).
    pub scale_factor_limit: u32,
    /// Ask for jobs only with confirmed idle capacity; unset = `idle_count > 0`.
    pub preemptive_mode: Option<bool>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            periods: vec!["* * * * *".into()],
            timezone: String::new(),
            idle_count: 0,
            idle_time: Duration::from_secs(0),
            scale_factor: 0.0,
            scale_factor_limit: 0,
            preemptive_mode: None,
        }
    }
}

impl Policy {
    /// Whether jobs are requested only when idle capacity is confirmed (GitLab's rule).
    pub fn preemptive(&self) -> bool {
        self.preemptive_mode.unwrap_or(self.idle_count > 0)
    }

    /// Idle slots to keep given `in_use` acquired slots (GitLab's formula).
    pub fn idle_target(&self, in_use: u32) -> u32 {
        if self.scale_factor <= 0.0 {
            return self.idle_count;
        }
        let scaled = (self.scale_factor * f64::from(in_use)).ceil();
        // Float to int: clamp first so the cast cannot wrap.
        let mut target = scaled.clamp(0.0, f64::from(u32::MAX)) as u32;
        if self.scale_factor_limit > 0 {
            target = target.min(self.scale_factor_limit);
        }
        target.max(self.idle_count)
    }
}

/// A policy's periods, parsed once.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// The policy.
    pub policy: Policy,
    crons: Vec<Cron>,
    tz: chrono_tz::Tz,
}

/// A period or time zone that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A cron expression did not parse.
    #[error("policy {index}: period {period:?} is not a 5-field cron expression: {message}")]
    Period {
        /// Index of the policy.
        index: usize,
        /// The expression.
        period: String,
        /// Parser message.
        message: String,
    },
    /// Unknown time zone name.
    #[error(
        "policy {index}: unknown time zone {timezone:?} (expected an IANA name such as \"Europe/Berlin\")"
    )]
    Timezone {
        /// Index of the policy.
        index: usize,
        /// The name.
        timezone: String,
    },
}

/// Parse every policy's periods and time zone; errors name the policy and the bad value.
pub fn compile(policies: &[Policy]) -> Result<Vec<CompiledPolicy>, PolicyError> {
    policies
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let tz = if p.timezone.is_empty() {
                chrono_tz::UTC
            } else {
                p.timezone.parse().map_err(|_| PolicyError::Timezone {
                    index,
                    timezone: p.timezone.clone(),
                })?
            };
            let crons = p
                .periods
                .iter()
                .map(|period| {
                    if period.split_whitespace().count() != 5 {
                        return Err(PolicyError::Period {
                            index,
                            period: period.clone(),
                            message:
                                "expected 5 fields: minute hour day-of-month month day-of-week"
                                    .into(),
                        });
                    }
                    period.parse::<Cron>().map_err(|e| PolicyError::Period {
                        index,
                        period: period.clone(),
                        message: e.to_string(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(CompiledPolicy {
                policy: p.clone(),
                crons,
                tz,
            })
        })
        .collect()
}

/// The policy in force at `now`: the last whose periods match, else the zero policy.
pub fn active(policies: &[CompiledPolicy], now: SystemTime) -> Policy {
    // Periods match whole minutes: croner's 5-field patterns match second 0 only.
    let utc: DateTime<Utc> = now.into();
    let utc = utc
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(utc);
    policies
        .iter()
        .rev()
        .find(|p| {
            let local = utc.with_timezone(&p.tz);
            p.crons
                .iter()
                .any(|c| c.is_time_matching(&local).unwrap_or(false))
        })
        .map(|p| p.policy.clone())
        .unwrap_or(Policy {
            periods: Vec::new(),
            ..Policy::default()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        DateTime::parse_from_rfc3339(rfc3339)
            .map(SystemTime::from)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    fn policy(periods: &[&str], tz: &str, idle: u32) -> Policy {
        Policy {
            periods: periods.iter().map(|s| s.to_string()).collect(),
            timezone: tz.into(),
            idle_count: idle,
            ..Policy::default()
        }
    }

    #[test]
    fn last_matching_policy_wins() {
        let ps = compile(&[
            policy(&["* * * * *"], "", 1),
            policy(&["* 7-19 * * mon-fri"], "", 10),
        ])
        .expect("valid");
        // Wednesday 12:00 UTC: business hours (at any second of the minute).
        assert_eq!(active(&ps, at("2026-11-18T12:00:00Z")).idle_count, 10);
        assert_eq!(active(&ps, at("2026-11-18T12:00:37Z")).idle_count, 10);
        // Wednesday 22:00: only the catch-all.
        assert_eq!(active(&ps, at("2026-11-18T22:00:00Z")).idle_count, 1);
        // Saturday noon: weekend.
        assert_eq!(active(&ps, at("2026-11-21T12:00:00Z")).idle_count, 1);
    }

    #[test]
    fn periods_are_read_in_their_time_zone() {
        let ps = compile(&[policy(&["* 9-17 * * *"], "America/New_York", 5)]).expect("valid");
        // 14:00 UTC is 09:00 in New York (EST, UTC-5).
        assert_eq!(active(&ps, at("2026-11-18T14:00:00Z")).idle_count, 5);
        // 13:00 UTC is 08:00 there: outside.
        assert_eq!(active(&ps, at("2026-11-18T13:00:00Z")).idle_count, 0);
    }

    #[test]
    fn no_match_means_no_idle_capacity() {
        let ps = compile(&[policy(&["* 7-8 * * *"], "", 3)]).expect("valid");
        assert_eq!(active(&ps, at("2026-11-18T12:00:00Z")).idle_count, 0);
    }

    #[test]
    fn bad_periods_and_zones_are_named() {
        let e = compile(&[policy(&["* * *"], "", 1)]).expect_err("3 fields");
        assert!(e.to_string().contains("\"* * *\""), "{e}");
        let e = compile(&[policy(&["* * * * *"], "Mars/Olympus", 1)]).expect_err("zone");
        assert!(e.to_string().contains("Mars/Olympus"), "{e}");
        let e = compile(&[policy(&["61 * * * *"], "", 1)]).expect_err("minute 61");
        assert!(e.to_string().contains("61"), "{e}");
    }

    #[test]
    fn scale_factor_follows_gitlabs_formula() {
        let p = Policy {
            idle_count: 2,
            scale_factor: 0.5,
            scale_factor_limit: 10,
            ..Policy::default()
        };
        assert_eq!(p.idle_target(0), 2, "idle_count is the floor");
        assert_eq!(p.idle_target(9), 5, "ceil(0.5 × 9)");
        assert_eq!(p.idle_target(100), 10, "capped by scale_factor_limit");
    }

    #[test]
    fn preemptive_mode_defaults_to_idle_count_above_zero() {
        assert!(!Policy::default().preemptive());
        assert!(
            Policy {
                idle_count: 1,
                ..Policy::default()
            }
            .preemptive()
        );
        assert!(
            !Policy {
                idle_count: 1,
                preemptive_mode: Some(false),
                ..Policy::default()
            }
            .preemptive()
        );
    }
}
