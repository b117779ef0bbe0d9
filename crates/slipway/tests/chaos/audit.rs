//! What the soak checks at the end: one final state per job, complete traces in order, no
//! instance used beyond `max_use_count`, and nothing of the run left anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use super::mix::{Final, Kind, SoakJob};

/// One job as the run left it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The final state, if it reached one.
    pub last: Option<Final>,
    /// Final states reported more than once, or changed after the first (GitLab's view).
    pub extra_finals: usize,
    /// The trace (queue log or GitLab trace).
    pub trace: String,
    /// The result's message (the queue's; empty for GitLab).
    pub message: String,
}

/// Problems with one job's trace, if any: for a job that succeeded, every numbered line once
/// and in order, and the closing line last; for any job, at most one run.
pub fn trace_problems(job: &SoakJob, seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = seen
        .trace
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .collect();
    // A placement whose instance failed before the script started is tried again elsewhere
    // (and says so): only the others count as runs.
    let placed = lines
        .iter()
        .filter(|l| l.starts_with("Running on instance "))
        .count();
    let retried = lines
        .iter()
        .filter(|l| l.contains("the job's script had not started: trying it again"))
        .count();
    let runs = placed.saturating_sub(retried);
    if runs > 1 {
        out.push(format!("{}: ran {runs} times", job.name));
    }
    let success = seen.last.as_ref().is_some_and(|f| f.status == "success");
    if !success {
        return out;
    }
    let mut at = Vec::new();
    for i in 1..=job.lines {
        let want = format!("{} {i}", job.name);
        let hits: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| **l == want)
            .map(|(n, _)| n)
            .collect();
        if hits.len() != 1 {
            out.push(format!(
                "{}: line {want:?} appears {} times",
                job.name,
                hits.len()
            ));
        }
        at.extend(hits.first().copied());
    }
    if !at.windows(2).all(|w| w[0] < w[1]) {
        out.push(format!("{}: numbered lines out of order", job.name));
    }
    let closing = lines.iter().rev().find(|l| !l.trim().is_empty());
    if !closing.is_some_and(|l| l.contains("Job succeeded")) {
        out.push(format!(
            "{}: trace does not end with the closing line: {closing:?}",
            job.name
        ));
    }
    out
}

