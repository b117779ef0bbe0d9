//! Host side: start a plugin process the go-plugin way, connect to it over gRPC (AutoMTLS on a
//! private unix socket), and keep it running.
//!
//! A supervisor task owns the child: when the process dies unexpectedly it is restarted with
//! backoff and handed to a re-init hook (which re-sends the last `Init`), so callers only see a
//! short wait. What the plugin serves is the caller's business: it gets a [`Connection`]'s
//! channel and builds its own client on it.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::net::{TcpStream, UnixStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tonic::Status;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};
use tracing::Level;

use crate::handshake::{Handshake, HandshakeError, Network};
use crate::io::Io;
use crate::proto::Empty;
use crate::proto::grpc_controller_client::GrpcControllerClient;
use crate::proto::grpc_stdio_client::GrpcStdioClient;
use crate::proto::stdio_data::Channel as StdioChannel;
use crate::tls::{self, AutoMtlsCert, TlsError};
use crate::{ENV_CLIENT_CERT, ENV_PROTOCOL_VERSIONS, ENV_UNIX_SOCKET_DIR, Protocol};

/// go-plugin's host raises message limits to MaxInt32; clients built on a [`Connection`] should
/// match it.
pub const MAX_MESSAGE_SIZE: usize = i32::MAX as usize;
/// go-plugin waits this long for a plugin to exit after `GRPCController.Shutdown`.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// After a transport error, how long to wait for the supervisor to notice the process died.
const DEATH_NOTICE_WAIT: Duration = Duration::from_secs(2);
/// Bound on connecting and health-checking once the handshake line is read.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 receive window per stream (bytes).
const RECEIVE_WINDOW: u32 = 1 << 20;
/// How many trailing stderr lines an early-exit error quotes.
const STDERR_TAIL_LINES: usize = 10;

/// How to start and supervise one plugin process.
#[derive(Clone)]
pub struct ProcessOptions {
    /// Short name used in logs and errors (e.g. `local`).
    pub name: String,
    /// Executable to start.
    pub path: PathBuf,
    /// How long to wait for the handshake line.
    pub handshake_timeout: Duration,
    /// Restarts in a row (without the plugin staying up for `stable_after`) before giving up.
    pub max_restarts: u32,
    /// Delay before the first restart; doubles per consecutive restart.
    pub restart_backoff: Duration,
    /// Upper bound of the restart delay.
    pub restart_backoff_max: Duration,
    /// A process that ran this long resets the consecutive-restart count.
    pub stable_after: Duration,
    /// How long an RPC waits for a restart in progress before failing.
    pub call_wait: Duration,
    /// Use go-plugin AutoMTLS (on by default).
    pub auto_mtls: bool,
    /// Extra environment for the plugin process.
    pub env: Vec<(String, String)>,
}

impl ProcessOptions {
    /// Options with go-plugin's defaults (60 s handshake, AutoMTLS, 200 ms → 5 s backoff).
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        ProcessOptions {
            name: name.into(),
            path: path.into(),
            handshake_timeout: Duration::from_secs(60),
            max_restarts: 5,
            restart_backoff: Duration::from_millis(200),
            restart_backoff_max: Duration::from_secs(5),
            stable_after: Duration::from_secs(60),
            call_wait: Duration::from_secs(30),
            auto_mtls: true,
            env: Vec::new(),
        }
    }

    /// Set the handshake timeout.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Set how many consecutive restarts are attempted before giving up.
    pub fn max_restarts(mut self, n: u32) -> Self {
        self.max_restarts = n;
        self
    }

    /// Set the restart backoff (initial delay, maximum delay).
    pub fn restart_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.restart_backoff = initial;
        self.restart_backoff_max = max;
        self
    }

    /// Set how long RPCs wait for a restart in progress.
    pub fn call_wait(mut self, wait: Duration) -> Self {
        self.call_wait = wait;
        self
    }

    /// Turn AutoMTLS on or off.
    pub fn auto_mtls(mut self, on: bool) -> Self {
        self.auto_mtls = on;
        self
    }

    /// Add an environment variable for the plugin.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Delay before restart attempt `attempt` (0-based): doubling, capped.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        self.restart_backoff
            .saturating_mul(factor)
            .min(self.restart_backoff_max)
    }
}

