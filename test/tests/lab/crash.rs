//! gRPC wires through a daemon crash: nine gRPC wires between the pods of two nodes (all
//! multiplexed on the one frame stream between the nodes), each carrying UDP datagrams
//! tagged with the wire they were sent on and a sequence number, in both directions,
//! while node 2's daemon is SIGKILLed and restarted. A raw packet socket on every wire
//! end sees every frame that arrives there. Afterwards every link passes again within
//! 2 s of the restart, traffic flows again on every wire, not one frame arrived on a
//! wire other than its own, the wires' frame counters went on from where they were,
//! and the node's wire-state mirror was written again from the store.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weft_harness::NamedNetns;
use weft_lab::Lab;
use weft_tests::{LabDown, TempDir, bin, failed_checks, privileged};

/// Marks a test datagram; followed by the wire tag (u32) and the sequence number (u64).
const MAGIC: &[u8; 8] = b"WEFTSEQ1";
const PORT: u16 = 7777;

/// One end of a wire as this test's traffic sees it: the pod, its interface and
/// address, the peer's address, and the tag its datagrams carry (the same for both
/// directions of a wire).
#[derive(Clone, Debug)]
struct TrafficEnd {
    pod: String,
    intf: String,
    local: Ipv4Addr,
    peer: Ipv4Addr,
    tag: u32,
}

/// A raw packet socket receiving every frame that arrives on `intf` (not those sent).
fn packet_socket(intf: &str) -> OwnedFd {
    let index = nix::net::if_::if_nametoindex(intf).unwrap_or_else(|e| panic!("{intf}: {e}"));
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket calls on a descriptor owned right away.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as i32);
        assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        let rc = libc::bind(
            fd.as_raw_fd(),
            &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(rc, 0, "binding to {intf}: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as u32,
        );
        fd
    }
}

/// The tag and sequence number of a tagged datagram in an Ethernet frame, if it is one.
fn tagged(frame: &[u8]) -> Option<(u32, u64)> {
    if frame.len() < 14 + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[9] != 17 || ip.len() < ihl + 8 + 20 {
        return None;
    }
    let payload = &ip[ihl + 8..];
    if &payload[..8] != MAGIC {
        return None;
    }
    let tag = u32::from_be_bytes(payload[8..12].try_into().ok()?);
    let seq = u64::from_be_bytes(payload[12..20].try_into().ok()?);
    Some((tag, seq))
}

/// What one wire end received.
#[derive(Debug, Default)]
struct Received {
    /// Tagged frames with this wire's tag.
    own: u64,
    /// Tagged frames with another wire's tag: must stay 0.
    foreign: Vec<u32>,
    /// Frames whose sequence number was not above the last one seen (reordered or
    /// duplicated), reported but not fatal.
    out_of_order: u64,
    /// When the last own frame arrived.
    last: Option<Instant>,
}

/// Sends tagged datagrams from an end to its peer every few milliseconds until `stop`.
fn sender(ns: String, end: TrafficEnd, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    // Made inside the pod's namespace, the socket stays there.
    let socket = NamedNetns::existing(&ns)
        .within(|| UdpSocket::bind(SocketAddrV4::new(end.local, 0)))
        .expect("inside the pod")
        .expect("bind");
    std::thread::spawn(move || {
        let mut seq = 0u64;
        let mut msg = [0u8; 20];
        msg[..8].copy_from_slice(MAGIC);
        msg[8..12].copy_from_slice(&end.tag.to_be_bytes());
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            msg[12..20].copy_from_slice(&seq.to_be_bytes());
            // Fails while the peer's address cannot be resolved (the wire is down).
            let _ = socket.send_to(&msg, SocketAddrV4::new(end.peer, PORT));
            std::thread::sleep(Duration::from_millis(5));
        }
        seq
    })
}

/// Counts the tagged frames arriving on an end until `stop`.
fn receiver(ns: String, end: TrafficEnd, stop: Arc<AtomicBool>) -> JoinHandle<Received> {
    let intf = end.intf.clone();
    let fd = NamedNetns::existing(&ns)
        .within(|| packet_socket(&intf))
        .expect("inside the pod");
    std::thread::spawn(move || {
        let mut got = Received::default();
        let mut last_seq = 0u64;
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: reading into a buffer we own; the address is a sockaddr_ll.
            let (n, pkttype) = unsafe {
                let mut from: libc::sockaddr_ll = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                let n = libc::recvfrom(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                    &mut from as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                    &mut len,
                );
                (n, from.sll_pkttype)
            };
            if n <= 0 || pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let Some((tag, seq)) = tagged(&buf[..n as usize]) else {
                continue;
            };
            if tag != end.tag {
                got.foreign.push(tag);
                continue;
            }
            got.own += 1;
            got.last = Some(Instant::now());
            if seq <= last_seq {
                got.out_of_order += 1;
            }
            last_seq = seq;
        }
        got
    })
}

