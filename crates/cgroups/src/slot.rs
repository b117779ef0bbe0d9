//! One job's slot cgroup: create with limits, put processes in, read stats, kill and remove.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{CgroupError, Result};
use crate::fs;
use crate::hierarchy::{Backend, Controller, Hierarchy};
use crate::limits::{CpuQuota, Limits};
use crate::script;
pub use crate::script::DEFAULT_CLEANUP_TIMEOUT;
use crate::template::{SlotPath, SlotTemplate, slot_path_unchecked};

/// How long to wait for a freeze to take effect before killing anyway.
const FREEZE_WAIT: Duration = Duration::from_millis(500);

/// Pause between kill or rmdir rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(10);

/// A slot cgroup: the same relative path in every mount of a [`Hierarchy`].
///
/// All methods do blocking filesystem I/O (and [`SlotCgroup::cleanup`] sleeps between rounds);
/// from async code call them inside `tokio::task::spawn_blocking`. The type is cheap to clone
/// for that purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotCgroup {
    hierarchy: Hierarchy,
    path: SlotPath,
}

/// Usage figures of a slot; `None` where the host lacks the controller or file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// CPU time used by the slot's processes, dead ones included.
    pub cpu_usage: Option<Duration>,
    /// Memory charged to the slot now, in bytes.
    pub memory_current: Option<u64>,
    /// Highest memory charge seen, in bytes.
    pub memory_peak: Option<u64>,
    /// Processes killed by the OOM killer inside the slot.
    pub oom_kills: u64,
    /// Processes in the slot now.
    pub processes: usize,
}

/// What [`SlotCgroup::cleanup`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Processes killed by the OOM killer during the slot's life: non-zero means the job ran
    /// out of memory.
    pub oom_kills: u64,
    /// Processes still in the slot when cleanup began (all killed).
    pub leftover: Vec<u32>,
    /// Whether the slot existed at all.
    pub existed: bool,
}

impl SlotCgroup {
    /// Create the slot at `path` in every mount and apply `limits`.
    ///
    /// A slot already at that path (left by a crashed run) is cleaned up first: its processes
    /// are killed and its directories removed. On cgroup v2, `cpu`, `memory` and `pids` are
    /// enabled in `cgroup.subtree_control` of each ancestor, and `memory.oom.group` is set so
    /// an OOM kills the job as a whole. Fails before touching anything if a limit needs a
    /// controller the host lacks; on a later failure the half-made slot is removed.
    pub fn create(hierarchy: &Hierarchy, path: SlotPath, limits: &Limits) -> Result<Self> {
        limits.validate()?;
        let slot = Self::open(hierarchy, path);
        for (wanted, controller, what) in [
            (limits.cpu.is_some(), Controller::Cpu, "cpu"),
            (limits.memory_bytes.is_some(), Controller::Memory, "memory"),
            (limits.pids.is_some(), Controller::Pids, "pids"),
        ] {
            if wanted && !hierarchy.has(controller) {
                return Err(CgroupError::ControllerUnavailable {
                    controller: controller.name(),
                    what,
                    root: hierarchy.root().to_path_buf(),
                });
            }
        }
        if slot.exists() {
            slot.cleanup(DEFAULT_CLEANUP_TIMEOUT)?;
        }
        let made = slot.make_dirs().and_then(|()| {
            if let Some(Backend::V2(_)) = hierarchy.backend(Controller::Memory) {
                slot.write(Controller::Memory, "memory.oom.group", "1")?;
            }
            slot.set_limits(limits)
        });
        if let Err(e) = made {
            // Best effort: the error that matters is the one that stopped creation.
            let _ = slot.cleanup(Duration::from_secs(1));
            return Err(e);
        }
        Ok(slot)
    }

    /// The slot at `path` without touching the filesystem (to clean up or inspect a slot made
    /// earlier, e.g. by another process or a script).
    pub fn open(hierarchy: &Hierarchy, path: SlotPath) -> Self {
        Self {
            hierarchy: hierarchy.clone(),
            path,
        }
    }

    /// The relative path, e.g. `slipway/slot-3`; see [`SlotPath::env`] for the job's variables.
    pub fn path(&self) -> &SlotPath {
        &self.path
    }

