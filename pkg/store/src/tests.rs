use std::collections::HashSet;
use std::net::IpAddr;

use weft_link::{LinkKind, WireEnd, WireState};

use super::*;

fn spec(cid: &str, ranges: &[&str]) -> NewAttachment {
    NewAttachment {
        key: AttachmentKey {
            network: "weft".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
        },
        netns: format!("/run/netns/{cid}"),
        pod: PodRef {
            namespace: "default".into(),
            name: cid.into(),
            uid: String::new(),
        },
        host_ifname: format!("h{cid}"),
        mtu: 1500,
        ranges: ranges.iter().map(|r| r.parse().unwrap()).collect(),
        ports: Vec::new(),
        requested: Vec::new(),
        pod_mac: None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn route(dst: &str, gw: &str) -> InstalledRoute {
    InstalledRoute {
        dst: dst.parse().unwrap(),
        gateway: ip(gw),
    }
}

fn port(host: Option<&str>, p: u16, proto: &str) -> PortRequest {
    PortRequest {
        host_ip: host.map(|h| h.parse().unwrap()),
        family: None,
        host_port: p,
        protocol: proto.into(),
        container_port: 80,
    }
}

#[test]
fn host_ports_are_held_per_family_and_conflicts_are_refused() {
    let (_d, mut db) = open();
    let r = ["10.0.0.0/24", "fd00::/64"];
    let mut a = spec("a", &r);
    a.ports = vec![port(None, 8080, "tcp"), port(Some("10.1.1.1"), 53, "udp")];
    let a = created(db.begin_add(&a).unwrap());
    assert_eq!(
        a.ports.len(),
        3,
        "wildcard on both families plus one specific: {:?}",
        a.ports
    );
    assert_eq!(db.ports().unwrap().len(), 3);

    // Same port, other protocol or other specific address: fine.
    let mut b = spec("b", &r);
    b.ports = vec![port(None, 8080, "udp"), port(Some("10.1.1.2"), 53, "udp")];
    created(db.begin_add(&b).unwrap());

    // A wildcard against a specific, and a specific against a wildcard: taken.
    for (cid, req) in [("c", port(None, 53, "udp")), ("d", port(Some("10.9.9.9"), 8080, "tcp"))] {
        let mut c = spec(cid, &r);
        c.ports = vec![req];
        match db.begin_add(&c) {
            Err(StoreError::PortTaken { holder, .. }) => assert!(holder.starts_with("pod default/"), "{holder}"),
            other => panic!("expected PortTaken, got {other:?}"),
        }
        assert!(db.get(&c.key).unwrap().is_none(), "nothing left behind");
    }
    assert_eq!(
        db.allocated_addresses().unwrap().len(),
        4,
        "the refused ADDs released their addresses"
    );

    // A specific IPv6 host IP for a pod without IPv6 is refused.
    let mut e = spec("e", &["10.0.0.0/24"]);
    e.ports = vec![port(Some("fd00::1"), 9000, "tcp")];
    assert!(matches!(db.begin_add(&e), Err(StoreError::PortInvalid(_))));

    // 0.0.0.0 (IPv4 only) for a pod with only IPv6 is refused; restricted to IPv6 it works.
    let mut g = spec("g", &["fd00::/64"]);
    g.ports = vec![PortRequest {
        family: Some(Family::V4),
        ..port(None, 9001, "tcp")
    }];
    assert!(matches!(db.begin_add(&g), Err(StoreError::PortInvalid(_))));
    g.ports = vec![PortRequest {
        family: Some(Family::V6),
        ..port(None, 9001, "tcp")
    }];
    assert_eq!(created(db.begin_add(&g).unwrap()).ports.len(), 1);

    // DEL releases the ports at once, the addresses only when removed.
    let d = db.begin_del(&a.key).unwrap().unwrap();
    assert_eq!(d.ports.len(), 3, "DEL learns which ports to remove from the kernel");
    assert_eq!(db.ports().unwrap().len(), 4, "b's three and g's one remain");
    let mut f = spec("f", &r);
    f.ports = vec![port(None, 8080, "tcp")];
    created(db.begin_add(&f).unwrap());
}

/// One container on two networks, each asked for the same host port (as podman sends a
/// container's `portMappings` to every network): no conflict; the mapping stays with the
/// first network's attachment and passes to the second when the first goes, in either
/// DEL order; another container is still refused; the last one out releases it.
#[test]
fn one_container_shares_its_host_ports_across_its_networks() {
    let on = |net: &str, cid: &str, ranges: &[&str]| {
        let mut a = spec(cid, ranges);
        a.key.network = net.into();
        a.key.ifname = if net == "a" { "eth0".into() } else { "eth1".into() };
        a.host_ifname = format!("h{cid}{net}");
        a.pod = PodRef {
            namespace: String::new(),
            name: "mp".into(),
            uid: String::new(),
        };
        a.ports = vec![port(None, 18086, "tcp")];
        a
    };
    for first_out in ["a", "b"] {
        let (_d, mut db) = open();
        let a = created(db.begin_add(&on("a", "c1", &["10.123.0.0/24"])).unwrap());
        let b = created(
            db.begin_add(&on("b", "c1", &["10.124.0.0/24", "fd00:124::/64"]))
                .unwrap(),
        );
        assert_eq!(a.ports.len(), 1, "{:?}", a.ports);
        assert_eq!(
            b.ports.len(),
            1,
            "b holds only IPv6 itself; its IPv4 mapping is a's: {:?}",
            b.ports
        );
        assert!(b.ports[0].container_ip.is_ipv6());
        let held = db.ports().unwrap();
        assert_eq!(held.len(), 2);
        let v4 = held.iter().find(|h| h.mapping.container_ip.is_ipv4()).unwrap();
        assert_eq!(v4.key.network, "a", "the first network asked first");

        // Another container: refused, named without an empty namespace.
        match db.begin_add(&on("a", "c2", &["10.123.0.0/24"])) {
            Err(StoreError::PortTaken { holder, mapping }) => {
                assert_eq!(holder, "pod mp");
                assert_eq!(mapping, "0.0.0.0:18086/tcp");
            }
            other => panic!("expected PortTaken, got {other:?}"),
        }
        // The same container asking for another container port: a conflict too.
        let mut other = on("c", "c1", &["10.125.0.0/24"]);
        other.ports[0].container_port = 81;
        assert!(matches!(db.begin_add(&other), Err(StoreError::PortTaken { .. })));

        let (gone, stays) = if first_out == "a" { (&a, &b) } else { (&b, &a) };
        db.begin_del(&gone.key).unwrap().unwrap();
        let held = db.ports().unwrap();
        let v4: Vec<_> = held.iter().filter(|h| h.mapping.container_ip.is_ipv4()).collect();
        assert_eq!(v4.len(), 1, "the IPv4 mapping stays while one network asks for it");
        assert_eq!(v4[0].key, stays.key);
        assert_eq!(v4[0].mapping.container_ip, stays.addresses[0].address);
        assert_eq!(v4[0].host_ifname, stays.host_ifname);
        db.remove(gone.id).unwrap();
        assert_eq!(
            db.get(&stays.key).unwrap().unwrap().ports.len(),
            held.iter().filter(|h| h.key == stays.key).count()
        );

        db.begin_del(&stays.key).unwrap().unwrap();
        assert!(db.ports().unwrap().is_empty(), "the last one out releases it");
        created(db.begin_add(&on("a", "c2", &["10.123.0.0/24"])).unwrap());
    }
}

fn created(b: BeginAdd) -> Attachment {
    match b {
        BeginAdd::Created(a) => a,
        BeginAdd::Existing(a) => panic!("expected a new attachment, got existing {a:?}"),
    }
}

fn open() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("weft.db")).unwrap();
    (dir, db)
}

