use std::time::Duration;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn node(name: &str, addrs: &[&str], cidrs: &[&str]) -> ClusterNode {
    ClusterNode {
        name: name.into(),
        addresses: addrs.iter().map(|a| ip(a)).collect(),
        pod_cidrs: cidrs.iter().map(|c| net(c)).collect(),
        ..Default::default()
    }
}

fn cfg(routing: PodRouting) -> Config {
    Config {
        node_name: "n1".into(),
        node_address: None,
        routing,
        vxlan_port: DEFAULT_VXLAN_PORT,
        vxlan_vni: DEFAULT_VXLAN_VNI,
        masquerade: true,
        no_masquerade: vec![net("192.0.2.0/24")],
        resync: Duration::from_secs(60),
        export: None,
    }
}

fn cluster() -> Vec<ClusterNode> {
    vec![
        node("n1", &["172.30.1.2"], &["10.244.1.0/24"]),
        node("n2", &["172.30.1.3"], &["10.244.2.0/24"]),
        node("n3", &["172.30.3.2"], &["10.244.3.0/24"]),
    ]
}

/// n2 shares n1's segment, n3 is behind a router.
fn facts(mtu: u32) -> Facts {
    Facts {
        underlay_mtu: Some(mtu),
        on_link: [(ip("172.30.1.3"), true), (ip("172.30.3.2"), false)]
            .into_iter()
            .collect(),
    }
}

#[test]
fn auto_routes_on_link_peers_directly_and_the_rest_through_vxlan() {
    let d = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    assert_eq!(d.ranges, vec![net("10.244.1.0/24")]);
    assert!(d.routes.contains(&PeerRoute {
        dst: net("10.244.2.0/24"),
        gateway: ip("172.30.1.3"),
        over_vxlan: false
    }));
    assert!(d.routes.contains(&PeerRoute {
        dst: net("10.244.3.0/24"),
        gateway: ip("10.244.3.0"),
        over_vxlan: true
    }));
    assert_eq!(d.routes.len(), 2);
    let spec = d.vxlan.clone().expect("a VXLAN device for n3");
    assert_eq!(spec.local, ip("172.30.1.2"));
    assert_eq!(spec.mtu, 1450);
    assert_eq!(spec.mac, vxlan_mac("n1"));
    assert_eq!(d.fdb, [(vxlan_mac("n3"), ip("172.30.3.2"))].into_iter().collect());
    assert_eq!(
        d.neighbours,
        [(ip("10.244.3.0"), vxlan_mac("n3"))].into_iter().collect()
    );
    assert_eq!(d.vxlan_addresses, [ip("10.244.1.0")].into_iter().collect());
    let modes: Vec<_> = d.peers.iter().map(|p| (p.name.as_str(), p.mode)).collect();
    assert_eq!(modes, vec![("n2", PeerMode::Direct), ("n3", PeerMode::Vxlan)]);
    assert_eq!(d.pod_mtu, Some(1450), "one peer needs VXLAN");
}

#[test]
fn all_on_link_peers_give_pods_the_full_underlay_mtu() {
    let nodes = &cluster()[..2];
    let d = plan(&cfg(PodRouting::Auto), nodes, &[], &facts(9000));
    assert!(d.vxlan.is_none(), "no device without a VXLAN peer");
    assert_eq!(d.pod_mtu, Some(9000));
    // Alone, a node cannot know yet: it assumes encapsulation.
    let d = plan(&cfg(PodRouting::Auto), &cluster()[..1], &[], &facts(9000));
    assert_eq!(d.pod_mtu, Some(8950));
}

#[test]
fn vxlan_mode_tunnels_even_on_link_peers_and_jumbo_underlays_give_jumbo_pods() {
    let d = plan(&cfg(PodRouting::Vxlan), &cluster(), &[], &facts(9000));
    assert!(d.routes.iter().all(|r| r.over_vxlan));
    assert_eq!(d.routes.len(), 2);
    assert_eq!(d.pod_mtu, Some(8950));
    assert_eq!(d.vxlan.unwrap().mtu, 8950);
}

#[test]
fn an_ipv6_underlay_costs_seventy_bytes() {
    let nodes = vec![
        node("n1", &["fd00:30::2"], &["10.244.1.0/24"]),
        node("n3", &["fd00:31::2"], &["10.244.3.0/24"]),
    ];
    let d = plan(&cfg(PodRouting::Vxlan), &nodes, &[], &facts(1500));
    assert_eq!(d.pod_mtu, Some(1430));
    assert_eq!(d.fdb, [(vxlan_mac("n3"), ip("fd00:31::2"))].into_iter().collect());
}

