//! `[runners.autoscaler]`: the fleeting plugin, its instance group and the taskscaler over it,
//! with `[runners.autoscaler.state_storage]` and `[runners.autoscaler.scale_throttle]`.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::connector::ConnectorConfigToml;
use crate::policy::{self, PolicyConfig};
use crate::problem::Report;
use crate::runner::RunnerConfig;
use crate::shape::{self, ShapeConfig};
use crate::vm_isolation::VmIsolationConfig;

/// `[runners.autoscaler]`.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct AutoscalerConfig {
    /// Plugin name or path.
    pub plugin: String,
    /// Slots per instance.
    pub capacity_per_instance: u32,
    /// Jobs per instance before removal; 0 = unlimited.
    pub max_use_count: u32,
    /// Cap on instances; 0 = unlimited.
    pub max_instances: u32,
    /// Delete every instance when the runner stops.
    pub delete_instances_on_shutdown: bool,
    /// How long a job waits for a slot.
    #[serde(with = "crate::de::duration")]
    pub instance_acquire_timeout: Duration,
    /// Plugin `Update` period.
    #[serde(with = "crate::de::duration")]
    pub update_interval: Duration,
    /// Plugin `Update` period while changes are expected.
    #[serde(with = "crate::de::duration")]
    pub update_interval_when_expecting: Duration,
    /// Ask again for a deletion that had no effect after this long.
    #[serde(with = "crate::de::duration")]
    pub deletion_retry_interval: Duration,
    /// Wait between deletion checks at shutdown.
    #[serde(with = "crate::de::duration")]
    pub shutdown_deletion_interval: Duration,
    /// Deletion rounds at shutdown before giving up.
    pub shutdown_deletion_retries: u32,
    /// Free-form table passed to the plugin as JSON.
    pub plugin_config: toml::Table,
    /// `[runners.autoscaler.connector_config]`.
    pub connector_config: ConnectorConfigToml,
    /// `[[runners.autoscaler.policy]]`.
    pub policy: Vec<PolicyConfig>,
    /// `[runners.autoscaler.scale_throttle]`.
    pub scale_throttle: ScaleThrottleConfig,
    /// Keep reservations from blocking scale-down (GitLab default: on).
    pub reservation_throttling: bool,
    /// Consecutive failed health checks before an instance is replaced.
    pub failure_threshold: u32,
    /// Run on each new instance through the connector; a failure removes the instance.
    pub instance_ready_command: String,
    /// Slipway: instances a job may be tried on when each fails before the job's script starts
    /// (its connection lost, removed, not answering): the job then runs again on another;
    /// after the last it fails with `runner_system_failure`. Default 3.
    pub start_attempts: u32,
    /// Slipway: run on each ready instance every `preemption_check_interval`; exit 0 with
    /// output is a preemption notice (EC2's `spot/instance-action` JSON, an RFC 3339 time or
    /// unix seconds when the instance goes; anything else: within 2 minutes). Empty: none.
    pub preemption_check_command: String,
    /// Slipway: how often `preemption_check_command` runs on each ready instance.
    #[serde(with = "crate::de::duration")]
    pub preemption_check_interval: Duration,
    /// `[runners.autoscaler.state_storage]`.
    pub state_storage: StateStorageConfig,
    /// `[[runners.autoscaler.shape]]`: instance groups of different sizes (Slipway). Without
    /// any, the section itself is the one group and jobs are placed by slot count.
    pub shape: Vec<ShapeConfig>,
    /// `[runners.autoscaler.vm_isolation]`.
    pub vm_isolation: Option<VmIsolationConfig>,
    /// Slipway: what one instance costs per hour (the runner's instance type; each shape may
    /// set its own): `0.34` in `currency`, or `"0.34 EUR"`.
    pub price_per_hour: Option<crate::PriceValue>,
    /// Slipway: the currency of prices written as numbers (default USD).
    pub currency: Option<String>,
    /// Slipway: the shortest time an instance is billed for (per-second billing; 60 s on AWS).
    #[serde(with = "crate::de::duration")]
    pub billing_minimum: Duration,
}

