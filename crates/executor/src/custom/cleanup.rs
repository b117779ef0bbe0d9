//! `cleanup_exec`, run after every job whatever happened.

use tokio::time::Instant;

use slipway_job::trace::{Masker, Trace};

use super::driver::{Limits, Stream, capture};
use super::session::Session;
use super::stage_end::{StageEnd, stage_end};

impl Session<'_> {
    /// `cleanup_exec`: always, with its own timeout; a failure is a warning.
    pub(super) async fn cleanup(&self, trace: &mut Trace) {
        let cfg = self.cfg();
        if cfg.cleanup_exec.is_empty() {
            return;
        }
        let driver = self.driver(&cfg.cleanup_exec, cfg.cleanup_args.clone());
        let limits = Limits {
            job_deadline: None,
            stage_deadline: Some(Instant::now() + cfg.cleanup_timeout()),
            cancel: None,
        };
        let mut out = Vec::new();
        let mut err = Vec::new();
        let end = driver
            .run(limits, &mut |stream, b| match stream {
                Stream::Stdout => capture(&mut out, b),
                Stream::Stderr => capture(&mut err, b),
            })
            .await;
        let secrets = self.job.masked_values();
        let mask = |bytes: &[u8]| {
            let mut m = Masker::new(secrets.iter());
            let mut v = m.push(bytes);
            v.extend(m.finish());
            String::from_utf8_lossy(&v).into_owned()
        };
        if !out.is_empty() {
            tracing::debug!(job = self.job.id, stdout = %mask(&out), "cleanup_exec output");
        }
        if !err.is_empty() {
            tracing::warn!(job = self.job.id, stderr = %mask(&err), "cleanup_exec output");
        }
        let end = stage_end(end, cfg.cleanup_timeout());
        if !matches!(end, StageEnd::Ok) {
            trace.message(&format!(
                "WARNING: Cleanup script failed: {}",
                end.describe()
            ));
        }
    }
}
