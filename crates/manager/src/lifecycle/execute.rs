//! A job on its slot: the executor for its level — on this machine (shell, docker, custom,
//! plugin) or on its instance over SSH (bash, a slot cgroup, a container, a VM) — run until it
//! ends, is canceled, or loses its instance.

use slipway_executor::{CollectedArtifacts, JobSlot, RunResult, Tarball};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use slipway_taskscaler::Acquisition;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use slipway_config::{Executor as ConfigExecutor, FetchSources, JobData};
use slipway_executor::{HostData, HostSources};

use super::{SourcesAt, Stops};
use crate::runner::Admission;
use crate::runner::{Place, Runner};

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
    (sources, data): (Option<Arc<dyn HostSources>>, Option<HostData>),
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
    let place = if runner.local {
        Place::Here
    } else {
        match runner.client(acq).await {
            Ok(c) => Place::Instance(c),
            Err(e) => {
                let msg = crate::chain::Chain(&e).to_string();
                trace.message(&format!("ERROR: {msg}"));
                // One refused connection (sshd's MaxStartups under a burst, say) is not a dead
                // instance: a second round trip tells.
                let failed = runner
                    .executors
                    .probe(runner, acq)
                    .await
                    .is_err()
                    .then(|| msg.clone());
                return Executed {
                    outcome: JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg),
                    artifacts: Vec::new(),
                    instance_failed: failed,
                };
            }
        }
    };
    let lost = acq.instance_lost();
    let mut instance_lost = false;

    let mut result = {
        let inputs = (artifacts_in, sources, data);
        let run = run_on(
            runner,
            acq,
            job,
            admission,
            &place,
            inputs,
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
    // This machine is no instance that can fail under a job: its jobs are never run twice.
    if runner.local {
        return Executed {
            outcome: result.outcome,
            artifacts: result.artifacts,
            instance_failed: None,
        };
    }
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
        if let Err(why) = runner.executors.probe(runner, acq).await {
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

/// Where `runner` fetches its jobs' sources: where their steps run (an instance's shell, a
/// container, a VM, this machine's shell, an executor plugin's environment) unless the runner
/// says `fetch_sources = "manager"`. Whether the manager may step in where that host has no
/// git is the fetch's own setting (`instance_or_manager`; `GitSources::with_manager_fallback`).
/// The custom executor's driver fetches its own.
pub(super) fn sources_at(runner: &Runner) -> SourcesAt {
    let on_host = matches!(
        runner.fetch_sources,
        FetchSources::Instance | FetchSources::InstanceOrManager
    );
    if on_host && runner.executor != ConfigExecutor::Custom {
        SourcesAt::Host
    } else {
        SourcesAt::Manager
    }
}

/// Where a job's dependencies, caches and artifacts move.
#[derive(Debug, Clone)]
pub enum DataAt {
    /// Through the manager (`job_data = "manager"`, the `microvm` and `vm` levels, whose
    /// guests have no network, and the custom and plugin executors).
    Manager,
    /// Where the job runs, by the job helper: the plan so far (the helper, the limits).
    Host(HostData),
    /// Where the job runs, but this manager has no job helper: a job with data to move fails.
    NoHelper,
}

impl DataAt {
    /// Why a job with data to move cannot run on a manager without a job helper.
    pub fn no_helper() -> JobOutcome {
        JobOutcome::failed(
            FailureReason::RunnerConfigurationError,
            None,
            "this manager has no job helper (slipway-helper) to move the job's artifacts and \
             cache where it runs: install it beside slipway (`make helper`), or set \
             job_data = \"manager\" in [[runners]]",
        )
    }
}

/// Where `runner` moves the data of a job: where its steps run (the instance, the build
/// container, the VM's guest on its user-mode network, an executor plugin's environment when
/// the plugin offers `job_data`) unless the runner says `job_data = "manager"`, or the job's
/// environment is another program's that does not say it reaches the servers (custom
/// executors, other plugins).
pub(super) fn data_at(runner: &Runner) -> DataAt {
    let plugin_offers = runner
        .executor_plugin
        .as_ref()
        .is_some_and(|p| p.host.capabilities().job_data);
    let here = runner.job_data == JobData::Manager
        || runner.executor == ConfigExecutor::Custom
        || (runner.executor == ConfigExecutor::Plugin && !plugin_offers);
    match (&runner.helper, here) {
        (_, true) => DataAt::Manager,
        (None, false) => DataAt::NoHelper,
        (Some(helper), false) => DataAt::Host(HostData {
            helper: helper.clone(),
            limits: slipway_job::data::ArchiveLimits {
                max_size: runner.archive_limits.max_size,
                max_entries: runner.archive_limits.max_entries,
                max_ratio: runner.archive_limits.max_ratio,
            },
            ca_pem: None,
            restore: Vec::new(),
            downloads: Vec::new(),
            collect: Vec::new(),
            artifacts: false,
            tracked: Arc::default(),
        }),
    }
}

/// Run `job` on the acquisition's slot with the executor its runner's provider hands out.
#[allow(clippy::too_many_arguments)]
async fn run_on(
    runner: &Runner,
    acq: &Acquisition,
    job: &JobResponse,
    admission: &Admission,
    place: &Place,
    (artifacts_in, sources, data): (Vec<Tarball>, Option<Arc<dyn HostSources>>, Option<HostData>),
    trace: &mut Trace,
    stops: &Stops,
) -> RunResult {
    let exec = match runner
        .executors
        .executor(runner, acq, admission, place, trace)
        .await
    {
        Ok(e) => e,
        Err(outcome) => {
            return RunResult {
                outcome,
                artifacts: Vec::new(),
            };
        }
    };
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
            max_collected: Some(runner.archive_limits.max_size),
            sources,
            data,
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