impl fmt::Debug for ProcessOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // env values may carry cloud credentials: show keys only.
        f.debug_struct("ProcessOptions")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_restarts", &self.max_restarts)
            .field("restart_backoff", &self.restart_backoff)
            .field("restart_backoff_max", &self.restart_backoff_max)
            .field("stable_after", &self.stable_after)
            .field("call_wait", &self.call_wait)
            .field("auto_mtls", &self.auto_mtls)
            .field(
                "env_keys",
                &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why a plugin could not be found or started.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No executable for the reference.
    #[error("plugin {name:?} not found; looked in: {}", list_paths(.looked))]
    NotFound {
        /// The reference searched for.
        name: String,
        /// Every candidate path tried.
        looked: Vec<PathBuf>,
    },
    /// The executable could not be spawned.
    #[error("plugin {name:?} ({}): cannot start: {source}", .path.display())]
    Spawn {
        /// Plugin name.
        name: String,
        /// Executable.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The handshake line was invalid.
    #[error("plugin {name:?} ({}): {source}", .path.display())]
    Handshake {
        /// Plugin name.
        name: String,
        /// Executable.
        path: PathBuf,
        /// What was wrong with the line.
        source: HandshakeError,
    },
    /// No handshake line within the timeout.
    #[error("plugin {name:?}: no handshake within {timeout:?}")]
    HandshakeTimeout {
        /// Plugin name.
        name: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// The process exited (or closed stdout) before printing its handshake.
    #[error("plugin {name:?} {how} before its handshake; stderr: {stderr}")]
    ExitedEarly {
        /// Plugin name.
        name: String,
        /// e.g. `exited with status 3`.
        how: String,
        /// Last stderr lines.
        stderr: String,
    },
    /// Dialing the announced address or the health check failed.
    #[error("plugin {name:?}: {what}: {message}")]
    Connect {
        /// Plugin name.
        name: String,
        /// Which step failed.
        what: String,
        /// Details.
        message: String,
    },
    /// AutoMTLS setup failed.
    #[error("plugin {name:?}: {source}")]
    Tls {
        /// Plugin name.
        name: String,
        /// Details.
        source: TlsError,
    },
    /// A local filesystem operation failed.
    #[error("plugin {name:?}: {what}: {source}")]
    Io {
        /// Plugin name.
        name: String,
        /// What was being done.
        what: String,
        /// OS error.
        source: std::io::Error,
    },
    /// Re-sending the last `init` to a restarted plugin failed.
    #[error("plugin {name:?}: re-initializing after restart: {message}")]
    Reinit {
        /// Plugin name.
        name: String,
        /// The plugin's answer.
        message: String,
    },
}

fn list_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nowhere (empty name)".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `reference` as a path, when it says it is one (absolute, `./`, `../`, or an existing relative
/// path with a `/`): a bare name never depends on the working directory.
pub fn as_path(reference: &str) -> Option<Result<PathBuf, HostError>> {
    let path_like = reference.starts_with('/')
        || reference.starts_with("./")
        || reference.starts_with("../")
        || (reference.contains('/') && Path::new(reference).exists());
    if !path_like {
        return None;
    }
    let path = PathBuf::from(reference);
    Some(if is_executable(&path) {
        Ok(path)
    } else {
        Err(HostError::NotFound {
            name: reference.to_owned(),
            looked: vec![path],
        })
    })
}

/// Where plugins are looked for after the operator's own directory: next to this executable
/// (and its parent when that is cargo's `deps`, so binaries of the same target dir are found),
/// then `PATH`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let deps_parent = (exe_dir.file_name() == Some("deps".as_ref()))
            .then(|| exe_dir.parent().map(Path::to_path_buf));
        dirs.push(exe_dir);
        dirs.extend(deps_parent.flatten());
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|d| !d.as_os_str().is_empty()));
    }
    dirs
}

/// The first executable `file` in `dirs`; every path tried is added to `looked`.
pub fn find_in(
    file: &str,
    dirs: impl IntoIterator<Item = PathBuf>,
    looked: &mut Vec<PathBuf>,
) -> Option<PathBuf> {
    for dir in dirs {
        let candidate = dir.join(file);
        if is_executable(&candidate) {
            return Some(candidate);
        }
        looked.push(candidate);
    }
    None
}

