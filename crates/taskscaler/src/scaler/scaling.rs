//! The scaling loop: each pass reads the plugin's list, decides how many instances should
//! exist (demand, large and whole-instance jobs, throttling) and acts on it.

use std::sync::Arc;
use std::time::Duration;

use slipway_fleeting::{GroupError, State};
use tokio::time::Instant;

use super::book::{Book, Instance, Reservation};
use super::health::{PreemptionChecks, ReadyChecks};
use super::{Inner, call};
use crate::decision::{self, Demand, InstanceView, RemovalCause};

/// Instances asked for but never listed by the plugin stop counting after this long.
const REQUEST_GRACE: Duration = Duration::from_secs(300);

pub(super) async fn run_loop(inner: Arc<Inner>) {
    if let Some(store) = &inner.store {
        // This manager's instances are its own from the start: no other manager adopts them
        // while it reads them.
        let lease = inner.lease();
        if let Err(e) = store.call(move |s| s.renew_lease(lease)).await {
            tracing::warn!(error = %e, "state store: lease not taken");
        }
        match store.load().await {
            Ok(snap) => {
                *inner.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Some(snap);
            }
            Err(e) => {
                tracing::error!(error = %e, "state store unreadable; treating every instance as unknown")
            }
        }
    }
    // The lease on this manager's instances is renewed on its own timer, so a slow pass (a
    // plugin call may take a minute) never lets it lapse; it stops with the loop.
    let _leases = inner
        .store
        .is_some()
        .then(|| AbortOnDrop(tokio::spawn(renew_leases(inner.clone()))));
    // Ready checks in flight; dropping the set (the loop ends) aborts them.
    let mut checks = ReadyChecks::new();
    let mut preemptions = PreemptionChecks::new();
    loop {
        // Shutdown must not wait for a slow plugin call; instances a cut-short pass asked for
        // are still found and deleted by the shutdown's own Update.
        tokio::select! {
            biased;
            _ = inner.stop.cancelled() => return,
            _ = inner.pass() => {}
        }
        inner.start_ready_checks(&mut checks);
        inner.start_preemption_checks(&mut preemptions);
        let interval = if inner.expecting() {
            inner.cfg.update_interval_when_expecting
        } else {
            inner.cfg.update_interval
        };
        // A preempted instance's notice running out is a deadline the loop keeps, and the
        // next preemption checks are due within their interval.
        let mut until = Instant::now() + interval;
        if let Some(at) = inner.next_preemption_deadline() {
            until = until.min(at);
        }
        if let Some(every) = inner.cfg.preemption_check_interval {
            until = until.min(Instant::now() + every);
        }
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
                Some(done) = preemptions.join_next(), if !preemptions.is_empty() => {
                    match done {
                        Ok((id, answer)) => inner.finish_preemption_check(&id, answer),
                        Err(e) => tracing::warn!(error = %e, "preemption check task failed"),
                    }
                }
                _ = inner.wake.notified() => break,
                _ = tokio::time::sleep_until(until) => break,
            }
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Renew this manager's lease in the state store a few times per lease.
async fn renew_leases(inner: Arc<Inner>) {
    let Some(store) = inner.store.clone() else {
        return;
    };
    let lease = inner.lease();
    let every = (lease / 5).clamp(Duration::from_secs(1), Duration::from_secs(60));
    // The first lease is taken at start, before anything is read (`run_loop`).
    loop {
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = store.call(move |s| s.renew_lease(lease)).await {
            tracing::warn!(error = %e, "state store: lease not renewed");
        }
    }
}

impl Inner {
    /// Whether the idle slots (with those of instances on their way) fall short of what the
    /// policy wants idle beside the pending jobs.
    pub(super) fn idle_short(&self) -> bool {
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

    fn expecting(&self) -> bool {
        let book = self.lock();
        book.requested > 0 || book.pending() > 0 || book.totals.flux > 0
    }

    /// One scaling pass: read the plugin's view, reconcile, decide, act.
    async fn pass(&self) {
        let adoptable = self.read_ownership().await;
        // Until the store has said who holds what, another manager's instances cannot be told
        // from unknown ones: deciding now could remove them.
        if self.store.is_some() && adoptable.is_none() && !self.lock().seen_first_update {
            return;
        }
        match call(self.group.update()).await {
            Ok(list) => {
                let work = self.reconcile(list, adoptable);
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
            let now = Instant::now();
            for (id, inst) in &book.instances {
                // A preempted instance goes once empty, or with its jobs when its notice ran
                // out (the cloud would take it then anyway).
                if let Some(at) = inst.preempted
                    && !inst.removing
                    && (inst.acquired() == 0 || now >= at)
                    && !d.remove.iter().any(|(r, _)| r == id)
                {
                    d.remove.push((id.clone(), RemovalCause::Preempted));
                    continue;
                }
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
                    if n > 0 {
                        book.refusals.clear();
                    }
                }
                Err(e @ GroupError::Capacity(_)) => {
                    tracing::warn!(error = %e, requested = decision.increase, "the provider has no capacity for new instances");
                    self.metrics.capacity_refused();
                    // Refusals more than two passes apart are separate runs: one long ago
                    // does not count towards a fallback now.
                    let gap = self.cfg.update_interval.max(Duration::from_secs(5)) * 2;
                    self.lock().refusals.refused(Instant::now(), gap);
                }
                Err(e) => tracing::warn!(error = %e, "plugin increase failed"),
            }
        }
        self.update_gauges();
        self.bump();
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
}

fn view(id: &str, i: &Instance) -> InstanceView {
    InstanceView {
        id: id.to_string(),
        state: i.state,
        acquired: i.acquired(),
        uses: i.uses,
        // Instances on their way out offer no capacity to the decision.
        removing: i.removing || i.preexisting || i.condemned.is_some() || i.preempted.is_some(),
        idle_since: i.idle_since,
    }
}
