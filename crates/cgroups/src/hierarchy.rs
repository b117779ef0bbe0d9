//! Which cgroup hierarchies a host has and where each controller lives.
//!
//! Three layouts exist in the wild:
//! - **unified** (cgroup v2 only): the root (e.g. `/sys/fs/cgroup`) is a cgroup2 mount with
//!   `cgroup.controllers`; limits are `cpu.max`, `memory.max`, `pids.max`.
//! - **legacy** (cgroup v1 only): the root is a tmpfs with one v1 mount per controller
//!   (`cpu`, `cpuacct`, `memory`, `pids`, `freezer`, …), possibly co-mounted (`cpu,cpuacct`).
//! - **hybrid**: legacy plus a cgroup2 mount at `<root>/unified`, which usually offers few or no
//!   controllers but always `cgroup.procs`, `cgroup.freeze` and (5.14+) `cgroup.kill`.
//!
//! A [`Hierarchy`] resolves each [`Controller`] to a [`Backend`]: a v1 mount, or the cgroup2
//! mount when the controller is enabled there. A slot cgroup is then one directory in the cgroup2
//! mount (if any) plus one in each distinct v1 mount.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{CgroupError, Result};
use crate::fs;

/// A cgroup controller (or v1 hierarchy) Slipway uses for slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    /// CPU bandwidth: `cpu.max` (v2) or `cpu.cfs_quota_us` / `cpu.cfs_period_us` (v1).
    Cpu,
    /// CPU usage accounting: `cpu.stat` (v2, always present) or the v1 `cpuacct` hierarchy.
    Cpuacct,
    /// Memory limit and OOM accounting.
    Memory,
    /// Process-count limit.
    Pids,
    /// Freezing: `cgroup.freeze` (v2, always present) or the v1 `freezer` hierarchy.
    Freezer,
}

impl Controller {
    /// Every controller a slot spans, in the order slot directories are made.
    pub const ALL: [Controller; 5] = [
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Memory,
        Controller::Pids,
        Controller::Freezer,
    ];

    /// The kernel's name: the v1 hierarchy directory and the v2 `cgroup.controllers` word.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Freezer => "freezer",
        }
    }

    /// Whether cgroup v2 provides this without enabling a controller (core interface files).
    fn core_in_v2(self) -> bool {
        matches!(self, Controller::Cpuacct | Controller::Freezer)
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a host mounts cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// cgroup v2 only.
    Unified,
    /// cgroup v1 controllers plus a cgroup2 mount.
    Hybrid,
    /// cgroup v1 only.
    Legacy,
}

/// Where one controller's interface files live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend<'a> {
    /// In the cgroup2 mount at this path.
    V2(&'a Path),
    /// In the v1 hierarchy mounted at this path.
    V1(&'a Path),
}

impl<'a> Backend<'a> {
    /// The mount directory.
    pub fn mount(self) -> &'a Path {
        match self {
            Backend::V2(p) | Backend::V1(p) => p,
        }
    }
}

/// The cgroup mounts of a host (or of a tempdir laid out like one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    root: PathBuf,
    unified: Option<PathBuf>,
    unified_controllers: Vec<String>,
    v1: Vec<(Controller, PathBuf)>,
}

impl Hierarchy {
    /// Where cgroups are mounted on Linux.
    pub const DEFAULT_ROOT: &'static str = "/sys/fs/cgroup";

    /// Detect the hierarchy under [`Hierarchy::DEFAULT_ROOT`].
    pub fn detect() -> Result<Self> {
        Self::at(Self::DEFAULT_ROOT)
    }

    /// Detect the hierarchy under `root`: cgroup v2 if `root/cgroup.controllers` exists,
    /// otherwise v1 mounts at `root/<controller>` plus a cgroup2 mount at `root/unified`.
    pub fn at(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        if let Some(controllers) = fs::read_opt(&root.join("cgroup.controllers"))? {
            return Ok(Self {
                unified_controllers: words(&controllers),
                unified: Some(root.clone()),
                root,
                v1: Vec::new(),
            });
        }
        let mut v1 = Vec::new();
        for controller in Controller::ALL {
            let mount = root.join(controller.name());
            if mount.join("cgroup.procs").is_file() {
                // Co-mounted controllers (`cpu` -> `cpu,cpuacct`) resolve to one directory.
                let mount = std::fs::canonicalize(&mount).unwrap_or(mount);
                v1.push((controller, mount));
            }
        }
        let unified_dir = root.join("unified");
        let (unified, unified_controllers) =
            match fs::read_opt(&unified_dir.join("cgroup.controllers"))? {
                Some(controllers) => (Some(unified_dir), words(&controllers)),
                None => (None, Vec::new()),
            };
        if v1.is_empty() && unified.is_none() {
            return Err(CgroupError::NoHierarchy { root });
        }
        Ok(Self {
            root,
            unified,
            unified_controllers,
            v1,
        })
    }

    /// Ignore the cgroup2 mount of a hybrid host and use the v1 hierarchies alone.
    ///
    /// No effect on a unified host, whose only mount is the cgroup2 one.
    pub fn without_unified(mut self) -> Self {
        if !self.v1.is_empty() {
            self.unified = None;
            self.unified_controllers.clear();
        }
        self
    }

    /// The root the hierarchy was detected under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Unified, hybrid or legacy.
    pub fn mode(&self) -> Mode {
        match (&self.unified, self.v1.is_empty()) {
            (Some(_), true) => Mode::Unified,
            (Some(_), false) => Mode::Hybrid,
            (None, _) => Mode::Legacy,
        }
    }

    /// The cgroup2 mount, if any.
    pub fn unified(&self) -> Option<&Path> {
        self.unified.as_deref()
    }

    /// The controllers listed in the cgroup2 mount's `cgroup.controllers`.
    pub fn unified_controllers(&self) -> &[String] {
        &self.unified_controllers
    }

    /// Where `controller` lives, or `None` if the host does not offer it.
    ///
    /// A v1 mount wins over the cgroup2 mount; the kernel lists a controller in only one.
    pub fn backend(&self, controller: Controller) -> Option<Backend<'_>> {
        if let Some((_, mount)) = self.v1.iter().find(|(c, _)| *c == controller) {
            return Some(Backend::V1(mount));
        }
        let unified = self.unified.as_deref()?;
        let enabled = controller.core_in_v2()
            || self
                .unified_controllers
                .iter()
                .any(|c| c == controller.name());
        enabled.then_some(Backend::V2(unified))
    }

    /// Whether the host offers `controller`.
    pub fn has(&self, controller: Controller) -> bool {
        self.backend(controller).is_some()
    }

    /// Every mount a slot spans: the cgroup2 mount first, then each distinct v1 mount.
    pub fn mounts(&self) -> Vec<&Path> {
        let mut mounts: Vec<&Path> = self.unified.as_deref().into_iter().collect();
        for (_, mount) in &self.v1 {
            if !mounts.contains(&mount.as_path()) {
                mounts.push(mount);
            }
        }
        mounts
    }

    /// The controllers to enable in `cgroup.subtree_control` on the way down to a slot in the
    /// cgroup2 mount: those of cpu, memory and pids that it offers.
    pub(crate) fn v2_domain_controllers(&self) -> Vec<&'static str> {
        [Controller::Cpu, Controller::Memory, Controller::Pids]
            .into_iter()
            .filter(|c| matches!(self.backend(*c), Some(Backend::V2(_))))
            .map(Controller::name)
            .collect()
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}
