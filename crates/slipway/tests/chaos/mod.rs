//! The chaos soak: `slipway run` works through a seeded mix of jobs (quick, slow, failing,
//! canceled, with artifacts, at the none, cgroup and docker levels) from the embedded queue or
//! the GitLab fake, on several `fleeting-plugin-local` instances, while a driver kills the
//! plugin, instances' sshd and the manager (twice), slows an instance's network, fills the state
//! directory's disk and, with GitLab, makes it fail, hang and drop connections. Then it audits
//! what the run left: see [`Report`].
//!
//! Shared by `tests/soak.rs` (a short run in `make test`) and `benches/soak.rs` (`make soak`).

// The driver is a test fixture: a broken step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, dead_code)]

pub mod audit;
pub mod faults;
pub mod mix;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use slipway_manager::source::queue::spool::Queue;
use slipway_testkit::gitlab::{FakeGitlab, Outage};

use crate::common::{World, plugin_processes, sshd_instances};
use audit::Seen;
use faults::{Event, Fault, StateDisk, Timed};
use mix::{Final, Kind, Rng, SoakJob};

/// How long the GitLab fake waits before failing a running job no runner touches (GitLab: an
/// hour; here long enough that a live job's trace PATCHes, every few seconds, keep it).
const STALE: Duration = Duration::from_secs(120);

/// Where jobs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The embedded queue (`slipway submit`).
    Queue,
    /// The GitLab fake over HTTP.
    Gitlab,
}

impl Source {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Queue => "queue",
            Source::Gitlab => "gitlab",
        }
    }
}

/// One soak's size and timing.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Job source.
    pub source: Source,
    /// Jobs in all.
    pub jobs: usize,
    /// Seed of the mix and the fault schedule.
    pub seed: u64,
    /// Slots per instance.
    pub capacity_per_instance: u32,
    /// Instances at most.
    pub max_instances: u32,
    /// Jobs at once (`concurrent`).
    pub concurrent: u32,
    /// Jobs per instance before it is replaced.
    pub max_use_count: u32,
    /// How long each GitLab fault lasts.
    pub outage: Duration,
    /// How long the state disk stays full.
    pub disk_full: Duration,
    /// The run gives up when no job finished for this long.
    pub stall: Duration,
}

/// What a soak found.
#[derive(Debug, Default)]
pub struct Report {
    /// Jobs in all.
    pub jobs: usize,
    /// Wall time of the run.
    pub seconds: f64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u32>,
    /// Final states by kind (`kind/state`).
    pub outcomes: BTreeMap<String, u32>,
    /// Jobs with no final state.
    pub lost: Vec<String>,
    /// Jobs with more than one final state, or that ran more than once.
    pub duplicated: Vec<String>,
    /// Jobs whose final state their kind cannot end in.
    pub unexpected: Vec<String>,
    /// Trace and artifact problems of finished jobs.
    pub traces: Vec<String>,
    /// Instances used beyond `max_use_count`.
    pub overruns: Vec<String>,
    /// Jobs per instance.
    pub uses: BTreeMap<String, u32>,
    /// Everything of the run left at the end.
    pub orphans: Vec<String>,
    /// Panics and other errors in the managers' output.
    pub manager_errors: Vec<String>,
    /// Dispatch times (ms), sorted.
    pub dispatch_ms: Vec<f64>,
    /// The last manager's RSS (kB): at its start, half-way through its life, and at the end.
    pub rss_kb: (u64, u64, u64),
    /// Jobs failed by faults (`runner_system_failure`).
    pub failed_by_faults: u32,
    /// Why jobs failed with `runner_system_failure`: the error line of their traces (digits
    /// dropped), counted.
    pub system_failures: BTreeMap<String, u32>,
    /// How the instance's network was slowed.
    pub network_delay: &'static str,
    /// Jobs GitLab itself failed as stuck: handed out to a manager that was killed before it
    /// read the answer (no runner can learn of such a job; GitLab times it out).
    pub timed_out_by_gitlab: Vec<String>,
    /// Empty cgroup directories (per instance and slot) left on this host by jobs a fault cut
    /// short; see [`audit::leftovers`].
    pub empty_cgroups: usize,
}

