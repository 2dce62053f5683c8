//! The lab file's schema (`examples/lab.yaml`): nodes, pods, namespaces, policies and
//! how the nodes are joined, typed where the file's values are a closed set.

pub(crate) mod checks;

use std::collections::BTreeMap;
use std::path::PathBuf;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use weft_nodenet::PodRouting;
use weft_topology::LinkKind;

/// A lab description (`examples/lab.yaml`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LabSpec {
    /// The lab's name: prefix of every namespace it creates.
    pub name: String,
    /// How links between nodes are carried unless a link says (`vxlan` or `grpc`).
    #[serde(default = "default_kind")]
    pub inter_node_link: LinkKind,
    /// The nodes: names, or objects naming their subnet and pod range too.
    pub nodes: Vec<NodeSpec>,
    /// The pods and the node each runs on.
    pub pods: Vec<PodSpec>,
    /// Topology objects written inline (meshnet/KNE objects, unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topologies: Vec<serde_json::Value>,
    /// A directory of Topology files (YAML or JSON), relative to the lab file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_dir: Option<PathBuf>,
    /// Kubernetes namespaces with their labels and annotations, for network policy; a
    /// namespace a pod uses exists whether it is listed or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceSpec>,
    /// NetworkPolicy objects (`networking.k8s.io/v1`) written inline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<serde_json::Value>,
    /// Files of NetworkPolicy objects (YAML or JSON, several documents each), relative
    /// to the lab file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_files: Vec<PathBuf>,
    /// Each daemon's `--reconcile-interval` in seconds: how soon kernel drift (a
    /// deleted route, veth or FDB entry) is repaired. Shorter than a node's default of
    /// 60 s, because a lab is where drift is made on purpose.
    #[serde(default = "default_reconcile_interval")]
    pub reconcile_interval: u64,
    /// How the nodes are joined: `routed` (each node in its own subnet behind the
    /// router: no shared broadcast domain, so pod traffic between nodes goes through
    /// VXLAN) or `shared` (every node on one segment, a bridge in the router namespace:
    /// direct routes).
    #[serde(default)]
    pub underlay: Underlay,
    /// MTU of every underlay link (the nodes' uplinks and the router's ends).
    #[serde(default = "default_underlay_mtu")]
    pub underlay_mtu: u32,
    /// Gives every node an IPv6 pod range too (`fd00:10:244:<i>::/64` unless a node
    /// names its own).
    #[serde(default)]
    pub ipv6: bool,
    /// Each daemon's `--pod-routing` (`auto`, `direct`, `vxlan`, `none`).
    #[serde(default)]
    pub pod_routing: PodRouting,
    /// Pod ranges between nodes over BGP: every weftd exports its podCIDRs
    /// (`--export-table 119`), a BIRD 2 in every node announces them to a BIRD in the
    /// router, and the nodes route by what it teaches them. Needs `underlay: routed`
    /// and `pod_routing: none`; IPv4 pod ranges only.
    #[serde(default)]
    pub bgp: bool,
    /// How the nodes' wire ports are protected: `mtls` (the default: the lab makes a
    /// CA and a certificate per node naming its name and address) or `insecure`
    /// (plaintext, `--wire-insecure`).
    #[serde(default)]
    pub wire_security: WireSecurityMode,
    /// How many pods `up` attaches (and `down` detaches) at a time. 1, the default,
    /// attaches them in the file's order, which labs about arrival order rely on; a
    /// big lab (`lab gen` writes 8) attaches as a runtime starting many pods does,
    /// since one at a time 500 pods took minutes.
    #[serde(default = "default_parallel_attach")]
    pub parallel_attach: usize,
    /// Flags given to every node's weftd after the lab's own (`["--flows=false"]`,
    /// `["--flows-workload-metrics=true"]`): what an operator sets in the DaemonSet.
    #[serde(default)]
    pub weftd_args: Vec<String>,
    /// The lab's DNS: names the outside answers for (a dnsmasq in the outside
    /// namespace, at its address, which every pod's resolv.conf names). None: no DNS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<DnsRecord>,
    /// A scenario file (`weftctl link scenario`), relative to the lab file, that the
    /// lab's bring-up starts once its pods are attached (in the background, logged to
    /// the lab's `scenario.log`; `lab down` stops it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<PathBuf>,
}

