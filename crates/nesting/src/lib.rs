//! Nesting's client side: what talks to a nesting daemon and to the guest agent in its VMs, and
//! the descriptions both sides share. The daemon itself is `slipway-nesting-daemon`.
//!
//! - [`agent`]: the host side of the guest agent protocol.
//! - [`client`]: the manager's client, over a local or SSH-forwarded socket.
//! - [`config`]: the `Init` configuration (a runner's `nesting_config`).
//! - [`name`]: the check every VM, image and snapshot name passes.
//! - [`proto`]: the `nesting.v1` wire contract, client and server.
//! - [`spec`]: the declarative VM description every backend renders.
//! - [`vsock`]: reaching a guest port through a Firecracker-style hybrid-vsock socket.

pub mod agent;
pub mod client;
pub mod config;
pub mod name;
pub mod proto;
pub mod spec;
pub mod vsock;

pub use agent::{AgentClient, AgentError};
pub use client::{AgentAddr, ClientError, NestingClient};
pub use config::{AccelChoice, Config, HypervisorKind};
pub use name::{BadName, check_name};
pub use spec::{
    Accel, AgentChannel, Capabilities, Disk, DiskFormat, GuestMemory, GuestNetwork, Level, VmSpec,
};
pub use vsock::VsockError;
