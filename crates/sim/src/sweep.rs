//! Policies and the fair comparison between them.
//!
//! Every policy is a point in its own settings space ([`Settings`]); the sweep gives each
//! policy the same procedure: for every combination of its secondary settings, bisect its
//! primary "how much spare capacity" knob for the smallest value that meets the p95 wait target,
//! then keep the cheapest of those runs. GitLab's baseline's primary knob is `idle_count` (its
//! docs' advice: raise idle capacity until jobs stop waiting, then tune `idle_time`,
//! `scale_factor`, `scale_factor_limit` and business-hours `periods` to pay less);
//! Slipway's is the forecast's `factor`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use slipway_taskscaler::forecast::Basis;
use slipway_taskscaler::{Config, Forecast, Policy};

use crate::fleet::FleetSpec;
use crate::run::{RunResult, SimError, run};
use crate::trace::Trace;

/// Slots per instance in every simulated fleet.
pub const CAPACITY_PER_INSTANCE: u32 = 4;
/// GitLab's business-hours example, in UTC: weekdays 08:00–17:59.
pub const BUSINESS_HOURS: &str = "* 8-17 * * mon-fri";

/// Which policy a setting belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// GitLab's documented algorithm (no forecast).
    Baseline,
    /// The same taskscaler with Slipway's demand forecast.
    Slipway,
}

impl Kind {
    /// Name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Baseline => "baseline",
            Kind::Slipway => "slipway",
        }
    }
}

/// Slipway's forecast settings, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForecastSettings {
    /// How far back arrivals are counted.
    pub window_s: u64,
    /// How far ahead demand is provisioned for.
    pub horizon_s: u64,
    /// Multiplier on the learnt idle target.
    pub factor: f64,
    /// Which statistic of recent demand sizes the idle target.
    pub basis: Basis,
    /// Share of recent jobs the surge target covers.
    pub quantile: f64,
    /// Idle time for instances the forecast does not need; `None` = the policy's `idle_time`.
    pub idle_time_s: Option<u64>,
}

/// One point in a policy's settings space.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Which policy.
    pub kind: Kind,
    /// Catch-all policy's `idle_count` (slots).
    pub idle_count: u32,
    /// `idle_time` in seconds (both policies).
    pub idle_time_s: u64,
    /// `scale_factor` (both policies).
    pub scale_factor: f64,
    /// `scale_factor_limit` (both policies).
    pub scale_factor_limit: u32,
    /// A second policy for [`BUSINESS_HOURS`] with this `idle_count`; `None` = catch-all only.
    pub business_idle_count: Option<u32>,
    /// Slipway's forecast.
    pub forecast: Option<ForecastSettings>,
}

impl Settings {
    /// The taskscaler configuration for these settings.
    pub fn config(&self) -> Config {
        let idle_time = Duration::from_secs(self.idle_time_s);
        let policy = |periods: &str, idle_count: u32| Policy {
            periods: vec![periods.to_string()],
            idle_count,
            idle_time,
            scale_factor: self.scale_factor,
            scale_factor_limit: self.scale_factor_limit,
            ..Policy::default()
        };
        let mut policies = vec![policy("* * * * *", self.idle_count)];
        if let Some(b) = self.business_idle_count {
            policies.push(policy(BUSINESS_HOURS, b));
        }
        Config {
            capacity_per_instance: CAPACITY_PER_INSTANCE,
            policies,
            forecast: self.forecast.map(|f| Forecast {
                window: Duration::from_secs(f.window_s),
                horizon: Duration::from_secs(f.horizon_s),
                factor: f.factor,
                basis: f.basis,
                quantile: f.quantile,
                idle_time: f.idle_time_s.map(Duration::from_secs),
            }),
            ..Config::default()
        }
    }