#[test]
fn dual_stack_allocation_gives_one_address_per_family() {
    let (_d, mut db) = open();
    let a = created(db.begin_add(&spec("c1", &["10.0.0.0/24", "fd00::/64"])).unwrap());
    assert_eq!(a.state, State::Creating);
    assert_eq!(a.addresses.len(), 2);
    assert_eq!(a.addresses[0].address, "10.0.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(a.addresses[0].gateway, "10.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(a.addresses[1].address, "fd00::2".parse::<IpAddr>().unwrap());
}

#[test]
fn repeated_add_returns_the_existing_attachment() {
    let (_d, mut db) = open();
    let a = created(db.begin_add(&spec("c1", &["10.0.0.0/24"])).unwrap());
    db.finish_add(a.id, "{}", &[]).unwrap();
    match db.begin_add(&spec("c1", &["10.0.0.0/24"])).unwrap() {
        BeginAdd::Existing(b) => {
            assert_eq!(b.id, a.id);
            assert_eq!(b.state, State::Ready);
            assert_eq!(b.addresses, a.addresses);
            assert_eq!(b.result.as_deref(), Some("{}"));
        }
        BeginAdd::Created(_) => panic!("second ADD allocated again"),
    }
    assert_eq!(db.allocated_addresses().unwrap().len(), 1);
}

#[test]
fn released_addresses_are_not_reused_immediately_and_allocation_wraps() {
    let (_d, mut db) = open();
    // /29: .2 .. .6 usable (5 addresses).
    let r = ["10.0.0.0/29"];
    let a = created(db.begin_add(&spec("a", &r)).unwrap());
    let b = created(db.begin_add(&spec("b", &r)).unwrap());
    db.remove(a.id).unwrap();
    let c = created(db.begin_add(&spec("c", &r)).unwrap());
    assert_eq!(
        c.addresses[0].address,
        "10.0.0.4".parse::<IpAddr>().unwrap(),
        "continues after the last"
    );
    let _d1 = created(db.begin_add(&spec("d", &r)).unwrap()); // .5
    let _e = created(db.begin_add(&spec("e", &r)).unwrap()); // .6
    let f = created(db.begin_add(&spec("f", &r)).unwrap()); // wraps to .2 (freed by a)
    assert_eq!(f.addresses[0].address, "10.0.0.2".parse::<IpAddr>().unwrap());
    match db.begin_add(&spec("g", &r)) {
        Err(StoreError::Exhausted {
            family: Family::V4,
            ranges,
        }) => assert_eq!(ranges, vec!["10.0.0.0/29"]),
        other => panic!("expected exhaustion, got {other:?}"),
    }
    // The failed ADD left no row behind.
    assert!(db.get(&spec("g", &r).key).unwrap().is_none());
    let _ = b;
}

#[test]
fn a_second_range_is_used_when_the_first_is_full() {
    let (_d, mut db) = open();
    let r = ["10.0.0.0/30", "10.0.1.0/30"];
    let a = created(db.begin_add(&spec("a", &r)).unwrap());
    let b = created(db.begin_add(&spec("b", &r)).unwrap());
    assert_eq!(a.addresses[0].range.to_string(), "10.0.0.0/30");
    assert_eq!(b.addresses[0].range.to_string(), "10.0.1.0/30");
    assert_eq!(b.addresses[0].gateway, "10.0.1.1".parse::<IpAddr>().unwrap());
    let err = db.begin_add(&spec("c", &r)).unwrap_err();
    assert_eq!(err.to_string(), "no free IPv4 address in 10.0.0.0/30, 10.0.1.0/30");
}

#[test]
fn exhausting_one_family_releases_the_other() {
    let (_d, mut db) = open();
    let r = ["10.0.0.0/30", "fd00::/64"];
    created(db.begin_add(&spec("a", &r)).unwrap());
    assert!(db.begin_add(&spec("b", &r)).is_err());
    assert_eq!(
        db.allocated_addresses().unwrap().len(),
        2,
        "only a's two addresses remain"
    );
}

#[test]
fn delete_lifecycle_keeps_addresses_until_removed() {
    let (_d, mut db) = open();
    let a = created(db.begin_add(&spec("a", &["10.0.0.0/24"])).unwrap());
    db.finish_add(a.id, "{}", &[]).unwrap();
    let d = db.begin_del(&a.key).unwrap().unwrap();
    assert_eq!(d.state, State::Deleting);
    assert_eq!(db.allocated_addresses().unwrap().len(), 1);
    assert_eq!(db.counts().unwrap(), (0, 0, 1));
    db.remove(a.id).unwrap();
    assert!(db.allocated_addresses().unwrap().is_empty());
    assert!(db.begin_del(&a.key).unwrap().is_none());
    db.remove(a.id).unwrap();
}

#[test]
fn usage_counts_allocations() {
    let (_d, mut db) = open();
    created(db.begin_add(&spec("a", &["10.0.0.0/30"])).unwrap());
    let u = db
        .usage_of(&["10.0.0.0/30".parse().unwrap(), "10.9.0.0/24".parse().unwrap()])
        .unwrap();
    assert!(u[0].is_full());
    assert_eq!(u[1].allocated, 0);
    let all = db.range_usage().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].capacity, 1);
}

