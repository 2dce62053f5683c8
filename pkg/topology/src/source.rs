//! The one trait both topology sources implement, and an in-memory source for tests.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use tokio::sync::watch;

use crate::objects::{PolicyMaps, cluster_policy_key, pod_key, policy_key};
use crate::strict::Strict;
use crate::{
    ClusterNetworkPolicy, ClusterNode, PolicyNamespace, PolicyObjects, PolicyPod, Topology, TopologyStatus, WireEnd,
};

/// What can go wrong talking to a source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(String),
    /// A file could not be read or written.
    #[error("{path}: {msg}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        msg: String,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Every Topology a source serves, by (namespace, name), as a persistent map: a copy
/// costs a pointer, and a source changes its map in place (an unchanged Topology keeps
/// its `Arc`), so two maps read at two moments share all but what changed in between.
/// A reader tells what moved by their difference ([`imbl::OrdMap::diff`] skips what
/// they share), not by a walk of every Topology of the cluster.
pub type Topologies = imbl::OrdMap<(String, String), Held>;

/// Brings `map` to hold exactly the keys of `now`, changing it in place rather than
/// building it anew: a key gone is removed, and a value is replaced only where `same`
/// says the old one does not stand for the new (made by `make`). So an unchanged object
/// keeps its `Arc`, and the map keeps sharing its structure with the copies readers
/// hold (their difference from it stays the change). Whether anything changed.
pub(crate) fn follow<K: Ord + Clone, V: Clone, N>(
    map: &mut imbl::OrdMap<K, V>,
    now: BTreeMap<K, N>,
    same: impl Fn(&V, &N) -> bool,
    make: impl Fn(N) -> V,
) -> bool {
    let gone: Vec<K> = map.keys().filter(|k| !now.contains_key(*k)).cloned().collect();
    let mut changed = !gone.is_empty();
    for k in gone {
        map.remove(&k);
    }
    for (k, n) in now {
        if map.get(&k).is_none_or(|old| !same(old, &n)) {
            map.insert(k, make(n));
            changed = true;
        }
    }
    changed
}

/// A Topology as [`Topologies`] holds it: equal to another only when it is the very
/// same object (a source keeps an unchanged one's `Arc`). So the difference of two maps
/// compares a pointer per entry it visits, never two Topologies field by field, and a
/// Topology replaced by a new read of it counts as changed.
#[derive(Debug, Clone)]
pub struct Held(pub Arc<Topology>);

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for Held {
    type Target = Arc<Topology>;
    fn deref(&self) -> &Arc<Topology> {
        &self.0
    }
}

/// Where the daemon learns about topologies and its own node, and where it reports
/// where its pods run and which wire ends it holds. Reads come from a cache and never
/// block; writes are asynchronous.
pub trait TopologySource: Send + Sync + 'static {
    /// The Topology of pod `pod` in `namespace`, if there is one.
    fn topology(&self, namespace: &str, pod: &str) -> Option<Arc<Topology>>;
    /// Every Topology known, by namespace and name: the same map, or one sharing all
    /// but what changed, from one call to the next (see [`Topologies`]).
    fn topologies(&self) -> Topologies;
    /// This node's address (its `InternalIP`), once known.
    fn node_address(&self) -> Option<IpAddr>;
    /// Every node known (this one included), sorted by name: where each is and which
    /// pod ranges it holds, and its labels and external addresses (for network policy's
    /// node peers). A change of any of these moves [`TopologySource::changes`].
    fn nodes(&self) -> Vec<ClusterNode>;
    /// Records where a pod of this node runs (or, with an empty status, that it is gone).
    fn set_status<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        status: TopologyStatus,
    ) -> BoxFuture<'a, Result<(), SourceError>>;
    /// Mirrors this node's wire ends into its `WireState`.
    fn set_wire_state(&self, wires: Vec<WireEnd>) -> BoxFuture<'_, Result<(), SourceError>>;
    /// A counter that moves whenever anything the source knows changes.
    fn changes(&self) -> watch::Receiver<u64>;
    /// Whether the caches are filled (the daemon is not ready before).
    fn ready(&self) -> bool;
    /// Pods, namespaces, network policies and cluster network policies as network
    /// policy reads them (a source without them: empty, and never synced).
    fn policy_objects(&self) -> Arc<crate::PolicyObjects> {
        Arc::default()
    }
    /// A counter that moves whenever [`TopologySource::policy_objects`] changes (a
    /// source without them: never).
    fn policy_changes(&self) -> watch::Receiver<u64> {
        watch::channel(0).1
    }
}

