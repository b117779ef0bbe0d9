//! An S3 bucket as `[runners.cache.s3]` describes it, and its pre-signed URLs.

use object_store::aws::{AmazonS3, AmazonS3Builder};

use crate::CacheError;
use crate::connector::Connector;

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

/// Access keys of an S3 cache (`AccessKey`, `SecretKey`, `SessionToken`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// `AccessKey`.
    pub access_key: String,
    /// `SecretKey`.
    pub secret_key: String,
    /// `SessionToken`, for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret and the token never reach a log.
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

impl S3Config {
    fn region(&self) -> &str {
        match self.region.trim() {
            "" => "us-east-1",
            r => r,
        }
    }

    /// The endpoint `object_store` addresses the bucket at (with the bucket's name in it when
    /// virtual-hosted), and whether that is path style; `None`: AWS's regional endpoint.
    fn endpoint(&self) -> (Option<String>, bool) {
        let server = self
            .server_address
            .trim()
            .trim_end_matches('/')
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        // AWS: its regional endpoint, virtual-hosted unless told otherwise, as GitLab Runner's
        // client addresses it (the global endpoint answers other regions with a redirect).
        if server.is_empty() || server.ends_with("amazonaws.com") {
            let path_style = self.path_style.unwrap_or(false);
            return (None, path_style);
        }
        let scheme = if self.insecure { "http" } else { "https" };
        match self.path_style.unwrap_or(true) {
            true => (Some(format!("{scheme}://{server}")), true),
            false => (Some(format!("{scheme}://{}.{server}", self.bucket)), false),
        }
    }

    /// The headers every PUT carries, signed (server-side encryption).
    pub(crate) fn put_headers(&self) -> Vec<(String, String)> {
        let mut headers: Vec<(String, String)> = Vec::new();
        match &self.encryption {
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
        headers
    }

    /// The bucket as `object_store` signs for it.
    pub(crate) fn build(&self) -> Result<AmazonS3, CacheError> {
        let (endpoint, path_style) = self.endpoint();
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(self.bucket.trim())
            .with_region(self.region())
            .with_allow_http(self.insecure)
            .with_virtual_hosted_style_request(!path_style)
            .with_access_key_id(self.credentials.access_key.trim())
            .with_secret_access_key(self.credentials.secret_key.trim())
            .with_http_connector(Connector);
        if let Some(token) = &self.credentials.session_token {
            b = b.with_token(token.trim());
        }
        if let Some(endpoint) = endpoint {
            b = b.with_endpoint(endpoint);
        }
        b.build().map_err(|e| CacheError::Config {
            section: "s3",
            key: "ServerAddress",
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(server: &str, path_style: Option<bool>) -> S3Config {
        S3Config {
            server_address: server.into(),
            bucket: "cache".into(),
            insecure: server.starts_with("127."),
            path_style,
            ..S3Config::default()
        }
    }

    #[test]
    fn endpoints_follow_the_server_and_style() {
        assert_eq!(
            s3("127.0.0.1:9000", None).endpoint(),
            (Some("http://127.0.0.1:9000".into()), true)
        );
        assert_eq!(
            s3("https://minio.example/", Some(false)).endpoint(),
            (Some("https://cache.minio.example".into()), false)
        );
        assert_eq!(s3("", None).endpoint(), (None, false));
        assert_eq!(s3("s3.amazonaws.com", Some(true)).endpoint(), (None, true));
    }
}
