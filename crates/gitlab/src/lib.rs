//! GitLab's runner API (`/api/v4`) from the runner's side: Slipway's client for it.
//!
//! - [`GitlabClient`]: one runner's HTTP client (HTTPS with the system's roots, plain HTTP for
//!   loopback tests): [`GitlabClient::verify`], [`GitlabClient::register`],
//!   [`GitlabClient::unregister`], [`GitlabClient::request_job`], [`GitlabClient::patch_trace`],
//!   [`GitlabClient::update_job`].
//! - [`Poller`]: asks for jobs when the caller has capacity, with `request_concurrency`,
//!   `check_interval`, `last_update` echoing and backoff.
//! - [`TraceSender`]: incremental trace upload with resync, size limit and cancel signals.
//! - [`PendingUpdate`] and [`GitlabClient::finish_job`]: the final job state, retried until GitLab
//!   accepts it and handed back (serializable) if it cannot be delivered.
//! - [`GitlabClient::upload_artifacts`] and [`GitlabClient::download_artifacts`]: job artifacts,
//!   downloads following redirects to object storage.
//!
//! - [`Outbox`]: job records on disk until GitLab has their final state, across restarts.
//! - [`wire_reason`]: a job's [`slipway_job::FailureReason`] as the server accepts it.
//! - [`remote`]: one fetch of a public file (a pipeline's `include: remote`), TLS as the client's.
//!
//! Tokens are [`Secret`]s: `Debug` prints `[MASKED]`, errors never carry them.
//!
//! Private modules (their items are re-exported here):
//!
//! - `client`: the HTTP layer and the runner lifecycle calls (`runners/verify`, `runners`,
//!   unregister).
//! - `request`: `POST /api/v4/jobs/request` and the [`Poller`].
//! - `trace`: incremental trace upload, `PATCH /api/v4/jobs/:id/trace`.
//! - `update`: job updates, `PUT /api/v4/jobs/:id`, and the final state that is never dropped.
//! - `response`: what the API's answers carry besides their bodies: the `Job-Status` header, the
//!   update interval, a 416's range, the trace's checksum and size.
//! - `artifacts`: artifact upload (multipart `POST`) and download (`GET`, possibly redirected to
//!   object storage).
//! - `outbox`: what GitLab must still hear about a job, kept on disk until it has.
//! - `system_id`: the runner's stable `system_id` (`s_` + 12 hex characters), kept in a file.
//! - `tls`: TLS towards GitLab as GitLab Runner configures it: the system's roots plus a private
//!   CA, and a client certificate.
//! - `error`: [`GitlabError`]; every variant names the endpoint, none carries a token.

mod artifacts;
mod client;
mod error;
mod outbox;
pub mod remote;
mod request;
mod response;
mod system_id;
mod tls;
mod trace;
mod update;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use artifacts::{MAX_DOWNLOAD_SIZE, UploadOptions, resolve as resolve_redirect};
pub use client::{ClientConfig, GitlabClient, RegisterOptions, RunnerCredentials};
pub use error::GitlabError;
pub use outbox::{INTERRUPTED_MESSAGE, Outbox, Owed};
pub use request::{JobRequestOutcome, Poller, PollerConfig};
pub use response::{OutputInfo, RemoteJobState, crc32, range_end, update_interval};
pub use system_id::SystemId;
pub use tls::{TlsFiles, host_of};
pub use trace::{
    DEFAULT_OUTPUT_LIMIT_KIB, PatchOutcome, TraceConfig, TraceSender, limit_exceeded_message,
};
pub use update::{
    FinishOutcome, JobState, PendingUpdate, UpdateOutcome, UpdateRetryPolicy, wire_reason,
};

pub(crate) use slipway_job::MASK;

/// A token (runner or job): printed as `[MASKED]` by `Debug`, serialized as-is (state stores need
/// it to resend).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a token.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The token itself, for the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// GitLab's short token: the first 9 characters after the `glrt-`/`glcbt-`/`glrtr-` prefix
    /// (and a `t1_`-style partition prefix), safe for logs.
    pub fn short(&self) -> String {
        let s = self.0.as_str();
        let s = ["glrt-", "glrtr-", "glcbt-"]
            .iter()
            .find_map(|p| s.strip_prefix(p))
            .unwrap_or(s);
        let s = ["t1_", "t2_", "t3_"]
            .iter()
            .find_map(|p| s.strip_prefix(p))
            .unwrap_or(s);
        s.chars().take(9).collect()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

/// The runner's `info` object, sent with registration, job requests and job updates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// Runner software name (`slipway`).
    pub name: String,
    /// Runner version.
    pub version: String,
    /// Source revision.
    pub revision: String,
    /// Operating system, in GitLab Runner's (Go's) spelling: `linux`, `darwin`, `windows`.
    pub platform: String,
    /// CPU architecture, in Go's spelling: `amd64`, `arm64`, ...
    pub architecture: String,
    /// Executor name (`shell`, `docker`, `docker-autoscaler`, `instance`, `custom`).
    pub executor: String,
    /// Shell (`bash`, `sh`, `pwsh`, ...).
    pub shell: String,
    /// Features this runner's executor supports (`refspecs`, `variables`, `artifacts`, ...).
    pub features: BTreeMap<String, bool>,
}

impl VersionInfo {
    /// Info for this build of Slipway with the executor's `features`; `refspecs` is always set
    /// (GitLab sends no detached merge-request jobs to runners without it).
    pub fn new(
        executor: impl Into<String>,
        shell: impl Into<String>,
        features: impl IntoIterator<Item = (String, bool)>,
    ) -> Self {
        let mut features: BTreeMap<String, bool> = features.into_iter().collect();
        features.insert("refspecs".into(), true);
        Self {
            name: "slipway".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            revision: option_env!("SLIPWAY_REVISION").unwrap_or("unknown").into(),
            platform: std::env::consts::OS.replace("macos", "darwin"),
            architecture: go_arch(std::env::consts::ARCH).into(),
            executor: executor.into(),
            shell: shell.into(),
            features,
        }
    }
}

/// Go's name for a Rust target architecture.
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// Exponential backoff between retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): `initial * 2^attempt`, capped at `max`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Sleeps `delay` unless `cancel` fires first; returns `false` when cancelled.
pub(crate) async fn sleep_or_cancel(
    delay: Duration,
    cancel: &tokio_util::sync::CancellationToken,
) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_masked_and_shortened() {
        let s = Secret::new("glrt-t2_abcdefghijklmnop");
        assert_eq!(format!("{s:?}"), "[MASKED]");
        assert_eq!(s.short(), "abcdefghi");
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            "\"glrt-t2_abcdefghijklmnop\""
        );
    }

    #[test]
    fn info_always_has_refspecs() {
        let info = VersionInfo::new("shell", "bash", [("variables".to_string(), true)]);
        assert_eq!(info.features.get("refspecs"), Some(&true));
        assert_eq!(info.features.get("variables"), Some(&true));
        assert_eq!(info.name, "slipway");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(400));
        assert_eq!(b.delay(30), Duration::from_secs(1));
    }
}
