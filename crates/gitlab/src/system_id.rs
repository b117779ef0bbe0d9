//! The runner's stable `system_id` (`s_` + 12 hex characters), created once and kept in a file.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::GitlabError;

/// A runner manager's identity towards GitLab: `s_` followed by 12 lowercase hex characters.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SystemId(String);

impl SystemId {
    /// Parses an id; `None` unless it is `s_`/`r_` + 12 hex characters.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let rest = text
            .strip_prefix("s_")
            .or_else(|| text.strip_prefix("r_"))?;
        (rest.len() == 12 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| Self(text.to_string()))
    }

    /// A fresh random id (`s_` + 12 hex characters).
    pub fn generate() -> Self {
        // RandomState is seeded from the OS's randomness: enough for an identifier.
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        hasher.write_u32(std::process::id());
        Self(format!("s_{:012x}", hasher.finish() & 0xffff_ffff_ffff))
    }

    /// Reads the id from `path`, or creates the file with a fresh id if it does not exist yet.
    /// An existing file with invalid contents is an error (never silently replaced: the id is the
    /// runner's identity in GitLab).
    pub async fn load_or_create(path: &Path) -> Result<Self, GitlabError> {
        let err = |message: String| GitlabError::SystemId {
            path: path.to_path_buf(),
            message,
        };
        match tokio::fs::read_to_string(path).await {
            Ok(text) => Self::parse(&text).ok_or_else(|| {
                err(format!(
                    "not a system id (want s_ + 12 hex characters): {:?}",
                    text.trim().chars().take(40).collect::<String>()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = Self::generate();
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    // The manager's state directory: owner only from creation on.
                    tokio::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(dir)
                        .await
                        .map_err(|e| err(format!("create directory: {e}")))?;
                }
                // Write to a temporary file and rename, so a crash never leaves a partial id.
                let tmp = path.with_extension("tmp");
                let mut file = tokio::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .await
                    .map_err(|e| err(format!("write: {e}")))?;
                tokio::io::AsyncWriteExt::write_all(&mut file, format!("{}\n", id.0).as_bytes())
                    .await
                    .map_err(|e| err(format!("write: {e}")))?;
                drop(file);
                tokio::fs::rename(&tmp, path)
                    .await
                    .map_err(|e| err(format!("rename: {e}")))?;
                Ok(id)
            }
            Err(e) => Err(err(format!("read: {e}"))),
        }
    }

    /// The id as sent to GitLab.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SystemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SystemId({})", self.0)
    }
}

impl fmt::Display for SystemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_have_gitlab_shape() {
        let id = SystemId::generate();
        assert_eq!(id.as_str().len(), 14);
        assert!(SystemId::parse(id.as_str()).is_some());
        assert!(SystemId::parse("s_12345").is_none());
        assert!(SystemId::parse("x_0123456789ab").is_none());
        assert!(SystemId::parse("s_0123456789zz").is_none());
    }

    #[tokio::test]
    async fn created_once_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/.runner_system_id");
        let a = SystemId::load_or_create(&path).await.unwrap();
        let b = SystemId::load_or_create(&path).await.unwrap();
        assert_eq!(a, b);
        std::fs::write(&path, "garbage").unwrap();
        let e = SystemId::load_or_create(&path).await.unwrap_err();
        assert!(e.to_string().contains("not a system id"), "{e}");
    }
}
