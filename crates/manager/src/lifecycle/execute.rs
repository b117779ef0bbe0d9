//! A job on its slot: the executor for its level — on this machine (shell, docker, custom,
//! plugin) or on its instance over SSH (bash, a slot cgroup, a container, a VM) — run until it
//! ends, is canceled, or loses its instance.

use slipway_executor::{
    CollectedArtifacts, CustomExecutor, Executor, Isolation, JobRunner, JobSlot, LocalHost,
    NestingExecutor, PluginExecutor, RunResult, SshHost, Steps, Tarball, cgroup,
};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use slipway_taskscaler::Acquisition;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use slipway_config::{Executor as ConfigExecutor, FetchSources};
use slipway_executor::HostSources;

use super::admission::Admission;
use super::{SourcesAt, Stops};
use crate::runner::Runner;

/// Run `job` on its slot at the level it asked for: on this machine (shell, docker, custom
/// executors) or on its instance over SSH (bash, in the slot's cgroup, or in a container via
/// the instance's Docker Engine). Stops it when `cancel` fires or its instance disappears (then
/// it fails with `runner_system_failure`); with `abort`, a cancel is graceful (`after_script`
/// still runs unless `abort` fires too). Returns the outcome and the artifacts archives. The
/// caller releases the slot.
#[allow(clippy::too_many_arguments)]
pub(super) async fn execute(
    runner: &Runner,
    acq: &Acquisition,
    job: &JobResponse,
    admission: &Admission,
    artifacts_in: Vec<Tarball>,
    sources: Option<Arc<dyn HostSources>>,
    trace: &mut Trace,
    stops: &Stops,
) -> Executed {
    if !runner.custom_build_dir
        && job
            .variable("GIT_CLONE_PATH")
            .is_some_and(|v| !v.trim().is_empty())
    {
        // GitLab Runner's rule and words.
        let msg = "setting GIT_CLONE_PATH is not allowed, enable `custom_build_dir` feature";
        trace.message(&format!("ERROR: {msg}"));
        return Executed::ended(JobOutcome::failed(
            FailureReason::RunnerConfigurationError,
            None,
            msg,
        ));
    }
    let cancel = stops.cancel.child_token();
    let abort = stops.abort.as_ref().map(CancellationToken::child_token);
    let stops = Stops {
        cancel: cancel.clone(),
        abort: abort.clone(),
    };
    if runner.local {
        let inputs = (artifacts_in, sources);
        let r = execute_here(runner, acq, job, admission, inputs, trace, &stops).await;
        return Executed {
            outcome: r.outcome,
            artifacts: r.artifacts,
            instance_failed: None,
        };
    }
    let client = match runner.client(acq).await {
        Ok(c) => c,
        Err(e) => {
            let msg = crate::chain::Chain(&e).to_string();
            trace.message(&format!("ERROR: {msg}"));
            // One refused connection (sshd's MaxStartups under a burst, say) is not a dead
            // instance: a second round trip tells.
            let failed = probe(runner, acq).await.is_err().then(|| msg.clone());
            return Executed {
                outcome: JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg),
                artifacts: Vec::new(),
                instance_failed: failed,
            };
        }
    };
    let lost = acq.instance_lost();
    let mut instance_lost = false;

    let mut result = {
        let run = execute_on_instance(
            runner,
            acq,
            job,
            admission,
            client,
            artifacts_in,
            sources,
            &mut *trace,
            &stops,
        );
        tokio::pin!(run);
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = lost.cancelled(), if !instance_lost => {
                    instance_lost = true;
                    // Nothing runs on a lost instance, after_script included.
                    if let Some(a) = &abort {
                        a.cancel();
                    }
                    cancel.cancel();
                }
            }
        }
    };
    // The run may end in the same instant as the loss is told (the removal's kills end the
    // steps; the taskscaler tells first): a script killed by it is not the script's failure.
    instance_lost |= lost.is_cancelled();
    let mut instance_failed = None;
    if instance_lost {
        let msg = if runner.is_preempted(acq) {
            format!(
                "instance {} was preempted by its cloud and removed under the job",
                acq.instance_id
            )
        } else {
            format!("instance {} was removed under the job", acq.instance_id)
        };
        trace.message(&format!("ERROR: {msg}"));
        result.outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg.clone());
        // An executor plugin's steps are out of sight: whether its script started is unknown,
        // so its job is never run twice.
        instance_failed = runner.executor_plugin.is_none().then_some(msg);
    } else if matches!(
        result.outcome,
        JobOutcome::Failed {
            reason: FailureReason::RunnerSystemFailure,
            ..
        }
    ) && !trace.script_started()
        && runner.executor_plugin.is_none()
        && !stops.cancel.is_cancelled()
    {
        // A system failure before the script: was it the instance? One round trip tells.
        if let Err(why) = probe(runner, acq).await {
            instance_failed = Some(format!(
                "instance {} does not answer: {why}",
                acq.instance_id
            ));
        }
    }
    Executed {
        outcome: result.outcome,
        artifacts: result.artifacts,
        instance_failed,
    }
}

