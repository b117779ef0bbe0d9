//! A remote command's stdin and stdout as one byte stream: tunnels such as
//! `docker system dial-stdio`, with no port opened and no socket file on either side.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use russh::ChannelStream;
use russh::client::Msg;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The stdin (write side) and stdout (read side) of a command on its own SSH channel; its
/// stderr is discarded. Dropping it closes the channel, which ends the command's stdin.
pub struct ExecStream {
    inner: Pin<Box<ChannelStream<Msg>>>,
    command: String,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream")
            .field("command", &self.command)
            .finish_non_exhaustive()
    }
}

impl ExecStream {
    pub(crate) fn new(inner: ChannelStream<Msg>, command: String) -> Self {
        ExecStream {
            inner: Box::pin(inner),
            command,
        }
    }
}

impl AsyncRead for ExecStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.inner.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for ExecStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.as_mut().poll_shutdown(cx)
    }
}
