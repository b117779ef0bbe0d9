//! The plugin's `plugin_config` JSON.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Errors in `plugin_config`; each names the offending field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The document is not a JSON object.
    #[error("plugin_config: {0}")]
    Syntax(String),
    /// A key that the plugin does not know.
    #[error("plugin_config: unknown field `{0}` (known: {known})", known = FIELDS.join(", "))]
    UnknownField(String),
    /// A known field with a bad value.
    #[error("plugin_config field `{field}`: {reason}")]
    Field {
        /// Field name.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// How instances are networked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// `netns` when running as root with a working `ip`, else `loopback`.
    #[default]
    Auto,
    /// One network namespace per instance, reached over a veth pair.
    Netns,
    /// sshd on 127.0.0.1 with its own port.
    Loopback,
}

/// The raw document, as written by the operator.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    dir: Option<PathBuf>,
    name: Option<String>,
    max_size: Option<u64>,
    provisioning_delay: Option<String>,
    network: Option<NetworkMode>,
    user: Option<String>,
    sshd_path: Option<PathBuf>,
}

const FIELDS: &[&str] = &[
    "dir",
    "name",
    "max_size",
    "provisioning_delay",
    "network",
    "user",
    "sshd_path",
];

/// Validated plugin configuration with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// State directory (`/tmp/slipway-local/<name>` by default).
    pub dir: PathBuf,
    /// Group name (`default`).
    pub name: String,
    /// Largest number of instances (16).
    pub max_size: u64,
    /// Wait before starting an instance's sshd (0 s).
    pub provisioning_delay: Duration,
    /// Networking mode as configured (`auto` is resolved at init).
    pub network: NetworkMode,
    /// Login user; `None` = the connector's username, else the current user.
    pub user: Option<String>,
    /// sshd binary; `None` = `/usr/sbin/sshd`, then PATH.
    pub sshd_path: Option<PathBuf>,
}

impl Config {
    /// Parse and validate `plugin_config` (empty input means all defaults).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ConfigError::Syntax("not UTF-8".into()))?
            .trim();
        let raw = if text.is_empty() {
            Raw::default()
        } else {
            let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
                .map_err(|e| ConfigError::Syntax(format!("expected a JSON object: {e}")))?;
            // Check keys and values one by one so every error names its field; serde_json's
            // own messages only give a line and column.
            for (key, value) in &map {
                let field = FIELDS
                    .iter()
                    .copied()
                    .find(|f| f == key)
                    .ok_or_else(|| ConfigError::UnknownField(key.clone()))?;
                check_type(field, value)?;
            }
            serde_json::from_value(serde_json::Value::Object(map))
                .map_err(|e| ConfigError::Syntax(e.to_string()))?
        };
        let name = raw.name.unwrap_or_else(|| "default".into());
        if name.is_empty()
            || name.len() > 32
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(field(
                "name",
                "must be 1-32 characters of A-Z, a-z, 0-9, '-' and '_'",
            ));
        }
        let dir = raw
            .dir
            .unwrap_or_else(|| Path::new("/tmp/slipway-local").join(&name));
        if !dir.is_absolute() {
            return Err(field("dir", "must be an absolute path"));
        }
        // The path is written into sshd_config and a shell command line: keep it to characters
        // that need no quoting there.
        let dir_str = dir
            .to_str()
            .ok_or_else(|| field("dir", "must be valid UTF-8"))?;
        if dir_str
            .chars()
            .any(|c| c.is_whitespace() || "\"'\\$`%#;&|<>*?".contains(c))
        {
            return Err(field(
                "dir",
                "must not contain whitespace, quotes or shell/sshd special characters",
            ));
        }
        let max_size = raw.max_size.unwrap_or(16);
        if max_size == 0 {
            return Err(field("max_size", "must be at least 1"));
        }
        let provisioning_delay = match raw.provisioning_delay {
            None => Duration::ZERO,
            Some(s) => humantime::parse_duration(&s).map_err(|e| {
                field(
                    "provisioning_delay",
                    &format!("invalid duration {s:?} (e.g. \"500ms\", \"2s\"): {e}"),
                )
            })?,
        };
        if let Some(user) = &raw.user
            && (user.is_empty()
                || !user
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        {
            return Err(field("user", "must be a plain user name"));
        }
        if let Some(p) = &raw.sshd_path
            && p.as_os_str().is_empty()
        {
            return Err(field("sshd_path", "must not be empty"));
        }
        Ok(Config {
            dir,
            name,
            max_size,
            provisioning_delay,
            network: raw.network.unwrap_or_default(),
            user: raw.user,
            sshd_path: raw.sshd_path,
        })
    }
}

fn field(field: &'static str, reason: &str) -> ConfigError {
    ConfigError::Field {
        field,
        reason: reason.to_owned(),
    }
}

fn check_type(name: &'static str, value: &serde_json::Value) -> Result<(), ConfigError> {
    use serde_json::Value;
    let ok = match name {
        "max_size" => value.as_u64().is_some(),
        "network" => matches!(value.as_str(), Some("auto" | "netns" | "loopback")),
        _ => matches!(value, Value::String(_)),
    };
    if ok {
        return Ok(());
    }
    let expected = match name {
        "max_size" => "a non-negative integer",
        "network" => "one of \"auto\", \"netns\", \"loopback\"",
        _ => "a string",
    };
    Err(field(name, &format!("expected {expected}, got {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::parse(b"").unwrap();
        assert_eq!(c.dir, PathBuf::from("/tmp/slipway-local/default"));
        assert_eq!((c.name.as_str(), c.max_size), ("default", 16));
        assert_eq!(c.provisioning_delay, Duration::ZERO);
        assert_eq!(c.network, NetworkMode::Auto);
        assert_eq!(Config::parse(b"{}").unwrap(), c);
    }

    #[test]
    fn all_fields() {
        let c = Config::parse(
            br#"{"dir":"/x/y","name":"g1","max_size":3,"provisioning_delay":"500ms",
                "network":"loopback","user":"root","sshd_path":"/usr/sbin/sshd"}"#,
        )
        .unwrap();
        assert_eq!(c.dir, PathBuf::from("/x/y"));
        assert_eq!(c.provisioning_delay, Duration::from_millis(500));
        assert_eq!(c.network, NetworkMode::Loopback);
        assert_eq!(c.user.as_deref(), Some("root"));
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (r#"{"bogus":1}"#, "bogus"),
            (r#"{"provisioning_delay":"soon"}"#, "provisioning_delay"),
            (r#"{"provisioning_delay":5}"#, "provisioning_delay"),
            (r#"{"max_size":"many"}"#, "max_size"),
            (r#"{"max_size":0}"#, "max_size"),
            (r#"{"network":"wifi"}"#, "network"),
            (r#"{"name":"a b"}"#, "name"),
            (r#"{"dir":"relative"}"#, "dir"),
            (r#"{"dir":"/a b"}"#, "dir"),
            (r#"{"user":""}"#, "user"),
        ];
        for (doc, name) in cases {
            let err = Config::parse(doc.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(&format!("`{name}`")), "{doc}: {err}");
        }
        assert!(Config::parse(b"[1]").is_err());
    }
}
