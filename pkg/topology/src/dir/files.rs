//! Serving object files that changed (written or removed by anyone) without reading the
//! rest of the directory: each is read again and patched into the merge of every file
//! (`Merged::replace`), and what moved is served.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::cache::{Cache, Cached, cached};
use super::manifest::{FileObjects, parse_file};
use super::{Inner, check_path_part, log_new_problems};

/// The objects of the file at `path` as [`cached`] has them; `Ok(None)` when it is gone
/// (or is not a file), `Err` when it cannot be read.
pub(super) fn read_objects(
    cache: &mut HashMap<PathBuf, Cached<Arc<FileObjects>>>,
    path: &Path,
    now: SystemTime,
) -> Result<Option<Arc<FileObjects>>, String> {
    // Follows symlinks: a ConfigMap mounted as the directory is all symlinks.
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => cached(cache, path, &m, now, |bytes| Arc::new(parse_file(path, bytes))).map(Some),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl Inner {
    /// Reads the object files at `paths` (written or removed by anyone) and serves what
    /// changed in them without reading the rest of the directory. False, having served
    /// nothing new, when that cannot be told from them alone (no load of everything yet,
    /// a file or status that cannot be read, an object another file names too, a stale
    /// snapshot): a reload of everything then decides, and records any problem.
    pub(super) fn reload_objects(&self, paths: &[&Path]) -> bool {
        if paths.is_empty() {
            return true;
        }
        // Held as a reload holds it, so two reloads swap in what they read in order.
        let mut guard = self.cache.lock().expect("lock");
        let cache: &mut Cache = &mut guard;
        if self.served.lock().expect("lock").policy.stale {
            return false;
        }
        let now = SystemTime::now();
        let mut topologies = BTreeSet::new();
        let mut problems = Vec::new();
        for path in paths {
            let Ok(new) = read_objects(&mut cache.objects, path, now) else {
                return false;
            };
            if new.is_none() {
                cache.objects.remove(*path);
            }
            let Some(merged) = cache.merged.as_mut() else {
                return false;
            };
            let Some(changed) = merged.replace(path, new.clone()) else {
                return false;
            };
            topologies.extend(changed);
            problems.push((*path, new.map(|o| o.problems.clone()).unwrap_or_default()));
        }
        let Some(merged) = cache.merged.as_ref() else {
            return false;
        };
        let mut updates = Vec::new();
        for key in topologies {
            let base = merged.topologies.get(&key).cloned();
            updates.push((key, base));
        }
        let (nodes, policy) = (merged.nodes.clone(), merged.policy.snapshot(true, false));
        let mut served_topologies = Vec::new();
        for (key, base) in updates {
            let Some(base) = base else {
                cache.served.remove(&key);
                served_topologies.push((key, None));
                continue;
            };
            let status = if check_path_part("namespace", &key.0).is_ok() && check_path_part("pod", &key.1).is_ok() {
                match self.read_status(&self.status_path(&key.0, &key.1)) {
                    Ok(s) => s,
                    Err(_) => return false,
                }
            } else {
                None
            };
            let t = cache.with_status(&key, base, status);
            served_topologies.push((key, Some(t)));
        }

        let address = nodes.get(&self.node_name).and_then(|n| n.addresses.first().copied());
        let mut served = self.served.lock().expect("lock");
        let mut changed = false;
        for (key, t) in served_topologies {
            match t {
                None => changed |= served.topologies.remove(&key).is_some(),
                Some(t) => match served.topologies.get(&key) {
                    Some(old) if Arc::ptr_eq(old, &t) || ***old == *t => {}
                    _ => {
                        served.topologies.insert(key, crate::Held(t));
                        changed = true;
                    }
                },
            }
        }
        if nodes != served.nodes || address != served.address {
            served.nodes = nodes;
            served.address = address;
            changed = true;
        }
        let before = served.problems.clone();
        for (path, new) in problems {
            served.problems.retain(|p| p.file != path);
            served.problems.extend(new);
        }
        log_new_problems(&served.problems, &before);
        let policy_changed = *served.policy != policy;
        if policy_changed {
            served.policy = Arc::new(policy);
        }
        drop(served);
        if changed {
            self.tx.send_modify(|g| *g += 1);
        }
        if policy_changed {
            self.policy_tx.send_modify(|g| *g += 1);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterNode, PolicyObjects, Topology, TopologyStatus};
    use std::net::IpAddr;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;
    use tokio::sync::watch;

    fn inner(dir: &Path) -> Inner {
        Inner {
            dir: dir.to_path_buf(),
            node_name: "n1".into(),
            served: Mutex::default(),
            cache: Mutex::default(),
            tx: watch::channel(0).0,
            policy_tx: watch::channel(0).0,
            ready: AtomicBool::new(false),
        }
    }

    /// Everything a source serves, comparable.
    #[derive(Debug, PartialEq)]
    struct Seen {
        topologies: Vec<Topology>,
        nodes: Vec<ClusterNode>,
        address: Option<IpAddr>,
        policy: PolicyObjects,
        problems: Vec<String>,
    }

    fn seen(i: &Inner) -> Seen {
        let s = i.served.lock().unwrap();
        Seen {
            topologies: s.topologies.values().map(|t| (***t).clone()).collect(),
            nodes: s.nodes.values().cloned().collect(),
            address: s.address,
            policy: (*s.policy).clone(),
            problems: s.problems.iter().map(ToString::to_string).collect(),
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
        dir.join(name)
    }

    fn topology(name: &str) -> String {
        format!(
            "apiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {{name: {name}, namespace: lab}}\n\
             spec: {{links: [{{uid: 1, peer_pod: x, local_intf: eth1, peer_intf: eth1}}]}}\n"
        )
    }

    fn pod(name: &str, app: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{namespace: lab, name: {name}, labels: {{app: {app}}}}}\n\
             spec: {{nodeName: n1}}\nstatus: {{podIPs: [{{ip: 10.0.0.1}}]}}\n"
        )
    }

    fn node(ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\nstatus: {{addresses: [{{type: InternalIP, address: {ip}}}]}}\n"
        )
    }

    /// Serving changed files one by one ends where a load of everything ends, whatever
    /// the change (a new file, a changed one, a removed one, a Topology with a status
    /// already written, a Node's address, a broken file, a file unchanged); a duplicate
    /// of another file's object is left to the load of everything.
    #[test]
    fn a_changed_file_served_alone_ends_where_a_load_of_everything_does() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(dir, "topology.yaml", &[topology("r1"), topology("r2")].join("---\n"));
        write(dir, "node.yaml", &node("192.0.2.1"));
        write(dir, "pod-a.yaml", &pod("a", "web"));
        let live = inner(dir);
        live.reload().unwrap();
        let check = |what: &str, paths: &[&PathBuf], alone: bool| {
            let (topologies, policy) = (*live.tx.borrow(), *live.policy_tx.borrow());
            let paths: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
            assert_eq!(live.reload_objects(&paths), alone, "{what}: served alone");
            if !alone {
                live.reload().unwrap();
            }
            let fresh = inner(dir);
            fresh.reload().unwrap();
            assert_eq!(seen(&live), seen(&fresh), "{what}");
            (*live.tx.borrow() != topologies, *live.policy_tx.borrow() != policy)
        };

        let b = write(dir, "pod-b.yaml", &pod("b", "db"));
        assert_eq!(check("a new pod", &[&b], true), (false, true));
        let a = write(dir, "pod-a.yaml", &pod("a", "api"));
        assert_eq!(check("a pod's labels", &[&a], true), (false, true));
        assert_eq!(check("unchanged", &[&a], true), (false, false));

        std::fs::create_dir_all(dir.join(".status/lab")).unwrap();
        let status = TopologyStatus {
            src_ip: "192.0.2.9".into(),
            ..Default::default()
        };
        std::fs::write(dir.join(".status/lab/r3.json"), serde_json::to_vec(&status).unwrap()).unwrap();
        let r3 = write(dir, "r3.yaml", &topology("r3"));
        assert_eq!(check("a topology with its status", &[&r3], true), (true, false));
        let t = live.served.lock().unwrap().topologies[&("lab".into(), "r3".into())].clone();
        assert_eq!(t.status.as_ref().map(|s| s.src_ip.as_str()), Some("192.0.2.9"));

        let n = write(dir, "node.yaml", &node("192.0.2.2"));
        assert_eq!(check("the node's address", &[&n], true), (true, false));
        assert_eq!(live.served.lock().unwrap().address, Some("192.0.2.2".parse().unwrap()));

        let bad = write(dir, "bad.yaml", "kind: [");
        check("a broken file", &[&bad], true);
        assert!(seen(&live).problems.iter().any(|p| p.contains("bad.yaml")));
        std::fs::remove_file(&bad).unwrap();
        check("the broken file removed", &[&bad], true);
        assert!(seen(&live).problems.is_empty());

        let dup = write(dir, "dup.yaml", &[pod("a", "other"), topology("r4")].join("---\n"));
        check("a duplicate", &[&dup], false);
        assert!(seen(&live).problems.iter().any(|p| p.contains("duplicate")));
        std::fs::remove_file(&dup).unwrap();
        check("the duplicate removed", &[&dup], false);

        std::fs::remove_file(&b).unwrap();
        std::fs::remove_file(&r3).unwrap();
        assert_eq!(check("two files removed", &[&b, &r3], true), (true, true));
        assert_eq!(seen(&live).topologies.len(), 2);
    }
}
