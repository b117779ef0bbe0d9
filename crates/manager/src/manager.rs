//! The manager (`slipway run`): every runner of config.toml started, each fed by its source
//! (GitLab or the embedded queue) through the one job lifecycle, the status page and metrics
//! served, policies reloaded as config.toml changes, until a drain or a stop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::source::queue::spool::{Queue, QueueError};
use slipway_config::{self as config, Loaded};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::chain::Chain;
use crate::limits::{Limits, effective_concurrency};
use crate::runner;
use crate::server::ServerError;
use crate::shutdown::Shutdown;
use crate::source::queue::QueueSourceError;
use crate::source::{gitlab, queue as queue_source};

/// Why the manager stopped before serving, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The embedded queue could not be locked or read.
    #[error(transparent)]
    Queue(#[from] QueueSourceError),
    /// A runner did not start.
    #[error(transparent)]
    Runner(#[from] runner::StartError),
    /// The HTTP server (`listen_address`) did not start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The scratch directory (jobs' data on its way) cannot be made ready.
    #[error("preparing {}: {source}", dir.display())]
    Scratch {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A manager to run: the loaded config, where it lives, the embedded queue, and where plugins
/// are found first.
#[derive(Debug)]
pub struct Manager<'a> {
    /// config.toml as loaded.
    pub loaded: &'a Loaded,
    /// Its path (state lives beside it; edits of its policies are followed).
    pub config_path: &'a Path,
    /// The embedded queue the runners without GitLab serve.
    pub queue: Queue,
    /// Where plugins are looked for first.
    pub plugin_dir: Option<PathBuf>,
    /// The job helper, copied to where jobs run to move their data.
    pub helper: Option<slipway_executor::Helper>,
}

impl Manager<'_> {
    /// Run until `shutdown` drains (every running job ends first, within `shutdown_timeout`)
    /// or stops (running jobs are canceled and reported); then stop every runner.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), ManagerError> {
        run_manager(
            self.loaded,
            self.config_path,
            self.queue,
            self.plugin_dir,
            self.helper,
            shutdown,
        )
        .await
    }
}

