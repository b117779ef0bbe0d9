//! Running a job's steps on any [`Host`]: the script step, `after_script`, artifacts in and
//! out, timeout and cancel (SIGTERM, grace, SIGKILL to the step's process group), cleanup.

use std::time::Duration;

use slipway_connector::Output;
use slipway_job::model::{JobResponse, StepName};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::artifact_paths;
use crate::cache;
use crate::data::{self, HostData, StageEnd};
use crate::host::Host;
use crate::script::{self, JobDirs};
use crate::sources::{HostSources, NO_GIT, UNREACHABLE};
use crate::tarball::Tarball;
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

pub use slipway_job::model::DEFAULT_JOB_TIMEOUT;
/// `after_script` has its own timeout, as in GitLab.
pub const AFTER_SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);
/// Bounded time for unpacking sources and artifacts and collecting artifacts: a repository
/// or an archive of gigabytes takes minutes. Unpacking is also bounded by the job's timeout,
/// and a cancel stops either.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Bounded time for removing a job's files; short, since it also runs on cancel.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// What a job gets besides its payload: the one slot context every executor takes.
#[derive(Debug)]
pub struct JobSlot<'a> {
    /// The job's slot.
    pub slot: u32,
    /// The slot's cgroup path, for executors that place containers under it.
    pub cgroup: Option<String>,
    /// Output sink (masks secrets).
    pub trace: &'a mut Trace,
    /// Cancelled to stop the job.
    pub cancel: CancellationToken,
    /// Set: a cancel is graceful (GitLab's `canceling`): `after_script` still runs unless this
    /// fires too. Unset: a cancel skips `after_script`.
    pub abort: Option<CancellationToken>,
    /// Tarballs of earlier jobs' artifacts to unpack into the project directory.
    pub artifacts_in: Vec<Tarball>,
    /// Where collected artifacts are written on this machine (the system's temporary
    /// directory when `None`): a disk with room for the largest artifacts of concurrent jobs.
    pub scratch_dir: Option<std::path::PathBuf>,
    /// Bytes of collected artifacts (and caches) the job may send to `scratch_dir`, each
    /// `artifacts:` entry on its own (`None`: [`DEFAULT_MAX_COLLECTED`]).
    pub max_collected: Option<u64>,
    /// The job's sources, fetched where its steps run before them (then not in
    /// `artifacts_in`); `None`: whatever `artifacts_in` holds.
    pub sources: Option<std::sync::Arc<dyn HostSources>>,
    /// The job's dependencies, cache and artifacts, moved by the job helper where its steps
    /// run (then not in `artifacts_in`, and its artifacts are not collected here).
    pub data: Option<HostData>,
}

/// How a job's steps are run, whatever the host.
#[derive(Debug, Clone)]
pub struct JobRunner {
    /// Builds root on the host, relative to `$HOME` unless absolute.
    pub builds_dir: String,
    /// Seconds between SIGTERM and SIGKILL when a step is stopped.
    pub kill_grace_secs: u32,
    /// Bash lines run at the start of every step, before the job's variables (an isolation
    /// level entering the slot's cgroup, say).
    pub prologue: String,
    /// Bash run once before the job (creating the slot's cgroup, say); a failure is a system
    /// failure and the job's steps do not run.
    pub prepare: String,
    /// Bash run once after the job, whatever happened (removing the slot's cgroup, killing
    /// what the job left). Lines it prints starting with [`NOTE_PREFIX`] go to the trace and,
    /// when the job failed, into its failure message (an OOM kill, say).
    pub teardown: String,
    /// The runner's cache directory on the host (under `$HOME` unless absolute); `None`: the
    /// job's `cache:` entries are skipped with a warning.
    pub cache_dir: Option<String>,
    /// Leave the job's directory in place after the job (a VM that is deleted or kept as a
    /// snapshot afterwards: removing files first would only cost time, or lose the state a
    /// developer wants to debug).
    pub keep_files: bool,
}

/// Bytes of one collected `artifacts:` entry when the runner sets no limit (4 GiB, the
/// default of `[runners.archives] max_size`).
pub const DEFAULT_MAX_COLLECTED: u64 = 4 << 30;

/// Prefix of the lines a teardown script prints for the job's trace.
pub const NOTE_PREFIX: &str = "slipway-note: ";

impl Default for JobRunner {
    fn default() -> Self {
        JobRunner {
            builds_dir: "builds".into(),
            kill_grace_secs: 3,
            prologue: String::new(),
            prepare: String::new(),
            teardown: String::new(),
            cache_dir: None,
            keep_files: false,
        }
    }
}

/// A finished job.
#[derive(Debug)]
pub struct RunResult {
    /// Success or why not.
    pub outcome: JobOutcome,
    /// The job's artifacts: one tarball per `artifacts:` entry whose `when` matched.
    pub artifacts: Vec<CollectedArtifacts>,
}

