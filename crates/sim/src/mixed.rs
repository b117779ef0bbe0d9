//! Per-job sizing: jobs of several sizes on instance shapes from a real price list.
//!
//! Three ways to run the [`crate::trace::mixed`] trace, each at its cheapest setting meeting the
//! same p95 wait:
//!
//! - **GitLab, one shape**: one runner whose single instance type fits the largest job. GitLab's
//!   slots carry no size, so only one job per instance guarantees every job its resources.
//! - **GitLab, tagged**: one runner per job size (jobs routed by tags), each with its own
//!   autoscaler and instance type fitted to its size. The runners share nothing, so each is
//!   swept alone and the cheapest combination meeting the overall p95 is kept.
//! - **Slipway**: one runner with several shapes; the real [`Placement`] puts each job on the
//!   cheapest shape with room now, else the cheapest that can hold it, and each shape's real
//!   taskscaler packs jobs by their resources.
//!
//! Costs are US dollars under per-second billing, at the prices of [`PRICE_LIST`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use slipway_taskscaler::{Config, Error, Placement, Resources, Shape, Taskscaler};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::SimOptions;
use crate::fleet::{Bill, FleetSpec, SimFleet};
use crate::run::{CHECK_INTERVAL, SimError, percentile};
use crate::sweep::{Family, Kind, Settings, baseline_families, slipway_families};
use crate::trace::{Job, MIXED_SIZES, Trace};

/// One instance type of a cloud's price list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstanceType {
    /// The cloud's name for it.
    pub name: &'static str,
    /// vCPUs.
    pub cpu: u32,
    /// Memory in GiB.
    pub memory_gib: u32,
    /// On-demand price per hour, USD.
    pub usd_per_hour: f64,
}

impl InstanceType {
    /// What one instance offers, as the taskscaler counts it.
    pub fn resources(&self) -> Resources {
        Resources {
            cpu_millis: u64::from(self.cpu) * 1000,
            memory_bytes: u64::from(self.memory_gib) << 30,
            gpus: 0,
        }
    }

    /// Price of the smallest fraction of one instance that holds `r` (a continuous share:
    /// the larger of the CPU and memory fractions); `None` when it cannot hold `r`.
    pub fn exact_share_usd_per_hour(&self, r: &Resources) -> Option<f64> {
        let offer = self.resources();
        if !r.fits_in(&offer) {
            return None;
        }
        let cpu = r.cpu_millis as f64 / offer.cpu_millis as f64;
        let mem = r.memory_bytes as f64 / offer.memory_bytes as f64;
        Some(self.usd_per_hour * cpu.max(mem))
    }
}

/// Where the prices come from.
pub const PRICE_SOURCE: &str = "AWS EC2 on-demand, Linux, us-east-1, per-second billing; \
    prices used as listed at the time of writing";

/// The instance types the comparison draws from (see [`PRICE_SOURCE`]).
pub const PRICE_LIST: &[InstanceType] = &[
    InstanceType {
        name: "c7i.large",
        cpu: 2,
        memory_gib: 4,
        usd_per_hour: 0.08925,
    },
    InstanceType {
        name: "c7i.xlarge",
        cpu: 4,
        memory_gib: 8,
        usd_per_hour: 0.1785,
    },
    InstanceType {
        name: "c7i.2xlarge",
        cpu: 8,
        memory_gib: 16,
        usd_per_hour: 0.357,
    },
    InstanceType {
        name: "c7i.4xlarge",
        cpu: 16,
        memory_gib: 32,
        usd_per_hour: 0.714,
    },
    InstanceType {
        name: "m7i.large",
        cpu: 2,
        memory_gib: 8,
        usd_per_hour: 0.1008,
    },
    InstanceType {
        name: "m7i.xlarge",
        cpu: 4,
        memory_gib: 16,
        usd_per_hour: 0.2016,
    },
    InstanceType {
        name: "m7i.2xlarge",
        cpu: 8,
        memory_gib: 32,
        usd_per_hour: 0.4032,
    },
    InstanceType {
        name: "m7i.4xlarge",
        cpu: 16,
        memory_gib: 64,
        usd_per_hour: 0.8064,
    },
];

/// An instance type of [`PRICE_LIST`] by name.
pub fn instance_type(name: &str) -> Option<InstanceType> {
    PRICE_LIST.iter().find(|t| t.name == name).copied()
}

/// One instance group of a runner: an instance type split into `capacity` slots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeSpec {
    /// What one instance is and costs.
    pub instance: InstanceType,
    /// Slots per instance (`capacity_per_instance`).
    pub capacity: u32,
}

impl ShapeSpec {
    /// The shape `name` of [`PRICE_LIST`] with `capacity` slots; `None` for an unknown name.
    pub fn of(name: &str, capacity: u32) -> Option<Self> {
        instance_type(name).map(|instance| ShapeSpec { instance, capacity })
    }

    /// The taskscaler configuration of this shape under `settings`.
    pub fn config(&self, settings: &Settings) -> Config {
        Config {
            capacity_per_instance: self.capacity.max(1),
            instance_resources: Some(self.instance.resources()),
            instance_cost: self.instance.usd_per_hour,
            ..settings.config()
        }
    }

    /// `name×capacity` for reports.
    pub fn describe(&self) -> String {
        format!("{}×{}", self.instance.name, self.capacity)
    }

