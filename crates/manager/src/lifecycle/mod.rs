//! One job's life on a runner, the same for every source: admit → reserve → acquire →
//! execute → release. A source (the embedded queue, GitLab, a local pipeline) supplies only
//! what differs — where jobs come from, what is unpacked before the steps, where the trace and
//! the final state go, and its retry rules — through [`JobSource`] and what it does with the
//! [`Ran`] it gets back.
//!
//! The runner's `environment`, `pre_build_script` and `post_build_script`
//! ([`JobDefaults`](crate::runner::JobDefaults))
//! apply here, so they count for every source alike.

mod admission;
mod ending;
mod execute;
pub mod request;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use slipway_executor::{CollectedArtifacts, HostData, HostSources, Isolation, Tarball};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use slipway_taskscaler::Acquisition;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::runner::Admission;
pub use admission::{NoSlot, acquire, admit, isolation_of, plugin_level, request_of, reserve};
pub use ending::{board_info, closing_line, ending_of_refusal};
pub use execute::DataAt;

use crate::runner::Runner;
use crate::runner::cache::DistributedCache;

/// What a source adds to the life of one of its jobs. Both steps have defaults that add
/// nothing.
#[async_trait::async_trait]
pub trait JobSource: Send + Sync {
    /// What is unpacked into the job's directory before its steps (its sources, the artifacts
    /// of the jobs it depends on). Fetched while the slot is acquired (an instance may be
    /// booting); a failure ends the job with that outcome.
    async fn inputs(
        &self,
        _job: &JobResponse,
        _at: SourcesAt,
        _data: &DataAt,
        _trace: &mut Trace,
        _cancel: &CancellationToken,
    ) -> Result<Inputs, JobOutcome> {
        Ok(Inputs::default())
    }

    /// The job holds the slot `acq` and its steps are next: where the source records that.
    /// An error fails the job with `runner_system_failure` before its steps.
    async fn placed(&self, _job: &JobResponse, _acq: &Acquisition) -> Result<(), PlacedError> {
        Ok(())
    }
}

/// Why a source could not record where its job runs.
#[derive(Debug, thiserror::Error)]
pub enum PlacedError {
    /// Writing the job's start where the source keeps it failed.
    #[error("recording the job's start: {}", crate::chain::Chain(.0.as_ref()))]
    Record(Box<dyn std::error::Error + Send + Sync>),
}

/// A source that adds nothing: no inputs, nothing recorded at placement.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoInputs;

impl JobSource for NoInputs {}

/// Where a job's sources are fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcesAt {
    /// On the manager, sent to the job as the first of [`Inputs::tars`].
    Manager,
    /// Where the job's steps run (an instance's shell, a container, a VM): [`Inputs::sources`]
    /// says how.
    Host,
}

/// What is unpacked into a job's directory before its steps.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Tar streams, unpacked in order: the sources, then each dependency's artifacts.
    pub tars: Vec<Tarball>,
    /// How many of `tars` are the sources: the restored cache goes after them, before the
    /// dependencies' artifacts (GitLab's order).
    pub leading: usize,
    /// Paths git tracks in the sources (what `artifacts:untracked` leaves out).
    pub tracked: Arc<BTreeSet<String>>,
    /// The sources, fetched where the job runs (then not in `tars`; `tracked` comes from
    /// here after the job).
    pub sources: Option<Arc<dyn HostSources>>,
    /// The job's data the job helper moves where it runs (dependencies, artifacts; the
    /// lifecycle adds the distributed cache).
    pub data: Option<HostData>,
}

/// What stops a job: `cancel` (its steps, and every wait before them), and `abort` (also its
/// `after_script`; unset: the cancel does).
#[derive(Debug, Clone, Default)]
pub struct Stops {
    /// Stops the job's steps and its waits for capacity and a slot.
    pub cancel: CancellationToken,
    /// Stops its `after_script` too (`None`: `cancel` does).
    pub abort: Option<CancellationToken>,
}

/// How a job enters its life.
#[derive(Debug, Clone)]
pub enum Start<'a> {
    /// Admitted, with capacity reserved under its key already (the queue reserves before it
    /// claims a job, so that a runner without room leaves it to another).
    Reserved(Admission),
    /// Admit it and reserve its capacity here. `held`: a reservation the source made before it
    /// had the job (GitLab: no capacity, no job request), given back just before the job's own
    /// is made, so the job normally lands on the capacity held for it.
    Admit {
        /// The source's earlier reservation for this job, if any.
        held: Option<&'a str>,
    },
}

