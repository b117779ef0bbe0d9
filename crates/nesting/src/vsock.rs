//! Host side of Firecracker-style hybrid vsock (Firecracker and Cloud Hypervisor): the guest's
//! AF_VSOCK port is reached through the VMM's unix socket by writing `CONNECT <port>\n` and
//! reading back `OK <host port>\n`.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

/// Why reaching a guest port through a hybrid-vsock socket failed.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The socket or the guest did not answer in time.
    #[error("{what} did not answer within {after:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        after: Duration,
    },
    /// I/O on the socket, or an acknowledgement other than `OK <port>`.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Longest acknowledgement line accepted (`OK 4294967295\n` is 14 bytes).
const MAX_ACK: usize = 64;

/// Connect to guest port `port` through the hybrid-vsock socket `uds`; the returned stream
/// carries the guest connection's bytes, nothing of the handshake.
pub async fn connect_vsock(
    uds: &Path,
    port: u32,
    timeout: Duration,
) -> Result<UnixStream, VsockError> {
    match tokio::time::timeout(timeout, handshake(uds, port)).await {
        Ok(result) => result,
        Err(_) => Err(VsockError::Timeout {
            what: format!("vsock CONNECT {port} via {}", uds.display()),
            after: timeout,
        }),
    }
}

async fn handshake(uds: &Path, port: u32) -> Result<UnixStream, VsockError> {
    let stream = UnixStream::connect(uds)
        .await
        .map_err(|source| VsockError::Io {
            context: format!("vsock connect (port {port} via {})", uds.display()),
            source,
        })?;
    connect_over(stream, port, &uds.display().to_string()).await
}

/// The `CONNECT <port>` handshake over an already open connection to a hybrid-vsock socket
/// (a local one, or one forwarded from an instance); `via` names it in errors. The returned
/// stream carries only the guest connection's bytes.
pub async fn connect_over<S>(mut stream: S, port: u32, via: &str) -> Result<S, VsockError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let io = |what: &str, source: std::io::Error| VsockError::Io {
        context: format!("vsock {what} (port {port} via {via})"),
        source,
    };
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await
        .map_err(|e| io("CONNECT", e))?;
    // Every failure from here on is about the acknowledgement line.
    let bad_ack = |kind: std::io::ErrorKind, message: String| {
        io("acknowledgement", std::io::Error::new(kind, message))
    };
    // Byte by byte: anything after the newline already belongs to the guest's stream.
    let mut line = Vec::with_capacity(16);
    loop {
        let mut byte = [0u8; 1];
        let n = stream
            .read(&mut byte)
            .await
            .map_err(|e| io("acknowledgement", e))?;
        if n == 0 {
            // The VMM closes the connection when nothing listens on the guest port.
            return Err(bad_ack(
                std::io::ErrorKind::ConnectionRefused,
                format!(
                    "closed before OK (nothing listens on guest port {port}?); got {:?}",
                    String::from_utf8_lossy(&line)
                ),
            ));
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > MAX_ACK {
            return Err(bad_ack(
                std::io::ErrorKind::InvalidData,
                "line too long".to_string(),
            ));
        }
    }
    if line.starts_with(b"OK ") {
        Ok(stream)
    } else {
        Err(bad_ack(
            std::io::ErrorKind::InvalidData,
            format!(
                "expected `OK <port>`, got {:?}",
                String::from_utf8_lossy(&line)
            ),
        ))
    }
}
