//! The manager's status endpoint at fleet scale: `GET /api/v1/status` for 1,000 instances
//! (4,000 slots, 2,500 busy, 200 jobs waiting, 50 recent, 6 h of history) through the real HTTP
//! server over one keep-alive connection, next to a 10-instance fleet, `/metrics` of the same
//! fleet, the status page (`/`), and building + encoding the status in-process.
//!
//! Writes `bench/results/status.json`. Run with `cargo bench -p slipway --bench status`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use slipway_job::{FailureReason, JobOutcome};
use slipway_manager::server::{Server, StatusRoutes};
use slipway_manager::status::{Source, runner_status_of};
use slipway_sim::fleet::{FleetSpec, SimFleet};
use slipway_sim::rng::Dist;
use slipway_status::{Ending, FleetStatus, History, JobBoard, JobInfo, JobMetrics, Sample};
use slipway_taskscaler::metrics::{MetricFamilies, Metrics};
use slipway_taskscaler::store::unix_ms;
use slipway_taskscaler::{Config, Options, Placement, Policy, Resources, ScaleThrottle, Shape};
use slipway_testkit::bench::{ms, percentile, round3 as round};

const COMMAND: &str = "cargo bench -p slipway --bench status";
/// Requests measured per endpoint, after [`WARMUP`] unmeasured ones.
const REQUESTS: usize = 200;
const WARMUP: usize = 20;
/// The goal of issue 17: `/api/v1/status` of 1,000 instances within this (p95).
const GOAL_MS: f64 = 50.0;
const CAPACITY: u32 = 4;
/// History as the manager keeps it by default: a sample every 15 s for 6 h.
const HISTORY_INTERVAL: Duration = Duration::from_secs(15);
const HISTORY_SPAN: Duration = Duration::from_secs(6 * 3600);
/// Jobs that ended (the board keeps the last 50).
const FINISHED: usize = 50;

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}

/// One runner's fleet: its taskscaler over an in-process group, its job board, its history
/// and metrics.
struct Fleet {
    placement: Arc<Placement>,
    board: Arc<JobBoard>,
    history: Arc<Mutex<History>>,
    families: Arc<MetricFamilies>,
    jobs: JobMetrics,
    started: Instant,
}

impl Fleet {
    /// The fleet's status now, as the manager's `StatusService::collect` builds it.
    fn collect(&self) -> FleetStatus {
        FleetStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            generated_at_ms: unix_ms(SystemTime::now()),
            uptime_s: self.started.elapsed().as_secs_f64(),
            runners: vec![runner_status_of(Source {
                name: "bench",
                executor: "docker-autoscaler",
                placement: &self.placement,
                board: &self.board,
                costs: None,
            })],
            history: self
                .history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .series(),
            // No embedded queue: a fleet fed by GitLab.
            ..FleetStatus::default()
        }
    }

    fn routes(self: &Arc<Self>) -> StatusRoutes {
        let me = self.clone();
        StatusRoutes {
            status: Arc::new(move || me.collect()),
            token: None,
        }
    }
}

fn job_info(n: usize) -> JobInfo {
    const STAGES: [&str; 4] = ["build", "test", "test", "deploy"];
    const LEVELS: [&str; 4] = ["docker", "docker", "microvm", "cgroup"];
    JobInfo {
        id: 1_000_000 + n as u64,
        name: format!("{}: [linux-amd64, shard {}/8]", STAGES[n % 4], n % 8 + 1),
        stage: STAGES[n % 4].to_string(),
        level: LEVELS[n % 4].to_string(),
    }
}

