//! Pods, namespaces, network policies and cluster network policies from the API for
//! network policy: more cluster-wide watch caches beside the Topology and Node ones,
//! slimmed to what policy reads, and the [`PolicyObjects`] snapshot rebuilt from them.
//!
//! The snapshot is republished (and [`TopologySource::policy_changes`] moves) only when
//! it really changed: kubelets rewrite Pod statuses all the time, and most rewrites
//! change nothing policy reads. It moves on its own counter, never on `changes()`, so
//! the engines that wake on that one do not run for every pod in the cluster.
//!
//! Memory: no watch keeps a reflector store. Each object is kept only in its read form
//! (a [`PolicyPod`], a [`PolicyNamespace`], a slimmed [`Strict`] policy), in the cache's
//! maps; a (re)list gathers its objects in that form and swaps them in at its end.
//!
//! Policies are read strictly ([`crate::strict`]): a field weft does not know must reach
//! the policy engine named, not be dropped by a typed decoding. So NetworkPolicies and
//! ClusterNetworkPolicies are watched as raw objects ([`DynamicObject`]: typed metadata,
//! the rest as JSON, whatever its shape) and each is decoded with [`strict::decode`] as
//! it arrives, then slimmed like the directory source's. An object that does not decode
//! at all (a field of the wrong type: a CRD's schema may allow what weft's types do not)
//! is left out, and a later version of it that does not decode takes the readable one
//! out (what is written is no longer what it said): the rest of its kind still arrive,
//! where a typed watch would fail the whole list, and the object is named in a warning,
//! once per change of it (its resourceVersion), not at every relist. Pods and Namespaces
//! are watched typed: weft reads only a few of their fields, and the API server
//! validates those.
//!
//! Whether a watch is lost (`stale`) is not something kube's watcher stream says: after
//! a dropped connection it just asks again, and a watch that is answered again yields
//! nothing until an object changes. So each watch gets its own client, wrapped in
//! [`Observed`], which sees every list and watch request of that watch: one unanswered
//! for longer than [`SLOW_ANSWER`], or answered with an error, marks the watch as
//! failing; a successful answer (or an event on the stream) marks it healthy again.
//!
//! ClusterNetworkPolicy is optional: its CRD is the network-policy-api project's, and
//! most clusters do not have it. It is watched at each version weft reads
//! ([`CNP_VERSIONS`]: `policy.networking.k8s.io/v1beta1` and `v1alpha2`), one watch per
//! version, each optional on its own; a cluster may serve either or both. [`Observed`]
//! tells a version's answers apart:
//! - `404 Not Found` (the cluster does not serve that version): listed, none. The version
//!   is synced and not stale, its objects leave the snapshot (deleting a CRD deletes its
//!   objects first; a version no longer served shows none), it is said in the log, naming
//!   the version, and the version is asked for again after 1 s, 2 s, 4 s... then every
//!   [`RECHECK`] ([`Recheck`]), so a CRD or a version installed later is picked up. When
//!   NEITHER version is served, the log says so once, plainly: no ClusterNetworkPolicy is
//!   enforced. The version's copies are kept aside meanwhile, not forgotten: kube's
//!   watcher, once it has listed, asks again with a watch from where it was (never a new
//!   list), and the API server answers that with what changed since (or `410 Gone`,
//!   and a relist), so the copies must stay in step with that point. They are few.
//! - `403 Forbidden` (weftd's ClusterRole lacks it; RBAC is per resource, so every
//!   version answers so, and it is logged once): synced, but stale, and logged as an
//!   error (and warned at every retry, on the same schedule). Before the version was
//!   ever listed that means none are enforced; after, the last ones stay. Not synced
//!   would be never-open, but 403 also answers where the CRD is absent, so a cluster
//!   whose RBAC was not updated would have no new pod networked at all (an ADD waits for
//!   `synced`) to guard against policies it most likely does not have; the stale flag
//!   (`weft_policy_stale`, `/readyz`) and the log say that Admin-tier denies, if any,
//!   are not enforced, and NetworkPolicies still are.
//! - any other failure: stale, the last objects kept, as for the other kinds.
//!
//! The snapshot is synced once every version has answered (listed, or 404/403 as above).
//! Where both versions are served, the API server serves each object at both (converted,
//! which for these two identical shapes changes only `apiVersion`): the snapshot holds
//! each object once, by name, the v1beta1 copy where both versions have it (if the two
//! copies differ, which happens for a moment after every change since the two watches
//! are apart, v1beta1's wins, with a debug log), and an object one version's watch
//! deleted while the other's still has it stays: that watch's delete is still coming,
//! or the version that went is no longer served. Both versions decode into the one
//! [`ClusterNetworkPolicy`] type (the same shape), whose read form carries no
//! apiVersion, so equal copies compare equal and are kept in memory once.
//!
//! [`TopologySource::policy_changes`]: crate::TopologySource::policy_changes
//! [`CNP_VERSIONS`]: crate::cnp::CNP_VERSIONS

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use kube::core::GroupVersionKind;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::drive_with;
use crate::cnp::{CNP_GROUP, CNP_VERSIONS};
use crate::objects::{PolicyMaps, mode_annotation, pod_key, slim_cluster_policy, slim_policy};
use crate::strict;
use crate::{ClusterNetworkPolicy, PolicyNamespace, PolicyObjects, PolicyPod, Strict, UnreadablePolicy};
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

