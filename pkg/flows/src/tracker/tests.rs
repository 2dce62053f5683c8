use std::collections::HashMap;

use weft_kernel::conntrack::CtCounters;

use super::*;
use crate::record::{Effect, PolicyHit};

/// A cluster as a table: pods by address, nodes by address, and ports policy denies.
struct Table {
    pods: HashMap<IpAddr, (&'static str, &'static str, &'static str, &'static str)>,
    nodes: HashMap<IpAddr, &'static str>,
    denied_ports: Vec<u16>,
}

impl Table {
    fn new() -> Self {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        Table {
            pods: [
                (ip("10.244.1.2"), ("x", "a", "Deployment/web", "n1")),
                (ip("10.244.1.3"), ("y", "b", "", "n1")),
                (ip("10.244.2.2"), ("y", "c", "StatefulSet/db", "n2")),
            ]
            .into_iter()
            .collect(),
            nodes: [(ip("172.18.0.1"), "n1"), (ip("172.18.0.2"), "n2")]
                .into_iter()
                .collect(),
            denied_ports: vec![81],
        }
    }
}

impl Resolve for Table {
    fn peer(&self, ip: IpAddr) -> Peer {
        if let Some((ns, pod, workload, node)) = self.pods.get(&ip) {
            return Peer {
                ip,
                port: 0,
                kind: PeerKind::Pod,
                namespace: (*ns).into(),
                pod: (*pod).into(),
                workload: (*workload).into(),
                node: (*node).into(),
            };
        }
        if let Some(node) = self.nodes.get(&ip) {
            return Peer {
                kind: PeerKind::Node,
                node: (*node).into(),
                ..Peer::outside(ip, 0)
            };
        }
        Peer::outside(ip, 0)
    }

    fn decide(&self, _src: IpAddr, _dst: IpAddr, _protocol: u8, port: u16) -> Decision {
        if self.denied_ports.contains(&port) {
            return Decision {
                verdict: Verdict::Denied,
                policies: vec![PolicyHit {
                    domain: "".into(),
                    side: PolicySide::Ingress,
                    kind: "networkpolicy".into(),
                    name: "y/deny-81".into(),
                    rule: None,
                    rule_name: "".into(),
                    effect: Effect::Isolate,
                }],
                staged: None,
            };
        }
        // A staged policy that would isolate port 8080.
        let staged = (port == 8080).then(|| {
            (
                Verdict::Denied,
                vec![PolicyHit {
                    domain: "".into(),
                    side: PolicySide::Ingress,
                    kind: "networkpolicy".into(),
                    name: "y/staged-deny".into(),
                    rule: None,
                    rule_name: "".into(),
                    effect: Effect::Isolate,
                }],
            )
        });
        Decision {
            verdict: Verdict::Forwarded,
            policies: vec![PolicyHit {
                domain: "".into(),
                side: PolicySide::Ingress,
                kind: "networkpolicy".into(),
                name: "y/allow-web".into(),
                rule: Some(0),
                rule_name: "".into(),
                effect: Effect::Allow,
            }],
            staged,
        }
    }
}

fn tuple(src: &str, sport: u16, dst: &str, dport: u16, protocol: u8) -> CtTuple {
    CtTuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        protocol,
        src_port: sport,
        dst_port: dport,
        icmp: None,
    }
}

fn entry(kind: CtEventKind, id: u32, original: CtTuple) -> CtEntry {
    CtEntry {
        kind,
        id,
        original,
        reply: CtTuple {
            src: original.dst,
            dst: original.src,
            src_port: original.dst_port,
            dst_port: original.src_port,
            ..original
        },
        status: 0,
        mark: 0,
        zone: None,
        tcp_state: None,
        original_counters: None,
        reply_counters: None,
        start_ns: None,
        stop_ns: None,
    }
}

fn counted(mut e: CtEntry, fwd: u64, rev: u64) -> CtEntry {
    e.original_counters = Some(CtCounters {
        packets: fwd / 1000 + 1,
        bytes: fwd,
    });
    e.reply_counters = Some(CtCounters {
        packets: rev / 1000 + 1,
        bytes: rev,
    });
    e
}

fn tracker() -> Tracker {
    Tracker::new(Config {
        node: "n1".into(),
        ..Config::default()
    })
}

