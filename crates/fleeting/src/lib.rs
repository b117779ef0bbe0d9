//! Fleeting: instance groups behind plugin processes.
//!
//! - [`group`]: the [`InstanceGroup`] trait and its types — what the taskscaler sees.
//! - [`host`]: starts a `fleeting-plugin-<name>` process go-plugin style and exposes it as an
//!   [`InstanceGroup`], restarting it when it dies.
//! - [`oci`]: plugins GitLab Runner installed from OCI references, found where it put them.
//! - [`sdk`]: turns one [`InstanceGroup`] implementation into a plugin binary.
//! - [`proto`]: the generated gRPC code for `fleeting.v1`; go-plugin's internal `plugin`
//!   package is re-exported there.
//! - [`convert`]: conversions between the contract types and the `fleeting.v1` wire messages.

pub mod convert;
pub mod group;
pub mod host;
pub mod oci;
pub mod proto;
pub mod sdk;

pub use slipway_goplugin::{handshake, tls};

pub use group::{ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State};
pub use host::{PluginHost, PluginOptions};

/// Environment variable the host sets so a plugin knows it was started by Slipway.
pub const MAGIC_COOKIE_KEY: &str = "SLIPWAY_FLEETING_PLUGIN";
/// Value of [`MAGIC_COOKIE_KEY`].
pub const MAGIC_COOKIE_VALUE: &str = "5c1a6d3e-fleeting-v1";
/// App protocol versions this build speaks.
pub const PROTOCOL_VERSIONS: &[u32] = &[1];

/// The fleeting plugin kind, as go-plugin tells plugin kinds apart.
pub const PROTOCOL: slipway_goplugin::Protocol = slipway_goplugin::Protocol {
    cookie_key: MAGIC_COOKIE_KEY,
    cookie_value: MAGIC_COOKIE_VALUE,
    versions: PROTOCOL_VERSIONS,
    what: "a Slipway fleeting plugin",
};
