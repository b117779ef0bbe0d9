//! Before a job holds a slot: what it may have (isolation level, resources), capacity reserved
//! for it, and the slot acquired. A job refused at any of these steps ends with a [`NoSlot`].

use slipway_executor::{Isolation, isolation};
use slipway_job::{FailureReason, Trace};
use slipway_job::{JobResponse, JobStatus};
use slipway_taskscaler::{Acquisition, Error as TsError, Resources};
use tokio_util::sync::CancellationToken;

use crate::runner::{Admission, Runner};

/// Why a job did not get a slot: its status (failed or canceled) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSlot {
    /// `Failed` or `Canceled`.
    pub status: JobStatus,
    /// What happened.
    pub message: String,
    /// The request can never be met by this runner (no shape fits, a bad variable).
    pub unsupported: bool,
    /// GitLab's failure reason for the job.
    pub failure_reason: FailureReason,
}

impl NoSlot {
    fn failed(trace: &mut Trace, e: &dyn std::fmt::Display) -> NoSlot {
        trace.message(&format!("ERROR: {e}"));
        NoSlot {
            status: JobStatus::Failed,
            message: e.to_string(),
            unsupported: false,
            failure_reason: FailureReason::RunnerSystemFailure,
        }
    }

    fn canceled(message: &str) -> NoSlot {
        NoSlot {
            status: JobStatus::Canceled,
            message: message.into(),
            unsupported: false,
            failure_reason: FailureReason::JobCanceled,
        }
    }
}

/// The level and resources `job` gets on `runner`, or why it can never run there.
pub fn admit(runner: &Runner, job: &JobResponse, trace: &mut Trace) -> Result<Admission, NoSlot> {
    let level = isolation_of(runner, job, trace)?;
    let request = request_of(job, trace)?;
    // Checked by `isolation_of` for a plugin runner: its error was reported there.
    let plugin_level = runner
        .executor_plugin
        .is_some()
        .then(|| plugin_level(runner, job).ok())
        .flatten();
    Ok(Admission {
        level,
        request,
        plugin_level,
    })
}

/// The job's resource request from its variables; an unusable one fails the job.
pub fn request_of(job: &JobResponse, trace: &mut Trace) -> Result<Resources, NoSlot> {
    crate::lifecycle::request::of_job(job).map_err(|e| NoSlot {
        unsupported: true,
        failure_reason: FailureReason::RunnerUnsupported,
        ..NoSlot::failed(trace, &e)
    })
}

/// The isolation level the job gets on `runner`: what it asks for (`SLIPWAY_ISOLATION`), if
/// the runner allows it; otherwise it fails before it starts (`runner_configuration_error`).
pub fn isolation_of(
    runner: &Runner,
    job: &JobResponse,
    trace: &mut Trace,
) -> Result<Isolation, NoSlot> {
    let refused = |trace: &mut Trace, e: &dyn std::fmt::Display| NoSlot {
        unsupported: true,
        failure_reason: FailureReason::RunnerConfigurationError,
        ..NoSlot::failed(trace, e)
    };
    if runner.executor_plugin.is_some() {
        // The plugin's own levels; its jobs take ordinary slots.
        return plugin_level(runner, job)
            .map(|_| Isolation::None)
            .map_err(|e| refused(trace, &e));
    }
    runner
        .isolation
        .resolve(job.variable(isolation::VARIABLE), &runner.name)
        .map_err(|e| refused(trace, &e))
}

/// The level a `plugin` runner's job gets: what it asks for (`SLIPWAY_ISOLATION`) among the
/// levels the plugin declared (and the runner's `allowed_isolation`, when set), else the
/// runner's `isolation` or the plugin's first level.
pub fn plugin_level(runner: &Runner, job: &JobResponse) -> Result<String, String> {
    let Some(plugin) = &runner.executor_plugin else {
        return Err(format!("runner {:?} has no executor plugin", runner.name));
    };
    let caps = plugin.host.capabilities();
    let allowed: Vec<&String> = caps
        .isolation_levels
        .iter()
        .filter(|l| plugin.allowed.as_ref().is_none_or(|a| a.contains(l)))
        .collect();
    let asked = job
        .variable(isolation::VARIABLE)
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let level = match asked {
        Some(v) => v.to_owned(),
        None => match &plugin.default {
            Some(d) => d.clone(),
            None => allowed.first().map(|l| (*l).clone()).unwrap_or_default(),
        },
    };
    if allowed.iter().any(|l| **l == level) {
        Ok(level)
    } else {
        Err(format!(
            "the job asks for isolation {level:?} but runner {:?} (executor plugin {:?}) allows only {}",
            runner.name,
            caps.name,
            allowed
                .iter()
                .map(|l| format!("{l:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Reserve capacity for `key` (a slot's share, or a whole fresh instance for the `instance`
/// level), waiting (with a trace line) while the runner has none free.
pub async fn reserve(
    runner: &Runner,
    key: &str,
    admission: &Admission,
    trace: &mut Trace,
    cancel: &CancellationToken,
) -> Result<(), NoSlot> {
    let request = &admission.request;
    let refused = |trace: &mut Trace, e: TsError| {
        let unsupported = matches!(e, TsError::Unsatisfiable(_));
        NoSlot {
            unsupported,
            failure_reason: if unsupported {
                FailureReason::RunnerUnsupported
            } else {
                FailureReason::RunnerSystemFailure
            },
            ..NoSlot::failed(trace, &e)
        }
    };
    let whole = admission.level == Isolation::Instance;
    let first = if whole {
        trace.message("Using isolation instance: the job gets a fresh instance of its own");
        runner.reserve_instance(key, request)
    } else {
        runner.reserve(key, request)
    };
    match first {
        Ok(()) => Ok(()),
        Err(e @ (TsError::NoCapacity(_) | TsError::NoIdleCapacity(_))) => {
            trace.message(&format!("Waiting for capacity: {e}"));
            let wait = async {
                if whole {
                    runner.reserve_wait_instance(key, request).await
                } else {
                    runner.reserve_wait(key, request).await
                }
            };
            tokio::select! {
                r = wait => r.map_err(|e| refused(trace, e)),
                _ = cancel.cancelled() => Err(NoSlot::canceled("canceled while waiting for capacity")),
            }
        }
        Err(e) => Err(refused(trace, e)),
    }
}

/// Bind the reservation `key` to a slot; the reservation is given back when that fails.
pub async fn acquire(
    runner: &Runner,
    key: &str,
    trace: &mut Trace,
    cancel: &CancellationToken,
) -> Result<Acquisition, NoSlot> {
    trace.message(&format!("Waiting for a slot on runner {:?}", runner.name));
    let acquired = tokio::select! {
        a = runner.acquire(key) => a,
        _ = cancel.cancelled() => {
            runner.unreserve(key);
            return Err(NoSlot::canceled("canceled while waiting for a slot"));
        }
    };
    acquired.map_err(|e| {
        runner.unreserve(key);
        NoSlot::failed(trace, &e)
    })
}
