//! The instance-group contract as Rust types: what a plugin implements and the taskscaler calls.

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

/// Lifecycle state of one instance, as a plugin reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Being provisioned.
    Creating,
    /// Ready to be connected to.
    Running,
    /// Deletion in progress.
    Deleting,
    /// Gone.
    Deleted,
    /// Failed, stuck or errored: the taskscaler removes it.
    Timeout,
}

impl State {
    /// Lower-case wire name (`creating`, `running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Deleting => "deleting",
            State::Deleted => "deleted",
            State::Timeout => "timeout",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity and capacity of an instance group, returned by `Init`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderInfo {
    /// Unique group id, e.g. `local/default`.
    pub id: String,
    /// Largest group size the plugin supports.
    pub max_size: u64,
    /// Plugin version.
    pub version: String,
    /// Build details.
    pub build_info: String,
    /// Optional features, e.g. `suspend_resume`.
    pub capabilities: Vec<String>,
}

/// How the manager reaches instances (GitLab's `ConnectorConfig`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectorConfig {
    /// `linux`, `windows`, `darwin`.
    pub os: String,
    /// `amd64`, `arm64`.
    pub arch: String,
    /// `ssh` (WinRM later).
    pub protocol: String,
    /// Port of the protocol; 0 = protocol default.
    pub protocol_port: u16,
    /// Login user.
    pub username: String,
    /// Password, if any. Never logged.
    pub password: String,
    /// Private key in OpenSSH PEM form. Never logged.
    pub key: Vec<u8>,
    /// When true the plugin must not provision credentials.
    pub use_static_credentials: bool,
    /// SSH keepalive interval; zero = default.
    pub keepalive: Duration,
    /// Dial timeout; zero = default.
    pub timeout: Duration,
}

impl fmt::Debug for ConnectorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Credentials are secrets: show only whether they are set.
        f.debug_struct("ConnectorConfig")
            .field("os", &self.os)
            .field("arch", &self.arch)
            .field("protocol", &self.protocol)
            .field("protocol_port", &self.protocol_port)
            .field("username", &self.username)
            .field(
                "password",
                &if self.password.is_empty() {
                    ""
                } else {
                    "[masked]"
                },
            )
            .field("key", &if self.key.is_empty() { "" } else { "[masked]" })
            .field("use_static_credentials", &self.use_static_credentials)
            .field("keepalive", &self.keepalive)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Everything needed to connect to one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectInfo {
    /// Instance id.
    pub id: String,
    /// Protocol, user and credentials for this instance.
    pub connector: ConnectorConfig,
    /// Private address (`host` or `host:port`).
    pub internal_addr: String,
    /// Public address (`host` or `host:port`); may be empty.
    pub external_addr: String,
    /// When dynamic credentials expire.
    pub expires: Option<SystemTime>,
}

/// An error from an instance group, local or across the plugin boundary.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The plugin config or a request was invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The named instance does not exist.
    #[error("instance {0} not found")]
    NotFound(String),
    /// Called before `Init` (or `Init` called twice).
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// The provider (cloud, hypervisor, local host) failed.
    #[error("provider error: {0}")]
    Provider(String),
    /// The provider has no capacity for more instances now (a spot market without capacity,
    /// a zone out of an instance type): `Increase` may succeed later or elsewhere. gRPC
    /// `RESOURCE_EXHAUSTED` on the plugin boundary.
    #[error("no capacity: {0}")]
    Capacity(String),
    /// The plugin process could not be reached or has died.
    #[error("plugin {plugin} unavailable: {message}")]
    Unavailable {
        /// Plugin name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
}

/// One group of like instances behind a provider (GitLab's `provider.InstanceGroup`).
///
/// Implemented by plugins (through [`crate::sdk`]) and by the host's remote handle
/// ([`crate::PluginHost`]), so the taskscaler drives either the same way.
#[async_trait]
pub trait InstanceGroup: Send + Sync + 'static {
    /// Validate `plugin_config` (JSON) and prepare the provider.
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError>;
    /// Every instance with its state; one not listed is gone.
    async fn update(&self) -> Result<Vec<(String, State)>, GroupError>;
    /// Request `delta` more instances; returns how many were requested.
    async fn increase(&self, delta: u32) -> Result<u32, GroupError>;
    /// Delete exactly these instances; returns the ids whose deletion was accepted.
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError>;
    /// Address and credentials of one instance.
    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError>;
    /// Liveness of one instance.
    async fn heartbeat(&self, id: &str) -> Result<(), GroupError>;
    /// Provider cleanup when the manager stops.
    async fn shutdown(&self) -> Result<(), GroupError>;
}
