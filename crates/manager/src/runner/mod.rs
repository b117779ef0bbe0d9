//! One `[[runners]]` entry brought to life: its plugin process, taskscaler and SSH connections.
//!
//! - `error`: why it did not start ([`StartError`]), and the errors' names for its groups.
//! - `group`: its instance groups (one per shape), each a fleeting plugin and a taskscaler.
//! - `local`: a runner whose jobs run on this machine, its slots one local taskscaler.
//! - `plugin`: a `plugin` runner's executor plugin, started and its levels checked.

pub mod cache;
mod defaults;
mod error;
pub mod executors;
mod group;
mod local;
pub mod localhost;
mod plugin;
pub mod pool;
pub mod preemption;
pub mod subtrees;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slipway_config::{Executor, RunnerConfig};
use slipway_connector::{Client, DialOptions};
use slipway_executor::cgroup::SlotCgroups;
use slipway_executor::docker::{DockerConfig, DockerExecutor, DockerExecutorError, Sweep};
use slipway_executor::{CustomConfig, Isolation, IsolationPolicy, NestingConfig};
use slipway_fleeting::PluginHost;
use slipway_status::{JobBoard, JobMetrics};
use slipway_taskscaler::metrics::MetricFamilies;
use slipway_taskscaler::{
    Acquisition, Error as TsError, Placement, Policy, Resources, Shape, Stats,
};
use tokio_util::sync::CancellationToken;

use crate::costs::{CostBook, ShapeTerms};
use crate::runner::pool::{DockerExecs, Pool, PoolError};
use crate::runner::subtrees::InstanceSubtrees;

pub use defaults::JobDefaults;
pub use error::{GroupName, SnapshotsError, StartError};
pub use executors::{Admission, BuiltinExecutors, ExecutorProvider, Place};
pub use group::{plugin_name, run_scoped_plugin_config};
pub use plugin::{ExecutorPlugin, check_plugin_levels, start_executor_plugin_with};

use group::{group_plans, placement_of, start_group, stop_started};
use local::start_local;
use plugin::start_plugin_of;

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
    /// Each instance's cgroup subtree, when its instances share this host (the local
    /// plugin's): removed with the instance.
    pub subtrees: Option<Arc<InstanceSubtrees>>,
    /// Executor (`instance`, `docker-autoscaler`, `shell`, `docker`, `custom`, `plugin`).
    pub executor: Executor,
    /// The distributed cache (`[runners.cache]` with S3), restored and saved around every
    /// job's steps whatever its source; `None`: jobs use the local cache.
    pub cache: Option<Arc<cache::DistributedCache>>,
    /// What hands out each job's executor: resolved once from `executor`.
    pub executors: Arc<dyn ExecutorProvider>,
    /// Jobs run on this machine (shell, docker, custom), not on autoscaled instances.
    pub local: bool,
    /// Jobs may choose their directory with `GIT_CLONE_PATH` (`[runners.custom_build_dir]`).
    pub custom_build_dir: bool,
    /// Where jobs' sources are fetched (`fetch_sources`).
    pub fetch_sources: slipway_config::FetchSources,
    /// Where jobs' dependencies, caches and artifacts are moved (`job_data`).
    pub job_data: slipway_config::JobData,
    /// The job helper that moves them where jobs run (`None`: this binary has none beside it).
    pub helper: Option<slipway_executor::Helper>,
    /// `[runners.docker]`.
    pub docker: DockerConfig,
    /// `[runners.custom]`.
    pub custom: Option<CustomConfig>,
    /// `[runners.autoscaler.vm_isolation]` for the `microvm` and `vm` levels.
    pub nesting: Option<NestingConfig>,
    /// Instances a job is tried on when each fails before its script starts
    /// (`start_attempts`).
    pub start_attempts: u32,
    /// The executor plugin of a `plugin` runner, started and initialized.
    pub executor_plugin: Option<ExecutorPlugin>,
    /// Its instance groups (one per shape) and where each job goes.
    pub placement: Placement,
    /// Its jobs as they wait, run and end (the status page and job metrics).
    pub board: Arc<JobBoard>,
    /// What config.toml adds to each of its jobs (`environment`, `pre_build_script`,
    /// `post_build_script`), whatever their source.
    pub defaults: JobDefaults,
    /// Where jobs' sources, artifacts and caches wait on this machine's disk on their way
    /// (`<state dir>/tmp`; the system's temporary directory without a state dir).
    pub scratch_dir: Option<PathBuf>,
    /// How far an archive a job sent may expand on this machine (`[runners.archives]`).
    pub archive_limits: slipway_artifacts::Limits,
    /// What its instances cost and what its jobs used of them (runners on instances).
    pub costs: Option<Arc<CostBook>>,
    /// The task keeping `costs` in step with the instances, stopped at shutdown.
    cost_sync: std::sync::Mutex<Option<(CancellationToken, tokio::task::JoinHandle<()>)>>,
    /// One plugin process per shape, in the placement's order.
    plugins: Vec<Arc<PluginHost>>,
    /// One SSH connection per instance, shared by the jobs on its slots and health checks.
    pool: Arc<Pool>,
    /// Docker executors by instance (`localhost` for the local engine), kept so each slot's
    /// network stays warm across jobs; their networks are removed when their instance is
    /// removed, and at shutdown.
    docker_execs: DockerExecs,
}

