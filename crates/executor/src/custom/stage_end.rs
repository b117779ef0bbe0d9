//! How a driver call ended in the protocol's terms, and what that means for the job.

use std::time::Duration;

use crate::job::fmt_secs;
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

use super::driver::{DriverEnd, Stop};
use super::session::Session;
use super::{BUILD_FAILURE_EXIT_CODE, SYSTEM_FAILURE_EXIT_CODE};

/// How a stage ended.
#[derive(Debug)]
pub(super) enum StageEnd {
    Ok,
    /// The driver exited `BUILD_FAILURE_EXIT_CODE`; the script's code when known.
    BuildFailure(Option<i32>),
    SystemFailure(String),
    Canceled,
    JobTimeout,
    StageTimeout(Duration),
}

impl StageEnd {
    /// A short description for a warning line.
    pub(super) fn describe(&self) -> String {
        match self {
            StageEnd::Ok => "ok".into(),
            StageEnd::BuildFailure(Some(c)) => format!("exit code {c}"),
            StageEnd::BuildFailure(None) => format!("exit status {BUILD_FAILURE_EXIT_CODE}"),
            StageEnd::SystemFailure(msg) => msg.clone(),
            StageEnd::Canceled => "canceled".into(),
            StageEnd::JobTimeout => "the job timed out".into(),
            StageEnd::StageTimeout(t) => format!("timed out after {}", fmt_secs(*t)),
        }
    }
}

pub(super) const SYSTEM_FAILURE_MSG: &str = "the driver reported a system failure";

/// A driver call's result in the protocol's terms.
pub(super) fn stage_end(end: DriverEnd, stage_timeout: Duration) -> StageEnd {
    match end {
        DriverEnd::SpawnFailed(msg) => StageEnd::SystemFailure(msg),
        DriverEnd::Stopped(Stop::Canceled) => StageEnd::Canceled,
        DriverEnd::Stopped(Stop::JobTimeout) => StageEnd::JobTimeout,
        DriverEnd::Stopped(Stop::StageTimeout) => StageEnd::StageTimeout(stage_timeout),
        DriverEnd::Exited(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            match (status.code(), status.signal()) {
                (Some(0), _) => StageEnd::Ok,
                (Some(BUILD_FAILURE_EXIT_CODE), _) => StageEnd::BuildFailure(None),
                (Some(SYSTEM_FAILURE_EXIT_CODE), _) => StageEnd::SystemFailure(format!(
                    "{SYSTEM_FAILURE_MSG} (exit code {SYSTEM_FAILURE_EXIT_CODE})"
                )),
                (Some(code), _) => StageEnd::SystemFailure(format!(
                    "unknown custom executor executable exit code {code}"
                )),
                (None, Some(sig)) => {
                    StageEnd::SystemFailure(format!("the driver was killed by signal {sig}"))
                }
                (None, None) => StageEnd::SystemFailure("the driver ended oddly".into()),
            }
        }
    }
}

impl Session<'_> {
    /// The outcome of a stage that did not succeed, with its trace line.
    pub(super) fn end_outcome(&self, trace: &mut Trace, end: StageEnd, stage: &str) -> JobOutcome {
        match end {
            StageEnd::Ok => JobOutcome::Success,
            StageEnd::BuildFailure(code) => {
                let msg = match code {
                    Some(c) => format!("exit code {c}"),
                    None => format!("exit status {BUILD_FAILURE_EXIT_CODE}"),
                };
                trace.message(&format!("ERROR: Job failed: {msg}"));
                JobOutcome::failed(
                    FailureReason::ScriptFailure,
                    code,
                    format!("script failed: {msg}"),
                )
            }
            StageEnd::SystemFailure(msg) => {
                let msg = format!("{stage}: {msg}");
                trace.message(&format!("ERROR: Job failed (system failure): {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::Canceled => {
                trace.message("ERROR: job canceled");
                JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled")
            }
            StageEnd::JobTimeout => {
                let msg = format!("job execution timeout: exceeded {}", fmt_secs(self.timeout));
                trace.message(&format!("ERROR: {msg}"));
                JobOutcome::failed(FailureReason::JobExecutionTimeout, None, msg)
            }
            StageEnd::StageTimeout(t) => {
                let msg = format!("{stage} timed out after {}", fmt_secs(t));
                trace.message(&format!("ERROR: Job failed (system failure): {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
        }
    }
}
