//! `[runners.custom]` (the custom executor's driver) and `[runners.custom_build_dir]`.

use std::path::Path;

use serde::Deserialize;
use slipway_executor::CustomConfig;

use crate::executor::Executor;
use crate::problem::Report;

/// `[runners.custom_build_dir]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct CustomBuildDirConfig {
    /// Let jobs choose their build directory under `$CI_BUILDS_DIR` (`GIT_CLONE_PATH`); unset:
    /// GitLab Runner's default for the executor ([`custom_build_dir_default`]).
    pub enabled: Option<bool>,
}

/// GitLab Runner's default of `[runners.custom_build_dir] enabled`: on for the docker
/// executors (each job has a container of its own), off for the others.
pub fn custom_build_dir_default(executor: &Executor) -> bool {
    matches!(executor, Executor::Docker | Executor::DockerAutoscaler)
}

/// The driver's executables given by absolute path must exist here, whatever the executor.
pub(crate) fn validate_files(c: &CustomConfig, report: &mut Report<'_>) {
    for (k, v) in [
        ("config_exec", &c.config_exec),
        ("prepare_exec", &c.prepare_exec),
        ("run_exec", &c.run_exec),
        ("cleanup_exec", &c.cleanup_exec),
    ] {
        // A bare name is looked up on PATH when the job runs.
        if Path::new(v).is_absolute() {
            report.missing_file(&[k], v);
        }
    }
}

/// A `custom` runner's section (`custom`: what the runner has): present, with a `run_exec`.
pub(crate) fn validate_section(custom: Option<&CustomConfig>, report: &mut Report<'_>) {
    match custom {
        None => report.error(
            &["custom"],
            "the custom executor needs a [runners.custom] section with run_exec",
        ),
        Some(c) => {
            if let Err(e) = c.validate() {
                report.error(&["custom", "run_exec"], e.to_string());
            }
        }
    }
}
