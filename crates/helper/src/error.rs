//! The helper's errors. URLs in messages never carry their query (pre-signed URLs hold their
//! signature there) and no message holds a token.

use std::path::{Path, PathBuf};

use crate::http::without_query;

/// Why a helper step failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The plan on stdin cannot be read.
    #[error("reading the plan on stdin: {0}")]
    Plan(String),
    /// The plan's CA cannot be used.
    #[error("the plan's TLS CA: {0}")]
    Tls(String),
    /// A request could not be made or answered.
    #[error("{url}: {message}")]
    Http {
        /// The URL, without its query.
        url: String,
        /// What failed.
        message: String,
    },
    /// A body broke off.
    #[error("{url}: transfer: {source}")]
    Transfer {
        /// The URL, without its query.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an unexpected status.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// The URL, without its query.
        url: String,
        /// The status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// A file on this host could not be used.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An archive could not be read, written or unpacked.
    #[error(transparent)]
    Archive(#[from] slipway_artifacts::ArtifactsError),
    /// Unpacking a tar stream into the project directory failed.
    #[error("unpacking into the project directory: {0}")]
    Unpack(#[source] std::io::Error),
}

impl HelperError {
    /// A request to `url` that failed with `e`.
    pub(crate) fn http(url: &str, e: ureq::Error) -> HelperError {
        HelperError::Http {
            url: without_query(url),
            message: e.to_string(),
        }
    }

    /// An unexpected `status` from `url`, with the start of its answer.
    pub(crate) fn status(
        url: &str,
        status: u16,
        resp: ureq::http::Response<ureq::Body>,
    ) -> HelperError {
        let mut body = String::new();
        let _ = std::io::Read::read_to_string(
            &mut std::io::Read::take(resp.into_body().into_reader(), 512),
            &mut body,
        );
        HelperError::Status {
            url: without_query(url),
            status,
            body: body.trim().to_string(),
        }
    }

    /// An error on the file `path`.
    pub(crate) fn file(path: &Path) -> impl FnOnce(std::io::Error) -> HelperError {
        let path = path.to_path_buf();
        move |source| HelperError::File { path, source }
    }

    /// Whether an archive broke the runner's limits: its job fails.
    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            HelperError::Archive(slipway_artifacts::ArtifactsError::Limit(_))
        )
    }

    /// What the operator can do about it, when the job's host could not reach the server.
    pub fn hint(&self) -> &'static str {
        match self {
            HelperError::Http { .. } => {
                " (the job's host cannot reach the server: let it, or set job_data = \"manager\" \
                 in [[runners]])"
            }
            _ => "",
        }
    }

    /// Whether trying again may help (the network, a busy server).
    pub fn is_transient(&self) -> bool {
        match self {
            HelperError::Http { .. } | HelperError::Transfer { .. } => true,
            HelperError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}
