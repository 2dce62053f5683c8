//! Scale by simulation: one weftd in a node namespace with [`SCALE_LOCAL_PODS`] local
//! pods, reading a synthetic cluster ([`Synthetic`]) of growing size from the in-process
//! fake API server through its watch caches, as a node of a cluster does (or, with
//! `WEFT_BENCH_POLICY_SOURCE=dir`, from files in its `--topology-dir`). At each size:
//!
//! - the batch one pod's arrival causes, read from `nft monitor`: a local pod's ADD
//!   (and kubelet's report of its address afterwards), and a pod of another node that
//!   is a peer of the node's policies appearing with its address;
//! - the time from such a remote pod's Pod object being written to the node's kernel
//!   holding its address (a full pass at that size);
//! - weftd's RSS with the cluster in its cache;
//! - the time from weftd's start to its policy table programmed: weftd is stopped, its
//!   table deleted, and weftd started again on the same node (its pods attached):
//!   from the spawn to the first line of the transaction that creates the table (one
//!   transaction holds all of it).

use std::time::{Duration, Instant};

use serde::Serialize;
use weft_harness::CniExec;

use super::add::{AddPath, NODE, PolicyNode, add, path_of};
use super::cluster::{Cluster, ClusterSource};
use super::nftmon::{BatchCounts, Monitor, TableSize, nft, table_size};
use super::objects::{ClusterSize, Synthetic};
use super::{LoadAvg, PolicyOptions};
use crate::Percentiles;
use crate::load::{create_pods, remove_pods};
use crate::memory::sample;
use crate::util::status_kib;

/// The node's own pods.
pub const SCALE_LOCAL_PODS: usize = 30;
/// weftd's RSS with the largest cluster in its cache, at most (MiB).
pub const SCALE_RSS_TARGET_MIB: f64 = 150.0;
/// Remote pods that arrive at each size.
const ARRIVALS: usize = 5;
/// How long a remote pod's address may take to reach the kernel.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(60);
/// Changes (a remote pod's label, each a full pass) after the arrivals, with weftd's
/// RSS read after every [`CHURN_STEP`] of them: whether memory settles or grows.
pub const SCALE_CHURN: usize = 100;
const CHURN_STEP: usize = 25;

/// The cluster of a given pod count: a tenth as many namespaces, a fifth as many
/// policies (10,000 pods: 1,000 namespaces, 2,000 policies).
pub fn scaled(pods: usize) -> ClusterSize {
    ClusterSize {
        namespaces: (pods / 10).max(1),
        pods,
        policies: (pods / 5).max(1),
    }
}

/// One size.
#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    /// The cluster.
    pub cluster: ClusterSize,
    /// Local pods attached.
    pub local_pods: usize,
    /// The batch of each local ADD, in order.
    pub add_batches: Vec<BatchCounts>,
    /// How each local ADD was placed.
    pub add_paths: Vec<AddPath>,
    /// The batch of kubelet's address report after each local ADD (a full pass).
    pub status_batches: Vec<BatchCounts>,
    /// The batch of each remote pod's arrival.
    pub arrival_batches: Vec<BatchCounts>,
    /// From each remote pod's object written to the node's kernel holding its address
    /// (ms).
    pub arrival_ms: Percentiles,
    /// The policy table with every local pod attached.
    pub table: TableSize,
    /// weftd's VmRSS (MiB) after the pods and arrivals (the first start).
    pub rss_mib: f64,
    /// weftd's VmRSS (MiB) along the first run: once started (cluster loaded, first
    /// pass), after the local pods, after the arrivals, then after every 25 more
    /// changes; with how many full passes it had run then.
    pub rss_trend: Vec<(String, f64, f64)>,
    /// The restarted weftd: from spawn to the policy table created (s).
    pub start_to_table_s: f64,
    /// The restarted weftd: from spawn to serving its socket (s).
    pub start_to_serving_s: f64,
    /// The table the restarted weftd made equals the one before the restart.
    pub table_after_restart: TableSize,
    /// The restarted weftd's VmRSS once settled (MiB).
    pub restart_rss_mib: f64,
    /// Its VmHWM (MiB).
    pub restart_hwm_mib: f64,
    /// The machine's load at the start and the end.
    pub load: (LoadAvg, LoadAvg),
}