/// A regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Connection to one plugin process.
#[derive(Clone, Debug)]
pub struct Connection {
    /// The gRPC channel: build the plugin's service client on it.
    pub channel: Channel,
    controller: GrpcControllerClient<Channel>,
    /// Which process this is (0 = first); lets a failed call tell whether a restart happened.
    pub generation: u64,
}

/// Called with a restarted process's channel before callers see it: re-send the last `Init`.
/// `Err` is the plugin's answer; the process is then killed and the restart retried.
pub type Reinit =
    Arc<dyn Fn(Channel) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Why a call through [`PluginProcess::call`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The process is restarting, gave up, is stopped, or the transport failed.
    #[error("{0}")]
    Unavailable(String),
    /// The plugin answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(Status),
}

/// What RPCs see.
#[derive(Clone)]
enum HostState {
    Ready(Box<Connection>),
    Restarting,
    Failed(String),
    Stopped,
}

struct Inner {
    opts: ProcessOptions,
    protocol: Protocol,
    reinit: Option<Reinit>,
    host_cert: Option<AutoMtlsCert>,
    socket_dir: PathBuf,
    state: watch::Sender<HostState>,
    stop: watch::Sender<bool>,
    /// Current process (and group) id; 0 when none is running.
    pid: AtomicU32,
    restarts: AtomicU32,
    stopped: AtomicBool,
}

impl Inner {
    fn name(&self) -> &str {
        &self.opts.name
    }

    fn unavailable(&self, message: impl Into<String>) -> CallError {
        CallError::Unavailable(message.into())
    }
}

/// A running, supervised plugin process.
pub struct PluginProcess {
    inner: Arc<Inner>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for PluginProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginProcess")
            .field("name", &self.inner.opts.name)
            .field("pid", &self.pid())
            .field("restarts", &self.restarts())
            .finish()
    }
}

/// Kills a plugin's whole process group when dropped, unless disarmed.
struct GroupGuard {
    pgid: i32,
}

impl GroupGuard {
    fn kill(&self) {
        if self.pgid > 0 {
            // ESRCH (group already empty) is fine.
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
        }
    }

