//! ADD latency with a cluster's policies in weftd's cache beside ADD without any: a
//! round per side (alternating which goes first), each on a fresh node namespace with
//! its own weftd reading its cluster (by default from the in-process fake API server
//! through its watch caches, or from a topology directory: [`super::cluster`]), pods
//! attached one by one through the real plugin as `load` attaches them.
//!
//! The "with" side's cluster holds a synthetic cluster ([`Synthetic`]: 1,000
//! NetworkPolicies, 5,000 Pods of other nodes with addresses, 50 namespaces) and, as
//! the API server has them before kubelet starts their sandboxes, the Pod objects of
//! the pods the round attaches (no addresses yet), labelled so that some policies select
//! them and others have them as peers. The "without" side's holds the same Namespaces
//! and the same Pods of the attached pods, and nothing else.
//!
//! Whether an ADD took the engine's fast path (its pod's dispatch and set elements added
//! to the last plan, one nfnetlink batch from weftd) or ran a full pass (the whole table
//! planned, the difference applied by an `nft` process) is read from `nft monitor` in
//! the node namespace: each transaction names the process that made it. Where the time
//! goes comes from scrapes of weftd's metrics around each ADD.
//!
//! Watching costs the ADDs it watches, and the "with" side's more: `nft monitor` wakes
//! to print every transaction, and only that side has them (on two cores, about 1.5 ms
//! per ADD). So the latency comes from rounds nobody watches, and one more round per
//! side, watched, says which path each ADD took and where its time went.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use weft_harness::{CniExec, CniVars, NamedNetns};

use super::cluster::{Cluster, ClusterSource};
use super::nftmon::{BatchCounts, Monitor, TableSize, table_size};
use super::objects::{ClusterSize, Synthetic};
use super::{LoadAvg, PolicyOptions, div, wait_metric};
use crate::load::{CallFailure, create_pods, failure, remove_pods};
use crate::memory::sample;
use crate::simnode::{SimNode, Wait};
use crate::table::Table;
use crate::util::{metric_sum, metrics_in};
use crate::{Percentiles, lab, ms};

/// The target: ADD p50 with the policies at most this multiple of ADD p50 without.
pub const ADD_TARGET_RATIO: f64 = 1.1;

/// The node's name (the Pods of the attached pods name it).
pub(crate) const NODE: &str = "bench-node";

/// How the engine handled one ADD, as `nft monitor` saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddPath {
    /// No transaction: nothing of the pod's needed to be in the table.
    Nothing,
    /// The fast path: one batch from weftd itself.
    Fast,
    /// A full pass: a transaction by an `nft` process.
    Full,
}

/// One ADD.
#[derive(Debug, Clone, Serialize)]
pub struct AddSample {
    /// Spawn to exit (ms; 0 when it failed).
    pub ms: f64,
    /// weftd's handling of the call (`grpc_server_handling_seconds`, ms).
    pub daemon_ms: f64,
    /// weftd's phases of this ADD (`weft_cni_phase_duration_seconds`, ms).
    pub phases_ms: BTreeMap<String, f64>,
    /// weftd's `policy` phase of this ADD (ms).
    pub policy_ms: f64,
    /// How the engine placed the pod.
    pub path: AddPath,
    /// What the ADD's transactions did to the table.
    pub batch: BatchCounts,
}

/// One side over every round.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AddSide {
    /// Every ADD of the watched round.
    pub samples: Vec<AddSample>,
    /// Spawn to exit of every successful ADD of the unwatched rounds (ms).
    pub unwatched_ms: Vec<f64>,
    /// Latency of the successful ADDs of the unwatched rounds.
    pub latency: Percentiles,
    /// The `policy` phase of the fast-path (or nothing-to-add) ADDs (ms).
    pub policy_fast: Percentiles,
    /// The `policy` phase of the ADDs that ran a full pass (ms).
    pub policy_full: Percentiles,
    /// Means over the ADDs that ran no full pass (ms): spawn to exit, weftd's
    /// handling, and each phase.
    pub steady_means_ms: BTreeMap<String, f64>,
    /// ADDs per path: nothing to add, fast path, full pass.
    pub paths: (usize, usize, usize),
    /// Failed ADDs.
    pub failures: Vec<CallFailure>,
    /// The policy table after each round's ADDs.
    pub tables: Vec<TableSize>,
    /// weftd's VmRSS after each round's ADDs (MiB).
    pub rss_mib: Vec<f64>,
    /// Each round: the pass once kubelet reported every attached pod's address (ms,
    /// `weft_policy_pass_seconds`); the cost of a full pass at this size.
    pub status_pass_ms: Vec<f64>,
}

