//! A `networking.k8s.io/v1` NetworkPolicy read into a checked model: the defaults of
//! `policyTypes` applied, peers and ports in one form each, CIDRs parsed. What the API
//! server would refuse, and fields weft does not know, are never skipped: the part that
//! cannot be read fails closed ([`crate::problem`]) and is reported, one policy at a
//! time, so one bad object never stops the others.

use std::fmt;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};
use weft_topology::{PortProtocol, Strict};

use crate::problem::{Cause, Effect, ObjectKind, Place, Problem, RuleAt, place};

/// The reason given for a field weft does not know.
pub(crate) const UNKNOWN: &str = "not a field weft knows";
pub use crate::direction::Direction;
use crate::selector::Selector;

/// A stable short name for a policy (from its namespace and name), the same on every
/// node and across restarts: nftables objects of a policy carry it. 48 bits, written
/// as 12 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(pub u64);

impl PolicyId {
    /// The id of policy `namespace/name` (the first 6 bytes of a SHA-256).
    pub fn of(namespace: &str, name: &str) -> Self {
        let h = Sha256::digest(format!("networkpolicy/{namespace}/{name}").as_bytes());
        let mut b = [0u8; 8];
        b[2..].copy_from_slice(&h[..6]);
        PolicyId(u64::from_be_bytes(b))
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:012x}", self.0)
    }
}

/// Which namespaces a pod peer may be in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Namespaces {
    /// The policy's own (a `podSelector` alone).
    Own,
    /// Those whose labels match (`namespaceSelector`; `{}` is every namespace).
    Matching(Selector),
}

/// Who a rule lets in (ingress) or out to (egress).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Pods matching `pods` in the namespaces `namespaces` says.
    Pods {
        /// Where.
        namespaces: Namespaces,
        /// Which (`{}` when only a namespace selector was given).
        pods: Selector,
    },
    /// Addresses in `cidr` but in no `except` range, pods' or not.
    Block {
        /// The block.
        cidr: IpNet,
        /// Ranges inside it that are left out.
        except: Vec<IpNet>,
    },
}

/// Which destination ports of one protocol a rule takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ports {
    /// Every port (a port entry with a protocol only).
    All,
    /// One port.
    One(u16),
    /// `port` to `endPort`, both included.
    Range(u16, u16),
    /// The port the destination pod names so (a pod without that name: none).
    Named(String),
}

/// One entry of a rule's `ports`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortMatch {
    /// The protocol.
    pub protocol: PortProtocol,
    /// The ports.
    pub ports: Ports,
}

impl PortMatch {
    /// The port named `name` of whichever protocol the destination pod's port of that
    /// name has (ClusterNetworkPolicy names ports without a protocol).
    pub fn named_any(name: &str) -> Vec<PortMatch> {
        PortProtocol::ALL
            .iter()
            .map(|p| PortMatch {
                protocol: *p,
                ports: Ports::Named(name.to_string()),
            })
            .collect()
    }
}

impl fmt::Display for PortMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ports {
            Ports::All => write!(f, "{}", self.protocol),
            Ports::One(p) => write!(f, "{p}/{}", self.protocol),
            Ports::Range(a, b) => write!(f, "{a}-{b}/{}", self.protocol),
            Ports::Named(n) => write!(f, "{n}/{}", self.protocol),
        }
    }
}

/// One ingress or egress rule: traffic passes when it is to or from one of `peers` and
/// to one of `ports`. `None` is "every" (the field absent or empty).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// `from` (ingress) or `to` (egress).
    pub peers: Option<Vec<Peer>>,
    /// `ports`.
    pub ports: Option<Vec<PortMatch>>,
}

