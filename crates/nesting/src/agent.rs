//! Host side of the guest agent protocol ([`slipway_guest_agent::frame`]).
//!
//! One [`AgentClient`] per connection: requests are written under one lock, and one reader task
//! routes the replies to the request they answer by id. When the connection ends every pending
//! request fails with [`AgentError::Closed`] and every [`Execution`]'s event stream ends.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slipway_guest_agent::frame::{FrameError, Reply, Request};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// Events buffered per exec before the reader task waits for the consumer.
const EVENT_BUFFER: usize = 64;

/// Longest reply line kept; the agent's are under 50 KiB, a longer one is not a frame.
const MAX_LINE: usize = 1 << 20;

/// Timeout of each hello while [`wait_ready`] waits for a booting guest.
const HELLO_ATTEMPT: Duration = Duration::from_secs(1);

/// Pause before [`wait_ready`] connects again.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// What can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The connection is gone (or went away while the request was pending).
    #[error("the guest agent connection is closed")]
    Closed,
    /// No answer in time.
    #[error("the guest agent did not answer within {0:?}")]
    Timeout(Duration),
    /// The agent answered with an error (a process that cannot start, a malformed request).
    #[error("the guest agent refused: {0}")]
    Refused(String),
    /// The agent's socket cannot be connected to.
    #[error("cannot connect to the guest agent at {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// [`wait_ready`] gave up.
    #[error("the guest agent at {path} was not ready after {waited:?}: {last}")]
    NotReady {
        /// The socket.
        path: PathBuf,
        /// How long it waited.
        waited: Duration,
        /// The last attempt's failure.
        last: String,
    },
    /// A request could not be encoded.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The host's RNG could not be read for a renew.
    #[error("reading the host's /dev/urandom: {0}")]
    HostEntropy(#[source] std::io::Error),
}

/// The agent's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u32,
    /// Guest uptime in milliseconds.
    pub uptime_ms: u64,
}

/// What a guest renewed ([`AgentClient::renew`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The kernel's RNG was credited with host entropy and reseeded.
    pub reseeded: bool,
    /// One line per thing not renewed, and why.
    pub notes: Vec<String>,
}

/// Bytes of host entropy a renew hands the guest (its CRNG's key is 32).
const RENEW_ENTROPY: usize = 64;

/// A process to start in the guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exec {
    /// Program and arguments; `argv[0]` is looked up in the guest's `PATH`.
    pub argv: Vec<String>,
    /// Variables added on top of the agent's environment.
    pub env: Vec<(String, String)>,
    /// Working directory (the agent's when `None`).
    pub cwd: Option<String>,
    /// Bytes written to stdin first; stdin is `/dev/null` when `None` and not `keep_stdin`.
    pub stdin: Option<Vec<u8>>,
    /// Keep stdin open for [`AgentClient::stdin`].
    pub keep_stdin: bool,
}

/// What happens to a started exec, in order: `Started` (or `Error`), output, `Exit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// The process started with this pid (also its process group).
    Started(u32),
    /// A chunk of stdout.
    Stdout(Vec<u8>),
    /// A chunk of stderr.
    Stderr(Vec<u8>),
    /// The process exited; its output is complete. The last event.
    Exit {
        /// Exit code, if it exited normally.
        code: Option<i32>,
        /// Terminating signal, if killed by one.
        signal: Option<i32>,
    },
    /// The process could not start. The last event.
    Error(String),
}

/// A requested exec: its id (for [`AgentClient::stdin`] and [`AgentClient::signal`]) and its
/// events. The stream ends after `Exit`/`Error`, or early when the connection closes.
///
/// Read the events promptly: while one exec's buffer is full the reader task waits, and so do
/// the replies to every other request on the connection. Dropping the receiver is fine (the
/// process keeps running; its events are discarded).
#[derive(Debug)]
pub struct Execution {
    /// Request id.
    pub id: u64,
    /// The exec's events.
    pub events: mpsc::Receiver<ExecEvent>,
}

/// A connection to a guest agent.
pub struct AgentClient {
    routes: Arc<Routes>,
    writer: tokio::sync::Mutex<Writer>,
    next_id: AtomicU64,
    reader: AbortHandle,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("next_id", &self.next_id)
            .field("closed", &self.routes.lock().closed)
            .finish_non_exhaustive()
    }
}

