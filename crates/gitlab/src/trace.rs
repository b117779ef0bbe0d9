//! Incremental trace upload: `PATCH /api/v4/jobs/:id/trace`.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use tokio_util::sync::CancellationToken;

use super::client::endpoint;
use super::response::{OutputInfo, RemoteJobState, crc32, range_end, update_interval};
use super::{Backoff, GitlabClient, GitlabError, Secret, sleep_or_cancel};

/// Silence after which a job is touched when GitLab has not asked for an update interval
/// (GitLab Runner's force-send interval).
const KEEPALIVE_AFTER: Duration = Duration::from_secs(30);

/// GitLab Runner's default `output_limit`, in KiB.
pub const DEFAULT_OUTPUT_LIMIT_KIB: u64 = 4096;

/// GitLab's answer to one trace PATCH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatchOutcome {
    /// 202: appended.
    Accepted {
        /// `Job-Status`.
        job_status: RemoteJobState,
        /// `X-GitLab-Trace-Update-Interval`.
        update_interval: Option<Duration>,
    },
    /// 416: the server holds `remote_len` bytes (end of its `Range: 0-N` header); resend from there.
    RangeMismatch {
        /// Bytes the server has.
        remote_len: u64,
        /// `Job-Status`.
        job_status: RemoteJobState,
    },
    /// 403 or 404: the job is gone or no longer running; stop the job.
    Abort {
        /// The HTTP status.
        status: u16,
        /// `Job-Status`.
        job_status: RemoteJobState,
    },
}

impl GitlabClient {
    /// `PATCH /api/v4/jobs/:id/trace`: appends `data` at byte offset `start`
    /// (`Content-Range: start-end`, inclusive end). `data` must not be empty.
    pub async fn patch_trace(
        &self,
        job_id: u64,
        job_token: &Secret,
        start: u64,
        data: Bytes,
        debug_trace: bool,
    ) -> Result<PatchOutcome, GitlabError> {
        let path = format!("jobs/{job_id}/trace?debug_trace={debug_trace}");
        let ep = endpoint(&Method::PATCH, &path);
        let end = start + (data.len() as u64).saturating_sub(1);
        let range = format!("{start}-{end}");
        let resp = self
            .call(
                Method::PATCH,
                &path,
                &[("JOB-TOKEN", job_token.expose()), ("Content-Range", &range)],
                Some(("text/plain", data)),
                self.config.request_timeout,
            )
            .await?;
        let job_status = RemoteJobState::parse(resp.header("job-status"));
        match resp.status.as_u16() {
            200 | 202 => Ok(PatchOutcome::Accepted {
                job_status,
                update_interval: resp
                    .header("x-gitlab-trace-update-interval")
                    .and_then(update_interval),
            }),
            416 => {
                let remote_len = resp.header("range").and_then(range_end).ok_or_else(|| {
                    GitlabError::Decode {
                        endpoint: ep.clone(),
                        message: "416 without a usable Range header".into(),
                    }
                })?;
                Ok(PatchOutcome::RangeMismatch {
                    remote_len,
                    job_status,
                })
            }
            status @ (403 | 404) => Ok(PatchOutcome::Abort { status, job_status }),
            _ => Err(resp.unexpected(ep, &[job_token.expose()])),
        }
    }
}

/// How a [`TraceSender`] uploads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceConfig {
    /// `output_limit` in KiB (0 → [`DEFAULT_OUTPUT_LIMIT_KIB`]); output beyond it is dropped
    /// after GitLab Runner's notice.
    pub output_limit_kib: u64,
    /// Largest PATCH body.
    pub max_patch_size: usize,
    /// Interval between uploads until GitLab sends `X-GitLab-Trace-Update-Interval`.
    pub update_interval: Duration,
    /// Delays between retries of the final upload.
    pub backoff: Backoff,
    /// How many times [`TraceSender::finish`] tries before giving up.
    pub finish_attempts: u32,
    /// `debug_trace` query parameter (`CI_DEBUG_TRACE`).
    pub debug_trace: bool,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            output_limit_kib: DEFAULT_OUTPUT_LIMIT_KIB,
            max_patch_size: 256 * 1024,
            update_interval: Duration::from_secs(3),
            backoff: Backoff::default(),
            finish_attempts: 10,
            debug_trace: false,
        }
    }
}

/// GitLab Runner's notice appended when the trace reaches `output_limit` (`limit` in bytes).
pub fn limit_exceeded_message(limit: u64) -> String {
    format!(
        "\n\x1b[33;1mJob's log exceeded limit of {limit} bytes.\n\
         Job execution will continue but no more output will be collected.\x1b[0;m\n"
    )
}

/// The trace kept for one job: everything accepted so far (bounded by `output_limit`).
#[derive(Debug, Default)]
struct Buffer {
    data: Vec<u8>,
    limit: u64,
    truncated: bool,
}

impl Buffer {
    fn push_limited(&mut self, bytes: &[u8]) {
        if self.truncated || bytes.is_empty() {
            return;
        }
        let room = usize::try_from(self.limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.data.len());
        if bytes.len() <= room {
            self.data.extend_from_slice(bytes);
        } else {
            self.data.extend_from_slice(&bytes[..room]);
            self.data
                .extend_from_slice(limit_exceeded_message(self.limit).as_bytes());
            self.truncated = true;
        }
    }
}

