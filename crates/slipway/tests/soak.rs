//! The short chaos soak `make test` runs (the long one is `make soak`): a mix of jobs through
//! `slipway run` on real instances while the plugin, instances' sshd and the manager are
//! killed, an instance's network is slowed, the state disk fills and GitLab fails. Every job
//! ends exactly once, traces are whole, no instance runs more than `max_use_count` jobs, and
//! nothing of the run is left.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod chaos;
mod common;

use std::time::Duration;

use chaos::faults::{Fault, schedule};
use chaos::mix::mix;
use chaos::{Plan, Source};

fn short(source: Source) -> Plan {
    Plan {
        source,
        jobs: 80,
        seed: 15,
        capacity_per_instance: 3,
        max_instances: 4,
        concurrent: 12,
        max_use_count: 12,
        outage: Duration::from_secs(8),
        disk_full: Duration::from_secs(8),
        stall: Duration::from_secs(240),
    }
}

fn soak(source: Source) {
    let plan = short(source);
    let report = chaos::run(&plan);
    eprintln!("{:#}", report.to_json(&plan));
    let problems = report.problems();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every kind of fault was really injected.
    let kinds = chaos::faults::schedule(plan.seed, source == Source::Gitlab);
    for ev in kinds {
        assert!(
            report.faults.contains_key(ev.fault.as_str()),
            "{} was never injected: {:?}",
            ev.fault.as_str(),
            report.faults
        );
    }
    // Faults cost some jobs, not the run: most still did what they were made to do.
    let ok: u32 = report
        .outcomes
        .iter()
        .filter(|(k, _)| !k.contains("runner_system_failure"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        ok as usize * 2 > plan.jobs,
        "most jobs were failed by faults: {:?}",
        report.outcomes
    );
}

#[test]
fn a_chaos_soak_on_the_embedded_queue_loses_nothing_and_leaves_nothing() {
    soak(Source::Queue);
}

#[test]
fn a_chaos_soak_on_the_gitlab_fake_loses_nothing_and_leaves_nothing() {
    soak(Source::Gitlab);
}

#[test]
fn the_mix_is_seeded_and_holds_every_kind() {
    let a = mix(7, 500, "1234");
    let b = mix(7, 500, "1234");
    let names = |m: &[chaos::mix::SoakJob]| m.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    let kinds: std::collections::BTreeSet<_> = a.iter().map(|j| j.kind).collect();
    assert_eq!(kinds.len(), 7, "{kinds:?}");
}

#[test]
fn the_schedule_kills_the_manager_twice_and_has_gitlab_faults_only_with_gitlab() {
    let count = |e: &[chaos::faults::Event], f: Fault| e.iter().filter(|x| x.fault == f).count();
    let q = schedule(1, false);
    let g = schedule(1, true);
    assert_eq!(count(&q, Fault::KillManager), 2);
    assert_eq!(count(&q, Fault::Gitlab500), 0);
    assert_eq!(count(&g, Fault::GitlabDrop), 1);
    assert!(g.windows(2).all(|w| w[0].at <= w[1].at));
}
