//! GitLab's `custom` executor: user-supplied driver executables prepare an environment, run
//! each stage's script in it and clean it up, so existing custom-executor drivers work
//! unchanged.
//!
//! The protocol (GitLab Runner's `docs/executors/custom.md`):
//! - `config_exec` prints JSON on stdout (`builds_dir`, `cache_dir`, `builds_dir_is_shared`,
//!   `hostname`, `driver {name, version}`, `job_env`); its stderr goes to the trace.
//! - `prepare_exec` runs once; stdout and stderr go to the trace; a system failure is retried.
//! - `run_exec [run_args…] <script path> <stage name>` runs once per stage. Slipway runs the
//!   stages `prepare_script`, `get_sources` (creates a fresh project directory: Slipway does
//!   not check out sources yet), `step_script`, `after_script` and `cleanup_file_variables`.
//! - `cleanup_exec` always runs; its failure is only a warning. Its stdout goes to the runner's
//!   log at DEBUG and its stderr at WARN, masked.
//!
//! Every driver call gets the runner's environment, the job's variables and the predefined CI
//! variables prefixed with `CUSTOM_ENV_`, `JOB_RESPONSE_FILE` (the job payload as JSON),
//! `BUILD_FAILURE_EXIT_CODE`, `SYSTEM_FAILURE_EXIT_CODE`, `TMPDIR` (a per-job directory, also the
//! working directory) and `config_exec`'s `job_env`. Drivers run as process-group leaders; a
//! stage timeout, the job timeout or a cancel sends SIGTERM to the group, SIGKILL after
//! `graceful_kill_timeout`, and gives up on the process after `force_kill_timeout`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;
use slipway_jobs::model::{JobResponse, StepName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::job::{AFTER_SCRIPT_TIMEOUT, DEFAULT_JOB_TIMEOUT, RunResult, fmt_secs};
use crate::outcome::{FailureReason, JobOutcome};
use crate::script::{self, JobDirs};
use crate::trace::{Masker, Trace};

/// Exit code a driver uses to report that the job failed (GitLab's value).
pub const BUILD_FAILURE_EXIT_CODE: i32 = 1;
/// Exit code a driver uses to report that the system failed (GitLab's value).
pub const SYSTEM_FAILURE_EXIT_CODE: i32 = 2;
/// Attempts of `prepare_exec` when it reports a system failure, and of `config_exec` when it
/// prints invalid JSON.
pub const PREPARE_ATTEMPTS: u32 = 3;
/// Pause between those attempts.
pub const PREPARE_RETRY_DELAY: Duration = Duration::from_secs(3);

/// Default of `config_exec_timeout`, `prepare_exec_timeout` and `cleanup_exec_timeout`, seconds.
const DEFAULT_EXEC_TIMEOUT: i64 = 3600;
/// Default of `graceful_kill_timeout` and `force_kill_timeout`, seconds.
const DEFAULT_KILL_TIMEOUT: i64 = 600;
/// Bound for the `cleanup_file_variables` stage (it also runs after a cancel).
const CLEANUP_STAGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long output is still read after a driver exits (a background process it left may hold
/// its stdout open).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// Most bytes of `config_exec` stdout, and of each `cleanup_exec` stream, kept.
const CAPTURE_LIMIT: usize = 1 << 20;

/// The `[runners.custom]` section of `config.toml`, with GitLab Runner's defaults.
///
/// An empty `*_exec` means the stage is not run (`run_exec` is required). A timeout of zero or
/// less means the default, as in GitLab Runner.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct CustomConfig {
    /// Executable printing the job's dynamic configuration as JSON.
    pub config_exec: String,
    /// Arguments of `config_exec`, before the runner's.
    pub config_args: Vec<String>,
    /// Seconds `config_exec` may run.
    pub config_exec_timeout: i64,
    /// Executable preparing the environment.
    pub prepare_exec: String,
    /// Arguments of `prepare_exec`.
    pub prepare_args: Vec<String>,
    /// Seconds `prepare_exec` may run.
    pub prepare_exec_timeout: i64,
    /// Executable running each stage's script (required).
    pub run_exec: String,
    /// Arguments of `run_exec`, before the script path and stage name.
    pub run_args: Vec<String>,
    /// Executable cleaning the environment up.
    pub cleanup_exec: String,
    /// Arguments of `cleanup_exec`.
    pub cleanup_args: Vec<String>,
    /// Seconds `cleanup_exec` may run.
    pub cleanup_exec_timeout: i64,
    /// Seconds between SIGTERM and SIGKILL when a driver is stopped.
    pub graceful_kill_timeout: i64,
    /// Seconds to wait after SIGKILL before giving up on a driver process.
    pub force_kill_timeout: i64,
}

impl Default for CustomConfig {
    fn default() -> Self {
        CustomConfig {
            config_exec: String::new(),
            config_args: Vec::new(),
            config_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            prepare_exec: String::new(),
            prepare_args: Vec::new(),
            prepare_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            run_exec: String::new(),
            run_args: Vec::new(),
            cleanup_exec: String::new(),
            cleanup_args: Vec::new(),
            cleanup_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            graceful_kill_timeout: DEFAULT_KILL_TIMEOUT,
            force_kill_timeout: DEFAULT_KILL_TIMEOUT,
        }
    }
}

fn secs_or(value: i64, default: i64) -> Duration {
    let secs = if value > 0 { value } else { default };
    Duration::from_secs(secs.unsigned_abs())
}

impl CustomConfig {
    /// Check what GitLab Runner checks before a job: `run_exec` is set.
    pub fn validate(&self) -> Result<(), CustomError> {
        if self.run_exec.trim().is_empty() {
            return Err(CustomError::MissingRunExec);
        }
        Ok(())
    }

    /// Time `config_exec` may take.
    pub fn config_timeout(&self) -> Duration {
        secs_or(self.config_exec_timeout, DEFAULT_EXEC_TIMEOUT)
    }

    /// Time `prepare_exec` may take.
    pub fn prepare_timeout(&self) -> Duration {
        secs_or(self.prepare_exec_timeout, DEFAULT_EXEC_TIMEOUT)
    }

    /// Time `cleanup_exec` may take.
    pub fn cleanup_timeout(&self) -> Duration {
        secs_or(self.cleanup_exec_timeout, DEFAULT_EXEC_TIMEOUT)
    }

    /// Time between SIGTERM and SIGKILL.
    pub fn graceful_kill(&self) -> Duration {
        secs_or(self.graceful_kill_timeout, DEFAULT_KILL_TIMEOUT)
    }

    /// Time after SIGKILL before a driver process is abandoned.
    pub fn force_kill(&self) -> Duration {
        secs_or(self.force_kill_timeout, DEFAULT_KILL_TIMEOUT)
    }
}

/// Why the custom executor cannot run.
#[derive(Debug, thiserror::Error)]
pub enum CustomError {
    /// `[runners.custom] run_exec` is empty.
    #[error("custom executor is missing run_exec")]
    MissingRunExec,
    /// Neither `[[runners]] builds_dir` nor `config_exec` names a builds directory.
    #[error("custom executor needs builds_dir (in [[runners]] or from config_exec)")]
    MissingBuildsDir,
    /// The job's temporary directory or files could not be written.
    #[error("cannot write the job's temporary files: {0}")]
    TempFiles(#[from] std::io::Error),
    /// `config_exec` printed something that is not its JSON object.
    #[error("error while parsing JSON output of config_exec: {0}")]
    ConfigJson(#[from] serde_json::Error),
}

/// `driver` in `config_exec`'s output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct DriverInfo {
    /// The driver's name, shown in the trace.
    pub name: Option<String>,
    /// The driver's version, shown after the name.
    pub version: Option<String>,
}

/// What `config_exec` prints; unknown keys are ignored.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ConfigExecOutput {
    /// Builds root replacing `[[runners]] builds_dir`.
    pub builds_dir: Option<String>,
    /// Cache root replacing `[[runners]] cache_dir` (Slipway keeps no local cache yet).
    pub cache_dir: Option<String>,
    /// Whether concurrent jobs share the builds directory.
    pub builds_dir_is_shared: Option<bool>,
    /// Hostname of the job's environment.
    pub hostname: Option<String>,
    /// The driver's name and version.
    pub driver: Option<DriverInfo>,
    /// Variables for the later driver calls (not for the job); may hold credentials.
    pub job_env: Option<BTreeMap<String, String>>,
}

impl fmt::Debug for ConfigExecOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // job_env often carries credentials: keys only.
        let keys: Vec<&String> = self.job_env.iter().flat_map(|m| m.keys()).collect();
        f.debug_struct("ConfigExecOutput")
            .field("builds_dir", &self.builds_dir)
            .field("cache_dir", &self.cache_dir)
            .field("builds_dir_is_shared", &self.builds_dir_is_shared)
            .field("hostname", &self.hostname)
            .field("driver", &self.driver)
            .field("job_env_keys", &keys)
            .finish()
    }
}

