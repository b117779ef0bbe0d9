//! Placement across instance groups of different shapes.
//!
//! A runner may have several instance groups, each declaring what one instance offers. A job
//! goes to a shape with a running instance that can take it now (packing first), else to the
//! cheapest shape whose instances can hold it; reserving there is what makes that shape scale
//! up. A job no shape can hold is refused at once, naming every shape.
//!
//! A shape may have a fallback ([`Fallback`]): a spot shape whose provider refuses new
//! instances for lack of capacity sends new capacity to its fallback for a while, jobs waiting
//! for a slot on it included. A fallback shape takes new capacity only then (or for jobs its
//! spot shape cannot hold); its running instances take jobs like any other.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::fallback::{Diversion, Fallback, Turn};
use crate::resources::Resources;
use crate::scaler::{Acquisition, Error, Taskscaler};

/// One instance group and its taskscaler.
#[derive(Debug)]
pub struct Shape {
    /// Name from the config (`default` for a runner without shapes).
    pub name: String,
    /// The group's taskscaler.
    pub scaler: Taskscaler,
}

/// Where a job's reservation went, and what it asked for (to move it to a fallback).
#[derive(Debug, Clone)]
struct Route {
    shape: usize,
    request: Resources,
    exclusive: bool,
}

/// Routes each job to one shape and remembers where it went.
#[derive(Debug)]
pub struct Placement {
    shapes: Vec<Shape>,
    routes: Mutex<HashMap<String, Route>>,
    /// Per shape: its fallback, if it has one.
    fallbacks: Vec<Option<Fallback>>,
    /// Per shape: whether its new capacity goes to its fallback now.
    diversions: Mutex<Vec<Diversion>>,
    /// Per shape: spot (preemptible) capacity, as configured; shown to operators.
    spot: Vec<bool>,
}

impl Placement {
    /// Place over `shapes` (at least one).
    pub fn new(shapes: Vec<Shape>) -> Self {
        let n = shapes.len();
        Placement {
            shapes,
            routes: Mutex::new(HashMap::new()),
            fallbacks: vec![None; n],
            diversions: Mutex::new(vec![Diversion::default(); n]),
            spot: vec![false; n],
        }
    }

    /// Mark shape `i` as spot capacity.
    #[must_use]
    pub fn with_spot(mut self, i: usize) -> Self {
        if let Some(s) = self.spot.get_mut(i) {
            *s = true;
        }
        self
    }

    /// Whether shape `i` is spot capacity.
    pub fn is_spot(&self, i: usize) -> bool {
        self.spot.get(i).copied().unwrap_or(false)
    }

    /// Give shape `from` a fallback (`rule.to`); ignored unless both are shapes here and differ
    /// (the config names them, and verify-config checks that).
    #[must_use]
    pub fn with_fallback(mut self, from: usize, rule: Fallback) -> Self {
        if from < self.shapes.len() && rule.to < self.shapes.len() && from != rule.to {
            self.fallbacks[from] = Some(rule);
        }
        self
    }

    /// Shape `i`'s fallback, if it has one.
    pub fn fallback_of(&self, i: usize) -> Option<&Fallback> {
        self.fallbacks.get(i)?.as_ref()
    }

    /// Whether some shape falls back to shape `i`.
    pub fn is_fallback(&self, i: usize) -> bool {
        self.fallbacks.iter().flatten().any(|f| f.to == i)
    }

    /// Since when shape `i`'s new capacity goes to its fallback (`None`: it does not), brought
    /// up to date with its refusals now.
    pub fn diverted_since(&self, i: usize) -> Option<Instant> {
        let rule = self.fallback_of(i)?;
        let scaler = &self.shapes[i].scaler;
        let refusals = scaler.capacity_refusals();
        let mut diversions = self.diversions.lock().unwrap_or_else(|p| p.into_inner());
        let d = diversions.get_mut(i)?;
        match d.update(rule, &refusals, Instant::now()) {
            Some(Turn::Diverted) => {
                tracing::warn!(shape = %self.shapes[i].name, fallback = %self.shapes[rule.to].name,
                    refusals = refusals.count, after = ?rule.after,
                    "no capacity for new instances: new capacity goes to the fallback shape");
                scaler.metrics().set_diverted(true);
            }
            Some(Turn::Returned) => {
                tracing::info!(shape = %self.shapes[i].name, quiet = ?rule.return_after,
                    "no capacity refusal for the quiet period: new capacity goes to the shape again");
                scaler.forget_capacity_refusals();
                scaler.metrics().set_diverted(false);
            }
            None => {}
        }
        d.since
    }

