//! Executor providers as plugins: the second plugin boundary beside fleeting.
//!
//! An executor provider decides where and in what a job's stage scripts run (a sandbox, a
//! microVM, a jail); the runner keeps the job logic. The contract is `proto/executor/v1`,
//! served over go-plugin's handshake ([`slipway_goplugin`]) like fleeting plugins.
//!
//! - [`provider`]: the [`ExecutorProvider`] trait and its types — what both sides see.
//! - [`host`]: starts an `executor-plugin-<name>` process and drives it as an [`ExecutorHost`].
//! - [`sdk`]: turns one [`ExecutorProvider`] into a plugin binary with one call.
//! - [`proto`]: the generated gRPC code.
//! - `convert`: provider types to and from their protobuf messages, and errors to and from gRPC
//!   statuses.

mod convert;
pub mod host;
pub mod proto;
pub mod provider;
pub mod sdk;

pub use host::{ExecutorHost, StartError, find_plugin};
pub use provider::{
    Capabilities, Chunk, CleanupJob, ExecutorProvider, Exit, Failure, Instance, JobStatus,
    Placement, PrepareJob, Prepared, ProviderError, Resources, Stage,
};

/// Environment variable the host sets so a plugin knows it was started by Slipway.
pub const MAGIC_COOKIE_KEY: &str = "SLIPWAY_EXECUTOR_PLUGIN";
/// Value of [`MAGIC_COOKIE_KEY`].
pub const MAGIC_COOKIE_VALUE: &str = "8e0b2f4a-executor-v1";
/// App protocol versions this build speaks.
pub const PROTOCOL_VERSIONS: &[u32] = &[1];
/// File name prefix of executor plugin executables.
pub const PLUGIN_PREFIX: &str = "executor-plugin-";

/// The executor plugin kind, as go-plugin tells plugin kinds apart.
pub const PROTOCOL: slipway_goplugin::Protocol = slipway_goplugin::Protocol {
    cookie_key: MAGIC_COOKIE_KEY,
    cookie_value: MAGIC_COOKIE_VALUE,
    versions: PROTOCOL_VERSIONS,
    what: "a Slipway executor plugin",
};