async fn run_manager(
    loaded: &Loaded,
    config_path: &Path,
    queue: Queue,
    plugin_dir: Option<PathBuf>,
    helper: Option<slipway_executor::Helper>,
    shutdown: Shutdown,
) -> Result<(), ManagerError> {
    let stop = shutdown.stop.clone();
    // One manager consumes a queue: a second would report the first one's jobs as orphans.
    // A manager started beside a running one (a rolling upgrade) starts its runners and serves
    // GitLab at once, and takes the queue over once the other one has drained and stopped.
    let consumer = take_queue(&queue).await?;
    if consumer.is_none() {
        tracing::warn!(queue = %queue.dir().display(),
            "another manager consumes the queue: taking it over once that one stops");
    }
    let families = std::sync::Arc::new(slipway_taskscaler::metrics::MetricFamilies::default());
    let job_metrics = slipway_status::JobMetrics::default();
    let state_dir = config::state_dir(config_path, loaded.config.state_dir.as_deref());
    let opts = runner::StartOptions {
        plugin_dir,
        helper,
        state_dir: Some(state_dir.clone()),
        work_dir: Some(config::work_dir(
            config_path,
            loaded.config.state_dir.as_deref(),
        )),
        metrics: Some(families.clone()),
        job_metrics: Some(job_metrics.clone()),
        concurrent: loaded.config.concurrent,
        ..runner::StartOptions::default()
    };
    // Held until this manager returns.
    let _scratch_lock = match runner::scratch_dir_of(&opts) {
        Some(dir) => runner::prepare_scratch(&dir)
            .await
            .map_err(|source| ManagerError::Scratch { dir, source })?,
        None => None,
    };
    let mut runners: Vec<Arc<runner::Runner>> = Vec::new();
    for cfg in &loaded.config.runners {
        let started = tokio::select! {
            r = runner::Runner::start(cfg, &opts) => r,
            _ = shutdown.drain.cancelled() => break,
        };
        match started {
            Ok(r) => {
                let r = Arc::new(r);
                r.start_cost_sync();
                runners.push(r);
            }
            Err(e) => {
                for r in &runners {
                    r.shutdown().await;
                }
                return Err(e.into());
            }
        }
    }
    tracing::info!(
        runners = runners.len(),
        queue = %queue.dir().display(),
        "manager running"
    );
    // Sampled from the start, so the page's charts cover the manager's whole life.
    let page = &loaded.config.status_page;
    let (interval, span) = page.history_durations();
    let mut status = crate::status::StatusService::new(runners.clone(), interval, span);
    // The embedded queue feeds only the runners GitLab does not.
    if !loaded.config.runners.iter().all(gitlab::serves_gitlab) {
        status = status.with_queue(queue.clone());
    }
    let status = Arc::new(status);
    let sampler_stop = CancellationToken::new();
    // Sampled, and listed, only for someone to look at.
    let served = loaded.config.listen_address.is_some() && page.enabled;
    let sampler = served.then(|| status.clone().spawn(sampler_stop.clone()));
    let server = match &loaded.config.listen_address {
        None => None,
        Some(addr) => {
            let registry = crate::server::registry(&families, &job_metrics);
            let routes = page.enabled.then(|| {
                let status = status.clone();
                crate::server::StatusRoutes {
                    status: Arc::new(move || status.collect()),
                    token: page.token.clone(),
                }
            });
            match crate::server::Server::start(addr, registry, routes).await {
                Ok(s) => Some(s),
                Err(e) => {
                    sampler_stop.cancel();
                    if let Some(s) = sampler {
                        let _ = s.await;
                    }
                    for r in &runners {
                        r.shutdown().await;
                    }
                    return Err(e.into());
                }
            }
        }
    };
    // The job sources: GitLab's per runner at once; the queue's (restart recovery, then one
    // dispatcher per queue-fed runner) once this manager consumes the queue. All end on `stop`.
    let mut sources = tokio::task::JoinSet::new();
    let mut queue_fed = Vec::new();
    let global = Arc::new(Semaphore::new(loaded.config.concurrent.max(1) as usize));
    for (r, cfg) in runners.iter().zip(&loaded.config.runners) {
        let limits = Limits {
            runner: Arc::new(Semaphore::new(effective_concurrency(loaded, cfg) as usize)),
            global: global.clone(),
        };
        if gitlab::serves_gitlab(cfg) {
            let opts = gitlab::SourceOptions {
                state_dir: state_dir.clone(),
                certs_dir: config::certs_dir(config_path),
                check_interval: std::time::Duration::from_secs(
                    match loaded.config.check_interval {
                        0 => 3,
                        s => s,
                    },
                ),
                limits,
            };
            let (r, cfg, shutdown) = (r.clone(), cfg.clone(), shutdown.clone());
            sources.spawn(async move {
                // A runner GitLab refuses stops serving; the others go on.
                if let Err(e) = gitlab::serve(r, &cfg, opts, shutdown).await {
                    tracing::error!("{e}");
                }
            });
            continue;
        }
        queue_fed.push((r.clone(), limits));
    }
    // A restarted manager clears what its predecessor's jobs left on their instances; the
    // drain stops it (the shutdown sweeps again, whole).
    for r in &runners {
        let (r, drain) = (r.clone(), shutdown.drain.clone());
        sources.spawn(async move { r.sweep_after_restart(&drain).await });
    }
    sources.spawn(feed_from_queue(
        queue.clone(),
        consumer,
        runners.clone(),
        queue_fed,
        shutdown.clone(),
    ));
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    // Policies follow config.toml edits (GitLab reloads only [[runners.autoscaler.policy]]).
    let mut reload = tokio::time::interval(std::time::Duration::from_secs(2));
    let mut seen = modified(config_path).await;
    loop {
        tokio::select! {
            // A stop drains too.
            _ = shutdown.drain.cancelled() => break,
            _ = reload.tick() => {
                let now = modified(config_path).await;
                if now != seen {
                    seen = now;
                    reload_policies(config_path, &runners).await;
                }
            }
            _ = tick.tick() => {
                for r in &runners {
                    let s = r.stats();
                    tracing::info!(runner = %r.name, instances = s.instances, running = s.running,
                        acquired = s.acquired, pending = s.pending, "status");
                }
            }
        }
    }
    // Draining: no source takes another job; the running ones have `shutdown_timeout` to end.
    let timer = (!stop.is_cancelled()).then(|| {
        let timeout = crate::shutdown::timeout_of(loaded.config.shutdown_timeout);
        tracing::info!(
            ?timeout,
            "draining: taking no more jobs, waiting for the running ones"
        );
        shutdown.drain_within(timeout)
    });
    // Running jobs end (or, on a stop, are canceled) and are reported before their runners
    // stop.
    while let Some(r) = sources.join_next().await {
        if let Err(e) = r {
            tracing::error!("job source task failed: {e}");
        }
    }
    if let Some(timer) = timer {
        timer.abort();
    }
    if let Some(server) = server {
        server.stop().await;
    }
    sampler_stop.cancel();
    if let Some(s) = sampler {
        let _ = s.await;
    }
    for r in &runners {
        r.shutdown().await;
    }
    Ok(())
}