/// Uploads one job's trace incrementally and turns GitLab's `Job-Status` into signals.
///
/// The caller [`append`](Self::append)s output (already masked by Slipway's trace masking) and
/// either drives [`run`](Self::run) next to the job or calls [`flush`](Self::flush) itself; at the
/// end [`finish`](Self::finish) sends the rest and returns the checksum and size for the final
/// update. [`cancel_token`](Self::cancel_token) fires on `Job-Status: canceling` (graceful),
/// [`abort_token`](Self::abort_token) on `canceled`/`failed` or a 403/404.
#[derive(Debug)]
pub struct TraceSender {
    client: GitlabClient,
    job_id: u64,
    token: Secret,
    config: TraceConfig,
    buffer: Mutex<Buffer>,
    /// Bytes GitLab holds; the lock also serializes uploads.
    sent: tokio::sync::Mutex<u64>,
    interval: Mutex<Duration>,
    /// When GitLab last heard about the job (a PATCH or a keep-alive).
    contact: Mutex<tokio::time::Instant>,
    /// The update interval GitLab asked for, once it has (`X-GitLab-Trace-Update-Interval`).
    asked: Mutex<Option<Duration>>,
    cancel: CancellationToken,
    abort: CancellationToken,
}

impl TraceSender {
    /// A sender for job `job_id` with its job token.
    pub fn new(client: GitlabClient, job_id: u64, token: Secret, config: TraceConfig) -> Self {
        let kib = if config.output_limit_kib == 0 {
            DEFAULT_OUTPUT_LIMIT_KIB
        } else {
            config.output_limit_kib
        };
        Self {
            client,
            job_id,
            token,
            buffer: Mutex::new(Buffer {
                limit: kib.saturating_mul(1024),
                ..Buffer::default()
            }),
            sent: tokio::sync::Mutex::new(0),
            interval: Mutex::new(config.update_interval),
            contact: Mutex::new(tokio::time::Instant::now()),
            asked: Mutex::new(None),
            config,
            cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
        }
    }

    /// Fires when GitLab asks for a graceful cancel (`Job-Status: canceling`).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Fires when the job must stop at once (`canceled`, `failed`, 403, 404).
    pub fn abort_token(&self) -> CancellationToken {
        self.abort.clone()
    }

    /// The current upload interval (GitLab's `X-GitLab-Trace-Update-Interval` once sent).
    pub fn update_interval(&self) -> Duration {
        self.interval
            .lock()
            .map(|g| *g)
            .unwrap_or(self.config.update_interval)
    }

    /// Adds output. Beyond `output_limit` it is dropped after GitLab Runner's notice.
    pub fn append(&self, bytes: &[u8]) {
        let Ok(mut buf) = self.buffer.lock() else {
            return;
        };
        buf.push_limited(bytes);
    }

    /// Total bytes of the trace so far (as GitLab will have them).
    pub fn len(&self) -> u64 {
        self.buffer.lock().map(|b| b.data.len() as u64).unwrap_or(0)
    }

    /// Whether nothing was appended yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checksum (`crc32:<hex>`) and size of the trace, for the final job update.
    pub fn output_info(&self) -> OutputInfo {
        let (checksum, bytesize) = self
            .buffer
            .lock()
            .map(|b| (crc32(&b.data), b.data.len() as u64))
            .unwrap_or((0, 0));
        OutputInfo {
            checksum: format!("crc32:{checksum:08x}"),
            bytesize,
        }
    }

    fn note_status(&self, status: &RemoteJobState) {
        match status {
            RemoteJobState::Canceling => {
                if !self.cancel.is_cancelled() {
                    tracing::info!(
                        job = self.job_id,
                        "GitLab asks to cancel the job gracefully"
                    );
                }
                self.cancel.cancel();
            }
            s if s.is_abort() => {
                if !self.abort.is_cancelled() {
                    tracing::info!(job = self.job_id, status = ?s, "GitLab stopped the job");
                }
                self.abort.cancel();
            }
            _ => {}
        }
    }

