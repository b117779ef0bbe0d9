//! The fake's HTTP side: connections (plain or TLS), requests read in full, answers, and
//! the parsing helpers the routes share.

use super::routes::{is_active, route};
use super::*;

pub(super) async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    // Dropping this set (when the accept task is aborted) aborts every connection task.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let shared = shared.clone();
                match tls.clone() {
                    None => {
                        conns.spawn(serve_connection(stream, shared));
                    }
                    Some(acceptor) => {
                        conns.spawn(async move {
                            // A refused handshake (an untrusted or missing client
                            // certificate) just ends the connection, as a server does.
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve_connection(stream, shared).await;
                            }
                        });
                    }
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

pub(super) async fn serve_connection<S>(stream: S, shared: Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let kill = Arc::new(Notify::new());
    let k = kill.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        let kill = k.clone();
        async move { Ok::<_, Infallible>(handle(shared, req, kill).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    // `Outage::Drop`: the handler never answers and notifies; dropping `conn` closes the socket.
    tokio::select! {
        _ = conn => {}
        _ = kill.notified() => {}
    }
}

pub(super) type Resp = Response<Full<Bytes>>;

/// A response; header values that are not valid are left out.
pub(super) fn reply(
    status: u16,
    headers: &[(&'static str, String)],
    body: impl Into<Bytes>,
) -> Resp {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            resp.headers_mut().insert(HeaderName::from_static(name), v);
        }
    }
    resp
}

pub(super) fn json_reply(status: u16, headers: &[(&'static str, String)], body: &Value) -> Resp {
    let mut resp = reply(status, headers, body.to_string());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A parsed request, body read in full.
pub(super) struct Req {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: BTreeMap<String, String>,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl Req {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

pub(super) async fn handle(shared: Arc<Shared>, req: Request<Incoming>, kill: Arc<Notify>) -> Resp {
    let (parts, body) = req.into_parts();
    let full_path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => {
            // The client went away mid-body: nothing to answer.
            kill.notify_one();
            return std::future::pending().await;
        }
    };
    let req = Req {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        query: parse_query(parts.uri.query().unwrap_or_default()),
        headers,
        body,
    };
    let git = shared.lock().git.clone();
    if let Some(repos) = git.filter(|_| GitRepos::handles(&req.path)) {
        let query = parts.uri.query().unwrap_or_default().to_owned();
        return serve_git(&shared, &repos, req, full_path, &query).await;
    }
    let hang = shared.lock().outage == Outage::Hang;
    let resp = {
        let mut st = shared.lock();
        let api = req.path == "/api/v4" || req.path.starts_with("/api/v4/");
        let (status, resp) = match (api, st.outage) {
            (true, Outage::Drop) => (0, None),
            (true, Outage::Unavailable) => (503, Some(reply(503, &[], "GitLab is not responding"))),
            (true, Outage::Status(code)) => (code, Some(reply(code, &[], "GitLab is failing"))),
            (true, Outage::Hang) => (0, None),
            _ => {
                let resp = route(&mut st, &req);
                (resp.status().as_u16(), Some(resp))
            }
        };
        st.requests.push(RequestRecord {
            method: req.method,
            path: full_path,
            status,
            headers: req.headers,
            body: req.body,
        });
        resp
    };
    match resp {
        Some(resp) => resp,
        None if hang => std::future::pending().await,
        None => {
            kill.notify_one();
            std::future::pending().await
        }
    }
}

/// A git or LFS request: a running job's token is the password; recorded like API requests.
pub(super) async fn serve_git(
    shared: &Shared,
    repos: &GitRepos,
    req: Req,
    full_path: String,
    query: &str,
) -> Resp {
    let base_url = shared.lock().url.clone();
    let header = |name: &str| req.header(name).map(str::to_owned);
    let git_req = GitRequest {
        method: &req.method,
        path: &req.path,
        query,
        header: &header,
        body: &req.body,
        base_url: &base_url,
    };
    let token_ok = |token: &str| {
        let st = shared.lock();
        st.jobs
            .values()
            .any(|j| j.record.token == token && is_active(&j.record.state))
    };
    let resp = repos.serve(&git_req, &token_ok).await;
    shared.lock().requests.push(RequestRecord {
        method: req.method,
        path: full_path,
        status: resp.status().as_u16(),
        headers: req.headers,
        body: Vec::new(),
    });
    resp
}

pub(super) fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub(super) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The `file` part of a `multipart/form-data` body: its filename and bytes.
pub(super) fn multipart_file(content_type: &str, body: &[u8]) -> Option<(String, Vec<u8>)> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = params
        .split(';')
        .map(str::trim)
        .find_map(|p| p.strip_prefix("boundary="))?
        .trim_matches('"');
    let delim = format!("--{boundary}").into_bytes();
    let mut next_delim = b"\r\n".to_vec();
    next_delim.extend_from_slice(&delim);
    let mut pos = find(body, &delim, 0)?;
    loop {
        let after = pos + delim.len();
        let rest = body.get(after..)?;
        if rest.starts_with(b"--") {
            return None; // the closing delimiter: no file part
        }
        let headers_start = after + if rest.starts_with(b"\r\n") { 2 } else { 0 };
        let headers_end = find(body, b"\r\n\r\n", headers_start)?;
        let headers = String::from_utf8_lossy(body.get(headers_start..headers_end)?);
        let data_start = headers_end + 4;
        let data_end = find(body, &next_delim, data_start)?;
        let disposition = headers
            .split("\r\n")
            .find_map(|h| {
                let (k, v) = h.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v)
            })
            .unwrap_or_default();
        let param = |name: &str| {
            disposition.split(';').map(str::trim).find_map(|p| {
                p.strip_prefix(name)
                    .and_then(|v| v.strip_prefix('='))
                    .map(|v| v.trim_matches('"').to_owned())
            })
        };
        if param("name").as_deref() == Some("file") {
            let filename = param("filename").unwrap_or_default();
            return Some((filename, body.get(data_start..data_end)?.to_vec()));
        }
        pos = data_end + 2;
    }
}
