//! Lab files made to order (`weftctl lab gen`): a ring of pods, each linked to its next
//! neighbours until the lab has as many links as asked, the pods spread over the
//! nodes, the Topology objects inline. What a new user writes to try weft at KNE's
//! sizes (1,500 links), and what the scale test builds.

use std::fmt;
use std::net::Ipv4Addr;

use serde_json::json;
use weft_topology::LinkKind;

/// How the generated links are carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenKind {
    /// Links between nodes over gRPC; pods on one node by veth.
    Grpc,
    /// Links between nodes over VXLAN; pods on one node by veth.
    Vxlan,
    /// Only veth: each node's pods form a ring of their own, so no link leaves a node.
    Veth,
    /// Links between nodes alternately gRPC and VXLAN; pods on one node by veth.
    Mixed,
}

impl std::str::FromStr for GenKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "mixed" {
            return Ok(GenKind::Mixed);
        }
        match s.parse::<LinkKind>() {
            Ok(LinkKind::Grpc) => Ok(GenKind::Grpc),
            Ok(LinkKind::Vxlan) => Ok(GenKind::Vxlan),
            Ok(LinkKind::Veth) => Ok(GenKind::Veth),
            Err(_) => Err(format!("{s:?}: grpc, vxlan, veth or mixed")),
        }
    }
}

impl fmt::Display for GenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GenKind::Grpc => LinkKind::Grpc.as_str(),
            GenKind::Vxlan => LinkKind::Vxlan.as_str(),
            GenKind::Veth => LinkKind::Veth.as_str(),
            GenKind::Mixed => "mixed",
        })
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenSpec {
    /// The lab's name (namespace prefix; at most 24 characters).
    pub name: String,
    /// How many pods (`p1`..`pN`).
    pub pods: usize,
    /// How many links.
    pub links: usize,
    /// How many nodes (`n1`..`nK`); pod `pI` runs on node `n((I-1) mod K + 1)`.
    pub nodes: usize,
    /// How the links are carried.
    pub kind: GenKind,
}

/// The first link address: 100.64.0.0/10 (shared address space) is neither a pod
/// range, the underlay, nor the lab's outside, and holds 1,048,576 /30s.
const LINK_BASE: u32 = u32::from_be_bytes([100, 64, 0, 0]);
const MAX_LINKS: usize = 1 << 20;

/// The pod pairs (indices from 0) of the links: every ring's pods linked to their
/// neighbour at distance 1, then 2, ..., until `links` pairs.
fn pairs(spec: &GenSpec) -> Result<Vec<(usize, usize)>, String> {
    // The rings: the whole lab, or for veth one per node (its pods in order).
    let rings: Vec<Vec<usize>> = if spec.kind == GenKind::Veth {
        (0..spec.nodes)
            .map(|n| (0..spec.pods).filter(|p| p % spec.nodes == n).collect())
            .collect()
    } else {
        vec![(0..spec.pods).collect()]
    };
    let room: usize = rings.iter().map(|r| r.len() * r.len().saturating_sub(1) / 2).sum();
    if spec.links > room {
        return Err(format!(
            "{} links do not fit {} pods{}: at most {room}",
            spec.links,
            spec.pods,
            if spec.kind == GenKind::Veth {
                format!(" in {} per-node rings", spec.nodes)
            } else {
                String::new()
            }
        ));
    }
    let mut out = Vec::with_capacity(spec.links);
    let longest = rings.iter().map(Vec::len).max().unwrap_or(0);
    'outer: for d in 1..=longest / 2 {
        // Ring by ring within a distance, so each ring gets its share.
        for ring in &rings {
            let n = ring.len();
            if d > n / 2 {
                continue;
            }
            // At exactly half the ring, i and i+d are each other's partners: once.
            let starts = if 2 * d == n { n / 2 } else { n };
            for i in 0..starts {
                if out.len() == spec.links {
                    break 'outer;
                }
                out.push((ring[i], ring[(i + d) % n]));
            }
        }
    }
    Ok(out)
}

