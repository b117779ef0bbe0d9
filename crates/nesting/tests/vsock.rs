//! The hybrid-vsock dialer ([`slipway_nesting::vsock`]) against a listener playing the VMM's
//! side (Firecracker's and Cloud Hypervisor's `CONNECT <port>` handshake).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use slipway_nesting::vsock::{VsockError, connect_vsock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A listener playing the VMM's side of hybrid vsock: reads `CONNECT <port>\n`, answers
/// `reply`, then (after `OK`) sends `hello` as the guest would.
async fn vsock_peer(
    reply: &'static [u8],
) -> (tempfile::TempDir, PathBuf, tokio::task::JoinHandle<String>) {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let listener = tokio::net::UnixListener::bind(&uds).unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while s.read_exact(&mut byte).await.is_ok() && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        if !reply.is_empty() {
            // The acknowledgement and the guest's first bytes in one write: the dialer must
            // not swallow what follows the newline.
            let _ = s.write_all(reply).await;
        }
        if reply.is_empty() {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        String::from_utf8(line).unwrap()
    });
    (dir, uds, task)
}

#[tokio::test]
async fn connect_vsock_sends_connect_and_accepts_ok() {
    let (_dir, uds, peer) = vsock_peer(b"OK 1073741824\nhello").await;
    let mut stream = connect_vsock(&uds, 1024, Duration::from_secs(5))
        .await
        .unwrap();
    let mut guest = [0u8; 5];
    stream.read_exact(&mut guest).await.unwrap();
    assert_eq!(&guest, b"hello");
    assert_eq!(peer.await.unwrap(), "CONNECT 1024");
}

#[tokio::test]
async fn connect_vsock_refusals_are_errors() {
    let (_dir, uds, _peer) = vsock_peer(b"NO\n").await;
    let err = connect_vsock(&uds, 52, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, VsockError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("OK"), "{err}");

    // A peer that never answers: the timeout.
    let (silent_dir, silent, _silent_peer) = vsock_peer(b"").await;
    let err = connect_vsock(&silent, 52, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(err, VsockError::Timeout { .. }), "{err:?}");

    // Nothing at the path.
    let err = connect_vsock(
        &silent_dir.path().join("none.sock"),
        52,
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VsockError::Io { .. }), "{err:?}");
}

#[tokio::test]
async fn connect_vsock_reports_a_closed_port() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let listener = tokio::net::UnixListener::bind(&uds).unwrap();
    let peer = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 32];
        let _ = s.read(&mut buf).await;
        // Dropped without an answer, as Firecracker does for a port nobody listens on.
    });
    let err = connect_vsock(&uds, 1024, Duration::from_secs(5))
        .await
        .unwrap_err();
    peer.await.unwrap();
    assert!(err.to_string().contains("nothing listens"), "{err}");
}
