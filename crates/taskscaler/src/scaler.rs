//! The running taskscaler: reservations, acquisitions and the scaling loop over one instance group.
//!
//! [`Taskscaler`] and its shared state live here; the rest is split by what it does:
//! the instance and reservation book (`book`), reserve/acquire/release (`reservations`),
//! ready checks and heartbeats (`health`), the scaling loop and its decision (`scaling`),
//! reconciling the plugin's list (`reconcile`), the state store (`restore`), removing
//! instances (`removal`) and status snapshots (`status`).

mod book;
mod health;
mod reconcile;
mod removal;
mod reservations;
mod restore;
mod scaling;
mod status;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use slipway_fleeting::{ConnectInfo, GroupError, InstanceGroup, ProviderInfo};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::hooks::InstanceHooks;
use crate::metrics::Metrics;
use crate::policy::{CompiledPolicy, Policy};
use crate::resources::Resources;
use crate::store::{AcquisitionRecord, AsyncStateStore, Snapshot};

use self::book::Book;
use self::scaling::run_loop;
pub use self::status::{InstanceStatus, Stats};

/// Longest a single plugin call may take before the loop moves on.
const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Taskscaler errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every slot the runner may ever have is reserved.
    #[error("no capacity: all {0} slots are reserved")]
    NoCapacity(u64),
    /// Preemptive mode or reservation throttling: no confirmed idle slot to reserve now.
    #[error("no idle capacity: {0}")]
    NoIdleCapacity(&'static str),
    /// A policy's periods or time zone cannot be used.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// The state store could not record an acquisition, so it is not handed out.
    #[error("state store: {0}")]
    Store(String),
    /// `acquire`/`release` for a key that was never reserved.
    #[error("no reservation {0}")]
    NotReserved(String),
    /// No slot became free within `instance_acquire_timeout`.
    #[error("no instance became available within {0:?}")]
    AcquireTimeout(Duration),
    /// No instance of this group can ever hold what the job asks for.
    #[error("{0}")]
    Unsatisfiable(String),
    /// The taskscaler is shutting down.
    #[error("taskscaler is shutting down")]
    ShuttingDown,
    /// The instance group failed.
    #[error(transparent)]
    Group(#[from] GroupError),
}

/// A job's slot on an instance, handed out by [`Taskscaler::acquire`].
#[derive(Debug, Clone)]
pub struct Acquisition {
    /// The reservation key.
    pub key: String,
    /// Instance the slot is on.
    pub instance_id: String,
    /// Slot number, `0..capacity_per_instance` (the lowest, when the job holds several).
    pub slot: u32,
    /// Slots held: more than one when the job asked for more than one slot's share.
    pub slots: u32,
    /// The job's share of the instance (`None` when the group declares no resources).
    pub resources: Option<Resources>,
    /// How to reach the instance.
    pub connect_info: ConnectInfo,
    lost: CancellationToken,
}

impl Acquisition {
    /// Cancelled when the instance disappears under the job, or when the taskscaler decides to
    /// remove it (a failed instance) while the job holds it: then before the plugin is asked to
    /// delete it, so the job learns of it before its processes are killed.
    pub fn instance_lost(&self) -> CancellationToken {
        self.lost.clone()
    }
}

struct Inner {
    group: Arc<dyn InstanceGroup>,
    cfg: Config,
    /// Replaced on config reload (`set_policies`).
    policies: std::sync::RwLock<Vec<CompiledPolicy>>,
    /// The active policy for one wall-clock minute.
    policy_cache: Mutex<Option<(u64, Policy)>>,
    hooks: Option<Arc<dyn InstanceHooks>>,
    store: Option<AsyncStateStore>,
    keep_instance_with_acquisitions: bool,
    /// What the store held at start, consumed by the first successful Update.
    snapshot: Mutex<Option<Snapshot>>,
    /// Jobs whose acquisitions were found at restart: they cannot resume.
    restored_failures: Mutex<Vec<AcquisitionRecord>>,
    /// Instances of the restored failures, kept after those are taken.
    restored_failure_instances: Mutex<Vec<String>>,
    metrics: Arc<Metrics>,
    /// Wall-clock time at `started` (tokio's clock may be paused and advanced in simulation).
    wall_start: SystemTime,
    started: Instant,
    provider: ProviderInfo,
    book: Mutex<Book>,
    changed: watch::Sender<u64>,
    wake: Notify,
    stop: CancellationToken,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taskscaler")
            .field("provider", &self.provider.id)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// How to start a [`Taskscaler`] beyond its config.
#[derive(Clone)]
pub struct Options {
    /// Wall-clock time now (policy periods advance from it on tokio's clock).
    pub wall_start: SystemTime,
    /// Runner-side checks: `instance_ready_command` and acquire heartbeats.
    pub hooks: Option<Arc<dyn InstanceHooks>>,
    /// Persistent state: instances, use counts and acquisitions survive a restart.
    pub store: Option<AsyncStateStore>,
    /// Keep a restored instance that still had acquisitions (their jobs fail either way).
    pub keep_instance_with_acquisitions: bool,
    /// Where to report metrics (default: families of its own, labelled with the group).
    pub metrics: Option<Metrics>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            wall_start: SystemTime::now(),
            hooks: None,
            store: None,
            keep_instance_with_acquisitions: false,
            metrics: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("wall_start", &self.wall_start)
            .field("hooks", &self.hooks.is_some())
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// The autoscaler of one runner: owns its scaling loop task.
#[derive(Debug)]
pub struct Taskscaler {
    inner: Arc<Inner>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Taskscaler {
    /// Start the scaling loop over an initialized group, on the wall clock.
    pub fn start(
        group: Arc<dyn InstanceGroup>,
        provider: ProviderInfo,
        cfg: Config,
    ) -> Result<Self, Error> {
        Self::start_at(group, provider, cfg, SystemTime::now())
    }

    /// Start with the wall clock reading `wall_start` now; time then advances with tokio's clock
    /// (so a simulation on paused time sees policy periods change as simulated days pass).
    pub fn start_at(
        group: Arc<dyn InstanceGroup>,
        provider: ProviderInfo,
        cfg: Config,
        wall_start: SystemTime,
    ) -> Result<Self, Error> {
        Self::start_with(
            group,
            provider,
            cfg,
            Options {
                wall_start,
                ..Options::default()
            },
        )
    }

    /// Start with runner-side hooks, a state store and a wall-clock start.
    pub fn start_with(
        group: Arc<dyn InstanceGroup>,
        provider: ProviderInfo,
        cfg: Config,
        opts: Options,
    ) -> Result<Self, Error> {
        let Options {
            wall_start,
            hooks,
            store,
            keep_instance_with_acquisitions,
            metrics,
        } = opts;
        let metrics = metrics.unwrap_or_else(|| Metrics::standalone(&provider.id));
        // GitLab's max_* gauges: the limits, set once.
        metrics.set_limits(
            cfg.max_instances,
            cfg.capacity_per_instance,
            cfg.max_use_count,
        );
        let policies = crate::policy::compile(&cfg.policies)?;
        let (changed, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            group,
            cfg,
            policies: std::sync::RwLock::new(policies),
            policy_cache: Mutex::new(None),
            hooks,
            store,
            keep_instance_with_acquisitions,
            snapshot: Mutex::new(None),
            restored_failures: Mutex::new(Vec::new()),
            restored_failure_instances: Mutex::new(Vec::new()),
            metrics: Arc::new(metrics),
            wall_start,
            started: Instant::now(),
            provider,
            book: Mutex::new(Book::default()),
            changed,
            wake: Notify::new(),
            stop: CancellationToken::new(),
        });
        let task = tokio::spawn(run_loop(inner.clone()));
        Ok(Taskscaler {
            inner,
            task: Mutex::new(Some(task)),
        })
    }

    /// Acquisitions found in the state store at start: their jobs cannot resume and must be
    /// reported failed by the job source. Each is returned once.
    pub fn take_restored_failures(&self) -> Vec<AcquisitionRecord> {
        std::mem::take(
            &mut *self
                .inner
                .restored_failures
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// The instances [`Taskscaler::take_restored_failures`] names (not yet taken or already
    /// taken): what a dead manager's jobs ran on, where they may have left containers.
    pub fn restored_failure_instances(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .inner
            .restored_failure_instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ids.sort();
        ids.dedup();
        ids
    }

    /// Resolves once the first successful Update has been reconciled, so that
    /// [`Taskscaler::take_restored_failures`] holds everything the state store knew;
    /// [`Error::ShuttingDown`] if the taskscaler stops first.
    pub async fn restored(&self) -> Result<(), Error> {
        loop {
            let mut rx = self.inner.changed.subscribe();
            if self.inner.lock().seen_first_update {
                return Ok(());
            }
            tokio::select! {
                biased;
                _ = self.inner.stop.cancelled() => return Err(Error::ShuttingDown),
                _ = rx.changed() => {}
            }
        }
    }

    /// This taskscaler's metrics, to register with a Prometheus registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.inner.metrics.clone()
    }

    /// Replace the policies (config.toml reloaded); the other keys are not reloaded, as in
    /// GitLab. Invalid policies are refused and the old ones stay.
    pub fn set_policies(&self, policies: &[Policy]) -> Result<(), Error> {
        let compiled = crate::policy::compile(policies)?;
        *self
            .inner
            .policies
            .write()
            .unwrap_or_else(|p| p.into_inner()) = compiled;
        *self
            .inner
            .policy_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// The policy in force now.
    pub fn active_policy(&self) -> Policy {
        self.inner.policy()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// A receiver that sees a change whenever slots may have freed or instances changed (a
    /// release, a scaling pass), for callers that place waiting jobs themselves.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// The instance group's id (from the plugin).
    pub fn group_id(&self) -> &str {
        &self.inner.provider.id
    }

    /// Stop the loop; with `delete_instances_on_shutdown`, delete every instance and wait for it.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        if self.inner.cfg.delete_instances_on_shutdown {
            self.inner.delete_all().await;
        } else {
            self.inner.release_ownership().await;
        }
        if let Err(e) = call(self.inner.group.shutdown()).await {
            tracing::warn!(error = %e, "plugin shutdown failed");
        }
    }
}

impl Drop for Taskscaler {
    fn drop(&mut self) {
        self.inner.stop.cancel();
    }
}

async fn call<T>(
    fut: impl std::future::Future<Output = Result<T, GroupError>>,
) -> Result<T, GroupError> {
    match tokio::time::timeout(PLUGIN_CALL_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(GroupError::Provider(format!(
            "plugin call timed out after {PLUGIN_CALL_TIMEOUT:?}"
        ))),
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Book> {
        // A poisoned lock only means another task panicked mid-update; the book stays usable.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn wall_now(&self) -> SystemTime {
        self.wall_start + self.started.elapsed()
    }

    /// The active policy; periods match whole minutes, so it is evaluated once a minute.
    fn policy(&self) -> Policy {
        let now = self.wall_now();
        let minute = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 60);
        let mut cache = self.policy_cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((m, p)) = cache.as_ref()
            && *m == minute
        {
            return p.clone();
        }
        let policies = self.policies.read().unwrap_or_else(|p| p.into_inner());
        let p = crate::policy::active(&policies, now);
        *cache = Some((minute, p.clone()));
        p
    }
}
