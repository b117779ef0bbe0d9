//! Which executor runs a job: resolved once per runner into an [`ExecutorProvider`] (as GitLab
//! Runner's `ExecutorProvider` and youki's cgroup-manager factory), asked for one executor per
//! job by its level and [`Place`]. The lifecycle never picks an executor itself, and tests put
//! a provider of their own in its place.

use std::sync::Arc;
use std::time::Duration;

use slipway_config::Executor as ConfigExecutor;
use slipway_connector::Client;
use slipway_executor::{
    CustomExecutor, Executor, Isolation, JobRunner, LocalHost, NestingExecutor, PluginExecutor,
    SshHost, Steps, cgroup,
};
use slipway_job::{FailureReason, JobOutcome, Trace};
use slipway_taskscaler::{Acquisition, Resources};

use super::Runner;

/// Where a job's executor reaches its slot.
#[derive(Debug, Clone)]
pub enum Place {
    /// This machine (the `shell`, `docker`, `custom` executors and local `plugin` runners).
    Here,
    /// An instance, over its SSH connection.
    Instance(Arc<Client>),
}

/// What a job gets on its runner, decided once, before capacity is reserved for it: what it
/// runs with is what was reserved for it, whatever the runner's `environment` adds later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The isolation level it runs at (`none` for a `plugin` runner's jobs: ordinary slots).
    pub level: Isolation,
    /// The resources it asked for.
    pub request: Resources,
    /// The executor plugin's level it runs at, for a `plugin` runner.
    pub plugin_level: Option<String>,
}

/// How long a probe of a job's instance may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Hands out the executor for each job of a runner.
#[async_trait::async_trait]
pub trait ExecutorProvider: Send + Sync + std::fmt::Debug {
    /// The executor for a job admitted as `admission` on its slot `acq`, reached at `place`;
    /// the outcome that ends the job when there can be none (a refused level, a missing
    /// section, an engine out of reach), said in `trace`.
    async fn executor<'a>(
        &'a self,
        runner: &'a Runner,
        acq: &'a Acquisition,
        admission: &'a Admission,
        place: &'a Place,
        trace: &mut Trace,
    ) -> Result<Box<dyn Executor + 'a>, JobOutcome>;

    /// One cheap round trip to the job's instance (`exit 0` over its connection, dialled again
    /// if it closed), as GitLab's acquire heartbeat does: why it does not answer, if it does
    /// not.
    async fn probe(&self, runner: &Runner, acq: &Acquisition) -> Result<(), String> {
        tokio::time::timeout(PROBE_TIMEOUT, runner.answers(acq))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")))
    }
}

/// Slipway's own executors, by the runner's `executor` and the job's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinExecutors {
    /// `shell`: bash on this machine (in the slot's cgroup at `cgroup`).
    Shell,
    /// `docker`: a container on this machine's engine.
    Docker,
    /// `custom`: GitLab's custom executor driver.
    Custom,
    /// `plugin`: an executor plugin's stages.
    Plugin,
    /// `instance` and `docker-autoscaler`: on an autoscaled instance, at the job's level
    /// (bash, a slot cgroup, a container through its engine, a VM from its nesting daemon).
    Instance,
}

impl BuiltinExecutors {
    /// The provider for a runner with `executor` in its config.
    pub fn of(executor: &ConfigExecutor) -> BuiltinExecutors {
        match executor {
            // Unknown names never pass validation: a runner that has one runs nothing else.
            ConfigExecutor::Shell | ConfigExecutor::Unknown(_) => BuiltinExecutors::Shell,
            ConfigExecutor::Docker => BuiltinExecutors::Docker,
            ConfigExecutor::Custom => BuiltinExecutors::Custom,
            ConfigExecutor::Plugin => BuiltinExecutors::Plugin,
            ConfigExecutor::Instance | ConfigExecutor::DockerAutoscaler => {
                BuiltinExecutors::Instance
            }
        }
    }
}