/// An in-memory source for tests: topologies, nodes, pods, namespaces, network
/// policies and cluster network policies are put in by hand; statuses written through the trait land on them. Its
/// policy objects start synced (everything it has is all there is) and not stale.
pub struct MemorySource {
    topologies: Mutex<Topologies>,
    address: Mutex<Option<IpAddr>>,
    nodes: Mutex<BTreeMap<String, ClusterNode>>,
    wires: Mutex<Vec<WireEnd>>,
    tx: watch::Sender<u64>,
    policy: Mutex<MemoryPolicy>,
    policy_tx: watch::Sender<u64>,
}

struct MemoryPolicy {
    maps: PolicyMaps,
    synced: bool,
    stale: bool,
    snapshot: Arc<PolicyObjects>,
}

impl Default for MemorySource {
    fn default() -> Self {
        Self {
            topologies: Mutex::default(),
            address: Mutex::default(),
            nodes: Mutex::default(),
            wires: Mutex::default(),
            tx: watch::channel(0).0,
            policy: Mutex::new(MemoryPolicy {
                maps: PolicyMaps::default(),
                synced: true,
                stale: false,
                snapshot: Arc::new(PolicyObjects {
                    synced: true,
                    ..PolicyObjects::default()
                }),
            }),
            policy_tx: watch::channel(0).0,
        }
    }
}

impl MemorySource {
    fn bump(&self) {
        self.tx.send_modify(|g| *g += 1);
    }

    /// Adds or replaces a topology.
    pub fn put(&self, t: Topology) {
        let ns = t.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = t.metadata.name.clone().unwrap_or_default();
        self.topologies
            .lock()
            .expect("lock")
            .insert((ns, name), Held(Arc::new(t)));
        self.bump();
    }

    /// Removes a topology.
    pub fn remove(&self, namespace: &str, pod: &str) {
        self.topologies
            .lock()
            .expect("lock")
            .remove(&(namespace.to_string(), pod.to_string()));
        self.bump();
    }

    /// Sets this node's address.
    pub fn set_address(&self, a: IpAddr) {
        *self.address.lock().expect("lock") = Some(a);
        self.bump();
    }

    /// Adds or replaces a node.
    pub fn put_node(&self, node: ClusterNode) {
        self.nodes.lock().expect("lock").insert(node.name.clone(), node);
        self.bump();
    }

    /// Removes a node.
    pub fn remove_node(&self, name: &str) {
        self.nodes.lock().expect("lock").remove(name);
        self.bump();
    }

    /// The wire ends last mirrored.
    pub fn wires(&self) -> Vec<WireEnd> {
        self.wires.lock().expect("lock").clone()
    }

    /// Changes the policy objects and, if the snapshot differs afterwards, publishes it
    /// and moves [`TopologySource::policy_changes`] (as the real sources do, a write that
    /// changes nothing moves nothing).
    fn change_policy(&self, f: impl FnOnce(&mut MemoryPolicy)) {
        let mut p = self.policy.lock().expect("lock");
        f(&mut p);
        let next = p.maps.snapshot(p.synced, p.stale);
        if *p.snapshot != next {
            p.snapshot = Arc::new(next);
            drop(p);
            self.policy_tx.send_modify(|g| *g += 1);
        }
    }

