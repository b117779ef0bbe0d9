//! How a job ended, once for the whole house: [`FailureReason`] in GitLab's vocabulary,
//! [`JobOutcome`] as the executor reports it, and the final [`JobStatus`] every source records.
//! Each source maps these to its own wire (GitLab's `failure_reason` through
//! `slipway_gitlab::wire_reason`, the queue's result file, a local pipeline's summary).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a job failed, by GitLab's `failure_reason` names (`job_canceled` never goes on a wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// A script line exited non-zero.
    ScriptFailure,
    /// The runner, instance or connection failed.
    RunnerSystemFailure,
    /// The job ran past its timeout.
    JobExecutionTimeout,
    /// The job's image could not be pulled.
    ImagePullFailure,
    /// The runner's configuration does not allow what the job asks for.
    RunnerConfigurationError,
    /// An external dependency (cloud, registry, object storage) failed.
    RunnerExternalDependencyFailure,
    /// The runner can never give the job what it asks for (no shape fits, a bad request).
    RunnerUnsupported,
    /// The runner was interrupted (shut down) under the job.
    RunnerInterrupted,
    /// Cause unknown.
    UnknownFailure,
    /// The job was canceled (internal, never sent to GitLab).
    JobCanceled,
}

impl FailureReason {
    /// Every reason, for tables and tests.
    pub const ALL: [FailureReason; 10] = [
        FailureReason::ScriptFailure,
        FailureReason::RunnerSystemFailure,
        FailureReason::JobExecutionTimeout,
        FailureReason::ImagePullFailure,
        FailureReason::RunnerConfigurationError,
        FailureReason::RunnerExternalDependencyFailure,
        FailureReason::RunnerUnsupported,
        FailureReason::RunnerInterrupted,
        FailureReason::UnknownFailure,
        FailureReason::JobCanceled,
    ];

    /// GitLab's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::ScriptFailure => "script_failure",
            FailureReason::RunnerSystemFailure => "runner_system_failure",
            FailureReason::JobExecutionTimeout => "job_execution_timeout",
            FailureReason::ImagePullFailure => "image_pull_failure",
            FailureReason::RunnerConfigurationError => "runner_configuration_error",
            FailureReason::RunnerExternalDependencyFailure => "runner_external_dependency_failure",
            FailureReason::RunnerUnsupported => "runner_unsupported",
            FailureReason::RunnerInterrupted => "runner_interrupted",
            FailureReason::UnknownFailure => "unknown_failure",
            FailureReason::JobCanceled => "job_canceled",
        }
    }

    /// The reason GitLab calls `name`, if Slipway knows it.
    pub fn from_name(name: &str) -> Option<FailureReason> {
        FailureReason::ALL.into_iter().find(|r| r.as_str() == name)
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

    /// The final status this outcome gives the job: a canceled failure is `canceled`.
    pub fn status(&self) -> JobStatus {
        match self {
            JobOutcome::Success => JobStatus::Success,
            JobOutcome::Failed {
                reason: FailureReason::JobCanceled,
                ..
            } => JobStatus::Canceled,
            JobOutcome::Failed { .. } => JobStatus::Failed,
        }
    }

    /// The failure reason, if the job failed.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            JobOutcome::Success => None,
            JobOutcome::Failed { reason, .. } => Some(*reason),
        }
    }
}

/// How a finished job ended, as every source records it (GitLab's final job statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Every step succeeded.
    Success,
    /// The job failed (see its [`FailureReason`]).
    Failed,
    /// The job was canceled.
    Canceled,
}

impl JobStatus {
    /// GitLab's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Success => "success",
            JobStatus::Failed => "failed",
            JobStatus::Canceled => "canceled",
        }
    }

    /// From GitLab's name (`CI_JOB_STATUS`); anything else is a failure.
    pub fn from_ci_name(s: &str) -> JobStatus {
        match s {
            "success" => JobStatus::Success,
            "canceled" => JobStatus::Canceled,
            _ => JobStatus::Failed,
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_name() {
        for r in FailureReason::ALL {
            assert_eq!(FailureReason::from_name(r.as_str()), Some(r));
        }
        assert_eq!(FailureReason::from_name("weird"), None);
    }

    #[test]
    fn a_canceled_failure_is_a_canceled_job() {
        let o = JobOutcome::failed(FailureReason::JobCanceled, None, "canceled");
        assert_eq!(o.status(), JobStatus::Canceled);
        let o = JobOutcome::failed(FailureReason::ScriptFailure, Some(1), "exit 1");
        assert_eq!(o.status(), JobStatus::Failed);
        assert_eq!(o.reason(), Some(FailureReason::ScriptFailure));
        assert_eq!(JobOutcome::Success.status(), JobStatus::Success);
    }

    #[test]
    fn statuses_serialize_as_gitlab_spells_them() {
        for s in [JobStatus::Success, JobStatus::Failed, JobStatus::Canceled] {
            assert_eq!(
                serde_json::to_string(&s).unwrap_or_default(),
                format!("\"{s}\"")
            );
        }
    }
}
