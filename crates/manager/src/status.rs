//! The manager's live status: `/api/v1/status` and the status page are built here from the
//! runners' taskscalers and job boards, and a sampler keeps the last hours in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use slipway_fleeting::State;
use slipway_status::history::p95;
use slipway_status::model::{
    InstanceStatus, NoCapacity, PendingJob, QueueStatus, RunnerStatus, ShapeStatus, SlotJob,
    SlotStatus, SnapshotStatus, Totals,
};
use slipway_status::{FleetStatus, History, Sample};
use slipway_taskscaler::store::unix_ms;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::runner::Runner;

/// How often the embedded queue's pending jobs are listed.
const QUEUE_POLL: Duration = Duration::from_secs(2);
/// Queued jobs shown by name.
const QUEUE_SHOWN: usize = 100;
/// Longest time between listings of the nesting daemons' snapshots.
const SNAPSHOT_POLL: Duration = Duration::from_secs(30);
/// Shortest time between them (however quick the history).
const SNAPSHOT_POLL_MIN: Duration = Duration::from_secs(5);
/// Instances whose snapshots are listed at once.
const SNAPSHOT_LISTINGS: usize = 8;
/// Longest one instance's snapshot listing may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

/// A snapshot as listed, with when it was taken (unix s).
#[derive(Debug, Clone)]
struct HeldSnapshot {
    name: String,
    bytes: u64,
    created_s: i64,
}

/// The status of every runner of a manager, and its history.
#[derive(Debug)]
pub struct StatusService {
    runners: Vec<Arc<Runner>>,
    started: Instant,
    history: Mutex<History>,
    /// Snapshots by instance id, from the last listing.
    snapshots: Mutex<HashMap<String, Vec<HeldSnapshot>>>,
    /// The embedded queue `slipway run` consumes, if any.
    queue: Option<crate::source::queue::spool::Queue>,
    /// Its pending jobs as last listed.
    queued: Mutex<Option<(usize, Vec<crate::source::queue::spool::Waiting>)>>,
}

impl StatusService {
    /// Status over `runners`, keeping `span` of history sampled every `interval`.
    pub fn new(runners: Vec<Arc<Runner>>, interval: Duration, span: Duration) -> StatusService {
        StatusService {
            runners,
            started: Instant::now(),
            history: Mutex::new(History::new(interval, span)),
            snapshots: Mutex::new(HashMap::new()),
            queue: None,
            queued: Mutex::new(None),
        }
    }

    /// Also show the pending jobs of the embedded queue the manager consumes.
    pub fn with_queue(mut self, queue: crate::source::queue::spool::Queue) -> StatusService {
        self.queue = Some(queue);
        self
    }

    fn queued(&self) -> MutexGuard<'_, Option<(usize, Vec<crate::source::queue::spool::Waiting>)>> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// List the queue's pending jobs again (file reads, off the runtime's threads).
    pub async fn poll_queue(&self) {
        let Some(q) = self.queue.clone() else {
            return;
        };
        match tokio::task::spawn_blocking(move || q.waiting(QUEUE_SHOWN)).await {
            Ok(Ok(w)) => *self.queued() = Some(w),
            Ok(Err(e)) => tracing::warn!("listing the queue for the status page: {e}"),
            Err(e) => tracing::warn!("listing the queue for the status page: {e}"),
        }
    }

    /// The queue's pending jobs but those a runner already holds: the listing is up to
    /// [`QUEUE_POLL`] old, and a job claimed since is shown by its runner.
    fn queue_status(&self) -> Option<QueueStatus> {
        self.queue.as_ref()?;
        let now = SystemTime::now();
        let held: std::collections::HashSet<String> =
            self.runners.iter().flat_map(|r| r.board.keys()).collect();
        let queued = self.queued();
        let (n, jobs) = queued
            .as_ref()
            .map_or((0, &[][..]), |(n, j)| (*n, j.as_slice()));
        let jobs: Vec<_> = jobs
            .iter()
            .filter(|w| !held.contains(&crate::source::queue::key_of(w.id)))
            .collect();
        let hidden = queued.as_ref().map_or(0, |(_, j)| j.len()) - jobs.len();
        Some(QueueStatus {
            pending: u32::try_from(n.saturating_sub(hidden)).unwrap_or(u32::MAX),
            jobs: jobs
                .into_iter()
                .map(|w| PendingJob {
                    id: w.id,
                    name: w.name.clone(),
                    stage: w.stage.clone(),
                    level: String::new(),
                    wait_s: now
                        .duration_since(w.queued_at)
                        .unwrap_or_default()
                        .as_secs_f64(),
                })
                .collect(),
        })
    }

    fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fleet now.
    pub fn collect(&self) -> FleetStatus {
        let snapshots = self
            .snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let now_ms = unix_ms(SystemTime::now());
        let now_s = now_ms / 1000;
        FleetStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            generated_at_ms: now_ms,
            uptime_s: self.started.elapsed().as_secs_f64(),
            queue: self.queue_status(),
            runners: self
                .runners
                .iter()
                .map(|r| runner_status(Source::of(r), &snapshots, now_s))
                .collect(),
            history: self.history().series(),
        }
    }

