//! `cargo bench -p slipway-sim --bench sim`: baseline vs Slipway vs oracle on the diurnal,
//! burst and weekend traces, each policy at the cheapest of its own settings that meets a
//! p95 wait of 30 s. Writes `bench/results/sim.json`.
//!
//! Environment: `SIM_SEED` (default 1), `SIM_THREADS` (default: all cores),
//! `SIM_TRACES` (comma list, default `diurnal,burst,weekend`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use serde_json::{Map, Value, json};
use slipway_sim::sweep::{self, CAPACITY_PER_INSTANCE, Evaluated, Settings, SweepResult};
use slipway_sim::{FleetSpec, oracle, run, trace};

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
    let traces = std::env::var("SIM_TRACES").unwrap_or_else(|_| "diurnal,burst,weekend".into());
    let fleet = FleetSpec::default();
    let started = Instant::now();
    let mut results = Map::new();
    for name in traces.split(',') {
        let t0 = Instant::now();
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
    let d = FleetSpec::default();
    results.insert(
        "fleet".into(),
        json!({
            "provisioning": format!("{:?}", d.provisioning),
            "deletion": format!("{:?}", d.deletion),
            "api_latency": format!("{:?}", d.api_latency),
            "boot_failure": d.boot_failure,
            "error_rate": d.error_rate,
            "capacity_per_instance": CAPACITY_PER_INSTANCE,
            "runner_check_interval_s": slipway_sim::run::CHECK_INTERVAL.as_secs_f64(),
            "seed": seed,
        }),
    );
    results.insert(
        "total_wall_s".into(),
        json!(round(started.elapsed().as_secs_f64(), 1)),
    );
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, text) = slipway_sim::bench::write(
        &repo,
        "sim",
        "cargo bench -p slipway-sim --bench sim",
        Value::Object(results),
    )
    .expect("write sim.json");
    println!("{text}");
    eprintln!("wrote {}", path.display());
}
