//! Convergence: from a change written into the topology directory (a pod's label, a
//! NetworkPolicy applied or deleted, as `weftctl lab label`/`apply`/`delete` write them)
//! to every node's kernel holding it, in a three-node lab like
//! `examples/lab-policy.yaml`. Each node's policy table is watched with `nft monitor`,
//! which reports every committed transaction the moment the kernel announces it: a
//! node is in step at the first line of the transaction that holds the change (the pod's
//! address added to or deleted from a peer set; the policy's chains added or deleted).
//! Changes alternate between the two kinds, each toggling what the previous one of its
//! kind did, and every one of them reaches every node (the policies they touch select a
//! pod on each). Optionally a synthetic cluster lies in the same directory, so every
//! node's pass plans with that many objects in its cache.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use weft_lab::objects::LabelTarget;

use super::nftmon::{Monitor, Transaction, nft};
use super::objects::{ClusterSize, Synthetic, policy, write_chunked, write_docs};
use super::{LoadAvg, PolicyOptions};
use crate::Percentiles;
use crate::table::Table;
use crate::util::LabGuard;

/// The target: p99 from a change to every node in step, below (ms).
pub const CONVERGE_TARGET_MS: f64 = 1000.0;

/// How long one change may take to reach a node before the run fails.
const CHANGE_LIMIT: Duration = Duration::from_secs(30);

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Pod y/b labelled `role=client`, or the label removed (its address enters or
    /// leaves a policy's peer set on every node).
    Label,
    /// A NetworkPolicy selecting every pod of x applied, or deleted (its chains and
    /// sets come or go on every node).
    Policy,
}

/// One change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// What changed.
    pub kind: ChangeKind,
    /// Whether it added (label set, policy applied) rather than removed.
    pub adds: bool,
    /// How long writing it took (the lab's own bookkeeping and the file's rename, ms).
    pub write_ms: f64,
    /// From just before the write to each node's kernel holding it (ms), n1, n2, n3.
    pub node_ms: Vec<f64>,
    /// The slowest node (ms): the whole cluster in step.
    pub all_ms: f64,
    /// Transactions each node committed on its policy table for this change.
    pub transactions: Vec<usize>,
}

/// One variant (a cache size).
#[derive(Debug, Clone, Serialize)]
pub struct ConvergeRun {
    /// The synthetic cluster beside the lab's own objects, if any.
    pub background: Option<ClusterSize>,
    /// Every change.
    pub changes: Vec<Change>,
    /// Every node in step (ms), all changes.
    pub all: Percentiles,
    /// Label changes only.
    pub label: Percentiles,
    /// Policy changes only.
    pub policy: Percentiles,
    /// Each node's own time (ms), all changes pooled.
    pub per_node: Percentiles,
    /// The machine's load at the start and the end.
    pub load: (LoadAvg, LoadAvg),
}

/// Convergence at each cache size.
#[derive(Debug, Clone, Serialize)]
pub struct ConvergeReport {
    /// Changes per variant.
    pub changes: usize,
    /// The variants.
    pub runs: Vec<ConvergeRun>,
    /// The target (ms) for the p99 of `all`.
    pub target_ms: f64,
}

fn spec(name: &str) -> serde_json::Value {
    let http = json!([{"name": "http", "containerPort": 80}]);
    json!({
        "name": name,
        "wire_security": "insecure",
        "nodes": ["n1", "n2", "n3"],
        "namespaces": [{"name": "x", "labels": {"ns": "x"}}, {"name": "y", "labels": {"ns": "y"}}],
        "pods": [
            {"name": "a", "namespace": "x", "node": "n1", "labels": {"pod": "a"}, "ports": http},
            {"name": "b", "namespace": "x", "node": "n2", "labels": {"pod": "b"}, "ports": http},
            {"name": "c", "namespace": "x", "node": "n3", "labels": {"pod": "c"}, "ports": http},
            {"name": "a", "namespace": "y", "node": "n2", "labels": {"pod": "a"}},
            {"name": "b", "namespace": "y", "node": "n3", "labels": {"pod": "b"}},
        ],
        "policies": [
            policy("x", "default-deny-ingress", json!({"podSelector": {}, "policyTypes": ["Ingress"]})),
            policy("x", "allow-y-on-http", json!({
                "podSelector": {},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                             "ports": [{"protocol": "TCP", "port": "http"}]}],
            })),
            policy("x", "allow-clients", json!({
                "podSelector": {},
                "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}],
                             "ports": [{"protocol": "TCP", "port": 81}]}],
            })),
        ],
    })
}

