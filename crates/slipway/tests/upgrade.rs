//! A rolling upgrade on a static pool: a second manager is started with the same config and
//! state while the first runs 8 jobs, then the first is drained (SIGQUIT). No job is killed, no
//! host is removed by a manager that does not own it, no slot is used twice at once, and the
//! second manager takes the queue and the first one's hosts over.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{World, signal, wait_until, wait_with_timeout};
use slipway_job::JobStatus as ResultStatus;
use slipway_manager::source::queue::spool::{JobState, Queue};

const HOSTS: usize = 4;

fn pipeline(prefix: &str, n: usize, secs: u32) -> String {
    let mut p = String::from("stages: [test]\n");
    for i in 1..=n {
        p.push_str(&format!(
            "{prefix}-{i}:\n  script: [\"echo begin\", \"sleep {secs}\", \"echo end $CI_JOB_ID\"]\n"
        ));
    }
    p
}

fn manager(w: &World, cfg: &Path, log: &str) -> Child {
    let log = std::fs::File::create(w.path().join(log)).unwrap();
    w.slipway(&["run", "-c", cfg.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(log))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn manager")
}

/// The leases in the static plugin's state file, by lease id.
fn leases(w: &World) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(w.path().join("static-state/state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["leases"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, l)| (id.clone(), l["state"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_manager_takes_over_while_the_first_drains_and_no_job_is_lost() {
    let w = World::new();
    let mut hosts = Vec::new();
    for _ in 0..HOSTS {
        hosts.push(slipway_testkit::Sshd::start().await.expect("sshd"));
    }
    let user = hosts[0].info().expect("info").connector.username;
    let mut text = format!(
        r#"
concurrent = 16
shutdown_timeout = 120
[[runners]]
  name = "pool"
  executor = "instance"
  builds_dir = "{builds}"
  [runners.autoscaler]
    plugin = "static"
    capacity_per_instance = 2
    max_instances = {HOSTS}
    update_interval = "1s"
    update_interval_when_expecting = "200ms"
    [[runners.autoscaler.policy]]
      idle_time = "10m"
    [runners.autoscaler.plugin_config]
      state_dir = "{state}"
"#,
        builds = w.path().join("builds").display(),
        state = w.path().join("static-state").display(),
    );
    text.push_str(&slipway_testkit::Sshd::static_hosts(&hosts, &user));
    let cfg = w.write("config.toml", &text);
    let queue = Queue::open(w.path().join(".slipway-queue")).unwrap();

    let w = std::sync::Arc::new(w);
    let ww = w.clone();
    tokio::task::spawn_blocking(move || {
        let w = &*ww;
        let first_jobs = w.submit(&cfg, "first.yml", &pipeline("first", 8, 8));
        let old = manager(w, &cfg, "old.log");
        let running = || {
            queue
                .list()
                .unwrap()
                .iter()
                .filter(|e| matches!(e.state, JobState::Running(Some(_))))
                .count()
        };
        assert!(
            wait_until(Duration::from_secs(120), || running() == 8),
            "8 jobs running: {:?}\n{}",
            queue.list().unwrap(),
            w.read("old.log")
        );
        let old_leases = leases(w);
        assert_eq!(old_leases.len(), HOSTS, "{old_leases:?}");

        // The new manager starts beside it with the same config and state.
        let new = manager(w, &cfg, "new.log");
        assert!(
            wait_until(Duration::from_secs(60), || w
                .read("new.log")
                .contains("another manager consumes the queue")),
            "{}",
            w.read("new.log")
        );
        // Work submitted meanwhile waits for the new manager.
        let later_jobs = w.submit(&cfg, "later.yml", &pipeline("later", 4, 1));
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            leases(w),
            old_leases,
            "no host was given back or taken over"
        );

        // The old one drains: its running jobs finish, it reports them and exits.
        signal(old.id(), "QUIT");
        let out = wait_with_timeout(old, Duration::from_secs(150));
        assert_eq!(out.status.code(), Some(0), "{}", w.read("old.log"));
        for id in &first_jobs {
            let r = queue.result(*id).unwrap().expect("reported");
            assert_eq!(
                r.status,
                ResultStatus::Success,
                "killed by the upgrade: {r:?}"
            );
        }

        // The new one takes the queue and the old one's hosts over.
        let all_done = wait_until(Duration::from_secs(120), || {
            later_jobs
                .iter()
                .all(|id| queue.result(*id).unwrap().is_some())
        });
        assert!(
            all_done,
            "{:?}\n{}",
            queue.list().unwrap(),
            w.read("new.log")
        );
        let old_hosts: BTreeSet<String> = old_leases.keys().cloned().collect();
        let mut on_adopted = 0;
        for id in &later_jobs {
            let r = queue.result(*id).unwrap().unwrap();
            assert_eq!(r.status, ResultStatus::Success, "{r:?}");
            on_adopted += usize::from(old_hosts.contains(r.instance_id.as_deref().unwrap()));
        }
        // Usually all four; an adopted host that fails its heartbeat on a loaded machine is
        // replaced (its host leased again under a new id), which is right too.
        eprintln!(
            "{on_adopted} of {} later jobs ran on adopted hosts",
            later_jobs.len()
        );
        let log = w.read("new.log");
        assert!(log.contains("adopting instance"), "{log}");
        assert!(
            !log.contains("removing it for safety"),
            "the new manager removed a host it did not own: {log}"
        );

        // No slot held by two jobs at once, across both managers.
        let mut by_slot: BTreeMap<(String, u32), Vec<(i64, i64)>> = BTreeMap::new();
        for id in first_jobs.iter().chain(&later_jobs) {
            let r = queue.result(*id).unwrap().unwrap();
            by_slot
                .entry((r.instance_id.clone().unwrap(), r.slot.unwrap()))
                .or_default()
                .push((r.started_at_ms.unwrap(), r.finished_at_ms));
        }
        for (slot, mut spans) in by_slot {
            spans.sort_unstable();
            for pair in spans.windows(2) {
                assert!(
                    pair[0].1 <= pair[1].0,
                    "slot {slot:?} used twice at once: {pair:?}"
                );
            }
        }

        signal(new.id(), "TERM");
        let out = wait_with_timeout(new, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{}", w.read("new.log"));
    })
    .await
    .expect("the test's thread");
    drop(hosts);
}
