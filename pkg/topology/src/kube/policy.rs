//! Pods, namespaces, network policies and cluster network policies from the API for
//! network policy: four more cluster-wide watch caches beside the Topology and Node ones,
//! slimmed to what policy reads, and the [`PolicyObjects`] snapshot rebuilt from them.
//!
//! The snapshot is republished (and [`TopologySource::policy_changes`] moves) only when
//! it really changed: kubelets rewrite Pod statuses all the time, and most rewrites
//! change nothing policy reads. It moves on its own counter, never on `changes()`, so
//! the engines that wake on that one do not run for every pod in the cluster.
//!
//! Whether a watch is lost (`stale`) is not something kube's watcher stream says: after
//! a dropped connection it just asks again, and a watch that is answered again yields
//! nothing until an object changes. So each kind gets its own client, wrapped in
//! [`Observed`], which sees every list and watch request of that kind: one unanswered
//! for longer than [`SLOW_ANSWER`], or answered with an error, marks the kind as
//! failing; a successful answer (or an event on the stream) marks it healthy again.
//!
//! ClusterNetworkPolicy is optional: its CRD is the network-policy-api project's, and
//! most clusters do not have it. [`Observed`] tells its answers apart:
//! - `404 Not Found` (the resource does not exist): listed, none. The kind is synced
//!   and not stale, its objects are dropped (deleting a CRD deletes its objects first),
//!   it is said once in the log, and the resource is asked for again after 1 s, 2 s,
//!   4 s... then every [`RECHECK`] ([`Recheck`]), so a CRD installed later is picked up.
//! - `403 Forbidden` (weftd's ClusterRole lacks it): synced, but stale, and logged as an
//!   error (and warned at every retry, on the same schedule). Before the kind was ever
//!   listed that means none are enforced; after, the last ones stay. Not synced would
//!   be never-open, but 403 also answers where the CRD is absent, so a cluster whose
//!   RBAC was not updated would have no new pod networked at all (an ADD waits for
//!   `synced`) to guard against policies it most likely does not have; the stale flag
//!   (`weft_policy_stale`, `/readyz`) and the log say that Admin-tier denies, if any,
//!   are not enforced, and NetworkPolicies still are.
//! - any other failure: stale, the last objects kept, as for the other kinds.
//!
//! [`TopologySource::policy_changes`]: crate::TopologySource::policy_changes

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::ObjectMeta;

use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

use super::drive_with;
use crate::objects::{
    POLICY_MODE_ANNOTATION, PolicyMaps, cluster_policy_key, pod_key, policy_key, slim_cluster_policy, slim_policy,
};
use crate::{ClusterNetworkPolicy, PolicyNamespace, PolicyObjects, PolicyPod};
use recheck::Recheck;

/// How long a list or watch request may wait for its answer before its watch counts as
/// lost: the API server answers a watch at once (events come later, in the body), so a
/// request waiting this long is not reaching it.
const SLOW_ANSWER: Duration = Duration::from_secs(2);

/// How often an optional kind the cluster does not serve (or does not let weftd read) is
/// asked for again, once the first quick retries found it still missing: a 404 costs the
/// API server little, but every node asks.
const RECHECK: Duration = Duration::from_secs(60);

/// The first retry of an optional kind found missing: soon, as a CRD or a ClusterRole
/// applied together with weft may take a moment to be served.
const FIRST_RECHECK: Duration = Duration::from_secs(1);

/// The four kinds, as indexes into [`State::kinds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pods = 0,
    Namespaces = 1,
    Policies = 2,
    ClusterPolicies = 3,
}

impl Kind {
    const COUNT: usize = 4;

    /// Whether the cluster may lack the kind (see the module doc).
    fn optional(self) -> bool {
        self == Kind::ClusterPolicies
    }
}

/// Why an optional kind is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unserved {
    /// The API server does not have the resource (404): no CRD.
    Absent,
    /// The API server refuses it (403): RBAC.
    Forbidden,
}