/// The ClusterNetworkPolicy watches as logs name them, one per [`CNP_VERSIONS`] entry
/// (a test checks they agree).
const CNP_WATCHES: [&str; CNP_VERSIONS.len()] = ["ClusterNetworkPolicy v1beta1", "ClusterNetworkPolicy v1alpha2"];

/// The watches: one per kind, and one per version of ClusterNetworkPolicy (an index into
/// [`CNP_VERSIONS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pods,
    Namespaces,
    Policies,
    ClusterPolicies(usize),
}

impl Kind {
    const COUNT: usize = 3 + CNP_VERSIONS.len();

    /// Where the watch's health is in [`State::kinds`].
    fn index(self) -> usize {
        match self {
            Kind::Pods => 0,
            Kind::Namespaces => 1,
            Kind::Policies => 2,
            Kind::ClusterPolicies(v) => 3 + v,
        }
    }

    /// The ClusterNetworkPolicy watches, in [`CNP_VERSIONS`] order (preferred first).
    fn cluster_policies() -> impl Iterator<Item = Kind> {
        (0..CNP_VERSIONS.len()).map(Kind::ClusterPolicies)
    }

    /// Whether the cluster may lack the kind (see the module doc).
    fn optional(self) -> bool {
        matches!(self, Kind::ClusterPolicies(_))
    }

    /// The watch, as logs name it.
    fn what(self) -> &'static str {
        match self {
            Kind::Pods => "Pod",
            Kind::Namespaces => "Namespace",
            Kind::Policies => "NetworkPolicy",
            Kind::ClusterPolicies(v) => CNP_WATCHES[v],
        }
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
    /// Whether the last answer that said if the kind is served said it is not (404):
    /// a 403 or a lost connection after a 404 says nothing new, so its objects stay
    /// out of the snapshot until it is served again.
    absent: bool,
}

/// ClusterNetworkPolicies by name.
type ClusterPolicyMap = imbl::OrdMap<String, Arc<Strict<ClusterNetworkPolicy>>>;

struct State {
    /// The objects of the snapshot (`cluster_policies` merged from the versions' maps).
    maps: PolicyMaps,
    /// The ClusterNetworkPolicies each version's watch has, in [`CNP_VERSIONS`] order.
    cluster_policies: [ClusterPolicyMap; CNP_VERSIONS.len()],
    kinds: [Health; Kind::COUNT],
    snapshot: Arc<PolicyObjects>,
}

