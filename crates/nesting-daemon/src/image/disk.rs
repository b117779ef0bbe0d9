//! Disks: the microvm's empty ext4 work disk, the vm's debootstrap root (its tree cached
//! between builds) and the conversion to qcow2.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::initramfs::{self, AGENT_GUEST_PATH};
use super::tools::{self, Preflight, Tools, blocking, run};
use super::{AGENT_PORT, BuildOptions, ImageError, VSOCK_PORT};

const MIB: u64 = 1024 * 1024;

/// Room left on a root disk beyond its files (ext4 metadata, journal, job files).
const ROOT_HEADROOM_MIB: u64 = 512;

/// A sparse file of `mib` MiB.
async fn sparse_file(step: &str, path: &Path, mib: u64) -> Result<(), ImageError> {
    let f = tokio::fs::File::create(path)
        .await
        .map_err(|e| ImageError::io(step, path, e))?;
    let bytes = mib.checked_mul(MIB).ok_or_else(|| {
        ImageError::io(
            step,
            path,
            std::io::Error::other(format!("{mib} MiB is too large")),
        )
    })?;
    f.set_len(bytes)
        .await
        .map_err(|e| ImageError::io(step, path, e))
}

/// The microvm's work disk: an empty ext4 file system filling `mib` MiB (sparse).
pub(super) async fn work_disk(tools: &Tools, raw: &Path, mib: u64) -> Result<(), ImageError> {
    const STEP: &str = "making the work disk";
    sparse_file(STEP, raw, mib).await?;
    let mut cmd = tools.command("mke2fs");
    // -m 0: no blocks reserved for root, everything in the guest runs as root anyway.
    cmd.args(["-q", "-t", "ext4", "-m", "0", "-L", "slipway-work", "-F"])
        .arg(raw);
    run(STEP, &mut cmd).await.map(drop)
}

/// `qemu-img convert -O qcow2` (zero blocks take no room in the qcow2).
pub(super) async fn to_qcow2(tools: &Tools, raw: &Path, out: &Path) -> Result<(), ImageError> {
    let mut cmd = tools.command("qemu-img");
    cmd.args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(raw)
        .arg(out);
    run("converting the disk to qcow2", &mut cmd)
        .await
        .map(drop)
}

/// A debootstrap tree kept in the cache directory, complete once its stamp file exists.
#[derive(Debug, Clone)]
pub(super) struct CachedTree {
    /// The root tree.
    pub(super) tree: PathBuf,
    stamp: PathBuf,
    lock: PathBuf,
    cache_dir: PathBuf,
    suite: String,
    sshd: bool,
}

/// The cached minbase tree of `suite` in `cache_dir` (with openssh-server: its own tree, so
/// images without sshd stay as they were).
pub(super) fn cached_tree(cache_dir: &Path, suite: &str, sshd: bool) -> CachedTree {
    let base = if sshd {
        format!("{suite}-minbase-sshd")
    } else {
        format!("{suite}-minbase")
    };
    CachedTree {
        tree: cache_dir.join(&base),
        stamp: cache_dir.join(format!("{base}.complete")),
        lock: cache_dir.join(format!("{base}.lock")),
        cache_dir: cache_dir.to_path_buf(),
        suite: suite.to_string(),
        sshd,
    }
}

impl CachedTree {
    /// Whether a previous build finished this tree.
    pub(super) async fn complete(&self) -> bool {
        tokio::fs::metadata(&self.stamp).await.is_ok()
            && tokio::fs::metadata(&self.tree)
                .await
                .is_ok_and(|m| m.is_dir())
    }

