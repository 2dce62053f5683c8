//! `ClusterNetworkPolicy` (`policy.networking.k8s.io/v1alpha2`), the network-policy-api
//! successor of AdminNetworkPolicy and BaselineAdminNetworkPolicy: cluster-wide
//! policies in an Admin tier (before NetworkPolicy) and a Baseline tier (after), with
//! priorities and Accept, Deny and Pass actions. The types follow the upstream API
//! (kubernetes-sigs/network-policy-api, `apis/v1alpha2`); weft reads them as plain
//! serde types (the CRD is the network-policy-api project's to install). Rules may
//! name ports either as upstream's `match` list (`tcp`/`udp` port numbers and ranges,
//! `namedPort`) or as AdminNetworkPolicy's `ports` list (`portNumber`, `portRange`,
//! `namedPort`), which implementations and users still write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The tier a ClusterNetworkPolicy is evaluated in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum CnpTier {
    /// Before NetworkPolicy: a final Accept or Deny here is not overridden.
    Admin,
    /// After NetworkPolicy, for pods no NetworkPolicy isolates.
    Baseline,
}

/// What a rule does to the traffic it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CnpAction {
    /// Allowed; no later rule or tier is looked at.
    Accept,
    /// Dropped; no later rule or tier is looked at.
    Deny,
    /// The rest of this tier is skipped; the next tier decides.
    Pass,
}

/// Pods in namespaces (both selectors; `{}` selects all).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    /// Which namespaces.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    /// Which pods in them.
    #[serde(default)]
    pub pod_selector: LabelSelector,
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

/// One ingress or egress rule, in the order written (the first that matches decides).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CnpRule {
    /// A name for people (in logs and explanations).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// What it does.
    pub action: Option<CnpAction>,
    /// The sources (ingress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<CnpPeer>>,
    /// The destinations (egress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<CnpPeer>>,
    /// Ports, upstream v1alpha2's form (absent or empty: every port and protocol).
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
    version = "v1alpha2",
    kind = "ClusterNetworkPolicy",
    plural = "clusternetworkpolicies",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ClusterNetworkPolicySpec {
    /// `Admin` or `Baseline`.
    pub tier: Option<CnpTier>,
    /// 0 to 1000; lower goes first within the tier.
    #[serde(default)]
    pub priority: i32,
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
