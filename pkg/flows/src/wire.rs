//! The admin API's form of flows (`weft.admin.v1`): records, aggregates, filters and
//! stats converted in one place, both ways where `weftctl` reads them back.

use std::net::IpAddr;

use weft_rpc::admin as pb;

use crate::aggregate::Aggregate;
use crate::filter::{EndpointSel, Filter};
use crate::record::{
    Counters, Effect, EndReason, FlowKind, FlowRecord, Peer, PeerKind, PolicyHit, PolicySide, Staged, Verdict,
    parse_protocol,
};
use crate::tracker::Stats;

fn counters(c: Counters) -> pb::FlowCounters {
    pb::FlowCounters {
        packets: c.packets,
        bytes: c.bytes,
    }
}

fn counters_of(c: Option<pb::FlowCounters>) -> Counters {
    let c = c.unwrap_or_default();
    Counters {
        packets: c.packets,
        bytes: c.bytes,
    }
}

fn peer_kind(k: PeerKind) -> &'static str {
    match k {
        PeerKind::Pod => "pod",
        PeerKind::Node => "node",
        PeerKind::Outside => "outside",
    }
}

fn peer(p: &Peer) -> pb::FlowPeer {
    pb::FlowPeer {
        ip: p.ip.to_string(),
        port: u32::from(p.port),
        kind: peer_kind(p.kind).into(),
        namespace: p.namespace.to_string(),
        pod: p.pod.to_string(),
        workload: p.workload.to_string(),
        node: p.node.to_string(),
    }
}

fn peer_of(p: Option<pb::FlowPeer>) -> Result<Peer, String> {
    let p = p.ok_or("a flow without an end")?;
    let ip: IpAddr = p.ip.parse().map_err(|_| format!("address {:?}", p.ip))?;
    let kind = match p.kind.as_str() {
        "pod" => PeerKind::Pod,
        "node" => PeerKind::Node,
        "outside" => PeerKind::Outside,
        other => return Err(format!("end kind {other:?}")),
    };
    Ok(Peer {
        ip,
        port: u16::try_from(p.port).map_err(|_| format!("port {}", p.port))?,
        kind,
        namespace: p.namespace.into(),
        pod: p.pod.into(),
        workload: p.workload.into(),
        node: p.node.into(),
    })
}

fn effect(e: Effect) -> &'static str {
    match e {
        Effect::Allow => "allow",
        Effect::Deny => "deny",
        Effect::Isolate => "isolate",
    }
}

fn side(s: PolicySide) -> &'static str {
    match s {
        PolicySide::Egress => "egress",
        PolicySide::Ingress => "ingress",
    }
}

fn hits(h: &[PolicyHit]) -> Vec<pb::FlowPolicy> {
    h.iter()
        .map(|h| pb::FlowPolicy {
            side: side(h.side).into(),
            kind: h.kind.to_string(),
            name: h.name.to_string(),
            rule: h.rule.map_or(-1, |r| r as i32),
            rule_name: h.rule_name.to_string(),
            effect: effect(h.effect).into(),
            domain: h.domain.to_string(),
        })
        .collect()
}

fn hits_of(list: Vec<pb::FlowPolicy>) -> Result<Vec<PolicyHit>, String> {
    let mut policies = Vec::new();
    for p in list {
        policies.push(PolicyHit {
            domain: p.domain.into(),
            side: match p.side.as_str() {
                "egress" => PolicySide::Egress,
                "ingress" => PolicySide::Ingress,
                other => return Err(format!("policy side {other:?}")),
            },
            kind: p.kind.into(),
            name: p.name.into(),
            rule: u32::try_from(p.rule).ok(),
            rule_name: p.rule_name.into(),
            effect: match p.effect.as_str() {
                "allow" => Effect::Allow,
                "deny" => Effect::Deny,
                "isolate" => Effect::Isolate,
                other => return Err(format!("policy effect {other:?}")),
            },
        });
    }
    Ok(policies)
}

