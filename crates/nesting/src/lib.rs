//! Nesting: one VM per slot on an instance.
//!
//! - [`accel`]: KVM when a guest really runs under it, else TCG.
//! - [`agent`]: the host side of the guest agent protocol.
//! - [`client`]: the manager's client, over a local or SSH-forwarded socket.
//! - [`config`]: the `Init` configuration (a runner's `nesting_config`).
//! - [`daemon`]: the `nesting.v1` service: VMs per slot, stomping, snapshots, restarts.
//! - [`disk`]: copy-on-write disk layers.
//! - [`error`]: the daemon's errors and their gRPC codes.
//! - [`snapshot`]: snapshot metadata, compatibility and retention.
//! - [`store`]: VM records on disk.
//! - [`warm`]: warm slots, a VM started ahead of the job in every free slot.
//! - [`spec`]: the declarative VM description every backend renders.
//! - [`image`]: guest images (`slipway image build`) and their manifests.
//! - [`hypervisor`]: the [`Hypervisor`] trait and its QEMU, Firecracker and Cloud Hypervisor
//!   backends.
//! - [`process`]: hypervisor processes that outlive a daemon restart.
//! - [`proto`]: the `nesting.v1` wire contract.
//! - [`service`]: the gRPC face of the daemon.

pub mod accel;
pub mod agent;
pub mod client;
pub mod config;
pub mod daemon;
pub mod disk;
pub mod error;
pub mod hypervisor;
pub mod image;
pub mod process;
pub mod proto;
pub mod service;
pub mod snapshot;
pub mod spec;
pub mod store;
pub mod warm;

pub use hypervisor::{Hypervisor, HypervisorError, Identity, SnapshotFiles, VmProcess};
pub use spec::{Accel, AgentChannel, Capabilities, Disk, DiskFormat, GuestMemory, Level, VmSpec};
