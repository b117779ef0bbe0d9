//! The initramfs: static busybox and its applet links, bash and the agent with their shared
//! libraries (microvm), the kernel modules the guest needs and a busybox-sh `/init`; packed as a
//! gzip'd newc cpio. Also the `/sbin/slipway-init` script of vm root disks.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use slipway_nesting::spec::Level;
use tokio::io::AsyncWriteExt;

use super::tools::{self, Compression, Preflight, Tools, blocking, run};
use super::{AGENT_PORT, BUILDS_DIR, BuildOptions, ImageError, VSOCK_PORT};

const STEP: &str = "staging initramfs";

/// Where the agent lives in the guest (both levels).
pub(super) const AGENT_GUEST_PATH: &str = "/sbin/slipway-guest-agent";

/// A module as `/init` loads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GuestModule {
    /// Module name.
    pub(super) name: String,
    /// Absolute path in the initramfs.
    pub(super) path: String,
    /// virtio_mmio only: it accepts `device=` (the kernel has
    /// `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES`), so `/init` passes the command line's
    /// `virtio_mmio.device=` values on.
    pub(super) mmio_devices: bool,
}

/// Lay out the initramfs for `opts.level` in `staging` (created here).
pub(super) async fn stage(
    opts: &BuildOptions,
    pre: &Preflight,
    staging: &Path,
) -> Result<(), ImageError> {
    let applets = busybox_applets(&pre.busybox).await?;
    // (host file, path in the guest)
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    if opts.level == Level::Microvm {
        files.push((pre.tools.path("bash"), "/bin/bash".into()));
        files.push((opts.agent.clone(), AGENT_GUEST_PATH.into()));
    }
    let mut libs: Vec<PathBuf> = Vec::new();
    for (host, _) in &files {
        for lib in shared_libraries(&pre.tools, host).await? {
            if !libs.contains(&lib) {
                libs.push(lib);
            }
        }
    }

    let staging_owned = staging.to_path_buf();
    let busybox = pre.busybox.clone();
    let level = opts.level;
    blocking(STEP, move || {
        lay_out(&staging_owned, level, &busybox, &applets, &files, &libs)
    })
    .await?;

    let modules = copy_modules(pre, staging).await?;
    let script = init_script(level, &modules, AGENT_PORT, VSOCK_PORT, opts.network);
    let init = staging.join("init");
    write_exec(&init, script).await
}

/// The directories, busybox and its links, binaries, libraries and a few /etc files.
fn lay_out(
    staging: &Path,
    level: Level,
    busybox: &Path,
    applets: &[String],
    files: &[(PathBuf, String)],
    libs: &[PathBuf],
) -> Result<(), ImageError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| ImageError::io(STEP, &p, e)
    };
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "lib", "etc", "proc", "sys", "dev", "tmp", "run",
        "root", "mnt", "newroot", "work", "var/tmp",
    ] {
        let p = staging.join(d);
        std::fs::create_dir_all(&p).map_err(io(&p))?;
    }
    copy_exec(busybox, &staging.join("bin/busybox"))?;
    for (host, guest) in files {
        copy_exec(host, &in_staging(staging, guest))?;
    }
    if level == Level::Microvm {
        // Scripts that say #!/usr/bin/bash (merged-/usr hosts) find it too.
        let p = staging.join("usr/bin/bash");
        symlink("/bin/bash", &p).map_err(io(&p))?;
    }
    // `busybox --install -s`: one link per applet at its usual place; never over a real file
    // (the list names `busybox` itself, and bash is ours).
    for applet in applets {
        let rel = applet.trim_start_matches('/');
        let p = staging.join(rel);
        if rel.is_empty() || p.file_name().is_some_and(|n| n == "busybox") {
            continue;
        }
        if p.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        symlink("/bin/busybox", &p).map_err(io(&p))?;
    }
    for lib in libs {
        let dest = in_staging(staging, &lib.to_string_lossy());
        if dest.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // fs::copy follows the host's symlinks: the guest gets the real library at the path
        // the loader will look for.
        std::fs::copy(lib, &dest).map_err(io(lib))?;
    }
    if level == Level::Microvm {
        for (name, text) in ETC_FILES {
            let p = staging.join("etc").join(name);
            std::fs::write(&p, text).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// Minimal identity files: jobs run `id`, `whoami` and resolve `localhost`.
pub(super) const ETC_FILES: &[(&str, &str)] = &[
    (
        "passwd",
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    ),
    ("group", "root:x:0:\nnogroup:x:65534:\n"),
    ("hosts", "127.0.0.1 localhost slipway\n::1 localhost\n"),
    ("hostname", "slipway\n"),
];

fn in_staging(staging: &Path, guest: &str) -> PathBuf {
    staging.join(guest.trim_start_matches('/'))
}

fn copy_exec(from: &Path, to: &Path) -> Result<(), ImageError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| ImageError::io(STEP, parent, e))?;
    }
    std::fs::copy(from, to).map_err(|e| ImageError::io(STEP, from, e))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| ImageError::io(STEP, to, e))
}

