//! The plugin's `plugin_config` JSON: every key checked on its own so each error names it.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};
use slipway_nesting::config::AccelChoice;

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
    /// A required key is absent.
    #[error("plugin_config key `{0}` is required")]
    Missing(&'static str),
    /// A known key with a bad value.
    #[error("plugin_config key `{key}`: {reason}")]
    Key {
        /// The key.
        key: &'static str,
        /// What was expected.
        reason: String,
    },
}

const KEYS: &[&str] = &[
    "dir",
    "name",
    "image",
    "images_dir",
    "cpus",
    "memory",
    "accel",
    "max_size",
    "boot_timeout",
    "username",
    "qemu",
];

/// Default images directory (as `slipway image build --images-dir`).
pub const DEFAULT_IMAGES_DIR: &str = "/var/lib/slipway/images";

/// Validated plugin configuration with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// State directory (`/tmp/slipway-qemu/<name>` by default).
    pub dir: PathBuf,
    /// Group name, the prefix of instance ids (`default`).
    pub name: String,
    /// The guest image's directory (`image` as a path, or `<images_dir>/<image>`).
    pub image_dir: PathBuf,
    /// Virtual CPUs per VM; `None` = the image's default.
    pub cpus: Option<u32>,
    /// Guest memory per VM in MiB; `None` = the image's default.
    pub memory_mib: Option<u32>,
    /// Accelerator choice (`auto`: KVM only if a probe guest runs under it).
    pub accel: AccelChoice,
    /// Largest number of VMs (2).
    pub max_size: u64,
    /// How long a VM may take from start to an SSH banner; `None` = by accelerator
    /// (10 min under TCG, 2 min under KVM).
    pub boot_timeout: Option<Duration>,
    /// Login user (`root`).
    pub username: String,
    /// The QEMU binary (`qemu-system-x86_64`, looked up on PATH).
    pub qemu: PathBuf,
}

fn key(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Key {
        key,
        reason: reason.into(),
    }
}

fn string(name: &'static str, v: &Value) -> Result<String, ConfigError> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::String(_) => Err(key(name, "expected a non-empty string")),
        other => Err(key(name, format!("expected a string, got {other}"))),
    }
}

fn positive(name: &'static str, v: &Value, max: u64) -> Result<u64, ConfigError> {
    match v.as_u64() {
        Some(n) if n >= 1 && n <= max => Ok(n),
        _ => Err(key(
            name,
            format!("expected a whole number from 1 to {max}, got {v}"),
        )),
    }
}

/// `512`, `"512"`, `"512M"`, `"512MiB"`, `"2G"`, `"2GiB"` → MiB (at least 128).
fn memory(v: &Value) -> Result<u32, ConfigError> {
    const EXPECTED: &str = "expected MiB as a number or a string like \"512M\" or \"2G\"";
    let mib: Option<u64> = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let s = s.trim();
            let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (num, unit) = s.split_at(digits);
            let factor = match unit.trim().to_ascii_lowercase().as_str() {
                "" | "m" | "mb" | "mib" => Some(1),
                "g" | "gb" | "gib" => Some(1024),
                _ => None,
            };
            num.parse::<u64>()
                .ok()
                .zip(factor)
                .and_then(|(n, f)| n.checked_mul(f))
        }
        _ => None,
    };
    let mib = mib.ok_or_else(|| key("memory", format!("{EXPECTED}, got {v}")))?;
    if !(128..=65536).contains(&mib) {
        return Err(key(
            "memory",
            format!("expected 128 MiB to 64 GiB, got {mib} MiB"),
        ));
    }
    u32::try_from(mib).map_err(|_| key("memory", EXPECTED))
}

/// `"10m"`, `"90s"` (humantime) or a number of seconds.
fn duration(name: &'static str, v: &Value) -> Result<Duration, ConfigError> {
    let d = match v {
        Value::Number(n) => n.as_u64().map(Duration::from_secs),
        Value::String(s) => humantime::parse_duration(s.trim()).ok(),
        _ => None,
    };
    match d {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(key(
            name,
            format!("expected a duration such as \"10m\" or a number of seconds, got {v}"),
        )),
    }
}

