//! Why a runner did not start, or did not list its VM snapshots, and how errors name an
//! instance group.

use std::fmt;

use slipway_config::ConnectorConfigError;
use slipway_fleeting::GroupError;
use slipway_goplugin::HostError;
use slipway_taskscaler::Error as TsError;
use slipway_taskscaler::store::StoreError;

use crate::runner::pool::PoolError;

/// Why a runner, or a `plugin` runner's executor plugin, could not be started. Each error
/// names the runner (or the shape) and the setting or step that failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting of the runner cannot be used.
    #[error("runner {runner:?}: {key}: {problem}")]
    Setting {
        /// The runner.
        runner: String,
        /// The setting.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Its jobs run on autoscaled instances, but it says nothing about them.
    #[error("runner {runner:?} has no [runners.autoscaler] section")]
    NoAutoscaler {
        /// The runner.
        runner: String,
    },
    /// A `[[runners.autoscaler.shape]]` setting cannot be used.
    #[error("shape {shape:?}: {key}: {problem}")]
    Shape {
        /// The shape.
        shape: String,
        /// The setting.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The fleeting plugin is not installed.
    #[error("{group}")]
    FindPlugin {
        /// The instance group it was wanted for.
        group: GroupName,
        /// Why it was not found.
        #[source]
        cause: Box<HostError>,
    },
    /// `plugin_config` cannot be sent to the fleeting plugin.
    #[error("plugin_config as JSON")]
    PluginConfigJson(#[source] serde_json::Error),
    /// `connector_config` cannot be used.
    #[error(transparent)]
    Connector(#[from] ConnectorConfigError),
    /// The fleeting plugin's process did not start.
    #[error("starting plugin for {group}")]
    StartPlugin {
        /// The instance group it was started for.
        group: GroupName,
        /// Why.
        #[source]
        cause: Box<HostError>,
    },
    /// The fleeting plugin refused its `Init`.
    #[error("{group}: plugin {plugin:?} refused its config")]
    PluginInit {
        /// The instance group.
        group: GroupName,
        /// The plugin as configured.
        plugin: String,
        /// What it answered.
        #[source]
        cause: GroupError,
    },
    /// The state store cannot be opened (unreadable, corrupt, another runner's).
    #[error("runner {runner:?}: state_storage")]
    StateStorage {
        /// The runner.
        runner: String,
        /// Why.
        #[source]
        cause: StoreError,
    },
    /// An instance group's taskscaler did not start.
    #[error("{group}: starting the taskscaler")]
    Taskscaler {
        /// The instance group.
        group: GroupName,
        /// Why.
        #[source]
        cause: TsError,
    },
    /// The taskscaler over this machine's slots did not start.
    #[error("runner {runner:?}: starting its slots")]
    Slots {
        /// The runner.
        runner: String,
        /// Why.
        #[source]
        cause: TsError,
    },
    /// The executor plugin (`[runners.plugin] name`) is not installed.
    #[error("runner {runner:?}: plugin.name")]
    ExecutorPluginName {
        /// The runner.
        runner: String,
        /// Why it was not found.
        #[source]
        cause: Box<HostError>,
    },
    /// `[runners.plugin] config` cannot be sent to the executor plugin.
    #[error("runner {runner:?}: plugin.config")]
    ExecutorPluginConfig {
        /// The runner.
        runner: String,
        /// Why.
        #[source]
        cause: serde_json::Error,
    },
    /// The executor plugin did not start, or refused its config.
    #[error("runner {runner:?}: executor plugin {plugin:?}")]
    ExecutorPlugin {
        /// The runner.
        runner: String,
        /// The plugin as configured.
        plugin: String,
        /// Why.
        #[source]
        cause: Box<slipway_executor_plugin::StartError>,
    },
    /// The executor plugin runs jobs elsewhere than the runner puts them.
    #[error(
        "runner {runner:?}: executor plugin {plugin:?} runs jobs {}, but the runner {}",
        where_plugin_runs(*.placement),
        what_runner_has(*.placement)
    )]
    Placement {
        /// The runner.
        runner: String,
        /// The plugin as configured.
        plugin: String,
        /// Where the plugin runs jobs.
        placement: slipway_executor_plugin::Placement,
    },
    /// `allowed_isolation` names a level the executor plugin does not give.
    #[error(
        "runner {runner:?}: allowed_isolation: the executor plugin does not give level {level:?}; it declares {}",
        quoted(.declared)
    )]
    LevelNotDeclared {
        /// The runner.
        runner: String,
        /// The level.
        level: String,
        /// The levels the plugin declares.
        declared: Vec<String>,
    },
    /// `isolation` is not among the levels the runner allows.
    #[error(
        "runner {runner:?}: isolation: {level:?} is not among the allowed levels ({})",
        quoted(.allowed)
    )]
    DefaultNotAllowed {
        /// The runner.
        runner: String,
        /// The default level.
        level: String,
        /// The levels allowed.
        allowed: Vec<String>,
    },
}

/// Why a runner's instance did not list its VM snapshots.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotsError {
    /// The runner has no VM isolation, so no nesting daemon.
    #[error("runner {runner:?} has no VM isolation")]
    NoVmIsolation {
        /// The runner.
        runner: String,
    },
    /// The instance cannot be reached.
    #[error(transparent)]
    Connect(#[from] PoolError),
    /// The nesting daemon cannot be reached on the instance.
    #[error("{0}")]
    Nesting(String),
    /// The nesting daemon did not list them.
    #[error(transparent)]
    List(#[from] slipway_nesting::client::ClientError),
}

/// An instance group as errors name it: `runner "x"`, and ` shape "y"` when the runner has
/// several shapes.
#[derive(Debug, Clone)]
pub struct GroupName {
    /// The runner.
    pub runner: String,
    /// The shape, when the runner has several.
    pub shape: Option<String>,
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "runner {:?}", self.runner)?;
        if let Some(shape) = &self.shape {
            write!(f, " shape {shape:?}")?;
        }
        Ok(())
    }
}

/// Where a plugin placing jobs at `p` runs them, for [`StartError::Placement`].
fn where_plugin_runs(p: slipway_executor_plugin::Placement) -> &'static str {
    match p {
        slipway_executor_plugin::Placement::Instance => {
            "on autoscaled instances (PLACEMENT_INSTANCE)"
        }
        slipway_executor_plugin::Placement::Local => "on the manager's machine (PLACEMENT_LOCAL)",
    }
}

/// What a runner has that does not fit a plugin placing jobs at `p`.
fn what_runner_has(p: slipway_executor_plugin::Placement) -> &'static str {
    match p {
        slipway_executor_plugin::Placement::Instance => "has no [runners.autoscaler] section",
        slipway_executor_plugin::Placement::Local => "has a [runners.autoscaler] section",
    }
}

/// `"a", "b"`.
fn quoted(levels: &[String]) -> String {
    levels
        .iter()
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
