//! The `instance` executor: each step is a bash script fed over SSH stdin, in a per-job directory
//! under the slot.

use slipway_connector::Client;
use slipway_job::model::JobResponse;
use tokio_util::sync::CancellationToken;

use crate::host::SshHost;
use crate::job::{JobContext, JobRunner, RunResult};
use slipway_job::trace::Trace;

/// Settings of the instance executor.
#[derive(Debug, Clone)]
pub struct InstanceExecutor {
    /// Builds root on the instance, relative to the login directory unless absolute.
    pub builds_dir: String,
    /// Seconds between SIGTERM and SIGKILL when a step is stopped.
    pub kill_grace_secs: u32,
}

impl Default for InstanceExecutor {
    fn default() -> Self {
        let r = JobRunner::default();
        InstanceExecutor {
            builds_dir: r.builds_dir,
            kill_grace_secs: r.kill_grace_secs,
        }
    }
}

/// What a job needs besides its payload.
#[derive(Debug)]
pub struct RunContext<'a> {
    /// SSH connection to the job's instance.
    pub client: &'a Client,
    /// The job's slot on that instance.
    pub slot: u32,
    /// Output sink (masks secrets).
    pub trace: &'a mut Trace,
    /// Cancelled to stop the job (manager shutdown, instance lost).
    pub cancel: CancellationToken,
    /// Tarballs of earlier jobs' artifacts to unpack into the project directory.
    pub artifacts_in: Vec<crate::tarball::Tarball>,
    /// Where collected artifacts are written on this machine (see [`JobContext`]).
    pub scratch_dir: Option<std::path::PathBuf>,
}

impl InstanceExecutor {
    /// Run a job on the instance: prepare the directory, the script step, `after_script`,
    /// artifacts, cleanup.
    pub async fn run(&self, job: &JobResponse, ctx: RunContext<'_>) -> RunResult {
        let runner = JobRunner {
            builds_dir: self.builds_dir.clone(),
            kill_grace_secs: self.kill_grace_secs,
            ..JobRunner::default()
        };
        let host = SshHost(ctx.client);
        runner
            .run(
                job,
                JobContext {
                    host: &host,
                    slot: ctx.slot,
                    trace: ctx.trace,
                    cancel: ctx.cancel,
                    abort: None,
                    artifacts_in: ctx.artifacts_in,
                    scratch_dir: ctx.scratch_dir,
                    sources: None,
                },
            )
            .await
    }
}
