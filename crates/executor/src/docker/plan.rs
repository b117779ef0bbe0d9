//! What one docker run is: its [`Plan`] (decided before any Docker call), the [`Limits`] of
//! its containers, and how an engine error fails it. The preparation, the containers and the
//! network all read these; none of them is read back.

use std::collections::BTreeMap;

use slipway_job::model::{Image, JobResponse};
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

use super::config::PullPolicy;
use super::names::RunNames;

/// What one run sets up, decided (and checked against the configuration) before any Docker
/// call.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    /// The job.
    pub(super) job: &'a JobResponse,
    /// The run's names.
    pub(super) run: &'a RunNames,
    /// The job's slot.
    pub(super) slot: u32,
    /// The build container's image.
    pub(super) image: Image,
    /// The services to start: `[[runners.docker.services]]`, then the job's (GitLab Runner's
    /// order).
    pub(super) services: Vec<Image>,
    /// Each image (the build's, then the services') with the pull policies to apply.
    pub(super) policies: Vec<(String, Vec<PullPolicy>)>,
    /// Labels on everything the run creates.
    pub(super) labels: BTreeMap<String, String>,
    /// Limits of every container.
    pub(super) limits: Limits,
    /// The network the job's containers join: the slot's, else the run's own.
    pub(super) network: String,
    /// The network does not exist yet.
    pub(super) create_network: bool,
}

/// What every container of a job gets: its limits and cgroup parent.
#[derive(Debug)]
pub(super) struct Limits {
    /// Memory limit in bytes.
    pub(super) memory: Option<i64>,
    /// CPU limit in billionths of a CPU.
    pub(super) nano_cpus: Option<i64>,
    /// The slot's cgroup, else `[runners.docker] cgroup_parent`.
    pub(super) cgroup_parent: Option<String>,
}

/// The job's failure for an engine error while doing `what`, said in the trace.
pub(super) fn system_failure(
    trace: &mut Trace,
    what: &str,
    e: slipway_docker::Error,
) -> JobOutcome {
    let msg = format!("{what}: {e}");
    trace.message(&format!("ERROR: Job failed (system failure): {msg}"));
    JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
}
