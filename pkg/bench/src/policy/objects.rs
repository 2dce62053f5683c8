//! The Kubernetes objects of the policy benchmarks, as weftd reads them (from files in
//! its `--topology-dir`, or from the API server): Namespaces with labels, Pods with
//! namespace, name, labels, node and addresses, NetworkPolicies; and a synthetic cluster
//! of any size whose policies both select a node's pods and name them as peers.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

pub(crate) use weft_lab::kinds::{namespace, network_policy as policy};

/// A Pod object on `node` with the benchmark's container, with its address once
/// kubelet has reported it.
pub(crate) fn pod(ns: &str, name: &str, node: &str, labels: Value, ip: Option<Ipv4Addr>) -> Value {
    let ips: Vec<IpAddr> = ip.map(IpAddr::V4).into_iter().collect();
    weft_lab::kinds::pod(ns, name, node, labels, json!({"name": "main", "image": "bench"}), &ips)
}

/// Writes `docs` to `dir/name` as YAML documents (JSON is YAML), through a rename so a
/// daemon never reads half of it.
pub(crate) fn write_docs(dir: &Path, name: &str, docs: &[Value]) -> Result<(), String> {
    let mut text = String::with_capacity(docs.len() * 400);
    for d in docs {
        text.push_str("---\n");
        text.push_str(&serde_json::to_string(d).expect("objects serialize"));
        text.push('\n');
    }
    weft_lab::kinds::write_file(dir, name, &text)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Writes `docs` in files of at most `per_file` documents, `<prefix>-<n>.yaml`.
pub(crate) fn write_chunked(dir: &Path, prefix: &str, docs: &[Value], per_file: usize) -> Result<(), String> {
    for (i, chunk) in docs.chunks(per_file.max(1)).enumerate() {
        write_docs(dir, &format!("{prefix}-{i:03}.yaml"), chunk)?;
    }
    Ok(())
}

/// The size of a synthetic cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClusterSize {
    /// Namespaces.
    pub namespaces: usize,
    /// Pods (on other nodes, with addresses).
    pub pods: usize,
    /// NetworkPolicies.
    pub policies: usize,
}

/// How many of the namespaces hold the measured node's pods.
pub(crate) const LOCAL_NAMESPACES: usize = 5;

/// How many `app` label values pods and selectors spread over.
const APPS: usize = 4;

/// How many `team` label values namespaces spread over.
const TEAMS: usize = 10;

/// A synthetic cluster: namespaces `ns-0000`... labelled `team=t<i mod 10>`; pod `i` in
/// namespace `i mod N`, labelled `app=a<(i / N) mod 4>`, on one of 50 other nodes, with
/// an address in 10.200.0.0/14; policy `j` in namespace `j mod N` (`k = j / N`)
/// selects `app=a<k mod 4>` there, for ingress from that namespace's `app=a<k+1>` and
/// from `app=a<k+2>` of the namespaces labelled `team=t<(j+k) mod 10>` on TCP port
/// 8000+k, and for egress to that namespace's `app=a<k+3>` on UDP 5353. The measured
/// node's pods live in the first [`LOCAL_NAMESPACES`] namespaces with the same labels,
/// so some policies select them and others have them as peers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Synthetic(pub(crate) ClusterSize);

impl Synthetic {
    pub(crate) fn ns_name(i: usize) -> String {
        format!("ns-{i:04}")
    }

    fn app(k: usize) -> String {
        format!("a{}", k % APPS)
    }