/// Write an executable script.
async fn write_exec(dest: &Path, text: String) -> Result<(), ImageError> {
    tokio::fs::write(dest, text)
        .await
        .map_err(|e| ImageError::io(STEP, dest, e))?;
    tokio::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
        .await
        .map_err(|e| ImageError::io(STEP, dest, e))
}

/// `busybox --list-full`: applet paths such as `usr/bin/awk`.
async fn busybox_applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let out = run(
        "listing busybox applets",
        tokio::process::Command::new(busybox)
            .arg("--list-full")
            .kill_on_drop(true),
    )
    .await?;
    let list: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains(".."))
        .map(String::from)
        .collect();
    for needed in [
        "sh",
        "mount",
        "insmod",
        "switch_root",
        "poweroff",
        "sleep",
        "mkdir",
        "grep",
        "cat",
        "hostname",
    ] {
        if !list.iter().any(|a| a.rsplit('/').next() == Some(needed)) {
            return Err(ImageError::Command {
                step: "listing busybox applets".into(),
                command: format!("{} --list-full", busybox.display()),
                status: "lacks an applet".into(),
                stderr: format!("expected applet {needed:?}, the guest's /init uses it"),
            });
        }
    }
    Ok(list)
}

/// The libraries `ldd` lists for `binary` (and the dynamic loader), as absolute host paths;
/// none for a static binary or a script.
pub(super) async fn shared_libraries(
    tools: &Tools,
    binary: &Path,
) -> Result<Vec<PathBuf>, ImageError> {
    let step = format!("finding the shared libraries of {}", binary.display());
    let mut cmd = tools.command("ldd");
    cmd.arg(binary);
    let out = cmd.output().await.map_err(|e| ImageError::Command {
        step: step.clone(),
        command: tools::describe(&cmd),
        status: "could not start".into(),
        stderr: e.to_string(),
    })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(ImageError::Command {
            step,
            command: tools::describe(&cmd),
            status: format!("failed ({})", out.status),
            stderr: tools::tail(text.as_bytes()),
        });
    }
    parse_ldd(&text).map_err(|missing| ImageError::Command {
        step,
        command: tools::describe(&cmd),
        status: "reports a missing library".into(),
        stderr: format!("{missing} => not found; install the package that provides it"),
    })
}

/// Paths in `ldd` output; `Err(name)` for a library ldd could not find.
pub(super) fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(name.trim().to_string());
                }
                rest
            }
            None => line,
        };
        let path = target.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            let p = PathBuf::from(path);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Copy (decompressing) the modules to `/lib/modules/<version>/…`; what `/init` loads.
async fn copy_modules(pre: &Preflight, staging: &Path) -> Result<Vec<GuestModule>, ImageError> {
    let mut loaded = Vec::new();
    for m in &pre.modules {
        let src = pre.kernel.modules_dir.join(&m.rel);
        let guest = format!("/lib/modules/{}/{}", pre.kernel.version, m.plain_rel());
        let dest = in_staging(staging, &guest);
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| ImageError::io(STEP, parent, e))?;
        }
        let tool = match m.compression {
            Compression::None => None,
            Compression::Xz => Some("xz"),
            Compression::Zstd => Some("zstd"),
            Compression::Gzip => Some("gzip"),
        };
        match tool {
            None => {
                tokio::fs::copy(&src, &dest)
                    .await
                    .map_err(|e| ImageError::io(STEP, &src, e))?;
            }
            Some(tool) => {
                let out = tokio::fs::File::create(&dest)
                    .await
                    .map_err(|e| ImageError::io(STEP, &dest, e))?
                    .into_std()
                    .await;
                let mut cmd = pre.tools.command(tool);
                cmd.arg("-dc").arg(&src).stdout(out);
                run(&format!("decompressing module {}", m.name), &mut cmd).await?;
            }
        }
        let mmio_devices = if m.name == "virtio_mmio" {
            let bytes = tokio::fs::read(&dest)
                .await
                .map_err(|e| ImageError::io(STEP, &dest, e))?;
            takes_device_param(&bytes)
        } else {
            false
        };
        loaded.push(GuestModule {
            name: m.name.clone(),
            path: guest,
            mmio_devices,
        });
    }
    Ok(loaded)
}

