//! A database written by an older weft (one fixture per schema version a node could
//! still have, `fixtures/weft-schema-N.sql`) is migrated in place by today's
//! `Store::open`: every row survives with its values, the columns added since read as
//! their defaults, and the store goes on taking attachments. One written by a newer
//! weft is refused.

use std::net::IpAddr;
use std::path::Path;

use weft_link::{LinkKind, WireState};
use weft_store::{
    AttachmentKey, BeginAdd, InstalledRoute, NewAttachment, PodRef, PreviousRun, SCHEMA_VERSION, State, Store,
    StoreError,
};

const FIXTURES: [&str; 5] = [
    include_str!("fixtures/weft-schema-1.sql"),
    include_str!("fixtures/weft-schema-2.sql"),
    include_str!("fixtures/weft-schema-3.sql"),
    include_str!("fixtures/weft-schema-4.sql"),
    include_str!("fixtures/weft-schema-5.sql"),
];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn key(cid: &str) -> AttachmentKey {
    AttachmentKey {
        network: "weft".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
    }
}

/// Writes the fixture of schema `version` as that weft would have left it on disk.
fn write_fixture(path: &Path, version: u32) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(FIXTURES[version as usize - 1]).unwrap();
    let v: u32 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, version, "the fixture sets its version");
}

