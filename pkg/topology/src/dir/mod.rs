//! Topologies from YAML/JSON files in a directory, for labs outside a cluster
//! (`--topology-dir`).
//!
//! Layout of the directory:
//! - `*.yaml`, `*.yml`, `*.json` (top level only, hidden files skipped): Kubernetes
//!   objects, several per file (`---` in YAML, a stream or a `List` in JSON). `Topology`
//!   objects (`networkop.co.uk/v1beta1`) are served; `Node` objects (`v1`) say where
//!   each node is and which pod ranges it holds (the one named after this node gives
//!   its address, its first `InternalIP`); `Pod`, `Namespace` (`v1`), `NetworkPolicy`
//!   (`networking.k8s.io/v1`) and `ClusterNetworkPolicy`
//!   (`policy.networking.k8s.io/v1alpha2`; another version is a [`LoadProblem`]) objects
//!   are what network policy reads
//!   ([`TopologySource::policy_objects`]: the lab plays the API server and kubelet, so
//!   its Pods carry their `status.podIPs`, and its Namespaces get the
//!   `kubernetes.io/metadata.name` label the API server would give them); other kinds
//!   are ignored. meshnet and KNE topology files load unchanged.
//! - `.status/<namespace>/<pod>.json`: the pod's `TopologyStatus`, written by whichever
//!   daemon runs the pod and merged into the served objects, so several daemons sharing
//!   the directory (several lab "nodes") see where each other's pods run.
//! - `.wires/<node>.json`: each node's `WireState`, for people and tools to read.
//!
//! Changes are seen through inotify (within about 100 ms) and, should an event be lost,
//! through a full rescan every 2 s (a directory that takes longer than 2 ms to read
//! whole waits 1,000 times that, up to a minute). Should inotify be unavailable, the
//! rescan is how changes are seen: every 2 s, or 100 times as long as it takes.
//!
//! The parts: `manifest` parses the files into objects, `cache` keeps what was
//! parsed until a file changes, `watcher` is the thread that notices changes, and
//! `status` reads and writes the per-pod status and per-node wire files; this module
//! merges them into what the [`DirSource`] serves.

mod cache;
mod files;
mod manifest;
mod merge;
mod status;
mod watcher;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::source::Topologies;
use crate::{ClusterNode, PolicyObjects, SourceError, Topology, TopologySource, TopologyStatus, WireEnd};
use cache::Cache;
use files::read_objects;
use manifest::is_topology_file;
pub use manifest::{LoadProblem, parse_topologies, read_topologies};
use merge::Merged;
use watcher::{Change, reload_loop, watch_dir};

const STATUS_DIR: &str = ".status";
const WIRES_DIR: &str = ".wires";

/// A [`TopologySource`] over a directory of topology files (see the module doc for the
/// layout). Several daemons may share one directory.
pub struct DirSource {
    inner: Arc<Inner>,
    // Dropping the watcher ends the event channel, which stops the reload thread.
    _watcher: Option<notify::RecommendedWatcher>,
    _events: std_mpsc::Sender<Change>,
}

struct Inner {
    dir: PathBuf,
    node_name: String,
    served: Mutex<Served>,
    /// Parsed files by path; its lock also keeps two reloads from interleaving.
    cache: Mutex<Cache>,
    tx: watch::Sender<u64>,
    /// Moves with every new policy snapshot (and never with `tx`).
    policy_tx: watch::Sender<u64>,
    ready: AtomicBool,
}

#[derive(Default)]
struct Served {
    /// Changed in place, never replaced whole (see [`Topologies`]).
    topologies: Topologies,
    address: Option<IpAddr>,
    nodes: BTreeMap<String, ClusterNode>,
    /// Synced from the first load on; stale while the directory cannot be read.
    policy: Arc<PolicyObjects>,
    problems: BTreeSet<LoadProblem>,
}

/// What one load of the directory read.
struct Loaded {
    topologies: BTreeMap<(String, String), Arc<Topology>>,
    nodes: BTreeMap<String, ClusterNode>,
    policy: PolicyObjects,
    problems: BTreeSet<LoadProblem>,
}

