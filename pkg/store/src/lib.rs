//! Node state for weft in SQLite: address ranges, pod attachments and the address
//! allocations that tie them together, host ports, wire ends, daemon runs and the
//! kernel settings weftd changed (one module per table under `db/`).
//!
//! One connection serves the whole daemon: callers run closures over [`Db`] on it one
//! at a time ([`Store::run`]), under a lock, on their own thread. SQLite allows one
//! writer at a time anyway; a single connection means no lock contention can ever
//! surface as `SQLITE_BUSY` to a CNI call.

mod addr;
mod attachment;
mod checkpoint;
mod damage;
mod db;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use addr::{capacity, gateway, narrowest_range, pool};
pub use attachment::{
    Allocation, Attachment, AttachmentKey, BeginAdd, Family, HeldPort, InstalledRoute, NewAttachment, PodRef,
    PortMapping, PortRequest, RangeUsage, ReadyPod, ReadyPods, State,
};
pub use damage::{MovedAside, damage, move_aside_if_damaged};
pub use db::{Db, RebuiltAttachment};

/// How the daemon's previous run ended, as the store remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreviousRun {
    /// None: this is the node's first start (or its state was wiped).
    None,
    /// It stopped cleanly.
    Stopped {
        /// Its version.
        version: String,
        /// When it started (Unix ms).
        started_at_ms: i64,
        /// When it stopped (Unix ms).
        stopped_at_ms: i64,
    },
    /// It never recorded a clean stop: killed, crashed, or the node went down.
    Crashed {
        /// Its version.
        version: String,
        /// When it started (Unix ms).
        started_at_ms: i64,
    },
}
pub use schema::CURRENT_VERSION as SCHEMA_VERSION;

/// What can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database was written by a newer weft.
    #[error("state database has schema version {found}, this weft knows only up to {known}; refusing to touch it")]
    TooNew {
        /// Version found in the file.
        found: u32,
        /// Newest version this binary knows.
        known: u32,
    },
    /// The thread that checkpoints the store could not be started.
    #[error("starting the store's checkpoint thread: {0}")]
    Checkpointer(std::io::Error),
    /// A damaged database file could not be moved aside.
    #[error("moving the damaged state database {path} aside: {source}")]
    MoveAside {
        /// The damaged file.
        path: PathBuf,
        /// Why the rename failed.
        source: std::io::Error,
    },
    /// No range of a family has a free address.
    #[error("no free {family} address in {}", ranges.join(", "))]
    Exhausted {
        /// The family that ran out.
        family: Family,
        /// The ranges of that family that were tried.
        ranges: Vec<String>,
    },
    /// A host port is held by another pod.
    #[error("host port {mapping} is already held by {holder}")]
    PortTaken {
        /// The mapping asked for (`host:port/proto`).
        mapping: String,
        /// Who holds it (`namespace/pod`, or the container id).
        holder: String,
    },
    /// A requested address is held by another attachment.
    #[error("requested address {address} is held by {holder}")]
    AddressTaken {
        /// The address asked for.
        address: std::net::IpAddr,
        /// Who holds it, for people (`pod namespace/name (network ..., interface ...)`).
        holder: String,
        /// The holding attachment.
        key: AttachmentKey,
        /// Whether the holder is being torn down (the address frees up once it is).
        deleting: bool,
    },
    /// A requested address is not one the network's ranges give to pods.
    #[error("{0}")]
    AddressInvalid(String),
    /// A VXLAN network id is held by another wire end of the node.
    #[error("VNI {vni} is held by wire {holder:#x}")]
    VniTaken {
        /// The VNI.
        vni: u32,
        /// The wire id holding it.
        holder: u64,
    },
    /// A stored wire end names a kind or state this binary does not know (a store
    /// written by a newer weftd, or a damaged one).
    #[error("wire {id:#x} in the state store: {source}")]
    UnknownWireName {
        /// The wire id of the row.
        id: u64,
        /// The name that did not parse.
        source: weft_link::UnknownName,
    },
    /// A run-time link setting in the store does not read (written by a newer weftd,
    /// or a damaged one).
    #[error("link settings of wire {id:#x} in the state store: {what}")]
    BadLinkSettings {
        /// The wire id of the row.
        id: u64,
        /// What did not parse.
        what: String,
    },
    /// A host port cannot be set up for this pod.
    #[error("host port {0}")]
    PortInvalid(String),
    /// An attachment row vanished under an operation that needed it.
    #[error("attachment {0} does not exist")]
    Missing(i64),
    /// The store went down (a panic outside a job's transaction took it down).
    #[error("state store is closed")]
    Closed,
    /// The job panicked (a bug): that call failed, its transaction was rolled back, and
    /// the store serves the next ones.
    #[error("state store job failed: {0}")]
    Panicked(String),
}

