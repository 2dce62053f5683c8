//! The adapters between the crates a node is made of: the wire engine as the
//! handler's wiring seam, the store as the node network's source of local ranges and
//! the wire engine's pods to restore, and the node network's view as the handler's pod
//! defaults and the admin service's report.

use std::collections::BTreeMap;
use std::sync::Arc;

use imbl::ordmap::DiffItem;
use tokio::sync::watch;
use weft_daemon::{FrameStream, LinkError, LinkRef, PodDefaults, WiredPod, Wiring};
use weft_kernel::capture::CaptureSocket;
use weft_link::{LinkChange, LinkView, WireReport};
use weft_store::Store;
use weft_wires::{Engine, LocalPod, WireError};

/// The wire engine as the handler's wiring seam.
pub struct EngineWiring(pub Arc<Engine>);

impl Wiring for EngineWiring {
    fn pod_added(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            let local = LocalPod {
                netns: pod.netns,
                container_id: pod.container_id,
            };
            self.0.pod_added(&pod.namespace, &pod.name, local).await
        })
    }
    fn pod_removed(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move { self.0.pod_removed(&pod.namespace, &pod.name, &pod.container_id).await })
    }
    fn wires(&self) -> futures::future::BoxFuture<'_, Vec<WireReport>> {
        Box::pin(async move {
            self.0.report().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot list the wire ends");
                Vec::new()
            })
        })
    }
    fn wait_links(
        &self,
        pod: WiredPod,
        default: Option<std::time::Duration>,
    ) -> futures::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.0
                .wait_links(&pod.namespace, &pod.name, default)
                .await
                .map_err(|e| e.to_string())
        })
    }
    fn link_change(
        &self,
        link: LinkRef,
        change: LinkChange,
    ) -> futures::future::BoxFuture<'_, Result<LinkView, LinkError>> {
        Box::pin(async move {
            self.0
                .link_change(link.namespace.as_deref(), &link.pod, &link.intf, change)
                .await
                .map_err(link_error)
        })
    }
    fn links(
        &self,
        namespace: Option<String>,
        pod: Option<String>,
    ) -> futures::future::BoxFuture<'_, Result<Vec<LinkView>, LinkError>> {
        Box::pin(async move {
            self.0
                .links(namespace.as_deref(), pod.as_deref())
                .await
                .map_err(link_error)
        })
    }
    fn capture(&self, link: LinkRef, snaplen: u32) -> futures::future::BoxFuture<'_, Result<FrameStream, LinkError>> {
        Box::pin(async move {
            let (netns, intf) = self
                .0
                .capture_target(link.namespace.as_deref(), &link.pod, &link.intf)
                .await
                .map_err(link_error)?;
            let what = format!("{}:{}", link.pod, link.intf);
            let sock = tokio::task::spawn_blocking(move || {
                let ns = weft_kernel::NetNs::open(std::path::Path::new(&netns))?;
                CaptureSocket::open_in(&ns, &intf)
            })
            .await
            .map_err(|e| capture(&what, e))?
            .map_err(|e| capture(&what, e))?;
            weft_wires::capture::frames(sock, snaplen).map_err(|e| capture(&what, e))
        })
    }
}

/// A capture of end `link` that could not be opened, and why.
fn capture(link: &str, reason: impl std::fmt::Display) -> LinkError {
    LinkError::Capture {
        link: link.into(),
        reason: reason.to_string(),
    }
}

/// A wire engine error as the admin service reports it: whose fault, and what.
fn link_error(e: WireError) -> LinkError {
    match e {
        WireError::NoSuchLink(e) => LinkError::NotFound(e),
        WireError::Invalid(m) => LinkError::Invalid(m),
        other => LinkError::Failed(other.to_string()),
    }
}

