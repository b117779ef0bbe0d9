//! `[runners.cache]`, with GitLab's capitalised keys.

use std::fmt;

use serde::Deserialize;

use slipway_cache::{
    AzureConfig, Credentials, GcsConfig, GcsCredentials, S3Config, ServerSideEncryption, Store,
    StoreConfig,
};

use crate::problem::Report;

/// `[runners.cache]`, with GitLab's capitalised keys.
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct CacheConfig {
    /// `Type`: empty (local), `s3`, `gcs` or `azure`.
    #[serde(rename = "Type")]
    pub cache_type: String,
    /// `Path`: prefix of cache keys in the bucket.
    #[serde(rename = "Path")]
    pub path: String,
    /// `Shared`: one cache for all runners.
    #[serde(rename = "Shared")]
    pub shared: bool,
    /// `MaxUploadedArchiveSize` in bytes; 0 = unlimited.
    #[serde(rename = "MaxUploadedArchiveSize")]
    pub max_uploaded_archive_size: i64,
    /// `[runners.cache.s3]`, free-form (holds credentials: never printed).
    pub s3: Option<toml::Table>,
    /// `[runners.cache.gcs]`, free-form (holds credentials: never printed).
    pub gcs: Option<toml::Table>,
    /// `[runners.cache.azure]`, free-form (holds credentials: never printed).
    pub azure: Option<toml::Table>,
}

impl fmt::Debug for CacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The provider tables hold access keys: name their keys, never their values.
        let keys =
            |t: &Option<toml::Table>| t.as_ref().map(|t| t.keys().cloned().collect::<Vec<_>>());
        f.debug_struct("CacheConfig")
            .field("cache_type", &self.cache_type)
            .field("path", &self.path)
            .field("shared", &self.shared)
            .field("max_uploaded_archive_size", &self.max_uploaded_archive_size)
            .field("s3_keys", &keys(&self.s3))
            .field("gcs_keys", &keys(&self.gcs))
            .field("azure_keys", &keys(&self.azure))
            .finish()
    }
}

/// `[runners.cache.s3]` as GitLab Runner reads it.
#[derive(Deserialize, Default)]
#[serde(default)]
struct S3Toml {
    #[serde(rename = "ServerAddress")]
    server_address: String,
    #[serde(rename = "AccessKey")]
    access_key: String,
    #[serde(rename = "SecretKey")]
    secret_key: String,
    #[serde(rename = "SessionToken")]
    session_token: String,
    #[serde(rename = "BucketName")]
    bucket_name: String,
    #[serde(rename = "BucketLocation")]
    bucket_location: String,
    #[serde(rename = "Insecure")]
    insecure: bool,
    #[serde(rename = "AuthenticationType")]
    authentication_type: String,
    #[serde(rename = "ServerSideEncryption")]
    server_side_encryption: String,
    #[serde(rename = "ServerSideEncryptionKeyID")]
    server_side_encryption_key_id: String,
    #[serde(rename = "PathStyle")]
    path_style: Option<bool>,
}

/// `[runners.cache.s3]` keys GitLab Runner knows that Slipway does not use.
const S3_UNUSED: &[&str] = &["DualStack", "Accelerate", "RoleARN", "UploadRoleARN"];

/// `[runners.cache.gcs]` as GitLab Runner reads it.
#[derive(Deserialize, Default)]
#[serde(default)]
struct GcsToml {
    #[serde(rename = "CredentialsFile")]
    credentials_file: String,
    #[serde(rename = "AccessID")]
    access_id: String,
    #[serde(rename = "PrivateKey")]
    private_key: String,
    #[serde(rename = "BucketName")]
    bucket_name: String,
}

/// `[runners.cache.azure]` as GitLab Runner reads it, and Slipway's `BlobEndpoint`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct AzureToml {
    #[serde(rename = "AccountName")]
    account_name: String,
    #[serde(rename = "AccountKey")]
    account_key: String,
    #[serde(rename = "ContainerName")]
    container_name: String,
    #[serde(rename = "StorageDomain")]
    storage_domain: String,
    #[serde(rename = "BlobEndpoint")]
    blob_endpoint: String,
}

/// The keys each section knows; any other is a warning (a typo would otherwise go unseen).
const GCS_KEYS: &[&str] = &["CredentialsFile", "AccessID", "PrivateKey", "BucketName"];
const AZURE_KEYS: &[&str] = &[
    "AccountName",
    "AccountKey",
    "ContainerName",
    "StorageDomain",
    "BlobEndpoint",
];

