//! Slipway's fleet simulator: the real taskscaler against a simulated cloud, on simulated time.
//!
//! - [`fleet`]: a simulated fleeting plugin (provisioning delays, boot failures, API errors,
//!   per-second and per-hour billing).
//! - [`trace`]: job traces (a diurnal day, pipeline bursts, a quiet weekend, CSV files).
//! - [`run`]: one trace through one taskscaler configuration on tokio's paused clock.
//! - [`oracle`]: the clairvoyant zero-wait lower bound.
//! - [`sweep`]: the policies (GitLab's baseline, Slipway's forecast) and the fair comparison.
//! - [`mixed`]: jobs of several sizes on shapes of a real price list — GitLab's one shape,
//!   GitLab's tagged runners, Slipway's shapes with packing.
//!
//! - [`rng`]: a deterministic PRNG and the distributions the simulator draws from.
//!
//! [`compare`] / [`run_named`] put it together for `slipway sim`. The bench-result writer lives in
//! `slipway_testkit::bench`, so only the binary depends on the simulator.

pub mod fleet;
pub mod mixed;
pub mod oracle;
pub mod rng;
pub mod run;
pub mod sweep;
pub mod trace;

pub use fleet::{Bill, FleetSpec, SimFleet};
pub use oracle::{OracleResult, oracle};
pub use run::{RunResult, SimError, run};
pub use sweep::{Family, ForecastSettings, Kind, Settings, SweepResult, sweep};
pub use trace::{Job, Trace, TraceError};

/// How to compare policies.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// The p95 wait each policy must meet, in seconds.
    pub target_p95_s: f64,
    /// Sweep each policy's settings (minutes) rather than run its default settings (seconds).
    pub sweep: bool,
    /// Threads for the sweep.
    pub threads: usize,
    /// The simulated cloud.
    pub fleet: FleetSpec,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            target_p95_s: 30.0,
            sweep: false,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            fleet: FleetSpec::default(),
        }
    }
}

/// One policy's outcome on a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyReport {
    /// `baseline`, `slipway` or `oracle`.
    pub policy: String,
    /// Settings used (`None` for the oracle).
    pub settings: Option<Settings>,
    /// Instance-seconds.
    pub instance_seconds: f64,
    /// Per-second bill.
    pub per_second_cost: f64,
    /// Per-hour bill.
    pub per_hour_cost: f64,
    /// Instances created.
    pub instances: u64,
    /// Median wait, seconds.
    pub wait_p50_s: f64,
    /// 95th percentile wait, seconds.
    pub wait_p95_s: f64,
    /// 99th percentile wait, seconds.
    pub wait_p99_s: f64,
    /// Whether the p95 target was met.
    pub met_target: bool,
}

impl PolicyReport {
    fn from_run(policy: Kind, settings: Settings, r: &RunResult, target: f64) -> Self {
        PolicyReport {
            policy: policy.as_str().into(),
            settings: Some(settings),
            instance_seconds: r.bill.instance_seconds,
            per_second_cost: r.bill.per_second_cost,
            per_hour_cost: r.bill.per_hour_cost,
            instances: r.bill.instances,
            wait_p50_s: r.wait_p50_s,
            wait_p95_s: r.wait_p95_s,
            wait_p99_s: r.wait_p99_s,
            met_target: r.wait_p95_s <= target,
        }
    }
}

/// The three policies on one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Trace name.
    pub trace: String,
    /// Jobs in the trace.
    pub jobs: usize,
    /// Simulated seconds.
    pub horizon_s: f64,
    /// The p95 wait target.
    pub target_p95_s: f64,
    /// GitLab's algorithm.
    pub baseline: PolicyReport,
    /// Slipway's forecast.
    pub slipway: PolicyReport,
    /// The clairvoyant lower bound.
    pub oracle: PolicyReport,
    /// Simulations run.
    pub simulations: usize,
}

impl Report {
    /// Slipway's instance-seconds over the baseline's.
    pub fn slipway_vs_baseline_cost(&self) -> f64 {
        self.slipway.instance_seconds / self.baseline.instance_seconds
    }

    /// Slipway's instance-seconds over the oracle's.
    pub fn slipway_vs_oracle_cost(&self) -> f64 {
        self.slipway.instance_seconds / self.oracle.instance_seconds
    }

    /// A plain-text table for the CLI.
    pub fn table(&self) -> String {
        let mut s = format!(
            "trace {}: {} jobs over {:.1} h, p95 wait target {} s, {} simulations\n",
            self.trace,
            self.jobs,
            self.horizon_s / 3600.0,
            self.target_p95_s,
            self.simulations
        );
        s.push_str(&format!(
            "{:<9} {:>14} {:>10} {:>10} {:>9} {:>9} {:>9} {:>6}\n",
            "policy", "instance-s", "$/second", "$/hour", "p50 s", "p95 s", "p99 s", "target"
        ));
        for p in [&self.baseline, &self.slipway, &self.oracle] {
            s.push_str(&format!(
                "{:<9} {:>14.0} {:>10.2} {:>10.2} {:>9.1} {:>9.1} {:>9.1} {:>6}\n",
                p.policy,
                p.instance_seconds,
                p.per_second_cost,
                p.per_hour_cost,
                p.wait_p50_s,
                p.wait_p95_s,
                p.wait_p99_s,
                if p.met_target { "met" } else { "MISSED" }
            ));
        }
        s.push_str(&format!(
            "slipway/baseline cost {:.3}, slipway/oracle cost {:.3}\n",
            self.slipway_vs_baseline_cost(),
            self.slipway_vs_oracle_cost()
        ));
        for p in [&self.baseline, &self.slipway] {
            if let Some(set) = &p.settings {
                s.push_str(&format!("{}: {}\n", p.policy, set.describe()));
            }
        }
        s
    }
}

