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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;

use crate::{
    ClusterNode, SourceError, Topology, TopologySource, TopologyStatus, WireEnd, WireState, WireStateStatus, validate,
};

/// How often the directory is rescanned whatever inotify says.
const RESCAN: Duration = Duration::from_secs(2);
/// How long to let a burst of file events settle before reloading (an editor's save is
/// several events; one reload is enough).
const DEBOUNCE: Duration = Duration::from_millis(50);
/// A file changed less than this long before it was read may change again with the same
/// size and timestamps (timestamps come from a coarse clock), so it is never trusted from
/// the cache.
const RACY: Duration = Duration::from_secs(1);

const STATUS_DIR: &str = ".status";
const WIRES_DIR: &str = ".wires";

/// Something in the directory that could not be loaded and was left out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LoadProblem {
    /// The file.
    pub file: PathBuf,
    /// The object or document concerned (`Topology lab/r1`, `document at line 12`), if the
    /// problem is not with the whole file.
    pub object: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for LoadProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.object {
            Some(o) => write!(f, "{}: {o}: {}", self.file.display(), self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

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

#[derive(Default)]
struct Cache {
    objects: HashMap<PathBuf, Cached<FileObjects>>,
    statuses: HashMap<PathBuf, Cached<Result<TopologyStatus, String>>>,
}

struct Cached<T> {
    stamp: Stamp,
    trusted: bool,
    value: T,
}

/// What identifies a file's version without reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether the file was last changed long enough ago that an equal stamp later means
    /// equal content.
    fn settled(&self, now: SystemTime) -> bool {
        let latest = self.mtime.max(self.ctime);
        let changed = if latest.0 >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(latest.0 as u64, latest.1.clamp(0, 999_999_999) as u32)
        } else {
            SystemTime::UNIX_EPOCH
        };
        now.duration_since(changed).is_ok_and(|age| age >= RACY)
    }
}

/// What one topology file holds.
#[derive(Clone, Default)]
struct FileObjects {
    topologies: Vec<Topology>,
    /// `Node` objects.
    nodes: Vec<ClusterNode>,
    problems: Vec<LoadProblem>,
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

/// Watches the directory and everything under it (`.status/<namespace>/` appear later).
fn watch_dir(dir: &Path, events: std_mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    let wires = dir.join(WIRES_DIR);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let relevant = match res {
            Ok(ev) => relevant_event(&ev, &wires),
            // An overflowed queue or a failing watch: only a reload can tell what changed.
            Err(_) => true,
        };
        if relevant {
            let _ = events.send(());
        }
    })?;
    watcher.watch(dir, RecursiveMode::Recursive)?;
    Ok(watcher)
}

/// Whether an event may change what is served. Our own reads (opens, closes without
/// writing, access times) are not, or every reload would trigger the next.
fn relevant_event(ev: &notify::Event, wires: &Path) -> bool {
    match ev.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => return false,
        _ => {}
    }
    ev.paths.is_empty() || ev.paths.iter().any(|p| !p.starts_with(wires))
}