#[test]
fn state_survives_reopen_and_schema_is_versioned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    let id = {
        let mut db = Db::open(&path).unwrap();
        assert_eq!(db.schema_found(), 0);
        created(db.begin_add(&spec("a", &["10.0.0.0/24"])).unwrap()).id
    };
    let mut db = Db::open(&path).unwrap();
    assert_eq!(db.schema_found(), SCHEMA_VERSION);
    let a = db.get(&spec("a", &[]).key).unwrap().unwrap();
    assert_eq!(a.id, id);
    assert_eq!(a.state, State::Creating);
    // The cursor persisted: the next address follows.
    let b = created(db.begin_add(&spec("b", &["10.0.0.0/24"])).unwrap());
    assert_eq!(b.addresses[0].address, "10.0.0.3".parse::<IpAddr>().unwrap());
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    }
    assert!(matches!(Db::open(&path), Err(StoreError::TooNew { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_through_the_writer_never_share_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            let sp = spec(&format!("c{i}"), &["10.0.0.0/24", "fd00::/120"]);
            match s.run(move |db| db.begin_add(&sp)).await.unwrap() {
                BeginAdd::Created(a) => a.addresses.iter().map(|x| x.address).collect::<Vec<_>>(),
                BeginAdd::Existing(_) => unreachable!(),
            }
        }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        for a in t.await.unwrap() {
            assert!(seen.insert(a), "{a} handed out twice");
        }
    }
    assert_eq!(seen.len(), 400);
    let n = store.run(|db| db.allocated_addresses()).await.unwrap().len();
    assert_eq!(n, 400);
}

fn wire(id: u64, uid: i64, vni: Option<u32>) -> WireEnd {
    WireEnd {
        id,
        namespace: "lab".into(),
        link_uid: uid,
        local_pod: "r1".into(),
        local_intf: format!("eth{uid}"),
        peer_pod: "r2".into(),
        peer_intf: "eth1".into(),
        peer_id: id + 1000,
        kind: if vni.is_some() { LinkKind::Vxlan } else { LinkKind::Grpc },
        peer_node: "10.2.0.2".into(),
        vni,
        netns: "/run/netns/r1".into(),
        state: WireState::Up,
    }
}

#[test]
fn wires_are_kept_with_unique_vnis_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    {
        let mut db = Db::open(&path).unwrap();
        db.put_wire(&wire(1, 1, Some(5001))).unwrap();
        db.put_wire(&wire(2, 2, None)).unwrap();
        match db.put_wire(&wire(3, 3, Some(5001))) {
            Err(StoreError::VniTaken { vni: 5001, holder: 1 }) => {}
            other => panic!("expected VniTaken, got {other:?}"),
        }
        // Updating a wire keeps its own VNI.
        let mut w1 = wire(1, 1, Some(5001));
        w1.state = WireState::Down;
        db.put_wire(&w1).unwrap();
        assert_eq!(db.vni_holder(5001).unwrap(), Some(1));
    }
    let mut db = Db::open(&path).unwrap();
    let all = db.wires().unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].state, WireState::Down);
    assert_eq!(all[1], wire(2, 2, None), "a wire end reads back as it was put");
    assert_eq!(db.wire(2).unwrap().unwrap().peer_id, 1002);
    db.remove_wire(1).unwrap();
    assert_eq!(db.vni_holder(5001).unwrap(), None);
    db.put_wire(&wire(3, 3, Some(5001))).unwrap();
}

