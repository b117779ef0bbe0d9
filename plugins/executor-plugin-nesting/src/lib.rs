//! `executor-plugin-nesting`: the `microvm` and `vm` levels as an executor plugin, built from
//! the in-process executor's code ([`NestingExecutor`]): `Prepare` starts the job's VM through
//! the instance's nesting daemon (over SSH, with the connection the runner passes), each stage
//! runs in the VM through its guest agent, and `Cleanup` keeps the VM as a snapshot when the job
//! asks or deletes it.
//!
//! plugin config (JSON, the keys of `[runners.autoscaler.vm_isolation]`): `nesting_host`
//! (`unix:///run/slipway/nesting.sock`), `nesting_config` (an object, sent with the daemon's
//! `Init`), `image`, `microvm_image`, `vm_image`, `allowed_images` (globs), `builds_dir`
//! (`/work/builds`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use slipway_connector::{Client, DialOptions, HostKeyStore, Output};
use slipway_executor::nesting::{GuestHost, NestingConfig, NestingExecutor};
use slipway_executor::script::{JobDirs, kill_script};
use slipway_executor::{Host as _, Isolation, RunResult};
use slipway_executor_plugin::{
    Capabilities, Chunk, CleanupJob, ExecutorProvider, Exit, Failure, Instance, JobStatus,
    Placement, PrepareJob, Prepared, ProviderError, Stage,
};
use slipway_fleeting::{ConnectInfo, ConnectorConfig};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use slipway_nesting::agent::AgentClient;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Config keys this provider reads.
const KEYS: &[&str] = &[
    "nesting_host",
    "nesting_config",
    "image",
    "microvm_image",
    "vm_image",
    "allowed_images",
    "builds_dir",
];
/// Seconds between SIGTERM and SIGKILL when a canceled stage is stopped.
const KILL_GRACE_SECS: u32 = 3;

/// A job whose VM runs.
#[derive(Debug)]
struct LiveJob {
    job: JobResponse,
    level: Isolation,
    agent: Arc<AgentClient>,
}

/// The provider.
#[derive(Debug, Default)]
pub struct NestingProvider {
    config: Mutex<Option<NestingConfig>>,
    host_keys: HostKeyStore,
    /// SSH connections by instance id.
    clients: tokio::sync::Mutex<HashMap<String, Arc<Client>>>,
    /// Jobs by VM id; after a restart their later calls reconnect from the state.
    jobs: Mutex<HashMap<String, Arc<LiveJob>>>,
}

/// What the runner hands back: where the job's VM is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    vm: String,
    addr: String,
    slot: Option<i32>,
    job_id: u64,
}

impl State {
    fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "vm": self.vm, "addr": self.addr, "slot": self.slot, "job_id": self.job_id,
        })
        .to_string()
        .into_bytes()
    }

    fn decode(bytes: &[u8]) -> Result<State, ProviderError> {
        let v: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| ProviderError::NotFound(format!("not this plugin's state: {e}")))?;
        let text = |k: &str| v[k].as_str().map(str::to_owned);
        match (text("vm"), text("addr")) {
            (Some(vm), Some(addr)) if !vm.is_empty() => Ok(State {
                vm,
                addr,
                slot: v["slot"].as_i64().and_then(|s| i32::try_from(s).ok()),
                job_id: v["job_id"].as_u64().unwrap_or(0),
            }),
            _ => Err(ProviderError::NotFound("the state names no VM".into())),
        }
    }
}

fn config_from(json: &serde_json::Value) -> Result<NestingConfig, ProviderError> {
    let bad = |k: &str, what: &str| ProviderError::InvalidConfig(format!("config.{k}: {what}"));
    let Some(map) = json.as_object() else {
        return Err(ProviderError::InvalidConfig(
            "expected a JSON object".into(),
        ));
    };
    if let Some(k) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(bad(k, &format!("unknown key (known: {})", KEYS.join(", "))));
    }
    let text = |k: &str| -> Result<Option<String>, ProviderError> {
        match map.get(k) {
            None => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
            Some(other) => Err(bad(k, &format!("expected a string, got {other}"))),
        }
    };
    let host = text("nesting_host")?.unwrap_or_else(|| "unix:///run/slipway/nesting.sock".into());
    let Some(socket) = host.strip_prefix("unix://") else {
        return Err(bad(
            "nesting_host",
            &format!("expected unix:///path/to/nesting.sock on the instance, got {host:?}"),
        ));
    };
    let init_config = match map.get("nesting_config") {
        None => b"{}".to_vec(),
        Some(v @ serde_json::Value::Object(_)) => v.to_string().into_bytes(),
        Some(other) => {
            return Err(bad(
                "nesting_config",
                &format!("expected an object, got {other}"),
            ));
        }
    };
    let allowed_images = match map.get("allowed_images") {
        None => Vec::new(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad("allowed_images", "expected strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(bad(
                "allowed_images",
                &format!("expected a list, got {other}"),
            ));
        }
    };
    Ok(NestingConfig {
        socket: socket.to_owned(),
        init_config,
        image: text("image")?,
        microvm_image: text("microvm_image")?,
        vm_image: text("vm_image")?,
        allowed_images,
        builds_dir: text("builds_dir")?.unwrap_or_else(|| "/work/builds".into()),
        cache_dir: "/work/cache".into(),
    })
}

