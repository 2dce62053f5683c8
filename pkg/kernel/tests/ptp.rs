//! The ptp driver against the real kernel: a node namespace and pod namespaces per test.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use weft_kernel::ptp::{self, PodAddress, PodNetwork, PodRoute, RouteRequest};
use weft_kernel::testutil::{TempNetns, privileged};
use weft_kernel::{Drift, KernelError, Netlink};

fn pod(ns: &TempNetns, host: &str, addrs: &[(&str, &str)]) -> PodNetwork {
    PodNetwork {
        netns: ns.path().to_path_buf(),
        ifname: "eth0".into(),
        host_ifname: host.into(),
        host_mac: [0x02, 0, 0, 0, 0, 1],
        pod_mac: [0x02, 0, 0, 0, 0, 2],
        mtu: 1400,
        addresses: addrs
            .iter()
            .map(|(a, g)| PodAddress {
                address: a.parse().unwrap(),
                gateway: g.parse().unwrap(),
            })
            .collect(),
        alias: "weft:test/eth0".into(),
    }
}

/// Sets `spec` up as a pod's only network does and returns what it installed.
fn setup(node: &TempNetns, spec: &PodNetwork) -> Vec<PodRoute> {
    node.run(|| spec.setup_routes(&RouteRequest::default_route())).unwrap()
}

fn route(dst: &str, prefix_len: u8, gateway: &str) -> PodRoute {
    PodRoute {
        dst: dst.parse().unwrap(),
        prefix_len,
        gateway: gateway.parse().unwrap(),
    }
}

/// The pod's main-table routes of one family as (dst, prefix, gateway, interface name).
fn pod_routes(p: &TempNetns, v6: bool) -> Vec<(Option<IpAddr>, u8, Option<IpAddr>, String)> {
    p.run(|| {
        let mut nl = Netlink::new().unwrap();
        let links = nl.links().unwrap();
        nl.routes(v6)
            .unwrap()
            .into_iter()
            .filter(|r| !(v6 && r.dst.is_some_and(|d| d.to_string().starts_with("fe80"))))
            .map(|r| {
                let dev = links
                    .iter()
                    .find(|l| Some(l.index) == r.oif)
                    .map_or(String::new(), |l| l.name.clone());
                (r.dst, r.prefix_len, r.gateway, dev)
            })
            .collect()
    })
}

fn defaults(p: &TempNetns, v6: bool) -> Vec<(Option<IpAddr>, String)> {
    pod_routes(p, v6)
        .into_iter()
        .filter(|r| r.1 == 0)
        .map(|r| (r.2, r.3))
        .collect()
}

/// Accepts one TCP connection in `ns` on `addr` and echoes a byte, while the node side
/// (the calling namespace thread) connects to it.
fn tcp_reachable(pod_ns: &TempNetns, node_ns: &TempNetns, addr: IpAddr) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            pod_ns.run(|| {
                let l = TcpListener::bind(SocketAddr::new(addr, 0)).unwrap();
                tx.send(l.local_addr().unwrap()).unwrap();
                l.set_nonblocking(false).unwrap();
                if let Ok((mut c, _)) = l.accept() {
                    let mut b = [0u8; 1];
                    let _ = c.read_exact(&mut b);
                    let _ = c.write_all(&b);
                }
            })
        });
        let target = rx.recv().unwrap();
        node_ns.run(|| {
            let Ok(mut c) = TcpStream::connect_timeout(&target, Duration::from_secs(3)) else {
                // unblock the listener
                return false;
            };
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            c.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).is_ok() && b == *b"x"
        })
    })
}

