#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Tests on temporary directories laid out like cgroupfs (youki's fixture pattern): detection,
//! paths and the files written for limits on v2, v1 and hybrid layouts, and that the bash
//! scripts write exactly what the Rust code writes.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use slipway_cgroups::script::{self, ScriptRoot};
use slipway_cgroups::{
    Backend, CgroupError, Controller, Hierarchy, Limits, Mode, SlotCgroup, SlotTemplate,
};
use tempfile::TempDir;

const V1_CONTROLLERS: [&str; 5] = ["cpu", "cpuacct", "memory", "pids", "freezer"];

fn set_fixture(dir: &Path, file: &str, content: &str) {
    let path = dir.join(file);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

/// A cgroup v2 root offering `controllers`.
fn v2_fixture(controllers: &str) -> TempDir {
    let tmp = TempDir::new().unwrap();
    set_fixture(tmp.path(), "cgroup.controllers", controllers);
    set_fixture(tmp.path(), "cgroup.subtree_control", "");
    set_fixture(tmp.path(), "cgroup.procs", "");
    tmp
}

/// This machine's layout: v1 controllers with swap accounting plus a hugetlb-only cgroup2 mount.
fn hybrid_fixture() -> TempDir {
    let tmp = TempDir::new().unwrap();
    for c in V1_CONTROLLERS {
        set_fixture(tmp.path(), &format!("{c}/cgroup.procs"), "");
    }
    set_fixture(
        tmp.path(),
        "memory/memory.memsw.limit_in_bytes",
        "9223372036854771712",
    );
    set_fixture(tmp.path(), "unified/cgroup.controllers", "hugetlb");
    set_fixture(tmp.path(), "unified/cgroup.procs", "");
    tmp
}

fn limits() -> Limits {
    Limits {
        cpu: Some(0.5),
        memory_bytes: Some(64 << 20),
        pids: Some(100),
    }
}

fn slot_path(n: u32) -> slipway_cgroups::SlotPath {
    SlotTemplate::default().expand(n)
}

/// Every file under `root` with its content, keyed by relative path.
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn detects_unified_layout() {
    let tmp = v2_fixture("cpuset cpu io memory hugetlb pids");
    let h = Hierarchy::at(tmp.path()).unwrap();
    assert_eq!(h.mode(), Mode::Unified);
    assert_eq!(h.unified(), Some(tmp.path()));
    assert_eq!(h.mounts(), vec![tmp.path()]);
    for c in Controller::ALL {
        assert_eq!(h.backend(c), Some(Backend::V2(tmp.path())), "{c}");
    }
}

#[test]
fn unified_without_controllers_still_has_freeze_and_stats() {
    let tmp = v2_fixture("hugetlb");
    let h = Hierarchy::at(tmp.path()).unwrap();
    assert!(!h.has(Controller::Cpu));
    assert!(!h.has(Controller::Memory));
    assert!(!h.has(Controller::Pids));
    assert!(h.has(Controller::Freezer));
    assert!(h.has(Controller::Cpuacct));
}

#[test]
fn detects_hybrid_and_legacy_layouts() {
    let tmp = hybrid_fixture();
    let root = fs::canonicalize(tmp.path()).unwrap();
    let h = Hierarchy::at(tmp.path()).unwrap();
    assert_eq!(h.mode(), Mode::Hybrid);
    assert_eq!(h.unified(), Some(tmp.path().join("unified").as_path()));
    assert_eq!(h.unified_controllers(), ["hugetlb".to_string()]);
    for c in Controller::ALL {
        assert_eq!(
            h.backend(c),
            Some(Backend::V1(&root.join(c.name()))),
            "{c} lives in its v1 hierarchy"
        );
    }
    assert_eq!(h.mounts().len(), 6);
    assert_eq!(h.mounts()[0], tmp.path().join("unified"));

    let legacy = h.clone().without_unified();
    assert_eq!(legacy.mode(), Mode::Legacy);
    assert_eq!(legacy.mounts().len(), 5);

    fs::remove_dir_all(tmp.path().join("unified")).unwrap();
    assert_eq!(Hierarchy::at(tmp.path()).unwrap().mode(), Mode::Legacy);
}

#[test]
fn co_mounted_v1_controllers_are_one_mount() {
    let tmp = TempDir::new().unwrap();
    set_fixture(tmp.path(), "cpu,cpuacct/cgroup.procs", "");
    set_fixture(tmp.path(), "memory/cgroup.procs", "");
    std::os::unix::fs::symlink("cpu,cpuacct", tmp.path().join("cpu")).unwrap();
    std::os::unix::fs::symlink("cpu,cpuacct", tmp.path().join("cpuacct")).unwrap();
    let h = Hierarchy::at(tmp.path()).unwrap();
    let root = fs::canonicalize(tmp.path()).unwrap();
    assert_eq!(
        h.mounts(),
        vec![root.join("cpu,cpuacct"), root.join("memory")]
    );
    assert_eq!(
        h.backend(Controller::Cpuacct),
        Some(Backend::V1(&root.join("cpu,cpuacct")))
    );
    assert!(!h.has(Controller::Pids));
    assert!(!h.has(Controller::Freezer));
}

#[test]
fn empty_root_is_no_hierarchy() {
    let tmp = TempDir::new().unwrap();
    let err = Hierarchy::at(tmp.path()).unwrap_err();
    assert!(matches!(err, CgroupError::NoHierarchy { .. }), "{err}");
}

#[test]
fn v2_create_writes_limits_and_delegates_controllers() {
    let tmp = v2_fixture("cpuset cpu io memory pids");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(3), &limits()).unwrap();
    let dir = tmp.path().join("slipway/slot-3");
    assert_eq!(slot.dirs(), vec![dir.clone()]);
    assert_eq!(slot.path().as_str(), "slipway/slot-3");
    let t = tree(tmp.path());
    let get = |p: &str| t.get(Path::new(p)).map(String::as_str);
    assert_eq!(get("cgroup.subtree_control"), Some("+cpu +memory +pids"));
    assert_eq!(
        get("slipway/cgroup.subtree_control"),
        Some("+cpu +memory +pids")
    );
    assert_eq!(get("slipway/slot-3/cgroup.subtree_control"), None);
    assert_eq!(get("slipway/slot-3/cpu.max"), Some("50000 100000"));
    assert_eq!(get("slipway/slot-3/memory.max"), Some("67108864"));
    assert_eq!(get("slipway/slot-3/memory.oom.group"), Some("1"));
    assert_eq!(get("slipway/slot-3/pids.max"), Some("100"));
    assert_eq!(get("slipway/slot-3/memory.swap.max"), None);
}

