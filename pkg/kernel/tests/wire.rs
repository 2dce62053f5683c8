//! Wire ends against the real kernel: veth between pods, VXLAN across routed "nodes"
//! with unicast FDB entries only, and the veth ends of gRPC wires read through packet
//! sockets.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use weft_kernel::testutil::{TempNetns, privileged};
use weft_kernel::{NetNs, in_netns, packet, wire};

fn ns(t: &TempNetns) -> NetNs {
    NetNs::open(t.path()).unwrap()
}

/// Runs `ip args` inside the namespace and returns what it printed.
fn ip(t: &TempNetns, args: &[&str]) -> String {
    let net = format!("--net={}", t.path().display());
    let out = Command::new("nsenter").arg(net).arg("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tcp_echo(server: &TempNetns, client: &TempNetns, addr: &str) -> bool {
    let addr: SocketAddr = addr.parse().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            server.run(|| {
                let l = TcpListener::bind(addr).unwrap();
                // Polled, so a client that never gets through cannot hang the test.
                l.set_nonblocking(true).unwrap();
                tx.send(()).unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(4);
                while std::time::Instant::now() < deadline {
                    match l.accept() {
                        Ok((mut c, _)) => {
                            c.set_nonblocking(false).unwrap();
                            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                            let mut b = [0u8; 4];
                            if c.read_exact(&mut b).is_ok() {
                                let _ = c.write_all(&b);
                            }
                            return;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        });
        rx.recv().unwrap();
        client.run(|| {
            let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) else {
                return false;
            };
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            c.write_all(b"wire").unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).is_ok() && &b == b"wire"
        })
    })
}

/// Joins pods `a` (`e1`, `<net>.0.0.1/24`) and `b` (`e2`, `<net>.0.0.2/24`) with a veth
/// pair made from `node`, both ends configured and up.
fn joined(node: &TempNetns, a: &TempNetns, b: &TempNetns, net: &str) {
    node.run(|| {
        wire::veth_between(
            wire::PodEnd {
                pod: &ns(a),
                name: "e1",
                mac: [2, 0, 0, 0, 1, 1],
            },
            wire::PodEnd {
                pod: &ns(b),
                name: "e2",
                mac: [2, 0, 0, 0, 2, 1],
            },
            1500,
        )
    })
    .unwrap();
    for (t, name, mac, host) in [(a, "e1", [2, 0, 0, 0, 1, 1], 1), (b, "e2", [2, 0, 0, 0, 2, 1], 2)] {
        let ip = format!("{net}.0.0.{host}");
        let mut s = wire::socket_in(&ns(t)).unwrap();
        wire::configure(&mut s, name, mac, 1500, Some((ip.parse().unwrap(), 24)), true).unwrap();
    }
}

#[test]
fn a_veth_wire_joins_two_pods() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let (a, b) = (TempNetns::new(), TempNetns::new());
    joined(&node, &a, &b, "12");
    // One queue each way on both ends, as asked (the kernel's default is one per
    // possible CPU, cut to one in use after a wait under the rtnl lock).
    for (t, name) in [(&a, "e1"), (&b, "e2")] {
        let text = ip(t, &["-d", "-o", "link", "show", name]);
        assert!(text.contains("numtxqueues 1 numrxqueues 1 "), "{name}: {text}");
    }
    assert!(tcp_echo(&b, &a, "12.0.0.2:7000"));
    // Counters come from the kernel.
    let mut s = wire::socket_in(&ns(&a)).unwrap();
    let (link, stats) = wire::stats(&mut s, "e1").unwrap().unwrap();
    assert!(link.up && stats.tx_packets > 0 && stats.rx_packets > 0, "{stats:?}");
    // A name that exists is refused; removal takes both ends.
    let err = node.run(|| {
        wire::veth_between(
            wire::PodEnd {
                pod: &ns(&a),
                name: "e1",
                mac: [2, 0, 0, 0, 1, 2],
            },
            wire::PodEnd {
                pod: &ns(&b),
                name: "e9",
                mac: [2, 0, 0, 0, 2, 2],
            },
            1500,
        )
    });
    assert!(
        matches!(err, Err(weft_kernel::KernelError::InterfaceExists { .. })),
        "{err:?}"
    );
    assert!(wire::remove(&mut s, "e1").unwrap());
    let mut sb = wire::socket_in(&ns(&b)).unwrap();
    assert!(wire::find(&mut sb, "e2").unwrap().is_none());
    assert!(!wire::remove(&mut s, "e1").unwrap());
}

