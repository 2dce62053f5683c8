//! The one trait both topology sources implement, and an in-memory source for tests.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::{ClusterNode, Topology, TopologyStatus, WireEnd};

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

/// Where the daemon learns about topologies and its own node, and where it reports
/// where its pods run and which wire ends it holds. Reads come from a cache and never
/// block; writes are asynchronous.
pub trait TopologySource: Send + Sync + 'static {
    /// The Topology of pod `pod` in `namespace`, if there is one.
    fn topology(&self, namespace: &str, pod: &str) -> Option<Arc<Topology>>;
    /// Every Topology known.
    fn topologies(&self) -> Vec<Arc<Topology>>;
    /// This node's address (its `InternalIP`), once known.
    fn node_address(&self) -> Option<IpAddr>;
    /// Every node known (this one included), sorted by name: where each is and which
    /// pod ranges it holds.
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
    /// Pods, namespaces and network policies as network policy reads them (a source
    /// without them: empty, and never synced).
    fn policy_objects(&self) -> Arc<crate::PolicyObjects> {
        Arc::default()
    }
    /// A counter that moves whenever [`TopologySource::policy_objects`] changes (a
    /// source without them: never).
    fn policy_changes(&self) -> watch::Receiver<u64> {
        watch::channel(0).1
    }
}

/// An in-memory source for tests: topologies are put in by hand; statuses written
/// through the trait land on them.
pub struct MemorySource {
    topologies: Mutex<BTreeMap<(String, String), Arc<Topology>>>,
    address: Mutex<Option<IpAddr>>,
    nodes: Mutex<BTreeMap<String, ClusterNode>>,
    wires: Mutex<Vec<WireEnd>>,
    tx: watch::Sender<u64>,
}

impl Default for MemorySource {
    fn default() -> Self {
        Self {
            topologies: Mutex::default(),
            address: Mutex::default(),
            nodes: Mutex::default(),
            wires: Mutex::default(),
            tx: watch::channel(0).0,
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
        self.topologies.lock().expect("lock").insert((ns, name), Arc::new(t));
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
}

impl TopologySource for MemorySource {
    fn topology(&self, namespace: &str, pod: &str) -> Option<Arc<Topology>> {
        self.topologies
            .lock()
            .expect("lock")
            .get(&(namespace.to_string(), pod.to_string()))
            .cloned()
    }
    fn topologies(&self) -> Vec<Arc<Topology>> {
        self.topologies.lock().expect("lock").values().cloned().collect()
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
            let mut t = (**t).clone();
            t.status = Some(status);
            map.insert(key, Arc::new(t));
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
}
