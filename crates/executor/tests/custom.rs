//! GitLab's custom executor with an existing-style driver written as shell scripts (the shape
//! of GitLab's documentation examples): real processes, real signals.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use slipway_executor::{CustomConfig, CustomExecutor, JobSlot};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A driver in a temp dir: config.sh, prepare.sh, run.sh, cleanup.sh, with `@ROOT@` replaced
/// by the dir.
struct Fixture {
    dir: tempfile::TempDir,
}

const CONFIG_SH: &str = r#"#!/usr/bin/env bash
echo "config: job $CUSTOM_ENV_CI_JOB_ID" >&2
cat <<EOS
{
  "builds_dir": "@ROOT@/builds",
  "builds_dir_is_shared": false,
  "hostname": "custom-host",
  "driver": {"name": "test-driver", "version": "v0.0.1"},
  "job_env": {"DRIVER_SESSION": "session-$CUSTOM_ENV_CI_JOB_ID"}
}
EOS
"#;

const PREPARE_SH: &str = r#"#!/usr/bin/env bash
set -eu
echo x >> "@ROOT@/prepare-attempts"
echo "prepare: session=$DRIVER_SESSION secret=$CUSTOM_ENV_SECRET tmpdir=$TMPDIR"
if grep -q "\"id\":$CUSTOM_ENV_CI_JOB_ID," "$JOB_RESPONSE_FILE"; then
  echo "prepare: job response file ok"
fi
mkdir -p "@ROOT@/envs/job-$CUSTOM_ENV_CI_JOB_ID"
"#;

const RUN_SH: &str = r#"#!/usr/bin/env bash
trap 'echo "run.sh: got SIGTERM in $2"; exit "$SYSTEM_FAILURE_EXIT_CODE"' TERM
echo "run.sh: stage $2 job=$CUSTOM_ENV_CI_JOB_ID greeting=$CUSTOM_ENV_GREETING session=$DRIVER_SESSION"
cd "@ROOT@/envs/job-$CUSTOM_ENV_CI_JOB_ID" || exit "$SYSTEM_FAILURE_EXIT_CODE"
bash "$1" || exit "$BUILD_FAILURE_EXIT_CODE"
"#;

const CLEANUP_SH: &str = r#"#!/usr/bin/env bash
rm -rf "@ROOT@/envs/job-$CUSTOM_ENV_CI_JOB_ID"
echo "cleaned up" > "@ROOT@/cleanup-$CUSTOM_ENV_CI_JOB_ID"
"#;

