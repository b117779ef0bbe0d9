//! Before a build: find every tool, the kernel, its modules and the agent, and report every
//! missing Debian package at once. Also the helpers that run tools.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use slipway_nesting::spec::Level;
use tokio::process::Command;

use super::{BuildOptions, ImageError};

/// Something the build needs that is not installed, and the Debian package that provides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingPackage {
    /// What is missing (`qemu-img`, `a static busybox`, …).
    pub what: String,
    /// The Debian package to install.
    pub package: String,
}

impl MissingPackage {
    fn new(what: impl Into<String>, package: impl Into<String>) -> Self {
        MissingPackage {
            what: what.into(),
            package: package.into(),
        }
    }

    /// `qemu-img (qemu-utils), cpio (cpio)`.
    pub(super) fn describe_all(all: &[MissingPackage]) -> String {
        all.iter()
            .map(|m| format!("{} ({})", m.what, m.package))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The distinct packages, in order.
    pub(super) fn packages(all: &[MissingPackage]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for m in all {
            if !out.contains(&m.package) {
                out.push(m.package.clone());
            }
        }
        out
    }
}

/// Tools found on this machine, by the name the build uses.
#[derive(Debug, Clone, Default)]
pub(super) struct Tools {
    found: HashMap<&'static str, PathBuf>,
}

impl Tools {
    /// The tool's path (preflight made sure it is there; the bare name is a harmless fallback
    /// that lets `Command` report "not found" with the name).
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.found
            .get(name)
            .cloned()
            .unwrap_or_else(|| PathBuf::from(name))
    }

    /// A command for the tool, killed if the build is dropped (a cancelled build must not
    /// leave debootstrap running).
    pub(super) fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.path(name));
        c.kill_on_drop(true);
        c
    }
}

/// The kernel being packaged.
#[derive(Debug, Clone)]
pub(super) struct KernelInfo {
    /// The kernel image.
    pub(super) path: PathBuf,
    /// Its `uname -r`.
    pub(super) version: String,
    /// `/lib/modules/<version>`.
    pub(super) modules_dir: PathBuf,
}

/// How a module file is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compression {
    None,
    Xz,
    Zstd,
    Gzip,
}

/// A module file to copy into the initramfs, in load order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ModuleFile {
    /// Module name (`virtio_mmio`).
    pub(super) name: String,
    /// Path relative to the modules directory, as in `modules.dep`.
    pub(super) rel: String,
    /// Its compression.
    pub(super) compression: Compression,
}

impl ModuleFile {
    /// The uncompressed file's path relative to the modules directory (busybox insmod reads
    /// only plain `.ko`).
    pub(super) fn plain_rel(&self) -> String {
        strip_compression(&self.rel).0.to_string()
    }
}

/// Everything found before the build starts.
#[derive(Debug, Clone)]
pub(super) struct Preflight {
    pub(super) tools: Tools,
    pub(super) kernel: KernelInfo,
    /// Modules in load order (dependencies first).
    pub(super) modules: Vec<ModuleFile>,
    /// A static busybox.
    pub(super) busybox: PathBuf,
    /// The host's TSC frequency, when it can be told (see `cmdline`).
    pub(super) tsc_khz: Option<u64>,
}

/// Check the agent, the kernel, its modules and every tool; one error lists every missing
/// package. Runs on the blocking pool (it stats and reads files).
pub(super) async fn preflight(opts: &BuildOptions) -> Result<Preflight, ImageError> {
    let opts = opts.clone();
    tokio::task::spawn_blocking(move || preflight_blocking(&opts))
        .await
        .map_err(|e| ImageError::Io {
            step: "checking tools".into(),
            path: PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        })?
}