/// The policy the policy changes apply and delete.
fn extra_policy(dir: &Path) -> Result<std::path::PathBuf, String> {
    let file = dir.join("extra-policy.yaml");
    write_docs(
        dir,
        "extra-policy.yaml",
        &[policy(
            "x",
            "extra",
            json!({
                "podSelector": {},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                             "ports": [{"protocol": "TCP", "port": 82}]}],
            }),
        )],
    )?;
    Ok(file)
}

/// Whether transaction `t` holds change `kind` (`adds`), `ip` being y/b's address.
fn holds(t: &Transaction, kind: ChangeKind, adds: bool, ip: &str) -> bool {
    let verb = if adds { "add" } else { "delete" };
    match kind {
        ChangeKind::Label => {
            t.has(&[&format!("{verb} element"), &format!("{ip} ")])
                || t.has(&[&format!("{verb} element"), &format!("{ip},")])
        }
        ChangeKind::Policy => t.has(&[&format!("{verb} chain")]),
    }
}

fn one_run(o: &PolicyOptions, background: Option<ClusterSize>, tag: &str) -> Result<ConvergeRun, String> {
    let load_start = LoadAvg::now();
    let dir = o.work_dir.join(tag);
    if let Some(size) = background {
        let topology = dir.join("state").join("topology");
        std::fs::create_dir_all(&topology).map_err(|e| format!("creating {}: {e}", topology.display()))?;
        let s = Synthetic(size);
        write_chunked(&topology, "bg-namespaces", &s.namespaces(), 500)?;
        write_chunked(&topology, "bg-pods", &s.pods(), 500)?;
        write_chunked(&topology, "bg-policies", &s.policies(), 500)?;
    }
    let guard = LabGuard::up(&dir, &spec(tag), &o.weftd, &o.weft)?;
    let lab = &guard.lab;
    let yb_ip = lab
        .pod_addresses("y/b")
        .into_iter()
        .find(IpAddr::is_ipv4)
        .ok_or("pod y/b has no IPv4 address")?
        .to_string();
    // Every pod's address reported and in the tables: y's pods in every node's set of
    // allow-y-on-http (each node has a pod of x).
    let ya_ip = lab
        .pod_addresses("y/a")
        .into_iter()
        .find(IpAddr::is_ipv4)
        .ok_or("pod y/a has no IPv4 address")?
        .to_string();
    for n in ["n1", "n2", "n3"] {
        let ns = lab.node_ns(n);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let table = nft(&ns, "list table inet weft-policy").unwrap_or_default();
            let has = |ip: &str| table.contains(&format!("{ip},")) || table.contains(&format!("{ip} "));
            if has(&ya_ip) && has(&yb_ip) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{tag}: y's pods never reached the policy table of {n}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let extra = extra_policy(&dir)?;
    let nodes = ["n1", "n2", "n3"];
    let monitors: Vec<Monitor> = nodes
        .iter()
        .map(|n| Monitor::start(&lab.node_ns(n)))
        .collect::<Result<_, _>>()?;
    for m in &monitors {
        m.settle(Duration::from_millis(500), Duration::from_secs(20));
    }
    let mut changes = Vec::with_capacity(o.converge_changes);
    let (mut labelled, mut applied) = (false, false);
    for i in 0..o.converge_changes {
        let kind = if i % 2 == 0 {
            ChangeKind::Label
        } else {
            ChangeKind::Policy
        };
        let adds = match kind {
            ChangeKind::Label => !labelled,
            ChangeKind::Policy => !applied,
        };
        let marks: Vec<usize> = monitors.iter().map(Monitor::mark).collect();
        let t0 = Instant::now();
        let written = match (kind, adds) {
            (ChangeKind::Label, true) => lab.label(LabelTarget::Pod, "y/b", &["role=client".into()]).map(drop),
            (ChangeKind::Label, false) => lab.label(LabelTarget::Pod, "y/b", &["role-".into()]).map(drop),
            (ChangeKind::Policy, true) => lab.apply_policies(std::slice::from_ref(&extra)).map(drop),
            (ChangeKind::Policy, false) => lab.delete_policies(std::slice::from_ref(&extra)).map(drop),
        };
        written.map_err(|e| format!("{tag}: change {i}: {e}"))?;
        let write_ms = t0.elapsed().as_secs_f64() * 1000.0;
        match kind {
            ChangeKind::Label => labelled = adds,
            ChangeKind::Policy => applied = adds,
        }
        let mut node_ms = Vec::new();
        let mut transactions = Vec::new();
        for (m, &mark) in monitors.iter().zip(&marks) {
            let (txs, ok) = m.wait(mark, CHANGE_LIMIT, |txs| {
                txs.iter().any(|t| holds(t, kind, adds, &yb_ip))
            });
            if !ok {
                return Err(format!(
                    "{tag}: change {i} ({kind:?}, adds {adds}) did not reach {} within {CHANGE_LIMIT:?}",
                    m.ns()
                ));
            }
            let t = txs.iter().find(|t| holds(t, kind, adds, &yb_ip)).expect("found above");
            node_ms.push(t.first.duration_since(t0).as_secs_f64() * 1000.0);
        }
        // Let every node finish what the change set off, then one more quiet moment.
        for m in &monitors {
            m.settle(Duration::from_millis(150), Duration::from_secs(10));
        }
        for (m, &mark) in monitors.iter().zip(&marks) {
            transactions.push(m.policy_since(mark).len());
        }
        let all_ms = node_ms.iter().copied().fold(0.0, f64::max);
        changes.push(Change {
            kind,
            adds,
            write_ms,
            node_ms,
            all_ms,
            transactions,
        });
    }
    drop(monitors);
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    let pick = |k: Option<ChangeKind>| {
        Percentiles::of(
            &changes
                .iter()
                .filter(|c| k.is_none_or(|k| c.kind == k))
                .map(|c| c.all_ms)
                .collect::<Vec<_>>(),
        )
    };
    Ok(ConvergeRun {
        background,
        all: pick(None),
        label: pick(Some(ChangeKind::Label)),
        policy: pick(Some(ChangeKind::Policy)),
        per_node: Percentiles::of(&changes.iter().flat_map(|c| c.node_ms.clone()).collect::<Vec<_>>()),
        changes,
        load: (load_start, LoadAvg::now()),
    })
}

/// Runs the convergence measurement: the lab alone, then with each background size.
pub(crate) fn run_converge(o: &PolicyOptions) -> Result<ConvergeReport, String> {
    let mut runs = Vec::new();
    for (i, bg) in std::iter::once(None)
        .chain(o.converge_backgrounds.iter().copied().map(Some))
        .enumerate()
    {
        let tag = format!("wb{}c{i}", std::process::id());
        runs.push(one_run(o, bg, &tag)?);
    }
    Ok(ConvergeReport {
        changes: o.converge_changes,
        runs,
        target_ms: CONVERGE_TARGET_MS,
    })
}

impl ConvergeReport {
    /// Whether every run's p99 is under the target.
    pub fn met(&self) -> bool {
        self.runs.iter().all(|r| r.all.n > 0 && r.all.p99 < self.target_ms)
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Convergence: {} changes per run written into a three-node lab's topology directory (alternately pod y/b's label role=client set/removed and a NetworkPolicy selecting every pod of x applied/deleted; each reaches all three nodes), timed from just before the write to the first line of the transaction holding the change in each node's `nft monitor`\n\n",
            self.changes
        );
        let mut t = Table::new()
            .text("objects in the cache besides the lab's")
            .num("every node in step p50 (ms)")
            .num("p90")
            .num("p99")
            .num("max")
            .text("label changes p50 / p99")
            .text("policy changes p50 / p99")
            .text("one node p50 / p99")
            .num("write p50 (ms)")
            .num("transactions per node and change (max)")
            .text("load start / end")
            .text(format!("target p99 < {:.0} ms", self.target_ms));
        for r in &self.runs {
            let bg = r.background.map_or("none".to_string(), |b| {
                format!("{} pods, {} policies, {} namespaces", b.pods, b.policies, b.namespaces)
            });
            let write = Percentiles::of(&r.changes.iter().map(|c| c.write_ms).collect::<Vec<_>>());
            let txs = r
                .changes
                .iter()
                .flat_map(|c| c.transactions.iter().copied())
                .max()
                .unwrap_or(0);
            t.row([
                bg,
                format!("{:.0}", r.all.p50),
                format!("{:.0}", r.all.p90),
                format!("{:.0}", r.all.p99),
                format!("{:.0}", r.all.max),
                format!("{:.0} / {:.0}", r.label.p50, r.label.p99),
                format!("{:.0} / {:.0}", r.policy.p50, r.policy.p99),
                format!("{:.0} / {:.0}", r.per_node.p50, r.per_node.p99),
                format!("{:.1}", write.p50),
                txs.to_string(),
                format!("{} / {}", r.load.0, r.load.1),
                crate::exec::met(r.all.n > 0 && r.all.p99 < self.target_ms).to_string(),
            ]);
        }
        out.push_str(&t.to_string());
        out
    }
}