    fn disarm(&mut self) {
        self.pgid = 0;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One plugin process and the tasks draining its output.
struct Process {
    child: Child,
    guard: GroupGuard,
    conn: Connection,
    /// stdout/stderr/stdio drains; dropping the set aborts them.
    tasks: JoinSet<()>,
    started: Instant,
}

impl Process {
    /// Kill the group, reap the leader, and let the drains flush what is left.
    async fn kill_and_reap(mut self, inner: &Inner) {
        // Kill before reaping: while the leader is an unreaped zombie its pid cannot be reused.
        self.guard.kill();
        let _ = self.child.wait().await;
        self.guard.disarm();
        inner.pid.store(0, Ordering::SeqCst);
        finish_tasks(&mut self.tasks).await;
    }
}

async fn finish_tasks(tasks: &mut JoinSet<()>) {
    // Output pipes close once the group is dead; a grandchild holding them must not block us.
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
}

impl PluginProcess {
    /// Start the plugin, complete the handshake, connect and health-check it. `reinit` is called
    /// on every restarted process before callers see it.
    pub async fn start(
        opts: ProcessOptions,
        protocol: Protocol,
        reinit: Option<Reinit>,
    ) -> Result<PluginProcess, HostError> {
        let name = opts.name.clone();
        let host_cert = if opts.auto_mtls {
            Some(AutoMtlsCert::generate().map_err(|source| HostError::Tls {
                name: name.clone(),
                source,
            })?)
        } else {
            None
        };
        let socket_dir = crate::io::make_private_dir("slipway-fp")
            .await
            .map_err(|source| HostError::Io {
                name: name.clone(),
                what: "creating the socket directory".into(),
                source,
            })?;
        let (stop, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            opts,
            protocol,
            reinit,
            host_cert,
            socket_dir,
            state: watch::channel(HostState::Restarting).0,
            stop,
            pid: AtomicU32::new(0),
            restarts: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
        });
        let process = match launch(&inner, 0).await {
            Ok(p) => p,
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&inner.socket_dir).await;
                return Err(e);
            }
        };
        inner
            .state
            .send_replace(HostState::Ready(Box::new(process.conn.clone())));
        let supervisor = tokio::spawn(supervise(inner.clone(), process));
        Ok(PluginProcess {
            inner,
            supervisor: Mutex::new(Some(supervisor)),
        })
    }

    /// Plugin name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Process id of the current plugin process (also its process group id).
    pub fn pid(&self) -> Option<u32> {
        Some(self.inner.pid.load(Ordering::SeqCst)).filter(|p| *p != 0)
    }

    /// How many times the plugin was restarted after dying.
    pub fn restarts(&self) -> u32 {
        self.inner.restarts.load(Ordering::SeqCst)
    }

    /// Stop the plugin: `GRPCController.Shutdown`, up to 2 s grace, SIGKILL the process group,
    /// reap, stop the supervisor and drains, remove the socket directory. Idempotent.
    pub async fn stop(&self) {
        let _ = self.inner.stop.send(true);
        let handle = self
            .supervisor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut handle) = handle {
            // The supervisor owns the child and performs the shutdown; bound it in case it hangs.
            if tokio::time::timeout(Duration::from_secs(10), &mut handle)
                .await
                .is_err()
            {
                handle.abort();
                let _ = handle.await;
            }
        }
        self.inner.state.send_replace(HostState::Stopped);
        let _ = tokio::fs::remove_dir_all(&self.inner.socket_dir).await;
        self.inner.stopped.store(true, Ordering::SeqCst);
    }

    /// The current connection, waiting (bounded by `call_wait`) for a restart in progress.
    pub async fn ready(&self) -> Result<Connection, CallError> {
        let inner = &self.inner;
        let mut rx = inner.state.subscribe();
        let wait = inner.opts.call_wait;
        let state =
            match tokio::time::timeout(wait, rx.wait_for(|s| !matches!(s, HostState::Restarting)))
                .await
            {
                Ok(Ok(state)) => state.clone(),
                Ok(Err(_)) => HostState::Stopped,
                Err(_) => return Err(inner.unavailable(format!("still restarting after {wait:?}"))),
            };
        match state {
            HostState::Ready(conn) => Ok(*conn),
            HostState::Failed(message) => Err(inner.unavailable(message)),
            HostState::Stopped | HostState::Restarting => {
                Err(inner.unavailable("plugin host is stopped"))
            }
        }
    }

    /// Did the supervisor replace (or give up on) the connection of `generation` within `wait`?
    async fn replaced(&self, generation: u64, wait: Duration) -> bool {
        let mut rx = self.inner.state.subscribe();
        let changed =
            rx.wait_for(|s| !matches!(s, HostState::Ready(c) if c.generation == generation));
        matches!(tokio::time::timeout(wait, changed).await, Ok(Ok(_)))
    }

    fn map_status(&self, rpc: &str, status: Status) -> CallError {
        if is_transport_error(&status) {
            self.inner
                .unavailable(format!("{rpc}: {}", status.message()))
        } else {
            CallError::Status(status)
        }
    }

    /// Run one unary RPC; on a transport error caused by the process dying, wait for the restart
    /// and retry once. Only for RPCs that are safe to repeat.
    pub async fn call<T, F, Fut>(&self, rpc: &str, f: F) -> Result<T, CallError>
    where
        F: Fn(Connection) -> Fut + Send + Sync,
        Fut: Future<Output = Result<tonic::Response<T>, Status>> + Send,
        T: Send,
    {
        let conn = self.ready().await?;
        let generation = conn.generation;
        match f(conn).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s)
                if is_transport_error(&s) && self.replaced(generation, DEATH_NOTICE_WAIT).await =>
            {
                tracing::debug!(plugin = %self.name(), rpc, "retrying after the plugin was restarted");
                let conn = self.ready().await?;
                f(conn)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| self.map_status(rpc, s))
            }
            Err(s) => Err(self.map_status(rpc, s)),
        }
    }
}

/// Statuses made by tonic itself (connection reset, refused, h2 errors) carry a source error;
/// statuses the plugin returned do not.
pub fn is_transport_error(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return;
        }
        // Last resort when stop() was not awaited: never leave a plugin acting on the cloud.
        let pid = self.inner.pid.swap(0, Ordering::SeqCst);
        if let Ok(pgid) = i32::try_from(pid)
            && pgid > 0
        {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        if let Some(handle) = self
            .supervisor
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // Dropping the supervisor's future drops the Child (kill_on_drop) for tokio to reap.
            handle.abort();
        }
        let _ = std::fs::remove_dir_all(&self.inner.socket_dir);
    }
}

