//! Slipway's demand forecast: idle capacity for the jobs expected before a new instance is ready.
//!
//! Kept apart from the scaler so the policy can evolve (and be swept by the simulator) without
//! touching reservation bookkeeping.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Keep idle capacity for the demand expected before a new instance could be ready.
///
/// Slipway's addition to GitLab's algorithm: the arrival rate over `window` times `horizon`
/// (about one instance's provisioning time) is added to the idle target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// How far back arrivals are counted.
    pub window: Duration,
    /// How far ahead demand is provisioned for.
    pub horizon: Duration,
    /// Multiplier on the expected arrivals (1.0 = the mean).
    pub factor: f64,
}

/// Recent reservation times, the forecast's input.
#[derive(Debug, Default)]
pub struct Arrivals {
    times: VecDeque<Instant>,
}

impl Arrivals {
    /// Record a reservation at `now`, forgetting what left the window.
    pub fn record(&mut self, forecast: Option<&Forecast>, now: Instant) {
        let Some(f) = forecast else {
            return;
        };
        self.times.push_back(now);
        while self
            .times
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > f.window)
        {
            self.times.pop_front();
        }
    }

    /// Idle slots the forecast wants kept at `now`.
    pub fn idle_target(&self, f: &Forecast, now: Instant) -> u32 {
        if f.window.is_zero() {
            return 0;
        }
        let recent = self
            .times
            .iter()
            .filter(|t| now.saturating_duration_since(**t) <= f.window)
            .count() as f64;
        let expected = recent / f.window.as_secs_f64() * f.horizon.as_secs_f64() * f.factor;
        expected.ceil().clamp(0.0, f64::from(u32::MAX)) as u32
    }
}