impl ConfigExecOutput {
    /// Parse `config_exec`'s stdout; empty output means no settings.
    pub fn parse(stdout: &[u8]) -> Result<Self, CustomError> {
        if stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(ConfigExecOutput::default());
        }
        Ok(serde_json::from_slice(stdout)?)
    }

    /// GitLab's startup line: `Using Custom executor with driver NAME VERSION...`.
    pub fn banner(&self) -> String {
        const USAGE: &str = "Using Custom executor";
        match self.driver.as_ref().map(|d| (&d.name, &d.version)) {
            Some((Some(name), Some(version))) => format!("{USAGE} with driver {name} {version}..."),
            Some((Some(name), None)) => format!("{USAGE} with driver {name}..."),
            _ => format!("{USAGE}..."),
        }
    }
}

/// GitLab's custom executor.
#[derive(Debug, Clone)]
pub struct CustomExecutor {
    /// The `[runners.custom]` settings.
    pub config: CustomConfig,
    /// `[[runners]] builds_dir` (should be absolute); `config_exec` may replace it.
    pub builds_dir: String,
}

/// What a custom-executor job needs besides its payload.
#[derive(Debug)]
pub struct CustomContext<'a> {
    /// The job's slot (`CI_CONCURRENT_ID`, and part of the project directory).
    pub slot: u32,
    /// Output sink (masks secrets).
    pub trace: &'a mut Trace,
    /// Cancelled to stop the job.
    pub cancel: CancellationToken,
}

impl CustomExecutor {
    /// A custom executor; fails when `run_exec` is missing.
    pub fn new(config: CustomConfig, builds_dir: impl Into<String>) -> Result<Self, CustomError> {
        config.validate()?;
        Ok(CustomExecutor {
            config,
            builds_dir: builds_dir.into(),
        })
    }

