//! The HTTP layer and the runner lifecycle calls (`runners/verify`, `runners`, unregister).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

use super::tls::certificate_problem;
use super::{GitlabError, MASK, Secret, SystemId, TlsFiles, VersionInfo};

/// Largest response body read (job payloads are at most a few hundred KiB).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// How a [`GitlabClient`] reaches GitLab.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// GitLab's URL as in `config.toml` (`https://gitlab.example.com/`, may have a sub-path).
    pub url: String,
    /// The runner's `info` object.
    pub info: VersionInfo,
    /// Timeout of ordinary calls (traces, updates, registration).
    pub request_timeout: Duration,
    /// Timeout of `jobs/request`, which GitLab may hold open for a long poll (~50 s).
    pub long_poll_timeout: Duration,
    /// A private CA and a client certificate, if any.
    pub tls: TlsFiles,
}

impl ClientConfig {
    /// A config with GitLab Runner's timeouts (60 s; 90 s for long polls).
    pub fn new(url: impl Into<String>, info: VersionInfo) -> Self {
        Self {
            url: url.into(),
            info,
            request_timeout: Duration::from_secs(60),
            long_poll_timeout: Duration::from_secs(90),
            tls: TlsFiles::default(),
        }
    }

    /// This config with `tls`.
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = tls;
        self
    }
}

/// A client of GitLab's runner API for one GitLab instance.
#[derive(Clone)]
pub struct GitlabClient {
    base: String,
    http: Client<HttpsConnector<HttpConnector>, Outbound>,
    pub(super) config: ClientConfig,
}

impl std::fmt::Debug for GitlabClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitlabClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// A request body: bytes in memory, or streamed from a file.
type Outbound = UnsyncBoxBody<Bytes, std::io::Error>;

/// What a request sends.
#[derive(Debug, Clone)]
pub(super) enum Payload {
    /// Bytes in memory.
    Bytes(Bytes),
    /// `head`, the file at `path` (read as it is sent), then `tail`.
    File {
        /// Sent before the file.
        head: Bytes,
        /// The file.
        path: PathBuf,
        /// Sent after it.
        tail: Bytes,
    },
}

impl Payload {
    /// Its length, when known (a file that cannot be read: `None`).
    pub(super) async fn len(&self) -> Option<u64> {
        match self {
            Payload::Bytes(b) => Some(b.len() as u64),
            Payload::File { head, path, tail } => tokio::fs::metadata(path)
                .await
                .ok()
                .map(|m| head.len() as u64 + m.len() + tail.len() as u64),
        }
    }

    /// The body and its length; a file is opened now (an error names it).
    async fn body(self, endpoint: &str) -> Result<(Outbound, u64), GitlabError> {
        match self {
            Payload::Bytes(b) => {
                let len = b.len() as u64;
                Ok((
                    Full::new(b).map_err(|never| match never {}).boxed_unsync(),
                    len,
                ))
            }
            Payload::File { head, path, tail } => {
                let unreadable = |e: std::io::Error| GitlabError::InvalidRequest {
                    endpoint: endpoint.to_string(),
                    message: format!("reading {}: {e}", path.display()),
                };
                let file = tokio::fs::File::open(&path).await.map_err(unreadable)?;
                let size = file.metadata().await.map_err(unreadable)?.len();
                let len = head.len() as u64 + size + tail.len() as u64;
                use futures::StreamExt as _;
                let reader = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024);
                let frames = futures::stream::once(async move { Ok(head) })
                    .chain(reader)
                    .chain(futures::stream::once(async move { Ok(tail) }))
                    .map(|chunk| chunk.map(hyper::body::Frame::data));
                Ok((StreamBody::new(frames).boxed_unsync(), len))
            }
        }
    }
}

/// A response as read by [`GitlabClient::call`].
#[derive(Debug)]
pub(super) struct RawResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl RawResponse {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `Retry-After` header in seconds, if present.
    pub fn retry_after(&self) -> Option<Duration> {
        self.header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
    }