/// The runner's view of the instance, as the SSH client wants it.
fn connect_info(i: &Instance) -> ConnectInfo {
    ConnectInfo {
        id: i.id.clone(),
        connector: ConnectorConfig {
            os: i.os.clone(),
            arch: i.arch.clone(),
            protocol: i.protocol.clone(),
            protocol_port: u16::try_from(i.protocol_port).unwrap_or(22),
            username: i.username.clone(),
            password: i.password.clone(),
            key: i.key.clone(),
            use_static_credentials: i.use_static_credentials,
            ..ConnectorConfig::default()
        },
        internal_addr: i.internal_addr.clone(),
        external_addr: i.external_addr.clone(),
        expires: None,
    }
}

fn failed(result: &RunResult) -> ProviderError {
    match &result.outcome {
        JobOutcome::Success => ProviderError::Failed("the VM did not start".into()),
        JobOutcome::Failed {
            reason: FailureReason::RunnerConfigurationError,
            message,
            ..
        } => ProviderError::InvalidConfig(message.clone()),
        JobOutcome::Failed { message, .. } => ProviderError::Failed(message.clone()),
    }
}

/// Lines a [`Trace`] was given, for `Prepared::messages` and `Cleanup`'s answer.
fn trace() -> (Trace, mpsc::UnboundedReceiver<Vec<u8>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Trace::new(Vec::<String>::new(), tx), rx)
}

fn lines(mut trace: Trace, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) -> Vec<String> {
    trace.finish();
    drop(trace);
    let mut text = Vec::new();
    while let Ok(chunk) = rx.try_recv() {
        text.extend(chunk);
    }
    String::from_utf8_lossy(&text)
        .lines()
        .map(|l| l.trim_end().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

impl NestingProvider {
    fn config(&self) -> Result<NestingConfig, ProviderError> {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ProviderError::Failed("Init must be called first".into()))
    }

    /// The instance's SSH connection, made on first use and again when it closed.
    async fn client(&self, instance: Option<&Instance>) -> Result<Arc<Client>, ProviderError> {
        let Some(instance) = instance else {
            return Err(ProviderError::InvalidConfig(
                "no instance: this plugin runs jobs on autoscaled instances".into(),
            ));
        };
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(&instance.id).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let client = Client::connect(
            &connect_info(instance),
            &DialOptions::default(),
            &self.host_keys,
        )
        .await
        .map_err(|e| {
            ProviderError::Failed(format!("connecting to instance {}: {e}", instance.id))
        })?;
        let client = Arc::new(client);
        clients.insert(instance.id.clone(), client.clone());
        Ok(client)
    }

    async fn executor(
        &self,
        instance: Option<&Instance>,
        level: Isolation,
    ) -> Result<NestingExecutor, ProviderError> {
        Ok(NestingExecutor {
            client: self.client(instance).await?,
            instance: instance.map(|i| i.id.clone()).unwrap_or_default(),
            config: self.config()?,
            level,
            // Counted by the manager only for its in-process executor (see docs/nesting.md).
            starts: None,
        })
    }

    /// The agent of the VM `state` names: remembered, or reached again after a restart.
    async fn agent(
        &self,
        state: &State,
        instance: Option<&Instance>,
    ) -> Result<Arc<AgentClient>, ProviderError> {
        let known = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&state.vm)
            .map(|j| j.agent.clone());
        if let Some(agent) = known {
            return Ok(agent);
        }
        let exec = self.executor(instance, Isolation::Microvm).await?;
        exec.agent(&state.addr)
            .await
            .map(Arc::new)
            .map_err(ProviderError::Failed)
    }
}

