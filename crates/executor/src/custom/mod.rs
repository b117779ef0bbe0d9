//! GitLab's `custom` executor: user-supplied driver executables prepare an environment, run
//! each stage's script in it and clean it up, so existing custom-executor drivers work
//! unchanged.
//!
//! The protocol (GitLab Runner's `docs/executors/custom.md`):
//! - `config_exec` prints JSON on stdout (`builds_dir`, `cache_dir`, `builds_dir_is_shared`,
//!   `hostname`, `driver {name, version}`, `job_env`); its stderr goes to the trace.
//! - `prepare_exec` runs once; stdout and stderr go to the trace; a system failure is retried.
//! - `run_exec [run_args…] <script path> <stage name>` runs once per stage. Slipway runs the
//!   stages `prepare_script`, `get_sources` (creates a fresh project directory: Slipway does
//!   not check out sources yet), `step_script`, `after_script` and `cleanup_file_variables`.
//! - `cleanup_exec` always runs; its failure is only a warning. Its stdout goes to the runner's
//!   log at DEBUG and its stderr at WARN, masked.
//!
//! Every driver call gets the runner's environment, the job's variables and the predefined CI
//! variables prefixed with `CUSTOM_ENV_`, `JOB_RESPONSE_FILE` (the job payload as JSON),
//! `BUILD_FAILURE_EXIT_CODE`, `SYSTEM_FAILURE_EXIT_CODE`, `TMPDIR` (a per-job directory, also the
//! working directory) and `config_exec`'s `job_env`. Drivers run as process-group leaders; a
//! stage timeout, the job timeout or a cancel sends SIGTERM to the group, SIGKILL after
//! `graceful_kill_timeout`, and gives up on the process after `force_kill_timeout`.

mod cleanup;
mod config;
mod config_exec;
mod driver;
mod env;
mod error;
mod job_files;
mod prepare;
mod session;
mod stage_end;
mod stages;

use std::collections::BTreeMap;

use slipway_job::model::JobResponse;

use crate::executor::Executor;
use crate::job::JobSlot;
use tokio::time::Instant;

use crate::job::RunResult;
use slipway_job::outcome::{FailureReason, JobOutcome};

pub use config::CustomConfig;
pub use config_exec::{ConfigExecOutput, DriverInfo};
pub use env::custom_env;
pub use error::CustomError;
pub use prepare::{PREPARE_ATTEMPTS, PREPARE_RETRY_DELAY};

use job_files::JobFiles;
use session::Session;

/// Exit code a driver uses to report that the job failed (GitLab's value).
pub const BUILD_FAILURE_EXIT_CODE: i32 = 1;
/// Exit code a driver uses to report that the system failed (GitLab's value).
pub const SYSTEM_FAILURE_EXIT_CODE: i32 = 2;

/// GitLab's custom executor.
#[derive(Debug, Clone)]
pub struct CustomExecutor {
    /// The `[runners.custom]` settings.
    pub config: CustomConfig,
    /// `[[runners]] builds_dir` (should be absolute); `config_exec` may replace it.
    pub builds_dir: String,
}

impl CustomExecutor {
    /// A custom executor; fails when `run_exec` is missing.
    pub fn new(config: CustomConfig, builds_dir: impl Into<String>) -> Result<Self, CustomError> {
        config.validate()?;
        Ok(CustomExecutor {
            config,
            builds_dir: builds_dir.into(),
        })
    }

    /// Run a job: `config_exec`, `prepare_exec`, the `run_exec` stages, then `cleanup_exec`
    /// whatever happened.
    /// The custom protocol has no artifact stages in this version; the driver owns its
    /// environment, so no cgroup is applied here; a graceful cancel (`abort`) is not told
    /// apart: the driver's after_script stage is skipped on any cancel.
    pub async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        let JobSlot {
            slot,
            trace,
            cancel,
            ..
        } = slot;
        let timeout = job.timeout();
        trace.message("Preparing the \"custom\" executor");
        if let Err(e) = self.config.validate() {
            trace.message(&format!("ERROR: Preparation failed: {e}"));
            return failed(FailureReason::RunnerSystemFailure, None, e.to_string());
        }
        let files = match JobFiles::create(job).await {
            Ok(f) => f,
            Err(e) => {
                trace.message(&format!("ERROR: Preparation failed: {e}"));
                return failed(FailureReason::RunnerSystemFailure, None, e.to_string());
            }
        };
        let mut session = Session {
            exec: self,
            job,
            slot,
            files: &files,
            cancel,
            job_deadline: Instant::now() + timeout,
            timeout,
            builds_dir: self.builds_dir.clone(),
            shared: false,
            job_env: BTreeMap::new(),
            scripts: 0,
        };
        let outcome = session.run(trace).await;
        session.cleanup(trace).await;
        files.remove().await;
        RunResult {
            outcome,
            artifacts: Vec::new(),
        }
    }
}

fn failed(reason: FailureReason, code: Option<i32>, msg: String) -> RunResult {
    RunResult {
        outcome: JobOutcome::failed(reason, code, msg),
        artifacts: Vec::new(),
    }
}

#[async_trait::async_trait]
impl Executor for CustomExecutor {
    fn name(&self) -> &'static str {
        "custom"
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        CustomExecutor::run(self, job, slot).await
    }
}