/// Start a fleet of `instances` instances with `running` jobs on slots, `waiting` jobs
/// reserved but not yet on a slot, [`FINISHED`] ended jobs and a full history; returns once
/// every instance is ready.
async fn start_fleet(instances: u32, running: usize, waiting: usize) -> anyhow::Result<Fleet> {
    let families = Arc::new(MetricFamilies::default());
    let jobs = JobMetrics::default();
    let group = Arc::new(SimFleet::new(
        FleetSpec {
            provisioning: Dist::Fixed(0.0),
            boot_failure: 0.0,
            deletion: Dist::Fixed(0.0),
            error_rate: 0.0,
            api_latency: Dist::Fixed(0.0),
            max_increase_per_call: None,
            max_size: 0,
            ..FleetSpec::default()
        },
        17,
    ));
    let provider = group.provider_info();
    let cfg = Config {
        capacity_per_instance: CAPACITY,
        max_instances: instances,
        policies: vec![Policy {
            idle_count: instances * CAPACITY,
            idle_time: Duration::from_secs(3600),
            ..Policy::default()
        }],
        scale_throttle: ScaleThrottle {
            limit: None,
            burst: instances,
        },
        update_interval: Duration::from_secs(5),
        update_interval_when_expecting: Duration::from_millis(20),
        ..Config::default()
    };
    let metrics = Metrics::new(
        families.clone(),
        vec![
            ("runner".into(), "bench".into()),
            ("shape".into(), "default".into()),
            ("group".into(), provider.id.clone()),
        ],
    );
    let scaler = slipway_taskscaler::Taskscaler::start_with(
        group,
        provider,
        cfg,
        Options {
            metrics: Some(metrics),
            ..Options::default()
        },
    )?;
    let placement = Arc::new(Placement::new(vec![Shape {
        name: "default".into(),
        scaler,
    }]));
    let fleet = Fleet {
        placement,
        board: Arc::new(JobBoard::new("bench", jobs.clone())),
        history: Arc::new(Mutex::new(History::new(HISTORY_INTERVAL, HISTORY_SPAN))),
        families,
        jobs,
        started: Instant::now(),
    };
    if let Err(e) = fill(&fleet, instances, running, waiting).await {
        fleet.placement.shutdown().await;
        return Err(e);
    }
    Ok(fleet)
}