/// Stops a stage's processes in the VM when its `Run` is dropped (a cancel or timeout).
struct StopOnDrop {
    agent: Arc<AgentClient>,
    kill: Option<String>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take() {
            let host = GuestHost {
                agent: self.agent.clone(),
            };
            // Owned by the runtime until it ends: it signals, waits the grace, and exits.
            tokio::spawn(async move {
                let _ = host.capture(&kill, Vec::new()).await;
            });
        }
    }
}

fn exit_of(status: &slipway_connector::ExitStatus) -> Exit {
    match (status.code, &status.signal) {
        (Some(code), _) => Exit::code(i32::try_from(code).unwrap_or(1)),
        (None, signal) => Exit {
            code: 1,
            failure: Failure::Script,
            message: format!("killed by signal {}", signal.as_deref().unwrap_or("?")),
        },
    }
}

#[async_trait]
impl ExecutorProvider for NestingProvider {
    async fn init(&self, config: &[u8], dry_run: bool) -> Result<Capabilities, ProviderError> {
        let json: serde_json::Value =
            serde_json::from_slice(if config.is_empty() { b"{}" } else { config })
                .map_err(|e| ProviderError::InvalidConfig(format!("not JSON: {e}")))?;
        let cfg = config_from(&json)?;
        if !dry_run {
            *self.config.lock().unwrap_or_else(|p| p.into_inner()) = Some(cfg);
        }
        Ok(Capabilities {
            name: "nesting".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            isolation_levels: vec![
                Isolation::Microvm.as_str().into(),
                Isolation::Vm.as_str().into(),
            ],
            placement: Placement::Instance,
            // Images built before guests had a network (or with --no-network) cannot reach
            // the servers: the runner keeps moving the data.
            job_data: false,
        })
    }

    async fn prepare(&self, req: PrepareJob) -> Result<Prepared, ProviderError> {
        let level: Isolation = req
            .isolation
            .parse()
            .map_err(|e| ProviderError::InvalidConfig(format!("isolation: {e}")))?;
        let job = JobResponse::from_json(&String::from_utf8_lossy(&req.job))
            .map_err(|e| ProviderError::InvalidConfig(format!("the job payload: {e}")))?;
        let exec = self.executor(req.instance.as_ref(), level).await?;
        let (mut trace, rx) = trace();
        // The runner waits for Prepare's answer whatever happens to the job, so no cancel here.
        let started = exec
            .start_vm(
                &job,
                req.resources.slot,
                &CancellationToken::new(),
                &mut trace,
            )
            .await;
        let mut vm = match started {
            Ok(vm) => vm,
            Err(result) => return Err(failed(&result)),
        };
        let agent = match vm.agent {
            Ok(agent) => Arc::new(agent),
            Err(ref msg) => {
                let msg = msg.clone();
                let result = RunResult {
                    outcome: JobOutcome::failed(FailureReason::RunnerSystemFailure, None, &msg),
                    artifacts: Vec::new(),
                };
                let _ = exec
                    .finish(&job, &mut vm.nesting, &vm.id, vm.slot, result, &mut trace)
                    .await;
                return Err(ProviderError::Failed(msg));
            }
        };
        let state = State {
            vm: vm.id.clone(),
            addr: vm.addr.clone(),
            slot: vm.slot,
            job_id: job.id,
        };
        let runner = exec.job_runner();
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(vm.id.clone(), Arc::new(LiveJob { job, level, agent }));
        Ok(Prepared {
            state: state.encode(),
            builds_dir: Some(runner.builds_dir),
            cache_dir: runner.cache_dir,
            messages: lines(trace, rx),
        })
    }