impl AgentClient {
    /// Serve requests over `stream`; spawns the reader task (so it needs a tokio runtime),
    /// which stops when the client is dropped.
    pub fn new<S>(stream: S) -> AgentClient
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        let routes = Arc::new(Routes::default());
        let task = tokio::spawn(read_replies(read, Arc::clone(&routes)));
        AgentClient {
            routes,
            writer: tokio::sync::Mutex::new(Writer {
                io: Box::new(write),
                torn: false,
            }),
            next_id: AtomicU64::new(1),
            reader: task.abort_handle(),
        }
    }

    /// Ask the agent whether it is there; also hands it the host clock (a restored snapshot
    /// sets its own from it).
    pub async fn hello(&self, timeout: Duration) -> Result<Hello, AgentError> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        let _route = self.routes.add(id, Route::Hello(tx))?;
        let unix_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let exchange = async {
            self.send(&Request::Hello { id, unix_time }).await?;
            match rx.await {
                Ok(Ok(hello)) => Ok(hello),
                Ok(Err(message)) => Err(AgentError::Refused(message)),
                Err(_) => Err(AgentError::Closed),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(AgentError::Timeout(timeout)))
    }

    /// Make the guest unique after a restore: fresh entropy from the host's RNG into its
    /// kernel's (reseeded at once), a new random machine-id, `hostname`, and new SSH host keys
    /// where it has some.
    pub async fn renew(&self, hostname: &str, timeout: Duration) -> Result<Renewal, AgentError> {
        use tokio::io::AsyncReadExt as _;
        let mut random = [0u8; RENEW_ENTROPY + 16];
        let mut urandom = tokio::fs::File::open("/dev/urandom")
            .await
            .map_err(AgentError::HostEntropy)?;
        urandom
            .read_exact(&mut random)
            .await
            .map_err(AgentError::HostEntropy)?;
        let (entropy, id_bytes) = random.split_at(RENEW_ENTROPY);
        let machine_id: String = id_bytes.iter().map(|b| format!("{b:02x}")).collect();
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        let _route = self.routes.add(id, Route::Renew(tx))?;
        let exchange = async {
            self.send(&Request::Renew {
                id,
                entropy: entropy.to_vec(),
                machine_id,
                hostname: hostname.to_string(),
            })
            .await?;
            match rx.await {
                Ok(Ok(renewal)) => Ok(renewal),
                Ok(Err(message)) => Err(AgentError::Refused(message)),
                Err(_) => Err(AgentError::Closed),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(AgentError::Timeout(timeout)))
    }

    /// Start a process; its events arrive on the returned [`Execution`].
    pub async fn exec(&self, req: Exec) -> Result<Execution, AgentError> {
        let id = self.next_id();
        let (tx, events) = mpsc::channel(EVENT_BUFFER);
        let route = self.routes.add(id, Route::Exec(tx))?;
        self.send(&Request::Exec {
            id,
            argv: req.argv,
            env: req.env,
            cwd: req.cwd,
            stdin: req.stdin,
            keep_stdin: req.keep_stdin,
        })
        .await?;
        route.keep();
        Ok(Execution { id, events })
    }

    /// More stdin for exec `id` (started with `keep_stdin`); `eof` closes it after `data`.
    pub async fn stdin(&self, id: u64, data: Option<Vec<u8>>, eof: bool) -> Result<(), AgentError> {
        self.send(&Request::Stdin { id, data, eof }).await
    }

    /// Send signal `sig` to exec `id`'s process group.
    pub async fn signal(&self, id: u64, sig: i32) -> Result<(), AgentError> {
        self.send(&Request::Signal { id, signal: sig }).await
    }

    /// Run `argv` with `stdin` to completion: exit code (`None` when killed by a signal),
    /// stdout, stderr.
    pub async fn run_capture(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
    ) -> Result<(Option<i32>, Vec<u8>, Vec<u8>), AgentError> {
        let mut execution = self
            .exec(Exec {
                argv,
                stdin: Some(stdin),
                ..Exec::default()
            })
            .await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = execution.events.recv().await {
            match event {
                ExecEvent::Started(_) => {}
                ExecEvent::Stdout(data) => stdout.extend(data),
                ExecEvent::Stderr(data) => stderr.extend(data),
                ExecEvent::Exit { code, .. } => return Ok((code, stdout, stderr)),
                ExecEvent::Error(message) => return Err(AgentError::Refused(message)),
            }
        }
        Err(AgentError::Closed)
    }

    /// [`Self::run_capture`] with stdin read from the file `input` (sent in pieces as the agent
    /// takes them) and stdout written to the file `output` when given (then returned empty):
    /// memory does not grow with the files' sizes.
    pub async fn run_transfer(
        &self,
        argv: Vec<String>,
        input: Option<&std::path::Path>,
        output: Option<&std::path::Path>,
    ) -> Result<(Option<i32>, Vec<u8>, Vec<u8>), AgentError> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let io = |path: &std::path::Path, e: std::io::Error| {
            AgentError::Refused(format!("{}: {e}", path.display()))
        };
        let mut source = match input {
            Some(path) => Some((
                tokio::fs::File::open(path).await.map_err(|e| io(path, e))?,
                path,
            )),
            None => None,
        };
        let mut sink = match output {
            Some(path) => Some((
                tokio::io::BufWriter::new(
                    tokio::fs::File::create(path)
                        .await
                        .map_err(|e| io(path, e))?,
                ),
                path,
            )),
            None => None,
        };
        let mut execution = self
            .exec(Exec {
                argv,
                stdin: None,
                keep_stdin: source.is_some(),
                ..Exec::default()
            })
            .await?;
        let id = execution.id;
        let feed = async {
            if let Some((file, path)) = source.as_mut() {
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let n = file.read(&mut buf).await.map_err(|e| io(path, e))?;
                    if n == 0 {
                        break;
                    }
                    self.stdin(id, Some(buf[..n].to_vec()), false).await?;
                }
                self.stdin(id, None, true).await?;
            }
            Ok::<(), AgentError>(())
        };
        let gather = async {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            while let Some(event) = execution.events.recv().await {
                match event {
                    ExecEvent::Started(_) => {}
                    ExecEvent::Stdout(data) => match sink.as_mut() {
                        Some((f, path)) => f.write_all(&data).await.map_err(|e| io(path, e))?,
                        None => stdout.extend(data),
                    },
                    ExecEvent::Stderr(data) => stderr.extend(data),
                    ExecEvent::Exit { code, .. } => {
                        if let Some((f, path)) = sink.as_mut() {
                            f.flush().await.map_err(|e| io(path, e))?;
                        }
                        return Ok((code, stdout, stderr));
                    }
                    ExecEvent::Error(message) => return Err(AgentError::Refused(message)),
                }
            }
            Err(AgentError::Closed)
        };
        tokio::pin!(feed, gather);
        let mut fed = false;
        loop {
            tokio::select! {
                r = &mut feed, if !fed => {
                    fed = true;
                    match r {
                        // A file that cannot be read ends the run: the process is killed, so
                        // it never takes a cut stream for a whole one.
                        Err(e @ AgentError::Refused(_)) => {
                            let _ = self.signal(id, 9).await;
                            return Err(e);
                        }
                        // A process that exits without reading all of its input is not an
                        // error here.
                        Err(e) => tracing::debug!("stdin not fully sent: {e}"),
                        Ok(()) => {}
                    }
                }
                r = &mut gather => return r,
            }
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    async fn send(&self, request: &Request) -> Result<(), AgentError> {
        let line = request.encode()?;
        if self.routes.lock().closed {
            return Err(AgentError::Closed);
        }
        let mut writer = self.writer.lock().await;
        let writer = &mut *writer;
        if writer.torn {
            // A cancelled send left half a line: end it, so the agent skips only that one.
            writer
                .io
                .write_all(b"\n")
                .await
                .map_err(|e| self.broken(&e))?;
        }
        writer.torn = true;
        writer
            .io
            .write_all(&line)
            .await
            .map_err(|e| self.broken(&e))?;
        writer.io.flush().await.map_err(|e| self.broken(&e))?;
        writer.torn = false;
        Ok(())
    }

    /// A write failed: the connection is unusable for every request.
    fn broken(&self, error: &std::io::Error) -> AgentError {
        tracing::debug!(%error, "guest agent connection broken");
        self.routes.close();
        AgentError::Closed
    }
}

