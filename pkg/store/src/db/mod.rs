//! The state operations, on one SQLite connection, one module per table: the handle
//! and its transactions here, each table's operations in its own module. Every write is
//! one `BEGIN IMMEDIATE` transaction, so a crash leaves either all of it or none of it.

mod addresses;
mod attachments;
mod links;
mod ports;
mod ready;
mod rebuild;
mod runs;
mod sysctls;
mod wires;

#[cfg(test)]
pub(crate) use ready::LOG_KEPT;
pub use rebuild::RebuiltAttachment;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::StoreError;
use crate::schema;

/// An open state database.
pub struct Db {
    conn: Connection,
    schema_found: u32,
    /// The last [`Db::ready_pods`] answer, kept up to date from the connection's log.
    ready_cache: Option<ready::ReadyCache>,
    /// Whether this connection logs what [`Db::ready_pods`] reads (from its first call).
    ready_log: bool,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn key_blob(k: u128) -> [u8; 16] {
    k.to_be_bytes()
}

fn blob_key(b: &[u8]) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    u128::from_be_bytes(a)
}

fn join<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

impl Db {
    /// Opens (creating if needed) the database at `path` and migrates it.
    ///
    /// WAL with `synchronous=NORMAL`: a committed transaction survives the daemon being
    /// killed at any instruction; only a power loss may drop the last commits, and a
    /// power loss takes every pod down with it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every statement of a job is taken from the cache rather than parsed again:
        // parsing was a quarter of the store's CPU in an ADD/DEL profile. Room for all
        // of the store's statements.
        conn.set_prepared_statement_cache_capacity(128);
        let schema_found = schema::migrate(&mut conn)?;
        Ok(Self {
            conn,
            schema_found,
            ready_cache: None,
            ready_log: false,
        })
    }

    /// Sets the log size (pages) at which a commit checkpoints by itself.
    pub(crate) fn set_autocheckpoint(&mut self, pages: u32) -> Result<(), StoreError> {
        self.conn.pragma_update(None, "wal_autocheckpoint", pages)?;
        Ok(())
    }

    /// The schema version the database had before this open migrated it (0 = new).
    pub fn schema_found(&self) -> u32 {
        self.schema_found
    }

    fn immediate(&mut self) -> Result<Transaction<'_>, StoreError> {
        Ok(self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    /// Runs raw SQL (tests: leaving a transaction open, as a job that panics half-way
    /// through hand-written SQL would).
    #[cfg(test)]
    pub(crate) fn execute_raw(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.conn.execute_batch(sql)?)
    }

    /// The first column of the first row of `sql` (tests: counting rows).
    #[cfg(test)]
    pub(crate) fn count_raw(&mut self, sql: &str) -> i64 {
        self.conn.query_row(sql, [], |r| r.get(0)).expect("count_raw")
    }

    /// Rows changed by every statement on the connection so far: the writer compares it
    /// across a job to tell whether the job wrote.
    pub(crate) fn total_changes(&self) -> u64 {
        self.conn.total_changes()
    }

    /// Rolls back a transaction left open (by a job that panicked half-way), so the
    /// connection serves the next job.
    pub(crate) fn roll_back_open_transaction(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}
