//! Job updates: `PUT /api/v4/jobs/:id`, and the final state that is never dropped.

use std::time::Duration;

use http::Method;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::client::endpoint;
use super::response::{OutputInfo, RemoteJobState};
use super::{Backoff, GitlabClient, GitlabError, Secret, VersionInfo, sleep_or_cancel};
use slipway_job::{FailureReason, JobResponse};

/// A job state as sent in `PUT jobs/:id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// `pending`.
    Pending,
    /// `running` (a keep-alive update).
    Running,
    /// `success`.
    Success,
    /// `failed`.
    Failed,
}

impl JobState {
    /// Whether this is a final state.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Success | Self::Failed)
    }
}

/// The `failure_reason` to send for `reason` given the server's `features.failure_reasons`, as
/// GitLab Runner maps it: `script_failure`, `runner_system_failure` and `job_execution_timeout`
/// always go as they are; a listed reason goes as it is; otherwise `image_pull_failure` and
/// `runner_external_dependency_failure` fall back to `runner_system_failure`,
/// `runner_configuration_error` to `script_failure`, anything else to `unknown_failure`.
/// `job_canceled` is never sent (`None`).
pub fn wire_reason(reason: FailureReason, supported: &[String]) -> Option<String> {
    let name = reason.as_str();
    match reason {
        FailureReason::JobCanceled => None,
        FailureReason::ScriptFailure
        | FailureReason::RunnerSystemFailure
        | FailureReason::JobExecutionTimeout => Some(name.to_string()),
        _ if supported.iter().any(|s| s == name) => Some(name.to_string()),
        FailureReason::ImagePullFailure | FailureReason::RunnerExternalDependencyFailure => {
            Some("runner_system_failure".into())
        }
        FailureReason::RunnerConfigurationError => Some("script_failure".into()),
        _ => Some("unknown_failure".into()),
    }
}

/// A job update not yet accepted by GitLab. Serializable (job token included, in clear) so the
/// manager can keep it in its state store and resend it after a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingUpdate {
    /// Job ID.
    pub job_id: u64,
    /// Job token (`Debug` masks it).
    pub token: Secret,
    /// State to report.
    pub state: JobState,
    /// Failure reason as sent (already resolved against the server's list); only with `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The script's exit code, if it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Trace checksum and size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputInfo>,
}

impl PendingUpdate {
    /// The update for `job`, resolving `reason` against the job's `features.failure_reasons`
    /// (a reason is only kept with [`JobState::Failed`]).
    pub fn new(
        job: &JobResponse,
        state: JobState,
        reason: Option<FailureReason>,
        exit_code: Option<i32>,
        output: Option<OutputInfo>,
    ) -> Self {
        let failure_reason = match state {
            JobState::Failed => reason.and_then(|r| wire_reason(r, &job.features.failure_reasons)),
            _ => None,
        };
        Self {
            job_id: job.id,
            token: Secret::new(job.token.clone()),
            state,
            failure_reason,
            exit_code,
            output,
        }
    }
}

/// GitLab's answer to one `PUT jobs/:id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// 200: done.
    Accepted,
    /// 202: accepted but not finished (trace still being processed); send again after `after`.
    Retry {
        /// `X-GitLab-Trace-Update-Interval` or `Retry-After`, if sent.
        after: Option<Duration>,
    },
    /// 403 or 404: the job is gone or no longer ours.
    JobGone {
        /// The HTTP status.
        status: u16,
        /// `Job-Status`.
        job_status: RemoteJobState,
    },
}

/// How hard [`GitlabClient::finish_job`] tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateRetryPolicy {
    /// Delays after failures and 202s without an interval.
    pub backoff: Backoff,
    /// Attempts before handing the update back.
    pub max_attempts: u32,
}

impl Default for UpdateRetryPolicy {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            max_attempts: 20,
        }
    }
}

/// The end of [`GitlabClient::finish_job`].
#[derive(Debug)]
pub enum FinishOutcome {
    /// GitLab accepted the final state.
    Accepted,
    /// The job is gone (403/404); nothing more to send.
    JobGone {
        /// The HTTP status.
        status: u16,
    },
    /// Not delivered: keep `update` (e.g. in the state store) and resend later.
    Undelivered {
        /// The update to resend.
        update: PendingUpdate,
        /// The last error (`None` if GitLab kept answering 202 or the caller cancelled).
        last_error: Option<GitlabError>,
    },
}

