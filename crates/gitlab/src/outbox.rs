//! The outbox: what GitLab must still hear about a job, kept on disk until it has.
//!
//! A job that starts leaves a `running/<id>.json` record (id and token); its final state
//! replaces it as `pending/<id>.json` until GitLab accepts it, and both are removed then. After
//! a crash or a restart, [`Outbox::recover`] hands back every pending state, and turns every
//! job that was still running into a `failed` / `runner_system_failure` state: no job is left
//! unreported. Files are written to a temporary name, synced and renamed, so a record is either
//! whole or absent; the directory is private (mode 0700) since records hold job tokens.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use slipway_job::FailureReason;

use super::{GitlabError, JobState, PendingUpdate, Secret, wire_reason};

/// A directory of job records not yet settled with GitLab.
#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
}

/// What a `running/` record holds.
#[derive(Serialize, Deserialize)]
struct Running {
    job_id: u64,
    token: Secret,
    /// The server's accepted failure reasons, to resolve the reason sent after a restart.
    #[serde(default)]
    failure_reasons: Vec<String>,
}

/// The trace line of a job that was running when its manager stopped.
pub const INTERRUPTED_MESSAGE: &str = "the runner manager stopped while the job was running";

/// A final state still owed to GitLab, found by [`Outbox::recover`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owed {
    /// What to send.
    pub update: PendingUpdate,
    /// The job was running when the manager stopped (its trace does not say why it ended).
    pub interrupted: bool,
}

impl Outbox {
    /// Opens (creating) the outbox in `dir`.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<Self, GitlabError> {
        let dir = dir.into();
        // Final states and traces waiting for GitLab: owner only, from creation on (an
        // existing directory is narrowed too).
        for sub in ["running", "pending"] {
            let d = dir.join(sub);
            tokio::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .await
                .map_err(|e| io_error(&d, "creating", &e))?;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let perms = std::fs::Permissions::from_mode(0o700);
            tokio::fs::set_permissions(&dir, perms)
                .await
                .map_err(|e| io_error(&dir, "restricting", &e))?;
        }
        Ok(Self { dir })
    }

    fn file(&self, sub: &str, job_id: u64) -> PathBuf {
        self.dir.join(sub).join(format!("{job_id}.json"))
    }

    /// Records that job `job_id` started (before any of its work is done).
    pub async fn started(
        &self,
        job_id: u64,
        token: &Secret,
        failure_reasons: &[String],
    ) -> Result<(), GitlabError> {
        let record = Running {
            job_id,
            token: token.clone(),
            failure_reasons: failure_reasons.to_vec(),
        };
        self.write(&self.file("running", job_id), &record).await
    }

    /// Records a final state GitLab has not accepted yet; the job is no longer "running".
    pub async fn pending(&self, update: &PendingUpdate) -> Result<(), GitlabError> {
        self.write(&self.file("pending", update.job_id), update)
            .await?;
        remove(&self.file("running", update.job_id)).await
    }

    /// Forgets job `job_id`: GitLab has its final state (or no longer wants it).
    pub async fn settled(&self, job_id: u64) -> Result<(), GitlabError> {
        remove(&self.file("pending", job_id)).await?;
        remove(&self.file("running", job_id)).await
    }

    /// Every final state still owed to GitLab: the pending ones, and a failed state for each
    /// job that was running (also written to `pending/`, so it survives another restart).
    /// Unreadable records are reported in the log and moved aside as `*.broken`, never lost
    /// silently, never retried forever.
    pub async fn recover(&self) -> Result<Vec<Owed>, GitlabError> {
        let mut out: Vec<Owed> = Vec::new();
        for (path, text) in self.records("pending").await? {
            match serde_json::from_slice::<PendingUpdate>(&text) {
                Ok(update) => out.push(Owed {
                    update,
                    interrupted: false,
                }),
                Err(e) => set_aside(&path, &e).await,
            }
        }
        for (path, text) in self.records("running").await? {
            let running = match serde_json::from_slice::<Running>(&text) {
                Ok(r) => r,
                Err(e) => {
                    set_aside(&path, &e).await;
                    continue;
                }
            };
            if out.iter().any(|o| o.update.job_id == running.job_id) {
                remove(&path).await?;
                continue;
            }
            let update = PendingUpdate {
                job_id: running.job_id,
                token: running.token,
                state: JobState::Failed,
                failure_reason: wire_reason(
                    FailureReason::RunnerSystemFailure,
                    &running.failure_reasons,
                ),
                exit_code: None,
                output: None,
            };
            self.pending(&update).await?;
            out.push(Owed {
                update,
                interrupted: true,
            });
        }
        out.sort_by_key(|o| o.update.job_id);
        Ok(out)
    }

    async fn records(&self, sub: &str) -> Result<Vec<(PathBuf, Vec<u8>)>, GitlabError> {
        let dir = self.dir.join(sub);
        let mut entries = tokio::fs::read_dir(&dir)
            .await
            .map_err(|e| io_error(&dir, "reading", &e))?;
        let mut out = Vec::new();
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| io_error(&dir, "reading", &e))?
        {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            // One unreadable record must not keep the others (or the runner) from going on.
            match tokio::fs::read(&path).await {
                Ok(text) => out.push((path, text)),
                Err(e) => tracing::error!(path = %path.display(), error = %e,
                    "cannot read a job record in the outbox; its job is not reported"),
            }
        }
        Ok(out)
    }

    async fn write<T: Serialize>(&self, path: &Path, value: &T) -> Result<(), GitlabError> {
        let text = serde_json::to_vec(value).map_err(|e| GitlabError::Outbox {
            path: path.to_path_buf(),
            message: format!("encoding: {e}"),
        })?;
        let tmp = path.with_extension("json.tmp");
        let path_owned = path.to_path_buf();
        let tmp_owned = tmp.clone();
        // Write, sync, rename, sync the directory: the record is whole or absent after a crash.
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            // Records hold the job's token: owner only.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp_owned)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp_owned, &path_owned)?;
            if let Some(dir) = path_owned.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(|e| GitlabError::Outbox {
            path: path.to_path_buf(),
            message: format!("writing: {e}"),
        })?
        .map_err(|e| io_error(path, "writing", &e))
    }
}

