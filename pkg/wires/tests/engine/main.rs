//! The wire engine against fake seams, without root: a lab of nodes (each an engine
//! with a fake kernel and a real store on a temporary file) sharing one in-memory
//! topology source, their `Ends` calls routed to each other in-process. Covers who
//! builds a link and from which side, peers arriving in either order, a pod moving to
//! another node, links removed from the topology, VNI negotiation, and a restart that
//! finds the ends the kernel kept (and rebuilds those it did not).

mod carrier;
mod fakes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fakes::{FakeKernel, FakePeers, FakePlane, Kind};
use weft_kernel::LinkStats;
use weft_link::{DownBy, Impairment, LinkChange, WireEnd, WireState};
use weft_rpc::wire::{End, EndsRequest, Hello};
use weft_store::Store;
use weft_telemetry::Metrics;
use weft_telemetry::metrics::RepairLabels;
use weft_topology::{Link, LinkKind, MemorySource, Topology, TopologySource, TopologySpec};
use weft_wires::ids::{derived_mac, derived_vni, next_vni, wire_id};
use weft_wires::metrics::{LinkStateLabels, WireDirLabels, WireMetrics};
use weft_wires::{Carriers, Engine, EngineConfig, LocalPod, PodKey, Seams, labels};

const NS: &str = "lab";

/// One node of the lab: what outlives its daemon (kernel, store file, pods attached)
/// and the daemon of its current life.
struct Node {
    name: String,
    addr: IpAddr,
    kernel: Arc<FakeKernel>,
    db: PathBuf,
    pods: BTreeMap<PodKey, LocalPod>,
    plane: Arc<FakePlane>,
    engine: Option<Arc<Engine<FakePlane>>>,
}

/// Nodes sharing one topology source (as nodes share one API server).
struct Lab {
    _dir: tempfile::TempDir,
    source: Arc<MemorySource>,
    peers: Arc<FakePeers>,
    metrics: Arc<Metrics>,
    nodes: Vec<Node>,
    links: BTreeMap<String, Vec<Link>>,
    /// The carriers each node's engine gets, by node name (weft's own by default).
    carriers: CarriersFor,
}

/// Makes the carriers of a node's engine, given the node's name.
type CarriersFor = Box<dyn Fn(&str) -> Carriers<FakePlane>>;

fn netns(node: &str, pod: &str) -> String {
    format!("/fake/{node}/{pod}")
}

impl Lab {
    /// Nodes `names`, at 192.0.2.1, .2, … in that order; no daemon runs yet.
    fn new(names: &[&str]) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let nodes = names
            .iter()
            .enumerate()
            .map(|(i, n)| Node {
                name: n.to_string(),
                addr: format!("192.0.2.{}", i + 1).parse().unwrap(),
                kernel: Arc::default(),
                db: dir.path().join(format!("{n}.db")),
                pods: BTreeMap::new(),
                plane: Arc::default(),
                engine: None,
            })
            .collect();
        Lab {
            _dir: dir,
            source: Arc::default(),
            peers: Arc::default(),
            metrics: Metrics::new("test", "test"),
            nodes,
            links: BTreeMap::new(),
            carriers: Box::new(|_| Carriers::standard()),
        }
    }

    /// Starts every node's daemon (again), as weftd does: the pods it had attached
    /// come from its store, everything else from the kernel and the source.
    async fn start(&mut self) {
        self.metrics = Metrics::new("test", "test");
        for n in &mut self.nodes {
            let cfg = EngineConfig {
                node_name: n.name.clone(),
                node_address: Some(n.addr),
                wire_port: 0,
                default_kind: LinkKind::Vxlan,
                mtu: 1500,
                resync: Duration::from_secs(3600),
                dataplane_runtime: None,
                security: weft_wiretls::WireSecurity::Insecure,
                node_ends: weft_kernel::packet::NodeEnds::Here,
            };
            n.plane = Arc::default();
            let plane = n.plane.clone();
            let seams = Seams {
                kernel: n.kernel.clone(),
                peers: self.peers.clone(),
                plane: Box::new(move |_| plane.clone()),
                carriers: (self.carriers)(&n.name),
            };
            let store = Store::open(&n.db).unwrap();
            let engine = Engine::start_with(
                cfg,
                self.source.clone() as Arc<dyn TopologySource>,
                store,
                self.metrics.clone(),
                n.pods.clone(),
                seams,
            )
            .await;
            self.peers.register(n.addr, &engine);
            n.engine = Some(engine);
        }
    }

    /// Forgets every daemon (their tasks end with the runtime they ran on).
    fn stop(&mut self) {
        for n in &mut self.nodes {
            n.engine = None;
        }
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).expect("no such node")
    }

    fn engine(&self, name: &str) -> &Arc<Engine<FakePlane>> {
        self.node(name).engine.as_ref().expect("daemon running")
    }

    fn kernel(&self, name: &str) -> &FakeKernel {
        &self.node(name).kernel
    }

    /// Adds link `uid` between `a` (pod, interface) and `b` to both pods' topologies.
    fn connect(&mut self, uid: i64, a: (&str, &str), b: (&str, &str), kind: Option<LinkKind>) {
        let end = |me: (&str, &str), peer: (&str, &str)| Link {
            uid,
            peer_pod: peer.0.into(),
            local_intf: me.1.into(),
            peer_intf: peer.1.into(),
            local_ip: String::new(),
            peer_ip: String::new(),
            local_mac: None,
            peer_mac: None,
            kind,
            impair: Default::default(),
        };
        self.links.entry(a.0.into()).or_default().push(end(a, b));
        self.links.entry(b.0.into()).or_default().push(end(b, a));
        self.publish();
    }

    /// Sets impairment `param` to `value` on `pod`'s entry of link `uid`.
    fn impair(&mut self, uid: i64, pod: &str, param: &str, value: &str) {
        for l in self.links.get_mut(pod).unwrap().iter_mut().filter(|l| l.uid == uid) {
            let v = Some(value.to_string());
            match param {
                "delay" => l.impair.delay = v,
                "loss" => l.impair.loss = v,
                "rate" => l.impair.rate = v,
                other => panic!("{other}"),
            }
        }
        self.publish();
    }

    /// Removes link `uid` from every topology.
    fn disconnect(&mut self, uid: i64) {
        for links in self.links.values_mut() {
            links.retain(|l| l.uid != uid);
        }
        self.publish();
    }

    /// Puts every pod's topology in the source, keeping the statuses daemons wrote.
    fn publish(&self) {
        for (pod, links) in &self.links {
            let mut t = Topology::new(
                pod,
                TopologySpec {
                    links: links.clone(),
                    ..Default::default()
                },
            );
            t.metadata.namespace = Some(NS.into());
            t.status = self.source.topology(NS, pod).and_then(|t| t.status.clone());
            self.source.put(t);
        }
    }

    /// The runtime attaches `pod` on `node` (its namespace is created first).
    async fn add(&mut self, node: &str, pod: &str) {
        let n = self.nodes.iter_mut().find(|n| n.name == node).unwrap();
        let local = LocalPod {
            netns: netns(node, pod),
            container_id: format!("{node}-{pod}"),
        };
        n.kernel.add_pod(&local.netns);
        n.pods.insert((NS.into(), pod.into()), local.clone());
        let engine = n.engine.clone().unwrap();
        engine.pod_added(NS, pod, local).await;
    }

    /// The runtime detaches `pod` from `node`, then deletes its namespace.
    async fn remove(&mut self, node: &str, pod: &str) {
        let n = self.nodes.iter_mut().find(|n| n.name == node).unwrap();
        n.pods.remove(&(NS.to_string(), pod.to_string()));
        let engine = n.engine.clone().unwrap();
        let kernel = n.kernel.clone();
        engine.pod_removed(NS, pod, &format!("{node}-{pod}")).await;
        kernel.remove_pod(&netns(node, pod));
    }

    /// Lets every daemon run passes until the calls between them have played out.
    async fn settle(&self) {
        for _ in 0..4 {
            for n in &self.nodes {
                if let Some(e) = &n.engine {
                    e.pass_and_wait().await;
                }
            }
        }
    }

    async fn wires(&self, node: &str) -> BTreeMap<u64, WireEnd> {
        self.engine(node)
            .wires()
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r))
            .collect()
    }

    /// Every VXLAN offer made so far: (from node, to address, VNI).
    fn offers(&self) -> Vec<(String, IpAddr, u32)> {
        self.peers.offers()
    }
}

