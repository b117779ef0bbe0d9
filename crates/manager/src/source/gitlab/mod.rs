//! `slipway run`'s GitLab job source: a `[[runners]]` entry with an `http(s)://` `url` and a
//! `token` takes its jobs from GitLab's runner API ([`slipway_gitlab`]).
//!
//! On start the token is verified (`POST /runners/verify`) with the manager's `system_id`, kept
//! in the state directory. Then `request_concurrency` loops per runner each, under the runner's
//! `limit` and the global `concurrent`:
//!
//! 1. reserve capacity under a provisional key — GitLab's rule: no capacity, no job request;
//! 2. ask GitLab for one job (`jobs/request`, `last_update` echoed); none → give the
//!    reservation back, wait `check_interval`, start over;
//! 3. a job → move the reservation to the key `gitlab-<job id>` (the name the state store
//!    records its acquisition under) with the job's own resource request, check its isolation
//!    level, acquire a slot, run it, stream its trace (`PATCH jobs/:id/trace`), and send the final
//!    state (`PUT jobs/:id`); release the slot.
//!
//! Before the job's steps its repository is fetched on the manager ([`git`]) and the
//! artifacts of its `dependencies` are downloaded; both are unpacked into its project directory.
//! After them its `artifacts:` are archived (zip or gzip, `exclude` and `untracked` applied)
//! and uploaded (`POST jobs/:id/artifacts`).
//!
//! GitLab's `Job-Status` cancels the job (`canceling`: cancel; `canceled`/`failed`/403: stop).
//! Every job is recorded in the runner's outbox ([`Outbox`]) when it starts; its final state
//! stays there until GitLab accepts it, retried with backoff in the background, and a
//! restarted manager sends what is left (a job that was running is reported
//! `runner_system_failure`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use slipway_gitlab::{
    Backoff, ClientConfig, FinishOutcome, GitlabClient, GitlabError, INTERRUPTED_MESSAGE, JobState,
    Outbox, Owed, PatchOutcome, PendingUpdate, Secret, SystemId, TlsFiles, TraceConfig,
    TraceSender, UpdateRetryPolicy, VersionInfo,
};
use slipway_job::{FailureReason, JobOutcome, JobResponse, Trace};
use slipway_status::Ending;
use slipway_taskscaler::{Error as TsError, Resources};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::lifecycle::{
    self, DataAt, Inputs, JobSource, Life, NoSlot, Ran, SourcesAt, Start, Stops,
};
use crate::limits::{Limits, Permits};
use crate::runner::Runner;
use crate::shutdown::Shutdown;
use git::GitSources;
use slipway_config::{Executor, FetchSources, RunnerConfig};

mod artifacts;
pub mod git;
mod inputs;

/// The directory name of a runner's GitLab state, unique per GitLab and runner: GitLab
/// Runner's key `URL|runner id` when the config has an id (it survives a token rotation), else
/// the token's short form in its place.
fn state_key(id: u64, token: &Secret, url: &str) -> String {
    let who = match id {
        0 => format!("t-{}", token.short()),
        id => id.to_string(),
    };
    slipway_taskscaler::store::runner_dir_name(&format!("{}|{who}", url.trim_end_matches('/')))
}

/// Where the manager's `system_id` lives in its state directory (`run` and `register` agree).
pub fn system_id_path(state_dir: &Path) -> PathBuf {
    state_dir.join("system_id")
}

/// Whether `cfg` takes its jobs from GitLab: an `http(s)://` `url` and a `token`.
pub fn serves_gitlab(cfg: &RunnerConfig) -> bool {
    let url = cfg.url.trim();
    (url.starts_with("http://") || url.starts_with("https://")) && !cfg.token.trim().is_empty()
}

/// The reservation (and acquisition) key of GitLab job `id`.
pub fn key_of(id: u64) -> String {
    format!("gitlab-{id}")
}