impl fmt::Debug for AutoscalerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // plugin_config often holds cloud credentials: show its keys, never its values.
        let keys: Vec<&String> = self.plugin_config.keys().collect();
        f.debug_struct("AutoscalerConfig")
            .field("plugin", &self.plugin)
            .field("capacity_per_instance", &self.capacity_per_instance)
            .field("max_use_count", &self.max_use_count)
            .field("max_instances", &self.max_instances)
            .field("plugin_config_keys", &keys)
            .field("connector_config", &self.connector_config)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        // GitLab's defaults are the taskscaler's.
        let d = slipway_taskscaler::Config::default();
        AutoscalerConfig {
            plugin: String::new(),
            capacity_per_instance: 1,
            max_use_count: 0,
            max_instances: 0,
            delete_instances_on_shutdown: false,
            instance_acquire_timeout: d.instance_acquire_timeout,
            update_interval: d.update_interval,
            update_interval_when_expecting: d.update_interval_when_expecting,
            deletion_retry_interval: d.deletion_retry_interval,
            shutdown_deletion_interval: d.shutdown_deletion_interval,
            shutdown_deletion_retries: d.shutdown_deletion_retries,
            plugin_config: toml::Table::new(),
            connector_config: ConnectorConfigToml::default(),
            policy: Vec::new(),
            scale_throttle: ScaleThrottleConfig::default(),
            reservation_throttling: d.reservation_throttling,
            failure_threshold: d.failure_threshold,
            instance_ready_command: String::new(),
            start_attempts: 3,
            preemption_check_command: String::new(),
            preemption_check_interval: Duration::from_secs(5),
            state_storage: StateStorageConfig::default(),
            shape: Vec::new(),
            vm_isolation: None,
            price_per_hour: None,
            currency: None,
            billing_minimum: Duration::from_secs(60),
        }
    }
}

/// `[runners.autoscaler.state_storage]`: on by default in Slipway (GitLab: off).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct StateStorageConfig {
    /// Keep instances, use counts and acquisitions across restarts.
    pub enabled: bool,
    /// Directory of the store (default: the global `state_dir`, else `.slipway-state` beside
    /// config.toml).
    pub dir: Option<String>,
    /// Keep a restored instance that still had acquisitions.
    pub keep_instance_with_acquisitions: bool,
}

impl Default for StateStorageConfig {
    fn default() -> Self {
        StateStorageConfig {
            enabled: true,
            dir: None,
            keep_instance_with_acquisitions: false,
        }
    }
}

/// `[runners.autoscaler.scale_throttle]`.
#[derive(Debug, Clone, Copy, Deserialize, Default)]
#[serde(default)]
pub struct ScaleThrottleConfig {
    /// Creations per second: 0 = 100/s (GitLab's default), -1 = unlimited.
    pub limit: i64,
    /// Bucket size; 0 = `max_instances`, or `limit` when that is unset.
    pub burst: u32,
}

impl AutoscalerConfig {
    /// The taskscaler's settings for this group; `force_delete` deletes every instance at
    /// shutdown whatever `delete_instances_on_shutdown` says.
    pub fn to_scaler_config(&self, force_delete: bool) -> slipway_taskscaler::Config {
        let t = self.scale_throttle;
        // GitLab: limit 0 = 100/s, -1 = unlimited; burst 0 = max_instances, or limit if unset.
        let limit = match t.limit {
            l if l < 0 => None,
            0 => Some(100.0),
            l => Some(l as f64),
        };
        let burst = match (t.burst, self.max_instances) {
            (0, 0) => limit.map_or(1, |l| l.ceil() as u32).max(1),
            (0, max) => max,
            (b, _) => b,
        };
        slipway_taskscaler::Config {
            capacity_per_instance: self.capacity_per_instance,
            max_instances: self.max_instances,
            max_use_count: self.max_use_count,
            policies: self.policy.iter().map(|p| p.to_policy()).collect(),
            scale_throttle: slipway_taskscaler::ScaleThrottle { limit, burst },
            reservation_throttling: self.reservation_throttling,
            failure_threshold: self.failure_threshold,
            forecast: None,
            instance_acquire_timeout: self.instance_acquire_timeout,
            update_interval: self.update_interval,
            update_interval_when_expecting: self.update_interval_when_expecting,
            deletion_retry_interval: self.deletion_retry_interval,
            delete_instances_on_shutdown: self.delete_instances_on_shutdown || force_delete,
            shutdown_deletion_interval: self.shutdown_deletion_interval,
            shutdown_deletion_retries: self.shutdown_deletion_retries,
            preemption_check_interval: (!self.preemption_check_command.trim().is_empty())
                .then_some(self.preemption_check_interval),
            ..slipway_taskscaler::Config::default()
        }
    }