/// Extra settings a command passes when starting a runner.
#[derive(Debug, Default, Clone)]
pub struct StartOptions {
    /// Where to look for plugins first.
    pub plugin_dir: Option<PathBuf>,
    /// The job helper, copied to where jobs run to move their data (`None`: jobs of runners
    /// with `job_data = "instance"` that need it fail, saying so).
    pub helper: Option<slipway_executor::Helper>,
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
    /// Where a runner on this machine (shell, docker, custom) keeps `builds/` and `cache/` when
    /// the config names none (`run`: the config's `state_dir`, else beside config.toml);
    /// unset: beside `state_dir`.
    pub work_dir: Option<PathBuf>,
    /// Metric families shared by every runner of the process (default: the runner's own).
    pub metrics: Option<Arc<MetricFamilies>>,
    /// Job metric families shared by every runner of the process (default: the runner's own).
    pub job_metrics: Option<JobMetrics>,
    /// Jobs at once on a runner without a `limit` (its slots when jobs run on this machine).
    pub concurrent: u32,
}

/// The runner's distributed cache: objects under its token's short form (GitLab Runner's
/// names), or under its name when it has no token (a queue's runner).
pub(crate) fn distributed_cache_of(
    cfg: &RunnerConfig,
    opts: &StartOptions,
) -> Option<Arc<cache::DistributedCache>> {
    let short = match cfg.token.trim() {
        "" => cfg.name.clone(),
        token => slipway_gitlab::Secret::new(token).short(),
    };
    cache::DistributedCache::new(
        cfg.cache.as_ref(),
        &short,
        scratch_dir_of(opts),
        cfg.archives.limits(),
    )
    .map(Arc::new)
}

/// `<state dir>/tmp` (see [`Runner::scratch_dir`]).
pub(crate) fn scratch_dir_of(opts: &StartOptions) -> Option<PathBuf> {
    opts.state_dir.as_ref().map(|d| d.join("tmp"))
}

