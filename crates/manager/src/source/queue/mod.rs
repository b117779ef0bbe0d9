//! `slipway run`'s job source: the embedded queue ([`spool`]).
//!
//! Per runner, up to its limit of jobs at once: reserve capacity (waiting while there is none)
//! for the oldest pending job → claim it → acquire a slot → record the start → run it with the
//! instance executor → write the result → release the slot. The reservation key is
//! `job-<queue id>`, the name the state store records the acquisition under, so a restarted
//! manager can tell which jobs held a slot when the last one died ([`recover`]).
//!
//! On shutdown, running jobs are canceled (and reported so); jobs still waiting for a slot go
//! back to pending. Artifacts are not passed between queued jobs.

pub mod spool;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use slipway_job::{FailureReason, JobOutcome, Trace};
use slipway_job::{JobResponse, JobStatus};
use slipway_taskscaler::Acquisition;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::spool::{JobResult, Queue, QueueError, Recovery, Started, unix_ms};
use crate::chain::Chain;
use crate::lifecycle::{self, JobSource, Life, PlacedError, Start, Stops};
use crate::limits::{Limits, Permits};
use crate::runner::Runner;
use crate::shutdown::Shutdown;

/// How often an idle runner looks for pending jobs.
const POLL: Duration = Duration::from_millis(250);
/// Why a job left running by a dead manager is failed.
pub const RESTART_MESSAGE: &str =
    "the manager restarted while the job was running; it cannot resume";

