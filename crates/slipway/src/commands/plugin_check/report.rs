//! The [`Report`] of a run, one [`CheckResult`] per check, and its human table.

use std::time::Duration;

use serde::Serialize;

/// Longest detail kept (JSON); a failure's full text also goes to stderr.
const DETAIL_MAX: usize = 400;
/// Longest detail shown in the table.
const TABLE_DETAIL_MAX: usize = 100;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The plugin did what the contract asks.
    Pass,
    /// It did not.
    Fail,
    /// Not run (not asked for, or something it needs failed).
    Skip,
}

impl Outcome {
    /// `pass`, `fail` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    /// One of [`CHECKS`](super::checks::CHECKS).
    pub name: &'static str,
    /// Pass, fail or skip.
    pub result: Outcome,
    /// What was seen, or why it failed or was skipped.
    pub detail: String,
    /// How long the check took, in milliseconds.
    pub ms: u64,
}

/// The outcome of a whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Path of the plugin binary checked.
    pub plugin: String,
    /// True when no check failed (skips allowed).
    pub passed: bool,
    /// The `--timeout` in seconds.
    pub timeout_secs: u64,
    /// One result per entry of [`CHECKS`](super::checks::CHECKS), in order.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// Count of (passed, failed, skipped) checks.
    pub fn counts(&self) -> (usize, usize, usize) {
        let n = |o: Outcome| self.checks.iter().filter(|c| c.result == o).count();
        (n(Outcome::Pass), n(Outcome::Fail), n(Outcome::Skip))
    }

    /// The human table: `CHECK  RESULT  DETAIL  TIME` rows, then the summary line.
    pub fn table(&self) -> String {
        let times: Vec<String> = self
            .checks
            .iter()
            .map(|c| go_duration(Duration::from_millis(c.ms)))
            .collect();
        let w_name = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .chain([5])
            .max()
            .unwrap_or(5);
        let details: Vec<String> = self
            .checks
            .iter()
            .map(|c| truncate(&c.detail, TABLE_DETAIL_MAX))
            .collect();
        let w_detail = details
            .iter()
            .map(|d| d.chars().count())
            .chain([6])
            .max()
            .unwrap_or(6);
        let mut out = format!(
            "plugin {} (timeout {})\n",
            self.plugin,
            go_duration(Duration::from_secs(self.timeout_secs))
        );
        out.push_str(&format!(
            "{:<w_name$}  {:<6}  {:<w_detail$}  TIME\n",
            "CHECK", "RESULT", "DETAIL"
        ));
        for ((c, time), detail) in self.checks.iter().zip(&times).zip(&details) {
            out.push_str(&format!(
                "{:<w_name$}  {:<6}  {detail:<w_detail$}  {time}\n",
                c.name,
                c.result.as_str(),
            ));
        }
        let (p, f, s) = self.counts();
        out.push_str(&format!(
            "plugin check: {p} passed, {f} failed, {s} skipped\n"
        ));
        out
    }
}

/// `5m0s`, `1h0m0s`, `30s`, `1.5s`, `250ms`: Go's duration style, as config.toml writes them.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        let tenths = d.subsec_millis() / 100;
        return if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        };
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

/// Details are table cells: one line, bounded length (the table cuts them shorter).
pub(super) fn one_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(
        &flat.split_whitespace().collect::<Vec<_>>().join(" "),
        DETAIL_MAX,
    )
}

/// At most `max` characters, the cut marked with `...`.
pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() > max {
        let cut: String = s.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::super::checks::CHECKS;
    use super::*;

    #[test]
    fn go_style_durations() {
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn table_has_a_row_per_check_and_a_summary() {
        let report = Report {
            plugin: "/x/fleeting-plugin-y".into(),
            passed: false,
            timeout_secs: 300,
            checks: CHECKS
                .iter()
                .enumerate()
                .map(|(i, n)| CheckResult {
                    name: n,
                    result: if i == 1 { Outcome::Fail } else { Outcome::Pass },
                    detail: "d".into(),
                    ms: 5,
                })
                .collect(),
        };
        let t = report.table();
        assert!(t.contains("timeout 5m0s"), "{t}");
        assert!(
            t.lines().any(|l| l.starts_with("cookie           fail")),
            "{t}"
        );
        assert!(
            t.ends_with("plugin check: 11 passed, 1 failed, 0 skipped\n"),
            "{t}"
        );
    }

    #[test]
    fn details_are_one_bounded_line() {
        let s = one_line(&format!("a\nb\t{}", "x".repeat(500)));
        assert!(!s.contains('\n') && s.starts_with("a b x") && s.chars().count() == DETAIL_MAX);
        assert_eq!(truncate("abcdef", 5), "ab...");
    }
}
