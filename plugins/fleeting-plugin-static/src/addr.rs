//! Host addresses (`host`, `host:port`, `[v6]:port`) and the reachability probe.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

pub use slipway_connector::split_host_port;

/// Check that an SSH server answers at `addr` within `timeout`: TCP connect, then the first
/// bytes of its banner must be `SSH-`. Returns why not.
pub async fn probe(addr: &str, timeout: Duration) -> Result<(), String> {
    let (host, port) = split_host_port(addr, 22)?;
    let attempt = async {
        let mut s = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)
            .await
            .map_err(|e| format!("reading the SSH banner: {e}"))?;
        // Answer with a banner and close: sshd then logs a plain disconnect instead of a
        // `kex_exchange_identification` error for every probe.
        let _ = s.write_all(b"SSH-2.0-slipway_static_probe\r\n").await;
        let _ = s.shutdown().await;
        if &buf == b"SSH-" {
            Ok(())
        } else {
            Err(format!(
                "not an SSH server (banner starts with {:?})",
                String::from_utf8_lossy(&buf)
            ))
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no SSH banner within {}",
            humantime::format_duration(timeout)
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn splits() {
        assert_eq!(split_host_port("h", 22).unwrap(), ("h".into(), 22));
        assert_eq!(split_host_port("h:2222", 22).unwrap(), ("h".into(), 2222));
        assert_eq!(split_host_port("[::1]:2", 22).unwrap(), ("::1".into(), 2));
        assert_eq!(
            split_host_port("fe80::1", 22).unwrap(),
            ("fe80::1".into(), 22)
        );
        assert!(split_host_port("h:0", 22).is_err());
        assert!(split_host_port(":22", 22).is_err());
    }

    #[tokio::test]
    async fn probe_reports_why() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(b"HTTP/1.1 400\r\n").await.unwrap();
        });
        let e = probe(&addr, Duration::from_secs(5)).await.unwrap_err();
        assert!(e.contains("not an SSH server"), "{e}");
        server.await.unwrap();
        let e = probe(&addr, Duration::from_secs(5)).await.unwrap_err();
        assert!(e.contains("connect"), "{e}");
    }
}
