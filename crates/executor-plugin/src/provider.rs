//! The [`ExecutorProvider`] trait and the types both sides of the boundary see.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

pub use crate::proto::v1::{Instance, Resources};

/// Where a provider's jobs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the manager's own machine: the runner needs no autoscaler.
    Local,
    /// On an autoscaled instance: [`PrepareJob::instance`] says how to reach it.
    Instance,
}

/// What a provider offers, answered by `Init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Provider name, for logs and job traces.
    pub name: String,
    /// Provider version.
    pub version: String,
    /// Isolation levels it gives a job; the first is the default.
    pub isolation_levels: Vec<String>,
    /// Where its jobs run.
    pub placement: Placement,
    /// Its job environments reach GitLab and the object store, so the runner's job helper
    /// moves the jobs' data there (proto `job_data`).
    pub job_data: bool,
}

/// One job to prepare an environment for.
#[derive(Debug, Clone)]
pub struct PrepareJob {
    /// GitLab's job payload as JSON.
    pub job: Vec<u8>,
    /// The isolation level chosen for the job.
    pub isolation: String,
    /// What the runner reserved for it.
    pub resources: Resources,
    /// How to reach the instance (placement [`Placement::Instance`] only).
    pub instance: Option<Instance>,
    /// The job's timeout; the host enforces it too.
    pub timeout: Duration,
}

/// A prepared job environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// Opaque state passed back into every later call for the job.
    pub state: Vec<u8>,
    /// Builds root inside the environment; `None`: the runner's `builds_dir`.
    pub builds_dir: Option<String>,
    /// A persistent cache directory inside the environment; `None`: no cache.
    pub cache_dir: Option<String>,
    /// Lines for the job's trace.
    pub messages: Vec<String>,
}

/// One stage's script to run in a prepared environment.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The job's state from [`Prepared::state`].
    pub state: Vec<u8>,
    /// GitLab's stage name (`step_script`, `upload_artifacts_on_success`, ...).
    pub name: String,
    /// The bash script.
    pub script: Vec<u8>,
    /// The script's standard input, then end of file.
    pub stdin: Vec<u8>,
    /// The job's instance (placement [`Placement::Instance`]), on every call: a restarted
    /// plugin reaches it without keeping credentials in the state.
    pub instance: Option<Instance>,
}

/// How a job ended, for [`ExecutorProvider::cleanup`]: the house's one final status.
pub use slipway_job::JobStatus;

/// A job whose environment is to be removed.
#[derive(Debug, Clone)]
pub struct CleanupJob {
    /// The job's state from [`Prepared::state`].
    pub state: Vec<u8>,
    /// The job's instance (placement [`Placement::Instance`]).
    pub instance: Option<Instance>,
    /// How the job ended.
    pub status: JobStatus,
}

/// Output of a running stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Bytes the script wrote to stdout.
    Stdout(Vec<u8>),
    /// Bytes the script wrote to stderr.
    Stderr(Vec<u8>),
}

/// How a stage failed, in GitLab's failure-reason vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The script ran; its exit code decides.
    None,
    /// `script_failure`.
    Script,
    /// `runner_system_failure`: the environment failed.
    System,
}

/// How a stage ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The script's exit code.
    pub code: i32,
    /// Why it failed, beyond its exit code.
    pub failure: Failure,
    /// Details for the trace.
    pub message: String,
}

impl Exit {
    /// The script exited with `code`.
    pub fn code(code: i32) -> Self {
        Exit {
            code,
            failure: Failure::None,
            message: String::new(),
        }
    }

    /// Did the stage succeed?
    pub fn success(&self) -> bool {
        self.code == 0 && matches!(self.failure, Failure::None)
    }
}

/// Why a provider call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The config (or a request) is not what the provider accepts.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// The state names a job environment the provider does not know.
    #[error("not found: {0}")]
    NotFound(String),
    /// The provider tried and failed.
    #[error("{0}")]
    Failed(String),
    /// The plugin process is gone, restarting, or did not answer in time.
    #[error("plugin {plugin:?} unavailable: {message}")]
    Unavailable {
        /// Plugin name.
        plugin: String,
        /// What happened.
        message: String,
    },
}

/// An executor provider: prepares a job's environment, runs stage scripts in it, removes it.
///
/// Calls for different jobs arrive concurrently. A [`ExecutorProvider::run`] future is dropped
/// when the host cancels the stage (a job cancel or timeout): everything it started must stop
/// then (spawn children with `kill_on_drop`, in their own process group).
#[async_trait]
pub trait ExecutorProvider: Send + Sync + 'static {
    /// Check and take the config; say what the provider offers. With `dry_run`, only check.
    async fn init(&self, config: &[u8], dry_run: bool) -> Result<Capabilities, ProviderError>;

    /// Make the job's environment.
    async fn prepare(&self, job: PrepareJob) -> Result<Prepared, ProviderError>;

    /// Run one stage's script, sending its output to `output` as it comes.
    async fn run(&self, stage: Stage, output: mpsc::Sender<Chunk>) -> Result<Exit, ProviderError>;

    /// Remove the job's environment (on its instance, with placement [`Placement::Instance`]),
    /// also for state a previous process of the plugin made; lines for the job's trace.
    async fn cleanup(&self, job: CleanupJob) -> Result<Vec<String>, ProviderError>;
}
