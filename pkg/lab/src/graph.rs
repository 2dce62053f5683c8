//! A picture of a lab (`weftctl lab graph`): its nodes as clusters, their pods inside
//! them, and one edge per link labelled with both ends, the link's kind, its state, its
//! impairment and, while the lab runs, the rate it carries. Built from the lab file and
//! what the nodes report about each link end, so it needs neither root nor a running
//! lab: without reports every link is drawn as down, from the file alone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use weft_topology::{LinkKind, Topology};

use crate::spec::LabSpec;

/// What a node reports about one link end (its wire and its link settings), as
/// `weftctl wires` and `weftctl link show` print them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndReport {
    /// How the end is carried: veth, vxlan or grpc.
    pub kind: String,
    /// The wire's state: up, down (peer away) or pending.
    pub state: String,
    /// An operator took the link down (`weftctl link down`).
    pub down_by_intent: bool,
    /// The impairment in force at this end when a run-time setting overrides the
    /// topology's (`delay 20ms loss 1%`); `None` when the topology's applies.
    pub runtime_impairment: Option<String>,
    /// Bits per second through the end, both directions, from two samples of its byte
    /// counters; `None` when not sampled.
    pub rate_bps: Option<f64>,
}

/// Where a link stands, from both of its ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Both ends are up.
    Up,
    /// Being built: an end waits for its peer or its wire.
    Pending,
    /// An end is down (its peer away), or no node reports it (the lab is not up).
    Down,
    /// An operator took it down: expected, not a failure.
    DownByIntent,
}

impl LinkState {
    /// The words on the picture.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Pending => "pending",
            LinkState::Down => "down",
            LinkState::DownByIntent => "down by intent",
        }
    }

    fn color(self) -> &'static str {
        match self {
            LinkState::Up => "darkgreen",
            LinkState::Pending => "orange",
            LinkState::Down => "red",
            LinkState::DownByIntent => "gray50",
        }
    }
}

/// One link of the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphLink {
    /// The Topology namespace.
    pub namespace: String,
    /// The link's uid.
    pub uid: i64,
    /// One end, `(pod, interface)`: the pod whose entry came first in the lab.
    pub a: (String, String),
    /// The other end.
    pub b: (String, String),
    /// veth, vxlan or grpc: as reported, else as the lab file implies.
    pub kind: String,
    /// Where it stands.
    pub state: LinkState,
    /// Its impairment (`delay 20ms loss 1%`), `None` when it has none.
    pub impairment: Option<String>,
    /// Bits per second it carries, `None` when not sampled.
    pub rate_bps: Option<f64>,
}

/// A lab as drawn: nodes with their pods, and the links.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// The lab's name.
    pub name: String,
    /// Each node with the pods placed on it, in the lab file's order.
    pub nodes: Vec<(String, Vec<String>)>,
    /// Every link once.
    pub links: Vec<GraphLink>,
}