    /// Adds or replaces a pod (by namespace and name).
    pub fn put_pod(&self, pod: PolicyPod) {
        self.change_policy(|p| {
            p.maps.pods.insert(pod_key(&pod), Arc::new(pod));
        });
    }

    /// Removes a pod.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.change_policy(|p| {
            p.maps.pods.remove(&(namespace.to_string(), name.to_string()));
        });
    }

    /// Adds or replaces a namespace (by name).
    pub fn put_namespace(&self, namespace: PolicyNamespace) {
        self.change_policy(|p| {
            p.maps.namespaces.insert(namespace.name.clone(), Arc::new(namespace));
        });
    }

    /// Removes a namespace.
    pub fn remove_namespace(&self, name: &str) {
        self.change_policy(|p| {
            p.maps.namespaces.remove(name);
        });
    }

    /// Adds or replaces a network policy (by namespace, `default` if unset, and name);
    /// one without a name is ignored.
    pub fn put_policy(&self, mut policy: NetworkPolicy) {
        // As the API server would: the object itself says where it applies.
        policy.metadata.namespace.get_or_insert_with(|| "default".into());
        self.change_policy(|p| {
            if let Some(key) = policy_key(&policy) {
                p.maps.policies.insert(key, Arc::new(Strict::known(policy)));
            }
        });
    }

    /// Removes a network policy.
    pub fn remove_policy(&self, namespace: &str, name: &str) {
        self.change_policy(|p| {
            p.maps.policies.remove(&(namespace.to_string(), name.to_string()));
        });
    }

    /// Adds or replaces a cluster network policy (by name); one without a name is
    /// ignored.
    pub fn put_cluster_policy(&self, mut policy: ClusterNetworkPolicy) {
        // Cluster-scoped: the API server would keep no namespace.
        policy.metadata.namespace = None;
        self.change_policy(|p| {
            if let Some(key) = cluster_policy_key(&policy) {
                p.maps.cluster_policies.insert(key, Arc::new(Strict::known(policy)));
            }
        });
    }

    /// Removes a cluster network policy.
    pub fn remove_cluster_policy(&self, name: &str) {
        self.change_policy(|p| {
            p.maps.cluster_policies.remove(name);
        });
    }

    /// Sets [`PolicyObjects::synced`] (to test what happens before the first list).
    pub fn set_policy_synced(&self, synced: bool) {
        self.change_policy(|p| p.synced = synced);
    }

    /// Sets [`PolicyObjects::stale`] (to test a lost watch).
    pub fn set_policy_stale(&self, stale: bool) {
        self.change_policy(|p| p.stale = stale);
    }
}

