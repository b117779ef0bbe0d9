//! The crate's error type: every variant names the path and the operation that failed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Result of a cgroup operation.
pub type Result<T, E = CgroupError> = std::result::Result<T, E>;

/// What went wrong, with the cgroupfs path involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// Writing an interface file failed (the kernel rejected the value, or the file is missing).
    #[error("cannot write {value} to {}: {source}", path.display())]
    Write {
        /// The interface file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The I/O error.
        source: io::Error,
    },
    /// Reading an interface file failed.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The interface file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// An interface file held something unexpected.
    #[error("cannot parse {what} from {}: {content:?}", path.display())]
    Parse {
        /// The interface file.
        path: PathBuf,
        /// What was being parsed.
        what: &'static str,
        /// The text that did not parse.
        content: String,
    },
    /// Creating a cgroup directory failed.
    #[error("cannot create cgroup {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Removing a cgroup directory failed.
    #[error("cannot remove cgroup {}: {source}", path.display())]
    RemoveDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A task entered the cgroup after it was emptied, so it could not be removed.
    #[error("cannot remove cgroup {}: a task entered it after it was emptied", path.display())]
    Entered {
        /// The directory.
        path: PathBuf,
    },
    /// Listing a cgroup directory failed.
    #[error("cannot list cgroup {}: {source}", path.display())]
    ListDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// No cgroup v1 or v2 hierarchy was found under the root.
    #[error("no cgroup hierarchy found under {}", root.display())]
    NoHierarchy {
        /// The root that was probed.
        root: PathBuf,
    },
    /// A limit needs a controller the hierarchy does not offer.
    #[error("cannot limit {what}: controller {controller} is not available under {}", root.display())]
    ControllerUnavailable {
        /// The missing controller.
        controller: &'static str,
        /// The limit that needed it.
        what: &'static str,
        /// The hierarchy root.
        root: PathBuf,
    },
    /// The slot cgroup template is not usable.
    #[error("invalid slot cgroup template {template:?}: {reason}")]
    Template {
        /// The template as given.
        template: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A resource limit is out of range.
    #[error("invalid {what} limit {value}: {reason}")]
    InvalidLimit {
        /// Which limit.
        what: &'static str,
        /// The value given.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A path given for a script is not safe to embed.
    #[error("invalid cgroup root {root:?}: {reason}")]
    InvalidRoot {
        /// The path as given.
        root: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Sending SIGKILL to a process of the slot failed.
    #[error("cannot kill pid {pid} in {}: {source}", path.display())]
    Kill {
        /// The slot cgroup.
        path: PathBuf,
        /// The process.
        pid: u32,
        /// The errno.
        source: nix::Error,
    },
    /// Processes were still in the slot when the cleanup deadline passed.
    #[error("processes {pids:?} still in {} after {after:?}", path.display())]
    KillTimeout {
        /// The slot cgroup.
        path: PathBuf,
        /// The processes left.
        pids: Vec<u32>,
        /// How long cleanup tried.
        after: Duration,
    },
    /// Cleanup was asked to kill the slot that holds the calling process.
    #[error("refusing to clean up {}: it holds this process (pid {pid})", path.display())]
    SelfInSlot {
        /// The slot cgroup.
        path: PathBuf,
        /// This process.
        pid: u32,
    },
}
