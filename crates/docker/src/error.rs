//! The crate's one error type.

use std::io;

/// Everything that can go wrong talking to the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transport could not open a stream to the engine.
    #[error("cannot connect to the Docker engine: {0}")]
    Connect(#[source] io::Error),
    /// HTTP-level failure on an open connection (closed early, malformed response…).
    #[error("Docker engine connection: {}", chain(.0))]
    Http(#[from] hyper::Error),
    /// I/O failure on a stream (attach, exec, request body).
    #[error("Docker engine stream: {0}")]
    Io(#[from] io::Error),
    /// The engine answered 404, e.g. "No such image: foo".
    #[error("not found: {message}")]
    NotFound {
        /// The engine's `message`.
        message: String,
    },
    /// The engine answered 409, e.g. a name already in use or removing a running container.
    #[error("conflict: {message}")]
    Conflict {
        /// The engine's `message`.
        message: String,
    },
    /// Any other non-success status.
    #[error("Docker engine error (HTTP {status}): {message}")]
    Api {
        /// The HTTP status code.
        status: u16,
        /// The engine's `message`, or the raw body when it had none.
        message: String,
    },
    /// Pulling an image failed (registry unreachable, unknown repository, no access…).
    #[error("pulling image {image}: {message}")]
    Pull {
        /// The image reference that was asked for.
        image: String,
        /// HTTP status when the engine refused outright; `None` when the error came mid-stream.
        status: Option<u16>,
        /// The engine's message.
        message: String,
    },
    /// A progress stream (import, …) reported an error.
    #[error("Docker engine reported: {0}")]
    Stream(String),
    /// The engine's response did not parse.
    #[error("unexpected response from the Docker engine ({context}): {source}")]
    Decode {
        /// What was being decoded.
        context: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// Our request could not be built (bad name, bad header value…).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// No API version both sides speak.
    #[error("Docker engine API {server} (min {min}) is incompatible with this client (max {ours})")]
    UnsupportedVersion {
        /// The server's newest API version.
        server: String,
        /// The server's oldest API version.
        min: String,
        /// Our newest API version.
        ours: String,
    },
}

impl Error {
    /// HTTP status the engine answered with, when the error came from one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::NotFound { .. } => Some(404),
            Error::Conflict { .. } => Some(409),
            Error::Api { status, .. } => Some(*status),
            Error::Pull { status, .. } => *status,
            _ => None,
        }
    }

    /// The engine said 404.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// The engine said 409.
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// Builds the error for a non-success `status` with response `body`.
    pub(crate) fn from_response(status: u16, body: &[u8]) -> Self {
        let message = engine_message(body);
        match status {
            404 => Error::NotFound { message },
            409 => Error::Conflict { message },
            _ => Error::Api { status, message },
        }
    }
}

/// `error: cause: cause…` (hyper keeps the interesting part in its sources).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The `message` field of an engine error body, or the body itself.
pub(crate) fn engine_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        message: String,
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => b.message,
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_status() {
        let e = Error::from_response(404, br#"{"message":"No such image: foo"}"#);
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "not found: No such image: foo");
        let e = Error::from_response(409, br#"{"message":"name in use"}"#);
        assert!(e.is_conflict());
        let e = Error::from_response(500, b"plain text\n");
        assert_eq!(e.status(), Some(500));
        assert_eq!(e.to_string(), "Docker engine error (HTTP 500): plain text");
    }
}
