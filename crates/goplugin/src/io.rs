//! A boxed byte stream, so plaintext and TLS connections share one type on both sides.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Anything usable as a gRPC connection.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A server-side connection (plaintext unix stream or TLS over it) that tonic can serve.
pub(crate) struct ServerIo(pub(crate) Box<dyn Io>);

impl std::fmt::Debug for ServerIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerIo")
    }
}

impl tonic::transport::server::Connected for ServerIo {
    // Nothing useful to report: the peer is always the one pinned host on a private socket.
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for ServerIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

/// Create a short, private (0700) temporary directory; unix socket paths are limited to ~108 bytes,
/// so a long `TMPDIR` falls back to `/tmp`.
pub(crate) async fn make_private_dir(prefix: &str) -> io::Result<PathBuf> {
    let mut base = std::env::temp_dir();
    if base.as_os_str().len() > 60 {
        base = PathBuf::from("/tmp");
    }
    let dir = base.join(format!("{prefix}-{:08x}", rand::random::<u32>()));
    let mut builder = tokio::fs::DirBuilder::new();
    builder.mode(0o700);
    builder.create(&dir).await?;
    Ok(dir)
}
