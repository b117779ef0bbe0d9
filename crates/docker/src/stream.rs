//! Stream decoders: the multiplexed stdout/stderr frame format of attach, logs and exec, JSON
//! progress streams (pull, import), and the hijacked attach/exec connection.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncWrite, ReadHalf, WriteHalf};
use tokio_util::io::ReaderStream;

use crate::error::{Error, Result};

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;

/// One chunk of a container's or exec's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOutput {
    /// Written to stdout.
    StdOut(Bytes),
    /// Written to stderr.
    StdErr(Bytes),
    /// Echoed stdin (only with some attach options).
    StdIn(Bytes),
    /// A TTY's merged output (no stdout/stderr split with a TTY).
    Console(Bytes),
}

impl LogOutput {
    /// The chunk's bytes, whichever stream it came from.
    pub fn bytes(&self) -> &Bytes {
        match self {
            LogOutput::StdOut(b) | LogOutput::StdErr(b) | LogOutput::StdIn(b) => b,
            LogOutput::Console(b) => b,
        }
    }
}

/// Output collected to its end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectedOutput {
    /// Everything written to stdout (or the TTY).
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
}

impl CollectedOutput {
    /// stdout as (lossy) UTF-8.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as (lossy) UTF-8.
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Demultiplexes the engine's output framing (8-byte header: stream, 0, 0, 0, big-endian length),
/// or passes a TTY's raw bytes through as [`LogOutput::Console`].
pub struct LogStream {
    inner: ByteStream,
    buf: BytesMut,
    tty: bool,
}

impl fmt::Debug for LogStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStream")
            .field("tty", &self.tty)
            .field("buffered", &self.buf.len())
            .finish()
    }
}

impl LogStream {
    /// Decodes `inner`; `tty` says the producer had a TTY (raw, unframed output).
    pub fn new<S>(inner: S, tty: bool) -> Self
    where
        S: Stream<Item = Result<Bytes>> + Send + 'static,
    {
        Self {
            inner: Box::pin(inner),
            buf: BytesMut::new(),
            tty,
        }
    }

    /// Reads to the end, keeping stdout and stderr apart.
    pub async fn collect_output(mut self) -> Result<CollectedOutput> {
        let mut out = CollectedOutput::default();
        while let Some(chunk) = self.next().await {
            match chunk? {
                LogOutput::StdOut(b) | LogOutput::Console(b) => out.stdout.extend_from_slice(&b),
                LogOutput::StdErr(b) => out.stderr.extend_from_slice(&b),
                LogOutput::StdIn(_) => {}
            }
        }
        Ok(out)
    }

    fn next_frame(&mut self) -> Option<Result<LogOutput>> {
        loop {
            if self.buf.len() < 8 {
                return None;
            }
            let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
            let len = len as usize;
            if self.buf.len() < 8 + len {
                self.buf.reserve(8 + len - self.buf.len());
                return None;
            }
            let kind = self.buf[0];
            self.buf.advance(8);
            let data = self.buf.split_to(len).freeze();
            if data.is_empty() {
                continue;
            }
            return Some(match kind {
                0 => Ok(LogOutput::StdIn(data)),
                1 => Ok(LogOutput::StdOut(data)),
                2 => Ok(LogOutput::StdErr(data)),
                3 => Err(Error::Stream(String::from_utf8_lossy(&data).into_owned())),
                other => Err(Error::Stream(format!(
                    "unknown output stream {other} in multiplexed frame"
                ))),
            });
        }
    }
}

impl Stream for LogStream {
    type Item = Result<LogOutput>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.tty {
                return this
                    .inner
                    .poll_next_unpin(cx)
                    .map(|o| o.map(|r| r.map(LogOutput::Console)));
            }
            if let Some(frame) = this.next_frame() {
                return Poll::Ready(Some(frame));
            }
            match std::task::ready!(this.inner.poll_next_unpin(cx)) {
                Some(Ok(chunk)) => this.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None if this.buf.is_empty() => return Poll::Ready(None),
                None => {
                    let left = this.buf.len();
                    this.buf.clear();
                    return Poll::Ready(Some(Err(Error::Stream(format!(
                        "output stream ended inside a frame ({left} bytes left)"
                    )))));
                }
            }
        }
    }
}