/// What a job's run on its slot came to.
#[derive(Debug)]
pub(super) struct Executed {
    /// How it ended.
    pub outcome: JobOutcome,
    /// Its artifacts archives.
    pub artifacts: Vec<CollectedArtifacts>,
    /// Why its instance failed under it, when that is why it ended (its script may or may not
    /// have started: see [`Trace::script_started`]).
    pub instance_failed: Option<String>,
}

impl Executed {
    fn ended(outcome: JobOutcome) -> Executed {
        Executed {
            outcome,
            artifacts: Vec::new(),
            instance_failed: None,
        }
    }
}

/// How long the probe of a job's instance may take.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One cheap round trip to the job's instance (`exit 0` over its connection, dialled again if
/// it closed), as GitLab's acquire heartbeat does.
async fn probe(runner: &Runner, acq: &Acquisition) -> Result<(), String> {
    tokio::time::timeout(PROBE_TIMEOUT, runner.answers(acq))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")))
}

/// Where `runner` fetches its jobs' sources: where their steps run (an instance's shell, a
/// container, a VM, this machine's shell, an executor plugin's environment), falling back to
/// the manager where that has no git, unless the runner says `fetch_sources = "manager"`. The
/// custom executor's driver fetches its own.
pub(super) fn sources_at(runner: &Runner) -> SourcesAt {
    if runner.fetch_sources == FetchSources::Instance && runner.executor != ConfigExecutor::Custom {
        SourcesAt::Host
    } else {
        SourcesAt::Manager
    }
}

fn config_error(msg: String) -> JobOutcome {
    JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg)
}

fn no_result(outcome: JobOutcome) -> RunResult {
    RunResult {
        outcome,
        artifacts: Vec::new(),
    }
}

