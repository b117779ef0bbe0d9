//! The soak's faults: what can be done to a run, and the seeded schedule of when.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::mix::Rng;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL the fleeting plugin (the manager restarts it).
    KillPlugin,
    /// SIGKILL one instance's sshd listener.
    KillSshd,
    /// Slow one instance's network down (netem delay, else a token bucket) until [`Fault::Undelay`].
    DelayNetwork,
    /// Lift the network delay.
    Undelay,
    /// SIGKILL the manager and start it again on the same config.
    KillManager,
    /// GitLab answers 500 for a while.
    Gitlab500,
    /// GitLab answers 502 for a while.
    Gitlab502,
    /// GitLab answers nothing (clients time out) for a while.
    GitlabTimeout,
    /// GitLab closes connections without answering for a while.
    GitlabDrop,
    /// The state directory's disk is full for a while.
    DiskFull,
}

impl Fault {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::KillPlugin => "plugin_sigkill",
            Fault::KillSshd => "instance_sshd_killed",
            Fault::DelayNetwork => "instance_network_delayed",
            Fault::Undelay => "instance_network_restored",
            Fault::KillManager => "manager_sigkill_restart",
            Fault::Gitlab500 => "gitlab_500",
            Fault::Gitlab502 => "gitlab_502",
            Fault::GitlabTimeout => "gitlab_timeout",
            Fault::GitlabDrop => "gitlab_dropped_connections",
            Fault::DiskFull => "state_disk_full",
        }
    }
}

/// A fault due once the run's progress (jobs finished / jobs) passes `at`.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// Progress in `[0, 1)`.
    pub at: f64,
    /// What happens.
    pub fault: Fault,
}

/// The seeded schedule: every kind of fault, spread over the run (GitLab's only with GitLab).
pub fn schedule(seed: u64, gitlab: bool) -> Vec<Event> {
    let mut rng = Rng::new(seed ^ 0xC4A0_5EED);
    let mut plan = vec![
        (0.08, Fault::KillPlugin),
        (0.18, Fault::KillSshd),
        (0.22, Fault::DelayNetwork),
        (0.30, Fault::KillManager),
        (0.40, Fault::DiskFull),
        (0.45, Fault::KillPlugin),
        (0.50, Fault::KillManager),
        (0.58, Fault::KillSshd),
        (0.62, Fault::Undelay),
        (0.70, Fault::KillPlugin),
    ];
    if gitlab {
        plan.extend([
            (0.12, Fault::Gitlab500),
            (0.34, Fault::Gitlab502),
            (0.54, Fault::GitlabTimeout),
            (0.66, Fault::GitlabDrop),
        ]);
    }
    let mut events: Vec<Event> = plan
        .into_iter()
        .map(|(at, fault)| Event {
            // Up to ±2 % of the run, so seeds differ in what overlaps.
            at: (at + (rng.unit() - 0.5) * 0.04_f64).clamp(0.01, 0.9),
            fault,
        })
        .collect();
    events.sort_by(|a, b| a.at.total_cmp(&b.at));
    events
}

/// Send `sig` to `pid`; whether it was delivered.
pub fn kill(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The pid at the start of a `processes_matching` line.
pub fn pid_of(line: &str) -> Option<u32> {
    line.split_whitespace().next()?.parse().ok()
}

/// A small tmpfs holding the manager's state (config, queue, state store), so the driver can
/// fill it; unmounted on drop.
#[derive(Debug)]
pub struct StateDisk {
    dir: PathBuf,
}

impl StateDisk {
    /// Mount a tmpfs of `size` (`64m`) at `dir`.
    pub fn mount(dir: &Path, size: &str) -> StateDisk {
        std::fs::create_dir_all(dir).expect("state dir");
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .expect("mount");
        assert!(st.success(), "mount tmpfs at {}", dir.display());
        StateDisk {
            dir: dir.to_path_buf(),
        }
    }

    /// Fill the disk to the last byte; the filler's path.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let small = [0u8; 512];
        while f.write_all(&small).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for StateDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Slow down instance network namespace `ns`: netem's delay where the kernel has it, else a
/// token bucket so slow that SSH traffic queues. The device shaped (for [`undelay`]) and how.
pub fn delay(ns: &str) -> Option<(String, &'static str)> {
    let out = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show"])
        .output()
        .ok()?;
    let dev = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|d| d.trim().split('@').next().unwrap_or("").to_string())
        .find(|d| !d.is_empty() && d != "lo")?;
    let tc = |args: &[&str]| {
        Command::new("ip")
            .args([
                "netns", "exec", ns, "tc", "qdisc", "replace", "dev", &dev, "root",
            ])
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if tc(&["netem", "delay", "150ms", "50ms"]) {
        return Some((dev, "netem delay 150ms ±50ms"));
    }
    // Kernels without sch_netem (this machine's): queueing behind a slow token bucket.
    tc(&["tbf", "rate", "256kbit", "burst", "8kb", "latency", "2s"])
        .then_some((dev, "tbf rate 256kbit (no sch_netem in this kernel)"))
}

/// Lift [`delay`] (the namespace may be gone by then: nothing to do).
pub fn undelay(ns: &str, dev: &str) {
    let _ = Command::new("ip")
        .args([
            "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root",
        ])
        .stderr(std::process::Stdio::null())
        .status();
}

/// A timed fault in progress and when it ends.
#[derive(Debug)]
pub struct Timed {
    /// Which.
    pub fault: Fault,
    /// When it is lifted.
    pub until: Instant,
}

impl Timed {
    /// `fault` for `d` from now.
    pub fn new(fault: Fault, d: Duration) -> Timed {
        Timed {
            fault,
            until: Instant::now() + d,
        }
    }
}
