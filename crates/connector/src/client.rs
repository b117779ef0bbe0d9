//! The SSH client: dial, authenticate, run commands with streamed output, reach unix sockets.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use russh::client::{Config, Handle};
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh::{ChannelMsg, ChannelOpenFailure, Disconnect, Sig};
use slipway_fleeting::ConnectInfo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::{ConnectError, HostKeyStoreError};
use crate::hostkeys::{Check, HostKeyStore, fingerprint};
use crate::stream::{ExecStream, ForwardedStream};
use crate::{DEFAULT_KEEPALIVE, DEFAULT_SSH_PORT, DEFAULT_TIMEOUT, KEEPALIVE_MAX};

/// How long starting a command ahead may take before the attempt is dropped.
const READY_AHEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Runner-side dial settings (GitLab's `connector.DialOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DialOptions {
    /// Dial the instance's external address when the plugin gave one.
    pub use_external_addr: bool,
}

/// One command to run on an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Shell command line, run by the login user's shell.
    pub command: String,
    /// Bytes written to the command's stdin, followed by EOF.
    pub stdin: Vec<u8>,
    /// A file on this machine streamed to stdin after [`RunOptions::stdin`] (large inputs:
    /// read as the channel's window allows, never held in memory).
    pub stdin_file: Option<std::path::PathBuf>,
    /// Give up (closing the channel) after this long; `None` waits forever.
    pub timeout: Option<Duration>,
    /// Keep one more channel with this same command started and waiting for its stdin, so the
    /// next such run skips the channel round trip and the remote process start-up.
    pub ready_ahead: bool,
}

impl RunOptions {
    /// Run `command` with empty stdin and no timeout.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }

    /// Set the bytes sent to stdin.
    pub fn stdin(mut self, stdin: impl Into<Vec<u8>>) -> Self {
        self.stdin = stdin.into();
        self
    }

    /// Stream the file `path` to stdin (see [`RunOptions::stdin_file`]).
    pub fn stdin_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.stdin_file = Some(path.into());
        self
    }

    /// Set the run timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Start the next run of this command ahead of time (see [`RunOptions::ready_ahead`]).
    /// Only for commands that do nothing before reading their stdin (a shell reading its
    /// script), since the started one waits, possibly long, for a run to use it.
    pub fn ready_ahead(mut self) -> Self {
        self.ready_ahead = true;
        self
    }
}

/// A chunk of command output, delivered as it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Bytes from stdout.
    Stdout(Vec<u8>),
    /// Bytes from stderr.
    Stderr(Vec<u8>),
}

impl Output {
    /// Everything `rx` delivers until its senders are gone: `(stdout, stderr)`.
    pub async fn gather(mut rx: mpsc::Receiver<Output>) -> (Vec<u8>, Vec<u8>) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(chunk) = rx.recv().await {
            match chunk {
                Output::Stdout(b) => out.extend_from_slice(&b),
                Output::Stderr(b) => err.extend_from_slice(&b),
            }
        }
        (out, err)
    }
}

/// How a remote command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExitStatus {
    /// Exit code, when the command exited normally.
    pub code: Option<u32>,
    /// Signal name without `SIG` (e.g. `KILL`), when the command was killed by a signal.
    pub signal: Option<String>,
}

impl ExitStatus {
    /// True when the command exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.code, &self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(sig)) => write!(f, "killed by signal {sig}"),
            (None, None) => f.write_str("unknown exit status"),
        }
    }
}

/// An authenticated SSH connection to one instance.
pub struct Client {
    handle: Handle<Handler>,
    instance: String,
    addr: String,
    /// A command started ahead on its own channel, waiting for a run to feed it stdin.
    ready: std::sync::Mutex<Option<Ready>>,
}

/// A channel whose command is already started and has not been given any input.
struct Ready {
    command: String,
    channel: russh::Channel<russh::client::Msg>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("instance", &self.instance)
            .field("addr", &self.addr)
            .field("closed", &self.handle.is_closed())
            .finish()
    }
}

