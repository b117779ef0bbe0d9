//! Hypervisor processes: started detached from the daemon (their own process group, output to
//! a log file) so that they outlive a daemon restart, and stopped by pid with the marker check
//! of [`is_running`](super::is_running).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{HypervisorError, VmProcess, is_running};

/// Start `binary` with `args`, stdout and stderr appended to `log`, in a process group of its
/// own (a signal to the daemon's group does not reach it). The returned child is only for
/// reaping: dropping it leaves the process running (tokio reaps it in the background).
pub fn spawn_detached(
    binary: &str,
    args: &[String],
    log: &Path,
) -> Result<tokio::process::Child, HypervisorError> {
    let io = |source| HypervisorError::Io {
        context: format!("cannot open log {}", log.display()),
        source,
    };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io)?;
    let err = out.try_clone().map_err(io)?;
    tokio::process::Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .map_err(|source| HypervisorError::Spawn {
            binary: binary.to_string(),
            source,
        })
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// Wait until `vm`'s process is gone, up to `limit`; whether it is.
pub async fn wait_gone(vm: &VmProcess, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if !is_running(vm) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Send `signal` to `vm`'s process if it is still ours (its pid runs with the marker); a
/// process that is already gone is not an error.
pub fn signal(vm: &VmProcess, signal: Signal) -> Result<(), HypervisorError> {
    if !is_running(vm) {
        return Ok(());
    }
    let pid = i32::try_from(vm.pid).map_err(|_| HypervisorError::Io {
        context: format!("pid {} out of range", vm.pid),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    match kill(Pid::from_raw(pid), signal) {
        // ESRCH: it exited between the check and the signal.
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(errno) => Err(HypervisorError::Io {
            context: format!("cannot signal process {}", vm.pid),
            source: std::io::Error::from(errno),
        }),
    }
}

/// SIGKILL `vm`'s process (after checking it is still ours) and wait for it to go.
pub async fn kill_now(vm: &VmProcess) -> Result<(), HypervisorError> {
    signal(vm, Signal::SIGKILL)?;
    if wait_gone(vm, Duration::from_secs(10)).await {
        Ok(())
    } else {
        Err(HypervisorError::Timeout {
            what: format!("process {} to exit after SIGKILL", vm.pid),
            after: Duration::from_secs(10),
        })
    }
}

/// Ask nicely with `polite` (a QMP quit, an API shutdown) and SIGKILL when that fails or the
/// process is still there after `grace`.
pub async fn stop_with<F>(vm: &VmProcess, grace: Duration, polite: F) -> Result<(), HypervisorError>
where
    F: std::future::Future<Output = Result<(), HypervisorError>>,
{
    if !is_running(vm) {
        return Ok(());
    }
    let asked = tokio::time::timeout(grace, polite).await;
    if matches!(asked, Ok(Ok(()))) && wait_gone(vm, grace).await {
        return Ok(());
    }
    kill_now(vm).await
}