    /// Whether one instance can hold `job`.
    pub fn holds(&self, job: &Job) -> bool {
        request(job).fits_in(&self.instance.resources())
    }
}

/// What `job` asks for: its CPUs and its memory (MiB).
pub fn request(job: &Job) -> Resources {
    Resources {
        cpu_millis: (job.cpu.max(0.0) * 1000.0).round() as u64,
        memory_bytes: (job.memory.max(0.0) * 1024.0 * 1024.0).round() as u64,
        gpus: 0,
    }
}

/// Index in [`MIXED_SIZES`] of `job`'s size; `None` for another size.
pub fn size_class(job: &Job) -> Option<usize> {
    MIXED_SIZES
        .iter()
        .position(|&(_, cpu, mem)| job.cpu == cpu && job.memory == mem)
}

/// What one run of a trace through one runner measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedRun {
    /// Per job, in trace order: seconds from arrival to acquisition.
    pub waits_s: Vec<f64>,
    /// 95th percentile wait.
    pub wait_p95_s: f64,
    /// Cost in USD (per-second billing over every shape).
    pub cost_usd: f64,
    /// Instance-seconds over every shape.
    pub instance_seconds: f64,
    /// Instances created over every shape.
    pub instances: u64,
    /// Per shape, in the runner's order: its name and bill.
    pub bills: Vec<(String, Bill)>,
}

/// Jobs waiting for a slot on one shape, by trace index (so placed in arrival order).
#[derive(Default)]
struct Queue {
    waiting: Mutex<BTreeMap<usize, Waiter>>,
    notify: Notify,
}

