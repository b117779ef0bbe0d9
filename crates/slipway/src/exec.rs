//! `slipway exec`: run a local pipeline through the whole path —
//! taskscaler → plugin process → SSH → instance executor.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use slipway_executor::{JobOutcome, Trace};
use slipway_jobs::{JobStatus, Pipeline, PipelineOptions, PipelineRun, PipelineStatus};
use slipway_taskscaler::Acquisition;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::RunnerConfig;
use crate::job;
use crate::runner::{Runner, StartOptions};

/// What `slipway exec` was asked to do.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Pipeline file.
    pub file: PathBuf,
    /// Run only this job.
    pub job: Option<String>,
    /// Ignore (with a warning) keys the reader does not support.
    pub allow_unsupported: bool,
    /// Jobs at once.
    pub concurrent: u32,
    /// Where to look for plugins first.
    pub plugin_dir: Option<PathBuf>,
    /// Handshake timeout for the plugin process (default: the host's).
    pub plugin_start_timeout: Option<Duration>,
}

/// One row of the summary table.
#[derive(Debug, Clone)]
pub struct JobRow {
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// Final status.
    pub status: JobStatus,
    /// Wall time from acquisition to the end.
    pub duration: Option<Duration>,
    /// Instance the job ran on.
    pub instance: String,
    /// Slot on that instance.
    pub slot: Option<u32>,
    /// Failure message, if any.
    pub message: String,
}

struct Finished {
    index: usize,
    row: JobRow,
    artifacts: Vec<PathBuf>,
}

/// Run the pipeline; returns whether it succeeded. `stop` cancels it (SIGTERM, Ctrl-C).
pub async fn run(
    runner_cfg: &RunnerConfig,
    opts: &ExecOptions,
    stop: CancellationToken,
) -> anyhow::Result<bool> {
    let text = tokio::fs::read_to_string(&opts.file)
        .await
        .with_context(|| format!("cannot read {}", opts.file.display()))?;
    let pipeline = Pipeline::parse(
        &text,
        &opts.file.display().to_string(),
        PipelineOptions {
            allow_unsupported: opts.allow_unsupported,
            ..PipelineOptions::default()
        },
    )?;
    for w in &pipeline.warnings {
        eprintln!("warning: {w}");
    }
    let mut plan = PipelineRun::new(&pipeline, opts.job.as_deref())?;

    // Everything this run creates lives under one directory, removed at the end.
    let run_dir = tempfile::Builder::new()
        .prefix("slipway-exec-")
        .tempdir()
        .context("creating the run directory")?;
    let artifacts_dir = run_dir.path().join("artifacts");
    tokio::fs::create_dir_all(&artifacts_dir).await?;

    let start = StartOptions {
        plugin_dir: opts.plugin_dir.clone(),
        plugin_config_defaults: if runner_cfg
            .autoscaler
            .as_ref()
            .is_some_and(|a| crate::runner::plugin_name(&a.plugin) == "local")
        {
            crate::runner::run_scoped_plugin_config(run_dir.path(), "x")
        } else {
            toml::Table::new()
        },
        handshake_timeout: opts.plugin_start_timeout,
        delete_instances_on_shutdown: true,
        state_dir: Some(run_dir.path().join("state")),
        metrics: None,
        concurrent: opts.concurrent,
    };
    let runner = tokio::select! {
        r = Runner::start(runner_cfg, &start) => Arc::new(r?),
        _ = stop.cancelled() => anyhow::bail!("interrupted while starting the runner"),
    };

    let result = drive(&runner, &pipeline, &mut plan, opts, &artifacts_dir, &stop).await;
    runner.shutdown().await;
    // Removing a directory tree is blocking I/O: keep it off the runtime's threads.
    match tokio::task::spawn_blocking(move || run_dir.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("removing the run directory: {e}"),
        Err(e) => tracing::warn!("removing the run directory: {e}"),
    }
    let rows = result?;
    print_summary(&rows);
    let ok = matches!(
        plan.status(),
        PipelineStatus::Success | PipelineStatus::SuccessWithWarnings
    );
    println!("Pipeline {}", if ok { "succeeded" } else { "failed" });
    Ok(ok)
}

