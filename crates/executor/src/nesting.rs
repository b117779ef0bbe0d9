//! The `microvm` and `vm` isolation levels: a VM per job from the instance's nesting daemon,
//! reached through the instance's SSH connection ("hopping" into it), the job's steps run by
//! the guest agent, the VM deleted afterwards — also after a timeout or a cancel — or kept as a
//! snapshot when the job asks (`SLIPWAY_SNAPSHOT=on_failure`, `SLIPWAY_SNAPSHOT_SAVE=NAME`);
//! `SLIPWAY_RESTORE=NAME` starts the job from a snapshot instead of a cold boot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use slipway_connector::{Client, ExitStatus, Output};
use slipway_job::JobResponse;
use slipway_nesting::agent::{AgentClient, Exec, ExecEvent};
use slipway_nesting::client::{AgentAddr, NestingClient};
use slipway_nesting::vsock;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::executor::Executor;
use crate::host::{Host, HostError};
use crate::isolation::Isolation;
use crate::job::JobSlot;
use crate::job::{JobRunner, RunResult};
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

/// The job variable asking to keep the VM: `on_failure`.
pub const SNAPSHOT_VARIABLE: &str = "SLIPWAY_SNAPSHOT";
/// The job variable naming a snapshot to save when the job succeeds.
pub const SNAPSHOT_SAVE_VARIABLE: &str = "SLIPWAY_SNAPSHOT_SAVE";
/// The job variable naming a snapshot to start from.
pub const RESTORE_VARIABLE: &str = "SLIPWAY_RESTORE";

/// How long deleting a VM may take (GitLab's runner allows a minute too).
const DELETE_TIMEOUT: Duration = Duration::from_secs(60);

/// The name `on_failure` gives a failed job's snapshot.
pub fn failure_snapshot_name(job_id: u64) -> String {
    format!("job-{job_id}")
}

/// A runner's `vm_isolation` settings, as the executor needs them.
#[derive(Debug, Clone, Default)]
pub struct NestingConfig {
    /// The daemon's unix socket on the instance (`nesting_host` without `unix://`).
    pub socket: String,
    /// `nesting_config` as JSON, sent with `Init`.
    pub init_config: Vec<u8>,
    /// `vm_isolation.image`: the VM image when the job names none.
    pub image: Option<String>,
    /// The default image of `microvm` jobs (before `image`).
    pub microvm_image: Option<String>,
    /// The default image of `vm` jobs (before `image`).
    pub vm_image: Option<String>,
    /// `[runners.instance] allowed_images`: job images allowed as VM images (`*` globs).
    pub allowed_images: Vec<String>,
    /// Builds directory inside the VM.
    pub builds_dir: String,
    /// Cache directory inside the VM.
    pub cache_dir: String,
}

/// Told of each VM a job gets from an image: whether its slot had it ready (warm) or it was
/// started for the job (cold). The manager counts them for its status page and `/metrics`.
pub trait VmStartSink: Send + Sync + std::fmt::Debug {
    /// A job got a VM of `image`; `warm` when it was started ahead of the job.
    fn vm_started(&self, image: &str, warm: bool);
}

/// The executor for one job on one instance.
#[derive(Debug)]
pub struct NestingExecutor {
    /// The instance's SSH connection.
    pub client: Arc<Client>,
    /// The instance's id (for messages).
    pub instance: String,
    /// Settings.
    pub config: NestingConfig,
    /// microvm or vm.
    pub level: Isolation,
    /// Where VM starts are counted, if anywhere.
    pub starts: Option<Arc<dyn VmStartSink>>,
}

/// A glob where `*` matches any run of characters (GitLab's `allowed_images` patterns).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