impl Fixture {
    fn new() -> Self {
        let f = Fixture {
            dir: tempfile::tempdir().unwrap(),
        };
        f.write("config.sh", CONFIG_SH);
        f.write("prepare.sh", PREPARE_SH);
        f.write("run.sh", RUN_SH);
        f.write("cleanup.sh", CLEANUP_SH);
        f
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, name: &str, body: &str) {
        let path = self.root().join(name);
        let body = body.replace("@ROOT@", &self.root().display().to_string());
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn path(&self, name: &str) -> String {
        self.root().join(name).display().to_string()
    }

    fn config(&self) -> CustomConfig {
        CustomConfig {
            config_exec: self.path("config.sh"),
            prepare_exec: self.path("prepare.sh"),
            run_exec: self.path("run.sh"),
            cleanup_exec: self.path("cleanup.sh"),
            graceful_kill_timeout: 10,
            force_kill_timeout: 10,
            ..CustomConfig::default()
        }
    }

    fn cleanup_ran(&self, job: u64) -> bool {
        self.root().join(format!("cleanup-{job}")).exists()
    }

    fn prepare_attempts(&self) -> usize {
        std::fs::read_to_string(self.root().join("prepare-attempts"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

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

/// Run `job`; `cancel_on` cancels the job once the trace shows that text.
async fn run_job(
    config: CustomConfig,
    builds_dir: &Path,
    job: &JobResponse,
    cancel_on: Option<&str>,
) -> Ran {
    let exec = CustomExecutor::new(config, builds_dir.display().to_string()).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut trace = Trace::new(job.masked_values(), tx);
    let cancel = CancellationToken::new();
    let mut output = Vec::new();
    let result = {
        let run = exec.run(
            job,
            JobSlot {
                slot: 0,
                cgroup: None,
                trace: &mut trace,
                cancel: cancel.clone(),
                abort: None,
                artifacts_in: Vec::new(),
                scratch_dir: None,
                max_collected: None,
                sources: None,
                data: None,
            },
        );
        let watch = async {
            while let Some(chunk) = rx.recv().await {
                output.extend(chunk);
                if let Some(text) = cancel_on
                    && !cancel.is_cancelled()
                    && String::from_utf8_lossy(&output).contains(text)
                {
                    cancel.cancel();
                }
            }
        };
        tokio::select! {
            r = run => r,
            _ = watch => unreachable!("the trace outlives the run"),
        }
    };
    trace.finish();
    drop(trace);
    while let Some(chunk) = rx.recv().await {
        output.extend(chunk);
    }
    Ran {
        outcome: result.outcome,
        output: String::from_utf8_lossy(&output).into_owned(),
    }
}

fn alive(marker: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", marker])
        .status()
        .unwrap()
        .success()
}

fn failure(outcome: &JobOutcome) -> (FailureReason, Option<i32>, String) {
    match outcome {
        JobOutcome::Failed {
            reason,
            exit_code,
            message,
        } => (*reason, *exit_code, message.clone()),
        JobOutcome::Success => panic!("expected a failure"),
    }
}

fn pos(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the trace:\n{haystack}"))
}

fn tmpdir_of(output: &str) -> PathBuf {
    let start = pos(output, "tmpdir=") + "tmpdir=".len();
    let end = output[start..].find('\n').unwrap() + start;
    PathBuf::from(&output[start..end])
}

#[tokio::test]
async fn a_passing_job_runs_every_stage_in_order_with_custom_env() {
    let fx = Fixture::new();
    let j = job(
        11,
        &["echo \"step says $GREETING in $(basename \"$PWD\")\""],
        &["echo after-script-ran"],
        120,
    );
    let ran = run_job(fx.config(), &fx.root().join("unused"), &j, None).await;
    let out = &ran.output;
    assert!(ran.outcome.is_success(), "{out}");

    // Driver banner, then the stages in GitLab's order, then after_script.
    let banner = pos(
        out,
        "Using Custom executor with driver test-driver v0.0.1...",
    );
    let config_stderr = pos(out, "config: job 11");
    let prepare = pos(out, "prepare: session=session-11");
    let prepare_script = pos(out, "run.sh: stage prepare_script");
    let running_on = pos(out, "Running on ");
    let get_sources = pos(out, "run.sh: stage get_sources");
    let step_stage = pos(out, "run.sh: stage step_script job=11 greeting=hello");
    let step = pos(out, "step says hello in job-11");
    let after_stage = pos(out, "run.sh: stage after_script");
    let after = pos(out, "after-script-ran");
    let file_vars = pos(out, "run.sh: stage cleanup_file_variables");
    assert!(config_stderr < banner, "{out}");
    assert!(banner < prepare && prepare < prepare_script, "{out}");
    assert!(
        prepare_script < running_on && running_on < get_sources,
        "{out}"
    );
    assert!(get_sources < step_stage && step_stage < step, "{out}");
    assert!(
        step < after_stage && after_stage < after && after < file_vars,
        "{out}"
    );

    // job_env reached every later driver call; JOB_RESPONSE_FILE held the payload.
    assert!(out.contains("session=session-11"), "{out}");
    assert!(out.contains("prepare: job response file ok"), "{out}");
    // The driver saw the masked variable; the trace did not.
    assert!(out.contains("secret=[MASKED]"), "{out}");
    assert!(!out.contains("s3cr3t-value"), "{out}");

    // config_exec's builds_dir was used; cleanup_exec ran; the per-job temp dir is gone.
    assert!(fx.root().join("builds/slot-0/job-11").is_dir());
    assert!(!fx.root().join("unused").exists());
    assert!(fx.cleanup_ran(11));
    assert!(!fx.root().join("envs/job-11").exists());
    let tmpdir = tmpdir_of(out);
    assert!(!tmpdir.exists(), "{} left behind", tmpdir.display());
}

#[tokio::test]
async fn a_failing_script_is_a_script_failure_with_its_exit_code() {
    let fx = Fixture::new();
    let j = job(
        12,
        &["echo before", "exit 3", "echo never"],
        &["echo after ran"],
        120,
    );
    let ran = run_job(fx.config(), fx.root(), &j, None).await;
    let (reason, code, _) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::ScriptFailure, "{}", ran.output);
    assert_eq!(code, Some(3), "{}", ran.output);
    assert!(ran.output.contains("before"), "{}", ran.output);
    assert!(!ran.output.contains("never\n"), "{}", ran.output);
    assert!(ran.output.contains("ERROR: Job failed: exit code 3"));
    assert!(ran.output.contains("after ran"), "{}", ran.output);
    assert!(fx.cleanup_ran(12));
}

#[tokio::test]
async fn an_unknown_driver_exit_code_is_a_system_failure() {
    let fx = Fixture::new();
    fx.write(
        "run.sh",
        "#!/usr/bin/env bash\n[ \"$2\" = step_script ] && exit 42\nbash \"$1\"\n",
    );
    let ran = run_job(fx.config(), fx.root(), &job(13, &["true"], &[], 120), None).await;
    let (reason, _, msg) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::RunnerSystemFailure, "{}", ran.output);
    assert!(msg.contains("exit code 42"), "{msg}");
    assert!(fx.cleanup_ran(13));
}

#[tokio::test]
async fn a_system_failure_in_prepare_is_retried_then_fails_and_cleanup_still_runs() {
    let fx = Fixture::new();
    fx.write(
        "prepare.sh",
        "#!/usr/bin/env bash\necho x >> \"@ROOT@/prepare-attempts\"\necho 'prepare: no capacity' >&2\nexit \"$SYSTEM_FAILURE_EXIT_CODE\"\n",
    );
    let ran = run_job(
        fx.config(),
        fx.root(),
        &job(14, &["echo hi"], &[], 120),
        None,
    )
    .await;
    let (reason, _, _) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::RunnerSystemFailure, "{}", ran.output);
    assert_eq!(fx.prepare_attempts(), 3, "{}", ran.output);
    assert!(
        ran.output.contains("prepare: no capacity"),
        "{}",
        ran.output
    );
    assert!(!ran.output.contains("run.sh: stage"), "{}", ran.output);
    assert!(fx.cleanup_ran(14));
}

#[tokio::test]
async fn a_job_past_its_timeout_is_stopped_with_its_processes() {
    let fx = Fixture::new();
    let marker = format!("slipway-custom-timeout-{}", std::process::id());
    let j = job(
        15,
        &[
            "echo started",
            &format!("bash -c 'exec -a {marker} sleep 300' & wait"),
        ],
        &[],
        4,
    );
    let ran = run_job(fx.config(), fx.root(), &j, None).await;
    let (reason, _, _) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::JobExecutionTimeout, "{}", ran.output);
    assert!(ran.output.contains("started"), "{}", ran.output);
    assert!(!alive(&marker), "the job's process outlived the timeout");
    assert!(fx.cleanup_ran(15));
}

#[tokio::test]
async fn cancel_sends_sigterm_to_the_driver_first() {
    let fx = Fixture::new();
    let marker = format!("slipway-custom-cancel-{}", std::process::id());
    let j = job(
        16,
        &[
            "echo step-started",
            &format!("bash -c 'exec -a {marker} sleep 300' & wait"),
        ],
        &["echo after"],
        600,
    );
    let ran = run_job(fx.config(), fx.root(), &j, Some("step-started")).await;
    let (reason, _, _) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::JobCanceled, "{}", ran.output);
    // The driver's TERM trap ran: SIGTERM came before any SIGKILL.
    assert!(
        ran.output.contains("run.sh: got SIGTERM in step_script"),
        "{}",
        ran.output
    );
    assert!(
        ran.output.contains("Skipping after_script"),
        "{}",
        ran.output
    );
    assert!(!alive(&marker), "the job's process outlived the cancel");
    assert!(fx.cleanup_ran(16));
}