/// Settings of one runner's GitLab source.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// The manager's state directory: its `system_id` is there ([`system_id_path`]), and each
    /// runner keeps its outbox and git working copies in
    /// `gitlab/<dir>/` there, named from `URL|runner id` (or the short token).
    pub state_dir: PathBuf,
    /// GitLab Runner's well-known TLS files (`certs/` beside config.toml).
    pub certs_dir: PathBuf,
    /// Pause after a job request without a job (global `check_interval`).
    pub check_interval: Duration,
    /// The runner's `limit` within the manager's `concurrent`.
    pub limits: Limits,
}

/// An error that keeps a runner from serving GitLab.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The client cannot be built (bad URL).
    #[error("runner {runner:?}: {source}")]
    Client {
        /// Runner name.
        runner: String,
        /// Why.
        source: GitlabError,
    },
    /// The system id file cannot be read or written.
    #[error("runner {runner:?}: {source}")]
    SystemId {
        /// Runner name.
        runner: String,
        /// Why.
        source: GitlabError,
    },
    /// The runner's outbox cannot be opened or read.
    #[error("runner {runner:?}: {source}")]
    Outbox {
        /// Runner name.
        runner: String,
        /// Why.
        source: GitlabError,
    },
    /// GitLab refused the token or the verification failed for good.
    #[error("runner {runner:?} (token {short}…): verifying the token with GitLab failed: {source}")]
    Verify {
        /// Runner name.
        runner: String,
        /// The token's short form, safe to print.
        short: String,
        /// Why.
        source: GitlabError,
    },
}

/// What every job of one runner shares.
struct Source {
    runner: Arc<Runner>,
    client: GitlabClient,
    token: Secret,
    system_id: SystemId,
    output_limit_kib: u64,
    check_interval: Duration,
    backoff: Backoff,
    last_update: std::sync::Mutex<Option<String>>,
    failures: std::sync::atomic::AtomicU32,
    provisional: AtomicU64,
    outbox: Outbox,
    git: Arc<GitSources>,
    /// `CI_SERVER_TLS_CA_FILE` and friends, given to every job as file variables.
    tls_variables: Vec<slipway_job::Variable>,
}

/// GitLab Runner's TLS variables: the files of `tls` as file variables of every job, so its
/// own git, curl or LFS calls trust the same CA and present the same certificate.
async fn tls_variables(tls: &TlsFiles) -> Vec<slipway_job::Variable> {
    let mut out = Vec::new();
    for (key, file) in [
        ("CI_SERVER_TLS_CA_FILE", &tls.ca_file),
        ("CI_SERVER_TLS_CERT_FILE", &tls.cert_file),
        ("CI_SERVER_TLS_KEY_FILE", &tls.key_file),
    ] {
        let Some(path) = file else { continue };
        if let Ok(value) = tokio::fs::read_to_string(path).await {
            out.push(slipway_job::Variable {
                key: key.into(),
                value,
                file: true,
                ..Default::default()
            });
        }
    }
    out
}

/// The runner `info` this version sends for `executor` (job requests, updates, registration).
pub fn version_info(executor: &Executor) -> VersionInfo {
    VersionInfo::new(
        executor.as_str(),
        "bash",
        executor
            .gitlab_features()
            .into_iter()
            .map(|f| (f.to_string(), true)),
    )
}

