//! Guest images (`slipway image build`): a directory `<images_dir>/<name>/` holding
//! `image.json` ([`ImageManifest`]), the kernel, a busybox initramfs with the guest agent and a
//! qcow2 base disk (an empty ext4 work disk for `microvm`, a debootstrap root for `vm`).
//!
//! - [`build`] makes one (into a temporary directory beside the target, renamed at the end);
//! - [`load`] reads and checks one for the daemon.

mod disk;
mod initramfs;
mod tools;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use slipway_nesting::spec::Level;

pub use tools::{MissingPackage, host_tsc_khz, newest_cloud_kernel};

/// The manifest's file name inside an image directory.
pub const MANIFEST_FILE: &str = "image.json";

/// Default virtio-serial port name the agent listens on.
pub const AGENT_PORT: &str = "org.slipway.agent";

/// Default vsock port the agent listens on (Firecracker, Cloud Hypervisor).
pub const VSOCK_PORT: u32 = 1024;

/// Where jobs' build directories live in the guest.
pub const BUILDS_DIR: &str = "/work/builds";

/// Default cache for debootstrap trees (the CLI's `--cache-dir` default).
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/slipway/debootstrap";

/// Default Debian mirror for `vm` images.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Default Debian suite for `vm` images.
pub const DEFAULT_SUITE: &str = "bookworm";

/// File names inside an image directory.
const KERNEL_FILE: &str = "vmlinuz";
const INITRD_FILE: &str = "initrd.img";
const DISK_FILE: &str = "disk.qcow2";

/// Why building or loading an image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image name cannot be a directory name.
    #[error("invalid image name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A build option is out of range.
    #[error("build option {option}: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What was expected.
        reason: String,
    },
    /// The guest agent binary is missing or unusable.
    #[error("guest agent binary {}: {reason}", path.display())]
    Agent {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The kernel is missing or unusable.
    #[error("kernel {}: {reason}", path.display())]
    Kernel {
        /// The kernel image.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Tools, the kernel or its modules are not installed: every missing package at once.
    #[error(
        "cannot build a {level} image, missing: {}; install with: apt-get install -y {}",
        MissingPackage::describe_all(missing),
        MissingPackage::packages(missing).join(" ")
    )]
    MissingPackages {
        /// Level being built.
        level: &'static str,
        /// What is missing, with the Debian package providing it.
        missing: Vec<MissingPackage>,
    },
    /// A kernel module the guest needs is not shipped by the kernel.
    #[error("kernel {kernel_version}: module {module}: {reason}")]
    Module {
        /// Kernel version.
        kernel_version: String,
        /// Module name.
        module: String,
        /// What is wrong.
        reason: String,
    },
    /// An external command failed.
    #[error("{step}: `{command}` {status}: {stderr}")]
    Command {
        /// Build step.
        step: String,
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// The end of its standard error.
        stderr: String,
    },
    /// A file operation failed.
    #[error("{step}: {}: {source}", path.display())]
    Io {
        /// Build step (or what was being read).
        step: String,
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `image.json` is not valid JSON of the expected shape.
    #[error("image manifest {}: {source}", path.display())]
    ManifestParse {
        /// The manifest file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A field of `image.json` names a file that is not there, or is not a plain file name.
    #[error("image manifest {}: field `{field}` = {value:?}: {problem}", manifest.display())]
    ManifestField {
        /// The manifest file.
        manifest: PathBuf,
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong (for example "file /images/x/vmlinuz does not exist").
        problem: String,
    },
}

impl ImageError {
    fn io(step: &str, path: &Path, source: io::Error) -> Self {
        ImageError::Io {
            step: step.to_string(),
            path: path.to_path_buf(),
            source,
        }
    }
}

/// `image.json`: what a guest image holds and how to boot it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageManifest {
    /// Image name (its directory's name).
    pub name: String,
    /// microvm (initramfs root, work disk) or vm (root disk).
    pub level: Level,
    /// Kernel image, relative to the image directory.
    pub kernel: String,
    /// Initramfs, relative to the image directory.
    pub initrd: String,
    /// Base disk (qcow2), relative to the image directory: the work disk (microvm) or the root
    /// disk (vm). VMs get a copy-on-write overlay of it.
    pub disk: String,
    /// Kernel command line.
    pub cmdline: String,
    /// virtio-serial port name the agent serves.
    pub agent_port: String,
    /// vsock port the agent serves (when the guest has vsock).
    pub vsock_port: u32,
    /// `uname -r` of the kernel.
    pub kernel_version: String,
    /// When the image was built (Unix seconds).
    pub built_at: u64,
    /// Default virtual CPUs.
    pub vcpus: u32,
    /// Default guest memory in MiB.
    pub memory_mib: u32,
    /// Directory for job builds in the guest.
    pub builds_dir: String,
    /// Whether the root disk has OpenSSH's sshd, started at boot with the key passed on the
    /// kernel command line (`vm` images built with `--sshd`; see [`SSH_KEY_PARAM`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sshd: bool,
    /// Whether the guest configures a virtio NIC on QEMU's user-mode network at boot, so that
    /// its VMs get one (images built before this field existed have no NIC driver).
    #[serde(default)]
    pub network: bool,
}