    /// The address of synthetic pod `i` (10.200.0.1 on).
    pub(crate) fn pod_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + 1 + i as u32)
    }

    fn n(&self) -> usize {
        self.0.namespaces.max(1)
    }

    pub(crate) fn namespaces(&self) -> Vec<Value> {
        (0..self.n())
            .map(|i| namespace(&Self::ns_name(i), json!({"team": format!("t{}", i % TEAMS)})))
            .collect()
    }

    pub(crate) fn pods(&self) -> Vec<Value> {
        (0..self.0.pods).map(|i| self.pod(i)).collect()
    }

    /// Synthetic pod `i` (`i` may run past the cluster's size: a pod that arrives).
    pub(crate) fn pod(&self, i: usize) -> Value {
        let n = self.n();
        pod(
            &Self::ns_name(i % n),
            &format!("p-{i}"),
            &format!("other-{}", i % 50),
            json!({"app": Self::app(i / n)}),
            Some(Self::pod_ip(i)),
        )
    }

    pub(crate) fn policies(&self) -> Vec<Value> {
        let n = self.n();
        (0..self.0.policies)
            .map(|j| {
                let (ns, k) = (j % n, j / n);
                policy(
                    &Self::ns_name(ns),
                    &format!("np-{j}"),
                    json!({
                        "podSelector": {"matchLabels": {"app": Self::app(k)}},
                        "policyTypes": ["Ingress", "Egress"],
                        "ingress": [{
                            "from": [
                                {"podSelector": {"matchLabels": {"app": Self::app(k + 1)}}},
                                {"namespaceSelector": {"matchLabels": {"team": format!("t{}", (j + k) % TEAMS)}},
                                 "podSelector": {"matchLabels": {"app": Self::app(k + 2)}}},
                            ],
                            "ports": [{"protocol": "TCP", "port": 8000 + (k % 100)}],
                        }],
                        "egress": [{
                            "to": [{"podSelector": {"matchLabels": {"app": Self::app(k + 3)}}}],
                            "ports": [{"protocol": "UDP", "port": 5353}],
                        }],
                    }),
                )
            })
            .collect()
    }

    /// The namespace and labels of the measured node's `i`-th pod.
    pub(crate) fn local(&self, i: usize) -> (String, Value) {
        let l = LOCAL_NAMESPACES.min(self.n());
        (Self::ns_name(i % l), json!({"app": Self::app(i / l)}))
    }

    /// The Pod object of the measured node's `i`-th pod, named `name`.
    pub(crate) fn local_pod(&self, i: usize, name: &str, node: &str, ip: Option<Ipv4Addr>) -> Value {
        let (ns, labels) = self.local(i);
        pod(&ns, name, node, labels, ip)
    }

    /// A pod of another node that some policy selecting the measured node's pods has as
    /// a peer: in the first local namespace, labelled as the ingress peers of the
    /// policies there that select `app=a0` (the node's first pod has `app=a0`).
    pub(crate) fn arriving_peer(&self, i: usize) -> Value {
        pod(
            &Self::ns_name(0),
            &format!("arriving-{i}"),
            "other-arrivals",
            json!({"app": Self::app(1)}),
            Some(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 210, 0, 0)) + 1 + i as u32)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthetic_cluster_has_its_size_and_its_labels_spread() {
        let s = Synthetic(ClusterSize {
            namespaces: 50,
            pods: 5000,
            policies: 1000,
        });
        assert_eq!(s.namespaces().len(), 50);
        let pods = s.pods();
        assert_eq!(pods.len(), 5000);
        // Every namespace holds every app.
        let apps: std::collections::BTreeSet<String> = pods
            .iter()
            .filter(|p| p["metadata"]["namespace"] == "ns-0007")
            .map(|p| p["metadata"]["labels"]["app"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(apps.len(), 4);
        assert_eq!(pods[4999]["status"]["podIPs"][0]["ip"], "10.200.19.136");
        let policies = s.policies();
        assert_eq!(policies.len(), 1000);
        assert_eq!(policies[51]["metadata"]["namespace"], "ns-0001");
        assert_eq!(policies[51]["spec"]["podSelector"]["matchLabels"]["app"], "a1");
        let (ns, labels) = s.local(7);
        assert_eq!((ns.as_str(), labels["app"].as_str()), ("ns-0002", Some("a1")));
        assert_eq!(s.local_pod(0, "l-0", "n", None)["metadata"]["labels"]["app"], "a0");
        assert_eq!(s.arriving_peer(0)["metadata"]["labels"]["app"], "a1");
    }
}
