//! How bytes reach the engine: a [`Dialer`] opens one fresh bidirectional stream per HTTP
//! connection. Built in: the local unix socket ([`UnixDialer`]), a local command whose stdin/stdout
//! is the socket ([`CommandDialer`], e.g. `docker system dial-stdio`), and any closure returning a
//! stream ([`FnDialer`], e.g. an SSH channel running `docker system dial-stdio`).

use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

/// Default path of the local engine socket.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// A bidirectional byte stream that can carry one HTTP/1.1 connection to the engine.
pub trait EngineStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> EngineStream for T {}

/// A boxed [`EngineStream`], what every [`Dialer`] returns.
pub type BoxStream = Box<dyn EngineStream>;

/// Opens a fresh stream to the engine for each HTTP connection the client makes.
#[async_trait]
pub trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// Opens one new stream to the engine.
    async fn dial(&self) -> io::Result<BoxStream>;
}

/// Dials the engine's unix socket.
#[derive(Debug, Clone)]
pub struct UnixDialer {
    path: PathBuf,
}

impl UnixDialer {
    /// A dialer for the socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

#[async_trait]
impl Dialer for UnixDialer {
    async fn dial(&self) -> io::Result<BoxStream> {
        let stream = tokio::net::UnixStream::connect(&self.path)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))?;
        Ok(Box::new(stream))
    }
}

type DialFuture = Pin<Box<dyn Future<Output = io::Result<BoxStream>> + Send>>;

/// Dials with a caller-supplied closure, e.g. one that opens an SSH exec channel running
/// `docker system dial-stdio` and returns it as a stream.
#[derive(Clone)]
pub struct FnDialer {
    name: String,
    dial: Arc<dyn Fn() -> DialFuture + Send + Sync>,
}

impl FnDialer {
    /// Wraps `dial`; `name` appears in `Debug` output and error messages.
    pub fn new<F, Fut, S>(name: impl Into<String>, dial: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<S>> + Send + 'static,
        S: EngineStream,
    {
        let dial = Arc::new(move || -> DialFuture {
            let fut = dial();
            Box::pin(async move { fut.await.map(|s| Box::new(s) as BoxStream) })
        });
        Self {
            name: name.into(),
            dial,
        }
    }
}

impl fmt::Debug for FnDialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnDialer")
            .field("name", &self.name)
            .finish()
    }
}

#[async_trait]
impl Dialer for FnDialer {
    async fn dial(&self) -> io::Result<BoxStream> {
        (self.dial)().await
    }
}

/// Spawns a local command per connection and talks HTTP over its stdin/stdout, e.g.
/// `docker system dial-stdio` or `ssh host docker system dial-stdio`. The process is killed when
/// the connection is dropped. When it ends before answering anything, what it wrote on stderr
/// becomes the connection's error (e.g. "dial unix /var/run/docker.sock: connect: …").
#[derive(Debug, Clone)]
pub struct CommandDialer {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl CommandDialer {
    /// A dialer running `program args…`.
    pub fn new<I, A>(program: impl Into<OsString>, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
        }
    }

    /// `docker system dial-stdio` with the `docker` CLI found on `PATH`.
    pub fn docker_dial_stdio() -> Self {
        Self::new("docker", ["system", "dial-stdio"])
    }

    /// Sets an environment variable for the spawned command.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

#[async_trait]
impl Dialer for CommandDialer {
    async fn dial(&self) -> io::Result<BoxStream> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("spawning {}: {e}", self.program.to_string_lossy()),
            )
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        match (stdin, stdout) {
            (Some(stdin), Some(stdout)) => Ok(Box::new(ChildStream {
                program: self.program.to_string_lossy().into_owned(),
                stdin: Some(stdin),
                stdout,
                stderr: child.stderr.take(),
                stderr_buf: Vec::new(),
                answered: false,
                _child: child,
            })),
            _ => Err(io::Error::other("child process has no stdin/stdout pipe")),
        }
    }
}

/// A child process's stdout (read side) and stdin (write side) as one stream. Shutting down the
/// write side closes the child's stdin (a half-close); dropping the stream kills the child.
#[derive(Debug)]
pub struct ChildStream {
    program: String,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    stderr: Option<ChildStderr>,
    stderr_buf: Vec<u8>,
    answered: bool,
    _child: Child,
}

/// How much of a failed child's stderr ends up in the error.
const STDERR_LIMIT: usize = 4096;

impl ChildStream {
    /// Reads stderr to its end (bounded); the error to report, if it said anything.
    fn poll_stderr_error(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Error>> {
        while let Some(stderr) = self.stderr.as_mut() {
            let mut chunk = [0u8; 1024];
            let mut buf = ReadBuf::new(&mut chunk);
            match std::task::ready!(Pin::new(stderr).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => {
                    let room = STDERR_LIMIT.saturating_sub(self.stderr_buf.len());
                    let take = buf.filled().len().min(room);
                    self.stderr_buf.extend_from_slice(&buf.filled()[..take]);
                }
                _ => self.stderr = None,
            }
        }
        let text = String::from_utf8_lossy(&self.stderr_buf).trim().to_string();
        self.stderr_buf.clear();
        Poll::Ready((!text.is_empty()).then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("{} ended: {text}", self.program),
            )
        }))
    }
}

