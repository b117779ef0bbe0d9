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

/// This machine's name, as sessions carry it.
fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default()
    })
}

/// This process's session id (its host, pid and start time: `host:pid-start`), for
/// [`LABEL_SESSION`].
pub fn session() -> &'static str {
    static SESSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SESSION.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}:{}-{nanos:x}", host(), std::process::id())
    })
}

/// Whether the manager of session `label` is gone: it ran on this machine (or its session
/// names no machine, as older ones did) and its pid runs no more, or runs a process started
/// after the session began (the pid was reused: a restarted manager in a container is pid 1
/// again). A session of another machine is never judged gone: its manager may run there still.
fn is_gone(label: &str) -> bool {
    let (on, rest) = label.split_once(':').unwrap_or(("", label));
    if !on.is_empty() && on != host() {
        return false;
    }
    let Some((pid, began)) = rest.split_once('-') else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    match started_at_s(pid) {
        None => true,
        // A session begins after its process: one started later holds a reused pid.
        Some(started) => {
            u128::from_str_radix(began, 16).is_ok_and(|ns| started > ns as f64 / 1e9 + 2.0)
        }
    }
}

/// When process `pid` started, in seconds since the epoch; `None` when it does not run.
fn started_at_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime, clock ticks since boot), counted after the command's ")".
    let ticks: f64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // USER_HZ is 100 on every architecture Slipway builds for.
    Some(boot + ticks / 100.0)
}

/// Which of a runner's sessions a sweep of an engine removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Every session (at shutdown, when no job of this manager runs).
    All,
    /// Sessions of managers gone from this machine, and this process's when `ours`: what an
    /// engine another manager of the runner may share (a rolling upgrade, the local plugin's
    /// instances on one engine, a static pool) needs, as that manager's jobs must not be
    /// touched. A session of another machine is left alone.
    Dead {
        /// This process's session too.
        ours: bool,
    },
}

impl Sweep {
    /// Whether a resource labelled with `label` (its session) goes.
    pub fn removes(self, label: Option<&str>) -> bool {
        let mine = label == Some(session());
        match self {
            Sweep::All => true,
            Sweep::Dead { ours } => {
                match label {
                    _ if mine => ours,
                    // Unlabelled: an older version's, removed when this manager is done.
                    None => ours,
                    Some(l) => is_gone(l),
                }
            }
        }
    }
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

    #[test]
    fn sweeps_judge_sessions_by_machine_and_process() {
        let me = session();
        assert!(me.starts_with(&format!("{}:{}-", host(), std::process::id())));
        // pid 1 runs, started before this session; a pid beyond pid_max never runs; this
        // process under a session older than itself is a reused pid.
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let live = format!("{}:1-{now_ns:x}", host());
        let gone = format!("{}:4194305-abc", host());
        let reused = format!("{}:{}-1", host(), std::process::id());
        assert!(Sweep::Dead { ours: false }.removes(Some(&reused)));
        let elsewhere = "another-machine:4194305-abc";
        let old_gone = "4194305-abc";
        let dead = Sweep::Dead { ours: false };
        assert!(!dead.removes(Some(me)) && Sweep::Dead { ours: true }.removes(Some(me)));
        assert!(!dead.removes(Some(&live)));
        assert!(dead.removes(Some(&gone)));
        assert!(
            !dead.removes(Some(elsewhere)),
            "another machine's manager may run"
        );
        assert!(dead.removes(Some(old_gone)));
        assert!(!dead.removes(None) && Sweep::Dead { ours: true }.removes(None));
        assert!(Sweep::All.removes(Some(me)));
    }
}
