//! A fault-injecting HTTP proxy on loopback in front of moto: answers chosen AWS actions with
//! throttling, 503 or capacity errors (the first N calls, or always) and forwards everything
//! else.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Which error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// HTTP 400 `Throttling` (Auto Scaling) / 503 `RequestLimitExceeded` (EC2).
    Throttle,
    /// HTTP 503 `ServiceUnavailable`.
    Unavailable,
    /// HTTP 400 `InsufficientInstanceCapacity`: the zone has none of the instance type (not
    /// retried by the SDK).
    NoCapacity,
}

#[derive(Debug)]
struct Fault {
    kind: FaultKind,
    // None = every call.
    remaining: Option<u32>,
}

#[derive(Debug, Default)]
struct State {
    faults: HashMap<String, Fault>,
    hits: HashMap<String, u32>,
}

/// The proxy; stops (with its connections) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`, to use as the endpoint URL.
    pub url: String,
    state: Arc<Mutex<State>>,
    tasks: JoinSet<()>,
}

impl FaultProxy {
    /// Listen on a free loopback port and forward to `upstream` (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str) -> std::io::Result<FaultProxy> {
        let upstream = upstream
            .strip_prefix("http://")
            .ok_or_else(|| std::io::Error::other("upstream must be http://"))?
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::default()));
        let mut tasks = JoinSet::new();
        let shared = Arc::clone(&state);
        tasks.spawn(async move {
            // Connection tasks live in this set: aborting the accept loop drops them too.
            let mut conns = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                while conns.try_join_next().is_some() {}
                let state = Arc::clone(&shared);
                let upstream = upstream.clone();
                conns.spawn(async move {
                    let service =
                        service_fn(move |req| handle(req, Arc::clone(&state), upstream.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(FaultProxy { url, state, tasks })
    }

    /// Fail the first `times` calls of `action` (None = every call).
    pub fn fail(&self, action: &str, kind: FaultKind, times: Option<u32>) {
        let mut s = self.lock();
        s.faults.insert(
            action.into(),
            Fault {
                kind,
                remaining: times,
            },
        );
    }

    /// Stop injecting faults.
    pub fn heal(&self) {
        self.lock().faults.clear();
    }

    /// How many calls of `action` reached the proxy (failed or forwarded).
    pub fn hits(&self, action: &str) -> u32 {
        *self.lock().hits.get(action).unwrap_or(&0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// The AWS action of a request: `Action=` of a Query-protocol body, or the JSON target header.
fn action(headers: &hyper::HeaderMap, body: &[u8]) -> String {
    if let Some(target) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        return target.rsplit('.').next().unwrap_or(target).to_owned();
    }
    String::from_utf8_lossy(body)
        .split('&')
        .find_map(|kv| kv.strip_prefix("Action="))
        .unwrap_or_default()
        .to_owned()
}

fn error_response(kind: FaultKind, ec2: bool) -> Response<Full<Bytes>> {
    let (status, code, message) = match (kind, ec2) {
        (FaultKind::Throttle, false) => (StatusCode::BAD_REQUEST, "Throttling", "Rate exceeded"),
        (FaultKind::Throttle, true) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "RequestLimitExceeded",
            "Request limit exceeded.",
        ),
        (FaultKind::Unavailable, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "Service is unavailable. Try again later.",
        ),
        (FaultKind::NoCapacity, _) => (
            StatusCode::BAD_REQUEST,
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient capacity in the Availability Zone you requested.",
        ),
    };
    // The two Query-protocol error shapes: EC2's own and the generic awsQuery one.
    let body = if ec2 {
        format!(
            "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>\
             </Errors><RequestID>fault</RequestID></Response>"
        )
    } else {
        format!(
            "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>\
             <Message>{message}</Message></Error><RequestId>fault</RequestId></ErrorResponse>"
        )
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("text/xml"),
    );
    resp
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    upstream: String,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(bad_gateway()),
    };
    let action = action(&parts.headers, &body);
    let ec2 = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("/ec2/aws4_request"));
    let fault = {
        let mut s = state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *s.hits.entry(action.clone()).or_default() += 1;
        match s.faults.get_mut(&action) {
            Some(f) => match &mut f.remaining {
                None => Some(f.kind),
                Some(0) => None,
                Some(n) => {
                    *n -= 1;
                    Some(f.kind)
                }
            },
            None => None,
        }
    };
    if let Some(kind) = fault {
        return Ok(error_response(kind, ec2));
    }
    Ok(forward(parts, body, &upstream)
        .await
        .unwrap_or_else(|_| bad_gateway()))
}

fn bad_gateway() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn forward(
    parts: hyper::http::request::Parts,
    body: Bytes,
    upstream: &str,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let stream = tokio::net::TcpStream::connect(upstream).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let req = Request::from_parts(parts, Full::new(body));
    // Drive the connection while the request runs; both end with this function.
    let (resp, _) = tokio::join!(
        async {
            let resp = sender.send_request(req).await?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            drop(sender);
            Ok::<_, BoxError>(Response::from_parts(parts, Full::new(bytes)))
        },
        conn
    );
    resp
}
