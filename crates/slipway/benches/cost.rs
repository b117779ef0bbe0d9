//! What cost tracking reports against what the instances were billed, and what it costs the
//! manager: a mixed-size workload through `slipway run` on the local plugin, two shapes with
//! prices, the instances' lives watched from outside (their directories in the plugin's
//! state) to bill them independently; then the same workload without prices for the CPU
//! baseline.
//!
//! Writes `bench/results/cost.json`; regenerate with `cargo bench -p slipway --bench cost`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use support::slipway;

mod support;

const COMMAND: &str = "cargo bench -p slipway --bench cost";
/// Jobs per run.
const JOBS: usize = 120;
/// The billing minimum of both shapes.
const MINIMUM_S: f64 = 10.0;
/// Shapes: name, CPUs, memory, price per hour (USD).
const SHAPES: [(&str, u32, &str, f64); 2] =
    [("small", 2, "4GiB", 0.085), ("large", 8, "32GiB", 0.34)];

fn main() -> anyhow::Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let plugins = support::build_plugins(&repo, &["fleeting-plugin-local"])?;
    let priced = run(&plugins, true)?;
    println!("priced: {priced:?}");
    let unpriced = run(&plugins, false)?;
    println!("unpriced: {unpriced:?}");
    let billed = priced.billed_independently;
    let conservation_error = (priced.jobs + priced.overhead - billed).abs() / billed;
    let per_1000 = |r: &Run| r.manager_cpu_s / JOBS as f64 * 1000.0;
    let results = serde_json::json!({
        "jobs": JOBS,
        "billed_total": round6(billed),
        "billed_total_by_manager": round6(priced.billed),
        "jobs_total": round6(priced.jobs),
        "overhead_total": round6(priced.overhead),
        "overhead_share": round6(priced.overhead / billed),
        "conservation_error": round6(conservation_error),
        "conservation_goal": 0.005,
        "ledger_conservation_error": round6(
            (priced.jobs + priced.overhead - priced.billed).abs() / priced.billed
        ),
        "instances": priced.instances,
        "manager_cpu_s_per_1000_jobs": round6(per_1000(&priced)),
        "manager_cpu_s_per_1000_jobs_without_cost": round6(per_1000(&unpriced)),
        "manager_cpu_ratio": round6(per_1000(&priced) / per_1000(&unpriced)),
        "wall_s": round6(priced.wall_s),
        "wall_s_without_cost": round6(unpriced.wall_s),
        "currency": "USD",
        "setup": format!(
            "slipway run, fleeting-plugin-local, shapes {} (2 slots each, 2 instances at most, \
             idle_time 3s, billing_minimum {MINIMUM_S}s); {JOBS} jobs of three sizes (1 CPU/1 GiB, \
             2 CPU/3 GiB, 6 CPU/20 GiB) sleeping 0.5-3 s; billed_total: each instance's life from \
             its directory's creation to its removal (watched every 20 ms), per second with the \
             minimum; jobs_total and overhead_total from /metrics once every instance was gone; \
             the manager's CPU from /proc after the last instance went, the same workload without \
             prices as the baseline",
            SHAPES
                .iter()
                .map(|(n, c, m, p)| format!("{n} ({c} CPU/{m}, {p} USD/h)"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    if conservation_error > 0.005 {
        eprintln!("warning: conservation error {conservation_error:.4} is above the 0.5 % goal");
    }
    let (path, text) = slipway_testkit::bench::write(&repo, "cost", COMMAND, results)?;
    println!("{}\n{text}", path.display());
    Ok(())
}

fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// Each instance's life as its plugin made it, by id: its shape, first seen, gone.
type Lives = Mutex<BTreeMap<String, (String, Instant, Option<Instant>)>>;

/// What one run came to.
#[derive(Debug, Default)]
struct Run {
    wall_s: f64,
    manager_cpu_s: f64,
    billed: f64,
    jobs: f64,
    overhead: f64,
    billed_independently: f64,
    instances: usize,
}

fn config(dir: &Path, port: u16, priced: bool) -> String {
    let mut c = format!(
        r#"
concurrent = 8
listen_address = "127.0.0.1:{port}"
[[runners]]
  name = "cost"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 2
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    billing_minimum = "{MINIMUM_S}s"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "3s"
"#
    );
    for (name, cpu, memory, price) in SHAPES {
        c.push_str(&format!(
            "    [[runners.autoscaler.shape]]\n      name = \"{name}\"\n      cpu = {cpu}\n      memory = \"{memory}\"\n"
        ));
        if priced {
            c.push_str(&format!("      price_per_hour = {price}\n"));
        } else {
            c.push_str(&format!("      cost = {price}\n"));
        }
        c.push_str(&format!(
            "      [runners.autoscaler.shape.plugin_config]\n        dir = \"{}\"\n        name = \"cost{}{name}\"\n",
            dir.join("plugin-state").join(name).display(),
            std::process::id()
        ));
    }
    c
}

fn pipeline() -> String {
    let sizes = [("1", "1GiB"), ("2", "3GiB"), ("6", "20GiB")];
    let mut p = String::from("stages: [test]\n");
    for i in 0..JOBS {
        let (cpu, memory) = sizes[(i * 7) % 3];
        let secs = 0.5 + (i % 6) as f64 * 0.5;
        p.push_str(&format!(
            "j{i}:\n  variables:\n    SLIPWAY_CPU: \"{cpu}\"\n    SLIPWAY_MEMORY: \"{memory}\"\n  script: [\"sleep {secs}\"]\n"
        ));
    }
    p
}

fn run(plugins: &Path, priced: bool) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("tmp"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    std::fs::write(
        dir.path().join("config.toml"),
        config(dir.path(), port, priced),
    )?;
    std::fs::write(dir.path().join("pipeline.yml"), pipeline())?;

    // Each instance's life as its plugin made it: first seen → gone, per shape.
    let lives: Arc<Lives> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (lives, done) = (lives.clone(), done.clone());
        let root = dir.path().join("plugin-state");
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                watch(&root, &lives);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let log = std::fs::File::create(dir.path().join("manager.err"))?;
    let mut child = slipway(dir.path(), plugins, &["run", "-c", "config.toml"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()?;
    let result = drive(dir.path(), plugins, port, &mut child, &lives);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let mut run = match result {
        Ok(r) => r,
        Err(e) => {
            let log = std::fs::read_to_string(dir.path().join("manager.err")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            bail!(
                "{e:#}\nmanager log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
    };
    let lives = lives
        .lock()
        .map_err(|_| anyhow::anyhow!("watcher panicked"))?;
    for (id, (shape, from, to)) in lives.iter() {
        let life = to.map(|t| t.duration_since(*from).as_secs_f64());
        println!("instance {id} ({shape}): {life:?} s");
    }
    run.instances = lives.len();
    run.billed_independently = lives
        .values()
        .map(|(shape, from, to)| {
            let price = SHAPES
                .iter()
                .find(|s| shape.contains(s.0))
                .map_or(0.0, |s| s.3);
            let life = to
                .unwrap_or_else(Instant::now)
                .duration_since(*from)
                .as_secs_f64();
            price / 3600.0 * life.max(MINIMUM_S)
        })
        .sum();
    Ok(run)
}

/// Record instance directories appearing and going under `root/<shape>/instances`.
fn watch(root: &Path, lives: &Lives) {
    let now = Instant::now();
    let mut seen = Vec::new();
    for (shape, ..) in SHAPES {
        let Ok(entries) = std::fs::read_dir(root.join(shape).join("instances")) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // `.trash-<id>`: an instance being deleted, renamed out of the way; its life ends
            // at the rename.
            if !name.starts_with('.') {
                seen.push((shape.to_string(), name));
            }
        }
    }
    let Ok(mut lives) = lives.lock() else { return };
    for (shape, id) in &seen {
        lives
            .entry(id.clone())
            .or_insert((shape.clone(), now, None));
    }
    for (id, life) in lives.iter_mut() {
        if life.2.is_none() && !seen.iter().any(|(_, s)| s == id) {
            life.2 = Some(now);
        }
    }
}

fn drive(
    dir: &Path,
    plugins: &Path,
    port: u16,
    child: &mut Child,
    lives: &Lives,
) -> anyhow::Result<Run> {
    wait(Duration::from_secs(60), child, || {
        Ok(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
    })
    .context("the manager never listened")?;
    let out = slipway(
        dir,
        plugins,
        &["submit", "-c", "config.toml", "pipeline.yml"],
    )
    .output()?;
    if !out.status.success() {
        bail!("slipway submit: {}", String::from_utf8_lossy(&out.stderr));
    }
    let start = Instant::now();
    wait(Duration::from_secs(900), child, || {
        let m = get(port, "/metrics")?;
        Ok(sum(&m, "slipway_jobs_finished_total{") as usize >= JOBS)
    })
    .context("the jobs did not all end")?;
    let wall_s = start.elapsed().as_secs_f64();
    // Every instance gone (idle), its bill settled.
    wait(Duration::from_secs(120), child, || {
        let l = lives
            .lock()
            .map_err(|_| anyhow::anyhow!("watcher panicked"))?;
        Ok(!l.is_empty() && l.values().all(|v| v.2.is_some()))
    })
    .context("the instances were not removed when idle")?;
    let mut metrics = String::new();
    wait(Duration::from_secs(30), child, || {
        metrics = get(port, "/metrics")?;
        Ok(sum(&metrics, "slipway_cost_per_hour{") == 0.0)
    })
    .context("the manager still bills live instances")?;
    let m = get(port, "/metrics")?;
    let failed = sum(
        &m,
        "slipway_jobs_finished_total{runner=\"cost\",outcome=\"failed\"}",
    );
    if failed > 0.0 {
        bail!("{failed} jobs failed");
    }
    Ok(Run {
        wall_s,
        manager_cpu_s: cpu_seconds(child.id())?,
        billed: sum(&m, "slipway_instance_billed_total{"),
        jobs: sum(&m, "slipway_job_cost_total{"),
        overhead: sum(&m, "slipway_instance_overhead_total{"),
        ..Run::default()
    })
}

/// The sum of every sample whose line starts with `prefix`.
fn sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// User and system CPU time of process `pid` so far.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).context("utime")?.parse::<f64>()? + f.get(12).context("stime")?.parse::<f64>()?;
    // Linux's USER_HZ is 100 on every architecture Slipway builds for.
    Ok(ticks / 100.0)
}

fn wait(
    limit: Duration,
    child: &mut Child,
    mut cond: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(st) = child.try_wait()? {
            bail!("the manager exited: {st}");
        }
        if cond().unwrap_or(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {limit:?}")
}

fn get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    conn.read_to_string(&mut out)?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}