/// The pods the wire engine starts with: every ready attachment the store holds for a
/// named pod, keyed by (namespace, name), so a restart picks up the wires it left.
pub async fn engine_pods(store: &Store) -> Result<BTreeMap<(String, String), LocalPod>, weft_store::StoreError> {
    Ok(pods_of(
        store.run(|db| db.list(None, Some(weft_store::State::Ready))).await?,
    ))
}

/// [`engine_pods`] without the store: attachments without a pod name are not wired,
/// and an empty namespace is Kubernetes' `default`.
fn pods_of(attachments: Vec<weft_store::Attachment>) -> BTreeMap<(String, String), LocalPod> {
    attachments
        .into_iter()
        .filter(|a| !a.pod.name.is_empty())
        .map(|a| {
            let ns = a.pod.namespace_or_default().to_string();
            let pod = LocalPod {
                netns: a.netns,
                container_id: a.key.container_id,
            };
            ((ns, a.pod.name), pod)
        })
        .collect()
}

/// The pod ranges of this node's network configs (every range the store has seen):
/// the masquerade keeps them inside the pod network too. Read at each of the node
/// network's passes, so the ranges alone, not their usage (a count of every pod's
/// address).
pub fn local_ranges(store: Store) -> weft_nodenet::LocalRanges {
    Arc::new(move || {
        let store = store.clone();
        Box::pin(async move { store.run(|db| db.ranges()).await.unwrap_or_default() })
    })
}

/// What `weftctl status` shows of the pod network between nodes: the last pass's view.
pub fn node_network_report(
    nodenet: &weft_nodenet::NodeNetwork<weft_nodenet::HostKernel>,
    masquerade: bool,
) -> weft_daemon::service::NodeNetworkReport {
    let view = nodenet.view();
    let routing = nodenet.config().routing.as_str();
    Arc::new(move || {
        let v = view.borrow();
        v.synced.then(|| weft_rpc::admin::NodeNetwork {
            routing: routing.to_string(),
            pod_cidrs: v.ranges.iter().map(ToString::to_string).collect(),
            pod_mtu: v.pod_mtu.unwrap_or(0),
            address: v.address.map(|a| a.to_string()).unwrap_or_default(),
            masquerade,
            peers: v
                .peers
                .iter()
                .map(|p| weft_rpc::admin::PeerNode {
                    name: p.name.clone(),
                    mode: p.mode.as_str().to_string(),
                    problem: p.problem.clone().unwrap_or_default(),
                })
                .collect(),
        })
    })
}