impl Drop for AgentClient {
    fn drop(&mut self) {
        self.reader.abort();
        // At once, not when the runtime gets round to dropping the aborted task.
        self.routes.close();
    }
}

/// Connect to an agent behind a unix socket (QEMU's virtio-serial chardev).
pub async fn connect_unix(path: &Path) -> Result<AgentClient, AgentError> {
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|source| AgentError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(AgentClient::new(stream))
}

/// Connect to the agent behind `path` and say hello until it answers or `limit` passes; the
/// connected client, its hello and how long it took.
///
/// A booting guest does not answer yet, so each hello waits only a second. The connection is
/// kept across unanswered hellos (the guest reads what was queued once its agent is up) and
/// made again when it fails or closes.
pub async fn wait_ready(
    path: &Path,
    limit: Duration,
) -> Result<(AgentClient, Hello, Duration), AgentError> {
    let started = Instant::now();
    let deadline = started + limit;
    let mut connected: Option<AgentClient> = None;
    let mut last = String::from("no attempt");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AgentError::NotReady {
                path: path.to_path_buf(),
                waited: started.elapsed(),
                last,
            });
        }
        let client = match connected.take() {
            Some(client) => client,
            None => match tokio::time::timeout(left, connect_unix(path)).await {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => {
                    last = e.to_string();
                    tokio::time::sleep(RETRY_PAUSE.min(left)).await;
                    continue;
                }
                Err(_) => continue,
            },
        };
        match client.hello(HELLO_ATTEMPT.min(left)).await {
            Ok(hello) => return Ok((client, hello, started.elapsed())),
            Err(e @ AgentError::Timeout(_)) => {
                last = e.to_string();
                connected = Some(client);
            }
            Err(e) => {
                last = e.to_string();
                drop(client);
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(RETRY_PAUSE.min(left)).await;
            }
        }
    }
}

