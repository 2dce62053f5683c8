//! Copying the write-ahead log into the database file off the callers' path. SQLite's
//! own checkpoint runs inside the commit that crosses its threshold: the writer then
//! waits for the log and the database to be synced to disk (1.5 ms on average, 4 ms at
//! worst, measured during ADDs), once every forty-odd ADDs, which was an ADD's p99. A
//! thread of its own with its own connection checkpoints passively every
//! [`PERIOD`] instead (never waiting for the writer, never making it wait), and the
//! writer's own checkpoint is left as a backstop for a log that grows past
//! [`WRITER_BACKSTOP_PAGES`] anyway.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

use rusqlite::Connection;

use crate::StoreError;

/// How often the log is copied into the database.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);

/// The log size (pages) at which the writer still checkpoints by itself: forty times
/// SQLite's default, far above what [`PERIOD`] lets the log reach at a thousand ADDs a
/// second, so it only acts when the checkpointer cannot.
pub(crate) const WRITER_BACKSTOP_PAGES: u32 = 40_000;

/// The checkpointing thread; it ends when this is dropped (with the last clone of the
/// store).
pub(crate) struct Checkpointer {
    _stop: Sender<()>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path` (already in WAL mode).
    pub(crate) fn start(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        // A checkpoint meeting a writer's lock gives up at once and tries next period.
        conn.busy_timeout(Duration::ZERO)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("weft-checkpoint".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(PERIOD) {
                    if let Err(e) = checkpoint(&conn) {
                        // The writer's own checkpoint stays as a backstop, and a disk that is
                        // full or failing shows in the writer's jobs, which report it.
                        tracing::debug!(error = %e, "a passive checkpoint of the store failed");
                    }
                }
            });
        spawned.map_err(StoreError::Checkpointer)?;
        Ok(Self { _stop: stop })
    }
}

/// One passive checkpoint: copies what the log holds beyond any reader's snapshot.
/// Returns (log frames, frames checkpointed).
pub(crate) fn checkpoint(conn: &Connection) -> Result<(i64, i64), rusqlite::Error> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(1)?, r.get(2)?)))
}
