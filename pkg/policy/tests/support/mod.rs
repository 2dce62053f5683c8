//! What the root tests of the policy table share: pods as network namespaces wired to
//! a node namespace by weft's own point-to-point set-up, servers that answer on the
//! ports a test asks for, and probes that say whether a connection got through.

#![allow(dead_code)]

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use weft_kernel::ptp::{PodAddress, PodNetwork};
use weft_kernel::testutil::TempNetns;
use weft_policy::{ClusterView, NftKernel, PolicyKernel, nft, plan};
use weft_topology::PortProtocol;

/// A pod (or an address outside the cluster) of a test: its namespace, address and
/// host interface.
pub struct Host {
    /// Its network namespace.
    pub ns: TempNetns,
    /// Its address.
    pub ip: IpAddr,
    /// `namespace/name`, or `None` for an address outside the cluster.
    pub pod: Option<(String, String)>,
    /// The node side of its veth.
    pub host_ifname: String,
}

/// A host wired to `node` as weft wires a pod (`ip` behind gateway `gw`).
pub fn host(node: &TempNetns, i: u8, ip: &str, gw: &str, pod: Option<(&str, &str)>) -> Host {
    let ns = TempNetns::new();
    let host_ifname = format!("wpol{i}");
    let net = PodNetwork {
        netns: ns.path().to_path_buf(),
        ifname: "eth0".into(),
        host_ifname: host_ifname.clone(),
        host_mac: [2, 0, 0, 0, 1, i],
        pod_mac: [2, 0, 0, 0, 2, i],
        mtu: 1500,
        addresses: vec![PodAddress {
            address: ip.parse().unwrap(),
            gateway: gw.parse().unwrap(),
        }],
        alias: format!("weft:test-{i}"),
    };
    node.run(|| net.setup()).unwrap();
    Host {
        ns,
        ip: ip.parse().unwrap(),
        pod: pod.map(|(a, b)| (a.to_string(), b.to_string())),
        host_ifname,
    }
}

/// Servers in `h` on `ports` (TCP: accept and write; UDP: echo) until `stop`.
pub fn serve(h: &Host, ports: &[(PortProtocol, u16)], stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    ports
        .iter()
        .map(|(proto, port)| {
            let stop = stop.clone();
            match proto {
                PortProtocol::Udp => {
                    let s = h.ns.run(|| UdpSocket::bind(("0.0.0.0", *port)).unwrap());
                    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 64];
                        while !stop.load(Ordering::Relaxed) {
                            if let Ok((n, from)) = s.recv_from(&mut buf) {
                                let _ = s.send_to(&buf[..n], from);
                            }
                        }
                    })
                }
                PortProtocol::Tcp | PortProtocol::Sctp => {
                    let l = h.ns.run(|| TcpListener::bind(("0.0.0.0", *port)).unwrap());
                    l.set_nonblocking(true).unwrap();
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            match l.accept() {
                                Ok((mut c, _)) => {
                                    let _ = c.write_all(b"ok");
                                }
                                Err(_) => std::thread::sleep(Duration::from_millis(5)),
                            }
                        }
                    })
                }
            }
        })
        .collect()
}

/// Whether a new connection from `src` to `dst` on `port`/`proto` gets through (a UDP
/// one: whether its echo comes back).
pub fn reaches(src: &Host, dst: IpAddr, proto: PortProtocol, port: u16) -> bool {
    let target = SocketAddr::new(dst, port);
    src.ns.run(|| match proto {
        PortProtocol::Udp => {
            // A source port no probe of this process used before: a flow an earlier
            // probe left in conntrack (a port open under the last policy) must not let
            // this one in as established, as a reused ephemeral port would.
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let sport = 20_000 + (n % 40_000) as u16;
            let s = UdpSocket::bind(("0.0.0.0", sport)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
            s.send_to(b"ping", target).unwrap();
            let mut buf = [0u8; 16];
            s.recv(&mut buf).is_ok()
        }
        PortProtocol::Tcp | PortProtocol::Sctp => {
            TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_ok()
        }
    })
}

/// Programs the node for `v` from whatever its kernel holds; returns the script.
pub fn program(node: &TempNetns, v: &ClusterView) -> Option<String> {
    let d = plan(v);
    node.run(|| {
        let mut k = NftKernel::default();
        let observed = k.observe().unwrap();
        let script = nft::diff(&d, &observed);
        if let Some(s) = &script {
            k.apply(s).unwrap_or_else(|e| panic!("{e}\n{s}"));
        }
        script
    })
}