impl NestingExecutor {
    /// The VM image for `job`: its `image:` (checked against `allowed_images`), else the
    /// runner's `vm_isolation.image`, variables expanded.
    pub fn image_for(&self, job: &JobResponse) -> Result<String, String> {
        let asked = job
            .image
            .as_ref()
            .map(|i| job.expand(&i.name))
            .filter(|n| !n.is_empty());
        match asked {
            Some(name) => {
                if self
                    .config
                    .allowed_images
                    .iter()
                    .any(|p| glob_match(p, &name))
                {
                    Ok(name)
                } else {
                    Err(format!(
                        "the job's image {name:?} is not in [runners.instance] allowed_images ({})",
                        if self.config.allowed_images.is_empty() {
                            "empty".to_string()
                        } else {
                            self.config.allowed_images.join(", ")
                        }
                    ))
                }
            }
            None => match self.level {
                Isolation::Vm => self.config.vm_image.as_ref(),
                _ => self.config.microvm_image.as_ref(),
            }
            .or(self.config.image.as_ref())
            .map(|i| job.expand(i))
            .filter(|n| !n.is_empty())
            .ok_or_else(|| "no nesting VM image specified".to_string()),
        }
    }

    /// A connection to the instance's nesting daemon, over the SSH connection.
    pub async fn nesting(&self) -> Result<NestingClient, String> {
        let client = self.client.clone();
        let socket = self.config.socket.clone();
        NestingClient::connect_with(format!("{}:{socket}", self.instance), move || {
            let client = client.clone();
            let socket = socket.clone();
            async move {
                client
                    .open_unix(&socket)
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))
            }
        })
        .await
        .map_err(|e| e.to_string())
    }
}

/// How a restored VM got its RAM, for the "ready in" line (nothing for a cold boot, or from a
/// daemon that does not say).
fn memory_note(snapshot: &str, memory: &str) -> String {
    match (snapshot, memory) {
        ("", _) | (_, "") => String::new(),
        (s, "private-file") => format!(" (restored from {s}: memory mapped copy-on-write)"),
        (s, _) => format!(" (restored from {s}: memory read from the snapshot's stream)"),
    }
}

fn system_failure(msg: String) -> RunResult {
    RunResult {
        outcome: JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg),
        artifacts: Vec::new(),
    }
}

/// A job's VM, started, with its guest agent reached (or why not).
#[derive(Debug)]
pub struct StartedVm {
    /// The connection to the instance's nesting daemon.
    pub nesting: NestingClient,
    /// The VM's id.
    pub id: String,
    /// The VM's agent address (`unix://` or `vsock://`) on the instance.
    pub addr: String,
    /// The slot it runs in.
    pub slot: Option<i32>,
    /// Its guest agent, or why it could not be reached (the VM is still to be finished).
    pub agent: Result<AgentClient, String>,
}

