//! The job's temporary directory on the runner: the job payload as JSON (`JOB_RESPONSE_FILE`),
//! the stage scripts, and `TMPDIR`.

use std::path::{Path, PathBuf};

use slipway_job::model::JobResponse;
use tokio::io::AsyncWriteExt as _;

use super::CustomError;

/// The job's temporary directory on the runner: `JOB_RESPONSE_FILE`, stage scripts, `TMPDIR`.
pub(super) struct JobFiles {
    dir: tempfile::TempDir,
    pub(super) response: PathBuf,
}

impl JobFiles {
    pub(super) async fn create(job: &JobResponse) -> Result<Self, CustomError> {
        let json = serde_json::to_vec(job).map_err(std::io::Error::other)?;
        let dir = tokio::task::spawn_blocking(|| {
            // Owner-only: tempfile's directories are 0777 less the umask.
            tempfile::Builder::new()
                .prefix("slipway-custom-executor")
                .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .tempdir()
        })
        .await
        .map_err(std::io::Error::other)??;
        let response = dir.path().join("response.json");
        write_private(&response, &json, 0o600).await?;
        Ok(JobFiles { dir, response })
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(super) async fn remove(self) {
        let dir = self.dir;
        let res = tokio::task::spawn_blocking(move || dir.close()).await;
        if !matches!(res, Ok(Ok(()))) {
            tracing::warn!("could not remove the custom executor's temporary directory");
        }
    }
}

pub(super) async fn write_private(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .await?;
    f.write_all(body).await?;
    f.flush().await
}
