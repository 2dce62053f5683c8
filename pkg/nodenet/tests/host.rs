//! The node network on a real kernel: a node namespace with an uplink, peers on-link
//! and behind a gateway, passes of the engine, and the kernel inspected with `ip`,
//! `bridge` and `nft` after each: routes, the VXLAN device, its FDB and neighbour
//! entries, the masquerade sets; drift repaired; routes of others never touched.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Node, json, node, sh};
use weft_kernel::testutil::privileged;
use weft_nodenet::*;
use weft_topology::ClusterNode;

fn cfg(routing: PodRouting) -> Config {
    Config {
        node_name: "n1".into(),
        node_address: None,
        routing,
        vxlan_port: DEFAULT_VXLAN_PORT,
        vxlan_vni: 42,
        masquerade: true,
        no_masquerade: vec!["192.0.2.0/24".parse().unwrap()],
        resync: Duration::from_secs(60),
        export: None,
    }
}

fn cluster() -> Vec<ClusterNode> {
    vec![
        node("n1", "172.30.1.2", &["10.244.1.0/24"]),
        node("n2", "172.30.1.3", &["10.244.2.0/24"]),
        node("n3", "172.30.3.2", &["10.244.3.0/24"]),
    ]
}

fn mac(name: &str) -> String {
    mac_string(&vxlan_mac(name))
}

