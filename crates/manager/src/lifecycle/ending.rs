//! How a job's end is told: its status, the trace's closing line, and what the status board
//! records.

use slipway_executor::isolation;
use slipway_job::{FailureReason, JobOutcome};
use slipway_job::{JobResponse, JobStatus};

use super::admission::{NoSlot, plugin_level};
use crate::runner::Runner;

/// The trace's closing line.
pub fn closing_line(outcome: &JobOutcome) -> String {
    match outcome {
        JobOutcome::Success => "Job succeeded".to_string(),
        JobOutcome::Failed { reason, .. } => format!("Job failed ({reason})"),
    }
}

/// What the status board shows of `job` on `runner`: id, name, stage and the isolation level
/// it gets (what it asked for when the runner refuses it).
pub fn board_info(runner: &Runner, job: &JobResponse) -> slipway_status::JobInfo {
    let asked = job
        .variable(isolation::VARIABLE)
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let level = if runner.executor_plugin.is_some() {
        plugin_level(runner, job).unwrap_or_else(|_| asked.unwrap_or_default().to_string())
    } else {
        match runner.isolation.resolve(asked, &runner.name) {
            Ok(l) => l.as_str().to_string(),
            Err(_) => asked.unwrap_or_default().to_string(),
        }
    };
    slipway_status::JobInfo {
        id: job.id,
        name: job.job_info.name.clone(),
        stage: job.job_info.stage.clone(),
        level,
    }
}

/// How the status board records `outcome`.
pub fn ending_of(outcome: &JobOutcome) -> slipway_status::Ending {
    let outcome_name = match outcome.status() {
        JobStatus::Success => "success",
        JobStatus::Canceled => "canceled",
        _ => "failed",
    };
    match outcome {
        JobOutcome::Success => slipway_status::Ending {
            outcome: outcome_name.into(),
            ..slipway_status::Ending::default()
        },
        JobOutcome::Failed {
            reason,
            exit_code,
            message,
        } => slipway_status::Ending {
            outcome: outcome_name.into(),
            failure_reason: (*reason != FailureReason::JobCanceled)
                .then(|| reason.as_str().to_string()),
            message: (!message.is_empty()).then(|| message.clone()),
            exit_code: *exit_code,
        },
    }
}

/// How the status board records a job that never got a slot.
pub fn ending_of_refusal(no: &NoSlot) -> slipway_status::Ending {
    let canceled = no.status == JobStatus::Canceled;
    slipway_status::Ending {
        outcome: if canceled { "canceled" } else { "failed" }.into(),
        failure_reason: (!canceled).then(|| no.failure_reason.to_string()),
        message: Some(no.message.clone()),
        exit_code: None,
    }
}