/// Kernel command line parameter carrying the public key sshd accepts for root, as
/// `<type>:<base64>` (`ssh-ed25519:AAAA…`: the command line splits on spaces).
pub const SSH_KEY_PARAM: &str = "slipway.ssh_key";

/// Kernel command line parameter naming the guest's host name (sshd images).
pub const HOSTNAME_PARAM: &str = "slipway.hostname";

/// The guest's address on QEMU's user-mode network (the target of a `hostfwd` rule).
pub const GUEST_USER_NET_ADDR: &str = "10.0.2.15";

impl ImageManifest {
    /// The kernel's absolute path for an image in `dir`.
    pub fn kernel_path(&self, dir: &Path) -> PathBuf {
        absolute(dir).join(&self.kernel)
    }

    /// The initramfs's absolute path for an image in `dir`.
    pub fn initrd_path(&self, dir: &Path) -> PathBuf {
        absolute(dir).join(&self.initrd)
    }

    /// The base disk's absolute path for an image in `dir`.
    pub fn disk_path(&self, dir: &Path) -> PathBuf {
        absolute(dir).join(&self.disk)
    }
}

fn absolute(dir: &Path) -> PathBuf {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// Read `<dir>/image.json` and check that the files it names are there (small synchronous
/// reads: a manifest and three `stat`s).
pub fn load(dir: &Path) -> Result<ImageManifest, ImageError> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ImageError::io("reading the image manifest", &path, e))?;
    let manifest: ImageManifest =
        serde_json::from_str(&text).map_err(|source| ImageError::ManifestParse {
            path: path.clone(),
            source,
        })?;
    let files = [
        ("kernel", &manifest.kernel),
        ("initrd", &manifest.initrd),
        ("disk", &manifest.disk),
    ];
    for (field, value) in files {
        let bad = |problem: String| ImageError::ManifestField {
            manifest: path.clone(),
            field,
            value: value.clone(),
            problem,
        };
        // A plain name keeps an image self-contained (copying the directory copies it all).
        let plain = !value.is_empty()
            && Path::new(value).components().count() == 1
            && !matches!(value.as_str(), "." | "..")
            && !value.contains('/');
        if !plain {
            return Err(bad("expected a file name inside the image directory".into()));
        }
        let file = absolute(dir).join(value);
        match std::fs::metadata(&file) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(bad(format!("{} is not a regular file", file.display()))),
            Err(e) => return Err(bad(format!("file {}: {e}", file.display()))),
        }
    }
    Ok(manifest)
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOptions {
    /// Image name (`[A-Za-z0-9._-]`, not starting with a dot).
    pub name: String,
    /// microvm or vm.
    pub level: Level,
    /// Images directory; the image goes to `<out_dir>/<name>`.
    pub out_dir: PathBuf,
    /// The `slipway-guest-agent` binary.
    pub agent: PathBuf,
    /// Kernel image; default the newest `/boot/vmlinuz-*-cloud-amd64`.
    pub kernel: Option<PathBuf>,
    /// Where debootstrap trees are kept between builds (vm level).
    pub cache_dir: PathBuf,
    /// Size of the microvm work disk in MiB.
    pub work_disk_mib: u64,
    /// Debian suite of the vm root.
    pub suite: String,
    /// Debian mirror for debootstrap.
    pub mirror: String,
    /// Default virtual CPUs recorded in the manifest.
    pub vcpus: u32,
    /// Default guest memory recorded in the manifest.
    pub memory_mib: u32,
    /// `vm` only: add OpenSSH's sshd to the root disk and start it at boot (network on the
    /// first virtio NIC as QEMU user-mode networking's guest, a host key made at boot, the key
    /// from [`SSH_KEY_PARAM`] authorised for root).
    pub sshd: bool,
    /// Give the guest a network: the virtio NIC driver, and `/init` configuring QEMU's
    /// user-mode network, so that jobs reach GitLab, the cache and package mirrors and the
    /// job helper moves their data in the VM (default on).
    pub network: bool,
}

