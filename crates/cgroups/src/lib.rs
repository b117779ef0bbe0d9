//! Per-job slot cgroups: Slipway's `cgroup` isolation level.
//!
//! Each acquired slot gets a cgroup at a templated path (GitLab's `slot_cgroup_template`,
//! default here `slipway/slot-{slot}`) with CPU, memory and pids limits. The job's processes
//! are put in it, and cleanup kills everything inside — daemons that `setsid` included — then
//! removes it and reports OOM kills.
//!
//! - [`hierarchy`]: detect cgroup v2, v1 or hybrid mounts and where each controller lives.
//! - [`template`]: slot path templates (`{slot}` or GitLab's `${slot}`) and the job's variables.
//! - [`limits`]: [`Limits`] and per-slot shares of an instance.
//! - [`slot`]: [`SlotCgroup`] (create, enter, stats, cleanup) and [`sweep`] of stale slots.
//! - [`script`]: the same operations as bash snippets for instances reached over SSH.
//! - [`error`]: [`CgroupError`]; every variant names the path and the operation that failed.
//! - `fs`: small cgroupfs file helpers that turn I/O errors into [`CgroupError`]s naming the path.
//!
//! ```no_run
//! use std::time::Duration;
//! use slipway_cgroups::{Hierarchy, Limits, SlotCgroup, SlotTemplate};
//!
//! # fn main() -> Result<(), slipway_cgroups::CgroupError> {
//! let hierarchy = Hierarchy::detect()?;
//! let template = SlotTemplate::parse("gitlab-runner/slot-${slot}")?;
//! let limits = Limits { cpu: Some(2.0), memory_bytes: Some(8 << 30), pids: Some(4096) }.per_slot(4);
//! let slot = SlotCgroup::create(&hierarchy, template.expand(0), &limits)?;
//! let child = slot.command("bash").arg("-c").arg("make test").spawn();
//! let report = slot.cleanup(Duration::from_secs(10))?;
//! if report.oom_kills > 0 { /* the job ran out of memory */ }
//! # drop(child); Ok(()) }
//! ```
//!
//! **Blocking I/O.** Everything here reads and writes cgroupfs synchronously, and cleanup sleeps
//! between kill rounds. Async callers must run these calls in `tokio::task::spawn_blocking`
//! (the types are `Clone + Send` for that). The [`script`] functions are pure.
//!
//! **Layouts.** On cgroup v2 limits are `cpu.max`, `memory.max` (+ `memory.oom.group=1`,
//! `memory.swap.max=0`) and `pids.max`, enabled via each ancestor's `cgroup.subtree_control`.
//! On v1 they are `cpu.cfs_quota_us`/`cpu.cfs_period_us`, `memory.limit_in_bytes`
//! (+ `memory.memsw.limit_in_bytes`) and `pids.max`. On a hybrid host the slot also lives in
//! the cgroup2 mount (`<root>/unified`), whose `cgroup.kill` ends it in one write.

pub mod error;
mod fs;
pub mod hierarchy;
pub mod limits;
pub mod script;
pub mod slot;
pub mod template;

pub use error::{CgroupError, Result};
pub use hierarchy::{Backend, Controller, Hierarchy, Mode};
pub use limits::{CpuQuota, Limits};
pub use slot::{CleanupReport, DEFAULT_CLEANUP_TIMEOUT, SlotCgroup, SlotStats, sweep};
pub use template::{DEFAULT_TEMPLATE, PER_INSTANCE_TEMPLATE, SlotPath, SlotTemplate};