/// Runs `f`, turning a panic into [`StoreError::Panicked`]: one bad job must fail its own
/// call, not close the store for every later one.
fn guarded<R>(db: &mut Db, f: impl FnOnce(&mut Db) -> Result<R, StoreError>) -> Result<R, StoreError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(db))) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panicked".to_string());
            // A transaction the job left open would refuse every later one.
            db.roll_back_open_transaction();
            tracing::error!(error = %msg, "a state store job panicked; its call fails, the store goes on");
            Err(StoreError::Panicked(msg))
        }
    }
}

/// Whether a job's error says the database cannot be written: the disk is full or
/// failing, the file was made read-only, cannot be opened, or is not (or no longer) a
/// database. Errors of the job's own making (a taken port, an exhausted range) and
/// transient ones (a busy lock) say nothing about the database.
fn cannot_write(err: &StoreError) -> bool {
    use rusqlite::ErrorCode::*;
    match err {
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
            e.code,
            DiskFull | SystemIoFailure | ReadOnly | CannotOpen | DatabaseCorrupt | NotADatabase
        ),
        _ => false,
    }
}

impl StoreError {
    /// Whether this error says the database cannot be written (disk full, I/O error,
    /// read-only, unopenable or damaged file), the failures that turn
    /// [`Store::writable`] false: callers answer them as a condition of the node that
    /// passes once the store writes again, not as a fault of the call.
    pub fn cannot_write(&self) -> bool {
        cannot_write(self)
    }

    /// The error a write fails with when the disk is full (`SQLITE_FULL`), for tests of
    /// the store's callers: SQLite's own page cap cannot provoke it for a write that
    /// only changes rows in place, as a DEL's does.
    #[cfg(feature = "test-util")]
    pub fn disk_full() -> Self {
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        ))
    }
}

/// The writer's view of whether the database can be written, published to
/// [`Store::writable`]. Owned by the writer, so it drops (and the store reads as
/// unwritable) when the store goes down.
struct Health(tokio::sync::watch::Sender<bool>);

impl Health {
    /// Runs a job and judges the database by it before the caller hears the answer, so
    /// a caller who saw a write fail never finds the store still reading as writable.
    /// The one place the store's health is decided: a failure that says the file
    /// cannot be written makes it unwritable, a job that went through having changed
    /// rows makes it writable again; anything else (a failure of the job's own, whose
    /// transaction was rolled back, or a read) says nothing.
    fn judged<R>(&self, db: &mut Db, f: impl FnOnce(&mut Db) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let changes = db.total_changes();
        let r = guarded(db, f);
        let now = match &r {
            Err(e) if cannot_write(e) => Some(false),
            Ok(_) if db.total_changes() != changes => Some(true),
            _ => None,
        };
        if let Some(now) = now
            && self.0.send_if_modified(|w| std::mem::replace(w, now) != now)
        {
            match &r {
                Err(e) => tracing::error!(error = %e, "the state database cannot be written; the node is not ready"),
                Ok(_) => tracing::info!("the state database is written again; the node is ready"),
            }
        }
        r
    }
}