/// A record as the admin API sends it.
pub fn flow(r: &FlowRecord) -> pb::Flow {
    pb::Flow {
        id: r.id,
        node: r.node.to_string(),
        start_unix_ms: r.start_ms,
        end_unix_ms: r.end_ms.unwrap_or(0),
        updated_unix_ms: r.updated_ms,
        src: Some(peer(&r.src)),
        dst: Some(peer(&r.dst)),
        dialled: r.dialled.map(|a| a.to_string()).unwrap_or_default(),
        protocol: u32::from(r.protocol),
        kind: r.kind.as_str().into(),
        verdict: r.verdict.as_str().into(),
        policies: hits(&r.policies),
        staged_verdict: r.staged.as_ref().map(|s| s.verdict.as_str().into()).unwrap_or_default(),
        staged_policies: r.staged.as_ref().map(|s| hits(&s.policies)).unwrap_or_default(),
        forward: Some(counters(r.forward)),
        reverse: Some(counters(r.reverse)),
        end: r.end.as_str().into(),
        has_icmp: r.icmp.is_some(),
        icmp_type: r.icmp.map_or(0, |i| u32::from(i.0)),
        icmp_code: r.icmp.map_or(0, |i| u32::from(i.1)),
    }
}

/// A record read back from the admin API.
pub fn record_of(f: pb::Flow) -> Result<FlowRecord, String> {
    let kind = [
        FlowKind::IntraNode,
        FlowKind::InterNode,
        FlowKind::ToOutside,
        FlowKind::FromOutside,
        FlowKind::ToNode,
        FlowKind::FromNode,
    ]
    .into_iter()
    .find(|k| k.as_str() == f.kind)
    .ok_or_else(|| format!("flow kind {:?}", f.kind))?;
    let end = [
        EndReason::Open,
        EndReason::Fin,
        EndReason::Rst,
        EndReason::Timeout,
        EndReason::Denied,
        EndReason::Lost,
    ]
    .into_iter()
    .find(|e| e.as_str() == f.end)
    .ok_or_else(|| format!("end {:?}", f.end))?;
    let policies = hits_of(f.policies)?;
    let staged = if f.staged_verdict.is_empty() {
        None
    } else {
        Some(Box::new(Staged {
            verdict: Verdict::parse(&f.staged_verdict)
                .ok_or_else(|| format!("staged verdict {:?}", f.staged_verdict))?,
            policies: hits_of(f.staged_policies)?.into(),
        }))
    };
    Ok(FlowRecord {
        id: f.id,
        node: f.node.into(),
        start_ms: f.start_unix_ms,
        end_ms: (f.end_unix_ms != 0).then_some(f.end_unix_ms),
        updated_ms: f.updated_unix_ms,
        src: peer_of(f.src)?,
        dst: peer_of(f.dst)?,
        dialled: if f.dialled.is_empty() {
            None
        } else {
            Some(f.dialled.parse().map_err(|_| format!("address {:?}", f.dialled))?)
        },
        protocol: u8::try_from(f.protocol).map_err(|_| format!("protocol {}", f.protocol))?,
        icmp: f.has_icmp.then_some((f.icmp_type as u8, f.icmp_code as u8)),
        kind,
        verdict: Verdict::parse(&f.verdict).ok_or_else(|| format!("verdict {:?}", f.verdict))?,
        policies: policies.into(),
        staged,
        forward: counters_of(f.forward),
        reverse: counters_of(f.reverse),
        end,
    })
}

/// An aggregate as the admin API sends it.
pub fn aggregate(a: &Aggregate) -> pb::FlowAggregate {
    pb::FlowAggregate {
        start_unix_ms: a.start_ms,
        end_unix_ms: a.end_ms,
        src: a.key.src.to_string(),
        dst: a.key.dst.to_string(),
        port: u32::from(a.key.port),
        protocol: u32::from(a.key.protocol),
        kind: a.key.kind.as_str().into(),
        verdict: a.key.verdict.as_str().into(),
        policy: a.key.policy.to_string(),
        flows: a.value.flows,
        forward: Some(counters(a.value.forward)),
        reverse: Some(counters(a.value.reverse)),
    }
}

