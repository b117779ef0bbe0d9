//! Git as GitLab serves it, for [`crate::gitlab::FakeGitlab`]: repositories over smart HTTP
//! through the real `git http-backend` (a CGI program), guarded by the job token as HTTP Basic
//! credentials (`gitlab-ci-token:<job token>`), and GitLab's LFS endpoint: the batch API
//! (`info/lfs/objects/batch`) and object downloads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

/// Bare repositories under a root (`<root>/<group>/<project>.git`) and the LFS objects they
/// reference.
#[derive(Debug)]
pub struct GitRepos {
    root: PathBuf,
    lfs: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Held before each answer (a slow server, to watch a fetch while it runs).
    delay: Mutex<std::time::Duration>,
}

/// A request as the git routes need it.
pub(crate) struct GitRequest<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub header: &'a (dyn Fn(&str) -> Option<String> + Sync),
    pub body: &'a [u8],
    /// `http(s)://host:port` of the server, for LFS download links.
    pub base_url: &'a str,
}

/// An answer: status, headers, body.
type GitAnswer = (u16, Vec<(String, String)>, Bytes);

impl GitRepos {
    /// Repositories under `root`.
    pub fn new(root: &Path) -> GitRepos {
        GitRepos {
            root: root.to_path_buf(),
            lfs: Mutex::new(BTreeMap::new()),
            delay: Mutex::new(std::time::Duration::ZERO),
        }
    }

    /// Keep `content` as an LFS object; its oid (sha256, hex).
    pub fn put_lfs_object(&self, content: &[u8]) -> String {
        let oid = sha256_hex(content);
        self.lfs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(oid.clone(), content.to_vec());
        oid
    }

    /// Hold every answer for `delay` from now on.
    pub fn set_delay(&self, delay: std::time::Duration) {
        *self
            .delay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = delay;
    }

    /// Whether `path` is one of these routes (`…/<project>.git/…`).
    pub(crate) fn handles(path: &str) -> bool {
        path.contains(".git/")
    }

