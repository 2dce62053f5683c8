//! Pods, namespaces, network policies and cluster network policies as network policy
//! needs them: the few fields policy reads (labels, addresses, named ports, node, specs),
//! kept by the sources' watch caches instead of whole objects, and handed out as one
//! snapshot ([`PolicyObjects`]) that a source rebuilds whenever one of them changes.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::ClusterNetworkPolicy;
use crate::strict::Strict;

/// The annotation of policy modes: on a namespace, `audit` puts its policies in audit
/// mode (would-be denies are counted and logged, and forwarded); on a NetworkPolicy or
/// ClusterNetworkPolicy, `staged` has it evaluated and not enforced, and
/// `staged-removal` has it enforced and evaluated as if it were gone (flows show the
/// verdict of the staged policies beside the enforced one).
pub const POLICY_MODE_ANNOTATION: &str = "weft.dev/policy-mode";

/// The namespace annotation that asks for flow metrics per workload
/// (`weft.dev/flow-metrics: workload`) besides the per-namespace ones.
pub const FLOW_METRICS_ANNOTATION: &str = "weft.dev/flow-metrics";

/// Takes the annotations out of `meta` and gives back only [`POLICY_MODE_ANNOTATION`]
/// and [`FLOW_METRICS_ANNOTATION`] (`None` without them): all that weft reads of an
/// object's annotations.
pub(crate) fn mode_annotation(meta: &mut kube::api::ObjectMeta) -> Option<BTreeMap<String, String>> {
    (meta.annotations.take())
        .map(|a| {
            a.into_iter()
                .filter(|(k, _)| k == POLICY_MODE_ANNOTATION || k == FLOW_METRICS_ANNOTATION)
                .collect()
        })
        .filter(|a: &BTreeMap<String, String>| !a.is_empty())
}

/// The value of [`POLICY_MODE_ANNOTATION`] in `meta`, if any.
pub fn policy_mode(meta: &kube::api::ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(POLICY_MODE_ANNOTATION)
        .map(String::as_str)
}

/// A transport protocol of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortProtocol {
    /// TCP (the Kubernetes default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl PortProtocol {
    /// Parses Kubernetes' spelling (`TCP`, `UDP`, `SCTP`); absent means TCP.
    pub fn parse(s: Option<&str>) -> Option<Self> {
        match s.map(str::to_ascii_uppercase).as_deref() {
            None | Some("TCP") => Some(Self::Tcp),
            Some("UDP") => Some(Self::Udp),
            Some("SCTP") => Some(Self::Sctp),
            Some(_) => None,
        }
    }

    /// The lowercase name, as nftables spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }

    /// Every protocol.
    pub const ALL: [PortProtocol; 3] = [Self::Tcp, Self::Udp, Self::Sctp];
}

impl fmt::Display for PortProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named container port (`spec.containers[].ports[]` with a `name`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    /// The port's name.
    pub name: String,
    /// `containerPort`.
    pub port: u16,
    /// Its protocol.
    pub protocol: PortProtocol,
}

/// A pod, reduced to what network policy reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its addresses (`status.podIPs`, or `status.podIP`); empty until kubelet reports
    /// them, and once the pod has finished (phase `Succeeded` or `Failed`).
    pub ips: Vec<IpAddr>,
    /// Its named container ports.
    pub ports: Vec<NamedPort>,
    /// The node it runs on (`spec.nodeName`); empty while unscheduled.
    pub node: String,
    /// Whether it uses the node's network (`spec.hostNetwork`): never policed, and not
    /// a pod peer.
    pub host_network: bool,
    /// The workload it belongs to, as flows group pods: its controller owner as
    /// `Kind/name` (a ReplicaSet made by a Deployment counts as the Deployment), or
    /// empty for a pod no controller owns (the pod is its own workload).
    pub workload: String,
}

impl PolicyPod {
    /// Reads a Pod object; `None` without a name. Addresses and ports that do not parse
    /// are left out.
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        // A pod that ran to completion keeps its addresses in its status, but they are
        // free again and may already belong to a new pod: it has none.
        let finished = status
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|l| l.iter().filter_map(|i| i.ip.parse().ok()).collect())
            .unwrap_or_default();
        if finished {
            ips.clear();
        } else if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.as_ref()).and_then(|i| i.parse().ok())
        {
            ips.push(ip);
        }
        let mut ports = Vec::new();
        for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
            for p in c.ports.iter().flatten() {
                let (Some(name), Ok(port), Some(protocol)) = (
                    p.name.clone(),
                    u16::try_from(p.container_port),
                    PortProtocol::parse(p.protocol.as_deref()),
                ) else {
                    continue;
                };
                ports.push(NamedPort { name, port, protocol });
            }
        }
        Some(PolicyPod {
            namespace,
            name,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ips,
            ports,
            node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            workload: workload_of(&pod.metadata),
        })
    }
}

