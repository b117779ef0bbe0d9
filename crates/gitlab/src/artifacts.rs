//! Job artifacts: `POST /api/v4/jobs/:id/artifacts` (multipart upload) and
//! `GET /api/v4/jobs/:id/artifacts` (download, possibly redirected to object storage).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Uri};

use super::client::{Payload, endpoint};
use super::{Backoff, GitlabClient, GitlabError, Secret};

/// Largest artifacts archive [`GitlabClient::download_artifacts`] reads.
pub const MAX_DOWNLOAD_SIZE: usize = 1024 * 1024 * 1024;

/// Largest upload answer read (GitLab answers with a small JSON document).
const MAX_UPLOAD_ANSWER: usize = 1024 * 1024;

/// Timeout of one artifacts transfer: archives are far larger than other API payloads.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The slowest upload rate an upload's time limit allows for (2 Mbit/s), beyond a minute for
/// GitLab's answer: a small archive whose request hangs is retried after a minute or so, not
/// after half an hour.
const SLOWEST_UPLOAD_BYTES_PER_SEC: u64 = 256 * 1024;

/// How long an upload of `len` bytes may take: a minute plus its time at the slowest rate,
/// at most [`TRANSFER_TIMEOUT`].
fn upload_timeout(len: Option<u64>) -> Duration {
    match len {
        Some(len) => (Duration::from_secs(60)
            + Duration::from_secs(len / SLOWEST_UPLOAD_BYTES_PER_SEC))
        .min(TRANSFER_TIMEOUT),
        None => TRANSFER_TIMEOUT,
    }
}

/// Redirects followed by a download (GitLab → object storage needs one).
const MAX_REDIRECTS: usize = 5;

/// Retries after the first attempt for 409/429/5xx and network errors.
const MAX_RETRIES: u32 = 3;

/// Delays between those retries.
const RETRY_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(4),
};

/// Longest `Retry-After` honoured: the job is waiting on the transfer.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);

/// How an artifacts archive is uploaded (one entry of the job's `artifacts`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadOptions {
    /// `artifacts:name`; the upload's file name is its base name (`artifacts` when unset).
    pub name: Option<String>,
    /// GitLab's `artifact_type`: `archive`, `junit`, ...
    pub artifact_type: String,
    /// GitLab's `artifact_format`: `zip` or `gzip`.
    pub artifact_format: String,
    /// `artifacts:expire_in` (e.g. `1 week`), sent when set.
    pub expire_in: Option<String>,
}

impl UploadOptions {
    /// The multipart file name as GitLab Runner chooses it: the name's base name (`artifacts`
    /// by default, `default` if it has none) plus `.zip` or `.gz`.
    pub fn file_name(&self) -> String {
        let name = self.name.as_deref().unwrap_or("artifacts");
        let base = name
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|b| !b.is_empty() && *b != ".")
            .unwrap_or("default");
        match self.artifact_format.as_str() {
            "zip" | "zipzstd" => format!("{base}.zip"),
            "gzip" => format!("{base}.gz"),
            "tarzstd" => format!("{base}.tar.zst"),
            _ => base.to_string(),
        }
    }
}

impl GitlabError {
    /// Whether GitLab refused an artifacts upload as too large (HTTP 413); retrying is useless.
    pub fn is_too_large(&self) -> bool {
        matches!(self, Self::Status { status: 413, .. })
    }

    /// Whether the server answered 404 (for a download: the job has no artifacts).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }
}

impl GitlabClient {
    /// The URL of `GET /api/v4/jobs/:id/artifacts` (a dependency's archive), for the job
    /// helper to download where the job runs.
    pub fn artifacts_url(&self, job_id: u64) -> String {
        self.api_url(&format!("jobs/{job_id}/artifacts"))
    }

    /// The URL of `POST /api/v4/jobs/:id/artifacts` with `opts` in its query, for the job
    /// helper to upload where the job runs.
    pub fn upload_artifacts_url(&self, job_id: u64, opts: &UploadOptions) -> String {
        self.api_url(&format!("jobs/{job_id}/artifacts?{}", upload_query(opts)))
    }

