//! Jobs of several sizes: the mixed trace, placement by resources, the dollar lower bound.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use slipway_sim::mixed::{self, MixedOptions, ShapeSpec, Ways, oracle_usd, run_placed};
use slipway_sim::rng::Dist;
use slipway_sim::trace::{self, Job, MIXED_SIZES, Trace};
use slipway_sim::{FleetSpec, Kind, default_settings};

/// Hours 11–13 of the mixed day, shifted to start at 0.
fn slice(seed: u64) -> Trace {
    common::busy_hours(trace::mixed(seed), "mixed-11-13")
}

#[test]
fn the_mixed_trace_is_the_diurnal_day_with_three_sizes() {
    let m = trace::mixed(1);
    assert_eq!(m, trace::mixed(1));
    assert_ne!(m, trace::mixed(2));
    let d = trace::diurnal(1);
    assert_eq!(m.jobs.len(), d.jobs.len());
    for (a, b) in m.jobs.iter().zip(&d.jobs) {
        assert_eq!((a.arrival_s, a.duration_s), (b.arrival_s, b.duration_s));
    }
    let n = m.jobs.len() as f64;
    for (k, &(share, cpu, mem)) in MIXED_SIZES.iter().enumerate() {
        let count = m
            .jobs
            .iter()
            .filter(|j| j.cpu == cpu && j.memory == mem)
            .count();
        assert_eq!(
            count,
            m.jobs
                .iter()
                .filter(|j| mixed::size_class(j) == Some(k))
                .count()
        );
        let got = count as f64 / n;
        assert!((got - share).abs() <= 0.02, "size {k}: {got} vs {share}");
    }
    assert!(m.jobs.iter().all(|j| mixed::size_class(j).is_some()));
}

/// Two jobs at t = 10 s for 100 s on a runner with a small shape and a large one; boots take
/// exactly 60 s, deletions are instant, no errors, no idle capacity. The small job goes to
/// c7i.large (its cheapest fit), the large one to m7i.4xlarge (the only shape holding it):
/// one instance each, requested at 10 s, running at 70 s (each job waits 60 s), deleted when
/// the job ends at 170 s: 160 s of each, at each instance type's price.
#[test]
fn a_tiny_trace_places_each_job_on_the_shape_hand_arithmetic_says() {
    let job = |cpu: f64, memory: f64| Job {
        arrival_s: 10.0,
        duration_s: 100.0,
        cpu,
        memory,
    };
    let t = Trace {
        name: "two".into(),
        jobs: vec![job(1.0, 2048.0), job(16.0, 65536.0)],
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
    let mut settings = default_settings(Kind::Baseline);
    settings.idle_count = 0;
    settings.business_idle_count = None;
    settings.scale_factor = 0.0;
    settings.idle_time_s = 0;
    let small = ShapeSpec::of("c7i.large", 2).expect("listed");
    let large = ShapeSpec::of("m7i.4xlarge", 16).expect("listed");
    let r = run_placed(&t, &fleet, &[small, large], &settings, 1).expect("run");
    assert_eq!(r.bills.len(), 2);
    assert_eq!(r.bills[0].1.instances, 1, "small job on c7i.large: {r:?}");
    assert_eq!(r.bills[1].1.instances, 1, "large job on m7i.4xlarge: {r:?}");
    for w in &r.waits_s {
        assert!((60.0..=60.01).contains(w), "waits {:?}", r.waits_s);
    }
    for (_, b) in &r.bills {
        assert!(
            (160.0..=160.01).contains(&b.instance_seconds),
            "{:?}",
            r.bills
        );
    }
    let want = 160.0 * (0.08925 + 0.8064) / 3600.0;
    assert!((r.cost_usd - want).abs() < 1e-5, "{} vs {want}", r.cost_usd);
}

#[test]
fn placed_runs_repeat_and_the_oracle_is_below_every_way() {
    let t = slice(3);
    assert!(t.jobs.len() > 500, "{} jobs", t.jobs.len());
    let fleet = FleetSpec::default();
    let ways = Ways::default();
    let o = oracle_usd(&t);
    assert!(o > 0.0);
    for kind in [Kind::Baseline, Kind::Slipway] {
        for idle in [0, 8] {
            let mut s = default_settings(kind);
            s.idle_count = idle;
            let runners: Vec<Vec<ShapeSpec>> = vec![
                vec![ways.one_shape],
                ways.slipway.clone(),
                ways.tagged.clone(),
            ];
            for shapes in runners {
                let a = run_placed(&t, &fleet, &shapes, &s, 5).expect("run");
                assert_eq!(a.waits_s.len(), t.jobs.len());
                assert!(
                    o <= a.cost_usd,
                    "oracle {o} > {kind:?} idle {idle} on {shapes:?}: {}",
                    a.cost_usd
                );
                if idle == 0 {
                    let b = run_placed(&t, &fleet, &shapes, &s, 5).expect("run again");
                    assert_eq!(a, b, "two runs differ");
                }
            }
        }
    }
}

#[test]
fn the_comparison_reports_three_ways_and_the_oracle() {
    let t = slice(4);
    let opts = MixedOptions {
        sim: slipway_sim::SimOptions {
            threads: 1,
            ..slipway_sim::SimOptions::default()
        },
        ..MixedOptions::default()
    };
    let r = mixed::compare_mixed(&t, 4, &opts).expect("compare");
    assert_eq!(r.jobs, t.jobs.len());
    assert_eq!(r.jobs_by_size.iter().sum::<usize>(), t.jobs.len());
    assert_eq!(r.gitlab_tagged.runners.len(), 3);
    for w in [&r.gitlab_one_shape, &r.gitlab_tagged, &r.slipway] {
        assert_eq!(w.waits_s.len(), t.jobs.len());
        assert!(r.oracle_usd <= w.cost_usd, "{} {}", w.name, w.cost_usd);
    }
    let table = r.table();
    for row in ["gitlab_one_shape", "gitlab_tagged", "slipway", "oracle"] {
        assert!(table.lines().any(|l| l.starts_with(row)), "{table}");
    }
    let json = r.to_json();
    for key in [
        "gitlab_one_shape_cost",
        "gitlab_tagged_cost",
        "slipway_cost",
        "oracle_cost",
        "slipway_wait_p95_s",
    ] {
        assert!(json.get(key).is_some_and(|v| v.is_number()), "{key}");
    }
}

#[test]
fn a_job_no_shape_holds_is_an_error_not_a_panic() {
    let t = Trace {
        name: "huge".into(),
        jobs: vec![Job {
            arrival_s: 0.0,
            duration_s: 10.0,
            cpu: 64.0,
            memory: 1024.0,
        }],
        horizon_s: 100.0,
        start: std::time::SystemTime::UNIX_EPOCH,
    };
    let shapes = [ShapeSpec::of("c7i.large", 2).expect("listed")];
    let e = run_placed(
        &t,
        &FleetSpec::default(),
        &shapes,
        &default_settings(Kind::Baseline),
        1,
    )
    .expect_err("no shape holds 64 CPUs");
    assert!(e.to_string().contains("no instance shape"), "{e}");
    assert!(
        run_placed(
            &t,
            &FleetSpec::default(),
            &[],
            &default_settings(Kind::Baseline),
            1
        )
        .is_err()
    );
    let e = mixed::compare_mixed(&t, 1, &MixedOptions::default()).expect_err("too large");
    assert!(e.to_string().contains("larger than"), "{e}");
}