/// Why a job failed: its result's message, else its trace's last `ERROR:` line, with words
/// holding digits (ids, addresses) dropped so like causes count together.
pub fn why(message: &str, trace: &str) -> String {
    let line = if message.trim().is_empty() {
        trace
            .lines()
            .rev()
            .find(|l| l.contains("ERROR"))
            .unwrap_or("(no ERROR line)")
    } else {
        message
    };
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| {
            if w.chars().any(|c| c.is_ascii_digit()) {
                "#".to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    let mut text = words.join(" ");
    text.truncate(160);
    text
}

/// The instance each job ran on, from its `Running on instance ID slot N` line.
pub fn instance_of(trace: &str) -> Option<String> {
    trace
        .lines()
        .find_map(|l| l.trim_end().strip_prefix("Running on instance "))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
}

/// Jobs per instance beyond `max_use_count` (0: unlimited).
pub fn overruns(
    jobs: &[SoakJob],
    seen: &[Seen],
    max_use_count: u32,
) -> (BTreeMap<String, u32>, Vec<String>) {
    let mut uses: BTreeMap<String, u32> = BTreeMap::new();
    for (_, s) in jobs.iter().zip(seen) {
        if let Some(i) = instance_of(&s.trace) {
            *uses.entry(i).or_default() += 1;
        }
    }
    let over = uses
        .iter()
        .filter(|(_, n)| max_use_count > 0 && **n > max_use_count)
        .map(|(i, n)| format!("instance {i} ran {n} jobs (max_use_count {max_use_count})"))
        .collect();
    (uses, over)
}

/// The dispatch time of a job (ms): from `since_ms` to the `t0` its script printed first.
pub fn dispatch_ms(trace: &str, since_ms: i64) -> Option<f64> {
    let t0: i64 = trace
        .lines()
        .find_map(|l| l.trim_end().strip_prefix("t0 "))?
        .trim()
        .parse()
        .ok()?;
    Some((t0 - since_ms) as f64)
}

/// Everything of the run still there: processes (sshd, plugins, managers, job sleeps tagged
/// with `marker`, VMs), network namespaces of `instances`, containers/networks/volumes of
/// `runner`, and slot cgroups under `cgroup_parent`.
pub fn leftovers(
    world: &str,
    marker: &str,
    instances: &BTreeSet<String>,
    runner: &str,
    cgroup_parent: &str,
) -> Vec<String> {
    let mut out: Vec<String> = crate::common::processes_matching(world)
        .into_iter()
        .map(|p| format!("process {p}"))
        .collect();
    out.extend(
        crate::common::processes_matching(&format!(".{marker}"))
            .into_iter()
            .filter(|p| p.split_whitespace().nth(1) == Some("sleep"))
            .map(|p| format!("job process {p}")),
    );
    let namespaces: BTreeSet<String> = instances
        .iter()
        .map(|i| crate::common::netns_of(i))
        .collect();
    out.extend(
        crate::common::netns_list()
            .into_iter()
            .filter(|n| namespaces.contains(n))
            .map(|n| format!("network namespace {n}")),
    );
    for (what, args, field) in [
        ("container", &["ps", "-a"][..], "{{.Names}}"),
        ("docker network", &["network", "ls"][..], "{{.Name}}"),
        ("docker volume", &["volume", "ls"][..], "{{.Name}}"),
    ] {
        let listed = Command::new("docker")
            .args(args)
            .args([
                "--filter",
                &format!("label=com.slipway.runner={runner}"),
                "--format",
                field,
            ])
            .output();
        if let Ok(o) = listed {
            out.extend(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| format!("{what} {l}")),
            );
        }
    }
    // Slot cgroups: one holding a process is a leak. Empty ones are what jobs cut short (by a
    // manager kill) leave on their instance until its next job in that slot; a real instance
    // takes them with it when deleted, but the local plugin's instances share this host's
    // cgroupfs, so they are counted apart (`empty_cgroups`) and removed here.
    if let Ok(roots) = std::fs::read_dir("/sys/fs/cgroup") {
        for root in roots.flatten() {
            let parent = root.path().join(cgroup_parent);
            let mut dirs = Vec::new();
            walk(&parent, &mut dirs);
            for d in &dirs {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                if !procs.trim().is_empty() {
                    out.push(format!(
                        "cgroup {} holds processes {}",
                        d.display(),
                        procs.split_whitespace().collect::<Vec<_>>().join(",")
                    ));
                }
            }
        }
    }
    out
}

/// Every directory under `dir` (itself included when it exists), deepest first.
fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.path().is_dir() {
            walk(&e.path(), out);
        }
    }
    out.push(dir.to_path_buf());
}

/// Remove the (empty) slot cgroups under `cgroup_parent` in every hierarchy; how many there were
/// besides the parents themselves.
pub fn remove_cgroups(cgroup_parent: &str) -> usize {
    let mut n = 0;
    if let Ok(roots) = std::fs::read_dir("/sys/fs/cgroup") {
        for root in roots.flatten() {
            let parent = root.path().join(cgroup_parent);
            let mut dirs = Vec::new();
            walk(&parent, &mut dirs);
            for d in &dirs {
                if std::fs::remove_dir(d).is_ok() && *d != parent {
                    n += 1;
                }
            }
        }
    }
    n
}

/// Counts of final states by kind and outcome, for the report.
pub fn outcomes(jobs: &[SoakJob], seen: &[Seen]) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for (j, s) in jobs.iter().zip(seen) {
        let state = match &s.last {
            None => "none".to_string(),
            Some(f) if f.status == "failed" => format!(
                "failed:{}",
                f.reason.as_deref().unwrap_or("unknown_failure")
            ),
            Some(f) => f.status.clone(),
        };
        *out.entry(format!("{}/{state}", j.kind.as_str()))
            .or_insert(0) += 1;
    }
    out
}

/// Kinds whose script prints the `t0` dispatch mark.
pub fn has_t0(kind: Kind) -> bool {
    kind != Kind::Docker
}