    /// Make the tree unless complete: under a file lock (builds in parallel share the cache),
    /// a leftover partial tree removed first, the stamp written last.
    pub(super) async fn ensure(&self, tools: &Tools, mirror: &str) -> Result<(), ImageError> {
        const STEP: &str = "debootstrap";
        tokio::fs::create_dir_all(&self.cache_dir)
            .await
            .map_err(|e| ImageError::io(STEP, &self.cache_dir, e))?;
        let lock_path = self.lock.clone();
        let _lock = blocking(STEP, move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| ImageError::io("locking the debootstrap cache", &lock_path, e))?;
            Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| {
                ImageError::io(
                    "locking the debootstrap cache",
                    &lock_path,
                    std::io::Error::from(errno),
                )
            })
        })
        .await?;
        if self.complete().await {
            return Ok(());
        }
        tools::remove_tree(&self.tree).await?;
        match tokio::fs::remove_file(&self.stamp).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ImageError::io(STEP, &self.stamp, e)),
        }

        let mut cmd = tools.command("debootstrap");
        cmd.arg("--variant=minbase");
        if self.sshd {
            cmd.arg("--include=openssh-server");
        }
        cmd.arg(&self.suite)
            .arg(&self.tree)
            .arg(mirror)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a cancelled build kills dpkg and chroot children too.
            .process_group(0);
        let command = tools::describe(&cmd);
        let child = cmd.spawn().map_err(|e| ImageError::Command {
            step: STEP.into(),
            command: command.clone(),
            status: "could not start".into(),
            stderr: e.to_string(),
        })?;
        let group = GroupKiller(child.id());
        let out = child.wait_with_output().await;
        group.disarm();
        let failure = match out {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some((format!("failed ({})", out.status), tools::tail(&out.stderr))),
            Err(e) => Some(("could not be waited for".to_string(), e.to_string())),
        };
        if let Some((status, stderr)) = failure {
            let log = self.tree.join("debootstrap/debootstrap.log");
            let log_tail = tokio::fs::read(&log)
                .await
                .map(|b| tools::tail(&b))
                .unwrap_or_default();
            // Unmount what it left mounted now rather than at the next build.
            let _ = tools::remove_tree(&self.tree).await;
            return Err(ImageError::Command {
                step: format!("debootstrap {} into {}", self.suite, self.tree.display()),
                command,
                status,
                stderr: if log_tail.is_empty() {
                    stderr
                } else {
                    format!("{stderr} | debootstrap.log: {log_tail}")
                },
            });
        }
        let mut stamp = format!("suite={}\nmirror={mirror}\nvariant=minbase\n", self.suite);
        if self.sshd {
            stamp.push_str("include=openssh-server\n");
        }
        tokio::fs::write(&self.stamp, stamp)
            .await
            .map_err(|e| ImageError::io(STEP, &self.stamp, e))
    }
}

/// Kills a process group when dropped (unless disarmed).
struct GroupKiller(Option<u32>);

impl GroupKiller {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // ESRCH: the group is already gone.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The vm root: the cached tree copied to `root` (hard links when on the same file system,
/// so it is instant; every file this build adds replaces a link, never writes through one),
/// plus busybox, the agent with any library the tree lacks, `/sbin/slipway-init` and `/work`.
pub(super) async fn stage_root(
    tools: &Tools,
    tree: &Path,
    root: &Path,
    opts: &BuildOptions,
    pre: &Preflight,
) -> Result<(), ImageError> {
    const STEP: &str = "staging the root tree";
    let libs = initramfs::shared_libraries(tools, &opts.agent).await?;
    let mut linked = tools.command("cp");
    linked.arg("-al").arg(tree).arg(root);
    if run(STEP, &mut linked).await.is_err() {
        // Another file system: copy.
        tools::remove_tree(root).await?;
        let mut copy = tools.command("cp");
        copy.arg("-a").arg(tree).arg(root);
        run(STEP, &mut copy).await?;
    }

    let root = root.to_path_buf();
    let busybox = pre.busybox.clone();
    let agent = opts.agent.clone();
    let init = initramfs::slipway_init_script(AGENT_PORT, VSOCK_PORT, opts.sshd, opts.network);
    let sshd = opts.sshd;
    blocking(STEP, move || {
        let io = |p: &Path, e| ImageError::io(STEP, p, e);
        let put = |guest: &str, from: Put<'_>| -> Result<(), ImageError> {
            let dest = resolve_in_root(&root, Path::new(guest)).map_err(|e| io(&root, e))?;
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            if dest.symlink_metadata().is_ok() {
                std::fs::remove_file(&dest).map_err(|e| io(&dest, e))?;
            }
            let mode = match from {
                Put::Copy(src, mode) => {
                    std::fs::copy(src, &dest).map_err(|e| io(src, e))?;
                    mode
                }
                Put::Text(text, mode) => {
                    std::fs::write(&dest, text).map_err(|e| io(&dest, e))?;
                    mode
                }
            };
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                .map_err(|e| io(&dest, e))
        };
        put("/bin/busybox", Put::Copy(&busybox, 0o755))?;
        put(AGENT_GUEST_PATH, Put::Copy(&agent, 0o755))?;
        put("/sbin/slipway-init", Put::Text(&init, 0o755))?;
        put("/etc/hostname", Put::Text("slipway\n", 0o644))?;
        put(
            "/etc/hosts",
            Put::Text("127.0.0.1 localhost slipway\n::1 localhost\n", 0o644),
        )?;
        // The tree's own glibc stays: the agent only gets what the tree lacks.
        for lib in &libs {
            let dest = resolve_in_root(&root, lib).map_err(|e| io(&root, e))?;
            if !dest.exists() {
                let perms = std::fs::metadata(lib).map_err(|e| io(lib, e))?.mode() & 0o7777;
                put(&lib.to_string_lossy(), Put::Copy(lib, perms))?;
            }
        }
        if sshd {
            // openssh-server's postinst made host keys in the cached tree: every VM would share
            // them. Each guest makes its own at boot instead.
            let ssh_dir = resolve_in_root(&root, Path::new("/etc/ssh/x"))
                .map_err(|e| io(&root, e))?
                .with_file_name("");
            for entry in std::fs::read_dir(&ssh_dir).map_err(|e| io(&ssh_dir, e))? {
                let entry = entry.map_err(|e| io(&ssh_dir, e))?;
                if entry.file_name().to_string_lossy().starts_with("ssh_host_") {
                    std::fs::remove_file(entry.path()).map_err(|e| io(&entry.path(), e))?;
                }
            }
        }
        let work =
            resolve_in_root(&root, Path::new(super::BUILDS_DIR)).map_err(|e| io(&root, e))?;
        std::fs::create_dir_all(&work).map_err(|e| io(&work, e))
    })
    .await
}