/// The writing half.
struct Writer {
    io: Box<dyn AsyncWrite + Send + Unpin>,
    /// A send was cancelled mid-line.
    torn: bool,
}

/// Where each pending request's replies go.
#[derive(Default)]
struct Routes {
    inner: Mutex<RouteTable>,
}

#[derive(Default)]
struct RouteTable {
    /// The connection is gone: no new routes.
    closed: bool,
    routes: HashMap<u64, Route>,
}

enum Route {
    Hello(oneshot::Sender<Result<Hello, String>>),
    Renew(oneshot::Sender<Result<Renewal, String>>),
    Exec(mpsc::Sender<ExecEvent>),
}

impl Routes {
    fn lock(&self) -> MutexGuard<'_, RouteTable> {
        // The table stays consistent between statements; a panicked holder is no reason to hang.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Register `id`; the guard removes it again unless kept.
    fn add(&self, id: u64, route: Route) -> Result<RouteGuard<'_>, AgentError> {
        let mut table = self.lock();
        if table.closed {
            return Err(AgentError::Closed);
        }
        table.routes.insert(id, route);
        Ok(RouteGuard {
            routes: self,
            id,
            armed: true,
        })
    }

    /// Fail everything pending: dropped senders wake their receivers.
    fn close(&self) {
        let routes = {
            let mut table = self.lock();
            table.closed = true;
            std::mem::take(&mut table.routes)
        };
        drop(routes);
    }
}

/// Removes a route when its request is abandoned (timed out, cancelled, not sent).
struct RouteGuard<'a> {
    routes: &'a Routes,
    id: u64,
    armed: bool,
}

impl RouteGuard<'_> {
    fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.routes.lock().routes.remove(&self.id);
        }
    }
}

/// The reader task: route every reply until the connection ends, then fail what is pending.
async fn read_replies<R: AsyncRead + Unpin>(read: R, routes: Arc<Routes>) {
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        match read_line(&mut reader, &mut line).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) => {
                tracing::debug!(%error, "guest agent connection failed");
                break;
            }
        }
        match Reply::decode(&line) {
            Ok(reply) => deliver(&routes, reply).await,
            // Half a frame after a reconnect or a restore, or a newer agent's frame type.
            Err(error) => tracing::debug!(%error, "skipping a line from the guest agent"),
        }
    }
    routes.close();
}

