//! The job driver on this machine's bash (the shell executor's host): steps, failures,
//! timeout, cancel and masking, with real processes.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use slipway_executor::{JobRunner, JobSlot, LocalHost};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn job(id: u64, script: &[&str], after: &[&str], timeout_s: u64) -> JobResponse {
    let json = serde_json::json!({
        "id": id,
        "token": "job-token-secret",
        "runner_info": {"timeout": timeout_s},
        "variables": [
            {"key": "GREETING", "value": "hello", "public": true, "masked": false},
            {"key": "SECRET", "value": "s3cr3t-value", "public": false, "masked": true},
        ],
        "steps": [
            {"name": "script", "script": script, "timeout": timeout_s, "when": "on_success"},
            {"name": "after_script", "script": after, "timeout": 60, "when": "always"},
        ],
    });
    JobResponse::from_json(&json.to_string()).unwrap()
}

struct Ran {
    outcome: JobOutcome,
    output: String,
}

async fn run(job: &JobResponse, cancel: CancellationToken) -> (Ran, tempfile::TempDir) {
    run_with(job, cancel, None).await
}

async fn run_with(
    job: &JobResponse,
    cancel: CancellationToken,
    abort: Option<CancellationToken>,
) -> (Ran, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let runner = JobRunner {
        builds_dir: dir.path().display().to_string(),
        kill_grace_secs: 2,
        ..JobRunner::default()
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut trace = Trace::new(job.masked_values(), tx);
    let result = runner
        .run(
            job,
            &LocalHost::default(),
            JobSlot {
                cgroup: None,
                slot: 0,
                trace: &mut trace,
                cancel,
                abort,
                artifacts_in: Vec::new(),
                scratch_dir: None,
                max_collected: None,
                sources: None,
                data: None,
            },
        )
        .await;
    trace.finish();
    drop(trace);
    let mut output = Vec::new();
    while let Some(chunk) = rx.recv().await {
        output.extend(chunk);
    }
    (
        Ran {
            outcome: result.outcome,
            output: String::from_utf8_lossy(&output).into_owned(),
        },
        dir,
    )
}

fn alive(marker: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", marker])
        .status()
        .unwrap()
        .success()
}

#[tokio::test]
async fn a_job_runs_its_steps_with_variables_and_masks_secrets() {
    // The secret is printed in two writes: masking works across output chunks.
    let j = job(
        1,
        &[
            "echo \"$GREETING from $(basename \"$CI_PROJECT_DIR\")\"",
            "printf 's3cr'; sleep 0.2; printf '3t-value\\n'",
        ],
        &["echo after"],
        60,
    );
    let (ran, dir) = run(&j, CancellationToken::new()).await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(ran.output.contains("hello from job-1"), "{}", ran.output);
    assert!(ran.output.contains("[MASKED]"), "{}", ran.output);
    assert!(!ran.output.contains("s3cr3t-value"), "{}", ran.output);
    assert!(ran.output.contains("after"), "{}", ran.output);
    // Cleanup removed the job's directory.
    assert!(!dir.path().join("slot-0/job-1").exists());
}

#[tokio::test]
async fn a_payload_with_a_huge_timeout_runs_instead_of_panicking() {
    // `runner_info.timeout` comes from the job payload: u64::MAX seconds must not overflow the
    // deadline it becomes.
    let j = job(3, &["echo ran"], &[], u64::MAX);
    let (ran, _dir) = run(&j, CancellationToken::new()).await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(ran.output.contains("ran"), "{}", ran.output);
}

#[tokio::test]
async fn a_failing_script_reports_its_exit_code_and_after_script_still_runs() {
    let j = job(
        2,
        &["echo before", "exit 3", "echo never"],
        &["echo after ran"],
        60,
    );
    let (ran, _dir) = run(&j, CancellationToken::new()).await;
    match &ran.outcome {
        JobOutcome::Failed {
            reason, exit_code, ..
        } => {
            assert_eq!(*reason, FailureReason::ScriptFailure);
            assert_eq!(*exit_code, Some(3));
        }
        other => panic!("{other:?}"),
    }
    assert!(!ran.output.contains("never\n"), "{}", ran.output);
    assert!(ran.output.contains("after ran"), "{}", ran.output);
}

#[tokio::test]
async fn a_job_past_its_timeout_is_stopped_with_its_processes() {
    let marker = format!("slipway-timeout-{}", std::process::id());
    let j = job(
        3,
        &[&format!("bash -c 'exec -a {marker} sleep 300' & wait")],
        &[],
        1,
    );
    let (ran, _dir) = run(&j, CancellationToken::new()).await;
    match &ran.outcome {
        JobOutcome::Failed { reason, .. } => {
            assert_eq!(
                *reason,
                FailureReason::JobExecutionTimeout,
                "{}",
                ran.output
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(!alive(&marker), "the step's child outlived the timeout");
}

#[tokio::test]
async fn a_graceful_cancel_still_runs_after_script_and_an_abort_does_not() {
    for abort_too in [false, true] {
        let cancel = CancellationToken::new();
        let abort = CancellationToken::new();
        let (c, a) = (cancel.clone(), abort.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            if abort_too {
                a.cancel();
            }
            c.cancel();
        });
        let j = job(
            5,
            &["echo started", "sleep 300"],
            &["echo after-script-cleaned-up"],
            60,
        );
        let (ran, _dir) = run_with(&j, cancel, Some(abort)).await;
        match &ran.outcome {
            JobOutcome::Failed { reason, .. } => assert_eq!(*reason, FailureReason::JobCanceled),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            ran.output.contains("after-script-cleaned-up"),
            !abort_too,
            "abort={abort_too}:\n{}",
            ran.output
        );
    }
}

#[tokio::test]
async fn cancel_sends_sigterm_first_then_stops_the_job() {
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        stop.cancel();
    });
    let j = job(
        4,
        &[
            "trap 'echo got TERM; exit 1' TERM",
            "echo started",
            "sleep 300 & wait",
        ],
        &["echo after"],
        60,
    );
    let (ran, _dir) = run(&j, cancel).await;
    match &ran.outcome {
        JobOutcome::Failed { reason, .. } => assert_eq!(*reason, FailureReason::JobCanceled),
        other => panic!("{other:?}"),
    }
    assert!(ran.output.contains("got TERM"), "{}", ran.output);
    assert!(
        ran.output.contains("Skipping after_script"),
        "{}",
        ran.output
    );
}
