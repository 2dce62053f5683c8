//! Cluster scale by simulation (`--compare nodes`): one weftd in a node namespace
//! reading N Node objects (podCIDRs, an `InternalIP` each) from the in-process fake API
//! server over HTTPS through its watch cache, as a node of an N-node cluster does. The
//! peers are off-link (their addresses are routed nowhere), so `auto` reaches each
//! through the VXLAN device: a route, an FDB entry and a neighbour entry per peer. At
//! each size:
//!
//! - the time from weftd's spawn to its kernel fully programmed (every peer's route,
//!   FDB and neighbour entry present);
//! - weftd's RSS then;
//! - one node's change (a new podCIDR) reaching the kernel: the time from the object's
//!   write to the new route, and the kernel requests the change cost (changes made and
//!   on-link lookups, from weftd's own counters): constant, not proportional to N.
//!
//! `WEFT_BENCH_KEEP_LOG=1` keeps each size's weftd log in the scratch directory
//! (`wbn<pid>-<k>.log`), for seeing where a slow start went.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use weft_harness::NamedNetns;

use crate::Percentiles;
use crate::policy::{Cluster, ClusterSource};
use crate::simnode::{SimNode, Wait};
use crate::table::Table;
use crate::util::{metric_sum, metrics_in, status_kib};

/// The sizes measured unless `WEFT_BENCH_NODE_SIZES` says otherwise.
pub const NODE_SIZES: [usize; 3] = [100, 1000, 5000];
/// Changes measured at each size.
const CHANGES: usize = 5;
/// This node's address (on a veth standing for its uplink).
const ME: &str = "192.168.0.2";

/// What to run.
#[derive(Debug, Clone)]
pub struct NodeScaleOptions {
    /// The weftd binary.
    pub weftd: std::path::PathBuf,
    /// Cluster sizes (Node objects, this node included).
    pub sizes: Vec<usize>,
    /// Scratch directory.
    pub work_dir: std::path::PathBuf,
}

/// One size.
#[derive(Debug, Clone, Serialize)]
pub struct NodeScalePoint {
    /// Node objects in the cluster, this node included.
    pub nodes: usize,
    /// From weftd's spawn to every peer's route, FDB and neighbour entry in the kernel
    /// (s).
    pub start_to_programmed_s: f64,
    /// Routes, FDB and neighbour entries found then.
    pub programmed: (usize, usize, usize),
    /// weftd's VmRSS once programmed (MiB).
    pub rss_mib: f64,
    /// From one Node object's new podCIDR written to its route in the kernel (ms).
    pub change_ms: Percentiles,
    /// Kernel changes (routes, FDB and neighbour entries) per Node change, each change.
    pub writes_per_change: Vec<f64>,
    /// On-link route lookups per Node change, each change.
    pub lookups_per_change: Vec<f64>,
    /// On-link lookups of the whole first pass (one per peer).
    pub lookups_at_start: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct NodeScaleReport {
    /// Each size, smallest first.
    pub points: Vec<NodeScalePoint>,
}

impl NodeScaleReport {
    /// The Markdown table.
    pub fn markdown(&self) -> String {
        let mut t = Table::new()
            .num("nodes")
            .num("start to programmed (s)")
            .text("routes / FDB / neighbours")
            .num("RSS (MiB)")
            .num("one change p50 / max (ms)")
            .text("kernel writes per change")
            .text("lookups per change")
            .num("lookups at start");
        for p in &self.points {
            let list = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ");
            t.row([
                p.nodes.to_string(),
                format!("{:.2}", p.start_to_programmed_s),
                format!("{} / {} / {}", p.programmed.0, p.programmed.1, p.programmed.2),
                format!("{:.1}", p.rss_mib),
                format!("{:.0} / {:.0}", p.change_ms.p50, p.change_ms.max),
                list(&p.writes_per_change),
                list(&p.lookups_per_change),
                format!("{:.0}", p.lookups_at_start),
            ]);
        }
        format!(
            "Cluster scale by simulation: one weftd, N Node objects in the fake API server (VXLAN to every peer)\n\n{t}"
        )
    }
}

/// Node `i` of the cluster (0 is the measured node): its pod range `10.<64+i/256>.<i%256>.0/24`
/// and, for a peer, an address `172.16.<i/256>.<i%256>` routed nowhere.
fn node(i: usize, cidr: Option<&str>) -> Value {
    let address = if i == 0 {
        ME.to_string()
    } else {
        format!("172.16.{}.{}", i / 256, i % 256)
    };
    let cidr = cidr
        .map(str::to_string)
        .unwrap_or_else(|| format!("10.{}.{}.0/24", 64 + i / 256, i % 256));
    weft_lab::kinds::node(&weft_topology::ClusterNode {
        name: format!("n{i}"),
        addresses: vec![address.parse().expect("an address")],
        pod_cidrs: vec![cidr.parse().expect("a range")],
        ..Default::default()
    })
}

/// Lines of `argv` run in `ns` (0 when it fails).
fn count(ns: &str, argv: &[&str]) -> usize {
    NamedNetns::existing(ns)
        .command(argv)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .count()
        })
        .unwrap_or(0)
}

/// weft's routes through the VXLAN device, its FDB entries and its neighbour entries.
fn programmed(ns: &str) -> (usize, usize, usize) {
    (
        count(ns, &["ip", "route", "show", "proto", "75", "dev", "weft-vxlan"]),
        count(ns, &["sh", "-c", "bridge fdb show dev weft-vxlan | grep ' dst '"]),
        count(ns, &["ip", "neigh", "show", "dev", "weft-vxlan"]),
    )
}

