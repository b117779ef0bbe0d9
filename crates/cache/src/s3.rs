//! An S3 bucket as `[runners.cache.s3]` describes it, and its pre-signed URLs.

use std::time::{Duration, SystemTime};

use crate::sigv4::{Credentials, Presign, presign};

/// `ServerSideEncryption`: what S3 does with what it stores.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ServerSideEncryption {
    /// The bucket's default.
    #[default]
    None,
    /// `S3`: keys S3 manages (`AES256`).
    S3,
    /// `KMS` with a key id (`ServerSideEncryptionKeyID`).
    Kms(String),
}

/// The settings of an S3 cache.
#[derive(Debug, Clone, Default)]
pub struct S3Config {
    /// `ServerAddress` (`host[:port]`); empty: AWS.
    pub server_address: String,
    /// `BucketName`.
    pub bucket: String,
    /// `BucketLocation` (the region); empty: `us-east-1`.
    pub region: String,
    /// `Insecure`: plain HTTP.
    pub insecure: bool,
    /// `PathStyle`: `host/bucket/key` rather than `bucket.host/key`; unset: path style except
    /// on AWS.
    pub path_style: Option<bool>,
    /// `AccessKey`, `SecretKey`, `SessionToken`.
    pub credentials: Credentials,
    /// `ServerSideEncryption`.
    pub encryption: ServerSideEncryption,
}

/// An S3 bucket that pre-signs URLs for its objects.
#[derive(Debug, Clone)]
pub struct S3 {
    config: S3Config,
}

impl S3 {
    /// The bucket of `config`.
    pub fn new(config: S3Config) -> S3 {
        S3 { config }
    }

    fn region(&self) -> &str {
        match self.config.region.trim() {
            "" => "us-east-1",
            r => r,
        }
    }

    /// Scheme, host and path of `object`.
    fn locate(&self, object: &str) -> (&'static str, String, String) {
        let c = &self.config;
        let scheme = if c.insecure { "http" } else { "https" };
        let server = match c.server_address.trim().trim_end_matches('/') {
            "" => match self.region() {
                "us-east-1" => "s3.amazonaws.com".to_string(),
                r => format!("s3.{r}.amazonaws.com"),
            },
            s => s
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .to_string(),
        };
        // AWS's global endpoint for a bucket of another region answers with a redirect:
        // the region's own endpoint instead, as GitLab Runner's client finds it.
        let server = match (server.as_str(), self.region()) {
            ("s3.amazonaws.com", r) if r != "us-east-1" => format!("s3.{r}.amazonaws.com"),
            _ => server,
        };
        let aws = server.ends_with("amazonaws.com");
        let object = object.trim_start_matches('/');
        if c.path_style.unwrap_or(!aws) {
            (scheme, server, format!("/{}/{object}", c.bucket))
        } else {
            (
                scheme,
                format!("{}.{server}", c.bucket),
                format!("/{object}"),
            )
        }
    }

    /// A URL that reads `object` for `valid`.
    pub fn get_url(&self, object: &str, valid: Duration, now: SystemTime) -> String {
        let (scheme, host, path) = self.locate(object);
        presign(
            &Presign {
                method: "GET",
                scheme,
                host: &host,
                path: &path,
                region: self.region(),
                headers: &[],
                expires: valid.as_secs().max(1),
                now,
            },
            &self.config.credentials,
        )
    }

    /// A URL that writes `object` for `valid`, and the headers the PUT must carry (they are
    /// part of the signature).
    pub fn put_url(
        &self,
        object: &str,
        valid: Duration,
        now: SystemTime,
    ) -> (String, Vec<(String, String)>) {
        let (scheme, host, path) = self.locate(object);
        let mut headers: Vec<(String, String)> = Vec::new();
        match &self.config.encryption {
            ServerSideEncryption::None => {}
            ServerSideEncryption::S3 => {
                headers.push(("x-amz-server-side-encryption".into(), "AES256".into()));
            }
            ServerSideEncryption::Kms(key) => {
                headers.push(("x-amz-server-side-encryption".into(), "aws:kms".into()));
                if !key.is_empty() {
                    headers.push((
                        "x-amz-server-side-encryption-aws-kms-key-id".into(),
                        key.clone(),
                    ));
                }
            }
        }
        let signed: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let url = presign(
            &Presign {
                method: "PUT",
                scheme,
                host: &host,
                path: &path,
                region: self.region(),
                headers: &signed,
                expires: valid.as_secs().max(1),
                now,
            },
            &self.config.credentials,
        );
        (url, headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(server: &str, path_style: Option<bool>) -> S3 {
        S3::new(S3Config {
            server_address: server.into(),
            bucket: "cache".into(),
            insecure: server.starts_with("127."),
            path_style,
            credentials: Credentials {
                access_key: "a".into(),
                secret_key: "s".into(),
                session_token: Some("tok".into()),
            },
            encryption: ServerSideEncryption::S3,
            ..S3Config::default()
        })
    }

    #[test]
    fn urls_follow_the_server_and_style() {
        let now = SystemTime::now();
        let ttl = Duration::from_secs(60);
        let get = s3("127.0.0.1:9000", None).get_url("runner/x/project/1/k", ttl, now);
        assert!(
            get.starts_with("http://127.0.0.1:9000/cache/runner/x/project/1/k?"),
            "{get}"
        );
        assert!(get.contains("X-Amz-Security-Token=tok"), "{get}");
        let aws = s3("", None).get_url("k", ttl, now);
        assert!(
            aws.starts_with("https://cache.s3.amazonaws.com/k?"),
            "{aws}"
        );
        let (put, headers) = s3("127.0.0.1:9000", Some(true)).put_url("k", ttl, now);
        assert!(
            put.contains("X-Amz-SignedHeaders=host%3Bx-amz-server-side-encryption"),
            "{put}"
        );
        assert_eq!(headers[0].1, "AES256");
    }
}
