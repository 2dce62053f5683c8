//! Nodes of the cluster as pod networking and network policy see them: where each node
//! is (its `InternalIP`s) and which pod ranges it holds (`spec.podCIDRs`), for pod
//! routes; and its labels and `ExternalIP`s, for network policy.
//!
//! Why labels and external addresses, when routing needs neither: a ClusterNetworkPolicy
//! egress rule may name `nodes` peers, which select Node objects by their labels and
//! match every address in the selected Nodes' `status.addresses` (upstream's semantics,
//! not only the InternalIPs weft routes to). So both sources keep them: the kube
//! source's Node cache no longer drops labels, and the directory source reads them from
//! its Node files.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

/// One node of the cluster, reduced to what pod-to-pod routing and network policy's
/// node peers need.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterNode {
    /// The Node's name.
    pub name: String,
    /// Its `InternalIP` addresses in the Node's order (the primary one first).
    pub addresses: Vec<IpAddr>,
    /// Its pod ranges (`spec.podCIDRs`, or the older single `spec.podCIDR`), in order.
    pub pod_cidrs: Vec<IpNet>,
    /// Its `ExternalIP` addresses, in the Node's order (network policy's `nodes` peers
    /// take every address of a node's status; pod routes never use these).
    pub external_addresses: Vec<IpAddr>,
    /// Its labels (`metadata.labels`: network policy's `nodes` peers select nodes by
    /// label).
    pub labels: BTreeMap<String, String>,
}

impl ClusterNode {
    /// Reads a Node object. Entries that do not parse are left out with a warning: a
    /// node with one bad podCIDR still gets its good ones routed.
    pub fn from_node(node: &Node) -> Option<Self> {
        let name = node.metadata.name.clone()?;
        // The addresses of one type, in the Node's order.
        let addresses_of = |type_: &str| -> Vec<IpAddr> {
            let list = node.status.as_ref().and_then(|s| s.addresses.as_ref());
            (list.into_iter().flatten())
                .filter(|a| a.type_ == type_)
                .filter_map(|a| match a.address.parse::<IpAddr>() {
                    Ok(ip) => Some(ip),
                    Err(_) => {
                        tracing::warn!(node = %name, address = %a.address, "Node {type_} is not an IP address; ignored");
                        None
                    }
                })
                .collect()
        };
        let addresses = addresses_of("InternalIP");
        let external_addresses = addresses_of("ExternalIP");
        let spec = node.spec.as_ref();
        let raw: Vec<String> = match spec.and_then(|s| s.pod_cidrs.clone()) {
            Some(list) if !list.is_empty() => list,
            _ => spec.and_then(|s| s.pod_cidr.clone()).into_iter().collect(),
        };
        let mut pod_cidrs = Vec::with_capacity(raw.len());
        for c in raw {
            match c.parse::<IpNet>() {
                Ok(net) if net.network() == net.addr() => {
                    if !pod_cidrs.contains(&net) {
                        pod_cidrs.push(net);
                    }
                }
                _ => tracing::warn!(node = %name, pod_cidr = %c, "Node podCIDR is not a network CIDR; ignored"),
            }
        }
        Some(ClusterNode {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            name,
            addresses,
            pod_cidrs,
            external_addresses,
        })
    }

    /// The node's first address of one family, if it has one.
    pub fn address_of_family(&self, v6: bool) -> Option<IpAddr> {
        self.addresses.iter().copied().find(|a| a.is_ipv6() == v6)
    }

    /// A Node object carrying exactly this (for labs, which write Node files, and tests).
    pub fn to_node(&self) -> Node {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
        let cidrs: Vec<String> = self.pod_cidrs.iter().map(ToString::to_string).collect();
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(self.name.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: cidrs.first().cloned(),
                pod_cidrs: (!cidrs.is_empty()).then_some(cidrs),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(
                    (self.addresses.iter().map(|a| ("InternalIP", a)))
                        .chain(self.external_addresses.iter().map(|a| ("ExternalIP", a)))
                        .map(|(type_, a)| NodeAddress {
                            type_: type_.into(),
                            address: a.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn reads_pod_cidrs_addresses_of_both_kinds_and_labels() {
        let n = ClusterNode::from_node(&node(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "zone": "a"},
                         "annotations": {"note": "x"}},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "172.30.1.2"},
                {"type": "ExternalIP", "address": "203.0.113.9"},
                {"type": "InternalIP", "address": "fd00::2"},
                {"type": "ExternalIP", "address": "not-an-ip"},
                {"type": "ExternalIP", "address": "2001:db8::9"}
            ]}
        })))
        .unwrap();
        assert_eq!(n.name, "n1");
        assert_eq!(
            n.addresses,
            vec!["172.30.1.2".parse::<IpAddr>().unwrap(), "fd00::2".parse().unwrap()]
        );
        assert_eq!(
            n.external_addresses,
            vec!["203.0.113.9".parse::<IpAddr>().unwrap(), "2001:db8::9".parse().unwrap()],
            "the ones that parse, in order"
        );
        let labels: Vec<_> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(labels, ["kubernetes.io/hostname=n1", "zone=a"]);
        assert_eq!(n.pod_cidrs.len(), 2);
        assert_eq!(n.address_of_family(true), Some("fd00::2".parse().unwrap()));
    }

    #[test]
    fn falls_back_to_pod_cidr_and_skips_bad_entries() {
        let n = ClusterNode::from_node(&node(serde_json::json!({
            "metadata": {"name": "n2"},
            "spec": {"podCIDR": "10.244.2.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "not-an-ip"}]}
        })))
        .unwrap();
        assert_eq!(n.pod_cidrs, vec!["10.244.2.0/24".parse::<IpNet>().unwrap()]);
        assert!(n.addresses.is_empty() && n.external_addresses.is_empty() && n.labels.is_empty());
        let bad = ClusterNode::from_node(&node(serde_json::json!({
            "metadata": {"name": "n3"},
            "spec": {"podCIDRs": ["10.244.3.1/24", "10.244.4.0/24"]}
        })))
        .unwrap();
        assert_eq!(
            bad.pod_cidrs,
            vec!["10.244.4.0/24".parse::<IpNet>().unwrap()],
            "host bits set: left out"
        );
    }

    #[test]
    fn round_trips_through_a_node_object() {
        let n = ClusterNode {
            name: "n4".into(),
            addresses: vec!["172.30.4.2".parse().unwrap(), "fd00::4".parse().unwrap()],
            pod_cidrs: vec!["10.244.4.0/24".parse().unwrap()],
            external_addresses: vec!["203.0.113.4".parse().unwrap()],
            labels: [("node-role".to_string(), "edge".to_string())].into(),
        };
        let object = n.to_node();
        assert_eq!(object.metadata.labels.as_ref(), Some(&n.labels));
        assert_eq!(ClusterNode::from_node(&object), Some(n));
        // Without labels or external addresses, none are written.
        let bare = ClusterNode {
            name: "n5".into(),
            ..ClusterNode::default()
        };
        assert_eq!(bare.to_node().metadata.labels, None);
        assert_eq!(ClusterNode::from_node(&bare.to_node()), Some(bare));
    }
}