async fn fill(fleet: &Fleet, instances: u32, running: usize, waiting: usize) -> anyhow::Result<()> {
    let scaler = &fleet.placement.shapes()[0].scaler;
    let t = Instant::now();
    loop {
        let list = scaler.instances();
        if list.len() == instances as usize && list.iter().all(|i| i.ready) {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "{} of {instances} instances ready after 120 s",
            list.iter().filter(|i| i.ready).count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{instances} instances ready in {:.0} ms", ms(t.elapsed()));

    let board = &fleet.board;
    let placement = &fleet.placement;
    let request = Resources::default();
    // Jobs that got a slot and ended, one after another; then jobs that keep running.
    for n in 0..FINISHED + running {
        let key = format!("job-{n}");
        board.waiting(&key, job_info(n), Vec::new());
        placement.reserve(&key, &request)?;
        let acq = placement.acquire(&key).await?;
        board.running(&key, &acq.instance_id, acq.slot);
        if n < FINISHED {
            let failed = n % 7 == 3;
            board.finished(
                &key,
                Ending::of(&if failed {
                    JobOutcome::failed(
                        FailureReason::ScriptFailure,
                        Some(1),
                        "exit status 1: cargo test --workspace",
                    )
                } else {
                    JobOutcome::Success
                }),
            );
            placement.release(&key);
        }
    }
    // Jobs that arrived and wait for their slot.
    for n in FINISHED + running..FINISHED + running + waiting {
        let key = format!("job-{n}");
        board.waiting(&key, job_info(n), Vec::new());
        placement.reserve(&key, &request)?;
    }

    // Six hours of samples, ending now.
    let now = unix_ms(SystemTime::now());
    let mut h = fleet.history.lock().unwrap_or_else(|p| p.into_inner());
    let cap = (HISTORY_SPAN.as_secs() / HISTORY_INTERVAL.as_secs()) as i64;
    for k in 0..cap {
        let phase = k as f64 / cap as f64 * std::f64::consts::TAU;
        h.push(Sample {
            t_ms: now - (cap - 1 - k) * HISTORY_INTERVAL.as_millis() as i64,
            instances: instances - (k % 3) as u32,
            busy_slots: ((running as f64) * (0.75 + 0.25 * phase.sin())) as u32,
            queue_depth: ((waiting as f64) * (0.5 + 0.5 * phase.cos())) as u32,
            p95_wait_s: 4.0 + 3.0 * phase.sin().abs(),
        });
    }
    Ok(())
}

/// One keep-alive HTTP/1.1 connection to the server.
struct Client {
    sender: SendRequest<Empty<Bytes>>,
    conn: tokio::task::JoinHandle<()>,
    /// Ask for gzip, as browsers do.
    gzip: bool,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> anyhow::Result<Client> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let conn = tokio::spawn(async move {
            if let Err(e) = conn.await {
                eprintln!("connection: {e}");
            }
        });
        Ok(Client {
            sender,
            conn,
            gzip: false,
        })
    }

    /// GET `path`, read the whole body; returns its length (as sent: gzipped when the client
    /// asked for gzip and the server gave it).
    async fn get(&mut self, path: &str) -> anyhow::Result<usize> {
        self.sender.ready().await?;
        let mut req = http::Request::get(path).header(http::header::HOST, "127.0.0.1");
        if self.gzip {
            req = req.header(http::header::ACCEPT_ENCODING, "gzip");
        }
        let req = req.body(Empty::<Bytes>::new())?;
        let res = self.sender.send_request(req).await?;
        anyhow::ensure!(res.status().is_success(), "GET {path}: {}", res.status());
        let body = res.into_body().collect().await?.to_bytes();
        Ok(body.len())
    }

    /// Warm up, then time [`REQUESTS`] GETs of `path`: sorted ms and the last body's size.
    async fn measure(&mut self, path: &str) -> anyhow::Result<(Vec<f64>, usize)> {
        for _ in 0..WARMUP {
            self.get(path).await?;
        }
        let mut times = Vec::with_capacity(REQUESTS);
        let mut bytes = 0;
        for _ in 0..REQUESTS {
            let t = Instant::now();
            bytes = self.get(path).await?;
            times.push(ms(t.elapsed()));
        }
        times.sort_by(f64::total_cmp);
        Ok((times, bytes))
    }

    fn close(self) {
        drop(self.sender);
        self.conn.abort();
    }
}

/// Sorted ms of `f` run [`REQUESTS`] times after [`WARMUP`] runs.
fn time_in_process<T>(mut f: impl FnMut() -> T) -> Vec<f64> {
    for _ in 0..WARMUP {
        std::hint::black_box(f());
    }
    let mut times: Vec<f64> = (0..REQUESTS)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            ms(t.elapsed())
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

struct Measured {
    api: (Vec<f64>, usize),
    page: (Vec<f64>, usize),
    metrics: (Vec<f64>, usize),
    small_api: (Vec<f64>, usize),
    api_gzip: (Vec<f64>, usize),
    page_gzip: (Vec<f64>, usize),
}

async fn bench() -> anyhow::Result<()> {
    let big = Arc::new(start_fleet(1000, 2500, 200).await?);
    let small = match start_fleet(10, 25, 2).await {
        Ok(f) => Arc::new(f),
        Err(e) => {
            big.placement.shutdown().await;
            return Err(e);
        }
    };
    let big_server = Server::start(
        "127.0.0.1:0",
        slipway_manager::server::registry(&big.families, &big.jobs),
        Some(big.routes()),
    )
    .await
    .map_err(anyhow::Error::from);
    let small_server = Server::start(
        "127.0.0.1:0",
        slipway_manager::server::registry(&small.families, &small.jobs),
        Some(small.routes()),
    )
    .await
    .map_err(anyhow::Error::from);
    let measured = match (&big_server, &small_server) {
        (Ok(b), Ok(s)) => measure_http(b.addr, s.addr).await,
        (Err(e), _) | (_, Err(e)) => Err(anyhow::anyhow!("starting a server: {e:#}")),
    };

    // In process, no HTTP: what the handler does.
    let status = big.collect();
    let runner = &status.runners[0];
    let slots: u32 = runner
        .shapes
        .iter()
        .flat_map(|s| &s.instances)
        .map(|i| i.slots.len() as u32)
        .sum();
    let totals = runner.totals;
    let pending = runner.pending.len();
    let recent = runner.recent.len();
    let history_samples = status.history.t_ms.len();
    let build_and_encode = time_in_process(|| serde_json::to_vec(&big.collect()).map(|v| v.len()));
    let build = time_in_process(|| big.collect());
    let encode = time_in_process(|| serde_json::to_vec(&status).map(|v| v.len()));
    let scaler_copy = time_in_process(|| big.placement.shapes()[0].scaler.instances());
    let render = time_in_process(|| slipway_status::page::render(&status, 2000).len());

    for server in [big_server, small_server].into_iter().flatten() {
        server.stop().await;
    }
    big.placement.shutdown().await;
    small.placement.shutdown().await;
    let m = measured?;

    let (api, api_bytes) = (&m.api.0, m.api.1);
    let api50 = percentile(api, 50.0);
    let api95 = percentile(api, 95.0);
    let small50 = percentile(&m.small_api.0, 50.0);
    let metrics50 = percentile(&m.metrics.0, 50.0);
    let results = serde_json::json!({
        "instances": totals.instances,
        "ready_instances": totals.ready,
        "slots": slots,
        "busy_slots": totals.busy_slots,
        "pending_jobs": pending,
        "recent_jobs": recent,
        "history_samples": history_samples,
        "requests": REQUESTS,
        "goal_ms": GOAL_MS,
        "api_p50_ms": round(api50),
        "api_p95_ms": round(api95),
        "api_max_ms": round(api.last().copied().unwrap_or(f64::NAN)),
        "api_bytes": api_bytes,
        "meets_goal": api95 < GOAL_MS,
        "build_and_encode_p50_ms": round(percentile(&build_and_encode, 50.0)),
        "build_and_encode_p95_ms": round(percentile(&build_and_encode, 95.0)),
        // Where the handler's time goes: the status built (taskscaler and board copies
        // included), the taskscaler's copy of its instances alone, the JSON encoding alone.
        "build_p50_ms": round(percentile(&build, 50.0)),
        "taskscaler_instances_p50_ms": round(percentile(&scaler_copy, 50.0)),
        "encode_p50_ms": round(percentile(&encode, 50.0)),
        "page_p50_ms": round(percentile(&m.page.0, 50.0)),
        "page_p95_ms": round(percentile(&m.page.0, 95.0)),
        "page_max_ms": round(m.page.0.last().copied().unwrap_or(f64::NAN)),
        "page_bytes": m.page.1,
        "page_render_p50_ms": round(percentile(&render, 50.0)),
        "baseline_10_instances_p50_ms": round(small50),
        "baseline_10_instances_p95_ms": round(percentile(&m.small_api.0, 95.0)),
        "baseline_10_instances_bytes": m.small_api.1,
        "ratio_1000_to_10": round(api50 / small50),
        "metrics_p50_ms": round(metrics50),
        "metrics_p95_ms": round(percentile(&m.metrics.0, 95.0)),
        "metrics_bytes": m.metrics.1,
        "ratio_api_to_metrics": round(api50 / metrics50),
        // Browsers ask for gzip: the same answers compressed at the fastest level.
        "api_gzip_p50_ms": round(percentile(&m.api_gzip.0, 50.0)),
        "api_gzip_p95_ms": round(percentile(&m.api_gzip.0, 95.0)),
        "api_gzip_bytes": m.api_gzip.1,
        "page_gzip_p50_ms": round(percentile(&m.page_gzip.0, 50.0)),
        "page_gzip_p95_ms": round(percentile(&m.page_gzip.0, 95.0)),
        "page_gzip_bytes": m.page_gzip.1,
        "meets_goal_gzip": percentile(&m.api_gzip.0, 95.0) < GOAL_MS,
    });
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (_, text) = slipway_testkit::bench::write(&repo, "status", COMMAND, results)?;
    println!("{text}");
    Ok(())
}

async fn measure_http(
    big: std::net::SocketAddr,
    small: std::net::SocketAddr,
) -> anyhow::Result<Measured> {
    let mut c = Client::connect(big).await.context("connecting")?;
    let api = c.measure("/api/v1/status").await;
    let page = c.measure("/").await;
    let metrics = c.measure("/metrics").await;
    // What a browser gets: it asks for gzip.
    c.gzip = true;
    let api_gzip = c.measure("/api/v1/status").await;
    let page_gzip = c.measure("/").await;
    c.close();
    let mut s = Client::connect(small).await.context("connecting")?;
    let small_api = s.measure("/api/v1/status").await;
    s.close();
    Ok(Measured {
        api: api.context("/api/v1/status")?,
        page: page.context("/")?,
        metrics: metrics.context("/metrics")?,
        small_api: small_api.context("/api/v1/status of 10 instances")?,
        api_gzip: api_gzip.context("/api/v1/status with gzip")?,
        page_gzip: page_gzip.context("/ with gzip")?,
    })
}
