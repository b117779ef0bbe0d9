//! Snapshots for status output and metrics gauges: counts, and a copy of every instance.

use std::time::Duration;

use slipway_fleeting::{ConnectInfo, State};
use tokio::time::Instant;

use super::book::{STATES, state_index};
use super::{Inner, Taskscaler};

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
    /// Its cloud takes it away (a preemption notice): it takes no new job.
    pub preempted: bool,
    /// How to reach it, once known.
    pub connect_info: Option<ConnectInfo>,
}

impl Taskscaler {
    /// Instance `id` is taken away by its cloud in `left` (a preemption notice a plugin or the
    /// runner learned of): it takes no new job and goes when empty or when `left` runs out.
    pub fn preempt(&self, id: &str, left: Duration) {
        self.inner.preempt(id, left);
    }

    /// Whether instance `id` has a preemption notice.
    pub fn is_preempted(&self, id: &str) -> bool {
        self.inner
            .lock()
            .instances
            .get(id)
            .is_some_and(|i| i.preempted.is_some())
    }

    /// `Increase` calls refused for lack of capacity since capacity last came.
    pub fn capacity_refusals(&self) -> crate::fallback::Refusals {
        self.inner.lock().refusals
    }

    /// Forget the refusals so far: the next run of them is timed from its own first.
    pub fn forget_capacity_refusals(&self) {
        self.inner.lock().refusals.clear();
    }

    /// Whether `key` is reserved here and still waits for a slot (not yet bound to one).
    pub fn is_waiting(&self, key: &str) -> bool {
        self.inner
            .lock()
            .reservations
            .get(key)
            .is_some_and(|r| r.at.is_none())
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
                preempted: i.preempted.is_some(),
                connect_info: i.info.clone(),
            })
            .collect();
        drop(book);
        out.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.id.cmp(&b.id)));
        out
    }
}

impl Inner {
    pub(super) fn update_gauges(&self) {
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
}
