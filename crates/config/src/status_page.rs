//! `[status_page]`: the page (`/`) and its JSON (`/api/v1/status`) beside `/metrics`.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::problem::Report;

/// `[status_page]`: the page (`/`) and its JSON (`/api/v1/status`) beside `/metrics`.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct StatusPageConfig {
    /// Serve the page at all (default true).
    pub enabled: bool,
    /// When set, the page and its JSON need it (Bearer token, Basic password or `?token=`);
    /// `/metrics` and `/healthz` stay open, as GitLab Runner's. Never printed.
    pub token: Option<String>,
    /// Time between history samples (Go duration, default `15s`).
    pub history_interval: String,
    /// How much history the charts keep (Go duration; default `6h`, or what 10,000 samples
    /// cover when `history_interval` is short).
    pub history: Option<String>,
}

impl Default for StatusPageConfig {
    fn default() -> Self {
        StatusPageConfig {
            enabled: true,
            token: None,
            history_interval: "15s".into(),
            history: None,
        }
    }
}

impl fmt::Debug for StatusPageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusPageConfig")
            .field("enabled", &self.enabled)
            .field("token", &self.token.as_ref().map(|_| slipway_job::MASK))
            .field("history_interval", &self.history_interval)
            .field("history", &self.history)
            .finish()
    }
}

/// Most samples the status page's history may keep (every answer carries them all).
pub const MAX_HISTORY_SAMPLES: f64 = 10_000.0;

impl StatusPageConfig {
    /// The sampling interval and the span kept (checked by validation: defaults on error).
    pub fn history_durations(&self) -> (Duration, Duration) {
        let parse = |s: &str, d: u64| {
            humantime::parse_duration(s.trim())
                .ok()
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(d))
                .min(LONGEST)
        };
        let every = parse(&self.history_interval, 15);
        let span = match &self.history {
            Some(h) => parse(h, 6 * 3600),
            None => Duration::from_secs(6 * 3600).min(every.mul_f64(MAX_HISTORY_SAMPLES)),
        };
        (every, span)
    }

    /// Durations above zero, a second or more between samples, at most
    /// [`MAX_HISTORY_SAMPLES`] kept, no empty token.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        let every = checked_duration(report, "history_interval", &self.history_interval);
        let span = self
            .history
            .as_deref()
            .and_then(|h| checked_duration(report, "history", h));
        match every {
            Some(e) if e < Duration::from_secs(1) => report.error(
                &["history_interval"],
                format!("{:?}: expected at least \"1s\"", self.history_interval),
            ),
            Some(e)
                if span
                    .is_some_and(|s| s.as_secs_f64() / e.as_secs_f64() > MAX_HISTORY_SAMPLES) =>
            {
                report.error(
                    &["history"],
                    format!(
                        "{:?} of samples every {:?} is more than {MAX_HISTORY_SAMPLES} samples; \
                         keep less or sample less often",
                        self.history.as_deref().unwrap_or_default(),
                        self.history_interval
                    ),
                )
            }
            _ => {}
        }
        if self.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            report.error(
                &["token"],
                "empty token: leave it out to serve the page without one",
            );
        }
    }
}

/// A usable duration in key `name`, or reported.
/// The longest interval or history accepted: a year.
const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

fn checked_duration(report: &mut Report<'_>, name: &str, text: &str) -> Option<Duration> {
    match humantime::parse_duration(text.trim()) {
        // A timer that far out overflows the clock it is added to.
        Ok(d) if d > LONGEST => {
            report.error(&[name], format!("{text:?}: expected at most \"365d\""));
            None
        }
        Ok(d) if d.is_zero() => {
            report.error(
                &[name],
                format!("{text:?}: expected a duration above zero, e.g. \"15s\" or \"6h\""),
            );
            None
        }
        Ok(d) => Some(d),
        Err(_) => {
            report.duration_text(&[name], text);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::parse;
    use crate::testing::{GOOD, errors};

    #[test]
    fn a_huge_interval_is_an_error_naming_the_key_not_a_panic_later() {
        let text = GOOD.replacen(
            "concurrent = 4",
            "concurrent = 4\n[status_page]\n  history_interval = \"100000000000s\"",
            1,
        );
        let e = errors(&text);
        assert!(
            e.iter().any(|m| m.contains("status_page.history_interval")
                && m.contains("expected at most \"365d\"")),
            "{e:?}"
        );
    }

    #[test]
    fn status_page_keys_are_checked_and_its_token_never_printed() {
        let ok = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  token = \"st-secret-1\"\n  history = \"2h\"\n",
            1,
        );
        let loaded = parse(&ok, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let sp = &loaded.config.status_page;
        assert!(sp.enabled);
        assert_eq!(
            sp.history_durations(),
            (Duration::from_secs(15), Duration::from_secs(7200))
        );
        // Without `history`, a short interval keeps what 10,000 samples cover.
        let quick = StatusPageConfig {
            history_interval: "1s".into(),
            ..StatusPageConfig::default()
        };
        assert_eq!(
            quick.history_durations(),
            (Duration::from_secs(1), Duration::from_secs(10_000))
        );
        assert_eq!(
            StatusPageConfig::default().history_durations(),
            (Duration::from_secs(15), Duration::from_secs(6 * 3600))
        );
        assert!(!format!("{:?}", loaded.config).contains("st-secret-1"));
        let many = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  history_interval = \"1s\"\n  history = \"24h\"\n",
            1,
        );
        let e = errors(&many);
        assert!(
            e.len() == 1
                && e[0].starts_with("config.toml:5: status_page.history:")
                && e[0].contains("10000 samples"),
            "{e:?}"
        );
        let fast = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  history_interval = \"10ms\"\n",
            1,
        );
        let e = errors(&fast);
        assert!(
            e.len() == 1 && e[0].starts_with("config.toml:4: status_page.history_interval:"),
            "{e:?}"
        );
        let bad = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  history_interval = \"0s\"\n  history = \"soon\"\n  token = \"\"\n",
            1,
        );
        let e = errors(&bad);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:4: status_page.history_interval:")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:5: status_page.history:")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:6: status_page.token: empty token")),
            "{e:?}"
        );
    }
}
