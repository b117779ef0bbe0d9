//! The embedded queue: a durable spool directory of jobs for `slipway run` to consume.
//!
//! ```text
//! DIR/next-id               the next job id (guarded by an advisory lock on DIR/ids.lock)
//! DIR/pending/<id>.json     a submitted job (GitLab's job payload, JobResponse JSON)
//! DIR/running/<id>.json     a claimed job (renamed from pending/: exactly one consumer wins)
//! DIR/running/<id>.started  the job was bound to an instance and slot (JSON Started)
//! DIR/done/<id>.json        the job's result (JSON JobResult), written exactly once
//! DIR/logs/<id>.log         the job's trace
//! DIR/tmp/                  files being written
//! DIR/consumer.lock         held (advisory lock) by the manager consuming the queue
//! ```
//!
//! Every file is written to `tmp/`, synced, then renamed (or hard-linked when it must not
//! replace anything) into place, so a process killed with SIGKILL never leaves a half-written
//! file: a job is in exactly one of pending, running and done, and a crash between finishing
//! and cleaning up is repaired by [`Queue::recover`].

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use slipway_job::{JobResponse, JobStatus};

/// What went wrong with the queue; each error names the file it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A file holds something that is not what the queue wrote there.
    #[error("{}: not a valid queue file: {source}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A job with this id already exists.
    #[error("{}: a job with id {id} already exists", path.display())]
    Exists {
        /// The job id.
        id: u64,
        /// The file that is in the way.
        path: PathBuf,
    },
    /// The job is not in the state the operation needs (not claimed, say).
    #[error("{}: job {id} is not {wanted}", path.display())]
    NotFound {
        /// The job id.
        id: u64,
        /// The state it was expected in.
        wanted: &'static str,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// Another process consumes this queue.
    #[error("{}: the queue is consumed by another running manager", path.display())]
    Busy {
        /// The lock file.
        path: PathBuf,
    },
}

/// The result of a queue operation.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;

/// What [`Queue::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The job was pending: it is now done, canceled.
    Canceled,
    /// The job is running: its manager was asked to cancel it.
    Requested,
    /// The job had already ended, with this status.
    AlreadyDone(JobStatus),
}

/// A claimed job was bound to a slot: written before it starts running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// Runner that runs it.
    pub runner: String,
    /// Instance it runs on.
    pub instance_id: String,
    /// Slot on that instance.
    pub slot: u32,
    /// When it started, unix milliseconds.
    pub started_at_ms: i64,
}

/// A finished job: `done/<id>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobResult {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// How it ended.
    pub status: JobStatus,
    /// GitLab's failure reason (`script_failure`, `runner_system_failure`, …) when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The script's exit code, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed, or empty.
    #[serde(default)]
    pub message: String,
    /// Runner that ran it, if it got that far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    /// Instance it ran on, if it got one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// Slot on that instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// When it started running, unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<i64>,
    /// When it ended, unix milliseconds.
    pub finished_at_ms: i64,
}

impl JobResult {
    /// A result for `job` with nothing but a status; fill in the rest.
    pub fn new(job: &JobResponse, status: JobStatus) -> JobResult {
        JobResult {
            id: job.id,
            name: job.job_info.name.clone(),
            stage: job.job_info.stage.clone(),
            status,
            failure_reason: None,
            exit_code: None,
            message: String::new(),
            runner: None,
            instance_id: None,
            slot: None,
            started_at_ms: None,
            finished_at_ms: unix_ms(SystemTime::now()),
        }
    }

    /// Add where it ran.
    pub fn started(mut self, started: Option<&Started>) -> JobResult {
        if let Some(s) = started {
            self.runner = Some(s.runner.clone());
            self.instance_id = Some(s.instance_id.clone());
            self.slot = Some(s.slot);
            self.started_at_ms = Some(s.started_at_ms);
        }
        self
    }
}

/// Where a job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a runner.
    Pending,
    /// Claimed by a runner; `Some` once bound to a slot.
    Running(Option<Started>),
    /// Finished.
    Done(JobResult),
}

impl JobState {
    /// `pending`, `running`, or the result's status.
    pub fn label(&self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running(_) => "running",
            JobState::Done(r) => r.status.as_str(),
        }
    }
}

/// One job of [`Queue::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Job id.
    pub id: u64,
    /// Job name (from the payload, or the result).
    pub name: String,
    /// Stage.
    pub stage: String,
    /// Where it is.
    pub state: JobState,
}