/// A pod's workload from its controller owner reference: `Kind/name`, with a
/// Deployment's ReplicaSet (`web-7d4b9c`, labelled `pod-template-hash: 7d4b9c`) named
/// as the Deployment (`Deployment/web`); empty when no controller owns the pod.
pub fn workload_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    let Some(owner) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    else {
        return String::new();
    };
    if owner.kind == "ReplicaSet"
        && let Some(hash) = meta.labels.as_ref().and_then(|l| l.get("pod-template-hash"))
        && let Some(deployment) = owner.name.strip_suffix(hash.as_str()).and_then(|n| n.strip_suffix('-'))
        && !deployment.is_empty()
    {
        return format!("Deployment/{deployment}");
    }
    format!("{}/{}", owner.kind, owner.name)
}

/// The label the API server gives every Namespace, its name as value: policies select
/// namespaces by name through it. One definition for every reader and writer of
/// Namespaces (the directory source plays the API server and adds it too).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A namespace, reduced to what network policy reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyNamespace {
    /// Its name.
    pub name: String,
    /// Its labels (the API server adds `kubernetes.io/metadata.name`).
    pub labels: BTreeMap<String, String>,
    /// Whether [`POLICY_MODE_ANNOTATION`] says `audit`.
    pub audit: bool,
    /// Whether [`FLOW_METRICS_ANNOTATION`] asks for flow metrics per workload.
    pub workload_flow_metrics: bool,
}

impl PolicyNamespace {
    /// Reads a Namespace object; `None` without a name.
    pub fn from_namespace(ns: &Namespace) -> Option<Self> {
        let name = ns.metadata.name.clone()?;
        let audit = policy_mode(&ns.metadata) == Some("audit");
        Some(PolicyNamespace {
            name,
            labels: ns.metadata.labels.clone().unwrap_or_default(),
            audit,
            workload_flow_metrics: ns
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FLOW_METRICS_ANNOTATION))
                .is_some_and(|v| v == "workload"),
        })
    }
}

/// A policy object that does not decode as its type (a field of the wrong type: an API
/// server never stores one, a file may): never enforced, and said so.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnreadablePolicy {
    /// `NetworkPolicy` or `ClusterNetworkPolicy`.
    pub kind: String,
    /// Its namespace (empty for a cluster-scoped object).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Why it does not decode (the decoder's words).
    pub error: String,
}

/// Everything network policy reads of the cluster, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyObjects {
    /// Every pod (every namespace, every node), by namespace and name: a persistent map
    /// that a source changes in place, so two snapshots share all but the pods that
    /// changed between them (their difference, `imbl::OrdMap::diff`, skips the rest;
    /// a copy costs a pointer).
    pub pods: PolicyPods,
    /// Every namespace, sorted by name.
    pub namespaces: Vec<Arc<PolicyNamespace>>,
    /// Every `networking.k8s.io/v1` NetworkPolicy, sorted by namespace and name, as the
    /// API has it, with the fields weft does not know named (the policy engine reads
    /// each, failing closed on what it cannot understand).
    pub policies: Vec<Arc<Strict<NetworkPolicy>>>,
    /// Every ClusterNetworkPolicy (`policy.networking.k8s.io` v1beta1 or v1alpha2; one
    /// served at both counts once), sorted by name, with only its name, uid, generation
    /// and spec and the fields weft does not know named (none where the cluster has no
    /// such CRD; none, or the last known, and `stale`, where weftd may not read them).
    pub cluster_policies: Vec<Arc<Strict<ClusterNetworkPolicy>>>,
    /// Policy objects that do not decode as their type, sorted (each once).
    pub unreadable: Vec<Arc<UnreadablePolicy>>,
    /// Whether every kind was listed once (before, "no policy" means "not known yet").
    pub synced: bool,
    /// Whether a watch is lost (or refused) now (the objects are the last known;
    /// enforcement keeps them, and says it is stale).
    pub stale: bool,
}

/// The pods of a [`PolicyObjects`], by (namespace, name).
pub type PolicyPods = imbl::OrdMap<(String, String), Arc<PolicyPod>>;

/// A map of `pods`, each under its namespace and name (a later one of a name replaces an
/// earlier), as a snapshot holds them.
pub fn policy_pods(pods: impl IntoIterator<Item = Arc<PolicyPod>>) -> PolicyPods {
    pods.into_iter().map(|p| (pod_key(&p), p)).collect()
}

impl PolicyObjects {
    /// Adds pod `pod`, or replaces the one of its namespace and name (as a watch does).
    pub fn put_pod(&mut self, pod: Arc<PolicyPod>) {
        self.pods.insert(pod_key(&pod), pod);
    }

    /// Pod `namespace/name`, if there is one.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PolicyPod>> {
        self.pods.get(&(namespace.to_string(), name.to_string()))
    }
}

