//! The state store: restoring instances and failed jobs at the first Update, and writing
//! what each reconcile found.

use slipway_fleeting::{ConnectInfo, State};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::book::{Book, Counted, Instance};
use crate::store::{InstanceRecord, RestorePlan, plan_restore};

impl Inner {
    /// First Update with a state store: adopt what the store knows, remove the rest.
    pub(super) fn restore(&self, book: &mut Book, live: &[(String, State)], work: &mut StoreWork) {
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
        work.restore = Some(plan);
    }

    /// Write what a reconcile found; new instances become usable once recorded.
    pub(super) async fn persist(&self, work: StoreWork) {
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
}

/// State-store writes decided during a reconcile, done after the lock is released.
#[derive(Default)]
pub(super) struct StoreWork {
    pub(super) restore: Option<RestorePlan>,
    pub(super) record: Vec<InstanceRecord>,
    pub(super) forget: Vec<String>,
}
