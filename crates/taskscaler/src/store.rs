//! Persistent taskscaler state: instances, use counts, acquisitions and undelivered job reports.
//!
//! A [`StateStore`] is one SQLite file per runner and instance group (default
//! `<dir>/<runner key>/state.sqlite`, see [`StateStore::default_path`]) in WAL mode with
//! `synchronous=FULL`: every record is durable when its method returns, so the scaler writes it
//! *before* the action takes effect (write-ahead). After a crash, [`StateStore::load`] and
//! [`plan_restore`] decide which instances to adopt, which to delete and which jobs failed.
//!
//! The file is refused — never overwritten — when it belongs to another runner or group, is not an
//! SQLite database, is corrupt, or has a schema version this build does not know. A new file is
//! built under a temporary name and linked into place only when complete. Connect info (with
//! credentials) is stored as is, so the file and its WAL are kept at mode 0600 and the connect info
//! is never logged. A sidecar `<file>.lock` holds a shared advisory lock while the store is open:
//! managers of this version share the file, a build that takes it whole (schema 1) is kept out.
//!
//! Several managers may share one store (a rolling upgrade: the new one starts while the old one
//! drains). Each instance row names its `owner`, the manager that created or adopted it; each
//! owner holds a lease in `owners`, renewed while it runs. A manager reads and writes only its
//! own instances, never another live owner's; it adopts an instance once its owner released it
//! (a drained manager gives its instances up) or let its lease run out (a crashed one).
//!
//! [`AsyncStateStore`] runs a store on one dedicated OS thread so async code never blocks on disk
//! and calls are applied in the order they were made.

mod async_store;
mod restore;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use slipway_fleeting::{ConnectInfo, ConnectorConfig, State};

pub use async_store::AsyncStateStore;
pub use restore::{DeleteReason, RestorePlan, plan_restore};

/// Schema version this build reads and writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 2;

/// `PRAGMA application_id` of a Slipway state store ("SLPW").
pub const APPLICATION_ID: i64 = 0x534C_5057;

/// File name of the store inside the per-runner directory.
pub const FILE_NAME: &str = "state.sqlite";

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

const SCHEMA: &str = "
CREATE TABLE meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;
CREATE TABLE instances (
    id            TEXT PRIMARY KEY NOT NULL,
    state         TEXT NOT NULL,
    use_count     INTEGER NOT NULL CHECK (use_count >= 0),
    created_at_ms INTEGER NOT NULL,
    connect_info  BLOB,
    removing      INTEGER NOT NULL DEFAULT 0,
    owner         TEXT
) STRICT;
CREATE TABLE owners (
    owner          TEXT PRIMARY KEY NOT NULL,
    lease_until_ms INTEGER NOT NULL
) STRICT;
CREATE TABLE acquisitions (
    key            TEXT PRIMARY KEY NOT NULL,
    instance_id    TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    slot           INTEGER NOT NULL,
    job_ref        TEXT NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    UNIQUE (instance_id, slot)
) STRICT;
CREATE TABLE reports (
    job_id        TEXT PRIMARY KEY NOT NULL,
    state_json    TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
) STRICT;
";

/// Schema 1 → 2: instances get an owner (none: adoptable), owners their leases.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE instances ADD COLUMN owner TEXT;
CREATE TABLE owners (
    owner          TEXT PRIMARY KEY NOT NULL,
    lease_until_ms INTEGER NOT NULL
) STRICT;
";

/// An instance row this store's owner may use: its own, released, or of an owner whose lease
/// ran out (`?1`: this owner, `?2`: now in unix ms).
const MINE_OR_ADOPTABLE: &str = "(owner IS NULL OR owner = ?1 OR owner NOT IN
    (SELECT owner FROM owners WHERE lease_until_ms > ?2 AND owner != ?1))";

/// Whose state a store holds. A file written under one identity is refused under another.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreIdentity {
    /// Stable runner key, e.g. `https://gitlab.example.com|42` (URL and runner id) or the name.
    pub runner: String,
    /// Plugin name.
    pub plugin: String,
    /// Instance group id (`ProviderInfo.id`).
    pub group_id: String,
}

impl fmt::Display for StoreIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "runner {:?}, plugin {:?}, group {:?}",
            self.runner, self.plugin, self.group_id
        )
    }
}

/// One instance as last recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRecord {
    /// Instance id.
    pub id: String,
    /// State at last sight.
    pub state: State,
    /// Jobs this instance has been given so far.
    pub use_count: u64,
    /// Creation time, unix milliseconds.
    pub created_at_ms: i64,
    /// How to connect to it (credentials included; its `Debug` masks them). `None` until known.
    pub connect_info: Option<ConnectInfo>,
    /// Deletion has been decided.
    pub removing: bool,
}