/// The lab file (YAML) for `spec`.
pub fn generate(spec: &GenSpec) -> Result<String, String> {
    if spec.name.is_empty() || spec.name.len() > 24 || !spec.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(format!("name {:?}: 1-24 letters, digits or '-'", spec.name));
    }
    if spec.nodes == 0 || spec.nodes > 250 {
        return Err("nodes: 1 to 250".into());
    }
    if spec.pods < 2 {
        return Err("pods: at least 2".into());
    }
    if spec.links > MAX_LINKS {
        return Err(format!("links: at most {MAX_LINKS}"));
    }
    let pairs = pairs(spec)?;
    let node_of = |p: usize| p % spec.nodes;
    let mut links: Vec<Vec<serde_json::Value>> = vec![Vec::new(); spec.pods];
    let mut inter = 0usize;
    for (k, &(a, b)) in pairs.iter().enumerate() {
        let net = LINK_BASE + 4 * k as u32;
        let (ip_a, ip_b) = (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2));
        // Interfaces numbered per pod in the order its links come: e1, e2, ...
        let (ia, ib) = (format!("e{}", links[a].len() + 1), format!("e{}", links[b].len() + 1));
        let kind = if node_of(a) == node_of(b) {
            None
        } else {
            inter += 1;
            // Otherwise the lab's `inter_node_link` says.
            (spec.kind == GenKind::Mixed).then_some(
                if inter.is_multiple_of(2) {
                    LinkKind::Vxlan
                } else {
                    LinkKind::Grpc
                }
                .as_str(),
            )
        };
        let uid = k + 1;
        for (me, peer, li, pi, lip, pip) in [(a, b, &ia, &ib, ip_a, ip_b), (b, a, &ib, &ia, ip_b, ip_a)] {
            let mut l = json!({
                "uid": uid,
                "peer_pod": format!("p{}", peer + 1),
                "local_intf": li,
                "peer_intf": pi,
                "local_ip": format!("{lip}/30"),
                "peer_ip": format!("{pip}/30"),
            });
            if let Some(kind) = kind {
                l["kind"] = kind.into();
            }
            links[me].push(l);
        }
    }
    let per_node = spec.pods.div_ceil(spec.nodes);
    let nodes: Vec<serde_json::Value> = (0..spec.nodes)
        .map(|i| {
            let name = format!("n{}", i + 1);
            if per_node > 250 {
                // More pods than a /24 holds: a /16 per node, out of the way of the
                // default 10.244.<i>.0/24 ranges.
                json!({"name": name, "pod_range": format!("10.{}.0.0/16", 100 + i)})
            } else {
                json!(name)
            }
        })
        .collect();
    let pods: Vec<serde_json::Value> = (0..spec.pods)
        .map(|p| json!({"name": format!("p{}", p + 1), "node": format!("n{}", node_of(p) + 1)}))
        .collect();
    let topologies: Vec<serde_json::Value> = links
        .into_iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(p, l)| {
            json!({
                "apiVersion": "networkop.co.uk/v1beta1",
                "kind": "Topology",
                "metadata": {"name": format!("p{}", p + 1), "namespace": spec.name},
                "spec": {"links": l},
            })
        })
        .collect();
    let lab = json!({
        "name": spec.name,
        "inter_node_link": if spec.kind == GenKind::Vxlan { LinkKind::Vxlan } else { LinkKind::Grpc }.as_str(),
        // Generated labs do not depend on which pod arrives first.
        "parallel_attach": 8,
        "nodes": nodes,
        "pods": pods,
        "topologies": topologies,
    });
    let body = serde_yaml_ng::to_string(&lab).map_err(|e| e.to_string())?;
    let same = pairs.len() - inter;
    Ok(format!(
        "# Generated by `weftctl lab gen --pods {} --links {} --nodes {} --kind {} --name {}`:\n\
         # a ring of {} pods, each linked to its next neighbours; {} links ({} between nodes,\n\
         # {} veth on one node), a /30 each from 100.64.0.0/10.\n{body}",
        spec.pods,
        spec.links,
        spec.nodes,
        spec.kind,
        spec.name,
        spec.pods,
        pairs.len(),
        inter,
        same
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pods: usize, links: usize, nodes: usize, kind: GenKind) -> GenSpec {
        GenSpec {
            name: "g".into(),
            pods,
            links,
            nodes,
            kind,
        }
    }

    #[test]
    fn rings_give_unique_links_and_interface_names() {
        for (pods, links, nodes, kind) in [
            (500, 1500, 3, GenKind::Mixed),
            (10, 45, 2, GenKind::Grpc),
            (12, 18, 3, GenKind::Veth),
        ] {
            let s = spec(pods, links, nodes, kind);
            let p = pairs(&s).unwrap();
            assert_eq!(p.len(), links);
            let set: std::collections::BTreeSet<_> = p.iter().map(|&(a, b)| (a.min(b), a.max(b))).collect();
            assert_eq!(set.len(), links, "no pair twice");
            assert!(p.iter().all(|&(a, b)| a != b));
            if kind == GenKind::Veth {
                assert!(
                    p.iter().all(|&(a, b)| a % nodes == b % nodes),
                    "veth links stay on a node"
                );
            }
            let yaml = generate(&s).unwrap();
            let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
            let mut ends = 0;
            for t in v["topologies"].as_array().unwrap() {
                let names: Vec<&str> = t["spec"]["links"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l["local_intf"].as_str().unwrap())
                    .collect();
                let uniq: std::collections::BTreeSet<_> = names.iter().collect();
                assert_eq!(uniq.len(), names.len(), "interface names unique per pod");
                ends += names.len();
            }
            assert_eq!(ends, 2 * links);
        }
    }

    #[test]
    fn too_many_links_is_refused() {
        assert!(generate(&spec(4, 7, 1, GenKind::Grpc)).is_err());
        assert!(generate(&spec(4, 6, 1, GenKind::Grpc)).is_ok());
    }
}
