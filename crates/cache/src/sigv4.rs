//! AWS Signature Version 4 with query parameters: a pre-signed URL.
//!
//! Checked against the example AWS publishes for S3 ("Authenticating Requests: Using Query
//! Parameters"): the same request, key and time give the same signature.

use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

/// An access key, as `[runners.cache.s3]` holds it.
#[derive(Clone, Default)]
pub struct Credentials {
    /// `AccessKey`.
    pub access_key: String,
    /// `SecretKey`.
    pub secret_key: String,
    /// `SessionToken` (temporary credentials), if any.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// One request to pre-sign.
#[derive(Debug, Clone)]
pub struct Presign<'a> {
    /// `GET` or `PUT`.
    pub method: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The `Host` header (with a port when not the scheme's).
    pub host: &'a str,
    /// The path, not yet encoded (`/bucket/key` or `/key`).
    pub path: &'a str,
    /// The region (`us-east-1` when unsure).
    pub region: &'a str,
    /// Headers the request will carry that the signature must cover, lowercase names.
    pub headers: &'a [(&'a str, &'a str)],
    /// How long the URL is valid, in seconds (at most a week).
    pub expires: u64,
    /// When it is signed.
    pub now: SystemTime,
}

/// The pre-signed URL of `req` with `creds`.
pub fn presign(req: &Presign<'_>, creds: &Credentials) -> String {
    let stamp = amz_date(req.now);
    let date = &stamp[..8];
    let scope = format!("{date}/{}/s3/aws4_request", req.region);
    let mut headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    headers.push(("host".into(), req.host.to_string()));
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let mut query: Vec<(String, String)> = vec![
        ("X-Amz-Algorithm".into(), "AWS4-HMAC-SHA256".into()),
        (
            "X-Amz-Credential".into(),
            format!("{}/{scope}", creds.access_key),
        ),
        ("X-Amz-Date".into(), stamp.clone()),
        ("X-Amz-Expires".into(), req.expires.min(604_800).to_string()),
        ("X-Amz-SignedHeaders".into(), signed_headers.clone()),
    ];
    if let Some(token) = &creds.session_token {
        query.push(("X-Amz-Security-Token".into(), token.clone()));
    }
    let mut encoded: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (encode(k, true), encode(v, true)))
        .collect();
    encoded.sort();
    let canonical_query = encoded
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let path = encode(req.path, false);
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let canonical = format!(
        "{}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\nUNSIGNED-PAYLOAD",
        req.method
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", creds.secret_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [req.region, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    format!(
        "{}://{}{path}?{canonical_query}&X-Amz-Signature={signature}",
        req.scheme, req.host
    )
}

/// `YYYYMMDDTHHMMSSZ`.
fn amz_date(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect()
}

/// URI-encode as SigV4 wants: unreserved characters kept, the rest `%XX`; `/` kept in paths.
fn encode(s: &str, slash_too: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if !slash_too => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 64;
    let mut k = if key.len() > BLOCK {
        Sha256::digest(key).to_vec()
    } else {
        key.to_vec()
    };
    k.resize(BLOCK, 0);
    let inner: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let outer: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let mut h = Sha256::new();
    h.update(&inner);
    h.update(data);
    let inner_hash = h.finalize();
    let mut h = Sha256::new();
    h.update(&outer);
    h.update(inner_hash);
    h.finalize().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        assert_eq!(
            hex(&hmac(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn presigned_get_matches_the_aws_example() {
        // 2013-05-24T00:00:00Z
        let now = UNIX_EPOCH + Duration::from_secs(1_369_353_600);
        let url = presign(
            &Presign {
                method: "GET",
                scheme: "https",
                host: "examplebucket.s3.amazonaws.com",
                path: "/test.txt",
                region: "us-east-1",
                headers: &[],
                expires: 86_400,
                now,
            },
            &Credentials {
                access_key: "AKIAIOSFODNN7EXAMPLE".into(),
                secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
                session_token: None,
            },
        );
        assert_eq!(
            url,
            "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256\
             &X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
             &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
             &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
        );
    }

    #[test]
    fn paths_keep_slashes_and_encode_the_rest() {
        assert_eq!(
            encode("/b/runner/x/project/1/a b+c", false),
            "/b/runner/x/project/1/a%20b%2Bc"
        );
        assert_eq!(encode("a/b", true), "a%2Fb");
    }
}
