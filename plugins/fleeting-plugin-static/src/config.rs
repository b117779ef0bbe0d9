//! The plugin's `plugin_config` JSON, validated key by key so every error names its key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::addr::split_host_port;

/// A bad `plugin_config`: `key` is the dotted path of the offending key (`instances.web1.key_path`).
#[derive(Debug, thiserror::Error)]
#[error("plugin_config: {key}: {reason}")]
pub struct ConfigError {
    /// Dotted path of the key, e.g. `instances.web1.password`.
    pub key: String,
    /// What is wrong and what was expected.
    pub reason: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Top-level keys, in the order the README lists them.
const TOP_KEYS: &[&str] = &[
    "instances",
    "cleanup_command",
    "cleanup_timeout",
    "probe_timeout",
    "use_external_addr",
    "state_dir",
    "name",
];
/// Keys of one host entry (GitLab's static plugin's names).
const HOST_KEYS: &[&str] = &[
    "external_addr",
    "internal_addr",
    "username",
    "password",
    "key_path",
];

/// A value that must never be printed (passwords, private keys).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret<T>(pub T);

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[masked]")
    }
}

/// One operator-provided machine, as configured (credentials not yet merged with the connector).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// The key under `instances`; also the host-key pin name and the lease id prefix.
    pub name: String,
    /// Address the manager dials with `use_external_addr` (defaults to `internal_addr`).
    pub external_addr: String,
    /// Address the manager dials otherwise (defaults to `external_addr`).
    pub internal_addr: String,
    /// Login user; `None` = the connector_config's username.
    pub username: Option<String>,
    /// Login password; exclusive with `key_path`.
    pub password: Option<Secret<String>>,
    /// Private key file, read at `Init`; exclusive with `password`.
    pub key_path: Option<PathBuf>,
}

/// Validated plugin configuration with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The machines, by name.
    pub instances: BTreeMap<String, HostConfig>,
    /// Shell command run on a host over SSH when it is given back; `None` = hand back as is.
    pub cleanup_command: Option<String>,
    /// Longest a cleanup may run before it counts as failed (5 min).
    pub cleanup_timeout: Duration,
    /// Timeout of the reachability probe: TCP connect + SSH banner (5 s).
    pub probe_timeout: Duration,
    /// The plugin's own probes and cleanups dial `external_addr` instead of `internal_addr`.
    pub use_external_addr: bool,
    /// Where the lease state and pinned host keys live.
    pub state_dir: PathBuf,
    /// Group name (`default`): the provider id is `static/<name>`.
    pub name: String,
}

/// Default `cleanup_timeout`.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `probe_timeout`.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl Config {
    /// Parse and validate `plugin_config`. Files (`key_path`) are checked later, at `Init`.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ConfigError::new("plugin_config", "not UTF-8"))?
            .trim();
        let doc: Map<String, Value> = if text.is_empty() {
            Map::new()
        } else {
            serde_json::from_str(text).map_err(|e| {
                ConfigError::new("plugin_config", format!("expected a JSON object: {e}"))
            })?
        };
        for key in doc.keys() {
            if !TOP_KEYS.contains(&key.as_str()) {
                return Err(ConfigError::new(
                    key.as_str(),
                    format!("unknown key (known: {})", TOP_KEYS.join(", ")),
                ));
            }
        }
        let name = opt_str(&doc, "name", "name")?.unwrap_or_else(|| "default".into());
        if !valid_name(&name) {
            return Err(ConfigError::new(
                "name",
                "must be 1-64 characters of A-Z, a-z, 0-9, '.', '-' and '_', not starting with '.' or '-'",
            ));
        }
        let instances = match doc.get("instances") {
            None => {
                return Err(ConfigError::new(
                    "instances",
                    "missing: expected a map of name -> {external_addr, internal_addr, username, password | key_path}",
                ));
            }
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(ConfigError::new(
                    "instances",
                    format!("expected a map of name -> host, got {other}"),
                ));
            }
        };
        if instances.is_empty() {
            return Err(ConfigError::new(
                "instances",
                "is empty: list at least one host",
            ));
        }
        let mut hosts = BTreeMap::new();
        for (host, value) in instances {
            hosts.insert(host.clone(), parse_host(host, value)?);
        }
        let cleanup_command = opt_str(&doc, "cleanup_command", "cleanup_command")?;
        if cleanup_command
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            return Err(ConfigError::new(
                "cleanup_command",
                "is empty: leave it out to hand hosts back without cleaning",
            ));
        }
        let cleanup_timeout =
            opt_duration(&doc, "cleanup_timeout")?.unwrap_or(DEFAULT_CLEANUP_TIMEOUT);
        let probe_timeout = opt_duration(&doc, "probe_timeout")?.unwrap_or(DEFAULT_PROBE_TIMEOUT);
        let use_external_addr = match doc.get("use_external_addr") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(ConfigError::new(
                    "use_external_addr",
                    format!("expected true or false, got {other}"),
                ));
            }
        };
        let state_dir = match opt_str(&doc, "state_dir", "state_dir")? {
            Some(d) => {
                let d = PathBuf::from(d);
                if !d.is_absolute() {
                    return Err(ConfigError::new("state_dir", "must be an absolute path"));
                }
                d
            }
            None => default_state_dir(&name),
        };
        Ok(Config {
            instances: hosts,
            cleanup_command,
            cleanup_timeout,
            probe_timeout,
            use_external_addr,
            state_dir,
            name,
        })
    }
}

