//! End-to-end tests of the connector against a real OpenSSH sshd on 127.0.0.1.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use slipway_connector::{
    Client, ConnectError, DialOptions, ForwardedStream, HostKeyStore, Output, RunOptions,
};
use slipway_fleeting::{ConnectInfo, ConnectorConfig};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const SSHD: &str = "/usr/sbin/sshd";

/// Install openssh-server when missing (tests never skip for want of it).
fn ensure_sshd() {
    if Path::new(SSHD).exists() {
        return;
    }
    let ok = std::process::Command::new("apt-get")
        .args(["install", "-y", "-q", "openssh-server"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        let _ = std::process::Command::new("apt-get").arg("update").status();
        let st = std::process::Command::new("apt-get")
            .args(["install", "-y", "-q", "openssh-server"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .unwrap();
        assert!(st.success(), "apt-get install openssh-server failed");
    }
}

fn keygen(path: &Path) {
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A real sshd in the foreground (`-D -e`) with its own host key, killed with its session
/// processes when dropped. `SetEnv SHLVL=1`, as in slipway_testkit, keeps login shells from
/// sourcing the user's `~/.bashrc` (slow, and lock-taking, on some machines).
struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// Extra sshd_config lines.
    extra: String,
}

impl Sshd {
    async fn start() -> Sshd {
        Sshd::start_with("").await
    }

    /// Start with `extra` appended to the sshd_config.
    async fn start_with(extra: &str) -> Sshd {
        ensure_sshd();
        std::fs::create_dir_all("/run/sshd").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        keygen(&d.join("host"));
        keygen(&d.join("client"));
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).unwrap();
        let mut sshd = Sshd {
            dir,
            port: 0,
            child: None,
            extra: extra.to_owned(),
        };
        sshd.spawn(None).await;
        sshd
    }

    fn cfg(&self) -> PathBuf {
        self.dir.path().join("sshd_config")
    }

    async fn spawn(&mut self, port: Option<u16>) {
        for _ in 0..20 {
            let port = match port {
                Some(p) => p,
                None => std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port(),
            };
            let d = self.dir.path().display();
            std::fs::write(
                self.cfg(),
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\n\
                     AuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\n\
                     StrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                     PermitRootLogin prohibit-password\nMaxSessions 64\nMaxStartups 64:30:128\n\
                     LogLevel ERROR\nSetEnv SHLVL=1\n{}",
                    self.extra
                ),
            )
            .unwrap();
            let mut child = Command::new(SSHD)
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(self.cfg())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // e.g. port collision: retry with another port
                }
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    self.port = port;
                    self.child = Some(child);
                    return;
                }
                assert!(Instant::now() < deadline, "sshd did not start");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("could not start sshd");
    }

    fn info(&self) -> ConnectInfo {
        ConnectInfo {
            id: "inst-1".into(),
            connector: ConnectorConfig {
                os: "linux".into(),
                protocol: "ssh".into(),
                username: whoami(),
                key: std::fs::read(self.dir.path().join("client")).unwrap(),
                timeout: Duration::from_secs(5),
                ..ConnectorConfig::default()
            },
            internal_addr: format!("127.0.0.1:{}", self.port),
            ..ConnectInfo::default()
        }
    }

    /// SIGKILL the listener and every process below it (connection sshds, commands).
    fn kill_all(&mut self) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            kill_tree(pid);
        }
        self.child = None;
    }

    /// Restart on the same port with a freshly generated host key.
    async fn swap_host_key(&mut self) {
        self.kill_all();
        let host = self.dir.path().join("host");
        std::fs::remove_file(&host).unwrap();
        std::fs::remove_file(host.with_extension("pub")).unwrap();
        keygen(&host);
        let port = self.port;
        // The old listener may take a moment to release the port.
        let deadline = Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.spawn(Some(port)).await;
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn whoami() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Kill `root` and all its descendants (found through /proc/*/stat parent pids).
fn kill_tree(root: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let mut pids = vec![root];
    let mut i = 0;
    let table: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    while i < pids.len() {
        let parent = pids[i];
        pids.extend(
            table
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    for pid in pids {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

async fn connect(sshd: &Sshd, store: &HostKeyStore) -> Client {
    Client::connect(&sshd.info(), &DialOptions::default(), store)
        .await
        .unwrap()
}

#[tokio::test]
async fn stdin_stdout_stderr_and_exit_codes() {
    let sshd = Sshd::start().await;
    let store = HostKeyStore::new();
    let client = connect(&sshd, &store).await;

    let (st, out, err) = client
        .run_capture("tr a-z A-Z; echo oops >&2", b"hello stdin".to_vec())
        .await
        .unwrap();
    assert!(st.success(), "{st:?}");
    assert_eq!(out, b"HELLO STDIN");
    assert_eq!(err, b"oops\n");

    let (st, out, _) = client.run_capture("exit 3", Vec::new()).await.unwrap();
    assert_eq!(
        (st.code, st.signal.as_deref(), out.len()),
        (Some(3), None, 0)
    );

    let (st, _, _) = client
        .run_capture("kill -KILL $$", Vec::new())
        .await
        .unwrap();
    assert_eq!((st.code, st.signal.as_deref()), (None, Some("KILL")));

    // Large stdin through a command that echoes it back: flow control in both directions.
    let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    let (st, out, _) = client.run_capture("cat", big.clone()).await.unwrap();
    assert!(st.success());
    assert_eq!(out.len(), big.len());
    assert!(out == big);

    // The same from a file, streamed: what sources of gigabytes take.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stdin.bin");
    std::fs::write(&file, &big).unwrap();
    let (tx, rx) = mpsc::channel(64);
    let opts = RunOptions::new("wc -c")
        .stdin(b"0123".to_vec())
        .stdin_file(&file);
    let (st, (out, _)) = tokio::join!(client.run(opts, tx), Output::gather(rx));
    assert!(st.unwrap().success());
    assert_eq!(
        String::from_utf8_lossy(&out).trim(),
        (big.len() + 4).to_string(),
        "the bytes, then the file"
    );
    let (tx, _rx) = mpsc::channel(64);
    let missing = dir.path().join("missing.bin");
    let e = client
        .run(RunOptions::new("cat").stdin_file(&missing), tx)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("missing.bin"), "{e}");
    client.close().await;
}

#[tokio::test]
async fn output_streams_before_exit() {
    let sshd = Sshd::start().await;
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let (tx, mut rx) = mpsc::channel(16);
    let run = client.run(
        RunOptions::new("for i in 1 2 3; do echo line$i; sleep 0.3; done"),
        tx,
    );
    let watch = async {
        let mut chunks = Vec::new();
        while let Some(Output::Stdout(c)) = rx.recv().await {
            chunks.push((Instant::now(), c));
        }
        chunks
    };
    let (st, chunks) = tokio::join!(run, watch);
    let done = Instant::now();
    assert!(st.unwrap().success());
    assert!(chunks.len() > 1, "{chunks:?}");
    // The first line arrived well before the command ended.
    assert!(done - chunks[0].0 > Duration::from_millis(400));
    let all: Vec<u8> = chunks.into_iter().flat_map(|(_, c)| c).collect();
    assert_eq!(all, b"line1\nline2\nline3\n");
}

#[tokio::test]
async fn concurrent_runs_share_a_connection() {
    let sshd = Sshd::start().await;
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let start = Instant::now();
    let runs = (0..8).map(|i| {
        let client = &client;
        async move {
            client
                .run_capture(format!("sleep 0.5; echo {i}; exit {i}"), Vec::new())
                .await
        }
    });
    let results = futures_join_all(runs).await;
    for (i, r) in results.into_iter().enumerate() {
        let (st, out, _) = r.unwrap();
        assert_eq!(st.code, Some(i as u32));
        assert_eq!(out, format!("{i}\n").into_bytes());
    }
    // Sequential would take 4 s; generous bound for a loaded 2-core machine.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

/// Minimal join_all without pulling in the futures crate.
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.map(Box::pin).collect();
    let mut out = Vec::new();
    // Polling them through a single select-free loop: spawn-free, order-preserving.
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().map(Option::unwrap));
    out
}

#[tokio::test]
async fn run_timeout_closes_the_channel() {
    let sshd = Sshd::start().await;
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let (tx, _rx) = mpsc::channel(16);
    let start = Instant::now();
    let err = client
        .run(
            RunOptions::new("sleep 30").timeout(Duration::from_millis(500)),
            tx,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Timeout { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // The connection is still usable afterwards.
    let (st, out, _) = client.run_capture("echo ok", Vec::new()).await.unwrap();
    assert!(st.success());
    assert_eq!(out, b"ok\n");
}

#[tokio::test]
async fn host_key_pinned_then_mismatch_detected() {
    let mut sshd = Sshd::start().await;
    let pins = tempfile::tempdir().unwrap();
    let store = HostKeyStore::open(pins.path().join("known_hosts"))
        .await
        .unwrap();
    connect(&sshd, &store).await.close().await;
    let pinned = store.fingerprint("inst-1").unwrap();
    let text = std::fs::read_to_string(pins.path().join("known_hosts")).unwrap();
    assert!(text.starts_with("inst-1 ssh-ed25519 "), "{text}");

    sshd.swap_host_key().await;
    // A store reopened from the file (a restarted manager) still rejects the new key.
    let reopened = HostKeyStore::open(pins.path().join("known_hosts"))
        .await
        .unwrap();
    let err = Client::connect(&sshd.info(), &DialOptions::default(), &reopened)
        .await
        .unwrap_err();
    match &err {
        ConnectError::HostKeyMismatch {
            instance,
            expected_fingerprint,
            got_fingerprint,
        } => {
            assert_eq!(instance, "inst-1");
            assert_eq!(expected_fingerprint, &pinned);
            assert_ne!(got_fingerprint, &pinned);
            assert!(got_fingerprint.starts_with("SHA256:"));
        }
        other => panic!("expected HostKeyMismatch, got {other}"),
    }
    assert!(err.to_string().contains("inst-1"));

    // After the instance is forgotten (deleted and recreated), the new key is accepted.
    assert!(reopened.forget("inst-1").await.unwrap());
    connect(&sshd, &reopened).await.close().await;
}

#[tokio::test]
async fn dropped_connection_and_dead_server_are_errors() {
    let mut sshd = Sshd::start().await;
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let (tx, _rx) = mpsc::channel(16);
    let run = client.run(RunOptions::new("sleep 30"), tx);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        sshd.kill_all();
    };
    let (res, ()) =
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(run, kill) })
            .await
            .expect("run hung after the connection dropped");
    let err = res.unwrap_err();
    assert!(matches!(err, ConnectError::Disconnected { .. }), "{err}");

    let err = Client::connect(&sshd.info(), &DialOptions::default(), &HostKeyStore::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("inst-1") && msg.contains(&format!("127.0.0.1:{}", sshd.port)),
        "{msg}"
    );
}

#[tokio::test]
async fn wrong_key_is_an_auth_failure() {
    let sshd = Sshd::start().await;
    let other = sshd.dir.path().join("other");
    keygen(&other);
    let mut info = sshd.info();
    info.connector.key = std::fs::read(&other).unwrap();
    let err = Client::connect(&info, &DialOptions::default(), &HostKeyStore::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::AuthFailed { .. }), "{err}");
    info.connector.key = b"not a key".to_vec();
    let err = Client::connect(&info, &DialOptions::default(), &HostKeyStore::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::InvalidKey { .. }), "{err}");
    assert!(!format!("{err}").contains("not a key"));
}

#[tokio::test]
async fn a_command_as_a_byte_stream_carries_data_both_ways() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sshd = Sshd::start().await;
    let store = HostKeyStore::new();
    let client = connect(&sshd, &store).await;
    // Line-by-line echo: a request/response exchange, as an HTTP tunnel makes.
    let mut stream = client
        .open_stream("while IFS= read -r l; do echo \"got $l\"; done")
        .await
        .unwrap();
    for word in ["one", "two"] {
        stream
            .write_all(format!("{word}\n").as_bytes())
            .await
            .unwrap();
        stream.flush().await.unwrap();
        let mut buf = vec![0u8; 64];
        let mut got = Vec::new();
        while !got.ends_with(b"\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "stream ended early");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, format!("got {word}\n").as_bytes());
    }
    // Closing our side ends the command's input; its output then ends too.
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    // Bulk data through `cat`.
    let cat = client.open_stream("cat").await.unwrap();
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = tokio::io::split(cat);
    let send = async {
        w.write_all(&big).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let recv = r.read_to_end(&mut back);
    let (_, n) = tokio::join!(send, recv);
    n.unwrap();
    assert!(back == big);
    client.close().await;
}

/// A unix socket echo server in its own temp dir: each connection gets back what it sends,
/// then EOF once it has sent EOF.
struct EchoSocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl EchoSocket {
    fn start() -> EchoSocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("echo.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    // Our EOF after theirs: the client's reader must see it.
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut w).await;
                });
            }
        });
        EchoSocket {
            _dir: dir,
            path,
            task,
        }
    }

    fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

impl Drop for EchoSocket {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Send `line` and read until the echoed line is back.
async fn echo_line(stream: &mut ForwardedStream, line: &str) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream.write_all(line.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while got.len() < line.len() {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream ended early");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, line.as_bytes());
}

#[test]
fn a_forwarded_stream_can_carry_grpc() {
    // What tonic's connector and hyper's TokioIo ask of a transport.
    fn transport<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static>() {}
    transport::<ForwardedStream>();
}

#[tokio::test]
async fn a_unix_socket_through_sshd_carries_data_both_ways_and_eof() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sshd = Sshd::start().await;
    let echo = EchoSocket::start();
    let client = connect(&sshd, &HostKeyStore::new()).await;

    let mut stream = client.open_unix(echo.path()).await.unwrap();
    assert_eq!(stream.path(), echo.path());
    for line in ["{\"ping\":1}\n", "{\"ping\":2}\n"] {
        echo_line(&mut stream, line).await;
    }
    // Our EOF reaches the server, whose EOF then reaches us.
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
        .await
        .expect("EOF did not come back")
        .unwrap();
    assert!(rest.is_empty());

    // Bulk data both ways at once: flow control in both directions.
    let stream = client.open_unix(echo.path()).await.unwrap();
    let big: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = tokio::io::split(stream);
    let send = async {
        w.write_all(&big).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let recv = r.read_to_end(&mut back);
    let (_, n) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(send, recv) })
        .await
        .expect("bulk echo hung");
    n.unwrap();
    assert!(back == big);

    // The connection still runs commands next to forwarded sockets.
    let (st, out, _) = client.run_capture("echo ok", Vec::new()).await.unwrap();
    assert!(st.success());
    assert_eq!(out, b"ok\n");
    client.close().await;
}

#[tokio::test]
async fn the_far_side_closing_a_unix_socket_reaches_the_reader() {
    use tokio::io::AsyncReadExt as _;
    let sshd = Sshd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bye.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    // A server that says one thing and hangs up without reading.
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut conn, b"bye\n")
            .await
            .unwrap();
    });
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let mut stream = client.open_unix(path.to_str().unwrap()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .expect("the server's close did not reach the reader")
        .unwrap();
    assert_eq!(got, b"bye\n");
    server.await.unwrap();
}

#[tokio::test]
async fn two_unix_streams_at_once_stay_apart() {
    let sshd = Sshd::start().await;
    let echo = EchoSocket::start();
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let mut a = client.open_unix(echo.path()).await.unwrap();
    let mut b = client.open_unix(echo.path()).await.unwrap();
    // Interleaved: each stream gets back only its own bytes.
    for i in 0..5 {
        echo_line(&mut a, &format!("a{i}\n")).await;
        echo_line(&mut b, &format!("b{i}\n")).await;
    }
    tokio::join!(
        echo_line(&mut a, "together a\n"),
        echo_line(&mut b, "together b\n")
    );
    drop(a);
    // Closing one leaves the other working.
    echo_line(&mut b, "still here\n").await;
}

#[tokio::test]
async fn a_missing_unix_socket_is_an_error_naming_the_path() {
    let sshd = Sshd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody-listens.sock");
    let missing = missing.to_str().unwrap();
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let err = client.open_unix(missing).await.unwrap_err();
    match &err {
        ConnectError::UnixSocketRefused { instance, path, .. } => {
            assert_eq!(instance, "inst-1");
            assert_eq!(path, missing);
        }
        other => panic!("expected UnixSocketRefused, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(missing) && msg.contains("inst-1"), "{msg}");
    // The refusal is per channel: the connection carries on.
    let echo = EchoSocket::start();
    let mut ok = client.open_unix(echo.path()).await.unwrap();
    echo_line(&mut ok, "after\n").await;
}

#[tokio::test]
async fn forwarding_disabled_in_sshd_is_an_error_naming_the_path() {
    let sshd = Sshd::start_with("AllowStreamLocalForwarding no\n").await;
    let echo = EchoSocket::start();
    let client = connect(&sshd, &HostKeyStore::new()).await;
    let err = client.open_unix(echo.path()).await.unwrap_err();
    assert!(
        matches!(&err, ConnectError::UnixSocketRefused { path, .. } if path == echo.path()),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(echo.path()) && msg.contains("AllowStreamLocalForwarding"),
        "{msg}"
    );
}

/// Runs `script` through `exec bash -s` with a shell kept started ahead; returns its stdout.
async fn run_ready_ahead(client: &Client, script: &str) -> String {
    let (tx, rx) = mpsc::channel(16);
    let opts = RunOptions::new("exec bash --noprofile --norc -s")
        .stdin(script)
        .ready_ahead();
    let (st, (out, err)) = tokio::join!(client.run(opts, tx), Output::gather(rx));
    let st = st.unwrap();
    assert!(st.success(), "{st}: {}", String::from_utf8_lossy(&err));
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn a_shell_started_ahead_runs_the_next_script_and_yields_to_other_sessions() {
    // Two sessions at most: the spare shell takes one of them.
    let sshd = Sshd::start_with("MaxSessions 2\n").await;
    let client = connect(&sshd, &HostKeyStore::new()).await;
    // The shell's age when the script runs: /proc uptime less the process's start (ticks).
    let age = "read -r up _ < /proc/uptime; read -ra f < /proc/$$/stat; echo \"$$ $up ${f[21]}\"";
    let parse = |out: &str| {
        let v: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        (v[0] as u32, v[1] - v[2] / 100.0)
    };
    let (first_pid, _) = parse(&run_ready_ahead(&client, age).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (second_pid, second_age) = parse(&run_ready_ahead(&client, age).await);
    assert_ne!(first_pid, second_pid, "each run gets its own shell");
    // The second script ran in a shell started while the first ran, well before it was asked.
    assert!(
        second_age > 1.0,
        "the second run's shell was {second_age} s old: not started ahead"
    );
    // The spare holds a session: two more at once still run, the spare giving its place up.
    let (a, b) = tokio::join!(
        client.run_capture("sleep 0.3; echo a", Vec::new()),
        client.run_capture("sleep 0.3; echo b", Vec::new())
    );
    assert_eq!(a.unwrap().1, b"a\n");
    assert_eq!(b.unwrap().1, b"b\n");
    // With the spare gone, a run starts its shell afresh and works as before.
    let out = run_ready_ahead(&client, "echo fresh").await;
    assert_eq!(out, "fresh\n");
    client.close().await;
}