/// A pending job as [`Queue::waiting`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// When it was queued.
    pub queued_at: std::time::SystemTime,
}

/// What [`Queue::recover`] did with the jobs a dead manager left claimed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Claimed but never started: back to pending.
    pub requeued: Vec<u64>,
    /// Started (or holding an acquisition): reported failed with `runner_system_failure`.
    pub failed: Vec<u64>,
    /// Already finished (a crash between writing the result and cleaning up): cleaned up.
    pub cleaned: Vec<u64>,
}

/// A queue directory. Cheap to clone; every method does blocking file I/O (async callers use
/// `spawn_blocking`).
#[derive(Debug, Clone)]
pub struct Queue {
    dir: PathBuf,
}

/// Held while a process consumes the queue; released on drop (or when the process dies).
#[derive(Debug)]
pub struct ConsumerLock {
    _file: File,
}

const PENDING: &str = "pending";
const RUNNING: &str = "running";
const DONE: &str = "done";
const LOGS: &str = "logs";
const TMP: &str = "tmp";
/// A temporary file this old was left by a dead writer.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(600);

impl Queue {
    /// Open (creating when missing) the queue at `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Queue> {
        let q = Queue { dir: dir.into() };
        // Jobs hold their variables and logs their output: owner only, from creation on.
        for sub in [PENDING, RUNNING, DONE, LOGS, TMP] {
            let p = q.dir.join(sub);
            private_dirs(&p).map_err(io_at(&p))?;
        }
        Ok(q)
    }

    /// The queue directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the trace of job `id` is written.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.join(LOGS).join(format!("{id}.log"))
    }

    /// Become the queue's only consumer; [`QueueError::Busy`] when another process is.
    pub fn lock_consumer(&self) -> Result<ConsumerLock> {
        let path = self.dir.join("consumer.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_at(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(ConsumerLock { _file: file }),
            Err(fs::TryLockError::WouldBlock) => Err(QueueError::Busy { path }),
            Err(fs::TryLockError::Error(e)) => Err(QueueError::Io { path, source: e }),
        }
    }

    /// Reserve `n` consecutive fresh job ids (safe against concurrent submitters).
    pub fn next_ids(&self, n: u64) -> Result<std::ops::Range<u64>> {
        let lock_path = self.dir.join("ids.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_at(&lock_path))?;
        lock.lock().map_err(io_at(&lock_path))?;
        let path = self.dir.join("next-id");
        let stored = match fs::read_to_string(&path) {
            Ok(s) => s.trim().parse::<u64>().ok(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(QueueError::Io { path, source: e }),
        };
        // Never hand out an id that is on disk, even if next-id was lost.
        let first = stored.unwrap_or(1).max(self.max_id()? + 1);
        let end = first.saturating_add(n);
        self.write_atomic(&path, end.to_string().as_bytes())?;
        drop(lock);
        Ok(first..end)
    }

    /// Add a job (its `id` from [`Queue::next_ids`]) to pending.
    pub fn enqueue(&self, job: &JobResponse) -> Result<()> {
        for sub in [RUNNING, DONE] {
            let p = self.file(sub, job.id);
            if p.exists() {
                return Err(QueueError::Exists {
                    id: job.id,
                    path: p,
                });
            }
        }
        let bytes = serde_json::to_vec_pretty(job).map_err(|e| QueueError::Corrupt {
            path: self.file(PENDING, job.id),
            source: e,
        })?;
        self.create_new(&self.file(PENDING, job.id), job.id, &bytes)
    }

    /// Ids of pending jobs, oldest first.
    pub fn pending(&self) -> Result<Vec<u64>> {
        self.ids(PENDING)
    }

    /// How many jobs are pending, and the oldest `limit` of them with their names and when
    /// they were queued (a job's file keeps its time through claims and requeues).
    pub fn waiting(&self, limit: usize) -> Result<(usize, Vec<Waiting>)> {
        let ids = self.pending()?;
        let mut out = Vec::new();
        for id in ids.iter().copied().take(limit) {
            let path = self.file(PENDING, id);
            let queued_at = match fs::metadata(&path).and_then(|m| m.modified()) {
                Ok(t) => t,
                // Claimed between listing and reading.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(QueueError::Io { path, source: e }),
            };
            // A file the consumer would refuse is not this listing's to report.
            let Ok(Some(job)) = self.read_json::<JobResponse>(&path) else {
                continue;
            };
            out.push(Waiting {
                id,
                name: job.job_info.name,
                stage: job.job_info.stage,
                queued_at,
            });
        }
        Ok((ids.len(), out))
    }

    /// Ids of claimed jobs.
    pub fn running(&self) -> Result<Vec<u64>> {
        self.ids(RUNNING)
    }

    /// Read a pending job without claiming it (`None` when it is no longer pending).
    pub fn peek(&self, id: u64) -> Result<Option<JobResponse>> {
        self.read_json(&self.file(PENDING, id))
    }

    /// Claim pending job `id`: `None` when someone else claimed it first.
    pub fn claim(&self, id: u64) -> Result<Option<JobResponse>> {
        let from = self.file(PENDING, id);
        let to = self.file(RUNNING, id);
        match fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(QueueError::Io {
                    path: from,
                    source: e,
                });
            }
        }
        self.sync_dir(RUNNING)?;
        match self.read_json(&to)? {
            Some(job) => Ok(Some(job)),
            None => Err(QueueError::NotFound {
                id,
                wanted: "claimed",
                path: to,
            }),
        }
    }

    /// Record that claimed job `id` was bound to a slot and is about to run.
    pub fn mark_started(&self, id: u64, started: &Started) -> Result<()> {
        let claimed = self.file(RUNNING, id);
        if !claimed.exists() {
            return Err(QueueError::NotFound {
                id,
                wanted: "claimed",
                path: claimed,
            });
        }
        let path = self.started_file(id);
        let bytes = serde_json::to_vec(started).map_err(|e| QueueError::Corrupt {
            path: path.clone(),
            source: e,
        })?;
        self.write_atomic(&path, &bytes)
    }

    /// When and where claimed job `id` started, if it did.
    pub fn started(&self, id: u64) -> Result<Option<Started>> {
        self.read_json(&self.started_file(id))
    }

    /// Give back a claimed job that did not start (a runner shutting down, say).
    pub fn requeue(&self, id: u64) -> Result<()> {
        let from = self.file(RUNNING, id);
        let to = self.file(PENDING, id);
        fs::rename(&from, &to).map_err(io_at(&from))?;
        self.sync_dir(PENDING)
    }

    /// Write the result of claimed job `result.id` (exactly once), then drop its claim.
    pub fn finish(&self, result: &JobResult) -> Result<()> {
        let id = result.id;
        let claimed = self.file(RUNNING, id);
        if !claimed.exists() {
            return Err(QueueError::NotFound {
                id,
                wanted: "claimed",
                path: claimed,
            });
        }
        let done = self.file(DONE, id);
        let bytes = serde_json::to_vec_pretty(result).map_err(|e| QueueError::Corrupt {
            path: done.clone(),
            source: e,
        })?;
        self.create_new(&done, id, &bytes)?;
        self.drop_claim(id)
    }

    /// Cancel job `id`: a pending job is finished as canceled at once; a running one gets a
    /// cancel request its manager acts on (see [`Queue::cancel_requested`]).
    pub fn cancel(&self, id: u64) -> Result<Cancel> {
        if let Some(r) = self.result(id)? {
            return Ok(Cancel::AlreadyDone(r.status));
        }
        if let Some(job) = self.claim(id)? {
            let mut result = JobResult::new(&job, JobStatus::Canceled);
            result.message = "canceled before it started".into();
            self.finish(&result)?;
            return Ok(Cancel::Canceled);
        }
        // Claimed by a manager (or by a canceller) between the two looks.
        if self.file(RUNNING, id).exists() {
            self.write_atomic(&self.cancel_file(id), b"")?;
            return Ok(Cancel::Requested);
        }
        match self.result(id)? {
            Some(r) => Ok(Cancel::AlreadyDone(r.status)),
            None => Err(QueueError::NotFound {
                id,
                wanted: "pending or running",
                path: self.file(PENDING, id),
            }),
        }
    }

    /// Whether someone asked to cancel claimed job `id`.
    pub fn cancel_requested(&self, id: u64) -> bool {
        self.cancel_file(id).exists()
    }

    /// The result of job `id`, once done.
    pub fn result(&self, id: u64) -> Result<Option<JobResult>> {
        self.read_json(&self.file(DONE, id))
    }

    /// Every job and where it is, by id.
    pub fn list(&self) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for id in self.ids(DONE)? {
            if let Some(r) = self.result(id)? {
                seen.insert(id);
                out.push(Entry {
                    id,
                    name: r.name.clone(),
                    stage: r.stage.clone(),
                    state: JobState::Done(r),
                });
            }
        }
        for (sub, pending) in [(RUNNING, false), (PENDING, true)] {
            for id in self.ids(sub)? {
                if seen.contains(&id) {
                    continue;
                }
                // Moved on between listing and reading: it shows up where it went next time.
                let Some(job) = self.read_json::<JobResponse>(&self.file(sub, id))? else {
                    continue;
                };
                let state = if pending {
                    JobState::Pending
                } else {
                    JobState::Running(self.started(id)?)
                };
                seen.insert(id);
                out.push(Entry {
                    id,
                    name: job.job_info.name,
                    stage: job.job_info.stage,
                    state,
                });
            }
        }
        out.sort_by_key(|e| e.id);
        Ok(out)
    }

    /// After a manager restart (with the consumer lock held), for the jobs `claimed` by the dead
    /// manager (see [`Queue::running`]): a job that started, or is in `acquired` (jobs the state
    /// store says held a slot), cannot resume and is finished as failed with
    /// `runner_system_failure` and `message`; a job that never started goes back to pending; a
    /// claim left beside a result is removed. Temporary files older than ten minutes go too.
    pub fn recover(
        &self,
        claimed: &[u64],
        acquired: &HashSet<u64>,
        message: &str,
    ) -> Result<Recovery> {
        let mut rec = Recovery::default();
        for &id in claimed {
            if !self.file(RUNNING, id).exists() {
                continue;
            }
            if self.file(DONE, id).exists() {
                self.drop_claim(id)?;
                rec.cleaned.push(id);
                continue;
            }
            let started = self.started(id)?;
            if started.is_none() && !acquired.contains(&id) {
                self.requeue(id)?;
                rec.requeued.push(id);
                continue;
            }
            let Some(job) = self.read_json::<JobResponse>(&self.file(RUNNING, id))? else {
                continue;
            };
            let mut result = JobResult::new(&job, JobStatus::Failed).started(started.as_ref());
            result.failure_reason = Some("runner_system_failure".into());
            result.message = message.to_string();
            self.finish(&result)?;
            rec.failed.push(id);
        }
        // A dead writer's half-made file; live writers (a submit, say) finish in far less.
        let tmp = self.dir.join(TMP);
        for e in fs::read_dir(&tmp).map_err(io_at(&tmp))?.flatten() {
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(rec)
    }

    fn drop_claim(&self, id: u64) -> Result<()> {
        for p in [
            self.started_file(id),
            self.cancel_file(id),
            self.file(RUNNING, id),
        ] {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(QueueError::Io { path: p, source: e }),
            }
        }
        self.sync_dir(RUNNING)
    }

    fn file(&self, sub: &str, id: u64) -> PathBuf {
        self.dir.join(sub).join(format!("{id}.json"))
    }

    fn started_file(&self, id: u64) -> PathBuf {
        self.dir.join(RUNNING).join(format!("{id}.started"))
    }

    fn cancel_file(&self, id: u64) -> PathBuf {
        self.dir.join(RUNNING).join(format!("{id}.cancel"))
    }

    fn ids(&self, sub: &str) -> Result<Vec<u64>> {
        let dir = self.dir.join(sub);
        let mut ids: Vec<u64> = fs::read_dir(&dir)
            .map_err(io_at(&dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .and_then(|n| n.parse().ok())
            })
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn max_id(&self) -> Result<u64> {
        let mut max = 0;
        for sub in [PENDING, RUNNING, DONE] {
            max = max.max(self.ids(sub)?.last().copied().unwrap_or(0));
        }
        Ok(max)
    }

    fn read_json<T: serde::de::DeserializeOwned>(&self, path: &Path) -> Result<Option<T>> {
        let mut text = Vec::new();
        match File::open(path).and_then(|mut f| f.read_to_end(&mut text)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(QueueError::Io {
                    path: path.to_path_buf(),
                    source: e,
                });
            }
        }
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| QueueError::Corrupt {
                path: path.to_path_buf(),
                source: e,
            })
    }

    /// Write `bytes` to a synced temporary file and return its path.
    fn write_tmp(&self, bytes: &[u8]) -> Result<PathBuf> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let path = self.dir.join(TMP).join(format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let written = private_file(&path).and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
        match written {
            Ok(()) => Ok(path),
            Err(e) => {
                // A full disk leaves no half-written file behind.
                let _ = fs::remove_file(&path);
                Err(QueueError::Io { path, source: e })
            }
        }
    }

    /// Replace `path` atomically.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let tmp = self.write_tmp(bytes)?;
        if let Err(e) = fs::rename(&tmp, path) {
            let _ = fs::remove_file(&tmp);
            return Err(QueueError::Io {
                path: path.to_path_buf(),
                source: e,
            });
        }
        sync_parent(path)
    }

    /// Create `path` atomically; [`QueueError::Exists`] when it is already there.
    fn create_new(&self, path: &Path, id: u64, bytes: &[u8]) -> Result<()> {
        let tmp = self.write_tmp(bytes)?;
        // A hard link never replaces its target: of two writers, exactly one wins.
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => sync_parent(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(QueueError::Exists {
                id,
                path: path.to_path_buf(),
            }),
            Err(e) => Err(QueueError::Io {
                path: path.to_path_buf(),
                source: e,
            }),
        }
    }

    fn sync_dir(&self, sub: &str) -> Result<()> {
        let dir = self.dir.join(sub);
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_at(&dir))
    }
}

