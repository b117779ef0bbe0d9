//! `include:remote`: a pipeline file fetched over HTTP(S) as GitLab fetches it: a public URL
//! (no credentials sent), redirects followed, bounded in time and size.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The whole fetch, redirects included (GitLab gives up on a slow remote include too).
const TIMEOUT: Duration = Duration::from_secs(20);
/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;

/// Why a remote file could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Not an `http://` or `https://` URL with a host.
    #[error("not an http:// or https:// URL")]
    BadUrl,
    /// No answer in time.
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    Timeout,
    /// Connecting, TLS or the exchange failed.
    #[error("{0}")]
    Transport(String),
    /// The server answered with an error status.
    #[error(
        "the server answered HTTP {0} (GitLab fetches remote includes without credentials: the file must be public)"
    )]
    Status(http::StatusCode),
    /// Redirected too often, or to something that is not an HTTP(S) URL.
    #[error("{0}")]
    Redirect(String),
    /// The file is larger than allowed.
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    /// The file is not UTF-8 text.
    #[error("not UTF-8 text")]
    NotText,
}

/// `url` as it may be shown: without `user:password@`, query or fragment, which may hold
/// secrets (GitLab masks them too).
pub fn masked(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let rest = match rest.split_once('/') {
        Some((authority, path)) => {
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{host}/{path}")
        }
        None => rest.rsplit_once('@').map_or(rest, |(_, h)| h).to_string(),
    };
    match scheme {
        Some(s) => format!("{s}://{rest}"),
        None => rest,
    }
}

/// `include: integrity: sha256-<base64>`: the fetched text must have this SHA-256, as GitLab
/// checks it.
pub fn check_integrity(text: &str, want: &str) -> Result<(), String> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let Some(expected) = want.trim().strip_prefix("sha256-") else {
        return Err(format!(
            "integrity {want:?} is not \"sha256-<base64 of the file's SHA-256>\""
        ));
    };
    let got =
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(text.as_bytes()));
    if got == expected {
        Ok(())
    } else {
        Err(format!(
            "the fetched file fails its integrity check (its SHA-256 is sha256-{got}, integrity says {want})"
        ))
    }
}

/// The text at `url`, at most `max_bytes`. Blocking: the fetch runs on its own thread and
/// runtime, so it works from a blocking thread of a runtime (where `slipway exec` reads
/// pipelines) and outside any runtime alike.
pub fn fetch(url: &str, max_bytes: u64) -> Result<String, RemoteError> {
    let url = url.to_string();
    let worker = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Transport(format!("cannot start a fetch: {e}")))?;
        rt.block_on(async {
            tokio::time::timeout(TIMEOUT, fetch_async(&url, max_bytes))
                .await
                .map_err(|_| RemoteError::Timeout)?
        })
    });
    worker
        .join()
        .map_err(|_| RemoteError::Transport("the fetch's thread panicked".into()))?
}

async fn fetch_async(url: &str, max_bytes: u64) -> Result<String, RemoteError> {
    let tls = crate::TlsFiles::default()
        .client_config(url)
        .map_err(|e| RemoteError::Transport(e.to_string()))?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let mut current = url.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let uri: http::Uri = current.parse().map_err(|_| RemoteError::BadUrl)?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(RemoteError::BadUrl);
        }
        let request = http::Request::get(uri)
            .header(http::header::USER_AGENT, "slipway")
            .body(Empty::new())
            .map_err(|_| RemoteError::BadUrl)?;
        let response = client
            .request(request)
            .await
            .map_err(|e| RemoteError::Transport(causes(&e)))?;
        let status = response.status();
        if status.is_redirection() {
            let location = response
                .headers()
                .get(http::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| {
                    RemoteError::Redirect(format!("HTTP {status} without a Location"))
                })?;
            current = crate::resolve_redirect(&current, location).ok_or_else(|| {
                RemoteError::Redirect(format!("redirected to {location:?}, not an HTTP(S) URL"))
            })?;
            continue;
        }
        if !status.is_success() {
            return Err(RemoteError::Status(status));
        }
        let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        let body = Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    RemoteError::TooLarge(max_bytes)
                } else {
                    RemoteError::Transport(e.to_string())
                }
            })?
            .to_bytes();
        return String::from_utf8(body.to_vec()).map_err(|_| RemoteError::NotText);
    }
    Err(RemoteError::Redirect(format!(
        "more than {MAX_REDIRECTS} redirects"
    )))
}

/// An error and its causes, `: `-joined (hyper's own message is only "client error (Connect)").
fn causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_credentials_or_query() {
        assert_eq!(
            masked("https://user:tok@host.example/a/ci.yml?token=x#f"),
            "https://host.example/a/ci.yml"
        );
        assert_eq!(masked("https://host/ci.yml"), "https://host/ci.yml");
    }

    #[test]
    fn integrity_is_the_files_sha256_in_base64() {
        // `printf 'a: 1\n' | openssl dgst -sha256 -binary | base64`
        let want = "sha256-N7EoxZ8fUJf3P4JpHLUZ8fVoZn+qtc7RtKuXnTaDfq4=";
        let text = "a: 1\n";
        assert_eq!(check_integrity(text, want), Ok(()));
        assert!(
            check_integrity("a: 2\n", want)
                .unwrap_err()
                .contains("integrity")
        );
        assert!(check_integrity(text, "md5-x").unwrap_err().contains("not"));
    }
}