    /// A one-line description for tables.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "idle_count={} idle_time={}s scale_factor={} limit={}",
            self.idle_count, self.idle_time_s, self.scale_factor, self.scale_factor_limit
        );
        if let Some(b) = self.business_idle_count {
            s.push_str(&format!(" business_hours_idle_count={b}"));
        }
        if let Some(f) = self.forecast {
            s.push_str(&format!(
                " forecast(basis={:?} q={} window={}s horizon={}s factor={}",
                f.basis, f.quantile, f.window_s, f.horizon_s, f.factor
            ));
            if let Some(t) = f.idle_time_s {
                s.push_str(&format!(" idle_time={t}s"));
            }
            s.push(')');
        }
        s
    }

    /// Settings as `(key, value)` pairs for JSON output.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("idle_count", self.idle_count.to_string()),
            ("idle_time_s", self.idle_time_s.to_string()),
            ("scale_factor", self.scale_factor.to_string()),
            ("scale_factor_limit", self.scale_factor_limit.to_string()),
        ];
        match self.business_idle_count {
            Some(b) => {
                v.push((
                    "periods",
                    format!("\"* * * * *\" + \"{BUSINESS_HOURS}\" UTC"),
                ));
                v.push(("business_hours_idle_count", b.to_string()));
            }
            None => v.push(("periods", "\"* * * * *\"".into())),
        }
        if let Some(f) = self.forecast {
            v.push(("forecast_window_s", f.window_s.to_string()));
            v.push(("forecast_horizon_s", f.horizon_s.to_string()));
            v.push(("forecast_factor", f.factor.to_string()));
            v.push(("forecast_basis", format!("{:?}", f.basis).to_lowercase()));
            v.push(("forecast_quantile", f.quantile.to_string()));
            if let Some(t) = f.idle_time_s {
                v.push(("forecast_idle_time_s", t.to_string()));
            }
        }
        v
    }
}

/// A family of settings: fixed secondary settings and a ladder for the primary knob.
#[derive(Debug, Clone)]
pub struct Family {
    /// Settings with the primary knob still to fill in.
    pub base: Settings,
    /// Values of the primary knob, from least to most spare capacity.
    pub ladder: Vec<f64>,
}

impl Family {
    /// `base` with the primary knob at ladder value `v`.
    pub fn at(&self, v: f64) -> Settings {
        let mut s = self.base.clone();
        let slots = v.round().clamp(0.0, f64::from(u32::MAX)) as u32;
        match (&mut s.forecast, s.business_idle_count) {
            (Some(f), _) => f.factor = v,
            (None, Some(_)) => s.business_idle_count = Some(slots),
            (None, None) => s.idle_count = slots,
        }
        s
    }
}

/// The baseline's grid: GitLab's knobs as its docs advise tuning them — `idle_count` (the
/// ladder), `idle_time`, `scale_factor` with and without `scale_factor_limit`, and `periods`:
/// catch-all only, or a business-hours policy (the ladder) over a small catch-all.
pub fn baseline_families() -> Vec<Family> {
    let idle_ladder: Vec<f64> = [0, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64]
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    let mut out = Vec::new();
    // The same idle times as Slipway's grid (short ones included): a policy must not win
    // by being allowed a setting the other is denied.
    for idle_time_s in [30, 60, 120, 300, 900] {
        for (scale_factor, scale_factor_limit) in [
            (0.0, 0),
            (0.1, 0),
            (0.25, 0),
            (0.5, 0),
            (1.0, 0),
            (0.25, 8),
            (0.5, 16),
            (1.0, 32),
        ] {
            for off_hours in [None, Some(0), Some(2), Some(4)] {
                out.push(Family {
                    base: Settings {
                        kind: Kind::Baseline,
                        idle_count: off_hours.unwrap_or(0),
                        idle_time_s,
                        scale_factor,
                        scale_factor_limit,
                        business_idle_count: off_hours.map(|_| 0),
                        forecast: None,
                    },
                    ladder: idle_ladder.clone(),
                });
            }
        }
    }
    out
}

/// Slipway's grid: the surge forecast (`factor` the ladder; `window`, `horizon`, `quantile`)
/// with either GitLab's `idle_time` or the forecast's own, shorter one for instances it does
/// not need.
pub fn slipway_families() -> Vec<Family> {
    let factor_ladder = vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0];
    let idle_times = [
        (120, None),
        (300, None),
        (900, None),
        (120, Some(30)),
        (120, Some(60)),
    ];
    let mut out = Vec::new();
    for (idle_time_s, forecast_idle_s) in idle_times {
        for window_s in [900, 1800, 3600] {
            for horizon_s in [60, 120] {
                for quantile in [1.0, 0.95] {
                    out.push(Family {
                        base: Settings {
                            kind: Kind::Slipway,
                            idle_count: 0,
                            idle_time_s,
                            scale_factor: 0.0,
                            scale_factor_limit: 0,
                            business_idle_count: None,
                            forecast: Some(ForecastSettings {
                                window_s,
                                horizon_s,
                                factor: 1.0,
                                basis: Basis::Surge,
                                quantile,
                                idle_time_s: forecast_idle_s,
                            }),
                        },
                        ladder: factor_ladder.clone(),
                    });
                }
            }
        }
    }
    out
}

