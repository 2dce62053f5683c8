//! `KubeSource` against the in-process fake API server (`weft_topology::testing`): its
//! watch caches, readiness, relists after `410 Gone`, and its writes (Topology status,
//! WireState). No cluster and no root needed.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use kube::api::ObjectMeta;
use serde_json::json;
use tokio::time::Instant;
use weft_fakekube::FakeApiServer;
use weft_topology::{
    KubeSource, Link, LinkKind, SkippedLink, Topology, TopologySource, TopologySpec, TopologyStatus, WireEnd,
    WireState, validate,
};

const NODE: &str = "node-1";

fn link(uid: i64, peer: &str, local_intf: &str) -> Link {
    Link {
        uid,
        peer_pod: peer.into(),
        local_intf: local_intf.into(),
        peer_intf: "eth1".into(),
        local_ip: String::new(),
        peer_ip: String::new(),
        local_mac: None,
        peer_mac: None,
        kind: None,
        impair: Default::default(),
    }
}

fn topo(namespace: &str, pod: &str, links: Vec<Link>) -> Topology {
    let mut t = Topology::new(
        pod,
        TopologySpec {
            links,
            ..Default::default()
        },
    );
    t.metadata.namespace = Some(namespace.into());
    t
}

/// A topology `validate` refuses: two links on the same local interface.
fn invalid(namespace: &str, pod: &str) -> Topology {
    let t = topo(namespace, pod, vec![link(1, "x", "eth1"), link(2, "y", "eth1")]);
    assert!(validate(&t).is_err(), "the test's invalid topology is valid");
    t
}

/// A Node whose InternalIP is `ip` (listed after other address types on purpose).
fn node(name: &str, ip: &str) -> Node {
    let address = |type_: &str, address: &str| NodeAddress {
        type_: type_.into(),
        address: address.into(),
    };
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            addresses: Some(vec![
                address("Hostname", name),
                address("ExternalIP", "192.0.2.10"),
                address("InternalIP", ip),
            ]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().expect("an IP address"))
}