#[test]
fn v2_enables_only_missing_and_available_controllers() {
    let tmp = v2_fixture("cpu memory");
    set_fixture(tmp.path(), "cgroup.subtree_control", "cpu");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let only_cpu = Limits {
        cpu: Some(1.5),
        ..Limits::NONE
    };
    SlotCgroup::create(&h, slot_path(0), &only_cpu).unwrap();
    let t = tree(tmp.path());
    assert_eq!(t[Path::new("cgroup.subtree_control")], "+memory");
    assert_eq!(
        t[Path::new("slipway/cgroup.subtree_control")],
        "+cpu +memory"
    );
    assert_eq!(t[Path::new("slipway/slot-0/cpu.max")], "150000 100000");
    assert!(!t.contains_key(Path::new("slipway/slot-0/pids.max")));
}

#[test]
fn v2_swap_limited_where_present() {
    let tmp = v2_fixture("memory");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::open(&h, slot_path(1));
    set_fixture(&slot.dirs()[0], "memory.swap.max", "max");
    slot.set_limits(&Limits {
        memory_bytes: Some(1 << 30),
        ..Limits::NONE
    })
    .unwrap();
    assert_eq!(
        common::read(&slot.dirs()[0].join("memory.max")),
        "1073741824"
    );
    assert_eq!(common::read(&slot.dirs()[0].join("memory.swap.max")), "0");
}

