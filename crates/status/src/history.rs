//! The last hours of the fleet in memory: a ring of samples taken at a fixed interval.

use std::collections::VecDeque;
use std::time::Duration;

use crate::model::HistorySeries;

/// One sample over every runner.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// When (unix ms).
    pub t_ms: i64,
    /// Instances.
    pub instances: u32,
    /// Busy slots.
    pub busy_slots: u32,
    /// Jobs waiting.
    pub queue_depth: u32,
    /// p95 wait in seconds.
    pub p95_wait_s: f64,
}

/// A bounded ring of samples.
#[derive(Debug, Clone)]
pub struct History {
    interval: Duration,
    capacity: usize,
    samples: VecDeque<Sample>,
}

impl History {
    /// Keep `span` of samples taken every `interval` (at least one).
    pub fn new(interval: Duration, span: Duration) -> History {
        let n = span.as_secs_f64() / interval.as_secs_f64().max(0.001);
        let capacity = (n.ceil() as usize).max(1);
        History {
            interval,
            capacity,
            samples: VecDeque::with_capacity(capacity),
        }
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Add a sample, dropping the oldest when full.
    pub fn push(&mut self, s: Sample) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// No sample yet.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The samples as columns, oldest first.
    pub fn series(&self) -> HistorySeries {
        let mut h = HistorySeries {
            interval_s: self.interval.as_secs_f64(),
            ..HistorySeries::default()
        };
        for s in &self.samples {
            h.t_ms.push(s.t_ms);
            h.instances.push(s.instances);
            h.busy_slots.push(s.busy_slots);
            h.queue_depth.push(s.queue_depth);
            h.p95_wait_s.push(s.p95_wait_s);
        }
        h
    }
}

/// The 95th percentile (nearest rank) of `values`; 0 when empty.
pub fn p95(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64) * 0.95).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_span() {
        let mut h = History::new(Duration::from_secs(10), Duration::from_secs(30));
        for i in 0..5 {
            h.push(Sample {
                t_ms: i,
                instances: i as u32,
                ..Sample::default()
            });
        }
        let s = h.series();
        assert_eq!(s.t_ms, vec![2, 3, 4]);
        assert_eq!(s.instances, vec![2, 3, 4]);
        assert_eq!(s.interval_s, 10.0);
    }

    #[test]
    fn p95_is_the_nearest_rank() {
        assert_eq!(p95(&mut []), 0.0);
        assert_eq!(p95(&mut [3.0]), 3.0);
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(p95(&mut v), 95.0);
        let mut v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(p95(&mut v), 10.0);
    }
}