fn id(pod: &str, uid: i64) -> u64 {
    wire_id(NS, uid, pod)
}

fn vxlan_of(k: &FakeKernel, netns: &str, intf: &str) -> (u32, IpAddr, Vec<([u8; 6], IpAddr)>, bool) {
    let i = k.iface(netns, intf).unwrap_or_else(|| panic!("{netns}/{intf} missing"));
    match i.kind {
        Kind::Vxlan { vni, local } => (vni, local, i.fdb, i.up),
        other => panic!("{netns}/{intf} is {other:?}, not VXLAN"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_node_the_lower_name_builds_the_veth_for_both_whatever_the_order() {
    for order in [["r1", "r2"], ["r2", "r1"]] {
        let mut lab = Lab::new(&["a"]);
        lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
        lab.start().await;
        lab.add("a", order[0]).await;
        assert!(
            lab.kernel("a").created().is_empty(),
            "{order:?}: nothing to build with one pod"
        );
        assert!(lab.wires("a").await.is_empty());
        lab.add("a", order[1]).await;
        lab.settle().await;

        // One pair, created from r1's side (r1 < r2), whichever pod came first.
        assert_eq!(
            lab.kernel("a").created(),
            vec!["veth /fake/a/r1/eth1 /fake/a/r2/eth2".to_string()],
            "{order:?}"
        );
        let k = lab.kernel("a");
        let a = k.iface("/fake/a/r1", "eth1").unwrap();
        assert_eq!(
            a.kind,
            Kind::Veth {
                peer: ("/fake/a/r2".into(), "eth2".into())
            }
        );
        assert!(a.up);
        assert_eq!(a.mac, derived_mac(NS, "r1", "eth1"));
        assert_eq!(
            k.iface("/fake/a/r2", "eth2").unwrap().mac,
            derived_mac(NS, "r2", "eth2")
        );

        // Both ends recorded by the builder.
        let w = lab.wires("a").await;
        assert_eq!(
            w.keys().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([id("r1", 1), id("r2", 1)])
        );
        for r in w.values() {
            assert_eq!(
                (r.kind, r.state, r.peer_node.as_str()),
                (LinkKind::Veth, WireState::Up, "")
            );
        }
        assert_eq!(w[&id("r2", 1)].peer_id, id("r1", 1));
        assert_eq!(w[&id("r2", 1)].netns, "/fake/a/r2");

        // Nothing more to do.
        lab.settle().await;
        assert_eq!(lab.kernel("a").created().len(), 1);
        assert!(lab.offers().is_empty(), "a pair needs no other node");
    }
}

/// Polls the ends the node last mirrored into the wire-state resource until there are
/// `n` of them; how long that took, or `None` after `limit`.
async fn mirrored(lab: &Lab, n: usize, limit: Duration) -> Option<Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if lab.source.wires().len() == n {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// The wire-state resource is the whole list of the node's ends, written at most once
/// a second: ends recorded within the second after a write are held back, and written
/// when the second is up though nothing else happens (no pass is asked for, and the
/// resync is an hour away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ends_recorded_soon_after_a_mirror_write_are_mirrored_when_the_second_is_up() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.connect(2, ("r3", "eth1"), ("r4", "eth2"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("a", "r2").await;
    assert!(
        mirrored(&lab, 2, Duration::from_secs(5)).await.is_some(),
        "the first pair's ends never mirrored: {:?}",
        lab.source.wires()
    );
    let written = std::time::Instant::now();
    lab.add("a", "r3").await;
    lab.add("a", "r4").await;
    assert_eq!(lab.wires("a").await.len(), 4, "the second pair is recorded");
    if written.elapsed() < Duration::from_millis(800) {
        assert_eq!(lab.source.wires().len(), 2, "written again within the second");
    }
    assert!(
        mirrored(&lab, 4, Duration::from_secs(3)).await.is_some(),
        "the held-back write never came: {:?}",
        lab.source.wires().iter().map(|w| w.id).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_veth_end_is_rebuilt_and_a_pod_leaving_takes_the_pair() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("a", "r2").await;
    lab.kernel("a").yank("/fake/a/r2", "eth2");
    lab.settle().await;
    assert_eq!(lab.kernel("a").created().len(), 2, "rebuilt once");
    assert!(lab.kernel("a").iface("/fake/a/r1", "eth1").is_some());

    lab.remove("a", "r2").await;
    lab.settle().await;
    assert!(lab.wires("a").await.is_empty(), "both records go with either pod");
    assert!(lab.kernel("a").ifaces_of("/fake/a/r1").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arriving_pod_is_wired_without_reading_back_the_rest_of_the_node() {
    let mut lab = Lab::new(&["a"]);
    let pairs: Vec<(String, String)> = (0..10).map(|i| (format!("p{i:02}a"), format!("p{i:02}b"))).collect();
    for (i, (x, y)) in pairs.iter().enumerate() {
        lab.connect(i as i64 + 1, (x, "eth1"), (y, "eth1"), None);
    }
    lab.connect(100, ("s1", "eth1"), ("s2", "eth1"), None);
    lab.start().await;
    for (x, y) in &pairs {
        lab.add("a", x).await;
        lab.add("a", y).await;
    }
    lab.settle().await;
    lab.kernel("a").take_checked();

    // The passes that wire s1 and s2 (theirs and the ones their status writes cause)
    // look at their pair only.
    lab.add("a", "s1").await;
    lab.add("a", "s2").await;
    let k = lab.kernel("a");
    let checked = k.take_checked();
    assert!(
        checked.iter().all(|c| c.starts_with("/fake/a/s")),
        "only the arriving pair is read back: {checked:?}"
    );
    assert!(k.iface("/fake/a/s1", "eth1").is_some() && k.iface("/fake/a/s2", "eth1").is_some());

    // A pass of every pod (asked, or the resync) reads every pair back, so drift
    // elsewhere is still repaired.
    k.yank("/fake/a/p03b", "eth1");
    lab.engine("a").pass_and_wait().await;
    let checked: BTreeSet<String> = k.take_checked().into_iter().collect();
    assert!(
        checked.contains("/fake/a/p00a/eth1") && checked.contains("/fake/a/s2/eth1"),
        "{checked:?}"
    );
    assert!(k.iface("/fake/a/p03b", "eth1").is_some(), "the yanked end is rebuilt");
}

/// A pod whose namespace vanishes without a DEL (the runtime lost it) takes its links
/// at the next pass, whatever that pass was asked for: the pod linked to it says so in
/// its status at once, not at the next look at every pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_pod_s_linked_pods_follow_at_the_next_pass() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), None);
    lab.connect(2, ("s1", "eth1"), ("s2", "eth1"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("a", "r2").await;
    lab.settle().await;
    assert_eq!(link_states(&lab, "r1"), [("eth1".into(), "up".into(), String::new())]);

    lab.kernel("a").remove_pod("/fake/a/r2");
    // A pass for another pod only (s1's arrival), not one of every pod.
    lab.add("a", "s1").await;
    let states = link_states(&lab, "r1");
    assert!(
        states.iter().all(|(_, state, _)| state != "up"),
        "r1 still says its link to the vanished r2 is up: {states:?}"
    );
}

/// A pass for a new pod looks at that pod's namespace, not at every attached pod's
/// (each ADD's pass did, which made a bring-up quadratic), and a pod found gone stays
/// gone at the passes after; once a namespace goes, the next pass looks at every pod's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_looks_at_the_new_pods_namespaces_until_one_goes() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), None);
    lab.connect(2, ("r3", "eth1"), ("r4", "eth1"), None);
    lab.connect(3, ("r5", "eth1"), ("r6", "eth1"), None);
    lab.start().await;
    for r in ["r1", "r2", "r3", "r4"] {
        lab.add("a", r).await;
    }
    lab.settle().await;
    lab.kernel("a").take_asked();
    lab.add("a", "r5").await;
    let asked = lab.kernel("a").take_asked();
    assert!(
        (1..=2).contains(&asked),
        "the pass for r5 asked about {asked} namespaces, not r5's alone"
    );

    lab.kernel("a").remove_pod("/fake/a/r2");
    lab.add("a", "r6").await;
    assert!(
        lab.kernel("a").take_asked() >= 6,
        "a namespace went: the next pass looks at every pod's"
    );
    let states = link_states(&lab, "r1");
    assert!(
        states.iter().all(|(_, state, _)| state != "up"),
        "r1 still says its link to the vanished r2 is up: {states:?}"
    );
    // The passes after still take r2 for gone, looking at no one's namespace again.
    lab.kernel("a").take_asked();
    lab.settle().await;
    let states = link_states(&lab, "r1");
    assert!(states.iter().all(|(_, state, _)| state != "up"), "{states:?}");
    assert_eq!(link_states(&lab, "r5"), [("eth1".into(), "up".into(), String::new())]);
}

/// The `weft_links` gauge of node `a` by state: (pending, up).
fn link_gauge(lab: &Lab) -> (i64, i64) {
    let m = lab.metrics.families::<WireMetrics>();
    let get = |state| m.links.get_or_create(&LinkStateLabels { state }).get();
    (get("pending"), get("up"))
}

/// A pass goes through the ends of the pods it looks at and of the pods that left,
/// not through every end of the node: what it keeps (the ends, the links gauge) must
/// still follow pods that arrive, leave, or vanish, as a pass of every pod would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_of_a_few_pods_keep_the_node_s_ends_and_counts_right() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), None);
    lab.connect(2, ("r1", "eth2"), ("x", "eth1"), None);
    lab.connect(3, ("s1", "eth1"), ("s2", "eth1"), None);
    // A pair no pass below looks at.
    lab.connect(4, ("t1", "eth1"), ("t2", "eth1"), None);
    lab.start().await;
    for pod in ["r1", "r2", "s1", "t1", "t2"] {
        lab.add("a", pod).await;
    }
    lab.settle().await;
    // r1-r2 and t1-t2 up at both ends; r1's link to x and s1's to s2 wait for their
    // peers.
    assert_eq!(link_gauge(&lab), (2, 4));
    lab.add("a", "s2").await;
    lab.settle().await;
    assert_eq!(link_gauge(&lab), (1, 6));

    // s2 vanishes without a DEL and r2 is deleted: the next pass (for r2's DEL, not
    // one of every pod) takes both pods' ends, and their peers' links wait again.
    lab.kernel("a").remove_pod("/fake/a/s2");
    lab.remove("a", "r2").await;
    let owners: BTreeSet<String> = lab.wires("a").await.values().map(|r| r.local_pod.clone()).collect();
    assert!(!owners.contains("s2") && !owners.contains("r2"), "{owners:?}");
    assert_eq!(link_gauge(&lab), (3, 2));
    assert!(
        lab.kernel("a").ifaces_of("/fake/a/s1").is_empty(),
        "s1's end of the pair went with s2"
    );

    // A pass of every pod finds nothing else to change or count.
    let ends: Vec<u64> = lab.wires("a").await.into_keys().collect();
    lab.engine("a").pass_and_wait().await;
    assert_eq!(link_gauge(&lab), (3, 2));
    assert_eq!(lab.wires("a").await.into_keys().collect::<Vec<_>>(), ends);
}

#[tokio::test]
async fn a_pod_named_only_as_a_peer_gets_its_link_from_its_own_add() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), None);
    // r2 has no Topology of its own: only r1's link names it.
    lab.links.remove("r2");
    lab.source.remove(NS, "r2");
    lab.start().await;
    lab.add("a", "r1").await;
    lab.settle().await;
    // No pass after the ADD: the ADD itself must have built r1's side of the pair.
    lab.add("a", "r2").await;
    assert_eq!(link_states(&lab, "r1"), [("eth1".into(), "up".into(), String::new())]);
    // A pod nobody names is attached without a pass and changes nothing.
    lab.add("a", "lonely").await;
    assert_eq!(link_states(&lab, "r1"), [("eth1".into(), "up".into(), String::new())]);
    assert!(lab.source.topology(NS, "lonely").is_none());
    lab.remove("a", "lonely").await;
    // Its DEL, too, takes r1's side of the link down by itself.
    lab.remove("a", "r2").await;
    let states = link_states(&lab, "r1");
    assert!(
        states.iter().all(|(_, state, _)| state != "up"),
        "r1 still says its link to the removed r2 is up: {states:?}"
    );
}

/// r1 (the lower name, so the proposer) runs on node b, r2 on node a: who proposes is
/// decided by pod name, not by node.
async fn vxlan_pair(first: (&str, &str), second: (&str, &str)) -> Lab {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.start().await;
    lab.add(first.0, first.1).await;
    lab.settle().await;
    // Alone, a pod gets nothing built and asks nobody.
    assert!(lab.offers().is_empty());
    assert!(lab.kernel(first.0).created().is_empty());
    lab.add(second.0, second.1).await;
    lab.settle().await;
    lab
}

async fn assert_vxlan_pair(lab: &Lab, vni: u32) {
    let (a, b) = (lab.node("a").addr, lab.node("b").addr);
    let (v1, local1, fdb1, up1) = vxlan_of(lab.kernel("b"), "/fake/b/r1", "eth1");
    let (v2, local2, fdb2, up2) = vxlan_of(lab.kernel("a"), "/fake/a/r2", "eth2");
    assert_eq!((v1, v2), (vni, vni), "both ends on the agreed VNI");
    assert_eq!((local1, local2), (b, a));
    assert!(up1 && up2);
    assert!(fdb1.contains(&([0; 6], a)) && fdb1.contains(&(derived_mac(NS, "r2", "eth2"), a)));
    assert!(fdb2.contains(&([0; 6], b)) && fdb2.contains(&(derived_mac(NS, "r1", "eth1"), b)));
    let (wa, wb) = (lab.wires("a").await, lab.wires("b").await);
    let (ra, rb) = (&wa[&id("r2", 1)], &wb[&id("r1", 1)]);
    assert_eq!((ra.vni, rb.vni), (Some(vni), Some(vni)));
    assert_eq!((ra.state, rb.state), (WireState::Up, WireState::Up));
    assert_eq!(
        (ra.peer_node.clone(), rb.peer_node.clone()),
        (b.to_string(), a.to_string())
    );
    assert_eq!((wa.len(), wb.len()), (1, 1));
    let mtu = lab.kernel("a").iface("/fake/a/r2", "eth2").unwrap().mtu;
    assert_eq!(mtu, 1450, "the wire MTU less the encapsulation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_nodes_the_lower_name_proposes_whoever_arrives_first() {
    for (first, second) in [(("b", "r1"), ("a", "r2")), (("a", "r2"), ("b", "r1"))] {
        let lab = vxlan_pair(first, second).await;
        let vni = derived_vni(NS, 1);
        assert_vxlan_pair(&lab, vni).await;
        let offers = lab.offers();
        assert!(!offers.is_empty());
        assert!(
            offers
                .iter()
                .all(|(from, to, v)| from == "b" && *to == lab.node("a").addr && *v == vni),
            "only r1's node offers, and its first offer is the derived VNI: {offers:?}"
        );
        // Each node built its own end once.
        assert_eq!(lab.kernel("a").created().len(), 1);
        assert_eq!(lab.kernel("b").created().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_vni_makes_the_proposer_try_the_next() {
    let v0 = derived_vni(NS, 1);
    let (v1, v2) = (next_vni(v0), next_vni(next_vni(v0)));
    let mut lab = Lab::new(&["a", "b"]);
    lab.peers.refuse.lock().unwrap().extend([v0, v1]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("b", "r2").await;
    lab.settle().await;
    let mut offered: Vec<u32> = lab.offers().into_iter().map(|(_, _, v)| v).collect();
    offered.dedup();
    assert_eq!(offered, vec![v0, v1, v2]);
    let (va, ..) = vxlan_of(lab.kernel("a"), "/fake/a/r1", "eth1");
    let (vb, ..) = vxlan_of(lab.kernel("b"), "/fake/b/r2", "eth2");
    assert_eq!((va, vb), (v2, v2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_a_vni_another_end_holds_there() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.connect(2, ("r3", "eth1"), ("r4", "eth1"), None);
    lab.start().await;
    for (n, p) in [("a", "r1"), ("b", "r2"), ("b", "r4")] {
        lab.add(n, p).await;
    }
    lab.settle().await;
    let vni = derived_vni(NS, 1);
    assert_vxlan_pair_on(&lab, vni).await;
    // A node offering the VNI b holds for link 1, for an end of link 2.
    let offer = |vni| EndsRequest {
        from: Some(Hello {
            node: "c".into(),
            address: "192.0.2.3".into(),
        }),
        ends: vec![End {
            namespace: NS.into(),
            link_uid: 2,
            pod: "r3".into(),
            peer_pod: "r4".into(),
            kind: LinkKind::Vxlan.to_string(),
            vni,
            present: true,
            wire_id: id("r3", 2),
            control: None,
        }],
    };
    let reply = lab.engine("b").ends(offer(vni)).await;
    assert!(!reply.results[0].accepted);
    assert_eq!(reply.results[0].reason, format!("VNI {vni} is taken on this node"));
    let reply = lab.engine("b").ends(offer(next_vni(vni))).await;
    assert!(reply.results[0].accepted, "{}", reply.results[0].reason);
    assert_eq!(lab.wires("b").await[&id("r4", 2)].vni, Some(next_vni(vni)));
    // And a pod that is not there is refused.
    let mut bad = offer(next_vni(next_vni(vni)));
    bad.ends[0].peer_pod = "r9".into();
    assert!(!lab.engine("b").ends(bad).await.results[0].accepted);
}

/// Link 1 of the r1 (node a) – r2 (node b) pair is up on `vni`.
async fn assert_vxlan_pair_on(lab: &Lab, vni: u32) {
    let (va, _, _, upa) = vxlan_of(lab.kernel("a"), "/fake/a/r1", "eth1");
    let (vb, _, _, upb) = vxlan_of(lab.kernel("b"), "/fake/b/r2", "eth2");
    assert_eq!((va, vb, upa, upb), (vni, vni, true, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_moving_to_another_node_takes_its_wire_along() {
    let mut lab = Lab::new(&["a", "b", "c"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("b", "r2").await;
    lab.settle().await;
    let vni = derived_vni(NS, 1);
    assert_vxlan_pair_on(&lab, vni).await;
    let (b, c) = (lab.node("b").addr, lab.node("c").addr);

    // r2 leaves b: b forgets its end, a's end goes down and waits.
    lab.remove("b", "r2").await;
    lab.settle().await;
    assert!(lab.wires("b").await.is_empty());
    let ra = lab.wires("a").await[&id("r1", 1)].clone();
    assert_eq!((ra.state, ra.peer_node.clone()), (WireState::Down, b.to_string()));
    assert!(!lab.kernel("a").iface("/fake/a/r1", "eth1").unwrap().up);

    // r2 comes back on c: a re-points its end there, keeping the VNI.
    lab.add("c", "r2").await;
    lab.settle().await;
    let ra = lab.wires("a").await[&id("r1", 1)].clone();
    assert_eq!(
        (ra.state, ra.peer_node.clone(), ra.vni),
        (WireState::Up, c.to_string(), Some(vni))
    );
    let (va, _, fdb, up) = vxlan_of(lab.kernel("a"), "/fake/a/r1", "eth1");
    assert_eq!((va, up), (vni, true));
    assert!(
        fdb.contains(&([0; 6], c)) && !fdb.iter().any(|(_, n)| *n == b),
        "{fdb:?}"
    );
    assert_eq!(
        lab.kernel("a").created().len(),
        1,
        "re-pointed, not rebuilt under the pod"
    );
    let (vc, ..) = vxlan_of(lab.kernel("c"), "/fake/c/r2", "eth2");
    assert_eq!(vc, vni);
    assert_eq!(
        lab.wires("c").await[&id("r2", 1)].peer_node,
        lab.node("a").addr.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_removed_from_the_topology_are_taken_down_on_both_sides() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), None);
    lab.connect(2, ("r1", "eth2"), ("r3", "eth1"), None);
    lab.start().await;
    for (n, p) in [("a", "r1"), ("a", "r2"), ("b", "r3")] {
        lab.add(n, p).await;
    }
    lab.settle().await;
    assert_eq!(lab.wires("a").await.len(), 3, "a veth pair and one VXLAN end");
    assert_eq!(lab.wires("b").await.len(), 1);

    lab.disconnect(1);
    lab.settle().await;
    let wa = lab.wires("a").await;
    assert_eq!(wa.keys().copied().collect::<Vec<_>>(), vec![id("r1", 2)]);
    assert!(lab.kernel("a").iface("/fake/a/r1", "eth1").is_none());
    assert!(lab.kernel("a").ifaces_of("/fake/a/r2").is_empty());
    vxlan_of(lab.kernel("a"), "/fake/a/r1", "eth2");

    lab.disconnect(2);
    lab.settle().await;
    assert!(lab.wires("a").await.is_empty());
    assert!(lab.wires("b").await.is_empty());
    assert!(lab.kernel("a").ifaces_of("/fake/a/r1").is_empty());
    assert!(lab.kernel("b").ifaces_of("/fake/b/r3").is_empty());
    // Mirrored: the wire-state resource is empty too.
    assert!(lab.source.wires().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_ends_are_built_by_each_side_and_follow_their_peer() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), Some(LinkKind::Grpc));
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("b", "r2").await;
    lab.settle().await;
    for (node, pod, intf, peer) in [("a", "r1", "eth1", "b"), ("b", "r2", "eth2", "a")] {
        let i = lab.kernel(node).iface(&netns(node, pod), intf).unwrap();
        assert_eq!(i.kind, Kind::Packet { id: id(pod, 1) });
        let (end, up) = lab.node(node).plane.end(id(pod, 1)).expect("worker attached");
        assert!(up);
        assert_eq!(end.peer, lab.node(peer).addr);
        let peer_pod = if pod == "r1" { "r2" } else { "r1" };
        assert_eq!(end.peer_id, id(peer_pod, 1));
        assert_eq!(lab.kernel(node).created().len(), 1);
    }
    assert!(lab.offers().is_empty(), "gRPC wires negotiate nothing");

    lab.remove("b", "r2").await;
    lab.settle().await;
    let (_, up) = lab.node("a").plane.end(id("r1", 1)).unwrap();
    assert!(!up, "the worker stops carrying frames");
    assert!(!lab.kernel("a").iface("/fake/a/r1", "eth1").unwrap().up);
    assert_eq!(lab.wires("a").await[&id("r1", 1)].state, WireState::Down);

    lab.add("b", "r2").await;
    lab.settle().await;
    assert!(lab.node("a").plane.end(id("r1", 1)).unwrap().1);
    assert_eq!(lab.wires("a").await[&id("r1", 1)].state, WireState::Up);
    assert_eq!(lab.kernel("a").created().len(), 1, "a's end was kept throughout");
}

/// A pass that builds several gRPC ends whose peers are on one node tells that node of
/// them in one `Ends` call, not one per end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_tells_a_peer_node_of_the_grpc_ends_it_built_in_one_call() {
    let mut lab = Lab::new(&["a", "b"]);
    for uid in 1..=3 {
        let (mine, theirs) = (format!("eth{uid}"), format!("eth{uid}"));
        lab.connect(uid, ("r1", &mine), ("r2", &theirs), Some(LinkKind::Grpc));
    }
    lab.start().await;
    lab.add("b", "r2").await;
    lab.settle().await;
    lab.add("a", "r1").await;
    lab.settle().await;
    assert_eq!(lab.kernel("a").created().len(), 3);
    let built: Vec<usize> = (lab.peers.calls.lock().unwrap().iter())
        .filter(|c| c.from == "a" && c.to == lab.node("b").addr)
        .map(|c| {
            c.req
                .ends
                .iter()
                .filter(|e| e.present && e.control.is_none() && e.kind.parse() == Ok(LinkKind::Grpc))
                .count()
        })
        .filter(|n| *n > 0)
        .collect();
    assert_eq!(built, vec![3], "one call with the three ends a's pass built");
}

/// A pass hands what it tells a peer node of the ends it built to the engine's teller:
/// an ADD on a node whose peer does not answer yet returns all the same, the call is
/// made, and the peer hears of the ends once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_does_not_wait_for_the_peer_node_it_tells_of_its_ends() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), Some(LinkKind::Grpc));
    lab.start().await;
    lab.add("b", "r2").await;
    lab.settle().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *lab.peers.stall.lock().unwrap() = Some(gate.clone());
    let told = |lab: &Lab| {
        (lab.peers.calls.lock().unwrap().iter())
            .filter(|c| c.from == "a" && c.to == lab.node("b").addr)
            .flat_map(|c| c.req.ends.iter())
            .any(|e| e.present && e.control.is_none() && e.kind.parse() == Ok(LinkKind::Grpc))
    };
    tokio::time::timeout(Duration::from_secs(5), lab.add("a", "r1"))
        .await
        .expect("the ADD does not wait for the peer node's answer");
    assert_eq!(lab.kernel("a").created().len(), 1, "a's end is built");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !told(&lab) {
        assert!(tokio::time::Instant::now() < deadline, "b is never told of a's end");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gate.add_permits(1_000);
    lab.settle().await;
    assert!(lab.node("a").plane.end(id("r1", 1)).expect("a's worker").1, "up");
    assert!(lab.node("b").plane.end(id("r2", 1)).expect("b's worker").1, "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_fdb_entries_are_put_back_without_a_rebuild() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("b", "r2").await;
    lab.settle().await;
    lab.kernel("a").flush_fdb("/fake/a/r1", "eth1");
    lab.settle().await;
    let (_, _, fdb, _) = vxlan_of(lab.kernel("a"), "/fake/a/r1", "eth1");
    assert!(fdb.contains(&([0; 6], lab.node("b").addr)));
    assert_eq!(lab.kernel("a").created().len(), 1);
    let repairs = lab
        .metrics
        .reconcile_repairs
        .get_or_create(&RepairLabels { kind: "fdb" })
        .get();
    assert_eq!(repairs, 1);
}

fn frames(m: &Metrics, r: &WireEnd, direction: &'static str) -> u64 {
    m.families::<WireMetrics>()
        .frames
        .get_or_create(&WireDirLabels {
            wire: labels(r),
            direction,
        })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_ends_counters_grow_by_what_the_interface_counted() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("a", "r2").await;
    let st = |n| LinkStats {
        rx_packets: n,
        tx_packets: 2 * n,
        ..Default::default()
    };
    lab.kernel("a").set_stats("/fake/a/r1", "eth1", st(10));
    lab.engine("a").sample_counters().await;
    lab.kernel("a").set_stats("/fake/a/r1", "eth1", st(15));
    lab.engine("a").sample_counters().await;
    let r = lab.wires("a").await[&id("r1", 1)].clone();
    assert_eq!(
        (frames(&lab.metrics, &r, "rx"), frames(&lab.metrics, &r, "tx")),
        (15, 30)
    );
    let report = lab.engine("a").report().await.unwrap();
    let w1 = report.iter().find(|w| w.end.id == id("r1", 1)).unwrap();
    let c = w1.counters.expect("the interface was read");
    assert_eq!((c.rx_frames, c.tx_frames), (15, 30));
}

/// Runs `f` on a runtime of its own, dropped afterwards with every task of the
/// daemons it started: a daemon's life.
fn life<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(f);
    drop(rt);
    out
}

#[test]
fn a_restart_keeps_the_ends_the_kernel_kept_and_rebuilds_the_missing() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth1"), None);
    lab.connect(2, ("r1", "eth2"), ("r3", "eth1"), None);
    lab.connect(3, ("r1", "eth3"), ("r4", "eth1"), Some(LinkKind::Grpc));
    let vni = derived_vni(NS, 2);

    // First life: build everything.
    let (wa, wb) = life(async {
        lab.start().await;
        for (n, p) in [("a", "r1"), ("a", "r2"), ("b", "r3"), ("b", "r4")] {
            lab.add(n, p).await;
        }
        lab.settle().await;
        let w = (lab.wires("a").await, lab.wires("b").await);
        lab.stop();
        w
    });
    assert_eq!((wa.len(), wb.len()), (4, 2), "veth pair, VXLAN and gRPC ends");
    let (ca, cb) = (lab.kernel("a").created(), lab.kernel("b").created());
    assert_eq!((ca.len(), cb.len()), (3, 2));
    lab.kernel("b").set_stats(
        "/fake/b/r4",
        "eth1",
        LinkStats {
            rx_packets: 7,
            tx_packets: 9,
            ..Default::default()
        },
    );
    let calls = lab.peers.calls.lock().unwrap().len();

    // Second life: the kernel kept everything; nothing is rebuilt or renegotiated.
    life(async {
        lab.start().await;
        lab.settle().await;
        assert_eq!(lab.kernel("a").created(), ca);
        assert_eq!(lab.kernel("b").created(), cb);
        assert_eq!(lab.wires("a").await, wa);
        assert_eq!(lab.wires("b").await, wb);
        assert!(
            lab.peers.calls.lock().unwrap()[calls..].is_empty(),
            "no VNI offer, no gRPC announcement"
        );
        // The gRPC ends' workers came back from the store, their counters from the kernel.
        for (node, pod) in [("a", "r1"), ("b", "r4")] {
            let plane = &lab.node(node).plane;
            assert!(plane.attached_once(id(pod, 3)), "{node}: re-attached, not rebuilt");
        }
        let r4 = &wb[&id("r4", 3)];
        assert_eq!((frames(&lab.metrics, r4, "rx"), frames(&lab.metrics, r4, "tx")), (7, 9));
        lab.stop();
    });

    // While no daemon runs, someone deletes a's veth end and VXLAN end, and b's gRPC
    // pod end.
    lab.kernel("a").yank("/fake/a/r1", "eth1");
    lab.kernel("a").yank("/fake/a/r1", "eth2");
    lab.kernel("b").yank("/fake/b/r4", "eth1");

    // Third life: exactly those are rebuilt, under the same ids and VNI.
    life(async {
        lab.start().await;
        lab.settle().await;
        let (na, nb) = (lab.kernel("a").created(), lab.kernel("b").created());
        assert_eq!(
            na[ca.len()..]
                .iter()
                .map(|c| c.split(' ').next().unwrap())
                .collect::<Vec<_>>(),
            vec!["veth", "vxlan"]
        );
        assert_eq!(nb[cb.len()..], ["packet /fake/b/r4/eth1".to_string()]);
        let (v, ..) = vxlan_of(lab.kernel("a"), "/fake/a/r1", "eth2");
        assert_eq!(v, vni);
        assert_eq!(
            lab.wires("a").await.keys().collect::<Vec<_>>(),
            wa.keys().collect::<Vec<_>>()
        );
        assert!(lab.node("b").plane.end(id("r4", 3)).is_some());
        lab.stop();
    });
}

fn imp(params: &[(&str, &str)]) -> Impairment {
    Impairment::from_params(params.iter().copied()).unwrap()
}

/// A lab with a veth link r1:eth1-r2:eth2 on a, a VXLAN link r1:eth2-r3:eth1 and a
/// gRPC link r1:eth3-r4:eth1 to b, the topology impairing each.
async fn emulation_lab() -> Lab {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.connect(2, ("r1", "eth2"), ("r3", "eth1"), None);
    lab.connect(3, ("r1", "eth3"), ("r4", "eth1"), Some(LinkKind::Grpc));
    // Written on one entry: both directions. Written on both: each end its own.
    lab.impair(1, "r1", "delay", "20ms");
    lab.impair(2, "r3", "loss", "10%");
    lab.impair(3, "r1", "rate", "50mbit");
    lab.impair(3, "r4", "rate", "20mbit");
    lab.start().await;
    for (n, p) in [("a", "r1"), ("a", "r2"), ("b", "r3"), ("b", "r4")] {
        lab.add(n, p).await;
    }
    lab.settle().await;
    lab
}

/// The emulation on what `pod`'s end `intf` sends: netem on a kernel end, in the
/// worker of a gRPC end (link 3), which then has no netem.
fn impairment_of(lab: &Lab, node: &str, pod: &str, intf: &str) -> Impairment {
    let kernel = lab.kernel(node).iface(&netns(node, pod), intf).unwrap().impairment;
    if intf == "eth3" || (pod == "r4" && intf == "eth1") {
        assert!(kernel.is_empty(), "a gRPC end is impaired in its worker, not by netem");
        return lab.node(node).plane.impairment(id(pod, 3));
    }
    kernel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topology_impairs_both_directions_of_every_kind_once() {
    let lab = emulation_lab().await;
    let delay = imp(&[("delay", "20ms")]);
    let loss = imp(&[("loss", "10%")]);
    assert_eq!(impairment_of(&lab, "a", "r1", "eth1"), delay);
    assert_eq!(impairment_of(&lab, "a", "r2", "eth2"), delay);
    assert_eq!(impairment_of(&lab, "a", "r1", "eth2"), loss);
    assert_eq!(impairment_of(&lab, "b", "r3", "eth1"), loss);
    assert_eq!(impairment_of(&lab, "a", "r1", "eth3"), imp(&[("rate", "50mbit")]));
    assert_eq!(impairment_of(&lab, "b", "r4", "eth1"), imp(&[("rate", "20mbit")]));
    // Applied once: later passes leave the kernel alone.
    lab.kernel("a").take_emulation();
    lab.settle().await;
    assert!(lab.kernel("a").take_emulation().is_empty());
    let views = lab.engine("a").links(None, Some("r1")).await.unwrap();
    assert_eq!(views.len(), 3);
    assert!(
        views
            .iter()
            .all(|v| !v.overridden && v.active == v.topology && v.down.is_none())
    );
    let m = lab.metrics.render("text/plain").1;
    assert!(
        m.contains("weft_wire_impairment{namespace=\"lab\",link_uid=\"1\",pod=\"r1\",intf=\"eth1\",peer_node=\"\",kind=\"veth\",param=\"delay\"} 0.02"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_time_change_reaches_both_ends_and_a_reset_restores_the_topology() {
    let lab = emulation_lab().await;
    let new = imp(&[("delay", "5ms"), ("loss", "1%")]);
    for (intf, far) in [
        ("eth1", ("a", "r2", "eth2")),
        ("eth2", ("b", "r3", "eth1")),
        ("eth3", ("b", "r4", "eth1")),
    ] {
        let v = lab
            .engine("a")
            .link_change(None, "r1", intf, LinkChange::Set(new))
            .await
            .unwrap();
        assert!(v.overridden && v.active == new, "{intf}: {v:?}");
        lab.settle().await;
        assert_eq!(impairment_of(&lab, "a", "r1", intf), new, "{intf}");
        assert_eq!(impairment_of(&lab, far.0, far.1, far.2), new, "{intf}: the far end");
        let far_view = lab.engine(far.0).links(None, Some(far.1)).await.unwrap();
        assert!(far_view.iter().find(|v| v.end.local_intf == far.2).unwrap().overridden);
    }
    lab.engine("a")
        .link_change(None, "r1", "eth2", LinkChange::Reset)
        .await
        .unwrap();
    lab.settle().await;
    let loss = imp(&[("loss", "10%")]);
    assert_eq!(impairment_of(&lab, "a", "r1", "eth2"), loss);
    assert_eq!(impairment_of(&lab, "b", "r3", "eth1"), loss);

    // What cannot be done is refused with the reason.
    let e = lab
        .engine("a")
        .link_change(None, "r1", "eth9", LinkChange::Down)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no wire end r1:eth9 on this node"), "{e}");
    let jitter = Impairment {
        jitter_us: Some(2000),
        ..Impairment::default()
    };
    let e = lab
        .engine("a")
        .link_change(None, "r1", "eth1", LinkChange::Set(jitter))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("needs a delay"), "{e}");
}

/// Makes `change` to every link of the emulation lab's r1 (one of each kind), from node a.
async fn change_every_link_of_r1(lab: &Lab, change: LinkChange) {
    for intf in ["eth1", "eth2", "eth3"] {
        lab.engine("a")
            .link_change(None, "r1", intf, change.clone())
            .await
            .unwrap();
    }
}

#[test]
fn a_link_down_by_intent_drops_carrier_at_both_ends_and_stays_down_across_a_restart() {
    let mut lab = Lab::new(&["a", "b"]);
    life(async {
        let l = emulation_lab().await;
        lab = l;
        change_every_link_of_r1(&lab, LinkChange::Down).await;
        lab.settle().await;
        let (ka, kb) = (lab.kernel("a"), lab.kernel("b"));
        // veth: the named end goes down, the far end stays up (NO-CARRIER).
        assert!(!ka.iface("/fake/a/r1", "eth1").unwrap().up);
        assert!(ka.iface("/fake/a/r2", "eth2").unwrap().up);
        // VXLAN: both ends lose their carrier, up all the same.
        assert!(ka.iface("/fake/a/r1", "eth2").unwrap().proto_down);
        assert!(kb.iface("/fake/b/r3", "eth1").unwrap().proto_down);
        // gRPC: both node ends go down.
        assert!(ka.node_end_down(id("r1", 3)) && kb.node_end_down(id("r4", 3)));
        let views = lab.engine("b").links(None, None).await.unwrap();
        assert!(views.iter().all(|v| v.down == Some(DownBy::Peer)), "{views:?}");
        lab.stop();
    });
    // Someone rebuilds nothing; a restart finds the settings in the store.
    life(async {
        lab.start().await;
        lab.settle().await;
        let views = lab.engine("a").links(None, Some("r1")).await.unwrap();
        assert!(views.iter().all(|v| v.down == Some(DownBy::Named)), "{views:?}");
        assert!(!lab.kernel("a").iface("/fake/a/r1", "eth1").unwrap().up);
        assert!(lab.kernel("b").iface("/fake/b/r3", "eth1").unwrap().proto_down);
        let m = lab.metrics.render("text/plain").1;
        assert!(
            m.contains("weft_wire_down_by_intent{namespace=\"lab\",link_uid=\"2\",pod=\"r1\""),
            "{m}"
        );
        // Up again: every end gets its carrier back, the gRPC workers fresh sockets.
        change_every_link_of_r1(&lab, LinkChange::Up).await;
        lab.settle().await;
        let (ka, kb) = (lab.kernel("a"), lab.kernel("b"));
        assert!(ka.iface("/fake/a/r1", "eth1").unwrap().up);
        assert!(!ka.iface("/fake/a/r1", "eth2").unwrap().proto_down);
        assert!(!kb.iface("/fake/b/r3", "eth1").unwrap().proto_down);
        assert!(!ka.node_end_down(id("r1", 3)) && !kb.node_end_down(id("r4", 3)));
        assert!(lab.node("a").plane.end(id("r1", 3)).is_some());
        lab.stop();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_peer_node_may_change_an_end_and_a_removed_link_forgets_its_settings() {
    let mut lab = emulation_lab().await;
    // A node that does not hold the other end of b's r3:eth1 asks to take it down.
    let req = EndsRequest {
        from: Some(Hello {
            node: "c".into(),
            address: "192.0.2.3".into(),
        }),
        ends: vec![End {
            namespace: NS.into(),
            link_uid: 2,
            pod: "r1".into(),
            peer_pod: "r3".into(),
            kind: LinkKind::Vxlan.to_string(),
            vni: derived_vni(NS, 2),
            present: true,
            wire_id: id("r1", 2),
            control: Some(weft_rpc::wire::LinkControl {
                carrier: weft_rpc::wire::Carrier::Down as i32,
                ..Default::default()
            }),
        }],
    };
    let reply = lab.engine("b").ends(req).await;
    assert!(!reply.results[0].accepted);
    assert!(
        reply.results[0].reason.contains("does not hold the other end"),
        "{:?}",
        reply.results[0]
    );
    lab.settle().await;
    assert!(!lab.kernel("b").iface("/fake/b/r3", "eth1").unwrap().proto_down);

    // Settings go with their link.
    lab.engine("a")
        .link_change(None, "r1", "eth2", LinkChange::Down)
        .await
        .unwrap();
    lab.disconnect(2);
    lab.settle().await;
    lab.connect(2, ("r1", "eth2"), ("r3", "eth1"), None);
    lab.settle().await;
    for (node, pod) in [("a", "r1"), ("b", "r3")] {
        let v = lab.engine(node).links(None, Some(pod)).await.unwrap();
        let end = v.iter().find(|v| v.end.link_uid == 2).expect("rebuilt");
        assert_eq!(end.down, None, "{node}: {end:?}");
    }
}

/// The link states pod `pod`'s Topology status carries, as (interface, state, reason).
fn link_states(lab: &Lab, pod: &str) -> Vec<(String, String, String)> {
    let t = lab.source.topology(NS, pod).unwrap();
    t.status
        .as_ref()
        .map(|s| {
            s.links
                .iter()
                .map(|l| (l.local_intf.clone(), l.state.to_string(), l.reason.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waiting_for_its_links_is_answered_once_its_peers_arrive() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "e1"), ("r2", "e1"), Some(LinkKind::Grpc));
    lab.connect(2, ("r1", "e2"), ("r3", "e2"), None);
    lab.start().await;
    lab.add("a", "r1").await;

    let engine = lab.engine("a").clone();
    let waiting = tokio::spawn(async move { engine.wait_links(NS, "r1", Some(Duration::from_secs(10))).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "answered before any peer came");
    let states = link_states(&lab, "r1");
    assert_eq!(states.len(), 2, "{states:?}");
    for (intf, state, reason) in &states {
        let peer = if intf == "e1" { "r2" } else { "r3" };
        assert_eq!(state, "pending");
        assert_eq!(reason, &format!("peer pod {peer} is not running on any node yet"));
    }
    // `weftctl wires` lists the links with no end yet, with why.
    let report = lab.engine("a").report().await.unwrap();
    let e1 = report.iter().find(|r| r.end.local_intf == "e1").expect("e1 listed");
    assert_eq!(
        (e1.end.state, e1.reason.as_str()),
        (WireState::Pending, "peer pod r2 is not running on any node yet")
    );

    lab.add("b", "r2").await;
    assert!(!waiting.is_finished(), "answered with r3 still missing");
    lab.add("a", "r3").await;
    let answered = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("still waiting");
    assert_eq!(answered.unwrap(), Ok(()));
    lab.settle().await;
    for pod in ["r1", "r2", "r3"] {
        assert!(
            link_states(&lab, pod).iter().all(|(_, s, r)| s == "up" && r.is_empty()),
            "{pod}: {:?}",
            link_states(&lab, pod)
        );
    }

    // Down by intent is where the operator wants it: settled, and said so.
    lab.engine("a")
        .link_change(None, "r1", "e2", LinkChange::Down)
        .await
        .unwrap();
    lab.settle().await;
    let e2 = link_states(&lab, "r3");
    assert_eq!(e2[0].1, "down");
    assert_eq!(e2[0].2, "taken down by an operator at r1:e2");
    assert_eq!(
        lab.engine("a").wait_links(NS, "r3", Some(Duration::from_secs(1))).await,
        Ok(())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_links_ends_at_its_bound_and_a_topology_may_set_its_own() {
    let mut lab = Lab::new(&["a"]);
    lab.connect(1, ("r1", "e1"), ("r2", "e1"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    let e = lab
        .engine("a")
        .wait_links(NS, "r1", Some(Duration::from_millis(400)))
        .await
        .unwrap_err();
    assert_eq!(e.bound, Duration::from_millis(400));
    assert_eq!(
        e.to_string(),
        "links not up within 400ms: e1 (to r2:e1): pending: peer pod r2 is not running on any node yet"
    );
    // The node counts its pods' links by state.
    let links = |state| {
        lab.metrics
            .families::<WireMetrics>()
            .links
            .get_or_create(&weft_wires::metrics::LinkStateLabels { state })
            .get()
    };
    assert_eq!((links("pending"), links("up"), links("failed")), (1, 0, 0));
    // No wait configured, or none for pods without links: answered at once.
    assert_eq!(lab.engine("a").wait_links(NS, "r1", None).await, Ok(()));
    assert_eq!(
        lab.engine("a")
            .wait_links(NS, "nobody", Some(Duration::from_secs(5)))
            .await,
        Ok(())
    );

    // The pod's own Topology overrides the network's wait, both ways.
    let mut t = (*lab.source.topology(NS, "r1").unwrap()).clone();
    t.spec.wait_for_links = Some("0s".into());
    lab.source.put(t.clone());
    assert_eq!(
        lab.engine("a")
            .wait_links(NS, "r1", Some(Duration::from_secs(30)))
            .await,
        Ok(())
    );
    t.spec.wait_for_links = Some("200ms".into());
    lab.source.put(t);
    let e = lab.engine("a").wait_links(NS, "r1", None).await.unwrap_err();
    assert_eq!(e.bound, Duration::from_millis(200));
}

/// On a kernel without netem, a veth or VXLAN end's emulation is carried by a worker
/// through the end's link detour; a rate alone stays a qdisc. A change reaches the
/// worker in place, a qdisc-only setting or the end's removal takes the detour away,
/// and a detour an earlier run left for an end that needs none is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_netem_kernel_ends_are_emulated_through_a_detour() {
    let mut lab = Lab::new(&["a", "b"]);
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), None);
    lab.connect(2, ("r1", "eth2"), ("r3", "eth1"), None);
    lab.impair(1, "r1", "delay", "20ms");
    lab.impair(2, "r3", "rate", "10mbit");
    for n in ["a", "b"] {
        lab.kernel(n).without_netem();
    }
    lab.kernel("b").leave_detour(id("r3", 2), &netns("b", "r3"), "eth1");
    lab.start().await;
    for (n, p) in [("a", "r1"), ("a", "r2"), ("b", "r3")] {
        lab.add(n, p).await;
    }
    lab.settle().await;
    let delay = imp(&[("delay", "20ms")]);
    for (pod, intf) in [("r1", "eth1"), ("r2", "eth2")] {
        let end = id(pod, 1);
        assert_eq!(lab.node("a").plane.detoured(end), Some(delay), "{pod}");
        assert_eq!(
            lab.kernel("a").detour_of(end),
            Some((netns("a", pod), intf.to_string()))
        );
        assert!(
            lab.kernel("a")
                .iface(&netns("a", pod), intf)
                .unwrap()
                .impairment
                .is_empty()
        );
    }
    // A rate alone is the kernel's (tbf): no detour, and the one left behind is gone.
    let rate = imp(&[("rate", "10mbit")]);
    assert_eq!(
        lab.kernel("b").iface(&netns("b", "r3"), "eth1").unwrap().impairment,
        rate
    );
    assert_eq!(
        lab.kernel("a").iface(&netns("a", "r1"), "eth2").unwrap().impairment,
        rate
    );
    assert_eq!(lab.kernel("b").detour_of(id("r3", 2)), None);
    assert_eq!(lab.node("b").plane.detoured(id("r3", 2)), None);
    let views = lab.engine("a").links(None, Some("r1")).await.unwrap();
    assert!(views.iter().all(|v| v.problem.is_none()), "{views:?}");

    // A change reaches both workers in place.
    let loss = imp(&[("loss", "5%")]);
    lab.engine("a")
        .link_change(None, "r1", "eth1", LinkChange::Set(loss))
        .await
        .unwrap();
    assert_eq!(lab.node("a").plane.detoured(id("r1", 1)), Some(loss));
    assert_eq!(lab.node("a").plane.detoured(id("r2", 1)), Some(loss));
    // A rate alone needs no detour: both ends go back to the kernel's path.
    let slow = imp(&[("rate", "1mbit")]);
    lab.engine("a")
        .link_change(None, "r2", "eth2", LinkChange::Set(slow))
        .await
        .unwrap();
    for (pod, intf) in [("r1", "eth1"), ("r2", "eth2")] {
        assert_eq!(lab.node("a").plane.detoured(id(pod, 1)), None, "{pod}");
        assert_eq!(lab.kernel("a").detour_of(id(pod, 1)), None, "{pod}");
        assert_eq!(lab.kernel("a").iface(&netns("a", pod), intf).unwrap().impairment, slow);
    }
    // Back to the topology's delay, then the pod goes: its worker and detour with it.
    lab.engine("a")
        .link_change(None, "r2", "eth2", LinkChange::Reset)
        .await
        .unwrap();
    assert_eq!(lab.node("a").plane.detoured(id("r2", 1)), Some(delay));
    lab.remove("a", "r2").await;
    lab.settle().await;
    for pod in ["r1", "r2"] {
        assert_eq!(lab.node("a").plane.detoured(id(pod, 1)), None, "{pod}");
        assert_eq!(lab.kernel("a").detour_of(id(pod, 1)), None, "{pod}");
    }
}
