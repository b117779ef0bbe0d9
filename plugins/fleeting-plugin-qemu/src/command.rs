//! The QEMU command line of one VM: public so a benchmark can boot the same image with a bare
//! `qemu-system-x86_64` exactly as the plugin does.

use std::path::{Path, PathBuf};

use slipway_nesting::Accel;
use slipway_nesting_daemon::image::{AGENT_PORT, HOSTNAME_PARAM, ImageManifest, SSH_KEY_PARAM};

/// Files of a running VM inside its instance directory.
pub mod files {
    /// The copy-on-write overlay over the image's base disk.
    pub const DISK: &str = "disk.qcow2";
    /// QEMU's pid file (`-pidfile`).
    pub const PID: &str = "qemu.pid";
    /// QMP socket.
    pub const QMP: &str = "qmp.sock";
    /// Guest agent socket (virtio-serial; the image's agent serves it).
    pub const AGENT: &str = "agent.sock";
    /// The guest's serial console.
    pub const CONSOLE: &str = "console.log";
}

/// Everything that makes one VM's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// `qemu-system-x86_64` or a path to it.
    pub binary: PathBuf,
    /// QEMU's `-name`: also how the plugin recognises the process behind a pid.
    pub name: String,
    /// KVM or TCG.
    pub accel: Accel,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Kernel image.
    pub kernel: PathBuf,
    /// Initramfs.
    pub initrd: PathBuf,
    /// Kernel command line (see [`kernel_cmdline`]).
    pub cmdline: String,
    /// The root disk (a qcow2 overlay).
    pub disk: PathBuf,
    /// Host port forwarded to the guest's port 22 on 127.0.0.1.
    pub ssh_port: u16,
    /// Directory for the pid file, QMP and agent sockets and the console log.
    pub run_dir: PathBuf,
    /// Detach (`-daemonize`): QEMU returns once the VM runs, in a session of its own.
    pub daemonize: bool,
}

/// The `-name` QEMU runs under for instance `id`: how its process is recognised.
pub fn process_name(id: &str) -> String {
    format!("slipway-qemu-{id}")
}

/// Why a command line cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// QEMU's option syntax cannot carry this path (it separates options with commas).
    #[error("path {0} contains a comma, which QEMU's option syntax cannot carry")]
    Comma(PathBuf),
    /// The public key is not an OpenSSH `type base64 [comment]` line.
    #[error("expected an OpenSSH public key line (`type base64 [comment]`)")]
    PublicKey,
}

impl Launch {
    /// The launch of instance `id` (its guest's host name) from `image` (in `image_dir`), its
    /// files in `run_dir`, logging in with `public_key` (an OpenSSH public key line).
    #[allow(clippy::too_many_arguments)]
    pub fn for_image(
        binary: &Path,
        image: &ImageManifest,
        image_dir: &Path,
        id: &str,
        accel: Accel,
        cpus: Option<u32>,
        memory_mib: Option<u32>,
        public_key: &str,
        ssh_port: u16,
        run_dir: &Path,
    ) -> Result<Launch, LaunchError> {
        Ok(Launch {
            binary: binary.to_path_buf(),
            name: process_name(id),
            accel,
            cpus: cpus.unwrap_or(image.vcpus),
            memory_mib: memory_mib.unwrap_or(image.memory_mib),
            kernel: image.kernel_path(image_dir),
            initrd: image.initrd_path(image_dir),
            cmdline: kernel_cmdline(&image.cmdline, public_key, id)?,
            disk: run_dir.join(files::DISK),
            ssh_port,
            run_dir: run_dir.to_path_buf(),
            daemonize: true,
        })
    }

    /// The pid file QEMU writes.
    pub fn pid_file(&self) -> PathBuf {
        self.run_dir.join(files::PID)
    }

    /// The full argv, binary first.
    pub fn argv(&self) -> Result<Vec<String>, LaunchError> {
        qemu_command(self)
    }
}

/// The image's command line plus the login key and the host name (`public_key`'s comment is
/// dropped: the command line splits on spaces).
pub fn kernel_cmdline(base: &str, public_key: &str, hostname: &str) -> Result<String, LaunchError> {
    let mut parts = public_key.split_whitespace();
    let (Some(kind), Some(blob)) = (parts.next(), parts.next()) else {
        return Err(LaunchError::PublicKey);
    };
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '-' | '.' | '@'))
    };
    if !plain(kind) || !plain(blob) {
        return Err(LaunchError::PublicKey);
    }
    Ok(format!(
        "{base} {SSH_KEY_PARAM}={kind}:{blob} {HOSTNAME_PARAM}={hostname}"
    ))
}