/// One job of `runner`, under the reservation (and acquisition) key `key`.
pub struct Life<'a> {
    /// The runner it runs on.
    pub runner: &'a Runner,
    /// Its reservation and acquisition key (what the state store records).
    pub key: &'a str,
    /// What its source adds.
    pub source: &'a dyn JobSource,
    /// What stops it.
    pub stops: Stops,
    /// Its timeout counts from here (GitLab: from when the job was received, so getting the
    /// sources counts); `None`: from its steps' start.
    pub since: Option<Instant>,
}

impl std::fmt::Debug for Life<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Life")
            .field("runner", &self.runner.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// A job that held a slot (or lost it while its inputs failed): what it ended with.
#[derive(Debug)]
pub struct Ran<'a> {
    /// The job as its steps saw it: the runner's defaults applied, paths expanded.
    pub job: JobResponse,
    /// How it ended.
    pub outcome: JobOutcome,
    /// The artifacts archives its steps left.
    pub collected: Vec<CollectedArtifacts>,
    /// Paths git tracks in its sources.
    pub tracked: Arc<BTreeSet<String>>,
    /// Its instance and slot; `None` when its inputs failed before it got one.
    pub placement: Option<(String, u32)>,
    /// From the acquisition to the end of its steps.
    pub duration: Duration,
    /// What it cost, when its runner has prices: its share of its instance up to the end of
    /// its steps (the report after is the runner's overhead).
    pub cost: Option<slipway_cost::JobCost>,
    /// Its slot, still held: the source releases it when its report is safe (the queue: once
    /// the result is on disk), or lets it go when it is dropped.
    pub slot: Option<Held<'a>>,
}

/// A slot a finished job still holds; released by [`Held::release`] or when dropped.
#[derive(Debug)]
pub struct Held<'a> {
    runner: &'a Runner,
    key: String,
}

impl Held<'_> {
    /// Give the slot back to the taskscaler now.
    pub fn release(self) {}
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.runner.release(&self.key);
    }
}

