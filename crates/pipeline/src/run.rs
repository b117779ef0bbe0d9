//! Pipeline execution as a pure state machine: which jobs may start, what happens when one ends.
//!
//! No I/O and no clock: the caller starts jobs that [`PipelineRun::ready`] returns, runs them
//! however it likes (in parallel or not), and reports each outcome with [`PipelineRun::finish`].
//!
//! Semantics follow GitLab's pipeline processing (`Ci::ProcessBuildService`, status composites):
//! - Without `needs`, a job waits until every job of all earlier stages has finished; their
//!   combined status decides whether it runs. With `needs`, it waits for just those jobs
//!   (`needs: []` starts at once) and only their statuses count.
//! - Combined status: no jobs → success; with `needs`, any skipped → skipped; all skipped →
//!   skipped; only successes, allowed failures and skips → success; any failure → failed; else
//!   any cancel → canceled.
//! - `on_success` runs on success (and, without `needs`, on skipped); `on_failure` runs on
//!   failed; `always` runs on success, failed or skipped. Otherwise the job becomes `Skipped`.
//!
//! - A `when: manual` job whose turn comes waits as `Manual` until it is played (named in the
//!   [`Selection`]). One that may fail (`allow_failure`, the default outside `rules`) counts
//!   as skipped for later jobs; one that may not blocks them, and the pipeline is `Blocked`.
//! - `dependencies:` chooses whose artifacts a job gets (`needs` still decides when it starts).
//!
//! Left to the caller, which owns the clock and the executor: `when: delayed` (wait
//! `start_in` once [`PipelineRun::ready`] returns the job), `retry`, and `resource_group`.
//! A canceled job is never restarted.

use std::fmt;

use crate::pipeline::Pipeline;
use slipway_job::model::When;

/// State of one job in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// Not started; waiting for earlier jobs or for the caller to start it.
    Pending,
    /// Started and not finished.
    Running,
    /// Finished successfully.
    Success,
    /// Failed, and the job does not allow failure.
    Failed,
    /// Failed, but the job has `allow_failure: true`: the pipeline goes on as if it succeeded.
    FailedAllowed,
    /// Never ran: its `when` condition could not be met, or it was not selected.
    Skipped,
    /// Canceled before or while running.
    Canceled,
    /// A `when: manual` job whose turn came: it waits for someone to start it.
    Manual,
}

/// A finished job's status as the run records it.
impl From<slipway_job::JobStatus> for JobStatus {
    fn from(s: slipway_job::JobStatus) -> Self {
        match s {
            slipway_job::JobStatus::Success => JobStatus::Success,
            slipway_job::JobStatus::Failed => JobStatus::Failed,
            slipway_job::JobStatus::Canceled => JobStatus::Canceled,
        }
    }
}

impl JobStatus {
    /// True once the job will not change any more.
    pub fn is_finished(self) -> bool {
        !matches!(self, JobStatus::Pending | JobStatus::Running)
    }

    /// Lower-case name, as GitLab spells job statuses.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Success => "success",
            JobStatus::Failed => "failed",
            JobStatus::FailedAllowed => "failed (allowed)",
            JobStatus::Skipped => "skipped",
            JobStatus::Canceled => "canceled",
            JobStatus::Manual => "manual",
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Overall state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PipelineStatus {
    /// Some job is pending or running.
    Running,
    /// Every job that ran succeeded.
    Success,
    /// Succeeded, but some job with `allow_failure` failed.
    SuccessWithWarnings,
    /// A job without `allow_failure` failed.
    Failed,
    /// A job was canceled (and none failed).
    Canceled,
    /// No job ran at all.
    Skipped,
    /// A manual job that may not fail waits to be started; the jobs after it did not run.
    Blocked,
}

impl fmt::Display for PipelineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PipelineStatus::Running => "running",
            PipelineStatus::Success => "success",
            PipelineStatus::SuccessWithWarnings => "success with warnings",
            PipelineStatus::Failed => "failed",
            PipelineStatus::Canceled => "canceled",
            PipelineStatus::Skipped => "skipped",
            PipelineStatus::Blocked => "blocked",
        })
    }
}

/// A call that does not fit the run's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// `--job NAME` named no job of the pipeline.
    #[error("no job named \"{0}\" in the pipeline")]
    UnknownJob(String),
    /// A job index out of range.
    #[error("no job with index {0}")]
    NoSuchIndex(usize),
    /// `start` on a job that is not ready.
    #[error("job \"{job}\" cannot start: it is {status}{}", if *.waiting { " and waits for earlier jobs" } else { "" })]
    NotReady {
        /// Job name.
        job: String,
        /// Its status.
        status: JobStatus,
        /// Whether it is pending but still waiting for earlier jobs.
        waiting: bool,
    },
    /// `finish` on a job that is not running.
    #[error("job \"{job}\" cannot finish: it is {status}, not running")]
    NotRunning {
        /// Job name.
        job: String,
        /// Its status.
        status: JobStatus,
    },
    /// `finish` with a status that is not an outcome.
    #[error("\"{0}\" is not an outcome a job can finish with")]
    NotAnOutcome(JobStatus),
}

