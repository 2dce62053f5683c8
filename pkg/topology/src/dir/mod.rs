//! Topologies from YAML/JSON files in a directory, for labs outside a cluster
//! (`--topology-dir`).
//!
//! Layout of the directory:
//! - `*.yaml`, `*.yml`, `*.json` (top level only, hidden files skipped): Kubernetes
//!   objects, several per file (`---` in YAML, a stream or a `List` in JSON). `Topology`
//!   objects (`networkop.co.uk/v1beta1`) are served; `Node` objects (`v1`) say where
//!   each node is and which pod ranges it holds (the one named after this node gives
//!   its address, its first `InternalIP`); other kinds are ignored. meshnet and KNE
//!   topology files load unchanged.
//! - `.status/<namespace>/<pod>.json`: the pod's `TopologyStatus`, written by whichever
//!   daemon runs the pod and merged into the served objects, so several daemons sharing
//!   the directory (several lab "nodes") see where each other's pods run.
//! - `.wires/<node>.json`: each node's `WireState`, for people and tools to read.
//!
//! Changes are seen through inotify (within about 100 ms) and, should an event be lost or
//! inotify be unavailable, through a full rescan every 2 s.
//!
//! The parts: `manifest` parses the files into objects, `cache` keeps what was
//! parsed until a file changes, `watcher` is the thread that notices changes, and
//! `status` reads and writes the per-pod status and per-node wire files; this module
//! merges them into what the [`DirSource`] serves.

mod cache;
mod manifest;
mod status;
mod watcher;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::{ClusterNode, SourceError, Topology, TopologySource, TopologyStatus, WireEnd};
use cache::{Cache, cached};
pub use manifest::{LoadProblem, parse_topologies, read_topologies};
use manifest::{is_topology_file, parse_file};
use watcher::{reload_loop, watch_dir};

const STATUS_DIR: &str = ".status";
const WIRES_DIR: &str = ".wires";

/// A [`TopologySource`] over a directory of topology files (see the module doc for the
/// layout). Several daemons may share one directory.
pub struct DirSource {
    inner: Arc<Inner>,
    // Dropping the watcher ends the event channel, which stops the reload thread.
    _watcher: Option<notify::RecommendedWatcher>,
    _events: std_mpsc::Sender<()>,
}

struct Inner {
    dir: PathBuf,
    node_name: String,
    served: Mutex<Served>,
    /// Parsed files by path; its lock also keeps two reloads from interleaving.
    cache: Mutex<Cache>,
    tx: watch::Sender<u64>,
    ready: AtomicBool,
}

#[derive(Default)]
struct Served {
    topologies: BTreeMap<(String, String), Arc<Topology>>,
    address: Option<IpAddr>,
    nodes: BTreeMap<String, ClusterNode>,
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
        std::thread::Builder::new()
            .name("weft-topology-dir".into())
            .spawn(move || reload_loop(weak, rx))
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
    /// Reads everything and swaps it in, bumping the change counter only if what is
    /// served changed.
    fn reload(&self) -> Result<(), SourceError> {
        let mut cache = self.cache.lock().expect("lock");
        let (mut topologies, nodes, problems) = self.load(&mut cache)?;
        let address = nodes.get(&self.node_name).and_then(|n| n.addresses.first().copied());
        drop(cache);
        let mut served = self.served.lock().expect("lock");
        for p in problems.difference(&served.problems) {
            match &p.object {
                Some(object) => {
                    tracing::warn!(file = %p.file.display(), object = %object, reason = %p.reason, "topology left out")
                }
                None => tracing::warn!(file = %p.file.display(), reason = %p.reason, "topology file left out"),
            }
        }
        served.problems = problems;
        let same_keys = topologies.len() == served.topologies.len()
            && topologies.keys().zip(served.topologies.keys()).all(|(a, b)| a == b);
        let mut changed = !same_keys || address != served.address || nodes != served.nodes;
        for (key, t) in topologies.iter_mut() {
            match served.topologies.get(key) {
                // Keep the old Arc when nothing changed, so holders can compare cheaply.
                Some(old) if **old == **t => *t = old.clone(),
                _ => changed = true,
            }
        }
        if changed {
            served.topologies = topologies;
            served.address = address;
            served.nodes = nodes;
        }
        drop(served);
        self.ready.store(true, Ordering::Release);
        if changed {
            self.tx.send_modify(|g| *g += 1);
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn load(
        &self,
        cache: &mut Cache,
    ) -> Result<
        (
            BTreeMap<(String, String), Arc<Topology>>,
            BTreeMap<String, ClusterNode>,
            BTreeSet<LoadProblem>,
        ),
        SourceError,
    > {
        let now = SystemTime::now();
        let mut problems = BTreeSet::new();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| file_err(&self.dir, e))? {
            let entry = entry.map_err(|e| file_err(&self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || !is_topology_file(name) {
                continue;
            }
            files.push(entry.path());
        }
        files.sort();

        let mut topologies: BTreeMap<(String, String), (Topology, PathBuf)> = BTreeMap::new();
        let mut nodes: BTreeMap<String, ClusterNode> = BTreeMap::new();
        let mut seen = HashSet::new();
        for path in files {
            // Follows symlinks: a ConfigMap mounted as the directory is all symlinks.
            let objects = match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => cached(&mut cache.objects, &path, &m, now, |bytes| parse_file(&path, bytes)),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => Err(e.to_string()),
            };
            let objects = match objects {
                Ok(o) => o,
                Err(reason) => {
                    problems.insert(LoadProblem {
                        file: path.clone(),
                        object: None,
                        reason,
                    });
                    continue;
                }
            };
            seen.insert(path.clone());
            problems.extend(objects.problems.iter().cloned());
            for n in &objects.nodes {
                if nodes.contains_key(&n.name) {
                    problems.insert(LoadProblem {
                        file: path.clone(),
                        object: Some(format!("Node {}", n.name)),
                        reason: "a Node of that name was read before; this one is ignored".into(),
                    });
                    continue;
                }
                nodes.insert(n.name.clone(), n.clone());
            }
            for t in &objects.topologies {
                let key = (
                    t.metadata.namespace.clone().unwrap_or_default(),
                    t.metadata.name.clone().unwrap_or_default(),
                );
                if let Some((_, first)) = topologies.get(&key) {
                    problems.insert(LoadProblem {
                        file: path.clone(),
                        object: Some(format!("Topology {}/{}", key.0, key.1)),
                        reason: format!("duplicate of the one in {}; this one is ignored", first.display()),
                    });
                    continue;
                }
                topologies.insert(key, (t.clone(), path.clone()));
            }
        }
        cache.objects.retain(|p, _| seen.contains(p));

        let statuses = self.load_statuses(cache, now, &mut problems);
        let topologies = topologies
            .into_iter()
            .map(|(key, (mut t, _))| {
                if let Some(s) = statuses.get(&key) {
                    t.status = Some(s.clone());
                }
                (key, Arc::new(t))
            })
            .collect();
        Ok((topologies, nodes, problems))
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
            .cloned()
    }

    fn topologies(&self) -> Vec<Arc<Topology>> {
        self.inner
            .served
            .lock()
            .expect("lock")
            .topologies
            .values()
            .cloned()
            .collect()
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
}
