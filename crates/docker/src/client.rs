//! The [`Docker`] handle: HTTP/1.1 over dialed streams, a small keep-alive pool, API version
//! negotiation, and the request/response plumbing every resource module uses.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use http::header::{CONNECTION, CONTENT_TYPE, HOST, UPGRADE, USER_AGENT};
use http::{Method, Request, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::transport::Transport;

/// The newest Engine API version this client speaks; negotiation never goes above it.
pub const MAX_API_VERSION: ApiVersion = ApiVersion {
    major: 1,
    minor: 47,
};

/// How many idle connections the pool keeps (each may be a process or an SSH channel).
const MAX_IDLE: usize = 4;

/// An Engine API version such as `1.41`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// Major number (1).
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl FromStr for ApiVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidRequest(format!("bad API version {s:?}"));
        let (major, minor) = s.trim().split_once('.').ok_or_else(bad)?;
        Ok(Self {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A cloneable handle to one Docker Engine. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Docker {
    transport: Transport,
    version: ApiVersion,
    pool: Arc<Pool>,
}

impl fmt::Debug for Docker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Docker")
            .field("transport", &self.transport)
            .field("version", &self.version)
            .finish()
    }
}

impl Docker {
    /// Connects over `transport` and negotiates the API version (`GET /version`).
    pub async fn connect(transport: Transport) -> Result<Self> {
        let docker = Self::with_version(transport, MAX_API_VERSION);
        docker.negotiate().await
    }

    /// Connects to the local engine (`DOCKER_HOST=unix://…` or `/var/run/docker.sock`).
    pub async fn connect_local() -> Result<Self> {
        Self::connect(Transport::from_env().map_err(Error::Connect)?).await
    }

    /// A handle fixed at API `version`, without talking to the engine.
    pub fn with_version(transport: Transport, version: ApiVersion) -> Self {
        Self {
            transport,
            version,
            pool: Arc::new(Pool::default()),
        }
    }

    /// The API version requests use.
    pub fn api_version(&self) -> ApiVersion {
        self.version
    }

    /// The transport this handle dials.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Asks the engine for its versions and returns a handle using min(server, ours).
    pub async fn negotiate(self) -> Result<Self> {
        let v = self.version().await?;
        let server: ApiVersion = v.api_version.parse()?;
        let min: ApiVersion = match v.min_api_version.as_deref() {
            Some(m) => m.parse()?,
            None => server,
        };
        let chosen = server.min(MAX_API_VERSION);
        if chosen < min {
            return Err(Error::UnsupportedVersion {
                server: server.to_string(),
                min: min.to_string(),
                ours: MAX_API_VERSION.to_string(),
            });
        }
        tracing::debug!(%server, %chosen, "negotiated Docker API version");
        Ok(Self {
            version: chosen,
            ..self
        })
    }

    // ---- plumbing shared by the resource modules ----

    /// Sends `req`; a non-2xx answer becomes an [`Error`].
    pub(crate) async fn send(&self, req: Req) -> Result<ResponseBody> {
        let (status, body) = self.send_raw(req).await?;
        if status.is_success() {
            Ok(body)
        } else {
            let bytes = body.bytes().await?;
            Err(Error::from_response(status.as_u16(), &bytes))
        }
    }

    /// Sends `req` and decodes a JSON answer.
    pub(crate) async fn json<T: DeserializeOwned>(&self, req: Req) -> Result<T> {
        let context = format!("{} {}", req.method, req.path);
        let bytes = self.send(req).await?.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Decode { context, source })
    }

    /// Sends `req` and discards the answer's body.
    pub(crate) async fn empty(&self, req: Req) -> Result<()> {
        self.send(req).await?.bytes().await.map(drop)
    }

    /// Sends `req` and returns the status with the (unchecked) body.
    pub(crate) async fn send_raw(&self, req: Req) -> Result<(StatusCode, ResponseBody)> {
        let mut req = req;
        let (mut conn, reused) = self.checkout().await?;
        let retryable = reused && req.body.is_replayable();
        let first = conn.sender.send_request(self.build(&mut req, false)?).await;
        let resp = match first {
            Ok(resp) => resp,
            // A kept-alive connection the other end had already closed: try once on a new one.
            Err(e) if retryable && (e.is_canceled() || e.is_incomplete_message()) => {
                tracing::debug!(error = %e, "retrying on a fresh connection");
                let mut fresh = self.dial().await?;
                let resp = fresh
                    .sender
                    .send_request(self.build(&mut req, false)?)
                    .await?;
                conn = fresh;
                resp
            }
            Err(e) => return Err(e.into()),
        };
        let status = resp.status();
        let body = ResponseBody {
            inner: resp.into_body(),
            lease: Some(Lease {
                conn,
                pool: Arc::downgrade(&self.pool),
            }),
        };
        Ok((status, body))
    }

    /// Sends `req` asking the engine to hijack the connection (`Upgrade: tcp`), as attach and exec
    /// start do, and returns the raw bidirectional stream.
    pub(crate) async fn upgrade(&self, mut req: Req) -> Result<TokioIo<Upgraded>> {
        let (mut conn, _) = self.checkout().await?;
        let mut resp = conn
            .sender
            .send_request(self.build(&mut req, true)?)
            .await?;
        let status = resp.status();
        if status != StatusCode::SWITCHING_PROTOCOLS {
            let body = ResponseBody {
                inner: resp.into_body(),
                lease: None,
            };
            let bytes = body.bytes().await?;
            return Err(if status.is_success() {
                Error::Api {
                    status: status.as_u16(),
                    message: "engine did not upgrade the connection".into(),
                }
            } else {
                Error::from_response(status.as_u16(), &bytes)
            });
        }
        let upgraded = hyper::upgrade::on(&mut resp).await?;
        // The connection task has handed the stream over and ends on its own.
        drop(conn);
        Ok(TokioIo::new(upgraded))
    }

    fn build(&self, req: &mut Req, upgrade: bool) -> Result<Request<ReqBody>> {
        let mut uri = if req.versioned {
            format!("/v{}{}", self.version, req.path)
        } else {
            req.path.clone()
        };
        if !req.query.0.is_empty() {
            uri.push('?');
            uri.push_str(&req.query.encode());
        }
        let mut b = Request::builder()
            .method(req.method.clone())
            .uri(uri)
            .header(HOST, "docker")
            .header(
                USER_AGENT,
                concat!("slipway-docker/", env!("CARGO_PKG_VERSION")),
            );
        if upgrade {
            b = b.header(CONNECTION, "Upgrade").header(UPGRADE, "tcp");
        }
        let body = match &mut req.body {
            Body::Empty => Empty::new().map_err(|never| match never {}).boxed_unsync(),
            Body::Bytes(bytes, content_type) => {
                b = b.header(CONTENT_TYPE, *content_type);
                Full::new(bytes.clone())
                    .map_err(|never| match never {})
                    .boxed_unsync()
            }
            Body::Stream(stream, content_type) => {
                b = b.header(CONTENT_TYPE, *content_type);
                stream.take().ok_or_else(|| {
                    Error::InvalidRequest("streamed request body already sent".into())
                })?
            }
        };
        b.body(body)
            .map_err(|e| Error::InvalidRequest(format!("{} {}: {e}", req.method, req.path)))
    }

    async fn checkout(&self) -> Result<(Conn, bool)> {
        while let Some(mut conn) = self.pool.take() {
            if conn.sender.is_closed() {
                continue;
            }
            if conn.sender.is_ready() {
                return Ok((conn, true));
            }
            // Just released: the connection task may not have marked it ready yet.
            match tokio::time::timeout(Duration::from_millis(200), conn.sender.ready()).await {
                Ok(Ok(())) => return Ok((conn, true)),
                _ => continue,
            }
        }
        Ok((self.dial().await?, false))
    }

    async fn dial(&self) -> Result<Conn> {
        let stream = self.transport.dial().await.map_err(Error::Connect)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(Error::Http)?;
        let task = tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "Docker engine connection ended");
            }
        });
        Ok(Conn {
            sender,
            _task: Arc::new(TaskGuard(task)),
        })
    }
}

