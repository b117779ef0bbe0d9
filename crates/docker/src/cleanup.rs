//! Removing everything a job left behind, found by label.

use crate::client::Docker;
use crate::error::Result;

/// What [`Docker::cleanup_by_label`] removed, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Removed container IDs.
    pub containers: Vec<String>,
    /// Removed network IDs.
    pub networks: Vec<String>,
    /// Removed volume names.
    pub volumes: Vec<String>,
    /// `(kind, id, error)` for each object that could not be removed.
    pub failed: Vec<(String, String, String)>,
}

impl CleanupReport {
    /// Nothing failed.
    pub fn is_clean(&self) -> bool {
        self.failed.is_empty()
    }

    /// Nothing was found to remove.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.networks.is_empty() && self.volumes.is_empty()
    }
}

impl Docker {
    /// Force-removes every container (with its anonymous volumes), then every network and volume
    /// carrying `label` (`key` or `key=value`). Keeps going past failures and reports them;
    /// objects that vanished meanwhile count as removed. Fails only when listing fails.
    pub async fn cleanup_by_label(&self, label: &str) -> Result<CleanupReport> {
        let mut report = CleanupReport::default();
        for c in self.list_containers(Some(label)).await? {
            match self.remove_container(&c.id, true, true).await {
                Ok(()) => report.containers.push(c.id),
                Err(e) if e.is_not_found() => report.containers.push(c.id),
                Err(e) => report
                    .failed
                    .push(("container".into(), c.id, e.to_string())),
            }
        }
        for n in self.list_networks(Some(label)).await? {
            match self.remove_network(&n.id).await {
                Ok(()) => report.networks.push(n.id),
                Err(e) if e.is_not_found() => report.networks.push(n.id),
                Err(e) => report.failed.push(("network".into(), n.id, e.to_string())),
            }
        }
        for v in self.list_volumes(Some(label)).await? {
            match self.remove_volume(&v.name, true).await {
                Ok(()) => report.volumes.push(v.name),
                Err(e) if e.is_not_found() => report.volumes.push(v.name),
                Err(e) => report.failed.push(("volume".into(), v.name, e.to_string())),
            }
        }
        if !report.is_empty() || !report.is_clean() {
            tracing::debug!(label, ?report, "Docker cleanup by label");
        }
        Ok(report)
    }
}