/// How one kind's watch is doing.
#[derive(Debug, Default, Clone, Copy)]
struct Health {
    /// Listed (InitDone) at least once.
    synced: bool,
    /// The last request failed or the stream reported an error, and nothing succeeded since.
    failing: bool,
    /// Requests waiting longer than [`SLOW_ANSWER`] for their answer.
    slow: u32,
    /// Why an optional kind's last answer did not serve it.
    unserved: Option<Unserved>,
}

struct State {
    maps: PolicyMaps,
    kinds: [Health; Kind::COUNT],
    snapshot: Arc<PolicyObjects>,
}

/// The policy objects of a [`super::KubeSource`] and the counter that announces them.
pub(super) struct PolicyCache {
    state: Mutex<State>,
    tx: watch::Sender<u64>,
}

impl PolicyCache {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                maps: PolicyMaps::default(),
                kinds: [Health::default(); Kind::COUNT],
                snapshot: Arc::default(),
            }),
            tx: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("policy cache lock")
    }

    /// The current snapshot.
    pub(super) fn snapshot(&self) -> Arc<PolicyObjects> {
        self.lock().snapshot.clone()
    }

    /// The counter that moves with every new snapshot.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// Rebuilds the snapshot if the objects (`changed`) or its flags changed, and
    /// announces it. The counter moves under the lock, so whoever it wakes reads the
    /// snapshot it announces or a newer one.
    fn publish(&self, st: &mut State, changed: bool) {
        let synced = st.kinds.iter().all(|k| k.synced);
        let stale = st.kinds.iter().any(|k| k.synced && (k.failing || k.slow > 0));
        if changed || synced != st.snapshot.synced || stale != st.snapshot.stale {
            if stale != st.snapshot.stale {
                if stale {
                    tracing::warn!(
                        "a pod, namespace, network policy or cluster network policy watch is lost or refused; \
                         keeping the last objects"
                    );
                } else {
                    tracing::info!("pod, namespace, network policy and cluster network policy watches are back");
                }
            }
            st.snapshot = Arc::new(st.maps.snapshot(synced, stale));
            self.tx.send_modify(|g| *g += 1);
        }
    }

    fn update(&self, f: impl FnOnce(&mut State) -> bool) {
        let mut st = self.lock();
        let changed = f(&mut st);
        self.publish(&mut st, changed);
    }

    /// Takes one watcher event of a kind into the maps: `map` picks the kind's map, `read`
    /// turns an object into its key and value; `relist` gathers a (re)list's objects until
    /// it is complete.
    fn on_event<O, K, V>(
        &self,
        kind: Kind,
        ev: &watcher::Event<O>,
        relist: &mut Option<BTreeMap<K, V>>,
        map: fn(&mut PolicyMaps) -> &mut BTreeMap<K, Arc<V>>,
        read: fn(&O) -> Option<(K, V)>,
    ) where
        O: kube::Resource<DynamicType = ()> + Clone + 'static,
        K: Ord + Clone,
        V: PartialEq,
    {
        self.update(|st| {
            // An object on the stream shows the watch works; `Init` does not: the watcher
            // emits it before it even asks for the list (again after each failed list).
            if !matches!(ev, watcher::Event::Init) {
                st.kinds[kind as usize].failing = false;
            }
            match ev {
                // A (re)list in progress: its objects are gathered in their read form
                // (never as whole API objects) and swapped in at InitDone.
                watcher::Event::Init => {
                    *relist = Some(BTreeMap::new());
                    false
                }
                watcher::Event::InitApply(o) => {
                    if let (Some(buffer), Some((k, v))) = (relist.as_mut(), read(o)) {
                        buffer.insert(k, v);
                    }
                    false
                }
                watcher::Event::Apply(o) => {
                    let Some((k, v)) = read(o) else { return false };
                    let map = map(&mut st.maps);
                    if map.get(&k).is_some_and(|old| **old == v) {
                        return false;
                    }
                    map.insert(k, Arc::new(v));
                    true
                }
                watcher::Event::Delete(o) => read(o).is_some_and(|(k, _)| map(&mut st.maps).remove(&k).is_some()),
                watcher::Event::InitDone => {
                    st.kinds[kind as usize].synced = true;
                    let old = map(&mut st.maps);
                    let mut changed = false;
                    let mut fresh = BTreeMap::new();
                    for (k, v) in relist.take().unwrap_or_default() {
                        // The old Arc when nothing changed, so holders can compare cheaply.
                        let v = match old.get(&k) {
                            Some(a) if **a == v => a.clone(),
                            _ => {
                                changed = true;
                                Arc::new(v)
                            }
                        };
                        fresh.insert(k, v);
                    }
                    changed |= fresh.len() != old.len();
                    *old = fresh;
                    changed
                }
            }
        });
    }

    /// The stream of `kind` reported `error`; whether it is expected (not worth a
    /// warning).
    fn failed(&self, kind: Kind, error: &watcher::Error) -> bool {
        // An optional kind's 404 or 403 was taken from its answer already (`answered`).
        if kind.optional() && matches!(refused_with(error), Some(403 | 404)) {
            return refused_with(error) == Some(404);
        }
        self.update(|st| {
            st.kinds[kind as usize].failing = true;
            false
        });
        false
    }

    /// A request of `kind` was answered with HTTP status `code`, or not at all (`None`:
    /// the connection failed).
    fn answered(&self, kind: Kind, code: Option<u16>) {
        let ok = code.is_some_and(|c| (200..300).contains(&c));
        let unserved = match code {
            Some(404) if kind.optional() => Some(Unserved::Absent),
            Some(403) if kind.optional() => Some(Unserved::Forbidden),
            _ => None,
        };
        self.update(|st| {
            let health = &mut st.kinds[kind as usize];
            let was = std::mem::replace(&mut health.unserved, unserved);
            health.failing = !ok && unserved != Some(Unserved::Absent);
            match unserved {
                Some(Unserved::Absent) => {
                    health.synced = true;
                    if was != unserved {
                        tracing::info!(
                            recheck = ?RECHECK,
                            "ClusterNetworkPolicy is not served by the cluster (no CRD for \
                             clusternetworkpolicies.policy.networking.k8s.io): none are enforced; \
                             looking again now and then"
                        );
                    }
                    // The one optional kind; its objects went with its CRD.
                    let map = &mut st.maps.cluster_policies;
                    let changed = !map.is_empty();
                    map.clear();
                    changed
                }
                Some(Unserved::Forbidden) => {
                    // Listed as none if it never was (see the module doc), stale either way.
                    health.synced = true;
                    if was != unserved {
                        tracing::error!(
                            "weftd may not list ClusterNetworkPolicies (403 Forbidden: its ClusterRole lacks \
                             list and watch on clusternetworkpolicies in policy.networking.k8s.io): their \
                             denies are not enforced (the last known stay, if any), NetworkPolicies are; \
                             the policy state is stale until the RBAC is fixed (manifests/rbac.yaml)"
                        );
                    }
                    false
                }
                None => {
                    if ok && was.is_some() {
                        tracing::info!("ClusterNetworkPolicy is served and readable now");
                    }
                    false
                }
            }
        });
    }

    /// Whether the last answer for `kind` was a 404 or 403 of an optional kind.
    fn unserved(&self, kind: Kind) -> bool {
        self.lock().kinds[kind as usize].unserved.is_some()
    }

    /// A request of `kind` waits longer than it should (`true`), or no longer (`false`).
    fn slow(&self, kind: Kind, slow: bool) {
        self.update(|st| {
            let n = &mut st.kinds[kind as usize].slow;
            *n = if slow { *n + 1 } else { n.saturating_sub(1) };
            false
        });
    }
}

