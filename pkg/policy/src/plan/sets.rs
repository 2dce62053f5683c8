//! The sets a plan fills: their kinds and elements, and where each set's elements come
//! from (a selector's pods, a block's ranges).

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use weft_topology::{PolicyPod, PortProtocol};

use crate::cnp::{ClusterPeer, ClusterPolicy};
use crate::eval::ClusterView;
use crate::model::{Namespaces, Peer, Policy};
use crate::names::{SetName, SetRole};
use crate::selector::Selector;

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    /// IPv4 addresses.
    Addr4,
    /// IPv6 addresses.
    Addr6,
    /// IPv4 ranges.
    Net4,
    /// IPv6 ranges.
    Net6,
    /// IPv4 address . protocol . port.
    AddrPort4,
    /// IPv6 address . protocol . port.
    AddrPort6,
    /// IPv4 addresses learnt from DNS answers, each with a timeout: the planner
    /// declares the set, the learner fills it, the kernel expires its elements.
    Learnt4,
    /// IPv6 addresses learnt so.
    Learnt6,
}

impl SetKind {
    /// The set's type and flags in nft syntax.
    pub fn declaration(self) -> &'static str {
        match self {
            SetKind::Addr4 => "type ipv4_addr;",
            SetKind::Addr6 => "type ipv6_addr;",
            SetKind::Net4 => "type ipv4_addr; flags interval;",
            SetKind::Net6 => "type ipv6_addr; flags interval;",
            SetKind::AddrPort4 => "type ipv4_addr . inet_proto . inet_service;",
            SetKind::AddrPort6 => "type ipv6_addr . inet_proto . inet_service;",
            SetKind::Learnt4 => "type ipv4_addr; flags timeout;",
            SetKind::Learnt6 => "type ipv6_addr; flags timeout;",
        }
    }

    /// Whether its elements are the learner's (never planned, never repaired).
    pub fn learnt(self) -> bool {
        matches!(self, SetKind::Learnt4 | SetKind::Learnt6)
    }

    /// Whether it holds IPv6 addresses.
    pub fn v6(self) -> bool {
        matches!(
            self,
            SetKind::Addr6 | SetKind::Net6 | SetKind::AddrPort6 | SetKind::Learnt6
        )
    }
}

/// One element of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Element {
    /// One address.
    Addr(IpAddr),
    /// Addresses from the first to the last, both included.
    Range(IpAddr, IpAddr),
    /// A pod's named port: its address, the protocol and the port.
    AddrPort(IpAddr, PortProtocol, u16),
}

impl Element {
    /// The pod address it is of (`None` for a range: ranges are policies', not pods').
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Element::Addr(ip) | Element::AddrPort(ip, ..) => Some(*ip),
            Element::Range(..) => None,
        }
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Element::Addr(a) => write!(f, "{a}"),
            Element::Range(a, b) if a == b => write!(f, "{a}"),
            Element::Range(a, b) => write!(f, "{a}-{b}"),
            Element::AddrPort(a, p, port) => write!(f, "{a} . {} . {port}", p.as_str()),
        }
    }
}

/// A set and what it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    /// Its type.
    pub kind: SetKind,
    /// Its elements.
    pub elements: BTreeSet<Element>,
}

/// The addresses an `ipBlock` takes: `cidr` with every `except` cut out, as inclusive
/// ranges in order.
pub fn block_ranges(cidr: &IpNet, except: &[IpNet]) -> Vec<(IpAddr, IpAddr)> {
    let v6 = cidr.addr().is_ipv6();
    let to = |a: IpAddr| -> u128 {
        match a {
            IpAddr::V4(v) => u128::from(u32::from(v)),
            IpAddr::V6(v) => u128::from(v),
        }
    };
    let from = |n: u128| -> IpAddr {
        if v6 {
            IpAddr::V6(Ipv6Addr::from(n))
        } else {
            IpAddr::V4(Ipv4Addr::from(n as u32))
        }
    };
    let mut cuts: Vec<(u128, u128)> = except.iter().map(|x| (to(x.network()), to(x.broadcast()))).collect();
    cuts.sort();
    let (mut start, end) = (to(cidr.network()), to(cidr.broadcast()));
    let mut out = Vec::new();
    for (a, b) in cuts {
        if b < start {
            continue;
        }
        if a > start {
            out.push((from(start), from(a - 1)));
        }
        if b >= end {
            return out;
        }
        start = b + 1;
    }
    out.push((from(start), from(end)));
    out
}

/// Merges ranges that overlap or touch: an interval set refuses overlapping elements.
pub(super) fn merge(mut ranges: Vec<(IpAddr, IpAddr)>) -> BTreeSet<Element> {
    ranges.sort();
    let next = |a: IpAddr| -> Option<IpAddr> {
        match a {
            IpAddr::V4(v) => u32::from(v).checked_add(1).map(|n| IpAddr::V4(n.into())),
            IpAddr::V6(v) => u128::from(v).checked_add(1).map(|n| IpAddr::V6(n.into())),
        }
    };
    let mut out: Vec<(IpAddr, IpAddr)> = Vec::new();
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 || next(last.1) == Some(a) => {
                if b > last.1 {
                    last.1 = b;
                }
            }
            _ => out.push((a, b)),
        }
    }
    out.into_iter().map(|(a, b)| Element::Range(a, b)).collect()
}

/// Which namespaces a [`PodScope`] takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NamespaceScope {
    /// This one (a NetworkPolicy's own, for a `podSelector` alone).
    Named(String),
    /// Those whose labels match (`{}`: all).
    Matching(Selector),
}

