//! Merging each file's objects into what the directory serves, with one rule for a load
//! of everything and for a changed file served alone: files are read in path order, the
//! first to name an object wins, and each later one is a duplicate, reported and left
//! out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::cache::{Cache, Cached, cached};
use super::manifest::{FileObjects, parse_file};
use super::{Inner, LoadProblem, check_path_part, log_new_problems};
use crate::objects::{PolicyMaps, cluster_policy_key, pod_key, policy_key};
use crate::strict::Strict;
use crate::{ClusterNetworkPolicy, ClusterNode, PolicyNamespace, PolicyPod, Topology};

/// An object's identity across the files: two files naming the same one hold
/// duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum ObjectKey {
    /// A Topology by (namespace, name).
    Topology(String, String),
    /// A Node by name.
    Node(String),
    /// A Pod by (namespace, name).
    Pod(String, String),
    /// A Namespace by name.
    Namespace(String),
    /// A NetworkPolicy by (namespace, `default` if unset; name).
    NetworkPolicy(String, String),
    /// A ClusterNetworkPolicy by name.
    ClusterNetworkPolicy(String),
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectKey::Topology(ns, n) => write!(f, "Topology {ns}/{n}"),
            ObjectKey::Node(n) => write!(f, "Node {n}"),
            ObjectKey::Pod(ns, n) => write!(f, "Pod {ns}/{n}"),
            ObjectKey::Namespace(n) => write!(f, "Namespace {n}"),
            ObjectKey::NetworkPolicy(ns, n) => write!(f, "NetworkPolicy {ns}/{n}"),
            ObjectKey::ClusterNetworkPolicy(n) => write!(f, "ClusterNetworkPolicy {n}"),
        }
    }
}