fn reload_loop(inner: Weak<Inner>, rx: std_mpsc::Receiver<()>) {
    let mut next_rescan = Instant::now() + RESCAN;
    loop {
        let wait = next_rescan.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(()) => {
                std::thread::sleep(DEBOUNCE);
                loop {
                    match rx.try_recv() {
                        Ok(()) => continue,
                        Err(std_mpsc::TryRecvError::Empty) => break,
                        Err(std_mpsc::TryRecvError::Disconnected) => return,
                    }
                }
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = inner.reload() {
            tracing::warn!(dir = %inner.dir.display(), error = %e, "cannot read the topology directory; serving what was loaded before");
        }
        next_rescan = Instant::now() + RESCAN;
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

    /// Reads `.status/<namespace>/<pod>.json`.
    fn load_statuses(
        &self,
        cache: &mut Cache,
        now: SystemTime,
        problems: &mut BTreeSet<LoadProblem>,
    ) -> BTreeMap<(String, String), TopologyStatus> {
        let mut out = BTreeMap::new();
        let mut seen = HashSet::new();
        let Ok(namespaces) = std::fs::read_dir(self.dir.join(STATUS_DIR)) else {
            cache.statuses.clear();
            return out;
        };
        for ns in namespaces.flatten() {
            let (Some(namespace), true) = (ns.file_name().to_str().map(String::from), ns.path().is_dir()) else {
                continue;
            };
            let Ok(pods) = std::fs::read_dir(ns.path()) else {
                continue;
            };
            for pod in pods.flatten() {
                let path = pod.path();
                let Some(name) = pod
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(String::from)
                else {
                    continue;
                };
                if name.starts_with('.') {
                    continue;
                }
                let Ok(m) = std::fs::metadata(&path) else { continue };
                let status = cached(&mut cache.statuses, &path, &m, now, |bytes| {
                    serde_json::from_slice::<TopologyStatus>(bytes).map_err(|e| format!("not a TopologyStatus: {e}"))
                });
                seen.insert(path.clone());
                match status {
                    Ok(Ok(s)) => {
                        out.insert((namespace.clone(), name), s);
                    }
                    Ok(Err(reason)) | Err(reason) => {
                        problems.insert(LoadProblem {
                            file: path,
                            object: None,
                            reason,
                        });
                    }
                }
            }
        }
        cache.statuses.retain(|p, _| seen.contains(p));
        out
    }

    fn status_path(&self, namespace: &str, pod: &str) -> PathBuf {
        self.dir.join(STATUS_DIR).join(namespace).join(format!("{pod}.json"))
    }

    fn write_status(&self, namespace: &str, pod: &str, status: &TopologyStatus) -> Result<(), SourceError> {
        check_path_part("namespace", namespace)?;
        check_path_part("pod", pod)?;
        let path = self.status_path(namespace, pod);
        if *status == TopologyStatus::default() {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(file_err(&path, e)),
            }
        } else {
            let known = self
                .served
                .lock()
                .expect("lock")
                .topologies
                .contains_key(&(namespace.to_string(), pod.to_string()));
            if !known {
                return Err(SourceError::Other(format!("no topology {namespace}/{pod}")));
            }
            let body = serde_json::to_vec_pretty(status).map_err(|e| SourceError::Other(e.to_string()))?;
            write_atomically(&path, &body)?;
        }
        // Read our own write back now: the daemon expects to see the status it just set.
        self.reload()
    }

    fn write_wires(&self, wires: Vec<WireEnd>) -> Result<(), SourceError> {
        let mut ws = WireState::new(&self.node_name, Default::default());
        ws.status = Some(WireStateStatus { wires });
        let body = serde_json::to_vec_pretty(&ws).map_err(|e| SourceError::Other(e.to_string()))?;
        write_atomically(
            &self.dir.join(WIRES_DIR).join(format!("{}.json", self.node_name)),
            &body,
        )
    }
}

/// Returns the cached value for `path` if the file has not changed, else parses it.
fn cached<T: Clone>(
    cache: &mut HashMap<PathBuf, Cached<T>>,
    path: &Path,
    meta: &std::fs::Metadata,
    now: SystemTime,
    parse: impl FnOnce(&[u8]) -> T,
) -> Result<T, String> {
    let stamp = Stamp::of(meta);
    if let Some(c) = cache.get(path)
        && c.trusted
        && c.stamp == stamp
    {
        return Ok(c.value.clone());
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let value = parse(&bytes);
    cache.insert(
        path.to_path_buf(),
        Cached {
            stamp,
            trusted: stamp.settled(now),
            value: value.clone(),
        },
    );
    Ok(value)
}

fn is_topology_file(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".yaml", ".yml", ".json"]
        .iter()
        .any(|ext| lower.ends_with(ext) && lower.len() > ext.len())
}

/// Reads every Topology of the topology files directly in `dir` (the files a
/// [`DirSource`] would serve, without its status overlay): for tools that describe a lab
/// with such a directory. Returns the valid ones and what was left out.
pub fn read_topologies(dir: &Path) -> Result<(Vec<Topology>, Vec<LoadProblem>), SourceError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| file_err(dir, e))?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| !n.starts_with('.') && is_topology_file(n))
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    let (mut topologies, mut problems) = (Vec::new(), Vec::new());
    for path in files {
        let bytes = std::fs::read(&path).map_err(|e| file_err(&path, e))?;
        let objects = parse_file(&path, &bytes);
        topologies.extend(objects.topologies);
        problems.extend(objects.problems);
    }
    Ok((topologies, problems))
}

