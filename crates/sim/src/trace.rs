//! Job traces: when jobs arrive and how long they run.
//!
//! Generated traces are seeded and deterministic; traces can also be read from CSV
//! (`arrival_s,duration_s,cpu,memory`, one job a line, after that header).

use std::time::{Duration, SystemTime};

use crate::rng::{Dist, Rng};

/// One job of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Seconds from the start of the trace.
    pub arrival_s: f64,
    /// How long it holds its slot, in seconds.
    pub duration_s: f64,
    /// CPUs requested (the single-group traces carry it through; [`crate::mixed`] places by it).
    pub cpu: f64,
    /// Memory requested, in MiB.
    pub memory: f64,
}

/// A sequence of jobs, sorted by arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Name for reports.
    pub name: String,
    /// Jobs, sorted by `arrival_s`.
    pub jobs: Vec<Job>,
    /// Length of the simulated period in seconds (at least the last arrival).
    pub horizon_s: f64,
    /// Wall-clock time at second 0 (policy periods are matched against it).
    pub start: SystemTime,
}

/// A CSV trace that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Monday 2024-01-01 00:00:00 UTC.
pub const MONDAY: u64 = 1_704_067_200;
const DAY: f64 = 86_400.0;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// Names accepted by [`named`].
pub const NAMES: &[&str] = &["diurnal", "burst", "weekend", "mixed"];

/// A generated trace by name (`diurnal`, `burst`, `weekend`, `mixed`).
pub fn named(name: &str, seed: u64) -> Option<Trace> {
    match name {
        "diurnal" => Some(diurnal(seed)),
        "burst" => Some(burst(seed)),
        "weekend" => Some(weekend(seed)),
        "mixed" => Some(mixed(seed)),
        _ => None,
    }
}

/// Job durations: log-normal, median 4 min, from 15 s to an hour.
fn durations() -> Dist {
    Dist::LogNormal {
        median: 240.0,
        sigma: 0.7,
        min: 15.0,
        max: 3600.0,
    }
}

/// Arrivals of a Poisson process with rate `rate(t)` (jobs per second) over `0..horizon`,
/// by thinning against `max_rate`.
fn poisson(rng: &mut Rng, horizon: f64, max_rate: f64, rate: impl Fn(f64) -> f64) -> Vec<f64> {
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        t += rng.exp(max_rate);
        if t >= horizon {
            return out;
        }
        if rng.f64() * max_rate < rate(t) {
            out.push(t);
        }
    }
}

fn jobs_at(rng: &mut Rng, arrivals: &[f64], dist: Dist) -> Vec<Job> {
    arrivals
        .iter()
        .map(|&a| Job {
            arrival_s: a,
            duration_s: dist.sample(rng),
            cpu: 2.0,
            memory: 4096.0,
        })
        .collect()
}

/// Jobs per hour of the diurnal weekday at hour `h` (0..24, UTC): 4/h at night rising to
/// 600/h (10 a minute) at 13:00, a Gaussian of 3 h width.
pub fn diurnal_rate_per_hour(h: f64) -> f64 {
    4.0 + 596.0 * (-((h - 13.0) / 3.0).powi(2) / 2.0).exp()
}

/// One weekday (Monday, UTC) of Poisson arrivals whose rate follows [`diurnal_rate_per_hour`]:
/// about 4,500 jobs, peak concurrency around 50.
pub fn diurnal(seed: u64) -> Trace {
    let mut rng = Rng::stream(seed, 1);
    let arrivals = poisson(&mut rng, DAY, 600.0 / 3600.0, |t| {
        diurnal_rate_per_hour(t / 3600.0) / 3600.0
    });
    let jobs = jobs_at(&mut rng, &arrivals, durations());
    Trace {
        name: "diurnal".into(),
        jobs,
        horizon_s: DAY,
        start: at(MONDAY),
    }
}

/// One weekday of pipelines that fan out: pipelines arrive as a Poisson process (20/h in
/// 08:00–18:00 UTC, 2/h otherwise); each runs 1–3 stages, a stage starts 5–40 jobs at the
/// same second, and the next stage starts when the slowest job of the previous one would end.
pub fn burst(seed: u64) -> Trace {
    let mut rng = Rng::stream(seed, 2);
    let busy = |t: f64| (8.0..18.0).contains(&(t / 3600.0));
    let pipelines = poisson(&mut rng, DAY, 20.0 / 3600.0, |t| {
        (if busy(t) { 20.0 } else { 2.0 }) / 3600.0
    });
    let stage = Dist::LogNormal {
        median: 150.0,
        sigma: 0.6,
        min: 15.0,
        max: 1800.0,
    };
    let mut jobs = Vec::new();
    for p in pipelines {
        let mut t = p;
        for _ in 0..rng.range(1, 3) {
            let n = rng.range(5, 40);
            let mut longest: f64 = 0.0;
            for _ in 0..n {
                let d = stage.sample(&mut rng);
                longest = longest.max(d);
                jobs.push(Job {
                    arrival_s: t,
                    duration_s: d,
                    cpu: 2.0,
                    memory: 4096.0,
                });
            }
            t += longest;
        }
    }
    jobs.retain(|j| j.arrival_s < DAY);
    jobs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Trace {
        name: "burst".into(),
        jobs,
        horizon_s: DAY,
        start: at(MONDAY),
    }
}

