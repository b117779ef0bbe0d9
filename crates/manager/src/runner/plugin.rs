//! A `plugin` runner's executor plugin: found, started, `Init`ed and its isolation levels
//! checked against the runner's.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use slipway_config::{Executor, ExecutorPluginConfig, RunnerConfig};
use slipway_executor_plugin::ExecutorHost;

use super::{StartError, StartOptions, plugin_name};

/// A `plugin` runner's executor plugin and what its jobs may ask of it.
#[derive(Debug)]
pub struct ExecutorPlugin {
    /// The plugin process, initialized.
    pub host: Arc<ExecutorHost>,
    /// `[runners.plugin]`.
    pub config: ExecutorPluginConfig,
    /// The runner's `allowed_isolation` (plugin levels; `None`: all it declares).
    pub allowed: Option<Vec<String>>,
    /// The runner's `isolation` (`None`: the first allowed level).
    pub default: Option<String>,
}

/// Start a `plugin` runner's executor plugin and `Init` it (`dry_run`: only check its config);
/// it must run jobs where the runner puts them (on instances with `[runners.autoscaler]`).
pub async fn start_executor_plugin_with(
    cfg: &RunnerConfig,
    plugin: &ExecutorPluginConfig,
    plugin_dir: Option<&Path>,
    handshake_timeout: Option<Duration>,
    dry_run: bool,
) -> Result<ExecutorHost, StartError> {
    use slipway_executor_plugin::Placement;
    let runner = &cfg.name;
    let path = slipway_executor_plugin::find_plugin(&plugin.name, plugin_dir).map_err(|cause| {
        StartError::ExecutorPluginName {
            runner: runner.clone(),
            cause: Box::new(cause),
        }
    })?;
    let mut popts = slipway_goplugin::ProcessOptions::new(plugin_name(&plugin.name), path);
    if let Some(t) = handshake_timeout {
        popts.handshake_timeout = t;
    }
    let config =
        serde_json::to_vec(&plugin.config).map_err(|cause| StartError::ExecutorPluginConfig {
            runner: runner.clone(),
            cause,
        })?;
    let host = ExecutorHost::start(popts, config, dry_run)
        .await
        .map_err(|cause| StartError::ExecutorPlugin {
            runner: runner.clone(),
            plugin: plugin.name.clone(),
            cause: Box::new(cause),
        })?;
    let placement = host.capabilities().placement;
    let wanted = if cfg.on_instances() {
        Placement::Instance
    } else {
        Placement::Local
    };
    if placement != wanted {
        host.stop().await;
        return Err(StartError::Placement {
            runner: runner.clone(),
            plugin: plugin.name.clone(),
            placement,
        });
    }
    Ok(host)
}

/// Check a `plugin` runner's `allowed_isolation` and `isolation` against the levels its plugin
/// declared.
pub fn check_plugin_levels(cfg: &RunnerConfig, declared: &[String]) -> Result<(), StartError> {
    if let Some(allowed) = &cfg.allowed_isolation
        && let Some(bad) = allowed.iter().find(|l| !declared.contains(l))
    {
        return Err(StartError::LevelNotDeclared {
            runner: cfg.name.clone(),
            level: bad.clone(),
            declared: declared.to_vec(),
        });
    }
    if let Some(default) = &cfg.isolation {
        let allowed = cfg.allowed_isolation.as_deref().unwrap_or(declared);
        if !allowed.contains(default) {
            return Err(StartError::DefaultNotAllowed {
                runner: cfg.name.clone(),
                level: default.clone(),
                allowed: allowed.to_vec(),
            });
        }
    }
    Ok(())
}

/// A `plugin` runner's executor plugin, started, its levels checked; `None` for other runners.
/// Nothing is left running on an error.
pub(super) async fn start_plugin_of(
    cfg: &RunnerConfig,
    opts: &StartOptions,
) -> Result<Option<ExecutorPlugin>, StartError> {
    let Some(p) = cfg
        .plugin
        .as_ref()
        .filter(|_| cfg.executor == Executor::Plugin)
    else {
        return Ok(None);
    };
    let host = start_executor_plugin_with(
        cfg,
        p,
        opts.plugin_dir.as_deref(),
        opts.handshake_timeout,
        false,
    )
    .await?;
    let caps = host.capabilities();
    if let Err(e) = check_plugin_levels(cfg, &caps.isolation_levels) {
        host.stop().await;
        return Err(e);
    }
    tracing::info!(
        runner = %cfg.name,
        plugin = %caps.name,
        version = %caps.version,
        levels = ?caps.isolation_levels,
        "executor plugin ready"
    );
    Ok(Some(ExecutorPlugin {
        host: Arc::new(host),
        config: p.clone(),
        allowed: cfg.allowed_isolation.clone(),
        default: cfg.isolation.clone(),
    }))
}
