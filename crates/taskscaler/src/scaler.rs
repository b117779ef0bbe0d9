//! The running taskscaler: reservations, acquisitions and the scaling loop over one instance group.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use slipway_fleeting::{ConnectInfo, GroupError, InstanceGroup, ProviderInfo, State};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::decision::{self, Demand, InstanceView, RemovalCause};
use crate::forecast::Arrivals;
use crate::hooks::InstanceHooks;
use crate::metrics::Metrics;
use crate::policy::{CompiledPolicy, Policy};
use crate::resources::Resources;
use crate::store::{
    AcquisitionRecord, AsyncStateStore, InstanceRecord, RestorePlan, Snapshot, plan_restore,
};

/// Longest a single plugin call may take before the loop moves on.
const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a vanished instance id is remembered.
const VANISHED_MEMORY: Duration = Duration::from_secs(3600);
/// Connect info whose credentials expire sooner than this is fetched again before use.
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(60);
/// Longest an instance's ready check may take before it counts as failed.
const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest a heartbeat may take before it counts as failed.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the runner's cleanup of an instance about to be removed may take.
const REMOVING_HOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause in scale-up after instances kept failing their ready command.
const READY_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Instances asked for but never listed by the plugin stop counting after this long.
const REQUEST_GRACE: Duration = Duration::from_secs(300);

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

/// Counts for status lines and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instances by state (removing ones included).
    pub instances: usize,
    /// Instances the plugin reports as running.
    pub running: usize,
    /// Reservations not yet acquired.
    pub pending: usize,
    /// Acquired slots.
    pub acquired: usize,
    /// Instances ever created through this taskscaler.
    pub created: u64,
    /// Instances ever removed by this taskscaler.
    pub removed: u64,
}

/// One instance as status output shows it (a copy, taken under the book's lock).
#[derive(Debug, Clone)]
pub struct InstanceStatus {
    /// The plugin's instance id.
    pub id: String,
    /// Its state as the plugin reports it.
    pub state: State,
    /// Time since it was first seen.
    pub age: Duration,
    /// Jobs it has taken.
    pub uses: u32,
    /// Each slot's holder (a reservation key), `None` when free.
    pub slots: Vec<Option<String>>,
    /// Running and passed its ready command: may take jobs.
    pub ready: bool,
    /// Being removed (or condemned: failed, unhealthy, used up).
    pub removing: bool,
    /// Taken whole by a job at the `instance` isolation level.
    pub exclusive: bool,
    /// How to reach it, once known.
    pub connect_info: Option<ConnectInfo>,
}

#[derive(Debug)]
struct Instance {
    state: State,
    slots: Vec<Option<String>>,
    /// How many of `slots` are held.
    held: u32,
    uses: u32,
    removing: bool,
    idle_since: Instant,
    created: Instant,
    info: Option<ConnectInfo>,
    lost: CancellationToken,
    /// Found at startup with no record of its use: removed, never used.
    preexisting: bool,
    /// When Decrease was asked for; retried after `deletion_retry_interval`.
    removing_since: Option<Instant>,
    /// Passed `instance_ready_command` (or there is none): may take jobs.
    ready: bool,
    /// Removal decided outside the scale decision (not ready, unhealthy), with why.
    condemned: Option<RemovalCause>,
    /// Consecutive failed heartbeats.
    failures: u32,
    /// Recorded in the state store (always true without one): only then may it take jobs.
    persisted: bool,
    /// When it was first seen running.
    running_at: Option<Instant>,
    /// What it adds to the book's index and totals, as of its last `touch`.
    counted: Counted,
    /// A ready check is under way.
    checking: bool,
    /// Taken whole by a job at the `instance` isolation level: it takes nothing else, and goes
    /// when that job is done.
    exclusive: bool,
}

/// One instance's share of the book's running totals and index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counted {
    /// Held slots when entered in `Book::assignable`, if it is there.
    indexed: Option<u32>,
    idle: u32,
    held: u32,
    /// Index into `Totals::by_state`; `None` before the first touch.
    state: Option<usize>,
    /// Creating, deleting or being removed: the loop polls faster.
    flux: bool,
    /// Running without connect info yet.
    no_info: bool,
    /// Running, waiting for its ready command.
    unready: bool,
}

/// Totals over every instance, kept up to date by `Book::touch` so nothing on the hot path
/// (or in gauges and status) scans the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    idle: u64,
    held: u64,
    by_state: [u64; 5],
    flux: u64,
    no_info: u64,
    unready: u64,
}

impl Totals {
    fn apply(&mut self, c: &Counted, add: bool) {
        let f = |v: &mut u64, n: u64| {
            *v = if add { *v + n } else { v.saturating_sub(n) };
        };
        f(&mut self.idle, u64::from(c.idle));
        f(&mut self.held, u64::from(c.held));
        if let Some(i) = c.state {
            f(&mut self.by_state[i], 1);
        }
        f(&mut self.flux, u64::from(c.flux));
        f(&mut self.no_info, u64::from(c.no_info));
        f(&mut self.unready, u64::from(c.unready));
    }
}

const STATES: [State; 5] = [
    State::Creating,
    State::Running,
    State::Deleting,
    State::Deleted,
    State::Timeout,
];

fn state_index(s: State) -> usize {
    STATES.iter().position(|x| *x == s).unwrap_or(0)
}

impl Instance {
    /// Slots it can hand out now (as the decision sees it, without building a view).
    fn free_slots(&self, cfg: &Config) -> u32 {
        let leaving =
            self.removing || self.preexisting || self.condemned.is_some() || self.exclusive;
        decision::free_slots_of(cfg, self.state, leaving, self.acquired(), self.uses)
    }

    /// Slots held now (kept as a count: the hot path asks for it on every instance).
    fn acquired(&self) -> u32 {
        self.held
    }

    /// Give `slot` to `key`.
    fn take_slot(&mut self, slot: usize, key: &str) {
        if let Some(s) = self.slots.get_mut(slot)
            && s.replace(key.to_string()).is_none()
        {
            self.held += 1;
        }
    }