impl Report {
    /// `p` (0..1) percentile of the dispatch times.
    pub fn dispatch_percentile(&self, p: f64) -> f64 {
        if self.dispatch_ms.is_empty() {
            return 0.0;
        }
        let i = ((self.dispatch_ms.len() - 1) as f64 * p).round() as usize;
        self.dispatch_ms[i]
    }

    /// Growth of the last manager's RSS over the last half of its life (0.05 = 5 %).
    pub fn rss_growth_last_half(&self) -> f64 {
        let (_, mid, end) = self.rss_kb;
        if mid == 0 {
            return 0.0;
        }
        end as f64 / mid as f64 - 1.0
    }

    /// Every broken promise, one line each (empty: the run kept them all).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let lists = [
            ("lost", &self.lost),
            ("duplicated", &self.duplicated),
            ("unexpected outcome", &self.unexpected),
            ("trace", &self.traces),
            ("max_use_count", &self.overruns),
            ("left behind", &self.orphans),
            ("manager", &self.manager_errors),
        ];
        for (what, list) in lists {
            out.extend(list.iter().map(|p| format!("{what}: {p}")));
        }
        out
    }

    /// The report as the results file's entry.
    pub fn to_json(&self, plan: &Plan) -> Value {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        json!({
            "source": plan.source.as_str(),
            "jobs": self.jobs,
            "seconds": r(self.seconds),
            "slots": plan.concurrent,
            "instances_max": plan.max_instances,
            "capacity_per_instance": plan.capacity_per_instance,
            "max_use_count": plan.max_use_count,
            "instances_used": self.uses.len(),
            "faults": self.faults,
            "lost": self.lost.len(),
            "duplicated": self.duplicated.len(),
            "orphans": self.orphans.len(),
            "unexpected_outcomes": self.unexpected.len(),
            "trace_problems": self.traces.len(),
            "max_use_count_overruns": self.overruns.len(),
            "failed_by_faults": self.failed_by_faults,
            "system_failures": self.system_failures,
            "timed_out_by_gitlab": self.timed_out_by_gitlab.len(),
            "network_delay": self.network_delay,
            "empty_cgroup_dirs_of_local_instances": self.empty_cgroups,
            "outcomes": self.outcomes,
            "dispatch_ms_p50": r(self.dispatch_percentile(0.5)),
            "dispatch_ms_p95": r(self.dispatch_percentile(0.95)),
            "dispatch_samples": self.dispatch_ms.len(),
            "manager_rss_kb_start": self.rss_kb.0,
            "manager_rss_kb_mid": self.rss_kb.1,
            "manager_rss_kb_end": self.rss_kb.2,
            "manager_rss_growth_last_half": (self.rss_growth_last_half() * 1000.0).round() / 1000.0,
        })
    }
}

/// How long after a killed manager was reaped a handout may still be the answer to its request.
const HANDOUT_GRACE_MS: i64 = 100;

/// A running `slipway run`, its output going to files in the world.
struct Manager {
    child: Child,
    incarnation: u32,
    started: Instant,
}