#[test]
fn a_vxlan_wire_crosses_a_routed_underlay_with_unicast_fdb() {
    if !privileged() {
        return;
    }
    // Two nodes in different subnets joined by a router: no shared broadcast domain.
    let (router, n1, n2) = (TempNetns::new(), TempNetns::new(), TempNetns::new());
    let (p1, p2) = (TempNetns::new(), TempNetns::new());
    for (n, r_if, n_if, r_ip, n_ip, gw) in [
        (&n1, "r1", "u1", "10.91.0.1/24", "10.91.0.2/24", "10.91.0.1"),
        (&n2, "r2", "u2", "10.92.0.1/24", "10.92.0.2/24", "10.92.0.1"),
    ] {
        ip(
            &router,
            &[
                "link",
                "add",
                r_if,
                "type",
                "veth",
                "peer",
                "name",
                n_if,
                "netns",
                &n.path().display().to_string(),
            ],
        );
        ip(&router, &["addr", "add", r_ip, "dev", r_if]);
        ip(&router, &["link", "set", r_if, "up"]);
        ip(n, &["addr", "add", n_ip, "dev", n_if]);
        ip(n, &["link", "set", n_if, "up"]);
        ip(n, &["route", "add", "default", "via", gw]);
    }
    router.run(weft_kernel::enable_forwarding).unwrap();
    let (m1, m2) = ([2, 0, 0, 9, 1, 1], [2, 0, 0, 9, 2, 1]);
    let (v1, v2): (IpAddr, IpAddr) = ("10.91.0.2".parse().unwrap(), "10.92.0.2".parse().unwrap());
    n1.run(|| {
        wire::vxlan_into(
            wire::PodEnd {
                pod: &ns(&p1),
                name: "e1",
                mac: m1,
            },
            424_242,
            v1,
            1450,
        )
    })
    .unwrap();
    n2.run(|| {
        wire::vxlan_into(
            wire::PodEnd {
                pod: &ns(&p2),
                name: "e1",
                mac: m2,
            },
            424_242,
            v2,
            1450,
        )
    })
    .unwrap();
    for (p, mac, ip_, peer_mac, vtep, peer_ip) in [
        (&p1, m1, "12.1.0.1", m2, v2, "12.1.0.2"),
        (&p2, m2, "12.1.0.2", m1, v1, "12.1.0.1"),
    ] {
        let mut s = wire::socket_in(&ns(p)).unwrap();
        wire::configure(&mut s, "e1", mac, 1450, Some((ip_.parse().unwrap(), 24)), true).unwrap();
        wire::point_vxlan(&mut s, "e1", vtep, peer_mac, Some(peer_ip.parse().unwrap())).unwrap();
        assert_eq!(wire::vxlan_vtep(&mut s, "e1").unwrap(), Some(vtep));
    }
    assert!(tcp_echo(&p2, &p1, "12.1.0.2:7000"), "traffic over the VXLAN wire");
    // The peer moves: re-pointing replaces the VTEP.
    let mut s = wire::socket_in(&ns(&p1)).unwrap();
    let moved: IpAddr = "10.93.0.2".parse().unwrap();
    wire::point_vxlan(&mut s, "e1", moved, m2, None).unwrap();
    assert_eq!(wire::vxlan_vtep(&mut s, "e1").unwrap(), Some(moved));
}

/// Makes gRPC wire end `id` as `e7` in `pod` (MAC `mac`, MTU 1500, `addr`/24, up) and
/// returns a netlink socket in the pod.
fn grpc_end(node: &NetNs, pod: &NetNs, id: u64, mac: [u8; 6], addr: &str) -> weft_kernel::Netlink {
    in_netns(node, || {
        packet::create(pod, "e7", mac, 1500, id, packet::NodeEndIpv6::PerEnd)
    })
    .unwrap();
    let mut s = wire::socket_in(pod).unwrap();
    wire::configure(&mut s, "e7", mac, 1500, Some((addr.parse().unwrap(), 24)), true).unwrap();
    s
}