#[test]
fn programs_direct_and_vxlan_peers_follows_changes_and_repairs_drift() {
    if !privileged() {
        return;
    }
    let n = Node::new(9000);
    // A route of someone else's: never to be touched.
    sh(
        n.ns.path(),
        &[
            "ip",
            "route",
            "add",
            "10.99.0.0/24",
            "via",
            "172.30.1.1",
            "proto",
            "static",
        ],
    );

    let (d, out) = n.pass(&cfg(PodRouting::Auto), &cluster(), None);
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert_eq!(
        n.routes(),
        vec![
            ("10.244.2.0/24".into(), "172.30.1.3".into(), "uplink".into()),
            ("10.244.3.0/24".into(), "10.244.3.0".into(), VXLAN_DEVICE.into()),
        ]
    );
    let link = n.link(VXLAN_DEVICE).expect("the VXLAN device");
    let info = &link["linkinfo"]["info_data"];
    assert_eq!(info["id"], 42);
    assert_eq!(info["port"], DEFAULT_VXLAN_PORT);
    assert_eq!(info["local"], "172.30.1.2");
    assert_eq!(info["learning"], false);
    assert_eq!(link["mtu"], 8950, "underlay 9000 minus VXLAN");
    assert_eq!(link["address"], mac("n1"));
    assert_eq!(d.pod_mtu, Some(8950));
    assert_eq!(n.fdb(), vec![(mac("n3"), "172.30.3.2".into())]);
    assert_eq!(n.neighbours(), vec![("10.244.3.0".into(), mac("n3"))]);
    // This node's own range: an address no pod holds is answered here, never sent out.
    assert_eq!(n.unreachable(), vec!["10.244.1.0/24".to_string()]);
    let lookup = Command::new("nsenter")
        .arg(format!("--net={}", n.ns.path().display()))
        .args(["ip", "route", "get", "10.244.1.77"])
        .output()
        .unwrap();
    // EHOSTUNREACH from the unreachable route (no route at all would be ENETUNREACH).
    assert!(
        !lookup.status.success() && String::from_utf8_lossy(&lookup.stderr).contains("No route to host"),
        "{lookup:?}"
    );
    let table = n.masquerade_sets();
    assert!(
        table.contains("10.244.1.0/24") || table.contains("10.244.0.0/22"),
        "{table}"
    );
    assert!(table.contains("192.0.2.0/24"), "{table}");

    // Nothing to do the second time.
    let (d2, out) = n.pass(&cfg(PodRouting::Auto), &cluster(), Some(&d));
    assert_eq!(out, PassOutcome::default());

    // n3 readdressed, n2 gets another podCIDR, n4 arrives: one pass follows.
    let mut nodes = cluster();
    nodes[2].addresses = vec!["172.30.9.2".parse().unwrap()];
    nodes[1].pod_cidrs = vec!["10.244.22.0/24".parse().unwrap()];
    nodes.push(node("n4", "172.30.4.2", &["10.244.4.0/24"]));
    let (d3, out) = n.pass(&cfg(PodRouting::Auto), &nodes, Some(&d2));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert!(out.repairs.is_empty(), "changes, not repairs: {out:?}");
    assert_eq!(
        n.routes(),
        vec![
            ("10.244.22.0/24".into(), "172.30.1.3".into(), "uplink".into()),
            ("10.244.3.0/24".into(), "10.244.3.0".into(), VXLAN_DEVICE.into()),
            ("10.244.4.0/24".into(), "10.244.4.0".into(), VXLAN_DEVICE.into()),
        ]
    );
    assert_eq!(n.fdb(), {
        let mut v = vec![
            (mac("n3"), "172.30.9.2".to_string()),
            (mac("n4"), "172.30.4.2".to_string()),
        ];
        v.sort();
        v
    });

    // Drift behind weft's back: a route, an FDB entry and a neighbour entry deleted.
    sh(n.ns.path(), &["ip", "route", "del", "10.244.22.0/24"]);
    sh(
        n.ns.path(),
        &[
            "bridge",
            "fdb",
            "del",
            &mac("n4"),
            "dev",
            VXLAN_DEVICE,
            "dst",
            "172.30.4.2",
        ],
    );
    sh(n.ns.path(), &["ip", "neigh", "del", "10.244.3.0", "dev", VXLAN_DEVICE]);
    sh(
        n.ns.path(),
        &["ip", "route", "del", "unreachable", "10.244.1.0/24", "proto", "75"],
    );
    let (d4, out) = n.pass(&cfg(PodRouting::Auto), &nodes, Some(&d3));
    assert_eq!(out.repairs.len(), 4, "{out:?}");
    assert_eq!(n.unreachable(), vec!["10.244.1.0/24".to_string()]);
    assert!(out.changes.is_empty());
    assert_eq!(n.routes().len(), 3);
    assert_eq!(n.fdb().len(), 2);
    assert_eq!(n.neighbours().len(), 2);

    // Every peer gone: routes, entries and the device go; the foreign route stays.
    let (_, out) = n.pass(&cfg(PodRouting::Auto), &nodes[..1], Some(&d4));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert!(n.routes().is_empty());
    assert!(n.link(VXLAN_DEVICE).is_none(), "no device without VXLAN peers");
    assert_eq!(n.unreachable(), vec!["10.244.1.0/24".to_string()], "still this node's");
    let foreign = sh(n.ns.path(), &["ip", "route", "show", "10.99.0.0/24"]);
    assert!(foreign.contains("proto static"), "{foreign}");
}

#[test]
fn masquerade_off_removes_the_table_and_none_mode_programs_nothing() {
    if !privileged() {
        return;
    }
    let n = Node::new(1500);
    let (d, _) = n.pass(&cfg(PodRouting::None), &cluster(), None);
    assert!(n.routes().is_empty());
    assert!(n.link(VXLAN_DEVICE).is_none());
    assert_eq!(
        n.unreachable(),
        vec!["10.244.1.0/24".to_string()],
        "own ranges in every mode"
    );
    assert_eq!(d.pod_mtu, Some(1500));
    assert!(n.masquerade_sets().contains("masquerade"));
    let mut off = cfg(PodRouting::None);
    off.masquerade = false;
    let (_, out) = n.pass(&off, &cluster(), Some(&d));
    assert_eq!(out.masquerade, Some(MasqChange::Remove));
    let listed = Command::new("nsenter")
        .arg(format!("--net={}", n.ns.path().display()))
        .args(["nft", "list", "table", "inet", "weft-egress"])
        .output()
        .unwrap();
    assert!(!listed.status.success(), "the table is gone");
}

