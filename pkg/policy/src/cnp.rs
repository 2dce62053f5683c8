//! ClusterNetworkPolicy read into a checked model: the subject as two selectors, each
//! rule's peers and ports in one form, and the upstream API's "fail closed" rule for
//! what weft cannot evaluate (a peer with no field, `domainNames`, `nodes` with a
//! selector: node labels are not known): such a peer matches nothing in an Accept rule
//! and everything in a Deny or Pass rule.

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use weft_topology::cnp::{CnpMatch, CnpPeer, CnpPort, CnpRule, NamespacedPod};
use weft_topology::{ClusterNetworkPolicy, CnpAction, CnpTier, PortProtocol};

use crate::model::{Direction, PolicyError, PolicyId, PortMatch, Ports};
use crate::selector::Selector;

/// Who a rule of a ClusterNetworkPolicy matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClusterPeer {
    /// Pods (not host-network) of namespaces matching `namespaces` whose labels match
    /// `pods`.
    Pods {
        /// Which namespaces (`{}`: all).
        namespaces: Selector,
        /// Which pods in them (`{}`: all).
        pods: Selector,
    },
    /// Addresses in these CIDRs, pods' too.
    Networks(Vec<IpNet>),
    /// Every node's addresses.
    AllNodes,
    /// What weft cannot evaluate: nothing for Accept, everything for Deny and Pass.
    FailClosed(String),
}

/// One rule: the first that matches decides (Accept, Deny) or hands over (Pass).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterRule {
    /// Its name, for people.
    pub name: String,
    /// What it does.
    pub action: CnpAction,
    /// Its peers (at least one).
    pub peers: Vec<ClusterPeer>,
    /// Its ports; `None`: every port and protocol.
    pub ports: Option<Vec<PortMatch>>,
}

/// A ClusterNetworkPolicy, checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterPolicy {
    /// Its name (cluster-scoped).
    pub name: String,
    /// Its stable short id.
    pub id: PolicyId,
    /// Its tier.
    pub tier: CnpTier,
    /// Its priority (lower first).
    pub priority: i32,
    /// The namespaces of the pods it applies to.
    pub subject_namespaces: Selector,
    /// The pods in them.
    pub subject_pods: Selector,
    /// Ingress rules, in order.
    pub ingress: Vec<ClusterRule>,
    /// Egress rules, in order.
    pub egress: Vec<ClusterRule>,
}

