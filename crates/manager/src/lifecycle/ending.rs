//! How a job's end is told: its status, the trace's closing line, and what the status board
//! records.

use slipway_executor::isolation;
use slipway_job::{JobOutcome, JobResponse, JobStatus};

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

/// How the status board records a job that never got a slot.
pub fn ending_of_refusal(no: &NoSlot) -> slipway_status::Ending {
    let ending = match no.status {
        JobStatus::Canceled => slipway_status::Ending::status(JobStatus::Canceled),
        _ => slipway_status::Ending::failed(no.failure_reason),
    };
    ending.with_message(no.message.clone())
}
