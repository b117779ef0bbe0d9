//! The book: every instance with its slots, every reservation, and the running totals and
//! index kept beside them so the hot path never scans the fleet.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use slipway_fleeting::{ConnectInfo, State};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::decision::{self, RemovalCause};
use crate::forecast::Arrivals;

#[derive(Debug)]
pub(super) struct Instance {
    pub(super) state: State,
    pub(super) slots: Vec<Option<String>>,
    /// How many of `slots` are held.
    pub(super) held: u32,
    pub(super) uses: u32,
    pub(super) removing: bool,
    pub(super) idle_since: Instant,
    pub(super) created: Instant,
    pub(super) info: Option<ConnectInfo>,
    pub(super) lost: CancellationToken,
    /// Found at startup with no record of its use: removed, never used.
    pub(super) preexisting: bool,
    /// When Decrease was asked for; retried after `deletion_retry_interval`.
    pub(super) removing_since: Option<Instant>,
    /// Passed `instance_ready_command` (or there is none): may take jobs.
    pub(super) ready: bool,
    /// Removal decided outside the scale decision (not ready, unhealthy), with why.
    pub(super) condemned: Option<RemovalCause>,
    /// Consecutive failed heartbeats.
    pub(super) failures: u32,
    /// Recorded in the state store (always true without one): only then may it take jobs.
    pub(super) persisted: bool,
    /// When it was first seen running.
    pub(super) running_at: Option<Instant>,
    /// What it adds to the book's index and totals, as of its last `touch`.
    pub(super) counted: Counted,
    /// A ready check is under way.
    pub(super) checking: bool,
    /// Taken whole by a job at the `instance` isolation level: it takes nothing else, and goes
    /// when that job is done.
    pub(super) exclusive: bool,
    /// Its cloud takes it away at this time (a preemption notice): it takes no new job, and
    /// goes when empty or then.
    pub(super) preempted: Option<Instant>,
    /// When it was last asked about preemption, and whether an answer is awaited.
    pub(super) preemption_asked: Option<Instant>,
    pub(super) preemption_checking: bool,
}

/// One instance's share of the book's running totals and index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counted {
    /// Held slots when entered in `Book::assignable`, if it is there.
    indexed: Option<u32>,
    idle: u32,
    held: u32,
    /// Index into `Totals::by_state`; `None` before the first touch.
    state: Option<usize>,
    /// Creating, deleting or being removed: the loop polls faster.
    flux: bool,
    /// Running without connect info yet.
    pub(super) no_info: bool,
    /// Running, waiting for its ready command.
    pub(super) unready: bool,
}

/// Totals over every instance, kept up to date by `Book::touch` so nothing on the hot path
/// (or in gauges and status) scans the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Totals {
    pub(super) idle: u64,
    pub(super) held: u64,
    pub(super) by_state: [u64; 5],
    pub(super) flux: u64,
    pub(super) no_info: u64,
    pub(super) unready: u64,
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

pub(super) const STATES: [State; 5] = [
    State::Creating,
    State::Running,
    State::Deleting,
    State::Deleted,
    State::Timeout,
];

pub(super) fn state_index(s: State) -> usize {
    STATES.iter().position(|x| *x == s).unwrap_or(0)
}

impl Instance {
    /// Slots it can hand out now (as the decision sees it, without building a view).
    pub(super) fn free_slots(&self, cfg: &Config) -> u32 {
        let leaving = self.removing
            || self.preexisting
            || self.condemned.is_some()
            || self.exclusive
            || self.preempted.is_some();
        decision::free_slots_of(cfg, self.state, leaving, self.acquired(), self.uses)
    }

