//! The manager's HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, and the status page
//! (`/`) with its JSON (`/api/v1/status`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::IntoResponse;
use axum::routing::get;
use base64::Engine as _;
use prometheus_client::registry::Registry;
use slipway_status::FleetStatus;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often the page refreshes itself.
const PAGE_REFRESH_MS: u64 = 2000;
/// Answers at least this large are gzipped for clients that accept it (a fleet's status is
/// hundreds of kB, refreshed every few seconds, often over a slow link).
const GZIP_FROM: usize = 16 * 1024;

/// Every metric family the manager exports: the taskscalers' and the jobs'.
pub fn registry(
    families: &slipway_taskscaler::metrics::MetricFamilies,
    jobs: &slipway_status::JobMetrics,
) -> Registry {
    let mut registry = Registry::default();
    families.register(&mut registry);
    jobs.register(&mut registry);
    registry
}

/// What the status page and its JSON are made from.
pub type StatusFn = Arc<dyn Fn() -> FleetStatus + Send + Sync>;

/// The status page's settings.
#[derive(Clone)]
pub struct StatusRoutes {
    /// Builds the fleet's status on each request.
    pub status: StatusFn,
    /// When set, `/` and `/api/v1/status` need it (Bearer, Basic password or `?token=`).
    pub token: Option<String>,
}

impl std::fmt::Debug for StatusRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusRoutes")
            .field("token", &self.token.as_ref().map(|_| slipway_job::MASK))
            .finish_non_exhaustive()
    }
}

/// Why the HTTP server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address cannot be listened on (taken, say, or not an address).
    #[error("listen_address {addr:?}: cannot listen")]
    Listen {
        /// `listen_address` as configured.
        addr: String,
        /// Why.
        #[source]
        cause: std::io::Error,
    },
    /// The listening socket has no address to report.
    #[error(transparent)]
    LocalAddr(std::io::Error),
}

/// A running HTTP server; stopped by [`Server::stop`].
#[derive(Debug)]
pub struct Server {
    /// The address it listens on (useful when port 0 was asked for).
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    /// Listen on `addr` and serve `registry`, and the status page when `status` is given.
    pub async fn start(
        addr: &str,
        registry: Registry,
        status: Option<StatusRoutes>,
    ) -> Result<Server, ServerError> {
        let bound = tokio::net::TcpListener::bind(addr).await;
        let listener = bound.map_err(|cause| ServerError::Listen {
            addr: addr.to_string(),
            cause,
        })?;
        let addr = listener.local_addr().map_err(ServerError::LocalAddr)?;
        let registry = Arc::new(registry);
        let mut app = Router::new()
            .route(
                "/metrics",
                get(move || {
                    let registry = registry.clone();
                    async move { metrics(&registry) }
                }),
            )
            .route("/healthz", get(|| async { "ok\n" }));
        if let Some(status) = status {
            let pages = Router::new()
                .route("/", get(page))
                .route("/api/v1/status", get(status_json))
                .with_state(Arc::new(status));
            app = app.merge(pages);
        }
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
        tracing::info!(%addr, "serving /metrics and the status page");
        Ok(Server { addr, stop, task })
    }

    /// Stop serving and wait for the server task.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn page(
    State(s): State<Arc<StatusRoutes>>,
    headers: HeaderMap,
    uri: Uri,
) -> axum::response::Response {
    if let Some(refused) = refuse(&s, &headers, &uri) {
        return refused;
    }
    let html = slipway_status::page::render(&(s.status)(), PAGE_REFRESH_MS);
    answer("text/html; charset=utf-8", html.into_bytes(), &headers)
}

/// A 200 answer, gzipped when it is large and the client accepts gzip.
fn answer(
    content_type: &'static str,
    body: Vec<u8>,
    headers: &HeaderMap,
) -> axum::response::Response {
    let accepts_gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(accepts_gzip);
    let plain = [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-store"),
        (header::VARY, "accept-encoding"),
    ];
    if !accepts_gzip || body.len() < GZIP_FROM {
        return (StatusCode::OK, plain, body).into_response();
    }
    match gzip(&body) {
        Ok(zipped) => (
            StatusCode::OK,
            plain,
            [(header::CONTENT_ENCODING, "gzip")],
            zipped,
        )
            .into_response(),
        // Compression into memory does not fail in practice; the plain body still serves.
        Err(_) => (StatusCode::OK, plain, body).into_response(),
    }
}

