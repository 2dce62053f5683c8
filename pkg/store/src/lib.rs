//! Node state for weft in SQLite: address ranges, pod attachments and the address
//! allocations that tie them together.
//!
//! One connection, owned by one writer thread, serves the whole daemon: callers send
//! it closures over [`Db`] and await the answer ([`Store::run`]). SQLite allows one
//! writer at a time anyway; a single owner means no lock contention can ever surface
//! as `SQLITE_BUSY` to a CNI call, and each call costs one channel round trip.

#![forbid(unsafe_code)]

mod addr;
mod attachment;
mod db;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use addr::{capacity, gateway, pool};
pub use attachment::{
    Allocation, Attachment, AttachmentKey, BeginAdd, Family, HeldPort, InstalledRoute, NewAttachment, PodRef,
    PortMapping, PortRequest, RangeUsage, State, WireRecord,
};
pub use db::Db;

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

type Job = Box<dyn FnOnce(&mut Db) + Send>;

/// Called with the duration of every store job, for metrics.
pub type Observer = Arc<dyn Fn(Duration) + Send + Sync>;

/// A handle to the store's writer thread; cheap to clone.
#[derive(Clone)]
pub struct Store {
    tx: std::sync::mpsc::Sender<Job>,
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
        std::thread::Builder::new()
            .name("weft-store".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let t = Instant::now();
                    job(&mut db);
                    if let Some(o) = &observer {
                        o(t.elapsed());
                    }
                }
            })
            .map_err(|_| StoreError::Closed)?;
        Ok(Self {
            tx,
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

    /// Runs `f` on the writer thread and returns its answer.
    pub async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Db) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx
            .send(Box::new(move |db: &mut Db| {
                let _ = reply.send(guarded(db, f));
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
            .send(Box::new(move |db: &mut Db| {
                let _ = reply.send(guarded(db, f));
            }))
            .map_err(|_| StoreError::Closed)?;
        answer.recv().map_err(|_| StoreError::Closed)?
    }
}

#[cfg(test)]
mod tests;
