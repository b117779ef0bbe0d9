//! Placement across instance groups of different shapes.
//!
//! A runner may have several instance groups, each declaring what one instance offers. A job
//! goes to a shape with a running instance that can take it now (packing first), else to the
//! cheapest shape whose instances can hold it; reserving there is what makes that shape scale
//! up. A job no shape can hold is refused at once, naming every shape.

use std::collections::HashMap;
use std::sync::Mutex;

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

/// Routes each job to one shape and remembers where it went.
#[derive(Debug)]
pub struct Placement {
    shapes: Vec<Shape>,
    routes: Mutex<HashMap<String, usize>>,
}

impl Placement {
    /// Place over `shapes` (at least one).
    pub fn new(shapes: Vec<Shape>) -> Self {
        Placement {
            shapes,
            routes: Mutex::new(HashMap::new()),
        }
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
        cheapest(&now)
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
        self.lock().insert(key.to_string(), i);
        Ok(())
    }

    /// Reserve, waiting while the chosen shape has no capacity to reserve.
    pub async fn reserve_wait(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i].scaler.reserve_wait_for(key, request).await?;
        self.lock().insert(key.to_string(), i);
        Ok(())
    }

    /// Reserve a whole fresh instance for `key` ([`crate::Taskscaler::reserve_instance`]) on
    /// the shape [`Placement::choose`] picks.
    pub fn reserve_instance(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i].scaler.reserve_instance(key, request)?;
        self.lock().insert(key.to_string(), i);
        Ok(())
    }

    /// [`Placement::reserve_instance`], waiting while the chosen shape has no capacity.
    pub async fn reserve_wait_instance(&self, key: &str, request: &Resources) -> Result<(), Error> {
        let i = self.choose(request)?;
        self.shapes[i]
            .scaler
            .reserve_wait_instance(key, request)
            .await?;
        self.lock().insert(key.to_string(), i);
        Ok(())
    }

    /// Acquire the reservation on its shape.
    pub async fn acquire(&self, key: &str) -> Result<Acquisition, Error> {
        self.route(key)?.scaler.acquire(key).await
    }

    /// Free a reservation or acquisition.
    pub fn release(&self, key: &str) {
        if let Some(i) = self.lock().remove(key) {
            self.shapes[i].scaler.release(key);
        }
    }

    /// Free acquisition `key` whose instance died before its job's script started: the
    /// instance is removed, the job may acquire again (see `Scaler::release_failed`).
    pub fn release_failed(&self, key: &str, why: &str) {
        if let Some(i) = self.lock().remove(key) {
            self.shapes[i].scaler.release_failed(key, why);
        }
    }

    /// Give back a reservation no job arrived for.
    pub fn unreserve(&self, key: &str) {
        self.release(key);
    }

    /// The shape a reservation went to.
    pub fn shape_of(&self, key: &str) -> Option<&Shape> {
        let i = *self.lock().get(key)?;
        self.shapes.get(i)
    }

    /// Shut every shape's taskscaler down, side by side.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.shapes.iter().map(|s| s.scaler.shutdown())).await;
    }

    fn route(&self, key: &str) -> Result<&Shape, Error> {
        self.shape_of(key)
            .ok_or_else(|| Error::NotReserved(key.to_string()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }
}