    /// Sends everything not yet sent (in PATCHes of at most `max_patch_size`), resyncing on 416.
    /// Returns GitLab's last `Job-Status`. Network errors and unexpected statuses are returned;
    /// what was sent stays sent and the next flush continues from there.
    pub async fn flush(&self) -> Result<RemoteJobState, GitlabError> {
        let mut sent = self.sent.lock().await;
        let mut last = RemoteJobState::Unknown;
        let mut mismatches = 0;
        loop {
            if self.abort.is_cancelled() {
                return Ok(last);
            }
            let chunk = {
                let buf = self
                    .buffer
                    .lock()
                    .map_err(|_| GitlabError::InvalidRequest {
                        endpoint: format!("PATCH /api/v4/jobs/{}/trace", self.job_id),
                        message: "trace buffer poisoned".into(),
                    })?;
                let start = usize::try_from(*sent)
                    .unwrap_or(usize::MAX)
                    .min(buf.data.len());
                let end = start
                    .saturating_add(self.config.max_patch_size.max(1))
                    .min(buf.data.len());
                Bytes::copy_from_slice(&buf.data[start..end])
            };
            if chunk.is_empty() {
                return Ok(last);
            }
            let len = chunk.len() as u64;
            let outcome = self
                .client
                .patch_trace(
                    self.job_id,
                    &self.token,
                    *sent,
                    chunk,
                    self.config.debug_trace,
                )
                .await?;
            match outcome {
                PatchOutcome::Accepted {
                    job_status,
                    update_interval,
                } => {
                    *sent += len;
                    mismatches = 0;
                    self.touched();
                    if let Some(i) = update_interval {
                        if let Ok(mut g) = self.interval.lock() {
                            *g = i;
                        }
                        if let Ok(mut g) = self.asked.lock() {
                            *g = Some(i);
                        }
                    }
                    self.note_status(&job_status);
                    last = job_status;
                }
                PatchOutcome::RangeMismatch {
                    remote_len,
                    job_status,
                } => {
                    self.note_status(&job_status);
                    mismatches += 1;
                    if mismatches > 3 {
                        return Err(GitlabError::Status {
                            endpoint: format!("PATCH /api/v4/jobs/{}/trace", self.job_id),
                            status: 416,
                            body: format!(
                                "range mismatch persists (server has {remote_len} bytes)"
                            ),
                        });
                    }
                    tracing::warn!(
                        job = self.job_id,
                        local = *sent,
                        remote = remote_len,
                        "trace range mismatch, resyncing"
                    );
                    *sent = remote_len.min(self.len());
                    last = job_status;
                }
                PatchOutcome::Abort { status, job_status } => {
                    tracing::info!(
                        job = self.job_id,
                        status,
                        "trace rejected, aborting the job"
                    );
                    self.abort.cancel();
                    return Ok(job_status);
                }
            }
        }
    }

    /// Uploads every `update_interval` until `stop` fires or the job is aborted. Failed uploads
    /// are logged and retried at the next tick. Call [`finish`](Self::finish) afterwards.
    pub async fn run(&self, stop: &CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.abort.cancelled() => return,
                () = tokio::time::sleep(self.update_interval()) => {}
            }
            if let Err(e) = self.flush().await {
                tracing::warn!(job = self.job_id, error = %e, "trace upload failed, will retry");
            } else if self.quiet_for() >= self.keepalive_after() {
                // Nothing new to send: a keep-alive, which also brings GitLab's Job-Status.
                match self.client.touch_job(self.job_id, &self.token).await {
                    Ok(status) => {
                        self.touched();
                        self.note_status(&status);
                    }
                    Err(e) => {
                        tracing::warn!(job = self.job_id, error = %e, "job keep-alive failed")
                    }
                }
            }
        }
    }

    fn touched(&self) {
        if let Ok(mut g) = self.contact.lock() {
            *g = tokio::time::Instant::now();
        }
    }

    /// Silence after which GitLab hears a keep-alive: the interval GitLab asked for (3 s while
    /// someone watches the job, 60 s otherwise), else GitLab Runner's 30 s.
    fn keepalive_after(&self) -> Duration {
        self.asked
            .lock()
            .ok()
            .and_then(|g| *g)
            .unwrap_or(KEEPALIVE_AFTER)
    }

    fn quiet_for(&self) -> Duration {
        self.contact.lock().map(|g| g.elapsed()).unwrap_or_default()
    }

    /// Sends the rest of the trace, retrying with backoff (up to `finish_attempts`, or until
    /// `cancel`), and returns the checksum and size for the final update.
    pub async fn finish(&self, cancel: &CancellationToken) -> Result<OutputInfo, GitlabError> {
        let mut attempt = 0;
        loop {
            match self.flush().await {
                Ok(_) => return Ok(self.output_info()),
                Err(e) if attempt + 1 < self.config.finish_attempts.max(1) => {
                    let delay = e
                        .retry_after()
                        .unwrap_or_else(|| self.config.backoff.delay(attempt));
                    tracing::warn!(job = self.job_id, error = %e, ?delay, "final trace upload failed, retrying");
                    attempt += 1;
                    if !sleep_or_cancel(delay, cancel).await {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_status_parses() {
        assert_eq!(
            RemoteJobState::parse(Some("canceling")),
            RemoteJobState::Canceling
        );
        assert!(RemoteJobState::parse(Some("canceled")).is_abort());
        assert!(RemoteJobState::parse(Some("failed")).is_abort());
        assert!(!RemoteJobState::parse(Some("running")).is_abort());
        assert_eq!(RemoteJobState::parse(None), RemoteJobState::Unknown);
    }

    #[test]
    fn buffer_truncates_with_gitlab_message() {
        let mut b = Buffer {
            limit: 10,
            ..Buffer::default()
        };
        b.push_limited(b"0123456");
        b.push_limited(b"789abc");
        b.push_limited(b"more");
        let want = format!("0123456789{}", limit_exceeded_message(10));
        assert_eq!(b.data, want.as_bytes());
    }
}
