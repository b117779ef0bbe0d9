//! The local pipeline source (`slipway exec`): a `.gitlab-ci.yml` run through the whole path —
//! taskscaler → plugin process → SSH → executor — in GitLab's order (stages, `needs`,
//! `when`, retries, resource groups), each job through the one [`crate::lifecycle`]. Its progress goes
//! out as [`Event`]s for the command line to show; nothing here prints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use slipway_executor::Tarball;
use slipway_job::Variable;
use slipway_job::{JobOutcome, Trace};
use slipway_pipeline::{JobStatus, PipelineRun, PipelineStatus, Retry, RunError, Selection};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::lifecycle::{self, DataAt, Inputs, JobSource, Life, SourcesAt, Start, Stops};
use crate::runner::{Runner, StartError, StartOptions};
use slipway_config::RunnerConfig;

pub mod cache;
pub mod read;

pub use read::{Read, ReadError, read};

/// Why a local pipeline could not be run to its end.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The jobs asked for do not fit the pipeline, or the run went out of order.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The directory for the run's state and artifacts cannot be created.
    #[error("creating the run directory")]
    RunDir(#[source] std::io::Error),
    /// The artifacts directory inside it cannot be created.
    #[error(transparent)]
    ArtifactsDir(std::io::Error),
    /// The runner did not start.
    #[error(transparent)]
    Runner(#[from] StartError),
    /// A stop came while the runner was starting.
    #[error("interrupted while starting the runner")]
    Interrupted,
    /// A job's task failed (a panic).
    #[error("job task failed: {cause}")]
    JobTask {
        /// Why.
        cause: tokio::task::JoinError,
    },
}

/// What `slipway exec` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// Pipeline file.
    pub file: PathBuf,
    /// Run only these jobs (all when empty).
    pub jobs: Vec<String>,
    /// With `jobs`: also run what they need.
    pub needs: bool,
    /// Manual jobs to play.
    pub manual: Vec<String>,
    /// `KEY=VALUE` variables given on the command line (over the variables file's), masked.
    pub variables: Vec<String>,
    /// `KEY=VALUE` variables given on the command line, shown in output (`--plain-variable`).
    pub plain_variables: Vec<String>,
    /// The variables file (default: `.slipway-variables.yml` beside the pipeline, if present).
    pub variables_file: Option<PathBuf>,
    /// Where `include:project` finds other projects' checkouts.
    pub include_root: Option<PathBuf>,
    /// Ignore (with a warning) keys the reader does not support.
    pub allow_unsupported: bool,
    /// Jobs at once.
    pub concurrent: u32,
    /// Where to look for plugins first.
    pub plugin_dir: Option<PathBuf>,
    /// Handshake timeout for the plugin process (default: the host's).
    pub plugin_start_timeout: Option<Duration>,
    /// Jobs' `cache:` is neither restored nor saved (`--no-cache`).
    pub no_cache: bool,
    /// The job helper, which moves the distributed cache where the jobs run.
    pub helper: Option<slipway_executor::Helper>,
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
    /// Coverage found by the job's `coverage` regex.
    pub coverage: Option<String>,
    /// Tries it took (more than one after `retry`).
    pub attempts: u32,
    /// The script's exit code, when it failed with one.
    pub exit_code: Option<i32>,
    /// What its tries cost, when the runner has prices.
    pub cost: Option<slipway_cost::Money>,
}

impl JobRow {
    /// A row with no run yet.
    pub fn new(name: &str, stage: &str, status: JobStatus) -> Self {
        JobRow {
            name: name.to_string(),
            stage: stage.to_string(),
            status,
            duration: None,
            instance: String::new(),
            slot: None,
            message: String::new(),
            coverage: None,
            attempts: 0,
            exit_code: None,
            cost: None,
        }
    }
}

struct Finished {
    index: usize,
    row: JobRow,
    artifacts: Vec<PathBuf>,
    /// Variables of its dotenv report.
    dotenv: Vec<Variable>,
}

/// What a local pipeline's run tells whoever shows it, in order.
#[derive(Debug, Clone)]
pub enum Event {
    /// A job started: its output follows.
    Start {
        /// Job name.
        name: Arc<str>,
        /// Its stage.
        stage: String,
    },
    /// A chunk of a job's masked output.
    Output(Arc<str>, Vec<u8>),
    /// A job's output ended.
    End(Arc<str>),
    /// A message for the user, apart from any job's output.
    Notice(String),
}

