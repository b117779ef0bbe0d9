#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Slot cgroups on this machine's real hierarchy (run as root): limits are enforced, cleanup
//! kills everything, stale slots are cleaned. Each test uses its own parent cgroup, swept on
//! drop even when the test fails.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{TestParent, is_dead, read, spawn_in, wait_until};
use slipway_cgroups::{CgroupError, Controller, Hierarchy, Limits, Mode, SlotCgroup, sweep};

const MIB: u64 = 1 << 20;
// Generous: these tests check what cleanup does, not how fast, on a machine busy with other
// tests (a kill round under load can take seconds).
const CLEANUP: Duration = Duration::from_secs(30);

#[test]
fn detects_this_host() {
    let h = Hierarchy::detect().unwrap();
    // Whatever the layout, every limit a slot needs must be available.
    for c in Controller::ALL {
        assert!(h.has(c), "{c} missing in {h:?}");
    }
    if h.mode() == Mode::Hybrid {
        assert_eq!(
            h.unified(),
            Some(std::path::Path::new("/sys/fs/cgroup/unified"))
        );
    }
}

#[test]
fn memory_hog_is_oom_killed_and_reported_while_neighbour_finishes() {
    let mut parent = TestParent::detect("oom");
    let limits = Limits {
        memory_bytes: Some(64 * MIB),
        ..Limits::NONE
    };
    let hog_slot =
        SlotCgroup::create(&parent.hierarchy, parent.template.expand(0), &limits).unwrap();
    let calm_slot =
        SlotCgroup::create(&parent.hierarchy, parent.template.expand(1), &limits).unwrap();
    if let Some(memsw) = hog_slot
        .dir(Controller::Memory)
        .map(|d| d.join("memory.memsw.limit_in_bytes"))
        .filter(|p| p.exists())
    {
        assert_eq!(read(&memsw), (64 * MIB).to_string());
    }

    // `tail` buffers a never-ending line; python holds 24 MiB it really touches.
    let hog = spawn_in(&hog_slot, "exec tail /dev/zero");
    let calm = spawn_in(
        &calm_slot,
        "python3 -c 'b = bytearray(24 << 20); import time; time.sleep(1.5); print(len(b))' >/dev/null",
    );
    let hog_pid = parent.adopt(hog);
    let calm_pid = parent.adopt(calm);

    let hog_status = parent.take(hog_pid).wait().unwrap();
    assert_eq!(
        hog_status.signal(),
        Some(9),
        "hog ended with {hog_status:?}"
    );
    let calm_status = parent.take(calm_pid).wait().unwrap();
    assert!(
        calm_status.success(),
        "neighbour ended with {calm_status:?}"
    );

    assert!(hog_slot.oom_kills().unwrap() >= 1);
    assert_eq!(calm_slot.oom_kills().unwrap(), 0);
    let peak = calm_slot.stats().unwrap().memory_peak.unwrap();
    assert!(
        (24 * MIB..=64 * MIB).contains(&peak),
        "neighbour peak {peak}"
    );

    let report = hog_slot.cleanup(CLEANUP).unwrap();
    assert!(report.oom_kills >= 1, "{report:?}");
    assert!(report.existed);
    let report = calm_slot.cleanup(CLEANUP).unwrap();
    assert_eq!(report.oom_kills, 0);
    assert!(!hog_slot.exists() && !calm_slot.exists());
}

#[test]
fn fork_bomb_stops_at_pids_max() {
    let mut parent = TestParent::detect("forkbomb");
    let limits = Limits {
        pids: Some(16),
        ..Limits::NONE
    };
    let slot = SlotCgroup::create(&parent.hierarchy, parent.template.expand(0), &limits).unwrap();
    let pids_dir = slot.dir(Controller::Pids).unwrap();
    assert_eq!(read(&pids_dir.join("pids.max")), "16");

    // Bounded bomb: 200 sleepers wanted, at most 16 tasks allowed (bash retries failed forks).
    let bomb = spawn_in(
        &slot,
        "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; wait",
    );
    parent.adopt(bomb);
    let full = wait_until(Duration::from_secs(15), || {
        read(&pids_dir.join("pids.current")) == "16"
    });
    assert!(
        full,
        "pids.current = {}",
        read(&pids_dir.join("pids.current"))
    );
    thread::sleep(Duration::from_millis(300));
    assert_eq!(read(&pids_dir.join("pids.current")), "16");
    assert!(slot.pids().unwrap().len() <= 16);
    // The kernel counted refused forks.
    let events = std::fs::read_to_string(pids_dir.join("pids.events")).unwrap();
    let refused: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(refused > 0, "{events}");

    // The machine is fine: this process can still fork.
    assert!(Command::new("true").status().unwrap().success());

    let started = Instant::now();
    let report = slot.cleanup(CLEANUP).unwrap();
    assert!(
        report.leftover.len() >= 2 && report.leftover.len() <= 16,
        "{report:?}"
    );
    assert!(started.elapsed() < CLEANUP);
    assert!(!slot.exists());
    for pid in report.leftover {
        assert!(
            wait_until(Duration::from_secs(2), || is_dead(pid)),
            "{pid} alive"
        );
    }
}

