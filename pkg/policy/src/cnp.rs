//! ClusterNetworkPolicy read into a checked model: the subject as two selectors, each
//! rule's peers and ports in one form (from any of the three ways ports are written:
//! `protocols`, `match`, `ports`), and upstream's "fail closed" rule for what weft
//! cannot read or evaluate (a field it does not know, a peer or port with no field
//! set, a `domainNames` entry that is no name or in a rule that does not accept): such a rule, if it accepts, matches nothing; if it denies or
//! passes, it denies all ([`crate::problem`]). The rule is rewritten so at reading,
//! so the evaluator and the planner see one meaning and never special-case it.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use weft_fqdn::DomainPattern;
use weft_topology::cnp::{
    CnpMatch, CnpMatchProtocol, CnpPeer, CnpPort, CnpProtocol, CnpProtocolPorts, CnpRule, NamespacedPod,
};
use weft_topology::{ClusterNetworkPolicy, CnpAction, CnpTier, PortProtocol, Strict};

use crate::model::{
    Direction, PolicyId, PolicyMode, PortMatch, Ports, Read, UNKNOWN, mode_problem, port_name, port_number, split_error,
};
use crate::problem::{Cause, Effect, ObjectKind, Place, Problem, RuleAt, place};
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
    /// The addresses of the nodes whose labels match (`{}`: every node): every IP in
    /// their `status.addresses`.
    Nodes(Selector),
    /// The addresses DNS answers gave this node's pods for names matching these
    /// (`domainNames`, egress Accept rules only), each until its TTL ends.
    Domains(Vec<DomainPattern>),
    /// Every address: the peer of a rule that fails closed as "deny all".
    All,
}

/// One rule: the first that matches decides (Accept, Deny) or hands over (Pass).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterRule {
    /// Its name, for people.
    pub name: String,
    /// What it does (`Deny` for a Deny or Pass rule that fails closed).
    pub action: CnpAction,
    /// Its peers (none: it matches nothing).
    pub peers: Vec<ClusterPeer>,
    /// Its ports; `None`: every port and protocol.
    pub ports: Option<Vec<PortMatch>>,
    /// Why it fails closed, when it does (its peers and ports are then not those
    /// written, see the module doc).
    pub fail_closed: Option<String>,
}

impl ClusterRule {
    /// The rule a rule that cannot be read becomes: an Accept matches nothing, anything
    /// else denies all.
    fn closed(name: String, written: Option<CnpAction>, why: String) -> Self {
        let accept = written == Some(CnpAction::Accept);
        ClusterRule {
            name,
            action: if accept { CnpAction::Accept } else { CnpAction::Deny },
            peers: if accept { Vec::new() } else { vec![ClusterPeer::All] },
            ports: None,
            fail_closed: Some(why),
        }
    }

    /// The effect of its failing closed.
    fn effect(written: Option<CnpAction>, at: RuleAt) -> Effect {
        if written == Some(CnpAction::Accept) {
            Effect::MatchesNothing(at)
        } else {
            Effect::DeniesAll(at)
        }
    }
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
    /// Whether it is enforced, staged or staged for removal.
    pub mode: PolicyMode,
}

