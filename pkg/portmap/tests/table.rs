//! The table and its elements in throw-away namespaces, with real connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use weft_kernel::ptp::{PodAddress, PodNetwork};
use weft_kernel::testutil::{TempNetns, privileged};
use weft_portmap::{Entries, Hairpin, HostPort, Options, Protocol};

fn pod(ns: &TempNetns) -> PodNetwork {
    PodNetwork {
        netns: ns.path().to_path_buf(),
        ifname: "eth0".into(),
        host_ifname: "weftpm0".into(),
        host_mac: [2, 0, 0, 0, 0, 1],
        pod_mac: [2, 0, 0, 0, 0, 2],
        mtu: 1500,
        addresses: vec![PodAddress {
            address: "10.9.0.5".parse().unwrap(),
            gateway: "10.9.0.1".parse().unwrap(),
        }],
        alias: "weft:test".into(),
    }
}

fn mapping(host: Option<&str>, port: u16) -> HostPort {
    HostPort {
        host_ip: host.map(|h| h.parse().unwrap()),
        host_port: port,
        protocol: Protocol::Tcp,
        container_ip: "10.9.0.5".parse().unwrap(),
        container_port: 8080,
    }
}

fn ports(list: &[&HostPort]) -> Entries {
    Entries {
        ports: list.iter().map(|m| (*m).clone()).collect(),
        hairpins: Vec::new(),
    }
}

/// Connects from the node to `target` while the pod serves one connection on 8080.
fn reaches_pod(node: &TempNetns, p: &TempNetns, target: &str) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            p.run(|| {
                let l = TcpListener::bind("0.0.0.0:8080").unwrap();
                l.set_nonblocking(true).unwrap();
                tx.send(()).unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(3);
                while std::time::Instant::now() < deadline {
                    if let Ok((mut c, _)) = l.accept() {
                        let _ = c.write_all(b"pod");
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        });
        rx.recv().unwrap();
        let target: SocketAddr = target.parse().unwrap();
        node.run(|| {
            let Ok(mut c) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                return false;
            };
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut b = [0u8; 3];
            c.read_exact(&mut b).is_ok() && &b == b"pod"
        })
    })
}

#[test]
fn elements_steer_connections_and_the_table_is_checked() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    node.run(|| pod(&p).setup()).unwrap();
    let opts = Options::default();
    node.run(|| weft_portmap::install(&Entries::default(), opts)).unwrap();
    assert!(node.run(|| weft_portmap::matches(&Entries::default(), opts)).unwrap());
    assert!(!reaches_pod(&node, &p, "10.9.0.1:18080"), "no mapping, no connection");

    let any = mapping(None, 18080);
    let specific = mapping(Some("10.9.0.1"), 18081);
    node.run(|| weft_portmap::add(&ports(&[&any, &specific]))).unwrap();
    node.run(|| weft_portmap::add(&ports(&[&any]))).unwrap(); // adding again is fine
    assert!(
        node.run(|| weft_portmap::matches(&ports(&[&any, &specific]), opts))
            .unwrap()
    );
    assert!(
        !node.run(|| weft_portmap::matches(&ports(&[&any]), opts)).unwrap(),
        "an extra element is drift"
    );
    assert!(reaches_pod(&node, &p, "10.9.0.1:18080"), "wildcard mapping");
    assert!(reaches_pod(&node, &p, "10.9.0.1:18081"), "host-IP mapping");

    node.run(|| weft_portmap::remove(&ports(&[&any]))).unwrap();
    node.run(|| weft_portmap::remove(&ports(&[&any, &specific]))).unwrap(); // one already gone
    assert!(node.run(|| weft_portmap::matches(&Entries::default(), opts)).unwrap());
    assert!(!reaches_pod(&node, &p, "10.9.0.1:18080"), "removed mapping");

    // Someone flushes the table: it no longer matches, and install brings it back.
    let st = node
        .run(|| {
            std::process::Command::new("nft")
                .args(["flush", "table", "inet", "weft"])
                .status()
        })
        .unwrap();
    assert!(st.success());
    assert!(!node.run(|| weft_portmap::matches(&ports(&[&specific]), opts)).unwrap());
    node.run(|| weft_portmap::install(&ports(&[&specific]), opts)).unwrap();
    assert!(node.run(|| weft_portmap::matches(&ports(&[&specific]), opts)).unwrap());
    assert!(reaches_pod(&node, &p, "10.9.0.1:18081"));
}

/// The pod connects to `target` (a host port mapped to itself) and serves itself.
fn pod_reaches_itself(p: &TempNetns, target: &str) -> bool {
    let target: SocketAddr = target.parse().unwrap();
    p.run(|| {
        let l = TcpListener::bind("0.0.0.0:8080").unwrap();
        l.set_nonblocking(true).unwrap();
        let Ok(mut c) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
            return false;
        };
        let Ok((mut served, _)) = l.accept() else { return false };
        let _ = served.write_all(b"pod");
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut b = [0u8; 3];
        c.read_exact(&mut b).is_ok() && &b == b"pod"
    })
}

#[test]
fn a_pod_reaches_its_own_host_port_through_hairpin_masquerade() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let p = TempNetns::new();
    node.run(|| pod(&p).setup()).unwrap();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let opts = Options::default();
    let m = mapping(None, 18080);
    node.run(|| weft_portmap::install(&ports(&[&m]), opts)).unwrap();
    assert!(
        !pod_reaches_itself(&p, "10.9.0.1:18080"),
        "without hairpin masquerade the reply never comes back"
    );
    let hairpin = Entries {
        ports: Vec::new(),
        hairpins: vec![Hairpin {
            ifname: "weftpm0".into(),
            addr: "10.9.0.5".parse().unwrap(),
        }],
    };
    node.run(|| weft_portmap::add(&hairpin)).unwrap();
    assert!(
        pod_reaches_itself(&p, "10.9.0.1:18080"),
        "hairpin through the node's address"
    );
    let all = Entries {
        ports: vec![m.clone()],
        hairpins: hairpin.hairpins.clone(),
    };
    assert!(node.run(|| weft_portmap::matches(&all, opts)).unwrap());
    node.run(|| weft_portmap::remove(&hairpin)).unwrap();
    assert!(node.run(|| weft_portmap::matches(&ports(&[&m]), opts)).unwrap());
}