#[test]
fn dual_stack_pod_is_built_checked_and_reachable() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    let spec = pod(&p, "weftt1", &[("10.9.0.5", "10.9.0.1"), ("fd09::5", "fd09::1")]);
    let routes = setup(&node, &spec);
    assert_eq!(
        routes,
        vec![route("0.0.0.0", 0, "10.9.0.1"), route("::", 0, "fd09::1")],
        "a pod's only network installs the default route of each family"
    );
    node.run(|| spec.check(&routes)).unwrap();

    // Inside the pod: eth0 with the MAC, MTU and both addresses, lo up.
    let (eth, addrs, lo_up) = p.run(|| {
        let mut nl = Netlink::new().unwrap();
        let eth = nl.link_by_name("eth0").unwrap().unwrap();
        let addrs = nl.addresses(eth.index).unwrap();
        let lo = nl.link_by_name("lo").unwrap().unwrap();
        (eth, addrs, lo.up)
    });
    assert!(eth.up && lo_up);
    assert_eq!(eth.mtu, 1400);
    assert_eq!(eth.mac, vec![0x02, 0, 0, 0, 0, 2]);
    assert!(addrs.contains(&("10.9.0.5".parse().unwrap(), 32)));
    assert!(addrs.contains(&("fd09::5".parse().unwrap(), 128)));

    // From the node, both addresses answer.
    assert!(
        tcp_reachable(&p, &node, "10.9.0.5".parse().unwrap()),
        "IPv4 unreachable"
    );
    assert!(tcp_reachable(&p, &node, "fd09::5".parse().unwrap()), "IPv6 unreachable");

    // Removal takes the pair, addresses and routes; repeating it is harmless.
    assert!(node.run(|| ptp::remove("weftt1")).unwrap());
    assert!(!node.run(|| ptp::remove("weftt1")).unwrap());
    let left = p.run(|| Netlink::new().unwrap().link_by_name("eth0").unwrap());
    assert!(left.is_none());
}

#[test]
fn two_pods_reach_each_other_through_the_node() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let a = TempNetns::new();
    let b = TempNetns::new();
    let sa = pod(&a, "weftta", &[("10.9.0.2", "10.9.0.1")]);
    let mut sb = pod(&b, "wefttb", &[("10.9.0.3", "10.9.0.1")]);
    sb.host_mac = [0x02, 0, 0, 0, 1, 1];
    node.run(|| sa.setup()).unwrap();
    node.run(|| sb.setup()).unwrap();
    assert!(tcp_reachable(&b, &a, "10.9.0.3".parse().unwrap()));
}

/// The host end of an IPv4-only pod has IPv6 off (otherwise each one adds routes the
/// kernel walks at every veth event on the node); a dual-stack pod's keeps it.
#[test]
fn ipv6_is_off_on_the_host_end_of_an_ipv4_pod() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let (a, b) = (TempNetns::new(), TempNetns::new());
    let v4 = pod(&a, "weftt6a", &[("10.9.6.2", "10.9.6.1")]);
    let mut dual = pod(&b, "weftt6b", &[("10.9.6.3", "10.9.6.1"), ("fd09:6::3", "fd09:6::1")]);
    dual.host_mac = [0x02, 0, 0, 0, 1, 1];
    let v4_routes = setup(&node, &v4);
    let dual_routes = setup(&node, &dual);
    let ipv6_off = |ifname: &str| {
        let key = format!("net/ipv6/conf/{ifname}/disable_ipv6");
        node.run(move || weft_kernel::sysctl::read(&key)).unwrap()
    };
    assert_eq!(ipv6_off("weftt6a"), "1");
    assert_eq!(ipv6_off("weftt6b"), "0");
    node.run(|| v4.check(&v4_routes)).unwrap();
    node.run(|| dual.check(&dual_routes)).unwrap();
    assert!(tcp_reachable(&a, &node, "10.9.6.2".parse().unwrap()));
    assert!(tcp_reachable(&b, &node, "fd09:6::3".parse().unwrap()));
}

#[test]
fn check_reports_missing_routes_and_interfaces() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    let spec = pod(&p, "weftt2", &[("10.9.1.5", "10.9.1.1")]);
    let routes = setup(&node, &spec);

    // Drop the pod's default route.
    p.run(|| {
        let mut nl = Netlink::new().unwrap();
        let eth = nl.link_by_name("eth0").unwrap().unwrap();
        assert!(nl.delete_route(None, 0, eth.index, false).unwrap());
    });
    match node.run(|| spec.check(&routes)) {
        Err(KernelError::Drift(d)) => {
            assert_eq!(
                d,
                Drift::DefaultRouteMissing {
                    gateway: "10.9.1.1".parse().unwrap(),
                    ifname: "eth0".into()
                }
            );
            assert_eq!(
                d.to_string(),
                "default route via 10.9.1.1 dev eth0 is missing in the pod"
            );
        }
        other => panic!("expected drift, got {other:?}"),
    }

    // Drop the host route instead (after rebuilding).
    node.run(|| ptp::remove("weftt2")).unwrap();
    setup(&node, &spec);
    node.run(|| {
        let mut nl = Netlink::new().unwrap();
        let h = nl.link_by_name("weftt2").unwrap().unwrap();
        assert!(
            nl.delete_route(Some("10.9.1.5".parse().unwrap()), 32, h.index, false)
                .unwrap()
        );
    });
    match node.run(|| spec.check(&routes)) {
        Err(KernelError::Drift(d)) => assert_eq!(
            d,
            Drift::HostRouteMissing {
                address: "10.9.1.5".parse().unwrap(),
                ifname: "weftt2".into()
            }
        ),
        other => panic!("expected drift, got {other:?}"),
    }

    node.run(|| ptp::remove("weftt2")).unwrap();
    match node.run(|| spec.check(&routes)) {
        Err(KernelError::Drift(d)) => assert_eq!(
            d,
            Drift::HostInterfaceMissing {
                ifname: "weftt2".into()
            }
        ),
        other => panic!("expected drift, got {other:?}"),
    }
}