impl CacheConfig {
    /// The bucket of a `Type = "s3"`, `"gcs"` or `"azure"` cache with usable settings, else
    /// `None` (the local cache is used; [`Self::validate`] said why).
    pub fn store_config(&self) -> Option<StoreConfig> {
        self.settings().ok().flatten()
    }

    /// Whether jobs use the distributed cache rather than `cache_dir`.
    pub fn is_distributed(&self) -> bool {
        self.store_config().is_some()
    }

    /// The settings of the cache's `Type`: `Ok(None)` for the local cache, or the key that
    /// keeps it from use, why, and whether that is an error.
    fn settings(&self) -> Result<Option<StoreConfig>, Unusable> {
        fn table<T: serde::de::DeserializeOwned>(
            t: &Option<toml::Table>,
            section: &'static str,
        ) -> Result<T, Unusable> {
            t.clone()
                .unwrap_or_default()
                .try_into::<T>()
                .map_err(|e| (section, e.message().to_string(), true))
        }
        Ok(Some(match self.cache_type.as_str() {
            "s3" => StoreConfig::S3(table::<S3Toml>(&self.s3, "")?.usable()?),
            "gcs" => StoreConfig::Gcs(table::<GcsToml>(&self.gcs, "")?.usable()?),
            "azure" => StoreConfig::Azure(table::<AzureToml>(&self.azure, "")?.usable()?),
            _ => return Ok(None),
        }))
    }

    /// [`Self::settings`], and what only the signer can tell (a key file that cannot be
    /// read, a key that is not PEM or not base64), said with the key's name.
    fn checked_settings(&self) -> Result<(), Unusable> {
        if let Some(config) = self.settings()? {
            Store::new(&config).map_err(|e| match e {
                slipway_cache::CacheError::Config { key, reason, .. } => (key, reason, true),
                other => ("", other.to_string(), true),
            })?;
        }
        Ok(())
    }

    /// A known `Type` with the settings it needs, and a size.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        match self.cache_type.as_str() {
            "" => {}
            t @ ("s3" | "gcs" | "azure") => {
                if let Err((key, why, fatal)) = self.checked_settings() {
                    let at: &[&str] = if key.is_empty() { &[t] } else { &[t, key] };
                    if fatal {
                        report.error(at, why);
                    } else {
                        report.warning(at, why);
                    }
                }
                let section = match t {
                    "s3" => &self.s3,
                    "gcs" => &self.gcs,
                    _ => &self.azure,
                };
                for key in section.iter().flat_map(|s| s.keys()) {
                    let known = match t {
                        "s3" => !S3_UNUSED.contains(&key.as_str()),
                        "gcs" => GCS_KEYS.contains(&key.as_str()),
                        _ => AZURE_KEYS.contains(&key.as_str()),
                    };
                    if t == "s3" && !known {
                        report.warning(&[t, key], "not used by slipway; ignored");
                    } else if !known {
                        report.warning(&[t, key], "unknown key; ignored");
                    }
                }
            }
            other => report.error(
                &["Type"],
                format!("unknown cache type {other:?}; expected \"s3\", \"gcs\" or \"azure\""),
            ),
        }
        if self.max_uploaded_archive_size < 0 {
            report.error(
                &["MaxUploadedArchiveSize"],
                "must be 0 (unlimited) or a size in bytes",
            );
        }
    }
}

