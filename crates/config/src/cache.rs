//! `[runners.cache]`, with GitLab's capitalised keys.

use std::fmt;

use serde::Deserialize;

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

impl CacheConfig {
    /// A known `Type` (a distributed one is a warning: the local cache is used) and a size.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        match self.cache_type.as_str() {
            "" => {}
            t @ ("s3" | "gcs" | "azure") => report.warning(
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

#[cfg(test)]
mod tests {
    use crate::problem::parse;
    use crate::testing::{GITLAB_WRITTEN, errors};

    #[test]
    fn distributed_cache_and_unused_keys_are_warnings() {
        let text = GITLAB_WRITTEN
            .replace("MaxUploadedArchiveSize = 0", "Type = \"gcs\"")
            .replace(
                "shell = \"sh\"",
                "shell = \"sh\"\n  pre_get_sources_script = \"x\"",
            );
        let loaded = parse(&text, "config.toml").expect("valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("runners[0].pre_get_sources_script: not supported yet"),
            "{w:?}"
        );
        assert!(
            w[1].contains("runners[0].cache.Type: distributed cache type \"gcs\" is not supported yet; jobs use the local cache in cache_dir"),
            "{w:?}"
        );
        let bad = GITLAB_WRITTEN.replace("shell = \"sh\"", "shell = \"pwsh\"");
        assert!(errors(&bad)[0].contains("shell \"pwsh\" is not supported"));
    }
}
