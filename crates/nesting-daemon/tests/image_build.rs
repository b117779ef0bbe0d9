//! `slipway image build` for real: the Debian cloud kernel, busybox-static, cpio, e2fsprogs
//! and qemu-utils must be installed (`scripts/deps.sh test`); the vm test runs debootstrap
//! against a Debian mirror once and reuses the tree from `/var/tmp/slipway-debootstrap-cache`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use slipway_nesting::Level;
use slipway_nesting_daemon::image::{self, BuildOptions, ImageError, Progress};

/// A dynamically linked stand-in for the agent (its libraries must land in the initramfs);
/// the real agent when it has been built.
fn agent(dir: &Path) -> PathBuf {
    let built =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/slipway-guest-agent");
    let src = if built.is_file() {
        built
    } else {
        PathBuf::from("/usr/bin/true")
    };
    let dest = dir.join("slipway-guest-agent");
    std::fs::copy(&src, &dest).unwrap();
    dest
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Paths in a gzip'd cpio, without a leading `./`.
fn initramfs_listing(initrd: &Path) -> Vec<String> {
    sh(&format!(
        "gzip -dc '{}' | cpio -t --quiet",
        initrd.display()
    ))
    .lines()
    .map(|l| l.trim_start_matches("./").to_string())
    .collect()
}

fn initramfs_file(initrd: &Path, name: &str) -> String {
    sh(&format!(
        "gzip -dc '{}' | cpio -i --to-stdout --quiet '{name}'",
        initrd.display()
    ))
}

/// Library paths `ldd` lists for `bin`, relative.
fn libs_of(bin: &str) -> Vec<String> {
    sh(&format!("ldd {bin}"))
        .lines()
        .filter_map(|l| {
            let target = l.split("=>").last()?.split_whitespace().next()?;
            target
                .starts_with('/')
                .then(|| target.trim_start_matches('/').to_string())
        })
        .collect()
}

async fn build(opts: &BuildOptions) -> (Result<image::ImageManifest, ImageError>, Vec<Progress>) {
    let mut seen = Vec::new();
    let r = image::build(opts, &mut |p| {
        eprintln!("{}", image::render_progress(&p));
        seen.push(p);
    })
    .await;
    (r, seen)
}

#[tokio::test]
async fn microvm_image_has_kernel_initramfs_and_work_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("images");
    let mut opts = BuildOptions::new(
        "micro".into(),
        Level::Microvm,
        images.clone(),
        agent(tmp.path()),
    );
    opts.work_disk_mib = 64;
    let (r, progress) = build(&opts).await;
    let m = r.unwrap();

    assert_eq!(m.name, "micro");
    assert_eq!(m.level, Level::Microvm);
    assert_eq!(
        (m.kernel.as_str(), m.initrd.as_str(), m.disk.as_str()),
        ("vmlinuz", "initrd.img", "disk.qcow2")
    );
    assert!(
        m.cmdline
            .starts_with("console=ttyS0 quiet panic=-1 reboot=t"),
        "{}",
        m.cmdline
    );
    assert!(!m.cmdline.contains("slipway.root"), "{}", m.cmdline);
    assert_eq!(m.agent_port, "org.slipway.agent");
    assert_eq!(m.vsock_port, 1024);
    assert!(
        Path::new("/lib/modules").join(&m.kernel_version).is_dir(),
        "{}",
        m.kernel_version
    );
    assert_eq!((m.vcpus, m.memory_mib), (1, 256));
    assert_eq!(m.builds_dir, "/work/builds");
    assert!(m.built_at > 1_700_000_000);

    let dir = images.join("micro");
    assert_eq!(image::load(&dir).unwrap(), m);
    assert!(m.kernel_path(&dir).is_file());

    // Six steps, each reported starting then done, in order.
    assert_eq!(progress.len(), 12, "{progress:?}");
    for (i, pair) in progress.chunks(2).enumerate() {
        assert_eq!(
            (pair[0].step, pair[0].steps, pair[0].done),
            (i + 1, 6, false)
        );
        assert_eq!((pair[1].step, pair[1].done), (i + 1, true));
    }

    let listing = initramfs_listing(&m.initrd_path(&dir));
    let has = |p: &str| listing.iter().any(|l| l == p);
    for p in [
        "init",
        "bin/busybox",
        "bin/sh",
        "sbin/switch_root",
        "bin/bash",
        "sbin/slipway-guest-agent",
    ] {
        assert!(has(p), "{p} missing from the initramfs: {listing:?}");
    }
    for lib in libs_of("/bin/bash")
        .into_iter()
        .chain(libs_of(&opts.agent.display().to_string()))
    {
        assert!(has(&lib), "{lib} missing from the initramfs");
    }
    for module in [
        "virtio_mmio",
        "virtio_blk",
        "virtio_console",
        "virtio",
        "virtio_ring",
    ] {
        assert!(
            listing
                .iter()
                .any(|l| l.starts_with("lib/modules/") && l.ends_with(&format!("/{module}.ko"))),
            "module {module} missing: {listing:?}"
        );
    }
    let init = initramfs_file(&m.initrd_path(&dir), "init");
    let at = |s: &str| {
        init.find(s)
            .unwrap_or_else(|| panic!("{s:?} not in /init:\n{init}"))
    };
    assert!(at("virtio_ring.ko") < at("/virtio.ko") && at("/virtio.ko") < at("virtio_mmio.ko"));
    assert!(at("virtio_mmio.ko") < at("virtio_blk.ko"));
    assert!(at("/dev/vda /work") < at("serve --port org.slipway.agent"));

    let info = sh(&format!(
        "qemu-img info --output=json '{}'",
        m.disk_path(&dir).display()
    ));
    assert!(info.contains("\"format\": \"qcow2\""), "{info}");
    assert!(
        info.contains(&format!("\"virtual-size\": {}", 64 * 1024 * 1024)),
        "{info}"
    );

    // Building again replaces the image and leaves nothing else behind.
    let (again, _) = build(&opts).await;
    let again = again.unwrap();
    assert_eq!(image::load(&dir).unwrap(), again);
    let entries: Vec<String> = std::fs::read_dir(&images)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, ["micro"]);
}

