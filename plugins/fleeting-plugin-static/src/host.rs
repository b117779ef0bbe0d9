//! A configured host with its credentials resolved against the runner's connector_config.

use std::time::Duration;

use slipway_connector::{Client, DialOptions, HostKeyStore, Output, RunOptions};
use slipway_fleeting::{ConnectInfo, ConnectorConfig};
use tokio::sync::mpsc;

use crate::config::{ConfigError, HostConfig, Secret};

/// Most stderr kept from a failed cleanup for its report.
const STDERR_TAIL: usize = 512;

/// One machine, ready to hand out.
#[derive(Debug, Clone)]
pub struct Host {
    /// Name under `instances`.
    pub name: String,
    /// Connector settings for this host: per-host user and credentials over connector_config.
    connector: Secret<ConnectorConfig>,
    external_addr: String,
    internal_addr: String,
}

impl Host {
    /// Merge `cfg` with the runner's `connector`, reading the key file. Per-host credentials
    /// replace the connector's; a host without any takes the connector's key and password.
    pub async fn resolve(
        cfg: &HostConfig,
        connector: &ConnectorConfig,
    ) -> Result<Host, ConfigError> {
        let at = |k: &str| format!("instances.{}.{k}", cfg.name);
        let mut cc = connector.clone();
        if cc.os.is_empty() {
            cc.os = "linux".into();
        }
        if cc.protocol.is_empty() {
            cc.protocol = "ssh".into();
        }
        if cc.protocol != "ssh" {
            return Err(ConfigError::new(
                "connector_config.protocol",
                format!(
                    "{:?} is not supported: static hosts are reached over ssh",
                    cc.protocol
                ),
            ));
        }
        if let Some(user) = &cfg.username {
            cc.username = user.clone();
        }
        if cc.username.is_empty() {
            return Err(ConfigError::new(
                at("username"),
                "not set here nor in connector_config",
            ));
        }
        if let Some(path) = &cfg.key_path {
            let key = tokio::fs::read(path).await.map_err(|e| {
                ConfigError::new(
                    at("key_path"),
                    format!("file {} not readable: {e}", path.display()),
                )
            })?;
            if !String::from_utf8_lossy(&key).contains("PRIVATE KEY-----") {
                return Err(ConfigError::new(
                    at("key_path"),
                    format!("file {} is not a PEM/OpenSSH private key", path.display()),
                ));
            }
            cc.key = key;
            cc.password = String::new();
        } else if let Some(pw) = &cfg.password {
            cc.password = pw.0.clone();
            cc.key = Vec::new();
        } else if cc.key.is_empty() && cc.password.is_empty() {
            return Err(ConfigError::new(
                format!("instances.{}", cfg.name),
                "no credentials: set password or key_path here, or key_path/password in connector_config",
            ));
        }
        Ok(Host {
            name: cfg.name.clone(),
            connector: Secret(cc),
            external_addr: cfg.external_addr.clone(),
            internal_addr: cfg.internal_addr.clone(),
        })
    }

    /// The address this plugin dials for probes and cleanups.
    pub fn dial_addr(&self, external: bool) -> &str {
        if external {
            &self.external_addr
        } else {
            &self.internal_addr
        }
    }

    /// Connect info for the lease `id` of this host.
    pub fn connect_info(&self, id: &str) -> ConnectInfo {
        ConnectInfo {
            id: id.to_owned(),
            connector: self.connector.0.clone(),
            internal_addr: self.internal_addr.clone(),
            external_addr: self.external_addr.clone(),
            // Static credentials: they do not expire.
            expires: None,
        }
    }

    /// Run `command` on the host over SSH; `Err` says why the host is not clean.
    ///
    /// The host key is pinned under the host's name (not the lease id) on first use, so a host
    /// that presents another key later is refused: its cleanup fails and it is held back.
    pub async fn run_cleanup(
        &self,
        command: &str,
        timeout: Duration,
        use_external_addr: bool,
        pins: &HostKeyStore,
    ) -> Result<(), String> {
        let info = self.connect_info(&self.name);
        let opts = DialOptions { use_external_addr };
        let client = Client::connect(&info, &opts, pins)
            .await
            .map_err(|e| format!("ssh: {e}"))?;
        let (tx, mut rx) = mpsc::channel(16);
        let run = client.run(RunOptions::new(command).timeout(timeout), tx);
        let gather = async {
            let mut err = Vec::new();
            while let Some(chunk) = rx.recv().await {
                if let Output::Stderr(b) = chunk {
                    err.extend_from_slice(&b);
                    // Keep only the tail: the end of the output says why it failed.
                    if err.len() > 4 * STDERR_TAIL {
                        err.drain(..err.len() - STDERR_TAIL);
                    }
                }
            }
            err
        };
        let (status, err) = tokio::join!(run, gather);
        client.close().await;
        let status = status.map_err(|e| format!("cleanup command: {e}"))?;
        if status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&err[err.len().saturating_sub(STDERR_TAIL)..])
            .trim()
            .to_owned();
        Err(if err.is_empty() {
            format!("cleanup command: {status}")
        } else {
            format!("cleanup command: {status}; stderr: {err}")
        })
    }
}