impl ClusterPolicy {
    /// Its rules for `dir`.
    pub fn rules(&self, dir: Direction) -> &[ClusterRule] {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    /// Reads a ClusterNetworkPolicy, refusing what its CRD would.
    pub fn from_k8s(c: &ClusterNetworkPolicy) -> Result<Self, PolicyError> {
        let name = c.metadata.name.clone().unwrap_or_default();
        let fail = |reason: String| PolicyError {
            namespace: String::new(),
            name: name.clone(),
            reason,
        };
        let spec = &c.spec;
        let tier = spec.tier.ok_or_else(|| fail("spec.tier: Admin or Baseline".into()))?;
        if !(0..=1000).contains(&spec.priority) {
            return Err(fail(format!("spec.priority: {} is not 0 to 1000", spec.priority)));
        }
        let sel = |s: &LabelSelector, at: &str| Selector::from_k8s(s).map_err(|e| format!("{at}: {e}"));
        let (subject_namespaces, subject_pods) = match (&spec.subject.namespaces, &spec.subject.pods) {
            (Some(ns), None) => (
                sel(ns, "spec.subject.namespaces").map_err(fail)?,
                Selector::everything(),
            ),
            (None, Some(p)) => (
                sel(&p.namespace_selector, "spec.subject.pods.namespaceSelector").map_err(fail)?,
                sel(&p.pod_selector, "spec.subject.pods.podSelector").map_err(fail)?,
            ),
            _ => return Err(fail("spec.subject: exactly one of namespaces and pods".into())),
        };
        let rules = |list: &[CnpRule], dir: Direction| -> Result<Vec<ClusterRule>, String> {
            list.iter()
                .enumerate()
                .map(|(i, r)| rule(r, dir, &format!("spec.{dir}[{i}]")))
                .collect()
        };
        Ok(ClusterPolicy {
            id: PolicyId::of("", &format!("clusternetworkpolicy/{name}")),
            name: name.clone(),
            tier,
            priority: spec.priority,
            subject_namespaces,
            subject_pods,
            ingress: rules(&spec.ingress, Direction::Ingress).map_err(fail)?,
            egress: rules(&spec.egress, Direction::Egress).map_err(fail)?,
        })
    }
}

fn pods(p: &NamespacedPod, at: &str) -> Result<ClusterPeer, String> {
    Ok(ClusterPeer::Pods {
        namespaces: Selector::from_k8s(&p.namespace_selector).map_err(|e| format!("{at}.namespaceSelector: {e}"))?,
        pods: Selector::from_k8s(&p.pod_selector).map_err(|e| format!("{at}.podSelector: {e}"))?,
    })
}

fn peer(p: &CnpPeer, dir: Direction, at: &str) -> Result<ClusterPeer, String> {
    let set = [
        p.namespaces.is_some(),
        p.pods.is_some(),
        p.nodes.is_some(),
        p.networks.is_some(),
        p.domain_names.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if set > 1 {
        return Err(format!("{at}: more than one kind of peer"));
    }
    let egress_only = p.nodes.is_some() || p.networks.is_some() || p.domain_names.is_some();
    if egress_only && dir == Direction::Ingress {
        return Err(format!("{at}: nodes, networks and domainNames are egress peers"));
    }
    if let Some(ns) = &p.namespaces {
        return Ok(ClusterPeer::Pods {
            namespaces: Selector::from_k8s(ns).map_err(|e| format!("{at}.namespaces: {e}"))?,
            pods: Selector::everything(),
        });
    }
    if let Some(np) = &p.pods {
        return pods(np, &format!("{at}.pods"));
    }
    if let Some(nets) = &p.networks {
        let mut out = Vec::new();
        for (i, n) in nets.iter().enumerate() {
            out.push(
                n.parse::<IpNet>()
                    .map(|n| n.trunc())
                    .map_err(|_| format!("{at}.networks[{i}]: {n:?} is not a CIDR"))?,
            );
        }
        return Ok(ClusterPeer::Networks(out));
    }
    if let Some(nodes) = &p.nodes {
        let s = Selector::from_k8s(nodes).map_err(|e| format!("{at}.nodes: {e}"))?;
        return Ok(if s.is_everything() {
            ClusterPeer::AllNodes
        } else {
            ClusterPeer::FailClosed(format!("{at}.nodes: node labels are not known to weft"))
        });
    }
    if p.domain_names.is_some() {
        return Ok(ClusterPeer::FailClosed(format!("{at}.domainNames: not supported")));
    }
    Ok(ClusterPeer::FailClosed(format!("{at}: a peer of an unknown kind")))
}

fn protocol_ports(
    proto: PortProtocol,
    list: &[weft_topology::cnp::CnpMatchProtocol],
    at: &str,
) -> Result<Vec<PortMatch>, String> {
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let ports = match &m.port {
            None => Ports::All,
            Some(p) => match (p.number, &p.port_range) {
                (Some(n), None) => Ports::One(port_number(n, &format!("{at}[{i}].port.number"))?),
                (None, Some(r)) => range(r.start, r.end, &format!("{at}[{i}].port.portRange"))?,
                _ => return Err(format!("{at}[{i}].port: exactly one of number and portRange")),
            },
        };
        out.push(PortMatch { protocol: proto, ports });
    }
    if list.is_empty() {
        out.push(PortMatch {
            protocol: proto,
            ports: Ports::All,
        });
    }
    Ok(out)
}

fn port_number(n: i32, at: &str) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{at}: {n} is not a port"))
}

fn range(a: i32, b: i32, at: &str) -> Result<Ports, String> {
    let (a, b) = (port_number(a, at)?, port_number(b, at)?);
    if b < a {
        return Err(format!("{at}: end {b} is below start {a}"));
    }
    Ok(Ports::Range(a, b))
}

/// A named port, for whichever protocol the destination pod's port has.
fn named(name: &str) -> Vec<PortMatch> {
    PortProtocol::ALL
        .iter()
        .map(|p| PortMatch {
            protocol: *p,
            ports: Ports::Named(name.to_string()),
        })
        .collect()
}

fn matches(list: &[CnpMatch], at: &str) -> Result<Vec<PortMatch>, String> {
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let kinds = [
            m.tcp.is_some(),
            m.udp.is_some(),
            m.sctp.is_some(),
            m.named_port.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(format!("{at}: exactly one of tcp, udp, sctp and namedPort"));
        }
        if let Some(l) = &m.tcp {
            out.extend(protocol_ports(PortProtocol::Tcp, l, &format!("{at}.tcp"))?);
        }
        if let Some(l) = &m.udp {
            out.extend(protocol_ports(PortProtocol::Udp, l, &format!("{at}.udp"))?);
        }
        if let Some(l) = &m.sctp {
            out.extend(protocol_ports(PortProtocol::Sctp, l, &format!("{at}.sctp"))?);
        }
        if let Some(n) = &m.named_port {
            out.extend(named(n));
        }
    }
    Ok(out)
}