/// Parses the Topology objects of one YAML or JSON document stream (`path` names it in
/// problems and tells JSON from YAML by its extension).
pub fn parse_topologies(path: &Path, bytes: &[u8]) -> (Vec<Topology>, Vec<LoadProblem>) {
    let objects = parse_file(path, bytes);
    (objects.topologies, objects.problems)
}

/// Parses one file into the objects weft cares about; what cannot be used is reported
/// and skipped, document by document.
fn parse_file(path: &Path, bytes: &[u8]) -> FileObjects {
    let mut out = FileObjects::default();
    let problem = |object: Option<String>, reason: String| LoadProblem {
        file: path.to_path_buf(),
        object,
        reason,
    };
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            out.problems.push(problem(None, format!("not UTF-8: {e}")));
            return out;
        }
    };
    let json = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if json {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let mut n = 0;
        loop {
            let at = stream.byte_offset();
            match stream.next() {
                None => break,
                Some(Ok(v)) => {
                    n += 1;
                    add_object(v, &format!("object {n}"), &mut out, path);
                }
                Some(Err(e)) => {
                    // A syntax error leaves no way to find where the next value starts.
                    let line = text[..at].lines().count() + 1;
                    out.problems.push(problem(
                        Some(format!("object at line {line} and after")),
                        format!("does not parse: {e}"),
                    ));
                    break;
                }
            }
        }
    } else {
        for (line, doc) in yaml_documents(text) {
            // Padding keeps the parser's line numbers those of the file.
            let padded = format!("{}{doc}", "\n".repeat(line - 1));
            match serde_yaml_ng::from_str::<Value>(&padded) {
                Ok(v) => add_object(v, &format!("document at line {line}"), &mut out, path),
                Err(e) => out.problems.push(problem(
                    Some(format!("document at line {line}")),
                    format!("does not parse: {e}"),
                )),
            }
        }
    }
    out
}

/// Splits a YAML stream at its `---` lines, so a syntax error costs one document, not
/// the rest of the file (the YAML parser cannot resume after one). Returns each
/// document's first line (1-based) and text.
fn yaml_documents(text: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let is_marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if is_marker && offset > start {
            docs.push((start_line, &text[start..offset]));
            start = offset;
            start_line = i + 1;
        }
        offset += line.len();
    }
    if offset > start {
        docs.push((start_line, &text[start..]));
    }
    docs
}

fn add_object(v: Value, what: &str, out: &mut FileObjects, path: &Path) {
    let problem = |object: String, reason: String| LoadProblem {
        file: path.to_path_buf(),
        object: Some(object),
        reason,
    };
    match v {
        Value::Null => return,
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                add_object(item, &format!("{what}, item {}", i + 1), out, path);
            }
            return;
        }
        Value::Object(_) => {}
        _ => {
            out.problems.push(problem(what.into(), "not an object".into()));
            return;
        }
    }
    let api_version = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match kind.as_str() {
        // `kubectl get -o yaml` output.
        "List" => {
            if let Some(Value::Array(items)) = v.get("items") {
                for (i, item) in items.iter().enumerate() {
                    add_object(item.clone(), &format!("{what}, item {}", i + 1), out, path);
                }
            }
        }
        "Topology" => {
            let label = |ns: &str| format!("Topology {ns}/{name} ({what})");
            if api_version != "networkop.co.uk/v1beta1" {
                let ns = v
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                out.problems.push(problem(
                    label(ns),
                    format!("apiVersion {api_version:?} is not networkop.co.uk/v1beta1"),
                ));
                return;
            }
            // A pod without links may come without a spec at all.
            let mut v = v;
            if let Some(obj) = v.as_object_mut() {
                obj.entry("spec").or_insert_with(|| serde_json::json!({}));
            }
            match Topology::deserialize(&v) {
                Ok(mut t) => {
                    let ns = t.metadata.namespace.get_or_insert_with(|| "default".into()).clone();
                    match validate(&t) {
                        Ok(()) => out.topologies.push(t),
                        Err(errors) => out.problems.push(problem(label(&ns), errors.join("; "))),
                    }
                }
                Err(e) => {
                    let ns = v
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("default");
                    out.problems
                        .push(problem(label(ns), format!("not a valid Topology: {e}")));
                }
            }
        }
        "Node" if api_version == "v1" => match Node::deserialize(&v) {
            Ok(node) => out.nodes.extend(ClusterNode::from_node(&node)),
            Err(e) => out
                .problems
                .push(problem(format!("Node {name}"), format!("not a valid Node: {e}"))),
        },
        _ => tracing::debug!(file = %path.display(), kind, api_version, "ignoring an object weft does not use"),
    }
}

