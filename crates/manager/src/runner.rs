//! One `[[runners]]` entry brought to life: its plugin process, taskscaler and SSH connections.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use slipway_config::ConnectorConfigError;
use slipway_connector::{Client, DialOptions};
use slipway_fleeting::{GroupError, InstanceGroup as _, PluginHost, PluginOptions};
use slipway_goplugin::HostError;
use slipway_taskscaler::metrics::{MetricFamilies, Metrics};
use slipway_taskscaler::store::{AsyncStateStore, StateStore, StoreError, StoreIdentity};
use slipway_taskscaler::{
    Acquisition, Error as TsError, Options, Placement, Policy, Resources, Shape, Stats, Taskscaler,
};

use slipway_executor::cgroup::SlotCgroups;
use slipway_executor::docker::{DockerConfig, DockerExecutor, DockerExecutorError};
use slipway_executor::{CustomConfig, IsolationPolicy, NestingConfig};

use crate::lifecycle::JobDefaults;
use crate::localhost::LocalGroup;
use slipway_executor_plugin::ExecutorHost;
use slipway_status::{JobBoard, JobMetrics};

use crate::pool::{Checks, DockerExecs, Pool, PoolError};
use slipway_config::{AutoscalerConfig, Executor, ExecutorPluginConfig, RunnerConfig};

/// A started runner.
#[derive(Debug)]
pub struct Runner {
    /// Runner name from the config.
    pub name: String,
    /// Builds root on instances.
    pub builds_dir: String,
    /// Cache root where jobs run (`cache_dir`; `cache` under `$HOME` by default).
    pub cache_dir: String,
    /// Cache root inside job containers (`cache_dir`; `/cache` by default, as GitLab's docker
    /// executor: kept across jobs when `[runners.docker] volumes` mounts a volume there).
    pub container_cache_dir: String,
    /// Isolation levels jobs may ask for, and the default.
    pub isolation: IsolationPolicy,
    /// Slot cgroups of the `cgroup` level.
    pub cgroups: SlotCgroups,
    /// Executor (`instance`, `docker-autoscaler`, `shell`, `docker`, `custom`, `plugin`).
    pub executor: Executor,
    /// Jobs run on this machine (shell, docker, custom), not on autoscaled instances.
    pub local: bool,
    /// `[runners.docker]`.
    pub docker: DockerConfig,
    /// `[runners.custom]`.
    pub custom: Option<CustomConfig>,
    /// `[runners.autoscaler.vm_isolation]` for the `microvm` and `vm` levels.
    pub nesting: Option<NestingConfig>,
    /// The executor plugin of a `plugin` runner, started and initialized.
    pub executor_plugin: Option<ExecutorPlugin>,
    /// Its instance groups (one per shape) and where each job goes.
    pub placement: Placement,
    /// Its jobs as they wait, run and end (the status page and job metrics).
    pub board: Arc<JobBoard>,
    /// What config.toml adds to each of its jobs (`environment`, `pre_build_script`,
    /// `post_build_script`), whatever their source.
    pub defaults: JobDefaults,
    /// One plugin process per shape, in the placement's order.
    plugins: Vec<Arc<PluginHost>>,
    /// One SSH connection per instance, shared by the jobs on its slots and health checks.
    pool: Arc<Pool>,
    /// Docker executors by instance (`localhost` for the local engine), kept so each slot's
    /// network stays warm across jobs; their networks are removed when their instance is
    /// removed, and at shutdown.
    docker_execs: DockerExecs,
}

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

/// Extra settings a command passes when starting a runner.
#[derive(Debug, Default, Clone)]
pub struct StartOptions {
    /// Where to look for plugins first.
    pub plugin_dir: Option<PathBuf>,
    /// Keys merged into `plugin_config` (a per-run state dir, say) unless the config sets them.
    /// With several shapes, string values of `name` and `dir` get the shape's name appended,
    /// so the groups stay apart.
    pub plugin_config_defaults: toml::Table,
    /// Handshake timeout.
    pub handshake_timeout: Option<Duration>,
    /// Delete every instance at shutdown whatever the config says (a run that owns its
    /// plugin's state must not leave instances nobody can find again).
    pub delete_instances_on_shutdown: bool,
    /// `state_storage.dir` when the config names none (`run`: beside config.toml).
    pub state_dir: Option<PathBuf>,
    /// Metric families shared by every runner of the process (default: the runner's own).
    pub metrics: Option<Arc<MetricFamilies>>,
    /// Job metric families shared by every runner of the process (default: the runner's own).
    pub job_metrics: Option<JobMetrics>,
    /// Jobs at once on a runner without a `limit` (its slots when jobs run on this machine).
    pub concurrent: u32,
}

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

