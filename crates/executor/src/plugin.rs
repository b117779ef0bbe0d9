//! The `plugin` executor: a job's stages run where an executor plugin puts them (a sandbox, a
//! microVM, a jail), through `proto/executor/v1`.
//!
//! The runner keeps the job logic ([`JobRunner`]: stage scripts, artifacts and cache as tar
//! streams, timeouts, masking); the plugin's `Prepare` makes the job's environment, each stage's
//! script goes to its `Run`, and `Cleanup` always follows a `Prepare` that answered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use slipway_connector::{ExitStatus, Output};
use slipway_executor_plugin::{
    Chunk, CleanupJob, ExecutorHost, Failure, Instance, JobStatus, PrepareJob, Resources, Stage,
};
use slipway_job::JobResponse;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::executor::Executor;
use crate::host::{Host, HostError};
use crate::job::JobSlot;
use crate::job::{JobRunner, RunResult, fmt_secs};
use slipway_job::outcome::{FailureReason, JobOutcome};

/// How long a plugin may take to answer `Prepare` unless configured.
pub const DEFAULT_PREPARE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a plugin may take to answer `Cleanup` unless configured.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(300);

/// One job through an executor plugin.
#[derive(Debug)]
pub struct PluginExecutor {
    /// The running plugin.
    pub host: Arc<ExecutorHost>,
    /// How stages are scripted; `builds_dir` is replaced by the one `Prepare` names.
    pub runner: JobRunner,
    /// The isolation level asked of the plugin.
    pub isolation: String,
    /// The instance the job was placed on (plugins with instance placement).
    pub instance: Option<Instance>,
    /// The job's share of its instance.
    pub resources: Resources,
    /// Bound on `Prepare`.
    pub prepare_timeout: Duration,
    /// Bound on `Cleanup`.
    pub cleanup_timeout: Duration,
}

fn system_failure(slot: &mut JobSlot<'_>, msg: String) -> RunResult {
    slot.trace.message(&format!("ERROR: {msg}"));
    RunResult {
        outcome: JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg),
        artifacts: Vec::new(),
    }
}

#[async_trait]
impl Executor for PluginExecutor {
    fn name(&self) -> &'static str {
        "plugin"
    }

    async fn run(&self, job: &JobResponse, mut slot: JobSlot<'_>) -> RunResult {
        let caps = self.host.capabilities();
        slot.trace.message(&format!(
            "Using executor plugin {} {} ({}), isolation {}",
            caps.name,
            caps.version,
            self.host.name(),
            self.isolation
        ));
        let payload = match serde_json::to_vec(job) {
            Ok(p) => p,
            Err(e) => return system_failure(&mut slot, format!("encoding the job payload: {e}")),
        };
        let timeout = job.timeout();
        let mut resources = self.resources.clone();
        resources.slot = slot.slot;
        if let Some(cgroup) = &slot.cgroup {
            resources.cgroup.clone_from(cgroup);
        }
        let request = PrepareJob {
            job: payload,
            isolation: self.isolation.clone(),
            resources,
            instance: self.instance.clone(),
            timeout,
        };
        let plugin = self.host.name().to_owned();
        // Not raced against a cancel: a Prepare dropped half-way could leave what it made with
        // no state to clean it up by. It is bounded by prepare_timeout instead.
        let prepared =
            match tokio::time::timeout(self.prepare_timeout, self.host.prepare(request)).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    return system_failure(
                        &mut slot,
                        format!("executor plugin {plugin:?}: Prepare: {e}"),
                    );
                }
                Err(_) => {
                    return system_failure(
                        &mut slot,
                        format!(
                            "executor plugin {plugin:?} did not answer Prepare within {}",
                            fmt_secs(self.prepare_timeout)
                        ),
                    );
                }
            };
        for m in &prepared.messages {
            slot.trace.message(m);
        }
        let runner = JobRunner {
            builds_dir: prepared
                .builds_dir
                .clone()
                .unwrap_or_else(|| self.runner.builds_dir.clone()),
            // The runner's cache directory is not inside the plugin's environment.
            cache_dir: prepared.cache_dir.clone(),
            ..self.runner.clone()
        };
        let stages = StageHost {
            host: &self.host,
            state: prepared.state.clone(),
            instance: self.instance.clone(),
            stopping: Mutex::new(CancellationToken::new()),
        };
        let result = runner
            .run(
                job,
                &stages,
                JobSlot {
                    cgroup: None,
                    slot: slot.slot,
                    trace: &mut *slot.trace,
                    cancel: slot.cancel.clone(),
                    abort: slot.abort.clone(),
                    artifacts_in: std::mem::take(&mut slot.artifacts_in),
                    scratch_dir: slot.scratch_dir.clone(),
                    max_collected: slot.max_collected,
                    sources: slot.sources.take(),
                    data: slot.data.take(),
                },
            )
            .await;
        let status = match &result.outcome {
            JobOutcome::Success => JobStatus::Success,
            JobOutcome::Failed {
                reason: FailureReason::JobCanceled,
                ..
            } => JobStatus::Canceled,
            JobOutcome::Failed { .. } => JobStatus::Failed,
        };
        let cleanup = tokio::time::timeout(
            self.cleanup_timeout,
            self.host.cleanup(CleanupJob {
                state: prepared.state.clone(),
                instance: self.instance.clone(),
                status,
            }),
        )
        .await;
        match cleanup {
            Ok(Ok(messages)) => {
                for m in messages {
                    slot.trace.message(&m);
                }
            }
            Ok(Err(e)) => slot.trace.message(&format!(
                "WARNING: executor plugin {plugin:?}: Cleanup: {e}"
            )),
            Err(_) => slot.trace.message(&format!(
                "WARNING: executor plugin {plugin:?} did not answer Cleanup within {}",
                fmt_secs(self.cleanup_timeout)
            )),
        }
        result
    }
}

