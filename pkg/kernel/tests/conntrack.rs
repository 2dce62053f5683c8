//! Conntrack events and dumps against the real kernel, in a namespace per test: a
//! connection is seen confirmed, counted and destroyed; a buffer too small for a burst
//! reports the loss instead of hiding it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use weft_kernel::conntrack::{self, ConntrackEvents, CtEntry, CtEventKind, ReadError, TcpState};
use weft_kernel::testutil::{TempNetns, privileged};
use weft_kernel::{nft, sysctl};

/// Brings up loopback, turns accounting and timestamps on, and makes conntrack track
/// the namespace's traffic (it tracks a namespace only once a rule there needs it).
fn tracked_netns() -> TempNetns {
    let ns = TempNetns::new();
    ns.run(|| {
        let mut nl = weft_kernel::Netlink::new().unwrap();
        let lo = nl.links().unwrap().into_iter().find(|l| l.name == "lo").unwrap();
        nl.set_up(lo.index, true).unwrap();
        nft::run(
            &["-f", "-"],
            Some("table inet cttest {\n chain output {\n  type filter hook output priority 0;\n  ct state new counter\n }\n}\n"),
        )
        .unwrap();
        sysctl::write("net/netfilter/nf_conntrack_acct", "1").unwrap();
        sysctl::write("net/netfilter/nf_conntrack_timestamp", "1").unwrap();
        // A closed connection's entry goes at once, so its destroy event comes soon.
        sysctl::write("net/netfilter/nf_conntrack_tcp_timeout_time_wait", "1").unwrap();
        sysctl::write("net/netfilter/nf_conntrack_udp_timeout", "1").unwrap();
    });
    ns
}

/// Reads events until `done` holds for what was read, or `within` passes.
fn events_until(ev: &mut ConntrackEvents, within: Duration, done: impl Fn(&[CtEntry]) -> bool) -> Vec<CtEntry> {
    ev.set_timeout(Duration::from_millis(200)).unwrap();
    let mut seen = Vec::new();
    let start = Instant::now();
    while start.elapsed() < within && !done(&seen) {
        let bad = ev.next(&mut seen).unwrap();
        assert_eq!(bad, 0, "every message decodes");
    }
    seen
}

#[test]
fn a_tcp_connection_is_seen_new_counted_and_destroyed() {
    if !privileged() {
        return;
    }
    let ns = tracked_netns();
    ns.run(|| {
        let mut ev = ConntrackEvents::subscribe(1 << 20).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 10_000];
            s.read_exact(&mut buf).unwrap();
            s.write_all(b"ok").unwrap();
        });
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let client_port = c.local_addr().unwrap().port();
        c.write_all(&[7u8; 10_000]).unwrap();
        let mut ok = [0u8; 2];
        c.read_exact(&mut ok).unwrap();
        drop(c);
        server.join().unwrap();

        let ours = |e: &CtEntry| e.original.dst_port == port && e.original.src_port == client_port;
        // The entry expires a second after the FINs; the kernel's collector reaps it
        // when it next passes (which can take a minute), a dump at once.
        std::thread::sleep(Duration::from_millis(1500));
        conntrack::dump().unwrap();
        let seen = events_until(&mut ev, Duration::from_secs(30), |s| {
            s.iter().any(|e| ours(e) && e.kind == CtEventKind::Destroy)
        });
        let mine: Vec<&CtEntry> = seen.iter().filter(|e| ours(e)).collect();
        let new = mine.iter().find(|e| e.kind == CtEventKind::New).expect("a new event");
        assert_eq!(new.original.protocol, 6);
        assert_eq!(new.original.src.to_string(), "127.0.0.1");
        assert_eq!(new.reply.src_port, port, "the reply comes from the server's port");
        assert!(new.id != 0, "the entry has an id");
        let finishing = mine
            .iter()
            .filter(|e| e.kind == CtEventKind::Update)
            .filter_map(|e| e.tcp_state)
            .any(TcpState::finishing);
        assert!(finishing, "an update saw the FINs: {mine:#?}");
        let destroy = mine
            .iter()
            .find(|e| e.kind == CtEventKind::Destroy)
            .expect("a destroy event");
        assert_eq!(destroy.id, new.id, "the same entry");
        let orig = destroy.original_counters.expect("accounting is on");
        let reply = destroy.reply_counters.expect("accounting is on");
        assert!(orig.bytes >= 10_000, "the client's bytes are counted: {orig:?}");
        assert!(orig.packets >= 3, "{orig:?}");
        assert!(
            reply.bytes >= 2 && reply.bytes < 10_000,
            "the server's answer is counted apart: {reply:?}"
        );
        let (start, stop) = (destroy.start_ns.unwrap(), destroy.stop_ns.expect("a stop time"));
        assert!(stop >= start);
    });
}

