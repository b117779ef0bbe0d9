//! SSH channels as byte streams, with no port opened on either side:
//!
//! - [`ExecStream`]: a remote command's stdin and stdout (tunnels such as
//!   `docker system dial-stdio`).
//! - [`ForwardedStream`]: a connection to a unix socket on the instance, made by its sshd
//!   (OpenSSH's `direct-streamlocal@openssh.com`), for gRPC or line protocols to agents there.

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

/// A connection to a unix socket on the instance, carried by an SSH channel.
///
/// Reads return 0 once the far end has closed its side (the socket's peer shut down or
/// closed); [`AsyncWriteExt::shutdown`](tokio::io::AsyncWriteExt::shutdown) sends EOF, so the
/// peer reads end-of-file while replies can still arrive. Dropping it closes the channel.
pub struct ForwardedStream {
    inner: Pin<Box<ChannelStream<Msg>>>,
    path: String,
}

impl std::fmt::Debug for ForwardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedStream")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ForwardedStream {
    pub(crate) fn new(inner: ChannelStream<Msg>, path: String) -> Self {
        ForwardedStream {
            inner: Box::pin(inner),
            path,
        }
    }

    /// Path of the socket on the instance.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// Both stream types are a channel stream with a label: delegate the I/O traits to it.
macro_rules! channel_io {
    ($ty:ty) => {
        impl AsyncRead for $ty {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.inner.as_mut().poll_read(cx, buf)
            }
        }

        impl AsyncWrite for $ty {
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

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                self.inner.as_mut().poll_shutdown(cx)
            }
        }
    };
}

channel_io!(ExecStream);
channel_io!(ForwardedStream);
