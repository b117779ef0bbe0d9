//! The connector's error types.

use std::path::PathBuf;
use std::time::Duration;

/// Why connecting to, or running a command on, an instance failed.
///
/// Every variant names the instance; those that reach the network also name the address.
/// Credentials never appear in messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The connect info is unusable (no address, bad port, no user, unsupported protocol).
    #[error("instance {instance}: invalid connect info: {reason}")]
    InvalidConnectInfo {
        /// Instance id.
        instance: String,
        /// What is wrong.
        reason: String,
    },
    /// The private key could not be parsed.
    #[error("instance {instance}: cannot parse private key: {reason}")]
    InvalidKey {
        /// Instance id.
        instance: String,
        /// Parser message (never key material).
        reason: String,
    },
    /// A file to stream to a command's stdin cannot be opened.
    #[error("cannot read {}: {source}", path.display())]
    Input {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TCP connection could not be established.
    #[error("instance {instance} at {addr}: cannot connect: {source}")]
    Io {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Connecting (TCP, key exchange and authentication) took longer than the dial timeout.
    #[error("instance {instance} at {addr}: connect timed out after {timeout:?}")]
    ConnectTimeout {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// The dial timeout.
        timeout: Duration,
    },
    /// The instance presented a host key different from the one pinned on first use.
    #[error(
        "instance {instance}: host key mismatch: pinned {expected_fingerprint}, \
         server presented {got_fingerprint} (possible man-in-the-middle, or the instance was \
         replaced without being forgotten)"
    )]
    HostKeyMismatch {
        /// Instance id.
        instance: String,
        /// SHA256 fingerprint of the pinned key.
        expected_fingerprint: String,
        /// SHA256 fingerprint of the key the server presented.
        got_fingerprint: String,
    },
    /// The pinned-key store could not be updated.
    #[error("instance {instance}: {source}")]
    HostKeyStore {
        /// Instance id.
        instance: String,
        /// Underlying error.
        #[source]
        source: HostKeyStoreError,
    },
    /// The server rejected every offered credential.
    #[error("instance {instance} at {addr}: authentication as {user:?} failed (tried: {tried})")]
    AuthFailed {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// Login user.
        user: String,
        /// Methods tried, e.g. `publickey, password`.
        tried: String,
    },
    /// An SSH protocol error.
    #[error("instance {instance} at {addr}: ssh: {source}")]
    Ssh {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// Underlying error (boxed: russh's error type is large).
        #[source]
        source: Box<russh::Error>,
    },
    /// The server refused to run the command (channel or exec request rejected).
    #[error("instance {instance} at {addr}: command rejected: {reason}")]
    Rejected {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// What the server said.
        reason: String,
    },
    /// The instance's sshd would not connect to a unix socket there: nothing listens at the
    /// path, or stream-local forwarding is disabled (`AllowStreamLocalForwarding no`).
    #[error("instance {instance} at {addr}: cannot open unix socket {path}: {reason}")]
    UnixSocketRefused {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// Socket path on the instance.
        path: String,
        /// What the server said, with the likely cause.
        reason: String,
    },
    /// The command did not finish within its timeout; its channel was closed.
    #[error("instance {instance} at {addr}: command timed out after {timeout:?}")]
    Timeout {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
        /// The run timeout.
        timeout: Duration,
    },
    /// The connection dropped before the command reported how it exited.
    #[error("instance {instance} at {addr}: connection lost before the command exited")]
    Disconnected {
        /// Instance id.
        instance: String,
        /// Address dialled.
        addr: String,
    },
}

/// Why the host-key store could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostKeyStoreError {
    /// Reading or writing the store file failed.
    #[error("host key store {path}: {source}")]
    Io {
        /// Store file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line of the store file is malformed.
    #[error("host key store {path} line {line}: {reason}")]
    Parse {
        /// Store file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// An instance id cannot be stored (empty or contains whitespace).
    #[error("instance id {0:?} cannot be stored: it is empty or contains whitespace")]
    BadInstanceId(String),
}
