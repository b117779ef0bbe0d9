//! `[runners.cache]`, with GitLab's capitalised keys.

use std::fmt;

use serde::Deserialize;

use slipway_cache::{Credentials, S3Config, ServerSideEncryption};

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

impl CacheConfig {
    /// The S3 bucket of a `Type = "s3"` cache with usable settings, else `None` (the local
    /// cache is used; [`Self::validate`] said why).
    pub fn s3_config(&self) -> Option<S3Config> {
        if self.cache_type != "s3" {
            return None;
        }
        self.s3_toml().ok().and_then(|t| t.usable().ok())
    }

    /// Whether jobs use the distributed cache rather than `cache_dir`.
    pub fn is_distributed(&self) -> bool {
        self.s3_config().is_some()
    }

    fn s3_toml(&self) -> Result<S3Toml, String> {
        self.s3
            .clone()
            .unwrap_or_default()
            .try_into::<S3Toml>()
            .map_err(|e| e.message().to_string())
    }

    /// A known `Type` with the settings it needs, and a size.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        match self.cache_type.as_str() {
            "" => {}
            "s3" => match self.s3_toml() {
                Err(e) => report.error(&["s3"], e),
                Ok(t) => {
                    if let Err((key, why, fatal)) = t.usable() {
                        if fatal {
                            report.error(&["s3", key], why);
                        } else {
                            report.warning(&["s3", key], why);
                        }
                    }
                    for key in S3_UNUSED {
                        if self.s3.as_ref().is_some_and(|t| t.contains_key(*key)) {
                            report.warning(&["s3", key], "not used by slipway; ignored");
                        }
                    }
                }
            },
            t @ ("gcs" | "azure") => report.warning(
                &["Type"],
                format!(
                    "distributed cache type {t:?} is not supported yet; jobs use the local cache in cache_dir"
                ),
            ),
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

impl S3Toml {
    /// The bucket, or the key that keeps it from use, why, and whether that is an error.
    fn usable(self) -> Result<S3Config, (&'static str, String, bool)> {
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
        let s3 = cache.s3_config().expect("an S3 cache");
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
    fn a_distributed_cache_this_version_lacks_is_a_warning_and_get_sources_hooks_are_not() {
        let text = GITLAB_WRITTEN
            .replace("MaxUploadedArchiveSize = 0", "Type = \"gcs\"")
            .replace(
                "shell = \"sh\"",
                "shell = \"sh\"\n  pre_get_sources_script = \"x\"",
            );
        let loaded = parse(&text, "config.toml").expect("valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("runners[0].cache.Type: distributed cache type \"gcs\" is not supported yet; jobs use the local cache in cache_dir"),
            "{w:?}"
        );
        let bad = GITLAB_WRITTEN.replace("shell = \"sh\"", "shell = \"pwsh\"");
        assert!(errors(&bad)[0].contains("shell \"pwsh\" is not supported"));
    }
}
