//! What a GitLab job finds in its directory before its steps: its sources (fetched on the
//! manager) and its dependencies' artifacts, each as a tar stream in a file.

use std::sync::Arc;

use slipway_executor::Tarball;
use slipway_gitlab::Secret;
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use tokio_util::sync::CancellationToken;

use super::Source;
use crate::lifecycle::{DataAt, Inputs, SourcesAt};
use slipway_config::Executor;
use slipway_executor::HostSources;
use slipway_executor::{Collect, HostData};
use slipway_gitlab::UploadOptions;
use slipway_job::data::DataStep;

/// The job's sources and its dependencies' artifacts; a failure ends the job.
pub(super) async fn inputs_of(
    source: &Source,
    job: &JobResponse,
    at: SourcesAt,
    data: &DataAt,
    trace: &mut Trace,
    cancel: &CancellationToken,
) -> Result<Inputs, JobOutcome> {
    let failed = |msg: String, cancel: &CancellationToken| {
        if cancel.is_cancelled() {
            JobOutcome::failed(FailureReason::JobCanceled, None, msg)
        } else {
            JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
        }
    };
    let mut inputs = Inputs::default();
    if source.runner.executor == Executor::Custom {
        if !job.git_info.repo_url.is_empty() || !job.dependencies.is_empty() {
            trace.message(
                "WARNING: the custom executor gets no sources or dependencies' artifacts from \
                 slipway yet; its driver must fetch them",
            );
        }
        return Ok(inputs);
    }
    // Bounded by the job's timeout: a hung fetch must not hold the job's slot for ever.
    let limit = job.timeout();
    if at == SourcesAt::Host {
        // Fetched where the job runs, when its steps are next; only checked here.
        match source.git.on_host(job, trace).await {
            Ok(plan) => inputs.sources = plan.map(|p| Arc::new(p) as Arc<dyn HostSources>),
            Err(msg) => return Err(failed(msg, cancel)),
        }
    } else {
        match tokio::time::timeout(limit, source.git.get(job, trace, cancel)).await {
            Ok(Ok(Some(s))) => {
                inputs.tars.push(s.tar);
                inputs.tracked = Arc::new(s.tracked);
            }
            Ok(Ok(None)) => {}
            Ok(Err(msg)) => return Err(failed(msg, cancel)),
            Err(_) => {
                let msg =
                    format!("getting the sources took longer than the job's timeout ({limit:?})");
                trace.message(&format!("ERROR: {msg}"));
                return Err(JobOutcome::failed(
                    FailureReason::JobExecutionTimeout,
                    None,
                    msg,
                ));
            }
        }
    }
    // GitLab's order: sources, the cache (the lifecycle's restore stage puts it here), then the
    // dependencies' artifacts (which win over a stale cache of the same paths).
    inputs.leading = inputs.tars.len();
    let moves_data =
        job.dependencies.iter().any(|d| d.artifacts_file.is_some()) || !job.artifacts.is_empty();
    match data {
        DataAt::Host(base) => {
            inputs.data = Some(helper_plan(source, job, base.clone()));
            return Ok(inputs);
        }
        DataAt::NoHelper if moves_data => {
            let outcome = DataAt::no_helper();
            if let JobOutcome::Failed { message, .. } = &outcome {
                trace.message(&format!("ERROR: {message}"));
            }
            return Err(outcome);
        }
        DataAt::NoHelper | DataAt::Manager => {}
    }
    for dep in &job.dependencies {
        if dep.artifacts_file.is_none() {
            continue;
        }
        trace.message(&format!(
            "Downloading artifacts for {} ({})...",
            dep.name, dep.id
        ));
        let token = Secret::new(dep.token.clone());
        let attempts = crate::archive::attempts_of(job, "ARTIFACT_DOWNLOAD_ATTEMPTS");
        let mut tar = Err((String::new(), false));
        for attempt in 1..=attempts {
            if attempt > 1 {
                trace.message(&format!(
                    "Retrying to download the artifacts of {} (attempt {attempt} of {attempts})",
                    dep.name
                ));
            }
            // Through files, streamed: memory does not grow with the archive.
            tar = tokio::select! {
                r = dependency_tar(source, dep.id, &token) => r,
                _ = cancel.cancelled() => return Err(failed("canceled while downloading artifacts".into(), cancel)),
            };
            match &tar {
                // A refused archive is refused again: no retry.
                Ok(_) | Err((_, true)) => break,
                Err((e, _)) if attempt < attempts => {
                    trace.message(&format!(
                        "WARNING: downloading the artifacts of {}: {e}",
                        dep.name
                    ));
                }
                Err(_) => {}
            }
        }
        match tar {
            Ok(tar) => {
                trace.message(&format!(
                    "Downloading artifacts from coordinator... ok  id={}",
                    dep.id
                ));
                inputs.tars.push(tar);
            }
            Err((e, _)) => {
                let msg = format!(
                    "downloading the artifacts of {} ({}): {e}",
                    dep.name, dep.id
                );
                trace.message(&format!("ERROR: {msg}"));
                return Err(failed(msg, cancel));
            }
        }
    }
    Ok(inputs)
}

