//! The `daemon_runs` table: each start and clean stop of weftd, so a start tells a first
//! start from a restart after a clean stop or a crash.

use rusqlite::{OptionalExtension, params};

use super::{Db, now_ms};
use crate::{PreviousRun, StoreError};

impl Db {
    /// Records the start of a daemon run and tells how the previous one ended. Only the
    /// last 100 runs are kept.
    pub fn begin_run(&mut self, version: &str) -> Result<(i64, PreviousRun), StoreError> {
        let tx = self.immediate()?;
        let last: Option<(String, i64, Option<i64>)> = tx
            .query_row(
                "SELECT version, started_at, stopped_at FROM daemon_runs ORDER BY id DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let previous = match last {
            None => PreviousRun::None,
            Some((version, started_at_ms, Some(stopped_at_ms))) => PreviousRun::Stopped {
                version,
                started_at_ms,
                stopped_at_ms,
            },
            Some((version, started_at_ms, None)) => PreviousRun::Crashed { version, started_at_ms },
        };
        tx.prepare_cached("INSERT INTO daemon_runs (version, started_at) VALUES (?1, ?2)")?
            .execute(params![version, now_ms()])?;
        let id = tx.last_insert_rowid();
        tx.prepare_cached("DELETE FROM daemon_runs WHERE id <= ?1 - 100")?
            .execute(params![id])?;
        tx.commit()?;
        Ok((id, previous))
    }

    /// Records that run `id` stopped cleanly.
    pub fn end_run(&mut self, id: i64) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE daemon_runs SET stopped_at = ?1 WHERE id = ?2",
            params![now_ms(), id],
        )?;
        Ok(())
    }

    /// Writes one row without changing it: proves the database file takes writes
    /// again after a failure made the store unwritable (a node that went idle while its
    /// disk was full would otherwise wait for the next CNI call to find out).
    pub fn probe_write(&mut self) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE daemon_runs SET version = version WHERE id = (SELECT max(id) FROM daemon_runs)",
            [],
        )?;
        Ok(())
    }
}
