//! SSH connector to fleet instances.
//!
//! [`Client::connect`] dials an instance described by a fleeting [`ConnectInfo`], pins its host
//! key in a [`HostKeyStore`] on first use, and authenticates with the key and/or password the
//! plugin handed out. [`Client::run`] executes one command per SSH channel and streams its
//! stdout/stderr live; several runs may share one connection. [`Client::open_stream`] turns a
//! command's stdin/stdout into a byte stream ([`ExecStream`]) for tunnels such as
//! `docker system dial-stdio`. [`Client::open_unix`] connects to a unix socket on the instance
//! through its sshd ([`ForwardedStream`]), for agents that listen on one (the nesting daemon's
//! gRPC socket, a VM agent's socket).
//!
//! Modules, all private (their types are re-exported here):
//!
//! - `client`: [`Client`]: dial, authenticate, run commands with streamed output, reach unix
//!   sockets.
//! - `hostkeys`: [`HostKeyStore`], trust-on-first-use pinning of instance host keys.
//! - `stream`: SSH channels as byte streams ([`ExecStream`], [`ForwardedStream`]), with no port
//!   opened on either side.
//! - `error`: the connector's error types, [`ConnectError`] and [`HostKeyStoreError`].
//!
//! [`ConnectInfo`]: slipway_fleeting::ConnectInfo

mod client;
mod error;
mod hostkeys;
mod stream;

pub use client::{Client, DialOptions, ExitStatus, Output, RunOptions, split_host_port};
pub use error::{ConnectError, HostKeyStoreError};
pub use hostkeys::HostKeyStore;
pub use stream::{ExecStream, ForwardedStream};

/// Dial timeout used when the connector config leaves it at zero.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Keepalive interval used when the connector config leaves it at zero.
pub const DEFAULT_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(30);
/// Unanswered keepalives after which the connection is considered dead.
pub const KEEPALIVE_MAX: usize = 3;
/// SSH port used when the connector config leaves `protocol_port` at zero.
pub const DEFAULT_SSH_PORT: u16 = 22;