#[test]
fn direct_mode_refuses_peers_that_are_not_on_link_and_says_why() {
    let d = plan(&cfg(PodRouting::Direct), &cluster(), &[], &facts(1500));
    assert_eq!(d.routes.len(), 1);
    assert!(d.vxlan.is_none());
    let n3 = d.peers.iter().find(|p| p.name == "n3").unwrap();
    assert_eq!(n3.mode, PeerMode::Unreachable);
    assert!(n3.problem.as_deref().unwrap().contains("not on-link"), "{n3:?}");
    assert_eq!(d.pod_mtu, Some(1500));
}

#[test]
fn none_mode_only_reports() {
    let d = plan(&cfg(PodRouting::None), &cluster(), &[], &facts(1500));
    assert!(d.routes.is_empty() && d.vxlan.is_none() && d.fdb.is_empty());
    assert!(d.peers.iter().all(|p| p.mode == PeerMode::None));
    assert!(d.masquerade.is_some(), "masquerade does not depend on routing");
}

#[test]
fn dual_stack_peer_on_an_ipv4_only_segment_is_mixed() {
    let nodes = vec![
        node("n1", &["172.30.1.2"], &["10.244.1.0/24", "fd00:10:244:1::/64"]),
        node("n2", &["172.30.1.3"], &["10.244.2.0/24", "fd00:10:244:2::/64"]),
    ];
    let d = plan(&cfg(PodRouting::Auto), &nodes, &[], &facts(1500));
    assert_eq!(d.peers[0].mode, PeerMode::Mixed, "{:?}", d.peers);
    assert!(d.routes.contains(&PeerRoute {
        dst: net("fd00:10:244:2::/64"),
        gateway: ip("fd00:10:244:2::"),
        over_vxlan: true
    }));
    assert_eq!(
        d.vxlan_addresses,
        [ip("10.244.1.0"), ip("fd00:10:244:1::")].into_iter().collect()
    );
}

#[test]
fn peers_without_ranges_or_overlapping_ours_are_left_out() {
    let nodes = vec![
        node("n1", &["172.30.1.2"], &["10.244.1.0/24"]),
        node("n2", &["172.30.1.3"], &[]),
        node("n4", &["172.30.4.2"], &["10.244.1.0/25"]),
    ];
    let d = plan(&cfg(PodRouting::Auto), &nodes, &[], &facts(1500));
    assert!(d.routes.is_empty());
    assert!(d.peers.iter().all(|p| p.mode == PeerMode::Unreachable));
    assert!(d.peers[1].problem.as_deref().unwrap().contains("overlaps"));
}

#[test]
fn masquerade_sets_cover_every_pod_range_and_the_exceptions() {
    let d = plan(
        &cfg(PodRouting::Auto),
        &cluster(),
        &[net("10.250.0.0/24")],
        &facts(1500),
    );
    let m = d.masquerade.unwrap();
    assert_eq!(m.exceptions, [net("192.0.2.0/24")].into_iter().collect());
    assert!(m.pods.contains(&net("10.250.0.0/24")));
    // 10.244.1.0/24 .. 10.244.3.0/24: aggregated where adjacent, nothing lost.
    for c in ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"] {
        assert!(m.pods.iter().any(|p| p.contains(&net(c))), "{c} in {:?}", m.pods);
    }
    let mut off = cfg(PodRouting::Auto);
    off.masquerade = false;
    assert!(plan(&off, &cluster(), &[], &facts(1500)).masquerade.is_none());
}

#[test]
fn an_unknown_own_address_leaves_vxlan_peers_unreached() {
    let mut nodes = cluster();
    nodes[0].addresses.clear();
    let d = plan(&cfg(PodRouting::Auto), &nodes, &[], &facts(1500));
    assert!(d.vxlan.is_none());
    assert_eq!(d.pod_mtu, None);
    let n3 = d.peers.iter().find(|p| p.name == "n3").unwrap();
    assert_eq!(n3.mode, PeerMode::Unreachable);
}

// --- diff ---

fn observed_after(d: &Desired) -> Observed {
    // What a kernel that applied everything holds.
    Observed {
        routes: d
            .routes
            .iter()
            .map(|r| ObservedRoute {
                dst: r.dst,
                gateway: Some(r.gateway),
                oif: Some(if r.over_vxlan { 7 } else { 2 }),
                unreachable: false,
            })
            .chain(d.unreachable.iter().map(|dst| ObservedRoute {
                dst: *dst,
                gateway: None,
                oif: None,
                unreachable: true,
            }))
            .collect(),
        vxlan: d.vxlan.as_ref().map(|s| ObservedVxlan {
            index: 7,
            vni: Some(s.vni),
            port: Some(s.port),
            local: Some(s.local),
            mac: s.mac.to_vec(),
            mtu: s.mtu,
            up: true,
        }),
        vxlan_addresses: d.vxlan_addresses.iter().copied().collect(),
        fdb: d.fdb.iter().copied().collect(),
        neighbours: d.neighbours.iter().copied().collect(),
        exported: d.exported.iter().copied().collect(),
    }
}