/// Whether a module's `.modinfo` declares a `device` parameter.
fn takes_device_param(ko: &[u8]) -> bool {
    let needle = b"parmtype=device:";
    ko.windows(needle.len()).any(|w| w == needle)
}

/// Pack `staging` as a gzip'd newc cpio (`cpio -o -H newc | gzip -1`), every file owned by
/// root.
pub(super) async fn pack(tools: &Tools, staging: &Path, out: &Path) -> Result<(), ImageError> {
    let root = staging.to_path_buf();
    let names = blocking("packing initramfs", move || list_tree(&root)).await?;

    let mut cpio = tools.command("cpio");
    cpio.args(["-o", "-H", "newc", "-R", "0:0", "--quiet"])
        .current_dir(staging)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let describe_cpio = tools::describe(&cpio);
    let start_err = |cmd: String, e: std::io::Error| ImageError::Command {
        step: "packing initramfs".into(),
        command: cmd,
        status: "could not start".into(),
        stderr: e.to_string(),
    };
    let mut cpio_child = cpio
        .spawn()
        .map_err(|e| start_err(describe_cpio.clone(), e))?;
    let cpio_out: Stdio = cpio_child
        .stdout
        .take()
        .ok_or_else(|| start_err(describe_cpio.clone(), std::io::Error::other("no stdout")))?
        .try_into()
        .map_err(|e| start_err(describe_cpio.clone(), e))?;
    let file = tokio::fs::File::create(out)
        .await
        .map_err(|e| ImageError::io("packing initramfs", out, e))?
        .into_std()
        .await;
    let mut gzip = tools.command("gzip");
    gzip.args(["-1", "-n", "-c"])
        .stdin(cpio_out)
        .stdout(file)
        .stderr(Stdio::piped());
    let describe_gzip = tools::describe(&gzip);
    let gzip_child = gzip
        .spawn()
        .map_err(|e| start_err(describe_gzip.clone(), e))?;

    if let Some(mut stdin) = cpio_child.stdin.take() {
        let mut list = names.join("\n");
        list.push('\n');
        // A write error means cpio died; its exit status below says why.
        let _ = stdin.write_all(list.as_bytes()).await;
        drop(stdin);
    }
    let cpio_done = cpio_child
        .wait_with_output()
        .await
        .map_err(|e| start_err(describe_cpio.clone(), e))?;
    let gzip_done = gzip_child
        .wait_with_output()
        .await
        .map_err(|e| start_err(describe_gzip.clone(), e))?;
    for (cmd, done) in [(describe_cpio, cpio_done), (describe_gzip, gzip_done)] {
        if !done.status.success() {
            return Err(ImageError::Command {
                step: "packing initramfs".into(),
                command: cmd,
                status: format!("failed ({})", done.status),
                stderr: tools::tail(&done.stderr),
            });
        }
    }
    Ok(())
}

/// Every path under `root`, relative, each directory before its contents (cpio needs the
/// directory entries to create them in the guest).
fn list_tree(root: &Path) -> Result<Vec<String>, ImageError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| ImageError::io("packing initramfs", &dir, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| ImageError::io("packing initramfs", &dir, e))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries.into_iter().rev() {
            let r = rel.join(e.file_name());
            let is_dir = e
                .file_type()
                .map_err(|err| ImageError::io("packing initramfs", &e.path(), err))?
                .is_dir();
            if is_dir {
                stack.push(r.clone());
            }
            out.push(r.to_string_lossy().into_owned());
        }
    }
    // Parents sort before children; order within a directory does not matter to the kernel.
    out.sort();
    Ok(out)
}