/// The supervisor: owns the running process, restarts it when it dies, stops it on request.
async fn supervise(inner: Arc<Inner>, mut process: Process) {
    let mut stop = inner.stop.subscribe();
    let mut consecutive = 0u32;
    let mut generation = process.conn.generation;
    loop {
        let status = tokio::select! {
            status = process.child.wait() => status,
            _ = stop_requested(&mut stop) => {
                shutdown_process(&inner, process).await;
                inner.state.send_replace(HostState::Stopped);
                return;
            }
        };
        inner.state.send_replace(HostState::Restarting);
        inner.pid.store(0, Ordering::SeqCst);
        // The leader is gone (tokio already reaped it); take any grandchildren with it. The pid was
        // freed a moment ago, and Linux allocates pids cyclically, so hitting a reused group is
        // practically impossible.
        process.guard.kill();
        process.guard.disarm();
        finish_tasks(&mut process.tasks).await;
        let how = status.map_or_else(|e| format!("wait failed: {e}"), describe_exit);
        if process.started.elapsed() >= inner.opts.stable_after {
            consecutive = 0;
        }
        drop(process);

        process = loop {
            if consecutive >= inner.opts.max_restarts {
                let message = format!(
                    "{how}; gave up after {} restart attempts in a row",
                    inner.opts.max_restarts
                );
                tracing::error!(plugin = %inner.name(), "plugin {:?} {message}", inner.name());
                inner.state.send_replace(HostState::Failed(message));
                stop_requested(&mut stop).await;
                inner.state.send_replace(HostState::Stopped);
                return;
            }
            let delay = inner.opts.backoff(consecutive);
            consecutive += 1;
            tracing::warn!(
                plugin = %inner.name(),
                "plugin {:?} {how}; restarting in {delay:?} (attempt {consecutive} of {})",
                inner.name(),
                inner.opts.max_restarts
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop_requested(&mut stop) => {
                    inner.state.send_replace(HostState::Stopped);
                    return;
                }
            }
            generation += 1;
            // Dropping an unfinished launch kills its process group (GroupGuard, kill_on_drop).
            let attempt = tokio::select! {
                r = relaunch(&inner, generation) => r,
                _ = stop_requested(&mut stop) => {
                    inner.state.send_replace(HostState::Stopped);
                    return;
                }
            };
            match attempt {
                Ok(p) => break p,
                Err(e) => tracing::warn!(plugin = %inner.name(), "restart failed: {e}"),
            }
        };
        inner.restarts.fetch_add(1, Ordering::SeqCst);
        tracing::info!(plugin = %inner.name(), pid = ?inner.pid.load(Ordering::SeqCst), "plugin restarted");
        inner
            .state
            .send_replace(HostState::Ready(Box::new(process.conn.clone())));
    }
}

/// Resolves once stop was requested (or the host is gone); drops the watch guard before returning
/// so callers stay `Send`.
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Start a new process and run the re-init hook, so waiting callers see an initialized plugin.
async fn relaunch(inner: &Arc<Inner>, generation: u64) -> Result<Process, HostError> {
    let process = launch(inner, generation).await?;
    let Some(reinit) = inner.reinit.clone() else {
        return Ok(process);
    };
    let result =
        tokio::time::timeout(inner.opts.call_wait, reinit(process.conn.channel.clone())).await;
    let message = match result {
        Ok(Ok(())) => return Ok(process),
        Ok(Err(message)) => message,
        Err(_) => "Init timed out".to_owned(),
    };
    process.kill_and_reap(inner).await;
    Err(HostError::Reinit {
        name: inner.name().to_owned(),
        message,
    })
}

/// go-plugin's stop: controller Shutdown, wait up to 2 s, then SIGKILL the group and reap.
async fn shutdown_process(inner: &Inner, mut process: Process) {
    let mut controller = process.conn.controller.clone();
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, controller.shutdown(Empty {})).await;
    match tokio::time::timeout(SHUTDOWN_WAIT, process.child.wait()).await {
        Ok(_) => {
            // Reaped already; still kill stragglers left in its group.
            process.guard.kill();
            process.guard.disarm();
            inner.pid.store(0, Ordering::SeqCst);
            finish_tasks(&mut process.tasks).await;
        }
        Err(_) => {
            tracing::warn!(plugin = %inner.name(), "plugin did not exit within {SHUTDOWN_WAIT:?}; killing it");
            process.kill_and_reap(inner).await;
        }
    }
}

fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exited with status {code}")
    } else if let Some(sig) = status.signal() {
        let name = Signal::try_from(sig)
            .map(Signal::as_str)
            .unwrap_or("unknown");
        format!("was killed by signal {sig} ({name})")
    } else {
        format!("exited ({status})")
    }
}

/// Spawn the plugin, read its handshake, connect and health-check. On any error the process group
/// is killed and reaped before returning.
async fn launch(inner: &Arc<Inner>, generation: u64) -> Result<Process, HostError> {
    let opts = &inner.opts;
    let name = opts.name.clone();
    let protocol = inner.protocol;
    let versions = protocol
        .versions
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = Command::new(&opts.path);
    cmd.env(protocol.cookie_key, protocol.cookie_value)
        .env(ENV_PROTOCOL_VERSIONS, versions)
        .env(ENV_UNIX_SOCKET_DIR, &inner.socket_dir)
        .envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: signals to the manager's group do not reach it, and killpg takes
        // the plugin's own children too.
        .process_group(0)
        .kill_on_drop(true);
    match &inner.host_cert {
        Some(cert) => cmd.env(ENV_CLIENT_CERT, &cert.cert_pem),
        None => cmd.env_remove(ENV_CLIENT_CERT),
    };
    let parent = nix::unistd::getpid();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec; it only makes the async-signal-safe
    // prctl(2) and getppid(2) syscalls and builds io::Errors from raw errno values (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            // A plugin must never outlive a killed manager (it would keep acting on the cloud).
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
            // The parent may have died between fork and prctl; then nobody would send the signal.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(
                    nix::errno::Errno::ESRCH as i32,
                ));
            }
            Ok(())
        });
    }
    // Spawned on this (async, long-lived) thread: PDEATHSIG fires when the spawning thread exits.
    let mut attempt = 0;
    let mut child = loop {
        match cmd.spawn() {
            Ok(child) => break child,
            // ETXTBSY: another thread forked while the executable was still open for writing
            // (a just-installed plugin); it clears as soon as that child execs.
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(source) => {
                return Err(HostError::Spawn {
                    name,
                    path: opts.path.clone(),
                    source,
                });
            }
        }
    };
    let pid = child.id().unwrap_or(0);
    let mut guard = GroupGuard {
        pgid: i32::try_from(pid).unwrap_or(0),
    };
    inner.pid.store(pid, Ordering::SeqCst);

    let mut tasks = JoinSet::new();
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(stderr) = child.stderr.take() {
        tasks.spawn(drain_lines(
            name.clone(),
            "stderr",
            stderr,
            Some(tail.clone()),
        ));
    }
    let Some(stdout) = child.stdout.take() else {
        // Unreachable with Stdio::piped(); the guard and kill_on_drop still clean up.
        inner.pid.store(0, Ordering::SeqCst);
        return Err(HostError::Connect {
            name,
            what: "reading stdout".into(),
            message: "stdout was not captured".into(),
        });
    };
    let mut stdout = BufReader::new(stdout);

    let result = handshake_and_connect(
        inner,
        generation,
        &mut child,
        &mut stdout,
        &mut tasks,
        &tail,
    )
    .await;
    match result {
        Ok(conn) => {
            tasks.spawn(drain_lines(name.clone(), "stdout", stdout, None));
            tasks.spawn(drain_stdio(name.clone(), conn.channel.clone()));
            tracing::debug!(plugin = %name, pid, "plugin started");
            Ok(Process {
                child,
                guard,
                conn,
                tasks,
                started: Instant::now(),
            })
        }
        Err(e) => {
            guard.kill();
            let _ = child.wait().await;
            guard.disarm();
            inner.pid.store(0, Ordering::SeqCst);
            finish_tasks(&mut tasks).await;
            Err(e)
        }
    }
}