#[test]
fn a_wire_row_with_an_unknown_state_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    let mut db = Db::open(&path).unwrap();
    db.put_wire(&wire(1, 1, None)).unwrap();
    db.put_wire(&wire(2, 2, Some(5002))).unwrap();
    // The schema checks kinds but not states: a newer weftd may have written one.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE wires SET state = 'draining' WHERE id = 1", [])
        .unwrap();
    match db.wire(1) {
        Err(e @ StoreError::UnknownWireName { id: 1, .. }) => {
            assert_eq!(
                e.to_string(),
                "wire 0x1 in the state store: unknown wire state \"draining\""
            );
        }
        other => panic!("expected UnknownWireName, got {other:?}"),
    }
    assert!(matches!(db.wires(), Err(StoreError::UnknownWireName { id: 1, .. })));
    assert_eq!(db.wire(2).unwrap(), Some(wire(2, 2, Some(5002))));
}

#[test]
fn a_requested_address_is_allocated_exactly_and_leaves_the_cursor_alone() {
    let (_d, mut db) = open();
    let r = ["10.0.0.0/24", "10.0.1.0/24", "fd00::/64"];
    let mut a = spec("a", &r);
    a.requested = vec![ip("10.0.1.7")];
    let a = created(db.begin_add(&a).unwrap());
    assert_eq!(
        a.addresses[0].address,
        ip("10.0.1.7"),
        "from the second range, which holds it"
    );
    assert_eq!(a.addresses[0].gateway, ip("10.0.1.1"));
    assert_eq!(a.addresses[1].address, ip("fd00::2"), "the other family as usual");
    let b = created(db.begin_add(&spec("b", &r)).unwrap());
    assert_eq!(
        b.addresses[0].address,
        ip("10.0.0.2"),
        "sequential allocation is unaffected"
    );
    // Sequential allocation steps over a requested address.
    let mut c = spec("c", &["10.0.0.0/24"]);
    c.requested = vec![ip("10.0.0.3")];
    created(db.begin_add(&c).unwrap());
    let d = created(db.begin_add(&spec("d", &["10.0.0.0/24"])).unwrap());
    assert_eq!(d.addresses[0].address, ip("10.0.0.4"));
}

