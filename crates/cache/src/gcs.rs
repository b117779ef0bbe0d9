//! A Google Cloud Storage bucket as `[runners.cache.gcs]` describes it.

use std::path::PathBuf;

use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder};

use crate::CacheError;
use crate::connector::Connector;

/// How a GCS cache signs its URLs, in GitLab Runner's order of precedence.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum GcsCredentials {
    /// `CredentialsFile`: a service account's JSON key file.
    File(PathBuf),
    /// `AccessID` (the service account's e-mail) and `PrivateKey` (its PEM key).
    Key {
        /// `AccessID`.
        access_id: String,
        /// `PrivateKey`.
        private_key: String,
    },
    /// Neither: the application default credentials (the instance's service account on
    /// GCE, signing through the IAM `signBlob` API).
    #[default]
    Default,
}

impl std::fmt::Debug for GcsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key never reaches a log.
        match self {
            GcsCredentials::File(p) => f.debug_tuple("File").field(p).finish(),
            GcsCredentials::Key { access_id, .. } => f
                .debug_struct("Key")
                .field("access_id", access_id)
                .finish_non_exhaustive(),
            GcsCredentials::Default => f.write_str("Default"),
        }
    }
}

/// The settings of a GCS cache.
#[derive(Debug, Clone, Default)]
pub struct GcsConfig {
    /// `BucketName`.
    pub bucket: String,
    /// `CredentialsFile`, or `AccessID` and `PrivateKey`.
    pub credentials: GcsCredentials,
}

impl GcsConfig {
    /// The bucket as `object_store` signs for it (V4 signatures). A key file may name another
    /// server in `gcs_base_url`, as GCS emulators expect.
    pub(crate) fn build(&self) -> Result<GoogleCloudStorage, CacheError> {
        let mut b = GoogleCloudStorageBuilder::new()
            .with_bucket_name(self.bucket.trim())
            .with_http_connector(Connector);
        let key = match &self.credentials {
            GcsCredentials::File(path) => {
                b = b.with_service_account_path(path.display().to_string());
                "CredentialsFile"
            }
            GcsCredentials::Key {
                access_id,
                private_key,
            } => {
                let key = serde_json::json!({
                    "type": "service_account",
                    "client_email": access_id.trim(),
                    "private_key": private_key,
                    "private_key_id": "",
                });
                b = b.with_service_account_key(key.to_string());
                "PrivateKey"
            }
            GcsCredentials::Default => "CredentialsFile",
        };
        b.build().map_err(|e| CacheError::Config {
            section: "gcs",
            key,
            reason: e.to_string(),
        })
    }
}
