//! The files daemons write for each other and for people: each pod's
//! `.status/<namespace>/<pod>.json` (read back and merged into the served Topologies) and
//! each node's `.wires/<node>.json`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::cache::{Cache, cached};
use super::{Inner, LoadProblem, STATUS_DIR, WIRES_DIR, check_path_part, file_err};
use crate::{SourceError, TopologyStatus, WireEnd, WireState, WireStateStatus};

impl Inner {
    /// Reads `.status/<namespace>/<pod>.json`.
    pub(super) fn load_statuses(
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

    /// The status file at `path`: `None` when there is none, `Err` when it cannot be
    /// read or is not a status.
    pub(super) fn read_status(&self, path: &Path) -> Result<Option<TopologyStatus>, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("not a TopologyStatus: {e}")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    pub(super) fn status_path(&self, namespace: &str, pod: &str) -> PathBuf {
        self.dir.join(STATUS_DIR).join(namespace).join(format!("{pod}.json"))
    }

    pub(super) fn write_status(&self, namespace: &str, pod: &str, status: &TopologyStatus) -> Result<(), SourceError> {
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
        // Serve our own write at once (the daemon expects to see the status it just
        // set) without reading the whole directory again: in a big lab every pod's
        // status write would cost a full reload on every node. The watcher's reload
        // reads the file back soon after and finds the same.
        self.serve_status(namespace, pod, status);
        Ok(())
    }

    /// Reads the status files at `paths` (written or removed by any daemon) and serves
    /// each as its pod's, without reading the rest of the directory. False when one
    /// cannot be read as a status: a reload of everything records the problem.
    pub(super) fn reload_statuses(&self, paths: &[&Path]) -> bool {
        // Held as a reload holds it, so a reload that read the directory before these
        // writes does not swap in what it read after they were served.
        let _cache = self.cache.lock().expect("lock");
        for path in paths {
            let (Some(pod), Some(namespace)) = (
                path.file_stem().and_then(|n| n.to_str()),
                path.parent().and_then(|d| d.file_name()).and_then(|n| n.to_str()),
            ) else {
                return false;
            };
            let Ok(status) = self.read_status(path) else {
                return false;
            };
            self.serve_status(namespace, pod, &status.unwrap_or_default());
        }
        true
    }

    /// Serves `status` as the status of `namespace/pod`'s Topology, if it has one.
    fn serve_status(&self, namespace: &str, pod: &str, status: &TopologyStatus) {
        let status = (*status != TopologyStatus::default()).then(|| status.clone());
        let mut served = self.served.lock().expect("lock");
        let Some(t) = served.topologies.get_mut(&(namespace.to_string(), pod.to_string())) else {
            return;
        };
        if t.status == status {
            return;
        }
        *t = crate::Held(std::sync::Arc::new(crate::Topology {
            status,
            ..(***t).clone()
        }));
        drop(served);
        self.tx.send_modify(|g| *g += 1);
    }

    pub(super) fn write_wires(&self, wires: Vec<WireEnd>) -> Result<(), SourceError> {
        let mut ws = WireState::new(&self.node_name, Default::default());
        ws.status = Some(WireStateStatus { wires });
        let body = serde_json::to_vec_pretty(&ws).map_err(|e| SourceError::Other(e.to_string()))?;
        write_atomically(
            &self.dir.join(WIRES_DIR).join(format!("{}.json", self.node_name)),
            &body,
        )
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