fn preflight_blocking(opts: &BuildOptions) -> Result<Preflight, ImageError> {
    check_agent(&opts.agent)?;
    let mut missing = Vec::new();

    let mut tools = Tools::default();
    let mut need = vec![
        ("qemu-img", "qemu-utils"),
        ("cpio", "cpio"),
        ("gzip", "gzip"),
        ("mke2fs", "e2fsprogs"),
        ("ldd", "libc-bin"),
    ];
    match opts.level {
        Level::Microvm => need.push(("bash", "bash")),
        Level::Vm => need.extend([("debootstrap", "debootstrap"), ("cp", "coreutils")]),
    }
    for (tool, package) in need {
        match find_tool(tool) {
            Some(p) => {
                tools.found.insert(tool, p);
            }
            None => missing.push(MissingPackage::new(tool, package)),
        }
    }
    // Optional: only to clean up a debootstrap tree a killed build left with mounts in it.
    if let Some(p) = find_tool("umount") {
        tools.found.insert("umount", p);
    }

    let busybox = find_static_busybox();
    if busybox.is_none() {
        missing.push(MissingPackage::new("a static busybox", "busybox-static"));
    }

    let kernel = match &opts.kernel {
        Some(path) => Some(explicit_kernel(path)?),
        None => {
            let k = newest_cloud_kernel(Path::new("/boot"));
            if k.is_none() {
                missing.push(MissingPackage::new(
                    "a guest kernel /boot/vmlinuz-*-cloud-amd64",
                    "linux-image-cloud-amd64",
                ));
            }
            k
        }
    };

    let mut resolved = None;
    if let Some(kernel) = &kernel {
        let version = kernel_version(kernel)?;
        let modules_dir = Path::new("/lib/modules").join(&version);
        if modules_dir.is_dir() {
            let modules = guest_modules(
                opts.level,
                opts.sshd || opts.network,
                &version,
                &modules_dir,
            )?;
            for (compression, tool, package) in [
                (Compression::Xz, "xz", "xz-utils"),
                (Compression::Zstd, "zstd", "zstd"),
            ] {
                if modules.iter().any(|m| m.compression == compression) {
                    match find_tool(tool) {
                        Some(p) => {
                            tools.found.insert(tool, p);
                        }
                        None => missing.push(MissingPackage::new(
                            format!("{tool} (the kernel's modules are compressed)"),
                            package,
                        )),
                    }
                }
            }
            resolved = Some((
                KernelInfo {
                    path: kernel.clone(),
                    version,
                    modules_dir,
                },
                modules,
            ));
        } else {
            missing.push(MissingPackage::new(
                format!("kernel modules {}", modules_dir.display()),
                format!("linux-image-{version}"),
            ));
        }
    }

    if !missing.is_empty() {
        return Err(ImageError::MissingPackages {
            level: opts.level.as_str(),
            missing,
        });
    }
    match (resolved, busybox) {
        (Some((kernel, modules)), Some(busybox)) => Ok(Preflight {
            tools,
            kernel,
            modules,
            busybox,
            tsc_khz: host_tsc_khz(),
        }),
        // Unreachable: each None above added to `missing`.
        _ => Err(ImageError::MissingPackages {
            level: opts.level.as_str(),
            missing: vec![MissingPackage::new(
                "a guest kernel",
                "linux-image-cloud-amd64",
            )],
        }),
    }
}

fn check_agent(path: &Path) -> Result<(), ImageError> {
    let bad = |reason: String| ImageError::Agent {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| {
        bad(if e.kind() == std::io::ErrorKind::NotFound {
            "does not exist (build it with `cargo build -p slipway-guest-agent`)".into()
        } else {
            e.to_string()
        })
    })?;
    if !meta.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(bad("is not executable".into()));
    }
    Ok(())
}