#[test]
fn a_dump_lists_live_entries_with_their_counters_in_both_families() {
    if !privileged() {
        return;
    }
    let ns = tracked_netns();
    ns.run(|| {
        let udp4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sink4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp6 = UdpSocket::bind("[::1]:0").unwrap();
        let sink6 = UdpSocket::bind("[::1]:0").unwrap();
        for _ in 0..5 {
            udp4.send_to(&[1u8; 100], sink4.local_addr().unwrap()).unwrap();
            udp6.send_to(&[1u8; 100], sink6.local_addr().unwrap()).unwrap();
        }
        let entries = conntrack::dump().unwrap();
        for (from, to) in [(&udp4, &sink4), (&udp6, &sink6)] {
            let (from, to) = (from.local_addr().unwrap(), to.local_addr().unwrap());
            let e = entries
                .iter()
                .find(|e| e.original.src_port == from.port() && e.original.dst_port == to.port())
                .unwrap_or_else(|| panic!("{from} -> {to} is listed: {entries:#?}"));
            assert_eq!(e.kind, CtEventKind::Dumped);
            assert_eq!(e.original.src, from.ip());
            assert_eq!(e.original.protocol, 17);
            let c = e.original_counters.expect("accounting is on");
            assert_eq!(c.packets, 5, "{from}: {c:?}");
            // 100 bytes of payload, 8 of UDP, 20 or 40 of IP.
            let ip = if from.is_ipv4() { 20 } else { 40 };
            assert_eq!(c.bytes, 5 * (100 + 8 + ip), "{from}: {c:?}");
        }
    });
}

#[test]
fn icmp_entries_carry_their_echo_identity() {
    if !privileged() {
        return;
    }
    let ns = tracked_netns();
    ns.run(|| {
        let out = std::process::Command::new("ping")
            .args(["-c", "2", "-i", "0.2", "-W", "1", "127.0.0.1"])
            .output()
            .expect("ping runs");
        assert!(out.status.success(), "{out:?}");
        let entries = conntrack::dump().unwrap();
        let e = entries
            .iter()
            .find(|e| e.original.protocol == 1)
            .unwrap_or_else(|| panic!("an ICMP entry: {entries:#?}"));
        let icmp = e.original.icmp.expect("ICMP's identity");
        assert_eq!(icmp.kind, 8, "an echo request");
        assert_eq!(e.reply.icmp.expect("the reply's identity").kind, 0, "an echo reply");
    });
}

#[test]
fn an_overflowed_buffer_is_reported_not_hidden() {
    if !privileged() {
        return;
    }
    let ns = tracked_netns();
    ns.run(|| {
        // The burst's flows must outlive the test: with the 1 s timeout the others use,
        // their 500 destroy events come while the test waits for the one event after
        // the drain, overflow the tiny buffer again and hide it.
        sysctl::write("net/netfilter/nf_conntrack_udp_timeout", "120").unwrap();
        // The smallest buffer the kernel grants holds a handful of events.
        let mut ev = ConntrackEvents::subscribe(1).unwrap();
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sink.local_addr().unwrap();
        // Each socket is a new flow: far more events than the buffer holds, unread.
        for _ in 0..500 {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.send_to(b"x", to).unwrap();
        }
        ev.set_timeout(Duration::from_millis(500)).unwrap();
        let mut seen = Vec::new();
        let mut overflowed = false;
        for _ in 0..1000 {
            match ev.next(&mut seen) {
                Err(ReadError::Overflow) => {
                    overflowed = true;
                    break;
                }
                Err(e) => panic!("{e}"),
                Ok(_) if seen.len() >= 500 => break,
                Ok(_) => {}
            }
        }
        assert!(overflowed, "the loss was reported (read {} events)", seen.len());
        // Events flow again once the queue is drained (the kernel drops them silently
        // until then).
        ev.drain(&mut seen).unwrap();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        s.send_to(b"x", to).unwrap();
        let after = events_until(&mut ev, Duration::from_secs(5), |s| {
            s.iter().any(|e| e.original.src_port == port)
        });
        assert!(
            after.iter().any(|e| e.original.src_port == port),
            "events flow again: {port} {after:#?}"
        );
    });
}
