//! The sets a plan fills: their kinds and elements, and where each set's elements come
//! from (a selector's pods, a block's ranges).

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use weft_topology::{PolicyPod, PortProtocol};

use crate::cnp::{ClusterPeer, ClusterPolicy};
use crate::eval::ClusterView;
use crate::model::{Direction, Policy};

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
        }
    }

    pub(super) fn v6(self) -> bool {
        matches!(self, SetKind::Addr6 | SetKind::Net6 | SetKind::AddrPort6)
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

/// What decides a pod-dependent set's elements: the rule (and, for a named port, the
/// port entry) it belongs to. A pod's elements in it follow from the pod alone
/// ([`SetSource::elements`]), so a pod that comes adds its own and nothing else moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetSource {
    /// The addresses of the pods a NetworkPolicy rule's pod peers select.
    Peers {
        /// The policy.
        policy: std::sync::Arc<Policy>,
        /// The rule's direction.
        dir: Direction,
        /// The rule's index.
        rule: usize,
        /// Which family.
        v6: bool,
    },
    /// The address, protocol and port of every destination pod's port of a name.
    Named {
        /// Whose subject a destination must be for ingress (a NetworkPolicy's or a
        /// ClusterNetworkPolicy's); egress takes any pod.
        subject: Subject,
        /// The direction.
        dir: Direction,
        /// The port name.
        name: String,
        /// Its protocol.
        protocol: PortProtocol,
        /// Which family.
        v6: bool,
    },
    /// The addresses of the pods a ClusterNetworkPolicy rule's pod peers select.
    ClusterPeers {
        /// The policy.
        policy: std::sync::Arc<ClusterPolicy>,
        /// The rule's direction.
        dir: Direction,
        /// The rule's index.
        rule: usize,
        /// Which family.
        v6: bool,
    },
}

/// The pods a policy applies to, for named ports of ingress rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A NetworkPolicy's.
    Policy(std::sync::Arc<Policy>),
    /// A ClusterNetworkPolicy's.
    Cluster(std::sync::Arc<ClusterPolicy>),
}

impl SetSource {
    /// The elements pod `pod` puts into the set (none for most).
    pub fn elements(&self, view: &ClusterView, pod: &PolicyPod) -> Vec<Element> {
        let family = |v6: bool| pod.ips.iter().filter(move |ip| ip.is_ipv6() == v6);
        // Every set holds one family: a pod without an address of it adds nothing, and
        // an ADD's fast path asks every set (a cheap answer for half of them).
        let v6 = match self {
            SetSource::Peers { v6, .. } | SetSource::Named { v6, .. } | SetSource::ClusterPeers { v6, .. } => *v6,
        };
        if family(v6).next().is_none() {
            return Vec::new();
        }
        match self {
            SetSource::Peers { policy, dir, rule, v6 } => {
                let peers = policy
                    .rules(*dir)
                    .and_then(|r| r.get(*rule))
                    .and_then(|r| r.peers.as_ref());
                if peers.is_some_and(|ps| ps.iter().any(|p| view.pod_is_peer(policy, p, pod))) {
                    family(*v6).map(|ip| Element::Addr(*ip)).collect()
                } else {
                    Vec::new()
                }
            }
            SetSource::ClusterPeers { policy, dir, rule, v6 } => {
                let Some(r) = policy.rules(*dir).get(*rule) else {
                    return Vec::new();
                };
                let ns = view.namespace_labels(&pod.namespace);
                let matches = !pod.host_network
                    && r.peers.iter().any(|p| match p {
                        ClusterPeer::Pods { namespaces, pods } => namespaces.matches(ns) && pods.matches(&pod.labels),
                        _ => false,
                    });
                if matches {
                    family(*v6).map(|ip| Element::Addr(*ip)).collect()
                } else {
                    Vec::new()
                }
            }
            SetSource::Named {
                subject,
                dir,
                name,
                protocol,
                v6,
            } => {
                if pod.host_network {
                    return Vec::new();
                }
                if *dir == Direction::Ingress {
                    // The destination of an ingress rule is a pod of this node the
                    // policy applies to.
                    let local = view.local.contains_key(&(pod.namespace.clone(), pod.name.clone()));
                    let selected = match subject {
                        Subject::Policy(p) => p.namespace == pod.namespace && p.selector.matches(&pod.labels),
                        Subject::Cluster(c) => {
                            c.subject_namespaces.matches(view.namespace_labels(&pod.namespace))
                                && c.subject_pods.matches(&pod.labels)
                        }
                    };
                    if !local || !selected {
                        return Vec::new();
                    }
                }
                pod.ports
                    .iter()
                    .filter(|np| &np.name == name && np.protocol == *protocol)
                    .flat_map(|np| family(*v6).map(move |ip| Element::AddrPort(*ip, np.protocol, np.port)))
                    .collect()
            }
        }
    }
}