fn ports(list: &[CnpPort], at: &str) -> Result<Vec<PortMatch>, String> {
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let proto = |s: Option<&str>| {
            PortProtocol::parse(s).ok_or_else(|| format!("{at}: protocol {s:?} is not TCP, UDP or SCTP"))
        };
        match (&p.port_number, &p.named_port, &p.port_range) {
            (Some(n), None, None) => out.push(PortMatch {
                protocol: proto(Some(&n.protocol))?,
                ports: Ports::One(port_number(n.port, &format!("{at}.portNumber.port"))?),
            }),
            (None, Some(n), None) => out.extend(named(n)),
            (None, None, Some(r)) => out.push(PortMatch {
                protocol: proto(r.protocol.as_deref())?,
                ports: range(r.start, r.end, &format!("{at}.portRange"))?,
            }),
            _ => return Err(format!("{at}: exactly one of portNumber, namedPort and portRange")),
        }
    }
    Ok(out)
}

fn rule(r: &CnpRule, dir: Direction, at: &str) -> Result<ClusterRule, String> {
    let action = r.action.ok_or_else(|| format!("{at}.action: Accept, Deny or Pass"))?;
    let (list, word) = match dir {
        Direction::Ingress => (&r.from, "from"),
        Direction::Egress => (&r.to, "to"),
    };
    let list = list.as_deref().unwrap_or_default();
    if list.is_empty() {
        return Err(format!("{at}.{word}: at least one peer"));
    }
    let peers = list
        .iter()
        .enumerate()
        .map(|(i, p)| peer(p, dir, &format!("{at}.{word}[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut port_list = Vec::new();
    if let Some(m) = &r.matches {
        port_list.extend(matches(m, &format!("{at}.match"))?);
    }
    if let Some(p) = &r.ports {
        port_list.extend(ports(p, &format!("{at}.ports"))?);
    }
    Ok(ClusterRule {
        name: r.name.clone(),
        action,
        peers,
        ports: (!port_list.is_empty()).then_some(port_list),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cnp(spec: serde_json::Value) -> Result<ClusterPolicy, PolicyError> {
        let c: ClusterNetworkPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "c"}, "spec": spec
        }))
        .unwrap();
        ClusterPolicy::from_k8s(&c)
    }

    #[test]
    fn both_port_forms_and_every_peer_kind_read() {
        let p = cnp(serde_json::json!({
            "tier": "Admin", "priority": 10,
            "subject": {"pods": {"namespaceSelector": {"matchLabels": {"ns": "x"}}, "podSelector": {}}},
            "egress": [
                {"name": "dns", "action": "Accept", "to": [{"namespaces": {}}],
                 "match": [{"udp": [{"port": {"number": 53}}]}, {"tcp": [{"port": {"portRange": {"start": 80, "end": 81}}}]}]},
                {"action": "Deny", "to": [{"networks": ["10.0.0.7/8"]}, {"nodes": {}}, {"nodes": {"matchLabels": {"a": "b"}}}],
                 "ports": [{"portNumber": {"protocol": "TCP", "port": 22}}, {"namedPort": "http"}]},
                {"action": "Pass", "to": [{"domainNames": ["example.com"]}]}
            ]
        }))
        .unwrap();
        assert_eq!(p.tier, CnpTier::Admin);
        let e = &p.egress;
        let ports: Vec<String> = e[0].ports.as_ref().unwrap().iter().map(ToString::to_string).collect();
        assert_eq!(ports, ["53/udp", "80-81/tcp"]);
        assert_eq!(
            e[1].peers[0],
            ClusterPeer::Networks(vec!["10.0.0.0/8".parse().unwrap()])
        );
        assert_eq!(e[1].peers[1], ClusterPeer::AllNodes);
        assert!(matches!(e[1].peers[2], ClusterPeer::FailClosed(_)));
        assert_eq!(
            e[1].ports.as_ref().unwrap().len(),
            4,
            "22/tcp and http on every protocol"
        );
        assert!(matches!(e[2].peers[0], ClusterPeer::FailClosed(_)));
    }

    #[test]
    fn what_the_crd_refuses_is_refused() {
        for (spec, field) in [
            (
                serde_json::json!({"priority": 1, "subject": {"namespaces": {}}}),
                "spec.tier",
            ),
            (
                serde_json::json!({"tier": "Admin", "priority": 1001, "subject": {"namespaces": {}}}),
                "spec.priority",
            ),
            (
                serde_json::json!({"tier": "Admin", "priority": 1, "subject": {}}),
                "spec.subject",
            ),
            (
                serde_json::json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                                   "ingress": [{"action": "Deny", "from": []}]}),
                "spec.ingress[0].from",
            ),
            (
                serde_json::json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                                   "ingress": [{"action": "Deny", "from": [{"networks": ["10.0.0.0/8"]}]}]}),
                "egress peers",
            ),
            (
                serde_json::json!({"tier": "Baseline", "priority": 1, "subject": {"namespaces": {}},
                                   "egress": [{"action": "Deny", "to": [{"namespaces": {}}], "match": [{"tcp": [], "udp": []}]}]}),
                "match[0]",
            ),
        ] {
            let e = cnp(spec).unwrap_err();
            assert!(e.reason.contains(field), "{e} should name {field}");
        }
    }
}
