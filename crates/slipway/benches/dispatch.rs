//! Dispatch latency with warm idle capacity: from a job being queued to its first output line,
//! next to a bare SSH exec over an open connection and a local `sh -c true` spawn; and the same
//! job through the manager's one job lifecycle (admit, reserve, acquire, execute, release), as
//! every job source runs it, against the executor driven by hand in the same run.
//!
//! Writes `bench/results/dispatch.json`. Run with `make bench` (see `command` in the file).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use slipway_config as config;
use slipway_executor::{Executor, JobRunner, JobSlot, SshHost, Steps};
use slipway_job::Trace;
use slipway_manager::lifecycle::{Life, NoInputs, Start, Stops};
use slipway_manager::runner::{Runner, StartOptions};
use slipway_pipeline::{Pipeline, PipelineOptions};
use slipway_taskscaler::Resources;
use slipway_testkit::bench::{ms, percentile, round3 as round};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const JOBS: usize = 200;
const BASELINE_RUNS: usize = 200;
const COMMAND: &str = "make bench";

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/dispatch-… → target/<profile>
    let plugin_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .context("locating the target dir")?;
    let run_dir = tempfile::Builder::new()
        .prefix("slipway-bench-")
        .tempdir()?;

    // The embedded config, with idle capacity kept warm for the whole run.
    let text = config::EMBEDDED.replace("idle_count = 0", "idle_count = 2");
    let loaded = config::parse(&text, "embedded")?;
    let runner_cfg = loaded.config.runners[0].clone();
    let runner = Runner::start(
        &runner_cfg,
        &StartOptions {
            plugin_dir: Some(plugin_dir),
            helper: None,
            plugin_config_defaults: slipway_manager::runner::run_scoped_plugin_config(
                run_dir.path(),
                "b",
            ),
            handshake_timeout: None,
            delete_instances_on_shutdown: true,
            state_dir: Some(run_dir.path().join("state")),
            work_dir: None,
            metrics: None,
            job_metrics: None,
            concurrent: 1,
        },
    )
    .await?;
    let result = measure(&runner).await;
    runner.shutdown().await;
    let (dispatch, acquire, ssh_exec, lifecycle) = result?;

    let mut spawn = Vec::with_capacity(BASELINE_RUNS);
    for _ in 0..BASELINE_RUNS {
        let t = Instant::now();
        let st = tokio::process::Command::new("sh")
            .args(["-c", "true"])
            .status()
            .await?;
        anyhow::ensure!(st.success(), "sh -c true failed");
        spawn.push(ms(t.elapsed()));
    }
    spawn.sort_by(f64::total_cmp);

    let d50 = percentile(&dispatch, 50.0);
    let d95 = percentile(&dispatch, 95.0);
    let s50 = percentile(&ssh_exec, 50.0);
    let p50 = percentile(&spawn, 50.0);
    let a50 = percentile(&acquire, 50.0);
    let l50 = percentile(&lifecycle, 50.0);
    let results = serde_json::json!({
        "jobs": dispatch.len(),
        "dispatch_ms_p50": round(d50),
        "dispatch_ms_p95": round(d95),
        "ssh_exec_ms_p50": round(s50),
        "spawn_ms_p50": round(p50),
        "dispatch_over_ssh_exec_p50": round(d50 / s50),
        "dispatch_over_spawn_p50": round(d50 / p50),
        // Where the time goes: reserve and acquire (the write-ahead record included), then the
        // rest (the job's script reaching the instance's shell, to its first line).
        "acquire_ms_p50": round(a50),
        "acquired_to_first_line_ms_p50": round(d50 - a50),
        // The same job through `Life::run`, the path of every source, against the executor
        // driven by hand above.
        "lifecycle_ms_p50": round(l50),
        "lifecycle_ms_p95": round(percentile(&lifecycle, 95.0)),
        "lifecycle_over_dispatch_p50": round(l50 / d50),
    });
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (_, text) = slipway_testkit::bench::write(&repo, "dispatch", COMMAND, results)?;
    println!("{text}");
    Ok(())
}