    /// `POST /api/v4/jobs/:id/artifacts`: uploads `archive` as `multipart/form-data` (field
    /// `file`, named as [`UploadOptions::file_name`]) with `artifact_format`, `artifact_type`
    /// and `expire_in` in the query and header `JOB-TOKEN`. 201 is success; 413 is
    /// [`GitlabError::is_too_large`] and 403/404 are returned at once; network errors and
    /// 409/429/5xx are retried up to 3 times with a short backoff, then returned.
    pub async fn upload_artifacts(
        &self,
        job_id: u64,
        job_token: &Secret,
        archive: Vec<u8>,
        opts: &UploadOptions,
    ) -> Result<(), GitlabError> {
        let boundary = boundary(&archive, job_id);
        let (content_type, head, tail) = multipart(opts, &boundary);
        let body = [head.as_bytes(), &archive, tail.as_bytes()].concat();
        let payload = Payload::Bytes(Bytes::from(body));
        self.upload(job_id, job_token, payload, &content_type, opts)
            .await
    }

    /// [`Self::upload_artifacts`] for an archive in the file `archive`, streamed from it (read
    /// again on a retry), so memory does not grow with its size.
    pub async fn upload_artifacts_file(
        &self,
        job_id: u64,
        job_token: &Secret,
        archive: &Path,
        opts: &UploadOptions,
    ) -> Result<(), GitlabError> {
        let boundary = random_boundary(job_id);
        let (content_type, head, tail) = multipart(opts, &boundary);
        let payload = Payload::File {
            head: Bytes::from(head),
            path: archive.to_path_buf(),
            tail: Bytes::from(tail),
        };
        self.upload(job_id, job_token, payload, &content_type, opts)
            .await
    }

    async fn upload(
        &self,
        job_id: u64,
        job_token: &Secret,
        payload: Payload,
        content_type: &str,
        opts: &UploadOptions,
    ) -> Result<(), GitlabError> {
        let path = format!("jobs/{job_id}/artifacts?{}", upload_query(opts));
        let ep = endpoint(&Method::POST, &path);
        let limit = upload_timeout(payload.len().await);
        retrying(job_id, "upload", || async {
            self.exchange(
                Method::POST,
                &self.api_url(&path),
                ep.clone(),
                &[("JOB-TOKEN", job_token.expose())],
                Some((content_type, payload.clone())),
                limit,
                MAX_UPLOAD_ANSWER,
                None,
            )
            .await
            .and_then(|resp| match resp.status.as_u16() {
                200 | 201 => Ok(()),
                413 => Err(GitlabError::Status {
                    endpoint: ep.clone(),
                    status: 413,
                    body: "artifacts archive too large: GitLab's maximum artifacts size \
                               (project, group or instance setting) is smaller"
                        .into(),
                }),
                _ => Err(resp.unexpected(ep.clone(), &[job_token.expose()])),
            })
        })
        .await
    }

    /// `GET /api/v4/jobs/:id/artifacts` with header `JOB-TOKEN`: the job's zip archive. Follows
    /// up to 5 redirects (object storage), sending `JOB-TOKEN` only to GitLab's own host. 404 is
    /// [`GitlabError::is_not_found`] (no artifacts, or expired); network errors and 409/429/5xx
    /// are retried (from GitLab again) up to 3 times. At most [`MAX_DOWNLOAD_SIZE`] bytes.
    pub async fn download_artifacts(
        &self,
        job_id: u64,
        job_token: &Secret,
    ) -> Result<Bytes, GitlabError> {
        retrying(job_id, "download", || {
            self.download_once(job_id, job_token, None)
        })
        .await
    }

    /// [`Self::download_artifacts`] into the file `dest` (created or truncated), streamed, so
    /// memory does not grow with the archive's size.
    pub async fn download_artifacts_to(
        &self,
        job_id: u64,
        job_token: &Secret,
        dest: &Path,
    ) -> Result<(), GitlabError> {
        retrying(job_id, "download", || {
            self.download_once(job_id, job_token, Some(dest))
        })
        .await
        .map(|_| ())
    }

