//! Running helper programs and finding/killing an instance's processes through /proc.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A helper program (`ip`, `ssh-keygen`, `sshd`) failed.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {message}")]
pub struct CommandError {
    command: String,
    message: String,
}

impl CommandError {
    /// An error not tied to one command run.
    pub fn other(message: &str) -> Self {
        CommandError {
            command: "local".into(),
            message: message.to_owned(),
        }
    }
}

/// Run `program args…` to completion; its stdout on success, its stderr in the error.
pub async fn run<I, S>(program: &str, args: I) -> Result<String, CommandError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let command = std::iter::once(program.to_owned())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let out = tokio::process::Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| CommandError {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CommandError {
            command,
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// True when `pid` is alive and its command line mentions `needle` (our sshd_config path):
/// a recycled pid belonging to another program does not count.
pub async fn alive_with(pid: i32, needle: &str) -> bool {
    if pid <= 1 {
        return false;
    }
    match tokio::fs::read(format!("/proc/{pid}/cmdline")).await {
        // sshd rewrites its title to "sshd: /usr/sbin/sshd -f <cfg> ... [listener] ...".
        Ok(raw) => {
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline.contains("sshd") && cmdline.contains(needle)
        }
        Err(_) => false,
    }
}

/// Every process belonging to an instance: command lines mentioning `needle` (the listener),
/// processes whose environment carries `env_marker` (session commands, even once orphaned),
/// `extra` pids (e.g. everything in its namespace), and all their descendants (per-connection
/// sshd processes, which rename themselves). Blocking: call from `spawn_blocking`.
pub fn instance_pids(needle: &str, env_marker: &str, extra: &[i32]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut table = Vec::new(); // (pid, ppid)
    let mut roots: HashSet<i32> = extra.iter().copied().collect();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may contain spaces and parentheses: parse after the last ')'.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        table.push((pid, ppid));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if contains(&cmdline, needle.as_bytes())
            || environ
                .split(|b| *b == 0)
                .any(|var| var == env_marker.as_bytes())
        {
            roots.insert(pid);
        }
    }
    let mut all: Vec<i32> = roots.into_iter().collect();
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        for (pid, ppid) in &table {
            if *ppid == parent && !all.contains(pid) {
                all.push(*pid);
            }
        }
        i += 1;
    }
    all.retain(|p| *p > 1 && *p != me);
    all
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Send `signal` to each pid, ignoring ones already gone.
pub fn signal_all(pids: &[i32], signal: Signal) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), signal);
    }
}