#[tokio::test]
async fn masked_variables_never_reach_the_trace_even_split_across_writes() {
    let fx = Fixture::new();
    let j = job(
        17,
        &[
            "echo \"whole: $SECRET\"",
            "printf 'split: s3cr'; sleep 0.2; printf '3t-value\\n'",
        ],
        &["echo \"after: $SECRET\""],
        120,
    );
    let ran = run_job(fx.config(), fx.root(), &j, None).await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(!ran.output.contains("s3cr3t-value"), "{}", ran.output);
    assert!(ran.output.contains("whole: [MASKED]"), "{}", ran.output);
    assert!(ran.output.contains("split: [MASKED]"), "{}", ran.output);
    assert!(ran.output.contains("after: [MASKED]"), "{}", ran.output);
}

#[tokio::test]
async fn prepare_past_its_timeout_is_a_system_failure() {
    let fx = Fixture::new();
    let marker = format!("slipway-custom-prepare-{}", std::process::id());
    fx.write(
        "prepare.sh",
        &format!("#!/usr/bin/env bash\necho preparing\nbash -c 'exec -a {marker} sleep 300'\n"),
    );
    let config = CustomConfig {
        prepare_exec_timeout: 2,
        ..fx.config()
    };
    let ran = run_job(config, fx.root(), &job(18, &["echo hi"], &[], 120), None).await;
    let (reason, _, msg) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::RunnerSystemFailure, "{}", ran.output);
    assert!(msg.contains("prepare_exec timed out"), "{msg}");
    assert!(!ran.output.contains("run.sh: stage"), "{}", ran.output);
    assert!(!alive(&marker), "prepare_exec outlived its timeout");
    assert!(fx.cleanup_ran(18));
}

