//! One VM on disk: its instance directory, its QEMU process (found again through the pid file
//! and QEMU's `-name`), its SSH port and its state markers.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt as _;

use crate::command::{Launch, files, process_name, qemu_command};

/// Marker files and the port file.
const PORT: &str = "port";
const STARTED: &str = "started";
const READY: &str = "ready";
const DELETING: &str = "deleting";
const FAILED: &str = "failed";
const QEMU_LOG: &str = "qemu.log";

/// How long QEMU gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Why a VM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A helper program (qemu-img, QEMU) failed.
    #[error("{command}: {message}")]
    Command {
        /// The program.
        command: String,
        /// Its status and output.
        message: String,
    },
    /// The command line cannot be built.
    #[error(transparent)]
    Launch(#[from] crate::command::LaunchError),
    /// QEMU did not go away after SIGKILL.
    #[error("qemu {pid} of instance {id} did not exit")]
    Stuck {
        /// The instance.
        id: String,
        /// QEMU's pid.
        pid: i32,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> VmError + use<> {
    let path = path.to_path_buf();
    move |source| VmError::Io { what, path, source }
}

/// One instance directory `<instances>/<id>/`.
#[derive(Debug, Clone)]
pub struct Vm {
    /// Instance id.
    pub id: String,
    /// Its directory.
    pub dir: PathBuf,
}

impl Vm {
    /// The instance `id` under `instances_dir` (nothing is touched).
    pub fn new(instances_dir: &Path, id: &str) -> Vm {
        Vm {
            id: id.to_string(),
            dir: instances_dir.join(id),
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    async fn has(&self, name: &str) -> bool {
        tokio::fs::try_exists(self.file(name))
            .await
            .unwrap_or(false)
    }

    /// Whether the directory exists.
    pub async fn exists(&self) -> bool {
        tokio::fs::metadata(&self.dir)
            .await
            .is_ok_and(|m| m.is_dir())
    }

    /// Make the directory (fails if it exists: ids are never reused).
    pub async fn create_dir(&self) -> Result<(), VmError> {
        tokio::fs::create_dir(&self.dir)
            .await
            .map_err(io("creating instance directory", &self.dir))
    }

    /// The copy-on-write overlay over `base`.
    pub async fn create_overlay(&self, base: &Path) -> Result<(), VmError> {
        let disk = self.file(files::DISK);
        let out = tokio::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(base)
            .arg(&disk)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| VmError::Command {
                command: "qemu-img create".into(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(VmError::Command {
                command: "qemu-img create".into(),
                message: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    /// Start QEMU detached (it daemonizes into a session of its own once the VM runs) and
    /// record the port and start time. Errors carry QEMU's own message.
    pub async fn start(&self, launch: &Launch) -> Result<(), VmError> {
        let argv = qemu_command(launch)?;
        let log_path = self.file(QEMU_LOG);
        let log = tokio::fs::File::create(&log_path)
            .await
            .map_err(io("creating", &log_path))?
            .into_std()
            .await;
        let log2 = log.try_clone().map_err(io("opening", &log_path))?;
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Until it daemonizes it is our child: never leave it half-started.
            .kill_on_drop(true);
        let status = cmd.status().await.map_err(|e| VmError::Command {
            command: launch.binary.display().to_string(),
            message: format!("could not start: {e}"),
        })?;
        if !status.success() {
            let log = tokio::fs::read_to_string(&log_path)
                .await
                .unwrap_or_default();
            return Err(VmError::Command {
                command: launch.binary.display().to_string(),
                message: format!("{status}: {}", log.trim()),
            });
        }
        write(&self.file(PORT), &launch.ssh_port.to_string()).await?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        write(&self.file(STARTED), &now.to_string()).await
    }

    /// The SSH port forwarded to the guest.
    pub async fn port(&self) -> Option<u16> {
        read_trimmed(&self.file(PORT)).await?.parse().ok()
    }

    /// When QEMU was started.
    pub async fn started(&self) -> Option<SystemTime> {
        let secs: u64 = read_trimmed(&self.file(STARTED)).await?.parse().ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(secs))
    }

    /// QEMU's pid while it runs (the pid file's process, checked to be this VM's QEMU: a pid
    /// reused by another process, or a zombie, does not count).
    pub async fn pid(&self) -> Option<i32> {
        let pid: i32 = read_trimmed(&self.file(files::PID)).await?.parse().ok()?;
        let cmdline = tokio::fs::read(format!("/proc/{pid}/cmdline")).await.ok()?;
        let name = process_name(&self.id);
        cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == name.as_bytes())
            .then_some(pid)
    }

    /// Whether sshd answers: a TCP connection to the forwarded port and an `SSH-` banner (user-
    /// mode networking accepts the connection itself even while nothing listens in the guest).
    pub async fn ssh_answers(&self) -> bool {
        let Some(port) = self.port().await else {
            return false;
        };
        let probe = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()?;
            let mut buf = [0u8; 64];
            let mut got = 0;
            while got < 4 {
                let n = s.read(&mut buf[got..]).await.ok()?;
                if n == 0 {
                    return None;
                }
                got += n;
            }
            buf.starts_with(b"SSH-").then_some(())
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), probe).await,
            Ok(Some(()))
        )
    }

    /// Whether the guest has answered once.
    pub async fn is_ready(&self) -> bool {
        self.has(READY).await
    }

    /// Record that sshd answered.
    pub async fn mark_ready(&self) -> Result<(), VmError> {
        write(&self.file(READY), "").await
    }

    /// Whether a deletion was requested.
    pub async fn is_deleting(&self) -> bool {
        self.has(DELETING).await
    }

    /// Record a deletion request (a restarted plugin finishes it).
    pub async fn mark_deleting(&self) -> Result<(), VmError> {
        write(&self.file(DELETING), "").await
    }

    /// Why the VM failed, if it did.
    pub async fn failure(&self) -> Option<String> {
        read_trimmed(&self.file(FAILED)).await
    }

    /// Record a failure (reported as `timeout` until the VM is deleted); the VM is stopped and
    /// its disk removed at once, keeping the console log for diagnosis.
    pub async fn fail(&self, reason: &str) {
        if let Err(e) = write(&self.file(FAILED), reason).await {
            tracing::warn!(instance = %self.id, "recording failure: {e}");
        }
        if let Err(e) = self.stop().await {
            tracing::warn!(instance = %self.id, "stopping failed VM: {e}");
        }
        let _ = tokio::fs::remove_file(self.file(files::DISK)).await;
    }

    /// The end of the guest console (for error messages).
    pub async fn console_tail(&self) -> String {
        let text = tokio::fs::read(self.file(files::CONSOLE))
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Stop QEMU: SIGTERM, SIGKILL after a grace period; returns once it is gone.
    pub async fn stop(&self) -> Result<(), VmError> {
        for (signal, wait) in [
            (Signal::SIGTERM, STOP_GRACE),
            (Signal::SIGKILL, Duration::from_secs(10)),
        ] {
            let Some(pid) = self.pid().await else {
                return Ok(());
            };
            // ESRCH: it exited meanwhile.
            let _ = kill(Pid::from_raw(pid), signal);
            let deadline = tokio::time::Instant::now() + wait;
            while tokio::time::Instant::now() < deadline {
                if self.pid().await.is_none() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        match self.pid().await {
            None => Ok(()),
            Some(pid) => Err(VmError::Stuck {
                id: self.id.clone(),
                pid,
            }),
        }
    }

    /// Stop QEMU and remove the directory.
    pub async fn destroy(&self) -> Result<(), VmError> {
        self.stop().await?;
        self.remove_dir().await
    }

    /// Remove the directory (QEMU must be gone).
    pub async fn remove_dir(&self) -> Result<(), VmError> {
        match tokio::fs::remove_dir_all(&self.dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing", &self.dir)(e)),
        }
    }
}

async fn write(path: &Path, text: &str) -> Result<(), VmError> {
    tokio::fs::write(path, text)
        .await
        .map_err(io("writing", path))
}

async fn read_trimmed(path: &Path) -> Option<String> {
    let s = tokio::fs::read_to_string(path).await.ok()?;
    Some(s.trim().to_string())
}

/// A free port on 127.0.0.1 (bound and released: QEMU binds it next; a lost race shows as a
/// QEMU error, and the caller draws again).
pub fn free_port() -> Result<u16, VmError> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| VmError::Command {
        command: "binding a free port".into(),
        message: e.to_string(),
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| VmError::Command {
            command: "binding a free port".into(),
            message: e.to_string(),
        })
}