impl AsyncRead for ChildStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.stdout).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.answered = true;
        } else if !self.answered && self.stderr.is_some() {
            // EOF before any answer: the command failed; say why.
            if let Some(e) = std::task::ready!(self.poll_stderr_error(cx)) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ChildStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.stdin.as_mut() {
            Some(stdin) => Pin::new(stdin).poll_write(cx, buf),
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stdin.as_mut() {
            Some(stdin) => Pin::new(stdin).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(stdin) = self.stdin.as_mut() {
            std::task::ready!(Pin::new(stdin).poll_flush(cx))?;
        }
        // Dropping the pipe is what delivers EOF to the child.
        self.stdin = None;
        Poll::Ready(Ok(()))
    }
}

/// A dialer that keeps `spares` streams dialed ahead, so a connection is ready when a request
/// needs one: worth it when dialing is slow (`docker system dial-stdio` over SSH starts a
/// process per connection). Each spare is dialed by a task this dialer owns and aborts when it
/// is dropped; a spare that failed is replaced by dialing on the spot.
pub struct Prefetch {
    inner: Arc<dyn Dialer>,
    spares: usize,
    ready: tokio::sync::Mutex<
        std::collections::VecDeque<tokio::task::JoinHandle<io::Result<BoxStream>>>,
    >,
}

impl fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prefetch")
            .field("inner", &self.inner)
            .field("spares", &self.spares)
            .finish_non_exhaustive()
    }
}

impl Prefetch {
    /// Keep `spares` streams of `inner` dialed ahead.
    pub fn new(inner: impl Dialer, spares: usize) -> Self {
        Prefetch {
            inner: Arc::new(inner),
            spares,
            ready: tokio::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }
}

#[async_trait]
impl Dialer for Prefetch {
    async fn dial(&self) -> io::Result<BoxStream> {
        let mut ready = self.ready.lock().await;
        let spare = ready.pop_front();
        while ready.len() < self.spares {
            let inner = Arc::clone(&self.inner);
            ready.push_back(tokio::spawn(async move { inner.dial().await }));
        }
        drop(ready);
        match spare {
            Some(task) => match task.await {
                Ok(Ok(stream)) => Ok(stream),
                // The spare failed (or was aborted): dial now, reporting this attempt's error.
                _ => self.inner.dial().await,
            },
            None => self.inner.dial().await,
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        for task in self.ready.get_mut().drain(..) {
            task.abort();
        }
    }
}

/// Where the engine is: the dialer the client uses for every connection.
#[derive(Debug, Clone)]
pub struct Transport {
    dialer: Arc<dyn Dialer>,
}

impl Transport {
    /// The unix socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Self::dialer(UnixDialer::new(path))
    }

    /// `DOCKER_HOST` when it is a `unix://` address, else [`DEFAULT_SOCKET`].
    pub fn from_env() -> io::Result<Self> {
        match std::env::var("DOCKER_HOST") {
            Ok(host) if !host.is_empty() => match host.strip_prefix("unix://") {
                Some(path) => Ok(Self::unix(path)),
                None => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("DOCKER_HOST={host}: only unix:// is supported"),
                )),
            },
            _ => Ok(Self::unix(DEFAULT_SOCKET)),
        }
    }

    /// A local command whose stdin/stdout is the connection (see [`CommandDialer`]).
    pub fn command(dialer: CommandDialer) -> Self {
        Self::dialer(dialer)
    }

    /// Any [`Dialer`], e.g. an SSH-based one.
    pub fn dialer(dialer: impl Dialer) -> Self {
        Self {
            dialer: Arc::new(dialer),
        }
    }

    /// Opens one new stream.
    pub async fn dial(&self) -> io::Result<BoxStream> {
        self.dialer.dial().await
    }
}

#[cfg(test)]
mod prefetch_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn spares_are_dialed_ahead_and_handed_out_first() {
        let dialed = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&dialed);
        let inner = FnDialer::new("counting", move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let (a, _b) = tokio::io::duplex(64);
                Ok::<_, io::Error>(a)
            }
        });
        let p = Prefetch::new(inner, 2);
        p.dial().await.unwrap();
        // One dialed on the spot, two spares started behind it.
        tokio::task::yield_now().await;
        for _ in 0..100 {
            if dialed.load(Ordering::SeqCst) >= 3 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(dialed.load(Ordering::SeqCst), 3);
        // The next dial takes a spare and starts one replacement: four in all, not five.
        p.dial().await.unwrap();
        for _ in 0..100 {
            if dialed.load(Ordering::SeqCst) >= 4 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(dialed.load(Ordering::SeqCst), 4);
    }
}
