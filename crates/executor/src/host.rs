//! Where a job's bash scripts run: an instance over SSH, this machine, or a container.
//!
//! Every executor drives a job the same way (steps as bash scripts with pid files, artifacts
//! as tar streams, a kill script on timeout or cancel); what differs is how a script reaches
//! a shell. That is this trait.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;
use slipway_connector::{Client, ExitStatus, Output, RunOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

use crate::script;

/// Why a host could not run a script: a system failure, never the script's own.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file on this machine (a transfer's input or output) could not be used.
    #[error("{action} {}: {source}", path.display())]
    File {
        /// `reading`, `creating` or `writing`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// bash on this machine could not be started or waited for.
    #[error("{action} bash: {source}")]
    Bash {
        /// `cannot start` or `waiting for`.
        action: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// bash on this machine came without one of its pipes.
    #[error("bash has no {0}")]
    NoPipe(&'static str),
    /// The SSH connection to the instance failed.
    #[error(transparent)]
    Connection(#[from] slipway_connector::ConnectError),
    /// The container engine failed while doing `action`.
    #[error("{action}: {source}")]
    Engine {
        /// What was being done (`exec in the build container`, ...).
        action: &'static str,
        /// The engine's error.
        #[source]
        source: slipway_docker::Error,
    },
    /// The step's environment (the build container, a VM's agent, an executor plugin's
    /// stage) failed or went away, as it said.
    #[error("{0}")]
    Environment(String),
    /// The kill script that stops a step failed: its status and what it said.
    #[error("{status}: {stderr}")]
    Stop {
        /// The kill script's status.
        status: ExitStatus,
        /// Its stderr.
        stderr: String,
    },
}

impl HostError {
    /// The step's environment failed, as `what` says.
    pub(crate) fn environment(what: impl std::fmt::Display) -> HostError {
        HostError::Environment(what.to_string())
    }

    /// The engine's error while doing `action`.
    pub(crate) fn engine(action: &'static str) -> impl Fn(slipway_docker::Error) -> HostError {
        move |source| HostError::Engine { action, source }
    }

    /// The error of `action` on the file `path`.
    pub(crate) fn file(
        action: &'static str,
        path: &Path,
    ) -> impl FnOnce(std::io::Error) -> HostError {
        let path = path.to_path_buf();
        move |source| HostError::File {
            action,
            path,
            source,
        }
    }

    /// The error of `action` on bash.
    pub(crate) fn bash(action: &'static str) -> impl FnOnce(std::io::Error) -> HostError {
        move |source| HostError::Bash { action, source }
    }
}

/// A shell that runs job scripts.
#[async_trait]
pub trait Host: Send + Sync + std::fmt::Debug {
    /// Feed `script` to bash on stdin and stream its output; the exit status of bash, or why
    /// it could not run (a system failure, not the script's).
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError>;

    /// Run `body` with `bash -c`, `stdin` on its stdin; its status, stdout and stderr.
    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError>;

    /// Where the job helper is kept on this host, as a bash expression: a directory of the
    /// job's user (its home on an instance; a container's own `/tmp`). `None`: the host is
    /// this machine, where the helper already is.
    fn helper_home(&self) -> Option<String> {
        Some("\"$HOME\"/.slipway".into())
    }

    /// A read-only directory where this host may find the helper already (a build container's
    /// engine-wide volume), tried before [`Host::helper_home`].
    fn shared_helper_dir(&self) -> Option<String> {
        None
    }

    /// [`Host::run_script`] for GitLab's stage `stage` (`step_script`, `after_script`), for
    /// hosts that run stages differently (an executor plugin).
    async fn run_stage(
        &self,
        stage: &str,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
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
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let _ = stage;
        self.capture(body, stdin).await
    }

    /// [`Host::capture_stage`] with stdin read from the file `input` and stdout written to the
    /// file `output` (files on this machine) when given; the returned stdout is then empty.
    /// Hosts that can stream do (memory does not grow with the files' sizes); the default
    /// reads and writes them whole.
    async fn transfer_stage(
        &self,
        stage: &str,
        body: &str,
        input: Option<&Path>,
        output: Option<&Path>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let stdin = match input {
            Some(path) => tokio::fs::read(path)
                .await
                .map_err(HostError::file("reading", path))?,
            None => Vec::new(),
        };
        let (status, out, err) = self.capture_stage(stage, body, stdin).await?;
        match output {
            Some(path) => {
                tokio::fs::write(path, &out)
                    .await
                    .map_err(HostError::file("writing", path))?;
                Ok((status, Vec::new(), err))
            }
            None => Ok((status, out, err)),
        }
    }

    /// Stop the step running as `stage` (a timeout or cancel): by default `kill_script`, which
    /// signals the step's process group through its pid file.
    async fn stop_stage(&self, stage: &str, kill_script: &str) -> Result<(), HostError> {
        let _ = stage;
        match self.capture(kill_script, Vec::new()).await? {
            (status, _, _) if status.success() => Ok(()),
            (status, _, err) => Err(HostError::Stop {
                status,
                stderr: String::from_utf8_lossy(&err).trim().to_string(),
            }),
        }
    }
}

/// bash reading the script on stdin; `exec` keeps the session leader's pid, which is then the
/// step's process group.
const SHELL: &str = "exec bash --noprofile --norc -s";

/// `body` run by `bash -c` as an SSH command line.
fn bash_c(body: &str) -> String {
    format!("exec bash --noprofile --norc -c {}", script::quote(body))
}

/// An instance reached over SSH.
#[derive(Debug, Clone, Copy)]
pub struct SshHost<'a>(pub &'a Client);

#[async_trait]
impl Host for SshHost<'_> {
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        self.0
            .run(
                RunOptions::new(SHELL)
                    .stdin(script::fed_on_stdin(&script))
                    .ready_ahead(),
                output,
            )
            .await
            .map_err(HostError::from)
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let command = bash_c(body);
        self.0
            .run_capture(command, stdin)
            .await
            .map_err(HostError::from)
    }

    async fn transfer_stage(
        &self,
        _stage: &str,
        body: &str,
        input: Option<&Path>,
        output: Option<&Path>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let command = bash_c(body);
        let mut opts = RunOptions::new(command);
        if let Some(path) = input {
            opts = opts.stdin_file(path);
        }
        let (tx, rx) = mpsc::channel(64);
        // `run` owns the sender, so the pump ends when `run` returns.
        let (status, pumped) = tokio::join!(self.0.run(opts, tx), pump(rx, output));
        let (out, err) = pumped?;
        Ok((status.map_err(HostError::from)?, out, err))
    }
}

/// Gathers a command's output: stdout into the file `output` when given (else kept), stderr
/// kept.
pub(crate) async fn pump(
    mut rx: mpsc::Receiver<Output>,
    output: Option<&Path>,
) -> Result<(Vec<u8>, Vec<u8>), HostError> {
    let mut file = match output {
        Some(path) => Some(
            tokio::fs::File::create(path)
                .await
                .map(|f| tokio::io::BufWriter::with_capacity(256 * 1024, f))
                .map_err(HostError::file("creating", path))?,
        ),
        None => None,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut failed = None;
    while let Some(chunk) = rx.recv().await {
        match (chunk, &mut file) {
            (Output::Stdout(b), Some(f)) => {
                // Keep draining after a write error so the command can finish.
                if failed.is_none()
                    && let Err(e) = f.write_all(&b).await
                {
                    failed = Some(e);
                }
            }
            (Output::Stdout(b), None) => out.extend(b),
            (Output::Stderr(b), _) => err.extend(b),
        }
    }
    if let (Some(f), None) = (&mut file, &failed)
        && let Err(e) = f.flush().await
    {
        failed = Some(e);
    }
    match (failed, output) {
        (Some(e), Some(path)) => Err(HostError::file("writing", path)(e)),
        _ => Ok((out, err)),
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
    fn helper_home(&self) -> Option<String> {
        None
    }

    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        let mut child = self
            .command(&["-s"])
            .spawn()
            .map_err(HostError::bash("cannot start"))?;
        let mut stdin = child.stdin.take().ok_or(HostError::NoPipe("stdin"))?;
        let mut stdout = child.stdout.take().ok_or(HostError::NoPipe("stdout"))?;
        let mut stderr = child.stderr.take().ok_or(HostError::NoPipe("stderr"))?;
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
            .map_err(HostError::bash("waiting for"))
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let mut child = self
            .command(&["-c", body])
            .spawn()
            .map_err(HostError::bash("cannot start"))?;
        let mut input = child.stdin.take().ok_or(HostError::NoPipe("stdin"))?;
        let feed = async move {
            let _ = input.write_all(&stdin).await;
            drop(input);
        };
        let (_, out) = tokio::join!(feed, child.wait_with_output());
        let out = out.map_err(HostError::bash("waiting for"))?;
        Ok((exit_status(out.status), out.stdout, out.stderr))
    }

    async fn transfer_stage(
        &self,
        _stage: &str,
        body: &str,
        input: Option<&Path>,
        output: Option<&Path>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        // The files are bash's own stdin and stdout: nothing passes through this process.
        let mut command = self.command(&["-c", body]);
        match input {
            Some(path) => {
                command.stdin(std::fs::File::open(path).map_err(HostError::file("reading", path))?)
            }
            None => command.stdin(Stdio::null()),
        };
        if let Some(path) = output {
            command.stdout(std::fs::File::create(path).map_err(HostError::file("creating", path))?);
        }
        let out = command
            .spawn()
            .map_err(HostError::bash("cannot start"))?
            .wait_with_output()
            .await
            .map_err(HostError::bash("waiting for"))?;
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
    async fn local_host_transfers_files_without_holding_them() {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in"), dir.path().join("out"));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&input, &data).unwrap();
        let host = LocalHost::default();
        let (st, out, err) = host
            .transfer_stage(
                "get_sources",
                "cat; echo note >&2",
                Some(&input),
                Some(&output),
            )
            .await
            .unwrap();
        assert!(st.success());
        assert!(out.is_empty(), "stdout went to the file");
        assert_eq!(err, b"note\n");
        assert!(std::fs::read(&output).unwrap() == data);
        // No input file: empty stdin; no output file: stdout returned.
        let (_, out, _) = host.transfer_stage("x", "wc -c", None, None).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out).trim(), "0");
        let e = host
            .transfer_stage("x", "cat", Some(&dir.path().join("missing")), None)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, HostError::File { action: "reading", path, .. } if path.ends_with("missing")),
            "{e}"
        );
        assert!(e.to_string().starts_with("reading "), "{e}");
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