/// One instance group of a runner as configured: the section itself, or one of its shapes.
struct GroupPlan {
    shape: String,
    auto: AutoscalerConfig,
    resources: Option<Resources>,
    cost: f64,
}

impl Runner {
    /// Start every shape's plugin, `Init` it and start its taskscaler. Nothing is left
    /// running when one of them fails.
    pub async fn start(cfg: &RunnerConfig, opts: &StartOptions) -> Result<Runner, StartError> {
        let isolation = cfg
            .isolation_policy()
            .map_err(|(key, problem)| StartError::Setting {
                runner: cfg.name.clone(),
                key,
                problem,
            })?;
        let cgroups = cfg.slot_cgroups().map_err(|problem| StartError::Setting {
            runner: cfg.name.clone(),
            key: "slot_cgroup_template",
            problem,
        })?;
        let docker = cfg.docker.clone().unwrap_or_default();
        if !cfg.on_instances() {
            let executor_plugin = start_plugin_of(cfg, opts).await?;
            return match start_local(cfg, opts, isolation, cgroups, docker) {
                Ok(mut runner) => {
                    runner.executor_plugin = executor_plugin;
                    Ok(runner)
                }
                Err(e) => {
                    if let Some(p) = executor_plugin {
                        p.host.stop().await;
                    }
                    Err(e)
                }
            };
        }
        let Some(auto) = &cfg.autoscaler else {
            return Err(StartError::NoAutoscaler {
                runner: cfg.name.clone(),
            });
        };
        let plans = group_plans(auto, opts)?;
        let pool = Arc::new(Pool::new(DialOptions {
            use_external_addr: auto.connector_config.use_external_addr,
        }));
        let families = opts.metrics.clone().unwrap_or_default();
        let docker_execs = DockerExecs::default();
        let mut plugins = Vec::new();
        let mut shapes = Vec::new();
        for plan in &plans {
            match start_group(
                cfg,
                plan,
                plans.len() > 1,
                opts,
                &pool,
                &docker_execs,
                &families,
            )
            .await
            {
                Ok((plugin, scaler)) => {
                    plugins.push(plugin);
                    shapes.push(Shape {
                        name: plan.shape.clone(),
                        scaler,
                    });
                }
                Err(e) => {
                    stop_started(&shapes, &plugins).await;
                    return Err(e);
                }
            }
        }
        let executor_plugin = match start_plugin_of(cfg, opts).await {
            Ok(p) => p,
            Err(e) => {
                stop_started(&shapes, &plugins).await;
                return Err(e);
            }
        };
        Ok(Runner {
            name: cfg.name.clone(),
            builds_dir: cfg.builds_dir.clone().unwrap_or_else(|| "builds".into()),
            cache_dir: cache_dir_of(cfg, "cache"),
            container_cache_dir: cache_dir_of(cfg, "/cache"),
            isolation,
            cgroups,
            executor: cfg.executor.clone(),
            local: false,
            docker,
            custom: cfg.custom.clone(),
            nesting: cfg.nesting_config(),
            executor_plugin,
            placement: Placement::new(shapes),
            board: board_of(cfg, opts),
            defaults: JobDefaults::of(cfg),
            plugins,
            pool,
            docker_execs,
        })
    }

    /// Reserve capacity for a job asking for `request` on the shape that fits it.
    pub fn reserve(&self, key: &str, request: &Resources) -> Result<(), TsError> {
        self.placement.reserve(key, request)
    }

    /// Reserve, waiting while the chosen shape has no capacity to reserve.
    pub async fn reserve_wait(&self, key: &str, request: &Resources) -> Result<(), TsError> {
        self.placement.reserve_wait(key, request).await
    }

    /// Reserve a whole fresh instance for a job at the `instance` isolation level.
    pub fn reserve_instance(&self, key: &str, request: &Resources) -> Result<(), TsError> {
        self.placement.reserve_instance(key, request)
    }

    /// [`Runner::reserve_instance`], waiting while the chosen shape has no capacity.
    pub async fn reserve_wait_instance(
        &self,
        key: &str,
        request: &Resources,
    ) -> Result<(), TsError> {
        self.placement.reserve_wait_instance(key, request).await
    }

    /// Bind a reservation to a slot.
    pub async fn acquire(&self, key: &str) -> Result<Acquisition, TsError> {
        self.placement.acquire(key).await
    }

    /// Free a reservation or acquisition.
    pub fn release(&self, key: &str) {
        self.placement.release(key);
    }

