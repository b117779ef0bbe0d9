//! The `[runners.custom]` section of `config.toml` and the timeouts it yields.

use std::time::Duration;

use serde::Deserialize;

use super::CustomError;

/// Default of `config_exec_timeout`, `prepare_exec_timeout` and `cleanup_exec_timeout`, seconds.
const DEFAULT_EXEC_TIMEOUT: i64 = 3600;
/// Default of `graceful_kill_timeout` and `force_kill_timeout`, seconds.
const DEFAULT_KILL_TIMEOUT: i64 = 600;

/// The `[runners.custom]` section of `config.toml`, with GitLab Runner's defaults.
///
/// An empty `*_exec` means the stage is not run (`run_exec` is required). A timeout of zero or
/// less means the default, as in GitLab Runner.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct CustomConfig {
    /// Executable printing the job's dynamic configuration as JSON.
    pub config_exec: String,
    /// Arguments of `config_exec`, before the runner's.
    pub config_args: Vec<String>,
    /// Seconds `config_exec` may run.
    pub config_exec_timeout: i64,
    /// Executable preparing the environment.
    pub prepare_exec: String,
    /// Arguments of `prepare_exec`.
    pub prepare_args: Vec<String>,
    /// Seconds `prepare_exec` may run.
    pub prepare_exec_timeout: i64,
    /// Executable running each stage's script (required).
    pub run_exec: String,
    /// Arguments of `run_exec`, before the script path and stage name.
    pub run_args: Vec<String>,
    /// Executable cleaning the environment up.
    pub cleanup_exec: String,
    /// Arguments of `cleanup_exec`.
    pub cleanup_args: Vec<String>,
    /// Seconds `cleanup_exec` may run.
    pub cleanup_exec_timeout: i64,
    /// Seconds between SIGTERM and SIGKILL when a driver is stopped.
    pub graceful_kill_timeout: i64,
    /// Seconds to wait after SIGKILL before giving up on a driver process.
    pub force_kill_timeout: i64,
}

impl Default for CustomConfig {
    fn default() -> Self {
        CustomConfig {
            config_exec: String::new(),
            config_args: Vec::new(),
            config_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            prepare_exec: String::new(),
            prepare_args: Vec::new(),
            prepare_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            run_exec: String::new(),
            run_args: Vec::new(),
            cleanup_exec: String::new(),
            cleanup_args: Vec::new(),
            cleanup_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            graceful_kill_timeout: DEFAULT_KILL_TIMEOUT,
            force_kill_timeout: DEFAULT_KILL_TIMEOUT,
        }
    }
}

fn secs_or(value: i64, default: i64) -> Duration {
    let secs = if value > 0 { value } else { default };
    Duration::from_secs(secs.unsigned_abs())
}

impl CustomConfig {
    /// Check what GitLab Runner checks before a job: `run_exec` is set.
    pub fn validate(&self) -> Result<(), CustomError> {
        if self.run_exec.trim().is_empty() {
            return Err(CustomError::MissingRunExec);
        }
        Ok(())
    }

    /// Time `config_exec` may take.
    pub fn config_timeout(&self) -> Duration {
        secs_or(self.config_exec_timeout, DEFAULT_EXEC_TIMEOUT)
    }

    /// Time `prepare_exec` may take.
    pub fn prepare_timeout(&self) -> Duration {
        secs_or(self.prepare_exec_timeout, DEFAULT_EXEC_TIMEOUT)
    }

    /// Time `cleanup_exec` may take.
    pub fn cleanup_timeout(&self) -> Duration {
        secs_or(self.cleanup_exec_timeout, DEFAULT_EXEC_TIMEOUT)
    }

    /// Time between SIGTERM and SIGKILL.
    pub fn graceful_kill(&self) -> Duration {
        secs_or(self.graceful_kill_timeout, DEFAULT_KILL_TIMEOUT)
    }

    /// Time after SIGKILL before a driver process is abandoned.
    pub fn force_kill(&self) -> Duration {
        secs_or(self.force_kill_timeout, DEFAULT_KILL_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::custom::CustomExecutor;

    #[test]
    fn config_defaults_follow_gitlab() {
        let c: CustomConfig = toml::from_str("run_exec = \"/bin/run\"").unwrap();
        assert_eq!(c.run_exec, "/bin/run");
        assert_eq!(c.config_timeout(), Duration::from_secs(3600));
        assert_eq!(c.prepare_timeout(), Duration::from_secs(3600));
        assert_eq!(c.cleanup_timeout(), Duration::from_secs(3600));
        assert_eq!(c.graceful_kill(), Duration::from_secs(600));
        assert_eq!(c.force_kill(), Duration::from_secs(600));
        assert!(c.config_exec.is_empty() && c.config_args.is_empty());
        assert_eq!(
            c,
            CustomConfig {
                run_exec: "/bin/run".into(),
                ..CustomConfig::default()
            }
        );
        c.validate().unwrap();
    }

    #[test]
    fn config_reads_every_key() {
        let c: CustomConfig = toml::from_str(
            r#"
            config_exec = "/c"
            config_args = ["a", "b"]
            config_exec_timeout = 200
            prepare_exec = "/p"
            prepare_args = ["p1"]
            prepare_exec_timeout = 201
            run_exec = "/r"
            run_args = ["r1"]
            cleanup_exec = "/x"
            cleanup_args = ["x1"]
            cleanup_exec_timeout = 202
            graceful_kill_timeout = 203
            force_kill_timeout = 204
            "#,
        )
        .unwrap();
        assert_eq!(c.config_args, ["a", "b"]);
        assert_eq!(c.prepare_exec, "/p");
        assert_eq!(c.run_args, ["r1"]);
        assert_eq!(c.cleanup_args, ["x1"]);
        assert_eq!(c.config_timeout(), Duration::from_secs(200));
        assert_eq!(c.prepare_timeout(), Duration::from_secs(201));
        assert_eq!(c.cleanup_timeout(), Duration::from_secs(202));
        assert_eq!(c.graceful_kill(), Duration::from_secs(203));
        assert_eq!(c.force_kill(), Duration::from_secs(204));
    }

    #[test]
    fn non_positive_timeouts_mean_the_default() {
        let c: CustomConfig =
            toml::from_str("run_exec = \"r\"\nprepare_exec_timeout = 0\nforce_kill_timeout = -5")
                .unwrap();
        assert_eq!(c.prepare_timeout(), Duration::from_secs(3600));
        assert_eq!(c.force_kill(), Duration::from_secs(600));
    }

    #[test]
    fn run_exec_is_required() {
        let c: CustomConfig = toml::from_str("").unwrap();
        assert!(matches!(c.validate(), Err(CustomError::MissingRunExec)));
        assert!(CustomExecutor::new(c, "/builds").is_err());
    }
}
