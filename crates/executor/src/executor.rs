//! One trait over every executor: run one job on its slot — prepare the job's isolation, run its
//! steps, clean up — whatever the executor.
//!
//! The implementations: [`Steps`] (bash steps on a [`Host`]: `shell` on this machine, `instance`
//! over SSH, either optionally in the slot's cgroup), [`DockerExecutor`] (`docker` and
//! `docker-autoscaler`) and [`CustomExecutor`] (GitLab's custom executor protocol).

use async_trait::async_trait;
use slipway_job::JobResponse;
use tokio_util::sync::CancellationToken;

use crate::custom::CustomExecutor;
use crate::docker::DockerExecutor;
use crate::host::Host;
use crate::job::{JobRunner, RunResult};
use slipway_job::trace::Trace;

/// What a job gets besides its payload: the one slot context every executor takes.
#[derive(Debug)]
pub struct JobSlot<'a> {
    /// The job's slot.
    pub slot: u32,
    /// The slot's cgroup path, for executors that place containers under it.
    pub cgroup: Option<String>,
    /// Output sink (masks secrets).
    pub trace: &'a mut Trace,
    /// Cancelled to stop the job.
    pub cancel: CancellationToken,
    /// Set: a cancel is graceful (GitLab's `canceling`): `after_script` still runs unless this
    /// fires too. Unset: a cancel skips `after_script`.
    pub abort: Option<CancellationToken>,
    /// Tarballs of earlier jobs' artifacts to unpack into the project directory.
    pub artifacts_in: Vec<crate::tarball::Tarball>,
    /// Where collected artifacts are written on this machine (the system's temporary
    /// directory when `None`): a disk with room for the largest artifacts of concurrent jobs.
    pub scratch_dir: Option<std::path::PathBuf>,
    /// The job's sources, fetched where its steps run before them (then not in
    /// `artifacts_in`); `None`: whatever `artifacts_in` holds.
    pub sources: Option<std::sync::Arc<dyn crate::sources::HostSources>>,
}

/// An executor: turns a job payload and a slot into a finished job.
#[async_trait]
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// The executor's name as written in config.toml.
    fn name(&self) -> &'static str;

    /// Prepare, run every step, clean up; also after a timeout or a cancel.
    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult;
}

/// Bash steps on a host: the `shell` executor on this machine, `instance` over SSH; with the
/// `cgroup` level the runner's prepare/prologue/teardown put every step in the slot's cgroup.
#[derive(Debug)]
pub struct Steps<H: Host> {
    /// Config name (`shell` or `instance`).
    pub name: &'static str,
    /// Where the steps run.
    pub host: H,
    /// How they run.
    pub runner: JobRunner,
}

#[async_trait]
impl<H: Host> Executor for Steps<H> {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        self.runner.run(job, &self.host, slot).await
    }
}

#[async_trait]
impl Executor for DockerExecutor {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        DockerExecutor::run(self, job, slot).await
    }
}

#[async_trait]
impl Executor for CustomExecutor {
    fn name(&self) -> &'static str {
        "custom"
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        CustomExecutor::run(self, job, slot).await
    }
}