/// A NetworkPolicy, checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Its namespace: it selects pods of this namespace only.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its stable short id.
    pub id: PolicyId,
    /// The pods it selects (`spec.podSelector`).
    pub selector: Selector,
    /// `Some` when it isolates the pods it selects for ingress (with the rules that
    /// allow; none: nothing is allowed in).
    pub ingress: Option<Vec<Rule>>,
    /// The same for egress.
    pub egress: Option<Vec<Rule>>,
    /// Whether it is enforced, staged or staged for removal.
    pub mode: PolicyMode,
}

/// What a policy object's `weft.dev/policy-mode` annotation asks: enforcement, or a
/// preview of a change on live traffic (flows show the staged verdict beside the
/// enforced one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PolicyMode {
    /// Enforced (no annotation).
    #[default]
    Enforced,
    /// `staged`: evaluated as if enforced, not enforced.
    Staged,
    /// `staged-removal`: enforced, and evaluated as if it were gone.
    StagedRemoval,
}

impl PolicyMode {
    /// The annotation's values.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyMode::Enforced => "enforced",
            PolicyMode::Staged => "staged",
            PolicyMode::StagedRemoval => "staged-removal",
        }
    }

    /// The mode `meta`'s annotation asks for; a value weft does not know is an error
    /// (the policy is then enforced as written: a preview is never read wider than
    /// asked).
    pub fn read(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Result<Self, String> {
        match weft_topology::objects::policy_mode(meta) {
            None | Some("enforced") => Ok(PolicyMode::Enforced),
            Some("staged") => Ok(PolicyMode::Staged),
            Some("staged-removal") => Ok(PolicyMode::StagedRemoval),
            Some(other) => Err(format!(
                "{other:?} is not a policy mode (staged, staged-removal, enforced)"
            )),
        }
    }
}

/// The problem of an unknown mode on a policy object.
pub(crate) fn mode_problem(reason: String) -> (String, String) {
    (
        format!(
            "metadata.annotations[{}]",
            weft_topology::objects::POLICY_MODE_ANNOTATION
        ),
        reason,
    )
}

impl Policy {
    /// Its rules for `dir`, when it isolates that way.
    pub fn rules(&self, dir: Direction) -> Option<&[Rule]> {
        match dir {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A policy object as read: what weft enforces of it (`None`: nothing, it is refused)
/// and everything it could not read, each with what it does instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read<T> {
    /// What is enforced.
    pub policy: Option<T>,
    /// What could not be read.
    pub problems: Vec<Problem>,
}

impl<T> Read<T> {
    /// The policy when it was read whole (tests, and `lab apply`, which refuses any
    /// problem); the problems otherwise.
    pub fn clean(self) -> Result<T, Vec<Problem>> {
        match self.policy {
            Some(p) if self.problems.is_empty() => Ok(p),
            _ => Err(self.problems),
        }
    }
}

fn cidr(s: &str, what: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("{what}: {s:?} is not a CIDR"))
}

fn peer(p: &NetworkPolicyPeer, at: &str) -> Result<Peer, String> {
    if let Some(block) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err(format!("{at}: ipBlock with a selector beside it"));
        }
        let net = cidr(&block.cidr, &format!("{at}.ipBlock.cidr"))?;
        let mut except = Vec::new();
        for (i, e) in block.except.iter().flatten().enumerate() {
            let x = cidr(e, &format!("{at}.ipBlock.except[{i}]"))?;
            if x.addr().is_ipv4() != net.addr().is_ipv4() || !net.contains(&x) || x == net {
                return Err(format!("{at}.ipBlock.except[{i}]: {x} is not inside {net}"));
            }
            except.push(x);
        }
        return Ok(Peer::Block { cidr: net, except });
    }
    let sel = |s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>, what: &str| {
        s.as_ref()
            .map(Selector::from_k8s)
            .transpose()
            .map_err(|e| format!("{at}.{what}: {e}"))
    };
    let pods = sel(&p.pod_selector, "podSelector")?;
    let namespaces = sel(&p.namespace_selector, "namespaceSelector")?;
    match (pods, namespaces) {
        (None, None) => Err(format!("{at}: a peer needs podSelector, namespaceSelector or ipBlock")),
        (Some(pods), None) => Ok(Peer::Pods {
            namespaces: Namespaces::Own,
            pods,
        }),
        (pods, Some(ns)) => Ok(Peer::Pods {
            namespaces: Namespaces::Matching(ns),
            pods: pods.unwrap_or_default(),
        }),
    }
}