struct Waiter {
    key: String,
    slots: u32,
    placed: oneshot::Sender<()>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Waiter>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Run `trace` through one runner with `shapes` (placed by the real [`Placement`]) under
/// `settings`, each shape on its own simulated fleet like `fleet` priced by its instance type;
/// deterministic for `seed`.
pub fn run_placed(
    trace: &Trace,
    fleet: &FleetSpec,
    shapes: &[ShapeSpec],
    settings: &Settings,
    seed: u64,
) -> Result<PlacedRun, SimError> {
    if shapes.is_empty() {
        return Err(SimError::Job("a runner needs at least one shape".into()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    rt.block_on(simulate_placed(trace, fleet, shapes, settings, seed))
}

async fn simulate_placed(
    trace: &Trace,
    spec: &FleetSpec,
    shapes: &[ShapeSpec],
    settings: &Settings,
    seed: u64,
) -> Result<PlacedRun, SimError> {
    let origin = Instant::now();
    let mut fleets = Vec::with_capacity(shapes.len());
    let mut groups = Vec::with_capacity(shapes.len());
    for (i, s) in shapes.iter().enumerate() {
        let fs = FleetSpec {
            price_per_second: s.instance.usd_per_hour / 3600.0,
            price_per_hour: s.instance.usd_per_hour,
            ..spec.clone()
        };
        // Each group draws its own delays and failures.
        let fleet = Arc::new(SimFleet::new(fs, seed.wrapping_add(i as u64 * 1_000_003)));
        let mut info = fleet.provider_info();
        info.id = format!("sim/{}", s.instance.name);
        let scaler = Taskscaler::start_at(fleet.clone(), info, s.config(settings), trace.start)?;
        groups.push(Shape {
            name: s.describe(),
            scaler,
        });
        fleets.push(fleet);
    }
    let placement = Arc::new(Placement::new(groups));
    let queues: Vec<Arc<Queue>> = shapes.iter().map(|_| Arc::default()).collect();
    let dispatchers: Vec<_> = (0..shapes.len())
        .map(|i| tokio::spawn(dispatch(placement.clone(), i, queues[i].clone())))
        .collect();

    let mut tasks = Vec::with_capacity(trace.jobs.len());
    for (i, job) in trace.jobs.iter().enumerate() {
        let arrival = origin + Duration::from_secs_f64(job.arrival_s);
        tokio::time::sleep_until(arrival).await;
        tasks.push(tokio::spawn(placed_job(
            placement.clone(),
            queues.clone(),
            i,
            *job,
            arrival,
        )));
    }
    let mut waits = Vec::with_capacity(tasks.len());
    let mut failed = None;
    for t in tasks {
        match t.await {
            Ok(Ok(w)) => waits.push(w),
            Ok(Err(e)) => {
                failed.get_or_insert(e);
            }
            Err(e) => {
                failed.get_or_insert(SimError::Job(e.to_string()));
            }
        }
    }
    for d in &dispatchers {
        d.abort();
    }
    if let Some(e) = failed {
        placement.shutdown().await;
        return Err(e);
    }
    tokio::time::sleep_until(origin + Duration::from_secs_f64(trace.horizon_s)).await;
    let end = Instant::now();
    let bills: Vec<(String, Bill)> = shapes
        .iter()
        .zip(&fleets)
        .map(|(s, f)| (s.describe(), f.bill(end)))
        .collect();
    placement.shutdown().await;
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(PlacedRun {
        wait_p95_s: percentile(&sorted, 95.0),
        cost_usd: bills.iter().map(|(_, b)| b.per_second_cost).sum(),
        instance_seconds: bills.iter().map(|(_, b)| b.instance_seconds).sum(),
        instances: bills.iter().map(|(_, b)| b.instances).sum(),
        waits_s: waits,
        bills,
    })
}

/// One job, as a runner with shapes handles it: reserve on the shape [`Placement`] picks
/// (asking again every check interval while refused), wait in that shape's line for a slot,
/// hold it for the job's duration, release.
async fn placed_job(
    placement: Arc<Placement>,
    queues: Vec<Arc<Queue>>,
    index: usize,
    job: Job,
    arrival: Instant,
) -> Result<f64, SimError> {
    let key = format!("job-{index}");
    let req = request(&job);
    loop {
        match placement.reserve(&key, &req) {
            Ok(()) => break,
            Err(Error::NoCapacity(_) | Error::NoIdleCapacity(_)) => {
                tokio::time::sleep(CHECK_INTERVAL).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let shape = placement
        .shape_of(&key)
        .and_then(|s| placement.shapes().iter().position(|x| std::ptr::eq(x, s)))
        .ok_or_else(|| SimError::Job(format!("{key}: reserved on no shape")))?;
    let slots = placement.shapes()[shape].scaler.slots_for(&req)?;
    let (tx, rx) = oneshot::channel();
    queues[shape].lock().insert(
        index,
        Waiter {
            key: key.clone(),
            slots,
            placed: tx,
        },
    );
    queues[shape].notify.notify_one();
    rx.await
        .map_err(|_| SimError::Job(format!("{key}: the dispatcher stopped")))?;
    let wait = Instant::now()
        .saturating_duration_since(arrival)
        .as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(job.duration_s)).await;
    placement.release(&key);
    Ok(wait)
}

/// Hand one shape's free slots to its waiting jobs: whenever its taskscaler reports a change
/// or a job joins the line, the earliest-arrived job that fits on a running instance now is
/// acquired, and so on until none fits.
///
/// One task per shape rather than each job acquiring for itself: jobs racing for a freed slot
/// would be woken in an order tokio randomises, and runs would not repeat. Skipping a job that
/// does not fit (a large job waiting for a new instance) keeps it from blocking smaller ones.
async fn dispatch(placement: Arc<Placement>, shape: usize, queue: Arc<Queue>) {
    let scaler = &placement.shapes()[shape].scaler;
    loop {
        let mut changes = scaler.changes();
        loop {
            let next = queue
                .lock()
                .iter()
                .find(|(_, w)| scaler.fits_now(w.slots))
                .map(|(i, _)| *i);
            let Some(waiter) = next.and_then(|i| queue.lock().remove(&i)) else {
                break;
            };
            // It fits now, so the acquisition is immediate.
            match scaler.acquire(&waiter.key).await {
                Ok(_) => {
                    let _ = waiter.placed.send(());
                }
                // The job's task sees its sender dropped and reports the run failed.
                Err(_) => return,
            }
        }
        tokio::select! {
            biased;
            r = changes.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = queue.notify.notified() => {}
        }
    }
}

/// One evaluated setting of one runner.
#[derive(Debug, Clone)]
pub struct PlacedEval {
    /// The settings.
    pub settings: Settings,
    /// What the run measured.
    pub run: PlacedRun,
}

/// Bisect each family's ladder for the least spare capacity meeting the p95 target (as
/// [`crate::sweep::sweep`] does), on `threads` threads. With `floor`, every family's first
/// ladder value is run too, so the sweep also knows the cheapest, slowest point of each
/// family. Returns every run, ordered by family then cost (deterministic).
pub fn sweep_placed(
    trace: &Trace,
    shapes: &[ShapeSpec],
    families: &[Family],
    opts: &MixedOptions,
    seed: u64,
    floor: bool,
) -> Result<Vec<PlacedEval>, SimError> {
    let (fleet, target_p95_s, threads) = (&opts.sim.fleet, opts.sim.target_p95_s, opts.sim.threads);
    let eval = |s: Settings| -> Result<PlacedEval, SimError> {
        let run = run_placed(trace, fleet, shapes, &s, seed)?;
        Ok(PlacedEval { settings: s, run })
    };
    let mut runs = crate::sweep::over_families(families, threads, |family| {
        bisect(family, target_p95_s, floor, &eval)
    })?;
    runs.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.run.cost_usd.total_cmp(&b.1.run.cost_usd))
    });
    Ok(runs.into_iter().map(|(_, e)| e).collect())
}

fn bisect(
    family: &Family,
    target_p95_s: f64,
    floor: bool,
    eval: &(dyn Fn(Settings) -> Result<PlacedEval, SimError> + Sync),
) -> Result<Vec<PlacedEval>, SimError> {
    let mut evals = Vec::new();
    let mut seen = Vec::new();
    let (mut lo, mut hi) = (0usize, family.ladder.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let e = eval(family.at(family.ladder[mid]))?;
        seen.push(mid);
        let ok = e.run.wait_p95_s <= target_p95_s;
        evals.push(e);
        if ok {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if floor && !family.ladder.is_empty() && !seen.contains(&0) {
        evals.push(eval(family.at(family.ladder[0]))?);
    }
    Ok(evals)
}

/// The cheapest run meeting the target; if none does, the one with the lowest p95 wait.
fn cheapest(runs: &[PlacedEval], target_p95_s: f64) -> Option<&PlacedEval> {
    runs.iter()
        .filter(|e| e.run.wait_p95_s <= target_p95_s)
        .min_by(|a, b| a.run.cost_usd.total_cmp(&b.run.cost_usd))
        .or_else(|| {
            runs.iter()
                .min_by(|a, b| a.run.wait_p95_s.total_cmp(&b.run.wait_p95_s))
        })
}

/// Jobs of a trace waiting longer than `target_s`.
fn late(waits: &[f64], target_s: f64) -> usize {
    waits.iter().filter(|&&w| w > target_s).count()
}

/// Most jobs of `n` that may wait longer than the target with the (nearest-rank) p95 still
/// within it.
fn late_allowed(n: usize) -> usize {
    n.saturating_sub((0.95 * n as f64).ceil() as usize)
}

/// The cheapest choice of one run per independent runner whose jobs, together, meet the p95
/// target: each runner's runs pruned to those no cheaper run waits as little as, then every
/// combination tried. `None` when no combination meets it.
fn combine(parts: &[Vec<PlacedEval>], total_jobs: usize, target_s: f64) -> Option<Vec<usize>> {
    let allowed = late_allowed(total_jobs);
    let fronts: Vec<Vec<(usize, f64, usize)>> = parts
        .iter()
        .map(|runs| {
            let mut c: Vec<(usize, f64, usize)> = runs
                .iter()
                .enumerate()
                .map(|(i, e)| (i, e.run.cost_usd, late(&e.run.waits_s, target_s)))
                .collect();
            c.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
            let mut front: Vec<(usize, f64, usize)> = Vec::new();
            for x in c {
                if front.last().is_none_or(|l| x.2 < l.2) {
                    front.push(x);
                }
            }
            front
        })
        .collect();
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut pick = vec![0usize; fronts.len()];
    fn walk(
        fronts: &[Vec<(usize, f64, usize)>],
        k: usize,
        cost: f64,
        late: usize,
        allowed: usize,
        pick: &mut Vec<usize>,
        best: &mut Option<(f64, Vec<usize>)>,
    ) {
        if late > allowed || best.as_ref().is_some_and(|b| cost >= b.0) {
            return;
        }
        if k == fronts.len() {
            *best = Some((cost, pick.clone()));
            return;
        }
        for &(i, c, l) in &fronts[k] {
            pick[k] = i;
            walk(fronts, k + 1, cost + c, late + l, allowed, pick, best);
        }
    }
    walk(&fronts, 0, 0.0, 0, allowed, &mut pick, &mut best);
    best.map(|b| b.1)
}

/// How a way ran: its cost, waits and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WayReport {
    /// `gitlab_one_shape`, `gitlab_tagged` or `slipway`.
    pub name: String,
    /// Runners (one for one shape and Slipway, one per size for tagged): their shapes and the
    /// jobs each ran.
    pub runners: Vec<RunnerReport>,
    /// Cost in USD over every runner.
    pub cost_usd: f64,
    /// Instance-seconds over every runner.
    pub instance_seconds: f64,
    /// Instances created.
    pub instances: u64,
    /// Wait percentiles over every job (p50, p95, p99).
    pub wait_p50_s: f64,
    /// 95th percentile wait.
    pub wait_p95_s: f64,
    /// 99th percentile wait.
    pub wait_p99_s: f64,
    /// p95 wait per job size of [`MIXED_SIZES`] (0 for a size with no jobs).
    pub wait_p95_by_size_s: Vec<f64>,
    /// Whether the p95 target was met.
    pub met_target: bool,
    /// Simulations run for its sweep.
    pub simulations: usize,
    /// Per job in trace order: wait in seconds.
    pub waits_s: Vec<f64>,
}

/// One runner of a way.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerReport {
    /// Its shapes.
    pub shapes: Vec<ShapeSpec>,
    /// Jobs it ran.
    pub jobs: usize,
    /// The settings chosen.
    pub settings: Settings,
    /// Its cost in USD.
    pub cost_usd: f64,
    /// Its p95 wait over its own jobs.
    pub wait_p95_s: f64,
}

/// The whole comparison on one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct MixedReport {
    /// Trace name.
    pub trace: String,
    /// Jobs.
    pub jobs: usize,
    /// Jobs per size of [`MIXED_SIZES`].
    pub jobs_by_size: Vec<usize>,
    /// The p95 wait target.
    pub target_p95_s: f64,
    /// GitLab, one runner with one shape fitting the largest job.
    pub gitlab_one_shape: WayReport,
    /// GitLab, one tagged runner per size.
    pub gitlab_tagged: WayReport,
    /// Slipway, one runner with shapes and packing.
    pub slipway: WayReport,
    /// The lower bound: every job-second at the cheapest exact-fit share of [`PRICE_LIST`].
    pub oracle_usd: f64,
    /// Simulations run in all.
    pub simulations: usize,
}

impl MixedReport {
    /// The cheaper of the two GitLab ways.
    pub fn better_gitlab(&self) -> &WayReport {
        if self.gitlab_tagged.cost_usd <= self.gitlab_one_shape.cost_usd {
            &self.gitlab_tagged
        } else {
            &self.gitlab_one_shape
        }
    }

    /// Slipway's cost over the better GitLab way's.
    pub fn slipway_vs_better_gitlab(&self) -> f64 {
        self.slipway.cost_usd / self.better_gitlab().cost_usd
    }

    /// Whether the goal holds: Slipway at least 25 % cheaper than the better GitLab
    /// way with an equal or lower p95 wait.
    pub fn goal_met(&self) -> bool {
        let g = self.better_gitlab();
        self.slipway_vs_better_gitlab() <= 0.75
            && self.slipway.met_target
            && self.slipway.wait_p95_s <= g.wait_p95_s.max(self.target_p95_s)
    }

    /// A plain-text table for the CLI.
    pub fn table(&self) -> String {
        let mut s = format!(
            "trace {}: {} jobs ({} of 1 CPU/2 GiB, {} of 4 CPU/8 GiB, {} of 16 CPU/64 GiB), \
             p95 wait target {} s, {} simulations\n",
            self.trace,
            self.jobs,
            self.jobs_by_size.first().copied().unwrap_or(0),
            self.jobs_by_size.get(1).copied().unwrap_or(0),
            self.jobs_by_size.get(2).copied().unwrap_or(0),
            self.target_p95_s,
            self.simulations
        );
        s.push_str(&format!("prices: {PRICE_SOURCE}\n"));
        s.push_str(&format!(
            "{:<17} {:>9} {:>12} {:>7} {:>7} {:>7} {:>17} {:>6}\n",
            "way", "USD", "instance-s", "p50 s", "p95 s", "p99 s", "p95 by size s", "target"
        ));
        for w in [&self.gitlab_one_shape, &self.gitlab_tagged, &self.slipway] {
            let by: Vec<String> = w
                .wait_p95_by_size_s
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect();
            s.push_str(&format!(
                "{:<17} {:>9.2} {:>12.0} {:>7.1} {:>7.1} {:>7.1} {:>17} {:>6}\n",
                w.name,
                w.cost_usd,
                w.instance_seconds,
                w.wait_p50_s,
                w.wait_p95_s,
                w.wait_p99_s,
                by.join("/"),
                if w.met_target { "met" } else { "MISSED" }
            ));
        }
        s.push_str(&format!(
            "{:<17} {:>9.2} {:>12} {:>7.1} {:>7.1} {:>7.1} {:>17} {:>6}\n",
            "oracle", self.oracle_usd, "-", 0.0, 0.0, 0.0, "0/0/0", "met"
        ));
        s.push_str(&format!(
            "slipway/{} cost {:.3} (goal <= 0.75 at equal or lower p95: {}), slipway/oracle {:.3}\n",
            self.better_gitlab().name,
            self.slipway_vs_better_gitlab(),
            if self.goal_met() { "met" } else { "not met" },
            self.slipway.cost_usd / self.oracle_usd
        ));
        for w in [&self.gitlab_one_shape, &self.gitlab_tagged, &self.slipway] {
            for r in &w.runners {
                let shapes: Vec<String> = r.shapes.iter().map(ShapeSpec::describe).collect();
                s.push_str(&format!(
                    "{} [{}] {} jobs, ${:.2}, p95 {:.1} s: {}\n",
                    w.name,
                    shapes.join(", "),
                    r.jobs,
                    r.cost_usd,
                    r.wait_p95_s,
                    r.settings.describe()
                ));
            }
        }
        s
    }

    /// The figures as JSON (`bench/results/sim.json`'s `mixed`).
    pub fn to_json(&self) -> Value {
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        let way = |w: &WayReport| {
            let runners: Vec<Value> = w
                .runners
                .iter()
                .map(|r| {
                    let fields: serde_json::Map<String, Value> = r
                        .settings
                        .fields()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), Value::String(v)))
                        .collect();
                    json!({
                        "shapes": r.shapes.iter().map(ShapeSpec::describe).collect::<Vec<_>>(),
                        "jobs": r.jobs,
                        "cost_usd": r2(r.cost_usd),
                        "wait_p95_s": r2(r.wait_p95_s),
                        "settings": fields,
                    })
                })
                .collect();
            json!({
                "cost_usd": r2(w.cost_usd),
                "instance_seconds": w.instance_seconds.round(),
                "instances_created": w.instances,
                "wait_p50_s": r2(w.wait_p50_s),
                "wait_p95_s": r2(w.wait_p95_s),
                "wait_p99_s": r2(w.wait_p99_s),
                "wait_p95_by_size_s": w.wait_p95_by_size_s.iter().map(|x| r2(*x)).collect::<Vec<_>>(),
                "met_target": w.met_target,
                "simulations": w.simulations,
                "runners": runners,
            })
        };
        let prices: Vec<Value> = PRICE_LIST
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "cpu": t.cpu,
                    "memory_gib": t.memory_gib,
                    "usd_per_hour": t.usd_per_hour,
                })
            })
            .collect();
        let better = self.better_gitlab();
        json!({
            "jobs": self.jobs,
            "jobs_by_size": self.jobs_by_size,
            "sizes": MIXED_SIZES.iter().map(|(share, cpu, mem)| json!({
                "share": share, "cpu": cpu, "memory_mib": mem, "gpu": 0,
            })).collect::<Vec<_>>(),
            "target_wait_p95_s": self.target_p95_s,
            "prices": { "source": PRICE_SOURCE, "instance_types": prices },
            "gitlab_one_shape_cost": r2(self.gitlab_one_shape.cost_usd),
            "gitlab_tagged_cost": r2(self.gitlab_tagged.cost_usd),
            "slipway_cost": r2(self.slipway.cost_usd),
            "oracle_cost": r2(self.oracle_usd),
            "gitlab_one_shape_wait_p95_s": r2(self.gitlab_one_shape.wait_p95_s),
            "gitlab_tagged_wait_p95_s": r2(self.gitlab_tagged.wait_p95_s),
            "slipway_wait_p95_s": r2(self.slipway.wait_p95_s),
            "oracle_wait_p95_s": 0.0,
            "cost_unit": "USD per simulated day",
            "better_gitlab": better.name,
            "slipway_vs_better_gitlab_cost": (self.slipway_vs_better_gitlab() * 1000.0).round() / 1000.0,
            "slipway_vs_oracle_cost": (self.slipway.cost_usd / self.oracle_usd * 1000.0).round() / 1000.0,
            "goal": "slipway_cost <= 0.75 × the better GitLab way's, at an equal or lower p95 wait",
            "goal_met": self.goal_met(),
            "gitlab_one_shape": way(&self.gitlab_one_shape),
            "gitlab_tagged": way(&self.gitlab_tagged),
            "slipway": way(&self.slipway),
            "oracle_settings": {
                "kind": "every job-second at the cheapest exact-fit share of any listed instance type (no boot, no idle, no packing loss): a lower bound",
            },
            "simulations": self.simulations,
        })
    }
}