#[test]
fn a_tcp_connection_becomes_one_record_with_its_bytes_and_its_end() {
    let (mut t, r) = (tracker(), Table::new());
    let tu = tuple("10.244.1.2", 40000, "10.244.1.3", 80, 6);
    let mut new = entry(CtEventKind::New, 7, tu);
    new.start_ns = Some(5_000_000_000);
    t.apply(&new, &r, 5_001);
    // The kernel's update events carry no counters: the FIN waits for a dump.
    let mut fin = entry(CtEventKind::Update, 7, tu);
    fin.tcp_state = Some(TcpState::TimeWait);
    fin.status = IPS_SEEN_REPLY;
    t.apply(&fin, &r, 6_000);
    assert_eq!(t.closing(), 1);
    assert_eq!(t.take_changes().len(), 1, "opened; the end waits for its counters");
    let mut dumped = counted(entry(CtEventKind::Dumped, 7, tu), 999_948, 2_000);
    dumped.tcp_state = Some(TcpState::TimeWait);
    t.read_closing(&[dumped], &r, 6_500);
    // Announced (to exports and followers) at the FIN's dump, not two minutes later.
    assert_eq!(t.closing(), 0);
    let changes = t.take_changes();
    assert_eq!(changes.len(), 1, "ended: {changes:#?}");
    assert_eq!((changes[0].end, changes[0].end_ms), (EndReason::Fin, Some(6_000)));
    assert_eq!(changes[0].forward.bytes, 999_948);
    let mut destroy = counted(entry(CtEventKind::Destroy, 7, tu), 1_000_000, 2_000);
    destroy.stop_ns = Some(126_000_000_000);
    t.apply(&destroy, &r, 126_001);

    let all = t.list(|_| true, 0);
    assert_eq!(all.len(), 1, "{all:#?}");
    let f = &all[0];
    assert_eq!((f.src.to_string(), f.dst.to_string()), ("x/a".into(), "y/b".into()));
    assert_eq!(f.src.workload.as_ref(), "Deployment/web");
    assert_eq!((f.src.port, f.dst.port, f.protocol), (40000, 80, 6));
    assert_eq!(f.kind, FlowKind::IntraNode);
    assert_eq!(f.verdict, Verdict::Forwarded);
    assert_eq!(f.policies[0].name.as_ref(), "y/allow-web");
    assert_eq!((f.forward.bytes, f.reverse.bytes), (1_000_000, 2_000));
    assert_eq!(f.end, EndReason::Fin);
    assert_eq!(
        (f.start_ms, f.end_ms),
        (5_000, Some(6_000)),
        "it ended at its FIN, not at the destroy"
    );
    assert_eq!(&*f.node, "n1");
    assert!(t.take_changes().is_empty(), "the destroy announces nothing again");

    let agg = t.aggregates().query(0, false, |_| true);
    assert_eq!(agg.len(), 1);
    assert_eq!(
        (&*agg[0].key.src, &*agg[0].key.dst, agg[0].value.flows),
        ("x/Deployment/web", "y/b", 1)
    );
    assert_eq!(agg[0].value.forward.bytes, 1_000_000);
    let s = t.stats();
    assert_eq!((s.entries, s.ended, s.open, s.kept), (4, 1, 0, 1));
}

#[test]
fn counters_of_open_flows_are_refreshed_and_aggregated_as_they_grow() {
    let (mut t, r) = (tracker(), Table::new());
    let tu = tuple("10.244.1.2", 40000, "10.244.2.2", 5432, 6);
    t.apply(&entry(CtEventKind::New, 1, tu), &r, 1_000);
    t.reconcile(
        &[counted(entry(CtEventKind::Dumped, 1, tu), 5_000, 100)],
        &r,
        10_000,
        false,
    );
    t.reconcile(
        &[counted(entry(CtEventKind::Dumped, 1, tu), 20_000, 300)],
        &r,
        40_000,
        false,
    );
    let open = t.list(|_| true, 0);
    assert_eq!((open[0].forward.bytes, open[0].end), (20_000, EndReason::Open));
    assert_eq!(open[0].kind, FlowKind::InterNode);
    let per = t.aggregates().query(0, true, |_| true);
    let bytes: Vec<(i64, u64)> = per.iter().map(|a| (a.start_ms, a.value.forward.bytes)).collect();
    assert_eq!(
        bytes,
        vec![(0, 5_000), (30_000, 15_000)],
        "each bucket has what grew in it"
    );
    let growth = t.take_growth();
    assert_eq!(growth.len(), 1);
    assert_eq!(
        growth.get(&(
            Verdict::Forwarded,
            FlowKind::InterNode,
            "x".into(),
            "Deployment/web".into()
        )),
        Some(&20_300),
        "both ways, for the source pod's namespace"
    );
    assert!(t.take_growth().is_empty(), "taken once");
}