async fn modified(path: &Path) -> Option<std::time::SystemTime> {
    tokio::fs::metadata(path)
        .await
        .and_then(|m| m.modified())
        .ok()
}

/// Apply the policies of an edited config; a broken file keeps the old ones.
async fn reload_policies(path: &Path, runners: &[Arc<runner::Runner>]) {
    let loaded = match config::load(path).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("config changed but cannot be used; keeping the old policies:\n{e}");
            return;
        }
    };
    for r in runners {
        let Some(auto) = loaded
            .config
            .runners
            .iter()
            .find(|c| c.name == r.name)
            .and_then(|c| c.autoscaler.as_ref())
        else {
            continue;
        };
        let policies: Vec<_> = auto.policy.iter().map(|p| p.to_policy()).collect();
        match r.set_policies(&policies) {
            Ok(()) => {
                tracing::info!(runner = %r.name, policies = policies.len(), "policies reloaded")
            }
            Err(e) => tracing::warn!(runner = %r.name, error = %e, "reloaded policies refused"),
        }
    }
}

/// Become the queue's consumer; `None` while another manager is.
async fn take_queue(
    queue: &Queue,
) -> Result<Option<crate::source::queue::spool::ConsumerLock>, QueueSourceError> {
    let q = queue.clone();
    match queue_source::blocking(move || q.lock_consumer()).await {
        Ok(lock) => Ok(Some(lock)),
        Err(QueueSourceError::Queue(QueueError::Busy { .. })) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Serve the queue-fed runners from the embedded queue: take the consumer lock (waiting while
/// another manager holds it), report what the last consumer left claimed, and dispatch; the
/// lock is held until every dispatcher has ended.
async fn feed_from_queue(
    queue: Queue,
    consumer: Option<crate::source::queue::spool::ConsumerLock>,
    runners: Vec<Arc<runner::Runner>>,
    fed: Vec<(Arc<runner::Runner>, Limits)>,
    shutdown: Shutdown,
) {
    let _consumer = match consumer {
        Some(lock) => lock,
        None => loop {
            match take_queue(&queue).await {
                Ok(Some(lock)) => {
                    tracing::info!("the other manager stopped: consuming the queue");
                    break lock;
                }
                Ok(None) => {}
                // Tried again: a manager that gave up here would never serve the queue.
                Err(e) => tracing::warn!("taking the queue over: {}; trying again", Chain(&e)),
            }
            tokio::select! {
                _ = shutdown.drain.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        },
    };
    // What the last manager left claimed, before this one claims anything.
    let q = queue.clone();
    let claimed = match queue_source::blocking(move || q.running()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("reading the queue's running jobs: {}", Chain(&e));
            return;
        }
    };
    // A drain stops the recovery too: it only reports what the last manager left.
    let recover = async {
        if let Err(e) = queue_source::recover(&queue, claimed, &runners, &shutdown.drain).await {
            tracing::error!("recovering the jobs of the last run: {}", Chain(&e));
        }
    };
    let mut dispatchers = tokio::task::JoinSet::new();
    for (r, limits) in fed {
        dispatchers.spawn(queue_source::serve(
            r,
            queue.clone(),
            limits,
            shutdown.clone(),
        ));
    }
    let serve = async {
        while let Some(r) = dispatchers.join_next().await {
            if let Err(e) = r {
                tracing::error!("job source task failed: {e}");
            }
        }
    };
    tokio::join!(recover, serve);
}
