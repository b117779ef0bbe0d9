//! Removing what jobs created: one run's everything at its end, and what earlier sessions left.

use std::time::Duration;

use slipway_docker::Docker;

use super::names::{RunNames, Sweep};
use super::network::SlotLease;
use super::{CLEANUP_TIMEOUT, DockerExecutor, LABEL_CACHE, LABEL_RUN, LABEL_RUNNER, LABEL_SESSION};
use slipway_job::trace::Trace;

impl DockerExecutor {
    /// Remove the job containers and volumes of `runner` on this engine of the sessions
    /// `sweep` names. Cache volumes are kept.
    pub async fn sweep_job_leftovers(
        docker: &Docker,
        runner: &str,
        sweep: Sweep,
    ) -> slipway_docker::Result<usize> {
        let label = format!("{LABEL_RUNNER}={runner}");
        let stale = |labels: Option<&std::collections::HashMap<String, String>>| {
            labels.is_some_and(|l| {
                l.contains_key(LABEL_RUN)
                    && !l.contains_key(LABEL_CACHE)
                    && sweep.removes(l.get(LABEL_SESSION).map(String::as_str))
            })
        };
        let mut removed = 0;
        for c in docker.list_containers(Some(&label)).await? {
            if stale(c.labels.as_ref()) {
                match docker.remove_container(&c.id, true, true).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for v in docker.list_volumes(Some(&label)).await? {
            if stale(v.labels.as_ref()) {
                match docker.remove_volume(&v.name, true).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }

    /// Remove everything the run created, then give the slot's network back: kept warm only
    /// when nothing was left on it.
    pub(super) async fn remove_all_and_release(
        &self,
        run: &RunNames,
        mut lease: Option<SlotLease>,
        trace: &mut Trace,
    ) {
        let clean = self.remove_all(run, trace).await;
        if let Some(lease) = lease.as_mut() {
            lease.clean = clean;
        }
        drop(lease);
    }

    /// Remove everything the run created; retried, bounded, reported in the trace. Whether
    /// nothing is left.
    async fn remove_all(&self, run: &RunNames, trace: &mut Trace) -> bool {
        let label = format!("{LABEL_RUN}={}", run.prefix);
        let work = async {
            let mut last = String::new();
            for attempt in 0..3u32 {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
                }
                match self.docker.cleanup_by_label(&label).await {
                    Ok(report) if report.is_clean() => return Ok(()),
                    Ok(report) => {
                        last = report
                            .failed
                            .iter()
                            .map(|(kind, id, e)| format!("{kind} {id}: {e}"))
                            .collect::<Vec<_>>()
                            .join("; ");
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            Err(last)
        };
        match tokio::time::timeout(CLEANUP_TIMEOUT, work).await {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => {
                tracing::warn!(run = %run.prefix, "docker cleanup incomplete: {e}");
                trace.message(&format!(
                    "WARNING: removing the job's containers failed: {e}"
                ));
            }
            Err(_) => {
                tracing::warn!(run = %run.prefix, "docker cleanup timed out");
                trace.message("WARNING: removing the job's containers timed out");
            }
        }
        false
    }
}
