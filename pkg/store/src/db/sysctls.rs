//! The `sysctls` table: kernel settings weftd changed, with the value it found before
//! its first change, so it can put each back once it no longer needs it (a restart
//! without the flag that wanted it, or an uninstall), even after a crash.

use rusqlite::{OptionalExtension, params};

use super::{Db, now_ms};
use crate::StoreError;

impl Db {
    /// Records that weftd is about to change sysctl `name`, which holds `original`.
    /// A value recorded already is kept: it is what the node had before weft.
    pub fn remember_sysctl(&mut self, name: &str, original: &str) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        tx.prepare_cached("INSERT OR IGNORE INTO sysctls (name, original, changed_at) VALUES (?1, ?2, ?3)")?
            .execute(params![name, original, now_ms()])?;
        tx.commit()?;
        Ok(())
    }

    /// The value sysctl `name` had before weftd changed it, if weftd did.
    pub fn remembered_sysctl(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT original FROM sysctls WHERE name = ?1")?
            .query_row(params![name], |r| r.get(0))
            .optional()?)
    }

    /// Every sysctl weftd changed, with the value it found: `(name, original)`.
    pub fn remembered_sysctls(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, original FROM sysctls ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets sysctl `name` once its original value is back.
    pub fn forget_sysctl(&mut self, name: &str) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        tx.prepare_cached("DELETE FROM sysctls WHERE name = ?1")?
            .execute(params![name])?;
        tx.commit()?;
        Ok(())
    }
}
