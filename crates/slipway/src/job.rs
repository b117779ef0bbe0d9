//! One job on a runner's slot — reserve, acquire, execute with the instance executor — shared
//! by `slipway exec` (a local pipeline) and `slipway run` (the embedded queue).

use slipway_executor::{FailureReason, InstanceExecutor, JobOutcome, RunContext, Trace};
use slipway_jobs::{JobResponse, JobStatus};
use slipway_taskscaler::{Acquisition, Error as TsError, Resources};
use tokio_util::sync::CancellationToken;

use crate::runner::Runner;

/// Why a job did not get a slot: its status (failed or canceled) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSlot {
    /// `Failed` or `Canceled`.
    pub status: JobStatus,
    /// What happened.
    pub message: String,
    /// The request can never be met by this runner (no shape fits, a bad variable).
    pub unsupported: bool,
}

impl NoSlot {
    fn failed(trace: &mut Trace, e: &dyn std::fmt::Display) -> NoSlot {
        trace.message(&format!("ERROR: {e}"));
        NoSlot {
            status: JobStatus::Failed,
            message: e.to_string(),
            unsupported: false,
        }
    }

    fn canceled(message: &str) -> NoSlot {
        NoSlot {
            status: JobStatus::Canceled,
            message: message.into(),
            unsupported: false,
        }
    }
}

/// The job's resource request from its variables; an unusable one fails the job.
pub fn request_of(job: &JobResponse, trace: &mut Trace) -> Result<Resources, NoSlot> {
    crate::request::of_job(job).map_err(|e| NoSlot {
        unsupported: true,
        ..NoSlot::failed(trace, &e)
    })
}

/// Reserve capacity for `key`, waiting (with a trace line) while the runner has none free.
pub async fn reserve(
    runner: &Runner,
    key: &str,
    request: &Resources,
    trace: &mut Trace,
    cancel: &CancellationToken,
) -> Result<(), NoSlot> {
    let refused = |trace: &mut Trace, e: TsError| {
        let unsupported = matches!(e, TsError::Unsatisfiable(_));
        NoSlot {
            unsupported,
            ..NoSlot::failed(trace, &e)
        }
    };
    match runner.reserve(key, request) {
        Ok(()) => Ok(()),
        Err(e @ (TsError::NoCapacity(_) | TsError::NoIdleCapacity(_))) => {
            trace.message(&format!("Waiting for capacity: {e}"));
            tokio::select! {
                r = runner.reserve_wait(key, request) => r.map_err(|e| refused(trace, e)),
                _ = cancel.cancelled() => Err(NoSlot::canceled("canceled while waiting for capacity")),
            }
        }
        Err(e) => Err(refused(trace, e)),
    }
}

/// Bind the reservation `key` to a slot; the reservation is given back when that fails.
pub async fn acquire(
    runner: &Runner,
    key: &str,
    trace: &mut Trace,
    cancel: &CancellationToken,
) -> Result<Acquisition, NoSlot> {
    trace.message(&format!("Waiting for a slot on runner {:?}", runner.name));
    let acquired = tokio::select! {
        a = runner.acquire(key) => a,
        _ = cancel.cancelled() => {
            runner.unreserve(key);
            return Err(NoSlot::canceled("canceled while waiting for a slot"));
        }
    };
    acquired.map_err(|e| {
        runner.unreserve(key);
        NoSlot::failed(trace, &e)
    })
}

/// Connect and run `job` on its slot with the instance executor; stops it when `cancel` fires
/// or its instance disappears (then it fails with `runner_system_failure`). Returns the outcome
/// and the artifacts archive, if any. The caller releases the slot.
pub async fn execute(
    runner: &Runner,
    acq: &Acquisition,
    job: &JobResponse,
    artifacts_in: Vec<Vec<u8>>,
    trace: &mut Trace,
    cancel: &CancellationToken,
) -> (JobOutcome, Option<Vec<u8>>) {
    let client = match runner.client(acq).await {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("{e:#}");
            trace.message(&format!("ERROR: {msg}"));
            return (
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg),
                None,
            );
        }
    };
    let cancel = cancel.child_token();
    let lost = acq.instance_lost();
    let exec = InstanceExecutor {
        builds_dir: runner.builds_dir.clone(),
        ..InstanceExecutor::default()
    };
    let ctx = RunContext {
        client: &client,
        slot: acq.slot,
        trace: &mut *trace,
        cancel: cancel.clone(),
        artifacts_in,
    };
    let mut instance_lost = false;
    let mut result = {
        let run = exec.run(job, ctx);
        tokio::pin!(run);
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = lost.cancelled(), if !instance_lost => {
                    instance_lost = true;
                    cancel.cancel();
                }
            }
        }
    };
    if instance_lost {
        let msg = format!("instance {} was removed under the job", acq.instance_id);
        trace.message(&format!("ERROR: {msg}"));
        result.outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg);
    }
    (result.outcome, result.artifacts)
}

/// A job's status from its outcome.
pub fn status_of(outcome: &JobOutcome) -> JobStatus {
    match outcome {
        JobOutcome::Success => JobStatus::Success,
        JobOutcome::Failed {
            reason: FailureReason::JobCanceled,
            ..
        } => JobStatus::Canceled,
        JobOutcome::Failed { .. } => JobStatus::Failed,
    }
}

/// The trace's closing line.
pub fn closing_line(outcome: &JobOutcome) -> String {
    match outcome {
        JobOutcome::Success => "Job succeeded".to_string(),
        JobOutcome::Failed { reason, .. } => format!("Job failed ({reason})"),
    }
}