async fn deliver(routes: &Routes, reply: Reply) {
    let id = reply.id();
    let (event, last) = match reply {
        Reply::Hello {
            version, uptime_ms, ..
        } => {
            if let Some(Route::Hello(tx)) = take_answer(routes, id) {
                let _ = tx.send(Ok(Hello { version, uptime_ms }));
            }
            return;
        }
        Reply::Renewed {
            reseeded, notes, ..
        } => {
            if let Some(Route::Renew(tx)) = take_answer(routes, id) {
                let _ = tx.send(Ok(Renewal { reseeded, notes }));
            }
            return;
        }
        Reply::Error { message, .. } => {
            match take_answer(routes, id) {
                Some(Route::Hello(tx)) => {
                    let _ = tx.send(Err(message));
                    return;
                }
                Some(Route::Renew(tx)) => {
                    let _ = tx.send(Err(message));
                    return;
                }
                _ => {}
            }
            (ExecEvent::Error(message), true)
        }
        Reply::Started { pid, .. } => (ExecEvent::Started(pid), false),
        Reply::Stdout { data, .. } => (ExecEvent::Stdout(data), false),
        Reply::Stderr { data, .. } => (ExecEvent::Stderr(data), false),
        Reply::Exit { code, signal, .. } => (ExecEvent::Exit { code, signal }, true),
    };
    let tx = {
        let mut table = routes.lock();
        match table.routes.get(&id) {
            Some(Route::Exec(tx)) => {
                let tx = tx.clone();
                if last {
                    table.routes.remove(&id);
                }
                tx
            }
            // A late reply to an abandoned request.
            _ => return,
        }
    };
    // Waits while the consumer's buffer is full: backpressure on the whole connection.
    if tx.send(event).await.is_err() && !last {
        // The consumer dropped its receiver: stop routing to it.
        routes.lock().routes.remove(&id);
    }
}

/// The route of a one-answer request (hello, renew) `id`, taken out of the table.
fn take_answer(routes: &Routes, id: u64) -> Option<Route> {
    let mut table = routes.lock();
    match table.routes.get(&id) {
        Some(Route::Hello(_) | Route::Renew(_)) => table.routes.remove(&id),
        _ => None,
    }
}

/// Read one line into `line` (without its `\n`); false at EOF. Lines over [`MAX_LINE`] come
/// back empty (they are then skipped as garbage).
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    line.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(any);
        }
        any = true;
        let newline = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..newline.unwrap_or(buf.len())];
        if !too_long {
            if line.len() + chunk.len() > MAX_LINE {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(buf.len(), |i| i + 1);
        reader.consume(used);
        if newline.is_some() {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    #[tokio::test]
    async fn replies_are_routed_by_id_and_garbage_is_skipped() {
        let (host, mut guest) = tokio::io::duplex(1 << 16);
        let client = AgentClient::new(host);
        let hello = tokio::spawn(async move {
            let answer = client.hello(Duration::from_secs(5)).await;
            (client, answer)
        });
        let mut buf = vec![0; 4096];
        let n = guest.read(&mut buf).await.unwrap();
        let request = Request::decode(&buf[..n]).unwrap();
        assert!(matches!(request, Request::Hello { id: 1, .. }));
        // A late reply to another id, half a frame and a frame of an unknown type first.
        guest
            .write_all(b"{\"type\":\"hello\",\"id\":99,\"version\":1,\"uptime_ms\":1}\n")
            .await
            .unwrap();
        guest
            .write_all(b"ype\":\"exit\"}\n{\"type\":\"new\",\"id\":1}\n")
            .await
            .unwrap();
        guest
            .write_all(b"{\"type\":\"hello\",\"id\":1,\"version\":1,\"uptime_ms\":42}\n")
            .await
            .unwrap();
        let (client, answer) = hello.await.unwrap();
        assert_eq!(
            answer.unwrap(),
            Hello {
                version: 1,
                uptime_ms: 42
            }
        );
        drop(guest);
        assert!(matches!(
            client.hello(Duration::from_secs(5)).await,
            Err(AgentError::Closed)
        ));
    }

    #[tokio::test]
    async fn a_cancelled_send_does_not_swallow_the_next_frame() {
        // Room for part of a frame only, so the first send blocks mid-line.
        let (host, mut guest) = tokio::io::duplex(16);
        let client = AgentClient::new(host);
        assert!(matches!(
            client.hello(Duration::from_millis(50)).await,
            Err(AgentError::Timeout(_))
        ));
        let signal = tokio::spawn(async move {
            client.signal(7, 9).await.unwrap();
            client
        });
        let mut received = Vec::new();
        while !received.ends_with(b"}\n") || received.iter().filter(|&&b| b == b'\n').count() < 2 {
            let mut buf = [0; 64];
            let n = guest.read(&mut buf).await.unwrap();
            assert!(n > 0);
            received.extend_from_slice(&buf[..n]);
        }
        let _client = signal.await.unwrap();
        let lines: Vec<&[u8]> = received.split(|&b| b == b'\n').collect();
        assert!(
            Request::decode(lines[0]).is_err(),
            "the torn frame is garbage"
        );
        assert_eq!(
            Request::decode(lines[1]).unwrap(),
            Request::Signal { id: 7, signal: 9 }
        );
    }
}
