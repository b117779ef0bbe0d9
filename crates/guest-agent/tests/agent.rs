//! The agent loop over a socketpair, with real child processes.
// Test helpers panic on anything unexpected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use slipway_guest_agent::frame::{MAX_CHUNK, Reply, Request};
use slipway_guest_agent::serve::{Config, Summary, serve_with};

/// The host end of a socketpair whose other end an agent thread serves.
struct Host {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    agent: JoinHandle<std::io::Result<Summary>>,
}

/// Everything one exec produced.
#[derive(Debug, Default)]
struct Outcome {
    pid: Option<u32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<(Option<i32>, Option<i32>)>,
    error: Option<String>,
}

impl Host {
    fn start() -> Host {
        let (stream, agent) = UnixStream::pair().unwrap();
        let agent_reader = agent.try_clone().unwrap();
        // Never touch the test machine's clock.
        let config = Config { set_clock: false };
        let agent = thread::spawn(move || serve_with(agent_reader, agent, &config));
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Host {
            stream,
            reader,
            agent,
        }
    }

    fn send(&mut self, request: &Request) {
        self.stream.write_all(&request.encode().unwrap()).unwrap();
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn recv(&mut self) -> Reply {
        let mut line = Vec::new();
        let n = self.reader.read_until(b'\n', &mut line).unwrap();
        assert!(n > 0, "agent closed the stream");
        assert_eq!(line.last(), Some(&b'\n'), "frames end with a newline");
        Reply::decode(&line).unwrap()
    }

    /// Replies until every id in `ids` has its exit or error, checking each id's frame order.
    fn collect(&mut self, ids: &[u64]) -> HashMap<u64, Outcome> {
        let mut outcomes: HashMap<u64, Outcome> =
            ids.iter().map(|id| (*id, Outcome::default())).collect();
        let done = |o: &Outcome| o.exit.is_some() || o.error.is_some();
        while !outcomes.values().all(done) {
            let reply = self.recv();
            let outcome = outcomes
                .get_mut(&reply.id())
                .unwrap_or_else(|| panic!("reply for an unexpected id: {reply:?}"));
            assert!(!done(outcome), "frame after the last one: {reply:?}");
            match reply {
                Reply::Started { pid, .. } => {
                    assert!(outcome.pid.is_none(), "started twice");
                    outcome.pid = Some(pid);
                }
                Reply::Stdout { data, .. } => {
                    assert!(outcome.pid.is_some(), "output before started");
                    assert!(!data.is_empty() && data.len() <= MAX_CHUNK);
                    outcome.stdout.extend(data);
                }
                Reply::Stderr { data, .. } => {
                    assert!(outcome.pid.is_some(), "output before started");
                    assert!(!data.is_empty() && data.len() <= MAX_CHUNK);
                    outcome.stderr.extend(data);
                }
                Reply::Exit { code, signal, .. } => {
                    assert!(outcome.pid.is_some(), "exit before started");
                    outcome.exit = Some((code, signal));
                }
                Reply::Error { message, .. } => {
                    assert!(outcome.pid.is_none(), "error after started");
                    outcome.error = Some(message);
                }
                Reply::Hello { .. } | Reply::Renewed { .. } => panic!("unexpected {reply:?}"),
            }
        }
        outcomes
    }

    fn run(&mut self, request: Request) -> Outcome {
        let id = request.id();
        self.send(&request);
        self.collect(&[id]).remove(&id).unwrap()
    }

    /// Hang up and wait for the agent loop to return.
    fn finish(self) -> Summary {
        self.stream.shutdown(Shutdown::Write).unwrap();
        self.agent.join().unwrap().unwrap()
    }
}

fn exec(id: u64, argv: &[&str]) -> Request {
    Request::Exec {
        id,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        cwd: None,
        stdin: None,
        keep_stdin: false,
    }
}

fn with_stdin(mut request: Request, data: &[u8]) -> Request {
    if let Request::Exec { stdin, .. } = &mut request {
        *stdin = Some(data.to_vec());
    }
    request
}

fn sh(id: u64, script: &str) -> Request {
    exec(id, &["sh", "-c", script])
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    !matches!(state, Some(Some('Z' | 'X')))
}

fn wait_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still alive");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The pid a script printed first (`echo $!`).
fn first_line_pid(host: &mut Host, id: u64) -> u32 {
    let mut out = Vec::new();
    loop {
        match host.recv() {
            Reply::Started { id: got, .. } => assert_eq!(got, id),
            Reply::Stdout { id: got, data } => {
                assert_eq!(got, id);
                out.extend(data);
                if let Some(line) = out
                    .split(|&b| b == b'\n')
                    .next()
                    .filter(|_| out.contains(&b'\n'))
                {
                    return String::from_utf8_lossy(line).trim().parse().unwrap();
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn hello_reports_version_and_uptime() {
    let mut host = Host::start();
    host.send(&Request::Hello {
        id: 1,
        unix_time: now(),
    });
    match host.recv() {
        Reply::Hello {
            id,
            version,
            uptime_ms,
        } => {
            assert_eq!((id, version), (1, 1));
            assert!(uptime_ms > 0);
        }
        other => panic!("unexpected {other:?}"),
    }
    // A stale clock (a restored snapshot) is answered as well.
    host.send(&Request::Hello {
        id: 2,
        unix_time: 0,
    });
    assert!(matches!(host.recv(), Reply::Hello { id: 2, .. }));
    assert_eq!(host.finish().frames, 2);
}

#[test]
fn exec_streams_stdout_stderr_and_exit_code() {
    let mut host = Host::start();
    let outcome = host.run(sh(1, "echo out; echo err >&2; exit 3"));
    assert!(outcome.pid.is_some());
    assert_eq!(outcome.stdout, b"out\n");
    assert_eq!(outcome.stderr, b"err\n");
    assert_eq!(outcome.exit, Some((Some(3), None)));
    assert_eq!(host.finish().execs, 1);
}

#[test]
fn stdin_is_passed_through_and_closed() {
    let mut host = Host::start();
    let outcome = host.run(with_stdin(exec(1, &["cat"]), b"hello\n"));
    assert_eq!(outcome.stdout, b"hello\n");
    assert_eq!(outcome.exit, Some((Some(0), None)));

    // More than a pipe holds in both directions: no deadlock, chunks stay within the limit.
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let outcome = host.run(with_stdin(exec(2, &["cat"]), &big));
    assert_eq!(outcome.stdout.len(), big.len());
    assert!(outcome.stdout == big);
    assert_eq!(outcome.exit, Some((Some(0), None)));

    // Without stdin the process reads EOF at once rather than hanging.
    let outcome = host.run(exec(3, &["cat"]));
    assert_eq!(outcome.stdout, b"");
    assert_eq!(outcome.exit, Some((Some(0), None)));
    host.finish();
}

#[test]
fn keep_stdin_takes_stdin_frames_until_eof() {
    let mut host = Host::start();
    host.send(&Request::Exec {
        id: 5,
        argv: vec!["cat".into()],
        env: vec![],
        cwd: None,
        stdin: Some(b"first ".to_vec()),
        keep_stdin: true,
    });
    assert!(matches!(host.recv(), Reply::Started { id: 5, .. }));
    host.send(&Request::Stdin {
        id: 5,
        data: Some(b"second ".to_vec()),
        eof: false,
    });
    host.send(&Request::Stdin {
        id: 5,
        data: Some(b"third".to_vec()),
        eof: false,
    });
    host.send(&Request::Stdin {
        id: 5,
        data: None,
        eof: true,
    });
    let mut out = Vec::new();
    loop {
        match host.recv() {
            Reply::Stdout { id: 5, data } => out.extend(data),
            Reply::Exit { id: 5, code, .. } => {
                assert_eq!(code, Some(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(out, b"first second third");
    host.finish();
}

#[test]
fn env_and_cwd_are_honoured() {
    let mut host = Host::start();
    let dir = std::env::temp_dir().canonicalize().unwrap();
    let outcome = host.run(Request::Exec {
        id: 1,
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo \"$GREETING\"; pwd; test -n \"$PATH\" && test -n \"$HOME\"".into(),
        ],
        env: vec![("GREETING".into(), "hello world".into())],
        cwd: Some(dir.to_string_lossy().into_owned()),
        stdin: None,
        keep_stdin: false,
    });
    assert_eq!(
        String::from_utf8(outcome.stdout).unwrap(),
        format!("hello world\n{}\n", dir.display())
    );
    assert_eq!(outcome.exit, Some((Some(0), None)));

    let outcome = host.run(Request::Exec {
        id: 2,
        argv: vec!["true".into()],
        env: vec![],
        cwd: Some("/nonexistent/dir".into()),
        stdin: None,
        keep_stdin: false,
    });
    assert!(outcome.error.is_some(), "{outcome:?}");
    host.finish();
}

#[test]
fn signal_kills_the_whole_process_group() {
    let mut host = Host::start();
    host.send(&sh(7, "sleep 100 & echo $!; wait"));
    let sleep_pid = first_line_pid(&mut host, 7);
    assert!(alive(sleep_pid));
    host.send(&Request::Signal { id: 7, signal: 9 });
    // The exit only comes once the background sleep, holding stdout, is gone too.
    let exit = loop {
        match host.recv() {
            Reply::Exit {
                id: 7,
                code,
                signal,
            } => break (code, signal),
            Reply::Stdout { id: 7, .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(exit, (None, Some(9)));
    wait_dead(sleep_pid);

    // A signal for an exec that is not running is ignored; the agent goes on.
    host.send(&Request::Signal { id: 7, signal: 15 });
    let outcome = host.run(sh(8, "exit 0"));
    assert_eq!(outcome.exit, Some((Some(0), None)));
    host.finish();
}

#[test]
fn concurrent_execs_interleave() {
    let mut host = Host::start();
    let ids = [11, 12, 13, 14];
    for id in ids {
        host.send(&Request::Exec {
            id,
            argv: vec![
                "sh".into(),
                "-c".into(),
                "for i in 1 2 3; do echo \"$NAME-$i\"; echo \"e$NAME\" >&2; sleep 0.5; done; exit $CODE"
                    .into(),
            ],
            env: vec![
                ("NAME".into(), format!("n{id}")),
                ("CODE".into(), (id - 10).to_string()),
            ],
            cwd: None,
            stdin: None,
            keep_stdin: false,
        });
    }
    let started = Instant::now();
    let outcomes = host.collect(&ids);
    // Run side by side, not one after another (4 × 1.5 s = 6 s); the margin is for a loaded
    // machine.
    assert!(started.elapsed() < Duration::from_millis(4500));
    for id in ids {
        let outcome = &outcomes[&id];
        assert_eq!(
            String::from_utf8_lossy(&outcome.stdout),
            format!("n{id}-1\nn{id}-2\nn{id}-3\n")
        );
        assert_eq!(
            String::from_utf8_lossy(&outcome.stderr),
            format!("en{id}\n").repeat(3)
        );
        assert_eq!(outcome.exit, Some((Some(id as i32 - 10), None)));
    }
    assert_eq!(host.finish().execs, 4);
}

#[test]
fn garbage_lines_are_skipped() {
    let mut host = Host::start();
    // Half a frame (as after a snapshot restore), binary noise, an empty line, a non-frame.
    host.send_raw(b"lo\",\"id\":1,\"unix_time\":5}\n\xff\xfe\x00junk\n\n[1,2]\n");
    host.send(&Request::Hello {
        id: 2,
        unix_time: now(),
    });
    assert!(matches!(host.recv(), Reply::Hello { id: 2, .. }));
    let summary = host.finish();
    assert_eq!((summary.frames, summary.skipped), (1, 3));
}

#[test]
fn unknown_op_is_answered_with_an_error() {
    let mut host = Host::start();
    host.send_raw(b"{\"op\":\"reboot\",\"id\":9}\n");
    match host.recv() {
        Reply::Error { id, message } => {
            assert_eq!(id, 9);
            assert!(message.starts_with("unknown op"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // A known op with bad fields is answered too.
    host.send_raw(b"{\"op\":\"exec\",\"id\":10,\"argv\":\"ls\"}\n");
    assert!(matches!(host.recv(), Reply::Error { id: 10, .. }));
    host.finish();
}

#[test]
fn a_missing_program_is_an_error() {
    let mut host = Host::start();
    let outcome = host.run(exec(3, &["/nonexistent/program", "arg"]));
    assert!(outcome.pid.is_none());
    let message = outcome.error.unwrap();
    assert!(message.contains("/nonexistent/program"), "{message}");
    let outcome = host.run(exec(4, &[]));
    assert_eq!(outcome.error.as_deref(), Some("empty argv"));
    assert_eq!(host.finish().execs, 0);
}

#[test]
fn hanging_up_kills_what_still_runs() {
    let mut host = Host::start();
    host.send(&sh(1, "sleep 100 & echo $!; wait"));
    let sleep_pid = first_line_pid(&mut host, 1);
    let started = Instant::now();
    let summary = host.finish();
    assert_eq!(summary.execs, 1);
    wait_dead(sleep_pid);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn the_binary_serves_stdio() {
    let binary = env!("CARGO_BIN_EXE_slipway-guest-agent");
    let version = Command::new(binary).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("slipway-guest-agent "));

    let mut agent = Command::new(binary)
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = agent.stdin.take().unwrap();
    let mut stdout = BufReader::new(agent.stdout.take().unwrap());
    stdin
        .write_all(&sh(1, "echo hi").encode().unwrap())
        .unwrap();
    let mut replies = Vec::new();
    loop {
        let mut line = Vec::new();
        stdout.read_until(b'\n', &mut line).unwrap();
        let reply = Reply::decode(&line).unwrap();
        let last = matches!(reply, Reply::Exit { .. });
        replies.push(reply);
        if last {
            break;
        }
    }
    assert!(matches!(replies[0], Reply::Started { id: 1, .. }));
    assert_eq!(
        replies[1],
        Reply::Stdout {
            id: 1,
            data: b"hi\n".to_vec()
        }
    );
    drop(stdin);
    assert!(agent.wait().unwrap().success());
}