#[test]
fn missing_controller_fails_before_creating_anything() {
    let tmp = v2_fixture("hugetlb");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let err = SlotCgroup::create(&h, slot_path(0), &limits()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::ControllerUnavailable {
                controller: "cpu",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("controller cpu is not available"));
    assert!(!tmp.path().join("slipway").exists());
    // Without limits the slot is fine: kill and freeze need no controller.
    SlotCgroup::create(&h, slot_path(0), &Limits::NONE).unwrap();
    assert!(tmp.path().join("slipway/slot-0").is_dir());
}

#[test]
fn invalid_limits_rejected() {
    let tmp = v2_fixture("cpu");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let err = SlotCgroup::create(
        &h,
        slot_path(0),
        &Limits {
            cpu: Some(f64::NAN),
            ..Limits::NONE
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("invalid cpu limit NaN"),
        "{err}"
    );
}

#[test]
fn v1_create_writes_each_hierarchy() {
    let tmp = hybrid_fixture();
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(2), &limits()).unwrap();
    assert_eq!(slot.dirs().len(), 6);
    for dir in slot.dirs() {
        assert!(dir.is_dir(), "{}", dir.display());
    }
    let t = tree(tmp.path());
    let get = |p: &str| t.get(Path::new(p)).map(String::as_str);
    assert_eq!(get("cpu/slipway/slot-2/cpu.cfs_period_us"), Some("100000"));
    assert_eq!(get("cpu/slipway/slot-2/cpu.cfs_quota_us"), Some("50000"));
    assert_eq!(
        get("memory/slipway/slot-2/memory.limit_in_bytes"),
        Some("67108864")
    );
    assert_eq!(
        get("memory/slipway/slot-2/memory.memsw.limit_in_bytes"),
        Some("67108864")
    );
    assert_eq!(get("pids/slipway/slot-2/pids.max"), Some("100"));
    // No v2 controllers to delegate on this layout, and no v2 limit files.
    assert_eq!(get("unified/cgroup.subtree_control"), None);
    assert_eq!(get("memory/slipway/slot-2/memory.oom.group"), None);
    assert_eq!(
        slot.dir(Controller::Pids),
        Some(
            fs::canonicalize(tmp.path())
                .unwrap()
                .join("pids/slipway/slot-2")
        )
    );
}

#[test]
fn v1_without_swap_accounting_skips_memsw() {
    let tmp = hybrid_fixture();
    fs::remove_file(tmp.path().join("memory/memory.memsw.limit_in_bytes")).unwrap();
    let h = Hierarchy::at(tmp.path()).unwrap();
    SlotCgroup::create(&h, slot_path(0), &limits()).unwrap();
    let t = tree(tmp.path());
    assert!(t.contains_key(Path::new("memory/slipway/slot-0/memory.limit_in_bytes")));
    assert!(!t.contains_key(Path::new(
        "memory/slipway/slot-0/memory.memsw.limit_in_bytes"
    )));
}

#[test]
fn write_errors_name_path_and_value() {
    let tmp = v2_fixture("cpu");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::open(&h, slot_path(0));
    // A directory where the interface file should be: the write fails.
    fs::create_dir_all(slot.dirs()[0].join("cpu.max")).unwrap();
    let err = slot
        .set_limits(&Limits {
            cpu: Some(0.5),
            ..Limits::NONE
        })
        .unwrap_err();
    let msg = err.to_string();
    let expected = format!(
        "cannot write 50000 100000 to {}: ",
        slot.dirs()[0].join("cpu.max").display()
    );
    assert!(msg.starts_with(&expected), "{msg}");
}

#[test]
fn add_pid_writes_every_mount() {
    let tmp = hybrid_fixture();
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(0), &Limits::NONE).unwrap();
    slot.add_pid(4242).unwrap();
    for dir in slot.dirs() {
        assert_eq!(common::read(&dir.join("cgroup.procs")), "4242");
    }
    assert_eq!(slot.pids().unwrap().len(), 1);
}

#[test]
fn stats_read_v1_and_v2_files() {
    let tmp = hybrid_fixture();
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(0), &Limits::NONE).unwrap();
    let mem = slot.dir(Controller::Memory).unwrap();
    set_fixture(
        &mem,
        "memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    );
    set_fixture(&mem, "memory.usage_in_bytes", "1000\n");
    set_fixture(&mem, "memory.max_usage_in_bytes", "2000\n");
    set_fixture(
        &slot.dir(Controller::Cpuacct).unwrap(),
        "cpuacct.usage",
        "1500000000\n",
    );
    set_fixture(
        &slot.dir(Controller::Pids).unwrap(),
        "cgroup.procs",
        "7\n8\n",
    );
    let stats = slot.stats().unwrap();
    assert_eq!(stats.oom_kills, 3);
    assert_eq!(stats.memory_current, Some(1000));
    assert_eq!(stats.memory_peak, Some(2000));
    assert_eq!(
        stats.cpu_usage,
        Some(std::time::Duration::from_millis(1500))
    );
    assert_eq!(stats.processes, 2);

    let tmp = v2_fixture("cpu memory pids");
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(0), &Limits::NONE).unwrap();
    let dir = &slot.dirs()[0];
    set_fixture(
        dir,
        "memory.events",
        "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\noom_group_kill 1\n",
    );
    set_fixture(
        dir,
        "cpu.stat",
        "usage_usec 250000\nuser_usec 200000\nsystem_usec 50000\n",
    );
    set_fixture(dir, "memory.current", "4096\n");
    let stats = slot.stats().unwrap();
    assert_eq!(stats.oom_kills, 1);
    assert_eq!(stats.cpu_usage, Some(std::time::Duration::from_millis(250)));
    assert_eq!(stats.memory_current, Some(4096));
    assert_eq!(stats.memory_peak, None);

    set_fixture(dir, "memory.events", "oom_kill lots\n");
    let err = slot.oom_kills().unwrap_err();
    assert!(
        err.to_string().contains("cannot parse oom_kill count from"),
        "{err}"
    );
}

