//! `[runners.docker]`: the keys Slipway honours, pull policies and the allowed-image globs.

use std::fmt;

use serde::{Deserialize, Deserializer};
use slipway_job::model::Image;

use super::DockerExecutorError;

/// GitLab's image pull policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullPolicy {
    /// Use the local image only.
    Never,
    /// Pull only when the image is not present locally.
    IfNotPresent,
    /// Pull every time.
    Always,
}

impl PullPolicy {
    /// GitLab's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Never => "never",
            PullPolicy::IfNotPresent => "if-not-present",
            PullPolicy::Always => "always",
        }
    }

    /// Parses GitLab's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "never" => Some(PullPolicy::Never),
            "if-not-present" => Some(PullPolicy::IfNotPresent),
            "always" => Some(PullPolicy::Always),
            _ => None,
        }
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[runners.docker]`: the keys Slipway honours (see the module docs), GitLab's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct DockerConfig {
    /// Engine address (`unix:///path`); the local default when `None`.
    pub host: Option<String>,
    /// Image for jobs that name none.
    pub image: Option<String>,
    /// Run build and service containers privileged.
    pub privileged: bool,
    /// Extra volumes: `host:ctr[:mode]`, `name:ctr[:mode]` or `/ctr` (a cache volume).
    pub volumes: Vec<String>,
    /// `/ctr` volumes are per-job instead of persistent cache volumes.
    pub disable_cache: bool,
    /// Memory limit in Docker units (`512m`, `2g`).
    pub memory: Option<String>,
    /// CPU limit (`"1.5"`).
    pub cpus: Option<String>,
    /// cgroup parent when the slot gives none.
    pub cgroup_parent: Option<String>,
    /// Pull policies, tried in order until one gives an image.
    #[serde(deserialize_with = "one_or_many")]
    pub pull_policy: Vec<PullPolicy>,
    /// Pull policies a job may ask for; `pull_policy` when empty.
    #[serde(deserialize_with = "one_or_many")]
    pub allowed_pull_policies: Vec<PullPolicy>,
    /// Globs the job image must match; all allowed when empty.
    pub allowed_images: Vec<String>,
    /// Globs service images must match; all allowed when empty.
    pub allowed_services: Vec<String>,
    /// Extra `/etc/hosts` entries, `host:ip` each.
    pub extra_hosts: Vec<String>,
    /// `[[runners.docker.services]]`: services every job gets, before its own.
    pub services: Vec<ServiceConfig>,
}

/// One `[[runners.docker.services]]` entry, as GitLab Runner reads it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServiceConfig {
    /// Image.
    pub name: String,
    /// Network alias (besides the names derived from the image).
    pub alias: Option<String>,
    /// Entrypoint override.
    pub entrypoint: Vec<String>,
    /// Command override.
    pub command: Vec<String>,
    /// `KEY=value` variables of the service container.
    pub environment: Vec<String>,
}

impl ServiceConfig {
    /// As a job's `services:` entry.
    pub fn to_image(&self) -> Image {
        let mut image = Image::named(&self.name);
        image.alias = self.alias.clone().unwrap_or_default();
        image.entrypoint = self.entrypoint.clone();
        image.command = self.command.clone();
        image.variables = self
            .environment
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| slipway_job::model::Variable::new(k, v))
            .collect();
        image
    }
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: None,
            image: None,
            privileged: false,
            volumes: Vec::new(),
            disable_cache: false,
            memory: None,
            cpus: None,
            cgroup_parent: None,
            pull_policy: vec![PullPolicy::Always],
            allowed_pull_policies: Vec::new(),
            allowed_images: Vec::new(),
            allowed_services: Vec::new(),
            extra_hosts: Vec::new(),
            services: Vec::new(),
        }
    }
}

/// One policy or a list of them, as GitLab accepts.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PullPolicy>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(PullPolicy),
        Many(Vec<PullPolicy>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(p) => vec![p],
        OneOrMany::Many(v) => v,
    })
}

impl DockerConfig {
    /// The memory limit in bytes.
    pub fn memory_bytes(&self) -> Result<Option<i64>, DockerExecutorError> {
        self.memory
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .map(|m| {
                parse_memory(m).ok_or_else(|| DockerExecutorError::Config {
                    key: "memory",
                    reason: format!("{m:?} is not a size like 512m or 2g"),
                })
            })
            .transpose()
    }

    /// The CPU limit in billionths of a CPU.
    pub fn nano_cpus(&self) -> Result<Option<i64>, DockerExecutorError> {
        self.cpus
            .as_deref()
            .filter(|c| !c.trim().is_empty())
            .map(|c| {
                c.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    // Whole nanoCPUs: the rounding is intended.
                    .map(|v| (v * 1e9).round() as i64)
                    .ok_or_else(|| DockerExecutorError::Config {
                        key: "cpus",
                        reason: format!("{c:?} is not a positive number of CPUs"),
                    })
            })
            .transpose()
    }

    /// Every value parses.
    pub fn validate(&self) -> Result<(), DockerExecutorError> {
        self.memory_bytes()?;
        self.nano_cpus()?;
        for (i, svc) in self.services.iter().enumerate() {
            if svc.name.trim().is_empty() {
                return Err(DockerExecutorError::Config {
                    key: "services",
                    reason: format!("entry {} has no name (the service's image)", i + 1),
                });
            }
            if let Some(bad) = svc.environment.iter().find(|kv| !kv.contains('=')) {
                return Err(DockerExecutorError::Config {
                    key: "services",
                    reason: format!(
                        "service {:?}: environment entry {bad:?} is not KEY=value",
                        svc.name
                    ),
                });
            }
        }
        Ok(())
    }