/// A quiet weekend (Saturday and Sunday, UTC): 12 jobs an hour, flat.
pub fn weekend(seed: u64) -> Trace {
    let mut rng = Rng::stream(seed, 3);
    let arrivals = poisson(&mut rng, 2.0 * DAY, 12.0 / 3600.0, |_| 12.0 / 3600.0);
    let jobs = jobs_at(&mut rng, &arrivals, durations());
    Trace {
        name: "weekend".into(),
        jobs,
        horizon_s: 2.0 * DAY,
        start: at(MONDAY + 5 * 86_400),
    }
}

/// The job sizes of [`mixed`]: share of jobs, CPUs, memory in MiB.
pub const MIXED_SIZES: [(f64, f64, f64); 3] = [
    (0.70, 1.0, 2048.0),
    (0.25, 4.0, 8192.0),
    (0.05, 16.0, 65536.0),
];

/// The diurnal weekday (same seed, same arrivals and durations) with jobs of three sizes:
/// 70 % of 1 CPU / 2 GiB, 25 % of 4 CPU / 8 GiB, 5 % of 16 CPU / 64 GiB, no GPU. Sizes come
/// from a random stream of their own, so [`diurnal`] is unchanged by this trace existing.
pub fn mixed(seed: u64) -> Trace {
    let mut t = diurnal(seed);
    let mut rng = Rng::stream(seed, 4);
    for j in &mut t.jobs {
        let u = rng.f64();
        let mut acc = 0.0;
        // The last size takes whatever rounding leaves above the cumulative shares.
        let mut size = MIXED_SIZES[MIXED_SIZES.len() - 1];
        for s in MIXED_SIZES {
            acc += s.0;
            if u < acc {
                size = s;
                break;
            }
        }
        j.cpu = size.1;
        j.memory = size.2;
    }
    t.name = "mixed".into();
    t
}

/// The CSV header this module reads and writes.
pub const CSV_HEADER: &str = "arrival_s,duration_s,cpu,memory";

/// Read a trace from CSV text: header `arrival_s,duration_s,cpu,memory`, then one job a line.
/// Blank lines and lines starting with `#` are skipped; jobs are sorted by arrival. The trace
/// starts on a Monday 00:00 UTC; its horizon is when the last job would end.
pub fn from_csv(name: &str, text: &str) -> Result<Trace, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let Some((hline, header)) = lines.next() else {
        return Err(TraceError {
            line: 1,
            message: format!("empty trace: expected the header {CSV_HEADER:?}"),
        });
    };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    if cols != CSV_HEADER.split(',').collect::<Vec<_>>() {
        return Err(TraceError {
            line: hline,
            message: format!("expected the header {CSV_HEADER:?}, found {header:?}"),
        });
    }
    let mut jobs = Vec::new();
    for (line, text) in lines {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != 4 {
            return Err(TraceError {
                line,
                message: format!("expected 4 fields ({CSV_HEADER}), found {}", fields.len()),
            });
        }
        let mut vals = [0.0f64; 4];
        for (k, (field, col)) in fields.iter().zip(&cols).enumerate() {
            let v: f64 = field.parse().map_err(|_| TraceError {
                line,
                message: format!("{col} {field:?} is not a number"),
            })?;
            if !v.is_finite() || v < 0.0 {
                return Err(TraceError {
                    line,
                    message: format!("{col} {field:?} must be a finite number >= 0"),
                });
            }
            vals[k] = v;
        }
        if vals[1] <= 0.0 {
            return Err(TraceError {
                line,
                message: format!("duration_s {:?} must be above 0", fields[1]),
            });
        }
        jobs.push(Job {
            arrival_s: vals[0],
            duration_s: vals[1],
            cpu: vals[2],
            memory: vals[3],
        });
    }
    jobs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    let horizon_s = jobs
        .iter()
        .map(|j| j.arrival_s + j.duration_s)
        .fold(0.0, f64::max);
    Ok(Trace {
        name: name.into(),
        jobs,
        horizon_s,
        start: at(MONDAY),
    })
}

/// Write a trace as CSV that [`from_csv`] reads back to the same jobs.
pub fn to_csv(trace: &Trace) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for j in &trace.jobs {
        // `{}` on f64 prints the shortest text that parses back to the same value.
        out.push_str(&format!(
            "{},{},{},{}\n",
            j.arrival_s, j.duration_s, j.cpu, j.memory
        ));
    }
    out
}

impl Trace {
    /// Job-seconds of work in the trace.
    pub fn work_s(&self) -> f64 {
        self.jobs.iter().map(|j| j.duration_s).sum()
    }
}
