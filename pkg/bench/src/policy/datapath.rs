//! Pod-to-pod traffic across two nodes with network policy in force beside the same
//! lab without any: two labs as `podnet`'s direct-routing one (nodes on one segment,
//! `--pod-routing direct`, a weftd per node), pod `a` on n1 sending to pod `b` on n2.
//! In the policy lab both pods are selected by [`DATA_POLICIES`] NetworkPolicies for
//! ingress and egress whose peers are the pods labelled `role=peer`: the two real pods
//! and [`DATA_PEERS`] Pod objects of a node that does not exist, written into the
//! daemons' topology directory, so every peer set holds that many addresses and more
//! (each rule's selector is written its own way, so no two rules share a set).
//! The policies are jumped to in name order: the first allows UDP port
//! [`FIRST_POLICY_PORT`] only, the last every port, and those between one TCP port
//! nobody uses each. So a new flow to the flood's usual port (9919) or iperf3's goes
//! through every policy chain before the last accepts it, and one to
//! [`FIRST_POLICY_PORT`] is accepted by the first.
//!
//! A TCP connection is `established` in conntrack after its handshake, a UDP flow only
//! once the other end has answered: a flow that is never answered (the flood) stays
//! `new`, and whether each of its packets walks the policy chains again depends on what
//! the table remembers of it (weft marks allowed flows in their conntrack mark). So the
//! 64-byte flood is measured three ways: never answered, to the port the last policy
//! accepts (the usual flood) and to the port the first accepts, and answered once
//! before the flood (established).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::nftmon::{TableSize, table_size};
use super::objects::{pod, policy, write_chunked, write_docs};
use super::{LoadAvg, PolicyOptions, div};
use crate::median;
use crate::table::Table;
use crate::udp::{Flood, PORT, flood_to};
use crate::util::{LabGuard, build_pair, iperf_tcp, metric_sum, metrics_in, side_name, turns, wait_reachable};

/// NetworkPolicies selecting the two pods.
pub const DATA_POLICIES: usize = 100;
/// Pod objects (on no real node) among their peers.
pub const DATA_PEERS: usize = 1000;
/// The target: with policy over without, TCP and 64-byte frames, at least.
pub const DATA_TARGET_RATIO: f64 = 0.95;
/// The UDP port the first policy allows.
pub const FIRST_POLICY_PORT: u16 = 9920;

/// How long the policy table may take to hold every peer.
const PROGRAM_LIMIT: Duration = Duration::from_secs(300);

/// One side's traffic.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrafficSide {
    /// TCP throughput per pass (Gbit/s).
    pub tcp_gbps: Vec<f64>,
    /// UDP floods per pass, never answered, to the port the last policy accepts.
    pub udp: Vec<Flood>,
    /// The same to the port the first policy accepts.
    pub udp_first: Vec<Flood>,
    /// Answered once before the flood (established), to the last policy's port.
    pub udp_replied: Vec<Flood>,
    /// Median TCP (Gbit/s).
    pub tcp_gbps_median: f64,
    /// Median 64-byte frames/s received, never answered, last policy's port.
    pub udp_fps_median: f64,
    /// The same, first policy's port.
    pub udp_first_fps_median: f64,
    /// The same, answered.
    pub udp_replied_fps_median: f64,
    /// The policy table of each node once set up (n1, n2).
    pub tables: Vec<TableSize>,
    /// `weft_policy_isolated_pods` (both directions) of each node.
    pub isolated_pods: Vec<f64>,
}

