//! Slipway's demand forecast: idle capacity for the jobs expected before a new instance is ready.
//!
//! Kept apart from the scaler so the policy can evolve (and be swept by the simulator) without
//! touching reservation bookkeeping.
//!
//! Two ways to size the idle target ([`Basis`]):
//! - [`Basis::Rate`]: arrival rate × horizon × factor. Right for smooth (Poisson) arrivals, but it
//!   ignores that finishing jobs free slots, and it misses bursts: a pipeline that starts 30 jobs
//!   in one second has a modest hourly rate.
//! - [`Basis::Surge`]: the largest rise in busy slots (reserved or running) within any
//!   `horizon`-long span of the last `window`, × factor. That is the idle capacity that would have
//!   let every job of that span start at once, net of the slots other jobs freed meanwhile, so it
//!   covers both Poisson noise and fan-out bursts. It rises the moment a surge happens and decays
//!   only when the surge leaves the window (fast up, slow down).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Keep idle capacity for the demand expected before a new instance could be ready.
///
/// Slipway's addition to GitLab's algorithm: an idle target learnt from recent demand (see
/// [`Basis`]) is kept on top of the policy's own, and idle instances beyond it may be removed
/// sooner than the policy's `idle_time` (see [`Forecast::idle_time`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// How far back demand is remembered.
    pub window: Duration,
    /// How far ahead demand is provisioned for (about one instance's provisioning time).
    pub horizon: Duration,
    /// Multiplier on the learnt target (1.0 = cover what the statistic saw).
    pub factor: f64,
    /// Which statistic of recent demand sizes the idle target.
    pub basis: Basis,
    /// For [`Basis::Surge`]: the share of recent jobs that should have found an idle slot at
    /// once (1.0 = every one: the largest surge; 0.9 ignores the tallest tenth of surges).
    pub quantile: f64,
    /// Idle time after which an instance the target does not need is removed, replacing the
    /// policy's `idle_time` (the forecast keeps the headroom, so idle instances need not linger
    /// as a hedge); `None` keeps the policy's.
    pub idle_time: Option<Duration>,
}

impl Default for Forecast {
    /// Cover the largest surge of the last 30 minutes, over a 90 s (one boot) horizon; the
    /// policy's `idle_time` stays in force.
    fn default() -> Self {
        Forecast {
            window: Duration::from_secs(30 * 60),
            horizon: Duration::from_secs(90),
            factor: 1.0,
            basis: Basis::Surge,
            quantile: 1.0,
            idle_time: None,
        }
    }
}

/// The statistic of recent demand the idle target follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Basis {
    /// Arrivals per second over `window` × `horizon`.
    Rate,
    /// The largest rise in busy slots within any `horizon`-long span of `window`.
    #[default]
    Surge,
}

/// Recent demand, the forecast's input: reservation times and the busy-slot level over time.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// Reservation times within `window` (for [`Basis::Rate`]).
    times: VecDeque<Instant>,
    /// Busy slots after each change within the last `horizon`, plus the one before it (the level
    /// in force at the span's start).
    levels: VecDeque<(Instant, u64)>,
    /// Per reservation within `window`: the rise in busy slots it completed within the horizon
    /// (how many idle slots it needed to start at once).
    rises: VecDeque<(Instant, u64)>,
    /// How many entries of `rises` have each value (for quantiles without sorting).
    counts: Vec<u32>,
}

impl Arrivals {
    /// Record a reservation at `now`; `busy` is the slots of every reservation (pending or
    /// acquired) including it.
    pub fn record(&mut self, forecast: Option<&Forecast>, now: Instant, busy: u64) {
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
        let low = self.level(f, now, busy);
        let rise = busy.saturating_sub(low);
        self.rises.push_back((now, rise));
        let i = usize::try_from(rise).unwrap_or(usize::MAX).min(MAX_RISE);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        while let Some(&(t, r)) = self.rises.front() {
            if now.saturating_duration_since(t) <= f.window {
                break;
            }
            self.rises.pop_front();
            let i = usize::try_from(r).unwrap_or(usize::MAX).min(MAX_RISE);
            if let Some(c) = self.counts.get_mut(i) {
                *c = c.saturating_sub(1);
            }
        }
    }