    fn diverted(&self, i: usize) -> bool {
        self.diverted_since(i).is_some()
    }

    /// Whether shape `i` may get new instances for a job that `fitting` shapes can hold: not
    /// while it is diverted to a fallback that can hold the job; a fallback shape only while a
    /// shape that falls back to it is diverted, or none of those can hold the job.
    fn takes_new_capacity(&self, i: usize, fitting: &[usize]) -> bool {
        if let Some(rule) = self.fallback_of(i)
            && fitting.contains(&rule.to)
            && self.diverted(i)
        {
            return false;
        }
        let mut primaries = (0..self.shapes.len())
            .filter(|j| fitting.contains(j) && self.fallback_of(*j).is_some_and(|f| f.to == i))
            .peekable();
        primaries.peek().is_none() || primaries.any(|j| self.diverted(j))
    }

    /// The shapes, in config order.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// Which shape a job asking for `request` goes to now.
    pub fn choose(&self, request: &Resources) -> Result<usize, Error> {
        let mut fitting = Vec::new();
        for (i, shape) in self.shapes.iter().enumerate() {
            if let Ok(slots) = shape.scaler.slots_for(request) {
                let cfg = shape.scaler.config();
                // What the job's share of an instance costs.
                let cost = cfg.instance_cost * f64::from(slots)
                    / f64::from(cfg.capacity_per_instance.max(1));
                fitting.push((i, slots, cost));
            }
        }
        if fitting.is_empty() {
            return Err(self.unsatisfiable(request));
        }
        if fitting.len() == 1 {
            return Ok(fitting[0].0);
        }
        let cheapest = |c: &[(usize, u32, f64)]| {
            c.iter()
                .min_by(|a, b| a.2.total_cmp(&b.2).then(a.0.cmp(&b.0)))
                .map(|c| c.0)
        };
        let now: Vec<(usize, u32, f64)> = fitting
            .iter()
            .copied()
            .filter(|(i, slots, _)| self.shapes[*i].scaler.fits_now(*slots))
            .collect();
        if let Some(i) = cheapest(&now) {
            return Ok(i);
        }
        let holders: Vec<usize> = fitting.iter().map(|c| c.0).collect();
        let fresh: Vec<(usize, u32, f64)> = fitting
            .iter()
            .copied()
            .filter(|(i, _, _)| self.takes_new_capacity(*i, &holders))
            .collect();
        cheapest(&fresh)
            .or_else(|| cheapest(&fitting))
            .ok_or_else(|| self.unsatisfiable(request))
    }

    fn unsatisfiable(&self, request: &Resources) -> Error {
        let offers: Vec<String> = self
            .shapes
            .iter()
            .map(|s| match &s.scaler.config().instance_resources {
                Some(r) => format!("{} ({r})", s.name),
                None => format!("{} (no resources declared)", s.name),
            })
            .collect();
        Error::Unsatisfiable(format!(
            "the job asks for {request}, which no instance shape of this runner can hold: {}",
            offers.join(", ")
        ))
    }

