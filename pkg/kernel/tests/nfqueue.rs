//! NFQUEUE against the real kernel, in a namespace per test: a rule written by the
//! nfnetlink batch (`queue num N bypass`, the xtables compat target) holds a datagram
//! until weft's verdict (accept delivers it, drop loses it), and lets it through while
//! nobody is bound; a hold without bypass, read on one socket with an NFLOG group,
//! gives the log's copies and the held packets in the order the packets passed, and a
//! repeat with a mark sends the packet through the chain again, past the hold.

use std::net::UdpSocket;
use std::time::Duration;

use weft_kernel::nfqueue::{Event, NfQueue, Overflow, Queued, Verdict, udp_payload};
use weft_kernel::nftbatch::{Batch, Expr, L4Proto};
use weft_kernel::nftset::Session;
use weft_kernel::testutil::{TempNetns, privileged};
use weft_kernel::{Netlink, nft};

const QUEUE: u16 = 4242;

/// A namespace of the test's own with loopback up and `table inet weft-q`, whose input
/// chain holds `rules` (written by the nfnetlink batch).
fn netns_with(rules: Vec<Vec<Expr>>) -> TempNetns {
    let ns = TempNetns::new();
    ns.run(|| {
        let mut nl = Netlink::new().unwrap();
        let lo = nl.link_by_name("lo").unwrap().unwrap();
        nl.set_up(lo.index, true).unwrap();
        nft::run(
            &["-f", "-"],
            Some("table inet weft-q {\n chain input {\n  type filter hook input priority 0;\n }\n}\n"),
        )
        .unwrap();
        let mut b = Batch::new("weft-q");
        for r in rules {
            b.add_rule("input", r);
        }
        b.commit(&mut Session::default())
            .expect("the compat queue rule is taken in an inet table");
    });
    ns
}

/// Loopback up, and `table inet weft-q` whose input chain queues UDP to `port`.
fn queued_netns(port: u16) -> TempNetns {
    netns_with(vec![vec![
        Expr::Dport {
            proto: L4Proto::Udp,
            ports: port..=port,
        },
        Expr::Queue {
            num: QUEUE,
            bypass: true,
        },
    ]])
}

fn only_held(events: Vec<Event>) -> Vec<Queued> {
    events
        .into_iter()
        .map(|e| match e {
            Event::Held(q) => q,
            Event::Logged(p) => panic!("nothing is logged here: {p:?}"),
        })
        .collect()
}

fn got(r: &UdpSocket) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    r.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

#[test]
fn a_datagram_waits_for_its_verdict_and_passes_when_nobody_listens() {
    if !privileged() {
        return;
    }
    // The namespace is the test's own: any port is free in it.
    let port = 40053;
    let ns = queued_netns(port);
    let listing = ns.run(|| nft::run(&["list", "table", "inet", "weft-q"], None).unwrap());
    assert!(
        listing.contains(&format!("udp dport {port} queue num {QUEUE} bypass")),
        "{listing}"
    );
    let (receiver, sender, mut queue) = ns.run(|| {
        let r = UdpSocket::bind(("127.0.0.1", port)).unwrap();
        r.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        (r, s, NfQueue::bind(QUEUE, 512, 64, Overflow::Pass).unwrap())
    });
    let to = ("127.0.0.1", port);

    sender.send_to(b"one", to).unwrap();
    let held = only_held(queue.next(Duration::from_secs(2)).unwrap());
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(!held[0].ipv6);
    let (dst, payload) = udp_payload(&held[0].payload).expect("a UDP packet");
    assert_eq!((dst.to_string().as_str(), payload), ("127.0.0.1", &b"one"[..]));
    assert_eq!(got(&receiver), None, "held until the verdict");
    queue.verdict(held[0].id, Verdict::Accept).unwrap();
    assert_eq!(got(&receiver).as_deref(), Some(&b"one"[..]), "delivered once accepted");

    sender.send_to(b"two", to).unwrap();
    let held = only_held(queue.next(Duration::from_secs(2)).unwrap());
    queue.verdict(held[0].id, Verdict::Drop).unwrap();
    assert_eq!(got(&receiver), None, "a dropped one never arrives");

    // Nobody bound: the rule's bypass lets it through.
    drop(queue);
    sender.send_to(b"three", to).unwrap();
    assert_eq!(got(&receiver).as_deref(), Some(&b"three"[..]));
}