#[derive(Debug, Clone)]
struct RunJob {
    name: String,
    when: When,
    allow_failure: bool,
    /// Exit codes whose failure is allowed.
    allow_exit_codes: Vec<i32>,
    /// `when: manual` and not played: it stops at `Manual`.
    manual: bool,
    /// Jobs whose end this one waits for and whose statuses decide whether it runs.
    preds: Vec<usize>,
    /// Scheduled by `needs` (GitLab's DAG scheduling), which changes what "skipped" means.
    dag: bool,
    /// Jobs whose artifacts this one receives, if they ran.
    artifact_from: Vec<usize>,
    /// False for jobs left out by `only_job`.
    selected: bool,
    status: JobStatus,
    /// A trigger job: how it ends.
    bridge: Option<Bridge>,
    /// In a child pipeline: the trigger job that started it, whose status it counts toward.
    upstream: Option<usize>,
    /// The trigger job whose child pipeline must be created before this job may start (its
    /// `upstream`, unless it was picked to run alone).
    gate: Option<usize>,
}

/// What a trigger job does once its turn comes.
#[derive(Debug, Clone, Copy)]
struct Bridge {
    /// `strategy: depend`.
    depend: bool,
    /// The child pipeline is not created (its `workflow:rules`): the trigger job fails.
    not_created: bool,
    /// The child pipeline was created: its jobs may start.
    created: bool,
}

/// Combined status of the jobs a job waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prior {
    Success,
    Skipped,
    Failed,
    Canceled,
    /// A manual job that may not fail waits.
    Blocked,
}

/// Which jobs a run includes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Run only these jobs (all when empty); they start whatever their `when` and are played
    /// when manual. A name of a `parallel:` job selects all of its jobs.
    pub jobs: Vec<String>,
    /// With `jobs`: also run what they need, transitively (their `needs`, else every job of
    /// the earlier stages), in pipeline order.
    pub needs: bool,
    /// Manual jobs to play in this run (by name, or a parallel job's name).
    pub manual: Vec<String>,
}

/// The state of one pipeline run. Job indices are those of [`Pipeline::jobs`].
#[derive(Debug, Clone)]
pub struct PipelineRun {
    jobs: Vec<RunJob>,
}

impl PipelineRun {
    /// Starts a run of `pipeline`. With `only_job` (`--job NAME`) only that job runs: it starts at
    /// once whatever its `when`, the jobs it needs are *not* run (and hand it no artifacts), and
    /// every other job stays `Skipped`.
    pub fn new(pipeline: &Pipeline, only_job: Option<&str>) -> Result<Self, RunError> {
        Self::with_selection(
            pipeline,
            &Selection {
                jobs: only_job.map(String::from).into_iter().collect(),
                ..Selection::default()
            },
        )
    }

