//! What the job helper (`slipway-helper`) does where a job runs: the plan of one of its data
//! stages (dependencies' artifacts, the cache, the job's own artifacts), written by the manager
//! and the executor and read by the helper on its stdin, never on a command line.
//!
//! The plan holds secrets (the job token, pre-signed URLs): its `Debug` shows none of them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The exit status of a helper stage whose archive broke the runner's limits (a bomb): the
/// job fails, whatever kind of archive it was.
pub const REFUSED: i32 = 3;
/// The exit status of a stage that failed in a way that fails the job (a dependency that
/// cannot be downloaded, an artifact that cannot be uploaded).
pub const FAILED: i32 = 1;

/// One stage's work for the helper.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct DataPlan {
    /// How far a downloaded archive may expand (`[runners.archives]`).
    pub limits: ArchiveLimits,
    /// PEM certificates trusted besides the system's (GitLab's `tls-ca-file`), for the
    /// servers of this plan.
    pub ca_pem: Option<String>,
    /// The paths git tracks in the project directory (what `untracked` leaves out).
    pub tracked: Vec<String>,
    /// What to do, in order.
    pub steps: Vec<DataStep>,
}

impl fmt::Debug for DataPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataPlan")
            .field("limits", &self.limits)
            .field("tracked", &self.tracked.len())
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

/// `[runners.archives]`: how far an archive may expand (0: no limit).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ArchiveLimits {
    /// Bytes of all files.
    pub max_size: u64,
    /// Entries.
    pub max_entries: u64,
    /// Expanded size over archived size, past 64 MiB.
    pub max_ratio: u64,
}

/// One thing the helper does.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum DataStep {
    /// Download a dependency's artifacts archive from GitLab and unpack it into the project
    /// directory.
    Download {
        /// The dependency's job name (for the trace).
        name: String,
        /// Its job ID.
        id: u64,
        /// GitLab's `GET /api/v4/jobs/:id/artifacts` URL.
        url: String,
        /// The `JOB-TOKEN` to send (secret).
        token: String,
        /// Tries (`ARTIFACT_DOWNLOAD_ATTEMPTS`).
        attempts: u32,
    },
    /// Restore one cache: the first of its keys that has an archive is unpacked into the
    /// project directory; a missing or broken cache is a warning.
    RestoreCache {
        /// `(key, pre-signed GET URL)` in the order to try (secret URLs).
        sources: Vec<(String, String)>,
        /// Tries per key (`RESTORE_CACHE_ATTEMPTS`).
        attempts: u32,
        /// Seconds one request may take (`CACHE_REQUEST_TIMEOUT`).
        timeout_secs: u64,
    },
    /// Archive collected files as one cache and upload it to a pre-signed URL.
    SaveCache {
        /// The cache key (for the trace).
        key: String,
        /// Pre-signed PUT URL (secret).
        url: String,
        /// Headers the signature covers.
        headers: Vec<(String, String)>,
        /// Largest archive to upload (`MaxUploadedArchiveSize`; 0: any).
        max_upload: u64,
        /// The cache's `paths`, relative to the project directory.
        paths: Vec<String>,
        /// Its `untracked`.
        untracked: bool,
        /// `CACHE_COMPRESSION_LEVEL`.
        compression: String,
        /// `CACHE_COMPRESSION_FORMAT`: `zip` (also when empty) or `tarzstd`.
        #[serde(default)]
        format: String,
        /// Seconds the upload may take (`CACHE_REQUEST_TIMEOUT`).
        timeout_secs: u64,
        /// The collected tar stream, a file name in the stage's scratch directory.
        tar: String,
    },
    /// Archive collected files as one `artifacts:` entry and upload it to GitLab.
    Upload {
        /// The job's ID (for the trace).
        job_id: u64,
        /// Whether the job succeeded (for the trace: GitLab Runner's words).
        succeeded: bool,
        /// GitLab's `POST /api/v4/jobs/:id/artifacts` URL.
        url: String,
        /// The job's `JOB-TOKEN` (secret).
        token: String,
        /// `archive`, `junit`, ...
        artifact_type: String,
        /// `zip`, `gzip` or `raw`.
        artifact_format: String,
        /// The upload's file name (`artifacts:name`), if any.
        name: Option<String>,
        /// `expire_in`, if any.
        expire_in: Option<String>,
        /// `ARTIFACT_COMPRESSION_LEVEL`.
        compression: String,
        /// Its `paths`, relative to the project directory (what was collected).
        paths: Vec<String>,
        /// Its `exclude` patterns, relative to the project directory.
        exclude: Vec<String>,
        /// Its `untracked`.
        untracked: bool,
        /// The collected tar stream, a file name in the stage's scratch directory.
        tar: String,
    },
}

impl fmt::Debug for DataStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataStep::Download { name, id, .. } => f
                .debug_struct("Download")
                .field("name", name)
                .field("id", id)
                .finish_non_exhaustive(),
            DataStep::RestoreCache { sources, .. } => f
                .debug_struct("RestoreCache")
                .field("keys", &sources.iter().map(|(k, _)| k).collect::<Vec<_>>())
                .finish_non_exhaustive(),
            DataStep::SaveCache { key, .. } => f
                .debug_struct("SaveCache")
                .field("key", key)
                .finish_non_exhaustive(),
            DataStep::Upload { artifact_type, .. } => f
                .debug_struct("Upload")
                .field("artifact_type", artifact_type)
                .finish_non_exhaustive(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_plan_goes_through_json_and_its_debug_shows_no_secret() {
        let plan = DataPlan {
            steps: vec![
                DataStep::Download {
                    name: "build".into(),
                    id: 7,
                    url: "https://gitlab.example/api/v4/jobs/7/artifacts".into(),
                    token: "glcbt-secret-token".into(),
                    attempts: 1,
                },
                DataStep::RestoreCache {
                    sources: vec![("k".into(), "https://s3/x?X-Amz-Signature=sig".into())],
                    attempts: 1,
                    timeout_secs: 600,
                },
            ],
            ..DataPlan::default()
        };
        let json = serde_json::to_string(&plan).unwrap();
        assert!(json.contains(r#""do":"download""#), "{json}");
        assert_eq!(serde_json::from_str::<DataPlan>(&json).unwrap(), plan);
        let debug = format!("{plan:?}");
        assert!(
            !debug.contains("secret") && !debug.contains("Signature"),
            "{debug}"
        );
    }
}