/// Creates the scratch directory, private (it holds jobs' sources), and empties what a killed
/// manager left there. Once per manager, before any job. The returned lock (on `<dir>.lock`)
/// is held for the manager's life: a second manager on the same state directory finds it
/// taken and leaves the first one's files alone.
pub async fn prepare_scratch(dir: &std::path::Path) -> std::io::Result<Option<std::fs::File>> {
    let dir = dir.to_path_buf();
    // File system work and a file lock: off the runtime's threads.
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::DirBuilderExt as _;
        let private = |d: &std::path::Path| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
        };
        if let Some(parent) = dir.parent() {
            private(parent)?;
        }
        use std::os::unix::fs::OpenOptionsExt as _;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.with_extension("lock"))?;
        let owned = match lock.try_lock() {
            Ok(()) => {
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
                Some(lock)
            }
            Err(std::fs::TryLockError::WouldBlock) => None,
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        };
        private(&dir)?;
        Ok(owned)
    })
    .await
    .map_err(std::io::Error::other)?
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
        let cgroups = crate::runner::subtrees::slot_cgroups_of(cfg).map_err(|problem| {
            StartError::Setting {
                runner: cfg.name.clone(),
                key: "slot_cgroup_template",
                problem,
            }
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
        let subtrees = InstanceSubtrees::of(cfg, &cgroups).map(Arc::new);
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
                subtrees.as_ref(),
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
        let costs = Arc::new(CostBook::new(
            &cfg.name,
            plans
                .iter()
                .zip(&shapes)
                .map(|(plan, shape)| ShapeTerms {
                    shape: plan.shape.clone(),
                    price: plan.price.clone(),
                    capacity: shape.scaler.config().capacity_per_instance,
                    offer: shape.scaler.config().instance_resources,
                })
                .collect(),
            auto.billing_minimum,
            opts.job_metrics.clone().unwrap_or_default(),
        ));
        Ok(Runner {
            scratch_dir: scratch_dir_of(opts),
            archive_limits: cfg.archives.limits(),
            name: cfg.name.clone(),
            builds_dir: cfg.builds_dir.clone().unwrap_or_else(|| "builds".into()),
            cache_dir: cache_dir_of(cfg, "cache"),
            container_cache_dir: cache_dir_of(cfg, "/cache"),
            isolation,
            cgroups,
            subtrees,
            executor: cfg.executor.clone(),
            executors: Arc::new(BuiltinExecutors::of(&cfg.executor)),
            cache: distributed_cache_of(cfg, opts),
            local: false,
            custom_build_dir: cfg.custom_build_dir(),
            fetch_sources: cfg.fetch_sources,
            job_data: cfg.job_data,
            helper: opts.helper.clone(),
            docker,
            custom: cfg.custom.clone(),
            nesting: cfg.nesting_config(),
            start_attempts: auto.start_attempts.max(1),
            executor_plugin,
            placement: placement_of(&plans, shapes),
            board: board_of(cfg, opts),
            defaults: JobDefaults::of(cfg),
            costs: Some(costs),
            cost_sync: std::sync::Mutex::new(None),
            plugins,
            pool,
            docker_execs,
        })
    }

    /// Start the task that bills the instances as the taskscalers list them (a runner with
    /// prices only); [`Runner::shutdown`] stops it.
    pub fn start_cost_sync(self: &Arc<Self>) {
        if !self.costs.as_ref().is_some_and(|b| b.is_tracking()) {
            return;
        }
        let mut slot = self.cost_sync.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (runner, stop) = (self.clone(), stop.clone());
            async move {
                let mut tick = tokio::time::interval(crate::costs::SYNC_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    runner.sync_costs();
                }
            }
        });
        *slot = Some((stop, task));
    }

    /// Bill the instances every shape lists now, settle those gone.
    fn sync_costs(&self) {
        let Some(book) = &self.costs else { return };
        let now = std::time::Instant::now();
        for s in self.placement.shapes() {
            book.instances_seen(&s.name, &s.scaler.instances(), now);
        }
    }

    /// Job `key` holds `acq` from now: its charge starts (a runner with prices).
    pub fn charge_started(
        &self,
        key: &str,
        acq: &Acquisition,
        whole: bool,
        job: &slipway_job::JobResponse,
    ) {
        let (Some(book), Some(shape)) = (&self.costs, self.placement.shape_of(key)) else {
            return;
        };
        let project = Some(job.job_info.project_full_path.trim_matches('/'))
            .filter(|p| !p.is_empty())
            .or_else(|| job.variable("CI_PROJECT_PATH").filter(|p| !p.is_empty()));
        book.job_started(
            key,
            &shape.name,
            crate::costs::Held::of(acq, whole),
            project,
            std::time::Instant::now(),
        );
    }

    /// Job `key`'s charge ends now (its steps ended, or it lost its slot): what it cost, once;
    /// the status board records it.
    pub fn charge_ended(&self, key: &str) -> Option<slipway_cost::JobCost> {
        let cost = self
            .costs
            .as_ref()?
            .job_ended(key, std::time::Instant::now())?;
        self.board.cost(key, cost.cost.amount, &cost.cost.currency);
        Some(cost)
    }

    /// What job `key` cost over every try, once (its charge ends now if it still runs).
    pub fn charge_total(&self, key: &str) -> Option<slipway_cost::JobCost> {
        self.charge_ended(key);
        self.costs
            .as_ref()?
            .take_total(key, std::time::Instant::now())
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
        self.charge_ended(key);
        self.placement.release(key);
    }

    /// Whether the instance of `acq` runs `exit 0` over its connection (dialled again if it
    /// closed), as GitLab's acquire heartbeat asks.
    pub async fn answers(&self, acq: &Acquisition) -> Result<(), String> {
        self.pool.answers(&acq.connect_info).await
    }

    /// Whether the instance of `acq` has a preemption notice from its cloud.
    pub fn is_preempted(&self, acq: &Acquisition) -> bool {
        self.placement
            .shape_of(&acq.key)
            .is_some_and(|s| s.scaler.is_preempted(&acq.instance_id))
    }

    /// Free acquisition `key` whose instance failed before its job's script started: the
    /// instance is removed and replaced, the job may reserve and acquire again.
    pub fn release_failed(&self, key: &str, why: &str) {
        self.charge_ended(key);
        self.placement.release_failed(key, why);
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
            starts: None,
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
            .map_or(crate::runner::localhost::ID, |(id, _)| *id);
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
        // A killed manager's leftovers (its jobs were reported failed); not those of another
        // live manager sharing the engine.
        self.sweep_engine(&exec, key, Sweep::Dead { ours: false })
            .await;
        cache.insert(key.to_string(), exec.clone());
        Ok(exec)
    }

    /// Whether jobs of this runner may run in containers on its instances' engines.
    fn runs_docker_on_instances(&self) -> bool {
        !self.local
            && (self.executor == Executor::DockerAutoscaler
                || self.isolation.allowed.contains(&Isolation::Docker))
    }

    /// Sweep this runner's containers, volumes and slot networks of the sessions `sweep`
    /// names off this machine's engine, when one answers at once.
    async fn sweep_local_engine(&self, sweep: Sweep) {
        // Bounded: a socket that takes the connection and never answers must not hold the
        // manager's shutdown.
        let connect = DockerExecutor::connect_local(self.docker.clone());
        let Ok(Ok(exec)) = tokio::time::timeout(ENGINE_PING_TIMEOUT, connect).await else {
            return;
        };
        if !matches!(
            tokio::time::timeout(ENGINE_PING_TIMEOUT, exec.docker().ping()).await,
            Ok(Ok(()))
        ) {
            return;
        }
        self.sweep_engine(&exec, "this machine", sweep).await;
    }

    /// Remove this runner's job containers, volumes and slot networks of the sessions `sweep`
    /// names from `engine`; what fails is logged (the next sweep tries again).
    async fn sweep_engine(&self, exec: &DockerExecutor, engine: &str, sweep: Sweep) {
        let docker = exec.docker();
        match DockerExecutor::sweep_job_leftovers(docker, &self.name, sweep).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(runner = %self.name, engine, removed = n,
                "removed containers and volumes of jobs whose manager is done"),
            Err(e) => tracing::warn!(runner = %self.name, engine, "removing jobs' leftovers: {e}"),
        }
        if let Err(e) = DockerExecutor::sweep_slot_networks(docker, &self.name, sweep).await {
            tracing::warn!(runner = %self.name, engine, "removing old slot networks: {e}");
        }
    }

    /// After a restart: sweep the containers, volumes and slot networks the dead manager's
    /// jobs left on the instances they ran on (an instance that takes no docker job again
    /// would keep them until deleted, and the local plugin's instances share this host's
    /// engine, which outlives them). Returns when done or on `stop`.
    pub async fn sweep_after_restart(&self, stop: &CancellationToken) {
        if !self.runs_docker_on_instances() {
            return;
        }
        // The local plugin's instances (and any on this machine) share its engine, which
        // outlives them: swept whole, as no instance may answer.
        tokio::select! {
            () = self.sweep_local_engine(Sweep::Dead { ours: false }) => {}
            _ = stop.cancelled() => return,
        }
        for shape in self.placement.shapes() {
            tokio::select! {
                res = shape.scaler.restored() => if res.is_err() { return },
                _ = stop.cancelled() => return,
            }
            let ids = shape.scaler.restored_failure_instances();
            if ids.is_empty() {
                continue;
            }
            let infos: HashMap<String, slipway_fleeting::ConnectInfo> = shape
                .scaler
                .instances()
                .into_iter()
                .filter_map(|i| Some((i.id, i.connect_info?)))
                .collect();
            for id in ids {
                let Some(info) = infos.get(&id) else { continue };
                let swept = async {
                    let client = self
                        .pool
                        .client(info)
                        .await
                        .map_err(|e| crate::chain::Chain(&e).to_string())?;
                    self.docker_executor(Some((&id, client)))
                        .await
                        .map(drop)
                        .map_err(|e| crate::chain::Chain(&e).to_string())
                };
                // Bounded: the executors' lock is held while an engine is reached, and an
                // instance on its way out must not hold up new docker jobs.
                let swept = async {
                    tokio::time::timeout(ENGINE_PING_TIMEOUT, swept)
                        .await
                        .unwrap_or_else(|_| Err("no answer in time".into()))
                };
                tokio::select! {
                    res = swept => if let Err(e) = res {
                        tracing::warn!(runner = %self.name, instance = %id,
                            "sweeping what the last run's jobs left: {e}");
                    },
                    _ = stop.cancelled() => return,
                }
            }
        }
    }

    /// Close connections, stop the taskscalers (deleting instances when configured), stop the
    /// plugins.
    pub async fn shutdown(&self) {
        let execs: Vec<(String, DockerExecutor)> = self.docker_execs.lock().await.drain().collect();
        for (engine, exec) in execs {
            // An engine that does not answer a ping at once is skipped: its instance is being
            // deleted meanwhile (an idle removal racing the shutdown), and a call through it
            // would hold the shutdown until TCP gives up. A slow but live engine is cleaned
            // whole, however long it takes.
            match tokio::time::timeout(ENGINE_PING_TIMEOUT, exec.docker().ping()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(runner = %self.name, engine = %engine, "not cleaned at shutdown: {e}");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(runner = %self.name, engine = %engine, "not cleaned at shutdown: no answer to a ping within {ENGINE_PING_TIMEOUT:?}");
                    continue;
                }
            }
            // Every job has ended: what a job whose cleanup failed (its instance's connection
            // lost, say) left on a still reachable engine goes now, and the slot networks of
            // executors whose instance is gone, on an engine they shared with this one (the
            // local plugin's instances share this host's).
            self.sweep_engine(&exec, &engine, ENDING).await;
            if let Err(e) = exec.shutdown().await {
                tracing::warn!(runner = %self.name, engine = %engine, "removing slot networks: {e}");
            }
        }
        if self.runs_docker_on_instances() {
            self.sweep_local_engine(ENDING).await;
        }
        self.pool.close_all().await;
        let sync = self
            .cost_sync
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((stop, task)) = sync {
            stop.cancel();
            let _ = task.await;
        }
        self.placement.shutdown().await;
        // The last bills: instances deleted at shutdown are settled.
        self.sync_costs();
        // The instances are gone (or idle, kept for the next run): so are their subtrees.
        if let Some(s) = &self.subtrees {
            s.remove_all().await;
        }
        for p in &self.plugins {
            p.stop().await;
        }
        if let Some(p) = &self.executor_plugin {
            p.host.stop().await;
        }
    }
}

