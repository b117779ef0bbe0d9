//! One job's state while it walks through the driver's stages.

use std::collections::BTreeMap;
use std::time::Duration;

use slipway_job::model::JobResponse;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::script::{self, JobDirs};
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

use super::driver::{Driver, Limits};
use super::job_files::JobFiles;
use super::{CustomConfig, CustomError, CustomExecutor};

/// One job's walk through the driver's stages.
pub(super) struct Session<'a> {
    pub(super) exec: &'a CustomExecutor,
    pub(super) job: &'a JobResponse,
    pub(super) slot: u32,
    pub(super) files: &'a JobFiles,
    pub(super) cancel: CancellationToken,
    pub(super) job_deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) builds_dir: String,
    pub(super) shared: bool,
    pub(super) job_env: BTreeMap<String, String>,
    pub(super) scripts: u32,
}

impl Session<'_> {
    pub(super) fn cfg(&self) -> &CustomConfig {
        &self.exec.config
    }

    pub(super) fn dirs(&self) -> JobDirs {
        JobDirs {
            builds_dir: self.builds_dir.clone(),
            slot: self.slot,
            job_id: self.job.id,
            // The driver chooses where the job lives (`builds_dir` of config_exec).
            clone_path: None,
        }
    }

    pub(super) fn driver(&self, program: &str, args: Vec<String>) -> Driver {
        Driver {
            program: program.to_string(),
            args,
            env: self.env(),
            dir: self.files.path().to_path_buf(),
            graceful: self.cfg().graceful_kill(),
            force: self.cfg().force_kill(),
        }
    }

    pub(super) fn limits(&self, stage_timeout: Option<Duration>) -> Limits {
        Limits {
            job_deadline: Some(self.job_deadline),
            stage_deadline: stage_timeout.map(|t| Instant::now() + t),
            cancel: Some(self.cancel.clone()),
        }
    }

    /// Everything up to `cleanup_exec`.
    pub(super) async fn run(&mut self, trace: &mut Trace) -> JobOutcome {
        for key in script::unexportable_variables(self.job) {
            trace.message(&format!(
                "WARNING: variable {key:?} is not a valid shell name; it is not passed to the job"
            ));
        }
        if let Err(outcome) = self.config(trace).await {
            return outcome;
        }
        if self.builds_dir.trim().is_empty() {
            let e = CustomError::MissingBuildsDir;
            trace.message(&format!("ERROR: Preparation failed: {e}"));
            return JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
        }
        if let Err(outcome) = self.prepare(trace).await {
            return outcome;
        }
        self.stages(trace).await
    }
}
