//! go-plugin's process protocol, shared by every plugin kind Slipway hosts (fleeting instance
//! groups, executor providers).
//!
//! - [`handshake`]: the `CORE|APP|NETWORK|ADDR|PROTOCOL|CERT` line a plugin prints first.
//! - [`tls`]: AutoMTLS — a fresh self-signed certificate per side, each pinning the other's.
//! - [`process`]: host side — start a plugin, connect, restart it when it dies, stop it.
//! - [`server`]: plugin side — print the handshake and serve a gRPC service until shut down.
//! - [`proto`]: go-plugin's internal services (controller, stdio, broker).
//! - `io`: a boxed byte stream, so plaintext and TLS connections share one type on both sides.

pub mod handshake;
mod io;
pub mod process;
pub mod proto;
pub mod server;
pub mod tls;

pub use process::{CallError, Connection, HostError, PluginProcess, ProcessOptions, Reinit};

/// Host's accepted app protocol versions.
pub const ENV_PROTOCOL_VERSIONS: &str = "PLUGIN_PROTOCOL_VERSIONS";
/// Host's AutoMTLS certificate (PEM).
pub const ENV_CLIENT_CERT: &str = "PLUGIN_CLIENT_CERT";
/// Directory to create the plugin's unix socket in.
pub const ENV_UNIX_SOCKET_DIR: &str = "PLUGIN_UNIX_SOCKET_DIR";

/// What tells one kind of plugin from another: go-plugin's magic cookie and app versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    /// Environment variable the host sets so a plugin knows who started it.
    pub cookie_key: &'static str,
    /// Its value.
    pub cookie_value: &'static str,
    /// App protocol versions this build speaks, highest preferred.
    pub versions: &'static [u32],
    /// What a person running the binary by hand is told it is (`a Slipway fleeting plugin`).
    pub what: &'static str,
}