    /// Free `slot`.
    fn free_slot(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot)
            && s.take().is_some()
        {
            self.held = self.held.saturating_sub(1);
        }
    }

    /// Give `n` free slots to `key`; the lowest one taken, or `None` (and nothing taken) when
    /// fewer are free.
    fn take_slots(&mut self, n: u32, key: &str) -> Option<u32> {
        let free: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| i)
            .take(n as usize)
            .collect();
        if free.len() < n as usize {
            return None;
        }
        for &i in &free {
            self.take_slot(i, key);
        }
        free.first().and_then(|&i| u32::try_from(i).ok())
    }

    /// Free every slot `key` holds; how many were freed.
    fn free_slots_of(&mut self, key: &str) -> u32 {
        let mut n = 0;
        for i in 0..self.slots.len() {
            if self.slots[i].as_deref() == Some(key) {
                self.free_slot(i);
                n += 1;
            }
        }
        n
    }

    /// May take a job now: running, ready, recorded, healthy, staying, with room.
    fn assignable(&self, cfg: &Config) -> bool {
        self.state == State::Running
            && self.ready
            && self.persisted
            && !self.preexisting
            && !self.removing
            && self.condemned.is_none()
            && self.free_slots(cfg) > 0
    }

    /// What it adds to the book's index and totals now.
    fn counted(&self, cfg: &Config) -> Counted {
        let running = self.state == State::Running;
        Counted {
            indexed: self.assignable(cfg).then_some(self.held),
            idle: self.idle_offer(cfg),
            held: self.held,
            state: Some(state_index(self.state)),
            flux: self.removing || matches!(self.state, State::Creating | State::Deleting),
            no_info: running && self.info.is_none() && !self.removing,
            unready: running
                && !self.ready
                && !self.removing
                && !self.preexisting
                && self.condemned.is_none(),
        }
    }

    /// Idle slots it offers as `reserve` counts them (running, not found at startup).
    fn idle_offer(&self, cfg: &Config) -> u32 {
        if self.state == State::Running && !self.preexisting {
            self.free_slots(cfg)
        } else {
            0
        }
    }

    /// Whether a job of `n` slots fits now (slots free and a use left).
    fn fits(&self, n: u32, cfg: &Config) -> bool {
        let cap = self.slots.len() as u32;
        cap.saturating_sub(self.held) >= n && self.free_slots(cfg) > 0
    }

    /// Never used and holding nothing: what a job at the `instance` level may take.
    fn fresh(&self) -> bool {
        self.uses == 0 && self.held == 0 && !self.exclusive
    }
}

/// A job's hold on capacity: how many slots it needs, and where once acquired.
#[derive(Debug, Clone, PartialEq)]
struct Reservation {
    slots: u32,
    /// (instance, first slot) once acquired.
    at: Option<(String, u32)>,
    /// Wants a fresh instance of its own (every slot), removed after the job.
    exclusive: bool,
}

#[derive(Debug, Default)]
struct Book {
    instances: BTreeMap<String, Instance>,
    reservations: HashMap<String, Reservation>,
    /// Slots of reservations not yet acquired (kept as a count: `reserve` reads it per job).
    pending_slots: u32,
    /// Slots of every reservation, pending or acquired.
    reserved_slots: u64,
    /// Instances that may take a job now, busiest first when iterated in reverse (oldest on
    /// ties): the hot path picks from here instead of scanning every instance.
    assignable: BTreeSet<(u32, Reverse<Instant>, String)>,
    /// Idle slots, held slots, instances by state and the like, over every instance.
    totals: Totals,
    requested: u32,
    requested_at: Option<Instant>,
    seen_first_update: bool,
    /// Recent reservation times, for the demand forecast.
    arrivals: Arrivals,
    /// Token bucket on creations: tokens and when they were last topped up.
    tokens: f64,
    tokens_at: Option<Instant>,
    /// Consecutive instances whose ready command failed, and no scale-up before this time
    /// (exponential backoff against thrashing, as GitLab 17.0).
    ready_failures: u32,
    scale_up_after: Option<Instant>,
    /// Instances whose accepted deletion had no effect: Decrease is sent again.
    redelete: Vec<String>,
    /// Ids that left the plugin's list, and when.
    vanished: HashMap<String, Instant>,
    created: u64,
    removed: u64,
}

impl Book {
    /// Bring `id`'s entries in `assignable` and `totals` up to date after a change; every
    /// change to an instance's state, flags, slots, uses or connect info is followed by this.
    fn touch(&mut self, id: &str, cfg: &Config) {
        let Some(inst) = self.instances.get_mut(id) else {
            return;
        };
        let now = inst.counted(cfg);
        let before = std::mem::replace(&mut inst.counted, now);
        if before == now {
            return;
        }
        let created = Reverse(inst.created);
        if before.indexed != now.indexed {
            if let Some(h) = before.indexed {
                self.assignable.remove(&(h, created, id.to_string()));
            }
            if let Some(h) = now.indexed {
                self.assignable.insert((h, created, id.to_string()));
            }
        }
        self.totals.apply(&before, false);
        self.totals.apply(&now, true);
    }

    /// Add an instance and count it.
    fn add_instance(&mut self, id: &str, inst: Instance, cfg: &Config) {
        if let Some(old) = self.instances.insert(id.to_string(), inst) {
            self.uncount(id, &old);
        }
        self.touch(id, cfg);
    }

    /// Remove an instance and its entries.
    fn remove_instance(&mut self, id: &str) -> Option<Instance> {
        let inst = self.instances.remove(id)?;
        self.uncount(id, &inst);
        Some(inst)
    }

    fn uncount(&mut self, id: &str, inst: &Instance) {
        if let Some(h) = inst.counted.indexed {
            self.assignable
                .remove(&(h, Reverse(inst.created), id.to_string()));
        }
        self.totals.apply(&inst.counted, false);
    }

    /// Recount from scratch and compare (tests: every change must have been touched).
    #[cfg(debug_assertions)]
    fn check_counts(&self, cfg: &Config) {
        let mut totals = Totals::default();
        for i in self.instances.values() {
            totals.apply(&i.counted(cfg), true);
        }
        debug_assert_eq!(totals, self.totals, "instance totals out of date");
        let expected: BTreeSet<(u32, Reverse<Instant>, String)> = self
            .instances
            .iter()
            .filter(|(_, i)| i.assignable(cfg))
            .map(|(id, i)| (i.held, Reverse(i.created), id.clone()))
            .collect();
        debug_assert!(expected == self.assignable, "assignable index out of date");
    }

    /// Slots wanted by reservations not yet acquired.
    fn pending(&self) -> u32 {
        self.pending_slots
    }

    fn add_reservation(&mut self, key: &str, slots: u32, exclusive: bool) {
        if let Some(old) = self.reservations.insert(
            key.to_string(),
            Reservation {
                slots,
                at: None,
                exclusive,
            },
        ) {
            self.forget_counts(&old);
        }
        self.pending_slots = self.pending_slots.saturating_add(slots);
        self.reserved_slots = self.reserved_slots.saturating_add(u64::from(slots));
    }

    fn remove_reservation(&mut self, key: &str) -> Option<Reservation> {
        let r = self.reservations.remove(key)?;
        self.forget_counts(&r);
        Some(r)
    }

    fn forget_counts(&mut self, r: &Reservation) {
        if r.at.is_none() {
            self.pending_slots = self.pending_slots.saturating_sub(r.slots);
        }
        self.reserved_slots = self.reserved_slots.saturating_sub(u64::from(r.slots));
    }