/// One evaluated point.
#[derive(Debug, Clone)]
pub struct Evaluated {
    /// The settings.
    pub settings: Settings,
    /// What the run measured.
    pub result: RunResult,
}

/// Outcome of a policy's sweep on one trace.
#[derive(Debug, Clone)]
pub struct SweepResult {
    /// The cheapest run that met the target; if none did, the run with the lowest p95 wait.
    pub best: Evaluated,
    /// Whether `best` meets the target.
    pub met_target: bool,
    /// Every run made, in no particular order.
    pub runs: Vec<Evaluated>,
}

/// Runs `work` on every family, `threads` at a time; each family's results tagged with its
/// index (in no particular order). The first error stops the threads' next families.
pub(crate) fn over_families<F: Sync, E: Send>(
    families: &[F],
    threads: usize,
    work: impl Fn(&F) -> Result<Vec<E>, SimError> + Sync,
) -> Result<Vec<(usize, E)>, SimError> {
    let next = AtomicUsize::new(0);
    let runs: Mutex<Vec<(usize, E)>> = Mutex::new(Vec::new());
    let error: Mutex<Option<SimError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(family) = families.get(i) else {
                        return;
                    };
                    match work(family) {
                        Ok(evals) => runs
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .extend(evals.into_iter().map(|e| (i, e))),
                        Err(e) => {
                            *error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(runs.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// Bisect each family's ladder for the least spare capacity meeting `target_p95_s`, then keep
/// the cheapest; runs families on `threads` threads. Deterministic: each run is.
pub fn sweep(
    trace: &Trace,
    fleet: &FleetSpec,
    families: &[Family],
    target_p95_s: f64,
    seed: u64,
    threads: usize,
) -> Result<SweepResult, SimError> {
    let mut runs = over_families(families, threads, |family| {
        bisect(trace, fleet, family, target_p95_s, seed)
    })?;
    // Thread timing must not change the answer: order by family, then by cost.
    runs.sort_by(|a, b| {
        a.0.cmp(&b.0).then(
            a.1.result
                .bill
                .instance_seconds
                .total_cmp(&b.1.result.bill.instance_seconds),
        )
    });
    let runs: Vec<Evaluated> = runs.into_iter().map(|(_, e)| e).collect();
    let meeting = runs
        .iter()
        .filter(|e| e.result.wait_p95_s <= target_p95_s)
        .min_by(|a, b| {
            a.result
                .bill
                .instance_seconds
                .total_cmp(&b.result.bill.instance_seconds)
        });
    let (best, met_target) = match meeting {
        Some(e) => (e.clone(), true),
        None => match runs
            .iter()
            .min_by(|a, b| a.result.wait_p95_s.total_cmp(&b.result.wait_p95_s))
        {
            Some(e) => (e.clone(), false),
            None => {
                return Err(SimError::Job("empty sweep".into()));
            }
        },
    };
    Ok(SweepResult {
        best,
        met_target,
        runs,
    })
}

/// Smallest ladder value meeting the target, by bisection (assumes more spare capacity never
/// raises the wait); returns every run made.
fn bisect(
    trace: &Trace,
    fleet: &FleetSpec,
    family: &Family,
    target_p95_s: f64,
    seed: u64,
) -> Result<Vec<Evaluated>, SimError> {
    let mut evals = Vec::new();
    let (mut lo, mut hi) = (0usize, family.ladder.len());
    // Invariant: every index < lo fails; index hi (if in range) meets.
    while lo < hi {
        let mid = (lo + hi) / 2;
        let settings = family.at(family.ladder[mid]);
        let result = run(trace, fleet, &settings.config(), seed)?;
        let ok = result.wait_p95_s <= target_p95_s;
        evals.push(Evaluated { settings, result });
        if ok {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(evals)
}