#[test]
fn busy_loop_is_held_to_half_a_cpu() {
    let mut parent = TestParent::detect("cpu");
    let limits = Limits {
        cpu: Some(0.5),
        ..Limits::NONE
    };
    let slot = SlotCgroup::create(&parent.hierarchy, parent.template.expand(0), &limits).unwrap();
    let cpu_dir = slot.dir(Controller::Cpu).unwrap();
    if cpu_dir.join("cpu.max").exists() {
        assert_eq!(read(&cpu_dir.join("cpu.max")), "50000 100000");
    } else {
        assert_eq!(read(&cpu_dir.join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(&cpu_dir.join("cpu.cfs_period_us")), "100000");
    }
    parent.adopt(spawn_in(&slot, "while :; do :; done"));
    thread::sleep(Duration::from_millis(500));

    let usage = || slot.stats().unwrap().cpu_usage.unwrap();
    let (t0, u0) = (Instant::now(), usage());
    thread::sleep(Duration::from_secs(5));
    let (t1, u1) = (Instant::now(), usage());
    let cpus = (u1 - u0).as_secs_f64() / (t1 - t0).as_secs_f64();
    eprintln!("busy loop in a 0.5-CPU slot got {cpus:.3} CPU");
    // The quota is a ceiling: on a loaded machine the loop may get less, never more.
    assert!(
        cpus <= 0.6,
        "busy loop got {cpus:.3} CPU, above its 0.5 quota"
    );
    assert!(
        cpus > 0.05,
        "busy loop got {cpus:.3} CPU: did it run at all?"
    );
    // The kernel says it held the loop back, which a loop that merely lost the CPU to others is not.
    let throttled = read(&cpu_dir.join("cpu.stat"))
        .lines()
        .find_map(|l| {
            l.strip_prefix("nr_throttled ")
                .map(|n| n.trim().parse::<u64>())
        })
        .expect("cpu.stat has nr_throttled")
        .unwrap();
    assert!(
        throttled > 0,
        "the slot's quota never throttled the busy loop"
    );

    slot.cleanup(CLEANUP).unwrap();
    assert!(!slot.exists());
}

/// Start a `setsid` daemon in `slot` from a shell that exits at once; return the daemon's pid.
fn start_daemon(parent: &mut TestParent, slot: &SlotCgroup) -> u32 {
    let pid_file = std::env::temp_dir().join(format!(
        "{}-{}.pid",
        parent.name,
        slot.path().as_str().replace('/', "-")
    ));
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 300' </dev/null >/dev/null 2>&1 & exit 0",
        pid_file.display()
    );
    let mut launcher = spawn_in(slot, &script);
    assert!(launcher.wait().unwrap().success());
    assert!(wait_until(Duration::from_secs(5), || pid_file.exists()
        && !read(&pid_file).is_empty()));
    let pid: u32 = read(&pid_file).parse().unwrap();
    let _ = std::fs::remove_file(&pid_file);
    // A session leader of its own, re-parented away from us, but still in the slot.
    let sid = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid as i32))).unwrap();
    assert_eq!(sid.as_raw(), pid as i32);
    assert!(slot.pids().unwrap().contains(&pid));
    pid
}

#[test]
fn setsid_daemon_is_gone_after_cleanup() {
    let mut parent = TestParent::detect("setsid");
    let slot =
        SlotCgroup::create(&parent.hierarchy, parent.template.expand(0), &Limits::NONE).unwrap();
    let daemon = start_daemon(&mut parent, &slot);
    let report = slot.cleanup(CLEANUP).unwrap();
    assert_eq!(report.leftover, vec![daemon]);
    assert!(wait_until(Duration::from_secs(2), || is_dead(daemon)));
    assert!(!slot.exists());
}

#[test]
fn setsid_daemon_is_gone_after_cleanup_by_freezer_on_v1_alone() {
    let h = Hierarchy::detect().unwrap().without_unified();
    let mut parent = TestParent::new(h, "setsid-v1");
    let slot =
        SlotCgroup::create(&parent.hierarchy, parent.template.expand(0), &Limits::NONE).unwrap();
    assert!(
        slot.dirs()
            .iter()
            .all(|d| !d.starts_with("/sys/fs/cgroup/unified"))
    );
    let daemon = start_daemon(&mut parent, &slot);
    // A second generation, forking while we kill.
    parent.adopt(spawn_in(&slot, "while :; do sleep 0.01 & wait; done"));
    let report = slot.cleanup(CLEANUP).unwrap();
    assert!(report.leftover.contains(&daemon));
    assert!(wait_until(Duration::from_secs(2), || is_dead(daemon)));
    assert!(!slot.exists());
}

