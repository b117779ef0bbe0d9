//! The bucket of a distributed cache, on any of GitLab Runner's three clouds, and the
//! pre-signed URLs of its objects: `object_store` signs them (SigV4 for S3, V4 for GCS, a
//! service SAS for Azure), so a transfer needs no credential.

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::signer::{HeaderName, HeaderValue, Method, SignedUrlOptions, Signer};

use crate::{AzureConfig, CacheError, GcsConfig, S3Config};

/// The longest a URL is signed for: S3 and GCS refuse more than seven days.
const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where a distributed cache lives: `[runners.cache] Type` and its section.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// `Type = "s3"`, `[runners.cache.s3]`.
    S3(S3Config),
    /// `Type = "gcs"`, `[runners.cache.gcs]`.
    Gcs(GcsConfig),
    /// `Type = "azure"`, `[runners.cache.azure]`.
    Azure(AzureConfig),
}

/// A bucket that pre-signs URLs for its objects.
#[derive(Debug, Clone)]
pub struct Store {
    signer: Arc<dyn Signer>,
    /// Headers a PUT carries.
    put_headers: Vec<(String, String)>,
    /// Those of them the signature covers (S3's encryption headers).
    put_signed: SignedUrlOptions,
}

impl Store {
    /// The bucket of `config`; an error names the setting that keeps it from use.
    pub fn new(config: &StoreConfig) -> Result<Store, CacheError> {
        let (signer, put_headers, signed): (Arc<dyn Signer>, _, _) = match config {
            StoreConfig::S3(c) => (Arc::new(c.build()?), c.put_headers(), true),
            StoreConfig::Gcs(c) => (Arc::new(c.build()?), Vec::new(), false),
            StoreConfig::Azure(c) => (Arc::new(c.build()?), c.put_headers(), false),
        };
        let mut put_signed = SignedUrlOptions::default();
        for (k, v) in put_headers.iter().filter(|_| signed) {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                put_signed = put_signed.with_signed_header(name, value);
            }
        }
        Ok(Store {
            signer,
            put_headers,
            put_signed,
        })
    }

    /// A URL that reads `object` for `valid` (at most seven days).
    pub async fn get_url(&self, object: &str, valid: Duration) -> Result<String, CacheError> {
        self.sign(Method::GET, object, valid, &SignedUrlOptions::default())
            .await
    }

    /// A URL that writes `object` for `valid` (at most seven days), and the headers the PUT
    /// must carry.
    pub async fn put_url(
        &self,
        object: &str,
        valid: Duration,
    ) -> Result<(String, Vec<(String, String)>), CacheError> {
        let url = self
            .sign(Method::PUT, object, valid, &self.put_signed)
            .await?;
        Ok((url, self.put_headers.clone()))
    }

    async fn sign(
        &self,
        method: Method,
        object: &str,
        valid: Duration,
        options: &SignedUrlOptions,
    ) -> Result<String, CacheError> {
        let failed = |message: String| CacheError::Sign {
            object: object.to_string(),
            message,
        };
        let path = Path::parse(object).map_err(|e| failed(e.to_string()))?;
        let valid = valid.clamp(Duration::from_secs(1), LONGEST);
        self.signer
            .signed_url_opts(method, &path, valid, options)
            .await
            .map(String::from)
            .map_err(|e| failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Credentials, GcsCredentials, ServerSideEncryption};

    fn s3() -> Store {
        Store::new(&StoreConfig::S3(S3Config {
            server_address: "127.0.0.1:9000".into(),
            bucket: "cache".into(),
            insecure: true,
            credentials: Credentials {
                access_key: "a".into(),
                secret_key: "s".into(),
                session_token: Some("tok".into()),
            },
            encryption: ServerSideEncryption::S3,
            ..S3Config::default()
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn s3_urls_carry_the_token_and_sign_the_encryption_header() {
        let ttl = Duration::from_secs(60);
        let get = s3().get_url("runner/x/project/1/k", ttl).await.unwrap();
        assert!(
            get.starts_with("http://127.0.0.1:9000/cache/runner/x/project/1/k?"),
            "{get}"
        );
        assert!(get.contains("X-Amz-Security-Token=tok"), "{get}");
        let (put, headers) = s3().put_url("k", ttl).await.unwrap();
        assert!(
            put.contains("X-Amz-SignedHeaders=host%3Bx-amz-server-side-encryption"),
            "{put}"
        );
        assert_eq!(
            headers,
            [("x-amz-server-side-encryption".into(), "AES256".into())]
        );
        // A week at most, whatever the job's timeout.
        let long = s3()
            .get_url("k", Duration::from_secs(30 * 86400))
            .await
            .unwrap();
        assert!(long.contains("X-Amz-Expires=604800"), "{long}");
    }

    #[tokio::test]
    async fn azure_urls_are_service_sas_and_puts_name_the_blob_type() {
        let store = Store::new(&StoreConfig::Azure(AzureConfig {
            account_name: "acct".into(),
            account_key: "a2V5".into(),
            container: "cache".into(),
            ..AzureConfig::default()
        }))
        .unwrap();
        let (put, headers) = store.put_url("p/k", Duration::from_secs(60)).await.unwrap();
        assert!(
            put.starts_with("https://acct.blob.core.windows.net/cache/p/k?"),
            "{put}"
        );
        assert!(put.contains("sig="), "{put}");
        assert_eq!(headers, [("x-ms-blob-type".into(), "BlockBlob".into())]);
    }

    #[test]
    fn a_gcs_key_that_is_not_pem_names_private_key() {
        let err = Store::new(&StoreConfig::Gcs(GcsConfig {
            bucket: "b".into(),
            credentials: GcsCredentials::Key {
                access_id: "sa@p.iam.gserviceaccount.com".into(),
                private_key: "not a key".into(),
            },
        }))
        .expect_err("a key that is not PEM is refused");
        assert!(
            err.to_string().contains("[runners.cache.gcs] PrivateKey"),
            "{err}"
        );
    }
}