    /// The hierarchy the slot lives in.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The slot's directory in each mount, cgroup2 first.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.hierarchy
            .mounts()
            .into_iter()
            .map(|m| m.join(self.path.as_str()))
            .collect()
    }

    /// The slot's directory holding `controller`'s files, if the host offers it.
    pub fn dir(&self, controller: Controller) -> Option<PathBuf> {
        self.hierarchy
            .backend(controller)
            .map(|b| b.mount().join(self.path.as_str()))
    }

    /// Whether any of the slot's directories exists.
    pub fn exists(&self) -> bool {
        self.dirs().iter().any(|d| d.is_dir())
    }

    /// Apply the limits that are set; unset ones keep their current value.
    pub fn set_limits(&self, limits: &Limits) -> Result<()> {
        limits.validate()?;
        if let Some(cpus) = limits.cpu {
            let quota = CpuQuota::from_cpus(cpus);
            match self.hierarchy.backend(Controller::Cpu) {
                Some(Backend::V2(_)) => self.write(Controller::Cpu, "cpu.max", &quota.cpu_max())?,
                Some(Backend::V1(_)) => {
                    self.write(
                        Controller::Cpu,
                        "cpu.cfs_period_us",
                        &quota.period_us.to_string(),
                    )?;
                    self.write(
                        Controller::Cpu,
                        "cpu.cfs_quota_us",
                        &quota.quota_us.to_string(),
                    )?;
                }
                None => return Err(self.unavailable(Controller::Cpu, "cpu")),
            }
        }
        if let Some(bytes) = limits.memory_bytes {
            self.set_memory(bytes)?;
        }
        if let Some(pids) = limits.pids {
            if !self.hierarchy.has(Controller::Pids) {
                return Err(self.unavailable(Controller::Pids, "pids"));
            }
            self.write(Controller::Pids, "pids.max", &pids.to_string())?;
        }
        Ok(())
    }

    fn set_memory(&self, bytes: u64) -> Result<()> {
        let value = bytes.to_string();
        match self.hierarchy.backend(Controller::Memory) {
            Some(Backend::V2(mount)) => {
                self.write(Controller::Memory, "memory.max", &value)?;
                // No swap beyond the limit, where the kernel has swap accounting.
                if mount
                    .join(self.path.as_str())
                    .join("memory.swap.max")
                    .is_file()
                {
                    self.write(Controller::Memory, "memory.swap.max", "0")?;
                }
                Ok(())
            }
            Some(Backend::V1(mount)) => {
                if !mount.join("memory.memsw.limit_in_bytes").is_file() {
                    return self.write(Controller::Memory, "memory.limit_in_bytes", &value);
                }
                // memory+swap must stay >= memory: lowering writes memory first, raising
                // needs memsw first. Try the first order, fall back to the second.
                let first = self.write(Controller::Memory, "memory.limit_in_bytes", &value);
                match first {
                    Ok(()) => self.write(Controller::Memory, "memory.memsw.limit_in_bytes", &value),
                    Err(_) => {
                        self.write(Controller::Memory, "memory.memsw.limit_in_bytes", &value)?;
                        self.write(Controller::Memory, "memory.limit_in_bytes", &value)
                    }
                }
            }
            None => Err(self.unavailable(Controller::Memory, "memory")),
        }
    }

    /// Move process `pid` (with all its threads) into the slot in every mount.
    pub fn add_pid(&self, pid: u32) -> Result<()> {
        let pid = pid.to_string();
        for dir in self.dirs() {
            fs::write(&dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    /// A command that starts `program` inside the slot: `/bin/sh` moves itself into every
    /// slot directory, then `exec`s the program. Append the program's arguments with `.arg()`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("{} && exec \"$@\"", self.enter_commands()))
            .arg("slipway-cgroup")
            .arg(program);
        cmd
    }

    /// A shell prologue that moves the running shell into the slot (exiting with an error
    /// message if it cannot), for scripts run on this host. For a remote host whose layout is
    /// not known here, use [`script::enter`].
    pub fn shell_prologue(&self) -> String {
        format!(
            "{{ {}; }} || {{ echo {} >&2; exit 1; }}\n",
            self.enter_commands(),
            script::quote(&format!(
                "slipway-cgroup: cannot enter slot cgroup {}",
                self.path
            )),
        )
    }

    fn enter_commands(&self) -> String {
        self.dirs()
            .iter()
            .map(|d| {
                format!(
                    "echo $$ > {}",
                    script::quote(&d.join("cgroup.procs").to_string_lossy())
                )
            })
            .collect::<Vec<_>>()
            .join(" && ")
    }

    /// Processes in the slot and its child cgroups, in any mount, sorted.
    pub fn pids(&self) -> Result<Vec<u32>> {
        let mut pids = BTreeSet::new();
        for dir in self.dirs() {
            for cgroup in fs::subtree_post_order(&dir)? {
                let procs = cgroup.join("cgroup.procs");
                // A child cgroup may vanish between listing and reading.
                let Some(text) = fs::read_opt(&procs)? else {
                    continue;
                };
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    let pid = line.trim().parse().map_err(|_| CgroupError::Parse {
                        path: procs.clone(),
                        what: "pid",
                        content: line.to_string(),
                    })?;
                    pids.insert(pid);
                }
            }
        }
        Ok(pids.into_iter().collect())
    }

    /// Processes the OOM killer killed inside the slot (`oom_kill` of v2 `memory.events` or
    /// v1 `memory.oom_control`); 0 without a memory controller or before the slot exists.
    pub fn oom_kills(&self) -> Result<u64> {
        let Some((backend, dir)) = self.backend_dir(Controller::Memory) else {
            return Ok(0);
        };
        let file = match backend {
            Backend::V2(_) => "memory.events",
            Backend::V1(_) => "memory.oom_control",
        };
        Ok(fs::read_key_opt(&dir.join(file), "oom_kill", "oom_kill count")?.unwrap_or(0))
    }

    /// CPU, memory and process figures of the slot.
    pub fn stats(&self) -> Result<SlotStats> {
        let cpu_usage = match self.backend_dir(Controller::Cpuacct) {
            Some((Backend::V1(_), dir)) => {
                fs::read_u64_opt(&dir.join("cpuacct.usage"), "cpu usage")?.map(Duration::from_nanos)
            }
            Some((Backend::V2(_), dir)) => {
                fs::read_key_opt(&dir.join("cpu.stat"), "usage_usec", "cpu usage")?
                    .map(Duration::from_micros)
            }
            None => None,
        };
        let (memory_current, memory_peak) = match self.backend_dir(Controller::Memory) {
            Some((Backend::V1(_), dir)) => (
                fs::read_u64_opt(&dir.join("memory.usage_in_bytes"), "memory usage")?,
                fs::read_u64_opt(&dir.join("memory.max_usage_in_bytes"), "memory peak")?,
            ),
            Some((Backend::V2(_), dir)) => (
                fs::read_u64_opt(&dir.join("memory.current"), "memory usage")?,
                fs::read_u64_opt(&dir.join("memory.peak"), "memory peak")?,
            ),
            None => (None, None),
        };
        Ok(SlotStats {
            cpu_usage,
            memory_current,
            memory_peak,
            oom_kills: self.oom_kills()?,
            processes: self.pids()?.len(),
        })
    }

    /// Kill every process in the slot and remove its directories, children first; a slot that
    /// does not exist is fine (idempotent).
    ///
    /// Uses `cgroup.kill` where the cgroup2 mount has it, which also catches daemons that
    /// `setsid`; then, until the slot is empty, freezes it (v1 freezer or `cgroup.freeze`),
    /// SIGKILLs every pid in `cgroup.procs` of every mount and thaws it. Refuses if the calling
    /// process is inside. Reads the OOM count before anything is removed.
    pub fn cleanup(&self, timeout: Duration) -> Result<CleanupReport> {
        if !self.exists() {
            return Ok(CleanupReport::default());
        }
        let deadline = Instant::now() + timeout;
        let oom_kills = self.oom_kills();
        let leftover = self.pids()?;
        loop {
            self.kill_all(&leftover, timeout, deadline)?;
            // Killed tasks may still be leaving (rmdir says EBUSY until they have): however long
            // the kill took, give their exit its own grace.
            match self.remove_dirs(deadline.max(Instant::now() + REMOVE_GRACE)) {
                // A task entered after the slot looked empty (a shell that moves itself in as
                // it starts): kill again, within the same deadline.
                Err(CgroupError::Entered { .. }) => continue,
                other => other?,
            }
            break;
        }
        Ok(CleanupReport {
            oom_kills: oom_kills?,
            leftover,
            existed: true,
        })
    }

    fn kill_all(&self, first: &[u32], timeout: Duration, deadline: Instant) -> Result<()> {
        let me = std::process::id();
        if first.contains(&me) {
            return Err(CgroupError::SelfInSlot {
                path: self.first_dir(),
                pid: me,
            });
        }
        if let Some(unified) = self.hierarchy.unified() {
            let kill_file = unified.join(self.path.as_str()).join("cgroup.kill");
            if kill_file.is_file() {
                // Falls through to the signal loop below if the kernel refuses.
                let _ = fs::write(&kill_file, "1");
            }
        }
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(());
            }
            if pids.contains(&me) {
                return Err(CgroupError::SelfInSlot {
                    path: self.first_dir(),
                    pid: me,
                });
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::KillTimeout {
                    path: self.first_dir(),
                    pids,
                    after: timeout,
                });
            }
            let frozen = self.freeze(true);
            let killed = self.signal_all(&pids);
            if frozen {
                self.freeze(false);
            }
            killed?;
            thread::sleep(ROUND_PAUSE);
        }
    }

    fn signal_all(&self, pids: &[u32]) -> Result<()> {
        for &pid in pids {
            let Ok(raw) = i32::try_from(pid) else {
                continue;
            };
            match kill(Pid::from_raw(raw), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(source) => {
                    return Err(CgroupError::Kill {
                        path: self.first_dir(),
                        pid,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Freeze (or thaw) the slot; returns whether a freezer was used. Best effort: a slot
    /// that cannot be frozen is killed unfrozen, round after round.
    fn freeze(&self, on: bool) -> bool {
        let Some((backend, dir)) = self.backend_dir(Controller::Freezer) else {
            return false;
        };
        let (file, value, done): (&str, &str, fn(&str) -> bool) = match (backend, on) {
            (Backend::V1(_), true) => ("freezer.state", "FROZEN", |s| s.trim() == "FROZEN"),
            (Backend::V1(_), false) => ("freezer.state", "THAWED", |_| true),
            (Backend::V2(_), true) => ("cgroup.freeze", "1", |s| {
                s.lines().any(|l| l.trim() == "frozen 1")
            }),
            (Backend::V2(_), false) => ("cgroup.freeze", "0", |_| true),
        };
        let path = dir.join(file);
        if !path.is_file() || fs::write(&path, value).is_err() {
            return false;
        }
        if on {
            let state = match backend {
                Backend::V1(_) => path,
                Backend::V2(_) => dir.join("cgroup.events"),
            };
            let until = Instant::now() + FREEZE_WAIT;
            while Instant::now() < until {
                match fs::read(&state) {
                    Ok(s) if done(&s) => break,
                    Ok(_) => thread::sleep(Duration::from_millis(2)),
                    Err(_) => break,
                }
            }
        }
        true
    }

    fn remove_dirs(&self, deadline: Instant) -> Result<()> {
        for dir in self.dirs() {
            for cgroup in fs::subtree_post_order(&dir)? {
                remove_dir_retrying(&cgroup, deadline)?;
            }
        }
        Ok(())
    }

    fn make_dirs(&self) -> Result<()> {
        for mount in self.hierarchy.mounts() {
            let is_v2 = Some(mount) == self.hierarchy.unified();
            let wanted = if is_v2 {
                self.hierarchy.v2_domain_controllers()
            } else {
                Vec::new()
            };
            let mut current = mount.to_path_buf();
            for component in self.path.as_str().split('/') {
                if !wanted.is_empty() {
                    enable_controllers(&current, &wanted)?;
                }
                current.push(component);
                fs::mkdir(&current)?;
            }
        }
        Ok(())
    }

    fn write(&self, controller: Controller, file: &str, value: &str) -> Result<()> {
        match self.dir(controller) {
            Some(dir) => fs::write(&dir.join(file), value),
            None => Err(self.unavailable(controller, controller.name())),
        }
    }

    fn backend_dir(&self, controller: Controller) -> Option<(Backend<'_>, PathBuf)> {
        let backend = self.hierarchy.backend(controller)?;
        let dir = backend.mount().join(self.path.as_str());
        Some((backend, dir))
    }

    fn unavailable(&self, controller: Controller, what: &'static str) -> CgroupError {
        CgroupError::ControllerUnavailable {
            controller: controller.name(),
            what,
            root: self.hierarchy.root().to_path_buf(),
        }
    }

    fn first_dir(&self) -> PathBuf {
        self.dirs()
            .into_iter()
            .next()
            .unwrap_or_else(|| self.hierarchy.root().join(self.path.as_str()))
    }
}

/// Add the `wanted` controllers missing from `dir/cgroup.subtree_control`.
fn enable_controllers(dir: &Path, wanted: &[&str]) -> Result<()> {
    let file = dir.join("cgroup.subtree_control");
    let current = fs::read_opt(&file)?.unwrap_or_default();
    let have: Vec<&str> = current.split_whitespace().collect();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|c| !have.contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    fs::write(&file, &missing.join(" "))
}

/// Least time rmdir is retried after the last task was killed.
const REMOVE_GRACE: Duration = Duration::from_secs(5);

fn remove_dir_retrying(path: &Path, deadline: Instant) -> Result<()> {
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // EBUSY while the last tasks leave; ENOTEMPTY if a child appeared meanwhile.
            Err(source) if Instant::now() >= deadline => {
                return Err(CgroupError::RemoveDir {
                    path: path.to_path_buf(),
                    source,
                });
            }
            Err(e) if e.raw_os_error() == Some(Errno::EBUSY as i32) && has_tasks(path) => {
                return Err(CgroupError::Entered {
                    path: path.to_path_buf(),
                });
            }
            Err(e) if e.raw_os_error() == Some(Errno::ENOTEMPTY as i32) => {
                for child in fs::subtree_post_order(path)? {
                    if child != path {
                        remove_dir_retrying(&child, deadline)?;
                    }
                }
            }
            Err(_) => thread::sleep(ROUND_PAUSE),
        }
    }
}

/// Whether live tasks are in the cgroup `path` itself.
fn has_tasks(path: &Path) -> bool {
    std::fs::read_to_string(path.join("cgroup.procs")).is_ok_and(|t| !t.trim().is_empty())
}

/// Clean up every slot of `template` under its parent whose slot number is not in `keep`
/// (stale slots of a crashed or restarted manager); returns the paths removed.
///
/// Looks in every mount. Only directories matching the template's first `{slot}` component
/// with a plain decimal slot number are touched. A shared template (no `{slot}`) has one
/// cgroup, removed only when `keep` is empty.
pub fn sweep(
    hierarchy: &Hierarchy,
    template: &SlotTemplate,
    keep: &[u32],
    timeout: Duration,
) -> Result<Vec<SlotPath>> {
    let Some((parent, prefix, suffix)) = template.slot_component() else {
        let slot = SlotCgroup::open(hierarchy, template.expand(0));
        if keep.is_empty() && slot.cleanup(timeout)?.existed {
            return Ok(vec![slot.path]);
        }
        return Ok(Vec::new());
    };
    let mut stale = BTreeSet::new();
    for mount in hierarchy.mounts() {
        for dir in fs::child_dirs(&mount.join(&parent))? {
            let Some(name) = dir.file_name().and_then(OsStr::to_str) else {
                continue;
            };
            let Some(number) = name
                .strip_prefix(prefix.as_str())
                .and_then(|rest| rest.strip_suffix(suffix.as_str()))
            else {
                continue;
            };
            let Ok(slot) = number.parse::<u32>() else {
                continue;
            };
            if slot.to_string() == number && !keep.contains(&slot) {
                stale.insert(name.to_string());
            }
        }
    }
    let mut removed = Vec::new();
    for name in stale {
        let path = if parent.is_empty() {
            name
        } else {
            format!("{parent}/{name}")
        };
        let slot = SlotCgroup::open(hierarchy, slot_path_unchecked(path));
        slot.cleanup(timeout)?;
        removed.push(slot.path);
    }
    Ok(removed)
}