    /// Give back a reservation no job arrived for.
    pub fn unreserve(&self, key: &str) {
        self.placement.unreserve(key);
    }

    /// Counts over every shape.
    pub fn stats(&self) -> Stats {
        let mut total = Stats::default();
        for s in self.placement.shapes() {
            let st = s.scaler.stats();
            total.instances += st.instances;
            total.running += st.running;
            total.pending += st.pending;
            total.acquired += st.acquired;
            total.created += st.created;
            total.removed += st.removed;
        }
        total
    }

    /// Replace every shape's policies (config.toml reloaded).
    pub fn set_policies(&self, policies: &[Policy]) -> Result<(), TsError> {
        for s in self.placement.shapes() {
            s.scaler.set_policies(policies)?;
        }
        Ok(())
    }

    /// An SSH connection to the acquisition's instance, reused across jobs.
    pub async fn client(&self, acq: &Acquisition) -> Result<Arc<Client>, PoolError> {
        self.pool.client(&acq.connect_info).await
    }

    /// The snapshots the nesting daemon on instance `id` holds (runners with VM isolation).
    pub async fn nesting_snapshots(
        &self,
        id: &str,
        info: &slipway_fleeting::ConnectInfo,
    ) -> Result<Vec<slipway_nesting::proto::Snapshot>, SnapshotsError> {
        let Some(config) = self.nesting.clone() else {
            return Err(SnapshotsError::NoVmIsolation {
                runner: self.name.clone(),
            });
        };
        let client = self.pool.client(info).await?;
        let exec = slipway_executor::NestingExecutor {
            client,
            instance: id.to_string(),
            config,
            level: slipway_executor::Isolation::Microvm,
        };
        let mut nesting = exec.nesting().await.map_err(SnapshotsError::Nesting)?;
        Ok(nesting.list_snapshots().await?)
    }

