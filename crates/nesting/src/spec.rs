//! The declarative description of one VM, rendered by each backend into its own form (a QEMU
//! argv, Firecracker API calls, a Cloud Hypervisor `vm.create` body).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Isolation level of a VM: a microVM (minimal machine, initramfs root) or a general VM (a
/// standard machine type booting a disk image).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// `-M microvm`, Firecracker, Cloud Hypervisor: virtio-mmio devices, direct kernel boot.
    Microvm,
    /// A general machine (QEMU q35) with a root disk image.
    Vm,
}

impl Level {
    /// The level's name as written in configs and image manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Microvm => "microvm",
            Level::Vm => "vm",
        }
    }
}

/// Which accelerator runs the guest's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's software emulation (10–50× slower).
    Tcg,
}

impl Accel {
    /// The accelerator's name as QEMU spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Disk image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    /// A plain file (Firecracker and Cloud Hypervisor read only this).
    Raw,
    /// QEMU copy-on-write format (backing files make branches cheap).
    Qcow2,
}

/// One block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// Device id (`rootfs`, `work`).
    pub id: String,
    /// File on the host.
    pub path: PathBuf,
    /// Its format.
    pub format: DiskFormat,
    /// Mounted as the guest's root file system.
    pub root: bool,
    /// Guest may not write.
    pub read_only: bool,
}

/// How the host talks to the guest agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AgentChannel {
    /// A virtio-serial port named `name`, exposed on the host as a unix socket the hypervisor
    /// listens on (QEMU `-chardev socket,server=on`).
    VirtioSerial {
        /// Port name the agent looks for in `/sys/class/virtio-ports/*/name`.
        name: String,
        /// Host socket.
        socket: PathBuf,
    },
    /// Firecracker / Cloud Hypervisor hybrid vsock: a host unix socket; the host writes
    /// `CONNECT <port>\n` to reach the guest's listener on `port`.
    Vsock {
        /// Guest context id (≥ 3).
        cid: u32,
        /// Guest port the agent listens on.
        port: u32,
        /// Host socket.
        socket: PathBuf,
    },
}

impl AgentChannel {
    /// The host-side unix socket.
    pub fn socket(&self) -> &std::path::Path {
        match self {
            AgentChannel::VirtioSerial { socket, .. } | AgentChannel::Vsock { socket, .. } => {
                socket
            }
        }
    }
}

/// Everything a backend needs to start (or restore) one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSpec {
    /// The VM's id (also names its process, e.g. `slipway-vm-<id>`).
    pub id: String,
    /// microvm or vm.
    pub level: Level,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Kernel image.
    pub kernel: PathBuf,
    /// Initial ramdisk, if any.
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    pub cmdline: String,
    /// Block devices, in guest order (`/dev/vda`, `/dev/vdb`, …).
    pub disks: Vec<Disk>,
    /// The guest agent's channel.
    pub agent: AgentChannel,
    /// Accelerator.
    pub accel: Accel,
    /// Directory for the VM's sockets, pid file and console log (short: unix socket paths are
    /// limited to about 108 bytes).
    pub run_dir: PathBuf,
    /// Where guest RAM lives (records written before this field existed: anonymous memory).
    #[serde(default)]
    pub memory: GuestMemory,
    /// The guest's network (records written before this field existed: none).
    #[serde(default)]
    pub network: GuestNetwork,
}

/// A guest's network interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuestNetwork {
    /// No NIC: the guest talks only to its agent.
    #[default]
    None,
    /// One virtio NIC on the hypervisor's user-mode network (QEMU's slirp): outbound
    /// connections leave through the host's own sockets, nothing reaches the guest from
    /// outside, and each VM has a network of its own (`10.0.2.15`, gateway `10.0.2.2`).
    User,
}

/// Where a VM's RAM lives. A file lets a snapshot keep the RAM by renaming the file and a
/// restore map it instead of reading it all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum GuestMemory {
    /// Anonymous memory of the hypervisor process: snapshots carry the RAM in their stream.
    #[default]
    Anonymous,
    /// RAM in `path`, mapped shared: the file is the guest's memory, so a snapshot of the
    /// stopped VM is that file.
    SharedFile {
        /// The memory file (created by the hypervisor when missing).
        path: PathBuf,
    },
    /// RAM mapped privately (copy-on-write) from `path`, a snapshot's memory file: pages the
    /// guest does not write stay shared with every other VM restored from it.
    PrivateFile {
        /// The snapshot's memory file (never written).
        path: PathBuf,
    },
}

impl GuestMemory {
    /// `anonymous`, `shared-file` or `private-file`.
    pub fn as_str(&self) -> &'static str {
        match self {
            GuestMemory::Anonymous => "anonymous",
            GuestMemory::SharedFile { .. } => "shared-file",
            GuestMemory::PrivateFile { .. } => "private-file",
        }
    }
}

/// What a backend can do; a caller checks before asking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Snapshot to files and restore in a new process.
    pub snapshot: bool,
    /// Host↔guest vsock.
    pub vsock: bool,
    /// Pause and resume vCPUs.
    pub pause: bool,
    /// Runs without KVM (software emulation).
    pub without_kvm: bool,
    /// Restores memory lazily (page faults served from the snapshot file).
    pub lazy_restore: bool,
}
