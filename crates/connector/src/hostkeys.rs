//! Trust-on-first-use pinning of instance host keys.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use russh::keys::{HashAlg, PublicKey};

use crate::error::HostKeyStoreError;

/// Host keys pinned per instance id, shared by every [`crate::Client`] of a manager.
///
/// The first connection to an instance id records the key the server presents; later
/// connections to that id must present the same key. Cloning shares the store. With a file
/// ([`HostKeyStore::open`]) pins survive restarts: one `instance_id key-type base64` line each.
#[derive(Debug, Clone, Default)]
pub struct HostKeyStore {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: Mutex<HashMap<String, PublicKey>>,
    path: Option<PathBuf>,
    // Serialises rewrites of the file so a slower writer cannot overwrite a newer snapshot.
    write: tokio::sync::Mutex<()>,
}

/// Outcome of checking a presented key against the store.
pub(crate) enum Check {
    /// Matches the pinned key.
    Known,
    /// First use: the key is now pinned (and must be persisted).
    Pinned,
    /// Differs from the pinned key, whose fingerprint is given.
    Mismatch(String),
}

impl HostKeyStore {
    /// An empty store kept in memory only.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store persisted to `path`, loading the pins already there (a missing file is empty).
    pub async fn open(path: impl Into<PathBuf>) -> Result<Self, HostKeyStoreError> {
        let path = path.into();
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(HostKeyStoreError::Io { path, source }),
        };
        let keys = parse(&path, &text)?;
        Ok(Self {
            inner: Arc::new(Inner {
                keys: Mutex::new(keys),
                path: Some(path),
                write: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// SHA256 fingerprint of the key pinned for `instance`, if any.
    pub fn fingerprint(&self, instance: &str) -> Option<String> {
        self.lock().get(instance).map(fingerprint)
    }

    /// Ids of all pinned instances, sorted.
    pub fn instances(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Drop the pin of a deleted instance (ids may be reused by a provider); true if one existed.
    pub async fn forget(&self, instance: &str) -> Result<bool, HostKeyStoreError> {
        let existed = self.lock().remove(instance).is_some();
        if existed {
            self.persist().await?;
        }
        Ok(existed)
    }

    /// Compare `key` with the pin of `instance`, pinning it on first use (in memory only; the
    /// caller persists with [`HostKeyStore::persist`] when [`Check::Pinned`] is returned).
    pub(crate) fn check(
        &self,
        instance: &str,
        key: &PublicKey,
    ) -> Result<Check, HostKeyStoreError> {
        valid_id(instance)?;
        let mut keys = self.lock();
        match keys.get(instance) {
            // Compare key data only: the comment is not part of the key's identity.
            Some(pinned) if pinned.key_data() == key.key_data() => Ok(Check::Known),
            Some(pinned) => Ok(Check::Mismatch(fingerprint(pinned))),
            None => {
                let mut key = key.clone();
                key.set_comment("");
                keys.insert(instance.to_owned(), key);
                Ok(Check::Pinned)
            }
        }
    }

    /// Write the current pins to the store file, if there is one (atomically: temp + rename).
    pub(crate) async fn persist(&self) -> Result<(), HostKeyStoreError> {
        let Some(path) = &self.inner.path else {
            return Ok(());
        };
        let _guard = self.inner.write.lock().await;
        // Snapshot under the lock so the file reflects a consistent state of the map.
        let text = {
            let keys = self.lock();
            let mut lines: Vec<String> = keys
                .iter()
                .map(|(id, key)| format!("{id} {}\n", openssh_no_comment(key)))
                .collect();
            lines.sort();
            lines.concat()
        };
        let tmp = tmp_path(path);
        let io = |source| HostKeyStoreError::Io {
            path: path.clone(),
            source,
        };
        tokio::fs::write(&tmp, text).await.map_err(io)?;
        tokio::fs::rename(&tmp, path).await.map_err(io)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, PublicKey>> {
        // A panic while holding this lock cannot leave the map half-updated (single inserts and
        // removes), so recovering from poisoning is safe.
        self.inner
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// SHA256 fingerprint in OpenSSH's `SHA256:...` form.
pub(crate) fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

fn openssh_no_comment(key: &PublicKey) -> String {
    let mut key = key.clone();
    key.set_comment("");
    key.to_openssh()
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn valid_id(instance: &str) -> Result<(), HostKeyStoreError> {
    if instance.is_empty() || instance.chars().any(char::is_whitespace) {
        return Err(HostKeyStoreError::BadInstanceId(instance.to_owned()));
    }
    Ok(())
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn parse(path: &Path, text: &str) -> Result<HashMap<String, PublicKey>, HostKeyStoreError> {
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |reason: String| HostKeyStoreError::Parse {
            path: path.to_owned(),
            line: n + 1,
            reason,
        };
        let mut fields = line.split_whitespace();
        let (Some(id), Some(kind), Some(b64), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(err("expected `instance_id key-type base64`".into()));
        };
        let key = PublicKey::from_openssh(&format!("{kind} {b64}"))
            .map_err(|e| err(format!("bad public key: {e}")))?;
        keys.insert(id.to_owned(), key);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC7IrjaU0rjDuVWXHYKkIuiRLkgWwRJg4g1v1e/J3OA2";
    const K2: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILEff+uz7UdZIsNnM/ADiApT23XznNvTT9/d5En35ptm";

    #[tokio::test]
    async fn pins_on_first_use_and_detects_mismatch_and_persists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known");
        let k1 = PublicKey::from_openssh(K1).unwrap();
        let k2 = PublicKey::from_openssh(K2).unwrap();
        let store = HostKeyStore::open(&path).await.unwrap();
        assert!(matches!(store.check("a", &k1).unwrap(), Check::Pinned));
        store.persist().await.unwrap();
        assert!(matches!(store.check("a", &k1).unwrap(), Check::Known));
        assert!(
            matches!(store.check("a", &k2).unwrap(), Check::Mismatch(fp) if fp == fingerprint(&k1))
        );
        assert!(store.check("has space", &k1).is_err());

        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("a {K1}\n"));
        let reopened = HostKeyStore::open(&path).await.unwrap();
        assert_eq!(reopened.fingerprint("a"), Some(fingerprint(&k1)));
        assert!(reopened.forget("a").await.unwrap());
        assert!(!reopened.forget("a").await.unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        assert!(matches!(reopened.check("a", &k2).unwrap(), Check::Pinned));
    }

    #[tokio::test]
    async fn bad_file_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known");
        std::fs::write(&path, format!("a {K1}\nb ssh-ed25519\n")).unwrap();
        let err = HostKeyStore::open(&path).await.unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