/// Shared by `/init` (microvm) and `/sbin/slipway-init` (vm): the runtime mounts, the work
/// directory, the agent under a restart loop and PID 1's reaping loop. `bb` prefixes busybox
/// applets (empty in the initramfs, where they are on `PATH`).
fn start_agent(bb: &str, port: &str, vsock_port: u32, before_agent: &str) -> String {
    format!(
        r#"{bb}mkdir -p /dev/pts /dev/shm
{bb}mount -t devpts -o gid=5,mode=620 devpts /dev/pts
{bb}mount -t tmpfs -o mode=1777 tmpfs /dev/shm
{bb}mount -t tmpfs -o mode=1777 tmpfs /tmp
{bb}mount -t tmpfs -o mode=755 tmpfs /run
{bb}mkdir -p {BUILDS_DIR}
{bb}hostname slipway
{bb}ip link set lo up 2>/dev/null
{before_agent}# The agent is restarted if it dies: without it the VM is unreachable.
serve() {{
  while :; do
    {AGENT_GUEST_PATH} "$@"
    say "agent $* exited (status $?), restarting"
    {bb}sleep 1
  done
}}
serve --port {port} &
if [ -e /dev/vsock ]; then serve --vsock {vsock_port} & fi
say "agent started"
# PID 1 reaps orphans: ash's wait collects any child, not only its own jobs.
while :; do wait; {bb}sleep 1; done
"#
    )
}

const HEADER: &str = r#"export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
say() { echo "slipway-guest: $*"; }
# Power off rather than exit: PID 1 exiting panics the kernel.
fail() { say "$*"; poweroff -f; }
"#;

/// The initramfs's `/init`.
pub(super) fn init_script(
    level: Level,
    modules: &[GuestModule],
    port: &str,
    vsock_port: u32,
    network: bool,
) -> String {
    let mut s = String::from("#!/bin/sh\n");
    s.push_str(match level {
        Level::Microvm => {
            "# slipway guest init (microvm), generated by `slipway image build`: the initramfs \
             is the root file system.\n"
        }
        Level::Vm => {
            "# slipway guest init (vm), generated by `slipway image build`: loads the virtio \
             modules, mounts the root disk and switches to it.\n"
        }
    });
    s.push_str(HEADER);
    s.push_str(
        "mount -t proc proc /proc\nmount -t sysfs sysfs /sys\nmount -t devtmpfs devtmpfs /dev\n\
         # The kernel opens /dev/console before /init; an initramfs without the node leaves\n\
         # init with no output.\n\
         exec </dev/console >/dev/console 2>&1\n",
    );
    for m in modules {
        if m.name == "virtio_mmio" {
            if m.mmio_devices {
                s.push_str(
                    "# busybox insmod does not read /proc/cmdline: pass QEMU's and \
                     Firecracker's virtio_mmio.device= values on.\n\
                     set --\n\
                     for w in $(cat /proc/cmdline); do\n  case \"$w\" in virtio_mmio.device=*) \
                     set -- \"$@\" \"device=${w#virtio_mmio.device=}\" ;; esac\n\
                     done\n",
                );
                s.push_str(&format!(
                    "insmod {} \"$@\" || say \"insmod {} failed\"\n",
                    m.path, m.name
                ));
                continue;
            }
            s.push_str(
                "# This kernel's virtio_mmio takes no device= parameter \
                 (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES unset): devices are found through ACPI \
                 (QEMU microvm acpi=on).\n",
            );
        }
        s.push_str(&format!(
            "insmod {} || say \"insmod {} failed\"\n",
            m.path, m.name
        ));
    }
    match level {
        Level::Microvm => {
            s.push_str(
                "mkdir -p /work\n\
                 if [ -b /dev/vda ]; then\n  mount -t ext4 -o noatime /dev/vda /work || say \
                 \"cannot mount the work disk /dev/vda on /work\"\nfi\n",
            );
            let net = if network {
                net_script("")
            } else {
                String::new()
            };
            s.push_str(&start_agent("", port, vsock_port, &net));
        }
        Level::Vm => s.push_str(
            r#"root=/dev/vda
for w in $(cat /proc/cmdline); do
  case "$w" in slipway.root=*) root="${w#slipway.root=}" ;; esac
done
# virtio probing is synchronous, so the disk is normally there already.
i=0
while [ ! -b "$root" ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done
mount -t ext4 -o noatime "$root" /newroot || fail "cannot mount the root disk $root"
[ -x /newroot/sbin/slipway-init ] || fail "the root disk $root has no /sbin/slipway-init"
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/slipway-init
"#,
        ),
    }
    s
}

