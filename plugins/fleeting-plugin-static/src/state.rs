//! Which hosts are leased, being cleaned or held back, persisted as `<state_dir>/state.json`.
//!
//! Several plugin processes may share a state dir (managers side by side on one pool, as in a
//! rolling upgrade): each holds `<dir>/lock` shared, changes the file only under the exclusive
//! `<dir>/state.lock` after reading it afresh, and cleans a host only while holding that
//! lease's `<dir>/cleaning-<id>.lock`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

/// Current file format.
const VERSION: u32 = 1;

/// What happens to a leased host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Phase {
    /// Handed out to the taskscaler (`running`).
    Leased,
    /// Given back; the cleanup command runs (`deleting`).
    Cleaning,
    /// The cleanup failed: the host is held out of the free set and the lease is no longer
    /// listed. A restarted plugin retries the cleanup.
    Failed {
        /// Why the last cleanup failed.
        reason: String,
    },
}

/// One lease of one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The host's name under `instances`.
    pub host: String,
    /// Where the lease is.
    #[serde(flatten)]
    pub phase: Phase,
}

/// The whole state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// File format version.
    pub version: u32,
    /// Number of the next lease: ids are `<host>-<n>` and never repeat.
    pub next_lease: u64,
    /// Leases by id.
    pub leases: BTreeMap<String, Lease>,
}

impl Default for State {
    fn default() -> Self {
        State {
            version: VERSION,
            next_lease: 1,
            leases: BTreeMap::new(),
        }
    }
}

impl State {
    /// The lease holding `host`, if any (a host has at most one).
    pub fn lease_of(&self, host: &str) -> Option<&str> {
        self.leases
            .iter()
            .find(|(_, l)| l.host == host)
            .map(|(id, _)| id.as_str())
    }

    /// Take a new lease of `host`; returns its id.
    pub fn lease(&mut self, host: &str) -> String {
        let id = format!("{host}-{}", self.next_lease);
        self.next_lease += 1;
        self.leases.insert(
            id.clone(),
            Lease {
                host: host.to_owned(),
                phase: Phase::Leased,
            },
        );
        id
    }
}

/// A failure reading or writing the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file or its directory could not be read or written.
    #[error("state file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another (older) plugin process holds the state dir exclusively.
    #[error(
        "state_dir {dir} is in use by another plugin process that takes it whole (an older fleeting-plugin-static): stop it first, or give this one its own `name` or `state_dir`"
    )]
    InUse {
        /// The state dir.
        dir: PathBuf,
    },
    /// The file is not a state file of this plugin.
    #[error("state file {path}: not a valid state file ({reason}); move it away to start afresh")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// How long `Init` waits for another process to let go of the state dir (a plugin being
/// replaced may still be exiting).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A plugin process's shared hold on a state dir, released when dropped or when the process
/// dies: an older plugin that takes the dir whole keeps this one out, and the reverse.
#[derive(Debug)]
pub struct DirLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

/// Open (creating it) `path` and `flock` it as `arg`; `None` when another process holds it in a
/// way that excludes `arg`. Blocking.
fn flock(
    path: &Path,
    arg: nix::fcntl::FlockArg,
) -> std::io::Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match nix::fcntl::Flock::lock(file, arg) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(std::io::Error::from(e)),
    }
}

/// Run blocking `f` off the runtime; its error (or the task's) is an error on `path`.
async fn off_runtime<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, StateError> {
    let io = |source| StateError::Io {
        path: path.to_owned(),
        source,
    };
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
        .map_err(io)
}