fn explicit_kernel(path: &Path) -> Result<PathBuf, ImageError> {
    let bad = |reason: String| ImageError::Kernel {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(path.to_path_buf()),
        Ok(_) => Err(bad("is not a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(bad("does not exist".into())),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// The newest `vmlinuz-*-cloud-amd64` in `boot`, by version order.
pub fn newest_cloud_kernel(boot: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(boot).ok()?;
    let mut best: Option<(String, PathBuf)> = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(version) = name.strip_prefix("vmlinuz-") else {
            continue;
        };
        if !version.ends_with("-cloud-amd64") || !e.path().is_file() {
            continue;
        }
        let newer = best
            .as_ref()
            .is_none_or(|(v, _)| version_cmp(version, v) == Ordering::Greater);
        if newer {
            best = Some((version.to_string(), e.path()));
        }
    }
    best.map(|(_, p)| p)
}

/// Compare version strings number by number (`6.1.0-10` > `6.1.0-9`).
pub(super) fn version_cmp(a: &str, b: &str) -> Ordering {
    fn parts(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    for (x, y) in parts(a).into_iter().zip(parts(b)) {
        let o = match (x, y) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

/// The kernel's `uname -r`: from the bzImage header (a kernel copied anywhere still says
/// its version), else from a `vmlinuz-<version>` file name.
fn kernel_version(path: &Path) -> Result<String, ImageError> {
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut head))
        .map_err(|e| ImageError::Kernel {
            path: path.to_path_buf(),
            reason: format!("cannot read it: {e}"),
        })?;
    if let Some(v) = bzimage_version(&head) {
        return Ok(v);
    }
    let name = path.file_name().and_then(OsStr::to_str).unwrap_or("");
    match name.strip_prefix("vmlinuz-") {
        Some(v) if !v.is_empty() => Ok(v.to_string()),
        _ => Err(ImageError::Kernel {
            path: path.to_path_buf(),
            reason: "cannot tell its version: not a bzImage with a version string, and the \
                     file name is not vmlinuz-<version>"
                .into(),
        }),
    }
}

/// The version string of an x86 bzImage (boot protocol: "HdrS" at 0x202, a pointer at 0x20e
/// to the string, minus 0x200).
pub(super) fn bzimage_version(head: &[u8]) -> Option<String> {
    if head.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let ptr = u16::from_le_bytes([*head.get(0x20e)?, *head.get(0x20f)?]) as usize;
    if ptr == 0 {
        return None;
    }
    let start = ptr + 0x200;
    let rest = head.get(start..)?;
    let end = rest.iter().position(|&b| b == 0 || b == b' ')?;
    let v = std::str::from_utf8(&rest[..end]).ok()?;
    (!v.is_empty()).then(|| v.to_string())
}

/// Find an executable on `PATH` or in the sbin directories (`mke2fs` lives in `/usr/sbin`,
/// which a non-root `PATH` often lacks).
pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for d in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A statically linked busybox (the Debian `busybox` package's is dynamic; `busybox-static`
/// installs a static one at `/bin/busybox`).
fn find_static_busybox() -> Option<PathBuf> {
    let mut candidates = vec![
        PathBuf::from("/bin/busybox"),
        PathBuf::from("/usr/bin/busybox"),
    ];
    candidates.extend(find_tool("busybox"));
    candidates
        .into_iter()
        .find(|p| is_executable(p) && is_static_elf(p) == Some(true))
}

/// Whether `path` is an ELF without a program interpreter; `None` if it is not an ELF.
pub(super) fn is_static_elf(path: &Path) -> Option<bool> {
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut head))
        .ok()?;
    elf_has_interp(&head).map(|interp| !interp)
}

/// Whether an ELF image (little-endian, 32 or 64 bit) has a `PT_INTERP` program header.
pub(super) fn elf_has_interp(b: &[u8]) -> Option<bool> {
    if b.get(0..4)? != b"\x7fELF" || *b.get(5)? != 1 {
        return None;
    }
    let u16at = |o: usize| Some(u16::from_le_bytes([*b.get(o)?, *b.get(o + 1)?]) as usize);
    let u32at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?) as usize);
    let (phoff, phentsize, phnum) = match *b.get(4)? {
        2 => (
            u64::from_le_bytes(b.get(0x20..0x28)?.try_into().ok()?) as usize,
            u16at(0x36)?,
            u16at(0x38)?,
        ),
        1 => (u32at(0x1c)?, u16at(0x2a)?, u16at(0x2c)?),
        _ => return None,
    };
    const PT_INTERP: usize = 3;
    for i in 0..phnum {
        if u32at(phoff + i * phentsize)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// The modules a guest of `level` needs, with their dependencies, in load order (`net`: and
/// the virtio NIC, for networked and sshd images).
fn guest_modules(
    level: Level,
    net: bool,
    version: &str,
    modules_dir: &Path,
) -> Result<Vec<ModuleFile>, ImageError> {
    let read = |name: &str| {
        let p = modules_dir.join(name);
        std::fs::read_to_string(&p).map_err(|e| ImageError::Module {
            kernel_version: version.to_string(),
            module: "(all)".into(),
            reason: format!(
                "cannot read {}: {e} (run `depmod {version}` if the file is missing)",
                p.display()
            ),
        })
    };
    let dep = read("modules.dep")?;
    // modules.builtin is absent on kernels with no built-in modules.
    let builtin = std::fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
    let mut wanted = wanted_modules(level);
    if net {
        wanted.push(("virtio_net", true));
    }
    resolve_modules(&dep, &builtin, &wanted, version)
}

/// What the guest needs: the transport, block, console, vsock when present, ext4.
pub(super) fn wanted_modules(level: Level) -> Vec<(&'static str, bool)> {
    let transport = match level {
        Level::Microvm => "virtio_mmio",
        Level::Vm => "virtio_pci",
    };
    vec![
        (transport, true),
        ("virtio_blk", true),
        ("virtio_console", true),
        ("vsock", false),
        ("vmw_vsock_virtio_transport", false),
        ("ext4", true),
        // ext4 asks the crypto API for crc32c; with no modprobe in the guest it must be loaded.
        ("crc32c_generic", false),
    ]
}

/// `name.ko[.xz|.zst|.gz]` → (`name.ko`, compression).
fn strip_compression(rel: &str) -> (&str, Compression) {
    for (ext, c) in [
        (".xz", Compression::Xz),
        (".zst", Compression::Zstd),
        (".gz", Compression::Gzip),
    ] {
        if let Some(s) = rel.strip_suffix(ext) {
            return (s, c);
        }
    }
    (rel, Compression::None)
}

/// A module's name from its path (`kernel/drivers/virtio/virtio-mmio.ko.xz` → `virtio_mmio`).
fn module_name(rel: &str) -> String {
    let (plain, _) = strip_compression(rel);
    let file = plain.rsplit('/').next().unwrap_or(plain);
    file.strip_suffix(".ko").unwrap_or(file).replace('-', "_")
}

/// Resolve `wanted` (name, required) against `modules.dep` and `modules.builtin`: module
/// files in load order, each after its dependencies, built-in ones skipped. Optional modules
/// the kernel lacks are skipped; required ones are an error. `crc32c_generic` only matters
/// when ext4 is a module.
pub(super) fn resolve_modules(
    dep: &str,
    builtin: &str,
    wanted: &[(&str, bool)],
    version: &str,
) -> Result<Vec<ModuleFile>, ImageError> {
    let mut deps: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut by_name: HashMap<String, &str> = HashMap::new();
    for line in dep.lines() {
        let Some((path, rest)) = line.split_once(':') else {
            continue;
        };
        let path = path.trim();
        deps.insert(path, rest.split_whitespace().collect());
        by_name.insert(module_name(path), path);
    }
    let builtin: Vec<String> = builtin
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(module_name)
        .collect();
    let ext4_is_module = by_name.contains_key("ext4");

    let mut order: Vec<&str> = Vec::new();
    fn visit<'a>(
        path: &'a str,
        deps: &HashMap<&'a str, Vec<&'a str>>,
        order: &mut Vec<&'a str>,
        depth: usize,
    ) {
        if order.contains(&path) || depth > 64 {
            return;
        }
        for d in deps.get(path).map(Vec::as_slice).unwrap_or(&[]) {
            visit(d, deps, order, depth + 1);
        }
        if !order.contains(&path) {
            order.push(path);
        }
    }
    for &(name, required) in wanted {
        if name == "crc32c_generic" && !ext4_is_module {
            continue;
        }
        if builtin.iter().any(|b| b == name) {
            continue;
        }
        match by_name.get(name) {
            Some(path) => visit(path, &deps, &mut order, 0),
            None if required => {
                return Err(ImageError::Module {
                    kernel_version: version.to_string(),
                    module: name.to_string(),
                    reason: "neither built in (modules.builtin) nor a module (modules.dep); \
                             the guest needs it"
                        .into(),
                });
            }
            None => {}
        }
    }
    Ok(order
        .into_iter()
        .map(|rel| ModuleFile {
            name: module_name(rel),
            rel: rel.to_string(),
            compression: strip_compression(rel).1,
        })
        .collect())
}

/// The host's TSC frequency in kHz from `/proc/cpuinfo`'s `bogomips` (on x86 the kernel
/// derives it from the calibrated TSC: bogomips = 2 × MHz), only with a constant TSC.
pub fn host_tsc_khz() -> Option<u64> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    parse_tsc_khz(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

pub(super) fn parse_tsc_khz(cpuinfo: &str) -> Option<u64> {
    let field = |key: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let flags = field("flags")?;
    if !flags.split_whitespace().any(|f| f == "constant_tsc") {
        return None;
    }
    let bogomips: f64 = field("bogomips")?.parse().ok()?;
    let khz = (bogomips * 500.0).round();
    (100_000.0..100_000_000.0)
        .contains(&khz)
        .then_some(khz as u64)
}

/// `program arg arg` for error messages.
pub(super) fn describe(cmd: &Command) -> String {
    let std = cmd.as_std();
    std::iter::once(std.get_program())
        .chain(std.get_args())
        .map(|a| {
            let s = a.to_string_lossy();
            if s.contains(' ') || s.is_empty() {
                format!("'{s}'")
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last lines of a tool's output, for an error message.
pub(super) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(8)..].join(" | ");
    if tail.is_empty() {
        "(no output)".into()
    } else {
        tail
    }
}

/// Run `cmd` to completion, capturing its output; an error names `step` and the command.
pub(super) async fn run(step: &str, cmd: &mut Command) -> Result<Output, ImageError> {
    let out = cmd.output().await.map_err(|e| ImageError::Command {
        step: step.to_string(),
        command: describe(cmd),
        status: "could not start".into(),
        stderr: e.to_string(),
    })?;
    if !out.status.success() {
        let mut stderr = tail(&out.stderr);
        if out.stderr.is_empty() {
            stderr = tail(&out.stdout);
        }
        return Err(ImageError::Command {
            step: step.to_string(),
            command: describe(cmd),
            status: format!("failed ({})", out.status),
            stderr,
        });
    }
    Ok(out)
}

/// Run blocking file work on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    step: &str,
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::Io {
            step: step.to_string(),
            path: PathBuf::new(),
            source: std::io::Error::other(format!("worker failed: {e}")),
        })?
}

/// Mount points at or under `dir`, deepest first (a killed debootstrap leaves `proc` and `sys`
/// mounted in its tree).
async fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = tokio::fs::read_to_string("/proc/self/mountinfo").await else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.clone().take(3).collect();
            if digits.len() == 3
                && let Ok(v) = u8::from_str_radix(&digits, 8)
            {
                out.push(v as char);
                chars.nth(2);
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Remove a directory tree (no error if absent). Unmounts anything mounted inside first and
/// refuses if that fails: removing through a live `/proc` or `/sys` mount must never happen.
pub(super) async fn remove_tree(dir: &Path) -> Result<(), ImageError> {
    let Ok(canonical) = tokio::fs::canonicalize(dir).await else {
        return Ok(());
    };
    let mounts = mounts_under(&canonical).await;
    if !mounts.is_empty() {
        let umount = find_tool("umount").unwrap_or_else(|| PathBuf::from("umount"));
        for m in &mounts {
            let _ = Command::new(&umount).arg("-l").arg(m).output().await;
        }
        let left = mounts_under(&canonical).await;
        if let Some(m) = left.first() {
            return Err(ImageError::Io {
                step: format!("removing {}", dir.display()),
                path: m.clone(),
                source: std::io::Error::other("still mounted; unmount it by hand"),
            });
        }
    }
    let owned = dir.to_path_buf();
    blocking(
        "removing a temporary tree",
        move || match std::fs::remove_dir_all(&owned) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::io("removing a temporary tree", &owned, e)),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/vmw_vsock/vsock.ko:
kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko
kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/net/vmw_vsock/vsock.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
";

    #[test]
    fn modules_come_after_their_dependencies() {
        let builtin = "kernel/fs/ext4/ext4.ko\nkernel/fs/jbd2/jbd2.ko\n";
        let m = resolve_modules(DEP, builtin, &wanted_modules(Level::Microvm), "6.1").unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "virtio_ring",
                "virtio",
                "virtio_mmio",
                "virtio_blk",
                "virtio_console",
                "vsock",
                "vmw_vsock_virtio_transport_common",
                "vmw_vsock_virtio_transport"
            ]
        );
        let blk = m.iter().find(|m| m.name == "virtio_blk").unwrap();
        assert_eq!(blk.compression, Compression::Xz);
        assert_eq!(blk.plain_rel(), "kernel/drivers/block/virtio_blk.ko");

        let vm = resolve_modules(DEP, builtin, &wanted_modules(Level::Vm), "6.1").unwrap();
        let names: Vec<&str> = vm.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            &names[..5],
            [
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio_ring",
                "virtio",
                "virtio_pci"
            ]
        );
    }

    #[test]
    fn a_required_module_the_kernel_lacks_is_named() {
        let e = resolve_modules(DEP, "", &wanted_modules(Level::Microvm), "6.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("module ext4"), "{e}");
        let dep = DEP.replace("virtio_console", "virtio_consolx");
        let e = resolve_modules(
            &dep,
            "kernel/fs/ext4/ext4.ko",
            &wanted_modules(Level::Vm),
            "6.1",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("module virtio_console"), "{e}");
    }

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(
            version_cmp("6.1.0-10-cloud-amd64", "6.1.0-9-cloud-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("6.10.0-1-cloud-amd64", "6.9.0-1-cloud-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("6.1.0-9-cloud-amd64", "6.1.0-9-cloud-amd64"),
            Ordering::Equal
        );
    }

    #[test]
    fn tsc_from_cpuinfo() {
        let ci =
            "processor\t: 0\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\nbogomips\t: 5200.00\n";
        assert_eq!(parse_tsc_khz(ci), Some(2_600_000));
        assert_eq!(parse_tsc_khz(&ci.replace("constant_tsc", "")), None);
    }

    #[test]
    fn elf_interp() {
        assert_eq!(is_static_elf(Path::new("/bin/sh")), Some(false));
        assert_eq!(elf_has_interp(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn bzimage_header() {
        let mut h = vec![0u8; 0x400];
        h[0x202..0x206].copy_from_slice(b"HdrS");
        h[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        h[0x300..0x317].copy_from_slice(b"6.1.0-56-cloud-amd64 (d");
        assert_eq!(bzimage_version(&h).as_deref(), Some("6.1.0-56-cloud-amd64"));
        assert_eq!(bzimage_version(&h[..0x100]), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
        assert_eq!(unescape_mount("/plain"), "/plain");
    }
}
