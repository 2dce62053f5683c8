//! The Kubernetes objects weft reads from a topology directory, built and written one
//! way: the lab's object files and the benchmarks that play a cluster through a
//! directory both build their Namespaces, Pods, Nodes and NetworkPolicies here, so each
//! kind has one shape (the one the API server and kubelet give it), and write them with
//! [`write_file`].

use std::fs;
use std::net::IpAddr;
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use crate::LabError;

use weft_topology::NAMESPACE_NAME_LABEL;

/// Writes `text` to `dir/name` through a hidden temporary file and a rename (a daemon
/// reading the directory sees the old file or the new, never half of one), unless the
/// file holds it already; returns whether it wrote. The one way the lab, and whatever
/// plays a cluster through a topology directory (the benchmarks), writes its objects.
pub fn write_file(dir: &Path, name: &str, text: &str) -> Result<bool, LabError> {
    let file = dir.join(name);
    if fs::read_to_string(&file).ok().as_deref() == Some(text) {
        return Ok(false);
    }
    // Hidden, so a daemon reloading meanwhile skips it.
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, text).map_err(|e| LabError::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, &file).map_err(|e| LabError::io(format!("writing {}", file.display()), e))?;
    Ok(true)
}

/// A Namespace with `labels` (any map of strings) and the name label the API server
/// adds to every Namespace.
pub fn namespace(name: &str, labels: impl Serialize) -> Value {
    let mut labels = serde_json::to_value(labels).unwrap_or_else(|_| json!({}));
    if !labels.is_object() {
        labels = json!({});
    }
    labels[NAMESPACE_NAME_LABEL] = name.into();
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// A Pod on `node` with one container: `Pending` until kubelet has reported its
/// addresses (`ips` empty), `Running` with `podIP` and `podIPs` once it has.
pub fn pod(namespace: &str, name: &str, node: &str, labels: impl Serialize, container: Value, ips: &[IpAddr]) -> Value {
    let labels = serde_json::to_value(labels).unwrap_or_else(|_| json!({}));
    let mut v = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node, "containers": [container]},
        "status": {"phase": "Pending"},
    });
    if let Some(first) = ips.first() {
        v["status"] = json!({
            "phase": "Running",
            "podIP": first.to_string(),
            "podIPs": ips.iter().map(|i| json!({"ip": i.to_string()})).collect::<Vec<_>>(),
        });
    }
    v
}

/// A Node as the API server has it: its pod ranges (`podCIDR` is the first) and its
/// addresses, as [`weft_topology::ClusterNode`] describes them.
pub fn node(n: &weft_topology::ClusterNode) -> Value {
    let mut v = serde_json::to_value(n.to_node()).expect("a Node serializes");
    v["apiVersion"] = "v1".into();
    v["kind"] = "Node".into();
    v
}

/// A NetworkPolicy with `spec`.
pub fn network_policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": namespace, "name": name}, "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_namespace_carries_its_name_label_beside_its_own() {
        let labels: BTreeMap<&str, &str> = [("team", "a")].into();
        let v = namespace("ns1", &labels);
        assert_eq!(v["metadata"]["labels"]["team"], "a");
        assert_eq!(v["metadata"]["labels"][NAMESPACE_NAME_LABEL], "ns1");
        assert_eq!(
            namespace("ns2", json!(null))["metadata"]["labels"][NAMESPACE_NAME_LABEL],
            "ns2"
        );
    }

    #[test]
    fn a_pod_is_pending_until_it_has_addresses() {
        let c = json!({"name": "main", "image": "x"});
        let p = pod("ns", "p", "n1", json!({"app": "a"}), c.clone(), &[]);
        assert_eq!(p["status"], json!({"phase": "Pending"}));
        assert_eq!(p["spec"]["nodeName"], "n1");
        let ips: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let p = pod("ns", "p", "n1", json!({}), c, &ips);
        assert_eq!(p["status"]["phase"], "Running");
        assert_eq!(p["status"]["podIP"], "10.0.0.2");
        assert_eq!(p["status"]["podIPs"][1]["ip"], "fd00::2");
    }

    #[test]
    fn a_node_names_its_ranges_and_address() {
        let n = weft_topology::ClusterNode {
            name: "n1".into(),
            addresses: vec!["192.0.2.1".parse().unwrap()],
            pod_cidrs: vec!["10.1.0.0/24".parse().unwrap()],
            ..Default::default()
        };
        let v = node(&n);
        assert_eq!(v["kind"], "Node");
        assert_eq!(v["spec"]["podCIDR"], "10.1.0.0/24");
        assert_eq!(v["spec"]["podCIDRs"][0], "10.1.0.0/24");
        assert_eq!(v["status"]["addresses"][0]["address"], "192.0.2.1");
        // Read back the way weftd reads it.
        let back = weft_topology::ClusterNode::from_node(&serde_json::from_value(v).unwrap());
        assert_eq!(back.map(|b| b.pod_cidrs), Some(n.pod_cidrs));
    }
}
