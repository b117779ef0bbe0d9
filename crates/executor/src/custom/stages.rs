//! The `run_exec` stages: `prepare_script`, `get_sources`, `step_script`, `after_script` and
//! `cleanup_file_variables`.

use std::time::Duration;

use slipway_job::model::StepName;
use tokio::time::Instant;

use crate::job::AFTER_SCRIPT_TIMEOUT;
use crate::script;
use slipway_job::outcome::JobOutcome;
use slipway_job::trace::Trace;

use super::BUILD_FAILURE_EXIT_CODE;
use super::driver::Limits;
use super::job_files::write_private;
use super::session::Session;
use super::stage_end::{StageEnd, stage_end};

/// Bound for the `cleanup_file_variables` stage (it also runs after a cancel).
const CLEANUP_STAGE_TIMEOUT: Duration = Duration::from_secs(60);

impl Session<'_> {
    /// The `run_exec` stages.
    pub(super) async fn stages(&mut self, trace: &mut Trace) -> JobOutcome {
        let dirs = self.dirs();
        let job = self.job;
        let lines = |name: StepName| -> Vec<String> {
            job.steps
                .iter()
                .filter(|s| s.name == name)
                .flat_map(|s| s.script.iter().cloned())
                .collect()
        };

        let mut end = self
            .stage(
                trace,
                "prepare_script",
                &script::announce_host_script(),
                None,
            )
            .await;
        if matches!(end, StageEnd::Ok) {
            end = self
                .stage(
                    trace,
                    "get_sources",
                    &script::prepare_script(&dirs, false),
                    None,
                )
                .await;
        }
        if matches!(end, StageEnd::Ok) {
            trace.message("Executing \"step_script\" stage of the job script");
            let body =
                script::step_script(job, &dirs, "step_script", &lines(StepName::Script), false);
            trace.mark_script_started();
            end = self.stage(trace, "step_script", &body, None).await;
        }
        let outcome = self.end_outcome(trace, end, "run_exec");

        let after = lines(StepName::AfterScript);
        if !after.is_empty() && self.cancel.is_cancelled() {
            trace.message("Skipping after_script: the job was canceled");
        } else if !after.is_empty() {
            trace.message("Running after_script");
            let body = script::step_script(job, &dirs, "after_script", &after, false);
            // after_script has its own time, also after the job's ran out (as in GitLab).
            let limits = Limits {
                job_deadline: None,
                stage_deadline: Some(Instant::now() + AFTER_SCRIPT_TIMEOUT),
                cancel: Some(self.cancel.clone()),
            };
            match self.stage_with(trace, "after_script", &body, limits).await {
                StageEnd::Ok | StageEnd::Canceled => {}
                StageEnd::StageTimeout(_) | StageEnd::JobTimeout => {
                    trace.message("WARNING: after_script timed out");
                }
                StageEnd::BuildFailure(code) => trace.message(&format!(
                    "WARNING: after_script failed: exit code {}",
                    code.unwrap_or(BUILD_FAILURE_EXIT_CODE)
                )),
                StageEnd::SystemFailure(msg) => {
                    trace.message(&format!("WARNING: after_script failed: {msg}"));
                }
            }
        }

        // Always, also after a cancel: file variables hold secrets.
        let limits = Limits {
            job_deadline: None,
            stage_deadline: Some(Instant::now() + CLEANUP_STAGE_TIMEOUT),
            cancel: None,
        };
        let body = script::file_variables_cleanup_script(&dirs);
        match self
            .stage_with(trace, "cleanup_file_variables", &body, limits)
            .await
        {
            StageEnd::Ok => {}
            other => trace.message(&format!(
                "WARNING: cleanup_file_variables failed: {}",
                other.describe()
            )),
        }
        outcome
    }

    async fn stage(
        &mut self,
        trace: &mut Trace,
        stage: &str,
        body: &str,
        timeout: Option<Duration>,
    ) -> StageEnd {
        let limits = self.limits(timeout);
        self.stage_with(trace, stage, body, limits).await
    }

    /// Write `body` to a script file and call `run_exec <file> <stage>`.
    async fn stage_with(
        &mut self,
        trace: &mut Trace,
        stage: &str,
        body: &str,
        limits: Limits,
    ) -> StageEnd {
        self.scripts += 1;
        let dir = self.files.path().join(format!("script{}", self.scripts));
        let file = dir.join("script.sh");
        let status_file = dir.join("exit_status");
        let text = script::record_exit_status(body, &status_file.to_string_lossy());
        let written = async {
            tokio::fs::create_dir(&dir).await?;
            write_private(&file, text.as_bytes(), 0o700).await
        }
        .await;
        if let Err(e) = written {
            return StageEnd::SystemFailure(format!("cannot write the {stage} script: {e}"));
        }
        let cfg = self.cfg();
        let mut args = cfg.run_args.clone();
        args.push(file.display().to_string());
        args.push(stage.to_string());
        let driver = self.driver(&cfg.run_exec, args);
        let timeout = limits
            .stage_deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        let end = driver.run(limits, &mut |_, b| trace.write(b)).await;
        match stage_end(end, timeout) {
            StageEnd::BuildFailure(_) => {
                let code = tokio::fs::read_to_string(&status_file)
                    .await
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                    .filter(|c| *c != 0);
                StageEnd::BuildFailure(code)
            }
            other => other,
        }
    }
}