/// A job holding a slot on an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquisitionRecord {
    /// Acquisition (reservation) key.
    pub key: String,
    /// Instance the slot is on.
    pub instance_id: String,
    /// Slot index on the instance.
    pub slot: u32,
    /// Opaque job reference, e.g. the job id.
    pub job_ref: String,
    /// When the slot was acquired, unix milliseconds.
    pub acquired_at_ms: i64,
}

/// A job's final state that must still be delivered to the job source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReport {
    /// Job id.
    pub job_id: String,
    /// Final state, JSON as given to [`StateStore::put_report`].
    pub state_json: String,
    /// When the report was first stored, unix milliseconds.
    pub created_at_ms: i64,
}

/// Everything a store holds about instances, as read by [`StateStore::load`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Instances, oldest first.
    pub instances: Vec<InstanceRecord>,
    /// Acquisitions, oldest first.
    pub acquisitions: Vec<AcquisitionRecord>,
}

/// Other managers sharing a store, as [`StateStore::ownership`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Other owners whose leases run.
    pub others: Vec<String>,
    /// Instances those owners hold: not to be used, removed or adopted.
    pub foreign: Vec<String>,
}

/// Owner names a store's managers take on one host, at most.
const MAX_OWNER_SLOTS: u32 = 64;

/// The lowest owner name `<host>#<n>` whose lock no other process holds, with that lock.
fn owner_slot(path: &Path) -> Result<(String, File), StoreError> {
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    for n in 0..MAX_OWNER_SLOTS {
        let lock = sibling(path, &format!(".owner-{n}.lock"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock)
            .map_err(|source| io_err(&lock, "open owner lock", source))?;
        match file.try_lock() {
            Ok(()) => return Ok((format!("{host}#{n}"), file)),
            Err(fs::TryLockError::WouldBlock) => continue,
            Err(fs::TryLockError::Error(source)) => {
                return Err(io_err(&lock, "lock owner name", source));
            }
        }
    }
    Err(StoreError::Locked {
        path: path.to_path_buf(),
        lock: sibling(path, ".owner-N.lock"),
    })
}

/// Why a store could not be opened or a record not written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system operation failed.
    #[error("state store {path}: {op}: {source}")]
    Io {
        /// File concerned.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Cause.
        source: io::Error,
    },
    /// The identity passed to [`StateStore::open`] is unusable.
    #[error("state store identity {0}: runner and group id must not be empty")]
    InvalidIdentity(StoreIdentity),
    /// Another process has the store open.
    #[error(
        "state store {path} is in use by another process (lock {lock} is held); \
         is another manager running with the same runner and state_storage.dir?"
    )]
    Locked {
        /// Store file.
        path: PathBuf,
        /// Lock file.
        lock: PathBuf,
    },
    /// The file is not an SQLite database. It was left untouched.
    #[error(
        "refusing state store {path}: not an SQLite database (found {found}); file left untouched"
    )]
    NotSqlite {
        /// Store file.
        path: PathBuf,
        /// What the file holds instead.
        found: String,
    },
    /// The file is an SQLite database, but not a Slipway state store.
    #[error(
        "refusing state store {path}: not a Slipway state store (found {found}); file left untouched"
    )]
    NotAStateStore {
        /// Store file.
        path: PathBuf,
        /// What the database holds instead.
        found: String,
    },
    /// The file is a damaged SQLite database.
    #[error("refusing state store {path}: database is corrupt ({detail}); file left untouched")]
    Corrupt {
        /// Store file.
        path: PathBuf,
        /// What the check found.
        detail: String,
    },
    /// The file was written with a schema version this build does not know.
    #[error(
        "refusing state store {path}: schema version {found}, this build knows version {supported}; \
         file left untouched"
    )]
    UnknownSchema {
        /// Store file.
        path: PathBuf,
        /// Version in the file.
        found: i64,
        /// Version this build knows.
        supported: i64,
    },
    /// The file belongs to another runner, plugin or instance group.
    #[error(
        "refusing state store {path}: it belongs to {stored}, not to {ours}; \
         file left untouched (use another state_storage.dir, or move the file away)"
    )]
    ForeignIdentity {
        /// Store file.
        path: PathBuf,
        /// Identity in the file.
        stored: Box<StoreIdentity>,
        /// Identity this manager opened it with.
        ours: Box<StoreIdentity>,
    },
    /// SQLite failed.
    #[error("state store {path}: {source}")]
    Database {
        /// Store file.
        path: PathBuf,
        /// Cause.
        source: rusqlite::Error,
    },
    /// No instance with this id is recorded.
    #[error("state store: no instance {0:?} recorded")]
    UnknownInstance(String),
    /// Another manager sharing the store holds the instance (its lease runs).
    #[error("state store: instance {0:?} belongs to another manager")]
    OwnedByOther(String),
    /// The instance is being removed and takes no new jobs.
    #[error("state store: instance {0:?} is being removed")]
    InstanceRemoving(String),
    /// An acquisition with this key is already recorded.
    #[error("state store: acquisition {0:?} already recorded")]
    DuplicateAcquisition(String),
    /// The slot already holds an acquisition.
    #[error(
        "state store: slot {slot} of instance {instance:?} is already held by acquisition {holder:?}"
    )]
    SlotTaken {
        /// Instance id.
        instance: String,
        /// Slot index.
        slot: u32,
        /// Key holding the slot.
        holder: String,
    },
    /// The store's thread is gone ([`AsyncStateStore`] was closed).
    #[error("state store is closed")]
    Closed,
}

