//! The build container as a [`Host`]: the first script through its attached main shell, every
//! later one as an exec.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use slipway_connector::{ExitStatus, Output};
use slipway_docker::{Attached, Docker, ExecSpec, LogOutput};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

use crate::host::{Host, HostError};

/// bash when the image has it, else `sh` (busybox, alpine), reading the script on stdin; `exec`
/// keeps the exec's session-leader pid, which is then the step's process group.
const RUN_SHELL: &str =
    "command -v bash >/dev/null && exec bash --noprofile --norc -s || exec sh -s";
/// The same choice for `bash -c "$1"`.
const CAPTURE_SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc -c \"$1\"; else exec sh -c \"$1\"; fi";
/// The build container's main process: the same shell choice, reading the first step (wrapped
/// by [`DockerHost`]) on its attached stdin; it then stays up as a childless `sleep`.
pub(super) const FIRST_STEP_SHELL: &str = RUN_SHELL;

/// A job's build container as a [`Host`]: every script is an exec, bash when the image has it,
/// else `sh`.
#[derive(Debug, Clone)]
pub struct DockerHost {
    docker: Docker,
    container: String,
    /// The build container's own shell (its pid 1), attached before it started, which runs the
    /// first script instead of an exec; taken by the first [`Host::run_script`].
    first: Arc<Mutex<Option<FirstStep>>>,
    /// The engine's helper volume is mounted at [`crate::data::SHARED_HELPER_DIR`].
    shared_helper: bool,
}

/// The attached main process of a build container started with [`FIRST_STEP_SHELL`].
#[derive(Debug)]
pub(super) struct FirstStep {
    pub(super) attached: Attached,
    /// Unguessable end marker; the status follows it.
    pub(super) marker: String,
}

impl DockerHost {
    /// Scripts run in `container` (which must be running).
    pub fn new(docker: Docker, container: impl Into<String>) -> Self {
        DockerHost {
            docker,
            container: container.into(),
            first: Arc::new(Mutex::new(None)),
            shared_helper: false,
        }
    }

    /// Scripts run in `container`, the first one by its main shell `first`.
    pub(super) fn with_first_step(docker: Docker, container: String, first: FirstStep) -> Self {
        DockerHost {
            docker,
            container,
            first: Arc::new(Mutex::new(Some(first))),
            shared_helper: false,
        }
    }

    /// This host with the engine's helper volume mounted (or not).
    pub(super) fn with_shared_helper(mut self, mounted: bool) -> Self {
        self.shared_helper = mounted;
        self
    }

    fn take_first(&self) -> Option<FirstStep> {
        self.first.lock().ok().and_then(|mut f| f.take())
    }

    /// The first script through the container's main shell: in a subshell, then the end
    /// marker with its status on stdout and on stderr, then the shell becomes a childless
    /// `sleep` that keeps the container up for the next scripts (execs).
    async fn run_first(
        &self,
        first: FirstStep,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        let FirstStep {
            attached:
                Attached {
                    output: mut stream,
                    mut input,
                },
            marker,
        } = first;
        let wrapped = format!(
            "(\n{script}\n) ; __slipway_rc=$?\n\
             printf '%s%d\\n' '{marker}' \"$__slipway_rc\"; printf '%s%d\\n' '{marker}' \"$__slipway_rc\" >&2\n\
             exec </dev/null >/dev/null 2>&1\nexec sleep 2147483647\n"
        );
        input
            .write_all(wrapped.as_bytes())
            .await
            .map_err(|e| HostError::environment(format!("feeding the build container: {e}")))?;
        let _ = input.flush().await;
        let mut out = MarkerFilter::new(&marker);
        let mut err = MarkerFilter::new(&marker);
        while out.status.is_none() || err.status.is_none() {
            let Some(chunk) = stream.next().await else {
                break;
            };
            match chunk {
                Ok(LogOutput::StdOut(b) | LogOutput::Console(b)) => {
                    let pass = out.feed(&b);
                    if !pass.is_empty() {
                        let _ = output.send(Output::Stdout(pass)).await;
                    }
                }
                Ok(LogOutput::StdErr(b)) => {
                    let pass = err.feed(&b);
                    if !pass.is_empty() {
                        let _ = output.send(Output::Stderr(pass)).await;
                    }
                }
                Ok(LogOutput::StdIn(_)) => {}
                Err(e) => {
                    return Err(HostError::environment(format!(
                        "build container output: {e}"
                    )));
                }
            }
        }
        match out.status.or(err.status) {
            Some(code) => Ok(exit_status(code)),
            None => Err(HostError::environment(
                "the build container stopped during the script",
            )),
        }
    }
}

/// Passes a stream's bytes through until an end marker, then parses the status after it.
#[derive(Debug)]
struct MarkerFilter {
    marker: Vec<u8>,
    pending: Vec<u8>,
    status: Option<i64>,
}

impl MarkerFilter {
    fn new(marker: &str) -> Self {
        MarkerFilter {
            marker: marker.as_bytes().to_vec(),
            pending: Vec::new(),
            status: None,
        }
    }