    async fn run(&self, stage: Stage, output: mpsc::Sender<Chunk>) -> Result<Exit, ProviderError> {
        let state = State::decode(&stage.state)?;
        let agent = self.agent(&state, stage.instance.as_ref()).await?;
        let host = GuestHost {
            agent: agent.clone(),
        };
        let streamed = matches!(stage.name.as_str(), "step_script" | "after_script");
        if !streamed {
            let script = String::from_utf8_lossy(&stage.script).into_owned();
            let (status, out, err) = host
                .capture(&script, stage.stdin)
                .await
                .map_err(|e| ProviderError::Failed(e.to_string()))?;
            for chunk in [Chunk::Stdout(out), Chunk::Stderr(err)] {
                if !matches!(&chunk, Chunk::Stdout(b) | Chunk::Stderr(b) if b.is_empty()) {
                    let _ = output.send(chunk).await;
                }
            }
            return Ok(exit_of(&status));
        }
        let step = if stage.name == "after_script" {
            "after_script"
        } else {
            "script"
        };
        let dirs = JobDirs {
            builds_dir: self.config()?.builds_dir,
            slot: state.slot.and_then(|s| u32::try_from(s).ok()).unwrap_or(0),
            job_id: state.job_id,
            clone_path: None,
        };
        let mut stop = StopOnDrop {
            agent,
            kill: Some(kill_script(&dirs, step, KILL_GRACE_SECS)),
        };
        let (tx, mut rx) = mpsc::channel(64);
        let script = String::from_utf8_lossy(&stage.script).into_owned();
        let run = host.run_script(script, tx);
        let forward = async {
            while let Some(o) = rx.recv().await {
                let chunk = match o {
                    Output::Stdout(b) => Chunk::Stdout(b),
                    Output::Stderr(b) => Chunk::Stderr(b),
                };
                if output.send(chunk).await.is_err() {
                    break;
                }
            }
        };
        let (status, ()) = tokio::join!(run, forward);
        // It ended on its own: nothing to stop.
        stop.kill = None;
        status
            .map(|s| exit_of(&s))
            .map_err(|e| ProviderError::Failed(e.to_string()))
    }

    async fn cleanup(&self, job: CleanupJob) -> Result<Vec<String>, ProviderError> {
        let state = State::decode(&job.state)?;
        let live = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&state.vm);
        let level = live.as_ref().map_or(Isolation::Microvm, |l| l.level);
        let exec = self.executor(job.instance.as_ref(), level).await?;
        let mut nesting = exec
            .nesting()
            .await
            .map_err(|e| ProviderError::Failed(e.to_string()))?;
        let Some(live) = live else {
            // A previous process of this plugin started it: the job's snapshot wishes went with
            // that process, so the VM is removed.
            return match nesting.delete(&state.vm).await {
                Ok(()) => Ok(vec![format!(
                    "Removed VM {} (started before the plugin restarted)",
                    state.vm
                )]),
                Err(e) if e.is_not_found() => Ok(Vec::new()),
                Err(e) => Err(ProviderError::Failed(format!(
                    "deleting VM {}: {e}",
                    state.vm
                ))),
            };
        };
        let outcome = match job.status {
            JobStatus::Success => JobOutcome::Success,
            JobStatus::Canceled => {
                JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled")
            }
            JobStatus::Failed => JobOutcome::failed(FailureReason::ScriptFailure, None, "failed"),
        };
        let (mut trace, rx) = trace();
        let result = RunResult {
            outcome,
            artifacts: Vec::new(),
        };
        let _ = exec
            .finish(
                &live.job,
                &mut nesting,
                &state.vm,
                state.slot,
                result,
                &mut trace,
            )
            .await;
        Ok(lines(trace, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keys_are_checked_and_named() {
        let ok = config_from(&serde_json::json!({
            "nesting_host": "unix:///run/n.sock",
            "nesting_config": {"accel": "tcg"},
            "allowed_images": ["test-*"],
            "microvm_image": "m",
        }))
        .unwrap();
        assert_eq!(ok.socket, "/run/n.sock");
        assert_eq!(ok.builds_dir, "/work/builds");
        assert_eq!(ok.init_config, br#"{"accel":"tcg"}"#.to_vec());
        for (bad, says) in [
            (serde_json::json!({"imag": "x"}), "config.imag: unknown key"),
            (
                serde_json::json!({"nesting_host": "tcp://1.2.3.4:9"}),
                "config.nesting_host: expected unix://",
            ),
            (
                serde_json::json!({"allowed_images": "x"}),
                "config.allowed_images: expected a list",
            ),
        ] {
            let err = config_from(&bad).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn state_round_trips_and_foreign_state_is_not_found() {
        let s = State {
            vm: "vm-1".into(),
            addr: "unix:///x".into(),
            slot: Some(2),
            job_id: 7,
        };
        assert_eq!(State::decode(&s.encode()).unwrap(), s);
        assert!(matches!(
            State::decode(b"/etc"),
            Err(ProviderError::NotFound(_))
        ));
    }
}
