//! Reserve → acquire → release: holding capacity for a job, binding it to slots on an
//! instance (with a heartbeat and a write-ahead record), and giving them back.

use std::time::Duration;

use slipway_fleeting::{ConnectInfo, GroupError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::book::{Instance, Reservation};
use super::{Acquisition, Error, Inner, Taskscaler, call};
use crate::decision::RemovalCause;
use crate::resources::Resources;

/// Connect info whose credentials expire sooner than this is fetched again before use.
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(60);

/// Longest a heartbeat may take before it counts as failed.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

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

impl Taskscaler {
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

    /// Free acquisition `key` whose instance was found dead (a job's connection to it failed
    /// before the job's script started): the instance is condemned as unhealthy — no job is
    /// handed to it again, and it is removed and replaced — and the reservation goes, so the
    /// job may reserve and acquire again elsewhere.
    pub fn release_failed(&self, key: &str, why: &str) {
        let id = {
            let book = self.inner.lock();
            book.reservations
                .get(key)
                .and_then(|r| r.at.as_ref())
                .map(|(id, _)| id.clone())
        };
        if let Some(id) = &id {
            let mut book = self.inner.lock();
            if let Some(inst) = book.instances.get_mut(id)
                && inst.condemned.is_none()
            {
                tracing::warn!(instance = %id, error = %why, "instance failed under a job before its script: removing it");
                inst.condemned = Some(RemovalCause::Unhealthy);
                book.touch(id, &self.inner.cfg);
            }
        }
        self.release(key);
        self.inner.wake.notify_one();
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
}

impl Inner {
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

    pub(super) async fn fetch_connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let info = call(self.group.connect_info(id)).await?;
        let mut book = self.lock();
        if let Some(inst) = book.instances.get_mut(id) {
            inst.info = Some(info.clone());
        }
        book.touch(id, &self.cfg);
        Ok(info)
    }
}
