//! The plugin's `plugin_config` JSON, read the way GitLab's AWS plugin reads it.

use std::path::PathBuf;

use serde::Deserialize;

/// Errors in `plugin_config`; each names the offending key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The document is not a JSON object.
    #[error("plugin_config: {0}")]
    Syntax(String),
    /// A key the plugin does not know.
    #[error("plugin_config: unknown key `{0}` (known: {known})", known = KEYS.join(", "))]
    UnknownKey(String),
    /// A known key with a bad value.
    #[error("plugin_config key `{key}`: {reason}")]
    Key {
        /// Key name.
        key: &'static str,
        /// What is wrong and what was expected.
        reason: String,
    },
}

/// Every key `plugin_config` accepts.
pub const KEYS: &[&str] = &[
    "name",
    "profile",
    "config_file",
    "credentials_file",
    "region",
    "endpoint_url",
];

#[derive(Debug, Default, Deserialize)]
struct Raw {
    name: Option<String>,
    profile: Option<String>,
    config_file: Option<PathBuf>,
    credentials_file: Option<PathBuf>,
    region: Option<String>,
    endpoint_url: Option<String>,
}

/// Validated plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Name of the Auto Scaling group (required).
    pub name: String,
    /// Named profile of the shared config/credentials files (`AWS_PROFILE` / `default` if unset).
    pub profile: Option<String>,
    /// Shared config file replacing `~/.aws/config`.
    pub config_file: Option<PathBuf>,
    /// Shared credentials file replacing `~/.aws/credentials`.
    pub credentials_file: Option<PathBuf>,
    /// Region; unset = the SDK's region chain (env, profile, instance metadata).
    pub region: Option<String>,
    /// Endpoint override for every AWS service (private endpoints, testing against moto).
    pub endpoint_url: Option<String>,
}

impl Config {
    /// Parse and validate `plugin_config`.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ConfigError::Syntax("not UTF-8".into()))?
            .trim();
        let map: serde_json::Map<String, serde_json::Value> = if text.is_empty() {
            serde_json::Map::new()
        } else {
            serde_json::from_str(text)
                .map_err(|e| ConfigError::Syntax(format!("expected a JSON object: {e}")))?
        };
        // Check keys one by one so every error names its key.
        for (key, value) in &map {
            let key = KEYS
                .iter()
                .copied()
                .find(|k| k == key)
                .ok_or_else(|| ConfigError::UnknownKey(key.clone()))?;
            if !value.is_string() {
                return Err(ConfigError::Key {
                    key,
                    reason: format!("expected a string, got {value}"),
                });
            }
        }
        let raw: Raw = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let name = raw.name.unwrap_or_default();
        if name.trim().is_empty() {
            return Err(ConfigError::Key {
                key: "name",
                reason: "required: the name of the Auto Scaling group".into(),
            });
        }
        let non_empty = |key: &'static str, v: Option<String>| match v {
            Some(s) if s.trim().is_empty() => Err(ConfigError::Key {
                key,
                reason: "must not be empty (leave the key out instead)".into(),
            }),
            v => Ok(v),
        };
        let endpoint_url = non_empty("endpoint_url", raw.endpoint_url)?;
        if let Some(url) = &endpoint_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(ConfigError::Key {
                key: "endpoint_url",
                reason: format!("expected an http:// or https:// URL, got {url:?}"),
            });
        }
        Ok(Config {
            name,
            profile: non_empty("profile", raw.profile)?,
            config_file: raw.config_file,
            credentials_file: raw.credentials_file,
            region: non_empty("region", raw.region)?,
            endpoint_url,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_gitlab_keys() {
        let c = Config::parse(
            br#"{"name":"ci","profile":"p","config_file":"/c","credentials_file":"/k","region":"eu-west-1"}"#,
        )
        .unwrap();
        assert_eq!(c.name, "ci");
        assert_eq!(c.profile.as_deref(), Some("p"));
        assert_eq!(c.config_file, Some(PathBuf::from("/c")));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse(br#"{"name":"ci","regoin":"x"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown key `regoin`"), "{e}");
        let e = Config::parse(b"{}").unwrap_err();
        assert!(e.to_string().contains("`name`"), "{e}");
        let e = Config::parse(br#"{"name":"ci","region":3}"#).unwrap_err();
        assert!(e.to_string().contains("`region`"), "{e}");
        let e = Config::parse(br#"{"name":"ci","endpoint_url":"localhost"}"#).unwrap_err();
        assert!(e.to_string().contains("`endpoint_url`"), "{e}");
    }
}
