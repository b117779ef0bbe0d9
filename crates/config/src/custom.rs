//! `[runners.custom]` (the custom executor's driver) and `[runners.custom_build_dir]`.

use std::path::Path;

use serde::Deserialize;
use slipway_executor::CustomConfig;

use crate::problem::Report;

/// `[runners.custom_build_dir]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct CustomBuildDirConfig {
    /// Let jobs choose their build directory (`GIT_CLONE_PATH`); not supported yet.
    pub enabled: bool,
}

impl CustomBuildDirConfig {
    /// Enabled: a warning, jobs cannot choose yet.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        if self.enabled {
            report.warning(
                &["enabled"],
                "not supported yet: jobs cannot choose their build directory (GIT_CLONE_PATH)",
            );
        }
    }
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