/// The lower bound: every job-second priced at the cheapest fraction of a listed instance type
/// that holds the job exactly. No run can pay less: each job holds at least that share of an
/// instance for its duration, and instances are billed from request to deletion besides.
pub fn oracle_usd(trace: &Trace) -> f64 {
    trace
        .jobs
        .iter()
        .map(|j| {
            let r = request(j);
            let per_hour = PRICE_LIST
                .iter()
                .filter_map(|t| t.exact_share_usd_per_hour(&r))
                .fold(f64::INFINITY, f64::min);
            if per_hour.is_finite() {
                per_hour * j.duration_s / 3600.0
            } else {
                0.0
            }
        })
        .sum()
}

/// Which runners and shapes each way uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Ways {
    /// GitLab's one runner: a single shape that fits the largest job, one job per instance.
    pub one_shape: ShapeSpec,
    /// GitLab's tagged runners, smallest first: a job goes to the first whose shape holds it.
    pub tagged: Vec<ShapeSpec>,
    /// Slipway's runner's shapes, in config order (the order breaks cost ties).
    pub slipway: Vec<ShapeSpec>,
}

impl Ways {
    /// These ways with the instance types named in `prices` (type name → price per hour)
    /// priced as given: what config.toml's `price_per_hour` says of them.
    pub fn with_prices(mut self, prices: &std::collections::HashMap<String, f64>) -> Ways {
        let reprice = |s: &mut ShapeSpec| {
            if let Some(p) = prices.get(s.instance.name) {
                s.instance.usd_per_hour = *p;
            }
        };
        reprice(&mut self.one_shape);
        self.tagged.iter_mut().for_each(reprice);
        self.slipway.iter_mut().for_each(reprice);
        self
    }
}

