//! A runner's instance groups, one per `[[runners.autoscaler.shape]]` (or the section itself):
//! each its own fleeting plugin process, state store and taskscaler.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use slipway_config::{AutoscalerConfig, RunnerConfig};
use slipway_cost::Price;
use slipway_fleeting::{InstanceGroup as _, PluginHost, PluginOptions};
use slipway_taskscaler::metrics::{MetricFamilies, Metrics};
use slipway_taskscaler::store::{AsyncStateStore, StateStore, StoreIdentity};
use slipway_taskscaler::{Fallback, Options, Placement, Resources, Shape, Taskscaler};

use super::{GroupName, StartError, StartOptions};
use crate::runner::pool::{Checks, DockerExecs, Pool};
use crate::runner::subtrees::InstanceSubtrees;

/// One instance group of a runner as configured: the section itself, or one of its shapes.
pub(super) struct GroupPlan {
    pub(super) shape: String,
    auto: AutoscalerConfig,
    resources: Option<Resources>,
    cost: f64,
    /// What one instance costs per hour: the shape's `price_per_hour`, else the runner's.
    pub(super) price: Option<Price>,
    /// `spot = true`: shown as spot capacity.
    pub(super) spot: bool,
    /// The shape taking this one's new capacity while its provider has none, and when.
    pub(super) fallback: Option<(String, Fallback)>,
}

/// The section itself when it declares no shapes, else one plan per shape.
pub(super) fn group_plans(
    auto: &AutoscalerConfig,
    opts: &StartOptions,
) -> Result<Vec<GroupPlan>, StartError> {
    let with_defaults = |table: &toml::Table, suffix: Option<&str>| {
        let mut t = table.clone();
        for (k, v) in &opts.plugin_config_defaults {
            let v = match (suffix, k.as_str(), v) {
                (Some(sfx), "name", toml::Value::String(s)) => {
                    toml::Value::String(format!("{s}-{sfx}"))
                }
                (Some(sfx), "dir", toml::Value::String(s)) => {
                    toml::Value::String(Path::new(s).join(sfx).display().to_string())
                }
                _ => v.clone(),
            };
            t.entry(k.clone()).or_insert(v);
        }
        t
    };
    if auto.shape.is_empty() {
        let mut a = auto.clone();
        a.plugin_config = with_defaults(&auto.plugin_config, None);
        return Ok(vec![GroupPlan {
            shape: "default".into(),
            auto: a,
            resources: None,
            cost: 1.0,
            price: price_of(auto.price_per_hour.as_ref(), auto),
            spot: false,
            fallback: None,
        }]);
    }
    auto.shape
        .iter()
        .map(|shape| {
            let resources = shape
                .resources()
                .map_err(|(key, problem)| StartError::Shape {
                    shape: shape.name.clone(),
                    key,
                    problem,
                })?;
            let mut a = auto.clone();
            a.shape.clear();
            let mut table = auto.plugin_config.clone();
            for (k, v) in &shape.plugin_config {
                table.insert(k.clone(), v.clone());
            }
            a.plugin_config = with_defaults(&table, Some(&shape.name));
            if let Some(v) = shape.capacity_per_instance {
                a.capacity_per_instance = v;
            }
            if let Some(v) = shape.max_instances {
                a.max_instances = v;
            }
            if let Some(v) = shape.max_use_count {
                a.max_use_count = v;
            }
            Ok(GroupPlan {
                shape: shape.name.clone(),
                auto: a,
                resources: Some(resources),
                // Placement picks the cheapest shape that fits: by the relative `cost` where
                // given, else by the price.
                cost: shape
                    .cost
                    .or_else(|| {
                        let price = shape.price_per_hour.as_ref()?;
                        price
                            .price(auto.currency.as_deref())
                            .ok()
                            .map(|p| p.per_hour)
                    })
                    .unwrap_or(1.0),
                price: price_of(
                    shape
                        .price_per_hour
                        .as_ref()
                        .or(auto.price_per_hour.as_ref()),
                    auto,
                ),
                spot: shape.spot,
                fallback: shape.fallback.as_ref().and_then(|to| {
                    let index = auto.shape.iter().position(|s| s.name == *to)?;
                    Some((
                        to.clone(),
                        Fallback {
                            to: index,
                            after: shape.fallback_after,
                            return_after: shape.return_after,
                        },
                    ))
                }),
            })
        })
        .collect()
}