/// Put `steps` in the slot's cgroup (limits: the job's share of the instance when its shape
/// declares one, else what it asked for); the slot cgroup's path, or why not.
fn enter_cgroup(
    runner: &Runner,
    acq: &Acquisition,
    admission: &Admission,
    steps: &mut JobRunner,
    trace: &mut Trace,
) -> Result<String, JobOutcome> {
    let share = acq.resources.unwrap_or(admission.request);
    let limits = cgroup::limits_for(share.cpu_millis, share.memory_bytes);
    match runner
        .cgroups
        .apply(steps, &acq.instance_id, acq.slot, &limits)
    {
        Ok(path) => {
            trace.message(&format!("Using isolation cgroup in {path}"));
            Ok(path.to_string())
        }
        Err(e) => {
            let msg = format!("slot cgroup: {e}");
            trace.message(&format!("ERROR: {msg}"));
            Err(config_error(msg))
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn execute_on_instance(
    runner: &Runner,
    acq: &Acquisition,
    job: &JobResponse,
    admission: &Admission,
    client: std::sync::Arc<slipway_connector::Client>,
    artifacts_in: Vec<Tarball>,
    sources: Option<Arc<dyn HostSources>>,
    trace: &mut Trace,
    stops: &Stops,
) -> RunResult {
    let level = admission.level;
    if let Some(s) = &runner.subtrees {
        s.used(&acq.instance_id);
    }
    let exec: Box<dyn Executor + '_> = if runner.executor_plugin.is_some() {
        let instance = instance_of(&acq.connect_info);
        match plugin_executor(runner, acq, admission, Some(instance)) {
            Ok(e) => Box::new(e),
            Err(outcome) => return no_result(outcome),
        }
    } else if matches!(level, Isolation::Microvm | Isolation::Vm) {
        let Some(nesting) = runner.nesting.clone() else {
            return no_result(config_error(format!(
                "isolation {level} needs [runners.autoscaler.vm_isolation] enabled = true"
            )));
        };
        Box::new(NestingExecutor {
            client: client.clone(),
            instance: acq.instance_id.clone(),
            config: nesting,
            level,
            starts: Some(Arc::new(BoardStarts(runner.board.clone()))),
        })
    } else if level == Isolation::Docker {
        trace.message("Using isolation docker through the instance's Docker Engine");
        match runner
            .docker_executor(Some((&acq.instance_id, client.clone())))
            .await
        {
            Ok(e) => Box::new(e),
            Err(e) => {
                let msg = format!("reaching the instance's Docker Engine: {e}");
                trace.message(&format!("ERROR: {msg}"));
                return no_result(JobOutcome::failed(
                    FailureReason::RunnerSystemFailure,
                    None,
                    msg,
                ));
            }
        }
    } else {
        let mut steps = JobRunner {
            builds_dir: runner.builds_dir.clone(),
            cache_dir: Some(runner.cache_dir.clone()),
            ..JobRunner::default()
        };
        if level == Isolation::Cgroup
            && let Err(outcome) = enter_cgroup(runner, acq, admission, &mut steps, trace)
        {
            return no_result(outcome);
        }
        if level == Isolation::Instance {
            trace.message(&format!(
                "Using isolation instance: instance {} is this job's alone and is removed after it",
                acq.instance_id
            ));
        }
        Box::new(Steps {
            name: "instance",
            host: SshHost(&client),
            runner: steps,
        })
    };
    let inputs = (artifacts_in, sources);
    run_on(runner, exec.as_ref(), acq, job, inputs, trace, stops).await
}

/// Run `job` with `exec` on the acquisition's slot.
async fn run_on(
    runner: &Runner,
    exec: &dyn Executor,
    acq: &Acquisition,
    job: &JobResponse,
    (artifacts_in, sources): (Vec<Tarball>, Option<Arc<dyn HostSources>>),
    trace: &mut Trace,
    stops: &Stops,
) -> RunResult {
    exec.run(
        job,
        JobSlot {
            slot: acq.slot,
            cgroup: Some(container_cgroup(runner, acq)),
            trace,
            cancel: stops.cancel.clone(),
            abort: stops.abort.clone(),
            artifacts_in,
            scratch_dir: runner.scratch_dir.clone(),
            sources,
        },
    )
    .await
}

/// The cgroup parent of the job's containers: the slot's cgroup, as GitLab does with
/// use_slot_cgroups. Relative (under the engine's own cgroup) on a real instance; absolute on
/// an instance sharing this host, so the containers stay in its subtree, which goes with it.
fn container_cgroup(runner: &Runner, acq: &Acquisition) -> String {
    let path = runner
        .cgroups
        .template
        .expand_on(&acq.instance_id, acq.slot);
    if runner.subtrees.is_some() {
        format!("/{path}")
    } else {
        path.to_string()
    }
}

/// A `plugin` runner's executor for `job`: on its instance when `instance` is given.
fn plugin_executor(
    runner: &Runner,
    acq: &Acquisition,
    admission: &Admission,
    instance: Option<slipway_executor_plugin::Instance>,
) -> Result<PluginExecutor, JobOutcome> {
    let Some(plugin) = &runner.executor_plugin else {
        return Err(config_error("no [runners.plugin] section".into()));
    };
    let isolation = admission
        .plugin_level
        .clone()
        .ok_or_else(|| config_error(format!("runner {:?} has no executor plugin", runner.name)))?;
    let share = acq.resources.unwrap_or_default();
    Ok(PluginExecutor {
        host: plugin.host.clone(),
        runner: JobRunner {
            builds_dir: runner.builds_dir.clone(),
            ..JobRunner::default()
        },
        isolation,
        instance,
        resources: slipway_executor_plugin::Resources {
            cpus: share.cpu_millis as f64 / 1000.0,
            memory_bytes: share.memory_bytes,
            ..Default::default()
        },
        prepare_timeout: plugin.config.prepare_timeout,
        cleanup_timeout: plugin.config.cleanup_timeout,
    })
}

/// How an executor plugin reaches the job's instance: what the fleeting plugin said.
fn instance_of(info: &slipway_fleeting::ConnectInfo) -> slipway_executor_plugin::Instance {
    let c = &info.connector;
    slipway_executor_plugin::Instance {
        id: info.id.clone(),
        os: c.os.clone(),
        arch: c.arch.clone(),
        protocol: c.protocol.clone(),
        username: c.username.clone(),
        password: c.password.clone(),
        key: c.key.clone(),
        use_static_credentials: c.use_static_credentials,
        internal_addr: info.internal_addr.clone(),
        external_addr: info.external_addr.clone(),
        protocol_port: u32::from(c.protocol_port),
    }
}

/// The shell, docker and custom executors: the job runs on this machine.
async fn execute_here(
    runner: &Runner,
    acq: &Acquisition,
    job: &JobResponse,
    admission: &Admission,
    (artifacts_in, sources): (Vec<Tarball>, Option<Arc<dyn HostSources>>),
    trace: &mut Trace,
    stops: &Stops,
) -> RunResult {
    let level = admission.level;
    let exec: Box<dyn Executor> = match runner.executor {
        ConfigExecutor::Plugin => match plugin_executor(runner, acq, admission, None) {
            Ok(e) => Box::new(e),
            Err(outcome) => return no_result(outcome),
        },
        ConfigExecutor::Custom => {
            let Some(cfg) = runner.custom.clone() else {
                return no_result(config_error("no [runners.custom] section".into()));
            };
            match CustomExecutor::new(cfg, runner.builds_dir.clone()) {
                Ok(e) => Box::new(e),
                Err(e) => return no_result(config_error(format!("[runners.custom]: {e}"))),
            }
        }
        ConfigExecutor::Docker => match runner.docker_executor(None).await {
            Ok(e) => Box::new(e),
            Err(e) => {
                let msg = format!("reaching the Docker Engine: {e}");
                trace.message(&format!("ERROR: {msg}"));
                return no_result(JobOutcome::failed(
                    FailureReason::RunnerSystemFailure,
                    None,
                    msg,
                ));
            }
        },
        _ => {
            let mut steps = JobRunner {
                builds_dir: runner.builds_dir.clone(),
                cache_dir: Some(runner.cache_dir.clone()),
                ..JobRunner::default()
            };
            if level == Isolation::Cgroup
                && let Err(outcome) = enter_cgroup(runner, acq, admission, &mut steps, trace)
            {
                return no_result(outcome);
            }
            Box::new(Steps {
                name: "shell",
                host: LocalHost::default(),
                runner: steps,
            })
        }
    };
    let inputs = (artifacts_in, sources);
    run_on(runner, exec.as_ref(), acq, job, inputs, trace, stops).await
}

/// VM starts counted on the runner's job board (its status page and `/metrics`).
#[derive(Debug)]
struct BoardStarts(Arc<slipway_status::JobBoard>);

impl slipway_executor::nesting::VmStartSink for BoardStarts {
    fn vm_started(&self, image: &str, warm: bool) {
        self.0.vm_started(image, warm);
    }
}