    /// Answer a git or LFS request; `token_ok` says whether a job token is valid.
    pub(crate) async fn serve(
        &self,
        req: &GitRequest<'_>,
        token_ok: &(dyn Fn(&str) -> bool + Sync),
    ) -> Response<Full<Bytes>> {
        let (status, headers, body) = self.answer(req, token_ok).await;
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() =
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                resp.headers_mut().append(k, v);
            }
        }
        resp
    }

    async fn answer(
        &self,
        req: &GitRequest<'_>,
        token_ok: &(dyn Fn(&str) -> bool + Sync),
    ) -> GitAnswer {
        let delay = *self
            .delay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tokio::time::sleep(delay).await;
        let auth = (req.header)("authorization");
        let token = auth.as_deref().and_then(basic_password);
        if !token.as_deref().is_some_and(token_ok) {
            return (
                401,
                vec![("www-authenticate".into(), "Basic realm=\"GitLab\"".into())],
                Bytes::from_static(b"HTTP Basic: Access denied\n"),
            );
        }
        let (repo, rest) = match req.path.split_once(".git/") {
            Some((repo, rest)) => (format!("{repo}.git"), rest),
            None => return not_found(),
        };
        if rest == "info/lfs/objects/batch" && req.method == "POST" {
            return self.lfs_batch(req, &repo, auth.as_deref().unwrap_or_default());
        }
        if let Some(oid) = rest.strip_prefix("gitlab-lfs/objects/") {
            let found = self
                .lfs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(oid)
                .cloned();
            return match found {
                Some(data) => (200, vec![], Bytes::from(data)),
                None => not_found(),
            };
        }
        self.backend(req).await
    }

    fn lfs_batch(&self, req: &GitRequest<'_>, repo: &str, auth: &str) -> GitAnswer {
        let body: Value = serde_json::from_slice(req.body).unwrap_or(Value::Null);
        let store = self
            .lfs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let objects: Vec<Value> = body["objects"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|o| {
                let oid = o["oid"].as_str().unwrap_or_default();
                let size = o["size"].as_u64().unwrap_or_default();
                match store.get(oid) {
                    Some(_) => json!({
                        "oid": oid, "size": size, "authenticated": true,
                        "actions": {"download": {
                            "href": format!("{}{repo}/gitlab-lfs/objects/{oid}", req.base_url),
                            "header": {"Authorization": auth},
                            "expires_in": 3600,
                        }},
                    }),
                    None => json!({
                        "oid": oid, "size": size,
                        "error": {"code": 404, "message": "Object does not exist on the server"},
                    }),
                }
            })
            .collect();
        let answer = json!({"transfer": "basic", "objects": objects});
        (
            200,
            vec![("content-type".into(), "application/vnd.git-lfs+json".into())],
            Bytes::from(answer.to_string()),
        )
    }

    /// `git http-backend` as a CGI program.
    async fn backend(&self, req: &GitRequest<'_>) -> GitAnswer {
        let mut cmd = tokio::process::Command::new("git");
        cmd.arg("http-backend")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_PROJECT_ROOT", &self.root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("PATH_INFO", req.path)
            .env("QUERY_STRING", req.query)
            .env("REQUEST_METHOD", req.method)
            .env("REMOTE_USER", "gitlab-ci-token")
            .env("REMOTE_ADDR", "127.0.0.1")
            .env("CONTENT_LENGTH", req.body.len().to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (header, var) in [
            ("content-type", "CONTENT_TYPE"),
            ("content-encoding", "HTTP_CONTENT_ENCODING"),
            ("git-protocol", "GIT_PROTOCOL"),
        ] {
            if let Some(v) = (req.header)(header) {
                cmd.env(var, v);
            }
        }
        let Ok(mut child) = cmd.spawn() else {
            return (
                500,
                vec![],
                Bytes::from_static(b"git http-backend did not start"),
            );
        };
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(req.body).await;
        }
        let Ok(out) = child.wait_with_output().await else {
            return (500, vec![], Bytes::from_static(b"git http-backend failed"));
        };
        parse_cgi(&out.stdout)
    }
}

/// A CGI program's output: headers (with `Status:`), a blank line, the body.
fn parse_cgi(out: &[u8]) -> GitAnswer {
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            out.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((head_end, body_start)) = split else {
        return (500, vec![], Bytes::from_static(b"bad CGI output"));
    };
    let mut status = 200;
    let mut headers = Vec::new();
    for line in String::from_utf8_lossy(&out[..head_end]).lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        if k == "status" {
            status = v
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
        } else {
            headers.push((k, v));
        }
    }
    (status, headers, Bytes::copy_from_slice(&out[body_start..]))
}

fn not_found() -> GitAnswer {
    (404, vec![], Bytes::from_static(b"404 Not Found"))
}

/// The password of `Basic base64(user:password)` when the user is `gitlab-ci-token`.
fn basic_password(header: &str) -> Option<String> {
    let encoded = header.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, pass) = text.split_once(':')?;
    (user == "gitlab-ci-token").then(|| pass.to_string())
}

/// SHA-256 of `data` in hex (an LFS oid).
fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgi_output_gives_status_headers_and_body() {
        let (status, headers, body) =
            parse_cgi(b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nmissing");
        assert_eq!(status, 404);
        assert_eq!(
            headers,
            vec![("content-type".to_string(), "text/plain".to_string())]
        );
        assert_eq!(&body[..], b"missing");
    }

    #[test]
    fn only_the_ci_token_user_is_accepted() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            basic_password(&format!("Basic {}", b64("gitlab-ci-token:glcbt-x"))).as_deref(),
            Some("glcbt-x")
        );
        assert_eq!(
            basic_password(&format!("Basic {}", b64("root:glcbt-x"))),
            None
        );
    }
}
