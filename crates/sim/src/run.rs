//! Drive one trace through one taskscaler configuration on simulated time.
//!
//! Each run gets its own single-threaded tokio runtime with the clock paused: whenever every
//! task is idle (jobs running, runners waiting to retry, the scaling loop sleeping) tokio jumps
//! to the next timer, so a simulated day takes well under a second. The taskscaler is the real
//! one, started with [`Taskscaler::start_at`] so its cron periods see the trace's wall time.

use std::sync::Arc;
use std::time::Duration;

use slipway_taskscaler::{Config, Error, Taskscaler};
use tokio::time::Instant;

use crate::fleet::{Bill, FleetSpec, SimFleet};
use crate::trace::{Job, Trace};

/// How often a runner that was refused a reservation asks again (GitLab's `check_interval`
/// default is 3 s).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(3);

/// A simulation that could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The runtime could not be built.
    #[error("simulation runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// The taskscaler refused the configuration or failed.
    #[error("taskscaler: {0}")]
    Taskscaler(#[from] Error),
    /// A simulated job task panicked.
    #[error("simulated job failed: {0}")]
    Job(String),
    /// A trace file that cannot be read.
    #[error("trace {0}")]
    Trace(String),
    /// Unknown trace name.
    #[error("unknown trace {0:?} (known: diurnal, burst, weekend, mixed, or a CSV file)")]
    UnknownTrace(String),
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// Jobs run.
    pub jobs: usize,
    /// Per job, in trace order: seconds from arrival to acquisition.
    pub waits_s: Vec<f64>,
    /// Median wait.
    pub wait_p50_s: f64,
    /// 95th percentile wait.
    pub wait_p95_s: f64,
    /// 99th percentile wait.
    pub wait_p99_s: f64,
    /// Longest wait.
    pub wait_max_s: f64,
    /// Acquisitions that hit `instance_acquire_timeout` (the job then asked again).
    pub acquire_timeouts: u64,
    /// The fleet's bill up to the end of the run.
    pub bill: Bill,
    /// Simulated seconds until the end of the run (the trace's horizon or the last job's end).
    pub end_s: f64,
}

/// Nearest-rank percentile of `sorted` (ascending); 0 for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Run `trace` through a taskscaler with `cfg` over a fleet of `fleet`, deterministically for
/// `seed` (which fixes the fleet's delays and failures).
pub fn run(
    trace: &Trace,
    fleet: &FleetSpec,
    cfg: &Config,
    seed: u64,
) -> Result<RunResult, SimError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    rt.block_on(simulate(trace, fleet, cfg, seed))
}

async fn simulate(
    trace: &Trace,
    spec: &FleetSpec,
    cfg: &Config,
    seed: u64,
) -> Result<RunResult, SimError> {
    let fleet = Arc::new(SimFleet::new(spec.clone(), seed));
    let origin = Instant::now();
    let ts = Arc::new(Taskscaler::start_at(
        fleet.clone(),
        fleet.provider_info(),
        cfg.clone(),
        trace.start,
    )?);
    let line = Arc::new(tokio::sync::Mutex::new(()));
    let mut tasks = Vec::with_capacity(trace.jobs.len());
    for (i, job) in trace.jobs.iter().enumerate() {
        let arrival = origin + Duration::from_secs_f64(job.arrival_s);
        tokio::time::sleep_until(arrival).await;
        tasks.push(tokio::spawn(job_task(
            ts.clone(),
            line.clone(),
            i,
            *job,
            arrival,
        )));
    }
    let mut waits = Vec::with_capacity(tasks.len());
    let mut acquire_timeouts = 0;
    for t in tasks {
        let (wait, timeouts) = t.await.map_err(|e| SimError::Job(e.to_string()))??;
        waits.push(wait);
        acquire_timeouts += timeouts;
    }
    tokio::time::sleep_until(origin + Duration::from_secs_f64(trace.horizon_s)).await;
    let end = Instant::now();
    let bill = fleet.bill(end);
    ts.shutdown().await;

    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(RunResult {
        jobs: waits.len(),
        wait_p50_s: percentile(&sorted, 50.0),
        wait_p95_s: percentile(&sorted, 95.0),
        wait_p99_s: percentile(&sorted, 99.0),
        wait_max_s: sorted.last().copied().unwrap_or(0.0),
        waits_s: waits,
        acquire_timeouts,
        bill,
        end_s: end.saturating_duration_since(origin).as_secs_f64(),
    })
}

/// One job, as a GitLab runner handles it: reserve (asking again every check interval while
/// refused), acquire, hold the slot for the job's duration, release.
///
/// Acquisitions go one at a time through `line`, first come first served (as GitLab hands out
/// its queue). Left to race, the jobs waiting for a slot would be woken in an order tokio
/// randomises (its watch channel spreads waiters over several queues by a random pick), and
/// which job, with which duration, lands on which instance would change from run to run.
async fn job_task(
    ts: Arc<Taskscaler>,
    line: Arc<tokio::sync::Mutex<()>>,
    index: usize,
    job: Job,
    arrival: Instant,
) -> Result<(f64, u64), SimError> {
    let key = format!("job-{index}");
    let mut timeouts = 0;
    loop {
        loop {
            match ts.reserve(&key) {
                Ok(()) => break,
                Err(Error::NoCapacity(_) | Error::NoIdleCapacity(_)) => {
                    tokio::time::sleep(CHECK_INTERVAL).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        // A fair (FIFO) lock: the job at the head of the line acquires first.
        let turn = line.lock().await;
        let acquired = ts.acquire(&key).await;
        drop(turn);
        match acquired {
            Ok(_acquisition) => break,
            Err(Error::AcquireTimeout(_)) => {
                timeouts += 1;
                ts.release(&key);
            }
            Err(e) => return Err(e.into()),
        }
    }
    let wait = Instant::now()
        .saturating_duration_since(arrival)
        .as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(job.duration_s)).await;
    ts.release(&key);
    Ok((wait, timeouts))
}