impl Life<'_> {
    /// The whole life of `job`: admitted and reserved as `start` says, then on its slot until
    /// it ends. The slot is released before this returns. `Err` when it never got a slot.
    pub async fn run(
        &self,
        job: &JobResponse,
        start: Start<'_>,
        trace: &mut Trace,
    ) -> Result<Ran<'_>, NoSlot> {
        let admission = match start {
            Start::Reserved(admission) => admission,
            Start::Admit { held } => {
                let admitted = admit(self.runner, job, trace);
                if let Some(held) = held {
                    self.runner.unreserve(held);
                }
                let admission = admitted?;
                reserve(self.runner, self.key, &admission, trace, &self.stops.cancel).await?;
                admission
            }
        };
        self.run_reserved(job, &admission, trace).await
    }

    /// Acquire the slot while the inputs are fetched, then execute; whichever of the two
    /// fails first stops the other.
    async fn run_reserved(
        &self,
        job: &JobResponse,
        admission: &Admission,
        trace: &mut Trace,
    ) -> Result<Ran<'_>, NoSlot> {
        let (runner, key) = (self.runner, self.key);
        let cancel = &self.stops.cancel;
        // The runner's environment counts for everything after: sources, cache, paths, steps.
        let job = runner.defaults.prepare(job);
        let whole = admission.level == Isolation::Instance;
        let fetch_cancel = cancel.child_token();
        let acquire_cancel = cancel.child_token();
        // 1: the acquisition failed first, 2: the fetch did.
        let first_failure = AtomicU8::new(0);
        // The inputs' trace lines follow the slot's.
        let (side_tx, mut side_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let mut side = Trace::for_job(&job, side_tx);
        let acquiring = async {
            let r = acquire(runner, key, trace, &acquire_cancel)
                .await
                .map(|a| (a, Instant::now()));
            match &r {
                // It holds its slot from now on, while its inputs may still be on their way.
                Ok((a, _)) => {
                    runner.board.running(key, &a.instance_id, a.slot);
                    runner.charge_started(key, a, whole, &job);
                }
                Err(_) => {
                    let _ =
                        first_failure.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
                    fetch_cancel.cancel();
                }
            }
            r
        };
        // The distributed cache's restore stage follows the source's inputs: the executor gets
        // the job without `cache:` and collects what to save as extra artifact entries.
        let cache = runner.cache.as_deref().filter(|_| !job.cache.is_empty());
        // Where its dependencies, caches and artifacts move: by the job helper where it runs,
        // unless the runner (or the level) says the manager.
        let data_at = execute::data_at(runner);
        let fetching = async {
            let at = execute::sources_at(runner);
            let r = self
                .source
                .inputs(&job, at, &data_at, &mut side, &fetch_cancel)
                .await;
            let r = match (r, cache, &data_at) {
                (Ok(_), Some(_), DataAt::NoHelper) => {
                    let outcome = DataAt::no_helper();
                    if let JobOutcome::Failed { message, .. } = &outcome {
                        side.message(&format!("ERROR: {message}"));
                    }
                    Err(outcome)
                }
                (Ok(mut inputs), Some(cache), DataAt::Host(base)) => {
                    let data = inputs.data.get_or_insert_with(|| base.clone());
                    data.restore = cache.restore_steps(&job, &mut side).await;
                    let saves = cache.save_collects(&job, &mut side).await;
                    data.collect.splice(0..0, saves);
                    Ok(inputs)
                }
                (Ok(mut inputs), Some(cache), _) => {
                    match cache.restore(&job, &mut side, &fetch_cancel).await {
                        Ok(restored) => {
                            let at = inputs.leading.min(inputs.tars.len());
                            inputs.tars.splice(at..at, restored);
                            Ok(inputs)
                        }
                        Err(msg) => Err(JobOutcome::failed(
                            FailureReason::RunnerSystemFailure,
                            None,
                            msg,
                        )),
                    }
                }
                (r, _, _) => r,
            };
            // Sources fetched on the manager: the helper learns what git tracks from here.
            let r = r.map(|mut inputs| {
                if let Some(d) = &mut inputs.data {
                    d.tracked = Arc::clone(&inputs.tracked);
                }
                inputs
            });
            if r.is_err() {
                let _ = first_failure.compare_exchange(0, 2, Ordering::SeqCst, Ordering::SeqCst);
                acquire_cancel.cancel();
            }
            r
        };
        let (acq, inputs) = tokio::join!(acquiring, fetching);
        side.finish();
        drop(side);
        let held = |_: &Acquisition| Held {
            runner,
            key: key.to_string(),
        };
        let ran = |job: JobResponse, outcome: JobOutcome, placement: Option<&Acquisition>| Ran {
            job,
            outcome,
            collected: Vec::new(),
            tracked: Arc::default(),
            placement: placement.map(|a| (a.instance_id.clone(), a.slot)),
            duration: Duration::ZERO,
            cost: runner.charge_total(key),
            slot: placement.map(held),
        };
        // Recorded only for a job whose steps are next.
        let placed = match (&acq, &inputs) {
            (Ok((a, _)), Ok(_)) => self.source.placed(&job, a).await,
            _ => Ok(()),
        };
        match (&acq, &placed) {
            (Ok((a, _)), Ok(())) => trace.message(&format!(
                "Running on instance {} slot {}",
                a.instance_id, a.slot
            )),
            (Ok(_), Err(e)) => trace.message(&format!("ERROR: {e}")),
            _ => {}
        }
        while let Ok(chunk) = side_rx.try_recv() {
            trace.write(&chunk);
        }
        let ((acq, acquired_at), inputs) = match (acq, inputs) {
            (Ok(a), Ok(i)) => (a, i),
            (Ok((a, _)), Err(outcome)) => return Ok(ran(job, outcome, Some(&a))),
            // The fetch failed and stopped the wait for a slot (which gave its reservation back).
            (Err(_), Err(outcome)) if first_failure.load(Ordering::SeqCst) == 2 => {
                return Ok(ran(job, outcome, None));
            }
            (Err(no), _) => return Err(no),
        };
        if let Err(e) = placed {
            let outcome =
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
            return Ok(ran(job, outcome, Some(&acq)));
        }
        let mut job = job;
        // Each try has what is left of the job's timeout since it was received.
        let timeout = job.runner_info.timeout;
        let (mut acq, mut acquired_at) = (acq, acquired_at);
        let mut tars = inputs.tars;
        let attempts = runner.start_attempts.max(1);
        let mut attempt = 1;
        // The job as the executor gets it with the distributed cache: made once, its timeout
        // kept in step with each try's.
        let helper_caches = matches!(data_at, DataAt::Host(_));
        let mut with_cache_entries = cache.map(|_| {
            if helper_caches {
                DistributedCache::without_cache(&job)
            } else {
                DistributedCache::for_executor(&job)
            }
        });
        let executed = loop {
            if let Some(since) = self.since
                && timeout > 0
            {
                let spent = since.elapsed().as_secs();
                job.runner_info.timeout = timeout.saturating_sub(spent).max(1);
            }
            // A try that may be followed by another hands over copies of the inputs.
            let mut last = attempt >= attempts;
            let these = if last {
                std::mem::take(&mut tars)
            } else {
                match tars.iter().map(Tarball::duplicate).collect() {
                    Ok(copies) => copies,
                    Err(e) => {
                        tracing::warn!(
                            job = job.id,
                            "copying the job's inputs for a second try: {e}"
                        );
                        last = true;
                        std::mem::take(&mut tars)
                    }
                }
            };
            if let Some(e) = &mut with_cache_entries {
                e.runner_info.timeout = job.runner_info.timeout;
            }
            let ex = execute::execute(
                runner,
                &acq,
                with_cache_entries.as_ref().unwrap_or(&job),
                admission,
                these,
                (inputs.sources.clone(), inputs.data.clone()),
                trace,
                &self.stops,
            )
            .await;
            let again = match &ex.instance_failed {
                Some(why) if !trace.script_started() && !cancel.is_cancelled() => why.clone(),
                Some(why) => {
                    // No other try: the failed instance still goes, rather than wait for a
                    // heartbeat to find it dead.
                    runner.release_failed(key, why);
                    break Ok((ex.outcome, ex.artifacts));
                }
                None => break Ok((ex.outcome, ex.artifacts)),
            };
            if last {
                runner.release_failed(key, &again);
                trace.message(&format!(
                    "ERROR: the job's instance failed before its script started on {attempt} \
                     instance(s) in a row (start_attempts = {attempts})"
                ));
                break Ok((ex.outcome, ex.artifacts));
            }
            attempt += 1;
            trace.message(&format!(
                "WARNING: {again}; the job's script had not started: trying it again on another \
                 instance (attempt {attempt} of {attempts})"
            ));
            runner.release_failed(key, &again);
            let next = async {
                reserve(runner, key, admission, trace, cancel).await?;
                acquire(runner, key, trace, cancel).await
            };
            match next.await {
                Ok(a) => {
                    if let Err(e) = self.source.placed(&job, &a).await {
                        trace.message(&format!("ERROR: {e}"));
                        let outcome = JobOutcome::failed(
                            FailureReason::RunnerSystemFailure,
                            None,
                            e.to_string(),
                        );
                        break Err((outcome, Some(a)));
                    }
                    runner.board.running(key, &a.instance_id, a.slot);
                    runner.charge_started(key, &a, whole, &job);
                    trace.message(&format!(
                        "Running on instance {} slot {}",
                        a.instance_id, a.slot
                    ));
                    (acq, acquired_at) = (a, Instant::now());
                }
                // No working slot came of it: to its source the job never got one (a queue
                // gives a job the manager's stop caught here back to its queue).
                Err(no) => {
                    runner.charge_total(key);
                    return Err(no);
                }
            }
        };
        let tracked = match &inputs.sources {
            Some(s) => s.tracked(),
            None => inputs.tracked,
        };
        let (outcome, collected, acq) = match executed {
            Ok((outcome, collected)) => (outcome, collected, Some(acq)),
            Err((outcome, placed)) => (outcome, Vec::new(), placed),
        };
        // The archive-cache stage: entries past the job's own artifacts are its caches.
        let (collected, caches): (Vec<_>, Vec<_>) = collected
            .into_iter()
            .partition(|c| c.spec < job.artifacts.len());
        if let (Some(cache), Some(ran_as)) = (cache, &with_cache_entries)
            && !caches.is_empty()
        {
            cache.save(ran_as, caches, &tracked, trace).await;
        }
        Ok(Ran {
            placement: acq.as_ref().map(|a| (a.instance_id.clone(), a.slot)),
            duration: acquired_at.elapsed(),
            cost: runner.charge_total(key),
            slot: acq.as_ref().map(held),
            job,
            outcome,
            collected,
            tracked,
        })
    }
}