    /// Run a job: `config_exec`, `prepare_exec`, the `run_exec` stages, then `cleanup_exec`
    /// whatever happened.
    pub async fn run(&self, job: &JobResponse, ctx: CustomContext<'_>) -> RunResult {
        let CustomContext {
            slot,
            trace,
            cancel,
        } = ctx;
        let timeout = match job.runner_info.timeout {
            0 => DEFAULT_JOB_TIMEOUT,
            s => Duration::from_secs(s),
        };
        trace.message("Preparing the \"custom\" executor");
        if let Err(e) = self.config.validate() {
            trace.message(&format!("ERROR: Preparation failed: {e}"));
            return failed(FailureReason::RunnerSystemFailure, None, e.to_string());
        }
        let files = match JobFiles::create(job).await {
            Ok(f) => f,
            Err(e) => {
                trace.message(&format!("ERROR: Preparation failed: {e}"));
                return failed(FailureReason::RunnerSystemFailure, None, e.to_string());
            }
        };
        let mut session = Session {
            exec: self,
            job,
            slot,
            files: &files,
            cancel,
            job_deadline: Instant::now() + timeout,
            timeout,
            builds_dir: self.builds_dir.clone(),
            shared: false,
            job_env: BTreeMap::new(),
            scripts: 0,
        };
        let outcome = session.run(trace).await;
        session.cleanup(trace).await;
        files.remove().await;
        RunResult {
            outcome,
            artifacts: Vec::new(),
        }
    }
}

fn failed(reason: FailureReason, code: Option<i32>, msg: String) -> RunResult {
    RunResult {
        outcome: JobOutcome::failed(reason, code, msg),
        artifacts: Vec::new(),
    }
}

/// The job's temporary directory on the runner: `JOB_RESPONSE_FILE`, stage scripts, `TMPDIR`.
struct JobFiles {
    dir: tempfile::TempDir,
    response: PathBuf,
}

impl JobFiles {
    async fn create(job: &JobResponse) -> Result<Self, CustomError> {
        let json = serde_json::to_vec(job).map_err(std::io::Error::other)?;
        let dir = tokio::task::spawn_blocking(|| {
            tempfile::Builder::new()
                .prefix("slipway-custom-executor")
                .tempdir()
        })
        .await
        .map_err(std::io::Error::other)??;
        let response = dir.path().join("response.json");
        write_private(&response, &json, 0o600).await?;
        Ok(JobFiles { dir, response })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    async fn remove(self) {
        let dir = self.dir;
        let res = tokio::task::spawn_blocking(move || dir.close()).await;
        if !matches!(res, Ok(Ok(()))) {
            tracing::warn!("could not remove the custom executor's temporary directory");
        }
    }
}

async fn write_private(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .await?;
    f.write_all(body).await?;
    f.flush().await
}

/// How a stage ended.
#[derive(Debug)]
enum StageEnd {
    Ok,
    /// The driver exited `BUILD_FAILURE_EXIT_CODE`; the script's code when known.
    BuildFailure(Option<i32>),
    SystemFailure(String),
    Canceled,
    JobTimeout,
    StageTimeout(Duration),
}

impl StageEnd {
    /// A short description for a warning line.
    fn describe(&self) -> String {
        match self {
            StageEnd::Ok => "ok".into(),
            StageEnd::BuildFailure(Some(c)) => format!("exit code {c}"),
            StageEnd::BuildFailure(None) => format!("exit status {BUILD_FAILURE_EXIT_CODE}"),
            StageEnd::SystemFailure(msg) => msg.clone(),
            StageEnd::Canceled => "canceled".into(),
            StageEnd::JobTimeout => "the job timed out".into(),
            StageEnd::StageTimeout(t) => format!("timed out after {}", fmt_secs(*t)),
        }
    }
}

/// One job's walk through the driver's stages.
struct Session<'a> {
    exec: &'a CustomExecutor,
    job: &'a JobResponse,
    slot: u32,
    files: &'a JobFiles,
    cancel: CancellationToken,
    job_deadline: Instant,
    timeout: Duration,
    builds_dir: String,
    shared: bool,
    job_env: BTreeMap<String, String>,
    scripts: u32,
}