/// The request body type on the wire.
pub(crate) type ReqBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// A request body as the resource modules describe it.
pub(crate) enum Body {
    /// No body.
    Empty,
    /// A body held in memory, with its content type; can be sent again on a retry.
    Bytes(Bytes, &'static str),
    /// A streamed body, with its content type; sent once.
    Stream(Option<ReqBody>, &'static str),
}

impl Body {
    fn is_replayable(&self) -> bool {
        !matches!(self, Body::Stream(..))
    }
}

/// One request, relative to the versioned API root.
pub(crate) struct Req {
    method: Method,
    path: String,
    query: Query,
    body: Body,
    versioned: bool,
}

impl Req {
    /// A request for `method path` (path like `/containers/create`).
    pub(crate) fn new(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            query: Query::default(),
            body: Body::Empty,
            versioned: true,
        }
    }

    /// `GET path`.
    pub(crate) fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path)
    }

    /// `POST path`.
    pub(crate) fn post(path: impl Into<String>) -> Self {
        Self::new(Method::POST, path)
    }

    /// `DELETE path`.
    pub(crate) fn delete(path: impl Into<String>) -> Self {
        Self::new(Method::DELETE, path)
    }

    /// Sent without the `/vX.Y` prefix (`/_ping`, `/version`).
    pub(crate) fn unversioned(mut self) -> Self {
        self.versioned = false;
        self
    }

    /// Adds a query parameter.
    pub(crate) fn query(mut self, key: &str, value: impl Into<String>) -> Self {
        self.query.0.push((key.to_string(), value.into()));
        self
    }

    /// Adds a query parameter when `value` is `Some`.
    pub(crate) fn query_opt(self, key: &str, value: Option<impl Into<String>>) -> Self {
        match value {
            Some(v) => self.query(key, v),
            None => self,
        }
    }

    /// Adds `key=1` or `key=0`.
    pub(crate) fn query_bool(self, key: &str, value: bool) -> Self {
        self.query(key, if value { "1" } else { "0" })
    }

    /// Adds a `filters` parameter selecting objects with `label` (`key` or `key=value`).
    pub(crate) fn label_filter(self, label: Option<&str>) -> Self {
        match label {
            None => self,
            Some(label) => {
                let filters = serde_json::json!({ "label": [label] });
                self.query("filters", filters.to_string())
            }
        }
    }

    /// Sets a JSON body.
    pub(crate) fn json<T: Serialize + ?Sized>(mut self, body: &T) -> Result<Self> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::InvalidRequest(format!("encoding {}: {e}", self.path)))?;
        self.body = Body::Bytes(bytes.into(), "application/json");
        Ok(self)
    }

    /// Sets an in-memory body of `content_type`.
    pub(crate) fn bytes(mut self, bytes: Bytes, content_type: &'static str) -> Self {
        self.body = Body::Bytes(bytes, content_type);
        self
    }

    /// Sets a streamed body of `content_type`.
    pub(crate) fn stream(mut self, body: ReqBody, content_type: &'static str) -> Self {
        self.body = Body::Stream(Some(body), content_type);
        self
    }
}