/// A price as written, in the runner's `currency` (verify-config reported a bad one).
fn price_of(value: Option<&slipway_config::PriceValue>, auto: &AutoscalerConfig) -> Option<Price> {
    value?.price(auto.currency.as_deref()).ok()
}

/// Place over `shapes` (started from `plans`, in order) with each plan's fallback.
pub(super) fn placement_of(plans: &[GroupPlan], shapes: Vec<Shape>) -> Placement {
    plans
        .iter()
        .enumerate()
        .fold(Placement::new(shapes), |p, (i, plan)| {
            let p = if plan.spot { p.with_spot(i) } else { p };
            match &plan.fallback {
                Some((_, rule)) => p.with_fallback(i, *rule),
                None => p,
            }
        })
}

/// Start one group's plugin and taskscaler; stops the plugin again when the rest fails.
#[allow(clippy::too_many_arguments)]
pub(super) async fn start_group(
    cfg: &RunnerConfig,
    plan: &GroupPlan,
    several: bool,
    opts: &StartOptions,
    pool: &Arc<Pool>,
    docker_execs: &DockerExecs,
    subtrees: Option<&Arc<InstanceSubtrees>>,
    families: &Arc<MetricFamilies>,
) -> Result<(Arc<PluginHost>, Taskscaler), StartError> {
    let auto = &plan.auto;
    let group = GroupName {
        runner: cfg.name.clone(),
        shape: several.then(|| plan.shape.clone()),
    };
    // OCI references find what `gitlab-runner fleeting install` put on this machine, else
    // `fleeting-plugin-<name>`.
    let path = slipway_fleeting::host::find_plugin(&auto.plugin, opts.plugin_dir.as_deref())
        .map_err(|cause| StartError::FindPlugin {
            group: group.clone(),
            cause: Box::new(cause),
        })?;
    let plugin_json =
        serde_json::to_vec(&auto.plugin_config).map_err(StartError::PluginConfigJson)?;
    let connector = auto.connector_config.to_connector_config().await?;
    let mut popts = PluginOptions::new(plugin_name(&auto.plugin), path);
    if let Some(t) = opts.handshake_timeout {
        popts.process.handshake_timeout = t;
    }
    let plugin = PluginHost::start(popts)
        .await
        .map_err(|cause| StartError::StartPlugin {
            group: group.clone(),
            cause: Box::new(cause),
        })?;
    let plugin = Arc::new(plugin);
    let info = match plugin.init(&plugin_json, &connector).await {
        Ok(info) => info,
        Err(e) => {
            plugin.stop().await;
            return Err(StartError::PluginInit {
                group,
                plugin: auto.plugin.clone(),
                cause: e,
            });
        }
    };
    tracing::info!(runner = %cfg.name, shape = %plan.shape, group = %info.id, version = %info.version, "plugin ready");
    let checks = Arc::new(Checks {
        pool: pool.clone(),
        group: plugin.clone(),
        ready_command: (!auto.instance_ready_command.trim().is_empty())
            .then(|| auto.instance_ready_command.clone()),
        preemption_command: (!auto.preemption_check_command.trim().is_empty())
            .then(|| auto.preemption_check_command.clone()),
        alive: std::sync::Mutex::new(std::collections::HashMap::new()),
        docker_execs: docker_execs.clone(),
        subtrees: subtrees.cloned(),
    });
    let store_key = several.then_some(plan.shape.as_str());
    let store = match open_store(cfg, auto, &info, opts, store_key).await {
        Ok(store) => store,
        Err(e) => {
            plugin.stop().await;
            return Err(e);
        }
    };
    let mut scfg = auto.to_scaler_config(opts.delete_instances_on_shutdown);
    scfg.instance_resources = plan.resources;
    scfg.instance_cost = plan.cost;
    let metrics = Metrics::new(
        families.clone(),
        vec![
            ("runner".into(), cfg.name.clone()),
            ("shape".into(), plan.shape.clone()),
            ("group".into(), info.id.clone()),
        ],
    );
    match Taskscaler::start_with(
        plugin.clone(),
        info,
        scfg,
        Options {
            hooks: Some(checks),
            store,
            keep_instance_with_acquisitions: auto.state_storage.keep_instance_with_acquisitions,
            metrics: Some(metrics),
            ..Options::default()
        },
    ) {
        Ok(s) => Ok((plugin, s)),
        Err(e) => {
            plugin.stop().await;
            Err(StartError::Taskscaler { group, cause: e })
        }
    }
}