    /// The body's start, with `secrets` masked, for error messages.
    pub fn body_excerpt(&self, secrets: &[&str]) -> String {
        let mut text = String::from_utf8_lossy(&self.body).into_owned();
        for s in secrets.iter().filter(|s| !s.is_empty()) {
            text = text.replace(s, MASK);
        }
        text.chars().take(200).collect()
    }

    /// The generic error for a status the endpoint does not expect: `RetryLater` for
    /// 409/429/5xx, `Forbidden` for 403, `Status` otherwise.
    pub fn unexpected(&self, endpoint: String, secrets: &[&str]) -> GitlabError {
        let status = self.status.as_u16();
        if status == 403 {
            GitlabError::Forbidden { endpoint }
        } else if status == 409 || status == 429 || self.status.is_server_error() {
            GitlabError::RetryLater {
                endpoint,
                status,
                retry_after: self.retry_after(),
            }
        } else {
            GitlabError::Status {
                endpoint,
                status,
                body: self.body_excerpt(secrets),
            }
        }
    }
}

/// Runner credentials returned by `runners/verify` or `runners` (registration).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerCredentials {
    /// The runner's ID in GitLab (0 if a legacy server did not say).
    #[serde(default)]
    pub id: u64,
    /// The runner authentication token.
    pub token: Secret,
    /// When the token expires (RFC 3339), if it does.
    #[serde(default)]
    pub token_expires_at: Option<String>,
}

