//! Slot cgroups of instances that share this machine's kernel (the local plugin's sshd hosts).
//!
//! A real instance has its own cgroup hierarchy, which goes with it. Instances on this host
//! share one: each gets its own subtree (`slipway/{instance}/slot-{slot}` unless the config
//! names a template), and the subtree is removed here when its instance is removed.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use slipway_cgroups::{Hierarchy, SlotCgroup, SlotTemplate};
use slipway_config::RunnerConfig;
use slipway_executor::cgroup::SlotCgroups;

/// Whether a runner's instances share this machine's kernel, cgroupfs and Docker Engine: those
/// of the local fleeting plugin.
pub fn instances_share_this_host(cfg: &RunnerConfig) -> bool {
    cfg.on_instances()
        && cfg
            .autoscaler
            .as_ref()
            .is_some_and(|a| crate::runner::plugin_name(&a.plugin) == "local")
}

/// The runner's slot cgroups: the configured template, else one subtree per instance where
/// instances share this host (slot 0 of one is not slot 0 of another), else the default.
pub fn slot_cgroups_of(cfg: &RunnerConfig) -> Result<SlotCgroups, String> {
    let mut cgroups = cfg.slot_cgroups()?;
    if cfg.slot_cgroup_template.is_none() && instances_share_this_host(cfg) {
        cgroups.template = SlotTemplate::per_instance();
    }
    Ok(cgroups)
}

/// The per-instance cgroup subtrees of a runner whose instances share this host: which
/// instances ran jobs, and their removal.
#[derive(Debug)]
pub struct InstanceSubtrees {
    cgroups: SlotCgroups,
    used: Mutex<HashSet<String>>,
}

impl InstanceSubtrees {
    /// Subtrees to look after when the runner's instances share this host and its template
    /// gives each instance a subtree of its own.
    pub fn of(cfg: &RunnerConfig, cgroups: &SlotCgroups) -> Option<InstanceSubtrees> {
        (instances_share_this_host(cfg) && cgroups.template.instance_subtree("i").is_some()).then(
            || InstanceSubtrees {
                cgroups: cgroups.clone(),
                used: Mutex::new(HashSet::new()),
            },
        )
    }

    /// A job runs on instance `id`: its subtree may exist from now on.
    pub fn used(&self, id: &str) {
        self.used_ids().insert(id.to_string());
    }

    /// Remove instance `id`'s subtree (killing what is left in it), as its deletion would on
    /// a real instance. Failures are logged: the instance goes anyway.
    pub async fn remove(&self, id: &str) {
        if !self.used_ids().remove(id) {
            return;
        }
        let Some(path) = self.cgroups.template.instance_subtree(id) else {
            return;
        };
        let root = self.cgroups.root.as_str().to_string();
        let timeout = self.cgroups.cleanup_timeout;
        // cgroupfs work and kill rounds block.
        let done = tokio::task::spawn_blocking(move || {
            let hierarchy = Hierarchy::at(&root)?;
            let report = SlotCgroup::open(&hierarchy, path.clone()).cleanup(timeout);
            // Docker also makes the containers' cgroups in hierarchies Slipway does not use
            // (blkio, devices, cpuset, name=systemd): empty now, they go too.
            remove_empty_subtrees(std::path::Path::new(&root), path.as_str());
            report
        })
        .await;
        match done {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(instance = %id, "removing the instance's cgroups: {e}"),
            Err(e) => tracing::warn!(instance = %id, "removing the instance's cgroups: {e}"),
        }
    }

    /// Remove the subtree of every instance that ran a job (the runner stopping).
    pub async fn remove_all(&self) {
        let ids: Vec<String> = self.used_ids().iter().cloned().collect();
        for id in ids {
            self.remove(&id).await;
        }
    }

    fn used_ids(&self) -> MutexGuard<'_, HashSet<String>> {
        // Poisoning only means a panic elsewhere; the set is still consistent.
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Remove `<root>/<mount>/<path>` (or `<root>/<path>`) and the cgroups under it, deepest first;
/// a cgroup still in use (rmdir refused) stays.
fn remove_empty_subtrees(root: &Path, path: &str) {
    let Ok(mounts) = std::fs::read_dir(root) else {
        return;
    };
    // Each v1 hierarchy under the root, or the root itself when it is a cgroup2 mount.
    for mount in mounts
        .flatten()
        .map(|m| m.path())
        .chain([root.to_path_buf()])
    {
        remove_dirs_below(&mount.join(path));
    }
}

/// rmdir `dir` after its subdirectories (cgroupfs: only directories are removed by hand).
fn remove_dirs_below(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dirs_below(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_plugin(plugin: &str, extra: &str) -> RunnerConfig {
        let text = format!(
            "[[runners]]\nname = \"r\"\nexecutor = \"instance\"\n{extra}\n\
             [runners.autoscaler]\nplugin = \"{plugin}\"\n"
        );
        let mut loaded = slipway_config::parse(&text, "config.toml").unwrap();
        loaded.config.runners.remove(0)
    }

    #[test]
    fn local_instances_get_a_subtree_each_and_others_keep_the_default() {
        let local = with_plugin("local", "");
        let c = slot_cgroups_of(&local).unwrap();
        assert_eq!(c.template.as_str(), "slipway/{instance}/slot-{slot}");
        assert!(InstanceSubtrees::of(&local, &c).is_some());
        let by_path = with_plugin("/opt/bin/fleeting-plugin-local", "");
        assert!(instances_share_this_host(&by_path));
        for plugin in ["aws", "static", "fleeting-plugin-googlecloud"] {
            let real = with_plugin(plugin, "");
            let c = slot_cgroups_of(&real).unwrap();
            assert_eq!(c.template.as_str(), "slipway/slot-{slot}", "{plugin}");
            assert!(InstanceSubtrees::of(&real, &c).is_none(), "{plugin}");
        }
    }

    #[test]
    fn a_configured_template_is_kept_even_for_local_instances() {
        let local = with_plugin("local", "slot_cgroup_template = \"ci/slot-${slot}\"");
        let c = slot_cgroups_of(&local).unwrap();
        assert_eq!(c.template.as_str(), "ci/slot-{slot}");
        assert!(InstanceSubtrees::of(&local, &c).is_none());
        let own = with_plugin(
            "local",
            "slot_cgroup_template = \"ci/${instance}/s-${slot}\"",
        );
        let c = slot_cgroups_of(&own).unwrap();
        assert_eq!(c.template.as_str(), "ci/{instance}/s-{slot}");
        assert!(InstanceSubtrees::of(&own, &c).is_some());
    }
}