impl Config {
    /// Parse and validate `plugin_config`.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ConfigError::Syntax("not UTF-8".into()))?
            .trim();
        let map: Map<String, Value> = if text.is_empty() {
            Map::new()
        } else {
            serde_json::from_str(text)
                .map_err(|e| ConfigError::Syntax(format!("expected a JSON object: {e}")))?
        };
        if let Some(unknown) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(ConfigError::UnknownKey(unknown.clone()));
        }
        let get = |k: &str| map.get(k).filter(|v| !v.is_null());

        let name = match get("name") {
            Some(v) => string("name", v)?,
            None => "default".into(),
        };
        if name.len() > 32
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(key(
                "name",
                format!("expected 1-32 characters of A-Z a-z 0-9 - _, got {name:?}"),
            ));
        }
        let dir = match get("dir") {
            Some(v) => PathBuf::from(string("dir", v)?),
            None => PathBuf::from("/tmp/slipway-qemu").join(&name),
        };
        let images_dir = match get("images_dir") {
            Some(v) => PathBuf::from(string("images_dir", v)?),
            None => PathBuf::from(DEFAULT_IMAGES_DIR),
        };
        let image = string("image", get("image").ok_or(ConfigError::Missing("image"))?)?;
        // A name is a directory under images_dir; anything with a slash is the directory.
        let image_dir = if image.contains('/') {
            PathBuf::from(image)
        } else if image.starts_with('.') {
            return Err(key(
                "image",
                format!("expected an image name or a directory path, got {image:?}"),
            ));
        } else {
            images_dir.join(image)
        };
        let cpus = get("cpus")
            .map(|v| positive("cpus", v, 64).map(|n| n as u32))
            .transpose()?;
        let memory_mib = get("memory").map(memory).transpose()?;
        let accel = match get("accel") {
            None => AccelChoice::Auto,
            Some(v) => match v.as_str() {
                Some("auto") => AccelChoice::Auto,
                Some("kvm") => AccelChoice::Kvm,
                Some("tcg") => AccelChoice::Tcg,
                _ => return Err(key("accel", format!("expected auto, kvm or tcg, got {v}"))),
            },
        };
        let max_size = match get("max_size") {
            Some(v) => positive("max_size", v, 1024)?,
            None => 2,
        };
        let boot_timeout = get("boot_timeout")
            .map(|v| duration("boot_timeout", v))
            .transpose()?;
        let username = match get("username") {
            Some(v) => string("username", v)?,
            None => "root".into(),
        };
        if !username
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(key(
                "username",
                format!("expected a user name, got {username:?}"),
            ));
        }
        let qemu = match get("qemu") {
            Some(v) => PathBuf::from(string("qemu", v)?),
            None => PathBuf::from("qemu-system-x86_64"),
        };
        Ok(Config {
            dir,
            name,
            image_dir,
            cpus,
            memory_mib,
            accel,
            max_size,
            boot_timeout,
            username,
            qemu,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn err(json: &str) -> String {
        Config::parse(json.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_values() {
        let c = Config::parse(br#"{"image":"vm1"}"#).unwrap();
        assert_eq!(c.image_dir, PathBuf::from("/var/lib/slipway/images/vm1"));
        assert_eq!(c.dir, PathBuf::from("/tmp/slipway-qemu/default"));
        assert_eq!((c.max_size, c.cpus, c.memory_mib), (2, None, None));
        assert_eq!(c.username, "root");
        assert_eq!(c.accel, AccelChoice::Auto);

        let c = Config::parse(
            br#"{"image":"/x/img","dir":"/s","cpus":2,"memory":"1G","accel":"tcg",
                 "boot_timeout":"15m","max_size":3,"username":"ci"}"#,
        )
        .unwrap();
        assert_eq!(c.image_dir, PathBuf::from("/x/img"));
        assert_eq!((c.cpus, c.memory_mib), (Some(2), Some(1024)));
        assert_eq!(c.boot_timeout, Some(Duration::from_secs(900)));
        assert_eq!(c.accel, AccelChoice::Tcg);
        assert_eq!(
            Config::parse(br#"{"image":"a","memory":768}"#)
                .unwrap()
                .memory_mib,
            Some(768)
        );
        assert_eq!(
            Config::parse(br#"{"image":"a","boot_timeout":90}"#)
                .unwrap()
                .boot_timeout,
            Some(Duration::from_secs(90))
        );
    }

    #[test]
    fn errors_name_the_key() {
        assert!(err("{}").contains("`image` is required"));
        assert!(err(r#"{"image":"a","cpus":0}"#).contains("`cpus`"));
        assert!(err(r#"{"image":"a","memory":"lots"}"#).contains("`memory`"));
        assert!(err(r#"{"image":"a","memory":16}"#).contains("`memory`"));
        assert!(err(r#"{"image":"a","accel":"xen"}"#).contains("`accel`"));
        assert!(err(r#"{"image":"a","max_size":-1}"#).contains("`max_size`"));
        assert!(err(r#"{"image":"a","boot_timeout":"soon"}"#).contains("`boot_timeout`"));
        assert!(err(r#"{"image":"a","username":"a b"}"#).contains("`username`"));
        assert!(err(r#"{"image":"a","name":"a/b"}"#).contains("`name`"));
        assert!(err(r#"{"image":"a","colour":1}"#).contains("unknown key `colour`"));
        assert!(err("[1]").contains("JSON object"));
    }
}