/// How long a shutdown waits for a Docker Engine to answer before cleaning it.
const ENGINE_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// What a stopping manager sweeps off an engine: its own jobs' leftovers and those of managers
/// gone, never another live manager's.
const ENDING: Sweep = Sweep::Dead { ours: true };

/// The runner's job board, writing the process's job metrics.
fn board_of(cfg: &RunnerConfig, opts: &StartOptions) -> Arc<JobBoard> {
    Arc::new(JobBoard::new(
        &cfg.name,
        opts.job_metrics.clone().unwrap_or_default(),
    ))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn the_scratch_directory_is_emptied_by_its_first_manager_only() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("tmp");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("left-by-a-killed-manager.tar"), b"x").unwrap();
        let first = prepare_scratch(&dir).await.unwrap();
        assert!(first.is_some(), "the first manager holds the lock");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "leftovers go");
        use std::os::unix::fs::PermissionsExt as _;
        for private in [dir.clone(), dir.with_extension("lock")] {
            let mode = std::fs::metadata(&private).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{}: {mode:o}", private.display());
        }
        std::fs::write(dir.join("in-flight.tar"), b"x").unwrap();
        let second = prepare_scratch(&dir).await.unwrap();
        assert!(second.is_none());
        assert!(
            dir.join("in-flight.tar").exists(),
            "a running manager's files stay"
        );
        drop(first);
        assert!(prepare_scratch(&dir).await.unwrap().is_some());
        assert!(!dir.join("in-flight.tar").exists());
    }
}