/// What [`stage_root`] puts at a path.
enum Put<'a> {
    Copy(&'a Path, u32),
    Text(&'a str, u32),
}

/// `guest` (absolute) inside the tree `root`, with symlinks in its directories followed
/// inside the tree (an absolute link such as `/lib64 -> /usr/lib64` must not lead out to the
/// host). The last component is not followed: it is what gets replaced.
pub(super) fn resolve_in_root(root: &Path, guest: &Path) -> std::io::Result<PathBuf> {
    let mut pending: VecDeque<OsString> = normal_parts(guest);
    let Some(last) = pending.pop_back() else {
        return Ok(root.to_path_buf());
    };
    let mut cur: Vec<OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            cur.pop();
            continue;
        }
        let candidate = cur
            .iter()
            .fold(root.to_path_buf(), |p, c| p.join(c))
            .join(&part);
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(std::io::Error::other(format!(
                        "too many symlinks resolving {} in {}",
                        guest.display(),
                        root.display()
                    )));
                }
                let target = std::fs::read_link(&candidate)?;
                if target.is_absolute() {
                    cur.clear();
                }
                for p in normal_parts(&target).into_iter().rev() {
                    pending.push_front(p);
                }
            }
            _ => cur.push(part),
        }
    }
    Ok(cur
        .iter()
        .fold(root.to_path_buf(), |p, c| p.join(c))
        .join(last))
}

fn normal_parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Bytes the files under `root` occupy (hard links counted once).
fn tree_bytes(root: &Path) -> Result<u64, ImageError> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| ImageError::io("sizing the root tree", &dir, e))?;
        for e in entries {
            let e = e.map_err(|err| ImageError::io("sizing the root tree", &dir, err))?;
            let m = e
                .path()
                .symlink_metadata()
                .map_err(|err| ImageError::io("sizing the root tree", &e.path(), err))?;
            if seen.insert((m.dev(), m.ino())) {
                total += m.blocks() * 512;
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(total)
}

/// The vm root disk: ext4 made from `root` (`mke2fs -d`), its files plus
/// [`ROOT_HEADROOM_MIB`].
pub(super) async fn root_disk(tools: &Tools, root: &Path, raw: &Path) -> Result<(), ImageError> {
    const STEP: &str = "making the root disk";
    let owned = root.to_path_buf();
    let bytes = blocking(STEP, move || tree_bytes(&owned)).await?;
    let mib = bytes.div_ceil(MIB) + ROOT_HEADROOM_MIB;
    sparse_file(STEP, raw, mib).await?;
    let mut cmd = tools.command("mke2fs");
    cmd.args(["-q", "-t", "ext4", "-m", "0", "-L", "slipway-root", "-d"])
        .arg(root)
        .arg("-F")
        .arg(raw)
        .arg(format!("{mib}M"));
    run(STEP, &mut cmd).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(root.join("usr/lib64")).unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        // An absolute link would point at the host's /usr/lib64 if followed naively.
        symlink("/usr/lib64", root.join("lib64")).unwrap();
        assert_eq!(
            resolve_in_root(root, Path::new("/bin/busybox")).unwrap(),
            root.join("usr/bin/busybox")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("/lib64/ld-linux-x86-64.so.2")).unwrap(),
            root.join("usr/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("/../../etc/x")).unwrap(),
            root.join("etc/x")
        );
        symlink("loop", root.join("loop")).unwrap();
        assert!(resolve_in_root(root, Path::new("/loop/x")).is_err());
    }

    #[test]
    fn hard_links_are_counted_once() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("a"), vec![1u8; 100_000]).unwrap();
        let one = tree_bytes(t.path()).unwrap();
        std::fs::hard_link(t.path().join("a"), t.path().join("b")).unwrap();
        assert_eq!(tree_bytes(t.path()).unwrap(), one);
    }
}
