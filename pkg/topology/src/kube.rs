//! Topologies, nodes and (in `policy`) the objects network policy reads from the
//! Kubernetes API, through watch caches (reflectors): reads never call the API server.

mod policy;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{
    ClusterNode, Held, PolicyObjects, SourceError, Topologies, Topology, TopologySource, TopologyStatus, WireEnd,
    WireState, validate,
};

/// The field manager weftd writes as (server-side apply, status patches).
pub const FIELD_MANAGER: &str = "weftd";

/// A [`TopologySource`] backed by watch caches of every `Topology` and every `Node` in
/// the cluster, and, for network policy, of every `Pod`, `Namespace`, `NetworkPolicy`
/// and `ClusterNetworkPolicy`. Writes go to the API server.
///
/// Policies are read strictly (a field weft does not know is named in
/// [`crate::Strict::unknown`]); one that does not decode is left out alone, with a
/// warning. ClusterNetworkPolicy is watched at v1beta1 and v1alpha2, each object once
/// (v1beta1's copy where both are served). Its CRD is not weft's, so the policy objects
/// do not wait for it: where the cluster answers 404 at a version (no CRD, or that
/// version not served) the version counts as listed with none (synced, not stale; said
/// in the log, and once more plainly when neither version is served) and is asked for
/// again after 1 s, doubling up to every 60 s, so a CRD installed later is picked up.
/// A 403 (the ClusterRole lacks it) is logged as an error and counts as listed too, but
/// stale: never synced would leave every new pod of a cluster whose RBAC was not
/// updated without networking (a 403 does not even say the CRD exists), while stale
/// keeps saying (`weft_policy_stale`, `/readyz`) that their Admin-tier denies, if any,
/// are not enforced; ones read before the 403 stay enforced. Any other failure is a lost
/// watch: stale, the last objects kept.
pub struct KubeSource {
    client: Client,
    node_name: String,
    nodes: Store<Node>,
    shared: Arc<Shared>,
    policy: Arc<policy::PolicyCache>,
    /// Whether the node's `WireState` object is known to exist, owned by the Node (see
    /// `set_wire_state`).
    wire_state_exists: AtomicBool,
    tasks: Vec<tokio::task::AbortHandle>,
}

struct Shared {
    tx: watch::Sender<u64>,
    /// The Topology cache as [`TopologySource::topologies`] serves it: kept in step
    /// with the reflector's store at each event, changed in place (see [`Topologies`]).
    topologies: std::sync::Mutex<Topologies>,
    topologies_synced: AtomicBool,
    node_synced: AtomicBool,
    address: std::sync::Mutex<Option<IpAddr>>,
    /// Every node as pod networking sees it, sorted by name.
    nodes: std::sync::Mutex<Vec<ClusterNode>>,
}

impl Shared {
    fn bump(&self) {
        self.tx.send_modify(|g| *g += 1);
    }
}