#[test]
fn a_requested_address_that_is_taken_or_not_a_pod_address_is_refused_whole() {
    let (_d, mut db) = open();
    let r = ["10.0.0.0/24", "fd00::/64"];
    let mut a = spec("a", &r);
    a.requested = vec![ip("10.0.0.7")];
    let a = created(db.begin_add(&a).unwrap());
    let before = db.allocated_addresses().unwrap();

    let mut b = spec("b", &r);
    b.requested = vec![ip("fd00::9"), ip("10.0.0.7")];
    match db.begin_add(&b) {
        Err(StoreError::AddressTaken {
            address,
            holder,
            key,
            deleting,
        }) => {
            assert_eq!(address, ip("10.0.0.7"));
            assert_eq!(holder, "pod default/a (network weft, interface eth0)");
            assert_eq!(key, a.key);
            assert!(!deleting);
        }
        other => panic!("expected AddressTaken, got {other:?}"),
    }
    for (want, says) in [
        ("10.9.0.7", "outside every IPv4 range of the network: 10.0.0.0/24"),
        ("10.0.0.0", "the network address of range 10.0.0.0/24"),
        ("10.0.0.1", "the gateway"),
        ("10.0.0.255", "the broadcast address"),
        ("fd00::1", "the gateway"),
    ] {
        let mut b = spec("b", &r);
        b.requested = vec![ip(want)];
        match db.begin_add(&b) {
            Err(StoreError::AddressInvalid(m)) => assert!(m.contains(says), "{want}: {m}"),
            other => panic!("{want}: expected AddressInvalid, got {other:?}"),
        }
    }
    let mut b = spec("b", &["10.0.0.0/24"]);
    b.requested = vec![ip("fd00::9")];
    match db.begin_add(&b) {
        Err(StoreError::AddressInvalid(m)) => assert!(m.contains("no IPv6 range"), "{m}"),
        other => panic!("expected AddressInvalid, got {other:?}"),
    }
    // Nothing of the refused ADDs remains: no row, no address (not even fd00::9).
    assert!(db.get(&spec("b", &r).key).unwrap().is_none());
    assert_eq!(db.allocated_addresses().unwrap(), before);

    // A holder being torn down is reported as such, so the caller can wait for it.
    db.begin_del(&a.key).unwrap();
    let mut b = spec("b", &r);
    b.requested = vec![ip("10.0.0.7")];
    match db.begin_add(&b) {
        Err(StoreError::AddressTaken { deleting, holder, .. }) => {
            assert!(deleting);
            assert!(holder.ends_with(", being deleted)"), "{holder}");
        }
        other => panic!("expected AddressTaken, got {other:?}"),
    }
    db.remove(a.id).unwrap();
    assert_eq!(created(db.begin_add(&b).unwrap()).addresses[0].address, ip("10.0.0.7"));
}