#[test]
fn cgroup2_mount_alone_works_as_a_v2_hierarchy() {
    // The hybrid host's cgroup2 mount: real cgroup.kill / cgroup.freeze, no limit controllers.
    let Some(unified) = Hierarchy::detect()
        .unwrap()
        .unified()
        .map(|p| p.to_path_buf())
    else {
        panic!("this host has no cgroup2 mount");
    };
    let h = Hierarchy::at(&unified).unwrap();
    if unified != std::path::Path::new("/sys/fs/cgroup") {
        assert_eq!(h.mode(), Mode::Unified);
    }
    let mut parent = TestParent::new(h, "v2");
    let path = parent.template.expand(0);
    let slot = SlotCgroup::create(&parent.hierarchy, path.clone(), &Limits::NONE).unwrap();
    assert_eq!(slot.dirs(), vec![unified.join(path.as_str())]);

    // A job that makes its own child cgroup and a daemon in it: cleanup removes children first.
    let child_cg = slot.dirs()[0].join("job-sub");
    std::fs::create_dir(&child_cg).unwrap();
    let daemon = start_daemon(&mut parent, &slot);
    std::fs::write(child_cg.join("cgroup.procs"), daemon.to_string()).unwrap();
    parent.adopt(spawn_in(&slot, "sleep 300"));
    assert!(wait_until(Duration::from_secs(2), || slot
        .pids()
        .unwrap()
        .len()
        == 2));

    let report = slot.cleanup(CLEANUP).unwrap();
    assert_eq!(report.leftover.len(), 2);
    assert!(wait_until(Duration::from_secs(2), || is_dead(daemon)));
    assert!(!slot.exists());
}

#[test]
fn limits_needing_absent_controllers_fail_on_real_cgroup2_mount() {
    let unified = Hierarchy::detect()
        .unwrap()
        .unified()
        .unwrap()
        .to_path_buf();
    let h = Hierarchy::at(&unified).unwrap();
    if h.has(Controller::Memory) {
        return; // A full v2 host offers memory; this checks the hugetlb-only mount.
    }
    let parent = TestParent::new(h, "v2-nomem");
    let err = SlotCgroup::create(
        &parent.hierarchy,
        parent.template.expand(0),
        &Limits {
            memory_bytes: Some(MIB),
            ..Limits::NONE
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::ControllerUnavailable {
                controller: "memory",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn stale_slot_is_cleaned_when_recreated() {
    let mut parent = TestParent::detect("stale");
    let path = parent.template.expand(4);
    let crashed = SlotCgroup::create(&parent.hierarchy, path.clone(), &Limits::NONE).unwrap();
    let orphan = parent.adopt(spawn_in(&crashed, "sleep 300"));
    assert!(wait_until(Duration::from_secs(2), || crashed
        .pids()
        .unwrap()
        == vec![orphan]));
    drop(crashed); // the manager crashed; the cgroup and its process stay

    let limits = Limits {
        pids: Some(10),
        ..Limits::NONE
    };
    let fresh = SlotCgroup::create(&parent.hierarchy, path, &limits).unwrap();
    assert!(fresh.pids().unwrap().is_empty());
    let status = parent.take(orphan).wait().unwrap();
    assert_eq!(status.signal(), Some(9));
    assert_eq!(
        read(&fresh.dir(Controller::Pids).unwrap().join("pids.max")),
        "10"
    );

    // Cleanup is idempotent.
    assert!(fresh.cleanup(CLEANUP).unwrap().existed);
    let again = fresh.cleanup(CLEANUP).unwrap();
    assert!(!again.existed);
}

#[test]
fn sweep_removes_stale_slots_and_keeps_active_ones() {
    let mut parent = TestParent::detect("sweep");
    let mut slots = Vec::new();
    for n in 0..3 {
        let slot = SlotCgroup::create(&parent.hierarchy, parent.template.expand(n), &Limits::NONE)
            .unwrap();
        let pid = parent.adopt(spawn_in(&slot, "sleep 300"));
        slots.push((slot, pid));
    }
    // Not slots of this template: left alone.
    let other = parent.hierarchy.mounts()[0]
        .join(&parent.name)
        .join("slot-01");
    std::fs::create_dir(&other).unwrap();

    let removed = sweep(&parent.hierarchy, &parent.template, &[1], CLEANUP).unwrap();
    let removed: Vec<&str> = removed.iter().map(|p| p.as_str()).collect();
    assert_eq!(
        removed,
        vec![
            format!("{}/slot-0", parent.name),
            format!("{}/slot-2", parent.name)
        ]
    );
    assert!(!slots[0].0.exists() && !slots[2].0.exists());
    assert!(slots[1].0.exists());
    assert_eq!(slots[1].0.pids().unwrap(), vec![slots[1].1]);
    assert!(other.is_dir());
    std::fs::remove_dir(&other).unwrap();
}

#[test]
fn add_pid_moves_a_running_process() {
    let mut parent = TestParent::detect("addpid");
    let slot =
        SlotCgroup::create(&parent.hierarchy, parent.template.expand(0), &Limits::NONE).unwrap();
    let child = Command::new("sleep").arg("300").spawn().unwrap();
    let pid = parent.adopt(child);
    slot.add_pid(pid).unwrap();
    assert_eq!(slot.pids().unwrap(), vec![pid]);
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroups.contains(slot.path().as_str()), "{cgroups}");
    let report = slot.cleanup(CLEANUP).unwrap();
    assert_eq!(report.leftover, vec![pid]);
    assert_eq!(parent.take(pid).wait().unwrap().signal(), Some(9));
}