/// Every size.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// The sizes, smallest first.
    pub points: Vec<ScalePoint>,
    /// The RSS target (MiB).
    pub rss_target_mib: f64,
    /// Where weftd read the cluster from.
    pub source: ClusterSource,
}

fn point(o: &PolicyOptions, cluster: ClusterSize, tag: &str) -> Result<ScalePoint, String> {
    let load_start = LoadAvg::now();
    let dir = o.work_dir.join(tag);
    let mut objects = Cluster::new(o.scale_source, &dir)?;
    let s = Synthetic(cluster);
    let n = o.scale_local_pods;
    objects.put_many("namespaces", &s.namespaces(), 500)?;
    objects.put_many("pods", &s.pods(), 500)?;
    objects.put_many("policies", &s.policies(), 500)?;
    let locals = |ips: &[Option<std::net::Ipv4Addr>]| -> Vec<serde_json::Value> {
        (0..n)
            .map(|i| s.local_pod(i, &format!("local-{i}"), NODE, ips.get(i).copied().flatten()))
            .collect()
    };
    objects.put("local-pods.yaml", &locals(&[]))?;
    let mut node = PolicyNode::start(o, tag, &dir, &mut objects)?;
    let mut rss_trend = Vec::new();
    let trend = |what: &str, node: &PolicyNode, t: &mut Vec<(String, f64, f64)>| -> Result<(), String> {
        let pid = node.daemon.pid().ok_or("weftd is not running")?;
        let passes = super::metric(node.ns.name(), "weft_policy_pass_seconds_count")?;
        t.push((what.to_string(), sample(pid)?.0 as f64 / 1024.0, passes));
        Ok(())
    };
    trend("started", &node, &mut rss_trend)?;
    let pods = create_pods(tag, n)?;
    let monitor = Monitor::start(node.ns.name())?;
    monitor.settle(Duration::from_millis(200), Duration::from_secs(10));
    let exec = CniExec::new(&o.weft);
    let conf = node.conf();
    let (mut add_batches, mut add_paths, mut status_batches) = (Vec::new(), Vec::new(), Vec::new());
    let mut ips = Vec::new();
    for (k, netns) in pods.iter().enumerate() {
        let (pod_ns, _) = s.local(k);
        let mark = monitor.mark();
        let a = add(&exec, &node.ns, netns, k, &pod_ns, &format!("local-{k}"), &conf);
        if let Some(f) = a.failure {
            return Err(format!("{tag}: ADD of local-{k} failed: {}", f.msg));
        }
        monitor.settle(Duration::from_millis(20), Duration::from_secs(2));
        let (path, batch) = path_of(&monitor.policy_since(mark));
        add_paths.push(path);
        add_batches.push(batch);
        // kubelet reports the address.
        ips.push(a.ip);
        let mark = monitor.mark();
        let before = super::metric(node.ns.name(), "weft_policy_pass_seconds_count")?;
        objects.put("local-pods.yaml", &locals(&ips))?;
        super::wait_metric(
            node.ns.name(),
            "weft_policy_pass_seconds_count",
            before + 1.0,
            Duration::from_secs(60),
        )?;
        monitor.settle(Duration::from_millis(50), Duration::from_secs(5));
        let (_, batch) = path_of(&monitor.policy_since(mark));
        status_batches.push(batch);
    }
    trend(&format!("{n} local pods"), &node, &mut rss_trend)?;
    // Remote pods arriving, each a peer of a policy selecting a local pod.
    let mut arrival_batches = Vec::new();
    let mut arrival_ms = Vec::new();
    let mut arrived = Vec::new();
    for i in 0..ARRIVALS {
        let p = s.arriving_peer(i);
        let ip = p["status"]["podIP"].as_str().unwrap_or_default().to_string();
        arrived.push(p);
        let mark = monitor.mark();
        let t0 = Instant::now();
        objects.put("arrivals.yaml", &arrived)?;
        let needle = format!("{ip} ");
        let needle2 = format!("{ip},");
        let (txs, ok) = monitor.wait(mark, ARRIVAL_LIMIT, |txs| {
            txs.iter()
                .any(|t| t.has(&["add element", &needle]) || t.has(&["add element", &needle2]))
        });
        if !ok {
            return Err(format!(
                "{tag}: the address of arriving pod {i} ({ip}) never reached the kernel"
            ));
        }
        let t = txs
            .iter()
            .find(|t| t.has(&["add element", &needle]) || t.has(&["add element", &needle2]))
            .expect("found above");
        arrival_ms.push(t.first.duration_since(t0).as_secs_f64() * 1000.0);
        monitor.settle(Duration::from_millis(100), Duration::from_secs(10));
        let (_, batch) = path_of(&monitor.policy_since(mark));
        arrival_batches.push(batch);
    }
    let table = table_size(node.ns.name())?;
    let pid = node.daemon.pid().ok_or("weftd is not running")?;
    let rss_mib = sample(pid)?.0 as f64 / 1024.0;
    rss_trend.push((
        format!("{ARRIVALS} remote pods"),
        rss_mib,
        super::metric(node.ns.name(), "weft_policy_pass_seconds_count")?,
    ));
    // Churn: the last arrival's label flips, each flip a full pass.
    for c in 1..=o.scale_churn {
        let mut last = arrived.pop().expect("arrivals");
        last["metadata"]["labels"]["churn"] = (c % 2).to_string().into();
        arrived.push(last);
        let before = super::metric(node.ns.name(), "weft_policy_pass_seconds_count")?;
        objects.put("arrivals.yaml", &arrived)?;
        super::wait_metric(
            node.ns.name(),
            "weft_policy_pass_seconds_count",
            before + 1.0,
            Duration::from_secs(60),
        )?;
        if c % CHURN_STEP == 0 {
            trend(&format!("{c} more changes"), &node, &mut rss_trend)?;
        }
    }

    // Start again without the table: from spawn to the table programmed.
    node.daemon.stop(crate::STOP_LIMIT);
    nft(node.ns.name(), "delete table inet weft-policy")?;
    monitor.settle(Duration::from_millis(100), Duration::from_secs(5));
    let mark = monitor.mark();
    let t0 = Instant::now();
    node.daemon
        .start_again()
        .map_err(|e| format!("{tag}: starting weftd again: {e}"))?;
    let start_to_serving_s = t0.elapsed().as_secs_f64();
    let (txs, ok) = monitor.wait(mark, Duration::from_secs(120), |txs| {
        txs.iter().any(|t| t.has(&["add table"]))
    });
    if !ok {
        return Err(format!("{tag}: the restarted weftd made no policy table within 120 s"));
    }
    let created = txs.iter().find(|t| t.has(&["add table"])).expect("found above");
    let start_to_table_s = created.first.duration_since(t0).as_secs_f64();
    monitor.settle(Duration::from_millis(500), Duration::from_secs(60));
    let table_after_restart = table_size(node.ns.name())?;
    std::thread::sleep(Duration::from_secs(2));
    let pid = node.daemon.pid().ok_or("weftd is not running")?;
    let (restart_rss, _) = sample(pid)?;
    let restart_hwm = status_kib(pid, "VmHWM").unwrap_or(0);

    drop(monitor);
    let PolicyNode { ns, mut daemon, .. } = node;
    daemon.stop(crate::STOP_LIMIT);
    remove_pods(pods);
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ScalePoint {
        cluster,
        local_pods: n,
        add_batches,
        add_paths,
        status_batches,
        arrival_batches,
        arrival_ms: Percentiles::of(&arrival_ms),
        table,
        rss_mib,
        rss_trend,
        start_to_table_s,
        start_to_serving_s,
        table_after_restart,
        restart_rss_mib: restart_rss as f64 / 1024.0,
        restart_hwm_mib: restart_hwm as f64 / 1024.0,
        load: (load_start, LoadAvg::now()),
    })
}