/// The taskscaler's state file. Every write is one durable transaction.
pub struct StateStore {
    conn: Connection,
    path: PathBuf,
    identity: StoreIdentity,
    /// The journal is a write-ahead log, whose commits are synced in order.
    wal: bool,
    /// The manager writing through this handle: its instances are the ones it may use.
    owner: String,
    // Held for the store's lifetime: the advisory lock on `<path>.lock`.
    _lock: File,
    // Held for the store's lifetime: the owner name's lock (`<path>.owner-<n>.lock`).
    _owner_lock: Option<File>,
}

impl fmt::Debug for StateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateStore")
            .field("path", &self.path)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Unix milliseconds of `t` (0 before the epoch, saturating far in the future).
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

impl StateStore {
    /// Default store path: `<dir>/<runner key>/state.sqlite`. A runner key that is not a plain
    /// file name (e.g. contains `/` or `:`) is made one and suffixed with a stable hash of the key.
    pub fn default_path(dir: impl AsRef<Path>, runner: &str) -> PathBuf {
        dir.as_ref().join(runner_dir_name(runner)).join(FILE_NAME)
    }

    /// Open the store at `path`, creating it (and its directory, mode 0700) if missing.
    ///
    /// An existing file is checked before anything is written to it: it must be an intact SQLite
    /// database with the Slipway application id, schema version [`SCHEMA_VERSION`] and `identity`.
    ///
    /// The handle's owner is `<host>#<n>`, `n` the lowest not held by another process on this
    /// host: a manager restarted after a crash gets its old name back (and its instances at
    /// once), a second manager running beside it gets a name of its own.
    pub fn open(path: impl AsRef<Path>, identity: &StoreIdentity) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let mut store = Self::open_as(path, identity, "")?;
        let (owner, lock) = owner_slot(path)?;
        store.owner = owner;
        store._owner_lock = Some(lock);
        Ok(store)
    }

    /// [`StateStore::open`] for `owner`, the manager that uses the store through this handle.
    pub fn open_as(
        path: impl AsRef<Path>,
        identity: &StoreIdentity,
        owner: &str,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if identity.runner.is_empty() || identity.group_id.is_empty() {
            return Err(StoreError::InvalidIdentity(identity.clone()));
        }
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
            && !parent.exists()
        {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|source| io_err(parent, "create directory", source))?;
        }
        let lock = lock_file(&path)?;
        match fs::metadata(&path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(StoreError::NotSqlite {
                    path,
                    found: "something that is not a regular file".into(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_file(&path, identity)?,
            Err(source) => return Err(io_err(&path, "stat", source)),
        }
        let mut conn = check_existing(&path, identity)?;
        let db = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        // Other managers write too: wait for their short transactions rather than fail.
        conn.busy_timeout(Duration::from_secs(10)).map_err(db)?;
        migrate(&mut conn).map_err(db)?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "wal", |r| r.get(0))
            .map_err(db)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), journal_mode = %mode, "state store: WAL mode unavailable");
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(db)?;
        conn.pragma_update(None, "foreign_keys", true).map_err(db)?;
        restrict_permissions(&path)?;
        Ok(StateStore {
            conn,
            path,
            identity: identity.clone(),
            wal: mode.eq_ignore_ascii_case("wal"),
            owner: owner.to_owned(),
            _lock: lock,
            _owner_lock: None,
        })
    }

    /// The manager writing through this handle.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Hold (or renew) this owner's lease for `lease` from now (the wall clock every owner's
    /// lease is read against): its instances are not adopted by another manager before then.
    pub fn renew_lease(&mut self, lease: Duration) -> Result<(), StoreError> {
        let until_ms =
            now_ms().saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
        self.conn
            .execute(
                "INSERT INTO owners (owner, lease_until_ms) VALUES (?1, ?2)
                 ON CONFLICT (owner) DO UPDATE SET lease_until_ms = excluded.lease_until_ms",
                params![self.owner, until_ms],
            )
            .map_err(self.db())?;
        Ok(())
    }

    /// Give this owner's instances up (a manager that drained and stops): another manager may
    /// adopt them at once. Returns how many were released.
    pub fn release_ownership(&mut self) -> Result<usize, StoreError> {
        let path = self.path.clone();
        let db = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let n = tx
            .execute(
                "UPDATE instances SET owner = NULL WHERE owner = ?1",
                [&self.owner],
            )
            .map_err(db)?;
        tx.execute("DELETE FROM owners WHERE owner = ?1", [&self.owner])
            .map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(n)
    }

    /// Who holds what: other owners whose leases run, and the instances they hold.
    pub fn ownership(&self) -> Result<Ownership, StoreError> {
        let now = now_ms();
        let db = self.db();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT owner FROM owners WHERE lease_until_ms > ?2 AND owner != ?1
                 ORDER BY owner",
            )
            .map_err(&db)?;
        let others: Vec<String> = stmt
            .query_map(params![self.owner, now], |r| r.get(0))
            .map_err(&db)?
            .collect::<Result<_, _>>()
            .map_err(&db)?;
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT id FROM instances WHERE NOT {MINE_OR_ADOPTABLE} ORDER BY id"
            ))
            .map_err(&db)?;
        let foreign = stmt
            .query_map(params![self.owner, now], |r| r.get(0))
            .map_err(&db)?
            .collect::<Result<_, _>>()
            .map_err(&db)?;
        Ok(Ownership { others, foreign })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whose state this is.
    pub fn identity(&self) -> &StoreIdentity {
        &self.identity
    }

    fn db(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Database {
            path: self.path.clone(),
            source,
        }
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            detail,
        }
    }

    /// Record an instance (insert or update). The use count never goes down (the larger of the
    /// stored and given count is kept), `removing` is never cleared once set, and a `None`
    /// connect info keeps the stored one.
    pub fn record_instance(&mut self, rec: &InstanceRecord) -> Result<(), StoreError> {
        let connect = rec
            .connect_info
            .as_ref()
            .map(encode_connect_info)
            .transpose()
            .map_err(|e| self.corrupt(format!("cannot encode connect info: {e}")))?;
        let use_count = i64::try_from(rec.use_count).unwrap_or(i64::MAX);
        self.conn
            .execute(
                &format!(
                    "INSERT INTO instances
                        (id, state, use_count, created_at_ms, connect_info, removing, owner)
                     VALUES (?3, ?4, ?5, ?6, ?7, ?8, ?1)
                     ON CONFLICT (id) DO UPDATE SET
                        state = excluded.state,
                        use_count = max(use_count, excluded.use_count),
                        connect_info = coalesce(excluded.connect_info, connect_info),
                        removing = removing OR excluded.removing,
                        owner = excluded.owner
                     WHERE {MINE_OR_ADOPTABLE}"
                ),
                params![
                    self.owner,
                    now_ms(),
                    rec.id,
                    rec.state.as_str(),
                    use_count,
                    rec.created_at_ms,
                    connect,
                    rec.removing
                ],
            )
            .map_err(self.db())
            .and_then(|n| {
                if n == 0 {
                    Err(StoreError::OwnedByOther(rec.id.clone()))
                } else {
                    Ok(())
                }
            })
    }

    /// Record that the job `job_ref` acquired `slot` of `instance` under `key`: in one transaction
    /// the instance's use count goes up by one and the acquisition is inserted. Returns the new use
    /// count. Refused for an unknown or removing instance, a duplicate key or a held slot.
    pub fn increment_use(
        &mut self,
        instance: &str,
        key: &str,
        slot: u32,
        job_ref: &str,
    ) -> Result<u64, StoreError> {
        let path = self.path.clone();
        let db = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let found: Option<(bool, bool)> = tx
            .query_row(
                &format!("SELECT removing, {MINE_OR_ADOPTABLE} FROM instances WHERE id = ?3"),
                params![self.owner, now_ms(), instance],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(db)?;
        match found {
            None => return Err(StoreError::UnknownInstance(instance.to_owned())),
            Some((_, false)) => return Err(StoreError::OwnedByOther(instance.to_owned())),
            Some((true, _)) => return Err(StoreError::InstanceRemoving(instance.to_owned())),
            Some((false, true)) => {}
        }
        let dup: Option<String> = tx
            .query_row("SELECT key FROM acquisitions WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db)?;
        if dup.is_some() {
            return Err(StoreError::DuplicateAcquisition(key.to_owned()));
        }
        let holder: Option<String> = tx
            .query_row(
                "SELECT key FROM acquisitions WHERE instance_id = ?1 AND slot = ?2",
                params![instance, slot],
                |r| r.get(0),
            )
            .optional()
            .map_err(db)?;
        if let Some(holder) = holder {
            return Err(StoreError::SlotTaken {
                instance: instance.to_owned(),
                slot,
                holder,
            });
        }
        let count: i64 = tx
            .query_row(
                "UPDATE instances SET use_count = use_count + 1, owner = ?2 WHERE id = ?1
                 RETURNING use_count",
                params![instance, self.owner],
                |r| r.get(0),
            )
            .map_err(db)?;
        tx.execute(
            "INSERT INTO acquisitions (key, instance_id, slot, job_ref, acquired_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key, instance, slot, job_ref, now_ms()],
        )
        .map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Remove the acquisition `key`. Returns whether it was recorded.
    ///
    /// In WAL mode it is written without its own fsync: the next synced commit (the next acquisition, say) makes
    /// it durable, as the WAL is synced in order. Until then a power loss leaves the acquisition
    /// held, which a restart already handles like a manager that died before releasing. This
    /// keeps a release from adding a disk flush in front of the next job's acquisition.
    pub fn release(&mut self, key: &str) -> Result<bool, StoreError> {
        // A rollback journal without syncs can be corrupted by a power loss: only in WAL mode.
        let relaxed = self.wal;
        if relaxed {
            self.conn
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(self.db())?;
        }
        let n = self
            .conn
            .execute("DELETE FROM acquisitions WHERE key = ?1", [key])
            .map_err(self.db());
        if relaxed {
            self.conn
                .pragma_update(None, "synchronous", "FULL")
                .map_err(self.db())?;
        }
        Ok(n? > 0)
    }

    /// Mark an instance as being removed (before asking the plugin to delete it). Returns whether
    /// the instance is recorded.
    pub fn mark_removing(&mut self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                &format!("UPDATE instances SET removing = 1 WHERE id = ?3 AND {MINE_OR_ADOPTABLE}"),
                params![self.owner, now_ms(), id],
            )
            .map_err(self.db())?;
        Ok(n > 0)
    }

    /// Delete an instance and its acquisitions (once the plugin no longer lists it). Returns
    /// whether the instance was recorded.
    pub fn forget_instance(&mut self, id: &str) -> Result<bool, StoreError> {
        let path = self.path.clone();
        let db = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let mine = format!("id = ?3 AND {MINE_OR_ADOPTABLE}");
        tx.execute(
            &format!("DELETE FROM acquisitions WHERE instance_id IN (SELECT id FROM instances WHERE {mine})"),
            params![self.owner, now_ms(), id],
        )
        .map_err(db)?;
        let n = tx
            .execute(
                &format!("DELETE FROM instances WHERE {mine}"),
                params![self.owner, now_ms(), id],
            )
            .map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(n > 0)
    }

    /// Read every instance this owner may use (its own and adoptable ones) with their
    /// acquisitions.
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        self.load_where(MINE_OR_ADOPTABLE)
    }

    /// Read the instances this owner may adopt: not its own, given up by their owner or held
    /// past its lease; with their acquisitions (jobs of a manager that died).
    pub fn load_adoptable(&self) -> Result<Snapshot, StoreError> {
        self.load_where(&format!(
            "(owner IS NULL OR owner != ?1) AND {MINE_OR_ADOPTABLE}"
        ))
    }

    /// Instances matching `filter` (SQL over `instances`, `?1` this owner, `?2` now).
    fn load_where(&self, filter: &str) -> Result<Snapshot, StoreError> {
        let db = self.db();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT id, state, use_count, created_at_ms, connect_info, removing
                 FROM instances WHERE {filter} ORDER BY created_at_ms, id"
            ))
            .map_err(&db)?;
        type Row = (String, String, i64, i64, Option<Vec<u8>>, bool);
        let now = now_ms();
        let rows = stmt
            .query_map(params![self.owner, now], |r| -> rusqlite::Result<Row> {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .map_err(&db)?
            .collect::<Result<Vec<Row>, _>>()
            .map_err(&db)?;
        let mut instances = Vec::with_capacity(rows.len());
        for (id, state, use_count, created_at_ms, connect, removing) in rows {
            let state = parse_state(&state)
                .ok_or_else(|| self.corrupt(format!("instance {id:?} has state {state:?}")))?;
            let connect_info = connect
                .map(|b| decode_connect_info(&b))
                .transpose()
                .map_err(|e| {
                    self.corrupt(format!("instance {id:?}: unreadable connect info: {e}"))
                })?;
            instances.push(InstanceRecord {
                id,
                state,
                use_count: u64::try_from(use_count).unwrap_or(0),
                created_at_ms,
                connect_info,
                removing,
            });
        }
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT key, instance_id, slot, job_ref, acquired_at_ms
                 FROM acquisitions WHERE instance_id IN
                    (SELECT id FROM instances WHERE {filter})
                 ORDER BY acquired_at_ms, key"
            ))
            .map_err(&db)?;
        let acquisitions = stmt
            .query_map(params![self.owner, now], |r| {
                Ok(AcquisitionRecord {
                    key: r.get(0)?,
                    instance_id: r.get(1)?,
                    slot: r.get(2)?,
                    job_ref: r.get(3)?,
                    acquired_at_ms: r.get(4)?,
                })
            })
            .map_err(&db)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&db)?;
        Ok(Snapshot {
            instances,
            acquisitions,
        })
    }

    /// Store a job's final state for delivery (replacing an earlier one for the same job).
    pub fn put_report(&mut self, job_id: &str, state_json: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO reports (job_id, state_json, created_at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (job_id) DO UPDATE SET state_json = excluded.state_json",
                params![job_id, state_json, now_ms()],
            )
            .map_err(self.db())?;
        Ok(())
    }

    /// Every report still to deliver, oldest first. They stay stored until [`Self::ack_report`].
    pub fn take_reports(&self) -> Result<Vec<PendingReport>, StoreError> {
        let db = self.db();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT job_id, state_json, created_at_ms FROM reports
                 ORDER BY created_at_ms, job_id",
            )
            .map_err(&db)?;
        let reports = stmt
            .query_map([], |r| {
                Ok(PendingReport {
                    job_id: r.get(0)?,
                    state_json: r.get(1)?,
                    created_at_ms: r.get(2)?,
                })
            })
            .map_err(&db)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&db)?;
        Ok(reports)
    }

    /// The report for `job_id` was delivered: drop it. Returns whether it was stored.
    pub fn ack_report(&mut self, job_id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute("DELETE FROM reports WHERE job_id = ?1", [job_id])
            .map_err(self.db())?;
        Ok(n > 0)
    }

    /// Apply a [`RestorePlan`] in one transaction: store `reports` (job id, final state JSON —
    /// typically the failure of each of `plan.failed_jobs`), drop the failed acquisitions, forget
    /// `plan.forget`, mark the recorded instances of `plan.delete` as removing and update the
    /// state of `plan.adopt`, claiming them for this owner. Returns the instances of the plan
    /// another live owner holds by now (it adopted them first): they are not this owner's.
    pub fn apply_restore(
        &mut self,
        plan: &RestorePlan,
        reports: &[(String, String)],
    ) -> Result<Vec<String>, StoreError> {
        let path = self.path.clone();
        let db = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let now = now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        for (job_id, json) in reports {
            tx.execute(
                "INSERT INTO reports (job_id, state_json, created_at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (job_id) DO UPDATE SET state_json = excluded.state_json",
                params![job_id, json, now],
            )
            .map_err(db)?;
        }
        let held_by_other = |id: &str| -> rusqlite::Result<bool> {
            tx.query_row(
                &format!("SELECT NOT {MINE_OR_ADOPTABLE} FROM instances WHERE id = ?3"),
                params![self.owner, now, id],
                |r| r.get(0),
            )
            .optional()
            .map(|v| v.unwrap_or(false))
        };
        let mut lost = Vec::new();
        for id in plan
            .delete
            .iter()
            .map(|(id, _)| id)
            .chain(plan.adopt.iter().map(|r| &r.id))
            .chain(&plan.forget)
        {
            if held_by_other(id).map_err(db)? {
                lost.push(id.clone());
            }
        }
        for a in &plan.failed_jobs {
            if lost.contains(&a.instance_id) {
                continue;
            }
            tx.execute("DELETE FROM acquisitions WHERE key = ?1", [&a.key])
                .map_err(db)?;
        }
        for id in plan.forget.iter().filter(|id| !lost.contains(id)) {
            tx.execute("DELETE FROM acquisitions WHERE instance_id = ?1", [id])
                .map_err(db)?;
            tx.execute("DELETE FROM instances WHERE id = ?1", [id])
                .map_err(db)?;
        }
        for (id, _) in &plan.delete {
            tx.execute(
                &format!(
                    "UPDATE instances SET removing = 1, owner = ?1 WHERE id = ?3
                     AND {MINE_OR_ADOPTABLE}"
                ),
                params![self.owner, now, id],
            )
            .map_err(db)?;
        }
        for rec in &plan.adopt {
            tx.execute(
                &format!(
                    "UPDATE instances SET state = ?4, owner = ?1 WHERE id = ?3
                     AND {MINE_OR_ADOPTABLE}"
                ),
                params![self.owner, now, rec.id, rec.state.as_str()],
            )
            .map_err(db)?;
        }
        tx.commit().map_err(db)?;
        Ok(lost)
    }
}

