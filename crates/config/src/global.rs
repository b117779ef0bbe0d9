//! The file's top level: the global keys GitLab Runner writes (`concurrent`, `check_interval`,
//! `listen_address`, `log_level`, `shutdown_timeout`…) and the sections beside `[[runners]]`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::problem::{Report, quoted};
use crate::runner::RunnerConfig;
use crate::status_page::StatusPageConfig;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Jobs running at once across all runners.
    pub concurrent: u32,
    /// Log level (`debug`, `info`, `warn`, `error`, `fatal`, `panic`).
    pub log_level: Option<String>,
    /// Log format (`runner`, `text`, `json`).
    pub log_format: Option<String>,
    /// `host:port` serving `/metrics` and `/healthz` (`slipway run`).
    pub listen_address: Option<String>,
    /// Seconds to wait for jobs at shutdown.
    pub shutdown_timeout: u64,
    /// Where the manager keeps its state and the embedded queue (Slipway's own key; relative
    /// to the file's directory). Unset: `.slipway-state` and `.slipway-queue` beside the file.
    pub state_dir: Option<PathBuf>,
    /// Seconds between job requests that found no job (GitLab Runner's default: 3; 0 = 3).
    pub check_interval: u64,
    /// GitLab Runner's HTTP keep-alive bound (`15m0s`); accepted, Slipway's client has its own.
    pub connection_max_age: Option<String>,
    /// Sentry DSN; accepted with a warning (Slipway does not report to Sentry). Never printed.
    pub sentry_dsn: Option<String>,
    /// `[session_server]` (interactive web terminal); accepted, not served.
    pub session_server: Option<toml::Table>,
    /// `[status_page]`: the status page `slipway run` serves on `listen_address`.
    pub status_page: StatusPageConfig,
    /// The `[[runners]]` entries.
    pub runners: Vec<RunnerConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrent: 1,
            log_level: None,
            log_format: None,
            listen_address: None,
            shutdown_timeout: 30,
            state_dir: None,
            check_interval: 3,
            connection_max_age: None,
            sentry_dsn: None,
            session_server: None,
            status_page: StatusPageConfig::default(),
            runners: Vec::new(),
        }
    }
}

/// Log levels GitLab Runner accepts.
const LOG_LEVELS: &[&str] = &[
    "debug", "info", "warn", "warning", "error", "fatal", "panic",
];

impl Config {
    /// The global keys GitLab Runner writes, `[status_page]` and `[session_server]`.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        if self.concurrent == 0 {
            report.error(&["concurrent"], "must be at least 1");
        }
        if self.runners.is_empty() {
            report.error(&["runners"], "no [[runners]] entry: nothing to run");
        }
        if let Some(l) = &self.log_level
            && !LOG_LEVELS.contains(&l.to_ascii_lowercase().as_str())
        {
            report.error(
                &["log_level"],
                format!(
                    "unknown log level {l:?}; expected one of {}",
                    quoted(LOG_LEVELS)
                ),
            );
        }
        if let Some(f) = &self.log_format
            && !matches!(f.as_str(), "runner" | "text" | "json")
        {
            report.error(
                &["log_format"],
                format!("unknown log format {f:?}; expected \"runner\", \"text\" or \"json\""),
            );
        }
        if let Some(a) = &self.listen_address {
            let port_ok = a
                .rsplit_once(':')
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
            if !port_ok {
                report.error(
                    &["listen_address"],
                    format!("{a:?}: expected host:port, e.g. \"localhost:9252\" or \":9252\""),
                );
            }
        }
        if self
            .state_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            report.error(
                &["state_dir"],
                "empty: expected a directory, e.g. \"/var/lib/slipway\"",
            );
        }
        if let Some(d) = &self.connection_max_age {
            report.duration_text(&["connection_max_age"], d);
        }
        if self
            .sentry_dsn
            .as_deref()
            .is_some_and(|d| !d.trim().is_empty())
        {
            report.warning(
                &["sentry_dsn"],
                "not used by slipway: errors are not reported to Sentry",
            );
        }
        self.status_page
            .validate(&mut report.section(&["status_page"]));
        if let Some(s) = &self.session_server
            && s.contains_key("listen_address")
        {
            report.warning(
                &["session_server"],
                "the interactive web terminal is not supported yet; [session_server] is ignored",
            );
        }
    }

    /// A warning when `concurrent` is more than runner `r`'s instances can hold.
    pub(crate) fn validate_capacity_of(&self, r: &RunnerConfig, report: &mut Report<'_>) {
        let Some(a) = &r.autoscaler else { return };
        let limit = u64::from(a.max_instances) * u64::from(a.capacity_per_instance);
        if a.max_instances > 0 && u64::from(self.concurrent) > limit {
            report.warning(
                &["concurrent"],
                format!(
                    "larger than max_instances × capacity_per_instance ({limit}) of runner {:?}",
                    r.name
                ),
            );
        }
    }
}