    /// What may go to the trace now; holds back a tail that could start the marker.
    fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.status.is_some() {
            return Vec::new();
        }
        self.pending.extend_from_slice(chunk);
        let m = &self.marker;
        if let Some(i) = self
            .pending
            .windows(m.len())
            .position(|w| w == m.as_slice())
        {
            let rest = &self.pending[i + m.len()..];
            if let Some(nl) = rest.iter().position(|&c| c == b'\n') {
                let code = std::str::from_utf8(&rest[..nl])
                    .ok()
                    .and_then(|c| c.trim().parse().ok())
                    .unwrap_or(-1);
                self.status = Some(code);
                let pass = self.pending[..i].to_vec();
                self.pending.clear();
                return pass;
            }
            // The status is not all here yet.
            let pass = self.pending[..i].to_vec();
            self.pending.drain(..i);
            return pass;
        }
        let keep = (1..m.len().min(self.pending.len() + 1))
            .rev()
            .find(|&k| self.pending.ends_with(&m[..k]))
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let pass = self.pending[..cut].to_vec();
        self.pending.drain(..cut);
        pass
    }
}

fn exit_status(code: i64) -> ExitStatus {
    ExitStatus {
        code: u32::try_from(code).ok(),
        signal: None,
    }
}

#[async_trait]
impl Host for DockerHost {
    fn helper_home(&self) -> Option<String> {
        // The image's user may have no writable home; the container's /tmp is the job's own.
        Some("/tmp/.slipway".into())
    }

    fn shared_helper_dir(&self) -> Option<String> {
        self.shared_helper
            .then(|| crate::data::SHARED_HELPER_DIR.to_string())
    }

    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        if let Some(first) = self.take_first() {
            return self.run_first(first, script, output).await;
        }
        let spec = ExecSpec::new(["sh", "-c", RUN_SHELL]);
        self.exec_streamed(spec, script.as_bytes(), output).await
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let spec = ExecSpec::new(["sh", "-c", CAPTURE_SHELL, "sh", body]);
        let out = self
            .docker
            .exec_run(&self.container, &spec, Some(Bytes::from(stdin)))
            .await
            .map_err(HostError::engine("exec in the build container"))?;
        Ok((
            exit_status(out.exit_code),
            out.output.stdout,
            out.output.stderr,
        ))
    }

    async fn transfer_stage(
        &self,
        _stage: &str,
        body: &str,
        input: Option<&Path>,
        output: Option<&Path>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), HostError> {
        let spec = ExecSpec::new(["sh", "-c", CAPTURE_SHELL, "sh", body]);
        // Opened first: a missing file is this side's error, and no exec is left waiting.
        let source = match input {
            Some(path) => Some(tokio::io::BufReader::with_capacity(
                256 * 1024,
                tokio::fs::File::open(path)
                    .await
                    .map_err(HostError::file("reading", path))?,
            )),
            None => None,
        };
        let stdin: Box<dyn tokio::io::AsyncRead + Send + Unpin> = match source {
            Some(file) => Box::new(file),
            None => Box::new(tokio::io::empty()),
        };
        let (tx, rx) = mpsc::channel(64);
        let (status, pumped) = tokio::join!(
            self.exec_streamed(spec, stdin, tx),
            crate::host::pump(rx, output)
        );
        let (out, err) = pumped?;
        Ok((status?, out, err))
    }
}

impl DockerHost {
    /// An exec of `spec` with `stdin` streamed to it and its output sent to `output` as it
    /// comes (kept draining when nobody reads, so the exec can finish); its exit status.
    async fn exec_streamed(
        &self,
        mut spec: ExecSpec,
        mut stdin: impl tokio::io::AsyncRead + Send + Unpin,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, HostError> {
        spec.stdin = true;
        let err = |e| HostError::engine("exec in the build container")(e);
        let id = self
            .docker
            .create_exec(&self.container, &spec)
            .await
            .map_err(err)?;
        let Attached {
            output: mut stream,
            mut input,
        } = self.docker.start_exec(&id, false).await.map_err(err)?;
        let feed = async move {
            // A script that exits early stops reading: a broken pipe is not an error here.
            // A read error of this side's stdin is: the script must not take a cut stream
            // for a whole one, so its run fails.
            let mut buf = vec![0u8; 64 * 1024];
            let unreadable = loop {
                let n = match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
                    Ok(0) => break None,
                    Ok(n) => n,
                    Err(e) => break Some(e),
                };
                if input.write_all(&buf[..n]).await.is_err() {
                    break None;
                }
            };
            let _ = input.shutdown().await;
            unreadable
        };
        let pump = async move {
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(LogOutput::StdOut(b) | LogOutput::Console(b)) => Output::Stdout(b.to_vec()),
                    Ok(LogOutput::StdErr(b)) => Output::Stderr(b.to_vec()),
                    Ok(LogOutput::StdIn(_)) => continue,
                    Err(e) => {
                        return Err(HostError::environment(format!(
                            "build container output: {e}"
                        )));
                    }
                };
                // Nobody reading any more: keep draining so the exec can finish.
                let _ = output.send(chunk).await;
            }
            Ok(())
        };
        let (unreadable, pumped) = tokio::join!(feed, pump);
        if let Some(e) = unreadable {
            return Err(HostError::environment(format!(
                "reading the input of the build container's script: {e}"
            )));
        }
        pumped?;
        let code = self.docker.exec_exit_code(&id).await.map_err(err)?;
        Ok(exit_status(code))
    }
}