/// Query parameters, percent-encoded on output.
#[derive(Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    fn encode(&self) -> String {
        let mut out = String::new();
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push('&');
            }
            out.push_str(&percent_encode(k, false));
            out.push('=');
            out.push_str(&percent_encode(v, false));
        }
        out
    }
}

/// Percent-encodes everything but unreserved characters (and `/`, `:` and `@` when `path`).
pub(crate) fn percent_encode(s: &str, path: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (path && matches!(b, b'/' | b':' | b'@'));
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One path segment (an ID or a name; image names keep their `/` and `:`).
pub(crate) fn seg(s: &str) -> String {
    percent_encode(s, true)
}

/// Aborts the connection task when the last user of the connection goes away.
struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One HTTP/1.1 connection: the request sender and the task driving it.
struct Conn {
    sender: SendRequest<ReqBody>,
    _task: Arc<TaskGuard>,
}

#[derive(Default)]
struct Pool {
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    fn take(&self) -> Option<Conn> {
        self.idle.lock().ok()?.pop()
    }

    fn give(&self, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(conn);
        }
    }
}

/// A connection lent to one response; back to the pool when the body was read to its end.
struct Lease {
    conn: Conn,
    pool: Weak<Pool>,
}

impl Lease {
    fn release(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give(self.conn);
        }
    }
}

/// A response body: a stream of byte chunks. Reading it to the end returns the connection to the
/// pool; dropping it early closes the connection.
pub(crate) struct ResponseBody {
    inner: Incoming,
    lease: Option<Lease>,
}

impl ResponseBody {
    /// Reads the whole body.
    pub(crate) async fn bytes(mut self) -> Result<Bytes> {
        let collected = (&mut self.inner).collect().await?.to_bytes();
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
        Ok(collected)
    }
}

impl Stream for ResponseBody {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    self.lease = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Poll::Ready(None) => {
                    if let Some(lease) = self.lease.take() {
                        lease.release();
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        let a: ApiVersion = "1.9".parse().unwrap();
        let b: ApiVersion = "1.41".parse().unwrap();
        assert!(a < b);
        assert_eq!(b.to_string(), "1.41");
        assert!("141".parse::<ApiVersion>().is_err());
    }

    #[test]
    fn encodes_query_and_path() {
        assert_eq!(
            percent_encode(r#"{"label":["a=b c"]}"#, false),
            "%7B%22label%22%3A%5B%22a%3Db%20c%22%5D%7D"
        );
        assert_eq!(seg("local/busybox:latest"), "local/busybox:latest");
        assert_eq!(seg("a b"), "a%20b");
    }
}