impl Client {
    /// Dial `info`'s instance, check its host key against `host_keys` (pinning it on first use)
    /// and authenticate with the connect info's key and/or password.
    pub async fn connect(
        info: &ConnectInfo,
        opts: &DialOptions,
        host_keys: &HostKeyStore,
    ) -> Result<Client, ConnectError> {
        let instance = info.id.clone();
        let cc = &info.connector;
        let invalid = |reason: String| ConnectError::InvalidConnectInfo {
            instance: instance.clone(),
            reason,
        };
        if !cc.protocol.is_empty() && cc.protocol != "ssh" {
            return Err(invalid(format!(
                "protocol {:?} is not supported",
                cc.protocol
            )));
        }
        if cc.username.is_empty() {
            return Err(invalid("no username".into()));
        }
        let (host, port) = dial_address(info, opts).map_err(invalid)?;
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        // Parse the key before dialling so a bad key fails fast and is not retried as a
        // network problem.
        let key = if cc.key.is_empty() {
            None
        } else {
            Some(parse_key(&instance, &cc.key)?)
        };
        if key.is_none() && cc.password.is_empty() {
            return Err(invalid("neither a key nor a password is set".into()));
        }
        let timeout = nonzero_or(cc.timeout, DEFAULT_TIMEOUT);
        let config = Arc::new(Config {
            keepalive_interval: Some(nonzero_or(cc.keepalive, DEFAULT_KEEPALIVE)),
            keepalive_max: KEEPALIVE_MAX,
            // Interactive output streaming: do not let Nagle delay small chunks.
            nodelay: true,
            ..Config::default()
        });
        let handler = Handler {
            instance: instance.clone(),
            store: host_keys.clone(),
        };
        let dial = async {
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|source| ConnectError::Io {
                    instance: instance.clone(),
                    addr: addr.clone(),
                    source,
                })?;
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(instance = %instance, addr = %addr, "set_nodelay: {e}");
            }
            let mut handle = russh::client::connect_stream(config, tcp, handler)
                .await
                .map_err(|e| e.into_connect_error(&instance, &addr))?;
            authenticate(
                &mut handle,
                &instance,
                &addr,
                &cc.username,
                key,
                &cc.password,
            )
            .await?;
            Ok::<_, ConnectError>(handle)
        };
        let handle = tokio::time::timeout(timeout, dial).await.map_err(|_| {
            ConnectError::ConnectTimeout {
                instance: instance.clone(),
                addr: addr.clone(),
                timeout,
            }
        })??;
        tracing::debug!(instance = %instance, addr = %addr, "ssh connected");
        Ok(Client {
            handle,
            instance,
            addr,
            ready: std::sync::Mutex::new(None),
        })
    }

    /// Instance id this client is connected to.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Address (`host:port`) this client dialled.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Run one command on its own channel, streaming its output into `output` as it arrives.
    ///
    /// Stdin is sent then closed. Several runs may proceed concurrently on one client. A slow
    /// `output` receiver slows the whole connection (SSH flow control); a dropped receiver
    /// discards further output without stopping the command.
    pub async fn run(
        &self,
        opts: RunOptions,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, ConnectError> {
        let RunOptions {
            command,
            stdin,
            stdin_file,
            timeout,
            ready_ahead,
        } = opts;
        // Opened first: a missing file is this side's error, not the command's.
        let stdin_file = match stdin_file {
            Some(path) => match tokio::fs::File::open(&path).await {
                Ok(f) => Some((f, path)),
                Err(source) => {
                    return Err(ConnectError::Input {
                        path: path.clone(),
                        source,
                    });
                }
            },
            None => None,
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        let timed_out = || ConnectError::Timeout {
            instance: self.instance.clone(),
            addr: self.addr.clone(),
            timeout: timeout.unwrap_or_default(),
        };
        let started = if ready_ahead {
            self.take_ready(&command).await
        } else {
            None
        };
        let fresh = started.is_none();
        let channel = match started {
            Some(channel) => channel,
            None => within(deadline, self.open_session())
                .await
                .ok_or_else(timed_out)?
                .map_err(|e| self.channel_error(e))?,
        };
        let (mut read, write) = channel.split();
        let drive = async {
            if fresh {
                write
                    .exec(true, command.as_bytes())
                    .await
                    .map_err(|e| self.channel_error(e))?;
            }
            // Stdin is written concurrently with reading output: a command that produces output
            // before consuming its input must not deadlock on SSH window sizes.
            // A read error of the file is this side's: it ends the run (no EOF, so the command
            // cannot take a cut stream for a whole one).
            let feed = async {
                if !stdin.is_empty() {
                    write.data(stdin.as_slice()).await.map_err(Fed::Channel)?;
                }
                if let Some((file, path)) = stdin_file {
                    let mut reader = ReadErrors {
                        inner: tokio::io::BufReader::with_capacity(256 * 1024, file),
                        failed: None,
                    };
                    let sent = write.data(&mut reader).await;
                    if let Some(e) = reader.failed.take() {
                        return Err(Fed::Unreadable(path, e));
                    }
                    sent.map_err(Fed::Channel)?;
                }
                write.eof().await.map_err(Fed::Channel)
            };
            let collect = collect(&mut read, &output);
            tokio::pin!(feed, collect);
            let mut fed = false;
            loop {
                tokio::select! {
                    res = &mut feed, if !fed => {
                        fed = true;
                        match res {
                            Err(Fed::Unreadable(path, source)) => {
                                return Err(ConnectError::Input { path, source });
                            }
                            // The command may exit without reading its input; not an error.
                            Err(Fed::Channel(e)) => {
                                tracing::debug!(instance = %self.instance, "stdin not fully sent: {e}");
                            }
                            Ok(()) => {}
                        }
                    }
                    res = &mut collect => break res,
                }
            }
        };
        // The next run's channel is started while this one runs, off its critical path.
        let ahead = async {
            if ready_ahead {
                self.start_ready(&command).await;
            }
        };
        let (done, ()) = tokio::join!(within(deadline, drive), ahead);
        match done {
            Some(Ok(Collected::Exited(status))) => Ok(status),
            Some(Ok(Collected::Rejected)) => Err(ConnectError::Rejected {
                instance: self.instance.clone(),
                addr: self.addr.clone(),
                reason: "exec request refused".into(),
            }),
            Some(Ok(Collected::Lost)) => Err(self.disconnected()),
            Some(Err(e)) => Err(e),
            None => {
                // Best effort: ask sshd to signal the command, then close the channel so sshd
                // tears the session down; either may fail if the connection is gone.
                let _ = write.signal(Sig::TERM).await;
                let _ = write.close().await;
                Err(timed_out())
            }
        }
    }

    /// A new session channel. sshd caps sessions per connection (OpenSSH's `MaxSessions`,
    /// 10 by default): when it refuses one, a started-ahead channel gives its place up.
    async fn open_session(&self) -> Result<russh::Channel<russh::client::Msg>, russh::Error> {
        match self.handle.channel_open_session().await {
            Err(russh::Error::ChannelOpenFailure(why)) => {
                let Some(spare) = self.lock_ready().take() else {
                    return Err(russh::Error::ChannelOpenFailure(why));
                };
                let _ = spare.channel.close().await;
                self.handle.channel_open_session().await
            }
            other => other,
        }
    }

    /// The started-ahead channel for `command`, if there is one whose command has not ended.
    async fn take_ready(&self, command: &str) -> Option<russh::Channel<russh::client::Msg>> {
        let ready = self.lock_ready().take()?;
        let mut channel = ready.channel;
        if ready.command != command {
            let _ = channel.close().await;
            return None;
        }
        // Anything but the exec's acknowledgement arriving before any input (an exit, a close,
        // output, a refusal) means the command is not waiting for us: start a fresh one.
        loop {
            match channel.wait().now_or_never() {
                None => return Some(channel),
                Some(Some(ChannelMsg::Success | ChannelMsg::WindowAdjusted { .. })) => {}
                Some(other) => {
                    tracing::debug!(instance = %self.instance, "started-ahead command not usable: {other:?}");
                    let _ = channel.close().await;
                    return None;
                }
            }
        }
    }

    /// Open a channel, start `command` on it and keep it for the next run of that command.
    async fn start_ready(&self, command: &str) {
        if self.lock_ready().is_some() {
            return;
        }
        let started = async {
            let channel = self.handle.channel_open_session().await?;
            channel.exec(true, command.as_bytes()).await?;
            Ok::<_, russh::Error>(channel)
        };
        match tokio::time::timeout(READY_AHEAD_TIMEOUT, started).await {
            Ok(Ok(channel)) => {
                let mut ready = self.lock_ready();
                // A concurrent run may have started one too: keep the first.
                if ready.is_none() {
                    *ready = Some(Ready {
                        command: command.to_string(),
                        channel,
                    });
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(instance = %self.instance, "starting a command ahead: {e}");
            }
            Err(_) => {
                tracing::debug!(instance = %self.instance, "starting a command ahead timed out");
            }
        }
    }

    fn lock_ready(&self) -> std::sync::MutexGuard<'_, Option<Ready>> {
        // Poisoning only means a panic elsewhere; an Option is always consistent.
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start `command` on its own channel and hand back its stdin and stdout as one byte
    /// stream (for `docker system dial-stdio` and other stdio tunnels).
    pub async fn open_stream(&self, command: &str) -> Result<ExecStream, ConnectError> {
        let channel = self
            .open_session()
            .await
            .map_err(|e| self.channel_error(e))?;
        channel
            .exec(true, command.as_bytes())
            .await
            .map_err(|e| self.channel_error(e))?;
        Ok(ExecStream::new(channel.into_stream(), command.to_string()))
    }

    /// Connect to the unix socket at `path` on the instance, through its sshd (OpenSSH's
    /// `direct-streamlocal@openssh.com` channel), and hand back the connection as a byte
    /// stream. Several may be open at once on one client, next to running commands.
    pub async fn open_unix(&self, path: &str) -> Result<ForwardedStream, ConnectError> {
        let channel = self
            .handle
            .channel_open_direct_streamlocal(path)
            .await
            .map_err(|e| match e {
                russh::Error::ChannelOpenFailure(why) => ConnectError::UnixSocketRefused {
                    instance: self.instance.clone(),
                    addr: self.addr.clone(),
                    path: path.to_owned(),
                    reason: open_failure_reason(&why),
                },
                e => self.channel_error(e),
            })?;
        Ok(ForwardedStream::new(channel.into_stream(), path.to_owned()))
    }

    /// Run a command and collect its whole output: `(status, stdout, stderr)`.
    pub async fn run_capture(
        &self,
        command: impl Into<String>,
        stdin: impl Into<Vec<u8>>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), ConnectError> {
        let (tx, rx) = mpsc::channel(64);
        let opts = RunOptions::new(command).stdin(stdin);
        // `run` owns the sender, so `gather` ends when `run` returns.
        let (status, (out, err)) = tokio::join!(self.run(opts, tx), Output::gather(rx));
        Ok((status?, out, err))
    }

    /// Disconnect politely.
    pub async fn close(self) {
        if let Err(e) = self
            .handle
            .disconnect(Disconnect::ByApplication, "", "en")
            .await
        {
            tracing::debug!(instance = %self.instance, "disconnect: {e}");
        }
    }

    fn channel_error(&self, e: russh::Error) -> ConnectError {
        match e {
            // The session task is gone: the connection dropped.
            russh::Error::SendError | russh::Error::Disconnect => self.disconnected(),
            russh::Error::ChannelOpenFailure(reason) => ConnectError::Rejected {
                instance: self.instance.clone(),
                addr: self.addr.clone(),
                reason: format!("channel open failed: {reason:?}"),
            },
            source => ConnectError::Ssh {
                instance: self.instance.clone(),
                addr: self.addr.clone(),
                source: Box::new(source),
            },
        }
    }

    fn disconnected(&self) -> ConnectError {
        ConnectError::Disconnected {
            instance: self.instance.clone(),
            addr: self.addr.clone(),
        }
    }
}

/// Why a command's stdin was not all sent.
enum Fed {
    /// The channel refused it (the command exited without reading it all).
    Channel(russh::Error),
    /// The file could not be read.
    Unreadable(std::path::PathBuf, std::io::Error),
}

/// A reader that keeps its first error (to tell a local read failure from a closed channel).
struct ReadErrors<R> {
    inner: R,
    failed: Option<std::io::Error>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ReadErrors<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Err(e)) = &polled {
            let told = std::io::Error::new(e.kind(), e.to_string());
            self.failed = Some(told);
        }
        polled
    }
}