impl Manager {
    fn start(w: &World, cfg: &Path, incarnation: u32) -> Manager {
        let file = |ext: &str| {
            std::fs::File::create(w.path().join(format!("manager-{incarnation}.{ext}")))
                .expect("manager log")
        };
        let child = w
            .slipway(&["run", "-c", cfg.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(file("out"))
            .stderr(file("err"))
            .spawn()
            .expect("spawn slipway run");
        Manager {
            child,
            incarnation,
            started: Instant::now(),
        }
    }

    fn rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

/// One soak job as submitted.
#[derive(Debug)]
struct Submitted {
    id: u64,
    done: bool,
    cancel_sent: bool,
}

fn config(w: &World, plan: &Plan, gl: Option<&FakeGitlab>, runner: &str, parent: &str) -> String {
    let source = match gl {
        Some(gl) => format!(
            "  url = \"{}\"\n  token = \"{}\"\n",
            gl.url(),
            gl.runner_token()
        ),
        None => String::new(),
    };
    format!(
        r#"
concurrent = {concurrent}
check_interval = 1
[[runners]]
  name = "{runner}"
{source}  executor = "instance"
  allowed_isolation = ["none", "cgroup", "docker"]
  slot_cgroup_template = "{parent}/{{instance}}/slot-${{slot}}"
  [runners.docker]
    image = "{image}"
    pull_policy = ["if-not-present"]
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = {cap}
    max_instances = {max}
    max_use_count = {uses}
    instance_acquire_timeout = "3m"
    update_interval = "1s"
    update_interval_when_expecting = "200ms"
    delete_instances_on_shutdown = true
    shutdown_deletion_interval = "1s"
    [runners.autoscaler.plugin_config]
      dir = "{plugin_state}"
      name = "sk{pid}"
    [[runners.autoscaler.policy]]
      idle_count = {concurrent}
      idle_time = "2m"
"#,
        concurrent = plan.concurrent,
        image = mix::IMAGE,
        cap = plan.capacity_per_instance,
        max = plan.max_instances,
        uses = plan.max_use_count,
        plugin_state = w.path().join("plugin-state").display(),
        pid = std::process::id(),
    )
}

/// Instance ids the plugin has made so far (one directory each in its state dir).
fn instance_dirs(w: &World) -> BTreeSet<String> {
    std::fs::read_dir(w.path().join("plugin-state/instances"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .map(|n| n.trim_start_matches(".trash-").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Run one soak and audit it.
pub fn run(plan: &Plan) -> Report {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine for docker-level jobs");
    let w = World::new();
    let pid = std::process::id();
    let marker = format!("{:04}{}", pid % 10_000, plan.source as u8);
    let runner = format!("soak-{}-{pid}", plan.source.as_str());
    let parent = format!("slipway-soak-{}-{pid}", plan.source.as_str());
    let state = w.path().join("state");
    let disk = StateDisk::mount(&state, "64m");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let gl = (plan.source == Source::Gitlab).then(|| rt.block_on(FakeGitlab::start()));
    if let Some(gl) = &gl {
        // GitLab fails a running job no runner touches (its stuck-jobs worker, after an hour):
        // what happens to a job handed out to a manager killed before it read the answer.
        gl.set_stale_after(STALE);
    }
    let cfg = state.join("config.toml");
    std::fs::write(&cfg, config(&w, plan, gl.as_ref(), &runner, &parent)).expect("config");
    let queue = Queue::open(state.join(".slipway-queue")).expect("queue");
    let batches = w.path().join("batches");
    std::fs::create_dir_all(&batches).expect("batches");

    let jobs = mix::mix(plan.seed, plan.jobs, &marker);
    let mut submitted: Vec<Submitted> = Vec::new();
    let mut events: Vec<Event> = faults::schedule(plan.seed, gl.is_some());
    events.reverse();
    let mut rng = Rng::new(plan.seed ^ 0xFA17);
    let mut report = Report {
        jobs: plan.jobs,
        ..Report::default()
    };
    let mut timed: Vec<Timed> = Vec::new();
    let mut delayed: Option<(String, String)> = None;
    let mut filler: Option<PathBuf> = None;
    // (SIGKILL sent, the killed manager reaped), unix ms.
    let mut kills_ms: Vec<(i64, i64)> = Vec::new();
    let mut instances = BTreeSet::new();
    let mut rss: Vec<(u32, f64, u64)> = Vec::new();
    let mut last_rss = Instant::now() - Duration::from_secs(10);

    let begun = Instant::now();
    let mut manager = Manager::start(&w, &cfg, 0);
    let mut last_progress = Instant::now();
    let mut finished = 0usize;
    loop {
        // Finished jobs.
        for s in submitted.iter_mut().filter(|s| !s.done) {
            s.done = match &gl {
                Some(gl) => gl
                    .job(s.id)
                    .is_some_and(|r| matches!(r.state.as_str(), "success" | "failed" | "canceled")),
                None => queue.result(s.id).ok().flatten().is_some(),
            };
            if s.done {
                finished += 1;
                last_progress = Instant::now();
            }
        }
        if finished == plan.jobs {
            break;
        }
        if last_progress.elapsed() > plan.stall {
            eprintln!("soak: no job finished for {:?}; giving up", plan.stall);
            // What the stalled jobs and the manager were doing, for whoever reads the failure.
            if let Some(gl) = &gl {
                for s in submitted.iter().filter(|s| !s.done) {
                    let (state, trace) = gl
                        .job(s.id)
                        .map(|j| (j.state.clone(), j.trace_text()))
                        .unwrap_or_default();
                    let tail: Vec<&str> = trace.lines().rev().take(3).collect();
                    eprintln!("soak: stalled job {} {state}: {:?}", s.id, tail);
                }
            }
            let log = w
                .path()
                .join(format!("manager-{}.err", manager.incarnation));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            for line in tail.into_iter().rev() {
                eprintln!("soak: manager log: {line}");
            }
            break;
        }
        let progress = finished as f64 / plan.jobs as f64;

        // Keep twice the slots' worth of jobs outstanding (not while the disk is full: a
        // submit would fail half-way, which is the submitter's problem, not the runner's).
        let outstanding = submitted.len() - finished;
        let want = (2 * plan.concurrent as usize).saturating_sub(outstanding);
        if want > 0 && submitted.len() < plan.jobs && filler.is_none() {
            let batch = &jobs[submitted.len()..(submitted.len() + want).min(plan.jobs)];
            match &gl {
                Some(gl) => {
                    for j in batch {
                        let id = gl.enqueue(j.payload());
                        submitted.push(Submitted {
                            id,
                            done: false,
                            cancel_sent: false,
                        });
                    }
                }
                None => {
                    let file = batches.join(format!("{}.yml", submitted.len()));
                    let yaml: String = std::iter::once("stages: [test]\n".to_string())
                        .chain(batch.iter().map(SoakJob::yaml))
                        .collect();
                    std::fs::write(&file, yaml).expect("batch");
                    let out = w.run(&[
                        "submit",
                        "-c",
                        cfg.to_str().unwrap(),
                        file.to_str().unwrap(),
                    ]);
                    assert_eq!(out.code, Some(0), "submit: {}", out.explain());
                    let ids: Vec<u64> = out
                        .stdout
                        .lines()
                        .map(|l| l.split('\t').next().unwrap().parse().unwrap())
                        .collect();
                    assert_eq!(ids.len(), batch.len(), "{}", out.stdout);
                    submitted.extend(ids.into_iter().map(|id| Submitted {
                        id,
                        done: false,
                        cancel_sent: false,
                    }));
                }
            }
        }

        // Cancel the jobs made to be canceled: some while pending, the rest once running.
        for (j, s) in jobs.iter().zip(submitted.iter_mut()) {
            if j.kind != Kind::Canceled || s.done || s.cancel_sent {
                continue;
            }
            let started = j.cancel_early || {
                let trace = match &gl {
                    Some(gl) => gl.job(s.id).map(|r| r.trace_text()).unwrap_or_default(),
                    None => std::fs::read_to_string(queue.log_path(s.id)).unwrap_or_default(),
                };
                trace.lines().any(|l| l == format!("{} 1", j.name))
            };
            if !started {
                continue;
            }
            s.cancel_sent = match &gl {
                Some(gl) => {
                    gl.cancel(s.id, false);
                    true
                }
                // Refused while the disk is full: tried again on the next round.
                None => {
                    w.run(&["cancel", "-c", cfg.to_str().unwrap(), &s.id.to_string()])
                        .code
                        == Some(0)
                }
            };
        }

        // Lift timed faults that are over.
        timed.retain(|t| {
            if Instant::now() < t.until {
                return true;
            }
            match t.fault {
                Fault::DiskFull => {
                    if let Some(f) = filler.take() {
                        let _ = std::fs::remove_file(f);
                    }
                }
                _ => {
                    if let Some(gl) = &gl {
                        gl.set_outage(Outage::None);
                    }
                }
            }
            false
        });

        // The next fault, once the run has got that far.
        if let Some(ev) = events.last().copied()
            && ev.at <= progress
        {
            let done = inject(
                ev.fault,
                &w,
                plan,
                &cfg,
                gl.as_ref(),
                &disk,
                &mut manager,
                &mut rng,
                &mut timed,
                &mut delayed,
                &mut filler,
                &mut kills_ms,
                &mut report.network_delay,
            );
            if done {
                events.pop();
                *report.faults.entry(ev.fault.as_str()).or_insert(0) += 1;
                eprintln!(
                    "soak {}: {} at {:.0}% ({} of {} jobs done)",
                    plan.source.as_str(),
                    ev.fault.as_str(),
                    progress * 100.0,
                    finished,
                    plan.jobs
                );
            }
        }

        if last_rss.elapsed() >= Duration::from_secs(1) {
            last_rss = Instant::now();
            instances.extend(instance_dirs(&w));
            if let Some(kb) = manager.rss_kb() {
                rss.push((
                    manager.incarnation,
                    manager.started.elapsed().as_secs_f64(),
                    kb,
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    report.seconds = begun.elapsed().as_secs_f64();

    // Lift what is still in force, then stop the manager as an operator would.
    if let Some(gl) = &gl {
        gl.set_outage(Outage::None);
    }
    if let Some(f) = filler.take() {
        let _ = std::fs::remove_file(f);
    }
    if let Some((ns, dev)) = delayed.take() {
        faults::undelay(&ns, &dev);
    }
    instances.extend(instance_dirs(&w));
    faults::kill(manager.child.id(), "TERM");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match manager.child.try_wait() {
            Ok(Some(st)) => {
                if st.code() != Some(0) {
                    report
                        .manager_errors
                        .push(format!("the last manager exited with {st} on SIGTERM"));
                }
                break;
            }
            _ if Instant::now() > deadline => {
                let _ = manager.child.kill();
                let _ = manager.child.wait();
                report
                    .manager_errors
                    .push("the last manager did not stop within 3 minutes of SIGTERM".into());
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }

    // What each job came to.
    let seen: Vec<Seen> = jobs
        .iter()
        .zip(&submitted)
        .map(|(_, s)| match &gl {
            Some(gl) => seen_in_gitlab(gl, s.id),
            None => seen_in_queue(&queue, s.id),
        })
        .collect();
    let jobs = &jobs[..seen.len()];
    for (j, s) in jobs.iter().zip(&seen) {
        match &s.last {
            None => report.lost.push(j.name.clone()),
            Some(f) => {
                if !j.allows(f) {
                    report.unexpected.push(format!("{}: {f:?}", j.name));
                }
                match f.reason.as_deref() {
                    Some("runner_system_failure") => {
                        report.failed_by_faults += 1;
                        *report
                            .system_failures
                            .entry(audit::why(&s.message, &s.trace))
                            .or_insert(0) += 1;
                    }
                    Some("stuck_or_timeout_failure") => {
                        report.timed_out_by_gitlab.push(j.name.clone())
                    }
                    _ => {}
                }
            }
        }
        if s.extra_finals > 0 {
            report
                .duplicated
                .push(format!("{}: {} extra final states", j.name, s.extra_finals));
        }
        let problems = audit::trace_problems(j, s);
        for p in problems {
            if p.contains("ran ") {
                report.duplicated.push(p);
            } else {
                report.traces.push(p);
            }
        }
    }
    report.lost.extend(
        mix::mix(plan.seed, plan.jobs, &marker)[seen.len()..]
            .iter()
            .map(|j| format!("{} (never submitted)", j.name)),
    );
    if let Some(gl) = &gl {
        for (j, s) in jobs.iter().zip(&submitted) {
            let ok = s.done
                && j.kind == Kind::Artifacts
                && gl.job(s.id).is_some_and(|r| r.state == "success");
            if !ok {
                continue;
            }
            let rec = gl.job(s.id).unwrap();
            let files = rec
                .artifacts
                .first()
                .map(|a| crate::common::unzip(&a.bytes))
                .unwrap_or_default();
            if files.get("out/name.txt").map(|t| t.trim()) != Some(j.name.as_str()) {
                report.traces.push(format!(
                    "{}: artifact out/name.txt missing or wrong: {files:?}",
                    j.name
                ));
            }
        }
    }
    // A job GitLab timed out must have been handed out just before a manager was killed;
    // any other is one the runner lost.
    if let Some(gl) = &gl {
        for (j, s) in jobs.iter().zip(&submitted) {
            if !report.timed_out_by_gitlab.contains(&j.name) {
                continue;
            }
            let handed = gl.job(s.id).and_then(|r| r.handed_out_ms);
            // Handed out in the few seconds before the kill, or while the manager was dying: a
            // request it sent before the SIGKILL can be answered after it (the fake answers
            // what it already read), but no later manager existed until the old one was reaped
            // (and it needs far more than HANDOUT_GRACE_MS to start and ask for a job).
            let near_kill = handed.is_some_and(|h| {
                kills_ms
                    .iter()
                    .any(|(sent, reaped)| h <= reaped + HANDOUT_GRACE_MS && sent - h < 5_000)
            });
            if !near_kill {
                report.lost.push(format!(
                    "{}: handed out at {handed:?}, not just before a manager kill ({kills_ms:?}), and never reported",
                    j.name
                ));
            }
        }
    }
    report.outcomes = audit::outcomes(jobs, &seen);
    let (uses, over) = audit::overruns(jobs, &seen, plan.max_use_count);
    instances.extend(uses.keys().cloned());
    report.uses = uses;
    report.overruns = over;
    report.dispatch_ms = jobs
        .iter()
        .zip(&submitted)
        .zip(&seen)
        .filter(|((j, _), _)| audit::has_t0(j.kind))
        .filter_map(|((_, s), seen)| {
            let since = match &gl {
                Some(gl) => gl.job(s.id)?.handed_out_ms?,
                None => queue.result(s.id).ok()??.started_at_ms?,
            };
            audit::dispatch_ms(&seen.trace, since)
        })
        .collect();
    report.dispatch_ms.sort_by(f64::total_cmp);
    let last: Vec<&(u32, f64, u64)> = rss.iter().filter(|s| s.0 == manager.incarnation).collect();
    // From 5 s in: a process just started has not mapped its libraries yet.
    let first = last.iter().find(|s| s.1 >= 5.0).or(last.first());
    if let (Some(first), Some(end)) = (first, last.last()) {
        let half = end.1 / 2.0;
        let mid = last.iter().find(|s| s.1 >= half).map_or(first.2, |s| s.2);
        report.rss_kb = (first.2, mid, end.2);
    }

    // Panics anywhere in the managers' output.
    for n in 0..=manager.incarnation {
        for ext in ["out", "err"] {
            let text = std::fs::read_to_string(w.path().join(format!("manager-{n}.{ext}")))
                .unwrap_or_default();
            report.manager_errors.extend(
                text.lines()
                    .filter(|l| l.contains("panicked"))
                    .map(|l| format!("manager {n}: {l}")),
            );
        }
    }

    // The managers' logs outlive the world, for whoever reads a failed run.
    let logs = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/soak-logs")
        .join(plan.source.as_str());
    let _ = std::fs::remove_dir_all(&logs);
    if std::fs::create_dir_all(&logs).is_ok() {
        for n in 0..=manager.incarnation {
            for ext in ["out", "err"] {
                let name = format!("manager-{n}.{ext}");
                let _ = std::fs::copy(w.path().join(&name), logs.join(&name));
            }
        }
    }

    // Nothing of the run may be left: give the shutdown's deletions a moment.
    let world = w.path().display().to_string();
    let mut left = Vec::new();
    crate::common::wait_until(Duration::from_secs(60), || {
        left = audit::leftovers(&world, &marker, &instances, &runner, &parent);
        left.is_empty()
    });
    report.orphans = left;
    report.empty_cgroups = audit::remove_cgroups(&parent);
    drop(disk);
    drop(gl);
    report
}

#[allow(clippy::too_many_arguments)]
fn inject(
    fault: Fault,
    w: &World,
    plan: &Plan,
    cfg: &Path,
    gl: Option<&FakeGitlab>,
    disk: &StateDisk,
    manager: &mut Manager,
    rng: &mut Rng,
    timed: &mut Vec<Timed>,
    delayed: &mut Option<(String, String)>,
    filler: &mut Option<PathBuf>,
    kills_ms: &mut Vec<(i64, i64)>,
    delay_method: &mut &'static str,
) -> bool {
    match fault {
        Fault::KillPlugin => {
            let pids: Vec<u32> = plugin_processes(w)
                .iter()
                .filter_map(|l| faults::pid_of(l))
                .collect();
            match pids.get(rng.below(pids.len() as u64) as usize) {
                Some(pid) => faults::kill(*pid, "KILL"),
                None => false,
            }
        }
        Fault::KillSshd => {
            let listeners: Vec<u32> = w
                .processes()
                .iter()
                .filter(|p| p.contains("sshd") && p.contains("/instances/"))
                .filter_map(|l| faults::pid_of(l))
                .collect();
            match listeners.get(rng.below(listeners.len() as u64) as usize) {
                Some(pid) => faults::kill(*pid, "KILL"),
                None => false,
            }
        }
        Fault::DelayNetwork => {
            let live: Vec<String> = sshd_instances(&w.processes()).into_iter().collect();
            let Some(i) = live.get(rng.below(live.len() as u64) as usize) else {
                return false;
            };
            let ns = crate::common::netns_of(i);
            match faults::delay(&ns) {
                Some((dev, how)) => {
                    *delayed = Some((ns, dev));
                    *delay_method = how;
                    true
                }
                None => false,
            }
        }
        Fault::Undelay => {
            if let Some((ns, dev)) = delayed.take() {
                faults::undelay(&ns, &dev);
            }
            true
        }
        Fault::KillManager => {
            let sent = slipway_manager::source::queue::spool::unix_ms(std::time::SystemTime::now());
            faults::kill(manager.child.id(), "KILL");
            let _ = manager.child.wait();
            kills_ms.push((
                sent,
                slipway_manager::source::queue::spool::unix_ms(std::time::SystemTime::now()),
            ));
            *manager = Manager::start(w, cfg, manager.incarnation + 1);
            true
        }
        Fault::Gitlab500 | Fault::Gitlab502 | Fault::GitlabTimeout | Fault::GitlabDrop => {
            let Some(gl) = gl else { return true };
            gl.set_outage(match fault {
                Fault::Gitlab500 => Outage::Status(500),
                Fault::Gitlab502 => Outage::Status(502),
                Fault::GitlabTimeout => Outage::Hang,
                _ => Outage::Drop,
            });
            timed.push(Timed::new(fault, plan.outage));
            true
        }
        Fault::DiskFull => {
            *filler = Some(disk.fill());
            timed.push(Timed::new(fault, plan.disk_full));
            true
        }
    }
}

fn seen_in_queue(queue: &Queue, id: u64) -> Seen {
    let last = queue.result(id).ok().flatten().map(|r| Final {
        status: r.status.as_str().to_string(),
        reason: r.failure_reason.clone(),
        exit_code: r.exit_code,
    });
    Seen {
        message: queue
            .result(id)
            .ok()
            .flatten()
            .map(|r| r.message)
            .unwrap_or_default(),
        last,
        extra_finals: 0,
        trace: std::fs::read_to_string(queue.log_path(id)).unwrap_or_default(),
    }
}

fn seen_in_gitlab(gl: &FakeGitlab, id: u64) -> Seen {
    let Some(rec) = gl.job(id) else {
        return Seen {
            last: None,
            extra_finals: 0,
            trace: String::new(),
            message: String::new(),
        };
    };
    let accepted = rec.accepted_final_states();
    let distinct: BTreeSet<&String> = accepted.iter().collect();
    let last_update = rec
        .updates
        .iter()
        .zip(&rec.update_statuses)
        .rev()
        .find(|(u, s)| **s == 200 && u["state"] != "running")
        .map(|(u, _)| u.clone())
        .unwrap_or(Value::Null);
    let last = matches!(rec.state.as_str(), "success" | "failed" | "canceled").then(|| Final {
        status: rec.state.clone(),
        reason: rec
            .dropped_reason
            .clone()
            .or_else(|| last_update["failure_reason"].as_str().map(str::to_string)),
        exit_code: last_update["exit_code"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok()),
    });
    let canceled_twice = usize::from(rec.state == "canceled" && !accepted.is_empty());
    Seen {
        last,
        extra_finals: distinct.len().saturating_sub(1) + canceled_twice,
        trace: rec.trace_text(),
        message: String::new(),
    }
}
