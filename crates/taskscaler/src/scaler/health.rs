//! Instance health: ready checks on new instances (run beside the loop) and the heartbeats
//! that `acquire` reports back.

use std::sync::Arc;
use std::time::Duration;

use slipway_fleeting::{ConnectInfo, State};
use tokio::time::Instant;

use super::Inner;
use crate::decision::RemovalCause;

/// Longest an instance's ready check may take before it counts as failed.
const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(600);

/// Longest pause in scale-up after instances kept failing their ready command.
const READY_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Ready checks under way: instance id and outcome.
pub(super) type ReadyChecks = tokio::task::JoinSet<(String, Result<(), String>)>;
/// Preemption checks in flight: each ends with its instance's id and answer.
pub(super) type PreemptionChecks = tokio::task::JoinSet<(String, Result<Option<Duration>, String>)>;

/// Longest a preemption check may take.
const PREEMPTION_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

impl Inner {
    /// Undo an assignment whose heartbeat failed; condemn the instance past the threshold.
    pub(super) fn failed_heartbeat(&self, key: &str, id: &str, slot: u32, why: &str) {
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
            // An instance running nothing else goes at its first failed check: nothing on it
            // is lost, and the job it was meant for takes another slot. One running jobs
            // gets `failure_threshold` tries (a passing hiccup must not kill them).
            if inst.failures >= self.cfg.failure_threshold.max(1) || inst.acquired() == 0 {
                inst.condemned = Some(RemovalCause::Unhealthy);
            }
            book.touch(id, &self.cfg);
        }
        drop(book);
        self.wake.notify_one();
    }

    pub(super) fn healthy(&self, id: &str) {
        if let Some(inst) = self.lock().instances.get_mut(id) {
            inst.failures = 0;
        }
    }

    /// Start the ready hook on running instances that have not passed it yet and have no
    /// check under way. Checks run beside the loop (a slow `instance_ready_command` must not
    /// hold up scaling); their results come back through [`Inner::finish_ready_check`].
    pub(super) fn start_ready_checks(self: &Arc<Self>, checks: &mut ReadyChecks) {
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
            let hooks = hooks.clone();
            self.spawn_check(
                checks,
                id,
                info,
                READY_CHECK_TIMEOUT,
                move |info| async move { hooks.ready(&info).await },
            );
        }
    }

    /// Run `check` on instance `id` beside the loop, within `limit`, its connect info asked
    /// for first when not known yet; the answer lands in `set` with the id.
    fn spawn_check<T, F, Fut>(
        self: &Arc<Self>,
        set: &mut tokio::task::JoinSet<(String, Result<T, String>)>,
        id: String,
        info: Option<ConnectInfo>,
        limit: Duration,
        check: F,
    ) where
        T: Send + 'static,
        F: FnOnce(ConnectInfo) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, String>> + Send,
    {
        let inner = self.clone();
        set.spawn(async move {
            let info = match info {
                Some(info) => info,
                None => match inner.fetch_connect_info(&id).await {
                    Ok(info) => info,
                    Err(e) => return (id, Err(e.to_string())),
                },
            };
            let answer = match tokio::time::timeout(limit, check(info)).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {limit:?}")),
            };
            (id, answer)
        });
    }

    /// Apply a finished ready check: the instance takes jobs, or is replaced (with backoff on
    /// scale-up, as GitLab 17.0, against thrashing).
    pub(super) fn finish_ready_check(&self, id: &str, result: Result<(), String>) {
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
}

impl Inner {
    /// Ask every ready instance not asked within `preemption_check_interval` whether its cloud
    /// is taking it away; the answers come back through [`Inner::finish_preemption_check`].
    pub(super) fn start_preemption_checks(self: &Arc<Self>, checks: &mut PreemptionChecks) {
        let (Some(hooks), Some(every)) = (&self.hooks, self.cfg.preemption_check_interval) else {
            return;
        };
        let now = Instant::now();
        let due: Vec<(String, Option<ConnectInfo>)> = {
            let mut book = self.lock();
            let due: Vec<(String, Option<ConnectInfo>)> = book
                .instances
                .iter()
                .filter(|(_, i)| {
                    i.state == State::Running
                        && i.ready
                        && !i.removing
                        && i.preempted.is_none()
                        && !i.preemption_checking
                        && i.preemption_asked
                            .is_none_or(|t| now.duration_since(t) >= every)
                })
                .map(|(id, i)| (id.clone(), i.info.clone()))
                .collect();
            for (id, _) in &due {
                if let Some(inst) = book.instances.get_mut(id) {
                    inst.preemption_checking = true;
                    inst.preemption_asked = Some(now);
                }
            }
            due
        };
        for (id, info) in due {
            let hooks = hooks.clone();
            self.spawn_check(
                checks,
                id,
                info,
                PREEMPTION_CHECK_TIMEOUT,
                move |info| async move { hooks.preemption(&info).await },
            );
        }
    }

    /// The earliest time a preempted instance's notice runs out, if any is still there.
    pub(super) fn next_preemption_deadline(&self) -> Option<Instant> {
        self.lock()
            .instances
            .values()
            .filter(|i| !i.removing)
            .filter_map(|i| i.preempted)
            .min()
    }

    /// Apply a preemption check's answer.
    pub(super) fn finish_preemption_check(
        &self,
        id: &str,
        answer: Result<Option<Duration>, String>,
    ) {
        if let Some(inst) = self.lock().instances.get_mut(id) {
            inst.preemption_checking = false;
        }
        match answer {
            Ok(Some(left)) => self.preempt(id, left),
            Ok(None) => {}
            Err(why) => tracing::debug!(instance = %id, error = %why, "preemption check failed"),
        }
    }

    /// Instance `id` is taken away by its cloud in `left`: no new job goes to it; it is
    /// removed once empty, or when `left` runs out (its jobs then end as the instance's
    /// failure). A later notice never extends an earlier one.
    pub(super) fn preempt(&self, id: &str, left: Duration) {
        let mut book = self.lock();
        let Some(inst) = book.instances.get_mut(id) else {
            return;
        };
        if inst.removing {
            return;
        }
        // A notice further out than a day is read as a day (and never overflows the clock).
        let left = left.min(Duration::from_secs(24 * 3600));
        let at = Instant::now() + left;
        if inst.preempted.is_some_and(|t| t <= at) {
            return;
        }
        tracing::warn!(instance = %id, left = ?left, jobs = inst.acquired(),
            "preemption notice: the instance takes no new job and goes when empty or when the notice runs out");
        inst.preempted = Some(at);
        book.touch(id, &self.cfg);
        drop(book);
        self.bump();
        self.wake.notify_one();
    }
}
