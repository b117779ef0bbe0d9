//! `POST /api/v4/jobs/request` and the [`Poller`] that asks for jobs when the caller has capacity.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::Method;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::client::endpoint;
use super::{Backoff, GitlabClient, GitlabError, Secret, SystemId, VersionInfo, sleep_or_cancel};
use slipway_job::JobResponse;

/// The answer to one `jobs/request`.
#[derive(Debug)]
pub struct JobRequestOutcome {
    /// The job (201), or `None` (204: nothing for this runner now).
    pub job: Option<Box<JobResponse>>,
    /// The `X-GitLab-Last-Update` header, to send back as `last_update` next time.
    pub last_update: Option<String>,
}

impl GitlabClient {
    /// `POST /api/v4/jobs/request`: one long-poll request for a job.
    ///
    /// 201 → a job; 204 → none; 403 → [`GitlabError::Forbidden`] (runner token invalid);
    /// 409/429/5xx → [`GitlabError::RetryLater`].
    pub async fn request_job(
        &self,
        token: &Secret,
        system_id: &SystemId,
        last_update: Option<&str>,
    ) -> Result<JobRequestOutcome, GitlabError> {
        #[derive(Serialize)]
        struct Body<'a> {
            info: &'a VersionInfo,
            token: &'a str,
            system_id: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            last_update: Option<&'a str>,
        }
        let path = "jobs/request";
        let ep = endpoint(&Method::POST, path);
        let body = Body {
            info: &self.config.info,
            token: token.expose(),
            system_id: system_id.as_str(),
            last_update,
        };
        let resp = self
            .call_json(
                Method::POST,
                path,
                &[],
                &body,
                self.config.long_poll_timeout,
            )
            .await?;
        let last_update = resp.header("x-gitlab-last-update").map(str::to_string);
        match resp.status.as_u16() {
            201 => {
                let job: JobResponse =
                    serde_json::from_slice(&resp.body).map_err(|e| GitlabError::Decode {
                        endpoint: ep,
                        message: e.to_string(),
                    })?;
                Ok(JobRequestOutcome {
                    job: Some(Box::new(job)),
                    last_update,
                })
            }
            204 => Ok(JobRequestOutcome {
                job: None,
                last_update,
            }),
            _ => Err(resp.unexpected(ep, &[token.expose()])),
        }
    }
}

/// How a [`Poller`] asks for jobs (`[[runners]]` `request_concurrency`, global `check_interval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollerConfig {
    /// How many `jobs/request` calls may be in flight at once (`request_concurrency`, min 1).
    pub request_concurrency: usize,
    /// Pause after an answer without a job (`check_interval`, GitLab Runner's default 3 s).
    pub check_interval: Duration,
    /// Delays after failures (network, 409/429/5xx) when the server gives no `Retry-After`.
    pub backoff: Backoff,
}

impl Default for PollerConfig {
    fn default() -> Self {
        Self {
            request_concurrency: 1,
            check_interval: Duration::from_secs(3),
            backoff: Backoff::default(),
        }
    }
}

/// Asks GitLab for jobs on behalf of one runner.
///
/// Call [`Poller::next_job`] whenever there is capacity for one more job (e.g. after reserving a
/// slot); several callers may wait at once, at most `request_concurrency` requests are in flight.
/// `last_update` is echoed automatically. The poller spawns nothing: all work happens inside the
/// caller's `next_job` future.
#[derive(Debug)]
pub struct Poller {
    client: GitlabClient,
    token: Secret,
    system_id: SystemId,
    config: PollerConfig,
    last_update: Mutex<Option<String>>,
    permits: Semaphore,
    failures: AtomicU32,
}

impl Poller {
    /// A poller for the runner with authentication `token`.
    pub fn new(
        client: GitlabClient,
        token: Secret,
        system_id: SystemId,
        config: PollerConfig,
    ) -> Self {
        Self {
            client,
            token,
            system_id,
            permits: Semaphore::new(config.request_concurrency.max(1)),
            config,
            last_update: Mutex::new(None),
            failures: AtomicU32::new(0),
        }
    }

    /// The `last_update` value the next request will send.
    pub fn last_update(&self) -> Option<String> {
        self.last_update.lock().ok().and_then(|g| g.clone())
    }

    /// Waits for a job: requests until one arrives, pausing `check_interval` after empty answers
    /// and backing off after failures (honouring `Retry-After`).
    ///
    /// Returns `Ok(None)` when `cancel` fires (an in-flight request is dropped), and an error only
    /// for what retrying cannot fix: 403 (token invalid), other unexpected statuses, a job payload
    /// that does not parse.
    pub async fn next_job(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Option<Box<JobResponse>>, GitlabError> {
        loop {
            let result = {
                let _permit = tokio::select! {
                    () = cancel.cancelled() => return Ok(None),
                    permit = self.permits.acquire() => match permit {
                        Ok(p) => p,
                        Err(_) => return Ok(None),
                    },
                };
                let last_update = self.last_update();
                tokio::select! {
                    () = cancel.cancelled() => return Ok(None),
                    r = self.client.request_job(&self.token, &self.system_id, last_update.as_deref()) => r,
                }
            };
            let delay = match result {
                Ok(outcome) => {
                    self.failures.store(0, Ordering::Relaxed);
                    if let Some(lu) = outcome.last_update
                        && let Ok(mut g) = self.last_update.lock()
                    {
                        *g = Some(lu);
                    }
                    if let Some(job) = outcome.job {
                        tracing::info!(job = job.id, runner = %self.token.short(), "received job");
                        return Ok(Some(job));
                    }
                    self.config.check_interval
                }
                Err(e) if e.is_retryable() => {
                    let attempt = self.failures.fetch_add(1, Ordering::Relaxed);
                    let delay = e
                        .retry_after()
                        .unwrap_or_else(|| self.config.backoff.delay(attempt));
                    tracing::warn!(error = %e, ?delay, runner = %self.token.short(), "job request failed, retrying");
                    delay
                }
                Err(e) => return Err(e),
            };
            if !sleep_or_cancel(delay, cancel).await {
                return Ok(None);
            }
        }
    }
}