impl KubeSource {
    /// Starts watching (in tasks of the current Tokio runtime, which must exist; they end
    /// when the source is dropped). The caches fill in the background: see
    /// [`TopologySource::ready`] (which does not wait for the policy objects: their
    /// snapshot says itself whether it is synced).
    pub fn start(client: Client, node_name: String) -> Arc<KubeSource> {
        let shared = Arc::new(Shared {
            tx: watch::channel(0).0,
            topologies: std::sync::Mutex::default(),
            topologies_synced: AtomicBool::new(false),
            node_synced: AtomicBool::new(false),
            address: std::sync::Mutex::new(None),
            nodes: std::sync::Mutex::default(),
        });

        let (topologies, writer) = reflector::store::<Topology>();
        let stream = watcher(Api::<Topology>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .filter_map(|ev| futures::future::ready(screen(ev)))
            .reflect(writer);
        let (s, store) = (shared.clone(), topologies);
        let topo_task = tokio::spawn(drive(stream, "Topology", move |ev| {
            // The map follows the cache, with the cache's own `Arc`s.
            let mut map = s.topologies.lock().expect("lock");
            match ev {
                watcher::Event::InitDone => {
                    follow_all(&mut map, &store);
                    drop(map);
                    s.topologies_synced.store(true, Ordering::Release);
                    s.bump();
                }
                watcher::Event::Apply(t) => {
                    let key = topology_key(t);
                    match store.get(&ObjectRef::new(&key.1).within(&key.0)) {
                        Some(t) => map.insert(key, Held(t)),
                        None => map.remove(&key),
                    };
                    drop(map);
                    s.bump();
                }
                watcher::Event::Delete(t) => {
                    map.remove(&topology_key(t));
                    drop(map);
                    s.bump();
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
        }));

        // Every Node, not just this one: pod routes to the other nodes come from their
        // addresses and podCIDRs, and network policy's node peers from their labels and
        // addresses. Kubelets rewrite their Node often; only those fields matter, so the
        // cache keeps nothing else and a change is announced only when what pod
        // networking or policy sees changed.
        let (nodes, writer) = reflector::store::<Node>();
        let stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|ev| ev.map(|ev| ev.modify(slim_node)))
            .reflect(writer);
        let (s, store, me) = (shared.clone(), nodes.clone(), node_name.clone());
        let node_task = tokio::spawn(drive(stream, "Node", move |ev| {
            if matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
                return;
            }
            let mut view: Vec<ClusterNode> = store.state().iter().filter_map(|n| ClusterNode::from_node(n)).collect();
            view.sort();
            let address = view
                .iter()
                .find(|n| n.name == me)
                .and_then(|n| n.addresses.first().copied());
            let first_sync = matches!(ev, watcher::Event::InitDone) && !s.node_synced.swap(true, Ordering::AcqRel);
            let moved = {
                let mut a = s.address.lock().expect("lock");
                std::mem::replace(&mut *a, address) != address
            };
            let changed = {
                let mut cur = s.nodes.lock().expect("lock");
                if *cur == view {
                    false
                } else {
                    *cur = view;
                    true
                }
            };
            if first_sync || moved || changed {
                s.bump();
            }
        }));

        let (policy, mut tasks) = policy::start(&client);
        tasks.extend([topo_task.abort_handle(), node_task.abort_handle()]);

        Arc::new(KubeSource {
            client,
            node_name,
            nodes,
            shared,
            policy,
            wire_state_exists: AtomicBool::new(false),
            tasks,
        })
    }

    /// Writes the node's `WireState` status, creating the object when needed.
    async fn apply_wire_state(&self, wires: &[WireEnd]) -> Result<(), kube::Error> {
        let api: Api<WireState> = Api::all(self.client.clone());
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        if !self.wire_state_exists.load(Ordering::Acquire) {
            let mut metadata = json!({ "name": self.node_name });
            // Owned by the Node, so the garbage collector removes it with the node.
            let owner = self
                .nodes
                .get(&ObjectRef::new(&self.node_name))
                .and_then(|n| n.metadata.uid.clone());
            if let Some(uid) = &owner {
                metadata["ownerReferences"] =
                    json!([{ "apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid }]);
            }
            let body = json!({
                "apiVersion": WireState::api_version(&()),
                "kind": WireState::kind(&()),
                "metadata": metadata,
                "spec": {},
            });
            api.patch(&self.node_name, &pp, &Patch::Apply(&body)).await?;
            // Done only once applied with its owner: a WireState first written before the
            // Node was in the cache (the daemon mirrors wires as soon as it knows its own
            // address, which can be configured) would otherwise never get one, and would
            // outlive its node. Until then, every call applies the metadata again.
            self.wire_state_exists.store(owner.is_some(), Ordering::Release);
        }
        let body = json!({
            "apiVersion": WireState::api_version(&()),
            "kind": WireState::kind(&()),
            "metadata": { "name": self.node_name },
            "status": { "wires": wires },
        });
        api.patch_status(&self.node_name, &pp, &Patch::Apply(&body)).await?;
        Ok(())
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Keeps only what [`ClusterNode`] reads of a Node (name, uid, labels, podCIDRs,
/// addresses): a cluster's Nodes carry images, conditions and annotations that would
/// otherwise fill the cache of every daemon. The labels stay: ClusterNetworkPolicy's
/// `nodes` peers select Nodes by them.
fn slim_node(n: &mut Node) {
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    n.metadata.managed_fields = None;
    n.metadata.annotations = None;
    if let Some(sp) = n.spec.as_mut() {
        *sp = NodeSpec {
            pod_cidr: sp.pod_cidr.take(),
            pod_cidrs: sp.pod_cidrs.take(),
            ..NodeSpec::default()
        };
    }
    if let Some(st) = n.status.as_mut() {
        *st = NodeStatus {
            addresses: st.addresses.take(),
            ..NodeStatus::default()
        };
    }
}

/// Keeps invalid Topologies out of the cache: an invalid update removes the object (the
/// previous valid version is stale too), an invalid object in a (re)list is left out.
fn screen(ev: watcher::Result<watcher::Event<Topology>>) -> Option<watcher::Result<watcher::Event<Topology>>> {
    let ev = match ev {
        Ok(ev) => ev.modify(|t| t.metadata.managed_fields = None),
        Err(e) => return Some(Err(e)),
    };
    let invalid = |t: &Topology| match validate(t) {
        Ok(()) => false,
        Err(errors) => {
            let ns = t.metadata.namespace.as_deref().unwrap_or_default();
            let name = t.metadata.name.as_deref().unwrap_or_default();
            tracing::warn!(topology = %format!("{ns}/{name}"), reason = %errors.join("; "), "invalid Topology left out");
            true
        }
    };
    match ev {
        watcher::Event::Apply(t) if invalid(&t) => Some(Ok(watcher::Event::Delete(t))),
        watcher::Event::InitApply(t) if invalid(&t) => None,
        ev => Some(Ok(ev)),
    }
}

/// Where the cache keeps Topology `t`: its namespace and name.
fn topology_key(t: &Topology) -> (String, String) {
    (
        t.metadata.namespace.clone().unwrap_or_default(),
        t.metadata.name.clone().unwrap_or_default(),
    )
}

/// Brings `map` to what `store` holds after a (re)list, changing only what differs: a
/// Topology the store still has as the very same `Arc` stays as it is.
fn follow_all(map: &mut Topologies, store: &Store<Topology>) {
    let now = store.state().into_iter().map(|t| (topology_key(&t), t)).collect();
    crate::source::follow(map, now, |old, t| Arc::ptr_eq(old, t), Held);
}

/// Runs a reflector stream for ever, calling `on_event` after each event is in the cache.
async fn drive<K, S>(stream: S, what: &'static str, on_event: impl FnMut(&watcher::Event<K>))
where
    S: Stream<Item = watcher::Result<watcher::Event<K>>>,
{
    drive_with(stream, what, on_event, |_| false).await
}

/// [`drive`], calling `on_error` too when the watch fails (not when it merely expires);
/// an error `on_error` says is expected (`true`) is not warned about.
async fn drive_with<K, S>(
    stream: S,
    what: &'static str,
    mut on_event: impl FnMut(&watcher::Event<K>),
    mut on_error: impl FnMut(&watcher::Error) -> bool,
) where
    S: Stream<Item = watcher::Result<watcher::Event<K>>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => on_event(&ev),
            // The history moved past us: the watcher relists, nothing is wrong.
            Err(watcher::Error::WatchError(s)) if s.code == 410 => {
                tracing::debug!(resource = what, "watch expired (410 Gone); relisting")
            }
            Err(e) => {
                if on_error(&e) {
                    tracing::debug!(resource = what, error = %e, "watch failed as expected; retrying later");
                } else {
                    tracing::warn!(resource = what, error = %e, "watch failed; retrying with backoff");
                }
            }
        }
    }
}

/// A merge patch of the whole status: empty fields are sent as `null` so that clearing
/// a status (pod gone) removes what was there, which a plain serialization (empty fields
/// skipped) would leave in place.
fn status_patch(status: &TopologyStatus) -> Value {
    let s = |v: &str| if v.is_empty() { Value::Null } else { v.into() };
    json!({
        "status": {
            "src_ip": s(&status.src_ip),
            "net_ns": s(&status.net_ns),
            "container_id": s(&status.container_id),
            "skipped": if status.skipped.is_empty() { Value::Null } else { json!(status.skipped) },
            "links": if status.links.is_empty() { Value::Null } else { json!(status.links) },
        }
    })
}

fn kube_err(e: kube::Error) -> SourceError {
    SourceError::Kube(e.to_string())
}

impl TopologySource for KubeSource {
    fn topology(&self, namespace: &str, pod: &str) -> Option<Arc<Topology>> {
        // From the map, not the store: what one Topology and the listing of all say
        // agrees at every moment.
        (self.shared.topologies.lock().expect("lock"))
            .get(&(namespace.to_string(), pod.to_string()))
            .map(|t| t.0.clone())
    }

    fn topologies(&self) -> Topologies {
        self.shared.topologies.lock().expect("lock").clone()
    }

    fn node_address(&self) -> Option<IpAddr> {
        *self.shared.address.lock().expect("lock")
    }

    fn nodes(&self) -> Vec<ClusterNode> {
        self.shared.nodes.lock().expect("lock").clone()
    }

    fn set_status<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        status: TopologyStatus,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let api: Api<Topology> = Api::namespaced(self.client.clone(), namespace);
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            api.patch_status(pod, &pp, &Patch::Merge(status_patch(&status)))
                .await
                .map_err(kube_err)?;
            Ok(())
        })
    }

    /// Server-side apply, as field manager `weftd` with force: the node's daemon is the
    /// only writer of its `WireState`, so there is nothing to read first, no conflict to
    /// retry, and the wire list is replaced whole. Because `status` is a subresource, the
    /// object is created (by an apply of its metadata, owned by the Node: once per process
    /// when the Node is cached, on every call until then) before its status is applied;
    /// if it was deleted since, the status apply answers 404 and both steps run again.
    fn set_wire_state(&self, wires: Vec<WireEnd>) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(async move {
            match self.apply_wire_state(&wires).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.wire_state_exists.store(false, Ordering::Release);
                    self.apply_wire_state(&wires).await.map_err(kube_err)
                }
                r => r.map_err(kube_err),
            }
        })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.shared.tx.subscribe()
    }

    fn ready(&self) -> bool {
        self.shared.topologies_synced.load(Ordering::Acquire) && self.shared.node_synced.load(Ordering::Acquire)
    }

    fn policy_objects(&self) -> Arc<PolicyObjects> {
        self.policy.snapshot()
    }

    fn policy_changes(&self) -> watch::Receiver<u64> {
        self.policy.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearing_a_status_nulls_every_field() {
        assert_eq!(
            status_patch(&TopologyStatus::default()),
            json!({"status": {"src_ip": null, "net_ns": null, "container_id": null, "skipped": null, "links": null}})
        );
        let st = TopologyStatus {
            src_ip: "10.0.0.1".into(),
            net_ns: "/var/run/netns/x".into(),
            ..Default::default()
        };
        assert_eq!(
            status_patch(&st),
            json!({"status": {"src_ip": "10.0.0.1", "net_ns": "/var/run/netns/x", "container_id": null, "skipped": null, "links": null}})
        );
        let with_links = TopologyStatus {
            links: vec![weft_link::LinkStatus {
                uid: 1,
                local_intf: "e1".into(),
                peer_pod: "r2".into(),
                peer_intf: "e1".into(),
                state: weft_link::LinkPhase::Pending,
                reason: "the peer pod runs nowhere yet".into(),
            }],
            ..st
        };
        let patch = status_patch(&with_links);
        assert_eq!(patch["status"]["links"][0]["state"], "pending");
        assert_eq!(patch["status"]["links"][0]["reason"], "the peer pod runs nowhere yet");
    }
}