fn shape(name: &str, capacity: u32) -> ShapeSpec {
    // Names from PRICE_LIST itself; a typo is a bug caught by the tests, not bad input.
    ShapeSpec::of(name, capacity).unwrap_or(ShapeSpec {
        instance: PRICE_LIST[0],
        capacity,
    })
}

impl Default for Ways {
    /// The shapes for [`MIXED_SIZES`]: GitLab's one shape is m7i.4xlarge (16 CPU / 64 GiB) with
    /// one job each; its tagged runners fit each size exactly (c7i.large split in two for
    /// 1 CPU / 2 GiB, c7i.xlarge for 4 CPU / 8 GiB, m7i.4xlarge for 16 CPU / 64 GiB). Slipway's
    /// runner has the small exact fit, a 16-CPU compute instance in 1 CPU / 2 GiB slots that
    /// packs small and medium jobs, and the 16 CPU / 64 GiB instance for the large ones (whose
    /// slots smaller jobs may fill).
    fn default() -> Self {
        Ways {
            one_shape: shape("m7i.4xlarge", 1),
            tagged: vec![
                shape("c7i.large", 2),
                shape("c7i.xlarge", 1),
                shape("m7i.4xlarge", 1),
            ],
            slipway: vec![
                shape("c7i.large", 2),
                shape("c7i.4xlarge", 16),
                shape("m7i.4xlarge", 16),
            ],
        }
    }
}