enum Collected {
    Exited(ExitStatus),
    Rejected,
    Lost,
}

/// Forward channel output until the channel closes, remembering the exit status.
async fn collect(
    read: &mut russh::ChannelReadHalf,
    output: &mpsc::Sender<Output>,
) -> Result<Collected, ConnectError> {
    let mut status = ExitStatus::default();
    let mut exited = false;
    loop {
        match read.wait().await {
            Some(ChannelMsg::Data { data }) => {
                // A dropped receiver means the caller stopped listening, not that the command
                // should stop; keep draining so the exit status still arrives.
                let _ = output.send(Output::Stdout(data.to_vec())).await;
            }
            Some(ChannelMsg::ExtendedData { data, ext: 1 }) => {
                let _ = output.send(Output::Stderr(data.to_vec())).await;
            }
            Some(ChannelMsg::ExitStatus { exit_status }) => {
                status.code = Some(exit_status);
                exited = true;
            }
            Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                status.signal = Some(signal_name_of(&signal_name));
                exited = true;
            }
            Some(ChannelMsg::Failure) => return Ok(Collected::Rejected),
            Some(ChannelMsg::Close) => {
                // OpenSSH always reports exit-status or exit-signal before closing; a close
                // without one happens when sshd itself lost the command.
                return Ok(if exited {
                    Collected::Exited(status)
                } else {
                    Collected::Lost
                });
            }
            Some(_) => {}
            None => {
                // The session ended without closing the channel: the connection dropped. A
                // status that already arrived is still the truth about the command.
                return Ok(if exited {
                    Collected::Exited(status)
                } else {
                    Collected::Lost
                });
            }
        }
    }
}

