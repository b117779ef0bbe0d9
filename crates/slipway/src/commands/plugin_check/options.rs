//! What `slipway plugin check` is told: [`CheckOptions`], and the `-c plugin_config` and
//! `--connector connector_config` JSON files read the way the manager reads its TOML.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use slipway_config::{ConnectorConfigError, ConnectorConfigToml};
use slipway_fleeting::ConnectorConfig;
use slipway_fleeting::host::HostError;

/// Default for `--timeout`: how long an instance may take to become running or to go away.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a check could not even start (bad usage): exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file named on the command line could not be read.
    #[error("cannot read {what} file {}: {source}", .path.display())]
    Read {
        /// Which option (`-c plugin_config`, `--connector connector_config`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file named on the command line has bad content.
    #[error("{what} file {}: {message}", .path.display())]
    Invalid {
        /// Which option.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key when there is one.
        message: String,
    },
    /// The plugin executable was not found.
    #[error(transparent)]
    NotFound(#[from] HostError),
}

/// What to check and how.
#[derive(Clone)]
pub struct CheckOptions {
    /// Plugin reference: a name (`local`, `fleeting-plugin-aws`) or a path.
    pub plugin: String,
    /// Directory searched first for `fleeting-plugin-<name>`.
    pub plugin_dir: Option<PathBuf>,
    /// The good `plugin_config` JSON (`-c`).
    pub plugin_config: Vec<u8>,
    /// The connector settings sent with `Init` (`--connector`).
    pub connector: ConnectorConfig,
    /// Dial the external address in the `ssh` check.
    pub use_external_addr: bool,
    /// Log in over SSH and run `echo` on the instance.
    pub connect: bool,
    /// How long an instance may take to be running or gone, and bound on each call.
    pub timeout: Duration,
}

impl fmt::Debug for CheckOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // plugin_config may carry cloud credentials: its size only.
        f.debug_struct("CheckOptions")
            .field("plugin", &self.plugin)
            .field("plugin_dir", &self.plugin_dir)
            .field("plugin_config_len", &self.plugin_config.len())
            .field("connector", &self.connector)
            .field("use_external_addr", &self.use_external_addr)
            .field("connect", &self.connect)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CheckOptions {
    /// Options for `plugin` with an empty config, no connector settings and the default timeout.
    pub fn new(plugin: impl Into<String>) -> Self {
        CheckOptions {
            plugin: plugin.into(),
            plugin_dir: None,
            plugin_config: b"{}".to_vec(),
            connector: ConnectorConfig::default(),
            use_external_addr: false,
            connect: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Read a `plugin_config` JSON file (`-c`); it must hold a JSON object.
pub async fn load_plugin_config(path: &Path) -> Result<Vec<u8>, CheckError> {
    const WHAT: &str = "plugin_config";
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| CheckError::Read {
            what: WHAT,
            path: path.to_owned(),
            source,
        })?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(_)) => Ok(bytes),
        Ok(other) => Err(CheckError::Invalid {
            what: WHAT,
            path: path.to_owned(),
            message: format!(
                "expected a JSON object (the [runners.autoscaler.plugin_config] table), found {}",
                json_kind(&other)
            ),
        }),
        Err(e) => Err(CheckError::Invalid {
            what: WHAT,
            path: path.to_owned(),
            message: format!("not valid JSON: {e}"),
        }),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Read a `connector_config` JSON file (`--connector`): the keys of
/// `[runners.autoscaler.connector_config]`, with `key_path` read here as the manager does.
///
/// Returns the settings and `use_external_addr`.
pub async fn load_connector(path: &Path) -> Result<(ConnectorConfig, bool), CheckError> {
    const WHAT: &str = "connector_config";
    let invalid = |message: String| CheckError::Invalid {
        what: WHAT,
        path: path.to_owned(),
        message,
    };
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| CheckError::Read {
            what: WHAT,
            path: path.to_owned(),
            source,
        })?;
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let mut note = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
    let raw: ConnectorConfigToml =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&mut de, &mut note))
            .map_err(|e| {
                let at = e.path().to_string();
                if at == "." {
                    invalid(e.inner().to_string())
                } else {
                    invalid(format!("key `{at}`: {}", e.inner()))
                }
            })?;
    if let Some(key) = unknown.first() {
        return Err(invalid(format!(
            "unknown key `{key}` (known: os, arch, protocol, protocol_port, username, password, \
             key_path, use_static_credentials, keepalive, timeout, use_external_addr)"
        )));
    }
    let connector = raw.to_connector_config().await.map_err(
        |ConnectorConfigError::KeyPath { path, source }| {
            invalid(format!("key `key_path`: cannot read {path:?}: {source}"))
        },
    )?;
    Ok((connector, raw.use_external_addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connector_file_reads_key_path_and_names_bad_keys() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id");
        std::fs::write(&key, "KEY").unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(
            &good,
            format!(
                r#"{{"username":"u","key_path":"{}","timeout":"10s","use_external_addr":true}}"#,
                key.display()
            ),
        )
        .unwrap();
        let (c, external) = load_connector(&good).await.unwrap();
        assert_eq!((c.username.as_str(), c.key.as_slice()), ("u", &b"KEY"[..]));
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert!(external);
        for (text, want) in [
            (r#"{"usernme":"u"}"#, "unknown key `usernme`"),
            (r#"{"protocol_port":"x"}"#, "key `protocol_port`"),
            (r#"{"timeout":"soon"}"#, "key `timeout`"),
        ] {
            let bad = dir.path().join("bad.json");
            std::fs::write(&bad, text).unwrap();
            let err = load_connector(&bad).await.unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("bad.json"), "{err}");
        }
        let err = load_plugin_config(&dir.path().join("none.json"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("none.json"), "{err}");
    }
}