fn kernel_requests(ns: &str) -> Result<(f64, f64), String> {
    let page = metrics_in(ns)?;
    let writes = ["route", "fdb", "neighbour"]
        .iter()
        .map(|k| metric_sum(&page, "weft_node_network_changes_total", &[&format!("kind=\"{k}\"")]))
        .sum();
    Ok((writes, metric_sum(&page, "weft_node_network_lookups_total", &[])))
}

/// Measures one size.
fn point(o: &NodeScaleOptions, n: usize, k: usize) -> Result<NodeScalePoint, String> {
    let tag = format!("wbn{}-{k}", std::process::id());
    let dir = o.work_dir.join(&tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let ns = NamedNetns::create(&format!("{tag}-node")).map_err(|e| e.to_string())?;
    for argv in [
        vec!["ip", "link", "set", "lo", "up"],
        // A veth pair stands for the uplink (not every kernel has `dummy`).
        vec![
            "ip",
            "link",
            "add",
            "uplink",
            "type",
            "veth",
            "peer",
            "name",
            "uplink-far",
        ],
        vec!["ip", "addr", "add", "192.168.0.2/24", "dev", "uplink"],
        vec!["ip", "link", "set", "uplink-far", "up"],
        vec!["ip", "link", "set", "uplink", "up"],
    ] {
        let st = ns.command(&argv).status().map_err(|e| format!("{argv:?}: {e}"))?;
        if !st.success() {
            return Err(format!("{argv:?} failed in {}", ns.name()));
        }
    }
    let mut cluster = Cluster::new(ClusterSource::Api, &dir.join("api"))?;
    let nodes: Vec<Value> = (0..n).map(|i| node(i, None)).collect();
    cluster.put_many("nodes", &nodes, 1000)?;
    let peers = n - 1;
    let t0 = Instant::now();
    let sim = SimNode::start(ns, &o.weftd, &dir, ("n0", ME), &mut cluster, Wait::Spawned)?;
    let ns = &sim.ns;
    let deadline = t0 + Duration::from_secs(300);
    // Routes come last in a pass (after the FDB and neighbour entries they resolve
    // through): only they are polled, so the polling costs the machine little; all
    // three are counted once they are complete.
    let routes = |ns: &str| count(ns, &["ip", "route", "show", "proto", "75", "dev", "weft-vxlan"]);
    while routes(ns.name()) < peers {
        if Instant::now() > deadline {
            return Err(format!("{n} nodes: kernel not programmed within 300 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let start_to_programmed_s = t0.elapsed().as_secs_f64();
    let found = programmed(ns.name());
    if found != (peers, peers, peers) {
        return Err(format!("{n} nodes: routes complete but {found:?} programmed"));
    }
    let pid = sim.daemon.pid().ok_or("weftd is not running")?;
    std::thread::sleep(Duration::from_millis(500));
    let rss_mib = status_kib(pid, "VmRSS").unwrap_or(0) as f64 / 1024.0;
    let (_, lookups_at_start) = kernel_requests(ns.name())?;

    let (mut change_ms, mut writes_per_change, mut lookups_per_change) = (Vec::new(), Vec::new(), Vec::new());
    for c in 0..CHANGES {
        // A peer spread over the cluster gets a new range.
        let i = 1 + (c * (peers.max(1) / CHANGES.max(1))).min(peers - 1);
        let cidr = format!("10.200.{c}.0/24");
        let (w0, l0) = kernel_requests(ns.name())?;
        let t = Instant::now();
        cluster.put("nodes-changed", &[node(i, Some(&cidr))])?;
        let limit = t + Duration::from_secs(60);
        while count(ns.name(), &["ip", "route", "show", &cidr]) == 0 {
            if Instant::now() > limit {
                return Err(format!("{n} nodes: node {i}'s new range never reached the kernel"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        change_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        // Let the pass finish its other changes before counting.
        std::thread::sleep(Duration::from_millis(300));
        let (w1, l1) = kernel_requests(ns.name())?;
        writes_per_change.push(w1 - w0);
        lookups_per_change.push(l1 - l0);
    }
    sim.finish();
    drop(cluster);
    Ok(NodeScalePoint {
        nodes: n,
        start_to_programmed_s,
        programmed: found,
        rss_mib,
        change_ms: Percentiles::of(&change_ms),
        writes_per_change,
        lookups_per_change,
        lookups_at_start,
    })
}

/// Runs every size in order.
pub fn run_nodes(o: &NodeScaleOptions) -> Result<NodeScaleReport, String> {
    let mut points = Vec::new();
    for (k, n) in o.sizes.iter().copied().enumerate() {
        if n < 2 {
            return Err(format!("a cluster of {n} node(s) has no peer to measure"));
        }
        points.push(point(o, n, k)?);
    }
    Ok(NodeScaleReport { points })
}

/// The sizes from `WEFT_BENCH_NODE_SIZES` (comma-separated), else [`NODE_SIZES`].
pub fn sizes_from_env() -> Result<Vec<usize>, String> {
    match std::env::var("WEFT_BENCH_NODE_SIZES") {
        Err(_) => Ok(NODE_SIZES.to_vec()),
        Ok(v) => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("WEFT_BENCH_NODE_SIZES: {s:?} is not a number"))
            })
            .collect(),
    }
}