    /// Record that a reservation ended at `now`, leaving `busy` reserved slots.
    pub fn depart(&mut self, forecast: Option<&Forecast>, now: Instant, busy: u64) {
        if let Some(f) = forecast {
            self.level(f, now, busy);
        }
    }

    /// Note the busy level at `now`; returns the lowest level within the horizon before it.
    fn level(&mut self, f: &Forecast, now: Instant, busy: u64) -> u64 {
        if self.levels.is_empty() {
            // Nothing was reserved before the first change.
            self.levels.push_back((now, 0));
        }
        self.levels.push_back((now, busy));
        // Keep one entry at or before `now - horizon`: the level the span starts from.
        while self.levels.len() > 1
            && self
                .levels
                .get(1)
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= f.horizon)
        {
            self.levels.pop_front();
        }
        self.levels.iter().map(|(_, b)| *b).min().unwrap_or(busy)
    }

    /// Idle slots the forecast wants kept at `now`.
    pub fn idle_target(&self, f: &Forecast, now: Instant) -> u32 {
        if f.window.is_zero() {
            return 0;
        }
        let expected = match f.basis {
            Basis::Rate => {
                let recent = self
                    .times
                    .iter()
                    .filter(|t| now.saturating_duration_since(**t) <= f.window)
                    .count() as f64;
                recent / f.window.as_secs_f64() * f.horizon.as_secs_f64()
            }
            Basis::Surge => self.rise_quantile(f, now) as f64,
        };
        (expected * f.factor).ceil().clamp(0.0, f64::from(u32::MAX)) as u32
    }

    /// The `quantile` of the rises reservations within `window` completed.
    fn rise_quantile(&self, f: &Forecast, now: Instant) -> usize {
        // Entries past the window not yet dropped (that happens on the next reservation).
        let mut stale = vec![0u32; self.counts.len()];
        let mut total = self.rises.len();
        for (t, r) in &self.rises {
            if now.saturating_duration_since(*t) <= f.window {
                break;
            }
            let i = usize::try_from(*r).unwrap_or(usize::MAX).min(MAX_RISE);
            if let Some(c) = stale.get_mut(i) {
                *c += 1;
            }
            total -= 1;
        }
        if total == 0 {
            return 0;
        }
        let need = (f.quantile.clamp(0.0, 1.0) * total as f64).ceil().max(1.0);
        let mut seen = 0.0;
        for (i, (c, s)) in self.counts.iter().zip(&stale).enumerate() {
            seen += f64::from(c.saturating_sub(*s));
            if seen >= need {
                return i;
            }
        }
        self.counts.len().saturating_sub(1)
    }
}

