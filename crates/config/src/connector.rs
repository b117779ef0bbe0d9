//! `[runners.autoscaler.connector_config]`: how the manager reaches an instance.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::problem::Report;

/// `[runners.autoscaler.connector_config]`.
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct ConnectorConfigToml {
    /// `linux`, `windows`, `darwin`.
    pub os: String,
    /// `amd64`, `arm64`.
    pub arch: String,
    /// `ssh`.
    pub protocol: String,
    /// Protocol port.
    pub protocol_port: u16,
    /// Login user.
    pub username: String,
    /// Password. Never printed.
    pub password: String,
    /// Private key file, read by the manager.
    pub key_path: String,
    /// The plugin must not provision credentials.
    pub use_static_credentials: bool,
    /// SSH keepalive.
    #[serde(with = "crate::de::duration")]
    pub keepalive: Duration,
    /// Dial timeout.
    #[serde(with = "crate::de::duration")]
    pub timeout: Duration,
    /// Dial the external address.
    pub use_external_addr: bool,
}

impl fmt::Debug for ConnectorConfigToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectorConfigToml")
            .field("os", &self.os)
            .field("protocol", &self.protocol)
            .field("username", &self.username)
            .field(
                "password",
                &if self.password.is_empty() {
                    ""
                } else {
                    "[masked]"
                },
            )
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// Why a connector config could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorConfigError {
    /// `key_path` could not be read.
    #[error("reading connector_config.key_path {path:?}")]
    KeyPath {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ConnectorConfigToml {
    /// What the fleeting plugin's `Init` is sent, with the key at `key_path` read.
    pub async fn to_connector_config(
        &self,
    ) -> Result<slipway_fleeting::ConnectorConfig, ConnectorConfigError> {
        let key = if self.key_path.is_empty() {
            Vec::new()
        } else {
            tokio::fs::read(&self.key_path).await.map_err(|source| {
                ConnectorConfigError::KeyPath {
                    path: self.key_path.clone(),
                    source,
                }
            })?
        };
        Ok(slipway_fleeting::ConnectorConfig {
            os: self.os.clone(),
            arch: self.arch.clone(),
            protocol: self.protocol.clone(),
            protocol_port: self.protocol_port,
            username: self.username.clone(),
            password: self.password.clone(),
            key,
            use_static_credentials: self.use_static_credentials,
            keepalive: self.keepalive,
            timeout: self.timeout,
        })
    }

    /// A `key_path` that does not exist here is a warning (`report` is at the section).
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        report.missing_file(&["key_path"], &self.key_path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn key_path_is_read_and_its_error_names_the_key() {
        let dir = std::env::temp_dir().join(format!("slipway-config-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let key = dir.join("id");
        std::fs::write(&key, b"KEY").expect("write");
        let c = ConnectorConfigToml {
            username: "u".into(),
            key_path: key.display().to_string(),
            ..ConnectorConfigToml::default()
        };
        let got = c.to_connector_config().await.expect("read");
        assert_eq!(
            (got.username.as_str(), got.key.as_slice()),
            ("u", &b"KEY"[..])
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
        let e = c.to_connector_config().await.expect_err("gone");
        assert!(
            e.to_string()
                .starts_with("reading connector_config.key_path \""),
            "{e}"
        );
    }
}
