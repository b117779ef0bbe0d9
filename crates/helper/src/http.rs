//! The helper's HTTP: GitLab's artifacts API and pre-signed object URLs, bodies streamed to and
//! from files. Redirects are followed by hand, so that the job token goes only to the server
//! it was meant for.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use ureq::Agent;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use crate::error::HelperError;

/// Redirects followed at most (object storage behind GitLab's artifacts API).
const MAX_REDIRECTS: u32 = 5;

/// A client for one plan: the system's web roots, or the plan's own CA for GitLab.
#[derive(Debug, Clone)]
pub struct Client {
    agent: Agent,
}

/// The answer to a download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Got {
    /// The body is in the file.
    Saved,
    /// 404: nothing there.
    NotFound,
}

impl Client {
    /// A client trusting `ca_pem` (PEM certificates) instead of Mozilla's roots when given,
    /// each request bounded by `timeout`.
    pub fn new(ca_pem: Option<&str>, timeout: Duration) -> Result<Client, HelperError> {
        let roots = match ca_pem {
            None => RootCerts::WebPki,
            Some(pem) => {
                let mut certs = certificates(pem.as_bytes())?;
                if certs.is_empty() {
                    return Err(HelperError::Tls("the CA holds no certificate".into()));
                }
                // Added to the host's own roots, as GitLab Runner adds `tls-ca-file` to the
                // system's pool (a redirect to public object storage still verifies).
                if let Some(system) = SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read(p).ok()) {
                    certs.extend(certificates(&system).unwrap_or_default());
                }
                RootCerts::new_with_certs(&certs)
            }
        };
        let agent: Agent = Agent::config_builder()
            .tls_config(
                TlsConfig::builder()
                    .root_certs(roots)
                    .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                        rustls::crypto::aws_lc_rs::default_provider(),
                    ))
                    .build(),
            )
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .user_agent(concat!("slipway-helper/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client { agent })
    }

    /// `GET url` into `dest` (created or truncated), `token` as `JOB-TOKEN` to `url`'s own
    /// origin only.
    pub fn get_to_file(
        &self,
        url: &str,
        token: Option<&str>,
        dest: &Path,
    ) -> Result<Got, HelperError> {
        let home = origin(url);
        let mut current = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.agent.get(&current);
            if let Some(token) = token.filter(|_| origin(&current) == home) {
                req = req.header("JOB-TOKEN", token);
            }
            let resp = req.call().map_err(|e| HelperError::http(&current, e))?;
            let status = resp.status().as_u16();
            match status {
                200 => {
                    let mut out = File::create(dest).map_err(HelperError::file(dest))?;
                    let mut body = resp.into_body().into_reader();
                    std::io::copy(&mut body, &mut out).map_err(|e| HelperError::Transfer {
                        url: without_query(&current),
                        source: e,
                    })?;
                    out.flush().map_err(HelperError::file(dest))?;
                    return Ok(Got::Saved);
                }
                404 => return Ok(Got::NotFound),
                301 | 302 | 303 | 307 | 308 => {
                    let location = resp
                        .headers()
                        .get("location")
                        .and_then(|l| l.to_str().ok())
                        .ok_or_else(|| HelperError::Status {
                            url: without_query(&current),
                            status,
                            body: "a redirect without Location".into(),
                        })?;
                    current = resolve(&current, location);
                }
                _ => return Err(HelperError::status(&current, status, resp)),
            }
        }
        Err(HelperError::Status {
            url: without_query(url),
            status: 310,
            body: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// `PUT url` with the file `src` as its body and `headers`.
    pub fn put_file(
        &self,
        url: &str,
        headers: &[(String, String)],
        src: &Path,
    ) -> Result<(), HelperError> {
        let file = File::open(src).map_err(HelperError::file(src))?;
        let mut req = self.agent.put(url);
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req.send(&file).map_err(|e| HelperError::http(url, e))?;
        match resp.status().as_u16() {
            200..=299 => Ok(()),
            status => Err(HelperError::status(url, status, resp)),
        }
    }

    /// `POST url` of `head`, the file `src` and `tail` (a multipart body), with
    /// `content_type` and `token` as `JOB-TOKEN`; the status GitLab answered with.
    pub fn post_framed_file(
        &self,
        url: &str,
        token: &str,
        content_type: &str,
        (head, src, tail): (&[u8], &Path, &[u8]),
    ) -> Result<u16, HelperError> {
        let file = File::open(src).map_err(HelperError::file(src))?;
        let len = file.metadata().map_err(HelperError::file(src))?.len();
        let total = head.len() as u64 + len + tail.len() as u64;
        let mut body = head.chain(file).chain(tail);
        self.post(url, token, content_type, &mut body, Some(total))
    }

    /// [`Self::post_framed_file`] of a body read as it is made (`Transfer-Encoding: chunked`,
    /// as GitLab Runner streams its archives): an error reading it breaks the request off
    /// before its last chunk, so the server never keeps a part.
    pub fn post_framed_stream(
        &self,
        url: &str,
        token: &str,
        content_type: &str,
        (head, body, tail): (&[u8], &mut dyn Read, &[u8]),
    ) -> Result<u16, HelperError> {
        let mut body = head.chain(body).chain(tail);
        self.post(url, token, content_type, &mut body, None)
    }

    fn post(
        &self,
        url: &str,
        token: &str,
        content_type: &str,
        body: &mut dyn Read,
        len: Option<u64>,
    ) -> Result<u16, HelperError> {
        let mut req = self
            .agent
            .post(url)
            .header("JOB-TOKEN", token)
            .header("Content-Type", content_type);
        if let Some(len) = len {
            req = req.header("Content-Length", len.to_string());
        }
        let resp = req
            .send(ureq::SendBody::from_reader(body))
            .map_err(|e| HelperError::http(url, e))?;
        let status = resp.status().as_u16();
        match status {
            200 | 201 => Ok(status),
            _ => Err(HelperError::status(url, status, resp)),
        }
    }
}

/// Where Debian, Alpine, Fedora and friends keep the system's CA bundle.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The certificates of a PEM text.
fn certificates(pem: &[u8]) -> Result<Vec<Certificate<'static>>, HelperError> {
    ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(c)) => Some(Ok(c)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_, _>>()
        .map_err(|e| HelperError::Tls(e.to_string()))
}

/// `scheme://host:port` of a URL, for telling whether a redirect leaves its server.
fn origin(url: &str) -> &str {
    let rest = url.find("://").map_or(0, |i| i + 3);
    let end = url[rest..].find('/').map_or(url.len(), |i| rest + i);
    &url[..end]
}

/// `location` against `base`: absolute, or a path on `base`'s origin.
fn resolve(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else if location.starts_with('/') {
        format!("{}{location}", origin(base))
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
        format!("{dir}/{location}")
    }
}

/// A URL as errors and the trace name it: no query (pre-signed URLs carry secrets there).
pub fn without_query(url: &str) -> String {
    url.split('?').next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_and_keep_their_origin() {
        let base = "https://gitlab.example:8443/api/v4/jobs/1/artifacts";
        assert_eq!(origin(base), "https://gitlab.example:8443");
        assert_eq!(
            resolve(base, "/uploads/x"),
            "https://gitlab.example:8443/uploads/x"
        );
        assert_eq!(
            resolve(base, "https://s3.example/b/k?X-Amz-Signature=s"),
            "https://s3.example/b/k?X-Amz-Signature=s"
        );
        assert_ne!(origin("https://s3.example/b/k"), origin(base));
        assert_eq!(
            without_query("https://s3/b/k?X-Amz-Signature=s"),
            "https://s3/b/k"
        );
    }
}