/// Where [`JobRunner`]'s scripts run: the plugin's `Run`, one call per stage.
#[derive(Debug)]
struct StageHost<'a> {
    host: &'a ExecutorHost,
    state: Vec<u8>,
    instance: Option<Instance>,
    /// Fired to stop the running step: its `Run` call is dropped, which the plugin sees as a
    /// cancel. Replaced by a fresh token for the next step.
    stopping: Mutex<CancellationToken>,
}

impl StageHost<'_> {
    async fn run(
        &self,
        stage: &str,
        script: String,
        stdin: Vec<u8>,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        let stop = self
            .stopping
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let call = self.host.run_with(
            Stage {
                state: self.state.clone(),
                name: stage.to_owned(),
                script: script.into_bytes(),
                stdin,
                instance: self.instance.clone(),
            },
            |c| {
                let output = output.clone();
                async move {
                    let out = match c {
                        Chunk::Stdout(b) => Output::Stdout(b),
                        Chunk::Stderr(b) => Output::Stderr(b),
                    };
                    output.send(out).await.is_ok()
                }
            },
        );
        let result = tokio::select! {
            r = call => Some(r),
            _ = stop.cancelled() => None,
        };
        match result {
            None => Err(HostError::environment(format!("stage {stage} stopped"))),
            Some(Ok(exit)) => match exit.failure {
                Failure::None => Ok(ExitStatus {
                    code: u32::try_from(exit.code).ok(),
                    signal: None,
                }),
                // A script failure whatever the code: never a success.
                Failure::Script => Ok(ExitStatus {
                    code: Some(
                        u32::try_from(exit.code)
                            .ok()
                            .filter(|c| *c != 0)
                            .unwrap_or(1),
                    ),
                    signal: None,
                }),
                Failure::System => Err(HostError::environment(if exit.message.is_empty() {
                    format!("stage {stage}: the plugin reported a system failure")
                } else {
                    format!("stage {stage}: {}", exit.message)
                })),
            },
            Some(Err(e)) => Err(HostError::environment(format!("stage {stage}: {e}"))),
        }
    }
}

#[async_trait]
impl Host for StageHost<'_> {
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        self.run_stage("step_script", script, output).await
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        self.capture_stage("step_script", body, stdin).await
    }

    async fn run_stage(
        &self,
        stage: &str,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        self.run(stage, script, Vec::new(), output).await
    }

    async fn capture_stage(
        &self,
        stage: &str,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let (tx, rx) = mpsc::channel(64);
        let (status, (out, err)) = tokio::join!(
            self.run(stage, body.to_owned(), stdin, tx),
            Output::gather(rx)
        );
        status.map(|s| (s, out, err))
    }

    async fn stop_stage(&self, _stage: &str, _kill_script: &str) -> Result<(), HostError> {
        // The plugin stops a stage when its Run call is cancelled; a kill script run in a
        // fresh sandbox would not even see the step's processes.
        let mut stopping = self.stopping.lock().unwrap_or_else(|p| p.into_inner());
        stopping.cancel();
        *stopping = CancellationToken::new();
        Ok(())
    }
}