/// Verify the runner's token, then serve its jobs until the shutdown drains it; returns once every job it
/// started has been reported (or shutdown cut the reporting short). Fails only at start: bad
/// URL, unusable system id file, token refused.
pub async fn serve(
    runner: Arc<Runner>,
    cfg: &RunnerConfig,
    opts: SourceOptions,
    shutdown: Shutdown,
) -> Result<(), SourceError> {
    let stop = shutdown.stop.clone();
    let name = runner.name.clone();
    let tls = cfg.tls_files(Some(&opts.certs_dir));
    let client = GitlabClient::new(
        ClientConfig::new(cfg.url.trim(), version_info(&cfg.executor)).with_tls(tls.clone()),
    )
    .map_err(|source| SourceError::Client {
        runner: name.clone(),
        source,
    })?;
    let token = Secret::new(cfg.token.trim());
    let backoff = Backoff::default();
    let own_dir = opts
        .state_dir
        .join("gitlab")
        .join(state_key(cfg.id, &token, cfg.url.trim()));
    // The runner's files (system id, outbox) may be out of reach for a while (a full disk at
    // start): retried, not given up, so the runner serves once they are back.
    let mut delay = STATE_RETRY_FIRST;
    let (system_id, outbox, owed) = loop {
        match open_state(&name, &opts.state_dir, &own_dir).await {
            Ok(state) => break state,
            Err(e) => {
                tracing::error!(runner = %name, "{e}; retrying in {delay:?}");
                tokio::select! {
                    _ = shutdown.drain.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(STATE_RETRY_MAX);
            }
        }
    };
    if !verify(&client, &token, &system_id, &name, backoff, &shutdown.drain).await? {
        return Ok(());
    }
    let scratch = runner.scratch_dir.clone();
    let source = Arc::new(Source {
        runner,
        client,
        token,
        system_id,
        output_limit_kib: cfg.output_limit,
        check_interval: opts.check_interval,
        backoff,
        last_update: std::sync::Mutex::new(None),
        failures: std::sync::atomic::AtomicU32::new(0),
        provisional: AtomicU64::new(0),
        outbox,
        git: Arc::new(
            GitSources::new(own_dir.join("git"), cfg.clone_url.clone(), tls.clone())
                .with_scratch(scratch)
                .with_manager_fallback(cfg.fetch_sources == FetchSources::InstanceOrManager),
        ),
        tls_variables: tls_variables(&tls).await,
    });
    let loops = cfg.request_concurrency.max(1);
    tracing::info!(runner = %name, url = %cfg.url.trim(), %source.system_id, request_concurrency = loops,
        "serving GitLab jobs");
    let mut set = JoinSet::new();
    // Final states a previous run could not deliver (and jobs it left running) go first.
    for Owed {
        update,
        interrupted,
    } in owed
    {
        tracing::warn!(runner = %name, job = update.job_id, state = ?update.state,
            failure_reason = ?update.failure_reason, "sending a final job state left by an earlier run");
        let (source, stop) = (source.clone(), stop.clone());
        set.spawn(async move {
            if interrupted {
                // Best effort, and never in the way of a shutdown.
                tokio::select! {
                    () = explain_interruption(&source, &update) => {}
                    _ = stop.cancelled() => {}
                }
            }
            if let Some(u) = redeliver(source, update, Duration::ZERO, stop).await {
                tracing::warn!(
                    job = u.job_id,
                    "final job state kept in the outbox for the next start"
                );
            }
        });
    }
    for _ in 0..loops {
        set.spawn(dispatch(
            source.clone(),
            opts.limits.clone(),
            shutdown.clone(),
        ));
    }
    while let Some(r) = set.join_next().await {
        if let Err(e) = r {
            tracing::error!(runner = %name, "GitLab dispatcher failed: {e}");
        }
    }
    Ok(())
}

/// First pause before the runner's state files are tried again.
const STATE_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest pause between those tries.
const STATE_RETRY_MAX: Duration = Duration::from_secs(30);

/// The runner's system id and outbox, and the final states an earlier run still owes GitLab.
async fn open_state(
    name: &str,
    state_dir: &Path,
    own_dir: &Path,
) -> Result<(SystemId, Outbox, Vec<Owed>), SourceError> {
    let system_id = SystemId::load_or_create(&system_id_path(state_dir))
        .await
        .map_err(|source| SourceError::SystemId {
            runner: name.to_string(),
            source,
        })?;
    let outbox = Outbox::open(own_dir.join("outbox"))
        .await
        .map_err(|source| SourceError::Outbox {
            runner: name.to_string(),
            source,
        })?;
    let owed = outbox
        .recover()
        .await
        .map_err(|source| SourceError::Outbox {
            runner: name.to_string(),
            source,
        })?;
    Ok((system_id, outbox, owed))
}

/// `POST /runners/verify`, retried while GitLab is unreachable. `Ok(false)` when stopped first.
/// A 404 means a GitLab without the endpoint (before 15.x, and `gitlab-runner-mock`): the token
/// is then checked by the first job request instead.
async fn verify(
    client: &GitlabClient,
    token: &Secret,
    system_id: &SystemId,
    name: &str,
    backoff: Backoff,
    stop: &CancellationToken,
) -> Result<bool, SourceError> {
    let mut attempt = 0;
    loop {
        let result = tokio::select! {
            r = client.verify(token, system_id) => r,
            _ = stop.cancelled() => return Ok(false),
        };
        match result {
            Ok(creds) => {
                tracing::info!(runner = %name, id = creds.id, token = %token.short(), %system_id,
                    "runner token verified");
                return Ok(true);
            }
            Err(GitlabError::Status { status: 404, .. }) => {
                tracing::warn!(runner = %name, token = %token.short(),
                    "GitLab has no /api/v4/runners/verify (older GitLab); the token is checked by job requests");
                return Ok(true);
            }
            Err(e) if e.is_retryable() => {
                let delay = e.retry_after().unwrap_or_else(|| backoff.delay(attempt));
                attempt += 1;
                tracing::warn!(runner = %name, error = %e, ?delay, "verifying the runner token, retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => return Ok(false),
                }
            }
            Err(source) => {
                return Err(SourceError::Verify {
                    runner: name.to_string(),
                    short: token.short(),
                    source,
                });
            }
        }
    }
}

/// Append why a job ended to its trace (best effort): it was running when the manager
/// stopped. The trace's length is unknown after a restart: GitLab's 416 tells it.
async fn explain_interruption(source: &Source, update: &PendingUpdate) {
    let line = bytes::Bytes::from(format!("\nERROR: Job failed: {INTERRUPTED_MESSAGE}\n"));
    let mut start = 0;
    for _ in 0..3 {
        match source
            .client
            .patch_trace(update.job_id, &update.token, start, line.clone(), false)
            .await
        {
            Ok(PatchOutcome::RangeMismatch { remote_len, .. }) if remote_len != start => {
                start = remote_len;
            }
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(runner = %source.runner.name, job = update.job_id, error = %e,
                    "cannot add the interruption to the job's trace");
                return;
            }
        }
    }
}

