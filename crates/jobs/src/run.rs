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
//! Simplifications: no `manual`/`delayed` jobs, no retries, no `dependencies:` keyword, and a
//! canceled job is never restarted.

use std::fmt;

use crate::model::When;
use crate::pipeline::Pipeline;

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
    /// Jobs whose end this one waits for and whose statuses decide whether it runs.
    preds: Vec<usize>,
    /// Scheduled by `needs` (GitLab's DAG scheduling), which changes what "skipped" means.
    dag: bool,
    /// Jobs whose artifacts this one receives, if they ran.
    artifact_from: Vec<usize>,
    /// False for jobs left out by `only_job`.
    selected: bool,
    status: JobStatus,
}

/// Combined status of the jobs a job waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prior {
    Success,
    Skipped,
    Failed,
    Canceled,
}

/// The state of one pipeline run. Job indices are those of [`Pipeline::jobs`].
#[derive(Debug, Clone)]
pub struct PipelineRun {
    jobs: Vec<RunJob>,
}

impl PipelineRun {
    /// Starts a run of `pipeline`. With `only_job` (`--job NAME`) only that job runs: it starts at
    /// once whatever its `when`, the jobs it needs are *not* run (and hand it no artifacts), and
    /// every other job stays `Skipped`. Running a job with its prerequisites is a different
    /// feature; this one is for re-running one job quickly.
    pub fn new(pipeline: &Pipeline, only_job: Option<&str>) -> Result<Self, RunError> {
        let only = match only_job {
            Some(name) => Some(
                pipeline
                    .job_index(name)
                    .ok_or_else(|| RunError::UnknownJob(name.to_string()))?,
            ),
            None => None,
        };
        let index = |name: &str| pipeline.job_index(name);
        let jobs = pipeline
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let earlier: Vec<usize> = pipeline
                    .jobs
                    .iter()
                    .enumerate()
                    .filter(|(_, j)| j.stage_index < job.stage_index)
                    .map(|(k, _)| k)
                    .collect();
                let (preds, artifact_from, dag) = match &job.needs {
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
                    None => (earlier.clone(), earlier, false),
                };
                let selected = only.is_none_or(|o| o == i);
                let mut rj = RunJob {
                    name: job.name.clone(),
                    when: job.when,
                    allow_failure: job.allow_failure,
                    preds,
                    dag,
                    artifact_from,
                    selected,
                    status: if selected {
                        JobStatus::Pending
                    } else {
                        JobStatus::Skipped
                    },
                };
                if only.is_some() {
                    rj.preds.clear();
                    rj.when = When::Always;
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
        j.selected && j.status == JobStatus::Pending && self.preds_finished(i)
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
        let j = self.get(i)?;
        if j.status != JobStatus::Running {
            return Err(RunError::NotRunning {
                job: j.name.clone(),
                status: j.status,
            });
        }
        let status = match status {
            JobStatus::Success | JobStatus::Canceled => status,
            JobStatus::Failed | JobStatus::FailedAllowed if j.allow_failure => {
                JobStatus::FailedAllowed
            }
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
            if j.selected && j.status == JobStatus::Pending {
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
        let statuses: Vec<JobStatus> = self
            .jobs
            .iter()
            .filter(|j| j.selected)
            .map(|j| j.status)
            .collect();
        let any = |s: JobStatus| statuses.contains(&s);
        if statuses.iter().all(|&s| s == JobStatus::Skipped) {
            PipelineStatus::Skipped
        } else if any(JobStatus::Failed) {
            PipelineStatus::Failed
        } else if any(JobStatus::Canceled) {
            PipelineStatus::Canceled
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
                if !self.jobs[i].selected
                    || self.jobs[i].status != JobStatus::Pending
                    || !self.preds_finished(i)
                {
                    continue;
                }
                let prior = self.prior(i);
                if !runs(self.jobs[i].when, prior, self.jobs[i].dag) {
                    self.jobs[i].status = JobStatus::Skipped;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    fn prior(&self, i: usize) -> Prior {
        let j = &self.jobs[i];
        let statuses: Vec<JobStatus> = j
            .preds
            .iter()
            .filter(|&&p| self.jobs[p].selected)
            .map(|&p| self.jobs[p].status)
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
        When::Always => prior != Prior::Canceled,
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
}