impl ClusterPolicy {
    /// Its rules for `dir`.
    pub fn rules(&self, dir: Direction) -> &[ClusterRule] {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    /// Reads a ClusterNetworkPolicy built in code (nothing unknown in it).
    pub fn from_k8s(c: &ClusterNetworkPolicy) -> Read<Self> {
        Self::read(&Strict::known(c.clone()))
    }

    /// Reads a ClusterNetworkPolicy, with what it could not read failing closed (see
    /// the module doc): a rule at a time, every rule for a field elsewhere in the spec,
    /// and the whole object refused when its subject, tier or priority cannot be read.
    pub fn read(c: &Strict<ClusterNetworkPolicy>) -> Read<Self> {
        let name = c.object.metadata.name.clone().unwrap_or_default();
        let mut problems = Vec::new();
        let mut problem = |field: String, reason: String, effect: Effect, cause: Cause| {
            problems.push(Problem {
                kind: ObjectKind::ClusterNetworkPolicy,
                namespace: String::new(),
                name: name.clone(),
                field,
                reason,
                effect,
                cause,
            })
        };
        let spec = &c.object.spec;
        let mut refused = false;
        let tier = match spec.tier.as_deref() {
            Some(t) => CnpTier::parse(t).or_else(|| {
                problem(
                    "spec.tier".into(),
                    format!("{t:?} is not Admin or Baseline"),
                    Effect::Refused,
                    Cause::Invalid,
                );
                None
            }),
            None => {
                problem(
                    "spec.tier".into(),
                    "required (Admin or Baseline)".into(),
                    Effect::Refused,
                    Cause::Invalid,
                );
                None
            }
        };
        let priority = match spec.priority {
            Some(p) if (0..=1000).contains(&p) => Some(p),
            Some(p) => {
                problem(
                    "spec.priority".into(),
                    format!("{p} is not 0 to 1000"),
                    Effect::Refused,
                    Cause::Invalid,
                );
                None
            }
            None => {
                problem(
                    "spec.priority".into(),
                    "required (0 to 1000)".into(),
                    Effect::Refused,
                    Cause::Invalid,
                );
                None
            }
        };
        let subject = subject(spec).map_err(|e| {
            let (field, reason) = split_error(&e);
            problem(field, reason, Effect::Refused, Cause::Invalid);
        });
        // Paths of fields weft does not know: in a rule, that rule fails closed; in the
        // subject, nobody knows whom it covers (refused); elsewhere, every rule.
        let mut closed_rules: BTreeMap<RuleAt, String> = BTreeMap::new();
        let mut all_closed = None;
        for path in &c.unknown {
            let why = format!("{path}: {UNKNOWN}");
            match place(path) {
                Place::Rule(at) => {
                    let written = spec
                        .rules_of(at.direction)
                        .get(at.index)
                        .and_then(|r| r.action.as_deref())
                        .and_then(CnpAction::parse);
                    problem(
                        path.clone(),
                        UNKNOWN.into(),
                        ClusterRule::effect(written, at),
                        Cause::UnknownField,
                    );
                    closed_rules.entry(at).or_insert(why);
                }
                Place::Spec if path.starts_with("spec.subject") => {
                    problem(path.clone(), UNKNOWN.into(), Effect::Refused, Cause::UnknownField);
                    refused = true;
                }
                Place::Spec => {
                    problem(
                        path.clone(),
                        UNKNOWN.into(),
                        Effect::AllRulesFailClosed,
                        Cause::UnknownField,
                    );
                    all_closed.get_or_insert(why);
                }
            }
        }
        let mut rules = |dir: Direction| -> Vec<ClusterRule> {
            let list = spec.rules_of(dir);
            list.iter()
                .enumerate()
                .map(|(index, r)| {
                    let at = RuleAt { direction: dir, index };
                    let written = r.action.as_deref().and_then(CnpAction::parse);
                    if let Some(why) = all_closed.as_ref().or(closed_rules.get(&at)) {
                        return ClusterRule::closed(r.name.clone(), written, why.clone());
                    }
                    match rule(r, dir, &format!("spec.{dir}[{index}]")) {
                        Ok(rule) => rule,
                        Err(Unread(e, cause)) => {
                            let (field, reason) = split_error(&e);
                            problem(field, reason, ClusterRule::effect(written, at), cause);
                            ClusterRule::closed(r.name.clone(), written, e)
                        }
                    }
                })
                .collect()
        };
        let (ingress, egress) = (rules(Direction::Ingress), rules(Direction::Egress));
        let mode = PolicyMode::read(&c.object.metadata).unwrap_or_else(|e| {
            let (field, reason) = mode_problem(e);
            problem(field, reason, Effect::EnforcedAsWritten, Cause::Invalid);
            PolicyMode::Enforced
        });
        let policy = match (tier, priority, subject) {
            (Some(tier), Some(priority), Ok((subject_namespaces, subject_pods))) if !refused => Some(ClusterPolicy {
                id: PolicyId::of("", &format!("clusternetworkpolicy/{name}")),
                name: name.clone(),
                tier,
                priority,
                subject_namespaces,
                subject_pods,
                ingress,
                egress,
                mode,
            }),
            _ => None,
        };
        problems.sort();
        problems.dedup();
        Read { policy, problems }
    }
}

/// The subject's two selectors.
fn subject(spec: &weft_topology::ClusterNetworkPolicySpec) -> Result<(Selector, Selector), String> {
    let sel = |s: &LabelSelector, at: &str| Selector::from_k8s(s).map_err(|e| format!("{at}: {e}"));
    match (&spec.subject.namespaces, &spec.subject.pods) {
        (Some(ns), None) => Ok((sel(ns, "spec.subject.namespaces")?, Selector::everything())),
        (None, Some(p)) => {
            let (ns, pods) = pod_selectors(p, "spec.subject.pods")?;
            Ok((ns, pods))
        }
        _ => Err("spec.subject: exactly one of namespaces and pods".into()),
    }
}

/// The namespace and pod selectors of a `pods` subject or peer.
fn pod_selectors(p: &NamespacedPod, at: &str) -> Result<(Selector, Selector), String> {
    let namespaces = Selector::from_k8s(&p.namespace_selector).map_err(|e| format!("{at}.namespaceSelector: {e}"))?;
    let pods = match &p.pod_selector {
        Some(s) => Selector::from_k8s(s).map_err(|e| format!("{at}.podSelector: {e}"))?,
        None => return Err(format!("{at}.podSelector: required")),
    };
    Ok((namespaces, pods))
}

/// The rules of a direction, as the spec holds them.
trait RulesOf {
    fn rules_of(&self, dir: Direction) -> &[CnpRule];
}

impl RulesOf for weft_topology::ClusterNetworkPolicySpec {
    fn rules_of(&self, dir: Direction) -> &[CnpRule] {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// Why a rule could not be read: `field: reason`, and the cause.
struct Unread(String, Cause);

impl From<String> for Unread {
    fn from(e: String) -> Self {
        Unread(e, Cause::Invalid)
    }
}

fn peer(p: &CnpPeer, dir: Direction, at: &str) -> Result<ClusterPeer, Unread> {
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
    match set {
        0 => {
            return Err(Unread(
                format!("{at}: a peer with no field weft knows (a newer API?)"),
                Cause::UnknownField,
            ));
        }
        1 => {}
        _ => return Err(format!("{at}: more than one kind of peer").into()),
    }
    let egress_only = p.nodes.is_some() || p.networks.is_some() || p.domain_names.is_some();
    if egress_only && dir == Direction::Ingress {
        return Err(format!("{at}: nodes, networks and domainNames are egress peers").into());
    }
    if let Some(ns) = &p.namespaces {
        return Ok(ClusterPeer::Pods {
            namespaces: Selector::from_k8s(ns).map_err(|e| format!("{at}.namespaces: {e}"))?,
            pods: Selector::everything(),
        });
    }
    if let Some(np) = &p.pods {
        let (namespaces, pods) = pod_selectors(np, &format!("{at}.pods"))?;
        return Ok(ClusterPeer::Pods { namespaces, pods });
    }
    if let Some(nets) = &p.networks {
        if nets.is_empty() {
            return Err(format!("{at}.networks: at least one CIDR").into());
        }
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
        return Ok(ClusterPeer::Nodes(
            Selector::from_k8s(nodes).map_err(|e| format!("{at}.nodes: {e}"))?,
        ));
    }
    let names = p.domain_names.as_deref().unwrap_or_default();
    if names.is_empty() {
        return Err(format!("{at}.domainNames: at least one name").into());
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        out.push(DomainPattern::parse(n).map_err(|e| format!("{at}.domainNames[{i}]: {e}"))?);
    }
    Ok(ClusterPeer::Domains(out))
}

/// A named port, for whichever protocol the destination pod's port has.
fn named(name: &str, at: &str) -> Result<Vec<PortMatch>, String> {
    if !port_name(name) {
        return Err(format!("{at}: {name:?} is not a port name"));
    }
    Ok(PortMatch::named_any(name))
}

fn range(a: i32, b: i32, at: &str, strict: bool) -> Result<Ports, String> {
    let (a, b) = (port_number(a, at)?, port_number(b, at)?);
    if b < a || (strict && a == b) {
        return Err(format!("{at}: start {a} must be below end {b}"));
    }
    Ok(Ports::Range(a, b))
}

/// The released API's `protocols` list.
fn protocols(list: &[CnpProtocol], at: &str) -> Result<Vec<PortMatch>, String> {
    if list.is_empty() {
        return Err(format!(
            "{at}: empty (the API requires at least one entry; absent is every port)"
        ));
    }
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let given: Vec<(PortProtocol, &CnpProtocolPorts)> = [
            (PortProtocol::Tcp, &p.tcp),
            (PortProtocol::Udp, &p.udp),
            (PortProtocol::Sctp, &p.sctp),
        ]
        .into_iter()
        .filter_map(|(proto, v)| v.as_ref().map(|v| (proto, v)))
        .collect();
        match (given.as_slice(), &p.destination_named_port) {
            ([], Some(n)) => out.extend(named(n, &format!("{at}.destinationNamedPort"))?),
            ([(proto, ports)], None) => {
                let at = format!("{at}.{proto}");
                let port = ports
                    .destination_port
                    .as_ref()
                    .ok_or_else(|| format!("{at}: no destinationPort (a field weft does not know?)"))?;
                let ports = match (port.number, &port.range) {
                    (Some(n), None) => Ports::One(port_number(n, &format!("{at}.destinationPort.number"))?),
                    (None, Some(r)) => {
                        let at = format!("{at}.destinationPort.range");
                        match (r.start, r.end) {
                            (Some(a), Some(b)) => range(a, b, &at, true)?,
                            _ => return Err(format!("{at}: start and end are required")),
                        }
                    }
                    _ => return Err(format!("{at}.destinationPort: exactly one of number and range")),
                };
                out.push(PortMatch {
                    protocol: *proto,
                    ports,
                });
            }
            _ => return Err(format!("{at}: exactly one of tcp, udp, sctp and destinationNamedPort")),
        }
    }
    Ok(out)
}

/// The earlier drafts' `match` list.
fn matches(list: &[CnpMatch], at: &str) -> Result<Vec<PortMatch>, String> {
    if list.is_empty() {
        return Err(format!("{at}: empty (absent is every port)"));
    }
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
        for (proto, list) in [
            (PortProtocol::Tcp, &m.tcp),
            (PortProtocol::Udp, &m.udp),
            (PortProtocol::Sctp, &m.sctp),
        ] {
            if let Some(l) = list {
                out.extend(protocol_ports(proto, l, &format!("{at}.{proto}"))?);
            }
        }
        if let Some(n) = &m.named_port {
            out.extend(named(n, &format!("{at}.namedPort"))?);
        }
    }
    Ok(out)
}

/// One protocol's list in the `match` form (empty, or an entry without a port: every
/// port of the protocol).
fn protocol_ports(proto: PortProtocol, list: &[CnpMatchProtocol], at: &str) -> Result<Vec<PortMatch>, String> {
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let ports = match &m.port {
            None => Ports::All,
            Some(p) => match (p.number, &p.port_range) {
                (Some(n), None) => Ports::One(port_number(n, &format!("{at}[{i}].port.number"))?),
                (None, Some(r)) => range(r.start, r.end, &format!("{at}[{i}].port.portRange"), false)?,
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

/// AdminNetworkPolicy's `ports` list.
fn ports(list: &[CnpPort], at: &str) -> Result<Vec<PortMatch>, String> {
    if list.is_empty() {
        return Err(format!("{at}: empty (absent is every port)"));
    }
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
            (None, Some(n), None) => out.extend(named(n, &format!("{at}.namedPort"))?),
            (None, None, Some(r)) => out.push(PortMatch {
                protocol: proto(r.protocol.as_deref())?,
                ports: range(r.start, r.end, &format!("{at}.portRange"), false)?,
            }),
            _ => return Err(format!("{at}: exactly one of portNumber, namedPort and portRange")),
        }
    }
    Ok(out)
}

fn rule(r: &CnpRule, dir: Direction, at: &str) -> Result<ClusterRule, Unread> {
    let action = match r.action.as_deref() {
        Some(a) => CnpAction::parse(a).ok_or_else(|| format!("{at}.action: {a:?} is not Accept, Deny or Pass"))?,
        None => return Err(format!("{at}.action: required (Accept, Deny or Pass)").into()),
    };
    let (list, word) = match dir {
        Direction::Ingress => (&r.from, "from"),
        Direction::Egress => (&r.to, "to"),
    };
    let list = list.as_deref().unwrap_or_default();
    if list.is_empty() {
        return Err(format!("{at}.{word}: at least one peer").into());
    }
    let peers = list
        .iter()
        .enumerate()
        .map(|(i, p)| peer(p, dir, &format!("{at}.{word}[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let forms = [r.protocols.is_some(), r.matches.is_some(), r.ports.is_some()];
    let ports = match forms.iter().filter(|f| **f).count() {
        0 => None,
        1 => Some(if let Some(p) = &r.protocols {
            protocols(p, &format!("{at}.protocols"))?
        } else if let Some(m) = &r.matches {
            matches(m, &format!("{at}.match"))?
        } else {
            ports(r.ports.as_deref().unwrap_or_default(), &format!("{at}.ports"))?
        }),
        _ => return Err(format!("{at}: ports in more than one of protocols, match and ports").into()),
    };
    // Upstream's validation: domainNames only in an Accept rule (a name's addresses
    // are learnt from answers; denying by them would be only as good as the answers
    // seen, and the API refuses it).
    if action != CnpAction::Accept && peers.iter().any(|p| matches!(p, ClusterPeer::Domains(_))) {
        return Err(
            format!("{at}: domainNames only in Accept rules (the API refuses a {action:?} rule with them)").into(),
        );
    }
    // Upstream's validation: a named port cannot be asked of a peer that is no pod.
    let named_port = ports.iter().flatten().any(|p| matches!(p.ports, Ports::Named(_)));
    if named_port && peers.iter().any(|p| !matches!(p, ClusterPeer::Pods { .. })) {
        return Err(format!("{at}: a named port with a networks or nodes peer (they have no named ports)").into());
    }
    Ok(ClusterRule {
        name: r.name.clone(),
        action,
        peers,
        ports,
        fail_closed: None,
    })
}

#[cfg(test)]
mod tests;
