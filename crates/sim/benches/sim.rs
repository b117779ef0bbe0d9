//! `cargo bench -p slipway-sim --bench sim`: baseline vs Slipway vs oracle on the diurnal,
//! burst and weekend traces, each policy at the cheapest of its own settings that meets a
//! p95 wait of 30 s; and on the `mixed` trace (jobs of three sizes) GitLab's one shape,
//! GitLab's tagged runners and Slipway's shapes, in USD. Writes `bench/results/sim.json`.
//!
//! Environment: `SIM_SEED` (default 1), `SIM_THREADS` (default: all cores),
//! `SIM_TRACES` (comma list, default `diurnal,burst,weekend,mixed`). A run of some of the
//! traces replaces only their entries in an existing `sim.json` and keeps the rest as it was
//! (`SIM_TRACES=mixed` reruns the mixed comparison alone).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use serde_json::{Map, Value, json};
use slipway_sim::mixed::{self, MixedOptions};
use slipway_sim::sweep::{self, CAPACITY_PER_INSTANCE, Evaluated, Settings, SweepResult};
use slipway_sim::{FleetSpec, SimOptions, oracle, run, trace};

const TARGET_P95_S: f64 = 30.0;

fn settings_json(s: &Settings) -> Value {
    let mut m = Map::new();
    for (k, v) in s.fields() {
        let val = if let Ok(n) = v.parse::<u64>() {
            json!(n)
        } else if let Ok(f) = v.parse::<f64>() {
            json!(f)
        } else {
            Value::String(v)
        };
        m.insert(k.to_string(), val);
    }
    Value::Object(m)
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn policy_json(prefix: &str, s: &SweepResult, out: &mut Map<String, Value>) {
    let r = &s.best.result;
    out.insert(
        format!("{prefix}_cost"),
        json!(round(r.bill.instance_seconds, 0)),
    );
    out.insert(
        format!("{prefix}_wait_p50_s"),
        json!(round(r.wait_p50_s, 2)),
    );
    out.insert(
        format!("{prefix}_wait_p95_s"),
        json!(round(r.wait_p95_s, 2)),
    );
    out.insert(
        format!("{prefix}_wait_p99_s"),
        json!(round(r.wait_p99_s, 2)),
    );
    out.insert(format!("{prefix}_met_target"), json!(s.met_target));
    out.insert(
        format!("{prefix}_per_second_usd"),
        json!(round(r.bill.per_second_cost, 2)),
    );
    out.insert(
        format!("{prefix}_per_hour_usd"),
        json!(round(r.bill.per_hour_cost, 2)),
    );
    out.insert(
        format!("{prefix}_instances_created"),
        json!(r.bill.instances),
    );
    out.insert(
        format!("{prefix}_peak_instances"),
        json!(r.bill.peak_instances),
    );
    out.insert(
        format!("{prefix}_plugin_update_calls"),
        json!(r.bill.update_calls),
    );
    out.insert(
        format!("{prefix}_settings"),
        settings_json(&s.best.settings),
    );
    out.insert(format!("{prefix}_simulations"), json!(s.runs.len()));
}

/// The winner's settings on a second, unseen trace (seed + 1): does the choice generalise?
fn holdout(name: &str, seed: u64, fleet: &FleetSpec, best: &Evaluated) -> (f64, f64) {
    let t = trace::named(name, seed + 1).expect("trace");
    let r = run(&t, fleet, &best.settings.config(), seed + 1).expect("holdout run");
    (r.bill.instance_seconds, r.wait_p95_s)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let seed: u64 = std::env::var("SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let threads: usize = std::env::var("SIM_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    const ALL: &str = "diurnal,burst,weekend,mixed";
    let traces = std::env::var("SIM_TRACES").unwrap_or_else(|_| ALL.into());
    let fleet = FleetSpec::default();
    let started = Instant::now();
    let mut results = Map::new();
    for name in traces.split(',') {
        let t0 = Instant::now();
        if name == "mixed" {
            results.insert(name.into(), mixed_results(seed, threads));
            continue;
        }
        let t = trace::named(name, seed).expect("known trace");
        let o = oracle(&t, &fleet, CAPACITY_PER_INSTANCE);
        let base = sweep::sweep(
            &t,
            &fleet,
            &sweep::baseline_families(),
            TARGET_P95_S,
            seed,
            threads,
        )
        .expect("baseline sweep");
        let slip = sweep::sweep(
            &t,
            &fleet,
            &sweep::slipway_families(),
            TARGET_P95_S,
            seed,
            threads,
        )
        .expect("slipway sweep");
        let mut m = Map::new();
        m.insert("jobs".into(), json!(t.jobs.len()));
        m.insert("horizon_h".into(), json!(t.horizon_s / 3600.0));
        m.insert("work_job_seconds".into(), json!(round(t.work_s(), 0)));
        m.insert("target_wait_p95_s".into(), json!(TARGET_P95_S));
        policy_json("baseline", &base, &mut m);
        policy_json("slipway", &slip, &mut m);
        m.insert("oracle_cost".into(), json!(round(o.instance_seconds, 0)));
        m.insert("oracle_wait_p95_s".into(), json!(0.0));
        m.insert(
            "oracle_per_second_usd".into(),
            json!(round(o.per_second_cost, 2)),
        );
        m.insert(
            "oracle_per_hour_usd".into(),
            json!(round(o.per_hour_cost, 2)),
        );
        m.insert("oracle_instances_created".into(), json!(o.instances));
        m.insert("oracle_peak_instances".into(), json!(o.peak_instances));
        m.insert(
            "oracle_settings".into(),
            json!({
                "kind": "clairvoyant zero-wait lower bound on instance-seconds",
                "provisioning_s": fleet.provisioning.min(),
                "deletion_s": fleet.deletion.min(),
                "capacity_per_instance": CAPACITY_PER_INSTANCE,
            }),
        );
        let bc = base.best.result.bill.instance_seconds;
        let sc = slip.best.result.bill.instance_seconds;
        m.insert("slipway_vs_baseline_cost".into(), json!(round(sc / bc, 3)));
        m.insert(
            "slipway_vs_oracle_cost".into(),
            json!(round(sc / o.instance_seconds, 3)),
        );
        m.insert(
            "baseline_vs_oracle_cost".into(),
            json!(round(bc / o.instance_seconds, 3)),
        );
        let (hb_cost, hb_p95) = holdout(name, seed, &fleet, &base.best);
        let (hs_cost, hs_p95) = holdout(name, seed, &fleet, &slip.best);
        m.insert(
            "holdout_seed_plus_1".into(),
            json!({
                "baseline_cost": round(hb_cost, 0),
                "baseline_wait_p95_s": round(hb_p95, 2),
                "slipway_cost": round(hs_cost, 0),
                "slipway_wait_p95_s": round(hs_p95, 2),
                "slipway_vs_baseline_cost": round(hs_cost / hb_cost, 3),
            }),
        );
        m.insert("wall_s".into(), json!(round(t0.elapsed().as_secs_f64(), 1)));
        eprintln!(
            "{name}: baseline {bc:.0} (p95 {:.1}) slipway {sc:.0} (p95 {:.1}) oracle {:.0}; {:.1}s",
            base.best.result.wait_p95_s,
            slip.best.result.wait_p95_s,
            o.instance_seconds,
            t0.elapsed().as_secs_f64()
        );
        eprintln!("  baseline: {}", base.best.settings.describe());
        eprintln!("  slipway:  {}", slip.best.settings.describe());
        results.insert(name.to_string(), Value::Object(m));
    }
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut all: Vec<&str> = ALL.split(',').collect();
    let mut ran: Vec<&str> = traces.split(',').collect();
    all.sort_unstable();
    ran.sort_unstable();
    if ran != all {
        let (path, text) =
            slipway_testkit::bench::merge(&repo, "sim", results).expect("merge into sim.json");
        println!("{text}");
        eprintln!("updated {} ({traces} only)", path.display());
        return;
    }
    let mut fleet = fleet_json();
    fleet.insert("capacity_per_instance".into(), json!(CAPACITY_PER_INSTANCE));
    fleet.insert("seed".into(), json!(seed));
    results.insert("fleet".into(), Value::Object(fleet));
    results.insert(
        "total_wall_s".into(),
        json!(round(started.elapsed().as_secs_f64(), 1)),
    );
    let (path, text) = slipway_testkit::bench::write(
        &repo,
        "sim",
        "cargo bench -p slipway-sim --bench sim",
        Value::Object(results),
    )
    .expect("write sim.json");
    println!("{text}");
    eprintln!("wrote {}", path.display());
}

/// The mixed-size comparison, swept, with a holdout on seed + 1.
fn mixed_results(seed: u64, threads: usize) -> Value {
    let t0 = Instant::now();
    let opts = MixedOptions {
        sim: SimOptions {
            target_p95_s: TARGET_P95_S,
            sweep: true,
            threads,
            ..SimOptions::default()
        },
        ..MixedOptions::default()
    };
    let t = trace::mixed(seed);
    let report = mixed::compare_mixed(&t, seed, &opts).expect("mixed comparison");
    eprint!("{}", report.table());
    let mut m = match report.to_json() {
        Value::Object(m) => m,
        _ => unreachable!("to_json returns an object"),
    };
    let held = trace::mixed(seed + 1);
    let (one, tagged, slip) =
        mixed::rerun(&held, seed + 1, &opts, &report.chosen()).expect("mixed holdout");
    let better = if tagged.cost_usd <= one.cost_usd {
        &tagged
    } else {
        &one
    };
    m.insert(
        "holdout_seed_plus_1".into(),
        json!({
            "gitlab_one_shape_cost": round(one.cost_usd, 2),
            "gitlab_one_shape_wait_p95_s": round(one.wait_p95_s, 2),
            "gitlab_tagged_cost": round(tagged.cost_usd, 2),
            "gitlab_tagged_wait_p95_s": round(tagged.wait_p95_s, 2),
            "slipway_cost": round(slip.cost_usd, 2),
            "slipway_wait_p95_s": round(slip.wait_p95_s, 2),
            "slipway_vs_better_gitlab_cost": round(slip.cost_usd / better.cost_usd, 3),
        }),
    );
    let mut fleet = fleet_json();
    fleet.insert("same for every instance type".into(), json!(true));
    m.insert("fleet".into(), Value::Object(fleet));
    m.insert("seed".into(), json!(seed));
    m.insert(
        "command".into(),
        json!("SIM_TRACES=mixed cargo bench -p slipway-sim --bench sim"),
    );
    m.insert("machine".into(), json!(slipway_testkit::bench::machine()));
    m.insert(
        "date".into(),
        json!(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()),
    );
    m.insert("wall_s".into(), json!(round(t0.elapsed().as_secs_f64(), 1)));
    Value::Object(m)
}

/// The default simulated cloud, as recorded beside each trace's results.
fn fleet_json() -> Map<String, Value> {
    let d = FleetSpec::default();
    let mut m = serde_json::Map::new();
    m.insert(
        "provisioning".into(),
        json!(format!("{:?}", d.provisioning)),
    );
    m.insert("deletion".into(), json!(format!("{:?}", d.deletion)));
    m.insert("api_latency".into(), json!(format!("{:?}", d.api_latency)));
    m.insert("boot_failure".into(), json!(d.boot_failure));
    m.insert("error_rate".into(), json!(d.error_rate));
    m.insert(
        "runner_check_interval_s".into(),
        json!(slipway_sim::run::CHECK_INTERVAL.as_secs_f64()),
    );
    m
}