/// What a finished task leaves: a final state still to deliver, or nothing.
type Leftover = Option<PendingUpdate>;

/// One request loop: permits → reservation → one job request → a job task.
async fn dispatch(source: Arc<Source>, limits: Limits, shutdown: Shutdown) {
    let (drain, stop) = (&shutdown.drain, &shutdown.stop);
    let name = source.runner.name.clone();
    let mut tasks: JoinSet<Leftover> = JoinSet::new();
    loop {
        reap(&mut tasks, &source, stop);
        let permits = tokio::select! {
            biased;
            _ = drain.cancelled() => break,
            p = limits.acquire() => match p {
                Some(p) => p,
                None => break,
            },
        };
        let n = source.provisional.fetch_add(1, Ordering::Relaxed);
        let provisional = format!("gitlab-request-{n}");
        if !reserve_provisional(&source, &provisional, &mut tasks, &shutdown).await {
            break;
        }
        // A request already on its way is answered even while draining: a job GitLab hands
        // out is then run and reported, never dropped (only a stop abandons it).
        let job = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                source.runner.unreserve(&provisional);
                break;
            }
            j = source.request_one() => j,
        };
        match job {
            Some(job) => {
                tasks.spawn(run_job(
                    source.clone(),
                    job,
                    provisional,
                    permits,
                    stop.clone(),
                ));
            }
            None => {
                source.runner.unreserve(&provisional);
                drop(permits);
                let delay = source.next_delay();
                tokio::select! {
                    _ = drain.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        match r {
            // Draining, not stopped: the final state is retried until it is delivered or the
            // drain's time is up.
            Ok(Some(update)) if !stop.is_cancelled() => {
                let first = source.backoff.delay(0);
                tasks.spawn(redeliver(source.clone(), update, first, stop.clone()));
            }
            Ok(Some(update)) => tracing::warn!(runner = %name, job = update.job_id,
                state = ?update.state, "final job state not delivered before shutdown; kept in the outbox for the next start"),
            Ok(None) => {}
            Err(e) => tracing::error!(runner = %name, "GitLab job task failed: {e}"),
        }
    }
}

/// Reap finished tasks; an undelivered final state goes to a background retry task.
fn reap(tasks: &mut JoinSet<Leftover>, source: &Arc<Source>, stop: &CancellationToken) {
    while let Some(r) = tasks.try_join_next() {
        match r {
            Ok(Some(update)) => {
                let first = source.backoff.delay(0);
                tasks.spawn(redeliver(source.clone(), update, first, stop.clone()));
            }
            Ok(None) => {}
            Err(e) => tracing::error!(runner = %source.runner.name, "GitLab job task failed: {e}"),
        }
    }
}

/// Keep sending a final state GitLab has not accepted, with backoff (the first try after
/// `first`), until it is or `stop`; then it leaves the outbox.
async fn redeliver(
    source: Arc<Source>,
    update: PendingUpdate,
    first: Duration,
    stop: CancellationToken,
) -> Leftover {
    let mut update = update;
    let mut round = 0;
    loop {
        let delay = if round == 0 {
            first
        } else {
            source.backoff.delay(round - 1)
        };
        round += 1;
        tokio::select! {
            _ = stop.cancelled() => return Some(update),
            _ = tokio::time::sleep(delay) => {}
        }
        let id = update.job_id;
        match source.deliver(update, &stop).await {
            None => {
                tracing::info!(runner = %source.runner.name, job = id,
                    "final job state delivered after retries");
                return None;
            }
            Some(u) => update = u,
        }
    }
}

fn log_undelivered(runner: &str, update: &PendingUpdate, error: Option<&GitlabError>) {
    // `PendingUpdate`'s Debug masks the job token; errors never carry it.
    let error = error.map_or_else(
        || "GitLab kept answering 202".to_string(),
        |e| e.to_string(),
    );
    tracing::warn!(%runner, job = update.job_id, state = ?update.state, %error,
        "final job state not accepted by GitLab; retrying in the background");
}

/// Reserve a slot of the default shape before asking for a job; waits (asking GitLab nothing)
/// while the runner has no capacity. `false` when draining or stopped.
async fn reserve_provisional(
    source: &Arc<Source>,
    key: &str,
    tasks: &mut JoinSet<Leftover>,
    shutdown: &Shutdown,
) -> bool {
    let (drain, stop) = (&shutdown.drain, &shutdown.stop);
    let request = Resources::default();
    loop {
        match source.runner.reserve(key, &request) {
            Ok(()) => return true,
            Err(TsError::NoCapacity(_) | TsError::NoIdleCapacity(_)) => {
                tokio::select! {
                    biased;
                    _ = drain.cancelled() => return false,
                    r = source.runner.reserve_wait(key, &request) => match r {
                        Ok(()) => return true,
                        Err(TsError::ShuttingDown) => return false,
                        Err(e) => tracing::warn!(runner = %source.runner.name, error = %e,
                            "cannot reserve capacity for a job request"),
                    },
                }
            }
            Err(TsError::ShuttingDown) => return false,
            Err(e) => {
                tracing::warn!(runner = %source.runner.name, error = %e,
                    "cannot reserve capacity for a job request");
            }
        }
        reap(tasks, source, stop);
        tokio::select! {
            _ = drain.cancelled() => return false,
            _ = tokio::time::sleep(source.check_interval) => {}
        }
    }
}

impl Source {
    /// Sends a final state (retried per [`UpdateRetryPolicy`]); once GitLab has it, or no longer
    /// wants it, the job leaves the outbox. Hands the update back when it was not delivered.
    async fn deliver(&self, update: PendingUpdate, stop: &CancellationToken) -> Leftover {
        let id = update.job_id;
        match self
            .client
            .finish_job(update, UpdateRetryPolicy::default(), stop)
            .await
        {
            FinishOutcome::Accepted => {
                self.settle(id).await;
                None
            }
            FinishOutcome::JobGone { status } => {
                tracing::info!(runner = %self.runner.name, job = id, status,
                    "GitLab no longer has the job; its final state is not needed");
                self.settle(id).await;
                None
            }
            FinishOutcome::Undelivered { update, last_error } => {
                log_undelivered(&self.runner.name, &update, last_error.as_ref());
                Some(update)
            }
        }
    }

    /// Drops job `id` from the outbox: GitLab has its final state.
    async fn settle(&self, id: u64) {
        if let Err(e) = self.outbox.settled(id).await {
            tracing::warn!(runner = %self.runner.name, job = id, error = %e,
                "cannot remove a delivered job from the outbox; it may be reported again after a restart");
        }
    }

    /// One `jobs/request`: the job, or `None` (no job, or a failure, logged).
    async fn request_one(&self) -> Option<Box<JobResponse>> {
        let last = self.last_update.lock().ok().and_then(|g| g.clone());
        match self
            .client
            .request_job(&self.token, &self.system_id, last.as_deref())
            .await
        {
            Ok(outcome) => {
                self.failures.store(0, Ordering::Relaxed);
                if let Some(lu) = outcome.last_update
                    && let Ok(mut g) = self.last_update.lock()
                {
                    *g = Some(lu);
                }
                if let Some(job) = &outcome.job {
                    tracing::info!(runner = %self.runner.name, job = job.id, name = %job.job_info.name,
                        "received job");
                }
                outcome.job
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                match &e {
                    GitlabError::Forbidden { .. } => tracing::error!(runner = %self.runner.name,
                        token = %self.token.short(), error = %e,
                        "GitLab refuses the runner token; retrying with backoff"),
                    _ => {
                        tracing::warn!(runner = %self.runner.name, error = %e, "job request failed")
                    }
                }
                None
            }
        }
    }

    /// The pause before the next request: `check_interval`, or a backoff after failures.
    fn next_delay(&self) -> Duration {
        match self.failures.load(Ordering::Relaxed) {
            0 => self.check_interval,
            n => self.backoff.delay(n - 1).max(self.check_interval),
        }
    }
}

/// The final state for `outcome`: state, reason and exit code.
pub fn final_state(outcome: &JobOutcome) -> (JobState, Option<FailureReason>, Option<i32>) {
    match outcome {
        JobOutcome::Success => (JobState::Success, None, None),
        JobOutcome::Failed {
            reason, exit_code, ..
        } => (JobState::Failed, Some(*reason), *exit_code),
    }
}

/// The failure reason to send for `outcome` (`reason` as [`final_state`] maps it), given
/// whether the manager is stopping and whether GitLab canceled the job (learned at any time
/// before now: while GitLab was unreachable, only with the final trace).
fn reported_reason(
    outcome: &JobOutcome,
    reason: Option<FailureReason>,
    stopping: bool,
    gitlab_canceled: bool,
) -> Option<FailureReason> {
    use slipway_job::FailureReason as R;
    match outcome {
        // Canceled by the manager's shutdown, not by GitLab: the runner was interrupted.
        JobOutcome::Failed {
            reason: R::JobCanceled,
            ..
        } if stopping && !gitlab_canceled => Some(FailureReason::RunnerInterrupted),
        // The script's shell killed by a signal the runner did not send, in a job GitLab had
        // canceled: the cancel, not the script's failure.
        JobOutcome::Failed {
            reason: R::ScriptFailure,
            exit_code: None,
            ..
        } if gitlab_canceled => Some(FailureReason::JobCanceled),
        _ => reason,
    }
}

/// A job that did not get to run: its reason.
fn refused(no: &NoSlot, stop: &CancellationToken) -> JobOutcome {
    use slipway_job::FailureReason as R;
    let reason = match no.failure_reason {
        R::RunnerUnsupported | R::RunnerConfigurationError => R::RunnerConfigurationError,
        _ if no.status == slipway_job::JobStatus::Canceled && !stop.is_cancelled() => {
            R::JobCanceled
        }
        _ => R::RunnerSystemFailure,
    };
    JobOutcome::failed(reason, None, no.message.clone())
}

/// One job from GitLab: admit, reserve, acquire, run, report. Returns the final state when
/// GitLab did not accept it.
async fn run_job(
    source: Arc<Source>,
    job: Box<JobResponse>,
    provisional: String,
    _permits: Permits,
    stop: CancellationToken,
) -> Leftover {
    let runner = &source.runner;
    let mut job = job;
    // The runner's TLS variables come first: the job's own win.
    for v in source.tls_variables.iter().rev() {
        if job.variable(&v.key).is_none() {
            job.variables.insert(0, v.clone());
        }
    }
    let job_token = Secret::new(job.token.clone());
    if let Err(e) = source
        .outbox
        .started(job.id, &job_token, &job.features.failure_reasons)
        .await
    {
        tracing::error!(runner = %runner.name, job = job.id, error = %e,
            "cannot record the job in the outbox; a crash now would leave it unreported");
    }
    let board_key = key_of(job.id);
    runner.board.waiting(
        &board_key,
        lifecycle::board_info(runner, &job),
        job.masked_values().into_iter().map(String::from).collect(),
    );
    // A task that ends without recording its job (a panic) still takes it off the board.
    let _on_board = runner.board.guard(&board_key);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let trace = Trace::for_job(&job, tx);
    let sender = TraceSender::new(
        source.client.clone(),
        job.id,
        Secret::new(job.token.clone()),
        TraceConfig {
            output_limit_kib: source.output_limit_kib,
            debug_trace: job
                .variable("CI_DEBUG_TRACE")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            ..TraceConfig::default()
        },
    );
    // Cancels the job: manager shutdown, or GitLab (canceling / canceled / failed / 403).
    // `canceling` stops the steps (after_script still runs); `canceled`, `failed`, 403 and the
    // manager's shutdown stop everything.
    let job_abort = stop.child_token();
    let job_cancel = job_abort.child_token();
    let done = CancellationToken::new();
    let work = async {
        let mut trace = trace;
        let outcome = run_admitted(
            &source,
            &job,
            &provisional,
            &mut trace,
            &job_cancel,
            &job_abort,
            &stop,
        )
        .await;
        trace.message(&lifecycle::closing_line(&outcome));
        trace.finish();
        drop(trace);
        outcome
    };
    let forward = async {
        while let Some(chunk) = rx.recv().await {
            sender.append(&chunk);
        }
    };
    let (gitlab_cancel, gitlab_abort) = (sender.cancel_token(), sender.abort_token());
    let watch = async {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = gitlab_abort.cancelled() => {
                job_abort.cancel();
                return;
            }
            _ = gitlab_cancel.cancelled() => job_cancel.cancel(),
        }
        // Canceling: GitLab may still cancel outright while after_script runs.
        tokio::select! {
            _ = done.cancelled() => {}
            _ = gitlab_abort.cancelled() => job_abort.cancel(),
        }
    };
    let (outcome, (), ()) = tokio::join!(
        async {
            let (outcome, ()) = tokio::join!(work, forward);
            done.cancel();
            outcome
        },
        sender.run(&done),
        watch,
    );

    let output = match sender.finish(&stop).await {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!(runner = %runner.name, job = job.id, error = %e,
                "final trace upload failed; sending the job's state without it");
            None
        }
    };
    let (state, reason, exit_code) = final_state(&outcome);
    let reason = reported_reason(
        &outcome,
        reason,
        stop.is_cancelled(),
        gitlab_cancel.is_cancelled() || gitlab_abort.is_cancelled(),
    );
    // What GitLab is told is what the board shows: a job GitLab canceled is canceled, one the
    // manager's shutdown interrupted failed.
    let ending = match reason {
        Some(r) => Ending::of(&outcome).reported_as(r),
        None => Ending::of(&outcome),
    };
    runner.board.finished(&board_key, ending);
    let update = PendingUpdate::new(&job, state, reason, exit_code, output);
    tracing::info!(runner = %runner.name, job = job.id, ?state,
        failure_reason = ?update.failure_reason, ?exit_code, "job finished");
    let left = source.deliver(update, &stop).await;
    if let Some(update) = &left
        && let Err(e) = source.outbox.pending(update).await
    {
        tracing::error!(runner = %runner.name, job = job.id, error = %e,
            "cannot keep the final job state in the outbox; it is retried until shutdown only");
    }
    left
}