/// ADD with the policies beside ADD without.
#[derive(Debug, Clone, Serialize)]
pub struct AddReport {
    /// The cluster in the "with" side's cache.
    pub cluster: ClusterSize,
    /// ADDs per round and side.
    pub pods: usize,
    /// Rounds per side.
    pub rounds: usize,
    /// With the cluster's policies.
    pub with_policy: AddSide,
    /// Without.
    pub without_policy: AddSide,
    /// ADD p50, with over without.
    pub p50_ratio: f64,
    /// ADD p99, with over without.
    pub p99_ratio: f64,
    /// The target for `p50_ratio`.
    pub target_ratio: f64,
    /// The machine's load at the start and the end.
    pub load: (LoadAvg, LoadAvg),
    /// Where weftd read the cluster from.
    pub source: ClusterSource,
}

/// Per-ADD readings of weftd's metrics.
#[derive(Default, Clone)]
struct Reading {
    /// ADD phase -> seconds spent in it so far.
    phases: BTreeMap<String, f64>,
    handling: f64,
    pass_sum: f64,
    pass_count: f64,
}

impl Reading {
    fn take(ns: &str) -> Result<Self, String> {
        let page = metrics_in(ns)?;
        let mut phases = BTreeMap::new();
        for l in page.lines().filter(|l| !l.starts_with('#')) {
            let Some(rest) = l.strip_prefix("weft_cni_phase_duration_seconds_sum{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            if !labels.contains("command=\"ADD\"") {
                continue;
            }
            let phase = labels
                .split("phase=\"")
                .nth(1)
                .and_then(|p| p.split('"').next())
                .unwrap_or_default();
            *phases.entry(phase.to_string()).or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
        Ok(Reading {
            phases,
            handling: metric_sum(&page, "grpc_server_handling_seconds_sum", &["grpc_method=\"Add\""]),
            pass_sum: metric_sum(&page, "weft_policy_pass_seconds_sum", &[]),
            pass_count: metric_sum(&page, "weft_policy_pass_seconds_count", &[]),
        })
    }

    /// What each phase gained since `before` (ms).
    fn phases_since(&self, before: &Reading) -> BTreeMap<String, f64> {
        self.phases
            .iter()
            .map(|(k, v)| (k.clone(), (v - before.phases.get(k).copied().unwrap_or(0.0)) * 1000.0))
            .filter(|(_, v)| *v > 0.0)
            .collect()
    }
}

/// Node [`NODE`] in a fresh namespace `<tag>-node`, its state under `dir`, reading
/// `cluster`; returns once weftd serves and its policy engine has run its first pass.
pub(crate) fn policy_node(o: &PolicyOptions, tag: &str, dir: &Path, cluster: &mut Cluster) -> Result<SimNode, String> {
    let ns = NamedNetns::create(&format!("{tag}-node")).map_err(lab)?;
    let node = SimNode::start(ns, &o.weftd, dir, (NODE, "127.0.0.1"), cluster, Wait::Serving)?;
    wait_metric(
        node.ns.name(),
        "weft_policy_pass_seconds_count",
        1.0,
        Duration::from_secs(60),
    )?;
    Ok(node)
}

/// What one ADD through the plugin gave.
pub(crate) struct Added {
    pub(crate) ms: f64,
    pub(crate) ok: bool,
    pub(crate) ip: Option<Ipv4Addr>,
    pub(crate) failure: Option<CallFailure>,
}

/// ADD of pod `ns/name` in `netns` through the plugin.
pub(crate) fn add(
    exec: &CniExec,
    node: &NamedNetns,
    netns: &NamedNetns,
    k: usize,
    ns: &str,
    name: &str,
    conf: &[u8],
) -> Added {
    let cid = format!("{}-c{k}", netns.name());
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={cid}");
    let vars = CniVars {
        command: "ADD",
        container_id: &cid,
        netns: &netns.path(),
        ifname: "eth0",
        args: &args,
    };
    match exec.call(node, &vars, conf) {
        Ok(o) if o.ok() => {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            let ip = v["ips"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse::<Ipv4Addr>().ok())
                .next();
            Added {
                ms: ms(o.elapsed),
                ok: true,
                ip,
                failure: None,
            }
        }
        Ok(o) => Added {
            ms: 0.0,
            ok: false,
            ip: None,
            failure: Some(failure("ADD", k, o.code, &o.stdout)),
        },
        Err(e) => Added {
            ms: 0.0,
            ok: false,
            ip: None,
            failure: Some(CallFailure {
                command: "ADD".into(),
                call: k + 1,
                exit_code: -1,
                cni_code: None,
                msg: e.to_string(),
            }),
        },
    }
}

/// How the engine handled the transactions of one ADD.
pub(crate) fn path_of(txs: &[super::nftmon::Transaction]) -> (AddPath, BatchCounts) {
    let mut counts = BatchCounts::default();
    let mut path = AddPath::Nothing;
    for t in txs {
        counts.add(&t.counts());
        path = if t.by == "nft" {
            AddPath::Full
        } else if path == AddPath::Nothing {
            AddPath::Fast
        } else {
            path
        };
    }
    (path, counts)
}

/// The Pods of the attached pods, with the addresses kubelet reported.
fn local_pods(cluster: &Synthetic, n: usize, ips: &[Option<Ipv4Addr>]) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| cluster.local_pod(i, &format!("local-{i}"), NODE, ips.get(i).copied().flatten()))
        .collect()
}