/// `/sbin/slipway-init` on a vm root disk: the same runtime mounts as the microvm `/init` (the
/// initramfs has moved `/proc`, `/sys` and `/dev` over), then the agent.
pub(super) fn slipway_init_script(
    port: &str,
    vsock_port: u32,
    sshd: bool,
    network: bool,
) -> String {
    let bb = "/bin/busybox ";
    let mut s = String::from(
        "#!/bin/busybox sh\n\
         # slipway guest init (vm root disk), generated by `slipway image build`.\n",
    );
    s.push_str(&HEADER.replace("poweroff -f", "/bin/busybox poweroff -f"));
    // Debian's busybox has no `mountpoint` applet.
    s.push_str(&format!(
        "mounted() {{ {bb}grep -qs \" $1 \" /proc/mounts; }}\n\
         mounted /proc || {bb}mount -t proc proc /proc\n\
         mounted /sys || {bb}mount -t sysfs sysfs /sys\n\
         mounted /dev || {bb}mount -t devtmpfs devtmpfs /dev\n\
         exec </dev/console >/dev/console 2>&1\n"
    ));
    let mut before = String::new();
    if network || sshd {
        before.push_str(&net_script(bb));
    }
    if sshd {
        before.push_str(&sshd_script(bb));
    }
    s.push_str(&start_agent(bb, port, vsock_port, &before));
    s
}

/// Networked images: the first NIC on QEMU's user-mode network, when the hypervisor gave the
/// guest one (Firecracker and Cloud Hypervisor guests have none).
fn net_script(bb: &str) -> String {
    let addr = super::GUEST_USER_NET_ADDR;
    format!(
        r#"# QEMU user-mode networking: the guest is {addr}, the host 10.0.2.2, DNS 10.0.2.3.
if [ -e /sys/class/net/eth0 ]; then
  {bb}ip link set eth0 up && {bb}ip addr add {addr}/24 dev eth0 && {bb}ip route add default via 10.0.2.2 || say "cannot configure eth0"
  echo "nameserver 10.0.2.3" >/etc/resolv.conf
fi
"#
    )
}

/// sshd images: the guest's host name and machine id from the command line, cgroup v2, a
/// fresh host key, the injected key for root, sshd (after [`net_script`]).
fn sshd_script(bb: &str) -> String {
    let key = super::SSH_KEY_PARAM;
    let host = super::HOSTNAME_PARAM;
    format!(
        r#"key=
name=
for w in $({bb}cat /proc/cmdline); do
  case "$w" in
    {key}=*) key="${{w#{key}=}}" ;;
    {host}=*) name="${{w#{host}=}}" ;;
  esac
done
if [ -n "$name" ]; then
  {bb}hostname "$name"
  echo "$name" >/etc/hostname
  echo "127.0.0.1 localhost $name" >/etc/hosts
fi
# Each VM its own identity (the root disk is a copy of one image).
{bb}cat /proc/sys/kernel/random/uuid | {bb}tr -d - >/etc/machine-id
{bb}mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || say "cannot mount cgroup2"
if [ -n "$key" ]; then
  {bb}mkdir -p /root/.ssh /run/sshd
  {bb}chmod 700 /root/.ssh
  echo "$key" | {bb}sed 's/:/ /' >/root/.ssh/authorized_keys
  {bb}chmod 600 /root/.ssh/authorized_keys
  [ -e /etc/ssh/ssh_host_ed25519_key ] || /usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key
  /usr/sbin/sshd -o HostKey=/etc/ssh/ssh_host_ed25519_key -E /var/log/sshd.log && say "sshd started" || say "sshd failed"
else
  say "no {key}= on the command line: sshd not started"