#[test]
fn routes_and_a_requested_mac_are_kept_with_the_attachment() {
    let (_d, mut db) = open();
    let mut a = spec("a", &["10.0.0.0/24", "fd00::/64"]);
    a.pod_mac = Some([0x0a, 0x58, 0, 0, 0, 7]);
    let a = created(db.begin_add(&a).unwrap());
    assert!(a.routes.is_empty(), "nothing is installed yet");
    assert_eq!(a.pod_mac, Some([0x0a, 0x58, 0, 0, 0, 7]));
    let routes = vec![route("10.0.0.0/8", "10.0.0.1"), route("::/0", "fd00::1")];
    db.finish_add(a.id, "{}", &routes).unwrap();
    let got = db.get(&a.key).unwrap().unwrap();
    assert_eq!(got.routes, routes);
    assert_eq!(got.pod_mac, a.pod_mac);
    // An attachment that installed no route at all says so (and is not mistaken for an
    // old one, which had default routes).
    let b = created(db.begin_add(&spec("b", &["10.0.0.0/24"])).unwrap());
    db.finish_add(b.id, "{}", &[]).unwrap();
    let got = db.get(&b.key).unwrap().unwrap();
    assert!(got.routes.is_empty());
    assert_eq!(got.pod_mac, None);
}

#[test]
fn every_network_of_a_container_is_listed() {
    let (_d, mut db) = open();
    created(db.begin_add(&spec("a", &["10.0.0.0/24"])).unwrap());
    let mut net1 = spec("a", &["10.1.0.0/24"]);
    net1.key.network = "second".into();
    net1.key.ifname = "net1".into();
    net1.host_ifname = "ha1".into();
    created(db.begin_add(&net1).unwrap());
    created(db.begin_add(&spec("b", &["10.0.0.0/24"])).unwrap());
    let of_a = db.container_attachments("a").unwrap();
    let ifnames: Vec<_> = of_a.iter().map(|x| x.key.ifname.as_str()).collect();
    assert_eq!(ifnames, ["eth0", "net1"]);
    assert!(db.container_attachments("zz").unwrap().is_empty());
}

/// A database written by weft before schema 5 (no routes, no MAC column) is migrated,
/// and its attachments read as what weft installed then: the default route through
/// each gateway, the derived MAC.
#[test]
fn attachments_from_schema_4_read_as_what_they_installed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    {
        let mut c = rusqlite::Connection::open(&path).unwrap();
        crate::schema::migrate_to(&mut c, 4).unwrap();
        c.execute_batch(
            "INSERT INTO ranges (id, cidr) VALUES (1, '10.0.0.0/24'), (2, 'fd00::/64');
             INSERT INTO attachments (id, network, container_id, ifname, netns, host_ifname, mtu, state, result,
                                      created_at, updated_at)
                 VALUES (1, 'weft', 'old', 'eth0', '/run/netns/old', 'weftold', 1500, 'ready', '{}', 0, 0);
             INSERT INTO allocations (address, range_id, attachment_id) VALUES
                 (X'00000000000000000000ffff0a000002', 1, 1),
                 (X'fd000000000000000000000000000002', 2, 1);",
        )
        .unwrap();
    }
    let mut db = Db::open(&path).unwrap();
    assert_eq!(db.schema_found(), 4);
    let old = db.get(&spec("old", &[]).key).unwrap().unwrap();
    assert_eq!(old.addresses[0].address, ip("10.0.0.2"));
    assert_eq!(
        old.routes,
        vec![route("0.0.0.0/0", "10.0.0.1"), route("::/0", "fd00::1")]
    );
    assert_eq!(old.pod_mac, None);
    // And the migrated database takes new attachments as any other.
    let mut n = spec("new", &["10.0.0.0/24"]);
    n.requested = vec![ip("10.0.0.9")];
    let n = created(db.begin_add(&n).unwrap());
    db.finish_add(n.id, "{}", &[route("10.0.0.0/8", "10.0.0.1")]).unwrap();
    assert_eq!(db.get(&n.key).unwrap().unwrap().routes.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_job_fails_its_call_and_the_store_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    // A job that panics half-way through a transaction it opened by hand.
    let r: Result<(), StoreError> = store
        .run(|db| {
            db.execute_raw("BEGIN IMMEDIATE; INSERT INTO ranges (cidr) VALUES ('10.99.0.0/24');")?;
            panic!("a bug in a store job")
        })
        .await;
    match r {
        Err(StoreError::Panicked(m)) => assert!(m.contains("a bug in a store job"), "{m}"),
        other => panic!("expected Panicked, got {other:?}"),
    }
    // The next calls are served, and the half-done transaction was rolled back.
    let att = store
        .run(|db| db.begin_add(&spec("c1", &["10.244.1.0/24"])))
        .await
        .unwrap();
    assert!(matches!(att, BeginAdd::Created(_)));
    let ranges: Vec<String> = store
        .run(|db| Ok(db.range_usage()?.into_iter().map(|u| u.range.to_string()).collect()))
        .await
        .unwrap();
    assert_eq!(
        ranges,
        vec!["10.244.1.0/24".to_string()],
        "the panicked job's insert is gone"
    );
    // The blocking entry point too.
    let r: Result<(), StoreError> = store.run_blocking(|_| panic!("again"));
    assert!(matches!(r, Err(StoreError::Panicked(_))));
    assert!(store.run_blocking(|db| db.counts()).is_ok());
}

