//! One job on a runner's slot — reserve, acquire, execute with the instance executor — shared
//! by `slipway exec` (a local pipeline) and `slipway run` (the embedded queue).

use slipway_executor::{
    FailureReason, Isolation, JobContext, JobOutcome, JobRunner, SshHost, Trace, cgroup, isolation,
};
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
    /// GitLab's failure reason for the job.
    pub failure_reason: &'static str,
}

impl NoSlot {
    fn failed(trace: &mut Trace, e: &dyn std::fmt::Display) -> NoSlot {
        trace.message(&format!("ERROR: {e}"));
        NoSlot {
            status: JobStatus::Failed,
            message: e.to_string(),
            unsupported: false,
            failure_reason: "runner_system_failure",
        }
    }

    fn canceled(message: &str) -> NoSlot {
        NoSlot {
            status: JobStatus::Canceled,
            message: message.into(),
            unsupported: false,
            failure_reason: "job_canceled",
        }
    }
}

/// The job's resource request from its variables; an unusable one fails the job.
pub fn request_of(job: &JobResponse, trace: &mut Trace) -> Result<Resources, NoSlot> {
    crate::request::of_job(job).map_err(|e| NoSlot {
        unsupported: true,
        failure_reason: "runner_unsupported",
        ..NoSlot::failed(trace, &e)
    })
}

/// The isolation level the job gets on `runner`: what it asks for (`SLIPWAY_ISOLATION`), if
/// the runner allows it; otherwise it fails before it starts (`runner_configuration_error`).
pub fn isolation_of(
    runner: &Runner,
    job: &JobResponse,
    trace: &mut Trace,
) -> Result<Isolation, NoSlot> {
    runner
        .isolation
        .resolve(job.variable(isolation::VARIABLE), &runner.name)
        .map_err(|e| NoSlot {
            unsupported: true,
            failure_reason: "runner_configuration_error",
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
            failure_reason: if unsupported {
                "runner_unsupported"
            } else {
                "runner_system_failure"
            },
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
    // Checked before the job was reserved (`isolation_of`); asked again here, not carried.
    let level = match isolation_of(runner, job, trace) {
        Ok(level) => level,
        Err(no) => {
            return (
                JobOutcome::failed(FailureReason::RunnerConfigurationError, None, no.message),
                None,
            );
        }
    };
    let mut steps = JobRunner {
        builds_dir: runner.builds_dir.clone(),
        ..JobRunner::default()
    };
    if level == Isolation::Cgroup {
        // The job's share of the instance when the shape declares one, else what it asked for.
        let share = acq
            .resources
            .or_else(|| crate::request::of_job(job).ok())
            .unwrap_or_default();
        let limits = cgroup::limits_for(share.cpu_millis, share.memory_bytes);
        match runner.cgroups.apply(&mut steps, acq.slot, &limits) {
            Ok(path) => trace.message(&format!("Using isolation cgroup in {path}")),
            Err(e) => {
                let msg = format!("slot cgroup: {e}");
                trace.message(&format!("ERROR: {msg}"));
                return (
                    JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg),
                    None,
                );
            }
        }
    }
    let host = SshHost(&client);
    let ctx = JobContext {
        host: &host,
        slot: acq.slot,
        trace: &mut *trace,
        cancel: cancel.clone(),
        artifacts_in,
    };
    let mut instance_lost = false;
    let mut result = {
        let run = steps.run(job, ctx);
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