#[test]
fn only_the_node_of_the_source_pod_reports_a_flow_between_nodes() {
    let (mut t, r) = (tracker(), Table::new());
    // From n2's pod to ours: n2 reports it.
    t.apply(
        &entry(CtEventKind::New, 1, tuple("10.244.2.2", 1, "10.244.1.2", 80, 6)),
        &r,
        0,
    );
    // The node's own connection: nobody's flow.
    t.apply(
        &entry(CtEventKind::New, 2, tuple("172.18.0.1", 2, "172.18.0.2", 6443, 6)),
        &r,
        0,
    );
    // From outside and from a node to our pod: ours.
    t.apply(
        &entry(CtEventKind::New, 3, tuple("192.0.2.9", 3, "10.244.1.2", 80, 6)),
        &r,
        0,
    );
    t.apply(
        &entry(CtEventKind::New, 4, tuple("172.18.0.2", 4, "10.244.1.3", 8080, 6)),
        &r,
        0,
    );
    // Our pod to outside, masqueraded: the reply comes to the node's address.
    let mut out = entry(CtEventKind::New, 5, tuple("10.244.1.3", 5, "198.51.100.7", 443, 6));
    out.reply.dst = "172.18.0.1".parse().unwrap();
    t.apply(&out, &r, 0);
    let kinds: Vec<FlowKind> = t.list(|_| true, 0).iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![FlowKind::FromOutside, FlowKind::FromNode, FlowKind::ToOutside]
    );
    assert_eq!(t.stats().not_reported, 2);
    // Their later events are skipped cheaply, and forgotten at their end.
    t.apply(
        &entry(CtEventKind::Update, 1, tuple("10.244.2.2", 1, "10.244.1.2", 80, 6)),
        &r,
        1,
    );
    t.apply(
        &entry(CtEventKind::Destroy, 1, tuple("10.244.2.2", 1, "10.244.1.2", 80, 6)),
        &r,
        2,
    );
    assert_eq!(t.stats().not_reported, 2);
    assert!(t.ignored.len() == 1);
}

#[test]
fn a_service_address_is_followed_to_the_pod_that_answered() {
    let (mut t, r) = (tracker(), Table::new());
    let mut e = entry(CtEventKind::New, 1, tuple("10.244.1.2", 40000, "10.96.0.10", 53, 17));
    e.reply.src = "10.244.2.2".parse().unwrap();
    e.reply.src_port = 5353;
    t.apply(&e, &r, 0);
    let f = &t.list(|_| true, 0)[0];
    assert_eq!(f.dst.to_string(), "y/c");
    assert_eq!((f.dst.port, f.dialled), (5353, Some("10.96.0.10".parse().unwrap())));
    assert_eq!(f.kind, FlowKind::InterNode);
}

#[test]
fn a_connection_the_far_node_refused_is_denied_one_it_answered_is_not() {
    let (mut t, r) = (tracker(), Table::new());
    t.apply(
        &entry(CtEventKind::New, 1, tuple("10.244.1.2", 1, "10.244.2.2", 81, 6)),
        &r,
        0,
    );
    let mut answered = entry(CtEventKind::New, 2, tuple("10.244.1.2", 2, "10.244.2.2", 81, 6));
    answered.status = IPS_SEEN_REPLY;
    t.apply(&answered, &r, 0);
    let v: Vec<Verdict> = t.list(|_| true, 0).iter().map(|f| f.verdict).collect();
    assert_eq!(v, vec![Verdict::Denied, Verdict::Forwarded]);
}

