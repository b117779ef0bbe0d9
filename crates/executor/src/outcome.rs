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
    /// The runner can never give the job what it asks for (no shape fits, a bad request).
    RunnerUnsupported,
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
            FailureReason::RunnerUnsupported => "runner_unsupported",
        }
    }
}

/// GitLab's wire type for the same reason: one vocabulary from the executor to the job API.
impl From<FailureReason> for slipway_jobs::gitlab::FailureReason {
    fn from(r: FailureReason) -> Self {
        use slipway_jobs::gitlab::FailureReason as Gl;
        match r {
            FailureReason::ScriptFailure => Gl::ScriptFailure,
            FailureReason::RunnerSystemFailure => Gl::RunnerSystemFailure,
            FailureReason::JobExecutionTimeout => Gl::JobExecutionTimeout,
            FailureReason::JobCanceled => Gl::JobCanceled,
            FailureReason::RunnerConfigurationError => Gl::RunnerConfigurationError,
            FailureReason::ImagePullFailure => Gl::ImagePullFailure,
            FailureReason::RunnerUnsupported => Gl::Other(r.as_str().to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_keeps_its_name_on_the_wire() {
        for r in [
            FailureReason::ScriptFailure,
            FailureReason::RunnerSystemFailure,
            FailureReason::JobExecutionTimeout,
            FailureReason::JobCanceled,
            FailureReason::RunnerConfigurationError,
            FailureReason::ImagePullFailure,
            FailureReason::RunnerUnsupported,
        ] {
            let wire = slipway_jobs::gitlab::FailureReason::from(r);
            assert_eq!(wire.as_str(), r.as_str());
        }
    }
}
