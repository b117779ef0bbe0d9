//! The store's file: creating it, checking an existing one, migrating its schema, its locks
//! and permissions.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::{
    APPLICATION_ID, FILE_NAME, MIGRATE_1_TO_2, SCHEMA, SCHEMA_VERSION, SQLITE_MAGIC, StoreError,
    StoreIdentity, io_err, now_ms, sibling,
};

/// Open (creating it, mode 0600) the lock file `lock`.
pub(super) fn open_lock_file(lock: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(lock)
        .map_err(|source| io_err(lock, "open lock file", source))
}

/// Take `<path>.lock` shared: managers of this version share the store, a schema-1 build
/// holding it whole keeps them out.
pub(super) fn lock_file(path: &Path) -> Result<File, StoreError> {
    let lock = sibling(path, ".lock");
    let file = open_lock_file(&lock)?;
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
pub(super) fn create_file(path: &Path, identity: &StoreIdentity) -> Result<(), StoreError> {
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
pub(super) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
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
pub(super) fn check_existing(
    path: &Path,
    identity: &StoreIdentity,
) -> Result<Connection, StoreError> {
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
pub(super) fn restrict_permissions(path: &Path) -> Result<(), StoreError> {
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
