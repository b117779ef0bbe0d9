//! The agent client against the real `slipway-guest-agent --stdio`.
// Test helpers panic on anything unexpected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use slipway_nesting::agent::{
    AgentClient, AgentError, Exec, ExecEvent, Execution, connect_unix, wait_ready,
};
use tokio::process::{Child, Command};

/// Longest any single step may take before the test calls it a hang.
const PATIENCE: Duration = Duration::from_secs(20);

/// The agent binary: built by the workspace beside this test (`target/debug`), else built now.
fn agent_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            // target/debug/deps/agent_client-… → target/debug
            let exe = std::env::current_exe().unwrap();
            let profile_dir = exe.parent().unwrap().parent().unwrap();
            let beside = profile_dir.join("slipway-guest-agent");
            if beside.exists() {
                return beside;
            }
            // A separate target dir: the one running this test is locked by its cargo.
            let target = profile_dir.join("agent-client-test");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "slipway-guest-agent",
                    "--bin",
                    "slipway-guest-agent",
                ])
                .arg("--target-dir")
                .arg(&target)
                .status()
                .unwrap();
            assert!(status.success(), "cannot build slipway-guest-agent");
            target.join("debug").join("slipway-guest-agent")
        })
        .clone()
}

/// `slipway-guest-agent --stdio`, killed when dropped; stdin and stdout are the caller's to set.
fn agent_command() -> Command {
    let mut command = Command::new(agent_binary());
    command
        .arg("--stdio")
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// A running `--stdio` agent and a client on its stdin/stdout.
fn start_agent() -> (Child, AgentClient) {
    let mut agent = agent_command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = agent.stdout.take().unwrap();
    let stdin = agent.stdin.take().unwrap();
    (agent, AgentClient::new(tokio::io::join(stdout, stdin)))
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `args` with the default options.
fn command(args: &[&str]) -> Exec {
    Exec {
        argv: argv(args),
        ..Exec::default()
    }
}

async fn next(execution: &mut Execution) -> Option<ExecEvent> {
    tokio::time::timeout(PATIENCE, execution.events.recv())
        .await
        .expect("no event in time")
}

/// Start `exec` and take its `Started` event.
async fn started(client: &AgentClient, exec: Exec) -> Execution {
    let mut execution = client.exec(exec).await.unwrap();
    assert!(matches!(next(&mut execution).await, Some(ExecEvent::Started(pid)) if pid > 0));
    execution
}

/// What an exec wrote and how it ended.
#[derive(Debug, PartialEq, Eq)]
struct Finished {
    out: Vec<u8>,
    err: Vec<u8>,
    code: Option<i32>,
    signal: Option<i32>,
}

/// The events of a started exec up to and including its exit.
async fn until_exit(execution: &mut Execution) -> Finished {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match next(execution).await.unwrap() {
            ExecEvent::Stdout(data) => out.extend(data),
            ExecEvent::Stderr(data) => err.extend(data),
            ExecEvent::Exit { code, signal } => {
                return Finished {
                    out,
                    err,
                    code,
                    signal,
                };
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn hello_answers_with_version_and_uptime() {
    let (_agent, client) = start_agent();
    let hello = client.hello(PATIENCE).await.unwrap();
    assert_eq!(hello.version, 1);
    assert!(hello.uptime_ms > 0);
}

#[tokio::test]
async fn exec_streams_output_then_exit() {
    let (_agent, client) = start_agent();
    let mut execution = started(
        &client,
        command(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
    )
    .await;
    assert_eq!(
        until_exit(&mut execution).await,
        Finished {
            out: b"out\n".to_vec(),
            err: b"err\n".to_vec(),
            code: Some(3),
            signal: None
        }
    );
    assert_eq!(next(&mut execution).await, None, "nothing after the exit");
}

#[tokio::test]
async fn run_capture_passes_stdin_and_env_and_cwd() {
    let (_agent, client) = start_agent();
    let (code, out, err) = client
        .run_capture(argv(&["cat"]), b"some input".to_vec())
        .await
        .unwrap();
    assert_eq!(
        (code, out.as_slice(), err.as_slice()),
        (Some(0), &b"some input"[..], &b""[..])
    );

    let mut execution = started(
        &client,
        Exec {
            env: vec![("WHO".into(), "guest".into())],
            cwd: Some("/".into()),
            ..command(&["sh", "-c", "echo \"$WHO\"; pwd"])
        },
    )
    .await;
    assert_eq!(until_exit(&mut execution).await.out, b"guest\n/\n");
}

#[tokio::test]
async fn keep_stdin_takes_more_input_until_eof() {
    let (_agent, client) = start_agent();
    let mut execution = started(
        &client,
        Exec {
            stdin: Some(b"one ".to_vec()),
            keep_stdin: true,
            ..command(&["cat"])
        },
    )
    .await;
    // cat echoes while stdin is still open.
    let mut out = Vec::new();
    while out != b"one " {
        match next(&mut execution).await.unwrap() {
            ExecEvent::Stdout(data) => out.extend(data),
            other => panic!("unexpected {other:?}"),
        }
    }
    client
        .stdin(execution.id, Some(b"two".to_vec()), false)
        .await
        .unwrap();
    client.stdin(execution.id, None, true).await.unwrap();
    let rest = until_exit(&mut execution).await;
    assert_eq!((rest.code, rest.err.as_slice()), (Some(0), &b""[..]));
    out.extend(rest.out);
    assert_eq!(out, b"one two");
}

#[tokio::test]
async fn signal_kills_the_process_group() {
    let (_agent, client) = start_agent();
    let mut execution = started(&client, command(&["sh", "-c", "sleep 100 & wait"])).await;
    let started = Instant::now();
    client.signal(execution.id, 15).await.unwrap();
    // Only once the background sleep, holding stdout, is dead too.
    assert_eq!(
        next(&mut execution).await,
        Some(ExecEvent::Exit {
            code: None,
            signal: Some(15)
        })
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn concurrent_execs_get_their_own_output() {
    let (_agent, client) = start_agent();
    let client = Arc::new(client);
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..8 {
        let client = Arc::clone(&client);
        tasks.spawn(async move {
            let script = format!("for i in 1 2 3; do echo {n}-$i; sleep 0.05; done; exit {n}");
            let result = client
                .run_capture(argv(&["sh", "-c", &script]), Vec::new())
                .await;
            (n, result)
        });
    }
    let started = Instant::now();
    while let Some(joined) = tasks.join_next().await {
        let (n, result) = joined.unwrap();
        let (code, out, _) = result.unwrap();
        assert_eq!(code, Some(n));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{n}-1\n{n}-2\n{n}-3\n")
        );
    }
    assert!(started.elapsed() < PATIENCE);
}

#[tokio::test]
async fn a_missing_program_is_refused() {
    let (_agent, client) = start_agent();
    let result = client
        .run_capture(argv(&["/nonexistent/program"]), Vec::new())
        .await;
    assert!(
        matches!(&result, Err(AgentError::Refused(message)) if message.contains("/nonexistent/program")),
        "{result:?}"
    );
    // The connection is still good.
    client.hello(PATIENCE).await.unwrap();
}

#[tokio::test]
async fn dropping_the_client_ends_event_streams() {
    let (_agent, client) = start_agent();
    let mut execution = started(&client, command(&["sleep", "100"])).await;
    drop(client);
    assert_eq!(next(&mut execution).await, None);
}

#[tokio::test]
async fn killing_the_agent_fails_pending_requests() {
    let (mut agent, client) = start_agent();
    let client = Arc::new(client);
    let pending = {
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            client
                .run_capture(argv(&["sleep", "100"]), Vec::new())
                .await
        })
    };
    let mut execution = started(&client, command(&["sleep", "100"])).await;
    agent.kill().await.unwrap();
    let result = tokio::time::timeout(PATIENCE, pending)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(AgentError::Closed)), "{result:?}");
    assert_eq!(next(&mut execution).await, None);
    assert!(matches!(
        client.hello(PATIENCE).await,
        Err(AgentError::Closed)
    ));
    assert!(matches!(
        client.exec(command(&["true"])).await,
        Err(AgentError::Closed)
    ));
}

#[tokio::test]
async fn hello_times_out_when_nobody_answers() {
    let (host, _silent_guest) = tokio::io::duplex(1 << 16);
    let client = AgentClient::new(host);
    let started = Instant::now();
    let result = client.hello(Duration::from_millis(200)).await;
    assert!(matches!(result, Err(AgentError::Timeout(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A socket that appears late and an agent that starts reading later still: `wait_ready` keeps
/// trying and keeps the connection across unanswered hellos.
#[tokio::test]
async fn wait_ready_waits_for_a_late_agent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listen_at = path.clone();
    let guest = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let listener = tokio::net::UnixListener::bind(&listen_at).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        // The guest is still booting: nothing reads the connection yet.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let stream: OwnedFd = stream.into_std().unwrap().into();
        let stream = std::os::unix::net::UnixStream::from(stream);
        stream.set_nonblocking(false).unwrap();
        let reader = stream.try_clone().unwrap();
        agent_command()
            .stdin(Stdio::from(OwnedFd::from(reader)))
            .stdout(Stdio::from(OwnedFd::from(stream)))
            .spawn()
            .unwrap()
    });
    let (client, hello, took) = wait_ready(&path, PATIENCE).await.unwrap();
    assert_eq!(hello.version, 1);
    assert!(took >= Duration::from_millis(1800), "{took:?}");
    assert!(took < PATIENCE);
    let (code, out, _) = client
        .run_capture(argv(&["echo", "ready"]), Vec::new())
        .await
        .unwrap();
    assert_eq!((code, out.as_slice()), (Some(0), &b"ready\n"[..]));
    drop(client);
    let _agent = guest.await.unwrap();
}

#[tokio::test]
async fn wait_ready_gives_up_after_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.sock");
    let started = Instant::now();
    let result = wait_ready(&path, Duration::from_millis(400)).await;
    assert!(
        matches!(&result, Err(AgentError::NotReady { waited, .. }) if *waited >= Duration::from_millis(400)),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        connect_unix(&path).await,
        Err(AgentError::Connect { .. })
    ));
}