impl State {
    /// Rebuilds the snapshot's ClusterNetworkPolicies from the versions the cluster
    /// serves (each name once, the first version's copy first: see the module doc);
    /// whether they changed.
    fn merge_cluster_policies(&mut self) -> bool {
        let State {
            maps,
            cluster_policies,
            kinds,
            ..
        } = self;
        // Each name's copy, and the version it is from.
        let mut merged: BTreeMap<String, (usize, Arc<Strict<ClusterNetworkPolicy>>)> = BTreeMap::new();
        for (v, copies) in cluster_policies.iter_mut().enumerate() {
            // Not served: kept aside, out of the snapshot (module doc).
            if kinds[Kind::ClusterPolicies(v).index()].absent {
                continue;
            }
            let mut once = Vec::new();
            for (name, copy) in copies.iter() {
                let (from, kept) = match merged.entry(name.clone()) {
                    Entry::Vacant(e) => {
                        e.insert((v, copy.clone()));
                        continue;
                    }
                    Entry::Occupied(e) => e.into_mut(),
                };
                if Arc::ptr_eq(kept, copy) {
                    continue;
                }
                if **kept == **copy {
                    // The same object twice: keep it in memory once.
                    once.push((name.clone(), kept.clone()));
                    continue;
                }
                // Said when the copy read is new, not at every merge.
                if (maps.cluster_policies.get(name)).is_none_or(|was| !Arc::ptr_eq(was, kept)) {
                    tracing::debug!(
                        cluster_network_policy = %name,
                        read = CNP_VERSIONS[*from],
                        other = CNP_VERSIONS[v],
                        "a ClusterNetworkPolicy differs between two versions (for a moment after a change, \
                         the watches being apart); the preferred version's copy is read"
                    );
                }
            }
            for (name, kept) in once {
                copies.insert(name, kept);
            }
        }
        let merged: ClusterPolicyMap = merged.into_iter().map(|(name, (_, copy))| (name, copy)).collect();
        let changed = merged != maps.cluster_policies;
        maps.cluster_policies = merged;
        changed
    }
}

/// The ClusterNetworkPolicies of one version's watch (`kind`).
fn cluster_policies_at(st: &mut State, kind: Kind) -> &mut ClusterPolicyMap {
    let Kind::ClusterPolicies(v) = kind else {
        unreachable!("{kind:?} is not a ClusterNetworkPolicy watch")
    };
    &mut st.cluster_policies[v]
}

/// An object a watch could not read as its type.
#[derive(Debug)]
struct Unreadable {
    /// `namespace/name`, or the name of a cluster-scoped object.
    name: String,
    /// Its resourceVersion (a warning is given once per version).
    resource_version: Option<String>,
    /// Why (the decoder's words, with the path).
    error: String,
    /// What the snapshot says of it.
    object: Arc<UnreadablePolicy>,
}

/// What a watch's `read` makes of an object: `None` for one without a name (never
/// kept), else its key and its read form, or why it has none.
type Read<K, V> = Option<(K, Result<V, Unreadable>)>;

/// What one watch keeps between its events.
struct Watch<K, V> {
    /// A (re)list in progress: its objects in their read form (`None`: unreadable),
    /// swapped in at its end.
    relist: Option<BTreeMap<K, Option<V>>>,
    /// The objects that could not be read, with the resourceVersion warned about and
    /// what the snapshot says of them.
    unreadable: BTreeMap<K, (Option<String>, Arc<UnreadablePolicy>)>,
}