    /// Add one history sample of the fleet now.
    pub fn sample(&self) {
        let mut s = Sample {
            t_ms: unix_ms(SystemTime::now()),
            ..Sample::default()
        };
        let mut waits = Vec::new();
        for r in &self.runners {
            // The taskscalers' running totals: no copy of the fleet.
            let stats = r.stats();
            s.instances += u32::try_from(stats.instances).unwrap_or(u32::MAX);
            s.busy_slots += u32::try_from(stats.acquired).unwrap_or(u32::MAX);
            s.queue_depth += r.board.pending_count() as u32;
            waits.extend(r.board.take_waits());
        }
        if let Some(q) = self.queue_status() {
            s.queue_depth += q.pending;
            // Jobs still in the queue have waited too (the oldest of them are listed).
            waits.extend(q.jobs.iter().map(|j| j.wait_s));
        }
        s.p95_wait_s = p95(&mut waits);
        self.history().push(s);
    }

    /// List the snapshots of every ready instance of runners with VM isolation, a few
    /// instances at a time, each within [`SNAPSHOT_TIMEOUT`].
    pub async fn poll_snapshots(&self) {
        let limit = Arc::new(tokio::sync::Semaphore::new(SNAPSHOT_LISTINGS));
        let mut listings = tokio::task::JoinSet::new();
        for r in self
            .runners
            .iter()
            .filter(|r| r.nesting.is_some() && !r.local)
        {
            for shape in r.placement.shapes() {
                for i in shape.scaler.instances() {
                    let Some(info) = i.connect_info.clone().filter(|_| i.ready) else {
                        continue;
                    };
                    let (r, limit) = (r.clone(), limit.clone());
                    listings.spawn(async move {
                        let _permit = limit.acquire_owned().await;
                        let listed =
                            tokio::time::timeout(SNAPSHOT_TIMEOUT, r.nesting_snapshots(&i.id, &info))
                                .await;
                        match listed {
                            Ok(Ok(list)) => Some((
                                i.id,
                                list.into_iter()
                                    .map(|s| HeldSnapshot {
                                        name: s.name,
                                        bytes: s.memory_bytes.saturating_add(s.disk_bytes),
                                        created_s: s.created,
                                    })
                                    .collect::<Vec<_>>(),
                            )),
                            Ok(Err(e)) => {
                                tracing::debug!(runner = %r.name, instance = %i.id, "listing snapshots: {}", crate::chain::Chain(&e));
                                None
                            }
                            Err(_) => {
                                tracing::debug!(runner = %r.name, instance = %i.id, "listing snapshots timed out");
                                None
                            }
                        }
                    });
                }
            }
        }
        let mut found: HashMap<String, Vec<HeldSnapshot>> = HashMap::new();
        while let Some(done) = listings.join_next().await {
            if let Ok(Some((id, held))) = done {
                found.insert(id, held);
            }
        }
        *self.snapshots.lock().unwrap_or_else(|p| p.into_inner()) = found;
    }

    /// Until `stop`: sample the history every interval and list the queue every 2 s, and,
    /// apart so a slow instance never delays a sample, list snapshots at the history
    /// interval (between 5 and 30 s). The caller owns the task.
    pub fn spawn(self: Arc<Self>, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let interval = self.history().interval();
            let sampling = async {
                let mut sample = tokio::time::interval(interval);
                let mut queue = tokio::time::interval(QUEUE_POLL);
                sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                queue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = sample.tick() => self.sample(),
                        _ = queue.tick() => self.poll_queue().await,
                    }
                }
            };
            let listing = async {
                let every = interval.clamp(SNAPSHOT_POLL_MIN, SNAPSHOT_POLL);
                let mut snapshots = tokio::time::interval(every);
                snapshots.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    snapshots.tick().await;
                    self.poll_snapshots().await;
                }
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                () = sampling => {}
                () = listing => {}
            }
        })
    }
}