#[tokio::test]
async fn a_missing_agent_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-agent");
    let opts = BuildOptions::new(
        "x".into(),
        Level::Microvm,
        tmp.path().join("images"),
        missing.clone(),
    );
    let (r, _) = build(&opts).await;
    let e = r.unwrap_err();
    assert!(matches!(e, ImageError::Agent { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
    assert!(!tmp.path().join("images/x").exists());
}

#[tokio::test]
async fn a_missing_kernel_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = BuildOptions::new(
        "x".into(),
        Level::Microvm,
        tmp.path().join("images"),
        agent(tmp.path()),
    );
    let kernel = tmp.path().join("vmlinuz-none");
    opts.kernel = Some(kernel.clone());
    let (r, _) = build(&opts).await;
    let e = r.unwrap_err();
    assert!(matches!(e, ImageError::Kernel { .. }), "{e:?}");
    assert!(e.to_string().contains(&kernel.display().to_string()), "{e}");
}

#[tokio::test]
async fn a_failed_build_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("images");
    let mut opts = BuildOptions::new(
        "x".into(),
        Level::Microvm,
        images.clone(),
        agent(tmp.path()),
    );
    // Larger than any file system allows: fails at the work disk, after the initramfs.
    opts.work_disk_mib = 1 << 40;
    let (r, progress) = build(&opts).await;
    let e = r.unwrap_err();
    assert!(e.to_string().contains("making the work disk"), "{e}");
    assert!(
        progress.iter().any(|p| p.step == 3 && p.done),
        "{progress:?}"
    );
    assert_eq!(std::fs::read_dir(&images).unwrap().count(), 0);
}

#[tokio::test]
async fn vm_image_has_a_debootstrap_root_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("images");
    let mut opts = BuildOptions::new("full".into(), Level::Vm, images.clone(), agent(tmp.path()));
    opts.cache_dir = PathBuf::from("/var/tmp/slipway-debootstrap-cache");
    let (r, progress) = build(&opts).await;
    let m = r.unwrap();
    assert_eq!(m.level, Level::Vm);
    assert!(m.cmdline.contains("slipway.root=/dev/vda"), "{}", m.cmdline);
    assert_eq!(m.memory_mib, 512);
    assert_eq!(
        progress.last().map(|p| (p.step, p.steps, p.done)),
        Some((8, 8, true))
    );

    let dir = images.join("full");
    assert_eq!(image::load(&dir).unwrap(), m);
    let listing = initramfs_listing(&m.initrd_path(&dir));
    assert!(listing.iter().any(|l| l == "init"));
    assert!(
        listing.iter().any(|l| l.ends_with("/virtio_pci.ko")),
        "{listing:?}"
    );
    let init = initramfs_file(&m.initrd_path(&dir), "init");
    assert!(
        init.contains("exec switch_root /newroot /sbin/slipway-init"),
        "{init}"
    );

    // The root disk holds the agent, slipway-init and /work/builds (debugfs reads ext4).
    let raw = tmp.path().join("root.raw");
    sh(&format!(
        "qemu-img convert -O raw '{}' '{}'",
        m.disk_path(&dir).display(),
        raw.display()
    ));
    let debugfs = |req: &str| {
        sh(&format!(
            "debugfs -R '{req}' '{}' 2>/dev/null",
            raw.display()
        ))
    };
    assert!(debugfs("stat /usr/sbin/slipway-guest-agent").contains("Type: regular"));
    assert!(debugfs("cat /usr/sbin/slipway-init").contains("serve --port org.slipway.agent"));
    assert!(debugfs("stat /work/builds").contains("Type: directory"));
    assert!(debugfs("stat /usr/bin/bash").contains("Type: regular"));
    // The cache's tree was linked, not written through.
    let cached = Path::new("/var/tmp/slipway-debootstrap-cache/bookworm-minbase");
    assert!(!cached.join("sbin/slipway-init").exists());
    assert_ne!(
        std::fs::read_to_string(cached.join("etc/hostname"))
            .ok()
            .as_deref(),
        Some("slipway\n")
    );
}
