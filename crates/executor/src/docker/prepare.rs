//! A job's preparation, up to its running build container: the job's request checked against
//! the configuration, images, network and builds volume, services, then the build container.

use std::time::Duration;

use slipway_job::model::{Image, JobResponse};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::DockerExecutor;
use super::config::allowed;
use super::host::FirstStep;
use super::names::RunNames;
use super::network::SlotLease;
use super::plan::{Limits, Plan, system_failure};
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

/// Where and when a run is prepared: its names, its slot, the slot's cgroup, the job's cancel
/// and when the job started.
#[derive(Debug)]
pub(super) struct Setup<'a> {
    /// The run's names.
    pub(super) run: &'a RunNames,
    /// The job's slot.
    pub(super) slot: u32,
    /// The slot's cgroup, if any.
    pub(super) cgroup_parent: Option<String>,
    /// The job's cancel.
    pub(super) cancel: &'a CancellationToken,
    /// When the job started: its timeout covers its preparation too.
    pub(super) started: Instant,
    /// The job helper, when the job's data moves in its build container.
    pub(super) helper: Option<&'a crate::data::Helper>,
}

/// When preparation must stop: the job is canceled, or out of time.
#[derive(Debug)]
pub(super) struct Stop<'a> {
    cancel: &'a CancellationToken,
    timeout: Duration,
    deadline: Instant,
}

impl<'a> Stop<'a> {
    /// The job's cancel, and its timeout counted from `started`.
    fn new(job: &JobResponse, cancel: &'a CancellationToken, started: Instant) -> Self {
        let timeout = job.timeout();
        Stop {
            cancel,
            timeout,
            deadline: started + timeout,
        }
    }

    /// The job's failure, said in the trace, once it is canceled or out of time.
    fn stopped(&self, trace: &mut Trace) -> Option<JobOutcome> {
        if self.cancel.is_cancelled() {
            trace.message("ERROR: job canceled");
            Some(JobOutcome::failed(
                FailureReason::JobCanceled,
                None,
                "job canceled",
            ))
        } else if Instant::now() >= self.deadline {
            let msg = format!(
                "job execution timeout: exceeded {}",
                crate::job::fmt_secs(self.timeout)
            );
            trace.message(&format!("ERROR: {msg}"));
            Some(JobOutcome::failed(
                FailureReason::JobExecutionTimeout,
                None,
                msg,
            ))
        } else {
            None
        }
    }

    /// [`Stop::stopped`] as an error, to stop at with `?`.
    pub(super) fn check(&self, trace: &mut Trace) -> Result<(), JobOutcome> {
        match self.stopped(trace) {
            Some(o) => Err(o),
            None => Ok(()),
        }
    }
}

/// The job's failure for a configuration error, said in the trace.
fn config_error(trace: &mut Trace, msg: String) -> JobOutcome {
    trace.message(&format!("ERROR: {msg}"));
    JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg)
}

/// The job's failure for a cancel noticed without [`Stop::stopped`] saying why.
fn canceled() -> JobOutcome {
    JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled")
}

impl DockerExecutor {
    /// Everything up to a running build container: its id and attached main shell, or the
    /// job's failure. What was created is left for the caller's cleanup.
    pub(super) async fn prepare(
        &self,
        job: &JobResponse,
        setup: Setup<'_>,
        trace: &mut Trace,
        lease: Option<&mut SlotLease>,
    ) -> Result<(String, FirstStep, bool), JobOutcome> {
        let stop = Stop::new(job, setup.cancel, setup.started);
        let helper = setup.helper;
        let plan = self.plan(job, setup, lease.as_deref(), trace)?;
        stop.check(trace)?;
        self.prepare_images_and_network(&plan, lease, &stop, trace)
            .await?;
        let services = self.start_services(&plan, &stop, trace).await?;
        stop.check(trace)?;
        let volume = match helper {
            Some(h) => self.helper_volume(h).await,
            None => None,
        };
        let (id, first) = self
            .start_build_container(&plan, volume.as_deref(), trace)
            .await?;
        self.report_exited_services(services, trace).await;
        Ok((id, first, volume.is_some()))
    }

