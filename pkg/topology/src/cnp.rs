//! `ClusterNetworkPolicy` (`policy.networking.k8s.io`), the network-policy-api successor
//! of AdminNetworkPolicy and BaselineAdminNetworkPolicy: cluster-wide policies in an
//! Admin tier (before NetworkPolicy) and a Baseline tier (after), with priorities and
//! Accept, Deny and Pass actions. The types follow the upstream API
//! (kubernetes-sigs/network-policy-api, `apis/v1alpha2` as released in v0.2.0 and
//! `apis/v1beta1`, which have the same shape); weft reads them as plain serde types (the
//! CRD is the network-policy-api project's to install), through [`crate::strict`], so
//! a field these types lack is seen, never dropped.
//!
//! A rule's ports may be written three ways: upstream's released `protocols` list
//! (`tcp`/`udp`/`sctp` with a `destinationPort` `number` or `range`, or
//! `destinationNamedPort`), the earlier v1alpha2 drafts' `match` list (`tcp`/`udp`/`sctp`
//! port `number` or `portRange`, `namedPort`), and AdminNetworkPolicy's `ports` list
//! (`portNumber`, `portRange`, `namedPort`), which implementations and users still write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of ClusterNetworkPolicy.
pub const CNP_GROUP: &str = "policy.networking.k8s.io";

/// The versions weft reads, in the order it prefers them when a cluster serves both
/// (the same object, converted): v1beta1 first (upstream's storage version).
pub const CNP_VERSIONS: [&str; 2] = ["v1beta1", "v1alpha2"];

/// Whether `api_version` (`group/version`) is one weft reads ClusterNetworkPolicy at.
pub fn cnp_api_version_known(api_version: &str) -> bool {
    api_version
        .split_once('/')
        .is_some_and(|(g, v)| g == CNP_GROUP && CNP_VERSIONS.contains(&v))
}

/// The tier a ClusterNetworkPolicy is evaluated in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CnpTier {
    /// Before NetworkPolicy: a final Accept or Deny here is not overridden.
    Admin,
    /// After NetworkPolicy, for pods no NetworkPolicy isolates.
    Baseline,
}

impl CnpTier {
    /// Reads the API's spelling (`Admin`, `Baseline`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Admin" => Some(Self::Admin),
            "Baseline" => Some(Self::Baseline),
            _ => None,
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "Admin",
            Self::Baseline => "Baseline",
        }
    }
}

/// What a rule does to the traffic it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CnpAction {
    /// Allowed; no later rule or tier is looked at.
    Accept,
    /// Dropped; no later rule or tier is looked at.
    Deny,
    /// The rest of this tier is skipped; the next tier decides.
    Pass,
}

impl CnpAction {
    /// Reads the API's spelling (`Accept`, `Deny`, `Pass`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Accept" => Some(Self::Accept),
            "Deny" => Some(Self::Deny),
            "Pass" => Some(Self::Pass),
            _ => None,
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "Accept",
            Self::Deny => "Deny",
            Self::Pass => "Pass",
        }
    }
}

/// Pods in namespaces (both selectors; `{}` selects all).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    /// Which namespaces (absent: all).
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    /// Which pods in them (required by the API: absent is not read as "all").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// The pods a policy applies to: exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpSubject {
    /// Every pod of the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    /// The pods selected in the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// A peer of a rule: exactly one field. `nodes`, `networks` and `domainNames` are
/// egress only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CnpPeer {
    /// Every pod of the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    /// Pods in namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    /// Nodes by label (their addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<LabelSelector>,
    /// CIDRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    /// Domain names (Accept only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<Vec<String>>,
}

/// A port number or a range (`match` form: exactly one field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CnpMatchPort {
    /// One port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i32>,
    /// A range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range: Option<CnpPortRange>,
}

/// `start` to `end`, both included.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpPortRange {
    /// For the `ports` form: the protocol (TCP when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// First port.
    pub start: i32,
    /// Last port.
    pub end: i32,
}

/// A protocol's port match (`match` form).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpMatchProtocol {
    /// The ports (absent: every port of the protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<CnpMatchPort>,
}

/// One entry of a rule's `match` (upstream v1alpha2): exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CnpMatch {
    /// TCP ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Vec<CnpMatchProtocol>>,
    /// UDP ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<Vec<CnpMatchProtocol>>,
    /// SCTP ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<Vec<CnpMatchProtocol>>,
    /// A destination pod's container port by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_port: Option<String>,
}

/// A protocol and port (`ports` form, AdminNetworkPolicy's `portNumber`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpPortNumber {
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The port.
    pub port: i32,
}

/// One entry of a rule's `ports` (AdminNetworkPolicy's form): exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CnpPort {
    /// One port of one protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<CnpPortNumber>,
    /// A destination pod's container port by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_port: Option<String>,
    /// A range of one protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range: Option<CnpPortRange>,
}

/// A destination port of the released API's `protocols` form: exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpDestinationPort {
    /// One port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i32>,
    /// A range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<CnpRange>,
}

/// `start` to `end`, both included (the released API: `start` below `end`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpRange {
    /// First port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i32>,
    /// Last port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i32>,
}

/// The match of one protocol in the `protocols` form (at least one field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CnpProtocolPorts {
    /// The destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<CnpDestinationPort>,
}

/// One entry of a rule's `protocols` (the released API): exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CnpProtocol {
    /// TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<CnpProtocolPorts>,
    /// UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<CnpProtocolPorts>,
    /// SCTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<CnpProtocolPorts>,
    /// A destination pod's container port by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_named_port: Option<String>,
}

/// One ingress or egress rule, in the order written (the first that matches decides).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpRule {
    /// A name for people (in logs and explanations).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// What it does: `Accept`, `Deny` or `Pass` ([`CnpAction::parse`]; kept as written,
    /// so an action weft does not know is seen, not a decoding error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The sources (ingress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<CnpPeer>>,
    /// The destinations (egress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<CnpPeer>>,
    /// Ports, the released API's form (absent: every port and protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<CnpProtocol>>,
    /// Ports, the earlier v1alpha2 drafts' form.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<CnpMatch>>,
    /// Ports, AdminNetworkPolicy's form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<CnpPort>>,
}

/// The spec of a ClusterNetworkPolicy.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "policy.networking.k8s.io",
    version = "v1beta1",
    kind = "ClusterNetworkPolicy",
    plural = "clusternetworkpolicies",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ClusterNetworkPolicySpec {
    /// `Admin` or `Baseline` ([`CnpTier::parse`]; kept as written, as the action is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// 0 to 1000; lower goes first within the tier (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The pods it applies to.
    #[serde(default)]
    pub subject: CnpSubject,
    /// Rules for traffic to the subject's pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<CnpRule>,
    /// Rules for traffic from them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<CnpRule>,
}
