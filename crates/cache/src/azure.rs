//! An Azure Blob Storage container as `[runners.cache.azure]` describes it.

use object_store::azure::{MicrosoftAzure, MicrosoftAzureBuilder};

use crate::CacheError;
use crate::connector::Connector;

/// The settings of an Azure cache.
#[derive(Clone, Default)]
pub struct AzureConfig {
    /// `AccountName`.
    pub account_name: String,
    /// `AccountKey` (base64); empty: the identity of the host (managed identity, or a
    /// service principal in the environment), signing with a user delegation key.
    pub account_key: String,
    /// `ContainerName`.
    pub container: String,
    /// `StorageDomain`; empty: `blob.core.windows.net`.
    pub storage_domain: String,
    /// `BlobEndpoint` (Slipway's): the account's URL in full, for an emulator or a private
    /// endpoint (`http://127.0.0.1:10000/devstoreaccount1`); it wins over `StorageDomain`.
    pub blob_endpoint: String,
}

impl std::fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The account key never reaches a log.
        f.debug_struct("AzureConfig")
            .field("account_name", &self.account_name)
            .field("container", &self.container)
            .field("storage_domain", &self.storage_domain)
            .field("blob_endpoint", &self.blob_endpoint)
            .finish_non_exhaustive()
    }
}

impl AzureConfig {
    /// The account's URL: `https://<AccountName>.<StorageDomain>`, as GitLab Runner makes it.
    pub fn endpoint(&self) -> String {
        let blob = self.blob_endpoint.trim().trim_end_matches('/');
        if !blob.is_empty() {
            return blob.to_string();
        }
        let domain = match self.storage_domain.trim().trim_matches('.') {
            "" => "blob.core.windows.net",
            d => d,
        };
        format!("https://{}.{domain}", self.account_name.trim())
    }

    /// The headers every PUT carries: Azure stores one block blob per PUT.
    pub(crate) fn put_headers(&self) -> Vec<(String, String)> {
        vec![("x-ms-blob-type".into(), "BlockBlob".into())]
    }

    /// The container as `object_store` signs for it (service SAS).
    pub(crate) fn build(&self) -> Result<MicrosoftAzure, CacheError> {
        let endpoint = self.endpoint();
        let mut b = MicrosoftAzureBuilder::new()
            .with_account(self.account_name.trim())
            .with_container_name(self.container.trim())
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint)
            .with_http_connector(Connector);
        let key = self.account_key.trim();
        if !key.is_empty() {
            b = b.with_access_key(key);
        }
        b.build().map_err(|e| CacheError::Config {
            section: "azure",
            key: if key.is_empty() {
                "AccountName"
            } else {
                "AccountKey"
            },
            reason: e.to_string(),
        })
    }
}