    /// The section's checks (`report` is at it) for runner `r`: the plugin, VM isolation,
    /// sizes and intervals, the connector's key, policies, throttle, shapes.
    pub(crate) fn validate(&self, r: &RunnerConfig, report: &mut Report<'_>) {
        if self.plugin.trim().is_empty() {
            report.error(&["plugin"], "missing; expected a plugin name or path");
        }
        if let Some(v) = &self.vm_isolation {
            v.validate(&r.executor, &mut report.section(&["vm_isolation"]));
        }
        if self.capacity_per_instance == 0 {
            report.error(&["capacity_per_instance"], "must be at least 1");
        }
        if !self.preemption_check_command.trim().is_empty()
            && self.preemption_check_interval.is_zero()
        {
            report.error(
                &["preemption_check_interval"],
                "must be greater than 0 when preemption_check_command is set",
            );
        }
        if self.start_attempts == 0 {
            report.error(
                &["start_attempts"],
                "must be at least 1 (the job's first try)",
            );
        }
        if self.update_interval.is_zero() {
            report.error(&["update_interval"], "must be greater than 0");
        }
        if self.update_interval_when_expecting.is_zero() {
            report.error(
                &["update_interval_when_expecting"],
                "must be greater than 0",
            );
        }
        self.connector_config
            .validate(&mut report.section(&["connector_config"]));
        policy::validate(&self.policy, report);
        if self.scale_throttle.limit < -1 {
            report.error(
                &["scale_throttle", "limit"],
                "must be -1 (unlimited), 0 (default 100/s) or a positive rate",
            );
        }
        shape::validate(&self.shape, self.instance_acquire_timeout, report);
        let shape_prices: Vec<(usize, Option<&crate::PriceValue>)> = self
            .shape
            .iter()
            .enumerate()
            .map(|(j, s)| (j, s.price_per_hour.as_ref()))
            .collect();
        crate::price::validate(
            self.price_per_hour.as_ref(),
            &shape_prices,
            self.currency.as_deref(),
            report,
        );
    }

    /// A warning when the fleeting plugin is not on this machine where `slipway run` would
    /// look (`report` is at the section).
    pub(crate) fn check_plugin(&self, plugin_dir: Option<&Path>, report: &mut Report<'_>) {
        let reference = self.plugin.trim();
        if reference.is_empty()
            || slipway_fleeting::host::find_plugin(reference, plugin_dir).is_ok()
        {
            return;
        }
        let message = match slipway_fleeting::oci::Reference::parse(reference) {
            Some(r) if !reference.starts_with("./") => format!(
                "{reference:?} is not installed here (slipway looks where `gitlab-runner \
                 fleeting install` puts plugins, then for {}{} in --plugin-dir, next to \
                 slipway and on PATH)",
                slipway_fleeting::host::PLUGIN_PREFIX,
                r.name
            ),
            _ => format!("{reference:?} does not exist or is not executable on this machine"),
        };
        report.warning(&["plugin"], message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::parse;
    use crate::executor::Executor;
    use crate::testing::{GOOD, errors};

    /// Whether a runner with `executor` and `[runners.autoscaler]` runs its jobs on instances.
    fn on_instances(executor: Executor) -> bool {
        RunnerConfig {
            executor,
            autoscaler: Some(AutoscalerConfig::default()),
            ..RunnerConfig::default()
        }
        .on_instances()
    }

    #[test]
    fn reads_gitlab_style_config() {
        let loaded = parse(GOOD, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let r = &loaded.config.runners[0];
        let a = r.autoscaler.as_ref().expect("autoscaler");
        assert_eq!(a.capacity_per_instance, 2);
        assert_eq!(a.instance_acquire_timeout, Duration::from_secs(60));
        assert_eq!(a.policy[0].idle_time, Duration::from_secs(1200));
        assert_eq!(a.plugin_config["provisioning_delay"].as_str(), Some("1s"));
        assert!(
            !format!("{r:?}").contains("glrt-secret"),
            "token must not be printed"
        );
    }

    #[test]
    fn scaler_config_follows_gitlab_throttle_defaults() {
        let a = AutoscalerConfig {
            max_instances: 7,
            ..AutoscalerConfig::default()
        };
        let c = a.to_scaler_config(false);
        assert_eq!(c.scale_throttle.limit, Some(100.0));
        assert_eq!(c.scale_throttle.burst, 7);
        assert!(!c.delete_instances_on_shutdown);
        assert!(a.to_scaler_config(true).delete_instances_on_shutdown);
        let unlimited = AutoscalerConfig {
            scale_throttle: ScaleThrottleConfig {
                limit: -1,
                burst: 0,
            },
            ..AutoscalerConfig::default()
        };
        let c = unlimited.to_scaler_config(false);
        assert_eq!((c.scale_throttle.limit, c.scale_throttle.burst), (None, 1));
    }

    #[test]
    fn plugin_runners_with_an_autoscaler_run_on_instances() {
        assert!(on_instances(Executor::Plugin));
        assert!(on_instances(Executor::Instance));
        assert!(!on_instances(Executor::Shell));
        let e = errors(&GOOD.replace("executor = \"instance\"", "executor = \"shell\""));
        assert!(
            e.iter().any(|l| l.starts_with(
                "config.toml:8: runners[0].autoscaler: the shell executor runs jobs on this machine"
            )),
            "{e:?}"
        );
    }
}