/// How a run ended: every selected job's row, and the pipeline's status.
#[derive(Debug)]
pub struct Outcome {
    /// One row per selected job, in file order.
    pub rows: Vec<JobRow>,
    /// The pipeline's status (what GitLab would show).
    pub status: PipelineStatus,
    /// What the run's instances cost and what its jobs used (the runner on instances).
    pub costs: Option<slipway_status::model::RunnerCosts>,
}

impl Outcome {
    /// Whether the run counts as passed: succeeded (with warnings or not), or blocked on a
    /// manual job.
    pub fn passed(&self) -> bool {
        matches!(
            self.status,
            PipelineStatus::Success | PipelineStatus::SuccessWithWarnings | PipelineStatus::Blocked
        )
    }
}

/// Run `read`'s pipeline on `runner_cfg`, telling `events` as it goes. `stop` cancels it
/// (SIGTERM, Ctrl-C): running jobs are canceled, nothing is left behind.
pub async fn run(
    runner_cfg: &RunnerConfig,
    read: &Read,
    opts: &ExecOptions,
    events: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) -> Result<Outcome, LocalError> {
    let pipeline = &read.pipeline;
    let mut plan = PipelineRun::with_selection(
        pipeline,
        &Selection {
            jobs: opts.jobs.clone(),
            needs: opts.needs,
            manual: opts.manual.clone(),
        },
    )?;

    let persisted;
    let runner_cfg = match persisted_cache(runner_cfg, opts, &events).await {
        Some(cfg) => {
            persisted = cfg;
            &persisted
        }
        None => runner_cfg,
    };

    // Everything this run creates lives under one directory, removed at the end.
    // Owner-only: tempfile's directories are 0777 less the umask, readable by every user.
    let run_dir = tempfile::Builder::new()
        .prefix("slipway-exec-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map_err(LocalError::RunDir)?;
    let artifacts_dir = run_dir.path().join("artifacts");
    tokio::fs::create_dir_all(&artifacts_dir)
        .await
        .map_err(LocalError::ArtifactsDir)?;

    let start = StartOptions {
        plugin_dir: opts.plugin_dir.clone(),
        helper: opts.helper.clone(),
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
        work_dir: None,
        metrics: None,
        job_metrics: None,
        concurrent: opts.concurrent,
    };
    let runner = tokio::select! {
        r = Runner::start(runner_cfg, &start) => {
            let r = Arc::new(r?);
            r.start_cost_sync();
            r
        }
        _ = stop.cancelled() => return Err(LocalError::Interrupted),
    };

    let result = drive(
        &runner,
        read,
        &mut plan,
        opts,
        &artifacts_dir,
        &events,
        &stop,
    )
    .await;
    runner.shutdown().await;
    let costs = runner
        .costs
        .as_ref()
        .and_then(|c| c.status(std::time::Instant::now()));
    // Removing a directory tree is blocking I/O: keep it off the runtime's threads.
    match tokio::task::spawn_blocking(move || run_dir.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("removing the run directory: {e}"),
        Err(e) => tracing::warn!("removing the run directory: {e}"),
    }
    Ok(Outcome {
        rows: result?,
        status: plan.status(),
        costs,
    })
}

/// `runner_cfg` with its cache kept between runs of the project ([`cache`]), when it has no
/// `cache_dir` of its own and runs jobs on this machine; `None` to leave it as it is. With
/// `--no-cache` jobs skip their cache, and the user is told either way.
async fn persisted_cache(
    runner_cfg: &RunnerConfig,
    opts: &ExecOptions,
    events: &mpsc::UnboundedSender<Event>,
) -> Option<RunnerConfig> {
    let notice = |text: String| {
        let _ = events.send(Event::Notice(text));
    };
    if opts.no_cache {
        notice("Cache: not used (--no-cache): jobs neither restore nor save their cache:".into());
        return None;
    }
    if !cache::wants_persisted_cache(runner_cfg) {
        return None;
    }
    let project = match opts.file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let project = tokio::fs::canonicalize(&project).await.unwrap_or(project);
    let Some(dir) = cache::project_cache_dir(&project, &|k| std::env::var_os(k)) else {
        notice("warning: no HOME or XDG_CACHE_HOME: the cache lasts for this run only".into());
        return None;
    };
    // Private: the project's caches may hold what its jobs fetched with credentials.
    let made = tokio::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .await;
    if let Err(e) = made {
        notice(format!(
            "warning: creating the cache directory {}: {e}; the cache lasts for this run only",
            dir.display()
        ));
        return None;
    }
    let Some(cfg) = cache::with_cache_dir(runner_cfg, &dir) else {
        notice(format!(
            "warning: the cache directory {} cannot be mounted into containers (it has ':' or ','); the cache lasts for this run only",
            dir.display()
        ));
        return None;
    };
    notice(format!("Cache: {} (kept between runs)", dir.display()));
    Some(cfg)
}

/// A sink for one job's trace, and the task that forwards it to `events`: it ends when the
/// job drops its trace, giving the coverage its `coverage` regex found (the last match's
/// first group, else the whole match, as a number).
fn job_output(
    events: &mpsc::UnboundedSender<Event>,
    name: &str,
    stage: &str,
    coverage: Option<&str>,
) -> (
    mpsc::UnboundedSender<Vec<u8>>,
    tokio::task::JoinHandle<Option<String>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let out = events.clone();
    let name: Arc<str> = Arc::from(name);
    let _ = out.send(Event::Start {
        name: name.clone(),
        stage: stage.to_string(),
    });
    // Checked by the pipeline reader; a regex that does not build finds nothing.
    let regex = coverage.and_then(|c| regex::Regex::new(c).ok());
    let task = tokio::spawn(async move {
        let mut line = Vec::new();
        let mut found = None;
        while let Some(chunk) = rx.recv().await {
            if let Some(re) = &regex {
                for &b in &chunk {
                    if b == b'\n' {
                        found = read::coverage_in(re, &line).or(found);
                        line.clear();
                    } else if line.len() < 64 * 1024 {
                        line.push(b);
                    }
                }
            }
            let _ = out.send(Event::Output(name.clone(), chunk));
        }
        if let Some(re) = &regex {
            found = read::coverage_in(re, &line).or(found);
        }
        // Flushes the job's last partial line.
        let _ = out.send(Event::End(name));
        found
    });
    (tx, task)
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    runner: &Arc<Runner>,
    read: &Read,
    plan: &mut PipelineRun,
    opts: &ExecOptions,
    artifacts_dir: &Path,
    events: &mpsc::UnboundedSender<Event>,
    stop: &CancellationToken,
) -> Result<Vec<JobRow>, LocalError> {
    let pipeline = &read.pipeline;
    let mut rows: Vec<Option<JobRow>> = vec![None; pipeline.jobs.len()];
    let mut artifacts: HashMap<usize, Vec<PathBuf>> = HashMap::new();
    let mut dotenv: HashMap<usize, Vec<Variable>> = HashMap::new();
    let mut tasks: JoinSet<Finished> = JoinSet::new();
    let mut running = 0usize;
    let limit = opts.concurrent.max(1) as usize;
    let pipeline_id = u64::from(std::process::id());
    // Jobs stop on a signal, or when the run itself fails: never abandoned mid-step.
    let jobs_stop = stop.child_token();
    let mut fatal: Option<LocalError> = None;
    // One lock per resource group: its jobs run one at a time, in the order they start.
    let mut groups: HashMap<String, Arc<tokio::sync::Mutex<()>>> = HashMap::new();
    let sources = Arc::new(read.sources.clone());

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
                let from = plan.artifact_sources(index);
                // dotenv variables of the jobs it gets artifacts from; the user's still win.
                let extra: Vec<Variable> = from
                    .iter()
                    .filter_map(|i| dotenv.get(i))
                    .flatten()
                    .filter(|v| !read.user_keys.contains(&v.key))
                    .cloned()
                    .collect();
                let mut payload = job.to_job_response(id, pipeline_id, &[]);
                if opts.no_cache {
                    payload.cache.clear();
                }
                read::add_dotenv(&mut payload, extra);
                let inputs: Vec<PathBuf> = from
                    .into_iter()
                    .filter_map(|i| artifacts.get(&i).cloned())
                    .flatten()
                    .collect();
                let (trace, coverage) =
                    job_output(events, &job.name, &job.stage, job.coverage.as_deref());
                let ctx = JobTask {
                    runner: runner.clone(),
                    index,
                    name: job.name.clone(),
                    stage: job.stage.clone(),
                    payload,
                    sources: sources.clone(),
                    inputs,
                    artifacts_out: artifacts_dir.join(format!("{id}.tar")),
                    dotenv_files: job.dotenv.clone(),
                    trace,
                    coverage,
                    cancel: jobs_stop.child_token(),
                    start_in: job.start_in,
                    retry: job.retry.clone(),
                    group: job
                        .resource_group
                        .as_ref()
                        .map(|g| (g.clone(), groups.entry(g.clone()).or_default().clone())),
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
                        fatal.get_or_insert(LocalError::JobTask { cause: e });
                        jobs_stop.cancel();
                        continue;
                    }
                };
                let (index, status, code) =
                    (finished.index, finished.row.status, finished.row.exit_code);
                if let Err(e) = plan.finish_with_exit_code(index, status, code) {
                    fatal.get_or_insert(e.into());
                    jobs_stop.cancel();
                }
                if !finished.artifacts.is_empty() {
                    artifacts.insert(index, finished.artifacts);
                }
                if !finished.dotenv.is_empty() {
                    dotenv.insert(index, finished.dotenv);
                }
                let mut row = finished.row;
                // The plan knows allow_failure: it turns a failure into "failed (allowed)".
                row.status = plan.job_status(index).unwrap_or(row.status);
                rows[index] = Some(row);
            }
            _ = stop.cancelled(), if !stop.is_cancelled() => {
                let _ = events.send(Event::Notice("Stopping: canceling running jobs".into()));
            }
        }
    }
    if jobs_stop.is_cancelled() {
        plan.cancel();
    }
    if let Some(e) = fatal {
        return Err(e);
    }
    Ok(pipeline
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            rows[i].take().unwrap_or_else(|| {
                JobRow::new(
                    &j.name,
                    &j.stage,
                    plan.job_status(i).unwrap_or(JobStatus::Skipped),
                )
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
    payload: slipway_job::JobResponse,
    /// The project's files, unpacked first into the job's directory.
    sources: Arc<Vec<u8>>,
    inputs: Vec<PathBuf>,
    artifacts_out: PathBuf,
    dotenv_files: Vec<String>,
    trace: mpsc::UnboundedSender<Vec<u8>>,
    coverage: tokio::task::JoinHandle<Option<String>>,
    cancel: CancellationToken,
    start_in: Option<Duration>,
    retry: Retry,
    group: Option<(String, Arc<tokio::sync::Mutex<()>>)>,
}

impl JobTask {
    async fn run(self) -> Finished {
        let mut trace = Trace::for_job(&self.payload, self.trace.clone());
        let mut row = JobRow::new(&self.name, &self.stage, JobStatus::Failed);
        let mut artifacts = Vec::new();
        let mut dotenv = Vec::new();
        if let Some(wait) = self.start_in {
            trace.message(&format!(
                "Waiting {} before starting (when: delayed)",
                humantime::format_duration(wait)
            ));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.cancel.cancelled() => {
                    row.status = JobStatus::Canceled;
                    return self.end(trace, row, artifacts, dotenv).await;
                }
            }
        }
        // Held for the whole job: one job of a resource group at a time.
        let _resource = match &self.group {
            None => None,
            Some((name, lock)) => {
                let guard = match lock.clone().try_lock_owned() {
                    Ok(g) => g,
                    Err(_) => {
                        trace.message(&format!("Waiting for resource: {name}"));
                        tokio::select! {
                            g = lock.clone().lock_owned() => g,
                            _ = self.cancel.cancelled() => {
                                row.status = JobStatus::Canceled;
                                return self.end(trace, row, artifacts, dotenv).await;
                            }
                        }
                    }
                };
                Some(guard)
            }
        };
        let tries = self.retry.max + 1;
        for attempt in 1..=tries {
            row.attempts = attempt;
            if attempt > 1 {
                trace.message(&format!("Retrying the job (try {attempt} of {tries})"));
            }
            let key = format!("{}-{}-{attempt}", self.name, self.payload.id);
            let outcome = self.attempt(&key, &mut trace, &mut row).await;
            artifacts.clear();
            dotenv.clear();
            if let Some((outcome, collected, job)) = outcome {
                self.store(&job, &collected, &mut trace, &mut artifacts, &mut dotenv)
                    .await;
                row.status = outcome.status().into();
                row.exit_code = None;
                if let JobOutcome::Failed {
                    message,
                    exit_code,
                    reason,
                } = &outcome
                {
                    row.message = message.clone();
                    row.exit_code = *exit_code;
                    trace.message(&lifecycle::closing_line(&outcome));
                    let again = attempt < tries
                        && row.status == JobStatus::Failed
                        && self.retry.applies(reason.as_str(), *exit_code);
                    if again {
                        continue;
                    }
                } else {
                    trace.message(&lifecycle::closing_line(&outcome));
                }
            }
            break;
        }
        self.end(trace, row, artifacts, dotenv).await
    }

    /// One try: a slot, the job, the slot released; its outcome, its artifacts and the job as
    /// its steps saw it. `None` when no slot could be had (the row says why).
    async fn attempt(
        &self,
        key: &str,
        trace: &mut Trace,
        row: &mut JobRow,
    ) -> Option<(
        JobOutcome,
        Vec<slipway_executor::CollectedArtifacts>,
        slipway_job::JobResponse,
    )> {
        let life = Life {
            runner: &self.runner,
            key,
            source: self,
            stops: Stops {
                cancel: self.cancel.clone(),
                abort: None,
            },
            since: None,
        };
        // A local pipeline has no queue to leave jobs in: it waits for capacity.
        let ran = match life
            .run(&self.payload, Start::Admit { held: None }, trace)
            .await
        {
            Err(no) => {
                row.status = no.status.into();
                row.message = no.message;
                return None;
            }
            Ok(ran) => ran,
        };
        // Nothing to report before the slot goes back: a local pipeline has no other record.
        drop(ran.slot);
        if let Some(c) = ran.cost {
            match &mut row.cost {
                Some(total) => total.amount += c.cost.amount,
                None => row.cost = Some(c.cost),
            }
        }
        if let Some((instance, slot)) = ran.placement {
            row.instance = instance;
            row.slot = Some(slot);
            row.duration = Some(ran.duration);
        }
        Some((ran.outcome, ran.collected, ran.job))
    }

    /// Keeps a try's artifacts (one file per archive, each unpacked by its own `tar -x`) and
    /// reads its dotenv report; `$VARIABLE`s in the dotenv paths are expanded with the
    /// variables `job` ran with, as its artifact paths were (exclusions come resolved with
    /// the collected files).
    async fn store(
        &self,
        job: &slipway_job::JobResponse,
        collected: &[slipway_executor::CollectedArtifacts],
        trace: &mut Trace,
        artifacts: &mut Vec<PathBuf>,
        dotenv: &mut Vec<Variable>,
    ) {
        let expand =
            |paths: &[String]| -> Vec<String> { paths.iter().map(|p| job.expand(p)).collect() };
        let dotenv_files = expand(&self.dotenv_files);
        for (n, c) in collected.iter().enumerate() {
            let spec = self.payload.artifacts.get(c.spec);
            // A local run's artifacts are read whole (they are kept as files for its later
            // jobs); a GitLab job's are streamed.
            let tar = match c.tar.to_bytes() {
                Ok(t) => t,
                Err(e) => {
                    trace.message(&format!("WARNING: reading collected artifacts: {e}"));
                    continue;
                }
            };
            if spec.is_some_and(|s| s.artifact_type == "dotenv") {
                match read::dotenv_of(&tar, &dotenv_files) {
                    Ok(vars) => dotenv.extend(vars),
                    Err(e) => trace.message(&format!("WARNING: dotenv report: {e}")),
                }
                continue;
            }
            let tar = match read::without_excluded(&tar, &c.exclude) {
                Ok(t) => t,
                Err(e) => {
                    trace.message(&format!("WARNING: artifacts: {e}"));
                    continue;
                }
            };
            let path = self.artifacts_out.with_extension(format!("{n}.tar"));
            match tokio::fs::write(&path, tar).await {
                Ok(()) => artifacts.push(path),
                Err(e) => trace.message(&format!("WARNING: storing artifacts: {e}")),
            }
        }
    }

    async fn end(
        self,
        mut trace: Trace,
        mut row: JobRow,
        artifacts: Vec<PathBuf>,
        dotenv: Vec<Variable>,
    ) -> Finished {
        trace.finish();
        drop(trace);
        drop(self.trace);
        row.coverage = self.coverage.await.ok().flatten();
        Finished {
            index: self.index,
            row,
            artifacts,
            dotenv,
        }
    }
}

/// What a local pipeline adds to a job's life: the project's files and the artifacts of the
/// jobs it gets them from.
#[async_trait::async_trait]
impl JobSource for JobTask {
    async fn inputs(
        &self,
        _job: &slipway_job::JobResponse,
        _at: SourcesAt,
        _data: &DataAt,
        trace: &mut Trace,
        _cancel: &CancellationToken,
    ) -> Result<Inputs, JobOutcome> {
        let mut tars = vec![Tarball::from(self.sources.to_vec())];
        for p in &self.inputs {
            match tokio::fs::read(p).await {
                Ok(b) => tars.push(b.into()),
                Err(e) => trace.message(&format!("WARNING: artifacts {}: {e}", p.display())),
            }
        }
        // The project's files first; a restored cache goes after them.
        Ok(Inputs {
            tars,
            leading: 1,
            ..Inputs::default()
        })
    }
}
