//! The GET and PUT of a cache archive through its pre-signed URL.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, Limited, StreamBody};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt as _;

use crate::CacheError;

/// An HTTP(S) client for cache transfers (the system's roots; Mozilla's when it has none).
#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpsConnector<HttpConnector>, Outbound>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A request body: bytes, or a file read as it is sent.
type Outbound = UnsyncBoxBody<Bytes, std::io::Error>;

/// What a request sends, and where a `200` answer goes.
enum Body<'a> {
    Bytes(Bytes),
    File(&'a Path),
}

/// HTTP and HTTPS with the system's roots (Mozilla's when it has none).
pub(crate) fn https() -> Result<HttpsConnector<HttpConnector>, CacheError> {
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => b,
        Err(_) => hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| CacheError::Config {
                section: "s3",
                key: "ServerAddress",
                reason: format!("TLS setup: {e}"),
            })?,
    };
    Ok(builder.https_or_http().enable_http1().build())
}

/// A URL without its query: pre-signed URLs carry their signature there.
fn shown(url: &str) -> String {
    url.split('?').next().unwrap_or_default().to_string()
}

impl Client {
    /// A client whose transfers each take at most `timeout`.
    pub fn new(timeout: Duration) -> Result<Client, CacheError> {
        Ok(Client {
            http: HyperClient::builder(TokioExecutor::new()).build(https()?),
            timeout,
        })
    }

    /// One exchange: `body` sent; the answer's body read into memory (at most `limit`
    /// bytes), or written to `sink` when given and the answer is `200 OK`.
    async fn send(
        &self,
        method: &'static str,
        url: &str,
        headers: &[(String, String)],
        body: Body<'_>,
        limit: usize,
        sink: Option<&Path>,
    ) -> Result<(u16, Bytes), CacheError> {
        let network = |message: String| CacheError::Network {
            method,
            url: shown(url),
            message,
        };
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET))
            .uri(url);
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let body = match body {
            Body::Bytes(b) => Full::new(b).map_err(|never| match never {}).boxed_unsync(),
            Body::File(path) => {
                let file = |e: std::io::Error| CacheError::File {
                    path: path.to_path_buf(),
                    source: e,
                };
                let f = tokio::fs::File::open(path).await.map_err(file)?;
                // S3 wants the length of a PUT up front (no chunked uploads).
                let len = f.metadata().await.map_err(file)?.len();
                req = req.header("content-length", len);
                use futures::StreamExt as _;
                let frames = tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024)
                    .map(|chunk| chunk.map(hyper::body::Frame::data));
                StreamBody::new(frames).boxed_unsync()
            }
        };
        let req = req.body(body).map_err(|e| network(e.to_string()))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| {
                let mut m = e.to_string();
                let mut s = std::error::Error::source(&e);
                while let Some(inner) = s {
                    m.push_str(": ");
                    m.push_str(&inner.to_string());
                    s = inner.source();
                }
                network(m)
            })?;
            let status = resp.status().as_u16();
            let too_large = || CacheError::TooLarge {
                url: shown(url),
                limit,
            };
            let body = match sink {
                Some(path) if status == 200 => {
                    let file = |e: std::io::Error| CacheError::File {
                        path: path.to_path_buf(),
                        source: e,
                    };
                    let f = tokio::fs::File::create(path).await.map_err(file)?;
                    let mut f = tokio::io::BufWriter::with_capacity(256 * 1024, f);
                    let mut body = Limited::new(resp.into_body(), limit);
                    while let Some(frame) = body.frame().await {
                        // The limit's error and a broken connection read alike here.
                        let frame = frame.map_err(|e| {
                            if e.to_string().contains("length limit") {
                                too_large()
                            } else {
                                network(format!("reading the answer: {e}"))
                            }
                        })?;
                        if let Ok(data) = frame.into_data() {
                            f.write_all(&data).await.map_err(file)?;
                        }
                    }
                    f.flush().await.map_err(file)?;
                    Bytes::new()
                }
                _ => Limited::new(resp.into_body(), limit)
                    .collect()
                    .await
                    .map_err(|_| too_large())?
                    .to_bytes(),
            };
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CacheError::Timeout {
                method,
                url: shown(url),
                seconds: self.timeout.as_secs(),
            })?
    }

    /// The object at `url`, `None` when there is none (404); at most `limit` bytes.
    pub async fn get(&self, url: &str, limit: usize) -> Result<Option<Bytes>, CacheError> {
        let (status, body) = self
            .send("GET", url, &[], Body::Bytes(Bytes::new()), limit, None)
            .await?;
        match status {
            200 => Ok(Some(body)),
            404 => Ok(None),
            status => Err(CacheError::Status {
                method: "GET",
                url: shown(url),
                status,
                body: excerpt(&body),
            }),
        }
    }

    /// Store `body` at `url` with `headers` (those the signature covers).
    pub async fn put(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<(), CacheError> {
        let (status, answer) = self
            .send("PUT", url, headers, Body::Bytes(body), 64 * 1024, None)
            .await?;
        put_answer(url, status, &answer)
    }

    /// [`Self::get`] into the file `dest`, streamed: `false` when there is no object (404).
    pub async fn get_to_file(
        &self,
        url: &str,
        dest: &Path,
        limit: usize,
    ) -> Result<bool, CacheError> {
        let (status, body) = self
            .send(
                "GET",
                url,
                &[],
                Body::Bytes(Bytes::new()),
                limit,
                Some(dest),
            )
            .await?;
        match status {
            200 => Ok(true),
            404 => Ok(false),
            status => Err(CacheError::Status {
                method: "GET",
                url: shown(url),
                status,
                body: excerpt(&body),
            }),
        }
    }

    /// [`Self::put`] of the file `path`, streamed from it.
    pub async fn put_file(
        &self,
        url: &str,
        headers: &[(String, String)],
        path: &Path,
    ) -> Result<(), CacheError> {
        let (status, answer) = self
            .send("PUT", url, headers, Body::File(path), 64 * 1024, None)
            .await?;
        put_answer(url, status, &answer)
    }
}

/// A PUT's answer: any 2xx is stored.
fn put_answer(url: &str, status: u16, answer: &[u8]) -> Result<(), CacheError> {
    {
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(CacheError::Status {
                method: "PUT",
                url: shown(url),
                status,
                body: excerpt(answer),
            })
        }
    }
}

fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect()
}
