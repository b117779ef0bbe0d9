//! What the executor plugin boundary costs: the same jobs through the in-process `shell`
//! executor (`JobRunner` over `LocalHost`) and through `executor-plugin-shell` (the `plugin`
//! executor: Prepare, a `Run` per stage over go-plugin gRPC with AutoMTLS, Cleanup), both
//! running bash on this machine, interleaved in one run so drift hits both alike.
//!
//! - start: from the executor's `run` call to the trace receiving the job's output line `first`
//!   (warm: the plugin process is up and initialized), [`JOBS`] samples after [`WARMUP`].
//! - trace: a job printing 10 MiB (`head -c 10485760 /dev/zero | tr '\0' x`, in 100-byte
//!   lines), MiB/s from the `run` call to its return, [`TRACE_JOBS`] samples. Beside them, as
//!   context, the in-process job with one more process in its pipeline (`| cat`): what one extra
//!   copy through a pipe and a process costs on this machine, the floor of any executor whose
//!   output crosses a process boundary by copying.
//!
//! Goal (issue 13): plugin start p50 ≤ 1.1 × in-process + 5 ms; trace throughput ≥ 0.9 ×.
//!
//! Writes `bench/results/executor-plugin.json`; regenerate with [`COMMAND`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use slipway_executor::{Executor, JobRunner, JobSlot, LocalHost, PluginExecutor, Steps};
use slipway_executor_plugin::{ExecutorHost, Resources};
use slipway_goplugin::ProcessOptions;
use slipway_job::JobResponse;
use slipway_job::Trace;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const JOBS: usize = 60;
const WARMUP: usize = 5;
const TRACE_JOBS: usize = 21;
const TRACE_BYTES: usize = 10 * 1024 * 1024;
const COMMAND: &str = "cargo bench -p executor-plugin-shell --bench boundary";

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}

fn job(id: u64, script: &str) -> anyhow::Result<JobResponse> {
    let json = serde_json::json!({
        "id": id,
        "token": "bench-job-token",
        "job_info": {"project_id": 1, "name": "bench"},
        "runner_info": {"timeout": 600},
        "steps": [{"name": "script", "script": [script], "timeout": 600, "when": "on_success"}],
    });
    Ok(JobResponse::from_json(&json.to_string())?)
}

/// Run `job` on `exec`; (time to the line `first`, if watched for; time to the end; bytes).
async fn run(
    exec: &dyn Executor,
    job: &JobResponse,
    watch_first: bool,
) -> anyhow::Result<(Option<Duration>, Duration, usize)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let mut trace = Trace::new(Vec::<String>::new(), tx);
    let watcher = tokio::spawn(async move {
        let (mut first, mut bytes, mut tail) = (None, 0usize, String::new());
        while let Some(chunk) = rx.recv().await {
            let at = Instant::now();
            bytes += chunk.len();
            if watch_first && first.is_none() {
                tail.push_str(&String::from_utf8_lossy(&chunk));
                // `$ echo first` (the echoed command) comes before; the output line is `first`.
                if tail.lines().any(|l| l.trim_end() == "first") {
                    first = Some(at);
                }
            }
        }
        (first, bytes)
    });
    let t0 = Instant::now();
    let result = exec
        .run(
            job,
            JobSlot {
                slot: 0,
                cgroup: None,
                trace: &mut trace,
                cancel: CancellationToken::new(),
                abort: None,
                artifacts_in: Vec::new(),
                scratch_dir: None,
                max_collected: None,
                sources: None,
                data: None,
            },
        )
        .await;
    let total = t0.elapsed();
    trace.finish();
    drop(trace);
    let (first, bytes) = watcher.await?;
    ensure!(
        result.outcome.is_success(),
        "{} job failed: {:?}",
        exec.name(),
        result.outcome
    );
    let first = match (watch_first, first) {
        (true, None) => bail!("{}: the job printed no line `first`", exec.name()),
        (_, f) => f.map(|at| at.duration_since(t0)),
    };
    Ok((first, total, bytes))
}

async fn bench() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let config = serde_json::json!({ "root": tmp.path().join("plugin") }).to_string();
    let host = ExecutorHost::start(
        ProcessOptions::new("shell", env!("CARGO_BIN_EXE_executor-plugin-shell")),
        config.into_bytes(),
        false,
    )
    .await
    .context("starting executor-plugin-shell")?;
    let host = Arc::new(host);
    let result = measure(&host, tmp.path()).await;
    host.stop().await;
    let r = result?;
    write(&r)
}

struct Measured {
    start_in: Vec<f64>,
    start_plugin: Vec<f64>,
    trace_in: Vec<f64>,
    trace_plugin: Vec<f64>,
    trace_in_hop: Vec<f64>,
}