/// Some pods of the cluster, by what selects them: the namespaces they may be in and
/// their labels. Host-network pods are never in one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodScope {
    /// The namespaces.
    pub namespaces: NamespaceScope,
    /// The pods in them.
    pub pods: Selector,
}

impl PodScope {
    /// The pods `peer` of `policy` takes (`None` for an `ipBlock`).
    pub fn of_peer(policy: &Policy, peer: &Peer) -> Option<Self> {
        match peer {
            Peer::Pods { namespaces, pods } => Some(PodScope {
                namespaces: match namespaces {
                    Namespaces::Own => NamespaceScope::Named(policy.namespace.clone()),
                    Namespaces::Matching(sel) => NamespaceScope::Matching(sel.clone()),
                },
                pods: pods.clone(),
            }),
            Peer::Block { .. } => None,
        }
    }

    /// The pods `peer` of a ClusterNetworkPolicy takes (`None` for others than pods).
    pub fn of_cluster_peer(peer: &ClusterPeer) -> Option<Self> {
        match peer {
            ClusterPeer::Pods { namespaces, pods } => Some(PodScope {
                namespaces: NamespaceScope::Matching(namespaces.clone()),
                pods: pods.clone(),
            }),
            ClusterPeer::Networks(_) | ClusterPeer::Nodes(_) | ClusterPeer::Domains(_) | ClusterPeer::All => None,
        }
    }

    /// The pods a NetworkPolicy applies to.
    pub fn subject_of(policy: &Policy) -> Self {
        PodScope {
            namespaces: NamespaceScope::Named(policy.namespace.clone()),
            pods: policy.selector.clone(),
        }
    }

    /// The pods a ClusterNetworkPolicy applies to.
    pub fn subject_of_cluster(policy: &ClusterPolicy) -> Self {
        PodScope {
            namespaces: NamespaceScope::Matching(policy.subject_namespaces.clone()),
            pods: policy.subject_pods.clone(),
        }
    }

    /// Whether `pod` is one of them.
    pub fn matches(&self, view: &ClusterView, pod: &PolicyPod) -> bool {
        !pod.host_network
            && match &self.namespaces {
                NamespaceScope::Named(ns) => &pod.namespace == ns,
                NamespaceScope::Matching(sel) => sel.matches(view.namespace_labels(&pod.namespace)),
            }
            && self.pods.matches(&pod.labels)
    }

    /// The namespace all of them are in, when the scope names one.
    pub fn namespace(&self) -> Option<&str> {
        match &self.namespaces {
            NamespaceScope::Named(ns) => Some(ns),
            NamespaceScope::Matching(_) => None,
        }
    }
}

/// What decides a pod-dependent set's elements. A set is named after its source (see
/// [`SetSource::set_name`]), so rules of any policy that mean the same pods share one
/// set, and a pod's elements follow from the pod alone ([`SetSource::elements`]): a pod
/// that comes adds its own and nothing else moves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetSource {
    /// The addresses of the pods of a scope (a rule's pod peer).
    Pods {
        /// Which pods.
        scope: PodScope,
        /// Which family.
        v6: bool,
    },
    /// The address, protocol and port of a port of a name: of every pod for egress
    /// (`dest` `None`), of the pods of this node in `dest` for ingress (where the
    /// destination is a pod the policy applies to).
    Named {
        /// The destinations of an ingress rule.
        dest: Option<PodScope>,
        /// The port name.
        name: String,
        /// Its protocol.
        protocol: PortProtocol,
        /// Which family.
        v6: bool,
    },
}

impl SetSource {
    /// Which family the set holds.
    pub fn v6(&self) -> bool {
        match self {
            SetSource::Pods { v6, .. } | SetSource::Named { v6, .. } => *v6,
        }
    }

    /// The set's type.
    pub fn kind(&self) -> SetKind {
        match (self, self.v6()) {
            (SetSource::Pods { .. }, false) => SetKind::Addr4,
            (SetSource::Pods { .. }, true) => SetKind::Addr6,
            (SetSource::Named { .. }, false) => SetKind::AddrPort4,
            (SetSource::Named { .. }, true) => SetKind::AddrPort6,
        }
    }

    /// The set's name: its role, a hash of what it stands for, its family.
    pub fn set_name(&self) -> SetName {
        let role = match self {
            SetSource::Pods { .. } => SetRole::Pods,
            SetSource::Named { .. } => SetRole::Named,
        };
        SetName::Data {
            role,
            hash: super::short_hash(&[&format!("{self:?}")]),
            v6: self.v6(),
        }
    }

    /// The elements pod `pod` puts into the set (none for most).
    pub fn elements(&self, view: &ClusterView, pod: &PolicyPod) -> Vec<Element> {
        let v6 = self.v6();
        let family = || pod.ips.iter().filter(move |ip| ip.is_ipv6() == v6);
        if pod.host_network || family().next().is_none() {
            return Vec::new();
        }
        match self {
            SetSource::Pods { scope, .. } => {
                if scope.matches(view, pod) {
                    family().map(|ip| Element::Addr(*ip)).collect()
                } else {
                    Vec::new()
                }
            }
            SetSource::Named {
                dest, name, protocol, ..
            } => {
                if let Some(scope) = dest
                    && !(view.local.contains_key(&(pod.namespace.clone(), pod.name.clone()))
                        && scope.matches(view, pod))
                {
                    return Vec::new();
                }
                pod.ports
                    .iter()
                    .filter(|np| &np.name == name && np.protocol == *protocol)
                    .flat_map(|np| family().map(move |ip| Element::AddrPort(*ip, np.protocol, np.port)))
                    .collect()
            }
        }
    }
}
