//! Guest images for VM tests: QEMU, the kernel and the image tools installed when missing, and
//! `slipway image build` run once per image and target directory (under a file lock, since
//! test processes run in parallel), rebuilt when the guest agent or slipway is newer.

use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::{FixtureError, err};

/// Debian packages VM tests need, by the command that shows each is there.
const PACKAGES: &[(&str, &str)] = &[
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    ("/usr/bin/qemu-img", "qemu-utils"),
    ("/bin/busybox", "busybox-static"),
    ("/usr/bin/cpio", "cpio"),
    ("/usr/sbin/debootstrap", "debootstrap"),
    ("/sbin/mke2fs", "e2fsprogs"),
];

/// The two images tests use.
pub const MICROVM_IMAGE: &str = "test-microvm";
/// The `vm` level image (a debootstrap root disk).
pub const VM_IMAGE: &str = "test-vm";

fn has_cloud_kernel() -> bool {
    std::fs::read_dir("/boot")
        .map(|d| {
            d.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("vmlinuz-")
                    && e.file_name().to_string_lossy().ends_with("-cloud-amd64")
            })
        })
        .unwrap_or(false)
}

/// Install what VM tests need (apt-get, one package at a time: Debian's busybox and
/// busybox-static conflict when asked together with other packages on some systems).
pub fn ensure_vm_tools() -> Result<(), FixtureError> {
    let mut missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if !has_cloud_kernel() {
        missing.push("linux-image-cloud-amd64");
    }
    for pkg in missing {
        crate::apt_install(pkg)?;
    }
    Ok(())
}

/// The target directory's `debug` folder (where `slipway` and `slipway-guest-agent` are).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/debug/deps/test-… or target/debug/test-…
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Build (or reuse) the image `name` of `level` (`microvm` or `vm`) with the `slipway` binary
/// in `bin_dir()`; the images directory.
pub fn guest_image(name: &str, level: &str) -> Result<PathBuf, FixtureError> {
    ensure_vm_tools()?;
    let bins = bin_dir();
    let slipway = bins.join("slipway");
    let agent = bins.join("slipway-guest-agent");
    for b in [&slipway, &agent] {
        if !b.exists() {
            return Err(err(
                "building a guest image",
                format!(
                    "{} is missing: run `cargo build --workspace` first",
                    b.display()
                ),
            ));
        }
    }
    let images = bins.join("slipway-test-images");
    std::fs::create_dir_all(&images).map_err(|e| err("creating the images directory", e))?;
    let lock = std::fs::File::create(images.join(format!(".{name}.lock")))
        .map_err(|e| err("locking the images directory", e))?;
    let _held = Flock::lock(lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| err("locking the images directory", e))?;
    let manifest = images.join(name).join("image.json");
    let fresh = match mtime(&manifest) {
        Some(built) => [&agent, &slipway]
            .iter()
            .all(|b| mtime(b).is_some_and(|t| t <= built)),
        None => false,
    };
    if !fresh {
        let out = std::process::Command::new(&slipway)
            .args([
                "image",
                "build",
                "--name",
                name,
                "--level",
                level,
                "--images-dir",
            ])
            .arg(&images)
            .arg("--agent")
            .arg(&agent)
            .args(["--cache-dir", "/var/tmp/slipway-debootstrap-cache"])
            .output()
            .map_err(|e| err("running slipway image build", e))?;
        if !out.status.success() {
            return Err(err(
                "building a guest image",
                format!(
                    "slipway image build {name} failed: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
    }
    Ok(images)
}
