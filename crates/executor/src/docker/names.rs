//! Names and labels of what one run creates, unique to the run, and this process's session.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{LABEL_JOB, LABEL_RUN, LABEL_RUNNER, LABEL_SESSION};

/// Names of one run's objects, all starting with a prefix unique to the run.
#[derive(Debug, Clone)]
pub(super) struct RunNames {
    /// Starts every name of the run; the value of its [`LABEL_RUN`] label.
    pub(super) prefix: String,
    runner: String,
}

/// This process's session id (its pid and start time), for [`LABEL_SESSION`].
pub fn session() -> &'static str {
    static SESSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SESSION.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}-{nanos:x}", std::process::id())
    })
}

impl RunNames {
    /// Fresh names for one run of job `job_id` on `runner`.
    pub(super) fn new(runner: &str, job_id: u64) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let prefix = format!(
            "{}-job{job_id}-{:x}{:x}{}",
            sanitize(runner),
            std::process::id(),
            nanos & 0xfff_fff,
            N.fetch_add(1, Ordering::Relaxed)
        );
        RunNames {
            prefix,
            runner: runner.to_string(),
        }
    }

    /// The labels on everything the run creates.
    pub(super) fn labels(&self, job_id: u64, slot: u32) -> BTreeMap<String, String> {
        [
            (LABEL_JOB.to_string(), job_id.to_string()),
            (LABEL_RUNNER.to_string(), self.runner.clone()),
            (LABEL_RUN.to_string(), self.prefix.clone()),
            (LABEL_SESSION.to_string(), session().to_string()),
            ("com.slipway.slot".to_string(), slot.to_string()),
        ]
        .into()
    }

    /// The run's own network (when it gets no slot network).
    pub(super) fn network(&self) -> String {
        format!("{}-net", self.prefix)
    }

    /// The per-job builds volume.
    pub(super) fn builds_volume(&self) -> String {
        format!("{}-builds", self.prefix)
    }

    /// The `i`th service container.
    pub(super) fn service(&self, i: usize) -> String {
        format!("{}-svc{i}", self.prefix)
    }

    /// The build container.
    pub(super) fn build(&self) -> String {
        format!("{}-build", self.prefix)
    }
}

/// A name Docker accepts for containers, networks and volumes (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
pub(super) fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    match out.chars().next() {
        Some(c) if c.is_ascii_alphanumeric() => out,
        _ => format!("r{out}"),
    }
}

/// FNV-1a: a stable short hash for names (not for security).
pub(super) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_docker_safe_and_unique() {
        assert_eq!(sanitize("my runner/1"), "my-runner-1");
        assert_eq!(sanitize("-x"), "r-x");
        let a = RunNames::new("r", 1);
        let b = RunNames::new("r", 1);
        assert_ne!(a.prefix, b.prefix);
        assert!(a.network().starts_with("r-job1-"));
    }
}