/// The key that keeps a cache from use, why, and whether that is an error.
type Unusable = (&'static str, String, bool);

impl S3Toml {
    /// The bucket, or why it cannot be used.
    fn usable(self) -> Result<S3Config, Unusable> {
        if self.bucket_name.trim().is_empty() {
            return Err(("BucketName", "the bucket's name is required".into(), true));
        }
        match self.authentication_type.trim() {
            "" | "access-key" => {
                if self.access_key.trim().is_empty() || self.secret_key.trim().is_empty() {
                    return Err((
                        "AccessKey",
                        "AccessKey and SecretKey are required with access-key authentication"
                            .into(),
                        true,
                    ));
                }
            }
            "iam" => {
                return Err((
                    "AuthenticationType",
                    "\"iam\" (credentials from the instance's metadata) is not supported yet; \
                     set AccessKey and SecretKey. Jobs use the local cache in cache_dir"
                        .into(),
                    false,
                ));
            }
            other => {
                return Err((
                    "AuthenticationType",
                    format!("{other:?}: expected \"access-key\" or \"iam\""),
                    true,
                ));
            }
        }
        let encryption = match self
            .server_side_encryption
            .trim()
            .to_ascii_uppercase()
            .as_str()
        {
            "" => ServerSideEncryption::None,
            "S3" | "AES256" => ServerSideEncryption::S3,
            "KMS" | "AWS:KMS" => {
                ServerSideEncryption::Kms(self.server_side_encryption_key_id.trim().to_string())
            }
            _ => {
                return Err((
                    "ServerSideEncryption",
                    format!(
                        "{:?}: expected \"S3\" or \"KMS\"",
                        self.server_side_encryption
                    ),
                    true,
                ));
            }
        };
        let token = self.session_token.trim();
        Ok(S3Config {
            server_address: self.server_address.trim().to_string(),
            bucket: self.bucket_name.trim().to_string(),
            region: self.bucket_location.trim().to_string(),
            insecure: self.insecure,
            path_style: self.path_style,
            credentials: Credentials {
                access_key: self.access_key.trim().to_string(),
                secret_key: self.secret_key.trim().to_string(),
                session_token: (!token.is_empty()).then(|| token.to_string()),
            },
            encryption,
        })
    }
}

impl GcsToml {
    /// The bucket, or why it cannot be used. `CredentialsFile` wins over `AccessID` and
    /// `PrivateKey`, as in GitLab Runner; with neither, the host's own credentials sign.
    fn usable(self) -> Result<GcsConfig, Unusable> {
        if self.bucket_name.trim().is_empty() {
            return Err(("BucketName", "the bucket's name is required".into(), true));
        }
        let file = self.credentials_file.trim();
        let credentials = if !file.is_empty() {
            GcsCredentials::File(file.into())
        } else {
            match (self.access_id.trim(), self.private_key.trim()) {
                ("", "") => GcsCredentials::Default,
                ("", _) => {
                    return Err((
                        "AccessID",
                        "required with PrivateKey: the service account's e-mail".into(),
                        true,
                    ));
                }
                (_, "") => {
                    return Err((
                        "PrivateKey",
                        "required with AccessID: the service account's PEM key".into(),
                        true,
                    ));
                }
                (id, key) => GcsCredentials::Key {
                    access_id: id.to_string(),
                    // TOML strings keep `\n` escapes as newlines; a key pasted with
                    // literal `\n` (as in a JSON key file) is mended.
                    private_key: key.replace("\\n", "\n"),
                },
            }
        };
        Ok(GcsConfig {
            bucket: self.bucket_name.trim().to_string(),
            credentials,
        })
    }
}

impl AzureToml {
    /// The container, or why it cannot be used.
    fn usable(self) -> Result<AzureConfig, Unusable> {
        if self.account_name.trim().is_empty() {
            return Err((
                "AccountName",
                "the storage account's name is required".into(),
                true,
            ));
        }
        if self.container_name.trim().is_empty() {
            return Err((
                "ContainerName",
                "the container's name is required".into(),
                true,
            ));
        }
        let endpoint = self.blob_endpoint.trim();
        if !endpoint.is_empty()
            && !endpoint.starts_with("https://")
            && !endpoint.starts_with("http://")
        {
            return Err((
                "BlobEndpoint",
                format!("{endpoint:?}: expected a URL (https://host[:port][/path])"),
                true,
            ));
        }
        Ok(AzureConfig {
            account_name: self.account_name.trim().to_string(),
            account_key: self.account_key.trim().to_string(),
            container: self.container_name.trim().to_string(),
            storage_domain: self.storage_domain.trim().to_string(),
            blob_endpoint: endpoint.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::check::parse;
    use crate::testing::{GITLAB_WRITTEN, errors};

    #[test]
    fn s3_caches_as_gitlab_runner_writes_them_are_used() {
        let text = GITLAB_WRITTEN
            .replace("MaxUploadedArchiveSize = 0", "Type = \"s3\"\n    Shared = true")
            .replace(
                "[runners.cache.s3]",
                "[runners.cache.s3]\n      ServerAddress = \"127.0.0.1:9000\"\n      AccessKey = \"AKIA\"\n      SecretKey = \"secret\"\n      BucketName = \"runner\"\n      Insecure = true",
            );
        let loaded = parse(&text, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let cache = loaded.config.runners[0].cache.as_ref().unwrap();
        let Some(slipway_cache::StoreConfig::S3(s3)) = cache.store_config() else {
            panic!("an S3 cache");
        };
        assert_eq!(s3.bucket, "runner");
        assert!(s3.insecure);
        // No bucket: an error naming the key.
        let no_bucket = text.replace("      BucketName = \"runner\"\n", "");
        assert!(
            errors(&no_bucket)
                .iter()
                .any(|e| e.contains("runners[0].cache.s3.BucketName")),
            "{:?}",
            errors(&no_bucket)
        );
        // IAM: a warning, and the local cache.
        let iam = text.replace(
            "Insecure = true",
            "Insecure = true\n      AuthenticationType = \"iam\"",
        );
        let loaded = parse(&iam, "config.toml").expect("valid");
        assert!(loaded.warnings[0].to_string().contains("not supported yet"));
        assert!(
            !loaded.config.runners[0]
                .cache
                .as_ref()
                .unwrap()
                .is_distributed()
        );
    }

    #[test]
    fn gcs_and_azure_caches_are_read_with_gitlab_runners_keys() {
        let gcs = GITLAB_WRITTEN
            .replace("MaxUploadedArchiveSize = 0", "Type = \"gcs\"")
            .replace(
                "[runners.cache.gcs]",
                "[runners.cache.gcs]\n      AccessID = \"sa@p.iam.gserviceaccount.com\"\n      BucketName = \"runner\"",
            )
            .replace(
                "shell = \"sh\"",
                "shell = \"sh\"\n  pre_get_sources_script = \"x\"",
            );
        // AccessID without PrivateKey: an error naming the key that is missing.
        let e = errors(&gcs);
        assert!(
            e.iter()
                .any(|e| e.contains("runners[0].cache.gcs.PrivateKey")),
            "{e:?}"
        );
        // A key that is not PEM: refused when read, naming the key.
        let bad_key = gcs.replace(
            "BucketName = \"runner\"",
            "BucketName = \"runner\"\n      PrivateKey = \"not a key\"",
        );
        let e = errors(&bad_key);
        assert!(
            e.iter()
                .any(|e| e.contains("runners[0].cache.gcs.PrivateKey")),
            "{e:?}"
        );
        // No credentials at all: the host's own (GCE metadata), no warning.
        let ambient = gcs.replace("      AccessID = \"sa@p.iam.gserviceaccount.com\"\n", "");
        let loaded = parse(&ambient, "config.toml").expect("valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert!(w.is_empty(), "{w:?}");
        assert!(
            loaded.config.runners[0]
                .cache
                .as_ref()
                .unwrap()
                .is_distributed()
        );

        let azure = GITLAB_WRITTEN
            .replace("MaxUploadedArchiveSize = 0", "Type = \"azure\"")
            .replace(
                "[runners.cache.azure]",
                "[runners.cache.azure]\n      AccountName = \"acct\"\n      AccountKey = \"a2V5\"\n      ContainerName = \"runner\"\n      StorageDomain = \"blob.core.chinacloudapi.cn\"\n      Contaner = \"typo\"",
            );
        let loaded = parse(&azure, "config.toml").expect("valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("runners[0].cache.azure.Contaner: unknown key; ignored"),
            "{w:?}"
        );
        let Some(slipway_cache::StoreConfig::Azure(a)) = loaded.config.runners[0]
            .cache
            .as_ref()
            .unwrap()
            .store_config()
        else {
            panic!("an Azure cache");
        };
        assert_eq!(a.endpoint(), "https://acct.blob.core.chinacloudapi.cn");
        for (broken, key) in [
            ("AccountKey = \"a2V5\"", "AccountKey = \"not base64!\""),
            ("ContainerName = \"runner\"", ""),
        ] {
            let e = errors(&azure.replace(broken, key));
            let named = if key.is_empty() {
                "ContainerName"
            } else {
                "AccountKey"
            };
            assert!(
                e.iter()
                    .any(|e| e.contains(&format!("runners[0].cache.azure.{named}"))),
                "{e:?}"
            );
        }
        let bad = GITLAB_WRITTEN.replace("shell = \"sh\"", "shell = \"pwsh\"");
        assert!(errors(&bad)[0].contains("shell \"pwsh\" is not supported"));
    }
}