async fn drive(
    runner: &Arc<Runner>,
    pipeline: &Pipeline,
    plan: &mut PipelineRun,
    opts: &ExecOptions,
    artifacts_dir: &Path,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<JobRow>> {
    let printer = Printer::start();
    let mut rows: Vec<Option<JobRow>> = vec![None; pipeline.jobs.len()];
    let mut artifacts: HashMap<usize, Vec<PathBuf>> = HashMap::new();
    let mut tasks: JoinSet<Finished> = JoinSet::new();
    let mut running = 0usize;
    let limit = opts.concurrent.max(1) as usize;
    let pipeline_id = u64::from(std::process::id());
    // Jobs stop on a signal, or when the run itself fails: never abandoned mid-step.
    let jobs_stop = stop.child_token();
    let mut fatal: Option<anyhow::Error> = None;

    loop {
        if !jobs_stop.is_cancelled() {
            for index in plan.ready() {
                if running >= limit {
                    break;
                }
                if let Err(e) = plan.start(index) {
                    fatal = Some(e.into());
                    jobs_stop.cancel();
                    break;
                }
                running += 1;
                let job = &pipeline.jobs[index];
                let id = index as u64 + 1;
                let payload = job.to_job_response(id, pipeline_id, &[]);
                let inputs: Vec<PathBuf> = plan
                    .artifact_sources(index)
                    .into_iter()
                    .filter_map(|i| artifacts.get(&i).cloned())
                    .flatten()
                    .collect();
                let ctx = JobTask {
                    runner: runner.clone(),
                    index,
                    name: job.name.clone(),
                    stage: job.stage.clone(),
                    payload,
                    inputs,
                    artifacts_out: artifacts_dir.join(format!("{id}.tar")),
                    trace: printer.sender(&job.name),
                    cancel: jobs_stop.child_token(),
                };
                tasks.spawn(ctx.run());
            }
        }
        if running == 0 {
            break;
        }
        tokio::select! {
            done = tasks.join_next() => {
                let Some(done) = done else { break };
                running -= 1;
                let finished = match done {
                    Ok(f) => f,
                    Err(e) => {
                        fatal.get_or_insert_with(|| anyhow::anyhow!("job task failed: {e}"));
                        jobs_stop.cancel();
                        continue;
                    }
                };
                if let Err(e) = plan.finish(finished.index, finished.row.status) {
                    fatal.get_or_insert(e.into());
                    jobs_stop.cancel();
                }
                if !finished.artifacts.is_empty() {
                    artifacts.insert(finished.index, finished.artifacts);
                }
                let mut row = finished.row;
                // The plan knows allow_failure: it turns a failure into "failed (allowed)".
                row.status = plan.job_status(finished.index).unwrap_or(row.status);
                rows[finished.index] = Some(row);
            }
            _ = stop.cancelled(), if !stop.is_cancelled() => {
                eprintln!("Stopping: canceling running jobs");
            }
        }
    }
    if jobs_stop.is_cancelled() {
        plan.cancel();
    }
    printer.stop().await;
    if let Some(e) = fatal {
        return Err(e);
    }
    Ok(pipeline
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            rows[i].take().unwrap_or_else(|| JobRow {
                name: j.name.clone(),
                stage: j.stage.clone(),
                status: plan.job_status(i).unwrap_or(JobStatus::Skipped),
                duration: None,
                instance: String::new(),
                slot: None,
                message: String::new(),
            })
        })
        .enumerate()
        .filter(|(i, _)| plan.is_selected(*i))
        .map(|(_, r)| r)
        .collect())
}

struct JobTask {
    runner: Arc<Runner>,
    index: usize,
    name: String,
    stage: String,
    payload: slipway_jobs::JobResponse,
    inputs: Vec<PathBuf>,
    artifacts_out: PathBuf,
    trace: mpsc::UnboundedSender<Vec<u8>>,
    cancel: CancellationToken,
}

