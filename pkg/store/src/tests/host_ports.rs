//! Host ports: held per family, conflicts refused, shared by one container across its networks.

use super::*;

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