impl DirSource {
    /// Loads `dir` (which must exist) and keeps watching it. `node_name` is this node:
    /// its `Node` object gives [`TopologySource::node_address`] and its wire state goes
    /// to `.wires/<node_name>.json`. The first load is done when this returns.
    pub fn start(dir: PathBuf, node_name: String) -> Result<Arc<DirSource>, SourceError> {
        check_path_part("node name", &node_name)?;
        let meta = std::fs::metadata(&dir).map_err(|e| file_err(&dir, e))?;
        if !meta.is_dir() {
            return Err(SourceError::File {
                path: dir.display().to_string(),
                msg: "not a directory".into(),
            });
        }
        let inner = Arc::new(Inner {
            dir,
            node_name,
            served: Mutex::default(),
            cache: Mutex::default(),
            tx: watch::channel(0).0,
            policy_tx: watch::channel(0).0,
            ready: AtomicBool::new(false),
        });
        let (events, rx) = std_mpsc::channel();
        let watcher = match watch_dir(&inner.dir, events.clone()) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    dir = %inner.dir.display(),
                    error = %e,
                    "cannot watch the topology directory; changes will be seen by rescanning every 2 s"
                );
                None
            }
        };
        inner.reload()?;
        let weak = Arc::downgrade(&inner);
        let watched = watcher.is_some();
        std::thread::Builder::new()
            .name("weft-topology-dir".into())
            .spawn(move || reload_loop(weak, rx, watched))
            .map_err(|e| SourceError::Other(format!("cannot start the reload thread: {e}")))?;
        Ok(Arc::new(DirSource {
            inner,
            _watcher: watcher,
            _events: events,
        }))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// What was left out at the last load (files or objects that did not parse,
    /// Topologies that failed [`validate`], duplicates), sorted by file.
    pub fn problems(&self) -> Vec<LoadProblem> {
        self.inner
            .served
            .lock()
            .expect("lock")
            .problems
            .iter()
            .cloned()
            .collect()
    }

    /// Reads the directory again now instead of waiting for inotify or the rescan.
    pub fn reload(&self) -> Result<(), SourceError> {
        self.inner.reload()
    }
}

impl Inner {
    /// Reads everything and swaps it in, bumping each change counter only if what it
    /// announces changed.
    fn reload(&self) -> Result<(), SourceError> {
        // Held to the end, so that two reloads swap in what they read in the order they
        // read it.
        let mut cache = self.cache.lock().expect("lock");
        let Loaded {
            topologies,
            nodes,
            policy,
            problems,
        } = match self.load(&mut cache) {
            Ok(loaded) => loaded,
            Err(e) => {
                // As a lost watch: the last objects stay, marked stale.
                self.set_policy_stale();
                return Err(e);
            }
        };
        let address = nodes.get(&self.node_name).and_then(|n| n.addresses.first().copied());
        let mut served = self.served.lock().expect("lock");
        log_new_problems(&problems, &served.problems);
        served.problems = problems;
        // Changed in place: an unchanged Topology keeps its Arc, and the map shares
        // all but what moved with the one readers hold (see `Topologies`).
        let moved = crate::source::follow(
            &mut served.topologies,
            topologies,
            |old, t| Arc::ptr_eq(old, t) || ***old == **t,
            crate::Held,
        );
        let changed = moved || address != served.address || nodes != served.nodes;
        if changed {
            served.address = address;
            served.nodes = nodes;
        }
        let policy_changed = *served.policy != policy;
        if policy_changed {
            served.policy = Arc::new(policy);
        }
        drop(served);
        self.ready.store(true, Ordering::Release);
        if changed {
            self.tx.send_modify(|g| *g += 1);
        }
        if policy_changed {
            self.policy_tx.send_modify(|g| *g += 1);
        }
        Ok(())
    }

    /// Marks the policy snapshot stale (once there is one): the next load that succeeds
    /// clears it.
    fn set_policy_stale(&self) {
        let mut served = self.served.lock().expect("lock");
        if !served.policy.synced || served.policy.stale {
            return;
        }
        served.policy = Arc::new(PolicyObjects {
            stale: true,
            ..(*served.policy).clone()
        });
        drop(served);
        self.policy_tx.send_modify(|g| *g += 1);
    }