impl<K, V> Default for Watch<K, V> {
    fn default() -> Self {
        Self {
            relist: None,
            unreadable: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, V> Watch<K, V> {
    /// The key and read form (`None`: unreadable) of what `read` made of an object,
    /// warning about an unreadable one once per change of it.
    fn take(&mut self, kind: Kind, read: Read<K, V>) -> Option<(K, Option<V>)> {
        let (key, read) = read?;
        match read {
            Ok(v) => {
                self.unreadable.remove(&key);
                Some((key, Some(v)))
            }
            Err(u) => {
                if self.unreadable.get(&key).map(|(v, _)| v) != Some(&u.resource_version) {
                    tracing::warn!(
                        resource = kind.what(),
                        object = %u.name,
                        resource_version = u.resource_version.as_deref().unwrap_or_default(),
                        error = %u.error,
                        "an object that does not read as its type is left out (its other objects are read)"
                    );
                    self.unreadable.insert(key.clone(), (u.resource_version, u.object));
                }
                Some((key, None))
            }
        }
    }
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
                cluster_policies: Default::default(),
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

    /// Takes one watcher event of a watch (`kind`) into the maps: `map` picks the watch's
    /// map, `read` turns an object into its key and read form; `watch` keeps a (re)list's
    /// objects until it is complete, and which objects could not be read.
    fn on_event<O, K, V>(
        &self,
        kind: Kind,
        ev: &watcher::Event<O>,
        watch: &mut Watch<K, V>,
        map: fn(&mut State, Kind) -> &mut imbl::OrdMap<K, Arc<V>>,
        read: fn(&O) -> Read<K, V>,
    ) where
        K: Ord + Clone,
        V: PartialEq,
    {
        // Read (decoded, for policies) before the lock is taken: readers of the snapshot
        // and the other watches wait on it.
        let taken = match ev {
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => watch.take(kind, read(o)),
            watcher::Event::Delete(o) => read(o).map(|(k, _)| {
                watch.unreadable.remove(&k);
                (k, None)
            }),
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        self.update(|st| {
            // An object on the stream shows the watch works; `Init` does not: the watcher
            // emits it before it even asks for the list (again after each failed list).
            if !matches!(ev, watcher::Event::Init) {
                st.kinds[kind.index()].failing = false;
            }
            let changed = match (ev, taken) {
                // A (re)list in progress: its objects are gathered in their read form
                // (never as whole API objects) and swapped in at InitDone.
                (watcher::Event::Init, _) => {
                    watch.relist = Some(BTreeMap::new());
                    false
                }
                (watcher::Event::InitApply(_), Some((k, v))) => {
                    if let Some(buffer) = watch.relist.as_mut() {
                        buffer.insert(k, v);
                    }
                    false
                }
                (watcher::Event::Apply(_), Some((k, Some(v)))) => {
                    let map = map(st, kind);
                    if map.get(&k).is_some_and(|old| **old == v) {
                        false
                    } else {
                        map.insert(k, Arc::new(v));
                        true
                    }
                }
                // Unreadable now: the last readable version is not what is written.
                (watcher::Event::Apply(_), Some((k, None))) => map(st, kind).remove(&k).is_some(),
                (watcher::Event::Delete(_), Some((k, _))) => map(st, kind).remove(&k).is_some(),
                (watcher::Event::InitDone, _) => {
                    st.kinds[kind.index()].synced = true;
                    let listed = watch.relist.take().unwrap_or_default();
                    // Forget the unreadable objects that are gone, so that one created
                    // again under the same name is warned about again.
                    watch.unreadable.retain(|k, _| matches!(listed.get(k), Some(None)));
                    // Changed in place: an unchanged object keeps its Arc (holders
                    // compare cheaply) and the map its structure shared with the last
                    // snapshot's.
                    let readable = listed.into_iter().filter_map(|(k, v)| Some((k, v?))).collect();
                    crate::source::follow(map(st, kind), readable, |a, v| **a == *v, Arc::new)
                }
                // An object without a name: never kept.
                (_, None) => false,
            };
            // The objects it cannot read, in the snapshot too (rare: a list of few).
            let now: Vec<Arc<UnreadablePolicy>> = watch.unreadable.values().map(|(_, u)| u.clone()).collect();
            let slot = st.maps.unreadable.entry(kind.what().to_string()).or_default();
            let unreadable_changed = slot.len() != now.len() || slot.iter().zip(&now).any(|(a, b)| !Arc::ptr_eq(a, b));
            if unreadable_changed {
                *slot = now;
            }
            unreadable_changed
                | match kind {
                    Kind::ClusterPolicies(_) if changed => st.merge_cluster_policies(),
                    _ => changed,
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
            st.kinds[kind.index()].failing = true;
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
            let health = &mut st.kinds[kind.index()];
            let was = std::mem::replace(&mut health.unserved, unserved);
            health.failing = !ok && unserved != Some(Unserved::Absent);
            if unserved.is_some() {
                // Listed as none if it never was (see the module doc).
                health.synced = true;
            }
            let was_absent = health.absent;
            if ok || unserved == Some(Unserved::Absent) {
                health.absent = !ok;
            }
            let absent_changed = health.absent != was_absent;
            let Kind::ClusterPolicies(v) = kind else {
                return false;
            };
            let version = CNP_VERSIONS[v];
            // How the other versions' last answers went.
            let others = || (Kind::cluster_policies()).filter(move |k| *k != kind);
            match unserved {
                Some(Unserved::Absent) => {
                    if was != unserved {
                        if others().all(|k| st.kinds[k.index()].unserved == Some(Unserved::Absent)) {
                            tracing::info!(
                                versions = ?CNP_VERSIONS,
                                recheck = ?RECHECK,
                                "ClusterNetworkPolicy is not served by the cluster at any version weft reads \
                                 (no CRD for clusternetworkpolicies.{CNP_GROUP}, or one serving none of \
                                 {CNP_GROUP}/{}): no ClusterNetworkPolicy is enforced; looking again now and then",
                                CNP_VERSIONS.join(", ")
                            );
                        } else {
                            tracing::info!(
                                version = %format!("{CNP_GROUP}/{version}"),
                                recheck = ?RECHECK,
                                "ClusterNetworkPolicy is not served at {CNP_GROUP}/{version}: read at the other \
                                 versions the cluster serves, if any; looking again now and then"
                            );
                        }
                    }
                    // Its objects went with its CRD, or the version is no longer served.
                    absent_changed && st.merge_cluster_policies()
                }
                Some(Unserved::Forbidden) => {
                    // RBAC is per resource: every version is refused alike; said once.
                    let said = others().any(|k| st.kinds[k.index()].unserved == Some(Unserved::Forbidden));
                    if was != unserved && !said {
                        tracing::error!(
                            "weftd may not list ClusterNetworkPolicies (403 Forbidden at {CNP_GROUP}/{version}: \
                             its ClusterRole lacks list and watch on clusternetworkpolicies in {CNP_GROUP}, \
                             which covers every version): their denies are not enforced (the last known \
                             stay, if any), NetworkPolicies are; the policy state is stale until the RBAC \
                             is fixed (manifests/rbac.yaml)"
                        );
                    }
                    false
                }
                None => {
                    if ok && was.is_some() {
                        tracing::info!("ClusterNetworkPolicy is served and readable now at {CNP_GROUP}/{version}");
                    }
                    // Served again: its copies count again, as its watch goes on from them.
                    absent_changed && st.merge_cluster_policies()
                }
            }
        });
    }

    /// Whether the last answer for `kind` was a 404 or 403 of an optional kind.
    fn unserved(&self, kind: Kind) -> bool {
        self.lock().kinds[kind.index()].unserved.is_some()
    }

    /// A request of `kind` waits longer than it should (`true`), or no longer (`false`).
    fn slow(&self, kind: Kind, slow: bool) {
        self.update(|st| {
            let n = &mut st.kinds[kind.index()].slow;
            *n = if slow { *n + 1 } else { n.saturating_sub(1) };
            false
        });
    }
}

/// Starts the watches (in tasks of the current runtime): Pods, Namespaces,
/// NetworkPolicies, and ClusterNetworkPolicies at each version; returns the cache and
/// the tasks to abort when the source goes.
pub(super) fn start(client: &Client) -> (Arc<PolicyCache>, Vec<tokio::task::AbortHandle>) {
    let cache = Arc::new(PolicyCache::new());
    let mut tasks = vec![
        watch_kind::<Pod, _, _>(
            client,
            &cache,
            Kind::Pods,
            &(),
            slim_pod,
            |st, _| &mut st.maps.pods,
            read_pod,
            DefaultBackoff::default(),
        ),
        watch_kind::<Namespace, _, _>(
            client,
            &cache,
            Kind::Namespaces,
            &(),
            slim_namespace,
            |st, _| &mut st.maps.namespaces,
            read_namespace,
            DefaultBackoff::default(),
        ),
        watch_kind::<DynamicObject, _, _>(
            client,
            &cache,
            Kind::Policies,
            &ApiResource::erase::<NetworkPolicy>(&()),
            slim_raw,
            |st, _| &mut st.maps.policies,
            read_policy,
            DefaultBackoff::default(),
        ),
    ];
    for (v, version) in CNP_VERSIONS.iter().enumerate() {
        let kind = Kind::ClusterPolicies(v);
        tasks.push(watch_kind::<DynamicObject, _, _>(
            client,
            &cache,
            kind,
            &cluster_policy_resource(version),
            slim_raw,
            cluster_policies_at,
            read_cluster_policy,
            Recheck::new(cache.clone(), kind),
        ));
    }
    (cache, tasks)
}

/// ClusterNetworkPolicy at `version`, as the API serves it.
fn cluster_policy_resource(version: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(CNP_GROUP, version, "ClusterNetworkPolicy");
    ApiResource::from_gvk_with_plural(&gvk, "clusternetworkpolicies")
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

/// One watch: a watcher of `O` (of `resource`) over an [`Observed`] client, each object
/// slimmed and read into the cache as it comes, driven for ever.
#[allow(clippy::too_many_arguments)]
fn watch_kind<O, K, V>(
    client: &Client,
    cache: &Arc<PolicyCache>,
    kind: Kind,
    resource: &O::DynamicType,
    slim: fn(&mut O),
    map: fn(&mut State, Kind) -> &mut imbl::OrdMap<K, Arc<V>>,
    read: fn(&O) -> Read<K, V>,
    backoff: impl Backoff + 'static,
) -> tokio::task::AbortHandle
where
    O: kube::Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
    K: Ord + Clone + Send + 'static,
    V: PartialEq + Send + Sync + 'static,
{
    let observed = Observed {
        client: client.clone(),
        cache: cache.clone(),
        kind,
    };
    let api = Api::<O>::all_with(Client::new(observed, client.default_namespace().to_string()), resource);
    // No reflector store: each object is kept only in its read form (module doc).
    let stream = watcher(api, watcher::Config::default())
        .backoff(backoff)
        .map(move |ev| ev.map(|ev| ev.modify(slim)));
    let (events, errors) = (cache.clone(), cache.clone());
    let mut state = Watch::default();
    let task = tokio::spawn(drive_with(
        stream,
        kind.what(),
        move |ev| events.on_event(kind, ev, &mut state, map, read),
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
fn read_pod(p: &Pod) -> Read<(String, String), PolicyPod> {
    let p = PolicyPod::from_pod(p)?;
    Some((pod_key(&p), Ok(p)))
}

fn read_namespace(n: &Namespace) -> Read<String, PolicyNamespace> {
    let n = PolicyNamespace::from_namespace(n)?;
    Some((n.name.clone(), Ok(n)))
}

/// A NetworkPolicy read strictly from its raw object and slimmed, keyed by namespace
/// (`default` if unset, as the API server would) and name.
fn read_policy(o: &DynamicObject) -> Read<(String, String), Strict<NetworkPolicy>> {
    let name = o.metadata.name.clone()?;
    let namespace = o.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let read = decode(o, "NetworkPolicy", format!("{namespace}/{name}")).map(|mut p: Strict<NetworkPolicy>| {
        slim_policy(&mut p.object);
        p
    });
    Some(((namespace, name), read))
}

/// A ClusterNetworkPolicy (at either version: the same shape) read strictly from its raw
/// object and slimmed, keyed by name.
fn read_cluster_policy(o: &DynamicObject) -> Read<String, Strict<ClusterNetworkPolicy>> {
    let name = o.metadata.name.clone()?;
    let read = decode(o, "ClusterNetworkPolicy", name.clone()).map(|mut p: Strict<ClusterNetworkPolicy>| {
        slim_cluster_policy(&mut p.object);
        p
    });
    Some((name, read))
}

/// A raw object (apiVersion, kind, metadata, spec...) decoded as `T` by
/// [`strict::decode`], or why it could not be.
fn decode<T: DeserializeOwned>(o: &DynamicObject, kind: &str, name: String) -> Result<Strict<T>, Unreadable> {
    let unreadable = |error: String| Unreadable {
        name: name.clone(),
        resource_version: o.metadata.resource_version.clone(),
        object: Arc::new(UnreadablePolicy {
            kind: kind.to_string(),
            namespace: match kind {
                "NetworkPolicy" => o.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
                _ => String::new(),
            },
            name: o.metadata.name.clone().unwrap_or_default(),
            error: error.clone(),
        }),
        error,
    };
    let value = serde_json::to_value(o).map_err(|e| unreadable(e.to_string()))?;
    strict::decode(&value).map_err(unreadable)
}

/// Keeps of a raw policy object what reading it needs: its name, namespace, uid,
/// generation and policy-mode annotation (which the read form keeps), its resourceVersion (to warn once per change
/// about one that does not read), and everything but the metadata and the status, which
/// is what the strict reading looks at. The rest of the metadata (managedFields above
/// all) goes before the object is even decoded.
fn slim_raw(o: &mut DynamicObject) {
    o.metadata = ObjectMeta {
        name: o.metadata.name.take(),
        namespace: o.metadata.namespace.take(),
        uid: o.metadata.uid.take(),
        generation: o.metadata.generation.take(),
        resource_version: o.metadata.resource_version.take(),
        annotations: mode_annotation(&mut o.metadata),
        ..ObjectMeta::default()
    };
    if let Some(fields) = o.data.as_object_mut() {
        fields.remove("status");
    }
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

/// Keeps a Namespace's name, uid, labels and weft's annotations (policy mode, flow
/// metrics).
pub(super) fn slim_namespace(n: &mut Namespace) {
    let annotations = mode_annotation(&mut n.metadata);
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
