//! The clairvoyant lower bound: the cheapest fleet that runs a trace with zero wait.
//!
//! # What bound this is
//!
//! The oracle knows every arrival and duration in advance. With zero wait, at time `t` the fleet
//! needs at least `m(t) = ceil(n(t) / capacity_per_instance)` ready instances, where `n(t)` is
//! the number of jobs running at `t`. Every instance costs its ready time plus a fixed overhead
//! `K = P + D`: `P` = the fleet's *shortest* possible provisioning delay (billing starts when
//! it is requested) and `D` = the shortest deletion delay (billing ends when deletion completes).
//!
//! Any fleet schedule is a count of ready instances `c(t) >= m(t)` and costs at least
//! `∫ c(t) dt + K · (number of instances)`, and the number of instances is at least the total of
//! `c`'s upward steps. Writing `c` as a stack of layers `{t : c(t) >= k}`, both terms split per
//! layer, so the minimum is found layer by layer: layer `k` must cover `{t : m(t) >= k}`, and
//! each gap between its pieces is either bridged (pay the gap) or not (pay `K` for a new
//! instance): bridging exactly the gaps shorter than `K` is optimal, and the choices nest across
//! layers, so they form a valid `c`.
//!
//! It is a lower bound for any zero-wait schedule because it also relaxes everything the real
//! fleet adds: no boot failures, the shortest boot and deletion every time, no polling latency,
//! and jobs are not pinned to an instance (it may "move" a running job when a lower layer
//! ends). A policy that lets jobs wait can in principle go below it (one instance, everything
//! queued, is cheaper and useless); at a p95 wait target of tens of seconds against a
//! provisioning delay of a minute, that slack is small — and the tests check that no policy run
//! beats it on the traces used.

use crate::fleet::FleetSpec;
use crate::trace::Trace;

/// The oracle's cost for a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OracleResult {
    /// Instance-seconds of the cheapest zero-wait fleet.
    pub instance_seconds: f64,
    /// Instances it starts.
    pub instances: u64,
    /// Its per-second bill.
    pub per_second_cost: f64,
    /// The per-hour bill of the same schedule (each life rounded up to started hours). Not a
    /// bound under per-hour billing: this schedule minimises instance-seconds, and its many
    /// short lives each pay a whole hour.
    pub per_hour_cost: f64,
    /// Most instances it needs at once.
    pub peak_instances: u32,
}

/// The cheapest zero-wait fleet for `trace` on `fleet`, with `capacity` slots per instance.
pub fn oracle(trace: &Trace, fleet: &FleetSpec, capacity: u32) -> OracleResult {
    let cap = i64::from(capacity.max(1));
    let overhead = fleet.provisioning.min() + fleet.deletion.min();
    // Running-job count as a step function: (time, delta), ends before starts at equal times.
    let mut events: Vec<(f64, i64)> = trace
        .jobs
        .iter()
        .flat_map(|j| [(j.arrival_s, 1), (j.arrival_s + j.duration_s, -1)])
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    // Segments of constant instance need m: (start, end, m).
    let mut segs: Vec<(f64, f64, u32)> = Vec::new();
    let mut n: i64 = 0;
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        while i < events.len() && events[i].0 == t {
            n += events[i].1;
            i += 1;
        }
        let m = u32::try_from((n.max(0) + cap - 1) / cap).unwrap_or(u32::MAX);
        let end = events.get(i).map_or(t, |e| e.0);
        if end > t {
            segs.push((t, end, m));
        }
    }
    let peak = segs.iter().map(|s| s.2).max().unwrap_or(0);
    let mut result = OracleResult {
        instance_seconds: 0.0,
        instances: 0,
        per_second_cost: 0.0,
        per_hour_cost: 0.0,
        peak_instances: peak,
    };
    for layer in 1..=peak {
        // Pieces of {m >= layer}, gaps shorter than the overhead bridged.
        let mut lives: Vec<(f64, f64)> = Vec::new();
        for &(s, e, m) in &segs {
            if m < layer {
                continue;
            }
            match lives.last_mut() {
                Some(last) if s - last.1 < overhead => last.1 = e,
                _ => lives.push((s, e)),
            }
        }
        for (s, e) in lives {
            let life = e - s + overhead;
            result.instance_seconds += life;
            result.instances += 1;
            result.per_hour_cost += (life / 3600.0).ceil().max(1.0) * fleet.price_per_hour;
        }
    }
    result.per_second_cost = result.instance_seconds * fleet.price_per_second;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Dist;
    use crate::trace::Job;

    fn trace(jobs: &[(f64, f64)]) -> Trace {
        Trace {
            name: "t".into(),
            jobs: jobs
                .iter()
                .map(|&(a, d)| Job {
                    arrival_s: a,
                    duration_s: d,
                    cpu: 1.0,
                    memory: 1.0,
                })
                .collect(),
            horizon_s: 10_000.0,
            start: std::time::SystemTime::UNIX_EPOCH,
        }
    }

    fn fleet(p: f64, d: f64) -> FleetSpec {
        FleetSpec {
            provisioning: Dist::Fixed(p),
            deletion: Dist::Fixed(d),
            ..FleetSpec::default()
        }
    }

    #[test]
    fn bridges_short_gaps_and_splits_long_ones() {
        // K = 60. Gap of 30 s: keep the instance; gap of 500 s: a new one is cheaper.
        let t = trace(&[(0.0, 100.0), (130.0, 100.0), (730.0, 100.0)]);
        let o = oracle(&t, &fleet(50.0, 10.0), 1);
        assert_eq!(o.instances, 2);
        assert!((o.instance_seconds - ((230.0 + 60.0) + (100.0 + 60.0))).abs() < 1e-9);
    }

    #[test]
    fn packs_by_capacity() {
        // Three overlapping jobs, two slots per instance: two instances for the overlap only.
        let t = trace(&[(0.0, 100.0), (0.0, 100.0), (50.0, 100.0)]);
        let o = oracle(&t, &fleet(0.0, 0.0), 2);
        // Layer 1 covers 0..150, layer 2 covers 50..100.
        assert!((o.instance_seconds - 200.0).abs() < 1e-9, "{o:?}");
        assert_eq!(o.peak_instances, 2);
    }
}