/// Starts the four watches (in tasks of the current runtime); returns the cache and the
/// tasks to abort when the source goes.
pub(super) fn start(client: &Client) -> (Arc<PolicyCache>, Vec<tokio::task::AbortHandle>) {
    let cache = Arc::new(PolicyCache::new());
    let tasks = vec![
        watch_kind::<Pod, _, _>(
            client,
            &cache,
            Kind::Pods,
            "Pod",
            slim_pod,
            |m| &mut m.pods,
            read_pod,
            DefaultBackoff::default(),
        ),
        watch_kind::<Namespace, _, _>(
            client,
            &cache,
            Kind::Namespaces,
            "Namespace",
            slim_namespace,
            |m| &mut m.namespaces,
            read_namespace,
            DefaultBackoff::default(),
        ),
        watch_kind::<NetworkPolicy, _, _>(
            client,
            &cache,
            Kind::Policies,
            "NetworkPolicy",
            slim_policy,
            |m| &mut m.policies,
            read_policy,
            DefaultBackoff::default(),
        ),
        watch_kind::<ClusterNetworkPolicy, _, _>(
            client,
            &cache,
            Kind::ClusterPolicies,
            "ClusterNetworkPolicy",
            slim_cluster_policy,
            |m| &mut m.cluster_policies,
            read_cluster_policy,
            Recheck::new(cache.clone(), Kind::ClusterPolicies),
        ),
    ];
    (cache, tasks)
}