fn io_err(path: &Path, op: &'static str, source: io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// `<path>` with `suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Directory name for a runner key: the key itself when it is a plain, short file name, else a
/// sanitized prefix plus a stable FNV-1a hash of the whole key. Other per-runner state (the
/// GitLab source's) uses it too, so every runner directory is named one way.
pub fn runner_dir_name(runner: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !runner.is_empty()
        && runner.len() <= 64
        && !runner.starts_with('.')
        && runner.chars().all(plain)
    {
        return runner.to_owned();
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in runner.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let prefix: String = runner
        .chars()
        .map(|c| if plain(c) { c } else { '_' })
        .take(48)
        .collect();
    format!("{}-{hash:016x}", prefix.trim_start_matches('.'))
}

fn lock_file(path: &Path) -> Result<File, StoreError> {
    let lock = sibling(path, ".lock");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock)
        .map_err(|source| io_err(&lock, "open lock file", source))?;
    match file.try_lock_shared() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(StoreError::Locked {
            path: path.to_path_buf(),
            lock,
        }),
        Err(fs::TryLockError::Error(source)) => Err(io_err(&lock, "lock", source)),
    }
}

/// Removes a temporary file unless disarmed.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(&p);
            let _ = fs::remove_file(sibling(&p, "-journal"));
        }
    }
}

