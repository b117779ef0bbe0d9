//! Fixtures shared by the QEMU plugin's tests: the sshd guest image.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The sshd image tests boot (built once per target dir, rebuilt when slipway is newer).
const IMAGE: &str = "test-vm-sshd";

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// `slipway image build --name test-vm-sshd --level vm --sshd` into the test images directory
/// (under a file lock: test processes run in parallel); the image's directory.
pub fn sshd_image() -> PathBuf {
    slipway_testkit::guest::ensure_vm_tools().unwrap();
    if !Path::new("/usr/bin/ssh-keygen").exists() {
        slipway_testkit::apt_install("openssh-client").unwrap();
    }
    let bins = slipway_testkit::guest::bin_dir();
    let slipway = bins.join("slipway");
    let agent = bins.join("slipway-guest-agent");
    for b in [&slipway, &agent] {
        assert!(
            b.exists(),
            "{} is missing: run `cargo build -p slipway -p slipway-guest-agent` first",
            b.display()
        );
    }
    let images = bins.join("slipway-test-images");
    std::fs::create_dir_all(&images).unwrap();
    let lock = std::fs::File::create(images.join(format!(".{IMAGE}.lock"))).unwrap();
    let _held = Flock::lock(lock, FlockArg::LockExclusive).unwrap();
    let manifest = images.join(IMAGE).join("image.json");
    let fresh = mtime(&manifest).is_some_and(|built| {
        [&agent, &slipway]
            .iter()
            .all(|b| mtime(b).is_some_and(|t| t <= built))
    });
    if !fresh {
        let out = std::process::Command::new(&slipway)
            .args(["image", "build", "--name", IMAGE, "--level", "vm", "--sshd"])
            .arg("--images-dir")
            .arg(&images)
            .arg("--agent")
            .arg(&agent)
            .args(["--cache-dir", "/var/tmp/slipway-debootstrap-cache"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "slipway image build failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    images.join(IMAGE)
}