/// The objects of a [`PolicyObjects`] by key, as the sources keep them between
/// snapshots: maps make an update one lookup and keep the snapshot's order for free.
/// Persistent maps (one type for every kind, so that one watch loop serves them all):
/// the pods' is the snapshot's own, shared rather than copied.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PolicyMaps {
    /// By (namespace, name).
    pub(crate) pods: PolicyPods,
    /// By name.
    pub(crate) namespaces: imbl::OrdMap<String, Arc<PolicyNamespace>>,
    /// By (namespace, name).
    pub(crate) policies: imbl::OrdMap<(String, String), Arc<Strict<NetworkPolicy>>>,
    /// By name.
    pub(crate) cluster_policies: imbl::OrdMap<String, Arc<Strict<ClusterNetworkPolicy>>>,
    /// Objects that do not decode, by who found them (a watch, a file).
    pub(crate) unreadable: BTreeMap<String, Vec<Arc<UnreadablePolicy>>>,
}

impl PolicyMaps {
    /// The snapshot of these objects.
    pub(crate) fn snapshot(&self, synced: bool, stale: bool) -> PolicyObjects {
        PolicyObjects {
            pods: self.pods.clone(),
            namespaces: self.namespaces.values().cloned().collect(),
            policies: self.policies.values().cloned().collect(),
            cluster_policies: self.cluster_policies.values().cloned().collect(),
            unreadable: {
                let mut all: Vec<Arc<UnreadablePolicy>> = self.unreadable.values().flatten().cloned().collect();
                all.sort();
                all.dedup_by(|a, b| (&a.kind, &a.namespace, &a.name) == (&b.kind, &b.namespace, &b.name));
                all
            },
            synced,
            stale,
        }
    }
}

/// Where a pod is kept in [`PolicyMaps::pods`].
pub(crate) fn pod_key(p: &PolicyPod) -> (String, String) {
    (p.namespace.clone(), p.name.clone())
}

/// Where a policy is kept in [`PolicyMaps::policies`]; `None` without a name.
pub(crate) fn policy_key(p: &NetworkPolicy) -> Option<(String, String)> {
    let name = p.metadata.name.clone()?;
    Some((p.metadata.namespace.clone().unwrap_or_else(|| "default".into()), name))
}

/// Keeps a NetworkPolicy's name, namespace (`default` if unset, as the API server
/// would), uid, generation, policy-mode annotation and spec: what policy reads, for the
/// caches of both sources.
/// Without its resourceVersion, an update that leaves all of these alone (a label, an
/// annotation, a file written again) compares equal and changes no snapshot.
pub(crate) fn slim_policy(p: &mut NetworkPolicy) {
    p.metadata = kube::api::ObjectMeta {
        name: p.metadata.name.take(),
        namespace: Some(p.metadata.namespace.take().unwrap_or_else(|| "default".into())),
        uid: p.metadata.uid.take(),
        generation: p.metadata.generation.take(),
        annotations: mode_annotation(&mut p.metadata),
        ..Default::default()
    };
}

/// Where a cluster network policy is kept in [`PolicyMaps::cluster_policies`]; `None`
/// without a name.
pub(crate) fn cluster_policy_key(p: &ClusterNetworkPolicy) -> Option<String> {
    p.metadata.name.clone()
}

/// Keeps a ClusterNetworkPolicy's name, uid, generation, policy-mode annotation and
/// spec, as [`slim_policy`]
/// does for a NetworkPolicy (and for the same reason: an update that changes none of
/// them compares equal). It is cluster-scoped, so a namespace (a file may write one) is
/// dropped, as the API server would.
pub(crate) fn slim_cluster_policy(p: &mut ClusterNetworkPolicy) {
    p.metadata = kube::api::ObjectMeta {
        name: p.metadata.name.take(),
        uid: p.metadata.uid.take(),
        generation: p.metadata.generation.take(),
        annotations: mode_annotation(&mut p.metadata),
        ..Default::default()
    };
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn owned(kind: &str, name: &str, controller: bool, hash: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]),
            labels: hash.map(|h| [("pod-template-hash".to_string(), h.to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_pods_workload_is_its_controller_a_deployment_through_its_replicaset() {
        assert_eq!(
            workload_of(&owned("ReplicaSet", "web-7d4b9c", true, Some("7d4b9c"))),
            "Deployment/web"
        );
        assert_eq!(
            workload_of(&owned("ReplicaSet", "web-7d4b9c", true, None)),
            "ReplicaSet/web-7d4b9c"
        );
        assert_eq!(
            workload_of(&owned("ReplicaSet", "web", true, Some("7d4b9c"))),
            "ReplicaSet/web"
        );
        assert_eq!(workload_of(&owned("StatefulSet", "db", true, None)), "StatefulSet/db");
        assert_eq!(
            workload_of(&owned("StatefulSet", "db", false, None)),
            "",
            "not its controller"
        );
        assert_eq!(workload_of(&ObjectMeta::default()), "");
    }
}