/// Build a new store under a temporary name and link it into place (never replacing a file).
fn create_file(path: &Path, identity: &StoreIdentity) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| FILE_NAME.to_owned());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos();
    let tmp = dir.join(format!(".{name}.tmp-{}-{nanos}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|source| io_err(&tmp, "create", source))?;
    let mut guard = TempGuard(Some(tmp.clone()));
    let db = |source| StoreError::Database {
        path: tmp.clone(),
        source,
    };
    let mut conn = Connection::open_with_flags(
        &tmp,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(db)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(db)?;
    let tx = conn.transaction().map_err(db)?;
    tx.execute_batch(SCHEMA).map_err(db)?;
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(db)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(db)?;
    for (k, v) in [
        ("runner", &identity.runner),
        ("plugin", &identity.plugin),
        ("group_id", &identity.group_id),
        ("created_at_ms", &now_ms().to_string()),
    ] {
        tx.execute("INSERT INTO meta (key, value) VALUES (?1, ?2)", [k, v])
            .map_err(db)?;
    }
    tx.commit().map_err(db)?;
    conn.close().map_err(|(_, source)| db(source))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|source| io_err(&tmp, "sync", source))?;
    match fs::hard_link(&tmp, path) {
        Ok(()) => {}
        // Someone else created it meanwhile: theirs is checked like any existing file.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(source) => return Err(io_err(path, "link into place", source)),
    }
    drop(guard.0.take());
    fs::remove_file(&tmp).map_err(|source| io_err(&tmp, "remove", source))?;
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| io_err(&dir, "sync directory", source))?;
    tracing::info!(path = %path.display(), %identity, "created taskscaler state store");
    Ok(())
}