#[test]
fn an_existing_pod_interface_is_refused_and_nothing_is_left() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    let first = pod(&p, "weftt3", &[("10.9.2.5", "10.9.2.1")]);
    node.run(|| first.setup()).unwrap();
    let mut second = pod(&p, "weftt4", &[("10.9.2.6", "10.9.2.1")]);
    second.host_mac = [0x02, 0, 0, 0, 2, 1];
    match node.run(|| second.setup()) {
        Err(KernelError::InterfaceExists { ifname }) => assert_eq!(ifname, "eth0"),
        other => panic!("expected InterfaceExists, got {other:?}"),
    }
    let leftover = node.run(|| Netlink::new().unwrap().link_by_name("weftt4").unwrap());
    assert!(leftover.is_none());
}

#[test]
fn a_stale_host_end_is_replaced() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let old = TempNetns::new();
    let p = TempNetns::new();
    node.run(|| pod(&old, "weftt5", &[("10.9.3.5", "10.9.3.1")]).setup())
        .unwrap();
    let spec = pod(&p, "weftt5", &[("10.9.3.6", "10.9.3.1")]);
    let routes = setup(&node, &spec);
    node.run(|| spec.check(&routes)).unwrap();
}

#[test]
fn disconnect_cuts_traffic_before_removal() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    let spec = pod(&p, "weftt6", &[("10.9.4.5", "10.9.4.1")]);
    node.run(|| spec.setup()).unwrap();
    assert!(node.run(|| ptp::disconnect("weftt6")).unwrap());
    let routes = node.run(|| Netlink::new().unwrap().routes(false).unwrap());
    assert!(
        !routes.iter().any(|r| r.dst == Some("10.9.4.5".parse().unwrap())),
        "route withdrawn"
    );
    assert!(node.run(|| ptp::remove("weftt6")).unwrap());
    assert!(!node.run(|| ptp::disconnect("weftt6")).unwrap());
}