/// Caps the database at the pages it has now, as a full disk would: SQLite refuses to
/// grow it with `SQLITE_FULL`, whoever runs the test (root ignores file modes).
fn cap_pages(store: &Store, pages: Option<u32>) {
    let sql = format!("PRAGMA max_page_count = {}", pages.unwrap_or(1));
    store.run_blocking(move |db| db.execute_raw(&sql)).unwrap();
}

#[test]
fn a_store_that_cannot_write_is_unwritable_until_a_write_goes_through() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    let mut watch = store.writable_watch();
    store.run_blocking(|db| db.begin_run("test")).unwrap();
    assert!(store.writable());
    // A job failing for a reason of its own says nothing about the database.
    let mut taken = spec("ip-taken", &["10.0.0.0/24"]);
    taken.requested = vec![ip("10.0.0.1")];
    assert!(matches!(
        store.run_blocking(move |db| db.begin_add(&taken)),
        Err(StoreError::AddressInvalid(_))
    ));
    assert!(store.writable());

    cap_pages(&store, None);
    let mut failure = None;
    for i in 0..2000 {
        let mut s = spec(&format!("c{i}"), &["10.0.0.0/16"]);
        s.pod.name = "p".repeat(2000);
        if let Err(e) = store.run_blocking(move |db| db.begin_add(&s)) {
            failure = Some(e);
            break;
        }
    }
    match failure {
        Some(StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _))) => {
            assert_eq!(e.code, rusqlite::ErrorCode::DiskFull)
        }
        other => panic!("expected the capped database to fill up, got {other:?}"),
    }
    assert!(!store.writable(), "a full database is not writable");
    assert!(watch.has_changed().unwrap() && !*watch.borrow_and_update());
    // Reads still work, and do not make it writable.
    assert!(store.run_blocking(|db| db.counts()).is_ok());
    assert!(!store.writable());

    // Room again: the store stays unwritable until a write goes through; on an idle
    // node that write is the probe the daemon sends while the store is unwritable.
    cap_pages(&store, Some(1_000_000));
    assert!(!store.writable());
    store.run_blocking(|db| db.probe_write()).unwrap();
    assert!(store.writable(), "the probe's write went through");
    assert!(watch.has_changed().unwrap() && *watch.borrow_and_update());
    store
        .run_blocking(|db| db.begin_add(&spec("after", &["10.0.0.0/16"])))
        .unwrap();
    assert!(store.writable());
}

#[test]
fn a_store_that_went_down_is_unwritable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let die = Arc::new(AtomicBool::new(false));
    let observer: Observer = {
        let die = die.clone();
        Arc::new(move |_| assert!(!die.load(Ordering::SeqCst), "the store goes down (test)"))
    };
    let store = Store::open_observed(&dir.path().join("weft.db"), Some(observer)).unwrap();
    assert!(store.writable());
    die.store(true, Ordering::SeqCst);
    // The job runs, then its observer takes the store down.
    let _ = store.run_blocking(|db| db.counts());
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.writable() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!store.writable(), "a store that went down is not writable");
    assert!(matches!(store.run_blocking(|db| db.counts()), Err(StoreError::Closed)));
}

