//! Tests of `plan`.

use super::*;
use weft_topology::TopologySpec;

fn link(uid: i64, peer: &str, kind: Option<LinkKind>) -> Link {
    Link {
        uid,
        peer_pod: peer.into(),
        local_intf: "eth1".into(),
        peer_intf: "eth2".into(),
        local_ip: "10.0.0.1/30".into(),
        peer_ip: "10.0.0.2/30".into(),
        local_mac: None,
        peer_mac: Some("02:00:00:00:00:02".into()),
        kind,
        impair: Default::default(),
    }
}

fn topo(name: &str, links: Vec<Link>, node: Option<&str>) -> Arc<Topology> {
    let mut t = Topology::new(
        name,
        TopologySpec {
            links,
            ..Default::default()
        },
    );
    t.metadata.namespace = Some("lab".into());
    t.status = node.map(|n| TopologyStatus {
        src_ip: n.into(),
        net_ns: format!("/run/netns/{name}"),
        ..Default::default()
    });
    Arc::new(t)
}

fn pod(name: &str) -> LocalPod {
    LocalPod {
        netns: format!("/run/netns/{name}"),
        container_id: format!("c-{name}"),
    }
}

#[test]
fn a_links_state_says_why_it_is_not_up() {
    let l = link(1, "r2", None);
    let mut r = record("lab", "r1", "/run/netns/r1", &l, LinkKind::Grpc, "10.0.0.2".into());
    let st =
        |rec: Option<&WireEnd>, a: &Attempt, down| link_status("r1", &l, rec, a, down, "what the carrier waits for");

    let absent = st(None, &Attempt::PeerAbsent, None);
    assert_eq!(absent.state, LinkPhase::Pending);
    assert_eq!(absent.reason, "peer pod r2 is not running on any node yet");
    assert_eq!(
        (absent.uid, absent.local_intf.as_str(), absent.peer_intf.as_str()),
        (1, "eth1", "eth2")
    );

    r.state = WireState::Up;
    let up = st(Some(&r), &Attempt::Done, None);
    assert_eq!((up.state, up.reason.as_str()), (LinkPhase::Up, ""));

    // Down by intent wins over how the end was last seen, and says which end was named.
    let down = st(Some(&r), &Attempt::Done, Some(DownBy::Peer));
    assert_eq!(down.state, LinkPhase::Down);
    assert_eq!(down.reason, "taken down by an operator at r2:eth2");
    assert!(down.state.settled());
    // A link down by intent whose end is gone is waiting, not down.
    assert_eq!(
        st(None, &Attempt::PeerAbsent, Some(DownBy::Named)).state,
        LinkPhase::Pending
    );

    // A recorded end that is not built yet waits for what its carrier says.
    r.state = WireState::Pending;
    assert_eq!(st(Some(&r), &Attempt::Done, None).reason, "what the carrier waits for");
    r.state = WireState::Down;
    assert!(st(Some(&r), &Attempt::Done, None).reason.contains("went away"));

    let waiting = Attempt::Failed {
        transient: true,
        error: "connecting to 10.0.0.2: refused".into(),
    };
    assert_eq!(st(Some(&r), &waiting, None).state, LinkPhase::Pending);
    let refused = Attempt::Failed {
        transient: false,
        error: "kernel: File exists".into(),
    };
    let failed = st(None, &refused, None);
    assert_eq!(
        (failed.state, failed.reason.as_str()),
        (LinkPhase::Failed, "kernel: File exists")
    );
}

const ME: &str = "192.0.2.1";

fn plan(pod_name: &str, l: &Link, pods: &[&str], topos: &[Arc<Topology>]) -> Want {
    let pods = pods
        .iter()
        .map(|p| (("lab".to_string(), p.to_string()), pod(p)))
        .collect();
    let find = |ns: &str, n: &str| {
        topos
            .iter()
            .find(|t| key_of(t) == (ns.to_string(), n.to_string()))
            .cloned()
    };
    want(ME.parse().unwrap(), LinkKind::Vxlan, "lab", pod_name, l, &pods, find)
}

#[test]
fn same_node_the_lower_name_builds_for_both() {
    let r1 = topo("r1", vec![link(1, "r2", None)], None);
    let r2 = topo("r2", vec![link(1, "r1", None)], None);
    let topos = [r1, r2];
    assert_eq!(
        plan("r1", &link(1, "r2", None), &["r1", "r2"], &topos),
        Want::Veth {
            peer: pod("r2"),
            builder: true
        }
    );
    assert_eq!(
        plan("r2", &link(1, "r1", None), &["r1", "r2"], &topos),
        Want::Veth {
            peer: pod("r1"),
            builder: false
        }
    );
}

#[test]
fn same_node_a_link_only_one_side_lists_is_built_by_that_side() {
    // r2 lists nothing back: r2 would never build, so r3 (the higher name) does.
    let r3 = topo("r3", vec![link(1, "r2", None)], None);
    let r2 = topo("r2", vec![], None);
    assert_eq!(
        plan("r3", &link(1, "r2", None), &["r2", "r3"], &[r3, r2]),
        Want::Veth {
            peer: pod("r2"),
            builder: true
        }
    );
}

