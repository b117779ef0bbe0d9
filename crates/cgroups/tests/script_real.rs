#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The bash snippets, run by real `bash` against this machine's real cgroupfs, as the executor
//! runs them on an instance over SSH.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{TestParent, bash, is_dead, read, wait_until};
use slipway_cgroups::script::{self, ScriptRoot};
use slipway_cgroups::{Controller, Hierarchy, Limits, SlotCgroup, SlotPath};

// Generous: these tests check what cleanup does, not how fast, on a machine busy with other
// tests (a kill round under load can take seconds).
const CLEANUP: Duration = Duration::from_secs(30);

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn root_of(parent: &TestParent) -> ScriptRoot {
    ScriptRoot::new(parent.hierarchy.root().to_str().unwrap()).unwrap()
}

/// Start `bash -c "<enter prologue> body"` in the background.
fn spawn_entered(root: &ScriptRoot, path: &SlotPath, body: &str) -> std::process::Child {
    Command::new("bash")
        .arg("-c")
        .arg(format!("{}{body}", script::enter(root, path)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[test]
fn create_enter_cleanup_on_real_hierarchy() {
    let mut parent = TestParent::detect("script");
    let root = root_of(&parent);
    let path = parent.template.expand(0);
    let limits = Limits {
        cpu: Some(0.5),
        memory_bytes: Some(96 << 20),
        pids: Some(32),
    };
    ok(&bash(&script::create(&root, &path, &limits).unwrap()));

    // The Rust side sees exactly the slot the script made.
    let slot = SlotCgroup::open(&parent.hierarchy, path.clone());
    for dir in slot.dirs() {
        assert!(dir.is_dir(), "{}", dir.display());
    }
    let cpu = slot.dir(Controller::Cpu).unwrap();
    if cpu.join("cpu.max").exists() {
        assert_eq!(read(&cpu.join("cpu.max")), "50000 100000");
    } else {
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
    }
    let mem = slot.dir(Controller::Memory).unwrap();
    let mem_file = if mem.join("memory.max").exists() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    assert_eq!(read(&mem.join(mem_file)), (96u64 << 20).to_string());
    assert_eq!(
        read(&slot.dir(Controller::Pids).unwrap().join("pids.max")),
        "32"
    );

    // A step script whose prologue enters the slot, leaving a setsid daemon behind.
    let step = spawn_entered(
        &root,
        &path,
        "setsid sleep 300 </dev/null >/dev/null 2>&1 & exec sleep 300",
    );
    let step_pid = parent.adopt(step);
    assert!(wait_until(Duration::from_secs(5), || slot
        .pids()
        .unwrap()
        .len()
        == 2));
    let pids = slot.pids().unwrap();
    assert!(pids.contains(&step_pid));

    let out = ok(&bash(&script::cleanup(&root, &path, CLEANUP)));
    assert_eq!(script::parse_oom_kills(&out), Some(0), "{out}");
    assert!(out.contains(&format!("cleaned {path}")));
    assert!(!slot.exists());
    for pid in pids {
        assert!(
            wait_until(Duration::from_secs(2), || is_dead(pid)),
            "{pid} alive"
        );
    }
    assert_eq!(parent.take(step_pid).wait().unwrap().signal(), Some(9));

    // Cleaning a slot that is gone is fine.
    let out = ok(&bash(&script::cleanup(&root, &path, CLEANUP)));
    assert_eq!(script::parse_oom_kills(&out), Some(0));
}

#[test]
fn cleanup_script_reports_oom_kill() {
    let mut parent = TestParent::detect("script-oom");
    let root = root_of(&parent);
    let path = parent.template.expand(0);
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        ..Limits::NONE
    };
    ok(&bash(&script::create(&root, &path, &limits).unwrap()));
    let hog = spawn_entered(&root, &path, "exec tail /dev/zero");
    let hog_pid = parent.adopt(hog);
    let status = parent.take(hog_pid).wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let out = ok(&bash(&script::cleanup(&root, &path, CLEANUP)));
    assert!(script::parse_oom_kills(&out).unwrap() >= 1, "{out}");
}

#[test]
fn create_script_cleans_a_stale_slot() {
    let mut parent = TestParent::detect("script-stale");
    let root = root_of(&parent);
    let path = parent.template.expand(2);
    ok(&bash(&script::create(&root, &path, &Limits::NONE).unwrap()));
    let orphan = parent.adopt(spawn_entered(&root, &path, "exec sleep 300"));
    let slot = SlotCgroup::open(&parent.hierarchy, path.clone());
    assert!(wait_until(Duration::from_secs(5), || slot.pids().unwrap()
        == vec![orphan]));

    let limits = Limits {
        pids: Some(5),
        ..Limits::NONE
    };
    ok(&bash(&script::create(&root, &path, &limits).unwrap()));
    assert!(slot.pids().unwrap().is_empty());
    assert_eq!(parent.take(orphan).wait().unwrap().signal(), Some(9));
    assert_eq!(
        read(&slot.dir(Controller::Pids).unwrap().join("pids.max")),
        "5"
    );
}

#[test]
fn cleanup_script_refuses_to_kill_its_own_shell() {
    let parent = TestParent::detect("script-self");
    let root = root_of(&parent);
    let path = parent.template.expand(0);
    ok(&bash(&script::create(&root, &path, &Limits::NONE).unwrap()));
    let out = bash(&format!(
        "{}{}",
        script::enter(&root, &path),
        script::cleanup(&root, &path, CLEANUP)
    ));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to clean up"), "{stderr}");
    // The parent's drop guard removes the (now empty) slot.
}

#[test]
fn scripts_on_the_cgroup2_mount_use_cgroup_kill() {
    let unified = Hierarchy::detect()
        .unwrap()
        .unified()
        .unwrap()
        .to_path_buf();
    let parent = TestParent::new(Hierarchy::at(&unified).unwrap(), "script-v2");
    let root = ScriptRoot::new(unified.to_str().unwrap()).unwrap();
    let path = parent.template.expand(0);
    ok(&bash(&script::create(&root, &path, &Limits::NONE).unwrap()));
    let slot = SlotCgroup::open(&parent.hierarchy, path.clone());
    assert_eq!(slot.dirs(), vec![unified.join(path.as_str())]);

    // A daemon that forks on and on; cgroup.kill takes the whole tree at once.
    let out = ok(&bash(&format!(
        "{}setsid bash -c 'while :; do sleep 1 & wait; done' </dev/null >/dev/null 2>&1 &\necho $!",
        script::enter(&root, &path)
    )));
    let daemon: u32 = out.trim().parse().unwrap();
    assert!(wait_until(Duration::from_secs(5), || slot
        .pids()
        .unwrap()
        .contains(&daemon)));
    let out = ok(&bash(&script::cleanup(&root, &path, CLEANUP)));
    assert!(out.contains("oom_kills=0"), "{out}");
    assert!(wait_until(Duration::from_secs(2), || is_dead(daemon)));
    assert!(!slot.exists());
}

#[test]
fn sweep_script_removes_stale_slots() {
    let parent = TestParent::detect("script-sweep");
    let root = root_of(&parent);
    for n in [0, 1, 7] {
        let path = parent.template.expand(n);
        ok(&bash(&script::create(&root, &path, &Limits::NONE).unwrap()));
        ok(&bash(&format!(
            "{}setsid sleep 300 </dev/null >/dev/null 2>&1 &",
            script::enter(&root, &path)
        )));
    }
    let out = ok(&bash(&script::sweep(
        &root,
        &parent.template,
        &[1],
        CLEANUP,
    )));
    let mut cleaned: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix(script::REPORT_PREFIX))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    cleaned.sort_unstable();
    assert_eq!(
        cleaned,
        vec![
            format!("{}/slot-0", parent.name),
            format!("{}/slot-7", parent.name)
        ]
    );
    let kept = SlotCgroup::open(&parent.hierarchy, parent.template.expand(1));
    assert_eq!(kept.pids().unwrap().len(), 1);
    assert!(!SlotCgroup::open(&parent.hierarchy, parent.template.expand(0)).exists());
    assert!(!SlotCgroup::open(&parent.hierarchy, parent.template.expand(7)).exists());
}