#[async_trait::async_trait]
impl ExecutorProvider for BuiltinExecutors {
    async fn executor<'a>(
        &'a self,
        runner: &'a Runner,
        acq: &'a Acquisition,
        admission: &'a Admission,
        place: &'a Place,
        trace: &mut Trace,
    ) -> Result<Box<dyn Executor + 'a>, JobOutcome> {
        let level = admission.level;
        if let Place::Instance(_) = place
            && let Some(s) = &runner.subtrees
        {
            s.used(&acq.instance_id);
        }
        match (self, place) {
            (BuiltinExecutors::Plugin, Place::Here) => {
                Ok(Box::new(plugin_executor(runner, acq, admission, None)?))
            }
            (_, Place::Instance(_)) if runner.executor_plugin.is_some() => {
                let instance = instance_of(&acq.connect_info);
                Ok(Box::new(plugin_executor(
                    runner,
                    acq,
                    admission,
                    Some(instance),
                )?))
            }
            (BuiltinExecutors::Custom, _) => {
                let Some(cfg) = runner.custom.clone() else {
                    return Err(config_error("no [runners.custom] section".into()));
                };
                match CustomExecutor::new(cfg, runner.builds_dir.clone()) {
                    Ok(e) => Ok(Box::new(e)),
                    Err(e) => Err(config_error(format!("[runners.custom]: {e}"))),
                }
            }
            (BuiltinExecutors::Docker, Place::Here) => match runner.docker_executor(None).await {
                Ok(e) => Ok(Box::new(e)),
                Err(e) => Err(system_failure(
                    trace,
                    format!("reaching the Docker Engine: {e}"),
                )),
            },
            (_, Place::Instance(client)) if matches!(level, Isolation::Microvm | Isolation::Vm) => {
                let Some(nesting) = runner.nesting.clone() else {
                    return Err(config_error(format!(
                        "isolation {level} needs [runners.autoscaler.vm_isolation] enabled = true"
                    )));
                };
                Ok(Box::new(NestingExecutor {
                    client: client.clone(),
                    instance: acq.instance_id.clone(),
                    config: nesting,
                    level,
                    starts: Some(Arc::new(BoardStarts(runner.board.clone()))),
                }))
            }
            (_, Place::Instance(client)) if level == Isolation::Docker => {
                trace.message("Using isolation docker through the instance's Docker Engine");
                match runner
                    .docker_executor(Some((&acq.instance_id, client.clone())))
                    .await
                {
                    Ok(e) => Ok(Box::new(e)),
                    Err(e) => Err(system_failure(
                        trace,
                        format!("reaching the instance's Docker Engine: {e}"),
                    )),
                }
            }
            (_, Place::Instance(client)) => {
                let steps = steps_for(runner, acq, admission, trace)?;
                if level == Isolation::Instance {
                    trace.message(&format!(
                        "Using isolation instance: instance {} is this job's alone and is \
                         removed after it",
                        acq.instance_id
                    ));
                }
                Ok(Box::new(Steps {
                    name: "instance",
                    host: SshHost(client),
                    runner: steps,
                }))
            }
            (_, Place::Here) => Ok(Box::new(Steps {
                name: "shell",
                host: LocalHost::default(),
                runner: steps_for(runner, acq, admission, trace)?,
            })),
        }
    }
}

/// Bash steps for a job, in the slot's cgroup at the `cgroup` level.
fn steps_for(
    runner: &Runner,
    acq: &Acquisition,
    admission: &Admission,
    trace: &mut Trace,
) -> Result<JobRunner, JobOutcome> {
    let mut steps = JobRunner {
        builds_dir: runner.builds_dir.clone(),
        cache_dir: Some(runner.cache_dir.clone()),
        ..JobRunner::default()
    };
    if admission.level == Isolation::Cgroup {
        enter_cgroup(runner, acq, admission, &mut steps, trace)?;
    }
    Ok(steps)
}

fn config_error(msg: String) -> JobOutcome {
    JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg)
}

/// `msg` in the trace, and the job's end as a system failure.
fn system_failure(trace: &mut Trace, msg: String) -> JobOutcome {
    trace.message(&format!("ERROR: {msg}"));
    JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
}

/// Put `steps` in the slot's cgroup (limits: the job's share of the instance when its shape
/// declares one, else what it asked for).
fn enter_cgroup(
    runner: &Runner,
    acq: &Acquisition,
    admission: &Admission,
    steps: &mut JobRunner,
    trace: &mut Trace,
) -> Result<(), JobOutcome> {
    let share = acq.resources.unwrap_or(admission.request);
    let limits = cgroup::limits_for(share.cpu_millis, share.memory_bytes);
    match runner
        .cgroups
        .apply(steps, &acq.instance_id, acq.slot, &limits)
    {
        Ok(path) => {
            trace.message(&format!("Using isolation cgroup in {path}"));
            Ok(())
        }
        Err(e) => {
            let msg = format!("slot cgroup: {e}");
            trace.message(&format!("ERROR: {msg}"));
            Err(config_error(msg))
        }
    }
}

/// A `plugin` runner's executor for a job: on its instance when `instance` is given.
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

/// VM starts counted on the runner's job board (its status page and `/metrics`).
#[derive(Debug)]
struct BoardStarts(Arc<slipway_status::JobBoard>);

impl slipway_executor::nesting::VmStartSink for BoardStarts {
    fn vm_started(&self, image: &str, warm: bool) {
        self.0.vm_started(image, warm);
    }
}
