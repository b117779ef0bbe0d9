//! The state store: restoring instances and failed jobs at the first Update, and writing
//! what each reconcile found.

use std::time::Duration;

use slipway_fleeting::{ConnectInfo, State};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::book::{Book, Counted, Instance};
use crate::store::{InstanceRecord, RestorePlan, Snapshot, plan_restore};

/// Shortest lease a manager holds on its instances in a shared state store: well beyond a plugin
/// call's own limit, so no slow call lets it lapse.
const MIN_LEASE: Duration = Duration::from_secs(300);

impl Inner {
    /// How long this manager's instances stay its own without a renewal: three scaling passes,
    /// five minutes at least.
    pub(super) fn lease(&self) -> Duration {
        (self.cfg.update_interval * 3).max(MIN_LEASE)
    }

    /// Read who holds what in the state store: other managers'
    /// instances go into the book's `foreign` set; instances another manager gave up (or held
    /// past its lease) are returned for adoption. Without a store, or when it cannot be read,
    /// the book keeps what it knew.
    pub(super) async fn read_ownership(&self) -> Option<Snapshot> {
        let store = self.store.as_ref()?;
        // The lease itself is renewed on its own timer (`renew_leases`), not every pass.
        let read = store
            .call(move |s| {
                let ownership = s.ownership()?;
                let adoptable = s.load_adoptable()?;
                Ok((ownership, adoptable))
            })
            .await;
        match read {
            Ok((ownership, snapshot)) => {
                let mut book = self.lock();
                if ownership.others.is_empty() == book.others_live {
                    tracing::info!(others = ?ownership.others, "managers sharing the state store");
                }
                book.others_live = !ownership.others.is_empty();
                book.foreign = ownership.foreign.into_iter().collect();
                Some(snapshot)
            }
            Err(e) => {
                tracing::warn!(error = %e, "state store: ownership unreadable; keeping what was known");
                None
            }
        }
    }

    /// Instances of `adoptable` (what the store lets this manager use) that the plugin lists
    /// and the book lacks: given up by another manager, or held by one gone past its lease.
    /// They are adopted as at a restart; those that held jobs are removed and the jobs failed.
    pub(super) fn adopt(
        &self,
        book: &mut Book,
        adoptable: Snapshot,
        live: &[(String, State)],
        work: &mut StoreWork,
    ) {
        let fresh: Vec<InstanceRecord> = adoptable
            .instances
            .into_iter()
            .filter(|r| {
                !book.instances.contains_key(&r.id) && live.iter().any(|(id, _)| *id == r.id)
            })
            .collect();
        if fresh.is_empty() {
            return;
        }
        let acquisitions = adoptable
            .acquisitions
            .into_iter()
            .filter(|a| fresh.iter().any(|r| r.id == a.instance_id))
            .collect();
        let live: Vec<(String, State)> = live
            .iter()
            .filter(|(id, _)| fresh.iter().any(|r| r.id == *id))
            .cloned()
            .collect();
        let snapshot = Snapshot {
            instances: fresh,
            acquisitions,
        };
        tracing::info!(
            instances = snapshot.instances.len(),
            "adopting instances another manager gave up"
        );
        self.apply_plan(book, &snapshot, &live, work);
    }

    /// First Update with a state store: adopt what the store knows, remove the rest.
    pub(super) fn restore(&self, book: &mut Book, live: &[(String, State)], work: &mut StoreWork) {
        let snapshot = self
            .snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default();
        // What another manager adopted since the snapshot was read is not this one's.
        let snapshot = Snapshot {
            instances: snapshot
                .instances
                .into_iter()
                .filter(|r| !book.foreign.contains(&r.id))
                .collect(),
            acquisitions: snapshot
                .acquisitions
                .into_iter()
                .filter(|a| !book.foreign.contains(&a.instance_id))
                .collect(),
        };
        // With another manager running, an instance no one recorded may be its newest: not
        // removed here, but left to the reconcile's wait for a record.
        let live: Vec<(String, State)> = if book.others_live {
            live.iter()
                .filter(|(id, _)| snapshot.instances.iter().any(|r| r.id == *id))
                .cloned()
                .collect()
        } else {
            live.to_vec()
        };
        self.apply_plan(book, &snapshot, &live, work);
    }

    /// Plan what to do with `snapshot`'s instances as `live` lists them, and enter them in the
    /// book: adopted ones usable once the plan is on disk, the rest removed.
    fn apply_plan(
        &self,
        book: &mut Book,
        snapshot: &Snapshot,
        live: &[(String, State)],
        work: &mut StoreWork,
    ) {
        let plan = plan_restore(
            snapshot,
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
                    preempted: None,
                    preemption_asked: None,
                    preemption_checking: false,
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
        self.restored_failure_instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(plan.failed_jobs.iter().map(|j| j.instance_id.clone()));
        work.restore.push(plan);
    }

    /// Give this manager's instances up in the state store (it stops without deleting them):
    /// another manager sharing the store adopts them at once.
    pub(super) async fn release_ownership(&self) {
        let Some(store) = &self.store else { return };
        match store.call(|s| s.release_ownership()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                instances = n,
                "instances given up for another manager to adopt"
            ),
            Err(e) => tracing::warn!(error = %e, "state store: could not give instances up; \
                another manager adopts them once this one's lease runs out"),
        }
    }

    /// Write what a reconcile found; new instances become usable once recorded.
    pub(super) async fn persist(&self, work: StoreWork) {
        let Some(store) = &self.store else { return };
        for plan in work.restore {
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
                Ok(lost) => {
                    let mut book = self.lock();
                    // Another manager adopted these first: they leave this one's book before
                    // any decision could use or remove them.
                    for id in &lost {
                        if book.instances.get(id).is_some_and(|i| i.acquired() == 0) {
                            tracing::info!(instance = %id, "adopted by another manager first; leaving it to that one");
                            book.remove_instance(id);
                        }
                    }
                    for id in adopted.iter().filter(|id| !lost.contains(id)) {
                        if let Some(inst) = book.instances.get_mut(id) {
                            inst.persisted = true;
                        }
                        book.touch(id, &self.cfg);
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
}

/// State-store writes decided during a reconcile, done after the lock is released.
#[derive(Default)]
pub(super) struct StoreWork {
    pub(super) restore: Vec<RestorePlan>,
    pub(super) record: Vec<InstanceRecord>,
    pub(super) forget: Vec<String>,
}