#[test]
fn namespace_paths_are_validated() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let mut spec = pod(&node, "weftt7", &[("10.9.5.5", "10.9.5.1")]);
    spec.netns = "/nonexistent/netns".into();
    assert!(matches!(
        node.run(|| spec.setup()),
        Err(KernelError::InvalidNetns { .. })
    ));
    spec.netns = "/etc/hostname".into();
    match node.run(|| spec.setup()) {
        Err(KernelError::InvalidNetns { reason, .. }) => {
            assert!(reason.contains("not a namespace"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    spec.netns = "/proc/self/ns/uts".into();
    match node.run(|| spec.setup()) {
        Err(KernelError::InvalidNetns { reason, .. }) => {
            assert!(reason.contains("not a network namespace"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let links = node.run(|| Netlink::new().unwrap().links().unwrap());
    assert!(links.iter().all(|l| l.name == "lo"), "nothing created: {links:?}");
}

/// A second network in the same pod (`net1`, as Multus and podman attach them): before,
/// it failed with "File exists" adding a second default route. Now it installs only
/// what it is asked for, the pod keeps one default route per family (the first
/// network's), and each attachment checks, repairs and removes only its own.
#[test]
fn a_second_network_in_a_pod_leaves_the_default_route_to_the_first() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let p = TempNetns::new();
    let first = pod(&p, "weftt8a", &[("10.9.8.5", "10.9.8.1"), ("fd09:8::5", "fd09:8::1")]);
    let mut second = pod(&p, "weftt8b", &[("10.9.9.5", "10.9.9.1"), ("fd09:9::5", "fd09:9::1")]);
    second.ifname = "net1".into();
    second.host_mac = [0x02, 0, 0, 0, 8, 1];
    second.pod_mac = [0x02, 0, 0, 0, 8, 2];
    let first_routes = setup(&node, &first);
    let extra = route("10.99.0.0", 16, "10.9.9.1");
    let second_routes = node
        .run(|| {
            second.setup_routes(&RouteRequest {
                routes: vec![extra],
                default_unless_present: true,
            })
        })
        .unwrap();
    assert_eq!(second_routes, vec![extra], "no default route: the pod has them");
    let gw = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    assert_eq!(defaults(&p, false), vec![(gw("10.9.8.1"), "eth0".to_string())]);
    assert_eq!(defaults(&p, true), vec![(gw("fd09:8::1"), "eth0".to_string())]);
    assert!(
        pod_routes(&p, false).contains(&(gw("10.99.0.0"), 16, gw("10.9.9.1"), "net1".into())),
        "{:?}",
        pod_routes(&p, false)
    );
    node.run(|| first.check(&first_routes)).unwrap();
    node.run(|| second.check(&second_routes)).unwrap();
    assert!(tcp_reachable(&p, &node, "10.9.9.5".parse().unwrap()), "net1 over IPv4");
    assert!(tcp_reachable(&p, &node, "fd09:9::5".parse().unwrap()), "net1 over IPv6");

    // Repair restores exactly what each installed: the second gets its route back and
    // no default route.
    p.run(|| {
        let mut nl = Netlink::new().unwrap();
        let net1 = nl.link_by_name("net1").unwrap().unwrap();
        assert!(
            nl.delete_route(Some("10.99.0.0".parse().unwrap()), 16, net1.index, false)
                .unwrap()
        );
    });
    match node.run(|| second.check(&second_routes)) {
        Err(KernelError::Drift(d)) => {
            assert!(
                matches!(&d, Drift::RouteMissing { route, ifname } if route.prefix_len == 16 && ifname == "net1"),
                "{d:?}"
            );
            assert_eq!(
                d.to_string(),
                "route 10.99.0.0/16 via 10.9.9.1 dev net1 is missing in the pod"
            );
        }
        other => panic!("expected drift, got {other:?}"),
    }
    assert_eq!(node.run(|| second.repair(&second_routes)).unwrap(), vec!["route"]);
    assert!(node.run(|| second.repair(&second_routes)).unwrap().is_empty());
    assert!(node.run(|| first.repair(&first_routes)).unwrap().is_empty());
    assert_eq!(defaults(&p, false).len(), 1);

    // Removing the first leaves the second whole.
    assert!(node.run(|| ptp::remove("weftt8a")).unwrap());
    node.run(|| second.check(&second_routes)).unwrap();
    assert!(tcp_reachable(&p, &node, "10.9.9.5".parse().unwrap()));
}

/// A route the pod has already is refused as a conflict (the daemon answers code 108),
/// and nothing of the refused attachment is left.
#[test]
fn a_route_the_pod_has_already_is_a_conflict_and_nothing_is_left() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    let first = pod(&p, "weftt9a", &[("10.9.12.5", "10.9.12.1")]);
    setup(&node, &first);
    let mut second = pod(&p, "weftt9b", &[("10.9.13.5", "10.9.13.1")]);
    second.ifname = "net1".into();
    second.host_mac = [0x02, 0, 0, 0, 9, 1];
    let explicit_default = RouteRequest {
        routes: vec![PodRoute::default_via("10.9.13.1".parse().unwrap())],
        default_unless_present: false,
    };
    match node.run(|| second.setup_routes(&explicit_default)) {
        Err(e) => {
            assert!(ptp::is_route_conflict(&e), "{e:?}");
            assert!(e.to_string().contains("0.0.0.0/0 via 10.9.13.1 dev net1"), "{e}");
        }
        Ok(r) => panic!("a second default route was installed: {r:?}"),
    }
    assert!(
        node.run(|| Netlink::new().unwrap().link_by_name("weftt9b").unwrap())
            .is_none()
    );
    assert!(
        p.run(|| Netlink::new().unwrap().link_by_name("net1").unwrap())
            .is_none()
    );
    assert_eq!(defaults(&p, false).len(), 1);
    // Other kernel failures are not conflicts.
    let other = KernelError::os(
        "adding the pod address",
        std::io::Error::from_raw_os_error(libc::EEXIST),
    );
    assert!(!ptp::is_route_conflict(&other));

    // Asked for no default route at all, a pod's only network installs none.
    let lone = TempNetns::new();
    let spec = pod(&lone, "weftt9c", &[("10.9.14.5", "10.9.14.1")]);
    let none = RouteRequest {
        routes: Vec::new(),
        default_unless_present: false,
    };
    assert!(node.run(|| spec.setup_routes(&none)).unwrap().is_empty());
    assert!(defaults(&lone, false).is_empty());
    node.run(|| spec.check(&[])).unwrap();
}

/// The addresses of `ifname` in `ns` (none when it is missing).
fn addresses_of(ns: &TempNetns, ifname: &str) -> Vec<IpAddr> {
    ns.run(|| {
        let mut nl = Netlink::new().unwrap();
        match nl.link_by_name(ifname).unwrap() {
            Some(l) => nl.addresses(l.index).unwrap().into_iter().map(|(a, _)| a).collect(),
            None => Vec::new(),
        }
    })
}

/// The pod's permanent neighbour entries on eth0.
fn pod_neighbours(p: &TempNetns) -> Vec<(IpAddr, [u8; 6])> {
    p.run(|| {
        let mut nl = Netlink::new().unwrap();
        let eth = nl.link_by_name("eth0").unwrap().unwrap();
        nl.permanent_neighbours(eth.index).unwrap()
    })
}

fn drift_of(r: Result<(), KernelError>) -> Drift {
    match r {
        Err(KernelError::Drift(d)) => d,
        other => panic!("expected drift, got {other:?}"),
    }
}

#[test]
fn the_ipv4_gateway_is_held_once_per_node_and_found_through_a_neighbour_entry() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let (a, b) = (TempNetns::new(), TempNetns::new());
    let gw: IpAddr = "10.9.7.1".parse().unwrap();
    let spec_a = pod(&a, "weftg1", &[("10.9.7.2", "10.9.7.1")]);
    let mut spec_b = pod(&b, "weftg2", &[("10.9.7.3", "10.9.7.1")]);
    spec_b.host_mac = [0x02, 0, 0, 0, 0, 3];
    let routes_a = setup(&node, &spec_a);
    let routes_b = setup(&node, &spec_b);

    // The gateway device holds the gateway once; the host ends hold no IPv4 address.
    assert_eq!(addresses_of(&node, ptp::GATEWAY_DEVICE), vec![gw]);
    for host in ["weftg1", "weftg2"] {
        assert!(
            addresses_of(&node, host).iter().all(|a| !a.is_ipv4()),
            "{host} holds an IPv4 address"
        );
    }
    // Each pod finds the gateway at its own host end's MAC, and the host's route to
    // it answers from the gateway.
    assert_eq!(pod_neighbours(&a), vec![(gw, spec_a.host_mac)]);
    assert_eq!(pod_neighbours(&b), vec![(gw, spec_b.host_mac)]);
    let sources: Vec<Option<IpAddr>> = node.run(|| {
        let mut nl = Netlink::new().unwrap();
        nl.routes(false)
            .unwrap()
            .into_iter()
            .filter(|r| r.prefix_len == 32 && r.dst.is_some_and(|d| d.to_string().starts_with("10.9.7.")))
            .map(|r| r.prefsrc)
            .collect()
    });
    assert_eq!(sources, vec![Some(gw), Some(gw)]);
    node.run(|| spec_a.check(&routes_a)).unwrap();
    node.run(|| spec_b.check(&routes_b)).unwrap();
    // The node reaches the pod (from the gateway), the pod the gateway.
    assert!(tcp_reachable(&a, &node, "10.9.7.2".parse().unwrap()));
    assert!(tcp_reachable(&node, &a, gw));

    // The pod's neighbour entry gone: reported, then put back.
    a.run(|| {
        let mut nl = Netlink::new().unwrap();
        let eth = nl.link_by_name("eth0").unwrap().unwrap();
        assert!(nl.delete_neighbour(eth.index, gw).unwrap());
    });
    let d = drift_of(node.run(|| spec_a.check(&routes_a)));
    assert_eq!(
        d,
        Drift::GatewayNeighbourMissing {
            gateway: gw,
            ifname: "eth0".into()
        }
    );
    assert_eq!(
        d.to_string(),
        "neighbour entry of gateway 10.9.7.1 dev eth0 is missing in the pod"
    );
    assert_eq!(node.run(|| spec_a.repair(&routes_a)).unwrap(), vec!["neighbour"]);
    node.run(|| spec_a.check(&routes_a)).unwrap();

    // The gateway device gone (and with its address, the host routes that answer
    // from it): reported on it, and made again with the gateway and the routes.
    assert!(
        node.run(|| Netlink::new().unwrap().delete_link(ptp::GATEWAY_DEVICE))
            .unwrap()
    );
    assert_eq!(
        drift_of(node.run(|| spec_b.check(&routes_b))),
        Drift::GatewayMissing {
            gateway: gw,
            ifname: ptp::GATEWAY_DEVICE.into()
        }
    );
    assert_eq!(node.run(|| spec_b.repair(&routes_b)).unwrap(), vec!["address", "route"]);
    assert_eq!(node.run(|| spec_a.repair(&routes_a)).unwrap(), vec!["route"]);
    node.run(|| spec_a.check(&routes_a)).unwrap();
    assert!(tcp_reachable(&b, &node, "10.9.7.3".parse().unwrap()));

    // Removing a pod leaves the gateway to the other.
    node.run(|| ptp::remove("weftg1")).unwrap();
    node.run(|| spec_b.check(&routes_b)).unwrap();
    assert!(tcp_reachable(&node, &b, gw));

    // A release keeps the gateways in use and lets go of the others; the device goes
    // with the last.
    let other: IpAddr = "10.9.6.1".parse().unwrap();
    node.run(|| {
        let mut nl = Netlink::new().unwrap();
        let holder = nl.link_by_name(ptp::GATEWAY_DEVICE).unwrap().unwrap();
        nl.add_address(holder.index, other, 32).unwrap();
    });
    assert_eq!(node.run(|| ptp::release_gateways(&[gw])).unwrap(), vec![other]);
    assert_eq!(addresses_of(&node, ptp::GATEWAY_DEVICE), vec![gw]);
    node.run(|| spec_b.check(&routes_b)).unwrap();
    node.run(|| ptp::remove("weftg2")).unwrap();
    assert_eq!(node.run(|| ptp::release_gateways(&[])).unwrap(), vec![gw]);
    let links: Vec<String> = node.run(|| {
        Netlink::new()
            .unwrap()
            .links()
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect()
    });
    assert_eq!(links, ["lo"], "the node holds nothing of weft's");
    assert!(node.run(|| ptp::release_gateways(&[])).unwrap().is_empty());
}

#[test]
fn a_pod_built_with_its_gateway_on_the_host_end_is_repaired_into_the_node_held_form() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    let gw: IpAddr = "10.9.8.1".parse().unwrap();
    let spec = pod(&p, "weftg3", &[("10.9.8.2", "10.9.8.1")]);
    let routes = setup(&node, &spec);
    // What an older weftd left: the gateway on the host end, the host route without a
    // source, no neighbour entry in the pod, no gateway device. (Deleting the device
    // takes the route that answers from its address with it.)
    node.run(|| {
        let mut nl = Netlink::new().unwrap();
        assert!(nl.delete_link(ptp::GATEWAY_DEVICE).unwrap());
        let h = nl.link_by_name("weftg3").unwrap().unwrap();
        nl.add_address(h.index, gw, 32).unwrap();
        nl.add_route(Some("10.9.8.2".parse().unwrap()), 32, None, h.index, false)
            .unwrap();
    });
    p.run(|| {
        let mut nl = Netlink::new().unwrap();
        let eth = nl.link_by_name("eth0").unwrap().unwrap();
        assert!(nl.delete_neighbour(eth.index, gw).unwrap());
    });
    assert!(
        tcp_reachable(&p, &node, "10.9.8.2".parse().unwrap()),
        "the old form works"
    );
    // Rebuilding the state from the kernel finds the gateway either way.
    let ends = node.run(weft_kernel::hostends::host_ends).unwrap();
    assert_eq!(
        ends.iter().map(|e| e.gateways.clone()).collect::<Vec<_>>(),
        vec![vec![gw]]
    );

    assert!(matches!(
        drift_of(node.run(|| spec.check(&routes))),
        Drift::GatewayMissing { .. }
    ));
    assert_eq!(node.run(|| spec.repair(&routes)).unwrap(), vec!["address", "neighbour"]);
    node.run(|| spec.check(&routes)).unwrap();
    assert_eq!(addresses_of(&node, ptp::GATEWAY_DEVICE), vec![gw]);
    assert_eq!(pod_neighbours(&p), vec![(gw, spec.host_mac)]);
    assert!(tcp_reachable(&p, &node, "10.9.8.2".parse().unwrap()));
    assert!(tcp_reachable(&node, &p, gw));
}