#[test]
fn copies_and_held_packets_come_in_order_and_a_repeat_passes_the_hold() {
    if !privileged() {
        return;
    }
    hold_and_repeat("127.0.0.1");
}

#[test]
fn a_held_ipv6_packet_repeats_past_the_hold_too() {
    if !privileged() {
        return;
    }
    hold_and_repeat("::1");
}

fn hold_and_repeat(local: &str) {
    let (logged_port, held_port, group, mark) = (40054u16, 40055u16, 4243u16, 0x0040_0000u32);
    let ns = netns_with(vec![
        vec![
            Expr::Dport {
                proto: L4Proto::Udp,
                ports: logged_port..=logged_port,
            },
            Expr::Log {
                group,
                prefix: "copy".into(),
            },
        ],
        vec![
            Expr::MarkClear(mark),
            Expr::Dport {
                proto: L4Proto::Udp,
                ports: held_port..=held_port,
            },
            Expr::Queue {
                num: QUEUE,
                bypass: false,
            },
        ],
    ]);
    let (copied, receiver, sender) = ns.run(|| {
        let c = UdpSocket::bind((local, logged_port)).unwrap();
        let r = UdpSocket::bind((local, held_port)).unwrap();
        for s in [&c, &r] {
            s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        }
        (c, r, UdpSocket::bind((local, 0)).unwrap())
    });

    // Nobody bound and no bypass: the held one is dropped, the copied one passes.
    sender.send_to(b"lost", (local, held_port)).unwrap();
    assert_eq!(got(&receiver), None, "a hold without a reader fails closed");

    let mut queue = ns.run(|| {
        let mut q = NfQueue::bind(QUEUE, 512, 64, Overflow::Drop).unwrap();
        q.log_too(group, 512).unwrap();
        q
    });
    sender.send_to(b"answer", (local, logged_port)).unwrap();
    sender.send_to(b"connect", (local, held_port)).unwrap();
    assert_eq!(got(&copied).as_deref(), Some(&b"answer"[..]), "a copy never waits");
    let mut events = Vec::new();
    while events.len() < 2 {
        let more = queue.next(Duration::from_secs(2)).unwrap();
        assert!(!more.is_empty(), "both messages arrive: {events:?}");
        events.extend(more);
    }
    let id = match (&events[0], &events[1]) {
        (Event::Logged(p), Event::Held(q)) => {
            assert_eq!(p.prefix, "copy");
            assert_eq!(udp_payload(&p.payload).unwrap().1, b"answer");
            assert_eq!(udp_payload(&q.payload).unwrap().1, b"connect");
            q.id
        }
        other => panic!("the copy first, then the held packet: {other:?}"),
    };
    assert_eq!(got(&receiver), None, "held until the verdict");
    queue.verdict(id, Verdict::Repeat { mark }).unwrap();
    assert_eq!(
        got(&receiver).as_deref(),
        Some(&b"connect"[..]),
        "repeated with the mark, the chain lets it past the hold"
    );
    assert!(
        queue.next(Duration::from_millis(200)).unwrap().is_empty(),
        "not held a second time"
    );

    // Held packets whose verdicts are given all at once.
    sender.send_to(b"one", (local, held_port)).unwrap();
    sender.send_to(b"two", (local, held_port)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    queue.verdict_all(Verdict::Repeat { mark }).unwrap();
    assert_eq!(got(&receiver).as_deref(), Some(&b"one"[..]));
    assert_eq!(got(&receiver).as_deref(), Some(&b"two"[..]));
}