/// What a refused `direct-streamlocal` channel most likely means; OpenSSH sends only the code.
fn open_failure_reason(why: &ChannelOpenFailure) -> String {
    match why {
        ChannelOpenFailure::AdministrativelyProhibited => {
            "administratively prohibited (is AllowStreamLocalForwarding disabled in sshd_config?)"
                .into()
        }
        // OpenSSH sends this one both when the socket cannot be connected to and when
        // forwarding is disabled.
        ChannelOpenFailure::ConnectFailed => "connect failed (no socket at that path, nothing \
            listening on it, or AllowStreamLocalForwarding disabled in sshd_config)"
            .into(),
        ChannelOpenFailure::UnknownChannelType => {
            "the server does not support unix socket forwarding".into()
        }
        ChannelOpenFailure::ResourceShortage => "the server is short of resources".into(),
        ChannelOpenFailure::Other { code, reason } => format!("code {code}: {reason}"),
    }
}

fn signal_name_of(sig: &Sig) -> String {
    match sig {
        Sig::ABRT => "ABRT",
        Sig::ALRM => "ALRM",
        Sig::FPE => "FPE",
        Sig::HUP => "HUP",
        Sig::ILL => "ILL",
        Sig::INT => "INT",
        Sig::KILL => "KILL",
        Sig::PIPE => "PIPE",
        Sig::QUIT => "QUIT",
        Sig::SEGV => "SEGV",
        Sig::TERM => "TERM",
        Sig::USR1 => "USR1",
        Sig::Custom(name) => name.as_str(),
    }
    .to_owned()
}