/// Runs every size, smallest first.
pub(crate) fn run_scale(o: &PolicyOptions) -> Result<ScaleReport, String> {
    let mut points = Vec::new();
    for (i, pods) in o.scale_pods.iter().enumerate() {
        let tag = format!("wb{}-s{i}", std::process::id());
        points.push(point(o, scaled(*pods), &tag)?);
    }
    Ok(ScaleReport {
        points,
        rss_target_mib: SCALE_RSS_TARGET_MIB,
        source: o.scale_source,
    })
}

/// `min-max` of one count over batches (a single value when constant).
fn range(batches: &[BatchCounts], f: impl Fn(&BatchCounts) -> usize) -> String {
    let v: Vec<usize> = batches.iter().map(f).collect();
    match (v.iter().min(), v.iter().max()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}-{b}"),
        _ => "-".into(),
    }
}

impl ScaleReport {
    /// Whether the largest size's RSS is within the target.
    pub fn rss_met(&self) -> bool {
        self.points
            .iter()
            .all(|p| p.rss_mib <= self.rss_target_mib && p.restart_rss_mib <= self.rss_target_mib)
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Scale by simulation: one weftd, its pods attached through the plugin, the cluster's objects read from {} (namespaces = pods / 10, policies = pods / 5)\n\n\
             | pods | namespaces | policies | local pods | policy table (elements / chains) | weftd start to table programmed (s) | start to serving (s) | VmRSS first run / restarted (MiB) | VmHWM restarted (MiB) | remote pod to kernel p50 / max (ms) | load start / end |\n|---:|---:|---:|---:|---|---:|---:|---|---:|---|---|\n",
            self.source.describe()
        );
        for p in &self.points {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} / {} | {:.2} | {:.2} | {:.1} / {:.1} | {:.1} | {:.0} / {:.0} | {} / {} |\n",
                p.cluster.pods,
                p.cluster.namespaces,
                p.cluster.policies,
                p.local_pods,
                p.table.elements,
                p.table.chains,
                p.start_to_table_s,
                p.start_to_serving_s,
                p.rss_mib,
                p.restart_rss_mib,
                p.restart_hwm_mib,
                p.arrival_ms.p50,
                p.arrival_ms.max,
                p.load.0,
                p.load.1,
            ));
        }
        out.push_str(
            "\nThe batch one pod's arrival causes (elements added; other objects: chains, sets, rules added or deleted), min-max over the pods\n\n\
             | pods | local ADD, first half: elements / objects | local ADD, second half: elements / objects | ADDs nothing / fast / full | kubelet's address report: elements / objects | remote peer pod: elements / objects |\n|---:|---|---|---|---|---|\n",
        );
        for p in &self.points {
            let half = p.add_batches.len() / 2;
            let (first, second) = p.add_batches.split_at(half);
            let count = |x: AddPath| p.add_paths.iter().filter(|a| **a == x).count();
            out.push_str(&format!(
                "| {} | {} / {} | {} / {} | {} / {} / {} | {} / {} | {} / {} |\n",
                p.cluster.pods,
                range(first, |b| b.elements_added),
                range(first, BatchCounts::objects),
                range(second, |b| b.elements_added),
                range(second, BatchCounts::objects),
                count(AddPath::Nothing),
                count(AddPath::Fast),
                count(AddPath::Full),
                range(&p.status_batches, |b| b.elements_added),
                range(&p.status_batches, BatchCounts::objects),
                range(&p.arrival_batches, |b| b.elements_added),
                range(&p.arrival_batches, BatchCounts::objects),
            ));
        }
        out.push_str("\nweftd's VmRSS along the first run (MiB; full passes run so far in brackets)\n\n| pods |");
        let steps: Vec<String> = self
            .points
            .first()
            .map(|p| p.rss_trend.iter().map(|t| t.0.clone()).collect())
            .unwrap_or_default();
        out.push_str(&format!(
            " {} |\n|---:|{}\n",
            steps.join(" | "),
            "---:|".repeat(steps.len())
        ));
        for p in &self.points {
            let cells: Vec<String> = p
                .rss_trend
                .iter()
                .map(|(_, rss, passes)| format!("{rss:.1} ({passes:.0})"))
                .collect();
            out.push_str(&format!("| {} | {} |\n", p.cluster.pods, cells.join(" | ")));
        }
        let same = self.points.iter().all(|p| p.table_after_restart == p.table);
        out.push_str(&format!(
            "\nthe restarted weftd's table equals the one before the restart: {}\ntarget VmRSS <= {:.0} MiB: {}\n",
            if same { "yes" } else { "NO" },
            self.rss_target_mib,
            crate::exec::met(self.rss_met())
        ));
        out
    }
}