fi
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibtinfo.so.6 => /lib/x86_64-linux-gnu/libtinfo.so.6 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libtinfo.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert_eq!(
            parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err(),
            "libfoo.so.1"
        );
    }

    fn module(name: &str, mmio_devices: bool) -> GuestModule {
        GuestModule {
            name: name.into(),
            path: format!("/lib/modules/v/{name}.ko"),
            mmio_devices,
        }
    }

    #[test]
    fn microvm_init_loads_modules_in_order_then_starts_the_agent() {
        let mods = [
            module("virtio", false),
            module("virtio_mmio", true),
            module("virtio_blk", false),
        ];
        let s = init_script(Level::Microvm, &mods, "org.slipway.agent", 1024, false);
        let at = |needle: &str| {
            s.find(needle)
                .unwrap_or_else(|| panic!("{needle:?} in\n{s}"))
        };
        assert!(
            at("insmod /lib/modules/v/virtio.ko")
                < at("insmod /lib/modules/v/virtio_mmio.ko \"$@\"")
        );
        assert!(at("virtio_mmio.ko") < at("virtio_blk.ko"));
        assert!(at("device=${w#virtio_mmio.device=}") < at("virtio_mmio.ko"));
        assert!(
            at("mount -t ext4 -o noatime /dev/vda /work") < at("serve --port org.slipway.agent &")
        );
        assert!(at("serve --vsock 1024 &") < at("say \"agent started\""));
        at("mkdir -p /work/builds");
        at("while :; do wait; sleep 1; done");
        assert!(!s.contains("switch_root"));

        let plain = init_script(
            Level::Microvm,
            &[module("virtio_mmio", false)],
            "p",
            1,
            false,
        );
        assert!(
            plain.contains("insmod /lib/modules/v/virtio_mmio.ko ||"),
            "{plain}"
        );
    }

    #[test]
    fn vm_init_switches_to_the_root_disk() {
        let s = init_script(Level::Vm, &[module("virtio_pci", false)], "p", 1, false);
        assert!(s.contains("slipway.root=*"));
        assert!(s.contains("exec switch_root /newroot /sbin/slipway-init"));
        assert!(!s.contains("serve --port"));
        let init = slipway_init_script("org.slipway.agent", 1024, false, false);
        assert!(!init.contains("sshd"));
        let with_sshd = slipway_init_script("org.slipway.agent", 1024, true, false);
        assert!(with_sshd.contains("/usr/sbin/sshd"));
        assert!(with_sshd.find("sshd started") < with_sshd.find("serve --port"));
        assert!(init.starts_with("#!/bin/busybox sh\n"));
        assert!(init.contains("/sbin/slipway-guest-agent \"$@\""));
        assert!(init.contains("serve --port org.slipway.agent &"));
        assert!(init.contains("/bin/busybox mkdir -p /work/builds"));
        assert!(!init.contains("eth0"));
        // sshd images are networked, and the NIC is up before sshd starts.
        let eth0 = |s: &str| s.find("ip addr add 10.0.2.15/24 dev eth0");
        assert!(eth0(&with_sshd).is_some() && eth0(&with_sshd) < with_sshd.find("sshd started"));
        let networked = slipway_init_script("org.slipway.agent", 1024, false, true);
        assert!(
            eth0(&networked) < networked.find("serve --port"),
            "{networked}"
        );
    }

    #[test]
    fn a_networked_microvm_configures_its_nic_before_the_agent_starts() {
        let mods = [module("virtio_mmio", false), module("virtio_net", false)];
        let s = init_script(Level::Microvm, &mods, "p", 1, true);
        let at = |needle: &str| {
            s.find(needle)
                .unwrap_or_else(|| panic!("{needle:?} in\n{s}"))
        };
        assert!(at("insmod /lib/modules/v/virtio_net.ko") < at("ip link set eth0 up"));
        assert!(at("ip route add default via 10.0.2.2") < at("serve --port p &"));
        at("echo \"nameserver 10.0.2.3\" >/etc/resolv.conf");
        // A guest without a NIC (Firecracker) still boots: the setup is skipped.
        at("if [ -e /sys/class/net/eth0 ]; then");
        assert!(!init_script(Level::Microvm, &mods, "p", 1, false).contains("eth0"));
    }

    #[test]
    fn device_param_detection() {
        assert!(takes_device_param(b"\0parmtype=device:string\0"));
        assert!(!takes_device_param(b"\0alias=acpi*:LNRO0005:*\0"));
    }
}
