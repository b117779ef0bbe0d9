//! kill -9: a manager running six jobs on three real instances is killed with SIGKILL and
//! restarted. Nothing is orphaned, every job is reported exactly once, and no instance is used
//! beyond `max_use_count`.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{World, netns_list, netns_of, plugin_processes, signal, stop_manager, wait_until};
use slipway_job::JobStatus as ResultStatus;
use slipway_manager::source::queue::spool::{JobState, Queue};

const MAX_USE_COUNT: usize = 2;

/// Six jobs that outlive the first manager, and two that wait for a free slot meanwhile.
const FIRST: &str = r#"
stages: [test]
long-1:
  script: ["sleep 600"]
long-2:
  script: ["sleep 600"]
long-3:
  script: ["sleep 600"]
long-4:
  script: ["sleep 600"]
long-5:
  script: ["sleep 600"]
long-6:
  script: ["sleep 600"]
queued-1:
  script: ["echo queued $CI_JOB_ID"]
queued-2:
  script: ["echo queued $CI_JOB_ID"]
"#;

/// Jobs submitted after the restart: they need new instances.
const SHORT: &str = r#"
stages: [test]
short-1:
  script: ["echo short $CI_JOB_ID"]
short-2:
  script: ["echo short $CI_JOB_ID"]
short-3:
  script: ["echo short $CI_JOB_ID"]
short-4:
  script: ["echo short $CI_JOB_ID"]
"#;

fn config(w: &World) -> std::path::PathBuf {
    let state = w.path().join("plugin-state");
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 10
[[runners]]
  name = "restart"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 3
    max_use_count = {MAX_USE_COUNT}
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
      name = "rs{}"
"#,
            state.display(),
            std::process::id()
        ),
    )
}

/// Instance ids the plugin has made so far (its state dir keeps one directory per instance).
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

