//! Typed errors of the GitLab runner API client. Every variant names the endpoint; none carries a
//! token (bodies quoted from the server are cut short and masked).

use std::path::PathBuf;
use std::time::Duration;

/// An error talking to GitLab's runner API.
#[derive(Debug, thiserror::Error)]
pub enum GitlabError {
    /// The configured GitLab URL cannot be used.
    #[error("invalid GitLab URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given (tokens never live in it).
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The request could not be built (e.g. a token with characters invalid in a header).
    #[error("{endpoint}: cannot build request: {message}")]
    InvalidRequest {
        /// Method and path.
        endpoint: String,
        /// What was wrong (never the token itself).
        message: String,
    },
    /// The request could not be sent or its answer not read (connection refused, reset, TLS, ...).
    #[error("{endpoint}: network error: {message}")]
    Network {
        /// Method and path, e.g. `POST /api/v4/jobs/request`.
        endpoint: String,
        /// The transport's description of the failure.
        message: String,
    },
    /// A TLS file (`tls-ca-file`, `tls-cert-file`, `tls-key-file`) cannot be used.
    #[error("{file}: {reason} (TLS towards {url})")]
    TlsFile {
        /// The file.
        file: std::path::PathBuf,
        /// The GitLab it is for.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A certificate was rejected during the handshake (ours or the server's): not retried,
    /// since only a change of configuration or of the server's certificate fixes it.
    #[error("{endpoint} at {url}: {message}{}", ca_hint(ca_file))]
    Certificate {
        /// Method and path.
        endpoint: String,
        /// GitLab's URL.
        url: String,
        /// What was rejected and why.
        message: String,
        /// The CA file in use besides the system's roots, if any.
        ca_file: Option<std::path::PathBuf>,
    },
    /// No answer within the request timeout.
    #[error("{endpoint}: no answer within {timeout:?}")]
    Timeout {
        /// Method and path.
        endpoint: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// 403: the runner token (or job token) is not valid, or the job is gone.
    #[error("{endpoint}: forbidden (HTTP 403): token invalid or job no longer running")]
    Forbidden {
        /// Method and path.
        endpoint: String,
    },
    /// 409, 429 or 5xx: the server asks to come back later.
    #[error("{endpoint}: server busy or unavailable (HTTP {status}), retry after {retry_after:?}")]
    RetryLater {
        /// Method and path.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The server's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// Any other unexpected status.
    #[error("{endpoint}: unexpected HTTP {status}: {body}")]
    Status {
        /// Method and path.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body (masked, at most 200 characters).
        body: String,
    },
    /// The response body is not what the endpoint returns.
    #[error("{endpoint}: invalid response body: {message}")]
    Decode {
        /// Method and path.
        endpoint: String,
        /// What was wrong.
        message: String,
    },
    /// The outbox (final states kept until GitLab accepts them) cannot be read or written.
    #[error("job outbox {path}: {message}")]
    Outbox {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The `system_id` file cannot be read or written.
    #[error("system id file {path}: {message}")]
    SystemId {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl GitlabError {
    /// Whether retrying the same call later may succeed (network trouble, timeouts, 409/429/5xx).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Network { .. } | Self::Timeout { .. } | Self::RetryLater { .. }
        )
    }

    /// The delay the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RetryLater { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

fn ca_hint(ca_file: &Option<std::path::PathBuf>) -> String {
    match ca_file {
        Some(f) => format!(" (trusted: the system's roots and {})", f.display()),
        None => " (trusted: the system's roots only; set tls-ca-file for a private CA)".into(),
    }
}