    /// The Docker executor for jobs on `instance` (`None`: this machine's engine), made on first
    /// use: it sweeps slot networks a crashed run of this runner left on that engine.
    pub async fn docker_executor(
        &self,
        instance: Option<(&str, Arc<Client>)>,
    ) -> Result<DockerExecutor, DockerExecutorError> {
        let key = instance
            .as_ref()
            .map_or(crate::localhost::ID, |(id, _)| *id);
        let mut cache = self.docker_execs.lock().await;
        if let Some(e) = cache.get(key) {
            return Ok(e.clone());
        }
        let mut exec = match &instance {
            None => DockerExecutor::connect_local(self.docker.clone()).await?,
            Some((_, client)) => {
                DockerExecutor::connect_ssh(client.clone(), self.docker.clone()).await?
            }
        };
        exec.runner_name = self.name.clone();
        exec.cache_dir = Some(self.container_cache_dir.clone());
        match DockerExecutor::sweep_job_leftovers(exec.docker(), &self.name, false).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(runner = %self.name, engine = key, removed = n,
                "removed containers and volumes an earlier run's jobs left"),
            Err(e) => {
                tracing::warn!(runner = %self.name, engine = key, "sweeping an earlier run's containers: {e}")
            }
        }
        if let Err(e) = DockerExecutor::sweep_slot_networks(exec.docker(), &self.name, false).await
        {
            tracing::warn!(runner = %self.name, engine = key, "sweeping old slot networks: {e}");
        }
        cache.insert(key.to_string(), exec.clone());
        Ok(exec)
    }

    /// Close connections, stop the taskscalers (deleting instances when configured), stop the
    /// plugins.
    pub async fn shutdown(&self) {
        let execs: Vec<(String, DockerExecutor)> = self.docker_execs.lock().await.drain().collect();
        for (engine, exec) in execs {
            // Every job has ended: what a job whose cleanup failed (its instance's connection
            // lost, say) left on a still reachable engine goes now.
            if let Err(e) =
                DockerExecutor::sweep_job_leftovers(exec.docker(), &self.name, true).await
            {
                tracing::warn!(runner = %self.name, engine = %engine, "removing jobs' leftovers: {e}");
            }
            // Slot networks of executors whose instance is gone, on an engine they shared
            // with this one (the local plugin's instances share this host's).
            if let Err(e) =
                DockerExecutor::sweep_slot_networks(exec.docker(), &self.name, true).await
            {
                tracing::warn!(runner = %self.name, engine = %engine, "removing old slot networks: {e}");
            }
            if let Err(e) = exec.shutdown().await {
                tracing::warn!(runner = %self.name, engine = %engine, "removing slot networks: {e}");
            }
        }
        self.pool.close_all().await;
        self.placement.shutdown().await;
        for p in &self.plugins {
            p.stop().await;
        }
        if let Some(p) = &self.executor_plugin {
            p.host.stop().await;
        }
    }
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
async fn start_plugin_of(
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

/// The runner's job board, writing the process's job metrics.
fn board_of(cfg: &RunnerConfig, opts: &StartOptions) -> Arc<JobBoard> {
    Arc::new(JobBoard::new(
        &cfg.name,
        opts.job_metrics.clone().unwrap_or_default(),
    ))
}

/// Undo a start that failed half-way: the taskscalers and plugins started so far.
async fn stop_started(shapes: &[Shape], plugins: &[Arc<PluginHost>]) {
    for s in shapes {
        s.scaler.shutdown().await;
    }
    for p in plugins {
        p.stop().await;
    }
}

/// A runner whose jobs run on this machine: its slots come from a taskscaler over
/// [`LocalGroup`], an instance group of one that is this machine.
fn start_local(
    cfg: &RunnerConfig,
    opts: &StartOptions,
    isolation: IsolationPolicy,
    cgroups: SlotCgroups,
    docker: DockerConfig,
) -> Result<Runner, StartError> {
    let slots = if cfg.limit > 0 {
        cfg.limit
    } else {
        opts.concurrent.max(1)
    };
    let scfg = slipway_taskscaler::Config {
        capacity_per_instance: slots,
        max_instances: 1,
        policies: vec![Policy {
            idle_time: Duration::from_secs(3600),
            ..Policy::default()
        }],
        update_interval: Duration::from_secs(5),
        update_interval_when_expecting: Duration::from_millis(20),
        shutdown_deletion_interval: Duration::from_millis(100),
        ..slipway_taskscaler::Config::default()
    };
    let families = opts.metrics.clone().unwrap_or_default();
    let metrics = Metrics::new(
        families,
        vec![
            ("runner".into(), cfg.name.clone()),
            ("shape".into(), "default".into()),
            ("group".into(), crate::localhost::ID.into()),
        ],
    );
    let scaler = Taskscaler::start_with(
        Arc::new(LocalGroup::default()),
        crate::localhost::provider(),
        scfg,
        Options {
            metrics: Some(metrics),
            ..Options::default()
        },
    )
    .map_err(|cause| StartError::Slots {
        runner: cfg.name.clone(),
        cause,
    })?;
    let builds_dir = cfg.builds_dir.clone().unwrap_or_else(|| {
        let base = opts
            .state_dir
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(std::env::temp_dir);
        base.join("builds").display().to_string()
    });
    let local_default = Path::new(&builds_dir)
        .parent()
        .map(|p| p.join("cache").display().to_string())
        .unwrap_or_else(|| "cache".into());
    Ok(Runner {
        name: cfg.name.clone(),
        builds_dir,
        cache_dir: cache_dir_of(cfg, &local_default),
        container_cache_dir: cache_dir_of(cfg, "/cache"),
        isolation,
        cgroups,
        executor: cfg.executor.clone(),
        local: true,
        docker,
        custom: cfg.custom.clone(),
        nesting: None,
        executor_plugin: None,
        placement: Placement::new(vec![Shape {
            name: "default".into(),
            scaler,
        }]),
        board: board_of(cfg, opts),
        defaults: JobDefaults::of(cfg),
        plugins: Vec::new(),
        pool: Arc::new(Pool::new(DialOptions::default())),
        docker_execs: DockerExecs::default(),
    })
}

/// The section itself when it declares no shapes, else one plan per shape.
fn group_plans(auto: &AutoscalerConfig, opts: &StartOptions) -> Result<Vec<GroupPlan>, StartError> {
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
                cost: shape.cost.unwrap_or(1.0),
            })
        })
        .collect()
}

/// Start one group's plugin and taskscaler; stops the plugin again when the rest fails.
async fn start_group(
    cfg: &RunnerConfig,
    plan: &GroupPlan,
    several: bool,
    opts: &StartOptions,
    pool: &Arc<Pool>,
    docker_execs: &DockerExecs,
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
        alive: std::sync::Mutex::new(std::collections::HashMap::new()),
        docker_execs: docker_execs.clone(),
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

/// The runner's cache root: `cache_dir` (else `default`), under `[runners.cache] Path` when
/// that is set (GitLab's prefix for the cache of one runner).
fn cache_dir_of(cfg: &RunnerConfig, default: &str) -> String {
    let base = cfg
        .cache_dir
        .clone()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| default.to_string());
    match cfg.cache.as_ref().map(|c| c.path.trim_matches('/')) {
        Some(p) if !p.is_empty() => format!("{}/{p}", base.trim_end_matches('/')),
        _ => base,
    }
}
