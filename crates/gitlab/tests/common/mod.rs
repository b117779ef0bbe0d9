//! A scripted HTTP server on loopback for the GitLab client's tests: every request is recorded
//! and answered by the test's script.

// Not every test binary uses every helper.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use slipway_gitlab::{ClientConfig, GitlabClient, VersionInfo};

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Req {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Req {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// A reply: status, headers, body.
pub type Reply = (u16, Vec<(&'static str, String)>, Vec<u8>);
type Script = dyn Fn(&Req, &[Req]) -> Reply + Send + Sync;

/// The server: its URL (with a trailing `/`) and what it received.
pub struct Fake {
    pub url: String,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Fake {
    /// Starts a server answering every request with `script(request, earlier requests)`.
    pub async fn start(script: impl Fn(&Req, &[Req]) -> Reply + Send + Sync + 'static) -> Self {
        let log: Arc<Mutex<Vec<Req>>> = Arc::default();
        let script: Arc<Script> = Arc::new(script);
        let l = log.clone();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let (l, script) = (l.clone(), script.clone());
                async move {
                    let req = Req {
                        method,
                        path: uri.path().to_string(),
                        query: uri.query().unwrap_or_default().to_string(),
                        headers,
                        body: body.to_vec(),
                    };
                    let (status, headers, body) = {
                        let mut log = l.lock().unwrap();
                        let reply = script(&req, &log);
                        log.push(req);
                        reply
                    };
                    let mut resp: Response = body.into_response();
                    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                    for (k, v) in headers {
                        resp.headers_mut().insert(k, v.parse().unwrap());
                    }
                    resp
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, log }
    }

    /// A client of this server sending `info`.
    pub fn client_with(&self, info: VersionInfo) -> GitlabClient {
        GitlabClient::new(ClientConfig::new(&self.url, info)).unwrap()
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }
}