    fn load(&self, cache: &mut Cache) -> Result<Loaded, SourceError> {
        let now = SystemTime::now();
        let mut problems = BTreeSet::new();
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| file_err(&self.dir, e))? {
            let entry = entry.map_err(|e| file_err(&self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || !is_topology_file(name) {
                continue;
            }
            paths.push(entry.path());
        }
        let mut files = BTreeMap::new();
        for path in paths {
            match read_objects(&mut cache.objects, &path, now) {
                Ok(Some(objects)) => {
                    files.insert(path, objects);
                }
                Ok(None) => {}
                Err(reason) => {
                    problems.insert(LoadProblem {
                        file: path,
                        object: None,
                        reason,
                    });
                }
            }
        }
        cache.objects.retain(|p, _| files.contains_key(p));
        let merged = Merged::of(files, &mut problems);

        let mut statuses = self.load_statuses(cache, now, &mut problems);
        cache.served.retain(|key, _| merged.topologies.contains_key(key));
        let topologies = (merged.topologies.iter())
            .map(|(key, t)| (key.clone(), cache.with_status(key, t.clone(), statuses.remove(key))))
            .collect();
        let loaded = Loaded {
            topologies,
            nodes: merged.nodes.clone(),
            policy: merged.policy.snapshot(true, false),
            problems,
        };
        cache.merged = Some(merged);
        Ok(loaded)
    }
}

/// Logs each problem of `now` that was not in `before`.
fn log_new_problems(now: &BTreeSet<LoadProblem>, before: &BTreeSet<LoadProblem>) {
    for p in now.difference(before) {
        match &p.object {
            Some(object) => {
                tracing::warn!(file = %p.file.display(), object = %object, reason = %p.reason, "topology left out")
            }
            None => tracing::warn!(file = %p.file.display(), reason = %p.reason, "topology file left out"),
        }
    }
}

/// Names that become path components must not climb out of the directory.
fn check_path_part(what: &str, s: &str) -> Result<(), SourceError> {
    if s.is_empty() || s == "." || s == ".." || s.starts_with('.') || s.contains(['/', '\0']) {
        return Err(SourceError::Other(format!("invalid {what} {s:?}")));
    }
    Ok(())
}

fn file_err(path: &Path, e: impl fmt::Display) -> SourceError {
    SourceError::File {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

impl TopologySource for DirSource {
    fn topology(&self, namespace: &str, pod: &str) -> Option<Arc<Topology>> {
        let served = self.inner.served.lock().expect("lock");
        served
            .topologies
            .get(&(namespace.to_string(), pod.to_string()))
            .map(|t| t.0.clone())
    }

    fn topologies(&self) -> Topologies {
        self.inner.served.lock().expect("lock").topologies.clone()
    }

    fn node_address(&self) -> Option<IpAddr> {
        self.inner.served.lock().expect("lock").address
    }

    fn nodes(&self) -> Vec<ClusterNode> {
        self.inner
            .served
            .lock()
            .expect("lock")
            .nodes
            .values()
            .cloned()
            .collect()
    }

    fn set_status<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        status: TopologyStatus,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        let inner = self.inner.clone();
        let (namespace, pod) = (namespace.to_string(), pod.to_string());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.write_status(&namespace, &pod, &status))
                .await
                .map_err(|e| SourceError::Other(e.to_string()))?
        })
    }

    fn set_wire_state(&self, wires: Vec<WireEnd>) -> BoxFuture<'_, Result<(), SourceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.write_wires(wires))
                .await
                .map_err(|e| SourceError::Other(e.to_string()))?
        })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.inner.tx.subscribe()
    }

    fn ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    fn policy_objects(&self) -> Arc<PolicyObjects> {
        self.inner.served.lock().expect("lock").policy.clone()
    }

    fn policy_changes(&self) -> watch::Receiver<u64> {
        self.inner.policy_tx.subscribe()
    }
}
