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
mod file;
mod ownership;
mod restore;

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use self::file::{
    check_existing, create_file, lock_file, migrate, open_lock_file, restrict_permissions,
};
use self::ownership::{MINE_OR_ADOPTABLE, owner_slot};
use serde::{Deserialize, Serialize};
use slipway_fleeting::{ConnectInfo, ConnectorConfig, State};

pub use async_store::AsyncStateStore;
pub use ownership::Ownership;
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

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whose state this is.
    pub fn identity(&self) -> &StoreIdentity {
        &self.identity
    }

    fn db(&self) -> impl Fn(rusqlite::Error) -> StoreError + Copy + '_ {
        db_error(&self.path)
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
        let db = db_error(&self.path);
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
        let db = db_error(&self.path);
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
        let db = db_error(&self.path);
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

/// A database error on the store at `path`.
fn db_error(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + Copy + '_ {
    move |source| StoreError::Database {
        path: path.to_path_buf(),
        source,
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
