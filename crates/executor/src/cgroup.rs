//! The `cgroup` isolation level on any host: each job runs in its slot's cgroup with CPU,
//! memory and pids limits, and everything it started (daemons that `setsid` too) is killed
//! when it ends.
//!
//! The work is done by bash from `slipway_cgroups::script`, so the same level runs on this
//! machine and on instances over SSH; it plugs into a [`JobRunner`] as its prepare, per-step
//! prologue and teardown.

use std::fmt::Write as _;
use std::time::Duration;

use slipway_cgroups::script::{self as cg, ScriptRoot};
use slipway_cgroups::{CgroupError, Limits, SlotPath, SlotTemplate};

use crate::job::{JobRunner, NOTE_PREFIX};
use crate::script::quote;

/// pids.max of a slot when nothing else is configured: room for a big build, not a fork bomb.
pub const DEFAULT_PIDS: u64 = 4096;

/// Where slot cgroups live and how long cleanup may take.
#[derive(Debug, Clone)]
pub struct SlotCgroups {
    /// Mount root of the cgroup hierarchies on the host (`/sys/fs/cgroup`).
    pub root: ScriptRoot,
    /// Slot path template (GitLab's `slot_cgroup_template`).
    pub template: SlotTemplate,
    /// Longest the kill-and-remove at the end of a job may take.
    pub cleanup_timeout: Duration,
}

impl Default for SlotCgroups {
    fn default() -> Self {
        SlotCgroups {
            root: ScriptRoot::default(),
            template: SlotTemplate::default(),
            cleanup_timeout: slipway_cgroups::DEFAULT_CLEANUP_TIMEOUT,
        }
    }
}

impl SlotCgroups {
    /// Make `runner` run its job in slot `slot`'s cgroup with `limits`: create it (cleaning a
    /// leftover first), move every step into it and export its path to the job
    /// (`SLIPWAY_CGROUP`, GitLab's `GITLAB_RUNNER_SLOT_CGROUP`), and at the end kill what is
    /// left, remove it and say so when the job was OOM-killed.
    pub fn apply(
        &self,
        runner: &mut JobRunner,
        instance: &str,
        slot: u32,
        limits: &Limits,
    ) -> Result<SlotPath, CgroupError> {
        let path = self.template.expand_on(instance, slot);
        runner.prepare = cg::create(&self.root, &path, limits)?;
        let mut prologue = cg::enter(&self.root, &path);
        for (k, v) in path.env() {
            let _ = writeln!(prologue, "export {k}={}", quote(&v));
        }
        runner.prologue = prologue;
        runner.teardown = teardown(
            &cg::cleanup(&self.root, &path, self.cleanup_timeout),
            limits,
        );
        Ok(path)
    }
}

/// The cleanup script, with a note for the trace when the slot saw an OOM kill.
fn teardown(cleanup: &str, limits: &Limits) -> String {
    let limit = limits
        .memory_bytes
        .map(|b| format!(" of {} MiB", b / (1024 * 1024)))
        .unwrap_or_default();
    format!(
        "__slipway_out=$(\n{cleanup}\n)\n__slipway_st=$?\nprintf '%s\\n' \"$__slipway_out\"\n\
         case \"$__slipway_out\" in\n  *oom_kills=0*|'') ;;\n  *oom_kills=*) echo {};;\nesac\n\
         exit $__slipway_st\n",
        quote(&format!(
            "{NOTE_PREFIX}the job was OOM-killed: it used more than its memory limit{limit}"
        ))
    )
}

/// Limits for a job from what it holds: its share of CPU and memory, and [`DEFAULT_PIDS`].
pub fn limits_for(cpu_millis: u64, memory_bytes: u64) -> Limits {
    Limits {
        cpu: (cpu_millis > 0).then(|| cpu_millis as f64 / 1000.0),
        memory_bytes: (memory_bytes > 0).then_some(memory_bytes),
        pids: Some(DEFAULT_PIDS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_gets_prepare_prologue_and_teardown() {
        let mut runner = JobRunner::default();
        let path = SlotCgroups::default()
            .apply(&mut runner, "i-1", 3, &limits_for(500, 64 << 20))
            .unwrap();
        assert_eq!(path.as_str(), "slipway/slot-3");
        assert!(runner.prepare.contains("slipway/slot-3"));
        assert!(
            runner
                .prologue
                .contains("export SLIPWAY_CGROUP='slipway/slot-3'")
        );
        assert!(runner.prologue.contains("GITLAB_RUNNER_SLOT_CGROUP"));
        assert!(runner.teardown.contains("memory limit of 64 MiB"));
    }

    #[test]
    fn no_resources_means_only_a_pids_limit() {
        let l = limits_for(0, 0);
        assert_eq!(
            (l.cpu, l.memory_bytes, l.pids),
            (None, None, Some(DEFAULT_PIDS))
        );
    }
}