impl TopologySource for MemorySource {
    fn topology(&self, namespace: &str, pod: &str) -> Option<Arc<Topology>> {
        self.topologies
            .lock()
            .expect("lock")
            .get(&(namespace.to_string(), pod.to_string()))
            .map(|t| t.0.clone())
    }
    fn topologies(&self) -> Topologies {
        self.topologies.lock().expect("lock").clone()
    }
    fn node_address(&self) -> Option<IpAddr> {
        *self.address.lock().expect("lock")
    }
    fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes.lock().expect("lock").values().cloned().collect()
    }
    fn set_status<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        status: TopologyStatus,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let key = (namespace.to_string(), pod.to_string());
            let mut map = self.topologies.lock().expect("lock");
            let Some(t) = map.get(&key) else {
                return Err(SourceError::Other(format!("no topology {namespace}/{pod}")));
            };
            let mut t = (***t).clone();
            t.status = Some(status);
            map.insert(key, Held(Arc::new(t)));
            drop(map);
            self.bump();
            Ok(())
        })
    }
    fn set_wire_state(&self, wires: Vec<WireEnd>) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(async move {
            *self.wires.lock().expect("lock") = wires;
            Ok(())
        })
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
    fn ready(&self) -> bool {
        true
    }
    fn policy_objects(&self) -> Arc<PolicyObjects> {
        self.policy.lock().expect("lock").snapshot.clone()
    }
    fn policy_changes(&self) -> watch::Receiver<u64> {
        self.policy_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_source_policy_objects_are_sorted_and_move_only_on_change() {
        let source = MemorySource::default();
        let changes = source.policy_changes();
        assert!(source.policy_objects().synced && !source.policy_objects().stale);
        let pod = |ns: &str, name: &str| PolicyPod {
            namespace: ns.into(),
            name: name.into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            ..PolicyPod::default()
        };
        source.put_pod(pod("b", "x"));
        source.put_pod(pod("a", "y"));
        source.put_namespace(PolicyNamespace {
            name: "b".into(),
            ..PolicyNamespace::default()
        });
        let mut policy = NetworkPolicy::default();
        policy.metadata.name = Some("p".into());
        source.put_policy(policy);
        assert_eq!(*changes.borrow(), 4);
        let o = source.policy_objects();
        let pods: Vec<_> = o
            .pods
            .values()
            .map(|p| (p.namespace.as_str(), p.name.as_str()))
            .collect();
        assert_eq!(pods, [("a", "y"), ("b", "x")]);
        assert_eq!(o.namespaces.len(), 1);
        assert_eq!(o.policies.len(), 1);

        // The same again moves nothing.
        source.put_pod(pod("a", "y"));
        assert_eq!(*changes.borrow(), 4);
        source.set_policy_stale(true);
        assert!(source.policy_objects().stale);
        source.remove_pod("a", "y");
        source.remove_policy("default", "p");
        source.remove_namespace("b");
        source.set_policy_synced(false);
        assert_eq!(*changes.borrow(), 9);
        let o = source.policy_objects();
        assert_eq!(o.pods.len(), 1);
        assert!(o.namespaces.is_empty() && o.policies.is_empty() && !o.synced);
        // Nothing of it is a topology change.
        assert_eq!(*source.changes().borrow(), 0);
    }

    #[test]
    fn memory_source_cluster_policies_are_sorted_by_name_and_move_only_on_change() {
        let source = MemorySource::default();
        let changes = source.policy_changes();
        let cnp = |name: &str, priority: i32| {
            let mut c = ClusterNetworkPolicy::new(
                name,
                crate::ClusterNetworkPolicySpec {
                    priority: Some(priority),
                    ..Default::default()
                },
            );
            c.metadata.namespace = Some("ignored".into());
            c
        };
        source.put_cluster_policy(cnp("b", 1));
        source.put_cluster_policy(cnp("a", 2));
        assert_eq!(*changes.borrow(), 2);
        let o = source.policy_objects();
        let names: Vec<_> = (o.cluster_policies.iter())
            .map(|c| {
                (
                    c.object.metadata.name.as_deref().unwrap(),
                    c.object.metadata.namespace.as_deref(),
                )
            })
            .collect();
        assert_eq!(names, [("a", None), ("b", None)], "sorted, cluster-scoped");

        // The same again moves nothing; a new spec moves once.
        source.put_cluster_policy(cnp("a", 2));
        assert_eq!(*changes.borrow(), 2);
        source.put_cluster_policy(cnp("a", 3));
        assert_eq!(*changes.borrow(), 3);
        assert_eq!(
            source.policy_objects().cluster_policies[0].object.spec.priority,
            Some(3)
        );
        // Without a name, nothing.
        source.put_cluster_policy(ClusterNetworkPolicy::default());
        assert_eq!(*changes.borrow(), 3);

        source.remove_cluster_policy("b");
        source.remove_cluster_policy("nothing");
        assert_eq!(*changes.borrow(), 4);
        let o = source.policy_objects();
        assert_eq!(o.cluster_policies.len(), 1);
        assert!(o.pods.is_empty() && o.policies.is_empty());
        assert_eq!(*source.changes().borrow(), 0);
    }
}