/// Follows the node network's decisions with the defaults ADDs are served with.
pub fn pod_defaults(mut view: watch::Receiver<weft_nodenet::NodeView>) -> watch::Receiver<PodDefaults> {
    let of = |v: &weft_nodenet::NodeView| PodDefaults {
        ranges: v.ranges.clone(),
        mtu: v.pod_mtu,
    };
    let (tx, rx) = watch::channel(of(&view.borrow_and_update()));
    tokio::spawn(async move {
        while view.changed().await.is_ok() {
            let next = of(&view.borrow_and_update());
            tx.send_if_modified(|d| {
                if *d == next {
                    false
                } else {
                    *d = next;
                    true
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// The policy engine as the handler's policy seam.
pub struct EnginePolicy(pub Arc<weft_policy::PolicyEngine<weft_policy::NftKernel>>);

impl weft_daemon::PolicyHook for EnginePolicy {
    fn pod_attached(&self, pod: weft_daemon::PolicedPod) -> futures::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.0
                .pod_attached(weft_policy::LocalPod {
                    namespace: pod.namespace,
                    name: pod.name,
                    ips: pod.ips,
                    host_ifname: pod.host_ifname,
                })
                .await
        })
    }
    fn pod_detached(&self, host_ifname: &str) {
        self.0.pod_detached(host_ifname);
    }
}

/// A listing of the node's pods, the store's pods version it was read at, and the
/// store's listing it was made from.
struct Listing {
    version: i64,
    pods: weft_policy::LocalListing,
    from: weft_store::ReadyPods,
}

/// The store's pod as network policy knows it.
fn local_pod(a: &weft_store::ReadyPod) -> weft_policy::LocalPod {
    weft_policy::LocalPod {
        namespace: a.pod.namespace_or_default().to_string(),
        name: a.pod.name.clone(),
        ips: a.addresses.clone(),
        host_ifname: a.host_ifname.clone(),
    }
}

/// The listing of `ready` (by the store's attachment ids), made from `last` and the
/// difference between the store's listing it was made from and `ready`: the store
/// changes its map in place, so that difference is the pods written since, and only
/// they are made anew (a pod that did not change is the very same `Arc`). Made at every
/// ADD, it costs the change, not the node.
fn relist(ready: &weft_store::ReadyPods, last: Option<&Listing>) -> weft_policy::LocalListing {
    let Some(last) = last else {
        return (ready.iter()).map(|(id, a)| (*id, Arc::new(local_pod(a)))).collect();
    };
    let mut pods = last.pods.clone();
    for d in last.from.diff(ready) {
        match d {
            DiffItem::Add(id, a) | DiffItem::Update { new: (id, a), .. } => {
                pods.insert(*id, Arc::new(local_pod(a)));
            }
            DiffItem::Remove(id, _) => {
                pods.remove(id);
            }
        }
    }
    pods
}

/// The store as the policy engine's source of this node's pods: every ready attachment
/// of the pod network (`eth0`), as [`weft_daemon::PolicyHook`] sees them.
pub fn policed_pods(store: Store) -> weft_policy::LocalPods {
    // The last listing and the store's pods version it was read at: asked again while
    // the version stands (network policy asks at every pod another node announces),
    // the same `Arc`, which tells the engine that nothing changed.
    let last: Arc<std::sync::Mutex<Option<Listing>>> = Arc::default();
    Arc::new(move || {
        let (store, last) = (store.clone(), last.clone());
        Box::pin(async move {
            let mut known = last.lock().expect("listing lock").as_ref().map(|l| l.version);
            loop {
                let (version, ready) = store
                    .run(move |db| {
                        let version = db.pods_version()?;
                        if known == Some(version) {
                            return Ok((version, None));
                        }
                        Ok((version, Some(db.ready_pods(weft_daemon::POLICED_IFNAME)?)))
                    })
                    .await
                    .map_err(|e| format!("listing this node's pods: {e}"))?;
                let mut last = last.lock().expect("listing lock");
                let Some(ready) = ready else {
                    match last.as_ref() {
                        Some(l) if l.version == version => return Ok(l.pods.clone()),
                        // Another listing replaced it meanwhile: read the pods.
                        _ => {
                            known = None;
                            continue;
                        }
                    }
                };
                let pods = relist(&ready, last.as_ref());
                *last = Some(Listing {
                    version,
                    pods: pods.clone(),
                    from: ready,
                });
                return Ok(pods);
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(namespace: &str, name: &str, container_id: &str) -> weft_store::Attachment {
        weft_store::Attachment {
            id: 1,
            key: weft_store::AttachmentKey {
                network: "net".into(),
                container_id: container_id.into(),
                ifname: "eth0".into(),
            },
            netns: format!("/run/netns/{container_id}"),
            pod: weft_store::PodRef {
                namespace: namespace.into(),
                name: name.into(),
                uid: String::new(),
            },
            host_ifname: String::new(),
            mtu: 1500,
            state: weft_store::State::Ready,
            result: None,
            addresses: Vec::new(),
            ports: Vec::new(),
            routes: Vec::new(),
            pod_mac: None,
        }
    }

    #[test]
    fn restored_pods_are_the_named_ones_in_their_namespace() {
        let pods = pods_of(vec![
            attachment("lab", "r1", "c1"),
            attachment("", "r2", "c2"),
            attachment("lab", "", "c3"),
        ]);
        assert_eq!(pods.len(), 2, "{pods:?}");
        assert_eq!(
            pods[&("lab".to_string(), "r1".to_string())],
            LocalPod {
                netns: "/run/netns/c1".into(),
                container_id: "c1".into()
            }
        );
        assert_eq!(pods[&("default".to_string(), "r2".to_string())].container_id, "c2");
    }

    /// Asked again with nothing written, the listing is the same `Arc` (the policy
    /// engine then skips comparing the node's pods); after a write, a new one, which
    /// shares the pods that did not change with the last.
    #[tokio::test]
    async fn the_policed_pods_listing_is_shared_until_the_store_moves() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("weft.db")).unwrap();
        let add = |cid: &'static str| {
            store.run(move |db| {
                let spec = weft_store::NewAttachment {
                    key: weft_store::AttachmentKey {
                        network: "weft".into(),
                        container_id: cid.into(),
                        ifname: weft_daemon::POLICED_IFNAME.into(),
                    },
                    netns: format!("/run/netns/{cid}"),
                    pod: weft_store::PodRef {
                        namespace: "lab".into(),
                        name: cid.into(),
                        uid: String::new(),
                    },
                    host_ifname: format!("h{cid}"),
                    mtu: 1500,
                    ranges: vec!["10.244.0.0/24".parse().unwrap()],
                    ports: Vec::new(),
                    requested: Vec::new(),
                    pod_mac: None,
                };
                let weft_store::BeginAdd::Created(a) = db.begin_add(&spec)? else {
                    panic!("{cid} exists already")
                };
                db.finish_add(a.id, "{}", &[])
            })
        };
        let list = policed_pods(store.clone());
        let names = |l: &weft_policy::LocalListing| l.values().map(|p| p.name.clone()).collect::<Vec<_>>();
        add("p1").await.unwrap();
        let first = list().await.unwrap();
        let again = list().await.unwrap();
        assert!(first.ptr_eq(&again));
        assert_eq!(names(&first), ["p1"]);
        add("p2").await.unwrap();
        let after = list().await.unwrap();
        assert!(!first.ptr_eq(&after));
        assert_eq!(names(&after), ["p1", "p2"]);
        let (p1, p2) = (after.values().next().unwrap(), after.values().nth(1).unwrap());
        assert_eq!(p2.host_ifname, "hp2");
        assert_eq!(p2.ips.len(), 1, "{after:?}");
        // The pod that did not change is shared with the last listing, not copied.
        assert!(Arc::ptr_eq(first.values().next().unwrap(), p1));
        // A pod taken out: gone from the next listing, the rest shared.
        store
            .run(|db| {
                let a = db
                    .list(None, None)?
                    .into_iter()
                    .find(|a| a.pod.name == "p1")
                    .expect("p1");
                db.remove(a.id)
            })
            .await
            .unwrap();
        let last = list().await.unwrap();
        assert_eq!(names(&last), ["p2"]);
        assert!(Arc::ptr_eq(last.values().next().unwrap(), p2));
    }

    #[tokio::test]
    async fn pod_defaults_follow_the_node_view() {
        let (tx, rx) = watch::channel(weft_nodenet::NodeView::default());
        let mut defaults = pod_defaults(rx);
        assert!(defaults.borrow().ranges.is_empty());
        tx.send_modify(|v| {
            v.ranges = vec!["10.244.1.0/24".parse().unwrap()];
            v.pod_mtu = Some(1450);
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), defaults.changed())
            .await
            .unwrap()
            .unwrap();
        let d = defaults.borrow_and_update().clone();
        assert_eq!(d.ranges, vec!["10.244.1.0/24".parse::<ipnet::IpNet>().unwrap()]);
        assert_eq!(d.mtu, Some(1450));
        // A change the defaults do not carry (the peers) wakes nobody.
        tx.send_modify(|v| v.synced = true);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!defaults.has_changed().unwrap());
    }
}