#[test]
fn denied_packets_become_records_except_what_conntrack_or_another_node_reports() {
    let (mut t, r) = (tracker(), Table::new());
    let d = |src: &str, side, audit| DeniedPacket {
        at_ms: 1_000,
        src: src.parse().unwrap(),
        dst: "10.244.1.3".parse().unwrap(),
        protocol: 6,
        port: 81,
        src_port: 33333,
        side,
        audit,
    };
    t.denied(&d("10.244.1.2", PolicySide::Ingress, false), &r);
    t.denied(&d("10.244.1.2", PolicySide::Ingress, true), &r);
    t.denied(&d("10.244.2.2", PolicySide::Ingress, false), &r);
    t.denied(&d("192.0.2.1", PolicySide::Ingress, false), &r);
    let all = t.list(|_| true, 0);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all.iter()
            .all(|f| f.verdict == Verdict::Denied && f.end == EndReason::Denied)
    );
    assert_eq!(all[0].policies[0].name.as_ref(), "y/deny-81");
    assert_eq!(all[0].src.port, 33333);
    assert_eq!(t.stats().denies, 4);
    let agg = t.aggregates().query(0, false, |k| k.verdict == Verdict::Denied);
    assert_eq!(agg.iter().map(|a| a.value.flows).sum::<u64>(), 2);
}

#[test]
fn after_an_overflow_the_dump_ends_what_vanished_and_opens_what_was_missed() {
    let (mut t, r) = (tracker(), Table::new());
    let a = tuple("10.244.1.2", 1, "10.244.1.3", 80, 6);
    let b = tuple("10.244.1.2", 2, "10.244.1.3", 80, 6);
    let c = tuple("10.244.1.2", 3, "10.244.1.3", 80, 6);
    t.apply(&entry(CtEventKind::New, 1, a), &r, 0);
    t.apply(&entry(CtEventKind::New, 2, b), &r, 0);
    t.overflowed();
    t.reconcile(
        &[
            counted(entry(CtEventKind::Dumped, 2, b), 10, 10),
            counted(entry(CtEventKind::Dumped, 3, c), 5, 5),
        ],
        &r,
        100,
        true,
    );
    let all = t.list(|_| true, 0);
    let end = |port: u16| all.iter().find(|f| f.src.port == port).unwrap().end;
    assert_eq!(
        (end(1), end(2), end(3)),
        (EndReason::Lost, EndReason::Open, EndReason::Open)
    );
    let s = t.stats();
    assert_eq!((s.overflows, s.lost_events), (1, 2));
}

#[test]
fn without_a_loss_a_flow_missing_from_two_dumps_in_a_row_ended_unseen() {
    let (mut t, r) = (tracker(), Table::new());
    let a = tuple("10.244.1.2", 1, "10.244.1.3", 80, 6);
    t.apply(&entry(CtEventKind::New, 1, a), &r, 0);
    t.reconcile(&[], &r, 10, false);
    assert_eq!(
        t.list(|_| true, 0)[0].end,
        EndReason::Open,
        "its destroy may still be queued"
    );
    t.reconcile(&[], &r, 20, false);
    assert_eq!(t.list(|_| true, 0)[0].end, EndReason::Lost);
    // One that comes back in between is not.
    let b = tuple("10.244.1.2", 2, "10.244.1.3", 80, 6);
    t.apply(&entry(CtEventKind::New, 2, b), &r, 0);
    t.reconcile(&[], &r, 30, false);
    t.reconcile(&[entry(CtEventKind::Dumped, 2, b)], &r, 40, false);
    t.reconcile(&[], &r, 50, false);
    assert_eq!(t.list(|f| f.src.port == 2, 0)[0].end, EndReason::Open);
}

#[test]
fn a_flow_first_seen_at_its_end_is_still_reported() {
    let (mut t, r) = (tracker(), Table::new());
    let mut d = counted(
        entry(CtEventKind::Destroy, 9, tuple("10.244.1.2", 9, "10.244.1.3", 53, 17)),
        100,
        200,
    );
    d.start_ns = Some(3_000_000_000);
    t.apply(&d, &r, 9_000);
    let f = &t.list(|_| true, 0)[0];
    assert_eq!((f.start_ms, f.end_ms, f.end), (3_000, Some(9_000), EndReason::Timeout));
    assert_eq!(f.reverse.bytes, 200);
}

#[test]
fn the_ring_keeps_the_newest_and_listing_filters_and_limits() {
    let r = Table::new();
    let mut t = Tracker::new(Config {
        node: "n1".into(),
        ring: 3,
        ..Config::default()
    });
    for i in 0..5u16 {
        let tu = tuple("10.244.1.2", 100 + i, "10.244.1.3", 80, 6);
        t.apply(&entry(CtEventKind::New, u32::from(i), tu), &r, i64::from(i));
        t.apply(&entry(CtEventKind::Destroy, u32::from(i), tu), &r, i64::from(i));
    }
    let ports: Vec<u16> = t.list(|_| true, 0).iter().map(|f| f.src.port).collect();
    assert_eq!(ports, vec![102, 103, 104]);
    assert_eq!(t.list(|_| true, 2).len(), 2);
    assert_eq!(t.list(|f| f.src.port == 103, 0).len(), 1);
}