/// `plugin_config` defaults for `fleeting-plugin-local` that keep a run's instances to itself:
/// state under `dir`, and a group name unique to this process (instance and namespace names
/// derive from it, so parallel runs never collide).
pub fn run_scoped_plugin_config(dir: &Path, prefix: &str) -> toml::Table {
    let mut t = toml::Table::new();
    t.insert(
        "dir".into(),
        toml::Value::String(dir.join("plugin").display().to_string()),
    );
    t.insert(
        "name".into(),
        toml::Value::String(format!("{prefix}{}", std::process::id())),
    );
    t
}

/// A plugin reference's short name: `fleeting-plugin-local` and `/x/fleeting-plugin-local` → `local`.
pub fn plugin_name(reference: &str) -> String {
    let base = Path::new(reference)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| reference.to_string());
    ["fleeting-plugin-", slipway_executor_plugin::PLUGIN_PREFIX]
        .iter()
        .find_map(|p| base.strip_prefix(p))
        .unwrap_or(&base)
        .to_string()
}

/// Open the runner's state store (on by default), refusing a foreign or corrupt file.
async fn open_store(
    cfg: &RunnerConfig,
    auto: &AutoscalerConfig,
    info: &slipway_fleeting::ProviderInfo,
    opts: &StartOptions,
    shape: Option<&str>,
) -> Result<Option<AsyncStateStore>, StartError> {
    let st = &auto.state_storage;
    if !st.enabled {
        return Ok(None);
    }
    let dir = match (&st.dir, &opts.state_dir) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(d)) => d.clone(),
        (None, None) => PathBuf::from(".slipway-state"),
    };
    // The store belongs to one runner and one instance group: keyed like GitLab's scalers.
    let mut runner = if cfg.url.is_empty() {
        cfg.name.clone()
    } else {
        format!("{}|{}", cfg.url, cfg.name)
    };
    if let Some(shape) = shape {
        runner = format!("{runner}|{shape}");
    }
    let identity = StoreIdentity {
        runner: runner.clone(),
        plugin: plugin_name(&auto.plugin),
        group_id: info.id.clone(),
    };
    let path = StateStore::default_path(&dir, &runner);
    let store = AsyncStateStore::open(&path, &identity)
        .await
        .map_err(|cause| StartError::StateStorage {
            runner: cfg.name.clone(),
            cause,
        })?;
    tracing::info!(runner = %cfg.name, path = %path.display(), "state store open");
    Ok(Some(store))
}

/// Undo a start that failed half-way: the taskscalers and plugins started so far.
pub(super) async fn stop_started(shapes: &[Shape], plugins: &[Arc<PluginHost>]) {
    for s in shapes {
        s.scaler.shutdown().await;
    }
    for p in plugins {
        p.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(text: &str) -> AutoscalerConfig {
        let full = format!(
            "[[runners]]\n  name = \"r\"\n  executor = \"instance\"\n  [runners.autoscaler]\n    plugin = \"local\"\n{text}"
        );
        let loaded = slipway_config::parse(&full, "config.toml").expect("valid");
        loaded.config.runners[0]
            .autoscaler
            .clone()
            .expect("autoscaler")
    }

    #[test]
    fn shapes_are_placed_by_price_unless_a_relative_cost_is_given() {
        let a = auto(
            r#"    currency = "EUR"
    [[runners.autoscaler.shape]]
      name = "spot"
      cpu = 4
      price_per_hour = 0.05
    [[runners.autoscaler.shape]]
      name = "on-demand"
      cpu = 4
      price_per_hour = "0.17 EUR"
    [[runners.autoscaler.shape]]
      name = "own"
      cpu = 4
      price_per_hour = 0.5
      cost = 0.01
    [[runners.autoscaler.shape]]
      name = "unpriced"
      cpu = 4
"#,
        );
        let plans = group_plans(&a, &StartOptions::default()).expect("plans");
        let costs: Vec<(&str, f64)> = plans.iter().map(|p| (p.shape.as_str(), p.cost)).collect();
        assert_eq!(
            costs,
            vec![
                ("spot", 0.05),
                ("on-demand", 0.17),
                ("own", 0.01),
                ("unpriced", 1.0)
            ]
        );
    }
}