impl BuildOptions {
    /// Options with every default: the newest cloud kernel, a 2 GiB work disk, bookworm from
    /// deb.debian.org, 1 vCPU, 256 MiB (microvm) or 512 MiB (vm).
    pub fn new(name: String, level: Level, out_dir: PathBuf, agent: PathBuf) -> Self {
        BuildOptions {
            name,
            level,
            out_dir,
            agent,
            kernel: None,
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            work_disk_mib: 2048,
            suite: DEFAULT_SUITE.to_string(),
            mirror: DEFAULT_MIRROR.to_string(),
            vcpus: 1,
            memory_mib: match level {
                Level::Microvm => 256,
                Level::Vm => 512,
            },
            sshd: false,
            network: true,
        }
    }
}

/// One build step starting (`done == false`) or finished (`done == true`, with its duration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Step number, from 1.
    pub step: usize,
    /// Number of steps.
    pub steps: usize,
    /// What the step does.
    pub what: String,
    /// Whether the step has finished.
    pub done: bool,
    /// Time the step took (zero when starting).
    pub elapsed: Duration,
}

/// `[3/6] packing initramfs …` when a step starts, `[3/6] packing initramfs … done in 1.2 s`
/// when it ends.
pub fn render_progress(p: &Progress) -> String {
    let head = format!("[{}/{}] {} …", p.step, p.steps, p.what);
    if p.done {
        format!("{head} done in {}", Seconds(p.elapsed))
    } else {
        head
    }
}

/// A duration as `1.2 s` (or `2 min 5 s` past a minute: debootstrap takes minutes).
struct Seconds(Duration);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs_f64();
        if secs < 60.0 {
            write!(f, "{secs:.1} s")
        } else {
            let whole = self.0.as_secs();
            write!(f, "{} min {} s", whole / 60, whole % 60)
        }
    }
}

/// Emits [`Progress`] for numbered steps.
struct Reporter<'a> {
    progress: &'a mut dyn FnMut(Progress),
    steps: usize,
    step: usize,
    what: String,
    started: Instant,
}

impl<'a> Reporter<'a> {
    fn new(progress: &'a mut dyn FnMut(Progress), steps: usize) -> Self {
        Reporter {
            progress,
            steps,
            step: 0,
            what: String::new(),
            started: Instant::now(),
        }
    }

    fn begin(&mut self, what: impl Into<String>) {
        self.step += 1;
        self.what = what.into();
        self.started = Instant::now();
        (self.progress)(Progress {
            step: self.step,
            steps: self.steps,
            what: self.what.clone(),
            done: false,
            elapsed: Duration::ZERO,
        });
    }

    fn done(&mut self) {
        (self.progress)(Progress {
            step: self.step,
            steps: self.steps,
            what: self.what.clone(),
            done: true,
            elapsed: self.started.elapsed(),
        });
    }
}

