//! A graceful drain, as GitLab Runner's SIGQUIT: the manager takes no more jobs, lets the
//! running ones finish (within `shutdown_timeout`), reports each once, and exits by itself,
//! on the embedded queue and on GitLab.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use common::{World, plugin_processes, signal, wait_until};
use slipway_job::JobStatus as ResultStatus;
use slipway_manager::source::queue::spool::{JobState, Queue};
use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};

/// One runner on `fleeting-plugin-local` with a single slot, so a second job must wait.
fn queue_config(w: &World, shutdown_timeout: u64) -> PathBuf {
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 4
shutdown_timeout = {shutdown_timeout}
[[runners]]
  name = "drain"
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
      name = "dr{}"
"#,
            w.path().join("plugin-state").display(),
            std::process::id()
        ),
    )
}

/// Wait for the manager to exit by itself after SIGQUIT: exit 0, nothing of this world left.
fn exits_by_itself(w: &World, child: Child) -> String {
    let out = common::wait_with_timeout(child, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
    assert!(plugin_processes(w).is_empty(), "{:?}", plugin_processes(w));
    stderr
}

/// Wait until the queue's first job holds a slot.
fn first_running(queue: &Queue) {
    let started = wait_until(Duration::from_secs(120), || {
        matches!(
            queue.list().unwrap().first().map(|e| &e.state),
            Some(JobState::Running(Some(_)))
        )
    });
    assert!(started, "{:?}", queue.list().unwrap());
}

#[test]
fn sigquit_lets_the_running_queue_job_finish_and_takes_no_other() {
    let w = World::new();
    let cfg = queue_config(&w, 120);
    let queue = Queue::open(w.path().join(".slipway-queue")).unwrap();
    let ids = w.submit(
        &cfg,
        "pipeline.yml",
        "long:\n  script: [\"sleep 4\", \"echo long-finished\"]\nnext:\n  script: [\"echo next-ran\"]\n",
    );
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("spawn manager");
    first_running(&queue);
    signal(manager.id(), "QUIT");
    let stderr = exits_by_itself(&w, manager);
    assert!(stderr.contains("SIGQUIT"), "{stderr}");

    // The running job finished on its own terms, reported once.
    let r = queue.result(ids[0]).unwrap().expect("reported");
    assert_eq!(r.status, ResultStatus::Success, "{r:?}");
    let log = std::fs::read_to_string(queue.log_path(ids[0])).unwrap();
    assert!(log.contains("long-finished"), "{log}");
    assert_eq!(log.matches("Job succeeded").count(), 1, "{log}");
    // The waiting one was never taken: it stays queued for the next manager.
    assert_eq!(queue.pending().unwrap(), vec![ids[1]]);
    assert!(queue.running().unwrap().is_empty());
}

#[test]
fn a_job_still_running_at_shutdown_timeout_is_canceled_and_reported() {
    let w = World::new();
    let cfg = queue_config(&w, 2);
    let queue = Queue::open(w.path().join(".slipway-queue")).unwrap();
    let ids = w.submit(
        &cfg,
        "pipeline.yml",
        "forever:\n  script: [\"sleep 600\"]\n",
    );
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("spawn manager");
    first_running(&queue);
    signal(manager.id(), "QUIT");
    let stderr = exits_by_itself(&w, manager);
    assert!(stderr.contains("shutdown_timeout"), "{stderr}");
    let r = queue.result(ids[0]).unwrap().expect("reported");
    assert_eq!(r.status, ResultStatus::Canceled, "{r:?}");
    assert!(queue.running().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_lets_the_running_gitlab_job_finish_and_requests_no_more() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    // No repository to fetch: the job's sources are not what this test is about.
    let none = [("GIT_STRATEGY", "none")];
    let long = gl.enqueue(job_payload_with_vars(
        "long",
        &["sleep 4", "echo gitlab-long-finished"],
        &none,
    ));
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
check_interval = 1
shutdown_timeout = 120
[[runners]]
  name = "drain-gl"
  url = "{url}"
  token = "{token}"
  executor = "instance"
{autoscaler}"#,
            url = gl.url(),
            token = gl.runner_token(),
            autoscaler = common::local_autoscaler(&w, "dg"),
        ),
    );
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("spawn manager");
    let running = wait_until(Duration::from_secs(180), || {
        gl.job(long)
            .is_some_and(|j| j.trace_text().contains("Running on instance"))
    });
    assert!(running, "{:?}", gl.job(long).map(|j| j.trace_text()));
    signal(manager.id(), "QUIT");
    // Queued after the drain began: no request may take it.
    let later = gl.enqueue(job_payload_with_vars("later", &["echo later-ran"], &none));
    let requests_before = gl.requests_to("/api/v4/jobs/request").len();
    // Blocks one of the two runtime threads; the fake GitLab answers on the other.
    let stderr = exits_by_itself(&w, manager);

    let job = gl.job(long).unwrap();
    assert_eq!(job.accepted_final_states(), vec!["success"], "{stderr}");
    assert!(
        job.trace_text().contains("gitlab-long-finished"),
        "{}",
        job.trace_text()
    );
    let later = gl.job(later).unwrap();
    assert_eq!(later.state, "pending", "{stderr}");
    assert!(later.handed_out_ms.is_none(), "{later:?}");
    // At most a request already on the wire when the signal came, and it got nothing.
    let requests_after = gl.requests_to("/api/v4/jobs/request").len();
    assert!(
        requests_after <= requests_before + 1,
        "{requests_before} -> {requests_after}"
    );
}
