//! Cluster networking in the lab: pods reach pods on other nodes over `eth0` without
//! NAT (through VXLAN on a routed underlay, by direct routes on a shared segment, IPv4
//! and IPv6 on both), other nodes, and the outside only through masquerade; the other nodes'
//! kernels follow a node that is readdressed or removed within 2 s; drift is repaired
//! and counted; a 9000-byte underlay gives pods 8950 and an 8,900-byte packet crosses
//! nodes with DF set.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_lab::Lab;
use weft_tests::{
    LabDown, Prometheus, TempDir, bin, dashboard_queries, failed_checks, is_node_network_row, privileged,
};

/// A lab named after the test with `body` as its file, and the directory holding its
/// state. Bind them as `let (dir, lab) = ...`: locals drop in reverse order, so the lab
/// is taken down (its daemons found through their pid files) before the directory with
/// those files is removed.
fn lab(tag: &str, body: &str) -> (TempDir, LabDown) {
    let dir = TempDir::new(tag);
    let name = format!("wt{}{tag}", std::process::id());
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, format!("name: {name}\n{body}")).unwrap();
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(dir.path().join("state"));
    (dir, LabDown(lab))
}

fn in_ns(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn try_in_ns(ns: &str, args: &[&str]) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn fdb(lab: &Lab, node: &str) -> Vec<(String, String)> {
    let text = in_ns(
        &lab.node_ns(node),
        &["bridge", "-j", "fdb", "show", "dev", "weft-vxlan"],
    );
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Array(vec![]));
    let mut out: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["dst"].is_string())
        .map(|e| {
            (
                e["mac"].as_str().unwrap().to_string(),
                e["dst"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// weft's routes to other nodes' pod ranges (protocol 75, the unreachable routes of
/// the node's own ranges left out), both families.
fn routes(lab: &Lab, node: &str) -> Vec<String> {
    let mut out = Vec::new();
    for family in ["-4", "-6"] {
        let text = in_ns(
            &lab.node_ns(node),
            &["ip", "-j", family, "route", "show", "proto", "75"],
        );
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Array(vec![]));
        out.extend(
            v.as_array()
                .unwrap()
                .iter()
                .filter(|r| r["type"] != "unreachable")
                .map(|r| r["dst"].as_str().unwrap_or_default().to_string()),
        );
    }
    out.sort();
    out
}

/// Waits until `f` holds, at most `limit`; returns how long it took.
fn within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

const NODES: &str = "nodes: [n1, n2, n3]\npods:\n  - {name: a1, node: n1}\n  - {name: a2, node: n1}\n  - {name: b1, node: n2}\n  - {name: c1, node: n3}\n";

#[test]
fn routed_underlay_pods_reach_across_nodes_through_vxlan() {
    let _area = weft_tests::area("cluster::cluster");
    if !privileged() {
        return;
    }
    let (dir, lab) = lab(
        "cr",
        &format!("{NODES}underlay: routed\nunderlay_mtu: 9000\nipv6: true\n"),
    );
    let lab = &lab.0;
    lab.up().expect("lab up");
    let checks = lab.check_network(Duration::from_secs(10));
    assert!(failed_checks(&checks).is_empty(), "{:?}", failed_checks(&checks));
    let eth0: Vec<_> = checks.iter().filter(|c| c.kind == "eth0").collect();
    // a1, a2 -> b1, c1; b1 -> a1, a2, c1; c1 -> a1, a2, b1: 10 pairs, both families.
    assert_eq!(eth0.len(), 20, "{checks:?}");
    assert_eq!(checks.iter().filter(|c| c.kind == "outside").count(), 4);
    assert_eq!(checks.iter().filter(|c| c.kind == "node").count(), 8);

    // Nodes in different subnets: VXLAN, routes through weft's device, no NAT between
    // pods (c1 sees a1's own address).
    assert_eq!(
        weft_tests::lab_metric(lab, "n1", "weft_node_peers{mode=\"vxlan\"}"),
        2.0
    );
    assert_eq!(
        routes(lab, "n1"),
        vec![
            "10.244.2.0/24",
            "10.244.3.0/24",
            "fd00:10:244:2::/64",
            "fd00:10:244:3::/64"
        ]
    );
    let a1 = lab.pod_addresses("a1")[0];
    let c1 = lab.pod_addresses("c1")[0];
    let sock = udp_in(&lab.pod_ns("c1"));
    in_ns(
        &lab.pod_ns("a1"),
        &["bash", "-c", &format!("echo hello > /dev/udp/{c1}/7777")],
    );
    let mut buf = [0u8; 64];
    let (n, from) = sock.recv_from(&mut buf).expect("a datagram from a1");
    assert_eq!(&buf[..n], b"hello\n");
    assert_eq!(from.ip(), a1, "pod to pod across nodes is not NATed");

    // MTU: 9000 underlay, VXLAN: pods get 8950, and 8,900-byte packets cross with DF.
    let mtu = in_ns(&lab.pod_ns("a1"), &["cat", "/sys/class/net/eth0/mtu"]);
    assert_eq!(mtu.trim(), "8950");
    let c1 = c1.to_string();
    in_ns(
        &lab.pod_ns("a1"),
        &["ping", "-c1", "-W2", "-M", "do", "-s", "8872", &c1],
    );

    // n3 readdressed: it answers on a second address, its Node object says so; n1 and
    // n2 move their FDB entries within 2 s, and pods still reach c1.
    in_ns(
        &lab.node_ns("n3"),
        &["ip", "addr", "add", "172.30.3.3/24", "dev", "uplink"],
    );
    let mut nodes = lab.node_objects();
    nodes[2].addresses = vec!["172.30.3.3".parse().unwrap()];
    let start = Instant::now();
    lab.publish_nodes(&nodes).unwrap();
    for n in ["n1", "n2"] {
        within(
            &format!("{n} follows n3's new address"),
            Duration::from_secs(2) - start.elapsed(),
            || {
                fdb(lab, n).iter().any(|(_, dst)| dst == "172.30.3.3")
                    && !fdb(lab, n).iter().any(|(_, dst)| dst == "172.30.3.2")
            },
        );
    }
    let took = start.elapsed();
    eprintln!("Node readdressed -> every other node's FDB in step: {took:?}");
    in_ns(&lab.pod_ns("a1"), &["ping", "-c1", "-W2", &c1]);

    // n2 removed: its routes leave n1 and n3 within 2 s.
    let start = Instant::now();
    lab.publish_nodes(&[nodes[0].clone(), nodes[2].clone()]).unwrap();
    for n in ["n1", "n3"] {
        within(
            &format!("{n} drops n2's routes"),
            Duration::from_secs(2) - start.elapsed(),
            || {
                !routes(lab, n)
                    .iter()
                    .any(|r| r.starts_with("10.244.2.") || r.starts_with("fd00:10:244:2:"))
            },
        );
    }
    eprintln!(
        "Node removed -> every other node's routes in step: {:?}",
        start.elapsed()
    );
    lab.publish_nodes(&lab.node_objects()).unwrap();
    within("n2 back", Duration::from_secs(2), || routes(lab, "n1").len() == 4);

    // Drift on n1: a route, the FDB entries and the neighbour entries deleted, and the
    // masquerade table. The outside cannot answer pods without masquerade; the next
    // reconcile pass (the lab's interval is 10 s) repairs all of it and counts it.
    in_ns(&lab.node_ns("n1"), &["ip", "route", "del", "10.244.3.0/24"]);
    in_ns(
        &lab.node_ns("n1"),
        &["ip", "neigh", "flush", "dev", "weft-vxlan", "nud", "permanent"],
    );
    for (mac, dst) in fdb(lab, "n1") {
        in_ns(
            &lab.node_ns("n1"),
            &["bridge", "fdb", "del", &mac, "dev", "weft-vxlan", "dst", &dst],
        );
    }
    assert!(fdb(lab, "n1").is_empty());
    in_ns(&lab.node_ns("n1"), &["nft", "delete", "table", "inet", "weft-egress"]);
    assert!(
        !try_in_ns(&lab.pod_ns("a1"), &["ping", "-c1", "-W1", weft_lab::OUTSIDE_ADDRESS]),
        "the outside answered a pod without masquerade"
    );
    within("n1 repaired", Duration::from_secs(15), || {
        routes(lab, "n1").contains(&"10.244.3.0/24".to_string())
            && weft_tests::lab_metric(lab, "n1", "weft_reconcile_repairs_total{kind=\"masquerade\"}") >= 1.0
    });
    assert!(weft_tests::lab_metric(lab, "n1", "weft_reconcile_repairs_total{kind=\"node_route\"}") >= 1.0);
    assert!(weft_tests::lab_metric(lab, "n1", "weft_reconcile_repairs_total{kind=\"node_neighbour\"}") >= 1.0);
    assert!(weft_tests::lab_metric(lab, "n1", "weft_reconcile_repairs_total{kind=\"node_fdb\"}") >= 1.0);
    assert_eq!(fdb(lab, "n1").len(), 2, "both peers' FDB entries are back");
    let again = lab.check_network(Duration::from_secs(5));
    assert!(
        failed_checks(&again).is_empty(),
        "after the repair: {:?}",
        failed_checks(&again)
    );

    // The dashboard's pod network row, in a real Prometheus scraping n1: every panel
    // query returns a series.
    let prom = Prometheus::start(
        &lab.node_ns("n1"),
        &dir.path().join("prom"),
        19092,
        &[("127.0.0.1:9384", "n1")],
        None,
    );
    prom.wait_for("count_over_time(weft_node_peers[1m]) >= 2", Duration::from_secs(30));
    let queries: Vec<_> = dashboard_queries("weft.json")
        .into_iter()
        .filter(|q| is_node_network_row(&q.row))
        .collect();
    assert!(queries.len() >= 6, "only {} pod network panel queries", queries.len());
    for q in &queries {
        assert!(
            !prom.query(&q.expr).is_empty(),
            "panel {:?} returns nothing: {}",
            q.title,
            q.expr
        );
    }
}

#[test]
fn shared_segment_pods_reach_across_nodes_by_direct_routes() {
    let _area = weft_tests::area("cluster::cluster");
    if !privileged() {
        return;
    }
    // Dual-stack: on a shared segment the nodes have IPv6 underlay addresses too, so
    // IPv6 pod ranges are routed directly as well.
    let (dir, lab) = lab("cs", &format!("{NODES}underlay: shared\nipv6: true\n"));
    let lab = &lab.0;
    lab.up().expect("lab up");
    // What an operator sees: `weftctl status` on n1.
    let socket = dir.path().join("state/nodes/n1/weftd.sock");
    let out = std::process::Command::new(bin("weftctl"))
        .args(["--socket", socket.to_str().unwrap(), "--json", "status"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = &st["node_network"];
    assert_eq!(n["routing"], "auto", "{st}");
    assert_eq!(
        n["pod_cidrs"],
        serde_json::json!(["10.244.1.0/24", "fd00:10:244:1::/64"])
    );
    assert_eq!(n["pod_mtu"], 1500);
    assert_eq!(n["address"], "172.30.0.2");
    assert_eq!(
        n["peers"],
        serde_json::json!([{"name": "n2", "mode": "direct"}, {"name": "n3", "mode": "direct"}])
    );
    let checks = lab.check_network(Duration::from_secs(10));
    assert!(failed_checks(&checks).is_empty(), "{:?}", failed_checks(&checks));
    // 10 pairs of pods on different nodes, both families.
    assert_eq!(checks.iter().filter(|c| c.kind == "eth0").count(), 20);
    assert_eq!(
        checks
            .iter()
            .filter(|c| c.kind == "eth0" && c.to.contains("fd00:10:244:"))
            .count(),
        10
    );
    assert_eq!(
        weft_tests::lab_metric(lab, "n1", "weft_node_peers{mode=\"direct\"}"),
        2.0
    );
    let route = in_ns(&lab.node_ns("n1"), &["ip", "route", "show", "10.244.3.0/24"]);
    assert!(route.contains("via 172.30.0.4 dev uplink"), "{route}");
    let route6 = in_ns(&lab.node_ns("n1"), &["ip", "-6", "route", "show", "fd00:10:244:3::/64"]);
    assert!(route6.contains("via fd00:172:30::4 dev uplink"), "{route6}");
    assert!(
        !try_in_ns(&lab.node_ns("n1"), &["ip", "link", "show", "weft-vxlan"]),
        "no VXLAN device without a VXLAN peer"
    );
    // No encapsulation: pods get the underlay's MTU.
    let mtu = in_ns(&lab.pod_ns("a1"), &["cat", "/sys/class/net/eth0/mtu"]);
    assert_eq!(mtu.trim(), "1500");
}

/// A UDP socket bound to port 7777 inside a named namespace (it keeps that namespace).
fn udp_in(ns: &str) -> std::net::UdpSocket {
    let s = weft_harness::NamedNetns::existing(ns)
        .within(|| std::net::UdpSocket::bind("0.0.0.0:7777"))
        .unwrap()
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}