#[test]
fn a_grpc_end_offers_big_tcp_and_survives_its_socket() {
    if !privileged() {
        return;
    }
    let (n, p) = (TempNetns::new(), TempNetns::new());
    let (node, pod) = (ns(&n), ns(&p));
    let id = 0x1234_5678_9abc_def0;
    let mut s = grpc_end(&node, &pod, id, [2, 0, 0, 7, 7, 7], "12.7.0.1");
    // The node's namespace keeps IPv6 on by default: the end itself has it off.
    let v6 = in_netns(&node, || {
        weft_kernel::sysctl::read(&format!("net/ipv6/conf/{}/disable_ipv6", packet::node_end_name(id)))
    })
    .unwrap();
    assert_eq!(v6, "1", "no IPv6 on a node end in the node's namespace");
    // A second pair under the same names is refused, not half made.
    let again = in_netns(&node, || {
        Ok(packet::create(
            &pod,
            "e7",
            [2, 0, 0, 7, 7, 7],
            1500,
            id,
            packet::NodeEndIpv6::PerEnd,
        ))
    })
    .unwrap();
    assert!(
        matches!(again, Err(weft_kernel::KernelError::InterfaceExists { .. })),
        "{again:?}"
    );
    // The pod end offers BIG TCP super-frames (iproute2 prints gso_max_size).
    let out = Command::new("nsenter")
        .arg(format!("--net={}", p.path().display()))
        .args(["ip", "-d", "link", "show", "e7"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("gso_max_size {}", packet::GSO_MAX)),
        "pod end: {text}"
    );
    // A socket is dropped (weftd restarting) and a new one bound to the node end, by
    // the wire id alone, sees what the pod sends, behind a virtio-net header.
    drop(in_netns(&node, || packet::open(id)).unwrap());
    let fd = in_netns(&node, || packet::open(id)).unwrap();
    p.run(|| {
        let sock = std::net::UdpSocket::bind("12.7.0.1:0").unwrap();
        let _ = sock.send_to(b"hello", "12.7.0.2:9");
    });
    // The pod end may also send IPv6 multicast (MLD reports, neighbour discovery) of
    // its own accord, before or after the ARP request: frames are read until the ARP
    // broadcast comes, and every frame read must carry its virtio-net header.
    let mut buf = vec![0u8; packet::MAX_FRAME];
    let mut seen = Vec::new();
    let mut arp = false;
    for _ in 0..400 {
        // SAFETY: reading into a local buffer from an open descriptor.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let n = n as usize;
        assert!(
            n > packet::VNET_HDR_LEN + 14,
            "a frame with its virtio-net header came out of the node end ({n} bytes)"
        );
        let eth = &buf[packet::VNET_HDR_LEN..n];
        seen.push((eth[..6].to_vec(), [eth[12], eth[13]]));
        if eth[..6] == [0xff; 6] && eth[12..14] == [0x08, 0x06] {
            arp = true;
            break;
        }
    }
    assert!(
        arp,
        "the pod's ARP broadcast came out of the node end; frames seen (dst, type): {seen:?}"
    );
    // A burst written with one call reaches the pod whole, in order of the counters.
    let before = wire::stats(&mut s, "e7").unwrap().unwrap().1.rx_packets;
    let frames: Vec<Vec<u8>> = (0..100u8)
        .map(|i| {
            let mut f = vec![0u8; packet::VNET_HDR_LEN];
            f.extend_from_slice(&[0xff; 6]);
            f.extend_from_slice(&[2, 0, 0, 0, 9, i]);
            f.extend_from_slice(&[0x88, 0xb5]); // local experimental ethertype
            f.extend_from_slice(&[i; 46]);
            f
        })
        .collect();
    let slices: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let sock = in_netns(&node, || packet::open(id)).unwrap();
    let mut sent = 0;
    while sent < slices.len() {
        let n = sock.write_many(&slices[sent..]).unwrap();
        assert!((1..=packet::WRITE_BATCH).contains(&n), "{n}");
        sent += n;
    }
    let after = wire::stats(&mut s, "e7").unwrap().unwrap().1.rx_packets;
    assert_eq!(after - before, 100, "every frame of the burst reached the pod end");
    assert_eq!(sock.write_many(&[]).unwrap(), 0);
    // Removing the pod end removes the pair: nothing is left in the node.
    assert!(wire::remove(&mut s, "e7").unwrap());
    assert!(
        !in_netns(&node, || packet::exists(id)).unwrap(),
        "the node end went with the pod end"
    );
}

