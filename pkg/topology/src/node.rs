//! Nodes of the cluster as pod networking sees them: where each node is (its
//! `InternalIP`s) and which pod ranges it holds (`spec.podCIDRs`).

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

/// One node of the cluster, reduced to what pod-to-pod routing needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterNode {
    /// The Node's name.
    pub name: String,
    /// Its `InternalIP` addresses in the Node's order (the primary one first).
    pub addresses: Vec<IpAddr>,
    /// Its pod ranges (`spec.podCIDRs`, or the older single `spec.podCIDR`), in order.
    pub pod_cidrs: Vec<IpNet>,
}

impl ClusterNode {
    /// Reads a Node object. Entries that do not parse are left out with a warning: a
    /// node with one bad podCIDR still gets its good ones routed.
    pub fn from_node(node: &Node) -> Option<Self> {
        let name = node.metadata.name.clone()?;
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|list| {
                list.iter()
                    .filter(|a| a.type_ == "InternalIP")
                    .filter_map(|a| match a.address.parse::<IpAddr>() {
                        Ok(ip) => Some(ip),
                        Err(_) => {
                            tracing::warn!(node = %name, address = %a.address, "Node InternalIP is not an IP address; ignored");
                            None
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
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
            name,
            addresses,
            pod_cidrs,
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
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: cidrs.first().cloned(),
                pod_cidrs: (!cidrs.is_empty()).then_some(cidrs),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(
                    self.addresses
                        .iter()
                        .map(|a| NodeAddress {
                            type_: "InternalIP".into(),
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
    fn reads_pod_cidrs_and_internal_ips() {
        let n = ClusterNode::from_node(&node(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "172.30.1.2"},
                {"type": "ExternalIP", "address": "203.0.113.9"},
                {"type": "InternalIP", "address": "fd00::2"}
            ]}
        })))
        .unwrap();
        assert_eq!(n.name, "n1");
        assert_eq!(
            n.addresses,
            vec!["172.30.1.2".parse::<IpAddr>().unwrap(), "fd00::2".parse().unwrap()]
        );
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
        assert!(n.addresses.is_empty());
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
            addresses: vec!["172.30.4.2".parse().unwrap()],
            pod_cidrs: vec!["10.244.4.0/24".parse().unwrap()],
        };
        assert_eq!(ClusterNode::from_node(&n.to_node()), Some(n));
    }
}