/// Take `<dir>/lock` shared, waiting up to a few seconds for an exclusive holder to exit; also
/// whether this process was alone on the dir when it came (no other process held it).
pub async fn lock_dir(dir: &Path) -> Result<(DirLock, bool), StateError> {
    use nix::fcntl::FlockArg;
    let path = dir.join("lock");
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        let p = path.clone();
        let attempt = off_runtime(&path, move || {
            // Taken whole for a moment: it tells whether another process holds the dir.
            let alone = flock(&p, FlockArg::LockExclusiveNonblock)?.is_some();
            Ok(flock(&p, FlockArg::LockSharedNonblock)?.map(|lock| (lock, alone)))
        })
        .await?;
        match attempt {
            Some((lock, alone)) => return Ok((DirLock(lock), alone)),
            None if tokio::time::Instant::now() >= deadline => {
                return Err(StateError::InUse {
                    dir: dir.to_owned(),
                });
            }
            None => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}

/// An exclusive lock on a file of the state dir, released when dropped.
#[derive(Debug)]
pub struct FileLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

/// Lock `path` exclusively; `wait`: block until free, else `None` when another process holds
/// it.
async fn lock_file(path: PathBuf, wait: bool) -> Result<Option<FileLock>, StateError> {
    let arg = if wait {
        nix::fcntl::FlockArg::LockExclusive
    } else {
        nix::fcntl::FlockArg::LockExclusiveNonblock
    };
    let p = path.clone();
    off_runtime(&path, move || Ok(flock(&p, arg)?.map(FileLock))).await
}

/// Hold `<dir>/state.lock` to read, change and save the state file, waiting for other
/// processes' changes to finish.
pub async fn lock_state(dir: &Path) -> Result<FileLock, StateError> {
    let path = dir.join("state.lock");
    lock_file(path.clone(), true)
        .await?
        .ok_or_else(|| StateError::Io {
            path,
            source: std::io::Error::other("lock not granted"),
        })
}

/// Hold `<dir>/cleaning-<id>.lock` while cleaning lease `id`; `None` when another process is.
pub async fn lock_cleanup(dir: &Path, id: &str) -> Result<Option<FileLock>, StateError> {
    lock_file(cleanup_lock_path(dir, id), false).await
}

/// Where lease `id`'s cleanup lock lives (removed once the lease is gone).
pub fn cleanup_lock_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("cleaning-{id}.lock"))
}

/// Load the state at `path`; a missing file is an empty state.
pub async fn load(path: &Path) -> Result<State, StateError> {
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(source) => {
            return Err(StateError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let state: State = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    if state.version != VERSION {
        return Err(StateError::Corrupt {
            path: path.to_owned(),
            reason: format!("version {} (this plugin writes {VERSION})", state.version),
        });
    }
    Ok(state)
}

/// Write `state` to `path` atomically: a synced temp file renamed over the old one, so a plugin
/// killed mid-write leaves either the old or the new state, never half of one.
pub async fn save(path: &Path, state: &State) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        path: path.to_owned(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(state).map_err(|e| io(std::io::Error::other(e)))?;
    text.push(b'\n');
    let tmp = path.with_extension("json.tmp");
    let mut f = tokio::fs::File::create(&tmp).await.map_err(io)?;
    f.write_all(&text).await.map_err(io)?;
    f.sync_all().await.map_err(io)?;
    drop(f);
    tokio::fs::rename(&tmp, path).await.map_err(io)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn round_trip_and_ids_never_repeat() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut s = load(&path).await.unwrap();
        assert_eq!(s.lease("web1"), "web1-1");
        assert_eq!(s.lease("web2"), "web2-2");
        s.leases.remove("web1-1");
        assert_eq!(s.lease("web1"), "web1-3");
        s.leases.get_mut("web2-2").unwrap().phase = Phase::Failed {
            reason: "exit code 1".into(),
        };
        save(&path, &s).await.unwrap();
        assert_eq!(load(&path).await.unwrap(), s);
        assert_eq!(s.lease_of("web2"), Some("web2-2"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""state": "failed""#), "{text}");
        std::fs::write(&path, "{").unwrap();
        assert!(
            load(&path)
                .await
                .unwrap_err()
                .to_string()
                .contains("move it away")
        );
    }
}