/// How to run the comparison: the simulator's options (the fleet's prices are replaced by each
/// shape's) and the runners and shapes of each way.
#[derive(Debug, Clone, Default)]
pub struct MixedOptions {
    /// Target p95 wait, sweeping, threads and the simulated cloud.
    pub sim: SimOptions,
    /// Runners and shapes.
    pub ways: Ways,
}

/// GitLab's grid for its one-shape runner: the catch-all policy with every idle time and the
/// small scale factors of [`baseline_families`]. A slice, to keep the bench within minutes:
/// this way pays several times the others (one 16-CPU instance per job), so its finer
/// settings cannot change which way is cheaper.
pub fn one_shape_families() -> Vec<Family> {
    baseline_families()
        .into_iter()
        .filter(|f| {
            let b = &f.base;
            b.business_idle_count.is_none()
                && b.scale_factor_limit == 0
                && [0.0, 0.1, 0.25].contains(&b.scale_factor)
        })
        .collect()
}

fn sub_trace(trace: &Trace, keep: &[usize]) -> Trace {
    Trace {
        name: trace.name.clone(),
        jobs: keep.iter().map(|&i| trace.jobs[i]).collect(),
        horizon_s: trace.horizon_s,
        start: trace.start,
    }
}

/// Settings used without a sweep.
pub fn default_mixed_settings(kind: Kind) -> Settings {
    crate::default_settings(kind)
}