    /// What the job asks for, checked against the configuration: the run's plan, or the job's
    /// failure.
    fn plan<'a>(
        &self,
        job: &'a JobResponse,
        setup: Setup<'a>,
        lease: Option<&SlotLease>,
        trace: &mut Trace,
    ) -> Result<Plan<'a>, JobOutcome> {
        let memory = self
            .config
            .memory_bytes()
            .map_err(|e| config_error(trace, e.to_string()))?;
        let nano_cpus = self
            .config
            .nano_cpus()
            .map_err(|e| config_error(trace, e.to_string()))?;
        let image = self.job_image(job).map_err(|m| config_error(trace, m))?;

        trace.message(&format!(
            "Using Docker executor with image {} ...",
            image.name
        ));
        let services: Vec<Image> = self
            .config
            .services
            .iter()
            .filter(|s| !s.name.is_empty())
            .map(|s| s.to_image())
            .chain(job.services.iter().cloned())
            .collect();
        let mut policies = Vec::new();
        for img in std::iter::once(&image).chain(services.iter()) {
            let p = self
                .config
                .pull_policies_for(img)
                .map_err(|m| config_error(trace, m))?;
            policies.push((img.name.clone(), p));
        }

        let Setup {
            run,
            slot,
            cgroup_parent,
            ..
        } = setup;
        let cgroup_parent = cgroup_parent
            .filter(|p| !p.is_empty())
            .or_else(|| self.config.cgroup_parent.clone().filter(|p| !p.is_empty()));
        let (network, create_network) = match lease {
            Some(l) => (l.name.clone(), !l.created),
            None => (run.network(), true),
        };
        Ok(Plan {
            job,
            run,
            slot,
            image,
            services,
            policies,
            labels: run.labels(job.id, slot),
            limits: Limits {
                memory,
                nano_cpus,
                cgroup_parent,
            },
            network,
            create_network,
        })
    }

    /// The build container's image (the job's, else `[runners.docker] image`), checked with
    /// the service images against the allowed ones; why not, when it is not allowed.
    fn job_image(&self, job: &JobResponse) -> Result<Image, String> {
        let mut image = job.image.clone().unwrap_or_default();
        if image.name.is_empty() {
            image.name = self.config.image.clone().unwrap_or_default();
        }
        if image.name.is_empty() {
            return Err(
                "no image: the job names none and [runners.docker] image is not set".into(),
            );
        }
        if !allowed(&self.config.allowed_images, &image.name) {
            return Err(format!(
                "the image {:?} is not present on the list of allowed images: {}",
                image.name,
                self.config.allowed_images.join(", ")
            ));
        }
        for s in &job.services {
            if !allowed(&self.config.allowed_services, &s.name) {
                return Err(format!(
                    "the service {:?} is not present on the list of allowed services: {}",
                    s.name,
                    self.config.allowed_services.join(", ")
                ));
            }
        }
        Ok(image)
    }

    /// Apply the pull policies to every image while the network and the builds volume are
    /// created (independent calls, so at once); stop at a cancel or the timeout.
    async fn prepare_images_and_network(
        &self,
        plan: &Plan<'_>,
        lease: Option<&mut SlotLease>,
        stop: &Stop<'_>,
        trace: &mut Trace,
    ) -> Result<(), JobOutcome> {
        let setup = async {
            tokio::join!(
                self.create_network(plan, lease.as_deref()),
                self.create_builds_volume(plan)
            )
        };
        let pulls = self.pull_images(&plan.policies, trace);
        let both = async { tokio::join!(pulls, setup) };
        let done = tokio::select! {
            r = both => Some(r),
            _ = stop.cancel.cancelled() => None,
            _ = tokio::time::sleep_until(stop.deadline) => None,
        };
        let Some((pulled, (net, vol))) = done else {
            return Err(stop.stopped(trace).unwrap_or_else(canceled));
        };
        if let Err(msg) = pulled {
            trace.message(&format!("ERROR: Job failed: {msg}"));
            return Err(JobOutcome::failed(
                FailureReason::ImagePullFailure,
                None,
                msg,
            ));
        }
        net.map_err(|e| system_failure(trace, "creating the job's network", e))?;
        if let Some(l) = lease {
            l.created = true;
        }
        vol.map_err(|e| system_failure(trace, "creating the builds volume", e))?;
        Ok(())
    }
}