/// What a runner's status is made from.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// Runner name.
    pub name: &'a str,
    /// Executor.
    pub executor: &'a str,
    /// Its shapes' taskscalers.
    pub placement: &'a slipway_taskscaler::Placement,
    /// Its jobs.
    pub board: &'a slipway_status::JobBoard,
    /// Its costs (runners on instances).
    pub costs: Option<&'a crate::costs::CostBook>,
}

impl<'a> Source<'a> {
    /// The parts of a started runner.
    pub fn of(r: &'a Runner) -> Source<'a> {
        Source {
            name: &r.name,
            executor: r.executor.as_str(),
            placement: &r.placement,
            board: &r.board,
            costs: r.costs.as_deref(),
        }
    }
}

/// One runner's status (snapshots are left out: they come from the manager's listing).
pub fn runner_status_of(r: Source<'_>) -> RunnerStatus {
    runner_status(r, &HashMap::new(), 0)
}

/// `spot`, `fallback` or empty, as the status shows a shape.
fn shape_role(p: &slipway_taskscaler::Placement, i: usize) -> &'static str {
    if p.is_spot(i) {
        "spot"
    } else if p.is_fallback(i) {
        "fallback"
    } else {
        ""
    }
}

/// Shape `i`'s provider refusing new instances for lack of capacity, if it does.
fn no_capacity(p: &slipway_taskscaler::Placement, i: usize) -> Option<NoCapacity> {
    let shape = p.shapes().get(i)?;
    let refusals = shape.scaler.capacity_refusals();
    let first = refusals.first?;
    let diverted_to = p
        .diverted_since(i)
        .and_then(|_| p.fallback_of(i))
        .and_then(|f| p.shapes().get(f.to))
        .map(|s| s.name.clone());
    Some(NoCapacity {
        since_s: first.elapsed().as_secs_f64(),
        refusals: refusals.count,
        diverted_to,
    })
}

fn runner_status(
    r: Source<'_>,
    snapshots: &HashMap<String, Vec<HeldSnapshot>>,
    now_s: i64,
) -> RunnerStatus {
    let running = r.board.running_jobs();
    let pending = r.board.pending();
    let mut totals = Totals {
        pending: pending.len() as u32,
        running: running.len() as u32,
        ..Totals::default()
    };
    let placement = r.placement;
    let shapes = placement
        .shapes()
        .iter()
        .enumerate()
        .map(|(index, shape)| {
            let cfg = shape.scaler.config();
            let instances = shape
                .scaler
                .instances()
                .into_iter()
                .map(|i| {
                    let held = i.slots.iter().filter(|s| s.is_some()).count() as u32;
                    let state = state_label(&i, held);
                    totals.instances += 1;
                    totals.busy_slots += held;
                    if state == "idle" || state == "busy" {
                        totals.ready += 1;
                        totals.idle_slots += i.slots.len() as u32 - held;
                    }
                    InstanceStatus {
                        state: state.to_string(),
                        age_s: i.age.as_secs_f64(),
                        uses: i.uses,
                        slots: slots_of(&i.slots, &running),
                        snapshots: snapshots
                            .get(&i.id)
                            .map(|list| snapshot_views(list, now_s))
                            .unwrap_or_default(),
                        id: i.id,
                    }
                })
                .collect();
            ShapeStatus {
                name: shape.name.clone(),
                group: shape.scaler.group_id().to_string(),
                capacity_per_instance: cfg.capacity_per_instance,
                max_instances: cfg.max_instances,
                max_use_count: cfg.max_use_count,
                role: shape_role(placement, index).to_string(),
                no_capacity: no_capacity(placement, index),
                instances,
            }
        })
        .collect();
    RunnerStatus {
        name: r.name.to_string(),
        executor: r.executor.to_string(),
        totals,
        shapes,
        pending,
        recent: r.board.recent(),
        vm_starts: r.board.vm_starts(),
        costs: r.costs.and_then(|c| c.status(std::time::Instant::now())),
    }
}

