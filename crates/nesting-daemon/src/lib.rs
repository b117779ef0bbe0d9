//! Nesting's daemon: one VM per slot on an instance, behind the `nesting.v1` service whose
//! client, contract and VM description live in `slipway-nesting`.
//!
//! - [`accel`]: KVM when a guest really runs under it, else TCG.
//! - [`daemon`]: the `nesting.v1` service: VMs per slot, stomping, snapshots, restarts, warm
//!   slots.
//! - [`disk`]: copy-on-write disk layers.
//! - [`error`]: the daemon's errors and their gRPC codes.
//! - [`hypervisor`]: the [`Hypervisor`] trait and its QEMU, Firecracker and Cloud Hypervisor
//!   backends, with [`hypervisor::process`]: hypervisor processes that outlive a daemon restart.
//! - [`image`]: guest images (`slipway image build`) and their manifests.
//! - [`service`]: the gRPC face of the daemon, and [`Daemon::serve`].
//! - [`snapshot`]: snapshot metadata, compatibility and retention.
//! - [`store`]: VM records on disk.

pub mod accel;
pub mod daemon;
pub mod disk;
pub mod error;
pub mod hypervisor;
pub mod image;
pub mod service;
pub mod snapshot;
pub mod store;

pub use daemon::warm::WarmPool;
pub use daemon::{Daemon, DaemonOptions};
pub use error::DaemonError;
pub use hypervisor::{Hypervisor, HypervisorError, Identity, SnapshotFiles, VmProcess};
pub use image::{BuildOptions, ImageError, ImageManifest};
pub use service::Service;