/// Writes through a temporary file in the same directory and a rename, so a reader (or
/// another daemon) sees the old content or the new, never half of it. No fsync: after a
/// crash of the host, the lab is gone anyway.
fn write_atomically(path: &Path, body: &[u8]) -> Result<(), SourceError> {
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    // A dot name ending in `.tmp`: never read as a topology or status file.
    let mut tmp = tempfile::Builder::new()
        .prefix(".weft-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| file_err(dir, e))?;
    tmp.write_all(body).map_err(|e| file_err(tmp.path(), e))?;
    tmp.persist(path).map_err(|e| file_err(path, e.error))?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_documents_split_at_markers_only() {
        let text = "a: 1\n---\nb: 2\n--- # c\nc: |\n  ---x\n----\n---";
        let docs = yaml_documents(text);
        assert_eq!(
            docs,
            vec![
                (1, "a: 1\n"),
                (2, "---\nb: 2\n"),
                (4, "--- # c\nc: |\n  ---x\n----\n"),
                (8, "---")
            ]
        );
        assert_eq!(yaml_documents("---\na: 1\n"), vec![(1, "---\na: 1\n")]);
        assert!(yaml_documents("").is_empty());
    }

    #[test]
    fn a_broken_document_costs_only_itself() {
        let text = "apiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: r1}\nspec: {links: []}\n---\nkind: [\n---\napiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: r2}\n";
        let out = parse_file(Path::new("x.yaml"), text.as_bytes());
        let names: Vec<_> = out
            .topologies
            .iter()
            .map(|t| t.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["r1", "r2"]);
        assert_eq!(out.problems.len(), 1, "{:?}", out.problems);
        let p = &out.problems[0];
        assert_eq!(p.object.as_deref(), Some("document at line 5"));
        // The parser's line numbers are the file's.
        assert!(p.reason.contains("line 7") || p.reason.contains("line 6"), "{p}");
    }

    #[test]
    fn json_lists_and_streams() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"networkop.co.uk/v1beta1","kind":"Topology","metadata":{"name":"r1","namespace":"x"},"spec":{"links":[]}}]}
        {"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},"status":{"addresses":[{"type":"Hostname","address":"n1"},{"type":"InternalIP","address":"10.1.0.1"}]}}
        {"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"},"status":{"addresses":[{"type":"InternalIP","address":"10.1.0.2"}]}}"#;
        let out = parse_file(Path::new("x.json"), text.as_bytes());
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        assert_eq!(out.topologies.len(), 1);
        assert_eq!(out.topologies[0].metadata.namespace.as_deref(), Some("x"));
        // Every Node is read (pod routes need the others too), with its InternalIP.
        let nodes: Vec<_> = out
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.addresses.clone()))
            .collect();
        assert_eq!(
            nodes,
            vec![
                ("n1", vec!["10.1.0.1".parse::<IpAddr>().unwrap()]),
                ("n2", vec!["10.1.0.2".parse::<IpAddr>().unwrap()])
            ]
        );
    }

    #[test]
    fn unknown_kinds_are_ignored_and_bad_ones_reported() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: networkop.co.uk/v1alpha1\nkind: Topology\nmetadata: {name: r1}\n---\napiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: r2}\nspec: {links: [{uid: x}]}\n---\n42\n";
        let out = parse_file(Path::new("x.yml"), text.as_bytes());
        assert!(out.topologies.is_empty());
        let objects: Vec<_> = out.problems.iter().map(|p| p.object.clone().unwrap()).collect();
        assert_eq!(
            objects,
            [
                "Topology default/r1 (document at line 4)",
                "Topology default/r2 (document at line 8)",
                "document at line 13"
            ]
        );
    }

    #[test]
    fn only_topology_extensions() {
        assert!(is_topology_file("a.yaml") && is_topology_file("b.YML") && is_topology_file("c.json"));
        assert!(!is_topology_file("a.yaml~") && !is_topology_file(".yaml") && !is_topology_file("a.txt"));
    }
}