    /// One download, redirects followed; into `sink` when given.
    async fn download_once(
        &self,
        job_id: u64,
        job_token: &Secret,
        sink: Option<&Path>,
    ) -> Result<Bytes, GitlabError> {
        let path = format!("jobs/{job_id}/artifacts");
        let gitlab_url = self.api_url(&path);
        let gitlab_origin = origin(&gitlab_url);
        let mut url = gitlab_url.clone();
        let mut ep = endpoint(&Method::GET, &path);
        for _ in 0..=MAX_REDIRECTS {
            // Object storage gets presigned URLs: the job token must not leak to it.
            let same_host = origin(&url).is_some() && origin(&url) == gitlab_origin;
            let headers: &[(&str, &str)] = if same_host {
                &[("JOB-TOKEN", job_token.expose())]
            } else {
                &[]
            };
            let resp = self
                .exchange(
                    Method::GET,
                    &url,
                    ep.clone(),
                    headers,
                    None,
                    TRANSFER_TIMEOUT,
                    MAX_DOWNLOAD_SIZE,
                    sink,
                )
                .await?;
            match resp.status.as_u16() {
                200 => return Ok(resp.body),
                301 | 302 | 303 | 307 | 308 => {
                    let location = resp.header("location").ok_or_else(|| GitlabError::Decode {
                        endpoint: ep.clone(),
                        message: format!("HTTP {} without a Location header", resp.status),
                    })?;
                    url = resolve(&url, location).ok_or_else(|| GitlabError::Decode {
                        endpoint: ep.clone(),
                        message: "redirect to an invalid or non-HTTP Location".into(),
                    })?;
                    ep = redirect_endpoint(&url);
                }
                404 => {
                    return Err(GitlabError::Status {
                        endpoint: ep,
                        status: 404,
                        body: "no artifacts for this job (never uploaded, expired or deleted)"
                            .into(),
                    });
                }
                _ => return Err(resp.unexpected(ep, &[job_token.expose()])),
            }
        }
        Err(GitlabError::Decode {
            endpoint: ep,
            message: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }
}

/// The upload's query string.
fn upload_query(opts: &UploadOptions) -> String {
    let mut query = format!(
        "artifact_format={}&artifact_type={}",
        encode(&opts.artifact_format),
        encode(&opts.artifact_type)
    );
    if let Some(expire_in) = opts.expire_in.as_deref().filter(|e| !e.is_empty()) {
        query.push_str("&expire_in=");
        query.push_str(&encode(expire_in));
    }
    query
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The multipart framing around the archive (field `file`), plus `artifact_type` and
/// `artifact_format` as fields too (GitLab merges them with the query; some servers and mocks
/// read only these): the content type, what goes before the archive and what after.
fn multipart(opts: &UploadOptions, boundary: &str) -> (String, String, String) {
    // Values from the job payload must not break the multipart framing.
    let clean = |v: &str| v.replace(['"', '\r', '\n'], "_");
    let file_name = clean(&opts.file_name());
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"artifact_type\"\r\n\r\n{}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"artifact_format\"\r\n\r\n{}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n",
        clean(&opts.artifact_type),
        clean(&opts.artifact_format)
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    (
        format!("multipart/form-data; boundary={boundary}"),
        head,
        tail,
    )
}

/// A boundary for content that is not read beforehand: 128 bits from the process's random
/// hash keys (as Go's multipart writer, which GitLab Runner uses, picks 240 random bits).
fn random_boundary(job_id: u64) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let word = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(job_id ^ salt);
        h.finish()
    };
    format!("slipway-{:016x}{:016x}", word(1), word(2))
}

/// A boundary that does not occur in `content` (derived from the clock, the job and a counter;
/// no randomness source is needed since it is checked).
fn boundary(content: &[u8], job_id: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut counter = 0u64;
    loop {
        let candidate = format!("slipway-{nanos:x}-{job_id:x}-{counter:x}");
        if !content
            .windows(candidate.len())
            .any(|w| w == candidate.as_bytes())
        {
            return candidate;
        }
        counter += 1;
    }
}

/// The delay before retry `attempt`: the server's `Retry-After` (capped) or the backoff.
/// `op` until it succeeds, fails for good, or has been retried [`MAX_RETRIES`] times after
/// retryable errors (network, 409/429/5xx).
async fn retrying<T, F, Fut>(job_id: u64, what: &str, mut op: F) -> Result<T, GitlabError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, GitlabError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && attempt < MAX_RETRIES => {
                let delay = retry_delay(&e, attempt);
                tracing::warn!(job = job_id, error = %e, ?delay, "artifacts {what} failed, retrying");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn retry_delay(e: &GitlabError, attempt: u32) -> Duration {
    e.retry_after()
        .map(|d| d.min(MAX_RETRY_AFTER))
        .unwrap_or_else(|| RETRY_BACKOFF.delay(attempt))
}

/// `scheme://authority` of an absolute URL.
fn origin(url: &str) -> Option<(String, String)> {
    let uri: Uri = url.parse().ok()?;
    Some((
        uri.scheme_str()?.to_ascii_lowercase(),
        uri.authority()?.as_str().to_ascii_lowercase(),
    ))
}

/// `location` resolved against `base` (absolute, scheme-relative, absolute-path or relative).
pub fn resolve(base: &str, location: &str) -> Option<String> {
    let base_uri: Uri = base.parse().ok()?;
    let scheme = base_uri.scheme_str()?;
    let authority = base_uri.authority()?.as_str();
    let resolved = if has_scheme(location) {
        location.to_string()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let dir = base_uri.path().rsplit_once('/').map_or("", |(d, _)| d);
        format!("{scheme}://{authority}{dir}/{location}")
    };
    // Only HTTP(S) with a host is followed.
    let uri: Uri = resolved.parse().ok()?;
    (matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some())
        .then_some(resolved)
}

/// Whether a URL reference starts with `scheme:` (RFC 3986), i.e. is absolute.
fn has_scheme(reference: &str) -> bool {
    match reference.split_once(':') {
        Some((scheme, _)) => {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// How a redirect target is named in errors: without its query (presigned URLs carry
/// signatures there).
fn redirect_endpoint(url: &str) -> String {
    let shown = url.split(['?', '#']).next().unwrap_or(url);
    format!("GET {shown}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_small_upload_that_hangs_is_given_up_after_a_minute_a_large_one_has_time() {
        assert_eq!(upload_timeout(Some(10_000)), Duration::from_secs(60));
        // 100 MiB at 2 Mbit/s: 400 s more.
        assert_eq!(upload_timeout(Some(100 << 20)), Duration::from_secs(460));
        assert_eq!(upload_timeout(Some(10 << 30)), TRANSFER_TIMEOUT);
        assert_eq!(upload_timeout(None), TRANSFER_TIMEOUT);
    }

    fn opts(name: Option<&str>, format: &str) -> UploadOptions {
        UploadOptions {
            name: name.map(String::from),
            artifact_type: "archive".into(),
            artifact_format: format.into(),
            expire_in: None,
        }
    }

    #[test]
    fn file_names_follow_gitlab_runner() {
        assert_eq!(opts(None, "zip").file_name(), "artifacts.zip");
        assert_eq!(opts(Some("build-1"), "zip").file_name(), "build-1.zip");
        assert_eq!(opts(Some("junit"), "gzip").file_name(), "junit.gz");
        assert_eq!(opts(Some("out/report"), "gzip").file_name(), "report.gz");
        assert_eq!(opts(Some(""), "zip").file_name(), "default.zip");
    }

    #[test]
    fn query_is_encoded() {
        let mut o = opts(None, "zip");
        o.expire_in = Some("1 week".into());
        assert_eq!(
            upload_query(&o),
            "artifact_format=zip&artifact_type=archive&expire_in=1%20week"
        );
    }

    #[test]
    fn redirects_resolve_and_hide_queries() {
        let base = "http://gitlab.local:8080/api/v4/jobs/1/artifacts";
        assert_eq!(
            resolve(base, "https://s3.example/b/k?X-Amz-Signature=abc").unwrap(),
            "https://s3.example/b/k?X-Amz-Signature=abc"
        );
        assert_eq!(
            resolve(base, "/other").unwrap(),
            "http://gitlab.local:8080/other"
        );
        assert_eq!(
            resolve(base, "//cdn.example/x").unwrap(),
            "http://cdn.example/x"
        );
        assert_eq!(
            resolve(base, "zip").unwrap(),
            "http://gitlab.local:8080/api/v4/jobs/1/zip"
        );
        assert!(resolve(base, "ftp://x/y").is_none());
        assert!(resolve(base, "mailto:x@y").is_none());
        assert_eq!(
            resolve(base, "a:b/c").as_deref(),
            None,
            "a scheme-like prefix is a scheme"
        );
        assert_eq!(
            redirect_endpoint("https://s3.example/b/k?X-Amz-Signature=abc"),
            "GET https://s3.example/b/k"
        );
        assert_eq!(origin(base), origin("HTTP://GITLAB.local:8080/x"));
        assert_ne!(origin(base), origin("http://gitlab.local:8081/x"));
    }

    #[test]
    fn boundary_avoids_the_content() {
        let b = boundary(b"abc", 7);
        let content = format!("xx{b}yy");
        let other = boundary(content.as_bytes(), 7);
        assert!(!content.contains(&other));
    }
}
