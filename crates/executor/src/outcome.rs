//! How a job ended, in GitLab's failure-reason vocabulary.

use std::fmt;

/// Why a job failed (GitLab's `failure_reason` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// A script line exited non-zero.
    ScriptFailure,
    /// The runner, instance or connection failed.
    RunnerSystemFailure,
    /// The job ran past its timeout.
    JobExecutionTimeout,
    /// The job was canceled (internal, never sent to GitLab).
    JobCanceled,
    /// The runner's configuration does not allow what the job asks for.
    RunnerConfigurationError,
    /// The job's image could not be pulled.
    ImagePullFailure,
}

impl FailureReason {
    /// GitLab's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::ScriptFailure => "script_failure",
            FailureReason::RunnerSystemFailure => "runner_system_failure",
            FailureReason::JobExecutionTimeout => "job_execution_timeout",
            FailureReason::JobCanceled => "job_canceled",
            FailureReason::RunnerConfigurationError => "runner_configuration_error",
            FailureReason::ImagePullFailure => "image_pull_failure",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of running one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every step succeeded.
    Success,
    /// The job failed.
    Failed {
        /// Why.
        reason: FailureReason,
        /// The script's exit code, when it has one.
        exit_code: Option<i32>,
        /// A line for the trace and the summary.
        message: String,
    },
}

impl JobOutcome {
    /// True for [`JobOutcome::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self, JobOutcome::Success)
    }

    /// A failure with a reason and message.
    pub fn failed(
        reason: FailureReason,
        exit_code: Option<i32>,
        message: impl Into<String>,
    ) -> Self {
        JobOutcome::Failed {
            reason,
            exit_code,
            message: message.into(),
        }
    }
}