/// `weft_wire_frames_total` per (pod, intf, direction) on a node.
fn frame_counters(lab: &Lab, node: &str) -> BTreeMap<(String, String, String), f64> {
    let page = weft_tests::node_metrics(lab, node);
    let label = |s: &str, k: &str| {
        s.split(&format!("{k}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_string()
    };
    page.lines()
        .filter(|l| l.starts_with("weft_wire_frames_total{") && l.contains("kind=\"grpc\""))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((
                (label(series, "pod"), label(series, "intf"), label(series, "direction")),
                value.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn grpc_wires_carry_tagged_traffic_through_a_daemon_crash_without_crossing() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("labcrash");
    let name = format!("wt{}lc", std::process::id());
    // a1..a3 on n1, b1..b3 on n2; every a wired to every b: a<i>:e<j> <-> b<j>:e<i>.
    let mut ends: Vec<TrafficEnd> = Vec::new();
    let mut per_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 1..=3u8 {
        for j in 1..=3u8 {
            let k = (i - 1) * 3 + j;
            let (pa, pb) = (format!("a{i}"), format!("b{j}"));
            let (ia, ib) = (Ipv4Addr::new(10, 9, k, 1), Ipv4Addr::new(10, 9, k, 2));
            let tag = 1000 + u32::from(k);
            let link = |peer: &str, local: String, remote: String, l: Ipv4Addr, p: Ipv4Addr| {
                format!(
                    "{{uid: {k}, peer_pod: {peer}, local_intf: {local}, peer_intf: {remote}, local_ip: {l}/30, peer_ip: {p}/30}}"
                )
            };
            per_pod
                .entry(pa.clone())
                .or_default()
                .push(link(&pb, format!("e{j}"), format!("e{i}"), ia, ib));
            per_pod
                .entry(pb.clone())
                .or_default()
                .push(link(&pa, format!("e{i}"), format!("e{j}"), ib, ia));
            ends.push(TrafficEnd {
                pod: pa.clone(),
                intf: format!("e{j}"),
                local: ia,
                peer: ib,
                tag,
            });
            ends.push(TrafficEnd {
                pod: pb,
                intf: format!("e{i}"),
                local: ib,
                peer: ia,
                tag,
            });
        }
    }
    let topologies: String = per_pod
        .iter()
        .map(|(pod, links)| {
            format!(
                "  - {{apiVersion: networkop.co.uk/v1beta1, kind: Topology, metadata: {{name: {pod}, namespace: lc}}, spec: {{links: [{}]}}}}\n",
                links.join(", ")
            )
        })
        .collect();
    let pods: String = per_pod
        .keys()
        .map(|p| {
            format!(
                "  - {{name: {p}, node: {}}}\n",
                if p.starts_with('a') { "n1" } else { "n2" }
            )
        })
        .collect();
    let spec = format!("name: {name}\ninter_node_link: grpc\nnodes: [n1, n2]\npods:\n{pods}topologies:\n{topologies}");
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let lab = LabDown(
        Lab::load(&file)
            .unwrap()
            .with_binaries(bin("weftd"), bin("weft"))
            .with_state_dir(dir.path().join("state")),
    );
    lab.0.up().expect("lab up");
    let checks = lab.0.check(Duration::from_secs(5));
    assert_eq!(checks.len(), 18, "9 links, both directions");
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after up: {:?}",
        failed_checks(&checks)
    );
    assert!(checks.iter().all(|c| c.kind == "grpc"), "not all gRPC: {checks:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let receivers: Vec<_> = ends
        .iter()
        .map(|e| receiver(lab.0.pod_ns(&e.pod), e.clone(), stop.clone()))
        .collect();
    let senders: Vec<_> = ends
        .iter()
        .map(|e| sender(lab.0.pod_ns(&e.pod), e.clone(), stop.clone()))
        .collect();

    std::thread::sleep(Duration::from_secs(1));
    let before = frame_counters(&lab.0, "n2");
    assert_eq!(before.len(), 18, "9 gRPC ends on n2, two directions each: {before:?}");
    lab.0.crash("n2").unwrap();
    // The node's wire-state mirror is lost while its daemon is away: the restart must
    // write it again from the store, though no wire changed.
    let mirror = lab.0.topology_dir().join(".wires/n2.json");
    std::fs::remove_file(&mirror).unwrap_or_else(|e| panic!("{}: {e}", mirror.display()));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(lab.0.up().unwrap(), vec!["n2".to_string()]);
    let restarted = Instant::now();
    // Read at once, before much traffic: counters started again from zero would be
    // below what they were before the crash.
    let just_after = frame_counters(&lab.0, "n2");
    let after = lab.0.check(Duration::from_secs(2));
    assert!(
        failed_checks(&after).is_empty(),
        "links not back within 2 s of the restart: {:?}",
        failed_checks(&after)
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let sent: u64 = senders.into_iter().map(|h| h.join().unwrap()).sum();
    let got: Vec<(TrafficEnd, Received)> = ends
        .iter()
        .cloned()
        .zip(receivers.into_iter().map(|h| h.join().unwrap()))
        .collect();

    let total: u64 = got.iter().map(|(_, r)| r.own).sum();
    eprintln!(
        "{sent} datagrams sent, {total} arrived on their own wire, {} out of order",
        got.iter().map(|(_, r)| r.out_of_order).sum::<u64>()
    );
    for (end, r) in &got {
        assert!(
            r.foreign.is_empty(),
            "{}:{} (tag {}) received frames of other wires: {:?}",
            end.pod,
            end.intf,
            end.tag,
            r.foreign
        );
        assert!(
            r.last.is_some_and(|t| t > restarted),
            "{}:{} received nothing after the restart ({} before)",
            end.pod,
            end.intf,
            r.own
        );
    }

    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&mirror).expect("the wire-state mirror rewritten"))
            .expect("wire-state JSON");
    assert_eq!(
        state["status"]["wires"].as_array().map(Vec::len),
        Some(9),
        "n2's mirrored wire state: {state}"
    );

    // The restarted daemon's counters go on from the kernel's, not from zero.
    for (key, was) in &before {
        let now = just_after.get(key).copied().unwrap_or(0.0);
        assert!(
            now >= *was,
            "{key:?}: weft_wire_frames_total went from {was} back to {now}"
        );
    }
    lab.0.down().unwrap();
}