async fn handshake_and_connect(
    inner: &Arc<Inner>,
    generation: u64,
    child: &mut Child,
    stdout: &mut BufReader<tokio::process::ChildStdout>,
    tasks: &mut JoinSet<()>,
    tail: &Arc<Mutex<VecDeque<String>>>,
) -> Result<Connection, HostError> {
    let opts = &inner.opts;
    let name = opts.name.clone();
    let timeout = opts.handshake_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = Vec::new();
    let exited_early = |how: String| {
        let lines: Vec<String> = tail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        HostError::ExitedEarly {
            name: name.clone(),
            how,
            stderr: if lines.is_empty() {
                "(empty)".to_owned()
            } else {
                lines.join(" | ")
            },
        }
    };
    let line = loop {
        buf.clear();
        tokio::select! {
            biased;
            read = stdout.read_until(b'\n', &mut buf) => match read {
                Ok(0) | Err(_) => {
                    // stdout closed: report the exit status if the process is on its way out.
                    let how = match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
                        Ok(Ok(status)) => describe_exit(status),
                        _ => "closed its stdout".to_owned(),
                    };
                    finish_tasks(tasks).await;
                    return Err(exited_early(how));
                }
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim().to_owned();
                    if !line.is_empty() {
                        break line;
                    }
                }
            },
            status = child.wait() => {
                let how = status.map_or_else(|e| format!("could not be waited for ({e})"), describe_exit);
                finish_tasks(tasks).await;
                return Err(exited_early(how));
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Err(HostError::HandshakeTimeout { name, timeout });
            }
        }
    };
    let hs = Handshake::parse(&line, inner.protocol.versions).map_err(|source| {
        HostError::Handshake {
            name: name.clone(),
            path: opts.path.clone(),
            source,
        }
    })?;
    let tls_config = match (&hs.server_cert, &inner.host_cert) {
        (Some(server_cert), Some(own)) => Some(Arc::new(
            tls::client_config(own, server_cert).map_err(|source| HostError::Tls {
                name: name.clone(),
                source,
            })?,
        )),
        (None, Some(_)) => {
            // go-plugin falls back to plaintext when the plugin does not do AutoMTLS.
            tracing::debug!(plugin = %name, "plugin sent no certificate; connecting without TLS");
            None
        }
        (_, None) => None,
    };
    let server_name = tls::server_name().map_err(|source| HostError::Tls {
        name: name.clone(),
        source,
    })?;
    let network = hs.network;
    let address = hs.address.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let address = address.clone();
        let tls_config = tls_config.clone();
        let server_name = server_name.clone();
        async move {
            let io: Box<dyn Io> = match network {
                Network::Unix => Box::new(UnixStream::connect(&address).await?),
                Network::Tcp => Box::new(TcpStream::connect(&address).await?),
            };
            let io: Box<dyn Io> = match tls_config {
                Some(cfg) => Box::new(
                    tokio_rustls::TlsConnector::from(cfg)
                        .connect(server_name, io)
                        .await?,
                ),
                None => io,
            };
            Ok::<_, std::io::Error>(TokioIo::new(io))
        }
    });
    let connect_err = |what: &str, message: String| HostError::Connect {
        name: name.clone(),
        what: format!("{what} {} {}", hs.network, hs.address),
        message,
    };
    // HTTP/2's default 64 KiB receive window makes a streamed job trace wait on window updates;
    // on a local socket a larger one costs nothing.
    let endpoint = Endpoint::try_from("http://localhost")
        .map_err(|e| connect_err("building endpoint for", e.to_string()))?
        .initial_stream_window_size(RECEIVE_WINDOW)
        .initial_connection_window_size(2 * RECEIVE_WINDOW);
    let channel =
        match tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect_with_connector(connector))
            .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(connect_err("connecting to", error_chain(&e))),
            Err(_) => {
                return Err(connect_err(
                    "connecting to",
                    format!("timed out after {CONNECT_TIMEOUT:?}"),
                ));
            }
        };

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let req = tonic_health::pb::HealthCheckRequest {
        service: "plugin".into(),
    };
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    match tokio::time::timeout(CONNECT_TIMEOUT, health.check(req)).await {
        Ok(Ok(r)) if r.get_ref().status == serving => {}
        Ok(Ok(r)) => {
            return Err(connect_err(
                "health check of",
                format!("service \"plugin\" reports status {}", r.get_ref().status),
            ));
        }
        Ok(Err(s)) => {
            return Err(connect_err(
                "health check of",
                format!("{}: {}", s.code(), s.message()),
            ));
        }
        Err(_) => {
            return Err(connect_err(
                "health check of",
                format!("timed out after {CONNECT_TIMEOUT:?}"),
            ));
        }
    }

    Ok(Connection {
        controller: GrpcControllerClient::new(channel.clone()),
        channel,
        generation,
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// Forward a pipe line by line as tracing events; keep the last lines of stderr for errors.
async fn drain_lines<R: AsyncRead + Unpin>(
    plugin: String,
    stream: &'static str,
    reader: R,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(tail) = &tail {
            let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.to_owned());
        }
        emit_line(&plugin, stream, line);
    }
}