/// One object of a file that the directory serves.
enum Entry<'a> {
    Topology(&'a Arc<Topology>),
    Node(&'a ClusterNode),
    Pod(&'a Arc<PolicyPod>),
    Namespace(&'a Arc<PolicyNamespace>),
    NetworkPolicy(&'a Arc<Strict<NetworkPolicy>>),
    ClusterNetworkPolicy(&'a Arc<Strict<ClusterNetworkPolicy>>),
}

impl Entry<'_> {
    /// Its identity; `None` for a policy without a name (never served).
    fn key(&self) -> Option<ObjectKey> {
        Some(match self {
            Entry::Topology(t) => ObjectKey::Topology(
                t.metadata.namespace.clone().unwrap_or_default(),
                t.metadata.name.clone().unwrap_or_default(),
            ),
            Entry::Node(n) => ObjectKey::Node(n.name.clone()),
            Entry::Pod(p) => {
                let (ns, n) = pod_key(p);
                ObjectKey::Pod(ns, n)
            }
            Entry::Namespace(n) => ObjectKey::Namespace(n.name.clone()),
            Entry::NetworkPolicy(p) => {
                let (ns, n) = policy_key(&p.object)?;
                ObjectKey::NetworkPolicy(ns, n)
            }
            Entry::ClusterNetworkPolicy(p) => ObjectKey::ClusterNetworkPolicy(cluster_policy_key(&p.object)?),
        })
    }
}

/// Every object `objects` holds that the directory serves, each with its key.
fn entries(objects: &FileObjects) -> Vec<(ObjectKey, Entry<'_>)> {
    let all = (objects.topologies.iter().map(Entry::Topology))
        .chain(objects.nodes.iter().map(Entry::Node))
        .chain(objects.pods.iter().map(Entry::Pod))
        .chain(objects.namespaces.iter().map(Entry::Namespace))
        .chain(objects.policies.iter().map(Entry::NetworkPolicy))
        .chain(objects.cluster_policies.iter().map(Entry::ClusterNetworkPolicy));
    all.filter_map(|e| Some((e.key()?, e))).collect()
}

/// What the files of the directory hold, merged; kept between loads so that a changed
/// file can be served without reading the others.
#[derive(Default)]
pub(super) struct Merged {
    /// Each file read, by path.
    files: BTreeMap<PathBuf, Arc<FileObjects>>,
    /// How many objects of each key the files hold (more than one: duplicates).
    counts: HashMap<ObjectKey, usize>,
    /// The Topologies as their files have them (without the status files).
    pub(super) topologies: BTreeMap<(String, String), Arc<Topology>>,
    /// The Nodes by name.
    pub(super) nodes: BTreeMap<String, ClusterNode>,
    /// The policy objects.
    pub(super) policy: PolicyMaps,
}

impl Merged {
    /// Merges `files`, adding each file's own problems and the duplicates to `problems`.
    pub(super) fn of(files: BTreeMap<PathBuf, Arc<FileObjects>>, problems: &mut BTreeSet<LoadProblem>) -> Merged {
        let mut m = Merged::default();
        let mut first: HashMap<ObjectKey, &Path> = HashMap::new();
        for (path, objects) in &files {
            problems.extend(objects.problems.iter().cloned());
            for (key, entry) in entries(objects) {
                *m.counts.entry(key.clone()).or_default() += 1;
                if let Some(before) = first.get(&key) {
                    problems.insert(LoadProblem {
                        file: path.clone(),
                        object: Some(key.to_string()),
                        reason: format!("duplicate of the one in {}; this one is ignored", before.display()),
                    });
                    continue;
                }
                first.insert(key, path);
                m.serve(entry);
            }
            m.serve_unreadable(path, objects);
        }
        m.files = files;
        m
    }

    fn serve(&mut self, entry: Entry<'_>) {
        match entry {
            Entry::Topology(t) => {
                let key = (
                    t.metadata.namespace.clone().unwrap_or_default(),
                    t.metadata.name.clone().unwrap_or_default(),
                );
                self.topologies.insert(key, t.clone());
            }
            Entry::Node(n) => {
                self.nodes.insert(n.name.clone(), n.clone());
            }
            Entry::Pod(p) => {
                self.policy.pods.insert(pod_key(p), p.clone());
            }
            Entry::Namespace(n) => {
                self.policy.namespaces.insert(n.name.clone(), n.clone());
            }
            Entry::NetworkPolicy(p) => {
                if let Some(key) = policy_key(&p.object) {
                    self.policy.policies.insert(key, p.clone());
                }
            }
            Entry::ClusterNetworkPolicy(p) => {
                if let Some(key) = cluster_policy_key(&p.object) {
                    self.policy.cluster_policies.insert(key, p.clone());
                }
            }
        }
    }

    fn unserve(&mut self, key: &ObjectKey) {
        match key {
            ObjectKey::Topology(ns, n) => {
                self.topologies.remove(&(ns.clone(), n.clone()));
            }
            ObjectKey::Node(n) => {
                self.nodes.remove(n);
            }
            ObjectKey::Pod(ns, n) => {
                self.policy.pods.remove(&(ns.clone(), n.clone()));
            }
            ObjectKey::Namespace(n) => {
                self.policy.namespaces.remove(n);
            }
            ObjectKey::NetworkPolicy(ns, n) => {
                self.policy.policies.remove(&(ns.clone(), n.clone()));
            }
            ObjectKey::ClusterNetworkPolicy(n) => {
                self.policy.cluster_policies.remove(n);
            }
        }
    }

    /// The policy objects of `path` that do not decode, kept by file.
    fn serve_unreadable(&mut self, path: &Path, objects: &FileObjects) {
        let file = path.display().to_string();
        if objects.unreadable.is_empty() {
            self.policy.unreadable.remove(&file);
        } else {
            self.policy.unreadable.insert(file, objects.unreadable.clone());
        }
    }

    /// Serves `new` as the objects of file `path` (`None`: the file is gone) in place
    /// of what it held, and returns the Topologies that changed; `None`, changing
    /// nothing, when an object of either version is also named by another file or twice
    /// in the file, as then only a merge of every file can tell which one wins.
    fn replace(&mut self, path: &Path, new: Option<Arc<FileObjects>>) -> Option<Vec<(String, String)>> {
        let old = self.files.get(path).cloned();
        if let (Some(o), Some(n)) = (&old, &new)
            && Arc::ptr_eq(o, n)
        {
            return Some(vec![]);
        }
        let old_keys: Vec<ObjectKey> = old
            .as_deref()
            .map(entries)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let new_entries = new.as_deref().map(entries).unwrap_or_default();
        let mut mine: HashMap<&ObjectKey, usize> = HashMap::new();
        for k in &old_keys {
            *mine.entry(k).or_default() += 1;
        }
        let mut named = BTreeSet::new();
        for (k, _) in &new_entries {
            let theirs = self.counts.get(k).copied().unwrap_or(0) - mine.get(k).copied().unwrap_or(0);
            if theirs > 0 || !named.insert(k) {
                return None;
            }
        }
        if mine
            .iter()
            .any(|(k, n)| *n > 1 || self.counts.get(*k).copied().unwrap_or(0) > *n)
        {
            return None;
        }
        let mut changed = Vec::new();
        for k in &old_keys {
            self.counts.remove(k);
            self.unserve(k);
            if let ObjectKey::Topology(ns, n) = k {
                changed.push((ns.clone(), n.clone()));
            }
        }
        for (k, entry) in new_entries {
            if let ObjectKey::Topology(ns, n) = &k {
                changed.push((ns.clone(), n.clone()));
            }
            self.counts.insert(k, 1);
            self.serve(entry);
        }
        match &new {
            Some(objects) => {
                self.serve_unreadable(path, objects);
                self.files.insert(path.to_path_buf(), objects.clone());
            }
            None => {
                self.policy.unreadable.remove(&path.display().to_string());
                self.files.remove(path);
            }
        }
        changed.sort();
        changed.dedup();
        Some(changed)
    }
}

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
                    Some(old) if Arc::ptr_eq(old, &t) || **old == *t => {}
                    _ => {
                        served.topologies.insert(key, t);
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
    use crate::{PolicyObjects, TopologyStatus};
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
            topologies: s.topologies.values().map(|t| (**t).clone()).collect(),
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