/// The HTTP status a list or watch request was refused with, if that is the watcher's
/// error: [`Observed`] saw the same answer. (An error event within a watch is not one.)
fn refused_with(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => Some(s.code),
        _ => None,
    }
}

/// One kind's watch: a watcher over an [`Observed`] client, each object slimmed and read
/// into the cache as it comes, driven for ever.
#[allow(clippy::too_many_arguments)]
fn watch_kind<O, K, V>(
    client: &Client,
    cache: &Arc<PolicyCache>,
    kind: Kind,
    what: &'static str,
    slim: fn(&mut O),
    map: fn(&mut PolicyMaps) -> &mut BTreeMap<K, Arc<V>>,
    read: fn(&O) -> Option<(K, V)>,
    backoff: impl Backoff + 'static,
) -> tokio::task::AbortHandle
where
    O: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K: Ord + Clone + Send + 'static,
    V: PartialEq + Send + Sync + 'static,
{
    let observed = Observed {
        client: client.clone(),
        cache: cache.clone(),
        kind,
    };
    let api = Api::<O>::all(Client::new(observed, client.default_namespace().to_string()));
    // No reflector store: each object is kept only in its read form, in the cache's
    // maps; a relist gathers its objects in that form and swaps them in at its end.
    let stream = watcher(api, watcher::Config::default())
        .backoff(backoff)
        .map(move |ev| ev.map(|ev| ev.modify(slim)));
    let (events, errors) = (cache.clone(), cache.clone());
    let mut relist = None;
    let task = tokio::spawn(drive_with(
        stream,
        what,
        move |ev| events.on_event(kind, ev, &mut relist, map, read),
        move |e| errors.failed(kind, e),
    ));
    task.abort_handle()
}

/// A kube client's transport that tells the cache how the requests of one kind fare
/// (see the module doc): slow, failed or answered.
#[derive(Clone)]
struct Observed {
    client: Client,
    cache: Arc<PolicyCache>,
    kind: Kind,
}

impl tower::Service<http::Request<kube::client::Body>> for Observed {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner client queues requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let Observed { client, cache, kind } = self.clone();
        Box::pin(async move {
            let mut answer = std::pin::pin!(client.send(request));
            let (result, slow) = match tokio::time::timeout(SLOW_ANSWER, &mut answer).await {
                Ok(result) => (result, None),
                Err(_) => {
                    let slow = Slow::new(&cache, kind);
                    (answer.await, Some(slow))
                }
            };
            cache.answered(kind, result.as_ref().ok().map(|r| r.status().as_u16()));
            // After the answer is recorded: a failed answer keeps the kind stale without a
            // moment of looking healthy in between.
            drop(slow);
            result
        })
    }
}