/// The topology's impairment parameters in `tc netem`'s order.
fn topology_params(l: &weft_topology::Link) -> [(&'static str, Option<&str>); 7] {
    let i = &l.impair;
    [
        ("delay", i.delay.as_deref()),
        ("jitter", i.jitter.as_deref()),
        ("loss", i.loss.as_deref()),
        ("rate", i.rate.as_deref()),
        ("corrupt", i.corrupt.as_deref()),
        ("duplicate", i.duplicate.as_deref()),
        ("reorder", i.reorder.as_deref()),
    ]
}

/// The topology's impairment of a link from both entries: either entry's value applies
/// to both directions, and where the entries differ each end sends with its own, so
/// both are shown (`delay 20ms/30ms`).
fn topology_impairment(a: &weft_topology::Link, b: Option<&weft_topology::Link>) -> Option<String> {
    let pa = topology_params(a);
    let pb = b.map(topology_params);
    let mut parts = Vec::new();
    for (i, (name, va)) in pa.iter().enumerate() {
        let vb = pb.as_ref().and_then(|p| p[i].1);
        let v = match (va, vb) {
            (Some(x), Some(y)) if *x != y => format!("{x}/{y}"),
            (Some(x), _) => x.to_string(),
            (None, Some(y)) => y.to_string(),
            (None, None) => continue,
        };
        parts.push(format!("{name} {v}"));
    }
    (!parts.is_empty()).then(|| parts.join(" "))
}

impl Graph {
    /// The picture of a lab: its description, its Topology objects, and what the nodes
    /// report by `pod:intf` (empty when the lab is not up).
    pub fn new(spec: &LabSpec, topologies: &[Topology], ends: &BTreeMap<String, EndReport>) -> Graph {
        let nodes = spec
            .nodes
            .iter()
            .map(|n| {
                let pods = spec
                    .pods
                    .iter()
                    .filter(|p| p.node == n.name)
                    .map(|p| p.name.clone())
                    .collect();
                (n.name.clone(), pods)
            })
            .collect();
        let node_of = |pod: &str| spec.pods.iter().find(|p| p.name == pod).map(|p| p.node.as_str());

        // Each link appears in both pods' entries under one uid: the first entry seen
        // makes the edge, the second only adds its impairment values.
        let mut entries: BTreeMap<(String, i64), Vec<(String, &weft_topology::Link)>> = BTreeMap::new();
        let mut order = Vec::new();
        for t in topologies {
            let ns = t.metadata.namespace.clone().unwrap_or_default();
            let pod = t.metadata.name.clone().unwrap_or_default();
            for l in &t.spec.links {
                let key = (ns.clone(), l.uid);
                let e = entries.entry(key.clone()).or_default();
                if e.is_empty() {
                    order.push(key);
                }
                e.push((pod.clone(), l));
            }
        }

        let mut links = Vec::new();
        for key in order {
            let e = &entries[&key];
            let (pod, l) = &e[0];
            let a = (pod.clone(), l.local_intf.clone());
            let b = (l.peer_pod.clone(), l.peer_intf.clone());
            let other = e
                .iter()
                .find(|(p, x)| *p == b.0 && x.local_intf == b.1)
                .map(|(_, x)| *x);
            let ra = ends.get(&format!("{}:{}", a.0, a.1));
            let rb = ends.get(&format!("{}:{}", b.0, b.1));
            let reports: Vec<&EndReport> = ra.into_iter().chain(rb).collect();

            let kind = reports
                .iter()
                .map(|r| r.kind.clone())
                .find(|k| !k.is_empty())
                .unwrap_or_else(|| {
                    if node_of(&a.0).is_some() && node_of(&a.0) == node_of(&b.0) {
                        LinkKind::Veth.as_str().to_string()
                    } else {
                        l.kind
                            .or_else(|| other.and_then(|o| o.kind))
                            .map(|k| k.as_str().to_string())
                            .unwrap_or_else(|| spec.inter_node_link.to_string())
                    }
                });
            let state = if reports.iter().any(|r| r.down_by_intent) {
                LinkState::DownByIntent
            } else if reports.is_empty() || reports.iter().any(|r| r.state == "down") {
                LinkState::Down
            } else if reports.iter().any(|r| r.state == "pending") {
                LinkState::Pending
            } else if reports.iter().all(|r| r.state == "up") {
                LinkState::Up
            } else {
                LinkState::Pending
            };
            // A run-time setting replaces the topology's; each end may have its own.
            let runtime: BTreeSet<&str> = reports.iter().filter_map(|r| r.runtime_impairment.as_deref()).collect();
            let impairment = if runtime.is_empty() {
                topology_impairment(l, other)
            } else {
                let text = runtime.into_iter().collect::<Vec<_>>().join(" / ");
                Some(format!("{text} (run time)"))
            };
            // Each end counts both directions, so the busier end is the link's rate
            // (an end that is gone counts nothing).
            let rate_bps = reports.iter().filter_map(|r| r.rate_bps).reduce(f64::max);
            links.push(GraphLink {
                namespace: key.0.clone(),
                uid: key.1,
                a,
                b,
                kind,
                state,
                impairment,
                rate_bps,
            });
        }
        Graph {
            name: spec.name.clone(),
            nodes,
            links,
        }
    }

    /// The picture in Graphviz's DOT language (undirected: a link carries both ways).
    pub fn to_dot(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "graph {} {{", quote(&format!("lab {}", self.name)));
        let _ = writeln!(out, "  label={};", quote(&format!("lab {}", self.name)));
        out.push_str("  labelloc=t;\n  fontname=\"Helvetica\";\n");
        out.push_str("  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\"];\n");
        out.push_str("  edge [fontname=\"Helvetica\", fontsize=9];\n");
        let mut placed = BTreeSet::new();
        for (i, (node, pods)) in self.nodes.iter().enumerate() {
            let _ = writeln!(out, "  subgraph {} {{", quote(&format!("cluster_{i}")));
            let _ = writeln!(out, "    label={};", quote(&format!("node {node}")));
            out.push_str("    style=\"rounded,filled\";\n    fillcolor=\"#eef3fb\";\n");
            for p in pods {
                let _ = writeln!(out, "    {} [label={}];", quote(p), quote(p));
                placed.insert(p.as_str());
            }
            out.push_str("  }\n");
        }
        // A link's peer the lab does not place still gets a box (outside any node).
        for l in &self.links {
            for p in [&l.a.0, &l.b.0] {
                if placed.insert(p.as_str()) {
                    let _ = writeln!(out, "  {} [label={}, style=dashed];", quote(p), quote(p));
                }
            }
        }
        for l in &self.links {
            let mut label = vec![
                format!("{}:{} -- {}:{}", l.a.0, l.a.1, l.b.0, l.b.1),
                format!("{}, {}", l.kind, l.state.as_str()),
            ];
            if let Some(i) = &l.impairment {
                label.push(i.clone());
            }
            if let Some(r) = l.rate_bps {
                label.push(rate_text(r));
            }
            let style = match (l.state, l.kind.parse::<LinkKind>()) {
                (LinkState::DownByIntent, _) => "dotted",
                (_, Ok(LinkKind::Grpc)) => "dashed",
                (_, Ok(LinkKind::Vxlan)) => "bold",
                (_, Ok(LinkKind::Veth) | Err(_)) => "solid",
            };
            let _ = writeln!(
                out,
                "  {} -- {} [label={}, taillabel={}, headlabel={}, color={}, fontcolor={}, style={}];",
                quote(&l.a.0),
                quote(&l.b.0),
                quote(&label.join("\n")),
                quote(&l.a.1),
                quote(&l.b.1),
                l.state.color(),
                l.state.color(),
                style,
            );
        }
        out.push_str("}\n");
        out
    }
}