/// Drain `plugin.GRPCStdio` right away: go-plugin stalls a chatty plugin whose host never reads it.
async fn drain_stdio(plugin: String, channel: Channel) {
    let mut client = GrpcStdioClient::new(channel);
    let mut stream = match client.stream_stdio(()).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            if s.code() != tonic::Code::Unimplemented {
                tracing::debug!(plugin = %plugin, "GRPCStdio stream ended: {}", s.message());
            }
            return;
        }
    };
    while let Ok(Some(data)) = stream.message().await {
        let stream_name = match StdioChannel::try_from(data.channel) {
            Ok(StdioChannel::Stderr) => "stdio-stderr",
            _ => "stdio-stdout",
        };
        for line in String::from_utf8_lossy(&data.data)
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            emit_line(&plugin, stream_name, line);
        }
    }
}

/// Re-emit one plugin output line: hclog JSON becomes a structured event at its level, anything
/// else a plain-text event.
fn emit_line(plugin: &str, stream: &str, line: &str) {
    let Ok(serde_json::Value::Object(mut obj)) = serde_json::from_str::<serde_json::Value>(line)
    else {
        emit(Level::INFO, plugin, stream, line, "");
        return;
    };
    let level = match obj
        .remove("@level")
        .as_ref()
        .and_then(serde_json::Value::as_str)
    {
        Some("trace") => Level::TRACE,
        Some("debug") => Level::DEBUG,
        Some("warn" | "warning") => Level::WARN,
        Some("error") => Level::ERROR,
        _ => Level::INFO,
    };
    let message = match obj.remove("@message") {
        Some(serde_json::Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    obj.remove("@timestamp");
    let fields = obj
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s:?}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ");
    emit(level, plugin, stream, &message, &fields);
}

fn emit(level: Level, plugin: &str, stream: &str, message: &str, fields: &str) {
    // tracing levels are static per callsite, hence one callsite per level.
    match level {
        Level::ERROR => tracing::error!(plugin, stream, fields, "{message}"),
        Level::WARN => tracing::warn!(plugin, stream, fields, "{message}"),
        Level::INFO => tracing::info!(plugin, stream, fields, "{message}"),
        Level::DEBUG => tracing::debug!(plugin, stream, fields, "{message}"),
        Level::TRACE => tracing::trace!(plugin, stream, fields, "{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap() {
        let o = ProcessOptions::new("x", "/bin/true");
        let d: Vec<_> = (0..7).map(|a| o.backoff(a)).collect();
        assert_eq!(d[0], Duration::from_millis(200));
        assert_eq!(d[1], Duration::from_millis(400));
        assert_eq!(d[4], Duration::from_millis(3200));
        assert_eq!(d[5], Duration::from_secs(5));
        assert_eq!(d[6], Duration::from_secs(5));
    }

    #[test]
    fn options_debug_hides_env_values() {
        let o = ProcessOptions::new("x", "/bin/true").env("TOKEN", "t0k");
        let s = format!("{o:?}");
        assert!(!s.contains("t0k") && s.contains("TOKEN"), "{s}");
    }

    #[test]
    fn describes_exits() {
        assert_eq!(
            describe_exit(ExitStatus::from_raw(3 << 8)),
            "exited with status 3"
        );
        assert_eq!(
            describe_exit(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn a_path_reference_is_taken_as_it_is() {
        assert!(as_path("local").is_none());
        assert!(matches!(as_path("/bin/sh"), Some(Ok(_))));
        assert!(matches!(
            as_path("/nonexistent/plugin"),
            Some(Err(HostError::NotFound { .. }))
        ));
    }
}
