//! Which flows a reader wants: the selectors of `weftctl flows`, parsed once and
//! matched against records by the daemon (so only what is asked crosses the socket).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::record::{FlowRecord, Peer, PeerKind, Verdict, parse_protocol};

/// One end as a reader names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointSel {
    /// `namespace/pod`.
    Pod {
        /// The namespace.
        namespace: String,
        /// The pod.
        name: String,
    },
    /// `namespace/`: every pod of a namespace.
    Namespace(String),
    /// `namespace/Kind/name`: the pods of a workload (`default/Deployment/web`).
    Workload {
        /// The namespace.
        namespace: String,
        /// `Kind/name`.
        workload: String,
    },
    /// An address or a CIDR.
    Cidr(IpNet),
    /// `node:NAME`: a node's addresses and the pods it runs.
    Node(String),
    /// `outside`: anything that is neither a pod nor a node.
    Outside,
}

impl EndpointSel {
    /// Parses `ns/pod`, `ns/`, `ns/Kind/name`, an address or CIDR, `node:NAME` or
    /// `outside`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("outside") || s.eq_ignore_ascii_case("world") {
            return Ok(EndpointSel::Outside);
        }
        if let Some(node) = s.strip_prefix("node:") {
            if node.is_empty() {
                return Err(format!("{s:?}: node:NAME"));
            }
            return Ok(EndpointSel::Node(node.to_string()));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(EndpointSel::Cidr(IpNet::from(ip)));
        }
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(EndpointSel::Cidr(net.trunc()));
        }
        let parts: Vec<&str> = s.split('/').collect();
        match parts.as_slice() {
            [ns, ""] if !ns.is_empty() => Ok(EndpointSel::Namespace(ns.to_string())),
            [ns, pod] if !ns.is_empty() && !pod.is_empty() => Ok(EndpointSel::Pod {
                namespace: ns.to_string(),
                name: pod.to_string(),
            }),
            [ns, kind, name] if ![ns, kind, name].iter().any(|p| p.is_empty()) => Ok(EndpointSel::Workload {
                namespace: ns.to_string(),
                workload: format!("{kind}/{name}"),
            }),
            _ => Err(format!(
                "{s:?}: an end is ns/pod, ns/ (a namespace), ns/Kind/name (a workload), an address or CIDR, node:NAME, or outside"
            )),
        }
    }

    /// Whether `p` is one of the ends this names.
    pub fn matches(&self, p: &Peer) -> bool {
        match self {
            EndpointSel::Pod { namespace, name } => {
                p.kind == PeerKind::Pod && *p.namespace == **namespace && *p.pod == **name
            }
            EndpointSel::Namespace(ns) => p.kind == PeerKind::Pod && *p.namespace == **ns,
            EndpointSel::Workload { namespace, workload } => {
                p.kind == PeerKind::Pod && *p.namespace == **namespace && *p.workload == **workload
            }
            EndpointSel::Cidr(net) => net.contains(&p.ip),
            EndpointSel::Node(n) => matches!(p.kind, PeerKind::Pod | PeerKind::Node) && *p.node == **n,
            EndpointSel::Outside => p.kind == PeerKind::Outside,
        }
    }
}

/// The flows a reader asks for: every criterion given must hold (within one criterion,
/// any of its values), and none of `not`'s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Flows that began (or are still open) at or after this time (Unix ms).
    pub since_ms: Option<i64>,
    /// The source is one of these.
    pub from: Vec<EndpointSel>,
    /// The destination is one of these.
    pub to: Vec<EndpointSel>,
    /// The destination port is one of these.
    pub ports: Vec<u16>,
    /// The protocol is one of these (IP protocol numbers).
    pub protocols: Vec<u8>,
    /// The verdict is one of these.
    pub verdicts: Vec<Verdict>,
    /// The staged policies' verdict is one of these (a flow without one matches none).
    pub staged: Vec<Verdict>,
    /// One of these policies (`namespace/name` of a NetworkPolicy, `name` of a
    /// ClusterNetworkPolicy) took part in the verdict.
    pub policies: Vec<String>,
    /// Flows this matches are left out (each of its criteria left empty matches all,
    /// so an empty `not` leaves out nothing: see [`Filter::is_empty`]).
    pub not: Option<Box<Filter>>,
}

/// The keys of [`Filter::add`].
pub const KEYS: &str = "from, to, port, protocol, verdict, staged, policy";

impl Filter {
    /// Whether nothing is asked (every flow matches).
    pub fn is_empty(&self) -> bool {
        self.since_ms.is_none()
            && self.from.is_empty()
            && self.to.is_empty()
            && self.ports.is_empty()
            && self.protocols.is_empty()
            && self.verdicts.is_empty()
            && self.staged.is_empty()
            && self.policies.is_empty()
            && self.not.as_ref().is_none_or(|n| n.is_empty())
    }

    /// Whether `r` is asked for.
    pub fn matches(&self, r: &FlowRecord) -> bool {
        self.positive(r) && !self.not.as_ref().is_some_and(|n| !n.is_empty() && n.positive(r))
    }

