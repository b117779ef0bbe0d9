//! Helpers shared by the tests on the real cgroup hierarchy.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use slipway_cgroups::{Hierarchy, SlotCgroup, SlotTemplate, sweep};

/// A parent cgroup unique to one test (`slipway-test-<pid>-<tag>`), swept and removed on drop
/// even when the test fails, with the test's children killed and reaped.
pub struct TestParent {
    pub hierarchy: Hierarchy,
    pub name: String,
    pub template: SlotTemplate,
    children: Vec<Child>,
}

impl TestParent {
    pub fn new(hierarchy: Hierarchy, tag: &str) -> Self {
        let name = format!("slipway-test-{}-{tag}", std::process::id());
        let template = SlotTemplate::parse(&format!("{name}/slot-{{slot}}")).unwrap();
        let parent = Self {
            hierarchy,
            name,
            template,
            children: Vec::new(),
        };
        parent.remove();
        parent
    }

    /// The real hierarchy under `/sys/fs/cgroup`.
    pub fn detect(tag: &str) -> Self {
        Self::new(Hierarchy::detect().unwrap(), tag)
    }

    /// Keep a child to reap it on drop; returns its pid.
    pub fn adopt(&mut self, child: Child) -> u32 {
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// Take back an adopted child (to wait for it in the test).
    pub fn take(&mut self, pid: u32) -> Child {
        let at = self.children.iter().position(|c| c.id() == pid).unwrap();
        self.children.remove(at)
    }

    fn remove(&self) {
        if let Err(e) = sweep(
            &self.hierarchy,
            &self.template,
            &[],
            Duration::from_secs(10),
        ) {
            eprintln!("sweep of {} failed: {e}", self.name);
        }
        for mount in self.hierarchy.mounts() {
            let dir = mount.join(&self.name);
            if dir.exists()
                && let Err(e) = std::fs::remove_dir(&dir)
            {
                eprintln!("cannot remove {}: {e}", dir.display());
            }
        }
    }
}

impl Drop for TestParent {
    fn drop(&mut self) {
        self.remove();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Spawn `bash -c script` inside `slot`, with null stdio.
pub fn spawn_in(slot: &SlotCgroup, script: &str) -> Child {
    slot.command("bash")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Poll `f` every 20 ms until it is true or `timeout` passes; returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is gone or a zombie (dead, waiting to be reaped).
pub fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Run a script with real bash, returning its output.
pub fn bash(script: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Read a file to a trimmed string.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}
