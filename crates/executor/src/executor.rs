//! One trait over every executor: run one job on its slot — prepare the job's isolation, run its
//! steps, clean up — whatever the executor.
//!
//! The implementations: [`Steps`] (bash steps on a [`Host`]: `shell` on this machine, `instance`
//! over SSH, either optionally in the slot's cgroup) here; the `docker`, `custom`, `plugin` and
//! nesting executors each in their own module.

use async_trait::async_trait;
use slipway_job::JobResponse;

use crate::host::Host;
use crate::job::{JobRunner, JobSlot, RunResult};

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
