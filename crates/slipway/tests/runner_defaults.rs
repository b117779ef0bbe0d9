//! What a runner's config.toml adds to every job — `environment`, `pre_build_script`,
//! `post_build_script` — counts whatever the job's source: a local pipeline (`slipway exec`)
//! and the embedded queue (`slipway run`), as it does for GitLab jobs (gitlab_fake.rs).

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{World, stop_manager, wait_until};
use slipway_job::JobStatus as ResultStatus;
use slipway_manager::source::queue::spool::Queue;

/// A shell runner on this machine with all three defaults.
const CONFIG: &str = r#"
concurrent = 2
[[runners]]
  name = "defaults"
  executor = "shell"
  environment = ["FROM_RUNNER=set-in-config", "CI_JOB_NAME=overridden"]
  pre_build_script = "echo pre-build-ran"
  post_build_script = "echo post-build-ran"
"#;

const PIPELINE: &str = r#"
job:
  script:
    - 'echo "env: $FROM_RUNNER name: $CI_JOB_NAME"' 
"#;

/// The lines of `text` that hold each of `needles`, in order: they must appear in that order.
fn in_order(text: &str, needles: &[&str]) {
    let mut at = 0;
    for n in needles {
        match text[at..].find(n) {
            Some(i) => at += i + n.len(),
            None => panic!("{n:?} missing (or out of order) in:\n{text}"),
        }
    }
}

#[test]
fn a_local_pipeline_gets_the_runners_environment_and_build_scripts() {
    let w = World::new();
    let cfg = w.write("config.toml", CONFIG);
    let file = w.write(".gitlab-ci.yml", PIPELINE);
    let run = w.run(&["exec", file.to_str().unwrap(), "-c", cfg.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    // The runner's environment overrides the job's own variables, as in GitLab Runner.
    in_order(
        &run.stdout,
        &[
            "pre-build-ran",
            "env: set-in-config name: overridden",
            "post-build-ran",
        ],
    );
}

/// Submit `file` to the queue of `cfg`, run the manager until job `id`'s result is in `queue`,
/// stop it; the job's trace.
fn run_queued(
    w: &World,
    cfg: &std::path::Path,
    file: &std::path::Path,
    queue_dir: &std::path::Path,
) -> String {
    let submitted = w.run(&[
        "submit",
        "-c",
        cfg.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    assert_eq!(submitted.code, Some(0), "{}", submitted.explain());
    let id: u64 = submitted
        .stdout
        .split('\t')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let queue = Queue::open(queue_dir).unwrap();
    assert!(
        queue.list().unwrap().iter().any(|e| e.id == id),
        "job {id} is not in {}",
        queue_dir.display()
    );
    let manager = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .expect("spawn manager");
    let done = wait_until(Duration::from_secs(60), || {
        queue.result(id).unwrap().is_some()
    });
    stop_manager(w, manager);
    assert!(done, "{:?}", queue.list().unwrap());
    let r = queue.result(id).unwrap().unwrap();
    assert_eq!(r.status, ResultStatus::Success, "{r:?}");
    std::fs::read_to_string(queue.log_path(id)).unwrap()
}

#[test]
fn a_queued_job_gets_the_runners_environment_and_build_scripts() {
    let w = World::new();
    let cfg = w.write("config.toml", CONFIG);
    let file = w.write("pipeline.yml", PIPELINE);
    let log = run_queued(&w, &cfg, &file, &w.path().join(".slipway-queue"));
    in_order(
        &log,
        &[
            "pre-build-ran",
            "env: set-in-config name: overridden",
            "post-build-ran",
        ],
    );
}

/// With `state_dir` set (as the Debian package sets /var/lib/slipway), the queue, the state and
/// a local runner's default builds directory live in it, not beside config.toml or above it.
#[test]
fn state_dir_holds_the_queue_the_state_and_the_default_builds() {
    let w = World::new();
    std::fs::create_dir_all(w.path().join("etc")).unwrap();
    let cfg = w.write(
        "etc/config.toml",
        "concurrent = 1\nstate_dir = \"../var\"\n[[runners]]\n  name = \"here\"\n  executor = \"shell\"\n",
    );
    let file = w.write("pipeline.yml", "job:\n  script:\n    - pwd\n");
    let log = run_queued(&w, &cfg, &file, &w.path().join("var/queue"));
    let builds = std::fs::canonicalize(w.path().join("var/builds")).unwrap();
    assert!(log.contains(&builds.display().to_string()), "{log}");
    assert!(!w.path().join("etc/.slipway-queue").exists());
    assert!(!w.path().join("etc/.slipway-state").exists());
    assert!(
        !w.path().join("builds").exists(),
        "builds/ landed above state_dir"
    );
}