async fn remove(path: &Path) -> Result<(), GitlabError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(path, "removing", &e)),
    }
}

async fn set_aside(path: &Path, e: &serde_json::Error) {
    let e = e.to_string();
    tracing::error!(path = %path.display(), error = %e,
        "unreadable job record in the outbox; moved aside as .broken, its job is not reported");
    let _ = tokio::fs::rename(path, path.with_extension("broken")).await;
}

fn io_error(path: &Path, what: &str, e: &std::io::Error) -> GitlabError {
    GitlabError::Outbox {
        path: path.to_path_buf(),
        message: format!("{what}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn update(id: u64) -> PendingUpdate {
        PendingUpdate {
            job_id: id,
            token: Secret::new(format!("glcbt-{id}")),
            state: JobState::Success,
            failure_reason: None,
            exit_code: None,
            output: None,
        }
    }

    #[tokio::test]
    async fn running_jobs_become_failures_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path().join("outbox")).await.unwrap();
        let reasons = vec!["script_failure".to_string()];
        outbox
            .started(1, &Secret::new("glcbt-1"), &reasons)
            .await
            .unwrap();
        outbox
            .started(2, &Secret::new("glcbt-2"), &reasons)
            .await
            .unwrap();
        outbox.pending(&update(2)).await.unwrap();
        outbox
            .started(3, &Secret::new("glcbt-3"), &reasons)
            .await
            .unwrap();
        outbox.settled(3).await.unwrap();

        // A new process opens the same directory.
        let again = Outbox::open(dir.path().join("outbox")).await.unwrap();
        let owed = again.recover().await.unwrap();
        assert_eq!(owed.len(), 2, "{owed:?}");
        assert!(owed[0].interrupted);
        let first = &owed[0].update;
        assert_eq!(first.job_id, 1);
        assert_eq!(first.state, JobState::Failed);
        // runner_system_failure is always accepted, listed or not.
        assert_eq!(
            first.failure_reason.as_deref(),
            Some("runner_system_failure")
        );
        assert_eq!(first.token.expose(), "glcbt-1");
        assert_eq!(owed[1].update, update(2));
        assert!(!owed[1].interrupted);
        // Recovering twice gives the same updates: nothing is lost or doubled.
        let updates = |o: &[Owed]| o.iter().map(|o| o.update.clone()).collect::<Vec<_>>();
        assert_eq!(updates(&again.recover().await.unwrap()), updates(&owed));
        again.settled(1).await.unwrap();
        again.settled(2).await.unwrap();
        assert!(again.recover().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_broken_record_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path()).await.unwrap();
        std::fs::write(dir.path().join("pending/9.json"), b"{not json").unwrap();
        assert!(outbox.recover().await.unwrap().is_empty());
        assert!(dir.path().join("pending/9.broken").exists());
    }
}