/// A request counted as slow, until it is answered or given up.
struct Slow<'a> {
    cache: &'a PolicyCache,
    kind: Kind,
}

impl<'a> Slow<'a> {
    fn new(cache: &'a PolicyCache, kind: Kind) -> Self {
        cache.slow(kind, true);
        Self { cache, kind }
    }
}

impl Drop for Slow<'_> {
    fn drop(&mut self) {
        self.cache.slow(self.kind, false);
    }
}

/// A pod as [`PolicyPod::from_pod`] reads it, keyed.
fn read_pod(p: &Pod) -> Option<((String, String), PolicyPod)> {
    let p = PolicyPod::from_pod(p)?;
    Some((pod_key(&p), p))
}

fn read_namespace(n: &Namespace) -> Option<(String, PolicyNamespace)> {
    let n = PolicyNamespace::from_namespace(n)?;
    Some((n.name.clone(), n))
}

fn read_policy(p: &NetworkPolicy) -> Option<((String, String), NetworkPolicy)> {
    Some((policy_key(p)?, p.clone()))
}

fn read_cluster_policy(p: &ClusterNetworkPolicy) -> Option<(String, ClusterNetworkPolicy)> {
    Some((cluster_policy_key(p)?, p.clone()))
}

/// Keeps only what [`PolicyPod::from_pod`] reads of a Pod (name, namespace, uid, labels,
/// node, hostNetwork, named container ports, phase, addresses): the cache holds every
/// pod of the cluster, whose specs and statuses are large.
pub(super) fn slim_pod(p: &mut Pod) {
    p.metadata = ObjectMeta {
        name: p.metadata.name.take(),
        namespace: p.metadata.namespace.take(),
        uid: p.metadata.uid.take(),
        labels: p.metadata.labels.take(),
        ..ObjectMeta::default()
    };
    if let Some(sp) = p.spec.as_mut() {
        let containers = std::mem::take(&mut sp.containers)
            .into_iter()
            .map(|c| Container {
                ports: c.ports.map(|ports| {
                    // Only named ports can be named by a policy.
                    (ports.into_iter())
                        .filter(|p| p.name.is_some())
                        .map(|p| ContainerPort {
                            name: p.name,
                            container_port: p.container_port,
                            protocol: p.protocol,
                            ..ContainerPort::default()
                        })
                        .collect()
                }),
                name: c.name,
                ..Container::default()
            })
            .collect();
        *sp = PodSpec {
            containers,
            node_name: sp.node_name.take(),
            host_network: sp.host_network.take(),
            ..PodSpec::default()
        };
    }
    if let Some(st) = p.status.as_mut() {
        *st = PodStatus {
            phase: st.phase.take(),
            pod_ip: st.pod_ip.take(),
            pod_ips: st.pod_ips.take(),
            ..PodStatus::default()
        };
    }
}

/// Keeps a Namespace's name, uid, labels and the policy-mode annotation.
pub(super) fn slim_namespace(n: &mut Namespace) {
    let annotations = (n.metadata.annotations.take())
        .map(|a| a.into_iter().filter(|(k, _)| k == POLICY_MODE_ANNOTATION).collect())
        .filter(|a: &BTreeMap<String, String>| !a.is_empty());
    n.metadata = ObjectMeta {
        name: n.metadata.name.take(),
        uid: n.metadata.uid.take(),
        labels: n.metadata.labels.take(),
        annotations,
        ..ObjectMeta::default()
    };
    n.spec = None;
    n.status = None;
}

mod recheck;
#[cfg(test)]
mod tests;