fn way_report(
    name: &str,
    trace: &Trace,
    runners: Vec<RunnerReport>,
    runs: &[&PlacedRun],
    jobs_of: &[Vec<usize>],
    target: f64,
    simulations: usize,
) -> WayReport {
    let mut waits = vec![0.0; trace.jobs.len()];
    for (run, jobs) in runs.iter().zip(jobs_of) {
        for (w, &j) in run.waits_s.iter().zip(jobs) {
            waits[j] = *w;
        }
    }
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    let by_size = (0..MIXED_SIZES.len())
        .map(|k| {
            let mut v: Vec<f64> = trace
                .jobs
                .iter()
                .zip(&waits)
                .filter(|(j, _)| size_class(j) == Some(k))
                .map(|(_, w)| *w)
                .collect();
            v.sort_by(f64::total_cmp);
            percentile(&v, 95.0)
        })
        .collect();
    let p95 = percentile(&sorted, 95.0);
    WayReport {
        name: name.into(),
        runners,
        cost_usd: runs.iter().map(|r| r.cost_usd).sum(),
        instance_seconds: runs.iter().map(|r| r.instance_seconds).sum(),
        instances: runs.iter().map(|r| r.instances).sum(),
        wait_p50_s: percentile(&sorted, 50.0),
        wait_p95_s: p95,
        wait_p99_s: percentile(&sorted, 99.0),
        wait_p95_by_size_s: by_size,
        met_target: p95 <= target,
        simulations,
        waits_s: waits,
    }
}

/// Settings each way chose, to run them again on another trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    /// GitLab one shape's settings.
    pub one_shape: Settings,
    /// Each tagged runner's settings.
    pub tagged: Vec<Settings>,
    /// Slipway's settings.
    pub slipway: Settings,
}

impl MixedReport {
    /// The settings each way chose.
    pub fn chosen(&self) -> Chosen {
        Chosen {
            one_shape: self.gitlab_one_shape.runners[0].settings.clone(),
            tagged: self
                .gitlab_tagged
                .runners
                .iter()
                .map(|r| r.settings.clone())
                .collect(),
            slipway: self.slipway.runners[0].settings.clone(),
        }
    }
}

/// Jobs of `trace` per tagged runner: each job goes to the first runner whose shape holds it.
fn split_by_tag(trace: &Trace, tagged: &[ShapeSpec]) -> Result<Vec<Vec<usize>>, SimError> {
    let mut out = vec![Vec::new(); tagged.len()];
    for (i, j) in trace.jobs.iter().enumerate() {
        let k = tagged.iter().position(|s| s.holds(j)).ok_or_else(|| {
            SimError::Job(format!(
                "job {i} asks for {} which no tagged runner's shape holds",
                request(j)
            ))
        })?;
        out[k].push(i);
    }
    Ok(out)
}

