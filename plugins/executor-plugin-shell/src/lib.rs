//! `executor-plugin-shell`: the Rust SDK's reference executor provider. Each job gets a directory
//! of its own under `root` on the manager's machine; each stage's script runs there under bash,
//! in its own process group, which is killed when the host cancels the stage.
//!
//! It isolates nothing (level `none`); it is what a new provider starts from, and what the
//! benchmark measures the plugin boundary with.
//!
//! plugin config: `{"root": "/var/lib/slipway-shell"}` (default `$TMPDIR/slipway-shell`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use slipway_executor_plugin::{
    Capabilities, Chunk, CleanupJob, ExecutorProvider, Exit, Failure, Placement, PrepareJob,
    Prepared, ProviderError, Stage,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

/// Size asked for the stages' stdout pipes (Linux's default is 64 KiB).
const PIPE_BYTES: i32 = 1 << 20;
/// Largest read from a stage's output.
const READ_BYTES: usize = 256 * 1024;

/// Config keys this provider reads.
const KEYS: &[&str] = &["root"];

/// The provider.
#[derive(Debug, Default)]
pub struct ShellProvider {
    root: Mutex<Option<PathBuf>>,
}

/// Kills a stage's whole process group when the stage's future is dropped (a cancel).
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.0 > 0 {
            // ESRCH: the group already ended.
            let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
        }
    }
}

impl ShellProvider {
    fn root(&self) -> Result<PathBuf, ProviderError> {
        self.root
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ProviderError::Failed("Init must be called first".into()))
    }

    /// The job directory `state` names; only direct children of root are accepted.
    fn job_dir(&self, state: &[u8]) -> Result<PathBuf, ProviderError> {
        let root = self.root()?;
        let dir = PathBuf::from(String::from_utf8_lossy(state).into_owned());
        if dir.parent() != Some(root.as_path()) || dir.file_name().is_none() {
            return Err(ProviderError::NotFound(format!(
                "{} is not a job directory under {}",
                dir.display(),
                root.display()
            )));
        }
        Ok(dir)
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> ProviderError {
    ProviderError::Failed(format!("{what} {}: {e}", path.display()))
}

#[async_trait]
impl ExecutorProvider for ShellProvider {
    async fn init(&self, config: &[u8], dry_run: bool) -> Result<Capabilities, ProviderError> {
        let config: serde_json::Value =
            serde_json::from_slice(if config.is_empty() { b"{}" } else { config })
                .map_err(|e| ProviderError::InvalidConfig(format!("not JSON: {e}")))?;
        let Some(map) = config.as_object() else {
            return Err(ProviderError::InvalidConfig(
                "expected a JSON object".into(),
            ));
        };
        if let Some(k) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(ProviderError::InvalidConfig(format!(
                "config.{k}: unknown key (known: {})",
                KEYS.join(", ")
            )));
        }
        let root = match map.get("root") {
            None => std::env::temp_dir().join("slipway-shell"),
            Some(serde_json::Value::String(s)) if s.starts_with('/') => PathBuf::from(s),
            Some(other) => {
                return Err(ProviderError::InvalidConfig(format!(
                    "config.root: expected an absolute path, got {other}"
                )));
            }
        };
        if !dry_run {
            tokio::fs::create_dir_all(&root)
                .await
                .map_err(|e| io_error("creating", &root, e))?;
            *self.root.lock().unwrap_or_else(|p| p.into_inner()) = Some(root);
        }
        Ok(Capabilities {
            name: "shell".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            isolation_levels: vec!["none".into()],
            placement: Placement::Local,
            // Jobs run on this machine, which reaches what the runner reaches.
            job_data: true,
        })
    }

    async fn prepare(&self, job: PrepareJob) -> Result<Prepared, ProviderError> {
        let root = self.root()?;
        let id = serde_json::from_slice::<serde_json::Value>(&job.job)
            .ok()
            .and_then(|j| j["id"].as_u64())
            .unwrap_or(0);
        let dir = root.join(format!("job-{id}-{:08x}", rand::random::<u32>()));
        tokio::fs::create_dir_all(dir.join("scripts"))
            .await
            .map_err(|e| io_error("creating", &dir, e))?;
        Ok(Prepared {
            state: dir.display().to_string().into_bytes(),
            builds_dir: Some(dir.join("builds").display().to_string()),
            cache_dir: None,
            messages: vec![format!("Running in {} on the manager", dir.display())],
        })
    }

    async fn run(&self, stage: Stage, output: mpsc::Sender<Chunk>) -> Result<Exit, ProviderError> {
        let dir = self.job_dir(&stage.state)?;
        let script = dir.join("scripts").join(format!(
            "{}-{:08x}.sh",
            stage.name.replace('/', "_"),
            rand::random::<u32>()
        ));
        tokio::fs::write(&script, &stage.script)
            .await
            .map_err(|e| io_error("writing", &script, e))?;
        let mut child = tokio::process::Command::new("bash")
            .args(["--noprofile", "--norc"])
            .arg(&script)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ProviderError::Failed(format!("cannot start bash: {e}")))?;
        let _group = GroupGuard(child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ProviderError::Failed("bash has no pipes".into()));
        };
        // A larger pipe lets a fast writer fill bigger reads: fewer, larger messages to the host.
        let _ = nix::fcntl::fcntl(&stdout, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
        let feed = async move {
            // A script that exits early stops reading: not an error.
            let _ = stdin.write_all(&stage.stdin).await;
        };
        let pump = |mut r: Box<dyn tokio::io::AsyncRead + Unpin + Send>, err: bool| {
            let output = output.clone();
            async move {
                let mut buf = vec![0u8; READ_BYTES];
                while let Ok(n) = r.read(&mut buf).await {
                    let chunk = buf[..n].to_vec();
                    let chunk = if err {
                        Chunk::Stderr(chunk)
                    } else {
                        Chunk::Stdout(chunk)
                    };
                    if n == 0 || output.send(chunk).await.is_err() {
                        break;
                    }
                }
            }
        };
        tokio::join!(
            feed,
            pump(Box::new(stdout), false),
            pump(Box::new(stderr), true)
        );
        let status = child
            .wait()
            .await
            .map_err(|e| ProviderError::Failed(format!("waiting for bash: {e}")))?;
        let _ = tokio::fs::remove_file(&script).await;
        Ok(match status.code() {
            Some(code) => Exit::code(code),
            None => Exit {
                code: -1,
                failure: Failure::System,
                message: format!("bash was killed ({status})"),
            },
        })
    }

    async fn cleanup(&self, job: CleanupJob) -> Result<Vec<String>, ProviderError> {
        let dir = self.job_dir(&job.state)?;
        match tokio::fs::remove_dir_all(&dir).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io_error("removing", &dir, e))
            }
            _ => Ok(Vec::new()),
        }
    }
}