/// The job's life on its runner (the provisional reservation given back for its own), then
/// its artifacts uploaded once the slot is free.
async fn run_admitted(
    source: &Source,
    job: &JobResponse,
    provisional: &str,
    trace: &mut Trace,
    cancel: &CancellationToken,
    abort: &CancellationToken,
    stop: &CancellationToken,
) -> JobOutcome {
    let key = key_of(job.id);
    let life = Life {
        runner: &source.runner,
        key: &key,
        source,
        stops: Stops {
            cancel: cancel.clone(),
            abort: Some(abort.clone()),
        },
        // Getting the sources counts against the job's timeout, as in GitLab.
        since: Some(tokio::time::Instant::now()),
    };
    let start = Start::Admit {
        held: Some(provisional),
    };
    let ran = match life.run(job, start, trace).await {
        Ok(ran) => ran,
        Err(no) => return refused(&no, stop),
    };
    let Ran {
        job,
        mut outcome,
        collected,
        tracked,
        placement,
        slot,
        cost,
        ..
    } = ran;
    // The slot is free while the artifacts travel: uploading is the manager's work.
    drop(slot);
    // Inputs that failed before a slot was had leave nothing to upload.
    if placement.is_some() {
        artifacts::upload_artifacts(source, &job, collected, &tracked, &mut outcome, trace, stop)
            .await;
    }
    // Last before the closing line, where prices are set; nowhere but the trace.
    if let Some(cost) = &cost {
        trace.message(&crate::costs::trace_line(cost));
    }
    outcome
}