fn sync_parent(path: &Path) -> Result<()> {
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))
}

/// Create `dir` and its missing parents as 0700 (umask may only narrow it).
fn private_dirs(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Create (truncating) `path` as 0600.
fn private_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> QueueError + '_ {
    move |source| QueueError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(q: &Queue, name: &str) -> JobResponse {
        let id = q.next_ids(1).unwrap().start;
        let mut j = JobResponse {
            id,
            ..JobResponse::default()
        };
        j.job_info.name = name.into();
        j.job_info.stage = "test".into();
        j
    }

    fn started(slot: u32) -> Started {
        Started {
            runner: "r".into(),
            instance_id: "i-1".into(),
            slot,
            started_at_ms: 1,
        }
    }

    #[test]
    fn a_job_walks_pending_running_done() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path().join("q")).unwrap();
        let a = job(&q, "a");
        let b = job(&q, "b");
        assert_eq!((a.id, b.id), (1, 2));
        q.enqueue(&a).unwrap();
        q.enqueue(&b).unwrap();
        assert_eq!(q.pending().unwrap(), vec![1, 2]);
        assert_eq!(q.peek(1).unwrap().unwrap().job_info.name, "a");

        let claimed = q.claim(1).unwrap().unwrap();
        assert_eq!(claimed.job_info.name, "a");
        assert!(q.claim(1).unwrap().is_none(), "claimed twice");
        q.mark_started(1, &started(0)).unwrap();
        let list = q.list().unwrap();
        assert_eq!(list[0].state, JobState::Running(Some(started(0))));
        assert_eq!(list[1].state, JobState::Pending);

        let mut r = JobResult::new(&claimed, JobStatus::Success).started(Some(&started(0)));
        r.exit_code = Some(0);
        q.finish(&r).unwrap();
        assert_eq!(q.result(1).unwrap().unwrap(), r);
        assert!(q.running().unwrap().is_empty());
        assert!(q.started(1).unwrap().is_none());
        // Exactly once: a second result is refused, naming the file.
        let err = q.finish(&r).unwrap_err();
        assert!(matches!(err, QueueError::NotFound { id: 1, .. }), "{err}");
        assert!(err.to_string().contains("running/1.json"), "{err}");
        assert_eq!(q.list().unwrap()[0].state.label(), "success");
    }

    #[test]
    fn cancel_ends_a_pending_job_and_asks_a_running_one_to_stop() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path()).unwrap();
        let (a, b) = (job(&q, "a"), job(&q, "b"));
        q.enqueue(&a).unwrap();
        q.enqueue(&b).unwrap();
        assert_eq!(q.cancel(a.id).unwrap(), Cancel::Canceled);
        let r = q.result(a.id).unwrap().unwrap();
        assert_eq!(r.status, JobStatus::Canceled);
        assert!(q.pending().unwrap() == vec![b.id]);

        let claimed = q.claim(b.id).unwrap().unwrap();
        assert!(!q.cancel_requested(b.id));
        assert_eq!(q.cancel(b.id).unwrap(), Cancel::Requested);
        assert!(q.cancel_requested(b.id));
        // The request is not a job: listings do not see it, and finishing clears it.
        assert_eq!(q.running().unwrap(), vec![b.id]);
        q.finish(&JobResult::new(&claimed, JobStatus::Canceled))
            .unwrap();
        assert!(!q.cancel_requested(b.id));
        assert_eq!(
            q.cancel(b.id).unwrap(),
            Cancel::AlreadyDone(JobStatus::Canceled)
        );
        let err = q.cancel(99).unwrap_err();
        assert!(err.to_string().contains("99"), "{err}");
        assert!(
            std::fs::read_dir(dir.path().join("running"))
                .unwrap()
                .next()
                .is_none()
        );
    }

    #[test]
    fn waiting_lists_the_oldest_pending_jobs_with_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path()).unwrap();
        for name in ["a", "b", "c"] {
            let j = job(&q, name);
            q.enqueue(&j).unwrap();
        }
        q.claim(1).unwrap().unwrap();
        let (n, first) = q.waiting(1).unwrap();
        assert_eq!(n, 2);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].id, first[0].name.as_str()), (2, "b"));
        assert!(first[0].queued_at <= std::time::SystemTime::now());
    }

    #[test]
    fn ids_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path()).unwrap();
        let a = job(&q, "a");
        q.enqueue(&a).unwrap();
        let err = q.enqueue(&a).unwrap_err();
        assert!(matches!(err, QueueError::Exists { id: 1, .. }), "{err}");
        // Losing next-id does not recycle ids that are on disk.
        std::fs::remove_file(dir.path().join("next-id")).unwrap();
        assert_eq!(q.next_ids(3).unwrap(), 2..5);
        assert_eq!(q.next_ids(1).unwrap(), 5..6);
    }

    #[test]
    fn recover_fails_started_jobs_and_requeues_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path()).unwrap();
        let jobs: Vec<JobResponse> = ["started", "acquired", "claimed", "finished", "waiting"]
            .iter()
            .map(|n| job(&q, n))
            .collect();
        for j in &jobs {
            q.enqueue(j).unwrap();
        }
        for id in 1..=4 {
            q.claim(id).unwrap().unwrap();
        }
        q.mark_started(1, &started(1)).unwrap();
        // Job 4 finished but the manager died before dropping its claim.
        let r4 = JobResult::new(&jobs[3], JobStatus::Success);
        q.create_new(&q.file(DONE, 4), 4, &serde_json::to_vec(&r4).unwrap())
            .unwrap();
        // A half-written temporary file of the dead manager, and a fresh one of a live writer.
        let old = dir.path().join("tmp/999-0");
        std::fs::write(&old, b"{").unwrap();
        let hour_ago = SystemTime::now() - std::time::Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        std::fs::write(dir.path().join("tmp/1000-0"), b"{").unwrap();
        let claimed = q.running().unwrap();
        assert_eq!(claimed, vec![1, 2, 3, 4]);
        // Claimed by the new manager after the restart: not the dead one's to recover.
        q.claim(5).unwrap().unwrap();

        let rec = q
            .recover(&claimed, &HashSet::from([2, 4]), "the manager restarted")
            .unwrap();
        assert_eq!(rec.failed, vec![1, 2]);
        assert_eq!(rec.requeued, vec![3]);
        assert_eq!(rec.cleaned, vec![4]);
        let r1 = q.result(1).unwrap().unwrap();
        assert_eq!(r1.status, JobStatus::Failed);
        assert_eq!(r1.failure_reason.as_deref(), Some("runner_system_failure"));
        assert_eq!(r1.instance_id.as_deref(), Some("i-1"));
        assert_eq!(r1.message, "the manager restarted");
        assert_eq!(q.result(2).unwrap().unwrap().instance_id, None);
        assert_eq!(q.result(4).unwrap().unwrap(), r4);
        assert_eq!(q.pending().unwrap(), vec![3]);
        assert_eq!(q.running().unwrap(), vec![5]);
        assert!(!old.exists());
        assert!(dir.path().join("tmp/1000-0").exists());
        // Running it again changes nothing.
        assert_eq!(
            q.recover(&claimed, &HashSet::from([2]), "x").unwrap(),
            Recovery::default()
        );
    }

    #[test]
    fn one_consumer_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path()).unwrap();
        let lock = q.lock_consumer().unwrap();
        let err = q.lock_consumer().unwrap_err();
        assert!(matches!(err, QueueError::Busy { .. }), "{err}");
        drop(lock);
        q.lock_consumer().unwrap();
    }

    #[test]
    fn a_corrupt_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let q = Queue::open(dir.path()).unwrap();
        std::fs::write(dir.path().join("pending/7.json"), b"not json").unwrap();
        let err = q.list().unwrap_err();
        assert!(matches!(err, QueueError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("pending/7.json"), "{err}");
    }
}
