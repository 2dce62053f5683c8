//! A probe's trace against the real kernel: a "pod" namespace wired by a veth to a
//! "node" namespace that drops TCP port 81; the node's watch sees an echo request
//! answered, a SYN to 81 dropped by the rule that did it, and its marking table goes.

use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use weft_kernel::testutil::{TempNetns, privileged};
use weft_kernel::trace::{Probe, Watch, send_probe};
use weft_kernel::{NetNs, Netlink, NewLink, VethPair, nft};

const POD: &str = "10.77.0.2";
const NODE: &str = "10.77.0.1";

/// The node's `t-node` and the pod's `eth0`, addressed and up; the node drops TCP 81
/// on input.
fn wired() -> (TempNetns, TempNetns) {
    let node = TempNetns::new();
    let pod = TempNetns::new();
    let pod_fd = NetNs::open(pod.path()).unwrap();
    node.run(|| {
        let mut nl = Netlink::new().unwrap();
        nl.create_veth(&VethPair {
            local: NewLink {
                name: "t-node",
                mac: [0x02, 0, 0, 0, 0x77, 1],
                netns: None,
            },
            peer: NewLink {
                name: "eth0",
                mac: [0x02, 0, 0, 0, 0x77, 2],
                netns: Some(pod_fd.raw_fd()),
            },
            mtu: 1500,
            alias: None,
        })
        .unwrap();
        let l = nl.link_by_name("t-node").unwrap().unwrap();
        nl.add_address(l.index, NODE.parse().unwrap(), 24).unwrap();
        nl.set_up(l.index, true).unwrap();
        let lo = nl.link_by_name("lo").unwrap().unwrap();
        nl.set_up(lo.index, true).unwrap();
        nft::run(
            &["-f", "-"],
            Some("table inet t {\n chain input {\n  type filter hook input priority 0;\n  tcp dport 81 counter drop\n }\n}\n"),
        )
        .unwrap();
    });
    pod.run(|| {
        let mut nl = Netlink::new().unwrap();
        let l = nl.link_by_name("eth0").unwrap().unwrap();
        nl.add_address(l.index, POD.parse().unwrap(), 24).unwrap();
        nl.set_up(l.index, true).unwrap();
    });
    (node, pod)
}

#[test]
fn a_node_sees_an_echo_answered_and_a_syn_dropped_by_its_rule() {
    if !privileged() {
        return;
    }
    let (node, pod) = wired();
    let pod_ns = NetNs::open(pod.path()).unwrap();
    let (src, dst): (IpAddr, IpAddr) = (POD.parse().unwrap(), NODE.parse().unwrap());

    // An echo: answered, its hop in on the node's veth, delivered locally.
    let watch = node.run(|| Watch::start("weft-trace-test", src, dst, Probe::Icmp).unwrap());
    let answered = send_probe(&pod_ns, dst, Probe::Icmp).unwrap();
    assert_eq!(answered, Some(true), "the node answers the ping");
    assert!(watch.wait_seen(Duration::from_secs(2)), "the node traced it");
    std::thread::sleep(Duration::from_millis(200));
    let hop = node.run(move || watch.finish()).expect("a hop");
    assert_eq!(hop.iif, "t-node", "{hop:#?}");
    assert_eq!(hop.dropped_at, None, "{hop:#?}");
    assert_eq!(hop.route, format!("local {NODE}"), "{hop:#?}");
    assert!(
        hop.steps.iter().all(|s| s.table != "inet weft-trace-test"),
        "the marking table's own steps are left out: {hop:#?}"
    );

    // A SYN to 81: not answered, dropped by the input rule; to a listening port 80,
    // answered and passed.
    let listener = node.run(|| TcpListener::bind((NODE, 80)).unwrap());
    let watch = node.run(|| Watch::start("weft-trace-test", src, dst, Probe::Tcp(81)).unwrap());
    assert_eq!(send_probe(&pod_ns, dst, Probe::Tcp(81)).unwrap(), Some(false));
    let hop = node.run(move || watch.finish()).expect("a hop");
    let dropped = &hop.steps[hop.dropped_at.expect("dropped")];
    assert_eq!(
        (dropped.table.as_str(), dropped.chain.as_str(), dropped.verdict.as_str()),
        ("inet t", "input", "drop"),
        "{hop:#?}"
    );
    assert!(dropped.rule.contains("tcp dport 81"), "{hop:#?}");
    let watch = node.run(|| Watch::start("weft-trace-test", src, dst, Probe::Tcp(80)).unwrap());
    assert_eq!(send_probe(&pod_ns, dst, Probe::Tcp(80)).unwrap(), Some(true));
    std::thread::sleep(Duration::from_millis(200));
    let hop = node.run(move || watch.finish()).expect("a hop");
    assert_eq!(hop.dropped_at, None, "{hop:#?}");
    drop(listener);

    // A probe that goes elsewhere is not this watch's; the table is gone after.
    let watch = node.run(|| Watch::start("weft-trace-test", src, dst, Probe::Udp(53)).unwrap());
    assert_eq!(send_probe(&pod_ns, dst, Probe::Udp(54)).unwrap(), None);
    std::thread::sleep(Duration::from_millis(300));
    assert!(node.run(move || watch.finish()).is_none(), "port 54 is not the probe");
    let tables = node.run(|| nft::run(&["list", "tables"], None).unwrap());
    assert!(!tables.contains("weft-trace-test"), "{tables}");
}

#[test]
fn a_watch_dropped_unfinished_removes_its_table() {
    if !privileged() {
        return;
    }
    let (node, _pod) = wired();
    let tables = node.run(|| {
        let w = Watch::start(
            "weft-trace-drop",
            POD.parse().unwrap(),
            NODE.parse().unwrap(),
            Probe::Icmp,
        )
        .unwrap();
        let during = nft::run(&["list", "tables"], None).unwrap();
        drop(w);
        (during, nft::run(&["list", "tables"], None).unwrap())
    });
    assert!(tables.0.contains("weft-trace-drop"), "armed: {}", tables.0);
    assert!(!tables.1.contains("weft-trace-drop"), "gone: {}", tables.1);
}