impl NestingExecutor {
    /// Start `job`'s VM in `slot`: created from its image, or restored from the snapshot it
    /// asks for; progress goes to `trace`. A failure (or a cancel while starting, after which
    /// the VM is removed) comes back as the job's result.
    pub async fn start_vm(
        &self,
        job: &JobResponse,
        slot: u32,
        cancel: &CancellationToken,
        trace: &mut Trace,
    ) -> Result<StartedVm, RunResult> {
        let restore = job
            .variable(RESTORE_VARIABLE)
            .map(str::to_string)
            .filter(|s| !s.is_empty());
        let image = match (&restore, self.image_for(job)) {
            (Some(_), _) => String::new(),
            (None, Ok(i)) => i,
            (None, Err(msg)) => {
                trace.message(&format!("ERROR: {msg}"));
                return Err(RunResult {
                    outcome: JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg),
                    artifacts: Vec::new(),
                });
            }
        };
        let mut nesting = match self.nesting().await {
            Ok(n) => n,
            Err(e) => {
                let msg = format!(
                    "reaching the nesting daemon on instance {}: {e}",
                    self.instance
                );
                trace.message(&format!("ERROR: {msg}"));
                return Err(system_failure(msg));
            }
        };
        let slot_no = i32::try_from(slot).ok();
        let started = Instant::now();
        let starting = {
            // A clone shares the connection; the original stays free for the delete below.
            let (mut nesting, restore, image) = (nesting.clone(), &restore, &image);
            async move {
                match restore {
                    Some(name) => {
                        nesting
                            .restore_initialized(name, slot_no, &self.config.init_config)
                            .await
                    }
                    None => {
                        nesting
                            .create_initialized(image, slot_no, &self.config.init_config)
                            .await
                    }
                }
            }
        };
        trace.message(&match &restore {
            Some(name) => format!(
                "Restoring a {} VM from snapshot {name} in slot {slot} on instance {}",
                self.level, self.instance
            ),
            None => format!(
                "Creating a {} VM from image {image} in slot {slot} on instance {}",
                self.level, self.instance
            ),
        });
        tokio::pin!(starting);
        let created = tokio::select! {
            r = &mut starting => r,
            _ = cancel.cancelled() => {
                // Let the start finish (bounded by the daemon's boot timeout), then remove the
                // VM: dropping the call would leave the daemon to finish it for nobody.
                trace.message("Job canceled while its VM was starting; removing the VM");
                if let Ok((vm, _)) = starting.await {
                    let _ = tokio::time::timeout(DELETE_TIMEOUT, nesting.delete(&vm.id)).await;
                }
                return Err(RunResult {
                    outcome: JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled"),
                    artifacts: Vec::new(),
                });
            }
        };
        let (vm, stomped) = match created {
            Ok(v) => v,
            Err(e) => {
                let msg = format!("starting the VM: {e}");
                trace.message(&format!("ERROR: {msg}"));
                if e.is_transport() {
                    // The daemon finishes a start whose caller went away: remove what it made.
                    self.delete_slot(slot_no).await;
                }
                let reason = if e.is_configuration() {
                    FailureReason::RunnerConfigurationError
                } else {
                    FailureReason::RunnerSystemFailure
                };
                return Err(RunResult {
                    outcome: JobOutcome::failed(reason, None, msg),
                    artifacts: Vec::new(),
                });
            }
        };
        // A job that asked for a level gets it: a microvm image does not pass for a vm.
        if job.variable(crate::isolation::VARIABLE).is_some() && vm.level != self.level.as_str() {
            let msg = format!(
                "the job asked for isolation {} but the VM's image is a {} image",
                self.level, vm.level
            );
            trace.message(&format!("ERROR: {msg}"));
            let _ = tokio::time::timeout(DELETE_TIMEOUT, nesting.delete(&vm.id)).await;
            return Err(RunResult {
                outcome: JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg),
                artifacts: Vec::new(),
            });
        }
        if let Some(id) = stomped {
            trace.message(&format!("Stomped nesting VM {id} left in slot {slot}"));
        }
        if let (Some(sink), None) = (&self.starts, &restore) {
            sink.vm_started(&image, vm.warm);
        }
        if vm.warm {
            trace.message(&format!(
                "Warm start: VM {} was started ahead of the job in slot {slot} and is handed over",
                vm.id
            ));
        }
        trace.message(&format!(
            "VM {} ({}) ready in {:.1} s{}",
            vm.id,
            vm.name,
            started.elapsed().as_secs_f64(),
            memory_note(&vm.snapshot, &vm.memory)
        ));
        let agent = self.agent(&vm.addr).await;
        Ok(StartedVm {
            nesting,
            id: vm.id,
            addr: vm.addr,
            slot: slot_no,
            agent,
        })
    }

    /// How the job's steps run in its VM.
    pub fn job_runner(&self) -> JobRunner {
        JobRunner {
            builds_dir: self.config.builds_dir.clone(),
            cache_dir: Some(self.config.cache_dir.clone()),
            keep_files: true,
            ..JobRunner::default()
        }
    }
}

#[async_trait]
impl Executor for NestingExecutor {
    fn name(&self) -> &'static str {
        "nesting"
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        let trace = slot.trace;
        let mut vm = match self.start_vm(job, slot.slot, &slot.cancel, trace).await {
            Ok(vm) => vm,
            Err(result) => return result,
        };
        let result = match vm.agent {
            Ok(agent) => {
                let host = GuestHost {
                    agent: Arc::new(agent),
                };
                self.job_runner()
                    .run(
                        job,
                        &host,
                        JobSlot {
                            cgroup: None,
                            slot: slot.slot,
                            trace,
                            cancel: slot.cancel.clone(),
                            abort: slot.abort.clone(),
                            artifacts_in: slot.artifacts_in,
                            scratch_dir: slot.scratch_dir,
                            max_collected: slot.max_collected,
                            sources: slot.sources,
                            data: slot.data,
                        },
                    )
                    .await
            }
            Err(ref msg) => {
                trace.message(&format!("ERROR: {msg}"));
                system_failure(msg.clone())
            }
        };
        self.finish(job, &mut vm.nesting, &vm.id, vm.slot, result, trace)
            .await
    }
}

