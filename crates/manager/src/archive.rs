//! What the lifecycle's stages and the sources' reports share about archives and retries:
//! a zip turned into a tar stream on the scratch disk,
//! the compression a job asks for, and GitLab's `*_ATTEMPTS` variables.

use slipway_artifacts::Compression;
use slipway_executor::Tarball;
use slipway_job::{JobResponse, Trace};

/// Why a zip archive did not become a tar stream.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnzipError {
    /// The archive is unreadable, unsafe, or breaks the runner's `[runners.archives]` limits.
    #[error(transparent)]
    Archive(#[from] slipway_artifacts::ArtifactsError),
    /// The scratch file or the conversion's task failed.
    #[error("{0}")]
    Scratch(String),
}

impl UnzipError {
    /// Whether the archive broke a limit (a bomb, or more than the operator allows): its job
    /// fails, whatever kind of archive it is.
    pub(crate) fn is_refused(&self) -> bool {
        matches!(
            self,
            UnzipError::Archive(slipway_artifacts::ArtifactsError::Limit(_))
        )
    }
}

/// The zip archive `zip` as a tar stream in a new file of `scratch` named `<prefix>…`,
/// converted file to file off the runtime's threads and held to `limits` as it is written.
/// The files go with the task, so a canceled job cannot leave one behind that the task then
/// writes, and a refused archive leaves nothing on the disk.
pub(crate) async fn unzipped(
    zip: tempfile::TempPath,
    scratch: Option<&std::path::Path>,
    prefix: &str,
    limits: slipway_artifacts::Limits,
) -> Result<Tarball, UnzipError> {
    let tar = slipway_executor::scratch_file(scratch, prefix, ".tar")
        .map_err(|e| UnzipError::Scratch(format!("creating a file for the tar stream: {e}")))?;
    tokio::task::spawn_blocking(move || {
        slipway_artifacts::archive_file_to_tar_file(&zip, &tar, &limits)
            .map(|()| Tarball::File(tar))
    })
    .await
    .map_err(|e| UnzipError::Scratch(e.to_string()))?
    .map_err(UnzipError::Archive)
}

/// The compression level `variable` of `job` names (GitLab's `fastest` … `slowest`); an
/// unknown name is a warning and the default.
pub(crate) fn compression_of(job: &JobResponse, variable: &str, trace: &mut Trace) -> Compression {
    let (compression, warning) =
        Compression::named(job.variable(variable).unwrap_or_default(), variable);
    if let Some(w) = warning {
        trace.message(&w);
    }
    compression
}

/// GitLab's `*_ATTEMPTS` variables (`GET_SOURCES_ATTEMPTS`, `ARTIFACT_DOWNLOAD_ATTEMPTS`,
/// `RESTORE_CACHE_ATTEMPTS`): 1 to 10, 1 when unset or not a number.
pub(crate) fn attempts_of(job: &JobResponse, variable: &str) -> u32 {
    job.variable(variable)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1u32)
        .clamp(1, 10)
}