impl Session<'_> {
    fn cfg(&self) -> &CustomConfig {
        &self.exec.config
    }

    fn dirs(&self) -> JobDirs {
        JobDirs {
            builds_dir: self.builds_dir.clone(),
            slot: self.slot,
            job_id: self.job.id,
        }
    }

    /// The environment of a driver call (on top of the runner's own).
    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("TMPDIR".into(), self.files.path().display().to_string()),
            (
                "BUILD_FAILURE_EXIT_CODE".into(),
                BUILD_FAILURE_EXIT_CODE.to_string(),
            ),
            (
                "SYSTEM_FAILURE_EXIT_CODE".into(),
                SYSTEM_FAILURE_EXIT_CODE.to_string(),
            ),
            (
                "JOB_RESPONSE_FILE".into(),
                self.files.response.display().to_string(),
            ),
        ];
        env.extend(
            custom_env(self.job, &self.builds_dir, self.slot, self.shared)
                .into_iter()
                .map(|(k, v)| (format!("CUSTOM_ENV_{k}"), v)),
        );
        env.extend(
            self.job_env
                .iter()
                .filter(|(k, _)| env_name_ok(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        env
    }

    fn driver(&self, program: &str, args: Vec<String>) -> Driver {
        Driver {
            program: program.to_string(),
            args,
            env: self.env(),
            dir: self.files.path().to_path_buf(),
            graceful: self.cfg().graceful_kill(),
            force: self.cfg().force_kill(),
        }
    }

    fn limits(&self, stage_timeout: Option<Duration>) -> Limits {
        Limits {
            job_deadline: Some(self.job_deadline),
            stage_deadline: stage_timeout.map(|t| Instant::now() + t),
            cancel: Some(self.cancel.clone()),
        }
    }

    /// Everything up to `cleanup_exec`.
    async fn run(&mut self, trace: &mut Trace) -> JobOutcome {
        for key in script::unexportable_variables(self.job) {
            trace.message(&format!(
                "WARNING: variable {key:?} is not a valid shell name; it is not passed to the job"
            ));
        }
        if let Err(outcome) = self.config(trace).await {
            return outcome;
        }
        if self.builds_dir.trim().is_empty() {
            let e = CustomError::MissingBuildsDir;
            trace.message(&format!("ERROR: Preparation failed: {e}"));
            return JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
        }
        if let Err(outcome) = self.prepare(trace).await {
            return outcome;
        }
        self.stages(trace).await
    }

    async fn config(&mut self, trace: &mut Trace) -> Result<(), JobOutcome> {
        let cfg = self.cfg().clone();
        if cfg.config_exec.is_empty() {
            trace.message(&ConfigExecOutput::default().banner());
            return Ok(());
        }
        let mut attempt = 1;
        let out = loop {
            let driver = self.driver(&cfg.config_exec, cfg.config_args.clone());
            let mut stdout = Vec::new();
            let end = driver
                .run(
                    self.limits(Some(cfg.config_timeout())),
                    &mut |stream, bytes| match stream {
                        Stream::Stdout => capture(&mut stdout, bytes),
                        Stream::Stderr => trace.write(bytes),
                    },
                )
                .await;
            match stage_end(end, cfg.config_timeout()) {
                StageEnd::Ok => {}
                other => return Err(self.preparation_failed(trace, "config_exec", other)),
            }
            match ConfigExecOutput::parse(&stdout) {
                Ok(out) => break out,
                Err(e) if attempt < PREPARE_ATTEMPTS => {
                    trace.message(&format!(
                        "WARNING: Preparation failed: {e}\nWill be retried in {} ...",
                        fmt_secs(PREPARE_RETRY_DELAY)
                    ));
                    attempt += 1;
                    self.pause(trace).await?;
                }
                Err(e) => {
                    return Err(self.preparation_failed(
                        trace,
                        "config_exec",
                        StageEnd::SystemFailure(e.to_string()),
                    ));
                }
            }
        };
        if let Some(dir) = out.builds_dir.as_ref().filter(|d| !d.is_empty()) {
            self.builds_dir = dir.clone();
        }
        if let Some(shared) = out.builds_dir_is_shared {
            self.shared = shared;
        }
        self.job_env = out.job_env.clone().unwrap_or_default();
        trace.message(&out.banner());
        Ok(())
    }

    async fn prepare(&mut self, trace: &mut Trace) -> Result<(), JobOutcome> {
        let cfg = self.cfg().clone();
        if cfg.prepare_exec.is_empty() {
            return Ok(());
        }
        trace.message("Preparing environment");
        let mut attempt = 1;
        loop {
            let driver = self.driver(&cfg.prepare_exec, cfg.prepare_args.clone());
            let end = driver
                .run(self.limits(Some(cfg.prepare_timeout())), &mut |_, b| {
                    trace.write(b)
                })
                .await;
            match stage_end(end, cfg.prepare_timeout()) {
                StageEnd::Ok => return Ok(()),
                StageEnd::SystemFailure(msg)
                    if attempt < PREPARE_ATTEMPTS && msg.starts_with(SYSTEM_FAILURE_MSG) =>
                {
                    trace.message(&format!(
                        "WARNING: Preparation failed: {msg}\nWill be retried in {} ...",
                        fmt_secs(PREPARE_RETRY_DELAY)
                    ));
                    attempt += 1;
                    self.pause(trace).await?;
                }
                other => return Err(self.preparation_failed(trace, "prepare_exec", other)),
            }
        }
    }

    /// Wait between attempts, unless the job is canceled or out of time.
    async fn pause(&self, trace: &mut Trace) -> Result<(), JobOutcome> {
        tokio::select! {
            _ = tokio::time::sleep(PREPARE_RETRY_DELAY) => Ok(()),
            _ = tokio::time::sleep_until(self.job_deadline) => {
                Err(self.end_outcome(trace, StageEnd::JobTimeout, "prepare"))
            }
            _ = self.cancel.cancelled() => Err(self.end_outcome(trace, StageEnd::Canceled, "prepare")),
        }
    }

    fn preparation_failed(&self, trace: &mut Trace, what: &str, end: StageEnd) -> JobOutcome {
        match end {
            StageEnd::Canceled | StageEnd::JobTimeout => self.end_outcome(trace, end, what),
            StageEnd::StageTimeout(t) => {
                let msg = format!("{what} timed out after {}", fmt_secs(t));
                trace.message(&format!("ERROR: Preparation failed: {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::BuildFailure(_) => {
                let msg = format!("{what} exited with the build failure exit code");
                trace.message(&format!("ERROR: Preparation failed: {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::SystemFailure(msg) => {
                let msg = format!("{what}: {msg}");
                trace.message(&format!("ERROR: Preparation failed: {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::Ok => JobOutcome::Success,
        }
    }

    /// The outcome of a stage that did not succeed, with its trace line.
    fn end_outcome(&self, trace: &mut Trace, end: StageEnd, stage: &str) -> JobOutcome {
        match end {
            StageEnd::Ok => JobOutcome::Success,
            StageEnd::BuildFailure(code) => {
                let msg = match code {
                    Some(c) => format!("exit code {c}"),
                    None => format!("exit status {BUILD_FAILURE_EXIT_CODE}"),
                };
                trace.message(&format!("ERROR: Job failed: {msg}"));
                JobOutcome::failed(
                    FailureReason::ScriptFailure,
                    code,
                    format!("script failed: {msg}"),
                )
            }
            StageEnd::SystemFailure(msg) => {
                let msg = format!("{stage}: {msg}");
                trace.message(&format!("ERROR: Job failed (system failure): {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::Canceled => {
                trace.message("ERROR: job canceled");
                JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled")
            }
            StageEnd::JobTimeout => {
                let msg = format!("job execution timeout: exceeded {}", fmt_secs(self.timeout));
                trace.message(&format!("ERROR: {msg}"));
                JobOutcome::failed(FailureReason::JobExecutionTimeout, None, msg)
            }
            StageEnd::StageTimeout(t) => {
                let msg = format!("{stage} timed out after {}", fmt_secs(t));
                trace.message(&format!("ERROR: Job failed (system failure): {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
        }
    }

    /// The `run_exec` stages.
    async fn stages(&mut self, trace: &mut Trace) -> JobOutcome {
        let dirs = self.dirs();
        let job = self.job;
        let lines = |name: StepName| -> Vec<String> {
            job.steps
                .iter()
                .filter(|s| s.name == name)
                .flat_map(|s| s.script.iter().cloned())
                .collect()
        };

        let mut end = self
            .stage(
                trace,
                "prepare_script",
                &script::announce_host_script(),
                None,
            )
            .await;
        if matches!(end, StageEnd::Ok) {
            end = self
                .stage(
                    trace,
                    "get_sources",
                    &script::prepare_script(&dirs, false),
                    None,
                )
                .await;
        }
        if matches!(end, StageEnd::Ok) {
            trace.message("Executing \"step_script\" stage of the job script");
            let body =
                script::step_script(job, &dirs, "step_script", &lines(StepName::Script), false);
            end = self.stage(trace, "step_script", &body, None).await;
        }
        let outcome = self.end_outcome(trace, end, "run_exec");

        let after = lines(StepName::AfterScript);
        if !after.is_empty() && self.cancel.is_cancelled() {
            trace.message("Skipping after_script: the job was canceled");
        } else if !after.is_empty() {
            trace.message("Running after_script");
            let body = script::step_script(job, &dirs, "after_script", &after, false);
            // after_script has its own time, also after the job's ran out (as in GitLab).
            let limits = Limits {
                job_deadline: None,
                stage_deadline: Some(Instant::now() + AFTER_SCRIPT_TIMEOUT),
                cancel: Some(self.cancel.clone()),
            };
            match self.stage_with(trace, "after_script", &body, limits).await {
                StageEnd::Ok | StageEnd::Canceled => {}
                StageEnd::StageTimeout(_) | StageEnd::JobTimeout => {
                    trace.message("WARNING: after_script timed out");
                }
                StageEnd::BuildFailure(code) => trace.message(&format!(
                    "WARNING: after_script failed: exit code {}",
                    code.unwrap_or(BUILD_FAILURE_EXIT_CODE)
                )),
                StageEnd::SystemFailure(msg) => {
                    trace.message(&format!("WARNING: after_script failed: {msg}"));
                }
            }
        }

        // Always, also after a cancel: file variables hold secrets.
        let limits = Limits {
            job_deadline: None,
            stage_deadline: Some(Instant::now() + CLEANUP_STAGE_TIMEOUT),
            cancel: None,
        };
        let body = script::file_variables_cleanup_script(&dirs);
        match self
            .stage_with(trace, "cleanup_file_variables", &body, limits)
            .await
        {
            StageEnd::Ok => {}
            other => trace.message(&format!(
                "WARNING: cleanup_file_variables failed: {}",
                other.describe()
            )),
        }
        outcome
    }

    async fn stage(
        &mut self,
        trace: &mut Trace,
        stage: &str,
        body: &str,
        timeout: Option<Duration>,
    ) -> StageEnd {
        let limits = self.limits(timeout);
        self.stage_with(trace, stage, body, limits).await
    }

    /// Write `body` to a script file and call `run_exec <file> <stage>`.
    async fn stage_with(
        &mut self,
        trace: &mut Trace,
        stage: &str,
        body: &str,
        limits: Limits,
    ) -> StageEnd {
        self.scripts += 1;
        let dir = self.files.path().join(format!("script{}", self.scripts));
        let file = dir.join("script.sh");
        let status_file = dir.join("exit_status");
        let text = script::record_exit_status(body, &status_file.to_string_lossy());
        let written = async {
            tokio::fs::create_dir(&dir).await?;
            write_private(&file, text.as_bytes(), 0o700).await
        }
        .await;
        if let Err(e) = written {
            return StageEnd::SystemFailure(format!("cannot write the {stage} script: {e}"));
        }
        let cfg = self.cfg();
        let mut args = cfg.run_args.clone();
        args.push(file.display().to_string());
        args.push(stage.to_string());
        let driver = self.driver(&cfg.run_exec, args);
        let timeout = limits
            .stage_deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        let end = driver.run(limits, &mut |_, b| trace.write(b)).await;
        match stage_end(end, timeout) {
            StageEnd::BuildFailure(_) => {
                let code = tokio::fs::read_to_string(&status_file)
                    .await
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                    .filter(|c| *c != 0);
                StageEnd::BuildFailure(code)
            }
            other => other,
        }
    }

    /// `cleanup_exec`: always, with its own timeout; a failure is a warning.
    async fn cleanup(&self, trace: &mut Trace) {
        let cfg = self.cfg();
        if cfg.cleanup_exec.is_empty() {
            return;
        }
        let driver = self.driver(&cfg.cleanup_exec, cfg.cleanup_args.clone());
        let limits = Limits {
            job_deadline: None,
            stage_deadline: Some(Instant::now() + cfg.cleanup_timeout()),
            cancel: None,
        };
        let mut out = Vec::new();
        let mut err = Vec::new();
        let end = driver
            .run(limits, &mut |stream, b| match stream {
                Stream::Stdout => capture(&mut out, b),
                Stream::Stderr => capture(&mut err, b),
            })
            .await;
        let secrets = self.job.masked_values();
        let mask = |bytes: &[u8]| {
            let mut m = Masker::new(secrets.iter());
            let mut v = m.push(bytes);
            v.extend(m.finish());
            String::from_utf8_lossy(&v).into_owned()
        };
        if !out.is_empty() {
            tracing::debug!(job = self.job.id, stdout = %mask(&out), "cleanup_exec output");
        }
        if !err.is_empty() {
            tracing::warn!(job = self.job.id, stderr = %mask(&err), "cleanup_exec output");
        }
        let end = stage_end(end, cfg.cleanup_timeout());
        if !matches!(end, StageEnd::Ok) {
            trace.message(&format!(
                "WARNING: Cleanup script failed: {}",
                end.describe()
            ));
        }
    }
}

const SYSTEM_FAILURE_MSG: &str = "the driver reported a system failure";

fn capture(buf: &mut Vec<u8>, bytes: &[u8]) {
    let room = CAPTURE_LIMIT.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// A driver call's result in the protocol's terms.
fn stage_end(end: DriverEnd, stage_timeout: Duration) -> StageEnd {
    match end {
        DriverEnd::SpawnFailed(msg) => StageEnd::SystemFailure(msg),
        DriverEnd::Stopped(Stop::Canceled) => StageEnd::Canceled,
        DriverEnd::Stopped(Stop::JobTimeout) => StageEnd::JobTimeout,
        DriverEnd::Stopped(Stop::StageTimeout) => StageEnd::StageTimeout(stage_timeout),
        DriverEnd::Exited(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            match (status.code(), status.signal()) {
                (Some(0), _) => StageEnd::Ok,
                (Some(BUILD_FAILURE_EXIT_CODE), _) => StageEnd::BuildFailure(None),
                (Some(SYSTEM_FAILURE_EXIT_CODE), _) => StageEnd::SystemFailure(format!(
                    "{SYSTEM_FAILURE_MSG} (exit code {SYSTEM_FAILURE_EXIT_CODE})"
                )),
                (Some(code), _) => StageEnd::SystemFailure(format!(
                    "unknown custom executor executable exit code {code}"
                )),
                (None, Some(sig)) => {
                    StageEnd::SystemFailure(format!("the driver was killed by signal {sig}"))
                }
                (None, None) => StageEnd::SystemFailure("the driver ended oddly".into()),
            }
        }
    }
}

/// The variables a driver sees with the `CUSTOM_ENV_` prefix: the job's, then the predefined
/// ones the runner computes.
pub fn custom_env(
    job: &JobResponse,
    builds_dir: &str,
    slot: u32,
    shared: bool,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    if job.variable("CI_JOB_ID").is_none() {
        env.push(("CI_JOB_ID".into(), job.id.to_string()));
    }
    env.extend(
        job.variables
            .iter()
            .filter(|v| env_name_ok(&v.key) && !v.value.contains('\0'))
            .map(|v| (v.key.clone(), v.value.clone())),
    );
    let slot_dir = format!("{}/slot-{slot}", builds_dir.trim_end_matches('/'));
    let project_dir = format!("{slot_dir}/job-{}", job.id);
    env.push(("CI_BUILDS_DIR".into(), slot_dir));
    env.push(("CI_PROJECT_DIR".into(), project_dir));
    env.push(("CI_CONCURRENT_ID".into(), slot.to_string()));
    env.push(("CI_CONCURRENT_PROJECT_ID".into(), slot.to_string()));
    env.push(("CI_SERVER".into(), "yes".into()));
    let kind = if shared {
        "CI_SHARED_ENVIRONMENT"
    } else {
        "CI_DISPOSABLE_ENVIRONMENT"
    };
    env.push((kind.into(), "true".into()));
    let image = job
        .image
        .as_ref()
        .map(|i| i.name.clone())
        .unwrap_or_default();
    env.push(("CI_JOB_IMAGE".into(), image));
    if !job.services.is_empty() {
        let services: Vec<serde_json::Value> = job
            .services
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "alias": s.alias,
                    "entrypoint": if s.entrypoint.is_empty() { None } else { Some(&s.entrypoint) },
                    "command": if s.command.is_empty() { None } else { Some(&s.command) },
                })
            })
            .collect();
        env.push((
            "CI_JOB_SERVICES".into(),
            serde_json::Value::Array(services).to_string(),
        ));
    }
    env
}

/// A name the environment can carry.
fn env_name_ok(key: &str) -> bool {
    !key.is_empty() && !key.contains('=') && !key.contains('\0')
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Why a driver was stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Canceled,
    JobTimeout,
    StageTimeout,
}

/// How a driver process ended.
#[derive(Debug)]
enum DriverEnd {
    SpawnFailed(String),
    Exited(std::process::ExitStatus),
    /// Stopped by signals (or abandoned when it would not die).
    Stopped(Stop),
}

/// When a driver call must stop.
#[derive(Debug, Clone)]
struct Limits {
    job_deadline: Option<Instant>,
    stage_deadline: Option<Instant>,
    cancel: Option<CancellationToken>,
}

/// One driver call.
#[derive(Debug)]
struct Driver {
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    dir: PathBuf,
    graceful: Duration,
    force: Duration,
}

enum Phase {
    Running,
    Terminating(Instant),
    Killing(Instant),
}

impl Driver {
    /// Run the driver in its own process group, streaming its output to `out`, and stop the
    /// group (SIGTERM, grace, SIGKILL) on a deadline or cancel.
    async fn run(&self, limits: Limits, out: &mut (dyn FnMut(Stream, &[u8]) + Send)) -> DriverEnd {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return DriverEnd::SpawnFailed(format!("cannot start {}: {e}", self.program)),
        };
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let signal = |sig: Signal| {
            if let Some(pg) = pgid {
                // The group may be gone already.
                let _ = killpg(pg, sig);
            }
        };
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let mut obuf = vec![0u8; 16 * 1024];
        let mut ebuf = vec![0u8; 16 * 1024];
        let mut phase = Phase::Running;
        let mut stop = None;
        let mut status = None;
        let timer = |phase: &Phase| match phase {
            Phase::Running => match (limits.job_deadline, limits.stage_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            Phase::Terminating(t) | Phase::Killing(t) => Some(*t),
        };
        while status.is_none() {
            let wake = timer(&phase);
            let running = matches!(phase, Phase::Running);
            tokio::select! {
                n = read_some(&mut stdout, &mut obuf) => emit(out, Stream::Stdout, &obuf, n),
                n = read_some(&mut stderr, &mut ebuf) => emit(out, Stream::Stderr, &ebuf, n),
                st = child.wait() => match st {
                    Ok(st) => status = Some(st),
                    Err(e) => {
                        tracing::warn!(program = %self.program, "waiting for the driver: {e}");
                        break;
                    }
                },
                _ = cancelled(limits.cancel.as_ref()), if running => {
                    stop = Some(Stop::Canceled);
                    signal(Signal::SIGTERM);
                    phase = Phase::Terminating(Instant::now() + self.graceful);
                }
                _ = sleep_until(wake) => match phase {
                    Phase::Running => {
                        let job_over = limits.job_deadline.is_some_and(|d| d <= Instant::now());
                        stop = Some(if job_over { Stop::JobTimeout } else { Stop::StageTimeout });
                        signal(Signal::SIGTERM);
                        phase = Phase::Terminating(Instant::now() + self.graceful);
                    }
                    Phase::Terminating(_) => {
                        signal(Signal::SIGKILL);
                        phase = Phase::Killing(Instant::now() + self.force);
                    }
                    Phase::Killing(_) => {
                        tracing::warn!(program = %self.program, "driver did not die; abandoning it");
                        break;
                    }
                },
            }
        }
        if stop.is_some() && status.is_some() {
            // What the driver left behind in its group goes too.
            signal(Signal::SIGKILL);
        }
        // Output still in the pipes; a process the driver left running may hold them open.
        let drain_until = Instant::now() + OUTPUT_DRAIN;
        while stdout.is_some() || stderr.is_some() {
            tokio::select! {
                n = read_some(&mut stdout, &mut obuf) => emit(out, Stream::Stdout, &obuf, n),
                n = read_some(&mut stderr, &mut ebuf) => emit(out, Stream::Stderr, &ebuf, n),
                _ = tokio::time::sleep_until(drain_until) => break,
            }
        }
        match (stop, status) {
            (Some(stop), _) => DriverEnd::Stopped(stop),
            (None, Some(st)) => DriverEnd::Exited(st),
            (None, None) => DriverEnd::SpawnFailed(format!("lost track of {}", self.program)),
        }
    }
}

/// Read a chunk: `Some(n)`, or `None` once at end of stream (or error), when the reader is
/// dropped; afterwards this never completes.
async fn read_some<R: AsyncRead + Unpin>(reader: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match reader.as_mut() {
        Some(r) => match r.read(buf).await {
            Ok(n) if n > 0 => Some(n),
            _ => {
                *reader = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

/// Send a chunk read by [`read_some`] to `out`.
fn emit(out: &mut (dyn FnMut(Stream, &[u8]) + Send), stream: Stream, buf: &[u8], n: Option<usize>) {
    if let Some(n) = n {
        out(stream, &buf[..n]);
    }
}

async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_follow_gitlab() {
        let c: CustomConfig = toml::from_str("run_exec = \"/bin/run\"").unwrap();
        assert_eq!(c.run_exec, "/bin/run");
        assert_eq!(c.config_timeout(), Duration::from_secs(3600));
        assert_eq!(c.prepare_timeout(), Duration::from_secs(3600));
        assert_eq!(c.cleanup_timeout(), Duration::from_secs(3600));
        assert_eq!(c.graceful_kill(), Duration::from_secs(600));
        assert_eq!(c.force_kill(), Duration::from_secs(600));
        assert!(c.config_exec.is_empty() && c.config_args.is_empty());
        assert_eq!(
            c,
            CustomConfig {
                run_exec: "/bin/run".into(),
                ..CustomConfig::default()
            }
        );
        c.validate().unwrap();
    }

    #[test]
    fn config_reads_every_key() {
        let c: CustomConfig = toml::from_str(
            r#"
            config_exec = "/c"
            config_args = ["a", "b"]
            config_exec_timeout = 200
            prepare_exec = "/p"
            prepare_args = ["p1"]
            prepare_exec_timeout = 201
            run_exec = "/r"
            run_args = ["r1"]
            cleanup_exec = "/x"
            cleanup_args = ["x1"]
            cleanup_exec_timeout = 202
            graceful_kill_timeout = 203
            force_kill_timeout = 204
            "#,
        )
        .unwrap();
        assert_eq!(c.config_args, ["a", "b"]);
        assert_eq!(c.prepare_exec, "/p");
        assert_eq!(c.run_args, ["r1"]);
        assert_eq!(c.cleanup_args, ["x1"]);
        assert_eq!(c.config_timeout(), Duration::from_secs(200));
        assert_eq!(c.prepare_timeout(), Duration::from_secs(201));
        assert_eq!(c.cleanup_timeout(), Duration::from_secs(202));
        assert_eq!(c.graceful_kill(), Duration::from_secs(203));
        assert_eq!(c.force_kill(), Duration::from_secs(204));
    }

    #[test]
    fn non_positive_timeouts_mean_the_default() {
        let c: CustomConfig =
            toml::from_str("run_exec = \"r\"\nprepare_exec_timeout = 0\nforce_kill_timeout = -5")
                .unwrap();
        assert_eq!(c.prepare_timeout(), Duration::from_secs(3600));
        assert_eq!(c.force_kill(), Duration::from_secs(600));
    }

    #[test]
    fn run_exec_is_required() {
        let c: CustomConfig = toml::from_str("").unwrap();
        assert!(matches!(c.validate(), Err(CustomError::MissingRunExec)));
        assert!(CustomExecutor::new(c, "/builds").is_err());
    }

    #[test]
    fn config_exec_output_parses_and_ignores_unknown_keys() {
        let out = ConfigExecOutput::parse(
            br#"{"builds_dir": "/b", "cache_dir": "/c", "builds_dir_is_shared": true,
                "hostname": "h", "driver": {"name": "test driver", "version": "v0.0.1"},
                "job_env": {"CUSTOM_ENVIRONMENT": "example"}, "extra": 1}"#,
        )
        .unwrap();
        assert_eq!(out.builds_dir.as_deref(), Some("/b"));
        assert_eq!(out.builds_dir_is_shared, Some(true));
        assert_eq!(
            out.banner(),
            "Using Custom executor with driver test driver v0.0.1..."
        );
        assert_eq!(
            out.job_env
                .as_ref()
                .and_then(|m| m.get("CUSTOM_ENVIRONMENT")),
            Some(&"example".to_string())
        );
        // Debug shows job_env's keys, never its values.
        assert!(!format!("{out:?}").contains("example"));

        let empty = ConfigExecOutput::parse(b"  \n").unwrap();
        assert_eq!(empty.banner(), "Using Custom executor...");
        let name_only = ConfigExecOutput::parse(br#"{"driver": {"name": "d"}}"#).unwrap();
        assert_eq!(name_only.banner(), "Using Custom executor with driver d...");
        assert!(ConfigExecOutput::parse(b"not json").is_err());
    }

    #[test]
    fn custom_env_has_job_and_predefined_variables() {
        let job = JobResponse::from_json(
            r#"{"id": 42, "variables": [{"key": "GREETING", "value": "hi"},
                {"key": "BAD=NAME", "value": "x"}],
                "services": [{"name": "redis:latest"}]}"#,
        )
        .unwrap();
        let env = custom_env(&job, "/builds/", 3, false);
        let get = |k: &str| {
            env.iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("CI_JOB_ID"), Some("42"));
        assert_eq!(get("GREETING"), Some("hi"));
        assert_eq!(get("BAD=NAME"), None);
        assert_eq!(get("CI_BUILDS_DIR"), Some("/builds/slot-3"));
        assert_eq!(get("CI_PROJECT_DIR"), Some("/builds/slot-3/job-42"));
        assert_eq!(get("CI_CONCURRENT_ID"), Some("3"));
        assert_eq!(get("CI_DISPOSABLE_ENVIRONMENT"), Some("true"));
        assert_eq!(
            get("CI_JOB_SERVICES"),
            Some(r#"[{"alias":"","command":null,"entrypoint":null,"name":"redis:latest"}]"#)
        );
    }
}