/// Build the image `opts.name` into `opts.out_dir`, replacing an existing one only once the new
/// one is complete. Checks every tool first and names every missing package in one error.
pub async fn build(
    opts: &BuildOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<ImageManifest, ImageError> {
    check_name(&opts.name)?;
    check_options(opts)?;
    let steps = match opts.level {
        Level::Microvm => 6,
        Level::Vm => 8,
    };
    let mut report = Reporter::new(progress, steps);

    report.begin("checking tools, kernel and agent");
    let pre = tools::preflight(opts).await?;
    report.done();

    tokio::fs::create_dir_all(&opts.out_dir)
        .await
        .map_err(|e| ImageError::io("creating the images directory", &opts.out_dir, e))?;
    let tmp = TempDir::create(&opts.out_dir, &opts.name).await?;
    let manifest = match build_into(opts, &pre, tmp.path(), &mut report).await {
        Ok(m) => m,
        Err(e) => {
            // Removed before returning (not in the background as on cancellation), so the
            // caller never sees the half-written directory.
            let dir = tmp.keep();
            let _ = tools::remove_tree(&dir).await;
            return Err(e);
        }
    };

    report.begin(format!(
        "installing {}",
        opts.out_dir.join(&opts.name).display()
    ));
    install(tmp, &opts.out_dir, &opts.name).await?;
    report.done();
    Ok(manifest)
}

fn check_name(name: &str) -> Result<(), ImageError> {
    let bad = |reason| ImageError::InvalidName {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() || name.len() > 64 {
        return Err(bad("expected 1 to 64 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(bad("expected only A-Z a-z 0-9 . _ -"));
    }
    // Dot names are this module's temporary directories (and `.`/`..` are not names).
    if name.starts_with('.') {
        return Err(bad("must not start with a dot"));
    }
    Ok(())
}

fn check_options(opts: &BuildOptions) -> Result<(), ImageError> {
    if opts.vcpus == 0 {
        return Err(ImageError::InvalidOption {
            option: "vcpus",
            reason: "expected at least 1".into(),
        });
    }
    if opts.memory_mib < 64 {
        return Err(ImageError::InvalidOption {
            option: "memory_mib",
            reason: format!("expected at least 64 MiB, got {}", opts.memory_mib),
        });
    }
    if opts.level == Level::Microvm && opts.work_disk_mib < 16 {
        return Err(ImageError::InvalidOption {
            option: "work_disk_mib",
            reason: format!(
                "expected at least 16 MiB (ext4 needs room for its journal), got {}",
                opts.work_disk_mib
            ),
        });
    }
    if opts.sshd && opts.level != Level::Vm {
        return Err(ImageError::InvalidOption {
            option: "sshd",
            reason: "only vm images can have sshd (microvm guests have no root disk)".into(),
        });
    }
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if opts.level == Level::Vm && !plain(&opts.suite) {
        return Err(ImageError::InvalidOption {
            option: "suite",
            reason: format!(
                "expected a Debian suite name such as bookworm, got {:?}",
                opts.suite
            ),
        });
    }
    Ok(())
}

/// Everything but the final rename: kernel, initramfs, disk and manifest into `dir`.
async fn build_into(
    opts: &BuildOptions,
    pre: &tools::Preflight,
    dir: &Path,
    report: &mut Reporter<'_>,
) -> Result<ImageManifest, ImageError> {
    let kernel = dir.join(KERNEL_FILE);
    tokio::fs::copy(&pre.kernel.path, &kernel)
        .await
        .map_err(|e| ImageError::io("copying the kernel", &pre.kernel.path, e))?;

    let tree = match opts.level {
        Level::Vm => {
            let cached = disk::cached_tree(&opts.cache_dir, &opts.suite, opts.sshd);
            if cached.complete().await {
                report.begin(format!(
                    "reusing debootstrap tree {}",
                    cached.tree.display()
                ));
            } else {
                report.begin(format!(
                    "debootstrap {} from {} (takes minutes)",
                    opts.suite, opts.mirror
                ));
            }
            cached.ensure(&pre.tools, &opts.mirror).await?;
            report.done();
            Some(cached.tree)
        }
        Level::Microvm => None,
    };

    report.begin("staging initramfs");
    let staging = dir.join("initramfs.staging");
    initramfs::stage(opts, pre, &staging).await?;
    report.done();

    report.begin("packing initramfs");
    initramfs::pack(&pre.tools, &staging, &dir.join(INITRD_FILE)).await?;
    tools::remove_tree(&staging).await?;
    report.done();

    let raw = dir.join("disk.raw");
    match &tree {
        None => {
            report.begin(format!(
                "making a {} MiB ext4 work disk",
                opts.work_disk_mib
            ));
            disk::work_disk(&pre.tools, &raw, opts.work_disk_mib).await?;
            report.done();
        }
        Some(tree) => {
            report.begin("staging root tree (agent, slipway-init)");
            let root = dir.join("root.staging");
            disk::stage_root(&pre.tools, tree, &root, opts, pre).await?;
            report.done();
            report.begin("making the ext4 root disk");
            disk::root_disk(&pre.tools, &root, &raw).await?;
            tools::remove_tree(&root).await?;
            report.done();
        }
    }

    report.begin("converting the disk to qcow2");
    disk::to_qcow2(&pre.tools, &raw, &dir.join(DISK_FILE)).await?;
    tokio::fs::remove_file(&raw)
        .await
        .map_err(|e| ImageError::io("removing the raw disk", &raw, e))?;
    report.done();

    let manifest = ImageManifest {
        name: opts.name.clone(),
        level: opts.level,
        kernel: KERNEL_FILE.into(),
        initrd: INITRD_FILE.into(),
        disk: DISK_FILE.into(),
        cmdline: cmdline(opts.level, pre.tsc_khz),
        agent_port: AGENT_PORT.into(),
        vsock_port: VSOCK_PORT,
        kernel_version: pre.kernel.version.clone(),
        built_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        vcpus: opts.vcpus,
        memory_mib: opts.memory_mib,
        builds_dir: BUILDS_DIR.into(),
        sshd: opts.sshd,
        network: opts.network || opts.sshd,
    };
    let json =
        serde_json::to_vec_pretty(&manifest).map_err(|source| ImageError::ManifestParse {
            path: dir.join(MANIFEST_FILE),
            source,
        })?;
    let path = dir.join(MANIFEST_FILE);
    tokio::fs::write(&path, json)
        .await
        .map_err(|e| ImageError::io("writing the image manifest", &path, e))?;
    Ok(manifest)
}

/// The guest kernel command line.
///
/// `tsc_early_khz`: under TCG the kernel's PIT calibration of the TSC fails in about one boot
/// out of five on microvm (it has no HPET or ACPI PM timer to fall back on) and the boot hangs
/// before the first console line; TCG's guest TSC runs at the host's rate, so the host's
/// frequency is right. Under KVM it only replaces the kvmclock-reported value with the same one.
fn cmdline(level: Level, tsc_khz: Option<u64>) -> String {
    let mut c = String::from("console=ttyS0 quiet panic=-1 reboot=t");
    if let (Level::Microvm, Some(khz)) = (level, tsc_khz) {
        c.push_str(&format!(" tsc_early_khz={khz}"));
    }
    if level == Level::Vm {
        c.push_str(" slipway.root=/dev/vda");
    }
    c
}

/// A directory beside the target image that is removed unless installed.
#[derive(Debug)]
struct TempDir {
    path: Option<PathBuf>,
}

impl TempDir {
    async fn create(out_dir: &Path, name: &str) -> Result<Self, ImageError> {
        let path = out_dir.join(format!(".{name}.building-{}", unique()));
        tokio::fs::create_dir(&path)
            .await
            .map_err(|e| ImageError::io("creating the build directory", &path, e))?;
        Ok(TempDir { path: Some(path) })
    }

    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    fn keep(mut self) -> PathBuf {
        self.path.take().unwrap_or_default()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let Some(path) = self.path.take() else { return };
        // A failed or cancelled build: never leave a half-written image behind. Removal is
        // slow for a vm tree, so it goes to the blocking pool when there is a runtime.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || {
                    let _ = std::fs::remove_dir_all(&path);
                });
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{nanos:08x}-{n}", std::process::id())
}

/// Rename the finished build to `<out_dir>/<name>`: an old image is renamed away first and
/// removed after, so a reader sees either the old image or the new one, never a mixture.
async fn install(tmp: TempDir, out_dir: &Path, name: &str) -> Result<(), ImageError> {
    let target = out_dir.join(name);
    let old = out_dir.join(format!(".{name}.old-{}", unique()));
    let had_old = match tokio::fs::rename(&target, &old).await {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(ImageError::io("moving the old image away", &target, e)),
    };
    if let Err(e) = tokio::fs::rename(tmp.path(), &target).await {
        if had_old {
            let _ = tokio::fs::rename(&old, &target).await;
        }
        return Err(ImageError::io("installing the new image", &target, e));
    }
    tmp.keep();
    if had_old {
        tools::remove_tree(&old).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        let mut p = Progress {
            step: 3,
            steps: 6,
            what: "packing initramfs".into(),
            done: false,
            elapsed: Duration::ZERO,
        };
        assert_eq!(render_progress(&p), "[3/6] packing initramfs …");
        p.done = true;
        p.elapsed = Duration::from_millis(1240);
        assert_eq!(
            render_progress(&p),
            "[3/6] packing initramfs … done in 1.2 s"
        );
        p.elapsed = Duration::from_secs(125);
        assert!(render_progress(&p).ends_with("done in 2 min 5 s"));
    }

    #[test]
    fn missing_packages_are_listed_in_one_error() {
        let e = ImageError::MissingPackages {
            level: "vm",
            missing: vec![
                MissingPackage {
                    what: "qemu-img".into(),
                    package: "qemu-utils".into(),
                },
                MissingPackage {
                    what: "a static busybox".into(),
                    package: "busybox-static".into(),
                },
                MissingPackage {
                    what: "qemu-nbd".into(),
                    package: "qemu-utils".into(),
                },
            ],
        };
        assert_eq!(
            e.to_string(),
            "cannot build a vm image, missing: qemu-img (qemu-utils), a static busybox \
             (busybox-static), qemu-nbd (qemu-utils); install with: apt-get install -y \
             qemu-utils busybox-static"
        );
    }

    #[test]
    fn names() {
        assert!(check_name("test-microvm_1.0").is_ok());
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cmdlines() {
        assert_eq!(
            cmdline(Level::Microvm, Some(2_600_000)),
            "console=ttyS0 quiet panic=-1 reboot=t tsc_early_khz=2600000"
        );
        assert_eq!(
            cmdline(Level::Vm, Some(2_600_000)),
            "console=ttyS0 quiet panic=-1 reboot=t slipway.root=/dev/vda"
        );
    }

    fn write_image(dir: &Path, manifest: &ImageManifest) {
        std::fs::write(
            dir.join(MANIFEST_FILE),
            serde_json::to_string(manifest).unwrap(),
        )
        .unwrap();
    }

    fn sample() -> ImageManifest {
        ImageManifest {
            name: "t".into(),
            level: Level::Microvm,
            kernel: "vmlinuz".into(),
            initrd: "initrd.img".into(),
            disk: "disk.qcow2".into(),
            cmdline: "console=ttyS0".into(),
            agent_port: AGENT_PORT.into(),
            vsock_port: VSOCK_PORT,
            kernel_version: "6.1.0-56-cloud-amd64".into(),
            built_at: 1,
            vcpus: 1,
            memory_mib: 256,
            builds_dir: BUILDS_DIR.into(),
            sshd: false,
            network: false,
        }
    }

    #[test]
    fn load_checks_files_and_names_the_field() {
        let tmp = tempfile::tempdir().unwrap();
        let m = sample();
        write_image(tmp.path(), &m);
        for f in ["vmlinuz", "initrd.img"] {
            std::fs::write(tmp.path().join(f), b"x").unwrap();
        }
        let e = load(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("field `disk`"), "{e}");
        assert!(e.contains("disk.qcow2"), "{e}");

        std::fs::write(tmp.path().join("disk.qcow2"), b"x").unwrap();
        let loaded = load(tmp.path()).unwrap();
        assert_eq!(loaded, m);
        assert!(loaded.kernel_path(tmp.path()).is_absolute());
        assert_eq!(loaded.disk_path(tmp.path()), tmp.path().join("disk.qcow2"));

        let mut escaping = sample();
        escaping.kernel = "../vmlinuz".into();
        write_image(tmp.path(), &escaping);
        let e = load(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("field `kernel`"), "{e}");

        std::fs::write(tmp.path().join(MANIFEST_FILE), b"{\"name\": 1}").unwrap();
        let e = load(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("image.json"), "{e}");
    }
}
