//! Scale by simulation: one weftd in a node namespace with [`SCALE_LOCAL_PODS`] local
//! pods, reading a synthetic cluster ([`Synthetic`]) of growing size from the in-process
//! fake API server through its watch caches, as a node of a cluster does (or, with
//! `WEFT_BENCH_POLICY_SOURCE=dir`, from files in its `--topology-dir`). At each size:
//!
//! - the batch one pod's arrival causes, read from `nft monitor`: a local pod's ADD
//!   (and kubelet's report of its address afterwards);
//! - pods of another node that are peers of the node's policies, each timed from its
//!   Pod object written to the node's kernel holding the change (the first line of the
//!   transaction that adds or deletes its address, in `nft monitor`), with the batch it
//!   caused: its arrival with an address, then changes of its `app` label between a
//!   value the policies take as a peer and one no selector matches (its address leaves
//!   and enters the peer sets). Pods elsewhere in the cluster change set elements only,
//!   so neither the time nor the batch should grow with the cluster;
//! - weftd's RSS with the cluster in its cache;
//! - the time from weftd's start to its policy table programmed: weftd is stopped, its
//!   table deleted, and weftd started again on the same node (its pods attached):
//!   from the spawn to the first line of the transaction that creates the table (one
//!   transaction holds all of it).

use std::time::{Duration, Instant};

use serde::Serialize;
use weft_harness::CniExec;

use super::add::{AddPath, NODE, add, path_of, policy_node};
use super::cluster::{Cluster, ClusterSource};
use super::nftmon::{BatchCounts, Monitor, TableSize, Transaction, nft, table_size};
use super::objects::{ClusterSize, Synthetic};
use super::{LoadAvg, PolicyOptions};
use crate::Percentiles;
use crate::load::{create_pods, remove_pods};
use crate::memory::sample;
use crate::simnode::SimNode;
use crate::table::Table;
use crate::util::status_kib;