/// Await `fut`, giving up at `deadline` (`None`: never).
async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(deadline) => tokio::time::timeout_at(deadline, fut).await.ok(),
    }
}

fn nonzero_or(d: Duration, default: Duration) -> Duration {
    if d.is_zero() { default } else { d }
}

/// Host and port to dial: the external address when asked for and present, else the internal
/// one; a bare host gets the protocol port (22 by default).
fn dial_address(info: &ConnectInfo, opts: &DialOptions) -> Result<(String, u16), String> {
    let raw = if opts.use_external_addr && !info.external_addr.is_empty() {
        info.external_addr.as_str()
    } else {
        info.internal_addr.as_str()
    };
    let default_port = match info.connector.protocol_port {
        0 => DEFAULT_SSH_PORT,
        p => p,
    };
    split_host_port(raw.trim(), default_port)
}

/// Split `host`, `host:port`, `[v6]` or `[v6]:port`; a bare IPv6 address keeps `default_port`.
pub fn split_host_port(raw: &str, default_port: u16) -> Result<(String, u16), String> {
    if raw.is_empty() {
        return Err("no address".into());
    }
    let parse_port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port in address {raw:?}"))
    };
    if let Some(rest) = raw.strip_prefix('[') {
        // `[v6]` or `[v6]:port`
        let (host, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("unterminated '[' in address {raw:?}"))?;
        let port = match tail {
            "" => default_port,
            t => parse_port(
                t.strip_prefix(':')
                    .ok_or_else(|| format!("bad address {raw:?}"))?,
            )?,
        };
        return Ok((host.to_owned(), port));
    }
    match raw.matches(':').count() {
        0 => Ok((raw.to_owned(), default_port)),
        1 => {
            let (host, port) = raw.split_once(':').unwrap_or((raw, ""));
            if host.is_empty() {
                return Err(format!("no host in address {raw:?}"));
            }
            Ok((host.to_owned(), parse_port(port)?))
        }
        // A bare IPv6 address.
        _ => Ok((raw.to_owned(), default_port)),
    }
}

fn parse_key(instance: &str, pem: &[u8]) -> Result<PrivateKey, ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidKey {
        instance: instance.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(pem).map_err(|_| invalid("key is not UTF-8 PEM".into()))?;
    russh::keys::decode_secret_key(text, None).map_err(|e| invalid(e.to_string()))
}

