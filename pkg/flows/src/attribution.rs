//! The [`Resolve`] seam answered from network policy's view of the cluster (the one
//! `weftctl policy explain` evaluates): ends named from its pods and nodes, verdicts
//! and the policies behind them from its evaluation, so a flow's policy is never a
//! second reading of the objects.

use std::net::IpAddr;

use weft_policy::{ClusterView, SideVerdict};
use weft_topology::{CnpAction, PortProtocol};

use crate::record::{Decision, Effect, Peer, PeerKind, PolicyHit, PolicySide, Verdict};
use crate::tracker::Resolve;

/// Answers the tracker's questions from a policy view: who an address is (a pod, a
/// host-network pod or a node's address as its node, else outside) and the verdict.
pub struct ViewResolver<'a> {
    /// The view; `None` before the engine's first pass (every address is outside).
    pub view: Option<&'a ClusterView>,
    /// The view were the staged policy changes made ([`ClusterView::staged`]), when any
    /// are: flows get its verdict beside the enforced one.
    pub staged: Option<&'a ClusterView>,
}

impl Resolve for ViewResolver<'_> {
    fn peer(&self, ip: IpAddr) -> Peer {
        let Some(v) = self.view else {
            return Peer::outside(ip, 0);
        };
        if let Some(p) = v.by_ip.get(&ip) {
            if p.host_network {
                return Peer {
                    kind: PeerKind::Node,
                    node: p.node.as_str().into(),
                    ..Peer::outside(ip, 0)
                };
            }
            return Peer {
                ip,
                port: 0,
                kind: PeerKind::Pod,
                namespace: p.namespace.as_str().into(),
                pod: p.name.as_str().into(),
                workload: p.workload.as_str().into(),
                node: p.node.as_str().into(),
            };
        }
        if let Some(n) = v.nodes.get(&ip) {
            return Peer {
                kind: PeerKind::Node,
                node: n.as_str().into(),
                ..Peer::outside(ip, 0)
            };
        }
        Peer::outside(ip, 0)
    }

    fn decide(&self, src: IpAddr, dst: IpAddr, protocol: u8, port: u16) -> Decision {
        let Some(v) = self.view else {
            return Decision::unpoliced();
        };
        let l4 = match protocol {
            6 => Some((PortProtocol::Tcp, port)),
            17 => Some((PortProtocol::Udp, port)),
            132 => Some((PortProtocol::Sctp, port)),
            _ => None,
        };
        let mut d = decision(&v.verdict_l4(src, dst, l4));
        if let Some(s) = self.staged {
            let preview = decision(&s.verdict_l4(src, dst, l4));
            d.staged = Some((preview.verdict, preview.policies));
        }
        d
    }
}

/// The flow's view of a policy verdict: the sides that deny first, then the ones that
/// allow, each naming the rule that decided (or every isolating policy, when none did).
pub fn decision(v: &weft_policy::Verdict) -> Decision {
    let verdict = if v.allowed() {
        Verdict::Forwarded
    } else if v.passes() {
        Verdict::Audit
    } else {
        Verdict::Denied
    };
    let mut sides = [(PolicySide::Egress, &v.egress), (PolicySide::Ingress, &v.ingress)];
    sides.sort_by_key(|(_, s)| s.allows());
    let mut policies = Vec::new();
    for (side, s) in sides {
        hits(side, s, &mut policies);
    }
    Decision {
        verdict,
        policies,
        staged: None,
    }
}

fn hits(side: PolicySide, s: &SideVerdict, out: &mut Vec<PolicyHit>) {
    if let Some(c) = &s.cluster {
        out.push(PolicyHit {
            domain: c.domains.first().map_or("", String::as_str).into(),
            side,
            kind: "clusternetworkpolicy".into(),
            name: c.policy.as_str().into(),
            rule: u32::try_from(c.rule).ok(),
            rule_name: c.rule_name.as_str().into(),
            effect: match c.action {
                CnpAction::Accept | CnpAction::Pass => Effect::Allow,
                CnpAction::Deny => Effect::Deny,
            },
        });
        return;
    }
    if let Some(r) = &s.allowed_by {
        out.push(PolicyHit {
            domain: "".into(),
            side,
            kind: "networkpolicy".into(),
            name: r.policy.as_str().into(),
            rule: u32::try_from(r.rule).ok(),
            rule_name: "".into(),
            effect: Effect::Allow,
        });
        return;
    }
    for p in &s.isolating {
        out.push(PolicyHit {
            domain: "".into(),
            side,
            kind: "networkpolicy".into(),
            name: p.as_str().into(),
            rule: None,
            rule_name: "".into(),
            effect: Effect::Isolate,
        });
    }
}

#[cfg(test)]
mod tests {
    use weft_policy::{ClusterDecision, RuleRef};
    use weft_topology::CnpTier;

    use super::*;

    #[test]
    fn a_verdict_names_the_denying_side_first_and_the_rule_that_allowed() {
        let v = weft_policy::Verdict {
            egress: SideVerdict {
                policed: true,
                isolating: vec!["x/out".into()],
                allowed_by: Some(RuleRef {
                    policy: "x/out".into(),
                    rule: 1,
                }),
                ..SideVerdict::default()
            },
            ingress: SideVerdict {
                policed: true,
                isolating: vec!["y/in".into(), "y/in2".into()],
                ..SideVerdict::default()
            },
        };
        let d = decision(&v);
        assert_eq!(d.verdict, Verdict::Denied);
        let names: Vec<String> = d.policies.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "ingress isolated by networkpolicy y/in",
                "ingress isolated by networkpolicy y/in2",
                "egress allowed by networkpolicy x/out rule 1"
            ]
        );
        let audit = weft_policy::Verdict {
            ingress: SideVerdict {
                audit: true,
                ..v.ingress.clone()
            },
            ..v.clone()
        };
        assert_eq!(decision(&audit).verdict, Verdict::Audit);
        let cnp = weft_policy::Verdict {
            egress: SideVerdict {
                policed: true,
                cluster: Some(ClusterDecision {
                    tier: CnpTier::Admin,
                    policy: "block".into(),
                    rule: 0,
                    rule_name: "no-db".into(),
                    action: CnpAction::Deny,
                    domains: Vec::new(),
                }),
                ..SideVerdict::default()
            },
            ingress: SideVerdict::default(),
        };
        let d = decision(&cnp);
        assert_eq!(d.verdict, Verdict::Denied);
        assert_eq!(
            d.policies[0].to_string(),
            "egress denied by clusternetworkpolicy block rule 0 (no-db)"
        );
        assert_eq!(decision(&weft_policy::Verdict::default()), Decision::unpoliced());
    }
}
