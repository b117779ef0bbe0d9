//! `[runners.plugin]`: the executor plugin a `plugin` runner drives.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::problem::Report;

/// `[runners.plugin]`: the executor plugin a `plugin` runner drives.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct ExecutorPluginConfig {
    /// `executor-plugin-<name>` (in `--plugin-dir`, next to slipway, on `PATH`) or a path.
    pub name: String,
    /// `[runners.plugin.config]`, handed to the plugin's `Init` as JSON. Never printed.
    pub config: toml::Table,
    /// How long the plugin may take to prepare a job's environment.
    #[serde(with = "crate::de::duration")]
    pub prepare_timeout: Duration,
    /// How long the plugin may take to remove it.
    #[serde(with = "crate::de::duration")]
    pub cleanup_timeout: Duration,
}

impl Default for ExecutorPluginConfig {
    fn default() -> Self {
        ExecutorPluginConfig {
            name: String::new(),
            config: toml::Table::new(),
            prepare_timeout: slipway_executor::plugin::DEFAULT_PREPARE_TIMEOUT,
            cleanup_timeout: slipway_executor::plugin::DEFAULT_CLEANUP_TIMEOUT,
        }
    }
}

impl fmt::Debug for ExecutorPluginConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The plugin's config may hold credentials: keys only.
        f.debug_struct("ExecutorPluginConfig")
            .field("name", &self.name)
            .field("config_keys", &self.config.keys().collect::<Vec<_>>())
            .field("prepare_timeout", &self.prepare_timeout)
            .field("cleanup_timeout", &self.cleanup_timeout)
            .finish()
    }
}

/// A `plugin` runner's section (`plugin`: what the runner has) must name its plugin.
pub(crate) fn validate(plugin: Option<&ExecutorPluginConfig>, report: &mut Report<'_>) {
    if plugin.is_none_or(|p| p.name.trim().is_empty()) {
        report.error(
            &["plugin", "name"],
            "the plugin executor needs [runners.plugin] name = \"<plugin>\" (executor-plugin-<plugin> in --plugin-dir, next to slipway or on PATH, or a path)",
        );
    }
}
