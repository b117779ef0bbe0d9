//! One trait over the hypervisors: start a VM from a [`VmSpec`], pause, resume, snapshot it to
//! files, restore it in a new process, stop it.
//!
//! - [`qemu`]: QEMU (`-M microvm` or q35), driven by argv and QMP; KVM or TCG.
//! - [`firecracker`]: Firecracker's REST API over a unix socket (KVM only).
//! - [`cloud_hypervisor`]: Cloud Hypervisor's REST API over a unix socket (KVM only).
//!
//! Both REST backends reach their guests' agents through hybrid vsock
//! ([`slipway_nesting::vsock`]).

pub mod cloud_hypervisor;
pub mod firecracker;
mod http;
pub mod process;
pub mod qemu;
mod qmp;
mod rest;

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use slipway_nesting::spec::{Capabilities, VmSpec};

/// A running hypervisor process, as the daemon persists it: enough to find it again after the
/// daemon restarted (pid + the id in its command line) and to talk to it (its control socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmProcess {
    /// Process id of the hypervisor.
    pub pid: u32,
    /// Control socket (QMP for QEMU, the REST API socket for Firecracker / Cloud Hypervisor).
    pub control: PathBuf,
    /// A string that appears in the process's command line, so a recycled pid is not mistaken
    /// for the VM.
    pub marker: String,
}

/// Files a snapshot consists of (disks are not part of it: the caller keeps them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFiles {
    /// Directory holding the files.
    pub dir: PathBuf,
    /// Device state (Firecracker's snapshot file, Cloud Hypervisor's state.json); for QEMU the
    /// one migration stream holding state and memory.
    pub state: PathBuf,
    /// Guest memory image, when separate from the state.
    pub memory: Option<PathBuf>,
}

/// What identifies a hypervisor build for snapshot compatibility.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// `qemu`, `firecracker`, `cloud-hypervisor`.
    pub hypervisor: String,
    /// Its version string.
    pub version: String,
    /// Machine type (`microvm`, `q35`, or the VMM's single machine).
    pub machine: String,
    /// CPU model the guest sees (`max`, `host:<model name>`).
    pub cpu_model: String,
}

/// Errors of the hypervisor backends.
#[derive(Debug, thiserror::Error)]
pub enum HypervisorError {
    /// The hypervisor binary could not be started.
    #[error("cannot start {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: String,
        /// Why.
        source: std::io::Error,
    },
    /// The hypervisor process exited during start-up.
    #[error("{binary} exited during start-up ({status}); its log says: {log}")]
    Exited {
        /// The binary.
        binary: String,
        /// Exit status.
        status: String,
        /// Last lines of its log.
        log: String,
    },
    /// The control socket did not answer in time.
    #[error("{what} did not answer within {after:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        after: Duration,
    },
    /// The control API refused a request.
    #[error("{hypervisor} refused {request}: {message}")]
    Api {
        /// Which hypervisor.
        hypervisor: &'static str,
        /// The request (method and path, or QMP command).
        request: String,
        /// Its error message.
        message: String,
    },
    /// The backend cannot do this (see [`Capabilities`]).
    #[error("{hypervisor} does not support {what}")]
    Unsupported {
        /// Which hypervisor.
        hypervisor: &'static str,
        /// What was asked.
        what: &'static str,
    },
    /// The spec cannot be rendered for this backend.
    #[error("invalid VM spec for {hypervisor}: {message}")]
    Spec {
        /// Which hypervisor.
        hypervisor: &'static str,
        /// What is wrong.
        message: String,
    },
    /// I/O on a socket or file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl From<slipway_nesting::VsockError> for HypervisorError {
    fn from(e: slipway_nesting::VsockError) -> HypervisorError {
        match e {
            slipway_nesting::VsockError::Timeout { what, after } => {
                HypervisorError::Timeout { what, after }
            }
            slipway_nesting::VsockError::Io { context, source } => {
                HypervisorError::Io { context, source }
            }
        }
    }
}

/// A hypervisor backend. Processes it starts outlive the caller (the nesting daemon may restart);
/// every call after `boot`/`restore` works from the persisted [`VmProcess`] alone.
#[async_trait]
pub trait Hypervisor: Send + Sync + std::fmt::Debug {
    /// `qemu`, `firecracker` or `cloud-hypervisor`.
    fn kind(&self) -> &'static str;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Version, machine and CPU model of the VMs this backend starts for `spec`.
    async fn identity(&self, spec: &VmSpec) -> Result<Identity, HypervisorError>;

    /// Start the VM described by `spec`; returns once the process is running and its control
    /// socket answers (not when the guest has booted: the caller waits for the agent).
    async fn boot(&self, spec: &VmSpec) -> Result<VmProcess, HypervisorError>;

    /// Stop the guest's vCPUs.
    async fn pause(&self, vm: &VmProcess) -> Result<(), HypervisorError>;

    /// Continue a paused guest.
    async fn resume(&self, vm: &VmProcess) -> Result<(), HypervisorError>;

    /// Pause the VM and write its state (and memory) into `dir`. The VM stays paused.
    async fn snapshot(&self, vm: &VmProcess, dir: &Path) -> Result<SnapshotFiles, HypervisorError>;

    /// Start a new process for `spec` from `snapshot` and resume it. `spec` must describe the
    /// same devices as the VM the snapshot was taken from (disk paths may differ).
    async fn restore(
        &self,
        spec: &VmSpec,
        snapshot: &SnapshotFiles,
    ) -> Result<VmProcess, HypervisorError>;

    /// Stop the VM: a clean quit through the control socket, SIGKILL if that fails or takes
    /// longer than `grace`. Stopping a VM that is already gone is not an error.
    async fn stop(&self, vm: &VmProcess, grace: Duration) -> Result<(), HypervisorError>;
}

/// Whether `vm`'s process still runs (its pid is alive and its command line carries the marker).
pub fn is_running(vm: &VmProcess) -> bool {
    match std::fs::read(format!("/proc/{}/cmdline", vm.pid)) {
        Ok(cmdline) => {
            let marker = vm.marker.as_bytes();
            cmdline.windows(marker.len()).any(|w| w == marker) && !is_zombie(vm.pid)
        }
        Err(_) => false,
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
