//! How many jobs run at once: a runner's `limit` within the manager's `concurrent`, counted
//! the same way for every source.

use std::sync::Arc;

use slipway_config::{Loaded, RunnerConfig};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The concurrency limits a runner's jobs count against.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The runner's own `limit` (or `concurrent` when it has none).
    pub runner: Arc<Semaphore>,
    /// The manager's `concurrent`.
    pub global: Arc<Semaphore>,
}

/// A job's place under both limits, held for its whole life.
#[derive(Debug)]
pub struct Permits {
    _runner: OwnedSemaphorePermit,
    _global: OwnedSemaphorePermit,
}

impl Limits {
    /// Wait for a place under both limits (the runner's first, so a busy runner does not hold
    /// a global place while it waits); `None` once a limit is closed.
    pub async fn acquire(&self) -> Option<Permits> {
        let runner = self.runner.clone().acquire_owned().await.ok()?;
        let global = self.global.clone().acquire_owned().await.ok()?;
        Some(Permits {
            _runner: runner,
            _global: global,
        })
    }
}

/// Jobs at once on `runner`: its `limit`, within the global `concurrent`.
pub fn effective_concurrency(loaded: &Loaded, runner: &RunnerConfig) -> u32 {
    let global = loaded.config.concurrent.max(1);
    if runner.limit > 0 {
        global.min(runner.limit)
    } else {
        global
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_needs_a_place_under_both_limits() {
        let limits = Limits {
            runner: Arc::new(Semaphore::new(2)),
            global: Arc::new(Semaphore::new(1)),
        };
        let first = limits.acquire().await;
        assert!(first.is_some());
        // The global limit is full: a second job waits until the first ends.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), limits.acquire());
        assert!(waiting.await.is_err());
        drop(first);
        assert!(limits.acquire().await.is_some());
    }
}
