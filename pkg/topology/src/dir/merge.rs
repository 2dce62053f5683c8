//! Merging each file's objects into what the directory serves, with one rule for a load
//! of everything and for a changed file served alone: files are read in path order, the
//! first to name an object wins, and each later one is a duplicate, reported and left
//! out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::LoadProblem;
use super::manifest::FileObjects;
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
    pub(super) fn replace(&mut self, path: &Path, new: Option<Arc<FileObjects>>) -> Option<Vec<(String, String)>> {
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