/// Bring a schema-1 file to schema 2 (once, whoever gets there first).
fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == 1 {
        tx.execute_batch(MIGRATE_1_TO_2)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()
}

/// Check an existing file without writing to it, and open it.
fn check_existing(path: &Path, identity: &StoreIdentity) -> Result<Connection, StoreError> {
    let mut header = Vec::with_capacity(100);
    File::open(path)
        .and_then(|f| f.take(100).read_to_end(&mut header))
        .map_err(|source| io_err(path, "read", source))?;
    if !header.starts_with(SQLITE_MAGIC) {
        let found = if header.is_empty() {
            "an empty file".to_owned()
        } else {
            let hex: Vec<String> = header.iter().take(8).map(|b| format!("{b:02x}")).collect();
            format!("{} bytes starting with {}", file_len(path), hex.join(" "))
        };
        return Err(StoreError::NotSqlite {
            path: path.to_path_buf(),
            found,
        });
    }
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    if header.len() < 100 {
        return Err(corrupt(format!(
            "truncated: {} bytes, shorter than the SQLite header",
            header.len()
        )));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| corrupt(e.to_string()))?;
    let read = |sql: &str| -> Result<i64, StoreError> {
        conn.query_row(sql, [], |r| r.get(0))
            .map_err(|e| corrupt(e.to_string()))
    };
    let app_id = read("PRAGMA application_id")?;
    let version = read("PRAGMA user_version")?;
    if app_id != APPLICATION_ID {
        let tables = read("SELECT count(*) FROM sqlite_schema")?;
        return Err(StoreError::NotAStateStore {
            path: path.to_path_buf(),
            found: format!(
                "an SQLite database with application_id {app_id:#x}, user_version {version} and {tables} schema objects"
            ),
        });
    }
    // Schema 1 is migrated once the file is known to be intact.
    if version != SCHEMA_VERSION && version != 1 {
        return Err(StoreError::UnknownSchema {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let problems: Vec<String> = {
        let mut stmt = conn
            .prepare("PRAGMA integrity_check(10)")
            .map_err(|e| corrupt(e.to_string()))?;
        stmt.query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| corrupt(e.to_string()))?
    };
    if problems != ["ok"] {
        let problems = problems.join("; ").replace('\n', " ");
        return Err(corrupt(format!("integrity check: {problems}")));
    }
    let meta = |key: &str| -> Result<String, StoreError> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| corrupt(e.to_string()))?
            .ok_or_else(|| corrupt(format!("no {key} in the meta table")))
    };
    let stored = StoreIdentity {
        runner: meta("runner")?,
        plugin: meta("plugin")?,
        group_id: meta("group_id")?,
    };
    if &stored != identity {
        return Err(StoreError::ForeignIdentity {
            path: path.to_path_buf(),
            stored: Box::new(stored),
            ours: Box::new(identity.clone()),
        });
    }
    Ok(conn)
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Keep the store (and its WAL files) readable by the owner only: it holds credentials.
fn restrict_permissions(path: &Path) -> Result<(), StoreError> {
    for p in [
        path.to_path_buf(),
        sibling(path, "-wal"),
        sibling(path, "-shm"),
    ] {
        match fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                tracing::warn!(path = %p.display(), mode = format_args!("{:o}", m.permissions().mode() & 0o777), "state store readable by others; setting mode 0600");
                fs::set_permissions(&p, fs::Permissions::from_mode(0o600))
                    .map_err(|source| io_err(&p, "chmod", source))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(io_err(&p, "stat", source)),
        }
    }
    Ok(())
}