/// Run trivial jobs one after another; returns (queue→first line, queue→acquired, bare ssh
/// exec, queue→first line through the lifecycle) in ms, sorted.
async fn measure(runner: &Runner) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    let pipeline = Pipeline::parse(
        "bench:\n  script: [echo hi]\n",
        "bench.yml",
        PipelineOptions::default(),
    )?;
    let job = &pipeline.jobs[0];
    // The instance executor as the lifecycle builds it: bash steps over SSH.
    let exec = JobRunner::default();

    // Warm: wait until idle capacity is running, and open the connection once.
    let warm = runner_job(runner, &exec, job, 0).await?;
    anyhow::ensure!(warm.is_some(), "warm-up job produced no output");

    let mut dispatch = Vec::with_capacity(JOBS);
    let mut acquire = Vec::with_capacity(JOBS);
    for i in 1..=JOBS {
        let (first, acquired) = runner_job(runner, &exec, job, i as u64)
            .await?
            .context("no output")?;
        dispatch.push(first);
        acquire.push(acquired);
    }
    dispatch.sort_by(f64::total_cmp);
    acquire.sort_by(f64::total_cmp);

    let mut lifecycle = Vec::with_capacity(JOBS);
    for i in 1..=JOBS {
        lifecycle.push(lifecycle_job(runner, job, (JOBS + i) as u64).await?);
    }
    lifecycle.sort_by(f64::total_cmp);

    runner
        .reserve_wait("ssh-baseline", &Resources::default())
        .await?;
    let acq = runner.acquire("ssh-baseline").await?;
    let client = runner.client(&acq).await?;
    let mut ssh = Vec::with_capacity(BASELINE_RUNS);
    for _ in 0..BASELINE_RUNS {
        let t = Instant::now();
        let (st, _, _) = client.run_capture("true", Vec::new()).await?;
        anyhow::ensure!(st.success(), "ssh true failed: {st}");
        ssh.push(ms(t.elapsed()));
    }
    runner.release("ssh-baseline");
    ssh.sort_by(f64::total_cmp);
    Ok((dispatch, acquire, ssh, lifecycle))
}

/// One job through [`Life::run`]: the time from its arrival to its first output line after
/// the lifecycle's "Running on instance" line.
async fn lifecycle_job(
    runner: &Runner,
    job: &slipway_pipeline::PipelineJob,
    id: u64,
) -> anyhow::Result<f64> {
    let payload = job.to_job_response(id + 1, 1, &[]);
    let key = format!("bench-life-{id}");
    let queued = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let mut trace = Trace::new(Vec::<String>::new(), tx);
    let first = tokio::spawn(async move {
        let mut placed = false;
        while let Some(chunk) = rx.recv().await {
            if placed {
                return Some(queued.elapsed());
            }
            placed = String::from_utf8_lossy(&chunk).contains("Running on instance");
        }
        None
    });
    let life = Life {
        runner,
        key: &key,
        source: &NoInputs,
        stops: Stops::default(),
        since: None,
    };
    let ran = life
        .run(&payload, Start::Admit { held: None }, &mut trace)
        .await
        .map_err(|no| anyhow::anyhow!("no slot: {}", no.message))?;
    drop(ran.slot);
    anyhow::ensure!(
        ran.outcome.is_success(),
        "bench job failed: {:?}",
        ran.outcome
    );
    drop(trace);
    let elapsed = first.await?.context("no output after the placement line")?;
    Ok(ms(elapsed))
}

/// Queue one job and return the time until its first output chunk and until it was acquired.
async fn runner_job(
    runner: &Runner,
    exec: &JobRunner,
    job: &slipway_pipeline::PipelineJob,
    id: u64,
) -> anyhow::Result<Option<(f64, f64)>> {
    let payload = job.to_job_response(id + 1, 1, &[]);
    let key = format!("bench-{id}");
    let queued = Instant::now();
    // Preemptive mode (idle_count > 0) refuses a reservation until an idle slot is ready.
    runner.reserve_wait(&key, &Resources::default()).await?;
    let acq = runner.acquire(&key).await?;
    let acquired = ms(queued.elapsed());
    let client = runner.client(&acq).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut trace = Trace::new(Vec::<String>::new(), tx);
    let first = tokio::spawn(async move { rx.recv().await.map(|_| queued.elapsed()) });
    let steps = Steps {
        name: "instance",
        host: SshHost(&client),
        runner: exec.clone(),
    };
    let result = steps
        .run(
            &payload,
            JobSlot {
                slot: acq.slot,
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
    drop(trace);
    runner.release(&key);
    anyhow::ensure!(
        result.outcome.is_success(),
        "bench job failed: {:?}",
        result.outcome
    );
    Ok(first.await?.map(|d| (ms(d), acquired)))
}