/// A rate as people read it (`1.2 Mbit/s`).
pub fn rate_text(bps: f64) -> String {
    let units = [(1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")];
    for (scale, unit) in units {
        if bps >= scale {
            return format!("{:.1} {unit}", bps / scale);
        }
    }
    format!("{bps:.0} bit/s")
}

/// A DOT double-quoted string. Names come from files anyone may write, so a quote or a
/// backslash in them must not end the string or start an escape; a line break becomes
/// DOT's centred `\n`.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE_LAB: &str = include_str!("../../../examples/lab.yaml");
    const EXAMPLE_TOPOLOGIES: &str = include_str!("../../../examples/topologies/lab.yaml");

    fn example() -> (LabSpec, Vec<Topology>) {
        let spec: LabSpec = serde_yaml_ng::from_str(EXAMPLE_LAB).unwrap();
        let topologies = serde_yaml_ng::Deserializer::from_str(EXAMPLE_TOPOLOGIES)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        (spec, topologies)
    }

    fn report(kind: &str, state: &str) -> EndReport {
        EndReport {
            kind: kind.into(),
            state: state.into(),
            ..EndReport::default()
        }
    }

    #[test]
    fn every_link_of_the_example_is_drawn_once() {
        let (spec, topologies) = example();
        let g = Graph::new(&spec, &topologies, &BTreeMap::new());
        assert_eq!(g.links.len(), 8, "8 links, each in two entries");
        let uids: BTreeSet<i64> = g.links.iter().map(|l| l.uid).collect();
        assert_eq!(uids, (1..=8).collect());
        let dot = g.to_dot();
        assert_eq!(dot.matches(" -- \"").count(), 8, "one edge per link:\n{dot}");
        for l in &g.links {
            let name = format!("{}:{} -- {}:{}", l.a.0, l.a.1, l.b.0, l.b.1);
            assert_eq!(dot.matches(&name).count(), 1, "{name} once:\n{dot}");
            assert_eq!(l.state, LinkState::Down, "nothing reported: down");
            assert_eq!(l.rate_bps, None);
        }
        // Kinds from the file alone: same node veth, else the link's or the lab's.
        let kind = |uid: i64| g.links.iter().find(|l| l.uid == uid).unwrap().kind.clone();
        assert_eq!(kind(1), "veth", "r1 and r2 share n1");
        assert_eq!(kind(2), "vxlan", "the lab's inter_node_link");
        assert_eq!(kind(3), "grpc", "the link's own kind");
        for (node, pods) in [("n1", "\"r1\""), ("n2", "\"r3\""), ("n3", "\"h2\"")] {
            assert!(dot.contains(&format!("label=\"node {node}\"")), "{dot}");
            assert!(dot.contains(pods), "{dot}");
        }
        assert!(dot.starts_with("graph \"lab wl\" {") && dot.ends_with("}\n"));
    }

    #[test]
    fn reports_give_state_kind_impairment_and_rate() {
        let (spec, mut topologies) = example();
        // A topology delay on one entry of r1-r2 and a different one on the other.
        topologies[0].spec.links[0].impair.delay = Some("20ms".into());
        topologies[1].spec.links[0].impair.delay = Some("30ms".into());
        topologies[1].spec.links[0].impair.loss = Some("1%".into());
        let mut ends = BTreeMap::new();
        ends.insert(
            "r1:e1".to_string(),
            EndReport {
                rate_bps: Some(1_500_000.0),
                ..report("veth", "up")
            },
        );
        ends.insert(
            "r2:e1".to_string(),
            EndReport {
                rate_bps: Some(1_000.0),
                ..report("veth", "up")
            },
        );
        ends.insert("r1:e2".into(), report("vxlan", "pending"));
        ends.insert("r3:e1".into(), report("vxlan", "up"));
        ends.insert(
            "r2:e2".into(),
            EndReport {
                down_by_intent: true,
                ..report("grpc", "down")
            },
        );
        ends.insert(
            "r3:e2".into(),
            EndReport {
                runtime_impairment: Some("loss 10%".into()),
                ..report("grpc", "up")
            },
        );
        ends.insert("r5:e1".into(), report("grpc", "up"));
        ends.insert("r1:e3".into(), report("veth", "down"));
        let g = Graph::new(&spec, &topologies, &ends);
        let by = |uid: i64| g.links.iter().find(|l| l.uid == uid).unwrap();
        assert_eq!(by(1).state, LinkState::Up);
        assert_eq!(by(1).impairment.as_deref(), Some("delay 20ms/30ms loss 1%"));
        assert_eq!(by(1).rate_bps, Some(1_500_000.0), "the busier end");
        assert_eq!(by(2).state, LinkState::Pending);
        assert_eq!(by(3).state, LinkState::DownByIntent);
        assert_eq!(by(4).state, LinkState::Up);
        assert_eq!(by(4).impairment.as_deref(), Some("loss 10% (run time)"));
        assert_eq!(by(6).state, LinkState::Down, "one end down");
        let dot = g.to_dot();
        assert!(
            dot.contains("\"r1:e1 -- r2:e1\\nveth, up\\ndelay 20ms/30ms loss 1%\\n1.5 Mbit/s\""),
            "{dot}"
        );
        assert!(dot.contains("grpc, down by intent"), "{dot}");
        assert!(dot.contains("style=dotted"), "{dot}");
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(quote("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
        let (mut spec, mut topologies) = example();
        spec.name = "we\"ird".into();
        topologies[0].spec.links[0].local_intf = "e\"1\\".into();
        let dot = Graph::new(&spec, &topologies, &BTreeMap::new()).to_dot();
        assert!(dot.starts_with("graph \"lab we\\\"ird\" {"), "{dot}");
        assert!(dot.contains("taillabel=\"e\\\"1\\\\\""), "{dot}");
        // Every quote that is not escaped opens or closes a string: an even count per line.
        for line in dot.lines() {
            let unescaped = line.replace("\\\\", "").replace("\\\"", "");
            assert_eq!(unescaped.matches('"').count() % 2, 0, "unbalanced: {line}");
        }
    }

    #[test]
    fn rates_read_well() {
        assert_eq!(rate_text(0.0), "0 bit/s");
        assert_eq!(rate_text(999.0), "999 bit/s");
        assert_eq!(rate_text(12_345.0), "12.3 kbit/s");
        assert_eq!(rate_text(2.5e9), "2.5 Gbit/s");
    }
}