/// `namespace/name` of every topology served.
fn served(source: &KubeSource) -> BTreeSet<String> {
    (source.topologies().values())
        .map(|t| {
            let ns = t.metadata.namespace.clone().unwrap_or_default();
            format!("{ns}/{}", t.metadata.name.clone().unwrap_or_default())
        })
        .collect()
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Polls `cond` every 20 ms for up to 10 s; whether it became true.
async fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a source for `NODE` and waits until it is ready.
async fn start(server: &FakeApiServer) -> Arc<KubeSource> {
    let source = KubeSource::start(server.client(), NODE.into());
    assert!(
        wait_for(|| source.ready()).await,
        "never ready; server log: {:?}",
        server.log()
    );
    source
}

/// Both caches start held; the one released first fills but readiness waits for the other.
async fn ready_needs_both_caches(topologies_first: bool) {
    let server = FakeApiServer::new();
    let r1 = server.put(&topo("lab", "r1", vec![link(1, "r2", "eth1")]));
    server.put(&topo("lab", "r2", vec![link(1, "r1", "eth1")]));
    server.put(&node(NODE, "10.1.2.3"));
    server.put(&node("node-2", "10.9.9.9"));
    server.disconnect::<Topology>();
    server.disconnect::<Node>();

    let source = KubeSource::start(server.client(), NODE.into());
    assert!(wait_for(|| server.count("list topologies") == 1 && server.count("list nodes") == 1).await);
    assert!(!source.ready());
    assert!(source.topologies().is_empty());
    assert_eq!(source.node_address(), None);

    if topologies_first {
        server.reconnect::<Topology>();
        assert!(wait_for(|| served(&source).len() == 2).await, "{:?}", server.log());
        assert!(!source.ready(), "ready before the Node cache synced");
        assert_eq!(source.node_address(), None);
        server.reconnect::<Node>();
    } else {
        server.reconnect::<Node>();
        assert!(wait_for(|| source.node_address().is_some()).await, "{:?}", server.log());
        assert!(!source.ready(), "ready before the Topology cache synced");
        assert!(source.topologies().is_empty());
        server.reconnect::<Topology>();
    }
    assert!(wait_for(|| source.ready()).await, "{:?}", server.log());

    // This node's InternalIP (not its ExternalIP, not another node's).
    assert_eq!(source.node_address(), ip("10.1.2.3"));
    assert_eq!(served(&source), names(&["lab/r1", "lab/r2"]));
    assert_eq!(source.topology("lab", "r1").expect("r1").spec, r1.spec);
    assert!(source.topology("other", "r1").is_none());
    // The reads above came from the caches: one list each, no GET.
    assert_eq!(server.count("list topologies"), 1);
    assert_eq!(server.count("list nodes"), 1);
    assert_eq!(server.count("get topologies") + server.count("get nodes"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_waits_for_the_node_cache() {
    ready_needs_both_caches(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_waits_for_the_topology_cache() {
    ready_needs_both_caches(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_modified_and_deleted_topologies_reach_the_cache_and_bump_changes() {
    let server = FakeApiServer::new();
    server.put(&topo("lab", "r1", vec![link(1, "r2", "eth1")]));
    server.put(&node(NODE, "10.1.2.3"));
    let source = start(&server).await;
    let changes = source.changes();
    let mut expected = *changes.borrow();
    // Waits until the cache shows `cond` and the counter reached `expected`, then checks
    // it moved exactly once per change.
    macro_rules! settles {
        ($what:literal, $cond:expr) => {
            assert!(
                wait_for(|| $cond && *changes.borrow() >= expected).await,
                "{}: {:?}",
                $what,
                server.log()
            );
            assert_eq!(*changes.borrow(), expected, "{}: one bump per change", $what);
        };
    }

    let r2 = topo("lab", "r2", vec![link(1, "r1", "eth1")]);
    server.put(&r2);
    expected += 1;
    settles!("added", source.topology("lab", "r2").is_some());
    assert_eq!(source.topology("lab", "r2").expect("r2").spec, r2.spec);

    // The same pod name in another namespace is another topology.
    server.put(&topo("other", "r2", vec![link(7, "r9", "eth7")]));
    expected += 1;
    settles!("added elsewhere", source.topology("other", "r2").is_some());
    assert_eq!(source.topology("lab", "r2").expect("lab/r2").spec, r2.spec);

    let r2b = topo("lab", "r2", vec![link(1, "r1", "eth1"), link(2, "r3", "eth2")]);
    server.put(&r2b);
    expected += 1;
    settles!(
        "modified",
        source.topology("lab", "r2").is_some_and(|t| t.spec == r2b.spec)
    );

    server.delete::<Topology>(Some("lab"), "r1");
    expected += 1;
    settles!("deleted", source.topology("lab", "r1").is_none());
    assert_eq!(served(&source), names(&["lab/r2", "other/r2"]));

    server.put(&node(NODE, "10.1.2.4"));
    expected += 1;
    settles!("node address moved", source.node_address() == ip("10.1.2.4"));

    // Every node is watched (pod routes need them all): another node counts one...
    server.put(&node("node-2", "10.9.9.9"));
    expected += 1;
    settles!("another node", source.nodes().iter().any(|n| n.name == "node-2"));
    // ...but a rewrite of a Node that changes nothing pod networking or policy reads (as
    // kubelets do all the time: annotations, conditions) moves nothing: the next change
    // counts one.
    let mut annotated = node("node-2", "10.9.9.9");
    annotated.metadata.annotations = Some([("kubelet".to_string(), "busy".to_string())].into());
    annotated.status.as_mut().unwrap().conditions = Some(vec![k8s_openapi::api::core::v1::NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        ..Default::default()
    }]);
    server.put(&annotated);
    server.put(&topo("lab", "r5", vec![]));
    expected += 1;
    settles!("after another node", source.topology("lab", "r5").is_some());
    assert_eq!(source.node_address(), ip("10.1.2.4"));
    // A label is read (ClusterNetworkPolicy's node peers select by it): one change.
    let mut relabelled = annotated.clone();
    relabelled.metadata.labels = Some([("zone".to_string(), "b".to_string())].into());
    server.put(&relabelled);
    expected += 1;
    settles!(
        "relabelled",
        (source.nodes().iter()).any(|n| n.name == "node-2" && n.labels.get("zone").is_some_and(|z| z == "b"))
    );
    // Both kinds of addresses are kept.
    let node2 = source.nodes().into_iter().find(|n| n.name == "node-2").unwrap();
    assert_eq!(
        (node2.addresses, node2.external_addresses),
        (vec![ip("10.9.9.9").unwrap()], vec![ip("192.0.2.10").unwrap()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_topologies_are_not_served_and_do_not_hide_others() {
    let server = FakeApiServer::new();
    server.put(&topo("lab", "r1", vec![link(1, "r2", "eth1")]));
    let r2 = server.put(&topo("lab", "r2", vec![link(1, "r1", "eth1")]));
    server.put(&invalid("lab", "bad"));
    server.put(&node(NODE, "10.1.2.3"));
    let source = start(&server).await;
    // Left out of the initial list.
    assert_eq!(served(&source), names(&["lab/r1", "lab/r2"]));

    // A valid topology turned invalid is withdrawn (its old version is stale too).
    server.put(&invalid("lab", "r1"));
    assert!(
        wait_for(|| source.topology("lab", "r1").is_none()).await,
        "{:?}",
        server.log()
    );
    assert_eq!(served(&source), names(&["lab/r2"]));
    assert_eq!(source.topology("lab", "r2").expect("r2").spec, r2.spec);

    // A new invalid one never shows (r4, written after it, does).
    server.put(&invalid("lab", "r3"));
    server.put(&topo("lab", "r4", vec![]));
    assert!(
        wait_for(|| source.topology("lab", "r4").is_some()).await,
        "{:?}",
        server.log()
    );
    assert!(source.topology("lab", "r3").is_none());

    // Fixed, it is served again.
    let fixed = topo("lab", "r1", vec![link(1, "r2", "eth1"), link(2, "r3", "eth2")]);
    server.put(&fixed);
    assert!(
        wait_for(|| source.topology("lab", "r1").is_some()).await,
        "{:?}",
        server.log()
    );
    assert_eq!(source.topology("lab", "r1").expect("r1").spec, fixed.spec);
    assert_eq!(served(&source), names(&["lab/r1", "lab/r2", "lab/r4"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_410_gone_the_watcher_relists_and_converges() {
    let server = FakeApiServer::new();
    for pod in ["r1", "r2", "r3"] {
        server.put(&topo("lab", pod, vec![link(1, "peer", "eth1")]));
    }
    server.put(&node(NODE, "10.1.2.3"));
    let source = start(&server).await;
    let before = *source.changes().borrow();

    // Cut off: the open watch ends and the watcher's next watch waits.
    server.disconnect::<Topology>();
    assert!(
        wait_for(|| server.count("watch topologies") == 2).await,
        "{:?}",
        server.log()
    );
    // Meanwhile: a deletion, a change and an addition, then the history is compacted.
    server.delete::<Topology>(Some("lab"), "r2");
    let r1b = topo("lab", "r1", vec![link(1, "peer", "eth1"), link(2, "peer2", "eth2")]);
    server.put(&r1b);
    server.put(&topo("lab", "r4", vec![]));
    server.compact();
    assert_eq!(
        served(&source),
        names(&["lab/r1", "lab/r2", "lab/r3"]),
        "nothing got through the gap"
    );

    server.reconnect::<Topology>();
    let converged = || {
        served(&source) == names(&["lab/r1", "lab/r3", "lab/r4"])
            && source.topology("lab", "r1").is_some_and(|t| t.spec == r1b.spec)
    };
    assert!(wait_for(converged).await, "{:?} {:?}", served(&source), server.log());
    // Through a 410 and a second list, not through the (expired) watch.
    assert_eq!(server.count("expired topologies"), 1, "{:?}", server.log());
    assert_eq!(server.count("list topologies"), 2, "{:?}", server.log());
    assert!(*source.changes().borrow() > before);
    assert!(source.ready());
    assert_eq!(source.node_address(), ip("10.1.2.3"));

    // And it watches again from the new list: a later change arrives without a list.
    server.put(&topo("lab", "r5", vec![]));
    assert!(
        wait_for(|| source.topology("lab", "r5").is_some()).await,
        "{:?}",
        server.log()
    );
    assert_eq!(server.count("list topologies"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_do_not_disturb_the_cache_and_move_the_resume_point() {
    let server = FakeApiServer::new();
    server.put(&topo("lab", "r1", vec![link(1, "r2", "eth1")]));
    server.put(&node(NODE, "10.1.2.3"));
    let source = start(&server).await;
    let cached = served(&source);
    let before = *source.changes().borrow();

    // Another node arrives (one change), then a bookmark tells both watches where they
    // are.
    server.put(&node("node-2", "10.9.9.9"));
    server.bookmark();
    let sent = || server.count("bookmark topologies") == 1 && server.count("bookmark nodes") == 1;
    assert!(wait_for(sent).await, "{:?}", server.log());

    // Forget the history and cut both watches: they resume from the bookmark, which is
    // still in the history, so neither is told 410 nor relists.
    server.compact();
    server.disconnect::<Topology>();
    server.disconnect::<Node>();
    server.reconnect::<Topology>();
    server.reconnect::<Node>();
    let resumed = || server.count("watch topologies") == 2 && server.count("watch nodes") == 2;
    assert!(wait_for(resumed).await, "{:?}", server.log());

    server.put(&topo("lab", "r2", vec![link(1, "r1", "eth1")]));
    server.put(&node(NODE, "10.1.2.4"));
    let seen = || source.topology("lab", "r2").is_some() && source.node_address() == ip("10.1.2.4");
    assert!(wait_for(seen).await, "{:?}", server.log());
    assert_eq!(
        server.count("expired topologies") + server.count("expired nodes"),
        0,
        "{:?}",
        server.log()
    );
    assert_eq!(server.count("list topologies"), 1);
    assert_eq!(server.count("list nodes"), 1);
    // Three changes (node-2, r2, this node's address), three bumps: the bookmarks
    // themselves moved nothing.
    assert!(wait_for(|| *source.changes().borrow() >= before + 3).await);
    assert_eq!(*source.changes().borrow(), before + 3);
    let mut expected = cached;
    expected.insert("lab/r2".into());
    assert_eq!(served(&source), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_status_writes_the_status_and_clearing_removes_it() {
    let server = FakeApiServer::new();
    let r1 = server.put(&topo("lab", "r1", vec![link(1, "r2", "eth1")]));
    server.put(&node(NODE, "10.1.2.3"));
    let source = start(&server).await;

    let up = TopologyStatus {
        skipped: vec![SkippedLink {
            pod_name: "r2".into(),
            link_id: 1,
        }],
        src_ip: "10.1.2.3".into(),
        net_ns: "/var/run/netns/cni-1".into(),
        container_id: "c0ffee".into(),
        links: vec![weft_topology::LinkStatus {
            uid: 1,
            local_intf: "eth1".into(),
            peer_pod: "r2".into(),
            peer_intf: "eth1".into(),
            state: weft_topology::LinkPhase::Pending,
            reason: "peer pod r2 is not running on any node yet".into(),
        }],
    };
    source.set_status("lab", "r1", up.clone()).await.expect("set_status");
    let stored = server.get::<Topology>(Some("lab"), "r1").expect("r1");
    assert_eq!(stored.status, Some(up.clone()));
    assert_eq!(stored.spec, r1.spec, "a status patch leaves the spec alone");
    assert_eq!(server.count("patch topologies/status"), 1);
    // The cache learns it through the watch.
    let cached = || {
        source
            .topology("lab", "r1")
            .is_some_and(|t| t.status.as_ref() == Some(&up))
    };
    assert!(wait_for(cached).await, "{:?}", server.log());

    // Fields left empty are removed, not kept from before.
    let moved = TopologyStatus {
        src_ip: "10.1.2.3".into(),
        net_ns: "/var/run/netns/cni-2".into(),
        ..TopologyStatus::default()
    };
    source.set_status("lab", "r1", moved).await.expect("set_status");
    let status = &server.get_json::<Topology>(Some("lab"), "r1").expect("r1")["status"];
    assert_eq!(*status, json!({"src_ip": "10.1.2.3", "net_ns": "/var/run/netns/cni-2"}));

    // Clearing (the pod is gone) leaves an empty status.
    source
        .set_status("lab", "r1", TopologyStatus::default())
        .await
        .expect("clear");
    let stored = server.get_json::<Topology>(Some("lab"), "r1").expect("r1");
    assert_eq!(stored["status"], json!({}));
    let cleared = || {
        source
            .topology("lab", "r1")
            .is_some_and(|t| t.status == Some(TopologyStatus::default()))
    };
    assert!(wait_for(cleared).await, "{:?}", server.log());

    let err = (source.set_status("lab", "nope", up).await).expect_err("no such topology");
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_wire_state_creates_updates_and_recreates_the_node_wire_state() {
    let server = FakeApiServer::new();
    let node = server.put(&node(NODE, "10.1.2.3"));
    let source = start(&server).await;
    let wire = |uid: i64, peer: &str| WireEnd {
        namespace: "lab".into(),
        link_uid: uid,
        local_pod: "r1".into(),
        local_intf: format!("eth{uid}"),
        peer_pod: peer.into(),
        peer_intf: "eth1".into(),
        peer_node: "node-2".into(),
        kind: LinkKind::Vxlan,
        id: uid as u64 * 2,
        peer_id: uid as u64 * 2 + 1,
        state: weft_link::WireState::Up,
        vni: None,
        netns: String::new(),
    };
    let wires = |server: &FakeApiServer| {
        let ws = server.get::<WireState>(None, NODE).expect("the node's WireState");
        ws.status.expect("a status").wires
    };
    let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node.metadata.uid}]);

    source
        .set_wire_state(vec![wire(1, "r2"), wire(2, "r3")])
        .await
        .expect("create");
    assert_eq!(wires(&server), vec![wire(1, "r2"), wire(2, "r3")]);
    let stored = server.get_json::<WireState>(None, NODE).expect("WireState");
    assert_eq!(stored["metadata"]["ownerReferences"], owner, "owned by its Node");
    assert_eq!(stored["spec"], json!({}));

    // Replaced whole; the object itself is not applied again.
    source.set_wire_state(vec![wire(2, "r3")]).await.expect("update");
    assert_eq!(wires(&server), vec![wire(2, "r3")]);
    assert_eq!(server.count("patch wirestates"), 1);
    assert_eq!(server.count("patch wirestates/status"), 2);

    // Deleted behind the daemon's back: created again, still owned by the Node.
    assert!(server.delete::<WireState>(None, NODE));
    source.set_wire_state(vec![wire(1, "r2")]).await.expect("recreate");
    assert_eq!(wires(&server), vec![wire(1, "r2")]);
    let stored = server.get_json::<WireState>(None, NODE).expect("WireState");
    assert_eq!(stored["metadata"]["ownerReferences"], owner);

    source.set_wire_state(Vec::new()).await.expect("empty");
    assert_eq!(wires(&server), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wire_state_written_before_the_node_is_cached_gets_its_owner_later() {
    let server = FakeApiServer::new();
    let node = server.put(&node(NODE, "10.1.2.3"));
    server.disconnect::<Node>();
    let source = KubeSource::start(server.client(), NODE.into());
    let end = WireEnd {
        namespace: "lab".into(),
        link_uid: 1,
        local_pod: "r1".into(),
        local_intf: "eth1".into(),
        peer_pod: "r2".into(),
        peer_intf: "eth1".into(),
        peer_node: String::new(),
        kind: LinkKind::Veth,
        id: 2,
        peer_id: 3,
        state: weft_link::WireState::Up,
        vni: None,
        netns: String::new(),
    };

    // The daemon may mirror its wires before the Node cache is filled (a configured
    // node address does not wait for it): the WireState is created without an owner...
    source.set_wire_state(vec![end.clone()]).await.expect("create");
    let stored = server.get_json::<WireState>(None, NODE).expect("WireState");
    assert_eq!(stored["metadata"]["ownerReferences"], json!(null));

    // ...and gets one once the Node is known.
    server.reconnect::<Node>();
    assert!(wait_for(|| source.node_address().is_some()).await, "{:?}", server.log());
    source.set_wire_state(vec![end.clone()]).await.expect("update");
    let stored = server.get_json::<WireState>(None, NODE).expect("WireState");
    let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node.metadata.uid}]);
    assert_eq!(stored["metadata"]["ownerReferences"], owner, "{:?}", server.log());
    assert_eq!(stored["status"]["wires"], json!([end]));
}