/// Called with the duration of every store job, for metrics.
pub type Observer = Arc<dyn Fn(Duration) + Send + Sync>;

/// The database with what judges it, owned by the store's handles together.
struct Writer {
    db: Db,
    health: Health,
    observer: Option<Observer>,
}

/// A handle to the node's state database; cheap to clone. Jobs run one at a time, on
/// the calling thread, under a lock: a job is a transaction of tens of microseconds,
/// and handing each to a writer thread and its answer back cost more than the job (an
/// ADD's two jobs spent some 0.1 ms each in the hand-offs, on top of 0.05 ms in
/// SQLite). A job that panics takes the store down: later calls fail with
/// [`StoreError::Closed`] and the store reads as unwritable.
#[derive(Clone)]
pub struct Store {
    writer: Arc<Mutex<Option<Writer>>>,
    /// Whether the database can be written, kept by the jobs; its sender drops with
    /// the writer, which is how a store that went down shows.
    writable: tokio::sync::watch::Receiver<bool>,
    path: PathBuf,
    schema_found: u32,
    /// Copies the log into the database off the jobs' path; ends with the last clone.
    _checkpointer: Arc<checkpoint::Checkpointer>,
}

impl Store {
    /// Opens the database at `path` (creating and migrating it as needed).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_observed(path, None)
    }

    /// Like [`Store::open`], reporting each job's duration to `observer`.
    pub fn open_observed(path: &Path, observer: Option<Observer>) -> Result<Self, StoreError> {
        let mut db = Db::open(path)?;
        let schema_found = db.schema_found();
        let checkpointer = checkpoint::Checkpointer::start(path)?;
        db.set_autocheckpoint(checkpoint::WRITER_BACKSTOP_PAGES)?;
        let (health, writable) = tokio::sync::watch::channel(true);
        Ok(Self {
            writer: Arc::new(Mutex::new(Some(Writer {
                db,
                health: Health(health),
                observer,
            }))),
            writable,
            path: path.to_path_buf(),
            schema_found,
            _checkpointer: Arc::new(checkpointer),
        })
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version found when the store was opened: 0 means a fresh database,
    /// which is how the daemon tells a first start from a restart.
    pub fn schema_found(&self) -> u32 {
        self.schema_found
    }

    /// Whether the store can write: false once a job failed because the database
    /// cannot be written (disk full, I/O error, read-only, unopenable or corrupt file)
    /// or once the store went down, and true again after a later write goes through.
    /// What `/readyz` reports: a node that cannot record an attachment cannot take
    /// pods.
    pub fn writable(&self) -> bool {
        // `has_changed` fails only when the writer, which holds the sender, is gone.
        self.writable.has_changed().is_ok() && *self.writable.borrow()
    }

    /// Watches [`Store::writable`]: the value changes as writes fail and succeed
    /// again; `changed()` fails once the store went down.
    pub fn writable_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.writable.clone()
    }

    /// Runs `f` on the database and returns its answer.
    pub async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Db) -> Result<R, StoreError> + Send + 'static,
    {
        self.run_blocking(f)
    }

    /// Runs `f` on the database from a non-async caller (the same as [`run`](Self::run)).
    pub fn run_blocking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Db) -> Result<R, StoreError> + Send + 'static,
    {
        // A poisoned lock can only come from a panic, which already took the writer.
        let mut guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let w = guard.as_mut().ok_or(StoreError::Closed)?;
        let t = Instant::now();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let r = w.health.judged(&mut w.db, f);
            if let Some(o) = &w.observer {
                o(t.elapsed());
            }
            r
        }));
        match ran {
            Ok(r) => r,
            Err(_) => {
                tracing::error!("a state database job panicked: the store is closed");
                *guard = None;
                Err(StoreError::Closed)
            }
        }
    }
}

#[cfg(test)]
mod tests;
