//! Node state for weft in SQLite: address ranges, pod attachments and the address
//! allocations that tie them together, host ports, wire ends and daemon runs (one
//! module per table under `db/`).
//!
//! One connection, owned by one writer thread, serves the whole daemon: callers send
//! it closures over [`Db`] and await the answer ([`Store::run`]). SQLite allows one
//! writer at a time anyway; a single owner means no lock contention can ever surface
//! as `SQLITE_BUSY` to a CNI call, and each call costs one channel round trip.

#![forbid(unsafe_code)]

mod addr;
mod attachment;
mod damage;
mod db;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use addr::{capacity, gateway, narrowest_range, pool};
pub use attachment::{
    Allocation, Attachment, AttachmentKey, BeginAdd, Family, HeldPort, InstalledRoute, NewAttachment, PodRef,
    PortMapping, PortRequest, RangeUsage, State,
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
    /// The writer thread is gone (the daemon is shutting down).
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
/// [`Store::writable`]. Owned by the writer thread, so it drops (and the store reads as
/// unwritable) when that thread ends.
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

type Job = Box<dyn FnOnce(&mut Db, &Health) + Send>;

/// Called with the duration of every store job, for metrics.
pub type Observer = Arc<dyn Fn(Duration) + Send + Sync>;

/// A handle to the store's writer thread; cheap to clone.
#[derive(Clone)]
pub struct Store {
    tx: std::sync::mpsc::Sender<Job>,
    /// Whether the database can be written, kept by the writer thread; its sender
    /// drops with the thread, which is how a dead writer shows.
    writable: tokio::sync::watch::Receiver<bool>,
    path: PathBuf,
    schema_found: u32,
}

impl Store {
    /// Opens the database at `path` (creating and migrating it as needed) and starts
    /// the writer thread.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_observed(path, None)
    }

    /// Like [`Store::open`], reporting each job's duration to `observer`.
    pub fn open_observed(path: &Path, observer: Option<Observer>) -> Result<Self, StoreError> {
        let mut db = Db::open(path)?;
        let schema_found = db.schema_found();
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (health, writable) = tokio::sync::watch::channel(true);
        let health = Health(health);
        std::thread::Builder::new()
            .name("weft-store".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let t = Instant::now();
                    job(&mut db, &health);
                    if let Some(o) = &observer {
                        o(t.elapsed());
                    }
                }
            })
            .map_err(|_| StoreError::Closed)?;
        Ok(Self {
            tx,
            writable,
            path: path.to_path_buf(),
            schema_found,
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
    /// or once the writer thread is gone, and true again after a later write goes
    /// through. What `/readyz` reports: a node that cannot record an attachment
    /// cannot take pods.
    pub fn writable(&self) -> bool {
        // `has_changed` fails only when the writer thread, which holds the sender,
        // has ended.
        self.writable.has_changed().is_ok() && *self.writable.borrow()
    }

    /// Watches [`Store::writable`]: the value changes as writes fail and succeed
    /// again; `changed()` fails once the writer thread is gone.
    pub fn writable_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.writable.clone()
    }

    /// Runs `f` on the writer thread and returns its answer.
    pub async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Db) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx
            .send(Box::new(move |db: &mut Db, health: &Health| {
                let _ = reply.send(health.judged(db, f));
            }))
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f` on the writer thread, blocking the calling (non-async) thread.
    pub fn run_blocking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Db) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, answer) = std::sync::mpsc::channel();
        self.tx
            .send(Box::new(move |db: &mut Db, health: &Health| {
                let _ = reply.send(health.judged(db, f));
            }))
            .map_err(|_| StoreError::Closed)?;
        answer.recv().map_err(|_| StoreError::Closed)?
    }
}

#[cfg(test)]
mod tests;