/// One round of one side; `watched`: with `nft monitor` and metric scrapes around each
/// ADD.
fn round(o: &PolicyOptions, with: bool, watched: bool, tag: &str, side: &mut AddSide) -> Result<(), String> {
    let dir = o.work_dir.join(tag);
    let mut objects = Cluster::new(o.add_source, &dir)?;
    let cluster = Synthetic(o.add_cluster);
    let n = o.add_pods;
    objects.put_many("namespaces", &cluster.namespaces(), 500)?;
    if with {
        objects.put_many("pods", &cluster.pods(), 500)?;
        objects.put_many("policies", &cluster.policies(), 500)?;
    }
    objects.put("local-pods.yaml", &local_pods(&cluster, n, &[]))?;
    let node = policy_node(o, tag, &dir, &mut objects)?;
    let pods = create_pods(tag, n)?;
    let monitor = watched.then(|| Monitor::start(node.ns.name())).transpose()?;
    if let Some(m) = &monitor {
        m.settle(Duration::from_millis(200), Duration::from_secs(5));
    }
    let exec = CniExec::new(&o.weft);
    let conf = node.conf();
    let mut ips = Vec::with_capacity(n);
    for (k, netns) in pods.iter().enumerate() {
        let (pod_ns, _) = cluster.local(k);
        let Some(monitor) = &monitor else {
            let a = add(&exec, &node.ns, netns, k, &pod_ns, &format!("local-{k}"), &conf);
            if let Some(f) = a.failure {
                side.failures.push(f);
            } else {
                side.unwatched_ms.push(a.ms);
            }
            ips.push(a.ip);
            // The same pace as a watched round's.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let before = Reading::take(node.ns.name())?;
        let mark = monitor.mark();
        let a = add(&exec, &node.ns, netns, k, &pod_ns, &format!("local-{k}"), &conf);
        let after = Reading::take(node.ns.name())?;
        // The pod's batch was committed before the ADD answered; the monitor prints it
        // a moment later.
        monitor.settle(Duration::from_millis(20), Duration::from_secs(2));
        let (path, batch) = path_of(&monitor.policy_since(mark));
        if let Some(f) = a.failure {
            side.failures.push(f);
        }
        ips.push(a.ip);
        let phases_ms = after.phases_since(&before);
        side.samples.push(AddSample {
            ms: if a.ok { a.ms } else { 0.0 },
            daemon_ms: (after.handling - before.handling) * 1000.0,
            policy_ms: phases_ms.get("policy").copied().unwrap_or(0.0),
            phases_ms,
            path,
            batch,
        });
    }
    side.tables.push(table_size(node.ns.name())?);
    let pid = node.daemon.pid().ok_or("weftd is not running")?;
    side.rss_mib.push(sample(pid)?.0 as f64 / 1024.0);
    // kubelet reports every attached pod's address: one more pass over the cluster.
    let before = Reading::take(node.ns.name())?;
    objects.put("local-pods.yaml", &local_pods(&cluster, n, &ips))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = Reading::take(node.ns.name())?;
        if now.pass_count > before.pass_count {
            side.status_pass_ms
                .push((now.pass_sum - before.pass_sum) / (now.pass_count - before.pass_count) * 1000.0);
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{tag}: no policy pass within 60 s of the pods' addresses"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(monitor);
    node.finish();
    remove_pods(pods);
    Ok(())
}

impl AddSide {
    fn summarize(&mut self) {
        self.latency = Percentiles::of(&self.unwatched_ms);
        let policy = |full: bool| {
            Percentiles::of(
                &self
                    .samples
                    .iter()
                    .filter(|s| s.ms > 0.0 && (s.path == AddPath::Full) == full)
                    .map(|s| s.policy_ms)
                    .collect::<Vec<_>>(),
            )
        };
        self.policy_fast = policy(false);
        self.policy_full = policy(true);
        let steady: Vec<&AddSample> = self
            .samples
            .iter()
            .filter(|s| s.ms > 0.0 && s.path != AddPath::Full)
            .collect();
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for s in &steady {
            *sums.entry("call, spawn to exit".into()).or_default() += s.ms;
            *sums.entry("weftd handling".into()).or_default() += s.daemon_ms;
            for (p, v) in &s.phases_ms {
                *sums.entry(format!("phase {p}")).or_default() += v;
            }
        }
        let n = steady.len().max(1) as f64;
        self.steady_means_ms = sums.into_iter().map(|(k, v)| (k, v / n)).collect();
        let count = |p: AddPath| self.samples.iter().filter(|s| s.path == p).count();
        self.paths = (count(AddPath::Nothing), count(AddPath::Fast), count(AddPath::Full));
    }
}

/// Runs the ADD latency comparison.
pub(crate) fn run_add(o: &PolicyOptions) -> Result<AddReport, String> {
    let load_start = LoadAvg::now();
    let (mut with, mut without) = (AddSide::default(), AddSide::default());
    // The unwatched rounds, then one watched round per side.
    for r in 0..=o.rounds {
        let order = if r % 2 == 0 { [true, false] } else { [false, true] };
        for w in order {
            let tag = format!("wb{}-a{}{r}", std::process::id(), if w { "y" } else { "n" });
            round(o, w, r == o.rounds, &tag, if w { &mut with } else { &mut without })?;
        }
    }
    with.summarize();
    without.summarize();
    Ok(AddReport {
        cluster: o.add_cluster,
        pods: o.add_pods,
        rounds: o.rounds,
        p50_ratio: div(with.latency.p50, without.latency.p50),
        p99_ratio: div(with.latency.p99, without.latency.p99),
        with_policy: with,
        without_policy: without,
        target_ratio: ADD_TARGET_RATIO,
        load: (load_start, LoadAvg::now()),
        source: o.add_source,
    })
}

impl AddReport {
    /// Whether the p50 ratio is within the target.
    pub fn met(&self) -> bool {
        self.p50_ratio > 0.0 && self.p50_ratio <= self.target_ratio
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let c = &self.cluster;
        let mut out = format!(
            "ADD latency: {} ADDs per round x {} rounds per side (alternating) with nothing watching, each round a fresh node and weftd, the cluster read from {}; \"with\": {} NetworkPolicies, {} Pods of other nodes, {} namespaces in the cache, plus the Pods of the attached pods (some policies select them, others have them as peers); \"without\": the namespaces and the attached pods' Pods only; the columns from \"policy phase\" on, and where the time goes, from one more round per side watched by `nft monitor` and metric scrapes around each ADD; load {} at the start, {} at the end\n\n",
            self.pods,
            self.rounds,
            self.source.describe(),
            c.policies,
            c.pods,
            c.namespaces,
            self.load.0,
            self.load.1
        );
        let list = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
        let mut sides = Table::new()
            .text("side")
            .num("ADD p50 (ms)")
            .num("p90")
            .num("p99")
            .num("policy phase p50, fast path / nothing to add (ms)")
            .num("policy phase p50, full pass (ms)")
            .text("ADDs: nothing to add / fast path / full pass")
            .num("failed")
            .text("policy table after the ADDs")
            .text("weftd VmRSS (MiB)")
            .text("full pass after kubelet's addresses (ms)");
        for (name, s) in [("with policy", &self.with_policy), ("without", &self.without_policy)] {
            let t = s.tables.last().copied().unwrap_or_default();
            sides.row([
                name.to_string(),
                format!("{:.2}", s.latency.p50),
                format!("{:.2}", s.latency.p90),
                format!("{:.2}", s.latency.p99),
                if s.policy_fast.n > 0 {
                    format!("{:.3}", s.policy_fast.p50)
                } else {
                    "-".into()
                },
                if s.policy_full.n > 0 {
                    format!("{:.1} (n={})", s.policy_full.p50, s.policy_full.n)
                } else {
                    "-".into()
                },
                format!("{} / {} / {}", s.paths.0, s.paths.1, s.paths.2),
                s.failures.len().to_string(),
                format!("{} elements, {} chains", t.elements, t.chains),
                list(&s.rss_mib),
                list(&s.status_pass_ms),
            ]);
        }
        out.push_str(&sides.to_string());
        out.push_str(
            "\nWhere the time goes: means over the watched round's ADDs that ran no full pass (ms; watching adds to \"call\")\n\n",
        );
        let mut steps = Table::new()
            .text("")
            .num("with policy")
            .num("without")
            .num("difference");
        let (w, n) = (&self.with_policy.steady_means_ms, &self.without_policy.steady_means_ms);
        let mut keys: Vec<&String> = w.keys().chain(n.keys()).collect();
        keys.sort_by_key(|k| (!k.starts_with("call"), !k.starts_with("weftd"), (*k).clone()));
        keys.dedup();
        for k in keys {
            let (a, b) = (w.get(k).copied().unwrap_or(0.0), n.get(k).copied().unwrap_or(0.0));
            steps.row([
                k.clone(),
                format!("{a:.3}"),
                format!("{b:.3}"),
                format!("{:+.3}", a - b),
            ]);
        }
        let mut ratio = Table::new()
            .text("with / without")
            .num("ADD p50")
            .num("ADD p99")
            .text(format!("target p50 <= {:.1}", self.target_ratio));
        ratio.row([
            "ratio".to_string(),
            format!("{:.2}", self.p50_ratio),
            format!("{:.2}", self.p99_ratio),
            crate::exec::met(self.met()).to_string(),
        ]);
        out.push_str(&format!("{steps}\n{ratio}"));
        for f in self
            .with_policy
            .failures
            .iter()
            .chain(&self.without_policy.failures)
            .take(10)
        {
            out.push_str(&format!(
                "- failed ADD #{}: exit {}, CNI code {}: {}\n",
                f.call,
                f.exit_code,
                f.cni_code.map_or("-".into(), |c| c.to_string()),
                f.msg
            ));
        }
        out
    }
}