#[tokio::test]
async fn config_past_its_timeout_is_a_system_failure() {
    let fx = Fixture::new();
    let marker = format!("slipway-custom-config-{}", std::process::id());
    fx.write(
        "config.sh",
        &format!("#!/usr/bin/env bash\nbash -c 'exec -a {marker} sleep 300'\n"),
    );
    let config = CustomConfig {
        config_exec_timeout: 2,
        ..fx.config()
    };
    let ran = run_job(config, fx.root(), &job(19, &["echo hi"], &[], 120), None).await;
    let (reason, _, msg) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::RunnerSystemFailure, "{}", ran.output);
    assert!(msg.contains("config_exec timed out"), "{msg}");
    assert_eq!(fx.prepare_attempts(), 0);
    assert!(!alive(&marker), "config_exec outlived its timeout");
    assert!(fx.cleanup_ran(19));
}

#[tokio::test]
async fn invalid_config_json_is_retried_then_a_system_failure() {
    let fx = Fixture::new();
    fx.write(
        "config.sh",
        "#!/usr/bin/env bash\necho x >> \"@ROOT@/config-attempts\"\necho 'not json'\n",
    );
    let ran = run_job(
        fx.config(),
        fx.root(),
        &job(20, &["echo hi"], &[], 120),
        None,
    )
    .await;
    let (reason, _, msg) = failure(&ran.outcome);
    assert_eq!(reason, FailureReason::RunnerSystemFailure, "{}", ran.output);
    assert!(msg.contains("JSON"), "{msg}");
    let attempts = std::fs::read_to_string(fx.root().join("config-attempts")).unwrap();
    assert_eq!(attempts.lines().count(), 3);
    assert!(fx.cleanup_ran(20));
}

#[tokio::test]
async fn cleanup_past_its_timeout_is_only_a_warning() {
    let fx = Fixture::new();
    let marker = format!("slipway-custom-cleanup-{}", std::process::id());
    fx.write(
        "cleanup.sh",
        &format!(
            "#!/usr/bin/env bash\necho started > \"@ROOT@/cleanup-$CUSTOM_ENV_CI_JOB_ID\"\nbash -c 'exec -a {marker} sleep 300'\n"
        ),
    );
    let config = CustomConfig {
        cleanup_exec_timeout: 2,
        ..fx.config()
    };
    let ran = run_job(config, fx.root(), &job(21, &["echo hi"], &[], 120), None).await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(
        ran.output
            .contains("WARNING: Cleanup script failed: timed out"),
        "{}",
        ran.output
    );
    assert!(fx.cleanup_ran(21));
    assert!(!alive(&marker), "cleanup_exec outlived its timeout");
}

#[tokio::test]
async fn a_driver_without_config_or_prepare_still_runs() {
    let fx = Fixture::new();
    // run.sh needs the per-job dir prepare.sh would have made.
    fx.write(
        "run.sh",
        "#!/usr/bin/env bash\nbash \"$1\" || exit \"$BUILD_FAILURE_EXIT_CODE\"\n",
    );
    let config = CustomConfig {
        run_exec: fx.path("run.sh"),
        ..CustomConfig::default()
    };
    let builds = fx.root().join("b");
    let ran = run_job(
        config,
        &builds,
        &job(22, &["echo \"dir $PWD\""], &[], 120),
        None,
    )
    .await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(
        ran.output.contains("Using Custom executor..."),
        "{}",
        ran.output
    );
    assert!(
        ran.output
            .contains(&format!("dir {}/slot-0/job-22", builds.display())),
        "{}",
        ran.output
    );
}