/// Traffic with policy beside without.
#[derive(Debug, Clone, Serialize)]
pub struct DataPathReport {
    /// NetworkPolicies selecting the pods.
    pub policies: usize,
    /// Pod objects among their peers (the two real pods come on top).
    pub peer_pods: usize,
    /// Passes (alternating which lab goes first).
    pub rounds: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// Seconds per UDP flood.
    pub udp_seconds: f64,
    /// With the policies.
    pub with_policy: TrafficSide,
    /// Without.
    pub without_policy: TrafficSide,
    /// TCP, with over without (medians).
    pub tcp_ratio: f64,
    /// 64-byte frames/s, with over without (medians): never answered, accepted by the
    /// last policy (the usual flood).
    pub fps_ratio: f64,
    /// The same, accepted by the first policy.
    pub fps_first_ratio: f64,
    /// The same, answered before the flood (established).
    pub fps_replied_ratio: f64,
    /// Per pass: TCP ratio.
    pub tcp_per_pass: Vec<f64>,
    /// Per pass: frames/s ratio.
    pub fps_per_pass: Vec<f64>,
    /// Per pass: frames/s ratio, accepted by the first policy.
    pub fps_first_per_pass: Vec<f64>,
    /// Per pass: frames/s ratio, established.
    pub fps_replied_per_pass: Vec<f64>,
    /// The target.
    pub target_ratio: f64,
    /// Seconds from the daemons' start until both policy tables held every peer.
    pub programmed_s: f64,
    /// The machine's load at the start and the end.
    pub load: (LoadAvg, LoadAvg),
}

fn spec(name: &str) -> serde_json::Value {
    let labels = json!({"app": "bench", "role": "peer"});
    json!({
        "name": name,
        "underlay": "shared",
        "pod_routing": "direct",
        "wire_security": "insecure",
        // weftd's own default, not a lab's 10 s: every resync reads the whole table
        // back (`nft -j`), which with 200,000 elements takes CPU from the traffic on a
        // small machine.
        "reconcile_interval": 60,
        "nodes": ["n1", "n2"],
        "namespaces": [{"name": "bench", "labels": {"ns": "bench"}}],
        "pods": [
            {"name": "a", "node": "n1", "namespace": "bench", "labels": labels},
            {"name": "b", "node": "n2", "namespace": "bench", "labels": labels},
        ],
    })
}

