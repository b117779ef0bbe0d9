//! The GET and PUT of a cache archive through its pre-signed URL.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::CacheError;

/// An HTTP(S) client for cache transfers (the system's roots; Mozilla's when it has none).
#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A URL without its query: pre-signed URLs carry their signature there.
fn shown(url: &str) -> String {
    url.split('?').next().unwrap_or_default().to_string()
}

impl Client {
    /// A client whose transfers each take at most `timeout`.
    pub fn new(timeout: Duration) -> Result<Client, CacheError> {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(b) => b,
            Err(_) => hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(provider)
                .map_err(|e| CacheError::Config {
                    key: "ServerAddress",
                    reason: format!("TLS setup: {e}"),
                })?,
        };
        let https = builder.https_or_http().enable_http1().build();
        Ok(Client {
            http: HyperClient::builder(TokioExecutor::new()).build(https),
            timeout,
        })
    }

    async fn send(
        &self,
        method: &'static str,
        url: &str,
        headers: &[(String, String)],
        body: Bytes,
        limit: usize,
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
        let req = req
            .body(Full::new(body))
            .map_err(|e| network(e.to_string()))?;
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
            let body = Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|_| CacheError::TooLarge {
                    url: shown(url),
                    limit,
                })?
                .to_bytes();
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
        let (status, body) = self.send("GET", url, &[], Bytes::new(), limit).await?;
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
        let (status, answer) = self.send("PUT", url, headers, body, 64 * 1024).await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(CacheError::Status {
                method: "PUT",
                url: shown(url),
                status,
                body: excerpt(&answer),
            })
        }
    }
}

fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect()
}
