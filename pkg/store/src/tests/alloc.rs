//! Address allocation: one per family, requested addresses, cursors and release, ranges filling up.

use super::*;

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

/// The gateways in use are those of the ranges some attachment (ready or not) holds an
/// address of, each once, and a range goes out of use with its last address.
#[test]
fn gateways_in_use_follow_the_ranges_with_addresses_held() {
    let (_d, mut db) = open();
    assert!(db.gateways_in_use().unwrap().is_empty());
    let a = created(db.begin_add(&spec("a", &["10.0.0.0/24", "fd00:1::/64"])).unwrap());
    let b = created(db.begin_add(&spec("b", &["10.0.0.0/24"])).unwrap());
    let c = created(db.begin_add(&spec("c", &["10.1.0.0/24"])).unwrap());
    let mut used = db.gateways_in_use().unwrap();
    used.sort();
    let want: Vec<std::net::IpAddr> = vec![
        "10.0.0.1".parse().unwrap(),
        "10.1.0.1".parse().unwrap(),
        "fd00:1::1".parse().unwrap(),
    ];
    assert_eq!(used, want);
    db.remove(a.id).unwrap();
    db.remove(c.id).unwrap();
    assert_eq!(
        db.gateways_in_use().unwrap(),
        vec!["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    db.begin_del(&b.key).unwrap().unwrap();
    assert_eq!(
        db.gateways_in_use().unwrap().len(),
        1,
        "a pod being deleted still holds its range"
    );
    db.remove(b.id).unwrap();
    assert!(db.gateways_in_use().unwrap().is_empty());
}

/// The ranges alone are the ranges `range_usage` counts, in the same order.
#[test]
fn ranges_are_the_ranges_usage_counts() {
    let (_d, mut db) = open();
    assert!(db.ranges().unwrap().is_empty());
    created(db.begin_add(&spec("a", &["10.0.0.0/30", "fd00:1::/64"])).unwrap());
    created(db.begin_add(&spec("b", &["10.1.0.0/24"])).unwrap());
    let usage: Vec<ipnet::IpNet> = db.range_usage().unwrap().into_iter().map(|u| u.range).collect();
    assert_eq!(usage.len(), 3, "{usage:?}");
    assert_eq!(db.ranges().unwrap(), usage);
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

/// The node's ready pods read in one statement are what loading every ready
/// attachment gives: the same pods, host interfaces and addresses, in order; an
/// attachment still being created, another interface and a nameless pod are left out.
#[test]
fn ready_pods_are_the_ready_attachments_of_the_interface_in_brief() {
    let (_dir, mut db) = open();
    let ranges = ["10.244.0.0/24", "fd00:1::/64"];
    for cid in ["c1", "c2", "c3"] {
        let a = created(db.begin_add(&spec(cid, &ranges)).unwrap());
        db.finish_add(a.id, "{}", &[]).unwrap();
    }
    let _creating = created(db.begin_add(&spec("c4", &ranges)).unwrap());
    let mut other = spec("c5", &ranges[..1]);
    other.key.ifname = "net1".into();
    let a = created(db.begin_add(&other).unwrap());
    db.finish_add(a.id, "{}", &[]).unwrap();
    let mut nameless = spec("c6", &ranges[..1]);
    nameless.pod.name = String::new();
    let a = created(db.begin_add(&nameless).unwrap());
    db.finish_add(a.id, "{}", &[]).unwrap();

    let brief: Vec<ReadyPod> = db.ready_pods("eth0").unwrap().values().map(|p| (**p).clone()).collect();
    let full: Vec<ReadyPod> = db
        .list(None, Some(State::Ready))
        .unwrap()
        .into_iter()
        .filter(|a| a.key.ifname == "eth0" && !a.pod.name.is_empty())
        .map(|a| ReadyPod {
            pod: PodRef {
                uid: String::new(),
                ..a.pod
            },
            host_ifname: a.host_ifname,
            addresses: a.addresses.iter().map(|x| x.address).collect(),
        })
        .collect();
    assert_eq!(brief, full);
    let names: Vec<&str> = brief.iter().map(|p| p.pod.name.as_str()).collect();
    assert_eq!(names, ["c1", "c2", "c3"]);
    assert_eq!(brief[0].addresses.len(), 2, "{brief:?}");
}

/// The listing is kept between calls, and any write to a table it reads is seen at the
/// next call: through the store's own operations and through a statement that knows
/// nothing of the listing.
#[test]
fn ready_pods_follow_every_write_of_what_they_read() {
    let (_dir, mut db) = open();
    let ranges = ["10.244.0.0/24"];
    let names = |db: &mut Db| -> Vec<String> {
        db.ready_pods("eth0")
            .unwrap()
            .values()
            .map(|p| p.pod.name.clone())
            .collect()
    };
    let a = created(db.begin_add(&spec("c1", &ranges)).unwrap());
    db.finish_add(a.id, "{}", &[]).unwrap();
    assert_eq!(names(&mut db), ["c1"]);
    assert_eq!(names(&mut db), ["c1"], "asked again, unchanged");
    let before = db.ready_pods("eth0").unwrap();
    let b = created(db.begin_add(&spec("c2", &ranges)).unwrap());
    assert_eq!(names(&mut db), ["c1"], "c2 is not ready yet");
    db.finish_add(b.id, "{}", &[]).unwrap();
    assert_eq!(names(&mut db), ["c1", "c2"]);
    // c1 did not change: the listing shares it with the one before, it is not copied.
    let first = |pods: &crate::ReadyPods| pods.values().next().expect("a pod").clone();
    assert!(std::sync::Arc::ptr_eq(
        &first(&before),
        &first(&db.ready_pods("eth0").unwrap())
    ));
    // And the two listings differ by c2 alone.
    let after = db.ready_pods("eth0").unwrap();
    let moved: Vec<i64> = before
        .diff(&after)
        .map(|d| match d {
            imbl::ordmap::DiffItem::Add(id, _) => *id,
            other => panic!("only c2 came: {other:?}"),
        })
        .collect();
    assert_eq!(moved, [b.id]);
    db.begin_del(&spec("c1", &[]).key).unwrap().unwrap();
    assert_eq!(names(&mut db), ["c2"], "a pod being deleted is not listed");
    db.execute_raw("UPDATE attachments SET pod_name = 'renamed' WHERE container_id = 'c2'")
        .unwrap();
    assert_eq!(names(&mut db), ["renamed"], "a write by any statement is seen");
    db.execute_raw("DELETE FROM allocations").unwrap();
    assert!(
        first(&db.ready_pods("eth0").unwrap()).addresses.is_empty(),
        "its address rows went"
    );
}

/// The listing kept from the log is, after every kind of write, what a connection that
/// reads it whole finds: ADDs, DELs, a removal, raw statements on the pods, their
/// addresses and their ranges, a write by another connection, and more writes than the
/// log keeps while nobody asked.
#[test]
fn ready_pods_kept_from_the_log_are_what_a_whole_read_finds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    let mut db = Db::open(&path).unwrap();
    let whole = || Db::open(&path).unwrap().ready_pods("eth0").unwrap();
    let ranges = ["10.244.0.0/24", "fd00:1::/64"];
    let mut ids = Vec::new();
    let check = |db: &mut Db, what: &str| {
        let kept = db.ready_pods("eth0").unwrap();
        assert_eq!(kept, whole(), "after {what}");
        kept.len()
    };
    assert_eq!(check(&mut db, "nothing"), 0);
    for i in 0..6 {
        let a = created(db.begin_add(&spec(&format!("c{i}"), &ranges)).unwrap());
        ids.push(a.id);
        check(&mut db, &format!("c{i}'s begin_add"));
        db.finish_add(a.id, "{}", &[]).unwrap();
        assert_eq!(check(&mut db, &format!("c{i}'s finish_add")), i + 1);
    }
    db.begin_del(&spec("c2", &[]).key).unwrap().unwrap();
    assert_eq!(check(&mut db, "c2's begin_del"), 5);
    db.remove(ids[2]).unwrap();
    check(&mut db, "c2's removal");
    db.execute_raw("UPDATE attachments SET pod_name = 'renamed' WHERE container_id = 'c3'")
        .unwrap();
    check(&mut db, "a rename by a raw statement");
    db.execute_raw(&format!("DELETE FROM allocations WHERE attachment_id = {}", ids[4]))
        .unwrap();
    check(&mut db, "c4's addresses deleted");
    db.execute_raw(&format!(
        "UPDATE allocations SET attachment_id = {} WHERE attachment_id = {}",
        ids[5], ids[1]
    ))
    .unwrap();
    check(&mut db, "c1's addresses moved to c5");
    db.execute_raw("UPDATE ranges SET cidr = '10.245.0.0/24' WHERE cidr = '10.244.0.0/24'")
        .unwrap();
    check(&mut db, "a range's change");
    // Another connection's write is not in this one's log.
    let mut other = Db::open(&path).unwrap();
    let a = created(other.begin_add(&spec("by-other", &ranges)).unwrap());
    other.finish_add(a.id, "{}", &[]).unwrap();
    assert_eq!(check(&mut db, "another connection's ADD"), 6);
    // Many more writes than the log keeps, none asked about.
    for i in 0..(crate::db::LOG_KEPT as usize) {
        db.execute_raw(&format!(
            "UPDATE attachments SET pod_name = 'n{i}' WHERE container_id = 'c0'"
        ))
        .unwrap();
    }
    check(&mut db, "a log cut back while nobody asked");
    let n = db.count_raw("SELECT count(*) FROM temp.ready_log");
    assert!(n <= 2 * crate::db::LOG_KEPT, "the log is bounded: {n} entries");
}