    /// Reserve for `key` on the shape [`Placement::choose`] picks.
    pub fn reserve(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i].scaler.reserve_for(key, request)?;
        self.remember(key, i, request, false);
        Ok(())
    }

    /// Reserve, waiting while the chosen shape has no capacity to reserve.
    pub async fn reserve_wait(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i].scaler.reserve_wait_for(key, request).await?;
        self.remember(key, i, request, false);
        Ok(())
    }

    /// Reserve a whole fresh instance for `key` ([`crate::Taskscaler::reserve_instance`]) on
    /// the shape [`Placement::choose`] picks.
    pub fn reserve_instance(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i].scaler.reserve_instance(key, request)?;
        self.remember(key, i, request, true);
        Ok(())
    }

    /// [`Placement::reserve_instance`], waiting while the chosen shape has no capacity.
    pub async fn reserve_wait_instance(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i]
            .scaler
            .reserve_wait_instance(key, request)
            .await?;
        self.remember(key, i, request, true);
        Ok(())
    }

    /// Acquire the reservation on its shape. A job still waiting for a slot on a shape that
    /// becomes diverted moves to the shape's fallback and waits there.
    pub async fn acquire(&self, key: &str) -> Result<Acquisition, Error> {
        loop {
            let route = self
                .lock()
                .get(key)
                .cloned()
                .ok_or_else(|| Error::NotReserved(key.to_string()))?;
            let scaler = &self.shapes[route.shape].scaler;
            let Some(rule) = self.fallback_of(route.shape).copied() else {
                return scaler.acquire(key).await;
            };
            let mut changes = scaler.changes();
            {
                // Dropped at the end of this block, before the job moves.
                let acquire = scaler.acquire(key);
                tokio::pin!(acquire);
                let mut watching = true;
                loop {
                    tokio::select! {
                        // A slot freed on the job's own shape wins over a move.
                        biased;
                        r = &mut acquire => return r,
                        changed = changes.changed(), if watching => {
                            watching = changed.is_ok();
                            // Only a job not yet bound to a slot moves; `acquire` is then
                            // waiting for one, and dropping it leaves nothing half done.
                            if self.diverted(route.shape) && scaler.is_waiting(key) {
                                break;
                            }
                        }
                    }
                }
            }
            if !self.move_to(key, &route, rule.to) {
                // The fallback has no room to reserve: keep waiting where the job was.
                return self.shapes[route.shape].scaler.acquire(key).await;
            }
        }
    }

    /// Move waiting reservation `key` from its shape to shape `to`: reserved there first, and
    /// given up where it was only then, so a refusal leaves it waiting where it was (false).
    fn move_to(&self, key: &str, route: &Route, to: usize) -> bool {
        let from = &self.shapes[route.shape];
        let target = &self.shapes[to].scaler;
        let moved = if route.exclusive {
            target.reserve_instance(key, &route.request)
        } else {
            target.reserve_for(key, &route.request)
        };
        match moved {
            Ok(()) => {
                from.scaler.release(key);
                tracing::info!(job = %key, from = %from.name, to = %self.shapes[to].name,
                    "a job waiting for a slot moves to the fallback shape");
                self.remember(key, to, &route.request, route.exclusive);
                true
            }
            Err(e) => {
                tracing::warn!(job = %key, fallback = %self.shapes[to].name, error = %e,
                    "the fallback shape cannot take a waiting job; it keeps waiting");
                false
            }
        }
    }

    fn remember(&self, key: &str, shape: usize, request: &Resources, exclusive: bool) {
        self.lock().insert(
            key.to_string(),
            Route {
                shape,
                request: *request,
                exclusive,
            },
        );
    }

    /// Free a reservation or acquisition.
    pub fn release(&self, key: &str) {
        if let Some(r) = self.lock().remove(key) {
            self.shapes[r.shape].scaler.release(key);
        }
    }

    /// Free acquisition `key` whose instance died before its job's script started: the
    /// instance is removed, the job may acquire again (see `Scaler::release_failed`).
    pub fn release_failed(&self, key: &str, why: &str) {
        if let Some(r) = self.lock().remove(key) {
            self.shapes[r.shape].scaler.release_failed(key, why);
        }
    }

    /// Give back a reservation no job arrived for.
    pub fn unreserve(&self, key: &str) {
        self.release(key);
    }

    /// The shape a reservation went to.
    pub fn shape_of(&self, key: &str) -> Option<&Shape> {
        let i = self.lock().get(key)?.shape;
        self.shapes.get(i)
    }

    /// Shut every shape's taskscaler down, side by side.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.shapes.iter().map(|s| s.scaler.shutdown())).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }
}
