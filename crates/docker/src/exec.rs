//! Exec: run a process (a step script) in a running container, with stdin.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::client::{Docker, Req, seg};
use crate::error::{Error, Result};
use crate::stream::{Attached, CollectedOutput};

/// What to run with [`Docker::create_exec`].
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    /// Command and arguments.
    pub cmd: Vec<String>,
    /// Extra environment, `KEY=value` each.
    pub env: Vec<String>,
    /// Working directory.
    pub working_dir: Option<String>,
    /// User.
    pub user: Option<String>,
    /// Attach stdin.
    pub stdin: bool,
    /// Allocate a TTY (output then is not split into stdout/stderr).
    pub tty: bool,
    /// Privileged.
    pub privileged: bool,
}

impl ExecSpec {
    /// Runs `cmd` with stdout/stderr attached and no stdin.
    pub fn new<I, S>(cmd: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            cmd: cmd.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }
}

/// `GET /exec/{id}/json` (the parts we use).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExecInspect {
    /// Exec ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Whether the process still runs.
    #[serde(default)]
    pub running: bool,
    /// Exit code once it has exited.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Process ID on the host.
    #[serde(default)]
    pub pid: i64,
    /// Container the exec runs in.
    #[serde(default, rename = "ContainerID")]
    pub container_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct IdResponse {
    id: String,
}

/// Result of [`Docker::exec_run`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code.
    pub exit_code: i64,
    /// Output, stdout and stderr apart.
    pub output: CollectedOutput,
}

impl Docker {
    /// `POST /containers/{id}/exec`: returns the exec ID.
    pub async fn create_exec(&self, container: &str, spec: &ExecSpec) -> Result<String> {
        let mut body = json!({
            "AttachStdin": spec.stdin,
            "AttachStdout": true,
            "AttachStderr": true,
            "Tty": spec.tty,
            "Cmd": spec.cmd,
            "Privileged": spec.privileged,
        });
        if !spec.env.is_empty() {
            body["Env"] = json!(spec.env);
        }
        if let Some(wd) = &spec.working_dir {
            body["WorkingDir"] = json!(wd);
        }
        if let Some(user) = &spec.user {
            body["User"] = json!(user);
        }
        let req = Req::post(format!("/containers/{}/exec", seg(container))).json(&body)?;
        let resp: IdResponse = self.json(req).await?;
        Ok(resp.id)
    }

    /// `POST /exec/{id}/start` on a hijacked connection. `tty` must match the exec's spec.
    pub async fn start_exec(&self, exec_id: &str, tty: bool) -> Result<Attached> {
        let req = Req::post(format!("/exec/{}/start", seg(exec_id)))
            .json(&json!({ "Detach": false, "Tty": tty }))?;
        let io = self.upgrade(req).await?;
        Ok(Attached::new(io, tty))
    }

    /// `GET /exec/{id}/json`.
    pub async fn inspect_exec(&self, exec_id: &str) -> Result<ExecInspect> {
        self.json(Req::get(format!("/exec/{}/json", seg(exec_id))))
            .await
    }

    /// The exit code of a finished exec, polling briefly while the engine records it.
    pub async fn exec_exit_code(&self, exec_id: &str) -> Result<i64> {
        let mut delay = Duration::from_millis(5);
        for _ in 0..40 {
            let info = self.inspect_exec(exec_id).await?;
            if let (false, Some(code)) = (info.running, info.exit_code) {
                return Ok(code);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(250));
        }
        Err(Error::Stream(format!(
            "exec {exec_id}: output ended but the process is still running"
        )))
    }

    /// Runs `spec` in `container` to its end: writes `stdin` (then closes it) and collects the
    /// output. For streaming output use [`Docker::create_exec`] + [`Docker::start_exec`].
    pub async fn exec_run(
        &self,
        container: &str,
        spec: &ExecSpec,
        stdin: Option<Bytes>,
    ) -> Result<ExecOutput> {
        let mut spec = spec.clone();
        spec.stdin = spec.stdin || stdin.is_some();
        let id = self.create_exec(container, &spec).await?;
        let Attached { output, mut input } = self.start_exec(&id, spec.tty).await?;
        let writer = async move {
            if let Some(data) = stdin {
                input.write_all(&data).await?;
            }
            input.shutdown().await
        };
        let (written, output) = tokio::join!(writer, output.collect_output());
        let output = output?;
        if let Err(e) = written {
            // The process may exit without reading its stdin; that is not our failure.
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(e.into());
            }
        }
        let exit_code = self.exec_exit_code(&id).await?;
        Ok(ExecOutput { exit_code, output })
    }
}