fn parse_state(s: &str) -> Option<State> {
    Some(match s {
        "creating" => State::Creating,
        "running" => State::Running,
        "deleting" => State::Deleting,
        "deleted" => State::Deleted,
        "timeout" => State::Timeout,
        _ => return None,
    })
}

/// On-disk form of [`ConnectInfo`] (version 1).
#[derive(Serialize, Deserialize)]
struct ConnectInfoV1 {
    id: String,
    os: String,
    arch: String,
    protocol: String,
    protocol_port: u16,
    username: String,
    password: String,
    key: Vec<u8>,
    use_static_credentials: bool,
    keepalive_ms: u64,
    timeout_ms: u64,
    internal_addr: String,
    external_addr: String,
    expires_ms: Option<i64>,
}

fn encode_connect_info(c: &ConnectInfo) -> Result<Vec<u8>, serde_json::Error> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    serde_json::to_vec(&ConnectInfoV1 {
        id: c.id.clone(),
        os: c.connector.os.clone(),
        arch: c.connector.arch.clone(),
        protocol: c.connector.protocol.clone(),
        protocol_port: c.connector.protocol_port,
        username: c.connector.username.clone(),
        password: c.connector.password.clone(),
        key: c.connector.key.clone(),
        use_static_credentials: c.connector.use_static_credentials,
        keepalive_ms: ms(c.connector.keepalive),
        timeout_ms: ms(c.connector.timeout),
        internal_addr: c.internal_addr.clone(),
        external_addr: c.external_addr.clone(),
        expires_ms: c.expires.map(unix_ms),
    })
}

fn decode_connect_info(b: &[u8]) -> Result<ConnectInfo, serde_json::Error> {
    let v: ConnectInfoV1 = serde_json::from_slice(b)?;
    Ok(ConnectInfo {
        id: v.id,
        connector: ConnectorConfig {
            os: v.os,
            arch: v.arch,
            protocol: v.protocol,
            protocol_port: v.protocol_port,
            username: v.username,
            password: v.password,
            key: v.key,
            use_static_credentials: v.use_static_credentials,
            keepalive: Duration::from_millis(v.keepalive_ms),
            timeout: Duration::from_millis(v.timeout_ms),
        },
        internal_addr: v.internal_addr,
        external_addr: v.external_addr,
        expires: v
            .expires_ms
            .map(|ms| UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
    })
}

#[cfg(test)]
mod tests;