#[test]
fn nothing_to_do_when_the_kernel_holds_the_plan() {
    let d = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    assert_eq!(diff(&d, &observed_after(&d)), vec![]);
}

#[test]
fn from_scratch_the_device_comes_first_and_routes_last() {
    let d = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    let changes = diff(&d, &Observed::default());
    assert!(matches!(changes[0], Change::CreateVxlan(_)), "{changes:?}");
    let last_non_route = changes.iter().rposition(|c| !matches!(c, Change::AddRoute(_))).unwrap();
    let first_route = changes.iter().position(|c| matches!(c, Change::AddRoute(_))).unwrap();
    assert!(last_non_route < first_route, "{changes:?}");
    assert_eq!(changes.iter().filter(|c| matches!(c, Change::AddRoute(_))).count(), 2);
}

#[test]
fn a_readdressed_peer_moves_its_fdb_entry_and_keeps_the_rest() {
    let before = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    let mut nodes = cluster();
    nodes[2].addresses = vec![ip("172.30.9.2")];
    let after = plan(&cfg(PodRouting::Auto), &nodes, &[], &facts(1500));
    let changes = diff(&after, &observed_after(&before));
    assert_eq!(
        changes,
        vec![
            Change::DeleteFdb(vxlan_mac("n3"), ip("172.30.3.2")),
            Change::AddFdb(vxlan_mac("n3"), ip("172.30.9.2")),
        ]
    );
}

#[test]
fn a_removed_peer_takes_its_route_neighbour_fdb_and_finally_the_device() {
    let before = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    let after = plan(&cfg(PodRouting::Auto), &cluster()[..2], &[], &facts(1500));
    let changes = diff(&after, &observed_after(&before));
    assert_eq!(
        changes,
        vec![
            Change::DeleteRoute(ObservedRoute {
                dst: net("10.244.3.0/24"),
                gateway: Some(ip("10.244.3.0")),
                oif: Some(7),
                unreachable: false,
            }),
            Change::DeleteNeighbour(ip("10.244.3.0")),
            Change::DeleteFdb(vxlan_mac("n3"), ip("172.30.3.2")),
            Change::DeleteAddress(ip("10.244.1.0")),
            Change::DeleteVxlan,
        ]
    );
}

#[test]
fn a_changed_pod_cidr_replaces_the_route() {
    let before = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    let mut nodes = cluster();
    nodes[1].pod_cidrs = vec![net("10.244.22.0/24")];
    let after = plan(&cfg(PodRouting::Auto), &nodes, &[], &facts(1500));
    let changes = diff(&after, &observed_after(&before));
    assert_eq!(
        changes,
        vec![
            Change::DeleteRoute(ObservedRoute {
                dst: net("10.244.2.0/24"),
                gateway: Some(ip("172.30.1.3")),
                oif: Some(2),
                unreachable: false,
            }),
            Change::AddRoute(PeerRoute {
                dst: net("10.244.22.0/24"),
                gateway: ip("172.30.1.3"),
                over_vxlan: false
            }),
        ]
    );
}

#[test]
fn drift_is_put_back_and_a_device_with_other_parameters_is_rebuilt_whole() {
    let d = plan(&cfg(PodRouting::Auto), &cluster(), &[], &facts(1500));
    let mut o = observed_after(&d);
    o.fdb.clear();
    o.neighbours.clear();
    o.vxlan.as_mut().unwrap().up = false;
    let changes = diff(&d, &o);
    assert_eq!(
        changes,
        vec![
            Change::SetVxlanUp,
            Change::AddFdb(vxlan_mac("n3"), ip("172.30.3.2")),
            Change::AddNeighbour(ip("10.244.3.0"), vxlan_mac("n3")),
        ]
    );
    let mut o = observed_after(&d);
    o.vxlan.as_mut().unwrap().vni = Some(99);
    let changes = diff(&d, &o);
    assert_eq!(changes[0], Change::DeleteVxlan);
    assert!(matches!(changes[1], Change::CreateVxlan(_)));
    assert!(changes.contains(&Change::AddFdb(vxlan_mac("n3"), ip("172.30.3.2"))));
    assert!(
        !changes.iter().any(|c| matches!(c, Change::DeleteRoute(_))),
        "the direct route survives: {changes:?}"
    );
    assert_eq!(changes.iter().filter(|c| matches!(c, Change::AddRoute(_))).count(), 1);
}