impl GitlabClient {
    /// `PUT /api/v4/jobs/:id`: sends one update.
    pub async fn update_job(&self, update: &PendingUpdate) -> Result<UpdateOutcome, GitlabError> {
        #[derive(Serialize)]
        struct Body<'a> {
            info: &'a VersionInfo,
            token: &'a str,
            state: JobState,
            #[serde(skip_serializing_if = "Option::is_none")]
            failure_reason: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            exit_code: Option<i32>,
            #[serde(skip_serializing_if = "Option::is_none")]
            checksum: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            output: Option<&'a OutputInfo>,
        }
        let path = format!("jobs/{}", update.job_id);
        let body = Body {
            info: &self.config.info,
            token: update.token.expose(),
            state: update.state,
            failure_reason: update.failure_reason.as_deref(),
            exit_code: update.exit_code,
            checksum: update.output.as_ref().map(|o| o.checksum.as_str()),
            output: update.output.as_ref(),
        };
        let resp = self
            .call_json(Method::PUT, &path, &[], &body, self.config.request_timeout)
            .await?;
        match resp.status.as_u16() {
            200 => Ok(UpdateOutcome::Accepted),
            202 => Ok(UpdateOutcome::Retry {
                after: resp
                    .header("x-gitlab-trace-update-interval")
                    .and_then(super::response::update_interval)
                    .or_else(|| resp.retry_after()),
            }),
            status @ (403 | 404) => Ok(UpdateOutcome::JobGone {
                status,
                job_status: RemoteJobState::parse(resp.header("job-status")),
            }),
            _ => Err(resp.unexpected(endpoint(&Method::PUT, &path), &[update.token.expose()])),
        }
    }

    /// Tells GitLab the job is still running (`PUT jobs/:id` with `state: running`, as GitLab
    /// Runner does when it has no new output) and returns GitLab's `Job-Status`, so a cancel
    /// reaches a job that prints nothing. 403/404 come back as an aborting status.
    pub async fn touch_job(
        &self,
        job_id: u64,
        token: &Secret,
    ) -> Result<RemoteJobState, GitlabError> {
        let path = format!("jobs/{job_id}");
        let body = serde_json::json!({
            "info": &self.config.info,
            "token": token.expose(),
            "state": "running",
        });
        let resp = self
            .call_json(Method::PUT, &path, &[], &body, self.config.request_timeout)
            .await?;
        match resp.status.as_u16() {
            200 | 202 => Ok(RemoteJobState::parse(resp.header("job-status"))),
            403 | 404 => Ok(match RemoteJobState::parse(resp.header("job-status")) {
                RemoteJobState::Unknown => RemoteJobState::Canceled,
                s => s,
            }),
            _ => Err(resp.unexpected(endpoint(&Method::PUT, &path), &[token.expose()])),
        }
    }

    /// Sends a (final) update until GitLab accepts it: 202 is retried after GitLab's interval,
    /// network errors and 409/429/5xx with backoff. If it cannot be delivered (attempts used up,
    /// a non-retryable error such as 412, or `cancel`), the update is handed back, never dropped.
    pub async fn finish_job(
        &self,
        update: PendingUpdate,
        policy: UpdateRetryPolicy,
        cancel: &CancellationToken,
    ) -> FinishOutcome {
        let mut last_error = None;
        for attempt in 0..policy.max_attempts.max(1) {
            let delay = match self.update_job(&update).await {
                Ok(UpdateOutcome::Accepted) => return FinishOutcome::Accepted,
                Ok(UpdateOutcome::JobGone { status, .. }) => {
                    tracing::warn!(
                        job = update.job_id,
                        status,
                        "job gone while sending its final state"
                    );
                    return FinishOutcome::JobGone { status };
                }
                Ok(UpdateOutcome::Retry { after }) => {
                    last_error = None;
                    after.unwrap_or_else(|| policy.backoff.delay(attempt))
                }
                Err(e) if e.is_retryable() => {
                    let delay = e
                        .retry_after()
                        .unwrap_or_else(|| policy.backoff.delay(attempt));
                    tracing::warn!(job = update.job_id, error = %e, ?delay, "job update failed, retrying");
                    last_error = Some(e);
                    delay
                }
                Err(e) => {
                    return FinishOutcome::Undelivered {
                        update,
                        last_error: Some(e),
                    };
                }
            };
            if attempt + 1 == policy.max_attempts.max(1) || !sleep_or_cancel(delay, cancel).await {
                break;
            }
        }
        FinishOutcome::Undelivered { update, last_error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::crc32;

    #[test]
    fn crc32_matches_ieee() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    #[test]
    fn failure_reasons_map_like_gitlab_runner() {
        let listed = vec![
            "script_failure".to_string(),
            "image_pull_failure".to_string(),
        ];
        let r = |f: FailureReason| wire_reason(f, &listed);
        assert_eq!(
            r(FailureReason::ScriptFailure).as_deref(),
            Some("script_failure")
        );
        assert_eq!(
            r(FailureReason::JobExecutionTimeout).as_deref(),
            Some("job_execution_timeout")
        );
        assert_eq!(
            r(FailureReason::ImagePullFailure).as_deref(),
            Some("image_pull_failure")
        );
        assert_eq!(
            wire_reason(FailureReason::ImagePullFailure, &[]).as_deref(),
            Some("runner_system_failure")
        );
        assert_eq!(
            r(FailureReason::RunnerConfigurationError).as_deref(),
            Some("script_failure")
        );
        assert_eq!(
            r(FailureReason::RunnerExternalDependencyFailure).as_deref(),
            Some("runner_system_failure")
        );
        assert_eq!(
            r(FailureReason::RunnerInterrupted).as_deref(),
            Some("unknown_failure")
        );
        assert_eq!(r(FailureReason::JobCanceled), None);
    }

    #[test]
    fn pending_update_round_trips_and_masks() {
        let job = JobResponse {
            id: 7,
            token: "glcbt-secret".into(),
            ..JobResponse::default()
        };
        let u = PendingUpdate::new(
            &job,
            JobState::Failed,
            Some(FailureReason::ScriptFailure),
            Some(2),
            Some(OutputInfo {
                checksum: "crc32:00000000".into(),
                bytesize: 0,
            }),
        );
        assert_eq!(u.failure_reason.as_deref(), Some("script_failure"));
        assert!(!format!("{u:?}").contains("glcbt-secret"));
        let json = serde_json::to_string(&u).unwrap();
        assert_eq!(serde_json::from_str::<PendingUpdate>(&json).unwrap(), u);
        let ok = PendingUpdate::new(
            &job,
            JobState::Success,
            Some(FailureReason::ScriptFailure),
            Some(0),
            None,
        );
        assert_eq!(ok.failure_reason, None);
    }
}
