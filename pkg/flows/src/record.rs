//! The flow record: one connection (or one refused attempt) of a pod, as a node saw it.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What an end of a flow is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerKind {
    /// A pod with its own network.
    Pod,
    /// A node's address (a host-network pod's too: it shares its node's).
    Node,
    /// Anything else: outside the cluster, or an address no object names yet.
    Outside,
}

/// One end of a flow, named as well as the node knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Peer {
    /// Its address (for the destination: the one that answered, after any DNAT).
    pub ip: IpAddr,
    /// Its port; 0 for a protocol without ports.
    pub port: u16,
    /// What it is.
    pub kind: PeerKind,
    /// The pod's namespace (empty unless a pod).
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub namespace: Arc<str>,
    /// The pod's name (empty unless a pod).
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub pod: Arc<str>,
    /// The pod's workload: its controller as `Kind/name`, or empty for a pod no
    /// controller owns.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub workload: Arc<str>,
    /// The node: the pod's, or the node whose address this is.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub node: Arc<str>,
}

impl Peer {
    /// An address nothing names.
    pub fn outside(ip: IpAddr, port: u16) -> Self {
        Peer {
            ip,
            port,
            kind: PeerKind::Outside,
            namespace: "".into(),
            pod: "".into(),
            workload: "".into(),
            node: "".into(),
        }
    }

    /// What flows are grouped by: `namespace/Kind/name` for a pod of a workload,
    /// `namespace/pod` for a pod no controller owns, `node/NAME` for a node, the address
    /// for anything else.
    pub fn group(&self) -> String {
        match self.kind {
            PeerKind::Pod if !self.workload.is_empty() => format!("{}/{}", self.namespace, self.workload),
            PeerKind::Pod => format!("{}/{}", self.namespace, self.pod),
            PeerKind::Node if !self.node.is_empty() => format!("node/{}", self.node),
            PeerKind::Node | PeerKind::Outside => self.ip.to_string(),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            PeerKind::Pod => write!(f, "{}/{}", self.namespace, self.pod),
            PeerKind::Node if !self.node.is_empty() => write!(f, "node/{}({})", self.node, self.ip),
            PeerKind::Node | PeerKind::Outside => write!(f, "{}", self.ip),
        }
    }
}

/// Where a flow goes, seen from the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowKind {
    /// Between two pods of one node.
    IntraNode,
    /// Between pods of two nodes.
    InterNode,
    /// From a pod to an address outside the cluster.
    ToOutside,
    /// From outside to a pod.
    FromOutside,
    /// From a pod to a node (its own or another).
    ToNode,
    /// From a node to a pod.
    FromNode,
}

impl FlowKind {
    /// The kind of a flow between `src` and `dst`; `None` when neither is a pod (the
    /// node's own traffic is not a pod's flow).
    pub fn of(src: &Peer, dst: &Peer) -> Option<Self> {
        Some(match (src.kind, dst.kind) {
            (PeerKind::Pod, PeerKind::Pod) if src.node == dst.node => FlowKind::IntraNode,
            (PeerKind::Pod, PeerKind::Pod) => FlowKind::InterNode,
            (PeerKind::Pod, PeerKind::Outside) => FlowKind::ToOutside,
            (PeerKind::Pod, PeerKind::Node) => FlowKind::ToNode,
            (PeerKind::Outside, PeerKind::Pod) => FlowKind::FromOutside,
            (PeerKind::Node, PeerKind::Pod) => FlowKind::FromNode,
            (PeerKind::Node | PeerKind::Outside, PeerKind::Node | PeerKind::Outside) => return None,
        })
    }

    /// The name the API, the metrics and the CLI use.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowKind::IntraNode => "intra-node",
            FlowKind::InterNode => "inter-node",
            FlowKind::ToOutside => "to-outside",
            FlowKind::FromOutside => "from-outside",
            FlowKind::ToNode => "to-node",
            FlowKind::FromNode => "from-node",
        }
    }
}

/// What network policy did with a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Forwarded: allowed, or not policed.
    Forwarded,
    /// Dropped by a policy.
    Denied,
    /// A NetworkPolicy would deny it, but its namespace is in audit mode: forwarded.
    Audit,
}

impl Verdict {
    /// Every verdict, for parsing and for metrics.
    pub const ALL: [Verdict; 3] = [Verdict::Forwarded, Verdict::Denied, Verdict::Audit];

    /// The name the API, the metrics and the CLI use.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Forwarded => "forwarded",
            Verdict::Denied => "denied",
            Verdict::Audit => "audit",
        }
    }

    /// Reads [`Verdict::as_str`]'s names.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str().eq_ignore_ascii_case(s))
    }
}

/// The direction of the policy that decided, seen from the pod it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicySide {
    /// The source pod's egress.
    Egress,
    /// The destination pod's ingress.
    Ingress,
}

/// What a policy did to a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// One of its rules allowed it (a NetworkPolicy rule, or a ClusterNetworkPolicy
    /// `Accept`).
    Allow,
    /// A ClusterNetworkPolicy `Deny` rule matched it.
    Deny,
    /// It isolates the pod and none of its rules allowed the flow.
    Isolate,
}