    fn positive(&self, r: &FlowRecord) -> bool {
        let any = |list: &[EndpointSel], p: &Peer| list.is_empty() || list.iter().any(|s| s.matches(p));
        self.since_ms
            .is_none_or(|t| r.start_ms >= t || r.end_ms.is_none_or(|e| e >= t))
            && any(&self.from, &r.src)
            && any(&self.to, &r.dst)
            && (self.ports.is_empty() || self.ports.contains(&r.port()))
            && (self.protocols.is_empty() || self.protocols.contains(&r.protocol))
            && (self.verdicts.is_empty() || self.verdicts.contains(&r.verdict))
            && (self.staged.is_empty() || r.staged.as_ref().is_some_and(|s| self.staged.contains(&s.verdict)))
            && (self.policies.is_empty() || r.policies.iter().any(|h| self.policies.iter().any(|p| **p == *h.name)))
    }

    /// Adds one `KEY=VALUE` criterion (`from`, `to`, `port`, `protocol`, `verdict`,
    /// `staged`, `policy`), as `weftctl flows --not` takes them.
    pub fn add(&mut self, criterion: &str) -> Result<(), String> {
        let (key, value) = criterion
            .split_once('=')
            .ok_or_else(|| format!("{criterion:?}: KEY=VALUE, KEY one of {KEYS}"))?;
        match key.trim() {
            "from" => self.from.push(EndpointSel::parse(value)?),
            "to" => self.to.push(EndpointSel::parse(value)?),
            "port" => self
                .ports
                .push(value.trim().parse().map_err(|_| format!("port {value:?}: 0-65535"))?),
            "protocol" => self.protocols.push(
                parse_protocol(value)
                    .ok_or_else(|| format!("protocol {value:?}: tcp, udp, sctp, icmp, icmpv6 or a number"))?,
            ),
            "verdict" => self
                .verdicts
                .push(Verdict::parse(value).ok_or_else(|| format!("verdict {value:?}: forwarded, denied or audit"))?),
            "staged" => self
                .staged
                .push(Verdict::parse(value).ok_or_else(|| format!("staged {value:?}: forwarded, denied or audit"))?),
            "policy" => self.policies.push(value.trim().to_string()),
            other => return Err(format!("{other:?}: one of {KEYS}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Counters, EndReason, FlowKind};

    fn pod(ns: &str, name: &str, workload: &str, node: &str, ip: &str, port: u16) -> Peer {
        Peer {
            ip: ip.parse().unwrap(),
            port,
            kind: PeerKind::Pod,
            namespace: ns.into(),
            pod: name.into(),
            workload: workload.into(),
            node: node.into(),
        }
    }

    fn record(src: Peer, dst: Peer, verdict: Verdict) -> FlowRecord {
        FlowRecord {
            id: 1,
            node: "n1".into(),
            start_ms: 1000,
            end_ms: None,
            updated_ms: 1000,
            kind: FlowKind::of(&src, &dst).unwrap(),
            src,
            dst,
            dialled: None,
            protocol: 6,
            icmp: None,
            verdict,
            policies: Vec::new().into(),
            staged: None,
            forward: Counters::default(),
            reverse: Counters::default(),
            end: EndReason::Open,
        }
    }

    #[test]
    fn ends_read_as_people_write_them() {
        assert_eq!(
            EndpointSel::parse("x/a").unwrap(),
            EndpointSel::Pod {
                namespace: "x".into(),
                name: "a".into()
            }
        );
        assert_eq!(EndpointSel::parse("x/").unwrap(), EndpointSel::Namespace("x".into()));
        assert_eq!(
            EndpointSel::parse("x/Deployment/web").unwrap(),
            EndpointSel::Workload {
                namespace: "x".into(),
                workload: "Deployment/web".into()
            }
        );
        assert_eq!(
            EndpointSel::parse("10.0.0.0/8").unwrap(),
            EndpointSel::Cidr("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            EndpointSel::parse("10.1.2.3/8").unwrap(),
            EndpointSel::Cidr("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            EndpointSel::parse("fd00::1").unwrap(),
            EndpointSel::Cidr("fd00::1/128".parse().unwrap())
        );
        assert_eq!(EndpointSel::parse("node:n2").unwrap(), EndpointSel::Node("n2".into()));
        assert_eq!(EndpointSel::parse("outside").unwrap(), EndpointSel::Outside);
        for bad in ["", "/a", "a//b", "node:", "a/b/c/d"] {
            assert!(EndpointSel::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_criterion_must_hold_and_not_leaves_out() {
        let a = pod("x", "a", "Deployment/web", "n1", "10.244.1.2", 40000);
        let b = pod("y", "b", "", "n2", "10.244.2.3", 80);
        let r = record(a.clone(), b.clone(), Verdict::Forwarded);
        let mut f = Filter::default();
        assert!(f.is_empty() && f.matches(&r));
        f.add("from=x/Deployment/web").unwrap();
        f.add("to=y/").unwrap();
        f.add("port=80").unwrap();
        f.add("protocol=TCP").unwrap();
        assert!(f.matches(&r));
        f.verdicts.push(Verdict::Denied);
        assert!(!f.matches(&r), "the verdict differs");
        f.verdicts.push(Verdict::Forwarded);
        assert!(f.matches(&r), "any of one criterion's values");
        let mut not = Filter::default();
        not.add("to=node:n2").unwrap();
        f.not = Some(Box::new(not));
        assert!(!f.matches(&r), "b runs on n2: left out");
        f.not = Some(Box::default());
        assert!(f.matches(&r), "an empty not leaves out nothing");
        let reverse = record(b, a, Verdict::Forwarded);
        assert!(!f.matches(&reverse));
        assert!(Filter::default().add("color=red").is_err());
        assert!(Filter::default().add("port=http").is_err());
        assert!(Filter::default().add("verdict=maybe").is_err());
    }
}