/// Settings used without a sweep: hand-picked, conservative (p95 wait near zero on the diurnal
/// trace). For the fair comparison set [`SimOptions::sweep`], as `cargo bench -p slipway-sim
/// --bench sim` does.
pub fn default_settings(kind: Kind) -> Settings {
    match kind {
        Kind::Baseline => Settings {
            kind,
            idle_count: 0,
            idle_time_s: 300,
            scale_factor: 0.25,
            scale_factor_limit: 0,
            business_idle_count: Some(12),
            forecast: None,
        },
        Kind::Slipway => Settings {
            kind,
            idle_count: 0,
            idle_time_s: 300,
            scale_factor: 0.0,
            scale_factor_limit: 0,
            business_idle_count: None,
            forecast: Some(ForecastSettings {
                window_s: 300,
                horizon_s: 90,
                factor: 1.0,
                basis: slipway_taskscaler::forecast::Basis::Surge,
                quantile: 1.0,
                idle_time_s: None,
            }),
        },
    }
}

/// Compare baseline, Slipway and the oracle on `trace`.
pub fn compare(trace: &Trace, seed: u64, opts: &SimOptions) -> Result<Report, SimError> {
    let target = opts.target_p95_s;
    let mut simulations = 0;
    let mut pick = |kind: Kind, families: Vec<Family>| -> Result<PolicyReport, SimError> {
        if opts.sweep {
            let s = sweep::sweep(trace, &opts.fleet, &families, target, seed, opts.threads)?;
            simulations += s.runs.len();
            Ok(PolicyReport::from_run(
                kind,
                s.best.settings.clone(),
                &s.best.result,
                target,
            ))
        } else {
            let settings = default_settings(kind);
            let r = run::run(trace, &opts.fleet, &settings.config(), seed)?;
            simulations += 1;
            Ok(PolicyReport::from_run(kind, settings, &r, target))
        }
    };
    let baseline = pick(Kind::Baseline, sweep::baseline_families())?;
    let slipway = pick(Kind::Slipway, sweep::slipway_families())?;
    let o = oracle::oracle(trace, &opts.fleet, sweep::CAPACITY_PER_INSTANCE);
    Ok(Report {
        trace: trace.name.clone(),
        jobs: trace.jobs.len(),
        horizon_s: trace.horizon_s,
        target_p95_s: target,
        baseline,
        slipway,
        oracle: PolicyReport {
            policy: "oracle".into(),
            settings: None,
            instance_seconds: o.instance_seconds,
            per_second_cost: o.per_second_cost,
            per_hour_cost: o.per_hour_cost,
            instances: o.instances,
            wait_p50_s: 0.0,
            wait_p95_s: 0.0,
            wait_p99_s: 0.0,
            met_target: true,
        },
        simulations,
    })
}

/// `slipway sim`'s table for `trace`: [`mixed::compare_mixed`] for `mixed`, else
/// [`run_named`].
pub fn run_named_table(trace: &str, seed: u64, opts: &SimOptions) -> Result<String, SimError> {
    run_named_table_priced(trace, seed, opts, &std::collections::HashMap::new())
}

/// [`run_named_table`] with the mixed trace's instance types priced as `prices` says (type
/// name → price per hour, from config.toml's `price_per_hour`); the others keep the list's.
pub fn run_named_table_priced(
    trace: &str,
    seed: u64,
    opts: &SimOptions,
    prices: &std::collections::HashMap<String, f64>,
) -> Result<String, SimError> {
    if trace == "mixed" {
        let m = mixed::MixedOptions {
            sim: opts.clone(),
            ways: mixed::Ways::default().with_prices(prices),
        };
        return Ok(mixed::compare_mixed(&trace::mixed(seed), seed, &m)?.table());
    }
    Ok(run_named(trace, seed, opts)?.table())
}

/// [`compare`] on a named trace (`diurnal`, `burst`, `weekend`) or, for a name ending in
/// `.csv`, a trace read from that file.
pub fn run_named(trace: &str, seed: u64, opts: &SimOptions) -> Result<Report, SimError> {
    let t = if trace.ends_with(".csv") {
        let text = std::fs::read_to_string(trace)
            .map_err(|e| SimError::Trace(format!("cannot read {trace}: {e}")))?;
        trace::from_csv(trace, &text).map_err(|e| SimError::Trace(format!("{trace}: {e}")))?
    } else {
        trace::named(trace, seed).ok_or_else(|| SimError::UnknownTrace(trace.into()))?
    };
    compare(&t, seed, opts)
}