/// Why the queue could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum QueueSourceError {
    /// A queue operation failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The thread doing the queue's blocking I/O failed (a panic).
    #[error("queue I/O task")]
    Join(#[source] tokio::task::JoinError),
    /// A job's log file could not be opened.
    #[error("opening the job log")]
    OpenLog(#[source] std::io::Error),
    /// The thread opening a job's log file failed (a panic).
    #[error("opening the job log")]
    OpenLogTask(#[source] tokio::task::JoinError),
}

/// The reservation key of queue job `id`.
pub fn key_of(id: u64) -> String {
    format!("job-{id}")
}

/// The queue job id of a reservation key made by [`key_of`].
pub fn id_of_key(key: &str) -> Option<u64> {
    key.strip_prefix("job-")?.parse().ok()
}

/// Run `f` (blocking queue I/O) off the runtime's threads.
pub async fn blocking<T, F>(f: F) -> Result<T, QueueSourceError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, QueueError> + Send + 'static,
{
    Ok(tokio::task::spawn_blocking(f)
        .await
        .map_err(QueueSourceError::Join)??)
}

/// After a restart: wait until every runner's taskscaler has read its state store, then report
/// the jobs `claimed` by the dead manager (see [`Queue::recover`]) — failed when they had
/// started or held an acquisition, back to pending when they had not. `None` when stopped first.
pub async fn recover(
    queue: &Queue,
    claimed: Vec<u64>,
    runners: &[Arc<Runner>],
    stop: &CancellationToken,
) -> Result<Option<Recovery>, QueueSourceError> {
    let mut acquired = HashSet::new();
    for r in runners {
        for shape in r.placement.shapes() {
            tokio::select! {
                res = shape.scaler.restored() => {
                    if res.is_err() {
                        return Ok(None);
                    }
                }
                _ = stop.cancelled() => return Ok(None),
            }
            for rec in shape.scaler.take_restored_failures() {
                match id_of_key(&rec.job_ref) {
                    Some(id) => {
                        acquired.insert(id);
                    }
                    None => tracing::warn!(runner = %r.name, job = %rec.job_ref,
                        "state store names a job that is not from the queue; ignoring it"),
                }
            }
        }
    }
    if claimed.is_empty() {
        return Ok(Some(Recovery::default()));
    }
    // A full disk must not leave the dead manager's jobs claimed for ever: retried until it
    // works (each pass skips what the last one finished).
    let claimed = Arc::new(claimed);
    let acquired = Arc::new(acquired);
    let mut warned = false;
    let rec = loop {
        let (q, c, a) = (queue.clone(), claimed.clone(), acquired.clone());
        match blocking(move || q.recover(&c, &a, RESTART_MESSAGE)).await {
            Ok(rec) => break rec,
            Err(e) => {
                if !warned {
                    tracing::warn!(
                        "recovering the jobs of the last run: {}; retrying",
                        Chain(&e)
                    );
                    warned = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    for id in &rec.failed {
        tracing::warn!(
            job = id,
            "job was running when the manager died: reported failed"
        );
    }
    for id in &rec.requeued {
        tracing::info!(
            job = id,
            "job was claimed but never started: back to pending"
        );
    }
    Ok(Some(rec))
}

/// Feed `runner` from `queue` until the shutdown drains it; returns once every job it started
/// has ended (a stop cancels them).
pub async fn serve(runner: Arc<Runner>, queue: Queue, limits: Limits, shutdown: Shutdown) {
    let mut tasks: JoinSet<()> = JoinSet::new();
    'dispatch: loop {
        reap(&mut tasks, &runner.name);
        let permits = tokio::select! {
            biased;
            _ = shutdown.drain.cancelled() => break,
            p = limits.acquire() => match p {
                Some(p) => p,
                None => break,
            },
        };
        // The oldest pending job.
        let (id, payload) = loop {
            reap(&mut tasks, &runner.name);
            match next_pending(&queue).await {
                Ok(Some(found)) => break found,
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(runner = %runner.name, "reading the queue: {}", Chain(&e))
                }
            }
            tokio::select! {
                biased;
                _ = shutdown.drain.cancelled() => break 'dispatch,
                _ = tokio::time::sleep(POLL) => {}
            }
        };
        let key = key_of(id);
        // The trace is buffered until the job is ours, then written to the queue's log.
        let (tx, rx) = mpsc::unbounded_channel();
        let secrets: Vec<String> = payload
            .masked_values()
            .into_iter()
            .map(String::from)
            .collect();
        // The job goes on the board once claimed: until then it is the queue's (several
        // dispatchers may reserve for the same oldest job; one claims it).
        let board_entry = (lifecycle::board_info(&runner, &payload), secrets.clone());
        let mut trace = Trace::for_job(&payload, tx);
        let reserved = match lifecycle::admit(&runner, &payload, &mut trace) {
            Ok(admission) => {
                lifecycle::reserve(&runner, &key, &admission, &mut trace, &shutdown.drain)
                    .await
                    .map(|()| admission)
            }
            Err(no) => Err(no),
        };
        let admission = match reserved {
            Ok(admission) => admission,
            Err(no) => {
                let no = &no;
                if shutdown.drain.is_cancelled() {
                    break;
                }
                // The job can never run here (or the runner cannot reserve at all): report it
                // rather than retry it forever.
                if let Ok(Some(job)) = claim(&queue, id).await {
                    runner.board.waiting(&key, board_entry.0, board_entry.1);
                    let mut result = JobResult::new(&job, JobStatus::Failed);
                    result.failure_reason = Some(no.failure_reason.as_str().into());
                    result.message = no.message.clone();
                    result.runner = Some(runner.name.clone());
                    trace.finish();
                    drop(trace);
                    // The log first, then the result (see `JobTask::run`).
                    write_log(queue.log_path(id), rx).await;
                    finish(&queue, result, &runner.name).await;
                    runner
                        .board
                        .finished(&key, lifecycle::ending_of_refusal(no));
                }
                continue;
            }
        };
        match claim(&queue, id).await {
            Ok(Some(job)) => {
                runner.board.waiting(&key, board_entry.0, board_entry.1);
                let task = JobTask {
                    runner: runner.clone(),
                    queue: queue.clone(),
                    id,
                    key,
                    job,
                    admission,
                    trace,
                    log: rx,
                    stop: shutdown.stop.clone(),
                    _permits: permits,
                };
                tasks.spawn(task.run());
            }
            Ok(None) => runner.unreserve(&key),
            Err(e) => {
                runner.unreserve(&key);
                tracing::error!(runner = %runner.name, job = id, "claiming the job: {}", Chain(&e));
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r {
            tracing::error!(runner = %runner.name, "job task failed: {e}");
        }
    }
}

fn reap(tasks: &mut JoinSet<()>, runner: &str) {
    while let Some(r) = tasks.try_join_next() {
        if let Err(e) = r {
            tracing::error!(%runner, "job task failed: {e}");
        }
    }
}

async fn next_pending(queue: &Queue) -> Result<Option<(u64, JobResponse)>, QueueSourceError> {
    let q = queue.clone();
    blocking(move || {
        for id in q.pending()? {
            // Claimed by someone else since the listing: try the next one.
            if let Some(job) = q.peek(id)? {
                return Ok(Some((id, job)));
            }
        }
        Ok(None)
    })
    .await
}

async fn claim(queue: &Queue, id: u64) -> Result<Option<JobResponse>, QueueSourceError> {
    let q = queue.clone();
    blocking(move || q.claim(id)).await
}

/// How long a result that cannot be written (a full disk, say) is retried before the job is
/// left claimed for the next start to report.
const FINISH_RETRY: Duration = Duration::from_secs(300);

async fn finish(queue: &Queue, result: JobResult, runner: &str) {
    let id = result.id;
    let result = Arc::new(result);
    let deadline = tokio::time::Instant::now() + FINISH_RETRY;
    let mut warned = false;
    loop {
        let (q, r) = (queue.clone(), result.clone());
        match blocking(move || q.finish(&r)).await {
            Ok(()) => {
                if warned {
                    tracing::info!(%runner, job = id, "the job's result is written");
                }
                return;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                if !warned {
                    tracing::warn!(%runner, job = id, "writing the job's result: {}; retrying", Chain(&e));
                    warned = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                // It stays claimed: the next start reports it failed.
                tracing::error!(%runner, job = id, "writing the job's result: {}", Chain(&e));
                return;
            }
        }
    }
}

/// Append a job's trace to its log file until the trace is dropped.
async fn write_log(path: std::path::PathBuf, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let opened = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::OpenOptionsExt as _;
            // A trace may hold what a job printed: owner only, like the queue it lives in.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
        })
        .await
        .map_err(QueueSourceError::OpenLogTask)
        .and_then(|r| r.map_err(QueueSourceError::OpenLog))
    };
    let mut log = match opened {
        Ok(file) => Some(Log {
            file,
            unwritten: Vec::new(),
            warned: false,
        }),
        Err(e) => {
            tracing::warn!(path = %path.display(), "job log: {}", Chain(&e));
            None
        }
    };
    while let Some(chunk) = rx.recv().await {
        if let Some(mut l) = log.take() {
            l.unwritten.extend_from_slice(&chunk);
            log = l.flush(&path).await;
        }
    }
    // What a full disk held back: retried for a while before it is given up.
    let deadline = tokio::time::Instant::now() + FINISH_RETRY;
    while let Some(l) = log.take() {
        if l.unwritten.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::error!(path = %path.display(), bytes = l.unwritten.len(), "job log: not written");
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        log = l.flush(&path).await;
    }
}

/// A job's open log and the bytes not written to it yet (a full disk): kept in order and
/// written with the next chunk, so a trace survives a while without space instead of losing
/// its middle.
struct Log {
    file: std::fs::File,
    unwritten: Vec<u8>,
    warned: bool,
}

impl Log {
    /// Write what is pending; `None` only if the blocking task itself failed.
    async fn flush(self, path: &std::path::Path) -> Option<Log> {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || {
            use std::io::Write as _;
            let mut l = self;
            while !l.unwritten.is_empty() {
                match l.file.write(&l.unwritten) {
                    Ok(0) => break,
                    Ok(n) => {
                        l.unwritten.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        if !l.warned {
                            tracing::warn!(path = %path.display(), "job log: {e}; keeping the rest until it can be written");
                            l.warned = true;
                        }
                        break;
                    }
                }
            }
            l
        })
        .await
        .ok()
    }
}

/// One claimed job, from acquisition to its result.
struct JobTask {
    runner: Arc<Runner>,
    queue: Queue,
    id: u64,
    key: String,
    job: JobResponse,
    /// What it was admitted to, with capacity reserved for it.
    admission: lifecycle::Admission,
    trace: Trace,
    log: mpsc::UnboundedReceiver<Vec<u8>>,
    stop: CancellationToken,
    _permits: Permits,
}

impl JobTask {
    async fn run(self) {
        let JobTask {
            runner,
            queue,
            id,
            key,
            job,
            admission,
            mut trace,
            log,
            stop,
            _permits,
        } = self;
        // A task that ends without recording its job (a panic) still takes it off the board.
        let _on_board = runner.board.guard(&key);
        let writer = tokio::spawn(write_log(queue.log_path(id), log));
        let name = runner.name.clone();
        // `slipway cancel` stops this job alone; a shutdown stops them all.
        let cancel = stop.child_token();
        let watcher = tokio::spawn(watch_cancel(queue.clone(), id, cancel.clone()));
        let source = QueueJob {
            queue: queue.clone(),
            id,
            runner: name.clone(),
            started: std::sync::Mutex::new(None),
        };
        let life = Life {
            runner: &runner,
            key: &key,
            source: &source,
            stops: Stops {
                cancel: cancel.clone(),
                abort: None,
            },
            since: None,
        };
        // The result is written last, after the whole trace is on disk: a manager killed in
        // between leaves the job claimed (reported failed at the next start), never a result
        // whose log lacks its end.
        let mut ended = None;
        let mut slot = None;
        match life.run(&job, Start::Reserved(admission), &mut trace).await {
            Err(no) if no.status == JobStatus::Canceled && stop.is_cancelled() => {
                // It never ran: the next manager runs it.
                trace.message("Manager shutting down before the job started: back to pending");
                runner.board.forget(&key);
                let q = queue.clone();
                if let Err(e) = blocking(move || q.requeue(id)).await {
                    tracing::error!(runner = %name, job = id, "requeueing the job: {}", Chain(&e));
                }
            }
            Err(no) => {
                let mut result = JobResult::new(&job, no.status);
                if result.status == JobStatus::Failed {
                    result.failure_reason =
                        Some(FailureReason::RunnerSystemFailure.as_str().into());
                }
                let ending = lifecycle::ending_of_refusal(&no);
                result.message = no.message;
                result.runner = Some(name.clone());
                ended = Some((result, ending));
            }
            Ok(ran) => {
                // The slot is held until the result is on disk: a crash in between leaves an
                // acquisition for a finished job, which a restart skips.
                let outcome = ran.outcome;
                slot = ran.slot;
                trace.message(&lifecycle::closing_line(&outcome));
                let started = source.started.lock().ok().and_then(|s| s.clone());
                let mut result = JobResult::new(&job, outcome.status()).started(started.as_ref());
                if let JobOutcome::Failed {
                    reason,
                    exit_code,
                    message,
                } = &outcome
                {
                    if *reason != FailureReason::JobCanceled {
                        result.failure_reason = Some(reason.as_str().into());
                    }
                    result.exit_code = *exit_code;
                    result.message = message.clone();
                }
                ended = Some((result, slipway_status::Ending::of(&outcome)));
            }
        }
        watcher.abort();
        trace.finish();
        drop(trace);
        let _ = writer.await;
        if let Some((result, ending)) = ended {
            finish(&queue, result, &name).await;
            runner.board.finished(&key, ending);
        }
        drop(slot);
    }
}

/// What the queue adds to a job's life: its start recorded once it holds a slot, so a
/// restarted manager knows it ran.
struct QueueJob {
    queue: Queue,
    id: u64,
    runner: String,
    /// Where and when it started, once recorded.
    started: std::sync::Mutex<Option<Started>>,
}

#[async_trait::async_trait]
impl JobSource for QueueJob {
    async fn placed(&self, _job: &JobResponse, acq: &Acquisition) -> Result<(), PlacedError> {
        let record = Started {
            runner: self.runner.clone(),
            instance_id: acq.instance_id.clone(),
            slot: acq.slot,
            started_at_ms: unix_ms(SystemTime::now()),
        };
        if let Ok(mut s) = self.started.lock() {
            *s = Some(record.clone());
        }
        let (q, id) = (self.queue.clone(), self.id);
        blocking(move || q.mark_started(id, &record))
            .await
            .map_err(|e| PlacedError::Record(Box::new(e)))
    }
}

/// Cancel `token` once someone asks the queue to cancel job `id` (polled; ends with the job).
async fn watch_cancel(queue: Queue, id: u64, token: CancellationToken) {
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
        let q = queue.clone();
        let asked = tokio::task::spawn_blocking(move || q.cancel_requested(id))
            .await
            .unwrap_or(false);
        if asked {
            tracing::info!(job = id, "canceled by request");
            token.cancel();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        assert_eq!(key_of(42), "job-42");
        assert_eq!(id_of_key("job-42"), Some(42));
        assert_eq!(id_of_key("build-42"), None);
        assert_eq!(id_of_key("job-x"), None);
    }
}
