//! Preparation: `config_exec` (and applying its output) then `prepare_exec`, with GitLab's
//! retries.

use std::time::Duration;

use crate::job::fmt_secs;
use slipway_job::outcome::{FailureReason, JobOutcome};
use slipway_job::trace::Trace;

use super::ConfigExecOutput;
use super::driver::{Stream, capture};
use super::session::Session;
use super::stage_end::{SYSTEM_FAILURE_MSG, StageEnd, stage_end};

/// Attempts of `prepare_exec` when it reports a system failure, and of `config_exec` when it
/// prints invalid JSON.
pub const PREPARE_ATTEMPTS: u32 = 3;
/// Pause between those attempts.
pub const PREPARE_RETRY_DELAY: Duration = Duration::from_secs(3);

impl Session<'_> {
    pub(super) async fn config(&mut self, trace: &mut Trace) -> Result<(), JobOutcome> {
        let cfg = self.cfg().clone();
        if cfg.config_exec.is_empty() {
            trace.message(&ConfigExecOutput::default().banner());
            return Ok(());
        }
        let mut attempt = 1;
        let out = loop {
            let driver = self.driver(&cfg.config_exec, cfg.config_args.clone());
            let mut stdout = Vec::new();
            let end = driver
                .run(
                    self.limits(Some(cfg.config_timeout())),
                    &mut |stream, bytes| match stream {
                        Stream::Stdout => capture(&mut stdout, bytes),
                        Stream::Stderr => trace.write(bytes),
                    },
                )
                .await;
            match stage_end(end, cfg.config_timeout()) {
                StageEnd::Ok => {}
                other => return Err(self.preparation_failed(trace, "config_exec", other)),
            }
            match ConfigExecOutput::parse(&stdout) {
                Ok(out) => break out,
                Err(e) if attempt < PREPARE_ATTEMPTS => {
                    trace.message(&format!(
                        "WARNING: Preparation failed: {e}\nWill be retried in {} ...",
                        fmt_secs(PREPARE_RETRY_DELAY)
                    ));
                    attempt += 1;
                    self.pause(trace).await?;
                }
                Err(e) => {
                    return Err(self.preparation_failed(
                        trace,
                        "config_exec",
                        StageEnd::SystemFailure(e.to_string()),
                    ));
                }
            }
        };
        if let Some(dir) = out.builds_dir.as_ref().filter(|d| !d.is_empty()) {
            self.builds_dir = dir.clone();
        }
        if let Some(shared) = out.builds_dir_is_shared {
            self.shared = shared;
        }
        self.job_env = out.job_env.clone().unwrap_or_default();
        trace.message(&out.banner());
        Ok(())
    }

    pub(super) async fn prepare(&mut self, trace: &mut Trace) -> Result<(), JobOutcome> {
        let cfg = self.cfg().clone();
        if cfg.prepare_exec.is_empty() {
            return Ok(());
        }
        trace.message("Preparing environment");
        let mut attempt = 1;
        loop {
            let driver = self.driver(&cfg.prepare_exec, cfg.prepare_args.clone());
            let end = driver
                .run(self.limits(Some(cfg.prepare_timeout())), &mut |_, b| {
                    trace.write(b)
                })
                .await;
            match stage_end(end, cfg.prepare_timeout()) {
                StageEnd::Ok => return Ok(()),
                StageEnd::SystemFailure(msg)
                    if attempt < PREPARE_ATTEMPTS && msg.starts_with(SYSTEM_FAILURE_MSG) =>
                {
                    trace.message(&format!(
                        "WARNING: Preparation failed: {msg}\nWill be retried in {} ...",
                        fmt_secs(PREPARE_RETRY_DELAY)
                    ));
                    attempt += 1;
                    self.pause(trace).await?;
                }
                other => return Err(self.preparation_failed(trace, "prepare_exec", other)),
            }
        }
    }

    /// Wait between attempts, unless the job is canceled or out of time.
    async fn pause(&self, trace: &mut Trace) -> Result<(), JobOutcome> {
        tokio::select! {
            _ = tokio::time::sleep(PREPARE_RETRY_DELAY) => Ok(()),
            _ = tokio::time::sleep_until(self.job_deadline) => {
                Err(self.end_outcome(trace, StageEnd::JobTimeout, "prepare"))
            }
            _ = self.cancel.cancelled() => Err(self.end_outcome(trace, StageEnd::Canceled, "prepare")),
        }
    }

    fn preparation_failed(&self, trace: &mut Trace, what: &str, end: StageEnd) -> JobOutcome {
        match end {
            StageEnd::Canceled | StageEnd::JobTimeout => self.end_outcome(trace, end, what),
            StageEnd::StageTimeout(t) => {
                let msg = format!("{what} timed out after {}", fmt_secs(t));
                trace.message(&format!("ERROR: Preparation failed: {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::BuildFailure(_) => {
                let msg = format!("{what} exited with the build failure exit code");
                trace.message(&format!("ERROR: Preparation failed: {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::SystemFailure(msg) => {
                let msg = format!("{what}: {msg}");
                trace.message(&format!("ERROR: Preparation failed: {msg}"));
                JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
            }
            StageEnd::Ok => JobOutcome::Success,
        }
    }
}