/// What the job helper moves for `job` where it runs: its dependencies' artifacts downloaded
/// from GitLab, its own artifacts uploaded there, each with the job's tokens (which stay out
/// of every command line) and the runner's TLS CA.
fn helper_plan(source: &Source, job: &JobResponse, mut data: HostData) -> HostData {
    data.ca_pem = source
        .tls_variables
        .iter()
        .find(|v| v.key == "CI_SERVER_TLS_CA_FILE")
        .map(|v| v.value.clone());
    let attempts = crate::archive::attempts_of(job, "ARTIFACT_DOWNLOAD_ATTEMPTS");
    data.downloads = job
        .dependencies
        .iter()
        .filter(|d| d.artifacts_file.is_some())
        .map(|d| DataStep::Download {
            name: d.name.clone(),
            id: d.id,
            url: source.client.artifacts_url(d.id),
            token: d.token.clone(),
            attempts,
        })
        .collect();
    let compression = job
        .variable("ARTIFACT_COMPRESSION_LEVEL")
        .unwrap_or_default()
        .to_string();
    for spec in &job.artifacts {
        let kind = match spec.artifact_type.as_str() {
            "" => "archive",
            t => t,
        };
        let format = match spec.artifact_format.as_str() {
            "" => "zip",
            f => f,
        };
        let name = (!spec.name.is_empty()).then(|| spec.name.clone());
        let opts = UploadOptions {
            name: name.clone(),
            artifact_type: kind.to_string(),
            artifact_format: format.to_string(),
            expire_in: (!spec.expire_in.is_empty()).then(|| spec.expire_in.clone()),
        };
        data.collect.push(Collect {
            when: spec.when,
            paths: spec.paths.clone(),
            exclude: spec.exclude.clone(),
            untracked: spec.untracked,
            step: DataStep::Upload {
                job_id: job.id,
                succeeded: true,
                url: source.client.upload_artifacts_url(job.id, &opts),
                token: job.token.clone(),
                artifact_type: opts.artifact_type,
                artifact_format: opts.artifact_format,
                name,
                expire_in: opts.expire_in,
                compression: compression.clone(),
                paths: Vec::new(),
                exclude: Vec::new(),
                untracked: spec.untracked,
                tar: String::new(),
            },
        });
    }
    data.artifacts = true;
    data
}

/// The artifacts of job `id` as a tar stream in a file: the zip downloaded into one file, then
/// converted into another within the runner's `[runners.archives]` limits. The error says
/// whether the archive was refused (a retry would be refused too).
async fn dependency_tar(
    source: &Source,
    id: u64,
    token: &Secret,
) -> Result<Tarball, (String, bool)> {
    let scratch = source.runner.scratch_dir.as_deref();
    let zip = slipway_executor::scratch_file(scratch, &format!("artifacts-{id}-"), ".zip")
        .map_err(|e| (format!("creating a file for the download: {e}"), false))?;
    source
        .client
        .download_artifacts_to(id, token, &zip)
        .await
        .map_err(|e| (e.to_string(), false))?;
    let limits = source.runner.archive_limits;
    crate::archive::unzipped(zip, scratch, &format!("artifacts-{id}-"), limits)
        .await
        .map_err(|e| (e.to_string(), e.is_refused()))
}