/// A port number (1 to 65535) named `at` in errors.
pub(crate) fn port_number(n: i32, at: &str) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{at}: {n} is not a port"))
}

/// Whether `s` is a container port's name (IANA_SVC_NAME: 1-15 lower-case letters,
/// digits and '-', with a letter, no '-' at either end or twice in a row).
pub(crate) fn port_name(s: &str) -> bool {
    s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn port(p: &NetworkPolicyPort, at: &str) -> Result<PortMatch, String> {
    let protocol = PortProtocol::parse(p.protocol.as_deref())
        .ok_or_else(|| format!("{at}.protocol: {:?} is not TCP, UDP or SCTP", p.protocol))?;
    let ports = match (&p.port, p.end_port) {
        (None, None) => Ports::All,
        (None, Some(_)) => return Err(format!("{at}.endPort: needs a port")),
        (Some(IntOrString::Int(n)), None) => Ports::One(port_number(*n, &format!("{at}.port"))?),
        (Some(IntOrString::Int(n)), Some(end)) => {
            let (a, b) = (
                port_number(*n, &format!("{at}.port"))?,
                port_number(end, &format!("{at}.endPort"))?,
            );
            if b < a {
                return Err(format!("{at}.endPort: {b} is below port {a}"));
            }
            Ports::Range(a, b)
        }
        (Some(IntOrString::String(s)), end) => {
            if end.is_some() {
                return Err(format!("{at}.endPort: not with a named port"));
            }
            match s.parse::<i32>() {
                // The API server keeps a number written as a string as a number.
                Ok(n) => Ports::One(port_number(n, &format!("{at}.port"))?),
                Err(_) if !port_name(s) => return Err(format!("{at}.port: {s:?} is not a port name")),
                Err(_) => Ports::Named(s.clone()),
            }
        }
    };
    Ok(PortMatch { protocol, ports })
}

/// One rule, from the fields both directions have: its peers (`from` or `to`, named
/// `word` in errors) and its ports.
fn rule(
    peers: Option<&Vec<NetworkPolicyPeer>>,
    ports: Option<&Vec<NetworkPolicyPort>>,
    at: &str,
    word: &str,
) -> Result<Rule, String> {
    let peers = match peers {
        None => None,
        Some(list) if list.is_empty() => None,
        Some(list) => Some(
            list.iter()
                .enumerate()
                .map(|(i, p)| peer(p, &format!("{at}.{word}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let ports = match ports {
        None => None,
        Some(list) if list.is_empty() => None,
        Some(list) => Some(
            list.iter()
                .enumerate()
                .map(|(i, p)| port(p, &format!("{at}.ports[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Rule { peers, ports })
}

impl Rule {
    /// The rule that allows nothing: what a rule weft cannot read becomes.
    pub fn nothing() -> Self {
        Rule {
            peers: Some(Vec::new()),
            ports: None,
        }
    }
}

/// Splits an error of the readers above (`field: reason`) into its field and reason.
pub(crate) fn split_error(e: &str) -> (String, String) {
    match e.split_once(": ") {
        Some((field, reason)) => (field.to_string(), reason.to_string()),
        None => (String::new(), e.to_string()),
    }
}

impl Policy {
    /// Reads a NetworkPolicy (see [`crate::problem`] for what is made of what cannot be
    /// read), applying the defaults of `policyTypes`: absent, it is `Ingress`, plus
    /// `Egress` when `egress` is given. A direction in `policyTypes` with no rules
    /// isolates and allows nothing.
    pub fn read(np: &Strict<NetworkPolicy>) -> Read<Policy> {
        let np_obj = &np.object;
        let namespace = np_obj.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = np_obj.metadata.name.clone().unwrap_or_default();
        let mut problems = Vec::new();
        let mut problem = |field: String, reason: String, effect: Effect| {
            let cause = if reason == UNKNOWN {
                Cause::UnknownField
            } else {
                Cause::Invalid
            };
            problems.push(Problem {
                kind: ObjectKind::NetworkPolicy,
                namespace: namespace.clone(),
                name: name.clone(),
                field,
                reason,
                effect,
                cause,
            })
        };
        // The API server always has a spec; an absent one is the empty one.
        let default_spec = Default::default();
        let spec = np_obj.spec.as_ref().unwrap_or(&default_spec);
        let mut spec_unread = false;
        // An absent podSelector is the empty one: every pod of the namespace. One that
        // cannot be read could select any of them: all are isolated.
        let selector = match &spec.pod_selector {
            Some(s) => Selector::from_k8s(s).unwrap_or_else(|e| {
                problem("spec.podSelector".into(), e, Effect::IsolatesOnly);
                spec_unread = true;
                Selector::everything()
            }),
            None => Selector::everything(),
        };
        let (mut ingress_on, mut egress_on) = (true, spec.egress.is_some());
        if let Some(types) = &spec.policy_types {
            ingress_on = false;
            egress_on = false;
            for t in types {
                match t.as_str() {
                    "Ingress" => ingress_on = true,
                    "Egress" => egress_on = true,
                    other => {
                        // Either way could be meant: both are isolated.
                        problem(
                            "spec.policyTypes".into(),
                            format!("unknown type {other:?}"),
                            Effect::IsolatesOnly,
                        );
                        spec_unread = true;
                    }
                }
            }
            if spec_unread {
                (ingress_on, egress_on) = (true, true);
            }
        }
        let mut unread_rules = std::collections::BTreeSet::new();
        for path in &np.unknown {
            match place(path) {
                Place::Rule(at) => {
                    problem(path.clone(), UNKNOWN.into(), Effect::AllowsNothing(at));
                    unread_rules.insert(at);
                }
                Place::Spec => {
                    problem(path.clone(), UNKNOWN.into(), Effect::IsolatesOnly);
                    spec_unread = true;
                }
            }
        }
        let mut read_rules = |dir: Direction, on: bool, list: Vec<Result<Rule, String>>| -> Option<Vec<Rule>> {
            on.then(|| {
                list.into_iter()
                    .enumerate()
                    .map(|(index, r)| {
                        let at = RuleAt { direction: dir, index };
                        match r {
                            _ if spec_unread => Rule::nothing(),
                            Err(e) => {
                                let (field, reason) = split_error(&e);
                                problem(field, reason, Effect::AllowsNothing(at));
                                Rule::nothing()
                            }
                            Ok(_) if unread_rules.contains(&at) => Rule::nothing(),
                            Ok(r) => r,
                        }
                    })
                    .collect()
            })
        };
        let ingress_rules = spec
            .ingress
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| rule(r.from.as_ref(), r.ports.as_ref(), &format!("spec.ingress[{i}]"), "from"))
            .collect();
        let egress_rules = spec
            .egress
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| rule(r.to.as_ref(), r.ports.as_ref(), &format!("spec.egress[{i}]"), "to"))
            .collect();
        let ingress = read_rules(Direction::Ingress, ingress_on, ingress_rules);
        let egress = read_rules(Direction::Egress, egress_on, egress_rules);
        let mode = PolicyMode::read(&np_obj.metadata).unwrap_or_else(|e| {
            let (field, reason) = mode_problem(e);
            problem(field, reason, Effect::EnforcedAsWritten);
            PolicyMode::Enforced
        });
        let policy = Policy {
            mode,
            id: PolicyId::of(&namespace, &name),
            namespace: namespace.clone(),
            name: name.clone(),
            selector,
            ingress,
            egress,
        };
        problems.sort();
        problems.dedup();
        Read {
            policy: Some(policy),
            problems,
        }
    }

    /// Reads a NetworkPolicy built in code (nothing unknown in it).
    pub fn from_k8s(np: &NetworkPolicy) -> Read<Policy> {
        Self::read(&Strict::known(np.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn np(yaml: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(yaml).unwrap()
    }

    #[test]
    fn policy_types_default_as_the_api_documents() {
        let p = Policy::from_k8s(&np(serde_json::json!({
            "metadata": {"name": "a", "namespace": "x"},
            "spec": {"podSelector": {}}
        })))
        .clean()
        .unwrap();
        assert_eq!(p.ingress, Some(vec![]), "ingress isolated, nothing allowed");
        assert_eq!(p.egress, None, "egress left alone");
        let p = Policy::from_k8s(&np(serde_json::json!({
            "metadata": {"name": "a", "namespace": "x"},
            "spec": {"podSelector": {}, "egress": [{}]}
        })))
        .clean()
        .unwrap();
        assert_eq!(
            p.egress.as_ref().map(Vec::len),
            Some(1),
            "egress given: egress isolated"
        );
        assert_eq!(
            p.egress.unwrap()[0],
            Rule {
                peers: None,
                ports: None
            }
        );
        let p = Policy::from_k8s(&np(serde_json::json!({
            "metadata": {"name": "a", "namespace": "x"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]}
        })))
        .clean()
        .unwrap();
        assert_eq!(p.ingress, None, "policyTypes decides");
        assert_eq!(p.egress, Some(vec![]));
    }

    #[test]
    fn peers_and_ports_take_one_form_each() {
        let p = Policy::from_k8s(&np(serde_json::json!({
            "metadata": {"name": "a", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{
                "from": [
                    {"podSelector": {"matchLabels": {"pod": "b"}}},
                    {"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "c"}}},
                    {"ipBlock": {"cidr": "10.0.0.7/8", "except": ["10.1.0.0/16"]}}
                ],
                "ports": [{"port": 80}, {"protocol": "UDP", "port": 1000, "endPort": 2000},
                          {"port": "serve-81"}, {"protocol": "SCTP"}, {"port": "82"}]
            }]}
        })))
        .clean()
        .unwrap();
        let r = &p.ingress.unwrap()[0];
        let peers = r.peers.as_ref().unwrap();
        assert!(matches!(
            &peers[0],
            Peer::Pods {
                namespaces: Namespaces::Own,
                ..
            }
        ));
        assert!(matches!(&peers[1], Peer::Pods { namespaces: Namespaces::Matching(_), pods } if pods.is_everything()));
        assert!(
            matches!(&peers[2], Peer::Pods { namespaces: Namespaces::Matching(n), pods } if n.is_everything() && !pods.is_everything())
        );
        assert_eq!(
            peers[3],
            Peer::Block {
                cidr: "10.0.0.0/8".parse().unwrap(),
                except: vec!["10.1.0.0/16".parse().unwrap()]
            },
            "host bits are dropped, as the kernel would"
        );
        let ports: Vec<String> = r.ports.as_ref().unwrap().iter().map(ToString::to_string).collect();
        assert_eq!(ports, ["80/tcp", "1000-2000/udp", "serve-81/tcp", "sctp", "82/tcp"]);
    }

    /// What the API server would refuse fails closed, naming the field: a rule that
    /// cannot be read allows nothing, a spec that cannot be read isolates and allows
    /// nothing.
    #[test]
    fn what_cannot_be_read_fails_closed_with_the_field_named() {
        let rule0 = |d| Effect::AllowsNothing(RuleAt { direction: d, index: 0 });
        for (spec, field, effect) in [
            (
                serde_json::json!({"podSelector": {}, "ingress": [{"from": [{}]}]}),
                "spec.ingress[0].from[0]",
                rule0(Direction::Ingress),
            ),
            (
                serde_json::json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
                "spec.ingress[0].from[0].ipBlock.cidr",
                rule0(Direction::Ingress),
            ),
            (
                serde_json::json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}]}),
                "spec.egress[0].to[0].ipBlock.except[0]",
                rule0(Direction::Egress),
            ),
            (
                serde_json::json!({"podSelector": {}, "egress": [{"ports": [{"port": 90, "endPort": 80}]}]}),
                "spec.egress[0].ports[0].endPort",
                rule0(Direction::Egress),
            ),
            (
                serde_json::json!({"podSelector": {}, "egress": [{"ports": [{"port": "web", "endPort": 80}]}]}),
                "spec.egress[0].ports[0].endPort",
                rule0(Direction::Egress),
            ),
            (
                serde_json::json!({"podSelector": {}, "egress": [{"ports": [{"protocol": "ICMP"}]}]}),
                "spec.egress[0].ports[0].protocol",
                rule0(Direction::Egress),
            ),
            (
                serde_json::json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
                "spec.podSelector",
                Effect::IsolatesOnly,
            ),
            (
                serde_json::json!({"podSelector": {}, "policyTypes": ["Both"]}),
                "spec.policyTypes",
                Effect::IsolatesOnly,
            ),
        ] {
            let read = Policy::from_k8s(&np(
                serde_json::json!({"metadata": {"name": "bad", "namespace": "x"}, "spec": spec}),
            ));
            let p = read.policy.expect("still enforced, closed");
            assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
            let e = &read.problems[0];
            assert_eq!((e.field.as_str(), e.effect), (field, effect), "{e}");
            assert!(e.to_string().starts_with("NetworkPolicy x/bad: "), "{e}");
            for dir in Direction::BOTH {
                for r in p.rules(dir).unwrap_or_default() {
                    assert_eq!(*r, Rule::nothing(), "{e}: nothing is allowed");
                }
            }
            if effect == Effect::IsolatesOnly {
                assert!(p.selector.is_everything(), "{e}: every pod it could select");
                assert!(p.ingress.is_some(), "{e}");
            }
        }
    }

    /// A field weft does not know closes the rule it is in, or the whole policy when it
    /// is elsewhere in the spec; the rest of the policy stands.
    #[test]
    fn an_unknown_field_closes_what_holds_it() {
        let v = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "a", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
                {"from": [{"podSelector": {}, "serviceAccountSelector": {}}]},
                {"ports": [{"port": 80}]}
            ]}
        });
        let s: Strict<NetworkPolicy> = weft_topology::strict::decode(&v).unwrap();
        let read = Policy::read(&s);
        let p = read.policy.unwrap();
        let rules = p.ingress.unwrap();
        assert_eq!(rules[0], Rule::nothing());
        assert_eq!(rules[1].ports.as_ref().unwrap()[0].to_string(), "80/tcp");
        assert_eq!(read.problems.len(), 1);
        assert_eq!(read.problems[0].field, "spec.ingress[0].from[0].serviceAccountSelector");
        let mut v2 = v.clone();
        v2["spec"]["ingressPriority"] = 5.into();
        let read = Policy::read(&weft_topology::strict::decode(&v2).unwrap());
        let p = read.policy.unwrap();
        assert!(p.ingress.unwrap().iter().all(|r| *r == Rule::nothing()));
        assert_eq!(p.selector.to_string(), "pod=a", "a readable selector is kept");
        assert!(read.problems.iter().any(|e| e.effect == Effect::IsolatesOnly));
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(PolicyId::of("x", "a"), PolicyId::of("x", "a"));
        assert_ne!(PolicyId::of("x", "a"), PolicyId::of("y", "a"));
        assert_eq!(PolicyId::of("x", "a").to_string().len(), 12);
    }
}
