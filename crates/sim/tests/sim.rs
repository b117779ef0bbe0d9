//! The simulator end to end: determinism, traces, the oracle bound and a hand-checked run.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use slipway_sim::rng::Dist;
use slipway_sim::trace::{self, Job, Trace};
use slipway_sim::{FleetSpec, Kind, default_settings, oracle, run};
use slipway_taskscaler::{Config, Policy};

/// Two busy hours of the diurnal day (11:00–13:00), shifted to start at 0.
fn small_trace() -> Trace {
    common::busy_hours(trace::diurnal(7), "diurnal-11-13")
}

#[test]
fn same_seed_gives_the_same_traces_fleet_and_oracle() {
    assert_eq!(trace::diurnal(3), trace::diurnal(3));
    assert_eq!(trace::burst(3), trace::burst(3));
    assert_eq!(trace::weekend(3), trace::weekend(3));
    assert_ne!(trace::diurnal(3), trace::diurnal(4));
    let t = small_trace();
    let fleet = FleetSpec::default();
    assert_eq!(oracle(&t, &fleet, 4), oracle(&t, &fleet, 4));
}

// The same seed and settings give the same run, field by field (waits of every job, the whole
// bill), for both policies.
#[test]
fn same_seed_gives_identical_runs() {
    let t = small_trace();
    assert!(t.jobs.len() > 500, "{} jobs", t.jobs.len());
    let fleet = FleetSpec::default();
    for kind in [Kind::Baseline, Kind::Slipway] {
        let cfg = default_settings(kind).config();
        let a = run(&t, &fleet, &cfg, 42).expect("run a");
        let b = run(&t, &fleet, &cfg, 42).expect("run b");
        assert_eq!(a.jobs, t.jobs.len());
        assert_eq!(a, b, "{kind:?}: two runs differ");
    }
}

#[test]
fn csv_round_trip_and_named_errors() {
    for t in [trace::diurnal(1), trace::burst(1), trace::weekend(1)] {
        let back = trace::from_csv(&t.name, &trace::to_csv(&t)).expect("parse");
        assert_eq!(back.jobs, t.jobs, "{}", t.name);
    }
    let ok = trace::from_csv(
        "x",
        "arrival_s,duration_s,cpu,memory\n\n# note\n5,10,1,512\n0,3,2,1024\n",
    )
    .expect("valid");
    assert_eq!(ok.jobs.len(), 2);
    assert_eq!(ok.jobs[0].arrival_s, 0.0, "sorted by arrival");
    assert_eq!(ok.horizon_s, 15.0);

    let err = |text: &str| trace::from_csv("x", text).expect_err(text);
    let e = err("");
    assert!(e.to_string().contains("header"), "{e}");
    let e = err("arrival,duration\n1,2\n");
    assert_eq!(e.line, 1);
    assert!(
        e.to_string().contains("arrival_s,duration_s,cpu,memory"),
        "{e}"
    );
    let e = err("arrival_s,duration_s,cpu,memory\n1,2,3,4\n1,2,3\n");
    assert_eq!(e.line, 3);
    assert!(
        e.to_string().contains("trace line 3: expected 4 fields"),
        "{e}"
    );
    let e = err("arrival_s,duration_s,cpu,memory\n1,abc,3,4\n");
    assert!(
        e.to_string().contains("line 2") && e.to_string().contains("duration_s \"abc\""),
        "{e}"
    );
    let e = err("arrival_s,duration_s,cpu,memory\n-1,2,3,4\n");
    assert!(e.to_string().contains("arrival_s \"-1\""), "{e}");
    let e = err("arrival_s,duration_s,cpu,memory\n1,0,3,4\n");
    assert!(e.to_string().contains("must be above 0"), "{e}");
}

#[test]
fn the_oracle_never_costs_more_than_a_policy() {
    let t = small_trace();
    let fleet = FleetSpec::default();
    let o = oracle(&t, &fleet, slipway_sim::sweep::CAPACITY_PER_INSTANCE);
    assert!(o.instance_seconds > 0.0);
    for kind in [Kind::Baseline, Kind::Slipway] {
        for idle in [0, 8] {
            let mut s = default_settings(kind);
            s.idle_count = idle;
            let r = run(&t, &fleet, &s.config(), 5).expect("run");
            assert!(
                o.instance_seconds <= r.bill.instance_seconds,
                "oracle {} > {kind:?} idle {idle}: {}",
                o.instance_seconds,
                r.bill.instance_seconds
            );
        }
    }
}

/// One job at t = 100 s for 200 s; boots take exactly 60 s, deletions are instant, no errors.
/// No idle capacity: the job's reservation asks for an instance at 100 s, it is running at
/// 160 s (the taskscaler polls every 2 s while expecting, 30 polls), the job waits 60 s, runs
/// until 360 s, and with `idle_time = 0` the instance is deleted at once: 260 instance-seconds,
/// one started hour.
#[test]
fn a_tiny_trace_costs_what_hand_arithmetic_says() {
    let t = Trace {
        name: "one".into(),
        jobs: vec![Job {
            arrival_s: 100.0,
            duration_s: 200.0,
            cpu: 1.0,
            memory: 1.0,
        }],
        horizon_s: 1000.0,
        start: std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(trace::MONDAY),
    };
    let fleet = FleetSpec {
        provisioning: Dist::Fixed(60.0),
        boot_failure: 0.0,
        deletion: Dist::Fixed(0.0),
        error_rate: 0.0,
        api_latency: Dist::Fixed(0.0),
        ..FleetSpec::default()
    };
    let cfg = Config {
        capacity_per_instance: 1,
        policies: vec![Policy {
            idle_time: Duration::ZERO,
            ..Policy::default()
        }],
        ..Config::default()
    };
    let r = run(&t, &fleet, &cfg, 1).expect("run");
    assert_eq!(r.jobs, 1);
    assert!(
        (60.0..=60.01).contains(&r.wait_p95_s),
        "wait {}",
        r.wait_p95_s
    );
    assert!(
        (260.0..=260.01).contains(&r.bill.instance_seconds),
        "cost {}",
        r.bill.instance_seconds
    );
    assert_eq!(r.bill.instances, 1);
    assert!((r.bill.per_hour_cost - fleet.price_per_hour).abs() < 1e-12);
    assert!((r.bill.per_second_cost - 260.0 * fleet.price_per_second).abs() < 1e-6);
    // The oracle asks 60 s ahead and deletes at the end: the same 260 s, with zero wait.
    let o = oracle(&t, &fleet, 1);
    assert!((o.instance_seconds - 260.0).abs() < 1e-9);
}

#[test]
fn boot_failures_and_api_errors_are_survived() {
    let t = small_trace();
    let fleet = FleetSpec {
        boot_failure: 0.2,
        error_rate: 0.2,
        ..FleetSpec::default()
    };
    let r = run(&t, &fleet, &default_settings(Kind::Slipway).config(), 9).expect("run");
    assert_eq!(r.jobs, t.jobs.len(), "every job ran");
    assert!(
        r.bill.boot_failures > 0 && r.bill.plugin_errors > 0,
        "{:?}",
        r.bill
    );
}