    /// Slots held now (kept as a count: the hot path asks for it on every instance).
    pub(super) fn acquired(&self) -> u32 {
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
    pub(super) fn take_slots(&mut self, n: u32, key: &str) -> Option<u32> {
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
    pub(super) fn free_slots_of(&mut self, key: &str) -> u32 {
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
    pub(super) fn assignable(&self, cfg: &Config) -> bool {
        self.state == State::Running
            && self.ready
            && self.persisted
            && !self.preexisting
            && !self.removing
            && self.condemned.is_none()
            && self.preempted.is_none()
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
    pub(super) fn fits(&self, n: u32, cfg: &Config) -> bool {
        let cap = self.slots.len() as u32;
        cap.saturating_sub(self.held) >= n && self.free_slots(cfg) > 0
    }

    /// Never used and holding nothing: what a job at the `instance` level may take.
    pub(super) fn fresh(&self) -> bool {
        self.uses == 0 && self.held == 0 && !self.exclusive
    }
}

/// A job's hold on capacity: how many slots it needs, and where once acquired.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reservation {
    pub(super) slots: u32,
    /// (instance, first slot) once acquired.
    pub(super) at: Option<(String, u32)>,
    /// Wants a fresh instance of its own (every slot), removed after the job.
    pub(super) exclusive: bool,
}

#[derive(Debug, Default)]
pub(super) struct Book {
    pub(super) instances: BTreeMap<String, Instance>,
    pub(super) reservations: HashMap<String, Reservation>,
    /// Slots of reservations not yet acquired (kept as a count: `reserve` reads it per job).
    pending_slots: u32,
    /// Slots of every reservation, pending or acquired.
    pub(super) reserved_slots: u64,
    /// Instances that may take a job now, busiest first when iterated in reverse (oldest on
    /// ties): the hot path picks from here instead of scanning every instance.
    pub(super) assignable: BTreeSet<(u32, Reverse<Instant>, String)>,
    /// Idle slots, held slots, instances by state and the like, over every instance.
    pub(super) totals: Totals,
    pub(super) requested: u32,
    pub(super) requested_at: Option<Instant>,
    pub(super) seen_first_update: bool,
    /// Recent reservation times, for the demand forecast.
    pub(super) arrivals: Arrivals,
    /// Token bucket on creations: tokens and when they were last topped up.
    pub(super) tokens: f64,
    pub(super) tokens_at: Option<Instant>,
    /// Consecutive instances whose ready command failed, and no scale-up before this time
    /// (exponential backoff against thrashing, as GitLab 17.0).
    pub(super) ready_failures: u32,
    pub(super) scale_up_after: Option<Instant>,
    /// Instances whose accepted deletion had no effect: Decrease is sent again.
    pub(super) redelete: Vec<String>,
    /// Ids that left the plugin's list, and when.
    pub(super) vanished: HashMap<String, Instant>,
    pub(super) created: u64,
    pub(super) removed: u64,
    /// `Increase` calls refused for lack of capacity since capacity last came.
    pub(super) refusals: crate::fallback::Refusals,
    /// Instances another manager sharing the state store holds (as of the last pass).
    pub(super) foreign: std::collections::HashSet<String>,
    /// Another manager shares the state store and its lease runs.
    pub(super) others_live: bool,
    /// Listed instances no one has recorded yet while another manager runs (it may be that
    /// manager's newest), with when they were first seen.
    pub(super) unclaimed: HashMap<String, Instant>,
}

impl Book {
    /// Bring `id`'s entries in `assignable` and `totals` up to date after a change; every
    /// change to an instance's state, flags, slots, uses or connect info is followed by this.
    pub(super) fn touch(&mut self, id: &str, cfg: &Config) {
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
    pub(super) fn add_instance(&mut self, id: &str, inst: Instance, cfg: &Config) {
        if let Some(old) = self.instances.insert(id.to_string(), inst) {
            self.uncount(id, &old);
        }
        self.touch(id, cfg);
    }

    /// Remove an instance and its entries.
    pub(super) fn remove_instance(&mut self, id: &str) -> Option<Instance> {
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
    pub(super) fn check_counts(&self, cfg: &Config) {
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
    pub(super) fn pending(&self) -> u32 {
        self.pending_slots
    }

    pub(super) fn add_reservation(&mut self, key: &str, slots: u32, exclusive: bool) {
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

    pub(super) fn remove_reservation(&mut self, key: &str) -> Option<Reservation> {
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
    pub(super) fn set_at(&mut self, key: &str, at: Option<(String, u32)>) {
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