/// Removes the shard namespaces of a test's `NodeEnds` when dropped, even on failure.
struct Shards(packet::NodeEnds);

impl Drop for Shards {
    fn drop(&mut self) {
        let _ = self.0.delete_shards();
    }
}

/// With node ends in shard namespaces, a gRPC end's node end lives in its shard (made
/// when first needed, IPv6 off there), not in the caller's namespace, and everything
/// the wire engine does to it (look up, open a socket, read, set down, remove) is done
/// there; deleting the shards leaves nothing under /run/netns.
#[test]
fn a_grpc_end_in_a_shard_namespace_is_made_used_and_removed_there() {
    if !privileged() {
        return;
    }
    let (n, p) = (TempNetns::new(), TempNetns::new());
    let (node, pod) = (ns(&n), ns(&p));
    let shards = Shards(packet::NodeEnds::Shards {
        prefix: format!("wt-shard-{}-", std::process::id()),
        count: packet::DEFAULT_SHARDS,
    });
    let ends = &shards.0;
    let id = 0x0123_4567_89ab_cdef;
    let shard = std::path::Path::new("/run/netns").join(ends.shard_of(id).unwrap());
    let _ = weft_kernel::delete_named(&ends.shard_of(id).unwrap());
    let create = || {
        ends.within(id, || {
            packet::create(&pod, "e7", [2, 0, 0, 7, 7, 5], 1500, id, ends.ipv6())
        })
    };
    in_netns(&node, create).unwrap();
    assert!(shard.exists(), "the shard {} was made", shard.display());
    assert!(
        ends.within(id, || packet::exists(id)).unwrap(),
        "the node end is in its shard"
    );
    assert!(
        !in_netns(&node, || packet::exists(id)).unwrap(),
        "nothing of the end is in the node's namespace"
    );
    let v6 = ends
        .within(id, || {
            weft_kernel::sysctl::read(&format!("net/ipv6/conf/{}/disable_ipv6", packet::node_end_name(id)))
        })
        .unwrap();
    assert_eq!(v6, "1", "no IPv6 on a node end in a shard");
    // The same end again is refused, as in the node's namespace.
    let again = in_netns(&node, || Ok(create())).unwrap();
    assert!(
        matches!(again, Err(weft_kernel::KernelError::InterfaceExists { .. })),
        "{again:?}"
    );
    let mut s = wire::socket_in(&pod).unwrap();
    wire::configure(
        &mut s,
        "e7",
        [2, 0, 0, 7, 7, 5],
        1500,
        Some(("12.5.0.1".parse().unwrap(), 24)),
        true,
    )
    .unwrap();
    // A socket opened from the node's namespace (weftd's) reads what the pod sends.
    let sock = in_netns(&node, || ends.open(id)).unwrap();
    p.run(|| {
        let u = std::net::UdpSocket::bind("12.5.0.1:0").unwrap();
        let _ = u.send_to(b"hello", "12.5.0.2:9");
    });
    let mut buf = vec![0u8; packet::MAX_FRAME];
    let mut arp = false;
    for _ in 0..400 {
        match sock.read(&mut buf) {
            Ok(len) if len > packet::VNET_HDR_LEN + 14 => {
                let eth = &buf[packet::VNET_HDR_LEN..len];
                if eth[..6] == [0xff; 6] && eth[12..14] == [0x08, 0x06] {
                    arp = true;
                    break;
                }
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert!(arp, "the pod's ARP broadcast came out of the node end in the shard");
    // Down takes the pod end's carrier; removing the node end removes the pair.
    assert!(ends.set_up(id, false).unwrap());
    let out = Command::new("nsenter")
        .arg(format!("--net={}", p.path().display()))
        .args(["ip", "link", "show", "e7"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NO-CARRIER"),
        "pod end after its node end went down: {text}"
    );
    assert!(ends.within(id, || packet::remove(id)).unwrap());
    assert!(!ends.within(id, || packet::exists(id)).unwrap());
    assert!(
        wire::find(&mut s, "e7").unwrap().is_none(),
        "the pod end went with its node end"
    );
    drop(sock);
    ends.delete_shards().unwrap();
    assert!(!shard.exists(), "deleting the shards removes {}", shard.display());
}

/// Ends spread over as many shards as the count says, and deleting the shards removes
/// every shard of the prefix, those made under a larger count included, and nothing
/// else (a namespace whose name only starts like a shard's stays).
#[test]
fn deleting_shards_removes_every_shard_of_the_prefix_whatever_the_count() {
    if !privileged() {
        return;
    }
    let prefix = format!("wt-count-{}-", std::process::id());
    let wide = Shards(packet::NodeEnds::Shards {
        prefix: prefix.clone(),
        count: 4,
    });
    let run = std::path::Path::new("/run/netns");
    let made: std::collections::BTreeSet<String> = (0..8u64)
        .map(|id| {
            wide.0.within(id, || Ok(())).unwrap();
            wide.0.shard_of(id).unwrap()
        })
        .collect();
    let expected: std::collections::BTreeSet<String> = (0..4).map(|k| format!("{prefix}{k}")).collect();
    assert_eq!(made, expected, "8 ends over 4 shards");
    assert!(made.iter().all(|s| run.join(s).exists()), "each shard was made");
    let lookalike = format!("{prefix}x1");
    weft_kernel::create_named(&lookalike, || Ok(())).unwrap();
    let narrow = packet::NodeEnds::Shards {
        prefix: prefix.clone(),
        count: 2,
    };
    let deleted = narrow.delete_shards();
    let lookalike_stayed = run.join(&lookalike).exists();
    let _ = weft_kernel::delete_named(&lookalike);
    deleted.unwrap();
    let left: Vec<&String> = made.iter().filter(|s| run.join(s).exists()).collect();
    assert!(
        left.is_empty(),
        "shards left after deleting under a smaller count: {left:?}"
    );
    assert!(lookalike_stayed, "{lookalike} is not a shard and stays");
}

/// What a pod sends into a gRPC wire end is read in batches, small frames many to a
/// call and a super-frame whole among them; what overflows an unread socket is dropped
/// by the kernel and counted once.
#[test]
fn a_grpc_end_is_read_in_batches_and_counts_what_overflows() {
    if !privileged() {
        return;
    }
    let (n, p) = (TempNetns::new(), TempNetns::new());
    let (node, pod) = (ns(&n), ns(&p));
    let id = 0x0bad_cafe_0001;
    let mut s = grpc_end(&node, &pod, id, [2, 0, 0, 7, 7, 8], "12.8.0.1");
    // No neighbour answers on a wire end: a static entry lets the pod send at once.
    ip(
        &p,
        &["neigh", "add", "12.8.0.2", "lladdr", "02:00:00:07:07:09", "dev", "e7"],
    );
    let sock = in_netns(&node, || packet::open(id)).unwrap();
    sock.take_drops().unwrap();
    let flood = |count: usize, len: usize| {
        p.run(|| {
            let u = std::net::UdpSocket::bind("12.8.0.1:0").unwrap();
            for _ in 0..count {
                let _ = u.send_to(&vec![7u8; len], "12.8.0.2:9");
            }
        })
    };
    flood(40, 64);
    let mut room = packet::ReadRoom::new();
    let mut buf = bytes::BytesMut::new();
    let mut lens = Vec::new();
    let mut calls = 0;
    let udp_frame = packet::VNET_HDR_LEN + 14 + 20 + 8 + 64;
    let udp = |lens: &[usize]| lens.iter().filter(|l| **l == udp_frame).count();
    while udp(&lens) < 40 && calls < 100 {
        match sock.read_many(&mut buf, &mut room, packet::READ_BATCH, &mut lens) {
            Ok(_) => calls += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("read_many: {e}"),
        }
    }
    assert_eq!(udp(&lens), 40, "every datagram came out, whole");
    assert!(calls < lens.len() / 4, "{} frames took {calls} calls", lens.len());
    assert_eq!(buf.len(), lens.iter().sum::<usize>());
    // Unread, the socket's buffer fills and the kernel drops the rest: counted once.
    flood(40_000, 64);
    let dropped = sock.take_drops().unwrap();
    assert!(dropped > 0, "an unread end overflowed");
    assert_eq!(sock.take_drops().unwrap(), 0, "reading the count resets it");
    assert!(wire::remove(&mut s, "e7").unwrap());
}

/// Relays every frame read from `sock` back into it until `stop`; returns how many.
fn relay(sock: &packet::PacketSocket, stop: &std::sync::atomic::AtomicBool) -> usize {
    let mut buf = vec![0u8; packet::MAX_FRAME];
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match sock.read(&mut buf) {
            Ok(len) => {
                sock.write(&buf[..len]).unwrap();
                n += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("detour read: {e}"),
        }
    }
    n
}

#[test]
fn a_detour_steers_what_an_end_sends_through_a_packet_socket_and_back() {
    if !privileged() {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use weft_kernel::detour;
    let node = TempNetns::new();
    let (a, b) = (TempNetns::new(), TempNetns::new());
    joined(&node, &a, &b, "13");
    let id = 0xabc_def0_1234;
    assert!(!in_netns(&ns(&node), || detour::create(&ns(&a), "nope", id)).unwrap());
    assert!(in_netns(&ns(&node), || detour::create(&ns(&a), "e1", id)).unwrap());
    // Taking over what is there (as a restarted weftd does) works too.
    assert!(in_netns(&ns(&node), || detour::create(&ns(&a), "e1", id)).unwrap());
    assert_eq!(in_netns(&ns(&node), detour::list).unwrap(), vec![id]);
    // The node side answers no ARP: the node's stack stays out of the pod's link.
    let shown = Command::new("nsenter")
        .arg(format!("--net={}", node.path().display()))
        .args(["ip", "-o", "link", "show", &detour::node_side_name(id)])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("NOARP") && shown.contains(",UP"), "{shown}");
    let sock = in_netns(&ns(&node), || detour::open(id)).unwrap();
    let stop = AtomicBool::new(false);
    let (relayed, echoed) = std::thread::scope(|s| {
        let r = s.spawn(|| relay(&sock, &stop));
        let echoed = tcp_echo(&b, &a, "13.0.0.2:7000");
        stop.store(true, Ordering::Relaxed);
        (r.join().unwrap(), echoed)
    });
    assert!(echoed, "TCP through the detour");
    // ARP, SYN, data, ACKs, FIN: every frame a:e1 sent went through the socket.
    assert!(relayed >= 4, "{relayed} frames relayed");
    let mut sa = wire::socket_in(&ns(&a)).unwrap();
    let (_, stats) = wire::stats(&mut sa, "e1").unwrap().unwrap();
    assert!(stats.tx_packets >= relayed as u64, "{stats:?}");
    // Nobody reading: what a:e1 sends goes nowhere.
    assert!(!tcp_echo(&b, &a, "13.0.0.2:7001"));
    drop(sock);
    // Removed: the direct path again, and nothing of the detour left on either side.
    assert!(in_netns(&ns(&node), || detour::remove(&a.path().display().to_string(), "e1", id)).unwrap());
    assert!(tcp_echo(&b, &a, "13.0.0.2:7002"));
    assert!(wire::find(&mut sa, &detour::pod_side_name(id)).unwrap().is_none());
    assert!(in_netns(&ns(&node), detour::list).unwrap().is_empty());
    assert!(!in_netns(&ns(&node), || detour::remove(&a.path().display().to_string(), "e1", id)).unwrap());
}