/// The tracker's stats as the admin API sends them.
pub fn stats(node: &str, s: &Stats, ring: usize) -> pb::FlowStats {
    pb::FlowStats {
        node: node.into(),
        enabled: true,
        problem: String::new(),
        entries: s.entries,
        undecodable: s.undecodable,
        overflows: s.overflows,
        lost_events: s.lost_events,
        denies: s.denies,
        open: s.open,
        kept: s.kept,
        aggregates: s.aggregates,
        gaps: s
            .gaps
            .iter()
            .map(|g| pb::FlowGap {
                from_unix_ms: g.from_ms,
                to_unix_ms: g.to_ms,
                reason: g.reason.clone(),
            })
            .collect(),
        ring: ring as u64,
    }
}

/// The filter a request asks for; the error names what does not parse.
pub fn filter_of(f: &pb::FlowFilter) -> Result<Filter, String> {
    let mut out = Filter {
        since_ms: (f.since_unix_ms != 0).then_some(f.since_unix_ms),
        ..Filter::default()
    };
    for s in &f.from {
        out.from.push(EndpointSel::parse(s)?);
    }
    for s in &f.to {
        out.to.push(EndpointSel::parse(s)?);
    }
    for p in &f.ports {
        out.ports
            .push(u16::try_from(*p).map_err(|_| format!("port {p}: 0-65535"))?);
    }
    for p in &f.protocols {
        out.protocols.push(
            parse_protocol(p).ok_or_else(|| format!("protocol {p:?}: tcp, udp, sctp, icmp, icmpv6 or a number"))?,
        );
    }
    for v in &f.verdicts {
        out.verdicts
            .push(Verdict::parse(v).ok_or_else(|| format!("verdict {v:?}: forwarded, denied or audit"))?);
    }
    for v in &f.staged {
        out.staged
            .push(Verdict::parse(v).ok_or_else(|| format!("staged verdict {v:?}: forwarded, denied or audit"))?);
    }
    out.policies = f.policies.clone();
    if let Some(not) = &f.not {
        out.not = Some(Box::new(filter_of(not)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_record_survives_the_round_trip() {
        let r = FlowRecord {
            id: 9,
            node: "n1".into(),
            start_ms: 1,
            end_ms: Some(5),
            updated_ms: 5,
            src: Peer {
                ip: "10.244.1.2".parse().unwrap(),
                port: 4000,
                kind: PeerKind::Pod,
                namespace: "x".into(),
                pod: "a".into(),
                workload: "Deployment/web".into(),
                node: "n1".into(),
            },
            dst: Peer::outside("fd00::9".parse().unwrap(), 443),
            dialled: Some("10.96.0.1".parse().unwrap()),
            protocol: 6,
            icmp: Some((8, 0)),
            kind: FlowKind::ToOutside,
            verdict: Verdict::Audit,
            policies: Arc::from(vec![PolicyHit {
                domain: "".into(),
                side: PolicySide::Egress,
                kind: "networkpolicy".into(),
                name: "x/p".into(),
                rule: None,
                rule_name: "".into(),
                effect: Effect::Isolate,
            }]),
            staged: None,
            forward: Counters { packets: 3, bytes: 300 },
            reverse: Counters { packets: 2, bytes: 200 },
            end: EndReason::Rst,
        };
        assert_eq!(record_of(flow(&r)).unwrap(), r);
        let mut bad = flow(&r);
        bad.verdict = "maybe".into();
        assert!(record_of(bad).is_err());
    }

    #[test]
    fn a_filter_that_does_not_parse_says_which_part() {
        let f = pb::FlowFilter {
            from: vec!["x/".into()],
            ports: vec![80],
            not: Some(Box::new(pb::FlowFilter {
                verdicts: vec!["denied".into()],
                ..pb::FlowFilter::default()
            })),
            ..pb::FlowFilter::default()
        };
        let parsed = filter_of(&f).unwrap();
        assert_eq!(parsed.ports, vec![80]);
        assert_eq!(parsed.not.unwrap().verdicts, vec![Verdict::Denied]);
        let bad = pb::FlowFilter {
            protocols: vec!["tcpp".into()],
            ..pb::FlowFilter::default()
        };
        assert!(filter_of(&bad).unwrap_err().contains("tcpp"));
        assert!(
            filter_of(&pb::FlowFilter {
                ports: vec![70000],
                ..Default::default()
            })
            .is_err()
        );
    }
}