/// The node's own pods.
pub const SCALE_LOCAL_PODS: usize = 30;
/// weftd's RSS with the largest cluster in its cache, at most (MiB).
pub const SCALE_RSS_TARGET_MIB: f64 = 150.0;
/// Remote pods that arrive at each size (the sizes), each timed.
pub const SCALE_ARRIVALS: usize = 50;
/// How long a remote pod's change may take to reach the kernel.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(60);
/// Label changes of the arrived pods after the arrivals, each timed, with weftd's RSS
/// read after every [`CHURN_STEP`] of them: whether memory settles or grows.
pub const SCALE_CHURN: usize = 100;
const CHURN_STEP: usize = 25;
/// The target: a remote pod's arrival and a label change in the node's kernel, p99
/// below (ms), at the largest size.
pub const SCALE_KERNEL_TARGET_MS: f64 = 50.0;
/// The `app` label a churned pod takes out of every peer set: no synthetic selector
/// matches it.
const OFF_APP: &str = "off";

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
    /// Remote pods that arrived.
    pub arrivals: usize,
    /// The batch of each remote pod's arrival.
    pub arrival_batches: Vec<BatchCounts>,
    /// Who wrote each arrival's transactions: weftd's batch of set elements (`fast`),
    /// or an `nft` full pass.
    pub arrival_paths: Vec<AddPath>,
    /// From each remote pod's object written to the node's kernel holding its address
    /// (ms).
    pub arrival_ms: Percentiles,
    /// Label changes of arrived pods.
    pub churn: usize,
    /// The batch of each label change.
    pub churn_batches: Vec<BatchCounts>,
    /// Who wrote each label change's transactions.
    pub churn_paths: Vec<AddPath>,
    /// From each label change written to the node's kernel holding it (its address
    /// added to or deleted from the peer sets; ms).
    pub churn_ms: Percentiles,
    /// The policy table with every local pod attached, after the arrivals and label
    /// changes (before the restart).
    pub table: TableSize,
    /// Pods announced by their node (the wire port's `Policy/Announce`) before the API
    /// has their addresses.
    pub announced: usize,
    /// From each announcement's call to its answer, which comes once the address is in
    /// the node's kernel (ms).
    pub announce_answer_ms: Percentiles,
    /// From each announcement's call to the first transaction holding the address (ms).
    pub announce_kernel_ms: Percentiles,
    /// weftd's VmRSS (MiB) after the pods and arrivals (the first start).
    pub rss_mib: f64,
    /// weftd's VmRSS (MiB) along the first run: once started (cluster loaded, first
    /// pass), after the local pods, after the arrivals, then after every 25 more
    /// changes; with how many passes (full or of set elements only) it had run then.
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
    /// The target (ms) for the p99 of arrivals and label changes at the largest size.
    pub kernel_target_ms: f64,
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
    let mut node = policy_node(o, tag, &dir, &mut objects)?;
    let mut rss_trend = Vec::new();
    let trend = |what: &str, node: &SimNode, t: &mut Vec<(String, f64, f64)>| -> Result<(), String> {
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
    let mut arrived = Vec::with_capacity(o.scale_arrivals);
    let mut arrived_ips = Vec::with_capacity(o.scale_arrivals);
    let mut arrivals = Vec::with_capacity(o.scale_arrivals);
    for i in 0..o.scale_arrivals {
        let p = s.arriving_peer(i);
        let ip = p["status"]["podIP"].as_str().unwrap_or_default().to_string();
        arrived.push(p);
        let what = format!("{tag}: arriving pod {i} ({ip})");
        arrivals.push(remote_change(&monitor, &objects, &arrived, &ip, true, &what)?);
        arrived_ips.push(ip);
    }
    let pid = node.daemon.pid().ok_or("weftd is not running")?;
    let rss_mib = sample(pid)?.0 as f64 / 1024.0;
    rss_trend.push((
        format!("{} remote pods", o.scale_arrivals),
        rss_mib,
        super::metric(node.ns.name(), "weft_policy_pass_seconds_count")?,
    ));
    // Pods announced by their node before the API has their addresses.
    let announced = super::announce::announce(&node, &objects, &s, &monitor, o.scale_arrivals, tag)?;
    // Churn: the arrived pods' `app` label, in turn, out of every peer set and back.
    let mut churn = Vec::with_capacity(o.scale_churn);
    for c in 1..=o.scale_churn {
        let Some(j) = (c - 1).checked_rem(arrived.len()) else {
            break;
        };
        let on_app = s.arriving_peer(j)["metadata"]["labels"]["app"].clone();
        let labels = &mut arrived[j]["metadata"]["labels"];
        let adds = labels["app"] != on_app;
        labels["app"] = if adds { on_app } else { OFF_APP.into() };
        let what = format!("{tag}: label change {c} (arrived pod {j}, {})", arrived_ips[j]);
        churn.push(remote_change(
            &monitor,
            &objects,
            &arrived,
            &arrived_ips[j],
            adds,
            &what,
        )?);
        if c % CHURN_STEP == 0 {
            trend(&format!("{c} more changes"), &node, &mut rss_trend)?;
        }
    }

    // The table the restarted weftd must make again (the churn leaves some arrived
    // pods out of the peer sets).
    let table = table_size(node.ns.name())?;

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
    node.finish();
    remove_pods(pods);
    Ok(ScalePoint {
        cluster,
        local_pods: n,
        add_batches,
        add_paths,
        status_batches,
        arrivals: arrivals.len(),
        arrival_batches: arrivals.iter().map(|c| c.batch).collect(),
        arrival_paths: arrivals.iter().map(|c| c.path).collect(),
        arrival_ms: Percentiles::of(&arrivals.iter().map(|c| c.ms).collect::<Vec<_>>()),
        announced: announced.len(),
        announce_answer_ms: Percentiles::of(&announced.iter().map(|a| a.answer_ms).collect::<Vec<_>>()),
        announce_kernel_ms: Percentiles::of(&announced.iter().map(|a| a.kernel_ms).collect::<Vec<_>>()),
        churn: churn.len(),
        churn_batches: churn.iter().map(|c| c.batch).collect(),
        churn_paths: churn.iter().map(|c| c.path).collect(),
        churn_ms: Percentiles::of(&churn.iter().map(|c| c.ms).collect::<Vec<_>>()),
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

/// One remote pod's change as the node's kernel took it.
struct Timed {
    /// From the object written to the first line of the transaction holding it (ms).
    ms: f64,
    /// What every transaction it caused did to the policy table.
    batch: BatchCounts,
    /// Who wrote them.
    path: AddPath,
}

/// Writes `docs` (the arrived pods, one of them changed) and times it to the first
/// transaction that adds (`adds`) or deletes `ip` in the node's policy table; then
/// lets the node finish what the change set off and counts its batch.
fn remote_change(
    monitor: &Monitor,
    objects: &Cluster,
    docs: &[serde_json::Value],
    ip: &str,
    adds: bool,
    what: &str,
) -> Result<Timed, String> {
    let verb = if adds { "add element" } else { "delete element" };
    let (a, b) = (format!("{ip} "), format!("{ip},"));
    let holds = |t: &Transaction| t.has(&[verb, &a]) || t.has(&[verb, &b]);
    let mark = monitor.mark();
    let t0 = Instant::now();
    objects.put("arrivals.yaml", docs)?;
    let (txs, ok) = monitor.wait(mark, ARRIVAL_LIMIT, |txs| txs.iter().any(holds));
    if !ok {
        return Err(format!(
            "{what}: the kernel never took it ({verb}) within {ARRIVAL_LIMIT:?}"
        ));
    }
    let t = txs.iter().find(|t| holds(t)).expect("found above");
    let ms = t.first.duration_since(t0).as_secs_f64() * 1000.0;
    monitor.settle(Duration::from_millis(100), Duration::from_secs(10));
    let (path, batch) = path_of(&monitor.policy_since(mark));
    Ok(Timed { ms, batch, path })
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
        kernel_target_ms: SCALE_KERNEL_TARGET_MS,
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

/// `+elements / -elements / objects` over batches, each as [`range`] gives it.
fn batches(batches: &[BatchCounts]) -> String {
    format!(
        "{} / {} / {}",
        range(batches, |b| b.elements_added),
        range(batches, |b| b.elements_deleted),
        range(batches, BatchCounts::objects)
    )
}

/// `weftd batches / full passes` over changes' paths.
fn writers(paths: &[AddPath]) -> String {
    let n = |p: AddPath| paths.iter().filter(|x| **x == p).count();
    format!("{} / {}", n(AddPath::Fast), n(AddPath::Full))
}

impl ScaleReport {
    /// Whether the largest size's arrivals and label changes reached the kernel with a
    /// p99 under the target.
    pub fn kernel_met(&self) -> bool {
        self.points.last().is_some_and(|p| {
            p.arrival_ms.n > 0
                && p.churn_ms.n > 0
                && p.arrival_ms.p99 < self.kernel_target_ms
                && p.churn_ms.p99 < self.kernel_target_ms
        })
    }

    /// Whether the largest size's RSS is within the target.
    pub fn rss_met(&self) -> bool {
        self.points
            .iter()
            .all(|p| p.rss_mib <= self.rss_target_mib && p.restart_rss_mib <= self.rss_target_mib)
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Scale by simulation: one weftd, its pods attached through the plugin, the cluster's objects read from {} (namespaces = pods / 10, policies = pods / 5)\n\n",
            self.source.describe()
        );
        let mut sizes = Table::new()
            .num("pods")
            .num("namespaces")
            .num("policies")
            .num("local pods")
            .text("policy table (elements / chains)")
            .num("weftd start to table programmed (s)")
            .num("start to serving (s)")
            .text("VmRSS first run / restarted (MiB)")
            .num("VmHWM restarted (MiB)")
            .text("load start / end");
        for p in &self.points {
            sizes.row([
                p.cluster.pods.to_string(),
                p.cluster.namespaces.to_string(),
                p.cluster.policies.to_string(),
                p.local_pods.to_string(),
                format!("{} / {}", p.table.elements, p.table.chains),
                format!("{:.2}", p.start_to_table_s),
                format!("{:.2}", p.start_to_serving_s),
                format!("{:.1} / {:.1}", p.rss_mib, p.restart_rss_mib),
                format!("{:.1}", p.restart_hwm_mib),
                format!("{} / {}", p.load.0, p.load.1),
            ]);
        }
        out.push_str(&sizes.to_string());
        out.push_str(
            "\nThe batch one pod's arrival causes (elements added; other objects: chains, sets, rules added or deleted), min-max over the pods\n\n",
        );
        let mut adds = Table::new()
            .num("pods")
            .text("local ADD, first half: elements / objects")
            .text("local ADD, second half: elements / objects")
            .text("ADDs nothing / fast / full")
            .text("kubelet's address report: elements / objects");
        for p in &self.points {
            let half = p.add_batches.len() / 2;
            let (first, second) = p.add_batches.split_at(half);
            let count = |x: AddPath| p.add_paths.iter().filter(|a| **a == x).count();
            adds.row([
                p.cluster.pods.to_string(),
                format!(
                    "{} / {}",
                    range(first, |b| b.elements_added),
                    range(first, BatchCounts::objects)
                ),
                format!(
                    "{} / {}",
                    range(second, |b| b.elements_added),
                    range(second, BatchCounts::objects)
                ),
                format!(
                    "{} / {} / {}",
                    count(AddPath::Nothing),
                    count(AddPath::Fast),
                    count(AddPath::Full)
                ),
                format!(
                    "{} / {}",
                    range(&p.status_batches, |b| b.elements_added),
                    range(&p.status_batches, BatchCounts::objects)
                ),
            ]);
        }
        out.push_str(&adds.to_string());
        out.push_str(&format!(
            "\nPods of other nodes, peers of a local pod's policy: each arrival (its Pod object with an address), then label changes of the arrived pods in turn (app=a1, a peer, to app={OFF_APP}, which no selector matches, and back: the address leaves or enters the peer sets); each timed from the Pod object written to the first line of the transaction holding it in the node's `nft monitor`, with what its transactions did (min-max: elements added / deleted, other objects) and who wrote them (weftd's batch of set elements / an `nft` full pass)\n\n",
        ));
        let mut changes = Table::new()
            .num("pods")
            .num("policies")
            .num("arrivals")
            .text("arrival p50 / p99 / max (ms)")
            .text("arrival batch: +elements / -elements / objects")
            .text("weftd batch / full pass")
            .num("label changes")
            .text("label change p50 / p99 / max (ms)")
            .text("label change batch: +elements / -elements / objects")
            .text("weftd batch / full pass");
        for p in &self.points {
            changes.row([
                p.cluster.pods.to_string(),
                p.cluster.policies.to_string(),
                p.arrivals.to_string(),
                p.arrival_ms.p50_p99_max(1),
                batches(&p.arrival_batches),
                writers(&p.arrival_paths),
                p.churn.to_string(),
                p.churn_ms.p50_p99_max(1),
                batches(&p.churn_batches),
                writers(&p.churn_paths),
            ]);
        }
        out.push_str(&changes.to_string());
        out.push_str(
            "\nPods of another node announced by it at their ADD (the wire port's `weft.wire.v1.Policy/Announce`, called from that node's address, each pod's object in the cache without an address, as before kubelet reports it): from the call to its answer (given once the address is in the node's kernel) and to the first transaction holding it\n\n",
        );
        let mut announced = Table::new()
            .num("pods")
            .num("policies")
            .num("announced")
            .text("answer p50 / p99 / max (ms)")
            .text("in the kernel p50 / p99 / max (ms)");
        for p in &self.points {
            announced.row([
                p.cluster.pods.to_string(),
                p.cluster.policies.to_string(),
                p.announced.to_string(),
                p.announce_answer_ms.p50_p99_max(2),
                p.announce_kernel_ms.p50_p99_max(2),
            ]);
        }
        out.push_str(&announced.to_string());
        out.push_str("\nweftd's VmRSS along the first run (MiB; policy passes run so far, full or of set elements only, in brackets)\n\n");
        let mut trend = Table::new().num("pods");
        if let Some(p) = self.points.first() {
            for (step, _, _) in &p.rss_trend {
                trend = trend.num(step.as_str());
            }
        }
        for p in &self.points {
            let cells = p
                .rss_trend
                .iter()
                .map(|(_, rss, passes)| format!("{rss:.1} ({passes:.0})"));
            trend.row(std::iter::once(p.cluster.pods.to_string()).chain(cells));
        }
        out.push_str(&trend.to_string());
        let same = self.points.iter().all(|p| p.table_after_restart == p.table);
        out.push_str(&format!(
            "\nthe restarted weftd's table equals the one before the restart: {}\ntarget VmRSS <= {:.0} MiB: {}\n",
            if same { "yes" } else { "NO" },
            self.rss_target_mib,
            crate::exec::met(self.rss_met())
        ));
        if let Some(p) = self.points.last() {
            out.push_str(&format!(
                "target: a remote pod's arrival and a label change at {} pods and {} policies: kernel in step p99 < {:.0} ms: arrival {:.1} ms, label change {:.1} ms: {}\n",
                p.cluster.pods,
                p.cluster.policies,
                self.kernel_target_ms,
                p.arrival_ms.p99,
                p.churn_ms.p99,
                crate::exec::met(self.kernel_met())
            ));
        }
        out
    }
}
