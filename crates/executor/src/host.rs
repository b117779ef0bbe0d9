//! Where a job's bash scripts run: an instance over SSH, this machine, or a container.
//!
//! Every executor drives a job the same way (steps as bash scripts with pid files, artifacts
//! as tar streams, a kill script on timeout or cancel); what differs is how a script reaches
//! a shell. That is this trait.

use std::process::Stdio;

use async_trait::async_trait;
use slipway_connector::{Client, ExitStatus, Output, RunOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

use crate::script;

/// A shell that runs job scripts.
#[async_trait]
pub trait Host: Send + Sync + std::fmt::Debug {
    /// Feed `script` to bash on stdin and stream its output; the exit status of bash, or why
    /// it could not run (a system failure, not the script's).
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, String>;

    /// Run `body` with `bash -c`, `stdin` on its stdin; its status, stdout and stderr.
    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String>;

    /// [`Host::run_script`] for GitLab's stage `stage` (`step_script`, `after_script`), for
    /// hosts that run stages differently (an executor plugin).
    async fn run_stage(
        &self,
        stage: &str,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, String> {
        let _ = stage;
        self.run_script(script, output).await
    }

    /// [`Host::capture`] for GitLab's stage `stage` (`get_sources`, `restore_cache`,
    /// `upload_artifacts_on_success`, ...).
    async fn capture_stage(
        &self,
        stage: &str,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String> {
        let _ = stage;
        self.capture(body, stdin).await
    }

    /// Stop the step running as `stage` (a timeout or cancel): by default `kill_script`, which
    /// signals the step's process group through its pid file.
    async fn stop_stage(&self, stage: &str, kill_script: &str) -> Result<(), String> {
        let _ = stage;
        match self.capture(kill_script, Vec::new()).await? {
            (status, _, _) if status.success() => Ok(()),
            (status, _, err) => Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&err).trim()
            )),
        }
    }
}

/// bash reading the script on stdin; `exec` keeps the session leader's pid, which is then the
/// step's process group.
const SHELL: &str = "exec bash --noprofile --norc -s";

/// An instance reached over SSH.
#[derive(Debug, Clone, Copy)]
pub struct SshHost<'a>(pub &'a Client);

#[async_trait]
impl Host for SshHost<'_> {
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, String> {
        self.0
            .run(
                RunOptions::new(SHELL)
                    .stdin(script::fed_on_stdin(&script))
                    .ready_ahead(),
                output,
            )
            .await
            .map_err(|e| e.to_string())
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String> {
        let command = format!("exec bash --noprofile --norc -c {}", script::quote(body));
        self.0
            .run_capture(command, stdin)
            .await
            .map_err(|e| e.to_string())
    }
}

/// This machine: bash as a child process, each run in its own process group (so a step's
/// kill script reaches everything it started) and killed if the run is dropped.
#[derive(Debug, Clone, Default)]
pub struct LocalHost {
    /// Environment variables set for every script (e.g. `HOME` for relative builds dirs).
    pub env: Vec<(String, String)>,
}

impl LocalHost {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("bash");
        c.args(["--noprofile", "--norc"])
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        c
    }
}

#[async_trait]
impl Host for LocalHost {
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, String> {
        let mut child = self
            .command(&["-s"])
            .spawn()
            .map_err(|e| format!("cannot start bash: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("bash has no stdin")?;
        let mut stdout = child.stdout.take().ok_or("bash has no stdout")?;
        let mut stderr = child.stderr.take().ok_or("bash has no stderr")?;
        let feed = async move {
            // A script that exits early stops reading: a broken pipe is not an error here.
            let _ = stdin
                .write_all(script::fed_on_stdin(&script).as_bytes())
                .await;
            drop(stdin);
        };
        let out_tx = output.clone();
        let pump_out = async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = stdout.read(&mut buf).await {
                if n == 0
                    || out_tx
                        .send(Output::Stdout(buf[..n].to_vec()))
                        .await
                        .is_err()
                {
                    break;
                }
            }
        };
        let pump_err = async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0
                    || output
                        .send(Output::Stderr(buf[..n].to_vec()))
                        .await
                        .is_err()
                {
                    break;
                }
            }
        };
        let (_, _, _, status) = tokio::join!(feed, pump_out, pump_err, child.wait());
        status
            .map(exit_status)
            .map_err(|e| format!("waiting for bash: {e}"))
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String> {
        let mut child = self
            .command(&["-c", body])
            .spawn()
            .map_err(|e| format!("cannot start bash: {e}"))?;
        let mut input = child.stdin.take().ok_or("bash has no stdin")?;
        let feed = async move {
            let _ = input.write_all(&stdin).await;
            drop(input);
        };
        let (_, out) = tokio::join!(feed, child.wait_with_output());
        let out = out.map_err(|e| format!("waiting for bash: {e}"))?;
        Ok((exit_status(out.status), out.stdout, out.stderr))
    }
}

/// A local exit status in the connector's terms.
fn exit_status(st: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    ExitStatus {
        code: st.code().and_then(|c| u32::try_from(c).ok()),
        signal: st.signal().map(signal_name),
    }
}

/// A signal number as GitLab's traces name it (`KILL`, `TERM`; others by number).
pub(crate) fn signal_name(sig: i32) -> String {
    match sig {
        1 => "HUP",
        2 => "INT",
        6 => "ABRT",
        9 => "KILL",
        13 => "PIPE",
        15 => "TERM",
        _ => return sig.to_string(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_host_streams_output_and_reports_exit_codes() {
        let host = LocalHost::default();
        let (tx, mut rx) = mpsc::channel(16);
        let st = host
            .run_script("echo out; echo err >&2; exit 3".into(), tx)
            .await
            .unwrap();
        assert_eq!(st.code, Some(3));
        let mut out = Vec::new();
        let mut err = Vec::new();
        while let Ok(chunk) = rx.try_recv() {
            match chunk {
                Output::Stdout(b) => out.extend(b),
                Output::Stderr(b) => err.extend(b),
            }
        }
        assert_eq!(out, b"out\n");
        assert_eq!(err, b"err\n");
        let (st, out, _) = host
            .capture("cat; exit 0", b"piped".to_vec())
            .await
            .unwrap();
        assert!(st.success());
        assert_eq!(out, b"piped");
    }

    #[tokio::test]
    async fn local_host_reports_a_kill_by_signal() {
        let (tx, _rx) = mpsc::channel(16);
        let st = LocalHost::default()
            .run_script("kill -KILL $$".into(), tx)
            .await
            .unwrap();
        assert_eq!(st.signal.as_deref(), Some("KILL"));
        assert_eq!(st.code, None);
    }
}