fn local(pods: &[&str]) -> Pods {
    pods.iter()
        .map(|p| (("lab".to_string(), p.to_string()), pod(p)))
        .collect()
}

fn finder(topos: &[Arc<Topology>]) -> impl Fn(&str, &str) -> Option<Arc<Topology>> + '_ {
    move |ns, n| {
        topos
            .iter()
            .find(|t| key_of(t) == (ns.to_string(), n.to_string()))
            .cloned()
    }
}

fn keys(names: &[&str]) -> BTreeSet<PodKey> {
    names.iter().map(|n| ("lab".to_string(), n.to_string())).collect()
}

#[test]
fn a_pass_looks_at_what_moved_and_the_local_pods_linked_to_it() {
    // r1 - r2 (local), r2 - x (x elsewhere), r3 - r4 (local), r3 lists r5 which lists
    // nothing back; r6 is linked to no one.
    let topos = [
        topo("r1", vec![link(1, "r2", None)], None),
        topo("r2", vec![link(1, "r1", None), link(2, "x", None)], None),
        topo("r3", vec![link(3, "r4", None), link(4, "r5", None)], None),
        topo("r4", vec![link(3, "r3", None)], None),
        topo("r5", vec![], None),
        topo("r6", vec![], None),
        topo("x", vec![link(2, "r2", None)], Some("192.0.2.9")),
    ];
    let pods = local(&["r1", "r2", "r3", "r4", "r5", "r6"]);
    let find = finder(&topos);
    let listers = Listers::of(topos.iter().map(|t| &**t));
    // A remote pod moved: the local pods listing it.
    assert_eq!(affected(&pods, &keys(&["x"]), &find, &listers), keys(&["r2"]));
    // A local pod moved: itself and its local peers both ways.
    assert_eq!(affected(&pods, &keys(&["r1"]), &find, &listers), keys(&["r1", "r2"]));
    assert_eq!(affected(&pods, &keys(&["r5"]), &find, &listers), keys(&["r3", "r5"]));
    assert_eq!(affected(&pods, &keys(&["r6"]), &find, &listers), keys(&["r6"]));
    // A pod that is gone (no longer local, topology still there): its former peers.
    assert_eq!(
        affected(&local(&["r2", "r3"]), &keys(&["r4"]), &find, &listers),
        keys(&["r3"])
    );
    assert_eq!(affected(&pods, &BTreeSet::new(), &find, &listers), BTreeSet::new());
    // r3's topology changes to list r6 instead of r5: the index follows it.
    let mut listers = listers;
    let key = |n: &str| ("lab".to_string(), n.to_string());
    listers.remove(&key("r3"), &topos[2]);
    let r3 = topo("r3", vec![link(3, "r4", None), link(5, "r6", None)], None);
    listers.add(&key("r3"), &r3);
    let topos = [
        topos[0].clone(),
        topos[1].clone(),
        r3,
        topos[3].clone(),
        topos[4].clone(),
        topos[5].clone(),
        topos[6].clone(),
    ];
    let find = finder(&topos);
    assert_eq!(affected(&pods, &keys(&["r5"]), &find, &listers), keys(&["r5"]));
    assert_eq!(affected(&pods, &keys(&["r6"]), &find, &listers), keys(&["r3", "r6"]));
    assert_eq!(listers.listing(&key("r4")).collect::<Vec<_>>(), vec![&key("r3")]);
}

#[test]
fn an_end_is_wanted_while_its_pod_or_its_builder_lists_the_link() {
    let r1 = topo("r1", vec![link(1, "r2", None)], None);
    let r2_silent = topo("r2", vec![], None);
    let l = link(1, "r2", None);
    let ours = record("lab", "r1", "/run/netns/r1", &l, LinkKind::Veth, String::new());
    let theirs = mirror(&ours, "/run/netns/r2");
    let topos = [r1.clone(), r2_silent];
    let find = finder(&topos);
    let both = local(&["r1", "r2"]);
    assert!(end_wanted(&ours, &both, &find));
    // r2 does not list the link, but r1 builds the pair for both.
    assert!(end_wanted(&theirs, &both, &find));
    // Without r1 here, nothing asks for r2's end; without r2, neither runs here.
    assert!(!end_wanted(&theirs, &local(&["r2"]), &find));
    assert!(!end_wanted(&theirs, &local(&["r1"]), &find));
    // The link gone from r1's topology: neither end is wanted.
    let topos = [topo("r1", vec![], None), topo("r2", vec![], None)];
    let find = finder(&topos);
    assert!(!end_wanted(&ours, &both, &find));
    assert!(!end_wanted(&theirs, &both, &find));
    assert_eq!(owner(&theirs), ("lab".to_string(), "r2".to_string()));
}

