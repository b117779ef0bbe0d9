//! Nesting: one VM per slot on an instance.
//!
//! - [`spec`]: the declarative VM description every backend renders.
//! - [`hypervisor`]: the [`Hypervisor`] trait and its QEMU, Firecracker and Cloud Hypervisor
//!   backends.
//! - [`process`]: hypervisor processes that outlive a daemon restart.
//! - [`proto`]: the `nesting.v1` wire contract.

pub mod hypervisor;
pub mod process;
pub mod proto;
pub mod spec;

pub use hypervisor::{Hypervisor, HypervisorError, Identity, SnapshotFiles, VmProcess};
pub use spec::{Accel, AgentChannel, Capabilities, Disk, DiskFormat, Level, VmSpec};