/// `$XDG_STATE_HOME` (or `$HOME/.local/state`) + `slipway/fleeting-plugin-static/<name>`;
/// `/var/lib/slipway/fleeting-plugin-static/<name>` when neither is set. Not /tmp: leases must
/// survive a reboot of the runner host as long as the hosts themselves do.
fn default_state_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        })
        .map(|b| b.join("slipway"))
        .unwrap_or_else(|| Path::new("/var/lib/slipway").to_owned());
    base.join("fleeting-plugin-static").join(name)
}

fn parse_host(host: &str, value: &Value) -> Result<HostConfig, ConfigError> {
    let at = |k: &str| format!("instances.{host}.{k}");
    if !valid_name(host) {
        return Err(ConfigError::new(
            format!("instances.{host}"),
            "host names must be 1-64 characters of A-Z, a-z, 0-9, '.', '-' and '_', not starting with '.' or '-'",
        ));
    }
    let Value::Object(map) = value else {
        return Err(ConfigError::new(
            format!("instances.{host}"),
            format!(
                "expected a table {{external_addr, internal_addr, username, password | key_path}}, got {value}"
            ),
        ));
    };
    for key in map.keys() {
        if !HOST_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::new(
                at(key),
                format!("unknown key (known: {})", HOST_KEYS.join(", ")),
            ));
        }
    }
    let addr = |k: &str| -> Result<Option<String>, ConfigError> {
        let Some(a) = opt_str(map, k, &at(k))? else {
            return Ok(None);
        };
        let a = a.trim().to_owned();
        if a.is_empty() || a.chars().any(char::is_whitespace) {
            return Err(ConfigError::new(at(k), "expected `host` or `host:port`"));
        }
        split_host_port(&a, 22).map_err(|e| ConfigError::new(at(k), e))?;
        Ok(Some(a))
    };
    let external = addr("external_addr")?;
    let internal = addr("internal_addr")?;
    // Either address stands in for the other: most static hosts have only one.
    let (external_addr, internal_addr) = match (external, internal) {
        (Some(e), Some(i)) => (e, i),
        (Some(e), None) => (e.clone(), e),
        (None, Some(i)) => (i.clone(), i),
        (None, None) => {
            return Err(ConfigError::new(
                format!("instances.{host}"),
                "set external_addr or internal_addr (`host` or `host:port`)",
            ));
        }
    };
    let username = opt_str(map, "username", &at("username"))?;
    if username.as_deref().is_some_and(str::is_empty) {
        return Err(ConfigError::new(at("username"), "must not be empty"));
    }
    let password = opt_str(map, "password", &at("password"))?;
    let key_path = opt_str(map, "key_path", &at("key_path"))?;
    if password.is_some() && key_path.is_some() {
        return Err(ConfigError::new(
            format!("instances.{host}"),
            "set password or key_path, not both",
        ));
    }
    if password.as_deref().is_some_and(str::is_empty) {
        return Err(ConfigError::new(at("password"), "must not be empty"));
    }
    let key_path = match key_path {
        Some(p) if p.is_empty() => {
            return Err(ConfigError::new(at("key_path"), "must not be empty"));
        }
        Some(p) => Some(PathBuf::from(p)),
        None => None,
    };
    Ok(HostConfig {
        name: host.to_owned(),
        external_addr,
        internal_addr,
        username,
        password: password.map(Secret),
        key_path,
    })
}

fn opt_str(map: &Map<String, Value>, k: &str, key: &str) -> Result<Option<String>, ConfigError> {
    match map.get(k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ConfigError::new(
            key,
            // Never echo a password's value, even a mistyped one.
            if k == "password" {
                "expected a string".to_owned()
            } else {
                format!("expected a string, got {other}")
            },
        )),
    }
}