/// What the page calls an instance's state: the plugin's, refined by what the taskscaler knows.
fn state_label(i: &slipway_taskscaler::InstanceStatus, held: u32) -> &'static str {
    match i.state {
        State::Running if i.preempted && !i.removing => "preempted",
        State::Running if i.removing => "removing",
        State::Running if !i.ready => "booting",
        State::Running if held == 0 && !i.exclusive => "idle",
        State::Running => "busy",
        other => other.as_str(),
    }
}

fn slots_of(slots: &[Option<String>], running: &HashMap<String, SlotJob>) -> Vec<SlotStatus> {
    slots
        .iter()
        .enumerate()
        .map(|(n, holder)| SlotStatus {
            slot: n as u32,
            job: holder.as_ref().map(|key| {
                running.get(key).cloned().unwrap_or_else(|| SlotJob {
                    // Held by a key the board does not know (a job of the last run, say).
                    id: 0,
                    name: key.clone(),
                    ..SlotJob::default()
                })
            }),
        })
        .collect()
}

fn snapshot_views(list: &[HeldSnapshot], now_s: i64) -> Vec<SnapshotStatus> {
    let mut v: Vec<SnapshotStatus> = list
        .iter()
        .map(|s| SnapshotStatus {
            name: s.name.clone(),
            bytes: s.bytes,
            age_s: (now_s - s.created_s).max(0) as f64,
        })
        .collect();
    v.sort_by(|a, b| {
        a.age_s
            .total_cmp(&b.age_s)
            .then_with(|| a.name.cmp(&b.name))
    });
    v
}

/// Errors of [`fetch`].
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No connection.
    #[error("cannot connect: {0} (is `slipway run` running with this config?)")]
    Connect(std::io::Error),
    /// The exchange failed half-way.
    #[error("reading the answer: {0}")]
    Io(std::io::Error),
    /// The manager wants the status page's token.
    #[error("the manager wants a token: set [status_page] token in this config to the manager's")]
    Unauthorized,
    /// Anything but 200.
    #[error("the manager answered {0}")]
    Status(String),
    /// Not the JSON expected.
    #[error("unexpected answer: {0}")]
    Body(String),
}

/// Where a `listen_address` is reached from this machine: `:9252` and `0.0.0.0:9252` are
/// reached on loopback.
pub fn reachable(listen: &str) -> String {
    let (host, port) = listen.rsplit_once(':').unwrap_or((listen, "9252"));
    let host = match host.trim_matches(|c| c == '[' || c == ']') {
        "" | "0.0.0.0" => "127.0.0.1".to_string(),
        "::" => "[::1]".to_string(),
        h if h.contains(':') => format!("[{h}]"),
        h => h.to_string(),
    };
    format!("{host}:{port}")
}

/// `GET /api/v1/status` of the manager listening on `listen`: the status and its JSON text.
pub async fn fetch(listen: &str, token: Option<&str>) -> Result<(FleetStatus, String), FetchError> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = reachable(listen);
    let mut conn = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(&addr),
    )
    .await
    .map_err(|_| FetchError::Connect(std::io::ErrorKind::TimedOut.into()))?
    .map_err(FetchError::Connect)?;
    let mut req =
        format!("GET /api/v1/status HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    req.push_str("\r\n");
    let mut answer = Vec::new();
    let exchange = async {
        conn.write_all(req.as_bytes()).await?;
        conn.read_to_end(&mut answer).await
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| FetchError::Io(std::io::ErrorKind::TimedOut.into()))?
        .map_err(FetchError::Io)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| FetchError::Body("no HTTP header".into()))?;
    let status_line = head.lines().next().unwrap_or_default();
    let code = status_line.split_whitespace().nth(1).unwrap_or_default();
    match code {
        "200" => {}
        "401" => return Err(FetchError::Unauthorized),
        _ => return Err(FetchError::Status(status_line.to_string())),
    }
    let status: FleetStatus =
        serde_json::from_str(body).map_err(|e| FetchError::Body(e.to_string()))?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_are_reached_on_loopback() {
        assert_eq!(reachable(":9252"), "127.0.0.1:9252");
        assert_eq!(reachable("0.0.0.0:9252"), "127.0.0.1:9252");
        assert_eq!(reachable("[::]:9252"), "[::1]:9252");
        assert_eq!(reachable("localhost:80"), "localhost:80");
    }
}
