//! The stream transports: `docker system dial-stdio` as a child process (what the SSH path runs
//! remotely), and an arbitrary in-memory duplex stream proxied to the socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{Cleanup, ensure_engine, run, sh};
use slipway_docker::{CommandDialer, Docker, ExecSpec, FnDialer, Transport};
use tokio::task::JoinSet;

/// Exercises a client end to end: version, a container run with separated output, an exec with
/// stdin (hijacked connection + half-close through the transport), and cleanup.
async fn exercise(docker: &Docker, cleanup: &Cleanup) {
    docker.ping().await.unwrap();
    assert!(!docker.version().await.unwrap().api_version.is_empty());

    let (code, out, _) = run(docker, &sh(cleanup, "echo via-stream; echo e >&2; exit 7")).await;
    assert_eq!(code, 7);
    assert_eq!(out.stdout_str(), "via-stream\n");
    assert_eq!(out.stderr_str(), "e\n");

    let id = docker
        .create_container(&sh(cleanup, "sleep 300"))
        .await
        .unwrap()
        .id;
    docker.start_container(&id).await.unwrap();
    let mut spec = ExecSpec::new(["sh", "-s"]);
    spec.stdin = true;
    let out = docker
        .exec_run(
            &id,
            &spec,
            Some(Bytes::from_static(b"echo from-stdin; exit 4\n")),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 4);
    assert_eq!(out.output.stdout_str(), "from-stdin\n");

    let report = docker.cleanup_by_label(&cleanup.label()).await.unwrap();
    assert_eq!(report.containers.len(), 2, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dial_stdio_child_process_transport() {
    ensure_engine();
    let cleanup = Cleanup::new("dial-stdio");
    let dialer =
        CommandDialer::docker_dial_stdio().env("DOCKER_HOST", "unix:///var/run/docker.sock");
    let docker = Docker::connect(Transport::command(dialer)).await.unwrap();
    exercise(&docker, &cleanup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dial_stdio_failure_is_a_connection_error() {
    let dialer = CommandDialer::new("/nonexistent/docker", ["system", "dial-stdio"]);
    let err = Docker::connect(Transport::command(dialer))
        .await
        .unwrap_err();
    assert!(matches!(err, slipway_docker::Error::Connect(_)), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/docker"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dial_stdio_to_a_missing_engine_reports_why() {
    let dialer =
        CommandDialer::docker_dial_stdio().env("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    let err = Docker::connect(Transport::command(dialer))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("/nonexistent/docker.sock"), "{text}");
    eprintln!("reported: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_duplex_stream_transport() {
    ensure_engine();
    let cleanup = Cleanup::new("duplex");
    // Each dial hands the client one end of a duplex pair; a proxy task owned by the test copies
    // the other end to the engine socket.
    let proxies: Arc<Mutex<JoinSet<()>>> = Arc::new(Mutex::new(JoinSet::new()));
    let dials = Arc::new(Mutex::new(0usize));
    let dialer = {
        let proxies = proxies.clone();
        let dials = dials.clone();
        FnDialer::new("duplex-proxy", move || {
            let proxies = proxies.clone();
            let dials = dials.clone();
            async move {
                let (client, mut server) = tokio::io::duplex(64 * 1024);
                let mut socket = tokio::net::UnixStream::connect("/var/run/docker.sock").await?;
                *dials.lock().unwrap() += 1;
                proxies
                    .lock()
                    .map_err(|_| io::Error::other("poisoned"))?
                    .spawn(async move {
                        let _ = tokio::io::copy_bidirectional(&mut server, &mut socket).await;
                    });
                Ok(client)
            }
        })
    };
    let docker = Docker::connect(Transport::dialer(dialer)).await.unwrap();
    exercise(&docker, &cleanup).await;
    // Sequential plain requests reuse one pooled connection rather than dialing each time.
    let before = *dials.lock().unwrap();
    for _ in 0..10 {
        docker.ping().await.unwrap();
    }
    let after = *dials.lock().unwrap();
    assert!(
        after - before <= 1,
        "dialed {} times for 10 pings",
        after - before
    );
    drop(docker);
    proxies.lock().unwrap().abort_all();
}
