//! `slipway submit`, `slipway jobs` and `slipway cancel`: the embedded queue that
//! `slipway run` serves.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use slipway_manager::source::queue::blocking;
use slipway_manager::source::queue::spool::{Cancel, Entry, JobState, Queue};

/// What `slipway submit` takes.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// Pipeline file.
    #[arg(default_value = ".gitlab-ci.yml")]
    pub file: PathBuf,
    /// config.toml whose queue to use (its `state_dir`, else beside it, holds the queue).
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// Warn about pipeline keys this version does not support instead of failing.
    #[arg(long)]
    pub allow_unsupported: bool,
}

/// What `slipway cancel` takes.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// Job ids (as `slipway submit` and `slipway jobs` print them).
    #[arg(required = true)]
    pub ids: Vec<u64>,
    /// config.toml whose queue to use (its `state_dir`, else beside it, holds the queue).
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
}

/// What `slipway jobs` takes.
#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    /// config.toml whose queue to list (its `state_dir`, else beside it, holds the queue).
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
}

/// `slipway submit`.
pub async fn submit(args: SubmitArgs, queue: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let queue = open(queue, &args.config).await?;
    submit_jobs(&queue, &args.file, args.allow_unsupported).await?;
    Ok(ExitCode::SUCCESS)
}

/// `slipway cancel`.
pub async fn cancel(args: CancelArgs, queue: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let CancelArgs { ids, config } = args;
    let queue = open(queue, &config).await?;
    let mut code = ExitCode::SUCCESS;
    for id in ids {
        let q = queue.clone();
        // Through anyhow: `{:#}` shows the error's causes too.
        match blocking(move || q.cancel(id))
            .await
            .map_err(anyhow::Error::from)
        {
            Ok(Cancel::Canceled) => println!("{id}\tcanceled"),
            Ok(Cancel::Requested) => println!("{id}\tcancel requested"),
            Ok(Cancel::AlreadyDone(status)) => println!("{id}\talready {status}"),
            Err(e) => {
                eprintln!("error: job {id}: {e:#}");
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}

/// `slipway jobs`.
pub async fn jobs(args: JobsArgs, queue: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let queue = open(queue, &args.config).await?;
    let q = queue.clone();
    let entries = blocking(move || q.list()).await?;
    print_jobs(&entries);
    Ok(ExitCode::SUCCESS)
}

/// The queue named by `--queue`, else `queue` in config.toml's `state_dir`, else the one
/// beside config.toml (read for its `state_dir` alone: these commands need nothing else).
pub async fn open(flag: Option<PathBuf>, config: &Path) -> anyhow::Result<Queue> {
    let dir = match flag {
        Some(dir) => dir,
        None => {
            let setting = slipway_config::state_dir_setting(config).await?;
            slipway_config::queue_dir(config, setting.as_deref())
        }
    };
    open_dir(dir).await
}

/// The queue in `dir`.
pub async fn open_dir(dir: PathBuf) -> anyhow::Result<Queue> {
    let queue = blocking(move || Queue::open(dir))
        .await
        .context("opening the job queue")?;
    Ok(queue)
}

/// `slipway submit`: every job of the pipeline, flat, in file order.
async fn submit_jobs(queue: &Queue, file: &Path, allow_unsupported: bool) -> anyhow::Result<()> {
    let text = tokio::fs::read_to_string(file)
        .await
        .with_context(|| format!("cannot read {}", file.display()))?;
    let name = file.display().to_string();
    // Included files are read, and `include:remote` fetched, blocking: not on a worker.
    let pipeline = tokio::task::spawn_blocking(move || {
        slipway_pipeline::Pipeline::parse(
            &text,
            &name,
            slipway_pipeline::PipelineOptions {
                allow_unsupported,
                ..Default::default()
            },
        )
    })
    .await
    .context("reading the pipeline")??;
    for w in &pipeline.warnings {
        eprintln!("warning: {w}");
    }
    let n = pipeline.jobs.len() as u64;
    let q = queue.clone();
    let ids = blocking(move || q.next_ids(n)).await?;
    // The pipeline is named after its first job.
    let pipeline_id = ids.start;
    for (job, id) in pipeline.jobs.iter().zip(ids) {
        let payload = job.to_job_response(id, pipeline_id, &[]);
        let q = queue.clone();
        blocking(move || q.enqueue(&payload)).await?;
        println!("{id}\t{}", job.name);
    }
    Ok(())
}

fn print_jobs(entries: &[Entry]) {
    let header = ["ID", "NAME", "STAGE", "STATE", "INSTANCE", "SLOT", "REASON"];
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            let (instance, slot, reason) = match &e.state {
                JobState::Pending | JobState::Running(None) => (None, None, String::new()),
                JobState::Running(Some(s)) => {
                    (Some(s.instance_id.clone()), Some(s.slot), String::new())
                }
                JobState::Done(r) => {
                    let mut reason = r.failure_reason.clone().unwrap_or_default();
                    if !r.message.is_empty() {
                        let msg: String = r
                            .message
                            .lines()
                            .next()
                            .unwrap_or("")
                            .chars()
                            .take(80)
                            .collect();
                        reason = if reason.is_empty() {
                            msg
                        } else {
                            format!("{reason}: {msg}")
                        };
                    }
                    (r.instance_id.clone(), r.slot, reason)
                }
            };
            [
                e.id.to_string(),
                e.name.clone(),
                e.stage.clone(),
                e.state.label().to_string(),
                instance.unwrap_or_else(|| "-".into()),
                slot.map_or_else(|| "-".into(), |s| s.to_string()),
                reason,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
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
    println!("{}", line(header.to_vec()));
    for row in &rows {
        println!("{}", line(row.iter().map(String::as_str).collect()));
    }
}