/// The peer Pod objects and the policies, written where the lab's daemons will read
/// them before they start.
fn write_policy_objects(topology: &Path, policies: usize, peers: usize) -> Result<(), String> {
    std::fs::create_dir_all(topology).map_err(|e| format!("creating {}: {e}", topology.display()))?;
    let peer_pods: Vec<_> = (0..peers)
        .map(|i| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 250, 0, 0)) + 1 + i as u32);
            pod(
                "bench",
                &format!("peer-{i}"),
                "ghost",
                json!({"role": "peer"}),
                Some(ip),
            )
        })
        .collect();
    write_chunked(topology, "bench-peers", &peer_pods, 500)?;
    // Every rule takes the same pods, each through a selector written its own way: rules
    // that take the same pods the same way share one set, and this table is to hold a
    // set of every peer per rule, as distinct policies would.
    let peer = |way: String| json!([{"podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["peer", way]}]}}]);
    let docs: Vec<_> = (0..policies)
        .map(|i| {
            let mut rule_in = json!({"from": peer(format!("in-{i}"))});
            let mut rule_out = json!({"to": peer(format!("out-{i}"))});
            let ports = if i + 1 == policies {
                None
            } else if i == 0 {
                Some(json!([{"protocol": "UDP", "port": FIRST_POLICY_PORT}]))
            } else {
                Some(json!([{"protocol": "TCP", "port": 10000 + i}]))
            };
            if let Some(ports) = ports {
                rule_in["ports"] = ports.clone();
                rule_out["ports"] = ports;
            }
            policy(
                "bench",
                &format!("np-{i:03}"),
                json!({
                    "podSelector": {"matchLabels": {"app": "bench"}},
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [rule_in],
                    "egress": [rule_out],
                }),
            )
        })
        .collect();
    write_docs(topology, "bench-policies.yaml", &docs)
}

struct Side {
    guard: LabGuard,
    dst: Ipv4Addr,
}

impl Side {
    fn build(dir: &Path, name: &str, policies: Option<(usize, usize)>, o: &PolicyOptions) -> Result<Self, String> {
        if let Some((n, peers)) = policies {
            // LabGuard keeps the lab's state in `<dir>/state`; its daemons read
            // `<state>/topology`.
            write_policy_objects(&dir.join("state").join("topology"), n, peers)?;
        }
        let guard = LabGuard::up(dir, &spec(name), &o.weftd, &o.weft)?;
        let dst = v4(&guard.lab, "b").ok_or("pod b has no IPv4 address")?;
        Ok(Side { guard, dst })
    }

    fn ns(&self, pod: &str) -> String {
        self.guard.lab.pod_ns(pod)
    }

    fn nodes(&self) -> [String; 2] {
        [self.guard.lab.node_ns("n1"), self.guard.lab.node_ns("n2")]
    }
}

fn v4(lab: &weft_lab::Lab, pod: &str) -> Option<Ipv4Addr> {
    lab.pod_addresses(pod).into_iter().find_map(|a| match a {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(_) => None,
    })
}

/// Runs the data path comparison.
pub(crate) fn run_datapath(o: &PolicyOptions) -> Result<DataPathReport, String> {
    let load_start = LoadAvg::now();
    let base = format!("wb{}", std::process::id());
    let (policies, peers) = (o.data_policies, o.data_peers);
    let started = Instant::now();
    let (with, without) = build_pair("data path", |with| {
        let name = side_name(&base, with);
        Side::build(&o.work_dir.join(&name), &name, with.then_some((policies, peers)), o)
    })?;
    // Every peer (and both real pods, once their addresses are reported) in every set
    // of both directions on both nodes.
    let want = 2 * policies * (peers + 2);
    let deadline = started + PROGRAM_LIMIT;
    for ns in with.nodes() {
        while table_size(&ns)?.elements < want {
            if Instant::now() > deadline {
                return Err(format!(
                    "data path: the policy table of {ns} holds {} elements after {PROGRAM_LIMIT:?}, not {want}",
                    table_size(&ns)?.elements
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let programmed_s = started.elapsed().as_secs_f64();
    let sides = [&with, &without];
    for s in sides {
        for (from, to) in [
            ("a", s.dst),
            ("b", v4(&s.guard.lab, "a").ok_or("pod a has no IPv4 address")?),
        ] {
            if !wait_reachable(&s.ns(from), &to.to_string(), Duration::from_secs(30)) {
                return Err(format!("data path: pod {from} does not reach {to}"));
            }
        }
    }
    let mut results = [TrafficSide::default(), TrafficSide::default()];
    for (r, s) in results.iter_mut().zip(sides) {
        for ns in s.nodes() {
            r.tables.push(table_size(&ns)?);
            r.isolated_pods
                .push(metric_sum(&metrics_in(&ns)?, "weft_policy_isolated_pods", &[]));
        }
    }
    for round in 0..o.rounds {
        for i in turns(round) {
            let s = sides[i];
            let (a, b) = (s.ns("a"), s.ns("b"));
            let t = iperf_tcp(&a, &b, s.dst, o.tcp_seconds)?;
            results[i].tcp_gbps.push(t.gbps);
            let f = flood_to(&a, &b, s.dst, PORT, false, o.udp_seconds)?;
            results[i].udp.push(f);
            let f = flood_to(&a, &b, s.dst, FIRST_POLICY_PORT, false, o.udp_seconds)?;
            results[i].udp_first.push(f);
            let f = flood_to(&a, &b, s.dst, PORT, true, o.udp_seconds)?;
            results[i].udp_replied.push(f);
        }
    }
    drop(with);
    drop(without);
    for with in [true, false] {
        let _ = std::fs::remove_dir_all(o.work_dir.join(side_name(&base, with)));
    }
    let fps = |v: &[Flood]| median(&v.iter().map(Flood::received_per_s).collect::<Vec<_>>());
    for r in &mut results {
        r.tcp_gbps_median = median(&r.tcp_gbps);
        r.udp_fps_median = fps(&r.udp);
        r.udp_first_fps_median = fps(&r.udp_first);
        r.udp_replied_fps_median = fps(&r.udp_replied);
    }
    let [w, n] = results;
    Ok(DataPathReport {
        policies,
        peer_pods: peers,
        rounds: o.rounds,
        tcp_seconds: o.tcp_seconds,
        udp_seconds: o.udp_seconds,
        tcp_ratio: div(w.tcp_gbps_median, n.tcp_gbps_median),
        fps_ratio: div(w.udp_fps_median, n.udp_fps_median),
        fps_first_ratio: div(w.udp_first_fps_median, n.udp_first_fps_median),
        fps_replied_ratio: div(w.udp_replied_fps_median, n.udp_replied_fps_median),
        tcp_per_pass: w.tcp_gbps.iter().zip(&n.tcp_gbps).map(|(a, b)| div(*a, *b)).collect(),
        fps_per_pass: per_pass(&w.udp, &n.udp),
        fps_first_per_pass: per_pass(&w.udp_first, &n.udp_first),
        fps_replied_per_pass: per_pass(&w.udp_replied, &n.udp_replied),
        with_policy: w,
        without_policy: n,
        target_ratio: DATA_TARGET_RATIO,
        programmed_s,
        load: (load_start, LoadAvg::now()),
    })
}

fn per_pass(a: &[Flood], b: &[Flood]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(a, b)| div(a.received_per_s(), b.received_per_s()))
        .collect()
}

impl DataPathReport {
    /// Whether both ratios reach the target.
    pub fn met(&self) -> bool {
        self.tcp_ratio >= self.target_ratio && self.fps_ratio >= self.target_ratio
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let list = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
        let t = |s: &TrafficSide| {
            s.tables
                .iter()
                .map(|t| {
                    format!(
                        "{} elements, {} sets, {} chains, {} rules",
                        t.elements, t.sets, t.chains, t.rules
                    )
                })
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let mut out = format!(
            "Data path: pod a (n1) to pod b (n2), direct routing, {} pass(es) alternating; both pods selected by {} NetworkPolicies (ingress and egress) whose peers are {} Pod objects plus the two pods; iperf3 TCP one stream {} s, 64-byte UDP flood {} s; load {} at the start, {} at the end\n\n",
            self.rounds, self.policies, self.peer_pods, self.tcp_seconds, self.udp_seconds, self.load.0, self.load.1
        );
        let mut sides = Table::new()
            .text("side")
            .num("TCP (Gbit/s)")
            .num("64-byte frames/s, never answered, accepted by the last policy")
            .num("the same, accepted by the first policy")
            .num("answered before the flood (established)")
            .text("policy table n1 / n2")
            .text("isolated pods n1 / n2");
        for (name, s) in [("with policy", &self.with_policy), ("without", &self.without_policy)] {
            sides.row([
                name.to_string(),
                format!("{:.2}", s.tcp_gbps_median),
                format!("{:.0}", s.udp_fps_median),
                format!("{:.0}", s.udp_first_fps_median),
                format!("{:.0}", s.udp_replied_fps_median),
                t(s),
                list(&s.isolated_pods),
            ]);
        }
        let mut ratios = Table::new()
            .text("with / without")
            .num("TCP")
            .num("64-byte frames/s, last policy")
            .num("first policy")
            .num("established")
            .text(format!("target >= {:.2} (TCP and the usual flood)", self.target_ratio));
        ratios.row([
            "medians".to_string(),
            format!("{:.2}", self.tcp_ratio),
            format!("{:.2}", self.fps_ratio),
            format!("{:.2}", self.fps_first_ratio),
            format!("{:.2}", self.fps_replied_ratio),
            crate::exec::met(self.met()).to_string(),
        ]);
        ratios.row([
            "per pass".to_string(),
            list(&self.tcp_per_pass),
            list(&self.fps_per_pass),
            list(&self.fps_first_per_pass),
            list(&self.fps_replied_per_pass),
            String::new(),
        ]);
        out.push_str(&format!("{sides}\n{ratios}"));
        out.push_str(&format!(
            "\nboth policy tables held every peer {:.1} s after the labs started building\n",
            self.programmed_s
        ));
        out
    }
}