/// One policy's part in a flow's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PolicyHit {
    /// The side it polices.
    pub side: PolicySide,
    /// `networkpolicy` or `clusternetworkpolicy`.
    pub kind: Arc<str>,
    /// `namespace/name` of a NetworkPolicy, `name` of a ClusterNetworkPolicy.
    pub name: Arc<str>,
    /// The rule's index in its direction's list, when a rule decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<u32>,
    /// The rule's name (ClusterNetworkPolicy rules may have one).
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub rule_name: Arc<str>,
    /// What it did.
    pub effect: Effect,
    /// The name whose DNS answer gave the destination's address, when a
    /// ClusterNetworkPolicy rule took it by `domainNames`.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub domain: Arc<str>,
}

impl fmt::Display for PolicyHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let effect = match self.effect {
            Effect::Allow => "allowed by",
            Effect::Deny => "denied by",
            Effect::Isolate => "isolated by",
        };
        let side = match self.side {
            PolicySide::Egress => "egress",
            PolicySide::Ingress => "ingress",
        };
        write!(f, "{side} {effect} {} {}", self.kind, self.name)?;
        if let Some(r) = self.rule {
            write!(f, " rule {r}")?;
        }
        if !self.rule_name.is_empty() {
            write!(f, " ({})", self.rule_name)?;
        }
        if !self.domain.is_empty() {
            write!(f, " for {}", self.domain)?;
        }
        Ok(())
    }
}

/// Policy's judgement of a flow: the verdict and the policies behind it, the allowing
/// rules as well as the isolating and denying ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The verdict the policies give.
    pub verdict: Verdict,
    /// The policies that decided, egress first.
    pub policies: Vec<PolicyHit>,
    /// The verdict and policies were the staged changes made (policies marked `staged`
    /// enforced, `staged-removal` ones gone); `None` when nothing is staged.
    pub staged: Option<(Verdict, Vec<PolicyHit>)>,
}

impl Decision {
    /// A flow no policy polices.
    pub fn unpoliced() -> Self {
        Decision {
            verdict: Verdict::Forwarded,
            policies: Vec::new(),
            staged: None,
        }
    }
}

/// What the staged policies would do with a flow: the preview beside the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    /// The verdict the flow would get.
    pub verdict: Verdict,
    /// The policies that would decide it.
    #[serde(default, skip_serializing_if = "no_policies")]
    pub policies: Arc<[PolicyHit]>,
}

/// Packets and bytes one way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Counters {
    /// Packets.
    pub packets: u64,
    /// Bytes of IP packets, headers included.
    pub bytes: u64,
}

impl Counters {
    /// What `self` has beyond `earlier` (zero where a counter went back).
    pub fn since(self, earlier: Counters) -> Counters {
        Counters {
            packets: self.packets.saturating_sub(earlier.packets),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// How a flow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndReason {
    /// It has not.
    Open,
    /// TCP closed normally (both FINs).
    Fin,
    /// TCP reset.
    Rst,
    /// Its conntrack entry timed out (how UDP and ICMP flows end, and idle TCP).
    Timeout,
    /// Refused by policy: it never opened.
    Denied,
    /// Its end was lost with kernel events that overflowed the node's buffer: its
    /// entry was gone from the table at the recovery dump; counters are the last read.
    Lost,
}

impl EndReason {
    /// The name the API and the CLI use.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Open => "open",
            EndReason::Fin => "fin",
            EndReason::Rst => "rst",
            EndReason::Timeout => "timeout",
            EndReason::Denied => "denied",
            EndReason::Lost => "lost",
        }
    }
}

/// One flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// Unique among the reporting node's records since its daemon started.
    pub id: u64,
    /// The node that reported it.
    pub node: Arc<str>,
    /// When it began (Unix ms): the kernel's timestamp when it has one.
    pub start_ms: i64,
    /// When it ended (its FIN or RST, its entry's destruction); `None` while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_ms: Option<i64>,
    /// When its counters were last read.
    pub updated_ms: i64,
    /// Who opened it.
    pub src: Peer,
    /// Who it went to.
    pub dst: Peer,
    /// The address the source dialled when it was translated on the way (a Service's
    /// cluster address); `None` when it went where it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dialled: Option<IpAddr>,
    /// The IP protocol number.
    pub protocol: u8,
    /// ICMP's type and code of the first packet, for ICMP and ICMPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<(u8, u8)>,
    /// Where it goes.
    pub kind: FlowKind,
    /// What policy did.
    pub verdict: Verdict,
    /// The policies that decided (shared between the flows one decision covers).
    #[serde(default, skip_serializing_if = "no_policies")]
    pub policies: Arc<[PolicyHit]>,
    /// What the staged policies would do, when any are staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<Box<Staged>>,
    /// Source to destination.
    pub forward: Counters,
    /// Destination to source.
    pub reverse: Counters,
    /// How it ended.
    pub end: EndReason,
}

fn no_policies(p: &Arc<[PolicyHit]>) -> bool {
    p.is_empty()
}

impl FlowRecord {
    /// The destination port, or 0.
    pub fn port(&self) -> u16 {
        self.dst.port
    }

    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.forward.bytes + self.reverse.bytes
    }
}

/// The name of IP protocol `n` as flows show it (the deny log's names).
pub use weft_policy::denies::protocol_name;

/// Reads [`protocol_name`]'s names, or a number.
pub fn parse_protocol(s: &str) -> Option<u8> {
    match s.to_ascii_lowercase().as_str() {
        "icmp" => Some(1),
        "tcp" => Some(6),
        "udp" => Some(17),
        "icmpv6" | "ipv6-icmp" => Some(58),
        "sctp" => Some(132),
        other => other.parse().ok(),
    }
}