    /// Starts a run of `pipeline` limited to `selection`.
    pub fn with_selection(pipeline: &Pipeline, selection: &Selection) -> Result<Self, RunError> {
        // A name is a job, or a parallel job as written (all of its jobs).
        let named = |name: &str| -> Vec<usize> {
            match pipeline.job_index(name) {
                Some(i) => vec![i],
                None => pipeline
                    .jobs
                    .iter()
                    .enumerate()
                    .filter(|(_, j)| j.parallel.as_ref().is_some_and(|p| p.job == name))
                    .map(|(i, _)| i)
                    .collect(),
            }
        };
        let mut picked: Vec<usize> = Vec::new();
        for name in &selection.jobs {
            let hits = named(name);
            if hits.is_empty() {
                return Err(RunError::UnknownJob(name.clone()));
            }
            picked.extend(hits);
        }
        let mut played: Vec<usize> = picked.clone();
        for name in &selection.manual {
            let hits = named(name);
            if hits.is_empty() {
                return Err(RunError::UnknownJob(name.clone()));
            }
            played.extend(hits);
        }
        let index = |name: &str| pipeline.job_index(name);
        // Stages order the jobs of one pipeline (the top one or a child).
        let earlier = |job: &crate::pipeline::PipelineJob| -> Vec<usize> {
            pipeline
                .jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| j.upstream == job.upstream && j.stage_index < job.stage_index)
                .map(|(k, _)| k)
                .collect()
        };
        let preds_of = |i: usize| -> Vec<usize> {
            let job = &pipeline.jobs[i];
            match &job.needs {
                Some(needs) => needs.iter().filter_map(|n| index(&n.job)).collect(),
                None => earlier(job),
            }
        };
        let upstream: Vec<Option<usize>> = pipeline
            .jobs
            .iter()
            .map(|j| j.upstream.as_deref().and_then(index))
            .collect();
        // A picked trigger job brings its child pipeline (all of it, nested ones too).
        let within = |i: usize, bridge: usize| {
            let mut up = upstream[i];
            while let Some(u) = up {
                if u == bridge {
                    return true;
                }
                up = upstream[u];
            }
            false
        };
        // With `needs`, the picked jobs and everything they wait for (a child job: its
        // trigger job too).
        let mut selected: Vec<bool> = vec![picked.is_empty(); pipeline.jobs.len()];
        let mut stack = picked.clone();
        while let Some(i) = stack.pop() {
            if selected[i] {
                continue;
            }
            selected[i] = true;
            if selection.needs {
                stack.extend(preds_of(i));
                stack.extend(upstream[i]);
            }
            if pipeline.jobs[i].trigger.is_some() {
                stack.extend((0..pipeline.jobs.len()).filter(|&k| within(k, i)));
            }
        }
        let alone = !picked.is_empty() && !selection.needs;
        let jobs = pipeline
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let (preds, mut artifact_from, dag) = match &job.needs {
                    // Names were checked by the parser; an unknown one is ignored defensively.
                    Some(needs) => (
                        needs.iter().filter_map(|n| index(&n.job)).collect(),
                        needs
                            .iter()
                            .filter(|n| n.artifacts)
                            .filter_map(|n| index(&n.job))
                            .collect(),
                        true,
                    ),
                    None => {
                        let before = earlier(job);
                        (before.clone(), before, false)
                    }
                };
                if let Some(deps) = &job.dependencies {
                    // A job that `needs:` marks `artifacts: false` gives none, named in
                    // `dependencies:` or not (GitLab's rule).
                    let refused = |i: &usize| {
                        job.needs
                            .iter()
                            .flatten()
                            .any(|n| !n.artifacts && index(&n.job) == Some(*i))
                    };
                    artifact_from = deps
                        .iter()
                        .flat_map(|d| named(d))
                        .filter(|i| !refused(i))
                        .collect();
                }
                // A child pipeline's job also gets the artifacts of the parent's jobs it names.
                artifact_from.extend(job.parent_artifacts.iter().filter_map(|n| index(n)));
                let mut rj = RunJob {
                    name: job.name.clone(),
                    when: job.when,
                    allow_failure: job.allow_failure,
                    allow_exit_codes: job.allow_failure_exit_codes.clone(),
                    manual: job.manual && !played.contains(&i),
                    preds,
                    dag,
                    artifact_from,
                    selected: selected[i],
                    status: if selected[i] {
                        JobStatus::Pending
                    } else {
                        JobStatus::Skipped
                    },
                    bridge: job.trigger.as_ref().map(|t| Bridge {
                        depend: t.depend,
                        not_created: t.excluded.is_some(),
                        created: false,
                    }),
                    upstream: upstream[i],
                    gate: upstream[i],
                };
                if picked.contains(&i) {
                    // Asked for by name: it runs whatever its `when`.
                    rj.when = When::Always;
                    if alone {
                        rj.preds.clear();
                        // Nor does it wait for its trigger job, which is not run.
                        if !rj.upstream.is_some_and(|u| selected[u]) {
                            rj.gate = None;
                        }
                    }
                }
                rj
            })
            .collect();
        let mut run = PipelineRun { jobs };
        run.settle();
        Ok(run)
    }

    /// Number of jobs (selected or not).
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// True for a pipeline without jobs (the parser never produces one).
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Name of job `i`.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.jobs.get(i).map(|j| j.name.as_str())
    }

    /// Status of job `i`.
    pub fn job_status(&self, i: usize) -> Option<JobStatus> {
        self.jobs.get(i).map(|j| j.status)
    }

    /// Whether job `i` is part of this run (false for jobs left out by `only_job`).
    pub fn is_selected(&self, i: usize) -> bool {
        self.jobs.get(i).is_some_and(|j| j.selected)
    }

    /// Jobs that may start now, in pipeline order.
    pub fn ready(&self) -> Vec<usize> {
        (0..self.jobs.len()).filter(|&i| self.is_ready(i)).collect()
    }

    fn is_ready(&self, i: usize) -> bool {
        let j = &self.jobs[i];
        // `settle` has already skipped every waiting-complete job whose condition fails.
        j.selected
            && j.status == JobStatus::Pending
            && j.bridge.is_none()
            && self.gate_open(i)
            && self.preds_finished(i)
    }

    /// Whether job `i`'s pipeline exists: the top one, or a child its trigger job created.
    fn gate_open(&self, i: usize) -> bool {
        self.jobs[i]
            .gate
            .is_none_or(|g| self.jobs[g].bridge.is_some_and(|b| b.created))
    }

    fn preds_finished(&self, i: usize) -> bool {
        self.jobs[i]
            .preds
            .iter()
            .all(|&p| self.jobs[p].status.is_finished())
    }

    fn get(&self, i: usize) -> Result<&RunJob, RunError> {
        self.jobs.get(i).ok_or(RunError::NoSuchIndex(i))
    }

    /// Marks job `i` as running; it must be in [`PipelineRun::ready`].
    pub fn start(&mut self, i: usize) -> Result<(), RunError> {
        let j = self.get(i)?;
        if !self.is_ready(i) {
            return Err(RunError::NotReady {
                job: j.name.clone(),
                status: j.status,
                waiting: j.status == JobStatus::Pending,
            });
        }
        self.jobs[i].status = JobStatus::Running;
        Ok(())
    }

    /// Records how running job `i` ended: `Success`, `Failed`, `FailedAllowed` or `Canceled`.
    /// A failure is stored as `FailedAllowed` or `Failed` according to the job's
    /// `allow_failure`, so callers need not know it. Jobs that can no longer run become `Skipped`.
    pub fn finish(&mut self, i: usize, status: JobStatus) -> Result<(), RunError> {
        self.finish_with_exit_code(i, status, None)
    }

    /// As [`PipelineRun::finish`], with the script's exit code: a failure with one of the job's
    /// `allow_failure: exit_codes` is allowed.
    pub fn finish_with_exit_code(
        &mut self,
        i: usize,
        status: JobStatus,
        exit_code: Option<i32>,
    ) -> Result<(), RunError> {
        let j = self.get(i)?;
        let allowed = j.allow_failure || exit_code.is_some_and(|c| j.allow_exit_codes.contains(&c));
        if j.status != JobStatus::Running {
            return Err(RunError::NotRunning {
                job: j.name.clone(),
                status: j.status,
            });
        }
        let status = match status {
            JobStatus::Success | JobStatus::Canceled => status,
            JobStatus::Failed | JobStatus::FailedAllowed if allowed => JobStatus::FailedAllowed,
            JobStatus::Failed | JobStatus::FailedAllowed => JobStatus::Failed,
            other => return Err(RunError::NotAnOutcome(other)),
        };
        self.jobs[i].status = status;
        self.settle();
        Ok(())
    }

    /// Cancels the run: pending jobs become `Canceled`. Returns the running jobs, which the
    /// caller stops and then reports with `finish(i, Canceled)` (or how they really ended).
    pub fn cancel(&mut self) -> Vec<usize> {
        for j in &mut self.jobs {
            // A trigger job runs nothing of its own to stop.
            let waiting = j.status == JobStatus::Pending
                || (j.bridge.is_some() && j.status == JobStatus::Running);
            if j.selected && waiting {
                j.status = JobStatus::Canceled;
            }
        }
        (0..self.jobs.len())
            .filter(|&i| self.jobs[i].status == JobStatus::Running)
            .collect()
    }

    /// True when every selected job has finished.
    pub fn is_done(&self) -> bool {
        self.jobs
            .iter()
            .all(|j| !j.selected || j.status.is_finished())
    }

    /// The run's status: `Running` until [`PipelineRun::is_done`], then the outcome.
    pub fn status(&self) -> PipelineStatus {
        if !self.is_done() {
            return PipelineStatus::Running;
        }
        self.composite(None)
    }

    /// Combined status of the finished pipeline whose trigger job is `upstream` (`None`: the
    /// top pipeline).
    fn composite(&self, upstream: Option<usize>) -> PipelineStatus {
        let member = |j: &&RunJob| j.selected && j.upstream == upstream;
        let statuses: Vec<JobStatus> = self.jobs.iter().filter(member).map(|j| j.status).collect();
        let any = |s: JobStatus| statuses.contains(&s);
        let blocked = self
            .jobs
            .iter()
            .filter(member)
            .any(|j| j.status == JobStatus::Manual && !j.allow_failure);
        if statuses
            .iter()
            .all(|&s| matches!(s, JobStatus::Skipped | JobStatus::Manual))
            && !blocked
        {
            PipelineStatus::Skipped
        } else if any(JobStatus::Failed) {
            PipelineStatus::Failed
        } else if any(JobStatus::Canceled) {
            PipelineStatus::Canceled
        } else if blocked {
            PipelineStatus::Blocked
        } else if any(JobStatus::FailedAllowed) {
            PipelineStatus::SuccessWithWarnings
        } else {
            PipelineStatus::Success
        }
    }

    /// Earlier jobs whose artifacts job `i` receives: by default every job of an earlier stage,
    /// with `needs` exactly the needed jobs without `artifacts: false`; in both cases only those
    /// that ran (succeeded or failed; whether they left artifacts is the caller's business).
    pub fn artifact_sources(&self, i: usize) -> Vec<usize> {
        let Some(j) = self.jobs.get(i) else {
            return Vec::new();
        };
        j.artifact_from
            .iter()
            .copied()
            .filter(|&k| {
                let s = &self.jobs[k];
                s.selected
                    && matches!(
                        s.status,
                        JobStatus::Success | JobStatus::Failed | JobStatus::FailedAllowed
                    )
            })
            .collect()
    }

    /// Skips every pending job whose predecessors are done but whose condition fails, until
    /// nothing changes (a skip can complete another job's predecessors).
    fn settle(&mut self) {
        loop {
            let mut changed = false;
            for i in 0..self.jobs.len() {
                if self.jobs[i].selected && self.jobs[i].status == JobStatus::Running {
                    changed |= self.follow_child(i);
                }
                if !self.jobs[i].selected || self.jobs[i].status != JobStatus::Pending {
                    continue;
                }
                if !self.gate_open(i) {
                    // A trigger job that ended without creating its child: the child's jobs
                    // never run.
                    if let Some(g) = self.jobs[i].gate
                        && self.jobs[g].status.is_finished()
                    {
                        self.jobs[i].status = match self.jobs[g].status {
                            JobStatus::Canceled => JobStatus::Canceled,
                            _ => JobStatus::Skipped,
                        };
                        changed = true;
                    }
                    continue;
                }
                if !self.preds_finished(i) {
                    continue;
                }
                let prior = self.prior(i);
                if !runs(self.jobs[i].when, prior, self.jobs[i].dag) {
                    self.jobs[i].status = JobStatus::Skipped;
                    changed = true;
                } else if self.jobs[i].manual {
                    self.jobs[i].status = JobStatus::Manual;
                    changed = true;
                } else if self.jobs[i].bridge.is_some() {
                    self.create_child(i);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Trigger job `i`'s turn: it creates its child pipeline (or fails to).
    fn create_child(&mut self, i: usize) {
        let j = &mut self.jobs[i];
        let Some(b) = &mut j.bridge else {
            return;
        };
        j.status = if b.not_created {
            if j.allow_failure {
                JobStatus::FailedAllowed
            } else {
                JobStatus::Failed
            }
        } else {
            b.created = true;
            if b.depend {
                JobStatus::Running
            } else {
                JobStatus::Success
            }
        };
    }

    /// A running trigger job (`strategy: depend`) takes its child pipeline's status once every
    /// job of it has finished; returns whether it did.
    fn follow_child(&mut self, i: usize) -> bool {
        if self.jobs[i].bridge.is_none() {
            return false;
        }
        let child_done = self
            .jobs
            .iter()
            .all(|j| !j.selected || j.upstream != Some(i) || j.status.is_finished());
        if !child_done {
            return false;
        }
        let allowed = self.jobs[i].allow_failure;
        self.jobs[i].status = match self.composite(Some(i)) {
            PipelineStatus::Success | PipelineStatus::SuccessWithWarnings => JobStatus::Success,
            // GitLab leaves it running while its child waits; here it waits as a manual job.
            PipelineStatus::Blocked => JobStatus::Manual,
            _ if allowed => JobStatus::FailedAllowed,
            _ => JobStatus::Failed,
        };
        true
    }

    fn prior(&self, i: usize) -> Prior {
        let j = &self.jobs[i];
        let blocking = |p: &RunJob| p.status == JobStatus::Manual && !p.allow_failure;
        if j.preds.iter().any(|&p| blocking(&self.jobs[p])) {
            return Prior::Blocked;
        }
        // A manual job that may fail counts as skipped.
        let statuses: Vec<JobStatus> = j
            .preds
            .iter()
            .filter(|&&p| self.jobs[p].selected)
            .map(|&p| match self.jobs[p].status {
                JobStatus::Manual => JobStatus::Skipped,
                s => s,
            })
            .collect();
        let any = |s: JobStatus| statuses.contains(&s);
        if statuses.is_empty() {
            Prior::Success
        } else if j.dag && any(JobStatus::Skipped) {
            // GitLab: "the DAG job is skipped if one of the needs does not run at all".
            Prior::Skipped
        } else if statuses.iter().all(|&s| s == JobStatus::Skipped) {
            Prior::Skipped
        } else if statuses.iter().all(|&s| {
            matches!(
                s,
                JobStatus::Success | JobStatus::FailedAllowed | JobStatus::Skipped
            )
        }) {
            Prior::Success
        } else if any(JobStatus::Failed) {
            Prior::Failed
        } else {
            Prior::Canceled
        }
    }
}

/// Whether a job with condition `when` runs after `prior` (GitLab's valid statuses per `when`).
fn runs(when: When, prior: Prior, dag: bool) -> bool {
    match when {
        When::OnSuccess => prior == Prior::Success || (!dag && prior == Prior::Skipped),
        When::OnFailure => prior == Prior::Failed,
        When::Always => !matches!(prior, Prior::Canceled | Prior::Blocked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::PipelineOptions;

    fn pipeline(text: &str) -> Pipeline {
        Pipeline::parse(text, "test.yml", PipelineOptions::default()).unwrap()
    }

    fn idx(p: &Pipeline, name: &str) -> usize {
        p.job_index(name).unwrap()
    }

    fn names(p: &Pipeline, v: &[usize]) -> Vec<String> {
        v.iter().map(|&i| p.jobs[i].name.clone()).collect()
    }

    /// Runs to the end, starting everything ready and ending each job with `outcome(name)`;
    /// returns the order jobs started in, in waves.
    fn drive(
        p: &Pipeline,
        run: &mut PipelineRun,
        outcome: impl Fn(&str) -> JobStatus,
    ) -> Vec<Vec<String>> {
        let mut waves = Vec::new();
        while !run.is_done() {
            let ready = run.ready();
            assert!(!ready.is_empty(), "stuck: {run:?}");
            for &i in &ready {
                run.start(i).unwrap();
            }
            for &i in &ready {
                run.finish(i, outcome(&p.jobs[i].name)).unwrap();
            }
            waves.push(names(p, &ready));
        }
        waves
    }

    const STAGED: &str = "
stages: [build, test, deploy]
build: {stage: build, script: make}
lint: {stage: build, script: lint, allow_failure: true}
unit: {stage: test, script: test}
notify: {stage: test, script: notify, when: on_failure}
deploy: {stage: deploy, script: deploy}
cleanup: {stage: deploy, script: clean, when: always}
";

    #[test]
    fn all_green_runs_stage_by_stage() {
        let p = pipeline(STAGED);
        let mut run = PipelineRun::new(&p, None).unwrap();
        let waves = drive(&p, &mut run, |_| JobStatus::Success);
        assert_eq!(
            waves,
            vec![
                vec!["build", "lint"],
                vec!["unit"],
                vec!["deploy", "cleanup"]
            ]
        );
        assert_eq!(run.job_status(idx(&p, "notify")), Some(JobStatus::Skipped));
        assert_eq!(run.status(), PipelineStatus::Success);
    }

    #[test]
    fn allowed_failure_continues_with_warnings() {
        let p = pipeline(STAGED);
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive(&p, &mut run, |n| {
            if n == "lint" {
                JobStatus::Failed
            } else {
                JobStatus::Success
            }
        });
        assert_eq!(
            run.job_status(idx(&p, "lint")),
            Some(JobStatus::FailedAllowed)
        );
        assert_eq!(run.job_status(idx(&p, "deploy")), Some(JobStatus::Success));
        assert_eq!(run.job_status(idx(&p, "notify")), Some(JobStatus::Skipped));
        assert_eq!(run.status(), PipelineStatus::SuccessWithWarnings);
    }

    #[test]
    fn failure_skips_on_success_but_runs_on_failure_and_always() {
        let p = pipeline(STAGED);
        let mut run = PipelineRun::new(&p, None).unwrap();
        let waves = drive(&p, &mut run, |n| {
            if n == "build" {
                JobStatus::Failed
            } else {
                JobStatus::Success
            }
        });
        assert_eq!(
            waves,
            vec![vec!["build", "lint"], vec!["notify"], vec!["cleanup"]]
        );
        let st = |n| run.job_status(idx(&p, n)).unwrap();
        assert_eq!(st("unit"), JobStatus::Skipped);
        assert_eq!(st("deploy"), JobStatus::Skipped);
        assert_eq!(st("notify"), JobStatus::Success);
        assert_eq!(st("cleanup"), JobStatus::Success);
        assert_eq!(run.status(), PipelineStatus::Failed);
    }

    #[test]
    fn needs_run_as_a_dag() {
        let p = pipeline(
            "
stages: [build, test, deploy]
build_a: {stage: build, script: a}
build_b: {stage: build, script: b}
test_a: {stage: test, script: t, needs: [build_a]}
test_b: {stage: test, script: t, needs: [{job: build_b, artifacts: false}]}
lint: {stage: test, script: l, needs: []}
deploy: {stage: deploy, script: d}
",
        );
        let mut run = PipelineRun::new(&p, None).unwrap();
        assert_eq!(names(&p, &run.ready()), ["build_a", "build_b", "lint"]);
        for i in run.ready() {
            run.start(i).unwrap();
        }
        // test_a goes as soon as build_a ends, while build_b still runs.
        run.finish(idx(&p, "build_a"), JobStatus::Success).unwrap();
        assert_eq!(names(&p, &run.ready()), ["test_a"]);
        assert_eq!(
            names(&p, &run.artifact_sources(idx(&p, "test_a"))),
            ["build_a"]
        );
        // deploy (no needs) waits for all of build and test.
        run.finish(idx(&p, "build_b"), JobStatus::Success).unwrap();
        run.finish(idx(&p, "lint"), JobStatus::Success).unwrap();
        assert_eq!(names(&p, &run.ready()), ["test_a", "test_b"]);
        assert!(
            run.artifact_sources(idx(&p, "test_b")).is_empty(),
            "artifacts: false"
        );
        for i in run.ready() {
            run.start(i).unwrap();
            run.finish(i, JobStatus::Success).unwrap();
        }
        assert_eq!(names(&p, &run.ready()), ["deploy"]);
        assert_eq!(
            names(&p, &run.artifact_sources(idx(&p, "deploy"))),
            ["build_a", "build_b", "test_a", "test_b", "lint"]
        );
    }

    #[test]
    fn dag_job_is_skipped_when_a_need_was_skipped() {
        let p = pipeline(
            "
a: {stage: build, script: a}
b: {stage: test, script: b, needs: [a]}
c: {stage: deploy, script: c, needs: [b]}
d: {stage: deploy, script: d, needs: [b], when: always}
",
        );
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive(&p, &mut run, |_| JobStatus::Failed);
        let st = |n| run.job_status(idx(&p, n)).unwrap();
        assert_eq!(st("b"), JobStatus::Skipped);
        assert_eq!(st("c"), JobStatus::Skipped);
        assert_eq!(
            st("d"),
            JobStatus::Failed,
            "always runs after a skipped need"
        );
    }

    #[test]
    fn only_job_runs_alone() {
        let p = pipeline(STAGED);
        let mut run = PipelineRun::new(&p, Some("notify")).unwrap();
        assert_eq!(names(&p, &run.ready()), ["notify"]);
        let i = idx(&p, "notify");
        run.start(i).unwrap();
        assert!(run.artifact_sources(i).is_empty());
        run.finish(i, JobStatus::Success).unwrap();
        assert!(run.is_done());
        assert_eq!(run.status(), PipelineStatus::Success);
        assert!(!run.is_selected(idx(&p, "build")));
        assert_eq!(
            PipelineRun::new(&p, Some("nope")).unwrap_err().to_string(),
            "no job named \"nope\" in the pipeline"
        );
    }

    #[test]
    fn misuse_is_an_error() {
        let p = pipeline(STAGED);
        let mut run = PipelineRun::new(&p, None).unwrap();
        let deploy = idx(&p, "deploy");
        assert_eq!(
            run.start(deploy).unwrap_err().to_string(),
            "job \"deploy\" cannot start: it is pending and waits for earlier jobs"
        );
        assert!(matches!(
            run.finish(0, JobStatus::Success),
            Err(RunError::NotRunning { .. })
        ));
        run.start(0).unwrap();
        assert!(matches!(run.start(0), Err(RunError::NotReady { .. })));
        assert!(matches!(
            run.finish(0, JobStatus::Pending),
            Err(RunError::NotAnOutcome(_))
        ));
        assert!(matches!(run.start(99), Err(RunError::NoSuchIndex(99))));
        assert_eq!(run.status(), PipelineStatus::Running);
    }

    #[test]
    fn cancel_stops_pending_jobs() {
        let p = pipeline(STAGED);
        let mut run = PipelineRun::new(&p, None).unwrap();
        run.start(0).unwrap();
        assert_eq!(run.cancel(), vec![0]);
        assert!(!run.is_done());
        run.finish(0, JobStatus::Canceled).unwrap();
        assert!(run.is_done());
        assert!(run.ready().is_empty());
        assert_eq!(run.status(), PipelineStatus::Canceled);
    }

    /// Runs every ready job to `outcome(name)` until nothing is ready.
    fn drive_codes(
        p: &Pipeline,
        run: &mut PipelineRun,
        outcome: impl Fn(&str) -> (JobStatus, Option<i32>),
    ) {
        loop {
            let ready = run.ready();
            if ready.is_empty() {
                break;
            }
            for i in ready {
                run.start(i).unwrap();
                let (s, code) = outcome(&p.jobs[i].name);
                run.finish_with_exit_code(i, s, code).unwrap();
            }
        }
    }

    fn statuses(p: &Pipeline, run: &PipelineRun) -> Vec<String> {
        (0..p.jobs.len())
            .map(|i| format!("{}={}", p.jobs[i].name, run.job_status(i).unwrap()))
            .collect()
    }

    #[test]
    fn manual_jobs_wait_and_block_only_when_they_may_not_fail() {
        let text = "stages: [a, b]\n\
                    optional: {stage: a, script: x, when: manual}\n\
                    gate: {stage: a, script: x, when: manual, allow_failure: false}\n\
                    after: {stage: b, script: x}\n\
                    free: {stage: b, script: x, needs: []}\n";
        let p = pipeline(text);
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive_codes(&p, &mut run, |_| (JobStatus::Success, None));
        assert_eq!(
            statuses(&p, &run),
            [
                "optional=manual",
                "gate=manual",
                "after=skipped",
                "free=success"
            ]
        );
        assert_eq!(run.status(), PipelineStatus::Blocked);
        // Played, the gate runs and the next stage follows.
        let sel = Selection {
            manual: vec!["gate".into()],
            ..Selection::default()
        };
        let mut run = PipelineRun::with_selection(&p, &sel).unwrap();
        drive_codes(&p, &mut run, |_| (JobStatus::Success, None));
        assert_eq!(
            statuses(&p, &run),
            [
                "optional=manual",
                "gate=success",
                "after=success",
                "free=success"
            ]
        );
        assert_eq!(run.status(), PipelineStatus::Success);
    }

    #[test]
    fn exit_codes_allow_failures_and_dependencies_pick_artifacts() {
        let text = "stages: [a, b]\n\
                    flaky: {stage: a, script: x, allow_failure: {exit_codes: [3]}}\n\
                    other: {stage: a, script: x}\n\
                    use: {stage: b, script: x, dependencies: [other]}\n";
        let p = pipeline(text);
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive_codes(&p, &mut run, |n| match n {
            "flaky" => (JobStatus::Failed, Some(3)),
            _ => (JobStatus::Success, Some(0)),
        });
        assert_eq!(run.status(), PipelineStatus::SuccessWithWarnings);
        assert_eq!(run.artifact_sources(idx(&p, "use")), [idx(&p, "other")]);
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive_codes(&p, &mut run, |n| match n {
            "flaky" => (JobStatus::Failed, Some(4)),
            _ => (JobStatus::Success, Some(0)),
        });
        assert_eq!(run.status(), PipelineStatus::Failed);
        // A rule's allow_failure replaces the job's exit codes.
        let text = "flaky:\n  script: x\n  allow_failure: {exit_codes: [3]}\n  rules:\n    - allow_failure: false\n";
        let p = pipeline(text);
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive_codes(&p, &mut run, |_| (JobStatus::Failed, Some(3)));
        assert_eq!(run.status(), PipelineStatus::Failed);
        // `needs: artifacts: false` wins over `dependencies:` naming the same job.
        let text = "stages: [a, b]\n\
                    one: {stage: a, script: x}\n\
                    two: {stage: a, script: x}\n\
                    use: {stage: b, script: x, needs: [{job: one, artifacts: false}, two], dependencies: [one, two]}\n";
        let p = pipeline(text);
        let mut run = PipelineRun::new(&p, None).unwrap();
        drive_codes(&p, &mut run, |_| (JobStatus::Success, Some(0)));
        assert_eq!(run.artifact_sources(idx(&p, "use")), [idx(&p, "two")]);
    }

    #[test]
    fn a_job_with_its_needs() {
        let text = "stages: [a, b, c]\n\
                    one: {stage: a, script: x}\n\
                    two: {stage: a, script: x}\n\
                    three: {stage: b, script: x, needs: [one]}\n\
                    four: {stage: c, script: x, needs: [three]}\n";
        let p = pipeline(text);
        let sel = Selection {
            jobs: vec!["four".into()],
            needs: true,
            ..Selection::default()
        };
        let mut run = PipelineRun::with_selection(&p, &sel).unwrap();
        let mut order = Vec::new();
        loop {
            let ready = run.ready();
            if ready.is_empty() {
                break;
            }
            for i in ready {
                order.push(p.jobs[i].name.clone());
                run.start(i).unwrap();
                run.finish(i, JobStatus::Success).unwrap();
            }
        }
        assert_eq!(order, ["one", "three", "four"]);
        assert!(!run.is_selected(idx(&p, "two")));
        let err = PipelineRun::with_selection(
            &p,
            &Selection {
                jobs: vec!["nope".into()],
                ..Selection::default()
            },
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "no job named \"nope\" in the pipeline");
    }
}