    fn effective_pull_policy(&self) -> Vec<PullPolicy> {
        if self.pull_policy.is_empty() {
            vec![PullPolicy::Always]
        } else {
            self.pull_policy.clone()
        }
    }

    /// The policies to use for `image`: its own when it names some and they are allowed.
    pub(super) fn pull_policies_for(&self, image: &Image) -> Result<Vec<PullPolicy>, String> {
        let configured = self.effective_pull_policy();
        if image.pull_policy.is_empty() {
            return Ok(configured);
        }
        let allowed = if self.allowed_pull_policies.is_empty() {
            configured
        } else {
            self.allowed_pull_policies.clone()
        };
        let mut asked = Vec::new();
        for p in &image.pull_policy {
            match PullPolicy::parse(p) {
                Some(p) if allowed.contains(&p) => asked.push(p),
                _ => {
                    return Err(format!(
                        "pull_policy ({}) defined in the job is not one of the allowed_pull_policies ({})",
                        image.pull_policy.join(", "),
                        join(&allowed)
                    ));
                }
            }
        }
        Ok(asked)
    }
}

/// The policies as GitLab lists them in messages.
pub(super) fn join(p: &[PullPolicy]) -> String {
    p.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
}

/// Docker's size syntax: a number with an optional `b`, `k`, `m`, `g` or `t` (powers of 1024),
/// optionally followed by `b`.
fn parse_memory(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_suffix('b').unwrap_or(&s);
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 'b'),
    };
    let mult: f64 = match unit {
        'b' => 1.0,
        'k' => 1024.0,
        'm' => 1024.0 * 1024.0,
        'g' => 1024.0 * 1024.0 * 1024.0,
        't' => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v: f64 = num.trim().parse().ok()?;
    // Whole bytes: the rounding is intended.
    (v.is_finite() && v > 0.0).then_some((v * mult) as i64)
}

/// Glob match where `*` stays within one path segment and `**` crosses `/`.
pub(super) fn glob_match(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) if rest.first() == Some(&b'*') => {
                let rest = &rest[1..];
                (0..=t.len()).any(|i| go(rest, &t[i..]))
            }
            Some((b'*', rest)) => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != b'/')
                .any(|i| go(rest, &t[i..])),
            Some((b'?', rest)) => t.first().is_some_and(|&c| c != b'/') && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

/// Whether `image` matches one of `patterns` (all allowed when there are none).
pub(super) fn allowed(patterns: &[String], image: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| glob_match(p, image))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_keys() {
        let c: DockerConfig = toml::from_str("").unwrap();
        assert_eq!(c, DockerConfig::default());
        assert_eq!(c.pull_policy, vec![PullPolicy::Always]);
        assert!(!c.privileged);
        let c: DockerConfig = toml::from_str(
            r#"
            image = "alpine:3"
            privileged = false
            volumes = ["/cache", "/srv:/srv:ro"]
            memory = "128m"
            cpus = "1.5"
            pull_policy = "if-not-present"
            allowed_pull_policies = ["always", "never"]
            allowed_images = ["alpine:*", "team/**"]
            network_mode = "ignored"
            helper_image = "ignored"
            "#,
        )
        .unwrap();
        assert_eq!(c.pull_policy, vec![PullPolicy::IfNotPresent]);
        assert_eq!(
            c.allowed_pull_policies,
            vec![PullPolicy::Always, PullPolicy::Never]
        );
        assert_eq!(c.memory_bytes().unwrap(), Some(128 << 20));
        assert_eq!(c.nano_cpus().unwrap(), Some(1_500_000_000));
        let c: DockerConfig =
            toml::from_str(r#"pull_policy = ["always", "if-not-present"]"#).unwrap();
        assert_eq!(
            c.pull_policy,
            vec![PullPolicy::Always, PullPolicy::IfNotPresent]
        );
        assert!(toml::from_str::<DockerConfig>(r#"pull_policy = "sometimes""#).is_err());
        let c: DockerConfig = toml::from_str(
            r#"
            [[services]]
              name = "postgres:15"
              alias = "db"
              environment = ["POSTGRES_PASSWORD=x", "bad"]
            "#,
        )
        .unwrap();
        let db = c.services[0].to_image();
        assert_eq!((db.name.as_str(), db.alias.as_str()), ("postgres:15", "db"));
        assert_eq!(db.variables[0].value, "x");
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("services") && e.contains("\"bad\""), "{e}");
        let nameless: DockerConfig = toml::from_str("[[services]]\nalias = \"db\"\n").unwrap();
        assert!(
            nameless
                .validate()
                .unwrap_err()
                .to_string()
                .contains("no name")
        );
        let bad = DockerConfig {
            memory: Some("lots".into()),
            ..DockerConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn memory_units() {
        assert_eq!(parse_memory("512m"), Some(512 << 20));
        assert_eq!(parse_memory("2G"), Some(2 << 30));
        assert_eq!(parse_memory("64mb"), Some(64 << 20));
        assert_eq!(parse_memory("1024"), Some(1024));
        assert_eq!(parse_memory("1.5k"), Some(1536));
        assert_eq!(parse_memory("x"), None);
        assert_eq!(parse_memory("-1m"), None);
    }

    #[test]
    fn job_pull_policy_must_be_allowed() {
        let c = DockerConfig {
            pull_policy: vec![PullPolicy::IfNotPresent],
            ..DockerConfig::default()
        };
        let mut img = Image::named("x");
        assert_eq!(
            c.pull_policies_for(&img).unwrap(),
            vec![PullPolicy::IfNotPresent]
        );
        img.pull_policy = vec!["always".into()];
        assert!(c.pull_policies_for(&img).is_err());
        img.pull_policy = vec!["if-not-present".into()];
        assert_eq!(
            c.pull_policies_for(&img).unwrap(),
            vec![PullPolicy::IfNotPresent]
        );
    }
}