/// Compare the three ways on `trace`: swept (`opts.sim.sweep`) or at default settings.
pub fn compare_mixed(
    trace: &Trace,
    seed: u64,
    opts: &MixedOptions,
) -> Result<MixedReport, SimError> {
    let target = opts.sim.target_p95_s;
    let ways = &opts.ways;
    let all: Vec<usize> = (0..trace.jobs.len()).collect();
    let one_shape_holds = trace.jobs.iter().all(|j| ways.one_shape.holds(j));
    if !one_shape_holds {
        return Err(SimError::Job(format!(
            "a job is larger than GitLab's one shape {}",
            ways.one_shape.describe()
        )));
    }
    let (one_fams, gitlab_fams, slipway_fams) = if opts.sim.sweep {
        (
            one_shape_families(),
            baseline_families(),
            slipway_families(),
        )
    } else {
        let gitlab = vec![Family {
            base: default_mixed_settings(Kind::Baseline),
            // `Family::at` puts the ladder value where the primary knob is: here the
            // business-hours idle count.
            ladder: vec![{
                let d = default_mixed_settings(Kind::Baseline);
                f64::from(d.business_idle_count.unwrap_or(d.idle_count))
            }],
        }];
        (
            gitlab.clone(),
            gitlab,
            vec![Family {
                base: default_mixed_settings(Kind::Slipway),
                ladder: vec![
                    default_mixed_settings(Kind::Slipway)
                        .forecast
                        .map_or(1.0, |f| f.factor),
                ],
            }],
        )
    };
    let mut simulations = 0;
    let runner = |shapes: Vec<ShapeSpec>, jobs: usize, e: &PlacedEval| RunnerReport {
        shapes,
        jobs,
        settings: e.settings.clone(),
        cost_usd: e.run.cost_usd,
        wait_p95_s: e.run.wait_p95_s,
    };
    let none = || SimError::Job("empty sweep".into());

    // GitLab, one shape.
    let one = [ways.one_shape];
    let runs = sweep_placed(trace, &one, &one_fams, opts, seed, false)?;
    simulations += runs.len();
    let best = cheapest(&runs, target).ok_or_else(none)?;
    let gitlab_one_shape = way_report(
        "gitlab_one_shape",
        trace,
        vec![runner(one.to_vec(), trace.jobs.len(), best)],
        &[&best.run],
        std::slice::from_ref(&all),
        target,
        runs.len(),
    );

    // GitLab, tagged: each runner swept alone, then the cheapest combination.
    let split = split_by_tag(trace, &ways.tagged)?;
    let mut parts = Vec::with_capacity(ways.tagged.len());
    for (s, jobs) in ways.tagged.iter().zip(&split) {
        let sub = sub_trace(trace, jobs);
        let runs = sweep_placed(&sub, &[*s], &gitlab_fams, opts, seed, true)?;
        parts.push(runs);
    }
    let tagged_sims: usize = parts.iter().map(Vec::len).sum();
    simulations += tagged_sims;
    let pick = match combine(&parts, trace.jobs.len(), target) {
        Some(p) => p,
        // Nothing meets the target together: each runner's own best.
        None => parts
            .iter()
            .map(|runs| {
                cheapest(runs, target)
                    .and_then(|b| runs.iter().position(|r| std::ptr::eq(r, b)))
                    .unwrap_or(0)
            })
            .collect(),
    };
    let chosen: Vec<&PlacedEval> = parts
        .iter()
        .zip(&pick)
        .filter_map(|(runs, &i)| runs.get(i))
        .collect();
    if chosen.len() != parts.len() {
        return Err(none());
    }
    let gitlab_tagged = way_report(
        "gitlab_tagged",
        trace,
        chosen
            .iter()
            .zip(&ways.tagged)
            .zip(&split)
            .map(|((e, s), jobs)| runner(vec![*s], jobs.len(), e))
            .collect(),
        &chosen.iter().map(|e| &e.run).collect::<Vec<_>>(),
        &split,
        target,
        tagged_sims,
    );

    // Slipway: one runner with shapes.
    let runs = sweep_placed(trace, &ways.slipway, &slipway_fams, opts, seed, false)?;
    simulations += runs.len();
    let best = cheapest(&runs, target).ok_or_else(none)?;
    let slipway = way_report(
        "slipway",
        trace,
        vec![runner(ways.slipway.clone(), trace.jobs.len(), best)],
        &[&best.run],
        std::slice::from_ref(&all),
        target,
        runs.len(),
    );

    let jobs_by_size = (0..MIXED_SIZES.len())
        .map(|k| {
            trace
                .jobs
                .iter()
                .filter(|j| size_class(j) == Some(k))
                .count()
        })
        .collect();
    Ok(MixedReport {
        trace: trace.name.clone(),
        jobs: trace.jobs.len(),
        jobs_by_size,
        target_p95_s: target,
        gitlab_one_shape,
        gitlab_tagged,
        slipway,
        oracle_usd: oracle_usd(trace),
        simulations,
    })
}

/// Each way's chosen settings run once on `trace` (a holdout: a trace the sweep did not see).
pub fn rerun(
    trace: &Trace,
    seed: u64,
    opts: &MixedOptions,
    chosen: &Chosen,
) -> Result<(WayReport, WayReport, WayReport), SimError> {
    let target = opts.sim.target_p95_s;
    let fleet = &opts.sim.fleet;
    let ways = &opts.ways;
    let all: Vec<usize> = (0..trace.jobs.len()).collect();
    let one = run_placed(trace, fleet, &[ways.one_shape], &chosen.one_shape, seed)?;
    let split = split_by_tag(trace, &ways.tagged)?;
    let mut tagged = Vec::new();
    for ((s, jobs), set) in ways.tagged.iter().zip(&split).zip(&chosen.tagged) {
        tagged.push(run_placed(
            &sub_trace(trace, jobs),
            fleet,
            &[*s],
            set,
            seed,
        )?);
    }
    let slip = run_placed(trace, fleet, &ways.slipway, &chosen.slipway, seed)?;
    let rr = |shapes: Vec<ShapeSpec>, jobs: usize, s: &Settings, r: &PlacedRun| RunnerReport {
        shapes,
        jobs,
        settings: s.clone(),
        cost_usd: r.cost_usd,
        wait_p95_s: r.wait_p95_s,
    };
    Ok((
        way_report(
            "gitlab_one_shape",
            trace,
            vec![rr(vec![ways.one_shape], all.len(), &chosen.one_shape, &one)],
            &[&one],
            std::slice::from_ref(&all),
            target,
            1,
        ),
        way_report(
            "gitlab_tagged",
            trace,
            tagged
                .iter()
                .zip(&ways.tagged)
                .zip(&split)
                .zip(&chosen.tagged)
                .map(|(((r, s), jobs), set)| rr(vec![*s], jobs.len(), set, r))
                .collect(),
            &tagged.iter().collect::<Vec<_>>(),
            &split,
            target,
            tagged.len(),
        ),
        way_report(
            "slipway",
            trace,
            vec![rr(ways.slipway.clone(), all.len(), &chosen.slipway, &slip)],
            &[&slip],
            std::slice::from_ref(&all),
            target,
            1,
        ),
    ))
}
