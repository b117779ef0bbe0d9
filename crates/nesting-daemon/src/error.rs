//! The daemon's errors, each mapped to the gRPC status the client sees.

use slipway_nesting::BadName;
use tonic::Status;

use crate::hypervisor::HypervisorError;

/// Why a nesting request failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// `Init` has not been called (GitLab's `ErrNotInitialized`).
    #[error("not initialized")]
    NotInitialized,
    /// `Init` was called twice (GitLab's `ErrAlreadyInitialized`).
    #[error("already initialized")]
    AlreadyInitialized,
    /// The `Init` configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// No such VM.
    #[error("no VM with id {0:?}")]
    NoVm(String),
    /// No such image.
    #[error(
        "no image {name:?} in {dir} (build it with `slipway image build --name {name}`): {why}"
    )]
    NoImage {
        /// Image name.
        name: String,
        /// Images directory.
        dir: String,
        /// What is wrong.
        why: String,
    },
    /// No such snapshot.
    #[error("no snapshot named {0:?}")]
    NoSnapshot(String),
    /// A name that is not `[A-Za-z0-9._-]{1,64}` ([`slipway_nesting::check_name`]).
    #[error(transparent)]
    BadName(#[from] BadName),
    /// A snapshot cannot be restored here (hypervisor, version, machine or CPU differ).
    #[error("{0}")]
    Incompatible(String),
    /// The request conflicts with the current state (a snapshot in use, say).
    #[error("{0}")]
    Conflict(String),
    /// The hypervisor failed.
    #[error(transparent)]
    Hypervisor(#[from] HypervisorError),
    /// The guest agent did not answer.
    #[error("{0}")]
    Agent(String),
    /// Creating or inspecting a disk layer failed.
    #[error("{0}")]
    Disk(String),
    /// State files could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl DaemonError {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
        let context = context.into();
        move |source| DaemonError::Io { context, source }
    }
}

impl From<DaemonError> for Status {
    fn from(e: DaemonError) -> Status {
        let msg = e.to_string();
        match e {
            DaemonError::NotInitialized
            | DaemonError::AlreadyInitialized
            | DaemonError::Incompatible(_)
            | DaemonError::Conflict(_) => Status::failed_precondition(msg),
            DaemonError::Config(_) | DaemonError::BadName(_) => Status::invalid_argument(msg),
            DaemonError::NoVm(_) | DaemonError::NoImage { .. } | DaemonError::NoSnapshot(_) => {
                Status::not_found(msg)
            }
            DaemonError::Hypervisor(HypervisorError::Timeout { .. }) => {
                Status::deadline_exceeded(msg)
            }
            _ => Status::internal(msg),
        }
    }
}