#[test]
fn across_nodes_the_peer_status_decides() {
    let l = link(1, "r2", None);
    let r1 = topo("r1", vec![l.clone()], Some(ME));
    // No topology, no status, or a status without a namespace: absent.
    assert_eq!(plan("r1", &l, &["r1"], std::slice::from_ref(&r1)), Want::Absent);
    let r2 = topo("r2", vec![link(1, "r1", None)], None);
    assert_eq!(plan("r1", &l, &["r1"], &[r1.clone(), r2]), Want::Absent);
    // Claims to run here but is not attached here: absent.
    let r2 = topo("r2", vec![link(1, "r1", None)], Some(ME));
    assert_eq!(plan("r1", &l, &["r1"], &[r1.clone(), r2]), Want::Absent);
    // Runs on another node: the daemon's default kind, or the link's own.
    let r2 = topo("r2", vec![link(1, "r1", None)], Some("192.0.2.2"));
    let node: IpAddr = "192.0.2.2".parse().unwrap();
    assert_eq!(
        plan("r1", &l, &["r1"], &[r1.clone(), r2.clone()]),
        Want::Remote {
            kind: LinkKind::Vxlan,
            node
        }
    );
    let g = link(1, "r2", Some(LinkKind::Grpc));
    assert_eq!(
        plan("r1", &g, &["r1"], &[r1, r2]),
        Want::Remote {
            kind: LinkKind::Grpc,
            node
        }
    );
}

#[test]
fn a_change_settles_on_both_ends_and_keeps_the_rest() {
    let imp = Impairment::from_params([("delay", "20ms")]).unwrap();
    let down = EndSettings {
        impairment: None,
        down: Some(DownBy::Named),
    };
    let (a, b) = settle_change(&LinkChange::Set(imp), down, EndSettings::default());
    assert_eq!((a.impairment, b.impairment), (Some(imp), Some(imp)));
    assert_eq!((a.down, b.down), (Some(DownBy::Named), None), "the state is left alone");
    let (a, b) = settle_change(&LinkChange::Down, a, b);
    assert_eq!((a.down, b.down), (Some(DownBy::Named), Some(DownBy::Peer)));
    let (a, b) = settle_change(&LinkChange::Reset, a, b);
    assert_eq!((a.impairment, b.impairment), (None, None));
    let (a, b) = settle_change(&LinkChange::Up, a, b);
    assert!(a.is_empty() && b.is_empty());
}

#[test]
fn either_entry_gives_the_topology_impairment_and_an_override_wins() {
    let mut own = link(1, "r2", None);
    let mut peer = link(1, "r1", None);
    own.impair.delay = Some("20ms".into());
    peer.impair.delay = Some("50ms".into());
    peer.impair.loss = Some("10%".into());
    let t = topology_impairment(Some(&own), Some(&peer));
    assert_eq!((t.delay_us, t.loss_ppm), (Some(20_000), Some(100_000)));
    assert!(topology_impairment(None, None).is_empty());
    let rec = record("lab", "r1", "/a", &own, LinkKind::Veth, String::new());
    let v = view(rec.clone(), t, EndSettings::default());
    assert_eq!((v.active, v.overridden), (t, false));
    let none = EndSettings {
        impairment: Some(Impairment::default()),
        down: None,
    };
    let v = view(rec, t, none);
    assert!(v.active.is_empty() && v.overridden);
}

#[test]
fn the_lower_name_proposes_the_vni() {
    assert!(proposes("r1", "r2"));
    assert!(!proposes("r2", "r1"));
    let mut rec = record("lab", "r1", "/n", &link(1, "r2", None), LinkKind::Vxlan, ME.into());
    assert_eq!(first_vni(Some(&rec), "lab", 1), derived_vni("lab", 1));
    rec.vni = Some(77);
    assert_eq!(first_vni(Some(&rec), "lab", 1), 77);
}

#[test]
fn records_and_messages() {
    let l = link(5, "r2", None);
    let ours = record("lab", "r1", "/a", &l, LinkKind::Veth, String::new());
    let theirs = mirror(&ours, "/b");
    assert_eq!(theirs.id, wire_id("lab", 5, "r2"));
    assert_eq!(theirs.peer_id, ours.id);
    assert_eq!(
        (theirs.local_intf.as_str(), theirs.peer_intf.as_str()),
        ("eth2", "eth1")
    );
    assert_eq!(theirs.netns, "/b");
    let peer = vxlan_peer("lab", &l, "192.0.2.9".parse().unwrap());
    assert_eq!(peer.mac, [2, 0, 0, 0, 0, 2]);
    assert_eq!(peer.ip, Some("10.0.0.2".parse().unwrap()));
    let spec = local_spec("lab", "r1", "/a", &l, 1500);
    assert_eq!(spec.mac, derived_mac("lab", "r1", "eth1"));
    assert_eq!(spec.address, Some(("10.0.0.1".parse().unwrap(), 30)));
    assert_eq!(vxlan_mtu(1500, "192.0.2.1".parse().unwrap()), 1450);
    assert_eq!(vxlan_mtu(1500, "2001:db8::1".parse().unwrap()), 1430);
    assert_eq!((ours.kind, ours.state), (LinkKind::Veth, WireState::Up));
    let e = end_of("lab", "r1", &l, LinkKind::Vxlan, Some(9));
    assert!(e.present);
    assert_eq!((e.wire_id, e.vni, e.kind.as_str()), (ours.id, 9, "vxlan"));
}