/// A name of the lab's DNS: its addresses (the outside holds them, so they answer),
/// or the name it is an alias of, and its TTL.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DnsRecord {
    /// The name.
    pub name: String,
    /// Its A and AAAA records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<std::net::IpAddr>,
    /// The name it is a CNAME of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cname: Option<String>,
    /// The TTL of its records, in seconds.
    #[serde(default = "default_dns_ttl")]
    pub ttl: u32,
}

fn default_dns_ttl() -> u32 {
    300
}

fn default_parallel_attach() -> usize {
    1
}

/// How a lab's wire ports are protected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WireSecurityMode {
    /// Mutual TLS with lab-made certificates.
    #[default]
    Mtls,
    /// Plaintext.
    Insecure,
}

/// How the nodes of a lab are joined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Underlay {
    /// Each node in its own subnet behind the router.
    #[default]
    Routed,
    /// Every node on one segment.
    Shared,
}

fn default_kind() -> LinkKind {
    LinkKind::Vxlan
}

fn default_underlay_mtu() -> u32 {
    1500
}

fn default_reconcile_interval() -> u64 {
    10
}

/// One node of a lab: just its name (`- n1`), or its name with the addresses to use.
#[derive(Debug, Clone, Serialize)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// The node's underlay subnet: the router takes the first address, the node the
    /// second (default `172.30.<i>.0/24` for the i-th node, from 1).
    pub subnet: Ipv4Net,
    /// The range the node's pods get their `eth0` address from (default
    /// `10.244.<i>.0/24`): its Node's first podCIDR.
    pub pod_range: String,
    /// Its IPv6 pod range, when the lab has IPv6 (default `fd00:10:244:<i>::/64`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_range6: String,
    /// Its position in the lab (from 0), which places it on a shared segment.
    #[serde(skip)]
    pub index: usize,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NodeForm {
    Name(String),
    Full {
        name: String,
        #[serde(default)]
        subnet: Option<Ipv4Net>,
        #[serde(default)]
        pod_range: Option<String>,
        #[serde(default)]
        pod_range6: Option<String>,
    },
}

impl<'de> Deserialize<'de> for NodeSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The defaults depend on the node's position, filled in by `Lab::load`; an
        // unspecified subnet is marked by the unspecified network until then.
        let unset: Ipv4Net = "0.0.0.0/32".parse().expect("literal");
        Ok(match NodeForm::deserialize(d)? {
            NodeForm::Name(name) => NodeSpec {
                name,
                subnet: unset,
                pod_range: String::new(),
                pod_range6: String::new(),
                index: 0,
            },
            NodeForm::Full {
                name,
                subnet,
                pod_range,
                pod_range6,
            } => NodeSpec {
                name,
                subnet: subnet.unwrap_or(unset),
                pod_range: pod_range.unwrap_or_default(),
                pod_range6: pod_range6.unwrap_or_default(),
                index: 0,
            },
        })
    }
}

/// One pod of a lab.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    /// The pod's name (its Topology's name).
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// Its Kubernetes namespace. Without one it is the namespace of its Topology (the
    /// first of its name), else `default`, as before namespaces could be given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its labels (what policies select it by).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its container ports (what a policy's named ports resolve to).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PodPort>,
}

/// A container port of a lab pod, as in a Pod's `spec.containers[].ports[]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodPort {
    /// The port's name (optional; a policy names ports by it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The port number.
    pub container_port: u16,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
}

fn default_protocol() -> String {
    "TCP".into()
}

/// A Kubernetes namespace of a lab.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSpec {
    /// Its name (a DNS label).
    pub name: String,
    /// Its labels (the lab adds `kubernetes.io/metadata.name`, as the API server does).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its annotations (`weft.dev/policy-mode: audit` puts its policies in audit mode).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}