/// What the legacy registration flow (`POST /api/v4/runners`) sends besides the token.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RegisterOptions {
    /// Runner description.
    pub description: String,
    /// Maintenance note.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub maintenance_note: String,
    /// Tags.
    pub tag_list: Vec<String>,
    /// Whether to pick untagged jobs.
    pub run_untagged: bool,
    /// Whether the runner is locked to its project.
    pub locked: bool,
    /// `not_protected` or `ref_protected` (empty: server default).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub access_level: String,
    /// Maximum job timeout in seconds (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub maximum_timeout: u64,
    /// Whether the runner starts paused.
    pub paused: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl GitlabClient {
    /// A client for `config.url`; HTTPS trusts the system's root certificates (Mozilla's bundled
    /// roots when the system has none) and `config.tls`'s CA, and presents its client certificate.
    pub fn new(config: ClientConfig) -> Result<Self, GitlabError> {
        let invalid = |reason: &str| GitlabError::InvalidUrl {
            url: config.url.clone(),
            reason: reason.into(),
        };
        let uri: http::Uri = config
            .url
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(invalid("scheme must be http or https")),
        }
        if uri.authority().is_none() {
            return Err(invalid("no host"));
        }
        if uri.query().is_some() {
            return Err(invalid("must not have a query"));
        }
        let base = format!("{}/api/v4/", config.url.trim_end_matches('/'));

        let tls = config.tls.client_config(&config.url)?;
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
        let https = builder.https_or_http().enable_http1().build();
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(Self { base, http, config })
    }

    /// The runner `info` object this client sends.
    pub fn info(&self) -> &VersionInfo {
        &self.config.info
    }

    /// Sends one request to `path` (relative to `/api/v4/`) and reads the whole answer.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, Bytes)>,
        timeout: Duration,
    ) -> Result<RawResponse, GitlabError> {
        let endpoint = endpoint(&method, path);
        let uri = self.api_url(path);
        self.call_url(method, &uri, endpoint, headers, body, timeout, MAX_BODY)
            .await
    }

    /// The full URL of `path` (relative to `/api/v4/`).
    pub(super) fn api_url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// [`Self::call`] for a full URL (e.g. a redirect's `Location`), named `endpoint` in errors,
    /// reading at most `max_body` bytes.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn call_url(
        &self,
        method: Method,
        uri: &str,
        endpoint: String,
        headers: &[(&str, &str)],
        body: Option<(&str, Bytes)>,
        timeout: Duration,
        max_body: usize,
    ) -> Result<RawResponse, GitlabError> {
        let body = body.map(|(ct, b)| (ct, Payload::Bytes(b)));
        self.exchange(
            method, uri, endpoint, headers, body, timeout, max_body, None,
        )
        .await
    }

    /// One request and its answer: the body sent from `body`; a `200 OK` answer's body written
    /// to `sink` when given (its [`RawResponse::body`] is then empty), any other answer read
    /// into memory; at most `max_body` bytes either way.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn exchange(
        &self,
        method: Method,
        uri: &str,
        endpoint: String,
        headers: &[(&str, &str)],
        body: Option<(&str, Payload)>,
        timeout: Duration,
        max_body: usize,
        sink: Option<&Path>,
    ) -> Result<RawResponse, GitlabError> {
        let build = || async {
            let mut req = Request::builder().method(method.clone()).uri(uri).header(
                "user-agent",
                format!("slipway {}", self.config.info.version),
            );
            for (name, value) in headers {
                req = req.header(*name, *value);
            }
            let (body, len) = match &body {
                Some((content_type, payload)) => {
                    req = req.header("content-type", *content_type);
                    payload.clone().body(&endpoint).await?
                }
                None => Payload::Bytes(Bytes::new()).body(&endpoint).await?,
            };
            if len > 0 {
                req = req.header("content-length", len);
            }
            // The builder's error could quote a header value (a token): do not show it.
            req.body(body).map_err(|_| GitlabError::InvalidRequest {
                endpoint: endpoint.clone(),
                message: "a header or the URL has invalid characters".into(),
            })
        };

        let exchange = async {
            let mut resp = self.http.request(build().await?).await;
            // A connection the server closed as it was handed out (a TLS 1.3 server refusing
            // our certificate just after the handshake, say): the request was never sent, and
            // once more tells what happened instead of a bare "not ready".
            if let Err(e) = &resp
                && self
                    .network(&endpoint, e)
                    .to_string()
                    .contains("connection was not ready")
            {
                resp = self.http.request(build().await?).await;
            }
            let resp = resp.map_err(|e| self.network(&endpoint, &e))?;
            let (parts, body) = resp.into_parts();
            let reading = |e: &dyn std::fmt::Display| GitlabError::Network {
                endpoint: endpoint.clone(),
                message: format!("reading body: {e}"),
            };
            let body = match sink {
                Some(path) if parts.status == StatusCode::OK => {
                    let writing = |e: std::io::Error| GitlabError::InvalidRequest {
                        endpoint: endpoint.clone(),
                        message: format!("writing {}: {e}", path.display()),
                    };
                    let file = tokio::fs::File::create(path).await.map_err(writing)?;
                    let mut file = tokio::io::BufWriter::with_capacity(256 * 1024, file);
                    let mut body = Limited::new(body, max_body);
                    while let Some(frame) = body.frame().await {
                        let frame = frame.map_err(|e| reading(&e))?;
                        if let Ok(data) = frame.into_data() {
                            file.write_all(&data).await.map_err(writing)?;
                        }
                    }
                    file.flush().await.map_err(writing)?;
                    Bytes::new()
                }
                _ => Limited::new(body, max_body)
                    .collect()
                    .await
                    .map_err(|e| reading(&e))?
                    .to_bytes(),
            };
            Ok(RawResponse {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(GitlabError::Timeout { endpoint, timeout }),
        }
    }

    /// Sends JSON and reads the answer.
    pub(super) async fn call_json<T: Serialize>(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &T,
        timeout: Duration,
    ) -> Result<RawResponse, GitlabError> {
        let bytes = serde_json::to_vec(body).map_err(|e| GitlabError::InvalidRequest {
            endpoint: endpoint(&method, path),
            message: e.to_string(),
        })?;
        self.call(
            method,
            path,
            headers,
            Some(("application/json", Bytes::from(bytes))),
            timeout,
        )
        .await
    }

    /// `POST /api/v4/runners/verify`: checks a `glrt-` authentication token and registers this
    /// `system_id` as one of the runner's managers.
    pub async fn verify(
        &self,
        token: &Secret,
        system_id: &SystemId,
    ) -> Result<RunnerCredentials, GitlabError> {
        #[derive(Serialize)]
        struct Body<'a> {
            token: &'a str,
            system_id: &'a str,
            info: &'a VersionInfo,
        }
        let path = "runners/verify";
        let body = Body {
            token: token.expose(),
            system_id: system_id.as_str(),
            info: &self.config.info,
        };
        let resp = self
            .call_json(Method::POST, path, &[], &body, self.config.request_timeout)
            .await?;
        match resp.status.as_u16() {
            200 | 201 => {
                // Legacy servers answer in plain text: the token is valid, nothing else is known.
                Ok(
                    serde_json::from_slice::<RunnerCredentials>(&resp.body).unwrap_or_else(|_| {
                        RunnerCredentials {
                            id: 0,
                            token: token.clone(),
                            token_expires_at: None,
                        }
                    }),
                )
            }
            _ => Err(resp.unexpected(endpoint(&Method::POST, path), &[token.expose()])),
        }
    }

    /// `POST /api/v4/runners`: legacy registration with a registration token; returns the new
    /// runner's ID and authentication token.
    pub async fn register(
        &self,
        registration_token: &Secret,
        options: &RegisterOptions,
    ) -> Result<RunnerCredentials, GitlabError> {
        #[derive(Serialize)]
        struct Body<'a> {
            token: &'a str,
            info: &'a VersionInfo,
            #[serde(flatten)]
            options: &'a RegisterOptions,
        }
        let path = "runners";
        let ep = endpoint(&Method::POST, path);
        let body = Body {
            token: registration_token.expose(),
            info: &self.config.info,
            options,
        };
        let resp = self
            .call_json(Method::POST, path, &[], &body, self.config.request_timeout)
            .await?;
        match resp.status.as_u16() {
            200 | 201 => serde_json::from_slice(&resp.body).map_err(|e| GitlabError::Decode {
                endpoint: ep,
                message: e.to_string(),
            }),
            _ => Err(resp.unexpected(ep, &[registration_token.expose()])),
        }
    }

    /// `DELETE /api/v4/runners`: removes the runner from GitLab.
    pub async fn unregister(&self, token: &Secret) -> Result<(), GitlabError> {
        self.delete(
            "runners",
            serde_json::json!({ "token": token.expose() }),
            token,
        )
        .await
    }

    /// `DELETE /api/v4/runners/managers`: removes this `system_id` from a runner created in
    /// GitLab's UI (the runner itself is deleted there).
    pub async fn unregister_manager(
        &self,
        token: &Secret,
        system_id: &SystemId,
    ) -> Result<(), GitlabError> {
        let body = serde_json::json!({ "token": token.expose(), "system_id": system_id.as_str() });
        self.delete("runners/managers", body, token).await
    }

    /// `DELETE /api/v4/path` with a JSON `body` authenticated by `token`: 200 or 204.
    async fn delete(
        &self,
        path: &str,
        body: serde_json::Value,
        token: &Secret,
    ) -> Result<(), GitlabError> {
        let resp = self
            .call_json(
                Method::DELETE,
                path,
                &[],
                &body,
                self.config.request_timeout,
            )
            .await?;
        match resp.status.as_u16() {
            200 | 204 => Ok(()),
            _ => Err(resp.unexpected(endpoint(&Method::DELETE, path), &[token.expose()])),
        }
    }
}

/// `METHOD /api/v4/path` (paths never contain tokens).
pub(super) fn endpoint(method: &Method, path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    format!("{method} /api/v4/{path}")
}

/// A transport error, described with its causes.
impl GitlabClient {
    /// A transport error as a [`GitlabError`]: a rejected certificate apart (not retried).
    fn network(&self, endpoint: &str, e: &(dyn std::error::Error + 'static)) -> GitlabError {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        match certificate_problem(&message) {
            Some(message) => GitlabError::Certificate {
                endpoint: endpoint.to_string(),
                url: self.config.url.clone(),
                message,
                ca_file: self.config.tls.ca_file.clone(),
            },
            None => GitlabError::Network {
                endpoint: endpoint.to_string(),
                message,
            },
        }
    }
}