#[test]
fn sigkill_and_restart_leaves_nothing_behind_and_reports_every_job() {
    let w = World::new();
    let cfg = config(&w);
    let queue = Queue::open(w.path().join(".slipway-queue")).unwrap();
    let mut seen_instances = BTreeSet::new();

    let first = w.submit(&cfg, "first.yml", FIRST);
    assert_eq!(first.len(), 8);
    let (long, queued) = first.split_at(6);
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("spawn manager");

    // Six jobs running, two on each of three instances.
    let running = || -> BTreeMap<u64, String> {
        queue
            .list()
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.state {
                JobState::Running(Some(s)) => Some((e.id, s.instance_id)),
                _ => None,
            })
            .collect()
    };
    let all_running = wait_until(Duration::from_secs(180), || {
        seen_instances.extend(instance_dirs(&w));
        running().len() == 6
    });
    let before_kill = running();
    assert!(all_running, "jobs running: {before_kill:?}");
    let first_instances: BTreeSet<String> = before_kill.values().cloned().collect();
    assert_eq!(first_instances.len(), 3, "{before_kill:?}");
    assert_eq!(
        common::live_sshd_instances(&w),
        first_instances,
        "{:?}",
        w.processes()
    );
    assert!(!plugin_processes(&w).is_empty(), "the plugin runs");
    // Every slot is taken: the other two wait in the queue.
    assert_eq!(
        queue.pending().unwrap(),
        queued,
        "{:?}",
        queue.list().unwrap()
    );

    // kill -9: the plugin dies with the manager (PDEATHSIG); the instances' sshd live on.
    signal(manager.id(), "KILL");
    let out = manager.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), None, "killed by a signal");
    assert!(
        wait_until(Duration::from_secs(30), || plugin_processes(&w).is_empty()),
        "plugin outlived its manager: {:?}",
        plugin_processes(&w)
    );
    assert_eq!(common::live_sshd_instances(&w), first_instances);

    // Restart on the same config: the same plugin state, state store and queue.
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("respawn manager");
    let long_done = wait_until(Duration::from_secs(120), || {
        long.iter().all(|id| queue.result(*id).unwrap().is_some())
    });
    assert!(long_done, "{:?}", queue.list().unwrap());
    for id in long {
        let r = queue.result(*id).unwrap().unwrap();
        assert_eq!(r.status, ResultStatus::Failed, "{r:?}");
        assert_eq!(
            r.failure_reason.as_deref(),
            Some("runner_system_failure"),
            "{r:?}"
        );
        assert!(r.message.contains("manager restarted"), "{r:?}");
        assert_eq!(
            r.instance_id.as_deref(),
            before_kill.get(id).map(String::as_str)
        );
    }

    // The jobs that waited, and new work after the restart, run on new instances.
    let short = w.submit(&cfg, "short.yml", SHORT);
    assert_eq!(short.len(), 4);
    let all_done = wait_until(Duration::from_secs(180), || {
        seen_instances.extend(instance_dirs(&w));
        queued
            .iter()
            .chain(&short)
            .all(|id| queue.result(*id).unwrap().is_some())
    });
    assert!(all_done, "{:?}", queue.list().unwrap());
    for (id, word) in queued
        .iter()
        .map(|id| (id, "queued"))
        .chain(short.iter().map(|id| (id, "short")))
    {
        let r = queue.result(*id).unwrap().unwrap();
        assert_eq!(r.status, ResultStatus::Success, "{r:?}");
        let instance = r.instance_id.clone().unwrap();
        assert!(!first_instances.contains(&instance), "{r:?}");
        let log = std::fs::read_to_string(queue.log_path(*id)).unwrap();
        assert!(log.contains(&format!("{word} {id}")), "{log}");
    }
    // The first instances (used up, holding jobs that cannot resume) are deleted.
    let old_gone = wait_until(Duration::from_secs(60), || {
        common::live_sshd_instances(&w).is_disjoint(&first_instances)
    });
    assert!(old_gone, "{:?}", w.processes());

    // `slipway jobs` tells the same story.
    let jobs = w.run(&["jobs", "-c", cfg.to_str().unwrap()]);
    assert_eq!(jobs.code, Some(0), "{}", jobs.explain());
    eprintln!("{}", jobs.stdout);
    let rows: Vec<&str> = jobs.stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 12, "{}", jobs.stdout);
    assert_eq!(
        rows.iter()
            .filter(|l| l.contains("failed") && l.contains("runner_system_failure"))
            .count(),
        6,
        "{}",
        jobs.stdout
    );
    assert_eq!(
        rows.iter().filter(|l| l.contains("success")).count(),
        6,
        "{}",
        jobs.stdout
    );

    stop_manager(&w, manager);

    // Every job reported exactly once, none left pending or running.
    let entries = queue.list().unwrap();
    let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
    let mut submitted: Vec<u64> = first.iter().chain(&short).copied().collect();
    submitted.sort_unstable();
    assert_eq!(ids, submitted);
    assert!(queue.pending().unwrap().is_empty());
    assert!(queue.running().unwrap().is_empty());
    let done: Vec<_> = std::fs::read_dir(queue.dir().join("done"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(done.len(), submitted.len(), "{done:?}");

    // No instance used beyond max_use_count.
    let mut uses: BTreeMap<String, usize> = BTreeMap::new();
    for e in &entries {
        let JobState::Done(r) = &e.state else {
            panic!("not done: {e:?}")
        };
        if let Some(i) = &r.instance_id {
            *uses.entry(i.clone()).or_default() += 1;
        }
    }
    assert!(
        uses.values().all(|n| *n <= MAX_USE_COUNT),
        "uses per instance: {uses:?}"
    );

    // Nothing of this test is left: no sshd, no plugin, no network namespace.
    assert!(w.processes().is_empty(), "{:?}", w.processes());
    assert!(
        plugin_processes(&w).is_empty(),
        "{:?}",
        plugin_processes(&w)
    );
    seen_instances.extend(uses.keys().cloned());
    let namespaces: BTreeSet<String> = seen_instances.iter().map(|i| netns_of(i)).collect();
    let left: Vec<String> = netns_list()
        .into_iter()
        .filter(|n| namespaces.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

#[test]
fn sigterm_cancels_running_jobs_and_leaves_waiting_ones_queued() {
    let w = World::new();
    let state = w.path().join("plugin-state");
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 4
[[runners]]
  name = "term"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 1
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
      name = "term{}"
"#,
            state.display(),
            std::process::id()
        ),
    );
    let queue = Queue::open(w.path().join(".slipway-queue")).unwrap();
    let ids = w.submit(
        &cfg,
        "two.yml",
        "a:\n  script: [\"sleep 600\"]\nb:\n  script: [\"sleep 600\"]\n",
    );
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("spawn manager");
    let started = wait_until(Duration::from_secs(120), || {
        matches!(
            queue.list().unwrap().first().map(|e| &e.state),
            Some(JobState::Running(Some(_)))
        )
    });
    assert!(started, "{:?}", queue.list().unwrap());
    assert_eq!(queue.pending().unwrap(), vec![ids[1]]);

    // SIGTERM: the running job is canceled and reported, the waiting one stays queued.
    stop_manager(&w, manager);
    let r = queue.result(ids[0]).unwrap().expect("reported");
    assert_eq!(r.status, ResultStatus::Canceled, "{r:?}");
    assert!(r.instance_id.is_some(), "{r:?}");
    assert_eq!(queue.pending().unwrap(), vec![ids[1]]);
    assert!(queue.running().unwrap().is_empty());
    assert!(
        plugin_processes(&w).is_empty(),
        "{:?}",
        plugin_processes(&w)
    );
}