fn migrates_from(version: u32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    write_fixture(&path, version);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_found(), version);
    let (web0, web1, dns0, usage, allocated, ports, wires, prev, settings) = store
        .run_blocking(|db| {
            let prev = db.begin_run("test")?.1;
            Ok((
                db.get(&key("c0ffee01"))?.unwrap(),
                db.get(&key("c0ffee02"))?.unwrap(),
                db.get(&key("c0ffee03"))?.unwrap(),
                db.range_usage()?,
                db.allocated_addresses()?,
                db.ports()?,
                db.wires()?,
                prev,
                db.link_settings()?,
            ))
        })
        .unwrap();

    // Attachments, with every column as written.
    assert_eq!(web0.state, State::Ready);
    assert_eq!(web0.netns, "/var/run/netns/cni-1111");
    assert_eq!(
        web0.pod,
        PodRef {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: "uid-web-0".into()
        }
    );
    assert_eq!(web0.host_ifname, "weft1a2b3c4d5e");
    assert_eq!(web0.mtu, 1450);
    assert!(web0.result.as_deref().unwrap().contains("10.244.1.2/24"));
    let addrs: Vec<_> = web0
        .addresses
        .iter()
        .map(|a| (a.address, a.range.to_string(), a.gateway))
        .collect();
    assert_eq!(
        addrs,
        vec![
            (ip("10.244.1.2"), "10.244.1.0/24".to_string(), ip("10.244.1.1")),
            (
                ip("fd00:10:244:1::2"),
                "fd00:10:244:1::/64".to_string(),
                ip("fd00:10:244:1::1")
            ),
        ]
    );
    assert_eq!(web1.addresses.len(), 2);
    assert_eq!(web1.addresses[0].address, ip("10.244.1.3"));
    assert_eq!(dns0.state, State::Deleting);
    assert_eq!(dns0.pod.namespace, "kube-system");
    assert_eq!(dns0.result, None);
    assert_eq!(dns0.addresses[0].address, ip("10.244.1.4"));

    // The columns added since (schema 5) read as their defaults: what weft installed
    // then, the default route through each gateway, and the MAC derived from the key.
    assert_eq!(
        web0.routes,
        vec![
            InstalledRoute {
                dst: "0.0.0.0/0".parse().unwrap(),
                gateway: ip("10.244.1.1")
            },
            InstalledRoute {
                dst: "::/0".parse().unwrap(),
                gateway: ip("fd00:10:244:1::1")
            },
        ]
    );
    assert_eq!(web0.pod_mac, None);

    // Ranges and allocations.
    let usage: Vec<_> = usage.iter().map(|u| (u.range.to_string(), u.allocated)).collect();
    assert_eq!(
        usage,
        vec![("10.244.1.0/24".to_string(), 3), ("fd00:10:244:1::/64".to_string(), 2)]
    );
    assert_eq!(allocated.len(), 5);

    // Host ports (schema 2), wire ends (3) and daemon runs (4), where the version had them.
    if version >= 2 {
        assert_eq!(ports.len(), 1);
        let p = &ports[0];
        assert_eq!(p.key, key("c0ffee01"));
        assert_eq!((p.mapping.host_ip, p.mapping.host_port), (None, 8080));
        assert_eq!(p.mapping.protocol, "tcp");
        assert_eq!(
            (p.mapping.container_ip, p.mapping.container_port),
            (ip("10.244.1.2"), 80)
        );
    } else {
        assert!(ports.is_empty());
    }
    if version >= 3 {
        assert_eq!(wires.len(), 1);
        let w = &wires[0];
        assert_eq!((w.id, w.peer_id, w.link_uid), (0x1234, 0x5678, 7));
        assert_eq!(
            (w.namespace.as_str(), w.local_pod.as_str(), w.local_intf.as_str()),
            ("lab", "r1", "eth1")
        );
        assert_eq!((w.peer_pod.as_str(), w.peer_intf.as_str()), ("r2", "eth1"));
        assert_eq!(w.kind, LinkKind::Vxlan);
        assert_eq!(w.state, WireState::Up);
        assert_eq!(w.vni, Some(5001));
        assert_eq!(w.peer_node, "192.168.0.12");
        assert_eq!(w.netns, "/var/run/netns/cni-1111");
    } else {
        assert!(wires.is_empty());
    }
    if version >= 4 {
        assert_eq!(
            prev,
            PreviousRun::Crashed {
                version: "0.4.0".into(),
                started_at_ms: 1_700_000_200_000
            }
        );
    } else {
        assert_eq!(prev, PreviousRun::None);
    }

    // Run-time link settings (schema 6) start empty and take a setting.
    assert!(settings.is_empty());
    let down = weft_link::EndSettings {
        impairment: None,
        down: Some(weft_link::DownBy::Named),
    };
    store
        .run_blocking(move |db| db.put_link_settings(0x1234, &down))
        .unwrap();

    // The migrated store goes on: a new attachment gets the next address after the
    // range's cursor, not one an old pod holds, and an old one can be deleted.
    let got = store
        .run_blocking(|db| {
            let spec = NewAttachment {
                key: key("new"),
                netns: "/var/run/netns/new".into(),
                pod: PodRef::default(),
                host_ifname: "weftnew".into(),
                mtu: 1450,
                ranges: vec!["10.244.1.0/24".parse().unwrap()],
                ports: Vec::new(),
                requested: Vec::new(),
                pod_mac: None,
            };
            let BeginAdd::Created(a) = db.begin_add(&spec)? else {
                panic!("a new key makes a new attachment");
            };
            let old = db.begin_del(&key("c0ffee02"))?.unwrap();
            db.remove(old.id)?;
            Ok(a.addresses[0].address)
        })
        .unwrap();
    assert_eq!(got, ip("10.244.1.5"));
    drop(store);

    // Reopening finds the current version: the migration ran once, in place.
    let again = Store::open(&path).unwrap();
    assert_eq!(again.schema_found(), SCHEMA_VERSION);
}

#[test]
fn a_database_from_schema_5_is_migrated_in_place() {
    migrates_from(5);
}

#[test]
fn a_database_from_schema_4_is_migrated_in_place() {
    migrates_from(4);
}

#[test]
fn a_database_from_schema_3_is_migrated_in_place() {
    migrates_from(3);
}

#[test]
fn a_database_from_schema_2_is_migrated_in_place() {
    migrates_from(2);
}

#[test]
fn a_database_from_schema_1_is_migrated_in_place() {
    migrates_from(1);
}

#[test]
fn a_database_from_a_newer_weft_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    write_fixture(&path, 5);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    }
    let err = Store::open(&path).err().expect("a newer schema is refused");
    assert!(
        matches!(err, StoreError::TooNew { found, known } if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION)
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&(SCHEMA_VERSION + 1).to_string()) && msg.contains(&SCHEMA_VERSION.to_string()),
        "{msg}"
    );
    // Untouched: still the newer version, rows intact.
    let c = rusqlite::Connection::open(&path).unwrap();
    let v: u32 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION + 1);
    let n: i64 = c
        .query_row("SELECT COUNT(*) FROM attachments", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
}