#[test]
fn masquerade_sets_change_element_by_element() {
    if !privileged() {
        return;
    }
    let n = Node::new(1500);
    let (d, _) = n.pass(&cfg(PodRouting::None), &cluster(), None);
    // A handle of the table tells a rebuild from an update.
    let handle = |n: &Node| {
        let v = json(n.ns.path(), &["nft", "-j", "list", "table", "inet", "weft-egress"]);
        v["nftables"][1]["table"]["handle"].as_u64().unwrap()
    };
    let before = handle(&n);
    let mut nodes = cluster();
    nodes.push(node("n9", "172.30.9.2", &["10.250.9.0/24"]));
    let (_, out) = n.pass(&cfg(PodRouting::None), &nodes, Some(&d));
    assert!(matches!(out.masquerade, Some(MasqChange::Update { .. })), "{out:?}");
    assert_eq!(handle(&n), before, "updated in place, not rebuilt");
    assert!(n.masquerade_sets().contains("10.250.9.0/24"));
}

/// `ip -j route show table 119` in the node: (destination, type, protocol) of each route.
fn table_119(n: &Node, v6: bool) -> Vec<(String, String, String)> {
    let family = if v6 { "-6" } else { "-4" };
    let v = json(n.ns.path(), &["ip", "-j", family, "route", "show", "table", "119"]);
    v.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["dst"].as_str().unwrap_or_default().to_string(),
                r["type"].as_str().unwrap_or("unicast").to_string(),
                r["protocol"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn exported_ranges_are_blackholes_in_their_table_repaired_and_withdrawn() {
    if !privileged() {
        return;
    }
    let n = Node::new(1500);
    let mut c = cfg(PodRouting::None);
    c.export = Some(RouteExport::new(119, 75).unwrap());
    let mut nodes = cluster();
    nodes[0].pod_cidrs.push("fd00:10:244:1::/64".parse().unwrap());
    let (d, out) = n.pass(&c, &nodes, None);
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    // `ip` names protocol 75 by number (it is in no rt_protos file).
    let want4 = vec![("10.244.1.0/24".to_string(), "blackhole".to_string(), "75".to_string())];
    let want6 = vec![(
        "fd00:10:244:1::/64".to_string(),
        "blackhole".to_string(),
        "75".to_string(),
    )];
    assert_eq!(table_119(&n, false), want4);
    assert_eq!(table_119(&n, true), want6);
    // The node forwards by its main table: no route of weft's to another node in `none`.
    assert!(n.routes().is_empty());

    // A route someone deleted comes back at the next pass, counted as a repair; a
    // foreign route in the same table is left alone.
    sh(
        n.ns.path(),
        &[
            "ip",
            "route",
            "del",
            "blackhole",
            "10.244.1.0/24",
            "table",
            "119",
            "proto",
            "75",
        ],
    );
    sh(
        n.ns.path(),
        &[
            "ip",
            "route",
            "add",
            "10.99.0.0/24",
            "via",
            "172.30.1.1",
            "table",
            "119",
            "proto",
            "static",
        ],
    );
    let (d2, out) = n.pass(&c, &nodes, Some(&d));
    assert_eq!(out.repairs.len(), 1, "{:?}", out);
    assert!(matches!(out.repairs[0], Change::Export(..)));
    assert!(table_119(&n, false).contains(&want4[0]));

    // The node's IPv4 range goes: its export is withdrawn, the IPv6 one stays.
    nodes[0].pod_cidrs.retain(|c| c.addr().is_ipv6());
    let (_, out) = n.pass(&c, &nodes, Some(&d2));
    assert!(
        out.changes.iter().any(|ch| matches!(ch, Change::Withdraw(..))),
        "{out:?}"
    );
    let left = table_119(&n, false);
    assert_eq!(left.len(), 1, "only the foreign route: {left:?}");
    assert_eq!(left[0].0, "10.99.0.0/24");
    assert_eq!(table_119(&n, true), want6);
}