fn path(p: &Path) -> Result<String, LaunchError> {
    let s = p.display().to_string();
    if s.contains(',') {
        return Err(LaunchError::Comma(p.to_path_buf()));
    }
    Ok(s)
}

/// QEMU's argv for `l`, binary first: q35 with the image's kernel and initramfs, the overlay as
/// a virtio disk, a virtio NIC on user-mode networking forwarding `127.0.0.1:<ssh_port>` to
/// the guest's port 22, the agent's virtio-serial port, QMP, the console to a file.
pub fn qemu_command(l: &Launch) -> Result<Vec<String>, LaunchError> {
    let run = |f: &str| path(&l.run_dir.join(f));
    let cpu = match l.accel {
        Accel::Kvm => "host",
        Accel::Tcg => "max",
    };
    let mut a: Vec<String> = vec![
        l.binary.display().to_string(),
        "-name".into(),
        l.name.clone(),
        "-M".into(),
        "q35".into(),
        "-accel".into(),
        l.accel.as_str().into(),
        "-cpu".into(),
        cpu.into(),
        "-smp".into(),
        l.cpus.to_string(),
        "-m".into(),
        l.memory_mib.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", run(files::CONSOLE)?),
        "-kernel".into(),
        path(&l.kernel)?,
        "-initrd".into(),
        path(&l.initrd)?,
        "-append".into(),
        l.cmdline.clone(),
        "-drive".into(),
        format!(
            "id=root,file={},format=qcow2,if=none,discard=unmap",
            path(&l.disk)?
        ),
        "-device".into(),
        "virtio-blk-pci,drive=root".into(),
        "-netdev".into(),
        format!("user,id=net0,hostfwd=tcp:127.0.0.1:{}-:22", l.ssh_port),
        "-device".into(),
        "virtio-net-pci,netdev=net0".into(),
        "-device".into(),
        "virtio-serial-pci".into(),
        "-chardev".into(),
        format!(
            "socket,id=agent,path={},server=on,wait=off",
            run(files::AGENT)?
        ),
        "-device".into(),
        format!("virtserialport,chardev=agent,name={AGENT_PORT}"),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", run(files::QMP)?),
        "-pidfile".into(),
        run(files::PID)?,
    ];
    if l.daemonize {
        a.push("-daemonize".into());
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn command_line() {
        let cmdline = kernel_cmdline(
            "console=ttyS0 slipway.root=/dev/vda",
            "ssh-ed25519 AAAAC3Nza+/= me@host",
            "g-1",
        )
        .unwrap();
        assert_eq!(
            cmdline,
            "console=ttyS0 slipway.root=/dev/vda slipway.ssh_key=ssh-ed25519:AAAAC3Nza+/= \
             slipway.hostname=g-1"
        );
        assert!(kernel_cmdline("x", "garbage", "h").is_err());
        assert!(kernel_cmdline("x", "ssh-ed25519 a;b", "h").is_err());
        let l = Launch {
            binary: "qemu-system-x86_64".into(),
            name: "slipway-qemu-g-1".into(),
            accel: Accel::Tcg,
            cpus: 1,
            memory_mib: 512,
            kernel: "/i/vmlinuz".into(),
            initrd: "/i/initrd.img".into(),
            cmdline,
            disk: "/s/g-1/disk.qcow2".into(),
            ssh_port: 2222,
            run_dir: "/s/g-1".into(),
            daemonize: true,
        };
        let a = l.argv().unwrap().join(" ");
        assert!(a.starts_with("qemu-system-x86_64 -name slipway-qemu-g-1 -M q35 -accel tcg"));
        assert!(a.contains("hostfwd=tcp:127.0.0.1:2222-:22"));
        assert!(a.contains("file=/s/g-1/disk.qcow2,format=qcow2"));
        assert!(a.ends_with("-pidfile /s/g-1/qemu.pid -daemonize"));
        let mut bad = l.clone();
        bad.run_dir = "/a,b".into();
        assert!(bad.argv().is_err());
    }
}