impl JobTask {
    async fn run(self) -> Finished {
        let key = format!("{}-{}", self.name, self.payload.id);
        let secrets: Vec<String> = self
            .payload
            .masked_values()
            .into_iter()
            .map(String::from)
            .collect();
        let mut trace = Trace::new(secrets, self.trace.clone());
        let mut row = JobRow {
            name: self.name.clone(),
            stage: self.stage.clone(),
            status: JobStatus::Failed,
            duration: None,
            instance: String::new(),
            slot: None,
            message: String::new(),
        };
        let mut artifacts = Vec::new();
        match self.acquire(&key, &mut trace).await {
            Err(no) => {
                row.status = no.status;
                row.message = no.message;
            }
            Ok(acq) => {
                let started = Instant::now();
                row.instance = acq.instance_id.clone();
                row.slot = Some(acq.slot);
                trace.message(&format!(
                    "Running on instance {} slot {}",
                    acq.instance_id, acq.slot
                ));
                let mut inputs = Vec::new();
                for p in &self.inputs {
                    match tokio::fs::read(p).await {
                        Ok(b) => inputs.push(b),
                        Err(e) => {
                            trace.message(&format!("WARNING: artifacts {}: {e}", p.display()))
                        }
                    }
                }
                let (outcome, tar) = job::execute(
                    &self.runner,
                    &acq,
                    &self.payload,
                    inputs,
                    &mut trace,
                    &self.cancel,
                    None,
                )
                .await;
                self.runner.release(&key);
                // One file per archive: each is unpacked by its own `tar -x`.
                for (n, collected) in tar.into_iter().enumerate() {
                    let path = self.artifacts_out.with_extension(format!("{n}.tar"));
                    match tokio::fs::write(&path, collected.tar).await {
                        Ok(()) => artifacts.push(path),
                        Err(e) => trace.message(&format!("WARNING: storing artifacts: {e}")),
                    }
                }
                row.duration = Some(started.elapsed());
                row.status = job::status_of(&outcome);
                if let JobOutcome::Failed { message, .. } = &outcome {
                    row.message = message.clone();
                }
                trace.message(&job::closing_line(&outcome));
            }
        }
        trace.finish();
        Finished {
            index: self.index,
            row,
            artifacts,
        }
    }

    /// Reserve (waiting for capacity: a local pipeline has no queue to leave jobs in) and
    /// acquire a slot.
    async fn acquire(&self, key: &str, trace: &mut Trace) -> Result<Acquisition, job::NoSlot> {
        let level = job::isolation_of(&self.runner, &self.payload, trace)?;
        let request = job::request_of(&self.payload, trace)?;
        job::reserve(&self.runner, key, &request, level, trace, &self.cancel).await?;
        job::acquire(&self.runner, key, trace, &self.cancel).await
    }
}

/// Prints job output line by line, each line prefixed with its job's name.
struct Printer {
    tx: mpsc::UnboundedSender<(Arc<str>, Option<Vec<u8>>)>,
    task: tokio::task::JoinHandle<()>,
}

impl Printer {
    fn start() -> Printer {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Arc<str>, Option<Vec<u8>>)>();
        let task = tokio::spawn(async move {
            let mut partial: HashMap<Arc<str>, Vec<u8>> = HashMap::new();
            while let Some((name, chunk)) = rx.recv().await {
                let buf = partial.entry(name.clone()).or_default();
                let mut out = Vec::new();
                match chunk {
                    Some(bytes) => {
                        buf.extend_from_slice(&bytes);
                        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = buf.drain(..=pos).collect();
                            out.extend_from_slice(format!("[{name}] ").as_bytes());
                            out.extend_from_slice(&line);
                        }
                    }
                    None if !buf.is_empty() => {
                        out.extend_from_slice(format!("[{name}] ").as_bytes());
                        out.append(buf);
                        out.push(b'\n');
                    }
                    None => {}
                }
                if !out.is_empty() {
                    let mut stdout = std::io::stdout().lock();
                    let _ = stdout.write_all(&out);
                    let _ = stdout.flush();
                }
            }
        });
        Printer { tx, task }
    }

    /// A sink for one job's trace.
    fn sender(&self, name: &str) -> mpsc::UnboundedSender<Vec<u8>> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let out = self.tx.clone();
        let name: Arc<str> = Arc::from(name);
        // Ends when the job drops its trace; then flushes the job's last partial line.
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                let _ = out.send((name.clone(), Some(chunk)));
            }
            let _ = out.send((name, None));
        });
        tx
    }

    async fn stop(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

fn print_summary(rows: &[JobRow]) {
    let header = ["JOB", "STAGE", "STATUS", "DURATION", "INSTANCE", "SLOT"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.stage.clone(),
                r.status.to_string(),
                r.duration
                    .map(|d| format!("{:.1}s", d.as_secs_f64()))
                    .unwrap_or_else(|| "-".into()),
                if r.instance.is_empty() {
                    "-".into()
                } else {
                    r.instance.clone()
                },
                r.slot.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: Vec<&str>| {
        cols.iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!();
    println!("{}", line(header.to_vec()));
    for row in &cells {
        println!("{}", line(row.iter().map(String::as_str).collect()));
    }
}