async fn measure(host: &Arc<ExecutorHost>, dir: &Path) -> anyhow::Result<Measured> {
    let in_process = Steps {
        name: "shell",
        host: LocalHost::default(),
        runner: JobRunner {
            builds_dir: dir.join("builds").display().to_string(),
            ..JobRunner::default()
        },
    };
    let plugin = PluginExecutor {
        host: host.clone(),
        runner: JobRunner::default(),
        isolation: "none".into(),
        instance: None,
        resources: Resources::default(),
        prepare_timeout: Duration::from_secs(60),
        cleanup_timeout: Duration::from_secs(60),
    };
    let start_job = job(1, "echo first")?;
    let (mut start_in, mut start_plugin) = (Vec::new(), Vec::new());
    for i in 0..JOBS + WARMUP {
        let (a, _, _) = run(&in_process, &start_job, true).await?;
        let (b, _, _) = run(&plugin, &start_job, true).await?;
        if i >= WARMUP {
            start_in.push(ms(a.unwrap_or_default()));
            start_plugin.push(ms(b.unwrap_or_default()));
        }
    }
    let trace_job = job(
        2,
        &format!("head -c {TRACE_BYTES} /dev/zero | tr '\\0' x | fold -w 99"),
    )?;
    let hop_job = job(
        3,
        &format!("head -c {TRACE_BYTES} /dev/zero | tr '\\0' x | fold -w 99 | cat"),
    )?;
    let (mut trace_in, mut trace_plugin, mut trace_in_hop) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..TRACE_JOBS {
        for (exec, job, out) in [
            (&in_process as &dyn Executor, &trace_job, &mut trace_in),
            (&plugin as &dyn Executor, &trace_job, &mut trace_plugin),
            (&in_process as &dyn Executor, &hop_job, &mut trace_in_hop),
        ] {
            let (_, total, bytes) = run(exec, job, false).await?;
            ensure!(
                bytes >= TRACE_BYTES,
                "{}: the trace held {bytes} bytes",
                exec.name()
            );
            out.push(TRACE_BYTES as f64 / (1024.0 * 1024.0) / total.as_secs_f64());
        }
    }
    Ok(Measured {
        start_in,
        start_plugin,
        trace_in,
        trace_plugin,
        trace_in_hop,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (s.len() - 1) as f64).round() as usize;
    s[rank.min(s.len() - 1)]
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn write(m: &Measured) -> anyhow::Result<()> {
    let (in50, pl50) = (
        percentile(&m.start_in, 50.0),
        percentile(&m.start_plugin, 50.0),
    );
    let (tin, tpl) = (
        percentile(&m.trace_in, 50.0),
        percentile(&m.trace_plugin, 50.0),
    );
    let thop = percentile(&m.trace_in_hop, 50.0);
    let start_goal = 1.1 * in50 + 5.0;
    let results = serde_json::json!({
        "jobs": JOBS,
        "trace_jobs": TRACE_JOBS,
        "trace_bytes": TRACE_BYTES,
        "setup": "shell executor in-process (JobRunner over LocalHost) vs the plugin executor \
                  through executor-plugin-shell (go-plugin gRPC over a unix socket with AutoMTLS, \
                  a single-threaded plugin runtime, output gathered into messages of up to \
                  256 KiB, a partial one held at most 2 ms while output flows); both run bash on \
                  this machine; jobs interleaved",
        "start_in_process_ms_p50": round(in50),
        "start_in_process_ms_p95": round(percentile(&m.start_in, 95.0)),
        "start_plugin_ms_p50": round(pl50),
        "start_plugin_ms_p95": round(percentile(&m.start_plugin, 95.0)),
        "start_plugin_over_in_process": round(pl50 / in50),
        "start_goal_ms": round(start_goal),
        "start_meets_goal": pl50 <= start_goal,
        "trace_in_process_mib_s_p50": round(tin),
        "trace_plugin_mib_s_p50": round(tpl),
        "trace_plugin_over_in_process": round(tpl / tin),
        "trace_meets_goal": tpl >= 0.9 * tin,
        "trace_in_process_one_more_pipe_mib_s_p50": round(thop),
        "trace_one_more_pipe_over_in_process": round(thop / tin),
    });
    println!(
        "start p50: in-process {in50:.2} ms, plugin {pl50:.2} ms (goal ≤ {start_goal:.2} ms)\n\
         trace p50: in-process {tin:.1} MiB/s, plugin {tpl:.1} MiB/s ({:.2}×, goal ≥ 0.9×); \
         in-process with one more pipe {thop:.1} MiB/s ({:.2}×)",
        tpl / tin,
        thop / tin
    );
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, text) = slipway_testkit::bench::write(&repo, "executor-plugin", COMMAND, results)?;
    println!("{}\n{text}", path.display());
    Ok(())
}