/// Decodes a stream of JSON values (newline-separated or simply concatenated).
pub struct JsonStream<T> {
    inner: ByteStream,
    buf: BytesMut,
    done: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for JsonStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonStream")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

impl<T: DeserializeOwned> JsonStream<T> {
    /// Decodes `inner`.
    pub fn new<S>(inner: S) -> Self
    where
        S: Stream<Item = Result<Bytes>> + Send + 'static,
    {
        Self {
            inner: Box::pin(inner),
            buf: BytesMut::new(),
            done: false,
            _t: PhantomData,
        }
    }

    fn next_value(&mut self) -> Option<Result<T>> {
        let mut values = serde_json::Deserializer::from_slice(&self.buf).into_iter::<T>();
        match values.next() {
            None => {
                // Only whitespace buffered.
                self.buf.clear();
                None
            }
            Some(Ok(v)) => {
                let used = values.byte_offset();
                self.buf.advance(used);
                Some(Ok(v))
            }
            Some(Err(e)) if e.is_eof() && !self.done => None,
            Some(Err(source)) => {
                self.buf.clear();
                Some(Err(Error::Decode {
                    context: "JSON stream".into(),
                    source,
                }))
            }
        }
    }
}

impl<T: DeserializeOwned> Stream for JsonStream<T> {
    type Item = Result<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(v) = this.next_value() {
                return Poll::Ready(Some(v));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match std::task::ready!(this.inner.poll_next_unpin(cx)) {
                Some(Ok(chunk)) => this.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    this.done = true;
                    this.buf.clear();
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.done = true,
            }
        }
    }
}

/// A hijacked attach or exec connection: demultiplexed output, and the process's stdin.
#[derive(Debug)]
pub struct Attached {
    /// The process's output.
    pub output: LogStream,
    /// The process's stdin; `shutdown()` closes it (EOF for the process).
    pub input: AttachInput,
}

impl Attached {
    pub(crate) fn new(io: TokioIo<Upgraded>, tty: bool) -> Self {
        let (read, write) = tokio::io::split(io);
        let reader: ReaderStream<ReadHalf<TokioIo<Upgraded>>> = ReaderStream::new(read);
        let output = LogStream::new(reader.map(|r| r.map_err(Error::Io)), tty);
        Self {
            output,
            input: AttachInput(write),
        }
    }
}

/// The write side of an [`Attached`] connection.
pub struct AttachInput(WriteHalf<TokioIo<Upgraded>>);

impl fmt::Debug for AttachInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AttachInput")
    }
}

impl AsyncWrite for AttachInput {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, data: &[u8]) -> Vec<u8> {
        let mut v = vec![kind, 0, 0, 0];
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn chunks(parts: Vec<Vec<u8>>) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
        futures::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from(p))))
    }

    #[tokio::test]
    async fn demuxes_frames_split_across_chunks() {
        let mut all = frame(1, b"out1\n");
        all.extend(frame(2, b"err1\n"));
        all.extend(frame(1, b""));
        all.extend(frame(1, b"out2\n"));
        // Split at awkward places: inside a header and inside a payload.
        let parts = vec![all[..3].to_vec(), all[3..15].to_vec(), all[15..].to_vec()];
        let out = LogStream::new(chunks(parts), false)
            .collect_output()
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "out1\nout2\n");
        assert_eq!(out.stderr_str(), "err1\n");
    }

    #[tokio::test]
    async fn tty_passes_through_and_truncation_is_an_error() {
        let out = LogStream::new(chunks(vec![b"raw".to_vec()]), true)
            .collect_output()
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "raw");
        let cut = frame(1, b"hello")[..10].to_vec();
        let err = LogStream::new(chunks(vec![cut]), false)
            .collect_output()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("ended inside a frame"), "{err}");
    }

    #[tokio::test]
    async fn json_stream_handles_split_and_concatenated_values() {
        let parts = vec![
            b"{\"a\":1}\r\n{\"a\"".to_vec(),
            b":2}{\"a\":3}\n\n".to_vec(),
        ];
        let vals: Vec<serde_json::Value> = JsonStream::new(chunks(parts))
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(vals.len(), 3);
        assert_eq!(vals[2]["a"], 3);
        let bad: Vec<Result<serde_json::Value>> =
            JsonStream::new(chunks(vec![b"{\"a\":".to_vec()]))
                .collect()
                .await;
        assert!(bad[0].is_err());
    }
}
