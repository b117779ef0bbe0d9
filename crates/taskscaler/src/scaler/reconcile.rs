//! Reconciling the book with the plugin's list of instances: state changes, vanished and
//! new instances, and deletions to retry.

use std::collections::HashMap;
use std::time::Duration;

use slipway_fleeting::State;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::book::{Counted, Instance};
use super::restore::StoreWork;
use crate::store::InstanceRecord;

/// How long a vanished instance id is remembered.
const VANISHED_MEMORY: Duration = Duration::from_secs(3600);

impl Inner {
    pub(super) fn reconcile(
        &self,
        list: Vec<(String, State)>,
        adoptable: Option<crate::store::Snapshot>,
    ) -> StoreWork {
        let mut work = StoreWork::default();
        let mut book = self.lock();
        // Another manager's instances are not this one's to use, count or remove.
        let list = self.without_foreign(&mut book, list);
        let first = !book.seen_first_update;
        book.seen_first_update = true;
        if first && self.store.is_some() {
            self.restore(&mut book, &list, &mut work);
        } else if let Some(adoptable) = adoptable {
            self.adopt(&mut book, adoptable, &list, &mut work);
        }
        let reported: HashMap<String, State> = list.into_iter().collect();
        // Unrecorded instances no longer listed are no longer waited for.
        book.unclaimed.retain(|id, _| reported.contains_key(id));
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
            // With another manager running, an instance no one has recorded may be its newest:
            // left alone for a lease, unless this manager is waiting for instances itself.
            let mut unclaimed = false;
            if book.others_live && (first || book.requested == 0) {
                let seen = *book
                    .unclaimed
                    .entry(id.clone())
                    .or_insert_with(Instant::now);
                if seen.elapsed() < self.lease() {
                    continue;
                }
                book.unclaimed.remove(&id);
                unclaimed = true;
            }
            // Without saved state we cannot know a pre-existing instance's use count, so it is
            // not trusted (GitLab's rule with state storage off).
            // An instance that left the plugin's list and came back lost its use count with
            // it: like a pre-existing one, it is removed, never used again.
            let returned = book.vanished.remove(&id).is_some();
            let removing = (first || returned || unclaimed) && !matches!(state, State::Deleting);
            if unclaimed {
                tracing::warn!(instance = %id, "no manager recorded this instance within a lease; removing it for safety");
            } else if returned {
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
                    preempted: None,
                    preemption_asked: None,
                    preemption_checking: false,
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

    /// `list` without the instances another manager holds; one of them still in the book (its
    /// record went to the other manager first) leaves the book unless a job holds it.
    fn without_foreign(
        &self,
        book: &mut super::book::Book,
        list: Vec<(String, State)>,
    ) -> Vec<(String, State)> {
        if book.foreign.is_empty() {
            return list;
        }
        let taken: Vec<String> = book
            .instances
            .iter()
            .filter(|(id, i)| book.foreign.contains(*id) && i.acquired() == 0)
            .map(|(id, _)| id.clone())
            .collect();
        for id in taken {
            tracing::info!(instance = %id, "instance recorded by another manager first; leaving it to that one");
            book.remove_instance(&id);
        }
        list.into_iter()
            .filter(|(id, _)| !book.foreign.contains(id) || book.instances.contains_key(id))
            .collect()
    }
}