    /// Mark `key` acquired at `at`, or pending again with `None`.
    fn set_at(&mut self, key: &str, at: Option<(String, u32)>) {
        let Some(r) = self.reservations.get_mut(key) else {
            return;
        };
        match (r.at.is_some(), at.is_some()) {
            (false, true) => self.pending_slots = self.pending_slots.saturating_sub(r.slots),
            (true, false) => self.pending_slots = self.pending_slots.saturating_add(r.slots),
            _ => {}
        }
        r.at = at;
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

    /// Hold one slot for a job that is about to be requested.
    ///
    /// Refused when every possible slot is reserved; in preemptive mode also when no idle slot
    /// is confirmed (a runner then does not ask for a job, and says why).
    pub fn reserve(&self, key: &str) -> Result<(), Error> {
        self.reserve_for(key, &Resources::default())
    }

    /// Slots a job asking for `request` takes on one instance of this group (1 when the
    /// group declares no resources); an error naming both when no instance can hold it.
    pub fn slots_for(&self, request: &Resources) -> Result<u32, Error> {
        let cfg = &self.inner.cfg;
        let Some(offer) = &cfg.instance_resources else {
            return Ok(1);
        };
        request
            .slots_needed(offer, cfg.capacity_per_instance)
            .ok_or_else(|| {
                Error::Unsatisfiable(format!(
                    "the job asks for {request}, more than one instance of {} offers ({offer})",
                    self.inner.provider.id
                ))
            })
    }

    /// Whether a running instance could take a job of `slots` slots right now.
    pub fn fits_now(&self, slots: u32) -> bool {
        let book = self.inner.lock();
        let cfg = &self.inner.cfg;
        book.assignable
            .iter()
            .rev()
            .filter_map(|(_, _, id)| book.instances.get(id))
            .any(|i| i.assignable(cfg) && i.fits(slots, cfg))
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

    /// Hold capacity for a job asking for `request`: as many slots of one instance as the
    /// request needs. A request no instance can ever hold is refused with
    /// [`Error::Unsatisfiable`].
    pub fn reserve_for(&self, key: &str, request: &Resources) -> Result<(), Error> {
        self.reserve_held(key, request, false)
    }

    /// Hold a whole fresh instance for a job at the `instance` isolation level: every slot of
    /// one instance no job has used, which nothing else is placed on while the job runs and
    /// which is removed after it, whatever `max_use_count` says.
    pub fn reserve_instance(&self, key: &str, request: &Resources) -> Result<(), Error> {
        self.reserve_held(key, request, true)
    }

    fn reserve_held(&self, key: &str, request: &Resources, exclusive: bool) -> Result<(), Error> {
        if self.inner.stop.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let mut slots = self.slots_for(request)?;
        if exclusive {
            slots = self.inner.cfg.capacity_per_instance.max(1);
        }
        let policy = self.inner.policy();
        {
            let mut book = self.inner.lock();
            if let Some(max) = self.inner.cfg.max_capacity()
                && book.reserved_slots + u64::from(slots) > max
            {
                return Err(Error::NoCapacity(max));
            }
            let idle = book.totals.idle;
            let pending = u64::from(book.pending());
            if policy.preemptive() && pending + u64::from(slots) > idle {
                return Err(Error::NoIdleCapacity(
                    "preemptive mode: jobs are requested only when an idle slot is ready",
                ));
            }
            // taskscaler!60: with idle capacity around, do not let reservations pile up beyond
            // it (they would block scale-down); without any, they drive scale-up.
            if self.inner.cfg.reservation_throttling && idle > 0 && pending >= idle {
                return Err(Error::NoIdleCapacity(
                    "reservation throttling: outstanding reservations already cover idle capacity",
                ));
            }
            let busy = book.reserved_slots.saturating_add(u64::from(slots));
            book.arrivals
                .record(self.inner.cfg.forecast.as_ref(), Instant::now(), busy);
            book.add_reservation(key, slots, exclusive);
            // Only demand beyond the idle slots needs a scaling pass now; the rest waits for
            // the next interval (a pass per job would cost a plugin Update per job). A whole
            // instance needs a fresh one, which idle slots do not tell.
            if !exclusive && pending + u64::from(slots) <= idle {
                return Ok(());
            }
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Reserve, waiting while capacity is refused (`NoCapacity`, `NoIdleCapacity`) until a
    /// release or a scaling pass changes the picture. For callers with no queue to leave a job
    /// in (local pipelines, benchmarks); a GitLab runner simply does not ask for a job instead.
    pub async fn reserve_wait(&self, key: &str) -> Result<(), Error> {
        self.reserve_wait_for(key, &Resources::default()).await
    }

    /// [`Taskscaler::reserve_wait`] for a job asking for `request`.
    pub async fn reserve_wait_for(&self, key: &str, request: &Resources) -> Result<(), Error> {
        self.reserve_wait_held(key, request, false).await
    }

    /// [`Taskscaler::reserve_instance`], waiting while capacity is refused.
    pub async fn reserve_wait_instance(&self, key: &str, request: &Resources) -> Result<(), Error> {
        self.reserve_wait_held(key, request, true).await
    }

    async fn reserve_wait_held(
        &self,
        key: &str,
        request: &Resources,
        exclusive: bool,
    ) -> Result<(), Error> {
        loop {
            let mut rx = self.inner.changed.subscribe();
            match self.reserve_held(key, request, exclusive) {
                Err(Error::NoCapacity(_) | Error::NoIdleCapacity(_)) => {}
                other => return other,
            }
            tokio::select! {
                biased;
                _ = self.inner.stop.cancelled() => return Err(Error::ShuttingDown),
                _ = rx.changed() => {}
            }
        }
    }

    /// Give back a reservation no job arrived for.
    pub fn unreserve(&self, key: &str) {
        self.release(key);
    }

    /// Bind a reservation to a slot on a running instance, waiting up to `instance_acquire_timeout`.
    pub async fn acquire(&self, key: &str) -> Result<Acquisition, Error> {
        let timeout = self.inner.cfg.instance_acquire_timeout;
        let asked = Instant::now();
        let deadline = asked + timeout;
        let mut nudged = false;
        loop {
            let Assigned {
                id: instance_id,
                slot,
                slots,
                exclusive,
                lost,
                info: cached,
            } = loop {
                let mut rx = self.inner.changed.subscribe();
                if let Some(found) = self.inner.try_assign(key)? {
                    break found;
                }
                // One nudge so the loop sees this demand now; waking it on every change would
                // make the loop and a waiting acquire ping-pong (each pass signals a change).
                if !nudged {
                    nudged = true;
                    self.inner.wake.notify_one();
                }
                // Fixed branch order keeps simulations on paused time deterministic.
                tokio::select! {
                    biased;
                    _ = self.inner.stop.cancelled() => return Err(Error::ShuttingDown),
                    r = tokio::time::timeout_at(deadline, rx.changed()) => {
                        if r.is_err() {
                            return Err(Error::AcquireTimeout(timeout));
                        }
                    }
                }
            };
            let connect_info = match cached {
                Some(info) => info,
                None => match self.inner.fetch_connect_info(&instance_id).await {
                    Ok(info) => info,
                    Err(e) => {
                        self.release(key);
                        return Err(e.into());
                    }
                },
            };
            // The health check and the write-ahead record run side by side; the slot is handed
            // out only when both succeed.
            let check = async {
                let Some(hooks) = &self.inner.hooks else {
                    return Ok(());
                };
                match tokio::time::timeout(HEARTBEAT_TIMEOUT, hooks.heartbeat(&connect_info)).await
                {
                    Ok(r) => r,
                    Err(_) => Err(format!("no answer within {HEARTBEAT_TIMEOUT:?}")),
                }
            };
            let record = async {
                match &self.inner.store {
                    Some(store) => store
                        .increment_use(instance_id.clone(), key, slot, key)
                        .await
                        .map(|_| true),
                    None => Ok(false),
                }
            };
            let (healthy, recorded) = tokio::join!(check, record);
            if let Err(why) = healthy {
                if let (Ok(true), Some(store)) = (&recorded, &self.inner.store) {
                    let k = key.to_string();
                    store.enqueue("release", move |s| s.release(&k).map(|_| ()));
                }
                // The reservation stays: try another slot, or wait for a new instance.
                self.inner.failed_heartbeat(key, &instance_id, slot, &why);
                continue;
            }
            if self.inner.hooks.is_some() {
                self.inner.healthy(&instance_id);
            }
            if let Err(e) = recorded {
                // The store refused this slot (held in its records, instance being removed):
                // count it against the instance like a failed check and try another slot.
                self.inner
                    .failed_heartbeat(key, &instance_id, slot, &format!("state store: {e}"));
                continue;
            }
            // A whole instance never serves another job: recorded as being removed now, so a
            // manager restarted mid-job deletes it even with keep_instance_with_acquisitions.
            if exclusive && let Some(store) = &self.inner.store {
                let id = instance_id.clone();
                store.enqueue("mark_removing", move |s| s.mark_removing(&id).map(|_| ()));
            }
            self.inner
                .metrics
                .acquisition_wait(asked.elapsed().as_secs_f64());
            // A taken slot may leave less idle capacity than the policy wants: refill now. A
            // pass while enough is still idle would only cost a plugin Update per job (on the
            // cores the job is starting on); the next interval's pass sees the same.
            let p = self.inner.policy();
            if (p.idle_count > 0 || p.scale_factor > 0.0 || self.inner.cfg.forecast.is_some())
                && self.inner.idle_short()
            {
                self.inner.wake.notify_one();
            }
            let cfg = &self.inner.cfg;
            return Ok(Acquisition {
                key: key.to_string(),
                instance_id,
                slot,
                slots,
                resources: cfg
                    .instance_resources
                    .map(|r| r.share(slots, cfg.capacity_per_instance)),
                connect_info,
                lost,
            });
        }
    }

    /// Free a reservation or acquisition; counts towards the instance's idle time.
    pub fn release(&self, key: &str) {
        if let Some(store) = &self.inner.store {
            let k = key.to_string();
            store.enqueue("release", move |s| s.release(&k).map(|_| ()));
        }
        let idle_time = self.inner.policy().idle_time;
        let used_up = {
            let mut book = self.inner.lock();
            let max_use = self.inner.cfg.max_use_count;
            let left = book
                .reserved_slots
                .saturating_sub(book.reservations.get(key).map_or(0, |r| u64::from(r.slots)));
            book.arrivals
                .depart(self.inner.cfg.forecast.as_ref(), Instant::now(), left);
            if let Some(Reservation {
                at: Some((id, _)),
                exclusive,
                ..
            }) = book.remove_reservation(key)
                && let Some(inst) = book.instances.get_mut(&id)
            {
                inst.free_slots_of(key);
                let free = inst.acquired() == 0;
                if free {
                    inst.idle_since = Instant::now();
                }
                if exclusive && inst.condemned.is_none() {
                    tracing::info!(instance = %id, "instance-level job done: removing its instance");
                    inst.condemned = Some(RemovalCause::Exclusive);
                }
                // Used up, taken whole, or idle_time 0: it goes now rather than at the next
                // interval.
                let due = free
                    && ((max_use > 0 && inst.uses >= max_use)
                        || inst.exclusive
                        || idle_time.is_zero());
                book.touch(&id, &self.inner.cfg);
                due
            } else {
                false
            }
        };
        self.inner.bump();
        if used_up {
            self.inner.wake.notify_one();
        }
    }

    /// Counts for status output.
    pub fn stats(&self) -> Stats {
        let book = self.inner.lock();
        let t = &book.totals;
        Stats {
            instances: book.instances.len(),
            running: usize::try_from(t.by_state[state_index(State::Running)]).unwrap_or(usize::MAX),
            pending: book.pending() as usize,
            acquired: usize::try_from(t.held).unwrap_or(usize::MAX),
            created: book.created,
            removed: book.removed,
        }
    }

    /// Every instance with its slots, oldest first (status pages; copies under one lock).
    pub fn instances(&self) -> Vec<InstanceStatus> {
        let now = Instant::now();
        let book = self.inner.lock();
        let mut out: Vec<InstanceStatus> = book
            .instances
            .iter()
            .map(|(id, i)| InstanceStatus {
                id: id.clone(),
                state: i.state,
                age: now.saturating_duration_since(i.created),
                uses: i.uses,
                slots: i.slots.clone(),
                ready: i.ready && i.persisted && !i.preexisting,
                removing: i.removing || i.condemned.is_some() || i.preexisting,
                exclusive: i.exclusive,
                connect_info: i.info.clone(),
            })
            .collect();
        drop(book);
        out.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.id.cmp(&b.id)));
        out
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

async fn run_loop(inner: Arc<Inner>) {
    if let Some(store) = &inner.store {
        match store.load().await {
            Ok(snap) => {
                *inner.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Some(snap);
            }
            Err(e) => {
                tracing::error!(error = %e, "state store unreadable; treating every instance as unknown")
            }
        }
    }
    // Ready checks in flight; dropping the set (the loop ends) aborts them.
    let mut checks = ReadyChecks::new();
    loop {
        // Shutdown must not wait for a slow plugin call; instances a cut-short pass asked for
        // are still found and deleted by the shutdown's own Update.
        tokio::select! {
            biased;
            _ = inner.stop.cancelled() => return,
            _ = inner.pass() => {}
        }
        inner.start_ready_checks(&mut checks);
        let interval = if inner.expecting() {
            inner.cfg.update_interval_when_expecting
        } else {
            inner.cfg.update_interval
        };
        let until = Instant::now() + interval;
        loop {
            tokio::select! {
                biased;
                _ = inner.stop.cancelled() => return,
                Some(done) = checks.join_next(), if !checks.is_empty() => {
                    match done {
                        Ok((id, result)) => inner.finish_ready_check(&id, result),
                        Err(e) => tracing::warn!(error = %e, "ready check task failed"),
                    }
                }
                _ = inner.wake.notified() => break,
                _ = tokio::time::sleep_until(until) => break,
            }
        }
    }
}

/// Ready checks under way: instance id and outcome.
type ReadyChecks = tokio::task::JoinSet<(String, Result<(), String>)>;

/// Where `try_assign` put a reservation.
struct Assigned {
    id: String,
    slot: u32,
    slots: u32,
    /// The job takes the whole instance.
    exclusive: bool,
    lost: CancellationToken,
    info: Option<ConnectInfo>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Book> {
        // A poisoned lock only means another task panicked mid-update; the book stays usable.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Undo an assignment whose heartbeat failed; condemn the instance past the threshold.
    fn failed_heartbeat(&self, key: &str, id: &str, slot: u32, why: &str) {
        let mut book = self.lock();
        // Undo only what this acquire still holds (a concurrent release may have freed it).
        if book.reservations.get(key).and_then(|r| r.at.as_ref()) != Some(&(id.to_string(), slot)) {
            return;
        }
        book.set_at(key, None);
        if let Some(inst) = book.instances.get_mut(id) {
            if inst.free_slots_of(key) == 0 {
                return;
            }
            inst.uses = inst.uses.saturating_sub(1);
            inst.exclusive = false;
            inst.failures += 1;
            tracing::warn!(instance = %id, failures = inst.failures, error = %why, "heartbeat failed");
            if inst.failures >= self.cfg.failure_threshold.max(1) {
                inst.condemned = Some(RemovalCause::Unhealthy);
            }
            book.touch(id, &self.cfg);
        }
        drop(book);
        self.wake.notify_one();
    }

    fn healthy(&self, id: &str) {
        if let Some(inst) = self.lock().instances.get_mut(id) {
            inst.failures = 0;
        }
    }

    /// Start the ready hook on running instances that have not passed it yet and have no
    /// check under way. Checks run beside the loop (a slow `instance_ready_command` must not
    /// hold up scaling); their results come back through [`Inner::finish_ready_check`].
    fn start_ready_checks(self: &Arc<Self>, checks: &mut ReadyChecks) {
        let Some(hooks) = &self.hooks else { return };
        let due: Vec<(String, Option<ConnectInfo>)> = {
            let mut book = self.lock();
            if book.totals.unready == 0 {
                return;
            }
            let due: Vec<(String, Option<ConnectInfo>)> = book
                .instances
                .iter()
                .filter(|(_, i)| i.counted.unready && !i.checking)
                .map(|(id, i)| (id.clone(), i.info.clone()))
                .collect();
            for (id, _) in &due {
                if let Some(inst) = book.instances.get_mut(id) {
                    inst.checking = true;
                }
            }
            due
        };
        for (id, info) in due {
            let inner = self.clone();
            let hooks = hooks.clone();
            checks.spawn(async move {
                let info = match info {
                    Some(info) => info,
                    None => match inner.fetch_connect_info(&id).await {
                        Ok(info) => info,
                        Err(e) => return (id, Err(e.to_string())),
                    },
                };
                let result =
                    match tokio::time::timeout(READY_CHECK_TIMEOUT, hooks.ready(&info)).await {
                        Ok(r) => r,
                        Err(_) => Err(format!("no answer within {READY_CHECK_TIMEOUT:?}")),
                    };
                (id, result)
            });
        }
    }

    /// Apply a finished ready check: the instance takes jobs, or is replaced (with backoff on
    /// scale-up, as GitLab 17.0, against thrashing).
    fn finish_ready_check(&self, id: &str, result: Result<(), String>) {
        let mut book = self.lock();
        if let Some(inst) = book.instances.get_mut(id) {
            inst.checking = false;
        }
        match result {
            Ok(()) => {
                book.ready_failures = 0;
                if let Some(inst) = book.instances.get_mut(id) {
                    inst.ready = true;
                    if let Some(t) = inst.running_at {
                        self.metrics.readiness(t.elapsed().as_secs_f64());
                    }
                    self.metrics
                        .instance_ready(inst.created.elapsed().as_secs_f64());
                }
                book.touch(id, &self.cfg);
            }
            Err(why) => {
                tracing::warn!(instance = %id, error = %why, "instance_ready_command failed");
                book.ready_failures += 1;
                let backoff =
                    Duration::from_secs(1u64 << book.ready_failures.min(9)).min(READY_BACKOFF_MAX);
                book.scale_up_after = Some(Instant::now() + backoff);
                if let Some(inst) = book.instances.get_mut(id) {
                    inst.condemned = Some(RemovalCause::NotReady);
                }
                book.touch(id, &self.cfg);
            }
        }
        drop(book);
        self.bump();
        self.wake.notify_one();
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

    /// Whether the idle slots (with those of instances on their way) fall short of what the
    /// policy wants idle beside the pending jobs.
    fn idle_short(&self) -> bool {
        let book = self.lock();
        let d = self.demand(&book);
        let coming = u64::from(book.requested) * u64::from(self.cfg.usable_slots_per_instance());
        u64::from(d.pending) + u64::from(d.idle_target) > book.totals.idle + coming
    }

    /// What this pass wants: pending jobs, the policy's idle target (with scale factor), and
    /// Slipway's forecast of arrivals before a new instance could be ready.
    fn demand(&self, book: &Book) -> Demand {
        let policy = self.policy();
        let in_use = u32::try_from(book.totals.held).unwrap_or(u32::MAX);
        let mut idle_target = policy.idle_target(in_use);
        let mut idle_time = policy.idle_time;
        if let Some(f) = &self.cfg.forecast {
            idle_target = idle_target.max(book.arrivals.idle_target(f, Instant::now()));
            idle_time = f.idle_time.unwrap_or(idle_time);
        }
        Demand {
            pending: book.pending(),
            idle_target,
            idle_time,
            requested: book.requested,
        }
    }

    /// Make room for pending jobs of several slots, which need them on one instance: add
    /// instances when the free room is too scattered, and keep idle ones meanwhile. Jobs that
    /// take a whole instance get fresh ones (never used, or still being created) first.
    fn fit_large_jobs(&self, book: &Book, d: &mut decision::Decision, views: &[InstanceView]) {
        let pending = book.reservations.values().filter(|r| r.at.is_none());
        let (whole, large): (Vec<&Reservation>, Vec<&Reservation>) = pending
            .filter(|r| r.exclusive || r.slots > 1)
            .partition(|r| r.exclusive);
        if whole.is_empty() && large.is_empty() {
            return;
        }
        let large: Vec<u32> = large.iter().map(|r| r.slots).collect();
        d.remove.retain(|(_, cause)| *cause != RemovalCause::Idle);
        let cap = self.cfg.capacity_per_instance.max(1);
        let open: Vec<&Instance> = book
            .instances
            .values()
            .filter(|i| matches!(i.state, State::Creating | State::Running))
            .filter(|i| !i.removing && !i.preexisting && i.condemned.is_none())
            .filter(|i| i.free_slots(&self.cfg) > 0)
            .collect();
        let fresh = open.iter().filter(|i| i.fresh()).count() + book.requested as usize;
        // Whole-instance jobs take fresh instances first; what is left of them serves the rest.
        let mut spare_fresh = fresh.saturating_sub(whole.len());
        let mut free: Vec<u32> = Vec::with_capacity(open.len() + book.requested as usize);
        for i in &open {
            if i.fresh() && spare_fresh == 0 {
                continue;
            }
            if i.fresh() {
                spare_fresh -= 1;
            }
            free.push(cap.saturating_sub(i.held));
        }
        free.extend(std::iter::repeat_n(cap, spare_fresh));
        let whole_short = whole.len().saturating_sub(fresh) as u64;
        let mut n = u64::from(crate::packing::instances_needed(&large, &free, cap)) + whole_short;
        let wanted = n;
        let existing = views.iter().filter(|v| v.state != State::Deleted).count() as u64
            + u64::from(book.requested);
        if self.cfg.max_instances > 0 {
            n = n.min(u64::from(self.cfg.max_instances).saturating_sub(existing));
        }
        if self.provider.max_size > 0 {
            n = n.min(self.provider.max_size.saturating_sub(existing));
        }
        d.increase = d.increase.max(u32::try_from(n).unwrap_or(u32::MAX));
        // At the instance limit, idle used instances make room for whole-instance jobs now:
        // they can never serve one, and would hold the limit until their idle_time.
        let room = wanted.saturating_sub(n).min(whole_short) as usize;
        if room > 0 {
            let idle_used: Vec<String> = book
                .instances
                .iter()
                .filter(|(_, i)| i.state == State::Running && i.held == 0 && !i.fresh())
                .filter(|(_, i)| !i.removing && !i.preexisting && i.condemned.is_none())
                .map(|(id, _)| id.clone())
                .filter(|id| !d.remove.iter().any(|(r, _)| r == id))
                .take(room)
                .collect();
            d.remove
                .extend(idle_used.into_iter().map(|id| (id, RemovalCause::Idle)));
        }
    }

    /// Limit `wanted` creations by the scale throttle's token bucket.
    fn throttle(&self, book: &mut Book, wanted: u32) -> u32 {
        let Some(rate) = self.cfg.scale_throttle.limit else {
            return wanted;
        };
        let burst = f64::from(self.cfg.scale_throttle.burst.max(1));
        let now = Instant::now();
        let last = book.tokens_at.unwrap_or_else(|| {
            book.tokens = burst;
            now
        });
        book.tokens =
            (book.tokens + now.saturating_duration_since(last).as_secs_f64() * rate).min(burst);
        book.tokens_at = Some(now);
        let allowed = (book.tokens.floor().clamp(0.0, f64::from(u32::MAX)) as u32).min(wanted);
        book.tokens -= f64::from(allowed);
        if allowed < wanted {
            tracing::debug!(wanted, allowed, "scale_throttle limits instance creation");
        }
        allowed
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn expecting(&self) -> bool {
        let book = self.lock();
        book.requested > 0 || book.pending() > 0 || book.totals.flux > 0
    }

    /// Pick slots for `key`: pack onto the busiest running instance first, oldest on ties.
    fn try_assign(&self, key: &str) -> Result<Option<Assigned>, Error> {
        let mut book = self.lock();
        let want = match book.reservations.get(key) {
            None => return Err(Error::NotReserved(key.to_string())),
            Some(Reservation {
                at: Some((id, slot)),
                slots,
                exclusive,
            }) => {
                let inst = book.instances.get(id);
                return Ok(Some(Assigned {
                    id: id.clone(),
                    slot: *slot,
                    slots: *slots,
                    exclusive: *exclusive,
                    lost: inst.map(|i| i.lost.clone()).unwrap_or_default(),
                    info: inst.and_then(|i| self.fresh_info(i)),
                }));
            }
            Some(Reservation {
                at: None,
                slots,
                exclusive,
            }) => (*slots, *exclusive),
        };
        let (want, exclusive) = want;
        let cfg = &self.cfg;
        // Busiest first, oldest on ties; only instances with room are indexed, so a one-slot
        // job takes the first entry. A whole-instance job takes only a fresh one.
        let best = book
            .assignable
            .iter()
            .rev()
            .map(|(_, _, id)| id)
            .find(|id| {
                book.instances.get(*id).is_some_and(|i| {
                    i.assignable(cfg) && i.fits(want, cfg) && (!exclusive || i.fresh())
                })
            })
            .cloned();
        let Some(id) = best else { return Ok(None) };
        let Some(inst) = book.instances.get_mut(&id) else {
            return Ok(None);
        };
        let Some(slot) = inst.take_slots(want, key) else {
            return Ok(None);
        };
        let info = self.fresh_info(inst);
        inst.uses += 1;
        inst.exclusive = exclusive;
        let assigned = Assigned {
            id: id.clone(),
            slot,
            slots: want,
            exclusive,
            lost: inst.lost.clone(),
            info,
        };
        book.touch(&id, cfg);
        book.set_at(key, Some((id, slot)));
        Ok(Some(assigned))
    }

    /// The instance's cached connect info unless its credentials expire within a minute
    /// (then `acquire` asks the plugin again).
    fn fresh_info(&self, inst: &Instance) -> Option<ConnectInfo> {
        let soon = self.wall_now() + CREDENTIALS_MARGIN;
        inst.info
            .clone()
            .filter(|i| i.expires.is_none_or(|t| t > soon))
    }

    async fn fetch_connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let info = call(self.group.connect_info(id)).await?;
        let mut book = self.lock();
        if let Some(inst) = book.instances.get_mut(id) {
            inst.info = Some(info.clone());
        }
        book.touch(id, &self.cfg);
        Ok(info)
    }

    /// One scaling pass: read the plugin's view, reconcile, decide, act.
    async fn pass(&self) {
        match call(self.group.update()).await {
            Ok(list) => {
                let work = self.reconcile(list);
                self.persist(work).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "plugin update failed; keeping last known state");
                // Until one Update succeeded we cannot tell our instances from pre-existing
                // ones: deciding now would scale up blind, then remove our own instances.
                if !self.lock().seen_first_update {
                    return;
                }
            }
        }
        self.prefetch_connect_info().await;

        let (decision, removing) = {
            let mut book = self.lock();
            if book.requested > 0
                && book
                    .requested_at
                    .is_some_and(|t| t.elapsed() > REQUEST_GRACE)
            {
                tracing::warn!(
                    requested = book.requested,
                    "plugin never listed requested instances; no longer counting them"
                );
                book.requested = 0;
            }
            let views: Vec<InstanceView> =
                book.instances.iter().map(|(id, i)| view(id, i)).collect();
            let demand = self.demand(&book);
            let mut d = decision::decide(
                &self.cfg,
                &views,
                &demand,
                self.provider.max_size,
                Instant::now(),
            );
            self.fit_large_jobs(&book, &mut d, &views);
            d.increase = self.throttle(&mut book, d.increase);
            for (id, inst) in &book.instances {
                let cause = if inst.preexisting {
                    Some(RemovalCause::Preexisting)
                } else {
                    inst.condemned
                };
                if let Some(cause) = cause
                    && !inst.removing
                    && inst.acquired() == 0
                    && !d.remove.iter().any(|(r, _)| r == id)
                {
                    d.remove.push((id.clone(), cause));
                }
            }
            if book.scale_up_after.is_some_and(|t| Instant::now() < t) {
                d.increase = 0;
            }
            for id in std::mem::take(&mut book.redelete) {
                if !d.remove.iter().any(|(r, _)| *r == id) {
                    d.remove.push((id, RemovalCause::Retry));
                }
            }
            // Mark before asking, so no acquisition lands on an instance being removed.
            let now = Instant::now();
            for (id, cause) in &d.remove {
                if let Some(inst) = book.instances.get_mut(id) {
                    inst.removing = true;
                    inst.removing_since = Some(now);
                    // A failed instance goes with its jobs: tell them now, before its deletion
                    // kills their processes, so none is taken for its script's own failure.
                    // It never takes a job again, even if this deletion is refused.
                    if inst.acquired() > 0 && !inst.lost.is_cancelled() {
                        tracing::warn!(instance = %id, jobs = inst.acquired(),
                            cause = cause.as_str(), "removing an instance under running jobs");
                        inst.lost.cancel();
                        inst.condemned.get_or_insert(*cause);
                    }
                }
                book.touch(id, &self.cfg);
            }
            #[cfg(debug_assertions)]
            book.check_counts(&self.cfg);
            (d.clone(), d.remove)
        };

        if !removing.is_empty() {
            self.remove(&removing).await;
        }
        if decision.increase > 0 && !self.stop.is_cancelled() {
            match call(self.group.increase(decision.increase)).await {
                Ok(n) => {
                    tracing::info!(requested = decision.increase, accepted = n, "scaling up");
                    self.metrics.scaled_up("demand", u64::from(n));
                    let mut book = self.lock();
                    book.requested += n;
                    book.requested_at = Some(Instant::now());
                    book.created += u64::from(n);
                }
                Err(e) => tracing::warn!(error = %e, "plugin increase failed"),
            }
        }
        self.update_gauges();
        self.bump();
    }

    fn update_gauges(&self) {
        let totals = self.lock().totals;
        let pending = self.lock().pending();
        let m = &self.metrics;
        for (i, state) in STATES.iter().enumerate() {
            m.set_instances(
                state.as_str(),
                i64::try_from(totals.by_state[i]).unwrap_or(i64::MAX),
            );
        }
        for (kind, n) in [
            ("idle", totals.idle),
            ("reserved", u64::from(pending)),
            ("acquired", totals.held),
        ] {
            m.set_slots(kind, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn reconcile(&self, list: Vec<(String, State)>) -> StoreWork {
        let mut work = StoreWork::default();
        let mut book = self.lock();
        let first = !book.seen_first_update;
        book.seen_first_update = true;
        if first && self.store.is_some() {
            self.restore(&mut book, &list, &mut work);
        }
        let reported: HashMap<String, State> = list.into_iter().collect();
        // Remember vanished ids for an hour: long enough for a flapping listing to settle.
        book.vanished.retain(|_, t| t.elapsed() < VANISHED_MEMORY);
        let gone: Vec<String> = book
            .instances
            .keys()
            .filter(|id| !matches!(reported.get(*id), Some(s) if *s != State::Deleted))
            .cloned()
            .collect();
        for id in gone {
            if let Some(inst) = book.remove_instance(&id) {
                let jobs = inst.acquired();
                if jobs > 0 {
                    tracing::warn!(instance = %id, jobs, "instance vanished under running jobs");
                }
                inst.lost.cancel();
                self.metrics.lifetime(inst.created.elapsed().as_secs_f64());
                let keys: Vec<String> = book
                    .reservations
                    .iter()
                    .filter(|(_, r)| matches!(&r.at, Some((i, _)) if *i == id))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in keys {
                    book.remove_reservation(&k);
                }
                book.vanished.insert(id.clone(), Instant::now());
                work.forget.push(id);
            }
        }
        let cap = self.cfg.capacity_per_instance.max(1) as usize;
        let mut book_retry = Vec::new();
        for (id, state) in reported {
            if state == State::Deleted {
                continue;
            }
            if let Some(inst) = book.instances.get_mut(&id) {
                if inst.state != state {
                    tracing::debug!(instance = %id, from = %inst.state, to = %state, "instance state");
                    if state == State::Running {
                        let now = Instant::now();
                        inst.idle_since = now;
                        if inst.running_at.is_none() {
                            inst.running_at = Some(now);
                            let secs = now.saturating_duration_since(inst.created).as_secs_f64();
                            self.metrics.creation(secs);
                            // Without a ready check, running is ready.
                            if inst.ready {
                                self.metrics.instance_ready(secs);
                            }
                        }
                    }
                }
                inst.state = state;
                // A deletion the plugin accepted but that never happened is asked for again.
                if inst.removing
                    && state != State::Deleting
                    && inst
                        .removing_since
                        .is_some_and(|t| t.elapsed() >= self.cfg.deletion_retry_interval)
                {
                    // It stays out of service: only the Decrease is sent again.
                    tracing::warn!(instance = %id, "deletion had no effect; retrying");
                    inst.removing_since = None;
                    book_retry.push(id.clone());
                }
                if !inst.persisted
                    && !inst.preexisting
                    && !inst.removing
                    && !first
                    && self.store.is_some()
                {
                    // An earlier record failed (or a restore was not written): try again, so
                    // the instance can take jobs once its record is on disk.
                    work.record.push(InstanceRecord {
                        id: id.clone(),
                        state,
                        use_count: u64::from(inst.uses),
                        created_at_ms: crate::store::unix_ms(self.wall_now()),
                        connect_info: inst.info.clone(),
                        removing: false,
                    });
                }
                book.touch(&id, &self.cfg);
                continue;
            }
            // Without saved state we cannot know a pre-existing instance's use count, so it is
            // not trusted (GitLab's rule with state storage off).
            // An instance that left the plugin's list and came back lost its use count with
            // it: like a pre-existing one, it is removed, never used again.
            let returned = book.vanished.remove(&id).is_some();
            let removing = (first || returned) && !matches!(state, State::Deleting);
            if returned {
                tracing::warn!(instance = %id, "instance reappeared after vanishing; removing it for safety");
            } else if removing {
                tracing::warn!(instance = %id, "no data on pre-existing instance; removing it for safety");
            }
            if !removing {
                book.requested = book.requested.saturating_sub(1);
            }
            let now = Instant::now();
            book.add_instance(
                &id,
                Instance {
                    state,
                    slots: vec![None; cap],
                    held: 0,
                    uses: 0,
                    removing: false,
                    idle_since: now,
                    created: now,
                    info: None,
                    lost: CancellationToken::new(),
                    preexisting: false,
                    removing_since: None,
                    ready: self.hooks.is_none(),
                    condemned: None,
                    failures: 0,
                    persisted: self.store.is_none(),
                    running_at: (state == State::Running).then_some(now),
                    counted: Counted::default(),
                    checking: false,
                    exclusive: false,
                },
                &self.cfg,
            );
            if removing && let Some(inst) = book.instances.get_mut(&id) {
                inst.preexisting = true;
                book.touch(&id, &self.cfg);
            } else if self.store.is_some() {
                work.record.push(InstanceRecord {
                    id: id.clone(),
                    state,
                    use_count: 0,
                    created_at_ms: crate::store::unix_ms(self.wall_now()),
                    connect_info: None,
                    removing: false,
                });
            }
        }
        book.redelete.extend(book_retry);
        if book.requested == 0 {
            book.requested_at = None;
        }
        work
    }

    /// First Update with a state store: adopt what the store knows, remove the rest.
    fn restore(&self, book: &mut Book, live: &[(String, State)], work: &mut StoreWork) {
        let snapshot = self
            .snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default();
        let plan = plan_restore(
            &snapshot,
            live,
            u64::from(self.cfg.max_use_count),
            self.keep_instance_with_acquisitions,
        );
        let cap = self.cfg.capacity_per_instance.max(1) as usize;
        let now = Instant::now();
        let state_of = |id: &str| live.iter().find(|(i, _)| i == id).map(|(_, s)| *s);
        let mut insert = |id: &str, uses: u32, info: Option<ConnectInfo>, doomed: bool| {
            let Some(state) = state_of(id) else { return };
            book.add_instance(
                id,
                Instance {
                    state,
                    slots: vec![None; cap],
                    held: 0,
                    uses,
                    removing: false,
                    idle_since: now,
                    created: now,
                    info,
                    lost: CancellationToken::new(),
                    preexisting: doomed,
                    removing_since: None,
                    // Its ready command runs again: its earlier run may not have finished.
                    ready: self.hooks.is_none(),
                    condemned: None,
                    failures: 0,
                    // Usable once the restore is on disk.
                    persisted: false,
                    running_at: Some(now),
                    counted: Counted::default(),
                    checking: false,
                    exclusive: false,
                },
                &self.cfg,
            );
        };
        for rec in &plan.adopt {
            tracing::info!(instance = %rec.id, uses = rec.use_count, "adopting instance from state store");
            let uses = u32::try_from(rec.use_count).unwrap_or(u32::MAX);
            insert(&rec.id, uses, rec.connect_info.clone(), false);
        }
        for (id, reason) in &plan.delete {
            tracing::warn!(instance = %id, %reason, "removing instance found at restart");
            insert(id, 0, None, true);
        }
        for job in &plan.failed_jobs {
            tracing::warn!(job = %job.job_ref, instance = %job.instance_id,
                "job was running when the manager stopped; it cannot resume and is reported failed");
        }
        self.restored_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(plan.failed_jobs.iter().cloned());
        work.restore = Some(plan);
    }

    /// Write what a reconcile found; new instances become usable once recorded.
    async fn persist(&self, work: StoreWork) {
        let Some(store) = &self.store else { return };
        if let Some(plan) = work.restore {
            let reports: Vec<(String, String)> = plan
                .failed_jobs
                .iter()
                .map(|a| {
                    let report = serde_json::json!({
                        "state": "failed",
                        "failure_reason": "runner_system_failure",
                        "message": format!("the manager restarted while the job ran on instance {}", a.instance_id),
                    });
                    (a.job_ref.clone(), report.to_string())
                })
                .collect();
            let adopted: Vec<String> = plan.adopt.iter().map(|r| r.id.clone()).collect();
            match store.apply_restore(plan, reports).await {
                Ok(()) => {
                    let mut book = self.lock();
                    for id in adopted {
                        if let Some(inst) = book.instances.get_mut(&id) {
                            inst.persisted = true;
                        }
                        book.touch(&id, &self.cfg);
                    }
                }
                Err(e) => tracing::error!(error = %e,
                    "state store: recording the restore failed; restored instances stay unused"),
            }
        }
        for id in work.forget {
            store.enqueue("forget_instance", move |s| {
                s.forget_instance(&id).map(|_| ())
            });
        }
        for rec in work.record {
            let id = rec.id.clone();
            match store.record_instance(rec).await {
                Ok(()) => {
                    let mut book = self.lock();
                    if let Some(inst) = book.instances.get_mut(&id) {
                        inst.persisted = true;
                    }
                    book.touch(&id, &self.cfg);
                }
                Err(e) => {
                    tracing::error!(instance = %id, error = %e, "state store: instance not recorded; it stays unused")
                }
            }
        }
    }

    async fn prefetch_connect_info(&self) {
        let missing: Vec<String> = {
            let book = self.lock();
            if book.totals.no_info == 0 {
                return;
            }
            book.instances
                .iter()
                .filter(|(_, i)| i.counted.no_info)
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in missing {
            if let Err(e) = self.fetch_connect_info(&id).await {
                tracing::warn!(instance = %id, error = %e, "connect info unavailable");
            }
        }
    }

    async fn remove(&self, removing: &[(String, RemovalCause)]) {
        let ids: Vec<String> = removing.iter().map(|(id, _)| id.clone()).collect();
        for (id, cause) in removing {
            tracing::info!(instance = %id, cause = cause.as_str(), "removing instance");
        }
        if let Some(hooks) = &self.hooks {
            futures::future::join_all(ids.iter().map(|id| async move {
                if tokio::time::timeout(REMOVING_HOOK_TIMEOUT, hooks.removing(id))
                    .await
                    .is_err()
                {
                    tracing::warn!(instance = %id, "runner cleanup before removal: no answer within {REMOVING_HOOK_TIMEOUT:?}");
                }
            }))
            .await;
        }
        match call(self.group.decrease(&ids)).await {
            Ok(accepted) => {
                for (id, cause) in removing {
                    if accepted.contains(id) {
                        self.metrics.scaled_down(cause.as_str());
                    }
                }
                if let Some(store) = &self.store {
                    for id in &accepted {
                        let id = id.clone();
                        store.enqueue("mark_removing", move |s| s.mark_removing(&id).map(|_| ()));
                    }
                }
                let mut book = self.lock();
                book.removed += accepted.len() as u64;
                for id in ids.iter().filter(|id| !accepted.contains(id)) {
                    if let Some(inst) = book.instances.get_mut(id) {
                        inst.removing = false;
                    }
                    book.touch(id, &self.cfg);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "plugin decrease failed; will retry");
                let mut book = self.lock();
                for id in &ids {
                    if let Some(inst) = book.instances.get_mut(id) {
                        inst.removing = false;
                    }
                    book.touch(id, &self.cfg);
                }
            }
        }
    }

    async fn delete_all(&self) {
        let poll = self
            .cfg
            .shutdown_deletion_interval
            .min(Duration::from_millis(250));
        for _ in 0..=self.cfg.shutdown_deletion_retries {
            let Some(alive) = self.alive_instances().await else {
                tokio::time::sleep(poll).await;
                continue;
            };
            if alive.is_empty() {
                return;
            }
            tracing::info!(count = alive.len(), "deleting instances on shutdown");
            if let Err(e) = call(self.group.decrease(&alive)).await {
                tracing::warn!(error = %e, "decrease failed during shutdown deletion");
            }
            let until = Instant::now() + self.cfg.shutdown_deletion_interval;
            while Instant::now() < until {
                tokio::time::sleep(poll).await;
                if self.alive_instances().await.is_some_and(|a| a.is_empty()) {
                    return;
                }
            }
        }
        tracing::warn!("instances may remain after shutdown deletion retries");
    }

    async fn alive_instances(&self) -> Option<Vec<String>> {
        match call(self.group.update()).await {
            Ok(list) => Some(
                list.into_iter()
                    .filter(|(_, s)| *s != State::Deleted)
                    .map(|(id, _)| id)
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "update failed during shutdown deletion");
                None
            }
        }
    }
}

/// State-store writes decided during a reconcile, done after the lock is released.
#[derive(Default)]
struct StoreWork {
    restore: Option<RestorePlan>,
    record: Vec<InstanceRecord>,
    forget: Vec<String>,
}

fn view(id: &str, i: &Instance) -> InstanceView {
    InstanceView {
        id: id.to_string(),
        state: i.state,
        acquired: i.acquired(),
        uses: i.uses,
        // Instances on their way out offer no capacity to the decision.
        removing: i.removing || i.preexisting || i.condemned.is_some(),
        idle_since: i.idle_since,
    }
}