/// What GitLab adds to a job's life: its sources and its dependencies' artifacts.
#[async_trait::async_trait]
impl JobSource for Source {
    async fn inputs(
        &self,
        job: &JobResponse,
        at: SourcesAt,
        data: &DataAt,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Inputs, JobOutcome> {
        inputs::inputs_of(self, job, at, data, trace, cancel).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipway_job::FailureReason as R;

    #[test]
    fn gitlab_runners_need_an_http_url_and_a_token() {
        let mut cfg = RunnerConfig {
            url: "https://gitlab.example.com/".into(),
            token: "glrt-abc".into(),
            ..RunnerConfig::default()
        };
        assert!(serves_gitlab(&cfg));
        cfg.token.clear();
        assert!(!serves_gitlab(&cfg));
        cfg.token = "glrt-abc".into();
        cfg.url = "local".into();
        assert!(!serves_gitlab(&cfg));
    }

    #[test]
    fn a_signal_death_in_a_job_gitlab_canceled_is_the_cancel() {
        let killed = JobOutcome::failed(R::ScriptFailure, None, "killed by signal TERM");
        let script = Some(FailureReason::ScriptFailure);
        assert_eq!(
            reported_reason(&killed, script, false, true),
            Some(FailureReason::JobCanceled)
        );
        // Not canceled by GitLab: the script's own signal stays its failure.
        assert_eq!(reported_reason(&killed, script, false, false), script);
        // An exit code is the script's answer, whatever GitLab did meanwhile.
        let exited = JobOutcome::failed(R::ScriptFailure, Some(3), "exit code 3");
        assert_eq!(reported_reason(&exited, script, false, true), script);
        // The manager's shutdown cancels the job: the runner was interrupted.
        let canceled = JobOutcome::failed(R::JobCanceled, None, "job canceled");
        assert_eq!(
            reported_reason(&canceled, Some(FailureReason::JobCanceled), true, false),
            Some(FailureReason::RunnerInterrupted)
        );
        assert_eq!(
            reported_reason(&canceled, Some(FailureReason::JobCanceled), true, true),
            Some(FailureReason::JobCanceled)
        );
    }

    #[test]
    fn outcomes_map_to_gitlab_states() {
        assert_eq!(
            final_state(&JobOutcome::Success),
            (JobState::Success, None, None)
        );
        let (state, reason, code) =
            final_state(&JobOutcome::failed(R::ScriptFailure, Some(3), "x"));
        assert_eq!(state, JobState::Failed);
        assert_eq!(reason, Some(FailureReason::ScriptFailure));
        assert_eq!(code, Some(3));
    }
}
