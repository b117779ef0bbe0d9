//! Managers sharing a store: owner names, leases, and who holds which instance.

use std::fs::{self, File};
use std::path::Path;
use std::time::Duration;

use rusqlite::{TransactionBehavior, params};

use super::{StateStore, StoreError, db_error, now_ms, open_lock_file, sibling};

/// An instance row this store's owner may use: its own, released, or of an owner whose lease
/// ran out (`?1`: this owner, `?2`: now in unix ms).
pub(super) const MINE_OR_ADOPTABLE: &str = "(owner IS NULL OR owner = ?1 OR owner NOT IN
    (SELECT owner FROM owners WHERE lease_until_ms > ?2 AND owner != ?1))";

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
pub(super) fn owner_slot(path: &Path) -> Result<(String, File), StoreError> {
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    for n in 0..MAX_OWNER_SLOTS {
        let lock = sibling(path, &format!(".owner-{n}.lock"));
        let file = open_lock_file(&lock)?;
        match file.try_lock() {
            Ok(()) => return Ok((format!("{host}#{n}"), file)),
            Err(fs::TryLockError::WouldBlock) => continue,
            Err(fs::TryLockError::Error(source)) => {
                return Err(super::io_err(&lock, "lock owner name", source));
            }
        }
    }
    Err(StoreError::Locked {
        path: path.to_path_buf(),
        lock: sibling(path, ".owner-N.lock"),
    })
}

impl StateStore {
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
        let db = db_error(&self.path);
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
}