/// Every range this node serves, from its Node and from network configs, is answered
/// on the node in every routing mode; a range that stops being ours loses its route;
/// a rebuilt VXLAN device leaves them alone.
#[test]
fn own_ranges_get_unreachable_routes_that_follow_them() {
    let local = [net("10.123.0.0/24"), net("fd00:124::/64")];
    for routing in [
        PodRouting::Auto,
        PodRouting::Direct,
        PodRouting::Vxlan,
        PodRouting::None,
    ] {
        let d = plan(&cfg(routing), &cluster(), &local, &facts(1500));
        let want: std::collections::BTreeSet<IpNet> =
            [net("10.244.1.0/24"), net("10.123.0.0/24"), net("fd00:124::/64")].into();
        assert_eq!(d.unreachable, want, "{routing:?}");
        let changes = diff(&d, &Observed::default());
        for r in &want {
            assert!(changes.contains(&Change::AddUnreachable(*r)), "{changes:?}");
        }
    }
    let before = plan(&cfg(PodRouting::Auto), &cluster(), &local, &facts(1500));
    let after = plan(&cfg(PodRouting::Auto), &cluster(), &local[..1], &facts(1500));
    assert_eq!(
        diff(&after, &observed_after(&before)),
        vec![Change::DeleteRoute(ObservedRoute {
            dst: net("fd00:124::/64"),
            gateway: None,
            oif: None,
            unreachable: true,
        })]
    );
    let mut o = observed_after(&before);
    o.vxlan.as_mut().unwrap().vni = Some(99);
    let changes = diff(&before, &o);
    assert!(
        !changes.iter().any(|c| matches!(
            c,
            Change::AddUnreachable(_) | Change::DeleteRoute(ObservedRoute { unreachable: true, .. })
        )),
        "{changes:?}"
    );
}

#[test]
fn vxlan_macs_are_stable_unicast_and_local() {
    assert_eq!(vxlan_mac("n1"), vxlan_mac("n1"));
    assert_ne!(vxlan_mac("n1"), vxlan_mac("n2"));
    let m = vxlan_mac("node-a");
    assert_eq!(m[0] & 0x01, 0, "unicast");
    assert_eq!(m[0] & 0x02, 0x02, "locally administered");
}

// --- export ---

#[test]
fn export_is_this_nodes_podcidrs_only_and_follows_them() {
    let export = RouteExport::new(119, 75).unwrap();
    let mut c = cfg(PodRouting::None);
    c.export = Some(export);
    let config_range = net("10.250.0.0/24");
    let d = plan(&c, &cluster(), &[config_range], &facts(1500));
    // Not a network config's own range, not the peers' ranges.
    assert_eq!(d.exported, BTreeSet::from([net("10.244.1.0/24")]));
    // With `none`, no route of weft's to another node.
    assert!(d.routes.is_empty());
    assert_eq!(
        diff(&d, &Observed::default())
            .into_iter()
            .filter(|ch| matches!(ch, Change::Export(..) | Change::Withdraw(..)))
            .collect::<Vec<_>>(),
        vec![Change::Export(net("10.244.1.0/24"), export)]
    );
    assert_eq!(diff(&d, &observed_after(&d)), vec![]);

    // The range moves: the old one is withdrawn, the new one exported.
    let mut moved = cluster();
    moved[0].pod_cidrs = vec![net("10.244.9.0/24")];
    let d2 = plan(&c, &moved, &[], &facts(1500));
    let changes: Vec<Change> = diff(&d2, &observed_after(&d))
        .into_iter()
        .filter(|ch| matches!(ch, Change::Export(..) | Change::Withdraw(..)))
        .collect();
    assert_eq!(
        changes,
        vec![
            Change::Withdraw(net("10.244.1.0/24"), export),
            Change::Export(net("10.244.9.0/24"), export)
        ]
    );
    // Off: nothing exported, nothing read there, nothing withdrawn.
    let off = plan(&cfg(PodRouting::None), &cluster(), &[], &facts(1500));
    assert!(off.exported.is_empty());
    let mut found = observed_after(&off);
    found.exported = vec![net("10.244.1.0/24")];
    assert!(!diff(&off, &found).iter().any(|ch| matches!(ch, Change::Withdraw(..))));
}

#[test]
fn export_refuses_the_kernels_tables_and_protocols() {
    for table in [0, 253, 254, 255] {
        assert!(RouteExport::new(table, 75).is_err(), "table {table}");
    }
    for proto in [0, 1, 2, 3] {
        let e = RouteExport::new(119, proto).unwrap_err();
        assert!(e.contains("--export-protocol"), "{e}");
    }
    assert_eq!(
        RouteExport::new(119, 30),
        Ok(RouteExport {
            table: 119,
            protocol: 30
        })
    );
    assert!(RouteExport::new(1000, 75).is_ok());
}