/// Whether an `Accept-Encoding` value allows gzip: listed, and not with `q=0`.
fn accepts_gzip(value: &str) -> bool {
    value.split(',').any(|item| {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        coding.eq_ignore_ascii_case("gzip") && q > 0.0
    })
}

/// `body` gzipped at the fastest level: the point is fewer bytes on the wire, not the fewest.
fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    enc.write_all(body)?;
    enc.finish()
}

async fn status_json(
    State(s): State<Arc<StatusRoutes>>,
    headers: HeaderMap,
    uri: Uri,
) -> axum::response::Response {
    if let Some(refused) = refuse(&s, &headers, &uri) {
        return refused;
    }
    match serde_json::to_vec(&(s.status)()) {
        Ok(body) => answer("application/json", body, &headers),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("encoding the status: {e}\n"),
        )
            .into_response(),
    }
}

/// `None` when the request may see the status; else the 401 to send.
fn refuse(s: &StatusRoutes, headers: &HeaderMap, uri: &Uri) -> Option<axum::response::Response> {
    let want = s.token.as_deref()?;
    let given = presented_token(headers, uri);
    if given.is_some_and(|g| same(g.as_bytes(), want.as_bytes())) {
        return None;
    }
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Basic realm=\"slipway\""),
                (header::CONTENT_TYPE, "text/plain"),
            ],
            "the status page needs [status_page] token: as a Bearer token, a Basic password or ?token=\n",
        )
            .into_response(),
    )
}

/// The token a request presents: `Authorization: Bearer T`, Basic auth with password `T`, or
/// the `token` query parameter.
fn presented_token(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '));
    if let Some((scheme, value)) = auth {
        // Schemes are case-insensitive (RFC 9110).
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(value.trim().to_string());
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let password = base64::engine::general_purpose::STANDARD
                .decode(value.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .and_then(|t| t.split_once(':').map(|(_, p)| p.to_string()));
            if password.is_some() {
                return password;
            }
        }
    }
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "token").then(|| percent_decode(v))
    })
}

/// `%XX` and `+` decoded (a token typed into a URL).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Equal in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn metrics(registry: &Registry) -> axum::response::Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn a_token_is_taken_from_bearer_basic_or_the_query() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert_eq!(presented_token(&h, &uri("/")).as_deref(), Some("s3cret"));
        let basic = base64::engine::general_purpose::STANDARD.encode("ops:s3cret");
        h.insert(
            header::AUTHORIZATION,
            format!("Basic {basic}").parse().unwrap(),
        );
        assert_eq!(presented_token(&h, &uri("/")).as_deref(), Some("s3cret"));
        let none = HeaderMap::new();
        assert_eq!(
            presented_token(&none, &uri("/api/v1/status?x=1&token=a%2Bb+c")).as_deref(),
            Some("a+b c")
        );
        assert_eq!(presented_token(&none, &uri("/?token")), None);
        // Any case of the scheme; a broken Basic header still lets the query speak.
        h.insert(header::AUTHORIZATION, "bearer s3cret".parse().unwrap());
        assert_eq!(presented_token(&h, &uri("/")).as_deref(), Some("s3cret"));
        h.insert(header::AUTHORIZATION, "Basic !!!".parse().unwrap());
        assert_eq!(
            presented_token(&h, &uri("/?token=s3cret")).as_deref(),
            Some("s3cret")
        );
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn large_answers_are_gzipped_for_clients_that_accept_it() {
        use std::io::Read as _;
        let body = "{\"instances\":[]}".repeat(2000).into_bytes();
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, "br, gzip;q=0.8".parse().unwrap());
        let r = answer("application/json", body.clone(), &h);
        assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
        let zipped = futures_bytes(r);
        assert!(zipped.len() < body.len() / 10, "{}", zipped.len());
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&zipped[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, body);
        // Small answers, and clients that do not ask, get it plain.
        let r = answer("application/json", b"{}".to_vec(), &h);
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
        let r = answer("application/json", body.clone(), &HeaderMap::new());
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
        for refused in ["gzipx, identity", "gzip;q=0", "gzip; q=0.0, br"] {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT_ENCODING, refused.parse().unwrap());
            let r = answer("application/json", body.clone(), &h);
            assert!(
                r.headers().get(header::CONTENT_ENCODING).is_none(),
                "{refused}"
            );
        }
        assert!(accepts_gzip("GZIP;q=0.5"));
    }

    /// The whole body of a response built in memory.
    fn futures_bytes(r: axum::response::Response) -> Vec<u8> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap()
                .to_vec()
        })
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