/// Rises above this many slots are counted as this many (bounds the histogram).
const MAX_RISE: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    fn surge(window_s: u64, horizon_s: u64, factor: f64) -> Forecast {
        Forecast {
            window: Duration::from_secs(window_s),
            horizon: Duration::from_secs(horizon_s),
            factor,
            basis: Basis::Surge,
            quantile: 1.0,
            idle_time: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Replay `(second, +1 arrival / -1 departure)` events from `start`.
    fn replay(a: &mut Arrivals, f: &Forecast, start: Instant, events: &[(u64, i32)]) {
        let mut busy: u64 = 0;
        for &(t, d) in events {
            let now = start + secs(t);
            if d > 0 {
                busy += 1;
                a.record(Some(f), now, busy);
            } else {
                busy -= 1;
                a.depart(Some(f), now, busy);
            }
        }
    }

    #[test]
    fn rate_basis_is_arrivals_per_second_times_horizon() {
        let f = Forecast {
            basis: Basis::Rate,
            ..surge(100, 50, 1.0)
        };
        let start = Instant::now();
        let mut a = Arrivals::default();
        // 10 arrivals in 100 s: 0.1/s × 50 s = 5 slots.
        replay(
            &mut a,
            &f,
            start,
            &(0..10).map(|i| (i * 10, 1)).collect::<Vec<_>>(),
        );
        assert_eq!(a.idle_target(&f, start + secs(99)), 5);
    }

    #[test]
    fn surge_covers_a_burst_at_once() {
        let f = surge(600, 90, 1.0);
        let start = Instant::now();
        let mut a = Arrivals::default();
        replay(&mut a, &f, start, &[(0, 1); 30]);
        assert_eq!(a.idle_target(&f, start), 30);
        // Factor scales it, rounding up.
        assert_eq!(a.idle_target(&surge(600, 90, 0.5), start), 15);
    }

    #[test]
    fn surge_nets_out_slots_freed_within_the_horizon() {
        let f = surge(600, 90, 1.0);
        let start = Instant::now();
        let mut a = Arrivals::default();
        // 10 jobs, then 10 leave and 12 arrive within the horizon: the rise beyond the level
        // at the span's start is what needed idle slots.
        let mut ev: Vec<(u64, i32)> = vec![(0, 1); 10];
        ev.extend([(200, -1); 10]);
        ev.extend([(210, 1); 12]);
        replay(&mut a, &f, start, &ev);
        // Span starting at 0..: rise 10 (the first burst); span 200..290: from 0 to 12.
        assert_eq!(a.idle_target(&f, start + secs(220)), 12);
        // Steady churn (one leaves, one arrives) is no surge at all.
        let mut b = Arrivals::default();
        let mut ev: Vec<(u64, i32)> = vec![(0, 1); 5];
        for t in 1..100u64 {
            ev.push((t * 10, -1));
            ev.push((t * 10, 1));
        }
        let first_half = ev.iter().take_while(|(t, _)| *t < 500).count();
        replay(&mut b, &f, start, &ev[..first_half]);
        assert_eq!(
            b.idle_target(&f, start + secs(500)),
            5,
            "the start, still in the window"
        );
        let mut b = Arrivals::default();
        replay(&mut b, &f, start, &ev);
        assert_eq!(
            b.idle_target(&f, start + secs(1000)),
            1,
            "then one job at a time"
        );
        assert_eq!(b.idle_target(&f, start + secs(1000) + secs(600)), 0);
    }

    #[test]
    fn surge_only_counts_rises_within_the_horizon() {
        let f = surge(3600, 60, 1.0);
        let start = Instant::now();
        let mut a = Arrivals::default();
        // One arrival every 100 s: never more than one within 60 s, though the level climbs.
        replay(
            &mut a,
            &f,
            start,
            &(0..20).map(|i| (i * 100, 1)).collect::<Vec<_>>(),
        );
        assert_eq!(a.idle_target(&f, start + secs(2000)), 1);
    }

    #[test]
    fn surge_target_rises_at_once_and_decays_after_the_window() {
        let f = surge(300, 90, 1.0);
        let start = Instant::now();
        let mut a = Arrivals::default();
        assert_eq!(a.idle_target(&f, start), 0);
        let mut ev: Vec<(u64, i32)> = vec![(0, 1); 20];
        ev.extend([(100, 1); 4]);
        replay(&mut a, &f, start, &ev);
        assert_eq!(a.idle_target(&f, start), 20);
        assert_eq!(
            a.idle_target(&f, start + secs(300)),
            20,
            "still in the window"
        );
        // The big burst left the window; the small one (rise 4 over 100 s > horizon) remains.
        assert_eq!(a.idle_target(&f, start + secs(301)), 4);
        assert_eq!(a.idle_target(&f, start + secs(401)), 0);
    }

    #[test]
    fn quantile_leaves_out_the_tallest_surges() {
        let start = Instant::now();
        let mut a = Arrivals::default();
        let f = surge(600, 90, 1.0);
        // 20 at once: the jobs needed 1, 2, … 20 idle slots to start at once.
        replay(&mut a, &f, start, &[(0, 1); 20]);
        let q = |quantile: f64| Forecast { quantile, ..f };
        assert_eq!(a.idle_target(&q(1.0), start), 20);
        assert_eq!(a.idle_target(&q(0.95), start), 19);
        assert_eq!(a.idle_target(&q(0.5), start), 10);
        assert_eq!(a.idle_target(&q(0.0), start), 1, "at least the smallest");
    }

    #[test]
    fn no_forecast_records_nothing_and_zero_window_wants_nothing() {
        let start = Instant::now();
        let mut a = Arrivals::default();
        a.record(None, start, 5);
        a.depart(None, start, 4);
        assert!(a.times.is_empty() && a.levels.is_empty() && a.rises.is_empty());
        let f = surge(0, 90, 1.0);
        a.record(Some(&f), start, 5);
        assert_eq!(a.idle_target(&f, start), 0);
    }
}