impl NestingExecutor {
    /// Delete whatever VM holds `slot` (a start whose answer was lost), on a new connection.
    async fn delete_slot(&self, slot: Option<i32>) {
        let Some(slot) = slot else { return };
        let cleanup = async {
            let mut nesting = self.nesting().await.ok()?;
            // The daemon may still be starting it: wait until a VM shows up in the slot (or
            // the start's own limit passed) before deleting.
            for _ in 0..120 {
                let vms = nesting.list().await.ok()?;
                if let Some(vm) = vms.into_iter().find(|v| v.slot == Some(slot)) {
                    let _ = nesting.delete(&vm.id).await;
                    return Some(());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Some(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(150), cleanup).await;
    }

    /// Reach the guest agent at `addr` (a VM's address on the instance) over the SSH connection.
    pub async fn agent(&self, addr: &str) -> Result<AgentClient, String> {
        let parsed = AgentAddr::parse(addr)
            .ok_or_else(|| format!("the VM's address {addr:?} is not unix:// or vsock://"))?;
        let stream = self
            .client
            .open_unix(parsed.socket())
            .await
            .map_err(|e| format!("reaching the VM's agent: {e}"))?;
        let stream = match parsed {
            AgentAddr::Vsock { port, socket } => {
                vsock::connect_over(stream, port, &format!("{}:{socket}", self.instance))
                    .await
                    .map_err(|e| format!("reaching the VM's agent: {e}"))?
            }
            AgentAddr::Unix(_) => stream,
        };
        let agent = AgentClient::new(stream);
        agent
            .hello(Duration::from_secs(10))
            .await
            .map_err(|e| format!("the VM's agent: {e}"))?;
        Ok(agent)
    }

    /// The job's project directory in the VM (a bash expression), for `slipway debug`.
    fn workdir(&self, job: &JobResponse, slot: Option<i32>) -> String {
        crate::script::JobDirs {
            builds_dir: self.config.builds_dir.clone(),
            slot: slot.and_then(|s| u32::try_from(s).ok()).unwrap_or(0),
            job_id: job.id,
            clone_path: crate::script::clone_path_of(job).ok().flatten(),
        }
        .project_dir()
    }

    /// Keep the VM as a snapshot when the job asks, else delete it.
    pub async fn finish(
        &self,
        job: &JobResponse,
        nesting: &mut NestingClient,
        vm: &str,
        slot_no: Option<i32>,
        mut result: RunResult,
        trace: &mut slipway_job::trace::Trace,
    ) -> RunResult {
        let failed = !matches!(result.outcome, JobOutcome::Success);
        let canceled = matches!(
            result.outcome,
            JobOutcome::Failed {
                reason: FailureReason::JobCanceled,
                ..
            }
        );
        let keep = if failed && !canceled && job.variable(SNAPSHOT_VARIABLE) == Some("on_failure") {
            Some(failure_snapshot_name(job.id))
        } else if !failed {
            job.variable(SNAPSHOT_SAVE_VARIABLE)
                .map(str::to_string)
                .filter(|s| !s.is_empty())
        } else {
            None
        };
        if let Some(name) = keep {
            let labels = HashMap::from([
                ("job".to_string(), job.id.to_string()),
                ("job_name".to_string(), job.job_info.name.clone()),
                ("project".to_string(), job.job_info.project_name.clone()),
                ("workdir".to_string(), self.workdir(job, slot_no)),
            ]);
            let started = Instant::now();
            // Longer than the daemon's own limit on saving a VM (600 s), so its answer arrives.
            match tokio::time::timeout(
                Duration::from_secs(660),
                nesting.snapshot_initialized(vm, &name, labels, &self.config.init_config),
            )
            .await
            {
                Ok(Ok((snap, expired))) => {
                    trace.message(&format!(
                        "Saved the VM as snapshot {name} in {:.1} s ({} MiB memory image, {} MiB disk layer)",
                        started.elapsed().as_secs_f64(),
                        snap.memory_bytes >> 20,
                        snap.disk_bytes >> 20
                    ));
                    if failed {
                        trace.message(&format!(
                            "To step into the failed state: run `slipway debug {}` on instance {}",
                            job.id, self.instance
                        ));
                    }
                    for e in expired {
                        trace.message(&format!("Snapshot {e} removed: retention limit exceeded"));
                    }
                    // The snapshot consumed the VM; nothing is left to delete.
                    return result;
                }
                Ok(Err(e)) => {
                    trace.message(&format!("ERROR: saving snapshot {name}: {e}"));
                    if !failed {
                        result.outcome = JobOutcome::failed(
                            FailureReason::RunnerSystemFailure,
                            None,
                            format!("saving snapshot {name}: {e}"),
                        );
                    }
                }
                Err(_) => {
                    trace.message(&format!(
                        "ERROR: saving snapshot {name} took longer than 10 minutes"
                    ));
                    if !failed {
                        result.outcome = JobOutcome::failed(
                            FailureReason::RunnerSystemFailure,
                            None,
                            format!("saving snapshot {name} timed out"),
                        );
                    }
                }
            }
        }
        match tokio::time::timeout(DELETE_TIMEOUT, nesting.delete(vm)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_not_found() => {}
            Ok(Err(e)) => trace.message(&format!("WARNING: deleting VM {vm}: {e}")),
            Err(_) => trace.message(&format!("WARNING: deleting VM {vm} timed out")),
        }
        result
    }
}

/// A VM's guest agent as a [`Host`]: scripts run by bash inside the VM.
#[derive(Debug, Clone)]
pub struct GuestHost {
    /// The agent.
    pub agent: Arc<AgentClient>,
}

#[async_trait]
impl Host for GuestHost {
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        let mut exec = self
            .agent
            .exec(Exec {
                argv: vec![
                    "bash".into(),
                    "--noprofile".into(),
                    "--norc".into(),
                    "-s".into(),
                ],
                env: Vec::new(),
                cwd: None,
                stdin: Some(script.into_bytes()),
                keep_stdin: false,
            })
            .await
            .map_err(|e| HostError::environment(format!("the VM's agent: {e}")))?;
        while let Some(ev) = exec.events.recv().await {
            match ev {
                ExecEvent::Started(_) => {}
                ExecEvent::Stdout(b) => {
                    let _ = output.send(Output::Stdout(b)).await;
                }
                ExecEvent::Stderr(b) => {
                    let _ = output.send(Output::Stderr(b)).await;
                }
                ExecEvent::Exit { code, signal } => return Ok(exit_status(code, signal)),
                ExecEvent::Error(e) => {
                    return Err(HostError::environment(format!("the VM's agent: {e}")));
                }
            }
        }
        Err(HostError::environment("the VM's agent went away"))
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let (code, out, err) = self
            .agent
            .run_capture(bash_c(body), stdin)
            .await
            .map_err(|e| HostError::environment(format!("the VM's agent: {e}")))?;
        Ok((exit_status(code, None), out, err))
    }

    async fn transfer_stage(
        &self,
        _stage: &str,
        body: &str,
        input: Option<&std::path::Path>,
        output: Option<&std::path::Path>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let (code, out, err) = self
            .agent
            .run_transfer(bash_c(body), input, output)
            .await
            .map_err(|e| HostError::environment(format!("the VM's agent: {e}")))?;
        Ok((exit_status(code, None), out, err))
    }
}

/// `bash -c body` for the agent.
fn bash_c(body: &str) -> Vec<String> {
    ["bash", "--noprofile", "--norc", "-c", body]
        .map(String::from)
        .to_vec()
}

fn exit_status(code: Option<i32>, signal: Option<i32>) -> ExitStatus {
    ExitStatus {
        code: code.and_then(|c| u32::try_from(c).ok()),
        signal: signal.map(crate::host::signal_name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_allowed_images() {
        assert!(glob_match("*", "debian"));
        assert!(glob_match("ci-*", "ci-microvm"));
        assert!(!glob_match("ci-*", "debian"));
        assert!(glob_match("*-vm", "bookworm-vm"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }

    #[test]
    fn the_ready_line_says_how_a_restore_got_its_memory() {
        assert_eq!(memory_note("", "shared-file"), "");
        assert_eq!(memory_note("deps", ""), "");
        assert_eq!(
            memory_note("deps", "private-file"),
            " (restored from deps: memory mapped copy-on-write)"
        );
        assert_eq!(
            memory_note("deps", "shared-file"),
            " (restored from deps: memory read from the snapshot's stream)"
        );
    }
}