fn opt_duration(map: &Map<String, Value>, k: &str) -> Result<Option<Duration>, ConfigError> {
    let Some(s) = opt_str(map, k, k)? else {
        return Ok(None);
    };
    let d = humantime::parse_duration(&s).map_err(|e| {
        ConfigError::new(
            k,
            format!("invalid duration {s:?} (expected e.g. \"30s\", \"5m\"): {e}"),
        )
    })?;
    if d.is_zero() {
        return Err(ConfigError::new(k, "must be greater than zero"));
    }
    Ok(Some(d))
}

/// Names become lease ids, pin names and log fields: keep them to plain characters.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with(['.', '-'])
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn err(doc: &str) -> String {
        Config::parse(doc.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_address_fallback() {
        let c = Config::parse(
            br#"{"instances":{"web1":{"external_addr":"10.0.0.1:2222","username":"ci","password":"pw"},
                "web2":{"internal_addr":"db.lan"}}}"#,
        )
        .unwrap();
        assert_eq!(c.name, "default");
        assert_eq!(c.cleanup_command, None);
        assert_eq!(c.cleanup_timeout, DEFAULT_CLEANUP_TIMEOUT);
        assert_eq!(c.probe_timeout, DEFAULT_PROBE_TIMEOUT);
        assert!(c.state_dir.ends_with("fleeting-plugin-static/default"));
        let w1 = &c.instances["web1"];
        assert_eq!(
            (w1.external_addr.as_str(), w1.internal_addr.as_str()),
            ("10.0.0.1:2222", "10.0.0.1:2222")
        );
        assert_eq!(w1.password, Some(Secret("pw".into())));
        let w2 = &c.instances["web2"];
        assert_eq!(
            (w2.external_addr.as_str(), w2.internal_addr.as_str()),
            ("db.lan", "db.lan")
        );
        assert_eq!(w2.username, None);
        assert!(
            !format!("{c:?}").contains("pw\""),
            "password in Debug: {c:?}"
        );
    }

    #[test]
    fn readme_example_parses() {
        let readme = include_str!("../README.md");
        let block = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap();
        let doc: toml::Table = toml::from_str(block).unwrap();
        let pc = &doc["runners"]["autoscaler"]["plugin_config"];
        let c = Config::parse(&serde_json::to_vec(pc).unwrap()).unwrap();
        assert_eq!(c.name, "lab");
        assert_eq!(c.instances.len(), 3);
        assert_eq!(c.instances["web1"].internal_addr, "10.0.0.10:2222");
        assert_eq!(c.instances["web3"].internal_addr, "gpu.lan");
        assert_eq!(c.cleanup_timeout, Duration::from_secs(300));
    }

    #[test]
    fn errors_name_the_key() {
        let cases: &[(&str, &str)] = &[
            (r#"{}"#, "instances: missing"),
            (r#"{"instances":{}}"#, "instances: is empty"),
            (r#"{"instances":[]}"#, "instances: expected a map"),
            (
                r#"{"bogus":1,"instances":{"a":{"internal_addr":"h"}}}"#,
                "bogus: unknown key",
            ),
            (
                r#"{"instances":{"a":{"addr":"h"}}}"#,
                "instances.a.addr: unknown key",
            ),
            (
                r#"{"instances":{"a":{}}}"#,
                "instances.a: set external_addr or internal_addr",
            ),
            (
                r#"{"instances":{"a":"h"}}"#,
                "instances.a: expected a table",
            ),
            (
                r#"{"instances":{"a b":{"internal_addr":"h"}}}"#,
                "instances.a b: host names",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h:x"}}}"#,
                "instances.a.internal_addr: bad port",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":5}}}"#,
                "instances.a.internal_addr: expected a string",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h","password":"p","key_path":"/k"}}}"#,
                "instances.a: set password or key_path, not both",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h","username":""}}}"#,
                "instances.a.username: must not be empty",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h"}},"cleanup_timeout":"soon"}"#,
                "cleanup_timeout: invalid duration",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h"}},"probe_timeout":"0s"}"#,
                "probe_timeout: must be greater",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h"}},"cleanup_command":" "}"#,
                "cleanup_command: is empty",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h"}},"state_dir":"rel"}"#,
                "state_dir: must be an absolute path",
            ),
            (
                r#"{"instances":{"a":{"internal_addr":"h"}},"use_external_addr":"yes"}"#,
                "use_external_addr: expected true or false",
            ),
            ("[1]", "plugin_config: expected a JSON object"),
        ];
        for (doc, want) in cases {
            let e = err(doc);
            assert!(e.contains(want), "{doc}: {e}");
        }
        assert!(!err(r#"{"instances":{"a":{"internal_addr":"h","password":7}}}"#).contains('7'));
    }
}