async fn authenticate(
    handle: &mut Handle<Handler>,
    instance: &str,
    addr: &str,
    user: &str,
    key: Option<PrivateKey>,
    password: &str,
) -> Result<(), ConnectError> {
    let ssh = |source: russh::Error| ConnectError::Ssh {
        instance: instance.to_owned(),
        addr: addr.to_owned(),
        source: Box::new(source),
    };
    let mut tried = Vec::new();
    if let Some(key) = key {
        tried.push("publickey");
        let key = PrivateKeyWithHashAlg::new(Arc::new(key), None);
        if handle
            .authenticate_publickey(user, key)
            .await
            .map_err(ssh)?
            .success()
        {
            return Ok(());
        }
    }
    if !password.is_empty() {
        tried.push("password");
        if handle
            .authenticate_password(user, password)
            .await
            .map_err(ssh)?
            .success()
        {
            return Ok(());
        }
    }
    Err(ConnectError::AuthFailed {
        instance: instance.to_owned(),
        addr: addr.to_owned(),
        user: user.to_owned(),
        tried: tried.join(", "),
    })
}

/// russh callbacks: host key verification against the pin store.
struct Handler {
    instance: String,
    store: HostKeyStore,
}

/// Errors raised inside [`Handler`], carried out of russh's session task.
#[derive(Debug)]
enum HandlerError {
    Ssh(russh::Error),
    Mismatch { expected: String, got: String },
    Store(HostKeyStoreError),
}

impl From<russh::Error> for HandlerError {
    fn from(e: russh::Error) -> Self {
        HandlerError::Ssh(e)
    }
}

impl HandlerError {
    fn into_connect_error(self, instance: &str, addr: &str) -> ConnectError {
        match self {
            HandlerError::Ssh(source) => ConnectError::Ssh {
                instance: instance.to_owned(),
                addr: addr.to_owned(),
                source: Box::new(source),
            },
            HandlerError::Mismatch { expected, got } => ConnectError::HostKeyMismatch {
                instance: instance.to_owned(),
                expected_fingerprint: expected,
                got_fingerprint: got,
            },
            HandlerError::Store(source) => ConnectError::HostKeyStore {
                instance: instance.to_owned(),
                source,
            },
        }
    }
}

impl russh::client::Handler for Handler {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            // No CA is configured: pin the certified key itself, like a plain host key.
            PublicKeyOrCertificate::Certificate(cert) => PublicKey::from(cert.public_key().clone()),
        };
        match self.store.check(&self.instance, &key) {
            Ok(Check::Known) => Ok(true),
            Ok(Check::Pinned) => {
                tracing::info!(
                    instance = %self.instance,
                    fingerprint = %fingerprint(&key),
                    "pinned host key on first use"
                );
                self.store.persist().await.map_err(HandlerError::Store)?;
                Ok(true)
            }
            Ok(Check::Mismatch(expected)) => Err(HandlerError::Mismatch {
                expected,
                got: fingerprint(&key),
            }),
            Err(e) => Err(HandlerError::Store(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("10.0.0.2", 22), Ok(("10.0.0.2".into(), 22)));
        assert_eq!(split_host_port("h:2222", 22), Ok(("h".into(), 2222)));
        assert_eq!(split_host_port("::1", 2200), Ok(("::1".into(), 2200)));
        assert_eq!(split_host_port("[::1]:23", 22), Ok(("::1".into(), 23)));
        assert_eq!(split_host_port("[::1]", 24), Ok(("::1".into(), 24)));
        assert!(split_host_port("h:0", 22).is_err());
        assert!(split_host_port("h:x", 22).is_err());
        assert!(split_host_port("", 22).is_err());
        assert!(split_host_port(":22", 22).is_err());
    }

    #[test]
    fn address_choice() {
        let mut info = ConnectInfo {
            internal_addr: "10.0.0.2".into(),
            ..ConnectInfo::default()
        };
        let ext = DialOptions {
            use_external_addr: true,
        };
        // Only an internal address: used whatever use_external_addr says.
        assert_eq!(dial_address(&info, &ext), Ok(("10.0.0.2".into(), 22)));
        info.external_addr = "1.2.3.4:2222".into();
        info.connector.protocol_port = 2200;
        assert_eq!(dial_address(&info, &ext), Ok(("1.2.3.4".into(), 2222)));
        assert_eq!(
            dial_address(&info, &DialOptions::default()),
            Ok(("10.0.0.2".into(), 2200))
        );
    }
}