#[test]
fn a_flow_carries_the_staged_verdict_beside_the_enforced_one() {
    let (mut t, r) = (tracker(), Table::new());
    t.apply(
        &entry(CtEventKind::New, 1, tuple("10.244.1.2", 40000, "10.244.1.3", 8080, 6)),
        &r,
        1_000,
    );
    t.apply(
        &entry(CtEventKind::New, 2, tuple("10.244.1.2", 40001, "10.244.1.3", 80, 6)),
        &r,
        1_000,
    );
    let all = t.list(|_| true, 0);
    let on = |port: u16| all.iter().find(|f| f.dst.port == port).unwrap();
    assert_eq!(on(8080).verdict, Verdict::Forwarded, "a staged policy enforces nothing");
    let staged = on(8080).staged.as_ref().expect("the preview");
    assert_eq!(staged.verdict, Verdict::Denied);
    assert_eq!(&*staged.policies[0].name, "y/staged-deny");
    assert!(on(80).staged.is_none());
    let mut f = crate::Filter::default();
    f.add("staged=denied").unwrap();
    assert_eq!(t.list(|r| f.matches(r), 0).len(), 1);
}

/// A pod the node learnt of after a flow to it began (the other node's announcement or
/// the watch came late) is named at the flow's next entry: its kind, verdict and
/// policies follow, its later bytes go to its own aggregate, and the flow stays counted
/// once.
#[test]
fn an_end_the_view_learns_of_later_is_named_at_the_next_entry() {
    let mut t = tracker();
    let mut r = Table::new();
    let late: IpAddr = "10.244.2.9".parse().unwrap();
    let tu = tuple("10.244.1.2", 40000, "10.244.2.9", 80, 6);
    t.apply(&entry(CtEventKind::New, 3, tu), &r, 1_000);
    let first = t.take_changes();
    assert_eq!(
        (first[0].dst.kind, first[0].kind),
        (PeerKind::Outside, FlowKind::ToOutside)
    );
    t.reconcile(
        &[counted(entry(CtEventKind::Dumped, 3, tu), 4_000, 100)],
        &r,
        2_000,
        false,
    );
    assert!(
        t.take_changes().is_empty(),
        "nothing new to say while the view has no such pod"
    );

    r.pods.insert(late, ("x", "late", "", "n2"));
    let mut fin = counted(entry(CtEventKind::Dumped, 3, tu), 10_000, 300);
    fin.tcp_state = Some(TcpState::TimeWait);
    fin.status = IPS_SEEN_REPLY;
    t.reconcile(&[fin], &r, 3_000, false);
    let changes = t.take_changes();
    assert!(
        changes
            .iter()
            .any(|c| c.dst.to_string() == "x/late" && c.kind == FlowKind::InterNode),
        "followers and exports learn the new name: {changes:#?}"
    );
    let all = t.list(|_| true, 0);
    assert_eq!(all.len(), 1, "{all:#?}");
    let f = &all[0];
    assert_eq!(
        (f.dst.to_string(), f.kind, f.end),
        ("x/late".into(), FlowKind::InterNode, EndReason::Fin)
    );
    assert_eq!(
        f.policies[0].name.as_ref(),
        "y/allow-web",
        "policy judged the named pod"
    );
    assert_eq!((f.forward.bytes, f.reverse.bytes), (10_000, 300));
    let aggs = t.aggregates().query(0, false, |_| true);
    let of = |dst: &str| {
        aggs.iter()
            .find(|a| &*a.key.dst == dst)
            .map(|a| (a.value.flows, a.value.forward.bytes))
    };
    assert_eq!(of("x/late"), Some((0, 6_000)), "what moved once it was named");
    assert_eq!(of("10.244.2.9"), Some((1, 4_000)), "where it began, counted once");

    // A flow to an address nothing names stays as it is, and is not announced again.
    let out = tuple("10.244.1.2", 40001, "192.0.2.1", 443, 6);
    t.apply(&entry(CtEventKind::New, 4, out), &r, 4_000);
    t.take_changes();
    t.reconcile(
        &[counted(entry(CtEventKind::Dumped, 4, out), 1_000, 10)],
        &r,
        5_000,
        false,
    );
    assert!(t.take_changes().is_empty());
}