/// The files of one `artifacts:` entry, as collected where the job ran.
#[derive(Debug)]
pub struct CollectedArtifacts {
    /// Index of the entry in the job's `artifacts`.
    pub spec: usize,
    /// Tar stream of the matching paths, relative to the project directory, in a file on this
    /// machine (streamed there, so memory does not grow with its size). With `untracked` it
    /// holds the whole project directory: the caller filters it.
    pub tar: Tarball,
    /// The entry's `paths`, relative to the project directory (those outside it dropped).
    pub paths: Vec<String>,
    /// Its `exclude` patterns, relative to the project directory, for the caller to apply to
    /// each entry of `tar` on its own (not to what is under it), as GitLab Runner does.
    pub exclude: Vec<String>,
}

enum StepEnd {
    Exited(JobOutcome),
    TimedOut,
    Canceled,
}

impl JobRunner {
    /// Run a job: prepare the directory, the script step, `after_script`, artifacts, cleanup.
    /// `host` is where its scripts run; the slot's cgroup is the host's business (a cgroup
    /// level's scripts enter it themselves).
    pub async fn run(&self, job: &JobResponse, host: &dyn Host, slot: JobSlot<'_>) -> RunResult {
        let JobSlot {
            slot,
            cgroup,
            trace,
            cancel,
            abort,
            artifacts_in,
            scratch_dir,
            max_collected,
            sources,
            data,
        } = slot;
        if !self.prepare.is_empty()
            && let Err(msg) = housekeeping(
                host,
                "prepare_script",
                &self.prepare,
                None,
                TRANSFER_TIMEOUT,
            )
            .await
        {
            trace.message(&format!(
                "ERROR: preparing the job's isolation failed: {msg}"
            ));
            let mut outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg);
            self.tear_down(host, trace, &mut outcome).await;
            return RunResult {
                outcome,
                artifacts: Vec::new(),
            };
        }
        let inner = JobSlot {
            slot,
            cgroup,
            trace: &mut *trace,
            cancel,
            abort,
            artifacts_in,
            scratch_dir,
            max_collected,
            sources,
            data,
        };
        let mut result = self.run_steps(job, host, inner).await;
        self.tear_down(host, trace, &mut result.outcome).await;
        result
    }

    /// Run the teardown script; its notes go to the trace and into a failure's message.
    async fn tear_down(&self, host: &dyn Host, trace: &mut Trace, outcome: &mut JobOutcome) {
        if self.teardown.is_empty() {
            return;
        }
        match housekeeping(
            host,
            "cleanup_file_variables",
            &self.teardown,
            None,
            CLEANUP_TIMEOUT,
        )
        .await
        {
            Ok(out) => {
                let out = String::from_utf8_lossy(&out);
                for note in out.lines().filter_map(|l| l.strip_prefix(NOTE_PREFIX)) {
                    trace.message(note);
                    if let JobOutcome::Failed { message, .. } = outcome {
                        message.push_str(&format!(" ({note})"));
                    }
                }
            }
            Err(msg) => trace.message(&format!(
                "WARNING: cleaning up the job's isolation failed: {msg}"
            )),
        }
    }

    async fn run_steps(&self, job: &JobResponse, host: &dyn Host, slot: JobSlot<'_>) -> RunResult {
        let JobSlot {
            slot,
            cgroup: _,
            trace,
            cancel,
            abort,
            artifacts_in,
            scratch_dir,
            max_collected,
            sources,
            data,
        } = slot;
        let clone_path = match script::clone_path_of(job) {
            Ok(p) => p,
            Err(msg) => {
                trace.message(&format!("ERROR: {msg}"));
                return RunResult {
                    outcome: JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg),
                    artifacts: Vec::new(),
                };
            }
        };
        // A working copy kept between jobs has its own place under the slot (GitLab Runner's
        // `<namespace>/<project>`), unless the job names one.
        let kept = sources.as_ref().and_then(|s| s.kept_path());
        let keep_project = kept.is_some();
        let clone_path = clone_path.or(kept);
        let dirs = JobDirs {
            builds_dir: self.builds_dir.clone(),
            slot,
            job_id: job.id,
            clone_path,
        };
        let timeout = job.timeout();
        let deadline = Instant::now() + timeout;

        for key in script::unexportable_variables(job) {
            trace.message(&format!(
                "WARNING: variable {key:?} is not a valid shell name; it is not passed to the job"
            ));
        }

        // Without artifacts to unpack, the script step creates its own directory: one SSH
        // round trip less between a job being queued and its first output line.
        let mut inputs: std::collections::VecDeque<Tarball> =
            artifacts_in.into_iter().filter(|a| !a.is_empty()).collect();
        if let Some(outcome) = self
            .hook(host, &dirs, job, PRE_GET_SOURCES, deadline, &cancel, trace)
            .await
        {
            self.cleanup(host, &dirs, keep_project, trace).await;
            return RunResult {
                outcome,
                artifacts: Vec::new(),
            };
        }
        // Sources fetched on the host make the project directory; from the manager (no git
        // there) they are the first archive.
        let mut on_host = false;
        if let Some(sources) = &sources {
            match self
                .fetch_on_host(sources.as_ref(), host, &dirs, deadline, &cancel, trace)
                .await
            {
                Ok(None) => on_host = true,
                Ok(Some(tar)) => inputs.push_front(tar),
                Err(outcome) => {
                    self.cleanup(host, &dirs, keep_project, trace).await;
                    return RunResult {
                        outcome,
                        artifacts: Vec::new(),
                    };
                }
            }
        }
        let restore = self.cache_script(job, &dirs, trace, None);
        let data_in = data
            .as_ref()
            .is_some_and(|d| !d.restore.is_empty() || !d.downloads.is_empty());
        let separate_prepare = on_host || !inputs.is_empty() || restore.is_some() || data_in;
        if separate_prepare {
            // GitLab's order: sources, then the cache, then the dependencies' artifacts, which
            // win over a stale cache of the same paths.
            // The manager ships a job's sources first, then dependencies' artifacts.
            let first = if on_host {
                None
            } else if restore.is_none() || job.ships_sources() {
                inputs.pop_front()
            } else {
                None
            };
            let mut runs = Vec::new();
            if !on_host {
                runs.push((
                    "get_sources",
                    script::prepare_script(&dirs, first.is_some()),
                    first.unwrap_or_default(),
                    false,
                ));
            }
            if let Some(body) = restore {
                runs.push(("restore_cache", body, Tarball::default(), true));
            }
            // One archive per run: busybox tar (in job images) cannot read concatenated ones.
            runs.extend(inputs.into_iter().map(|tar| {
                (
                    "download_artifacts",
                    script::unpack_script(&dirs),
                    tar,
                    false,
                )
            }));
            for (stage, body, tar, is_cache) in runs {
                // Within the job's timeout, and stopped by a cancel like the steps are.
                let limit =
                    TRANSFER_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
                let run = transfer(host, stage, &body, Some(tar), None, limit, Some(&cancel));
                match run.await.map(|(out, _)| out) {
                    Ok(out) if is_cache => trace.write(&out),
                    Ok(_) => {}
                    // A missing or broken cache never fails the job (GitLab's rule); only a host
                    // that cannot run the script at all is reported.
                    Err(msg) if is_cache => {
                        trace.message(&format!("WARNING: restoring the cache failed: {msg}"))
                    }
                    Err(msg) => {
                        trace.message(&format!(
                            "ERROR: preparing the build directory failed: {msg}"
                        ));
                        let outcome = failed_quietly(msg, &cancel, deadline);
                        self.cleanup(host, &dirs, keep_project, trace).await;
                        return RunResult {
                            outcome,
                            artifacts: Vec::new(),
                        };
                    }
                }
            }
        }

        // The helper restores the distributed cache, then the dependencies' artifacts, where
        // the job runs (GitLab's order).
        if let Some(d) = data.as_ref().filter(|_| data_in)
            && let Some(outcome) = self.data_in(host, &dirs, d, deadline, &cancel, trace).await
        {
            self.cleanup(host, &dirs, keep_project, trace).await;
            return RunResult {
                outcome,
                artifacts: Vec::new(),
            };
        }

        if let Some(outcome) = self
            .hook(host, &dirs, job, POST_GET_SOURCES, deadline, &cancel, trace)
            .await
        {
            self.cleanup(host, &dirs, keep_project, trace).await;
            return RunResult {
                outcome,
                artifacts: Vec::new(),
            };
        }

        let lines = |name: StepName| -> Vec<String> {
            job.steps
                .iter()
                .filter(|s| s.name == name)
                .flat_map(|s| s.script.iter().cloned())
                .collect()
        };

        let script_lines = lines(StepName::Script);
        let mut outcome = match self
            .step(
                host,
                &dirs,
                job,
                StepName::Script,
                &script_lines,
                !separate_prepare,
                deadline,
                &cancel,
                trace,
            )
            .await
        {
            StepEnd::Exited(o) => o,
            StepEnd::TimedOut => {
                let msg = format!("job execution timeout: exceeded {}", fmt_secs(timeout));
                trace.message(&format!("ERROR: {msg}"));
                JobOutcome::failed(FailureReason::JobExecutionTimeout, None, msg)
            }
            StepEnd::Canceled => {
                trace.message("ERROR: job canceled");
                JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled")
            }
        };

        // after_script runs whatever happened, with its own timeout (GitLab does the same).
        let after = lines(StepName::AfterScript);
        // A graceful cancel (GitLab's `canceling`) still runs after_script, stopped only by an
        // abort; any other cancel must stop promptly (the manager may be shutting down).
        // With an abort token a later graceful cancel must not stop after_script either.
        let after_cancel = match (&abort, cancel.is_cancelled()) {
            (Some(abort), _) if !abort.is_cancelled() => Some(abort.clone()),
            (None, false) => Some(cancel.clone()),
            _ => None,
        };
        if !after.is_empty() && after_cancel.is_none() {
            trace.message("Skipping after_script: the job was canceled");
        } else if let Some(after_cancel) = after_cancel.filter(|_| !after.is_empty()) {
            trace.message("Running after_script");
            let after_deadline = Instant::now() + AFTER_SCRIPT_TIMEOUT;
            // after_script learns how the job went, as GitLab Runner tells it.
            let status = match &outcome {
                JobOutcome::Success => "success",
                JobOutcome::Failed {
                    reason: FailureReason::JobCanceled,
                    ..
                } => "canceled",
                JobOutcome::Failed { .. } => "failed",
            };
            let mut with_status = job.clone();
            with_status
                .variables
                .push(slipway_job::Variable::new("CI_JOB_STATUS", status));
            match self
                .step(
                    host,
                    &dirs,
                    &with_status,
                    StepName::AfterScript,
                    &after,
                    false,
                    after_deadline,
                    &after_cancel,
                    trace,
                )
                .await
            {
                StepEnd::Exited(JobOutcome::Failed { message, .. }) => {
                    trace.message(&format!("WARNING: after_script failed: {message}"));
                }
                StepEnd::TimedOut => trace.message("WARNING: after_script timed out"),
                StepEnd::Exited(JobOutcome::Success) | StepEnd::Canceled => {}
            }
        }

        if !cancel.is_cancelled()
            && let Some(body) = self.cache_script(job, &dirs, trace, Some(outcome.is_success()))
        {
            let run = transfer(
                host,
                "archive_cache",
                &body,
                None,
                None,
                TRANSFER_TIMEOUT,
                Some(&cancel),
            );
            match run.await.map(|(out, _)| out) {
                Ok(out) => trace.write(&out),
                Err(msg) => trace.message(&format!("WARNING: saving the cache failed: {msg}")),
            }
        }

        if let Some(d) = data.as_ref().filter(|_| !cancel.is_cancelled()) {
            let tracked = match &sources {
                Some(s) => s.tracked(),
                None => std::sync::Arc::clone(&d.tracked),
            };
            self.data_out(host, &dirs, d, &tracked, &cancel, &mut outcome, trace)
                .await;
        }

        let mut artifacts = Vec::new();
        // With the helper, the job's artifacts went up from where it ran.
        let collect_here = !data.as_ref().is_some_and(|d| d.artifacts);
        for (spec, a) in job.artifacts.iter().enumerate() {
            if !a.when.holds_after(outcome.is_success()) || cancel.is_cancelled() || !collect_here {
                continue;
            }
            let mut paths =
                artifact_paths::relative_in_project(&a.paths, "artifact path", &dirs, trace);
            let exclude = artifact_paths::relative_in_project(
                &a.exclude,
                "artifacts:exclude pattern",
                &dirs,
                trace,
            );
            let included = paths.clone();
            if a.untracked {
                // Untracked files are told apart by the caller, who knows the tracked ones.
                paths = vec![".".to_string()];
            }
            if paths.is_empty() {
                continue;
            }
            if a.is_cache() {
                trace.message(&format!("Creating cache {}...", a.name));
            } else {
                trace.message("Collecting artifacts");
            }
            let stage = if outcome.is_success() {
                "upload_artifacts_on_success"
            } else {
                "upload_artifacts_on_failure"
            };
            let scratch = scratch_dir.as_deref();
            let collected =
                match crate::tarball::scratch_file(scratch, &format!("job-{}-", job.id), ".tar") {
                    Ok(t) => t,
                    Err(e) => {
                        let msg = format!("creating a file for the collected artifacts: {e}");
                        trace.message(&format!("ERROR: {msg}"));
                        if outcome.is_success() {
                            outcome =
                                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg);
                        }
                        continue;
                    }
                };
            match transfer(
                host,
                stage,
                &script::collect_script(&dirs, &paths),
                None,
                Some((&collected, max_collected.unwrap_or(DEFAULT_MAX_COLLECTED))),
                TRANSFER_TIMEOUT,
                Some(&cancel),
            )
            .await
            {
                Ok((_, err)) => {
                    let tar = Tarball::File(collected);
                    // The collect script's warnings (a path leaving through a symlink).
                    let err = String::from_utf8_lossy(&err);
                    for w in err.lines().filter(|l| l.starts_with("WARNING: ")) {
                        trace.message(w);
                    }
                    artifacts.push(CollectedArtifacts {
                        spec,
                        tar,
                        paths: included,
                        exclude,
                    })
                }
                // A cache never fails a job (GitLab's rule).
                Err(msg) if a.is_cache() => {
                    trace.message(&format!("WARNING: collecting the cache failed: {msg}"));
                }
                Err(msg) => {
                    trace.message(&format!("ERROR: collecting artifacts failed: {msg}"));
                    if outcome.is_success() {
                        outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg);
                    }
                }
            }
        }

        self.cleanup(host, &dirs, keep_project, trace).await;
        RunResult { outcome, artifacts }
    }

    /// The helper's stages before the job's script: the distributed cache, then the
    /// dependencies' artifacts. The job's end when one fails it.
    async fn data_in(
        &self,
        host: &dyn Host,
        dirs: &JobDirs,
        d: &HostData,
        deadline: Instant,
        cancel: &CancellationToken,
        trace: &mut Trace,
    ) -> Option<JobOutcome> {
        for (stage, steps) in [
            ("restore_cache", &d.restore),
            ("download_artifacts", &d.downloads),
        ] {
            if steps.is_empty() {
                continue;
            }
            let limit = TRANSFER_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
            let body = data::run_script(dirs, &data::helper_for(host, &d.helper));
            let plan = d.plan(steps.clone(), Vec::new());
            let failed =
                match data::run_stage(host, stage, &body, plan, &d.helper, limit, cancel).await {
                    StageEnd::Done(out) => {
                        trace.write(&out);
                        None
                    }
                    StageEnd::Failed(out) | StageEnd::Refused(out) => {
                        trace.write(&out);
                        Some(data::said_error(&out))
                    }
                    // A cache that cannot be had never fails a job (GitLab's rule).
                    StageEnd::System(msg) if stage == "restore_cache" => {
                        trace.message(&format!("WARNING: restoring the cache failed: {msg}"));
                        None
                    }
                    StageEnd::System(msg) => {
                        trace.message(&format!("ERROR: downloading artifacts failed: {msg}"));
                        Some(msg)
                    }
                };
            if let Some(msg) = failed {
                return Some(failed_quietly(msg, cancel, deadline));
            }
        }
        None
    }

    /// The helper's stages after the job's script: its caches archived and saved, then its
    /// artifacts archived and uploaded, each collected where the job ran. A failed upload
    /// fails a job that had succeeded; a cache never does.
    #[allow(clippy::too_many_arguments)]
    async fn data_out(
        &self,
        host: &dyn Host,
        dirs: &JobDirs,
        d: &HostData,
        tracked: &std::collections::BTreeSet<String>,
        cancel: &CancellationToken,
        outcome: &mut JobOutcome,
        trace: &mut Trace,
    ) {
        let success = outcome.is_success();
        let stage_of_artifacts = if success {
            "upload_artifacts_on_success"
        } else {
            "upload_artifacts_on_failure"
        };
        for (stage, caches) in [("archive_cache", true), (stage_of_artifacts, false)] {
            let mut collected = Vec::new();
            let mut steps = Vec::new();
            for (i, c) in d.collect.iter().enumerate() {
                if c.is_cache() != caches || !c.when.holds_after(success) {
                    continue;
                }
                let tar = format!("c{i}.tar");
                let Some((paths, step)) = data::collected_step(c, dirs, &tar, success, trace)
                else {
                    continue;
                };
                collected.push((tar, script::collect_script(dirs, &paths)));
                steps.push(step);
            }
            if steps.is_empty() {
                continue;
            }
            let body = data::collect_script(dirs, &data::helper_for(host, &d.helper), &collected);
            let plan = d.plan(steps, tracked.iter().cloned().collect());
            let end = data::run_stage(
                host,
                stage,
                &body,
                plan,
                &d.helper,
                TRANSFER_TIMEOUT,
                cancel,
            )
            .await;
            let failed = match end {
                StageEnd::Done(out) => {
                    trace.write(&out);
                    None
                }
                StageEnd::Failed(out) | StageEnd::Refused(out) => {
                    trace.write(&out);
                    Some(data::said_error(&out))
                }
                StageEnd::System(msg) => {
                    let what = if caches {
                        "saving the cache"
                    } else {
                        "uploading artifacts"
                    };
                    let level = if caches { "WARNING" } else { "ERROR" };
                    trace.message(&format!("{level}: {what} failed: {msg}"));
                    Some(msg)
                }
            };
            if let Some(msg) = failed.filter(|_| !caches && outcome.is_success()) {
                *outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg);
            }
        }
    }

    /// The cache restore (`after` = `None`) or save (`Some(success)`) script of `job`, if it
    /// has one; skipped entries are reported in the trace.
    fn cache_script(
        &self,
        job: &JobResponse,
        dirs: &JobDirs,
        trace: &mut Trace,
        after: Option<bool>,
    ) -> Option<String> {
        if job.cache.is_empty() {
            return None;
        }
        let Some(dir) = &self.cache_dir else {
            if after.is_none() {
                trace.message("WARNING: this runner has no cache directory; cache: is skipped");
            }
            return None;
        };
        let (body, skipped) = match after {
            None => cache::restore_script(dir, job, dirs)?,
            Some(success) => cache::archive_script(dir, job, dirs, success)?,
        };
        for s in skipped {
            trace.message(&format!(
                "WARNING: cache key {:?} skipped: {}",
                s.key, s.reason
            ));
        }
        Some(body)
    }

    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        host: &dyn Host,
        dirs: &JobDirs,
        job: &JobResponse,
        step: StepName,
        lines: &[String],
        create_dir: bool,
        deadline: Instant,
        cancel: &CancellationToken,
        trace: &mut Trace,
    ) -> StepEnd {
        let mut body =
            script::step_script_with(job, dirs, step.as_str(), lines, create_dir, &self.prologue);
        let (tx, mut rx) = mpsc::channel(256);
        let stage = match step {
            StepName::Script => "step_script",
            _ => step.as_str(),
        };
        // The job's script announces that its shell runs before anything else: until those
        // bytes arrive (or the shell exits), nothing of it has run, and a job whose instance
        // failed meanwhile may run again elsewhere (see `Trace::script_started`).
        let mut start = ScriptStart::new(stage == "step_script");
        if start.expected {
            body.insert_str(0, SCRIPT_STARTED_COMMAND);
        }
        let run = host.run_stage(stage, body, tx);
        tokio::pin!(run);
        let end = loop {
            tokio::select! {
                Some(chunk) = rx.recv() => start.write(trace, chunk),
                res = &mut run => break Some(res),
                _ = tokio::time::sleep_until(deadline) => break None,
                _ = cancel.cancelled() => break None,
            }
        };
        let result = match end {
            Some(res) => res,
            None => {
                // Stop the whole process group, then let the run finish and drain its output.
                let kill = script::kill_script(dirs, step.as_str(), self.kill_grace_secs);
                let bound = Duration::from_secs(u64::from(self.kill_grace_secs) + 5);
                let stopped = tokio::time::timeout(bound, host.stop_stage(stage, &kill)).await;
                let failed = match stopped {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some(format!("timed out after {}", fmt_secs(bound))),
                };
                if let Some(msg) = failed {
                    trace.message(&format!("WARNING: stopping the step failed: {msg}"));
                }
                let drained = tokio::time::timeout(Duration::from_secs(5), async {
                    loop {
                        tokio::select! {
                            Some(chunk) = rx.recv() => start.write(trace, chunk),
                            _ = &mut run => break,
                        }
                    }
                })
                .await;
                if drained.is_err() {
                    tracing::warn!(job = job.id, "step did not end after kill");
                }
                return if cancel.is_cancelled() {
                    StepEnd::Canceled
                } else {
                    StepEnd::TimedOut
                };
            }
        };
        while let Ok(chunk) = rx.try_recv() {
            start.write(trace, chunk);
        }
        if result.is_ok() && start.expected {
            // The shell ran to its end (its first bytes perhaps lost on the way).
            trace.mark_script_started();
        }
        StepEnd::Exited(match result {
            Ok(status) if status.success() => JobOutcome::Success,
            Ok(status) => {
                let code = status.code.and_then(|c| i32::try_from(c).ok());
                let msg = format!("script failed: {status}");
                trace.message(&format!("ERROR: Job failed: {status}"));
                JobOutcome::failed(FailureReason::ScriptFailure, code, msg)
            }
            Err(e) => {
                trace.message(&format!("ERROR: Job failed (system failure): {e}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string())
            }
        })
    }

    /// Run the lines of the job's hook `name` where it runs, in its project directory (made
    /// if missing, kept if there), output to the trace; the job's end when the hook fails.
    #[allow(clippy::too_many_arguments)]
    async fn hook(
        &self,
        host: &dyn Host,
        dirs: &JobDirs,
        job: &JobResponse,
        name: &str,
        deadline: Instant,
        cancel: &CancellationToken,
        trace: &mut Trace,
    ) -> Option<JobOutcome> {
        let lines = job.hook_lines(name);
        if lines.is_empty() {
            return None;
        }
        trace.message(&format!("Running {name}"));
        // The step's pid file sits in the slot's directory, and the hook runs in the project
        // directory: both made first, a working copy in it kept.
        let limit = TRANSFER_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
        let mkdir = format!("mkdir -p {}", dirs.project_dir());
        if let Err(msg) = housekeeping(host, name, &mkdir, None, limit).await {
            trace.message(&format!("ERROR: preparing {name}: {msg}"));
            return Some(failed_quietly(msg, cancel, deadline));
        }
        let step = StepName::Other(name.to_string());
        let end = self
            .step(
                host, dirs, job, step, &lines, false, deadline, cancel, trace,
            )
            .await;
        match end {
            StepEnd::Exited(JobOutcome::Success) => None,
            StepEnd::Exited(JobOutcome::Failed {
                reason,
                exit_code,
                message,
            }) => Some(JobOutcome::failed(
                reason,
                exit_code,
                format!("{name}: {message}"),
            )),
            StepEnd::TimedOut => {
                let msg = format!("job execution timeout: exceeded during {name}");
                trace.message(&format!("ERROR: {msg}"));
                Some(JobOutcome::failed(
                    FailureReason::JobExecutionTimeout,
                    None,
                    msg,
                ))
            }
            StepEnd::Canceled => {
                trace.message("ERROR: job canceled");
                Some(JobOutcome::failed(
                    FailureReason::JobCanceled,
                    None,
                    "job canceled",
                ))
            }
        }
    }

    /// Remove the job's files; with `keep_project`, its project directory stays (a working
    /// copy the slot's next job fetches into).
    async fn cleanup(
        &self,
        host: &dyn Host,
        dirs: &JobDirs,
        keep_project: bool,
        trace: &mut Trace,
    ) {
        if self.keep_files {
            return;
        }
        let body = if keep_project {
            script::file_variables_cleanup_script(dirs)
        } else {
            script::cleanup_script(dirs)
        };
        if let Err(msg) =
            housekeeping(host, "cleanup_file_variables", &body, None, CLEANUP_TIMEOUT).await
        {
            trace.message(&format!("WARNING: cleanup failed: {msg}"));
        }
    }
}

impl JobRunner {
    /// The `get_sources` stage on the host, tried `attempts` times. `Ok(None)`: the sources
    /// are in the project directory; `Ok(Some(tar))`: the host has no git and the manager
    /// fetched them (`tar` unpacks into a fresh directory).
    async fn fetch_on_host(
        &self,
        sources: &dyn HostSources,
        host: &dyn Host,
        dirs: &JobDirs,
        deadline: Instant,
        cancel: &CancellationToken,
        trace: &mut Trace,
    ) -> Result<Option<Tarball>, JobOutcome> {
        let body = sources.script(dirs);
        let attempts = sources.attempts().max(1);
        let failed = |msg: String, trace: &mut Trace| {
            trace.message(&format!("ERROR: {msg}"));
            failed_quietly(msg, cancel, deadline)
        };
        let mut last = String::new();
        for attempt in 1..=attempts {
            if attempt > 1 {
                trace.message(&format!(
                    "Retrying to get the sources (attempt {attempt} of {attempts})"
                ));
            }
            let limit = TRANSFER_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
            let run = host.capture_stage("get_sources", &body, sources.stdin());
            let ran = tokio::select! {
                r = tokio::time::timeout(limit, run) => r,
                () = cancel.cancelled() => {
                    return Err(failed("canceled while getting the sources".into(), trace));
                }
            };
            match ran {
                Err(_) => {
                    let msg = format!("getting the sources timed out after {}", fmt_secs(limit));
                    return Err(failed(msg, trace));
                }
                // The host could not run the script at all: not the fetch's failure.
                Ok(Err(msg)) => return Err(failed(format!("getting the sources: {msg}"), trace)),
                Ok(Ok((status, out, err))) => {
                    trace.write(&err);
                    if status.success() {
                        sources.set_tracked(&out);
                        return Ok(None);
                    }
                    let why = match status.code {
                        Some(NO_GIT) => {
                            Some("git (2.31 or later) is not installed where the job runs")
                        }
                        Some(UNREACHABLE) => Some(
                            "WARNING: the repository's server cannot be reached, or its certificate is not trusted, from where the job runs",
                        ),
                        _ => None,
                    };
                    if let Some(why) = why {
                        trace.message(&format!(
                            "{why}: the manager fetches the sources and sends them"
                        ));
                        let left = deadline.saturating_duration_since(Instant::now());
                        let fetched =
                            tokio::time::timeout(left, sources.on_manager(trace, cancel)).await;
                        return match fetched {
                            Ok(Ok(tar)) => Ok(tar),
                            Ok(Err(msg)) => Err(failed_quietly(msg, cancel, deadline)),
                            Err(_) => Err(failed(
                                "getting the sources took longer than the job's timeout".into(),
                                trace,
                            )),
                        };
                    }
                    let stderr = String::from_utf8_lossy(&err);
                    last = stderr
                        .lines()
                        .rev()
                        .map(str::trim)
                        .find(|l| !l.is_empty())
                        .map_or_else(|| format!("git exited with {status}"), str::to_string);
                }
            }
        }
        Err(failed(format!("getting the sources failed: {last}"), trace))
    }
}

/// A failure whose message is already in the trace.
fn failed_quietly(msg: String, cancel: &CancellationToken, deadline: Instant) -> JobOutcome {
    let reason = if cancel.is_cancelled() {
        FailureReason::JobCanceled
    } else if Instant::now() >= deadline {
        FailureReason::JobExecutionTimeout
    } else {
        FailureReason::RunnerSystemFailure
    };
    JobOutcome::failed(reason, None, msg)
}

/// The hook run where the job runs before its sources are fetched (GitLab's
/// `pre_get_sources_script`: the runner's, then the job's `hooks:`).
pub const PRE_GET_SOURCES: &str = "pre_get_sources_script";
/// The hook run after the job's sources (and its cache and dependencies) are in place.
pub const POST_GET_SOURCES: &str = "post_get_sources_script";

/// The first command of a job's script: it writes [`SCRIPT_STARTED`] to stdout.
const SCRIPT_STARTED_COMMAND: &str = "printf '\\033[0K'\n";
/// What [`SCRIPT_STARTED_COMMAND`] writes: "erase to the end of the line", invisible in a
/// terminal and in GitLab's job log should it ever reach one.
const SCRIPT_STARTED: &[u8] = b"\x1b[0K";

/// The job's script announcing its start: any output of the step means its shell runs; the
/// announcement itself is taken off the first stdout that carries it.
struct ScriptStart {
    /// The step announces itself (the job's script step).
    expected: bool,
    /// The announcement was taken off stdout.
    stripped: bool,
}

impl ScriptStart {
    fn new(expected: bool) -> Self {
        ScriptStart {
            expected,
            stripped: !expected,
        }
    }

    /// Write `chunk` to the trace, without the announcement; the first output of the step
    /// marks the script started.
    fn write(&mut self, trace: &mut Trace, chunk: Output) {
        if !self.expected {
            return write_output(trace, chunk);
        }
        if !trace.script_started() {
            trace.mark_script_started();
        }
        let chunk = match chunk {
            Output::Stdout(b) if !self.stripped && b.starts_with(SCRIPT_STARTED) => {
                self.stripped = true;
                Output::Stdout(b[SCRIPT_STARTED.len()..].to_vec())
            }
            other => other,
        };
        write_output(trace, chunk);
    }
}

fn write_output(trace: &mut Trace, chunk: Output) {
    match chunk {
        Output::Stdout(b) | Output::Stderr(b) => trace.write(&b),
    }
}

/// Run a bash script with bounded time, `input` on its stdin; its stdout, or a message for
/// the trace.
async fn housekeeping(
    host: &dyn Host,
    stage: &str,
    body: &str,
    input: Option<Tarball>,
    limit: Duration,
) -> Result<Vec<u8>, String> {
    transfer(host, stage, body, input, None, limit, None)
        .await
        .map(|(out, _)| out)
}

/// [`housekeeping`] with stdout into the file `output` when given, and the script's stderr
/// when it succeeded too; stopped early when `cancel` fires. A stream in a file goes through
/// [`Host::transfer_stage`].
async fn transfer(
    host: &dyn Host,
    stage: &str,
    body: &str,
    input: Option<Tarball>,
    output: Option<(&std::path::Path, u64)>,
    limit: Duration,
    cancel: Option<&CancellationToken>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let (output, most) = match output {
        Some((path, most)) => (Some(path), most),
        None => (None, u64::MAX),
    };
    let run = async {
        match (input.unwrap_or_default(), output) {
            (Tarball::File(path), output) => host
                .transfer_stage(stage, body, Some(&path), output)
                .await
                .map_err(|e| e.to_string()),
            (Tarball::Bytes(stdin), None) => host
                .capture_stage(stage, body, stdin)
                .await
                .map_err(|e| e.to_string()),
            (Tarball::Bytes(stdin), Some(output)) if stdin.is_empty() => host
                .transfer_stage(stage, body, None, Some(output))
                .await
                .map_err(|e| e.to_string()),
            (Tarball::Bytes(_), Some(_)) => {
                Err("bytes in and a file out: no step does that".to_string())
            }
        }
    };
    let canceled = async {
        match cancel {
            Some(c) => c.cancelled().await,
            None => std::future::pending().await,
        }
    };
    // The file is watched as it grows: what a job sends is stopped once past `most`, before
    // it fills this machine's disk (the file goes with its `TempPath`).
    let overflowed = async {
        match output {
            Some(path) if most < u64::MAX => loop {
                tokio::time::sleep(OUTPUT_CHECK_EVERY).await;
                if tokio::fs::metadata(path)
                    .await
                    .is_ok_and(|m| m.len() > most)
                {
                    break;
                }
            },
            _ => std::future::pending().await,
        }
    };
    let bounded = tokio::select! {
        r = tokio::time::timeout(limit, run) => r,
        () = canceled => return Err("canceled".into()),
        () = overflowed => return Err(format!(
            "the collected files pass {most} bytes ([runners.archives] max_size); refused"
        )),
    };
    match bounded {
        Err(_) => Err(format!("timed out after {}", fmt_secs(limit))),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok((status, out, err))) if status.success() => Ok((out, err)),
        Ok(Ok((status, _, err))) => Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&err).trim()
        )),
    }
}

/// How often a file a job streams to this machine is measured against its limit.
const OUTPUT_CHECK_EVERY: Duration = Duration::from_millis(50);

/// A duration for the trace: `1h`, `5m`, `42s`.
pub(crate) fn fmt_secs(d: Duration) -> String {
    humanize(d.as_secs())
}

fn humanize(secs: u64) -> String {
    match secs {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