#[test]
fn prologue_and_command_enter_every_mount() {
    let tmp = hybrid_fixture();
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(0), &Limits::NONE).unwrap();
    let out = common::bash(&format!("{}echo $$", slot.shell_prologue()));
    assert!(out.status.success());
    let pid = String::from_utf8(out.stdout).unwrap().trim().to_string();
    for dir in slot.dirs() {
        assert_eq!(common::read(&dir.join("cgroup.procs")), pid);
    }
    let out = slot
        .command("sh")
        .arg("-c")
        .arg("echo $$")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success());
    let pid = String::from_utf8(out.stdout).unwrap().trim().to_string();
    for dir in slot.dirs() {
        assert_eq!(common::read(&dir.join("cgroup.procs")), pid);
    }
    // A prologue that cannot enter stops the script.
    fs::remove_dir_all(tmp.path().join("unified")).unwrap();
    let out = common::bash(&format!("{}echo survived", slot.shell_prologue()));
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("survived"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot enter slot cgroup slipway/slot-0")
    );
}

/// The script run with real bash on one fixture writes the same files as the Rust code on a
/// twin fixture.
fn assert_script_mirrors_rust(make: fn() -> TempDir, limits: &Limits) {
    let rust = make();
    let bash = make();
    let h = Hierarchy::at(rust.path()).unwrap();
    SlotCgroup::create(&h, slot_path(5), limits).unwrap();
    let root = ScriptRoot::new(bash.path().to_str().unwrap()).unwrap();
    let out = common::bash(&script::create(&root, &slot_path(5), limits).unwrap());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(bash.path()), tree(rust.path()));
}

#[test]
fn create_script_mirrors_rust_on_v2() {
    assert_script_mirrors_rust(|| v2_fixture("cpuset cpu io memory pids"), &limits());
    assert_script_mirrors_rust(|| v2_fixture("cpu memory pids"), &Limits::NONE);
    assert_script_mirrors_rust(
        || v2_fixture("memory pids"),
        &Limits {
            pids: Some(7),
            ..Limits::NONE
        },
    );
}

#[test]
fn create_script_mirrors_rust_on_hybrid_and_legacy() {
    assert_script_mirrors_rust(hybrid_fixture, &limits());
    assert_script_mirrors_rust(
        || {
            let tmp = hybrid_fixture();
            fs::remove_dir_all(tmp.path().join("unified")).unwrap();
            fs::remove_file(tmp.path().join("memory/memory.memsw.limit_in_bytes")).unwrap();
            tmp
        },
        &Limits {
            cpu: Some(3.0),
            memory_bytes: Some(1 << 30),
            pids: None,
        },
    );
}

#[test]
fn create_script_fails_on_missing_controller() {
    let tmp = v2_fixture("hugetlb");
    let root = ScriptRoot::new(tmp.path().to_str().unwrap()).unwrap();
    let out = common::bash(&script::create(&root, &slot_path(0), &limits()).unwrap());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("slipway-cgroup: cannot limit cpu: controller cpu is not available"),
        "{stderr}"
    );
    assert!(!tmp.path().join("slipway").exists());
}

#[test]
fn enter_script_moves_the_shell_on_fixture() {
    let tmp = hybrid_fixture();
    let h = Hierarchy::at(tmp.path()).unwrap();
    let slot = SlotCgroup::create(&h, slot_path(0), &Limits::NONE).unwrap();
    let root = ScriptRoot::new(tmp.path().to_str().unwrap()).unwrap();
    // The prologue must not leak variables or options into the job's shell.
    let out = common::bash(&format!(
        "set -eu\n{}echo \"$$ ${{_sw_dirs:-clean}}\"",
        script::enter(&root, slot.path())
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (pid, leak) = stdout.trim().split_once(' ').unwrap();
    assert_eq!(leak, "clean");
    for dir in slot.dirs() {
        assert_eq!(common::read(&dir.join("cgroup.procs")), pid);
    }
}