/// GitLab Runner's directory of well-known TLS files: `certs/` beside `config`
/// (`/etc/gitlab-runner/certs` for `/etc/gitlab-runner/config.toml`).
pub fn certs_dir(config: &Path) -> PathBuf {
    config_dir(config).join("certs")
}

/// The manager's state directory (the taskscaler stores, the `system_id`, the GitLab sources'
/// outboxes): the file's `state_dir`, relative to its directory, or `.slipway-state` beside it.
pub fn state_dir(config: &Path, configured: Option<&Path>) -> PathBuf {
    match configured {
        Some(dir) => config_dir(config).join(dir),
        None => config_dir(config).join(".slipway-state"),
    }
}

/// The embedded queue's directory: `queue` in the configured `state_dir`, or `.slipway-queue`
/// beside the file.
pub fn queue_dir(config: &Path, configured: Option<&Path>) -> PathBuf {
    match configured {
        Some(dir) => config_dir(config).join(dir).join("queue"),
        None => config_dir(config).join(".slipway-queue"),
    }
}

/// Where runners on this machine keep `builds/` and `cache/` by default: in the configured
/// `state_dir`, else beside the file.
pub fn work_dir(config: &Path, configured: Option<&Path>) -> PathBuf {
    match configured {
        Some(dir) => config_dir(config).join(dir),
        None => config_dir(config).to_path_buf(),
    }
}

/// Only the `state_dir` key of the file at `config`, for commands that use the queue without
/// the whole config (`submit`, `jobs`, `cancel`): `None` when the file or the key is absent.
pub async fn state_dir_setting(config: &Path) -> Result<Option<PathBuf>, crate::ConfigError> {
    let file = config.display().to_string();
    let text = match tokio::fs::read_to_string(config).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(crate::ConfigError::Read { file, source }),
    };
    // Only this key: a file without runners yet (`register` adds them) is still fine here.
    let problem = |message: String| {
        crate::ConfigError::Invalid(vec![crate::Problem {
            file: file.clone(),
            line: None,
            key: "state_dir".into(),
            message,
        }])
    };
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        problem(format!("the file is not valid TOML: {}", e.message()))
    })?;
    match table.get("state_dir") {
        None => Ok(None),
        Some(toml::Value::String(d)) if !d.is_empty() => Ok(Some(PathBuf::from(d))),
        Some(other) => Err(problem(format!(
            "expected a directory, e.g. \"/var/lib/slipway\", got {other}"
        ))),
    }
}

/// The directory holding `config` (`.` for a bare file name).
fn config_dir(config: &Path) -> &Path {
    config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_queue_sit_beside_the_file_unless_state_dir_says() {
        let cfg = Path::new("/etc/slipway/config.toml");
        assert_eq!(work_dir(cfg, None), Path::new("/etc/slipway"));
        assert_eq!(
            state_dir(cfg, None),
            Path::new("/etc/slipway/.slipway-state")
        );
        assert_eq!(
            queue_dir(cfg, None),
            Path::new("/etc/slipway/.slipway-queue")
        );
        let set = Some(Path::new("/var/lib/slipway"));
        assert_eq!(state_dir(cfg, set), Path::new("/var/lib/slipway"));
        assert_eq!(queue_dir(cfg, set), Path::new("/var/lib/slipway/queue"));
        assert_eq!(work_dir(cfg, set), Path::new("/var/lib/slipway"));
        // Relative to the file's directory, as every path in it.
        let rel = Some(Path::new("state"));
        assert_eq!(
            state_dir(Path::new("config.toml"), rel),
            Path::new("./state")
        );
    }

    #[tokio::test]
    async fn state_dir_setting_reads_the_key_alone_and_names_it_when_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.toml");
        assert_eq!(state_dir_setting(&cfg).await.unwrap(), None, "no file");
        // No runners yet (before `register`): still read.
        std::fs::write(&cfg, "state_dir = \"/srv/slipway\"\n").unwrap();
        assert_eq!(
            state_dir_setting(&cfg).await.unwrap(),
            Some(PathBuf::from("/srv/slipway"))
        );
        std::fs::write(&cfg, "state_dir = 3\n").unwrap();
        let e = state_dir_setting(&cfg).await.unwrap_err().to_string();
        assert!(
            e.contains("state_dir") && e.contains("expected a directory"),
            "{e}"
        );
        std::fs::write(&cfg, "state_dir = [\n").unwrap();
        let e = state_dir_setting(&cfg).await.unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
    }
}
