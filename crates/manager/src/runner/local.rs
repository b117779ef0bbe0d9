//! A runner whose jobs run on this machine (shell, docker, custom, local plugins).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use slipway_config::RunnerConfig;
use slipway_connector::DialOptions;
use slipway_executor::IsolationPolicy;
use slipway_executor::cgroup::SlotCgroups;
use slipway_executor::docker::DockerConfig;
use slipway_taskscaler::metrics::Metrics;
use slipway_taskscaler::{Options, Placement, Policy, Shape, Taskscaler};

use super::{Runner, StartError, StartOptions, board_of, cache_dir_of};
use crate::runner::JobDefaults;
use crate::runner::localhost::LocalGroup;
use crate::runner::pool::{DockerExecs, Pool};

/// A runner whose jobs run on this machine: its slots come from a taskscaler over
/// [`LocalGroup`], an instance group of one that is this machine.
pub(super) fn start_local(
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
            ("group".into(), crate::runner::localhost::ID.into()),
        ],
    );
    let scaler = Taskscaler::start_with(
        Arc::new(LocalGroup::default()),
        crate::runner::localhost::provider(),
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
            .work_dir
            .clone()
            .or_else(|| {
                opts.state_dir
                    .as_deref()
                    .and_then(Path::parent)
                    .map(Path::to_path_buf)
            })
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(std::env::temp_dir);
        base.join("builds").display().to_string()
    });
    let local_default = Path::new(&builds_dir)
        .parent()
        .map(|p| p.join("cache").display().to_string())
        .unwrap_or_else(|| "cache".into());
    Ok(Runner {
        start_attempts: 1,
        scratch_dir: super::scratch_dir_of(opts),
        archive_limits: cfg.archives.limits(),
        name: cfg.name.clone(),
        builds_dir,
        cache_dir: cache_dir_of(cfg, &local_default),
        container_cache_dir: cache_dir_of(cfg, "/cache"),
        isolation,
        cgroups,
        subtrees: None,
        executor: cfg.executor.clone(),
        executors: Arc::new(super::BuiltinExecutors::of(&cfg.executor)),
        cache: super::distributed_cache_of(cfg, opts),
        local: true,
        custom_build_dir: cfg.custom_build_dir(),
        fetch_sources: cfg.fetch_sources,
        job_data: cfg.job_data,
        helper: opts.helper.clone(),
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
        costs: None,
        cost_sync: std::sync::Mutex::new(None),
        plugins: Vec::new(),
        pool: Arc::new(Pool::new(DialOptions::default())),
        docker_execs: DockerExecs::default(),
    })
}