/// The schema objects of a database, whitespace folded so indentation does not count.
fn schema_of(c: &rusqlite::Connection) -> Vec<(String, String, String)> {
    let mut stmt = c
        .prepare("SELECT type, name, COALESCE(sql, '') FROM sqlite_master ORDER BY type, name")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)?)))
        .unwrap()
        .map(|r| {
            let (t, n, sql) = r.unwrap();
            (t, n, sql.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

/// The fixtures the migration tests start from (`tests/fixtures/weft-schema-N.sql`)
/// hold exactly the schema that weft's migrations made at that version, so the tests
/// start from what a node really has on disk.
#[test]
fn migration_fixtures_match_the_schema_of_their_version() {
    let fixtures = [
        include_str!("../tests/fixtures/weft-schema-1.sql"),
        include_str!("../tests/fixtures/weft-schema-2.sql"),
        include_str!("../tests/fixtures/weft-schema-3.sql"),
        include_str!("../tests/fixtures/weft-schema-4.sql"),
    ];
    for (i, sql) in fixtures.iter().enumerate() {
        let version = i as u32 + 1;
        let fixture = rusqlite::Connection::open_in_memory().unwrap();
        fixture.execute_batch(sql).unwrap();
        let mut made = rusqlite::Connection::open_in_memory().unwrap();
        crate::schema::migrate_to(&mut made, version).unwrap();
        assert_eq!(schema_of(&fixture), schema_of(&made), "schema {version}");
        let v: u32 = fixture.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v, version);
    }
}

/// An attachment rebuilt from the kernel holds its addresses under the narrowest range
/// of its gateway; an ADD from the real, wider range does not hand them out again, and
/// recording it twice (or over a known key) writes nothing.
#[test]
fn rebuilt_attachments_hold_their_addresses_against_the_real_range() {
    let (_d, mut db) = open();
    let range = crate::narrowest_range(ip("10.0.0.1"), &[ip("10.0.0.2"), ip("10.0.0.3")]).unwrap();
    let rebuilt = |cid: &str, a: &str| RebuiltAttachment {
        key: spec(cid, &[]).key,
        netns: format!("/run/netns/{cid}"),
        host_ifname: format!("h{cid}"),
        mtu: 1450,
        addresses: vec![Allocation {
            address: ip(a),
            range,
            gateway: ip("10.0.0.1"),
        }],
        routes: vec![route("0.0.0.0/0", "10.0.0.1")],
        pod_mac: Some([2, 0, 0, 0, 0, 1]),
        result: Some(format!("{{\"cid\":\"{cid}\"}}")),
    };
    assert!(db.record_rebuilt(&rebuilt("a", "10.0.0.2")).unwrap());
    assert!(db.record_rebuilt(&rebuilt("b", "10.0.0.3")).unwrap());
    assert!(!db.record_rebuilt(&rebuilt("a", "10.0.0.9")).unwrap(), "known key");
    assert!(!db.record_rebuilt(&rebuilt("c", "10.0.0.2")).unwrap(), "held address");
    assert!(db.get(&spec("c", &[]).key).unwrap().is_none(), "nothing half-written");

    let a = db.get(&spec("a", &[]).key).unwrap().unwrap();
    assert_eq!(a.state, State::Ready);
    assert_eq!(a.addresses[0].address, ip("10.0.0.2"));
    assert_eq!(a.addresses[0].gateway, ip("10.0.0.1"));
    assert_eq!(a.routes, vec![route("0.0.0.0/0", "10.0.0.1")]);
    assert_eq!(a.pod_mac, Some([2, 0, 0, 0, 0, 1]));
    assert_eq!(a.mtu, 1450);
    assert_eq!(a.result.as_deref(), Some("{\"cid\":\"a\"}"));

    let n = created(db.begin_add(&spec("n", &["10.0.0.0/24"])).unwrap());
    assert_eq!(n.addresses[0].address, ip("10.0.0.4"));
    let mut taken = spec("t", &["10.0.0.0/24"]);
    taken.requested = vec![ip("10.0.0.3")];
    assert!(matches!(db.begin_add(&taken), Err(StoreError::AddressTaken { .. })));
    // DEL of a rebuilt attachment releases its address like any other.
    let b = db.begin_del(&spec("b", &[]).key).unwrap().unwrap();
    db.remove(b.id).unwrap();
    assert!(!db.allocated_addresses().unwrap().contains(&ip("10.0.0.3")));
}
