//! A GitLab job's `artifacts:`: what the executor collected, archived (zip, gzip or raw, with
//! `exclude` and `untracked`) and uploaded.

use std::collections::BTreeSet;
use std::sync::Arc;

use slipway_artifacts::{Format, Globs};
use slipway_executor::CollectedArtifacts;
use slipway_gitlab::{Secret, UploadOptions};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use tokio_util::sync::CancellationToken;

use super::Source;
use slipway_artifacts::keeps;

/// Archive and upload each collected `artifacts:` entry; a failed upload fails a job that had
/// succeeded.
pub(super) async fn upload_artifacts(
    source: &Source,
    job: &JobResponse,
    collected: Vec<CollectedArtifacts>,
    tracked: &Arc<BTreeSet<String>>,
    outcome: &mut JobOutcome,
    trace: &mut Trace,
    stop: &CancellationToken,
) {
    let token = Secret::new(job.token.clone());
    let compression = crate::archive::compression_of(job, "ARTIFACT_COMPRESSION_LEVEL", trace);
    for c in collected {
        let Some(spec) = job.artifacts.get(c.spec) else {
            continue;
        };
        let kind = match spec.artifact_type.as_str() {
            "" => "archive",
            t => t,
        };
        trace.message(&format!(
            "Uploading artifacts for {} job",
            if outcome.is_success() {
                "successful"
            } else {
                "failed"
            }
        ));
        let format = match spec.artifact_format.as_str() {
            "" => Format::Zip,
            f => match Format::parse(f) {
                Some(format) => format,
                None => {
                    // Never fail a job for a report format this version cannot write.
                    trace.message(&format!(
                        "WARNING: artifacts {kind:?} in format {f:?} are not supported yet \
                         (zip, gzip and raw are); not uploaded"
                    ));
                    continue;
                }
            },
        };
        // Made relative to the project directory where the job ran; those outside it were
        // dropped there with a warning.
        let (paths, exclude, untracked) = (c.paths, c.exclude, spec.untracked);
        // Shared, not copied: the list can hold every file of a large repository.
        let tracked = Arc::clone(tracked);
        let Some(tar) = c.tar.path().map(std::path::Path::to_path_buf) else {
            fail_upload(
                outcome,
                trace,
                "archiving artifacts: the collected files are not in a file".into(),
            );
            continue;
        };
        let scratch = source.runner.scratch_dir.as_deref();
        let archive = match slipway_executor::scratch_file(
            scratch,
            &format!("artifacts-{}-", job.id),
            ".archive",
        ) {
            Ok(f) => f,
            Err(e) => {
                fail_upload(
                    outcome,
                    trace,
                    format!("archiving artifacts: creating a file: {e}"),
                );
                continue;
            }
        };
        // Compressing is CPU work: off the runtime's threads. File to file, streamed: memory
        // does not grow with the artifacts. The archive's file goes with the task and comes
        // back, so an interrupted job cannot leave one behind that the task then writes.
        let archived = tokio::task::spawn_blocking(move || {
            let includes = Globs::new(&paths).map_err(|e| e.to_string())?;
            let excludes = Globs::new(&exclude).map_err(|e| e.to_string())?;
            let keep = |p: &str| keeps(p, &includes, &excludes, untracked, &tracked);
            slipway_artifacts::archive_file_from_tar_file(
                &tar,
                &archive,
                format,
                &keep,
                compression,
            )
            .map(|a| (format, a, archive))
            .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        let (format, made, archive) = match archived {
            Ok(a) => a,
            Err(msg) => {
                fail_upload(outcome, trace, format!("archiving artifacts: {msg}"));
                continue;
            }
        };
        if made.files == 0 {
            trace.message(&format!(
                "WARNING: no files to upload for artifacts {kind:?} (paths {:?})",
                spec.paths
            ));
            continue;
        }
        trace.message(&format!(
            "{} files and directories; uploading artifacts as {kind:?} to coordinator...",
            made.files
        ));
        let name = match (&made.raw_path, spec.name.as_str()) {
            (Some(path), _) => Some(path.clone()),
            (None, "") => None,
            (None, n) => Some(n.to_string()),
        };
        let opts = UploadOptions {
            name,
            artifact_type: kind.to_string(),
            artifact_format: format.as_str().to_string(),
            expire_in: (!spec.expire_in.is_empty()).then(|| spec.expire_in.clone()),
        };
        let uploaded = tokio::select! {
            r = source.client.upload_artifacts_file(job.id, &token, &archive, &opts) => r,
            // A shutdown does not wait for uploads: the job's state still gets reported.
            _ = stop.cancelled() => {
                fail_upload(outcome, trace, "uploading artifacts: interrupted by the runner's shutdown".into());
                return;
            }
        };
        match uploaded {
            Ok(()) => trace.message(&format!(
                "Uploading artifacts as {kind:?} to coordinator... 201 Created  id={}",
                job.id
            )),
            Err(e) => fail_upload(outcome, trace, format!("uploading artifacts: {e}")),
        }
    }
}

fn fail_upload(outcome: &mut JobOutcome, trace: &mut Trace, msg: String) {
    trace.message(&format!("ERROR: {msg}"));
    if outcome.is_success() {
        *outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg);
    }
}
