//! Network policy against its targets (issue 28), each side measured in the same run:
//!
//! - `data`: pod-to-pod TCP and 64-byte UDP across two nodes with 100 NetworkPolicies
//!   selecting the pods (1,000 addresses in every peer set) beside the same lab without
//!   policy ([`datapath`]);
//! - `add`: ADD latency with 1,000 policies and 5,000 pods in weftd's cache beside ADD
//!   with none, rounds alternating, and which ADDs took the engine's fast path
//!   ([`add`]);
//! - `converge`: from a label or policy change written into the topology directory to
//!   every node of a three-node lab holding it in its kernel ([`converge`]);
//! - `reach`: from a new pod's ADD answering to its first UDP echo from a pod of
//!   another node its policies allow, each way, in a three-node lab, with the nodes
//!   announcing new pods and without ([`reach`]);
//! - `scale`: one weftd with 30 pods and a synthetic cluster of 1,000 to 10,000 pods in
//!   its cache: start to table programmed, RSS, and each remote pod's arrival and label
//!   change timed to the node's kernel with the batch it caused ([`scale`]).
//!
//! `weft-bench --compare policy` runs them all; `WEFT_BENCH_POLICY_PARTS` (a comma
//! list of the names above) runs some, and `WEFT_BENCH_POLICY_SIZES=smoke` runs them at
//! `--smoke`'s tiny sizes. Kernel changes are read with `nft monitor` in
//! the node namespaces ([`nftmon`]); the objects are [`objects`]'.

mod add;
mod announce;
mod cluster;
mod converge;
mod datapath;
mod nftmon;
mod objects;
mod reach;
mod scale;

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use add::{ADD_TARGET_RATIO, AddPath, AddReport, AddSample, AddSide};
pub(crate) use cluster::Cluster;
pub use cluster::ClusterSource;
pub use converge::{CONVERGE_TARGET_MS, Change, ChangeKind, ConvergeReport, ConvergeRun};
pub use datapath::{DATA_PEERS, DATA_POLICIES, DATA_TARGET_RATIO, DataPathReport, FIRST_POLICY_PORT, TrafficSide};
pub use nftmon::{BatchCounts, TableSize};
pub use objects::ClusterSize;
pub use reach::{
    NO_ANNOUNCE_ENV, Quantiles, REACH_PODS, REACH_PORT, REACH_PROBE_LIMIT, REACH_TARGET_MS, ReachPod, ReachReport,
    ReachRun,
};
pub use scale::{
    SCALE_ARRIVALS, SCALE_CHURN, SCALE_KERNEL_TARGET_MS, SCALE_LOCAL_PODS, SCALE_RSS_TARGET_MIB, ScalePoint,
    ScaleReport, scaled,
};

use crate::table::Table;
use crate::util::{metric_sum, metrics_in};

/// From a new pod's Pod object written to its ADD, unless set otherwise: the lab's own
/// wait for its daemons to read new Pod objects before it attaches pods.
const REACH_OBJECT_LEAD: Duration = Duration::from_millis(300);

/// The parts `WEFT_BENCH_POLICY_PARTS` may name.
pub const POLICY_PARTS: [&str; 5] = ["data", "add", "converge", "reach", "scale"];

/// What to run.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Scratch directory.
    pub work_dir: PathBuf,
    /// Which parts ([`POLICY_PARTS`]).
    pub parts: Vec<String>,
    /// Data path passes, and the timed (unwatched) ADD rounds per side.
    pub rounds: usize,
    /// Seconds of each iperf3 TCP run.
    pub tcp_seconds: u64,
    /// Seconds of each UDP flood.
    pub udp_seconds: f64,
    /// Policies selecting the data path's pods.
    pub data_policies: usize,
    /// Pod objects among their peers.
    pub data_peers: usize,
    /// ADDs per round and side.
    pub add_pods: usize,
    /// The cluster in the "with" side's cache.
    pub add_cluster: ClusterSize,
    /// Changes per convergence run.
    pub converge_changes: usize,
    /// Convergence runs with these synthetic clusters beside the lab (after one
    /// without).
    pub converge_backgrounds: Vec<ClusterSize>,
    /// New pods per run of the reachability measurement.
    pub reach_pods: usize,
    /// From a new pod's Pod object written to its ADD: the scheduler's binding reaching
    /// kubelet, which starts the sandbox (`WEFT_BENCH_REACH_OBJECT_LEAD_MS`; the lab's
    /// own `up` waits as long for its daemons to read new Pod objects).
    pub reach_object_lead: Duration,
    /// From a new pod's ADD answering to its addresses reported into the lab, as
    /// kubelet reports them; never before the probes started
    /// (`WEFT_BENCH_REACH_REPORT_DELAY_MS`).
    pub reach_report_delay: Duration,
    /// A second run of the reachability measurement with weftds that do not announce
    /// new pods (the watch path alone; `WEFT_BENCH_REACH_WATCH_ONLY=0` leaves it out).
    pub reach_watch_only_run: bool,
    /// The scale simulation's sizes (pods).
    pub scale_pods: Vec<usize>,
    /// Local pods in the scale simulation.
    pub scale_local_pods: usize,
    /// Remote pods that arrive at each size of the scale simulation, each timed to the
    /// node's kernel.
    pub scale_arrivals: usize,
    /// Label changes of those remote pods after the arrivals, each timed to the node's
    /// kernel (RSS read every 25).
    pub scale_churn: usize,
    /// Where the ADD part's weftd reads its cluster.
    pub add_source: ClusterSource,
    /// Where the scale simulation's weftd reads its cluster.
    pub scale_source: ClusterSource,
}

impl PolicyOptions {
    /// The issue's sizes: 100 policies and 1,000 peers on the data path; 1,000
    /// policies, 5,000 pods and 50 namespaces for ADD; 50 changes, alone and with the
    /// ADD's cluster beside the lab; 1,000, 5,000 and 10,000 pods with 30 local ones.
    /// `parts` from `WEFT_BENCH_POLICY_PARTS` (default all); [`PolicyOptions::smoke`]'s
    /// sizes instead with `WEFT_BENCH_POLICY_SIZES=smoke`.
    pub fn issue(weft: PathBuf, weftd: PathBuf, work_dir: PathBuf, rounds: usize, add_pods: usize) -> Self {
        let add_cluster = ClusterSize {
            namespaces: 50,
            pods: 5000,
            policies: 1000,
        };
        let parts = std::env::var("WEFT_BENCH_POLICY_PARTS")
            .ok()
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_else(|| POLICY_PARTS.map(String::from).to_vec());
        if std::env::var("WEFT_BENCH_POLICY_SIZES").is_ok_and(|v| v == "smoke") {
            return Self {
                parts,
                ..Self::smoke(weft, weftd, work_dir)
            }
            .reach_from_env();
        }
        Self {
            weft,
            weftd,
            work_dir,
            parts,
            rounds,
            tcp_seconds: 5,
            udp_seconds: 3.0,
            data_policies: DATA_POLICIES,
            data_peers: DATA_PEERS,
            add_pods,
            add_cluster,
            converge_changes: 50,
            converge_backgrounds: vec![add_cluster],
            reach_pods: REACH_PODS,
            reach_object_lead: REACH_OBJECT_LEAD,
            reach_report_delay: Duration::ZERO,
            reach_watch_only_run: true,
            scale_pods: vec![1000, 5000, 10000],
            scale_local_pods: SCALE_LOCAL_PODS,
            scale_arrivals: SCALE_ARRIVALS,
            scale_churn: SCALE_CHURN,
            // The directory by default: through the fake API server, that server (in this
            // process, on the same two cores) adds its own work to every ADD of the side
            // with 5,000 pods; docs/BENCHMARKS.md gives both.
            add_source: ClusterSource::from_env(ClusterSource::Dir).unwrap_or(ClusterSource::Dir),
            scale_source: ClusterSource::from_env(ClusterSource::Api).unwrap_or(ClusterSource::Api),
        }
        .reach_from_env()
    }

    /// The reachability measurement's settings from the environment, where given:
    /// `WEFT_BENCH_REACH_PODS`, `WEFT_BENCH_REACH_OBJECT_LEAD_MS`,
    /// `WEFT_BENCH_REACH_REPORT_DELAY_MS`, `WEFT_BENCH_REACH_WATCH_ONLY` (0: no run
    /// without announcements).
    fn reach_from_env(mut self) -> Self {
        let num = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(n) = num("WEFT_BENCH_REACH_PODS") {
            self.reach_pods = n as usize;
        }
        if let Some(ms) = num("WEFT_BENCH_REACH_OBJECT_LEAD_MS") {
            self.reach_object_lead = Duration::from_millis(ms);
        }
        if let Some(ms) = num("WEFT_BENCH_REACH_REPORT_DELAY_MS") {
            self.reach_report_delay = Duration::from_millis(ms);
        }
        if let Some(n) = num("WEFT_BENCH_REACH_WATCH_ONLY") {
            self.reach_watch_only_run = n != 0;
        }
        self
    }

    /// Every part, tiny (CI: the code runs, timings mean nothing).
    pub fn smoke(weft: PathBuf, weftd: PathBuf, work_dir: PathBuf) -> Self {
        Self {
            weft,
            weftd,
            work_dir,
            parts: POLICY_PARTS.map(String::from).to_vec(),
            rounds: 1,
            tcp_seconds: 1,
            udp_seconds: 0.5,
            data_policies: 3,
            data_peers: 10,
            add_pods: 3,
            add_cluster: ClusterSize {
                namespaces: 5,
                pods: 50,
                policies: 10,
            },
            converge_changes: 2,
            converge_backgrounds: Vec::new(),
            reach_pods: 5,
            reach_object_lead: REACH_OBJECT_LEAD,
            reach_report_delay: Duration::ZERO,
            reach_watch_only_run: true,
            scale_pods: vec![100],
            scale_local_pods: 3,
            scale_arrivals: 3,
            scale_churn: 4,
            add_source: ClusterSource::Api,
            scale_source: ClusterSource::Api,
        }
    }

    fn wants(&self, part: &str) -> bool {
        self.parts.iter().any(|p| p == part)
    }
}

/// The machine's load average (1, 5, 15 minutes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LoadAvg(pub f64, pub f64, pub f64);

impl LoadAvg {
    /// `/proc/loadavg` now.
    pub fn now() -> Self {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let mut v = text.split_whitespace().map(|w| w.parse::<f64>().unwrap_or(0.0));
        LoadAvg(
            v.next().unwrap_or(0.0),
            v.next().unwrap_or(0.0),
            v.next().unwrap_or(0.0),
        )
    }
}

impl fmt::Display for LoadAvg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.2} {:.2} {:.2}", self.0, self.1, self.2)
    }
}

/// Every part that ran.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    /// The data path.
    pub data: Option<DataPathReport>,
    /// ADD latency.
    pub add: Option<AddReport>,
    /// Convergence.
    pub converge: Option<ConvergeReport>,
    /// A new pod's reachability.
    pub reach: Option<ReachReport>,
    /// The scale simulation.
    pub scale: Option<ScaleReport>,
    /// Seconds the whole run took.
    pub seconds: f64,
}

/// Runs the parts `o` names, in the order of [`POLICY_PARTS`].
pub fn run_policy(o: &PolicyOptions) -> Result<PolicyReport, String> {
    for (what, p) in [("weft", &o.weft), ("weftd", &o.weftd)] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    ClusterSource::from_env(ClusterSource::Api)?;
    if let Some(p) = o.parts.iter().find(|p| !POLICY_PARTS.contains(&p.as_str())) {
        return Err(format!(
            "no policy benchmark part {p:?} (parts: {})",
            POLICY_PARTS.join(", ")
        ));
    }
    let start = Instant::now();
    let data = if o.wants("data") {
        Some(datapath::run_datapath(o).map_err(|e| format!("data path: {e}"))?)
    } else {
        None
    };
    let add = if o.wants("add") {
        Some(add::run_add(o).map_err(|e| format!("ADD latency: {e}"))?)
    } else {
        None
    };
    let converge = if o.wants("converge") {
        Some(converge::run_converge(o).map_err(|e| format!("convergence: {e}"))?)
    } else {
        None
    };
    let reach = if o.wants("reach") {
        Some(reach::run_reach(o).map_err(|e| format!("reachability: {e}"))?)
    } else {
        None
    };
    let scale = if o.wants("scale") {
        Some(scale::run_scale(o).map_err(|e| format!("scale: {e}"))?)
    } else {
        None
    };
    Ok(PolicyReport {
        data,
        add,
        converge,
        reach,
        scale,
        seconds: start.elapsed().as_secs_f64(),
    })
}

impl PolicyReport {
    /// Every part's markdown, then the targets.
    pub fn markdown(&self) -> String {
        let mut out = Vec::new();
        if let Some(d) = &self.data {
            out.push(d.markdown());
        }
        if let Some(a) = &self.add {
            out.push(a.markdown());
        }
        if let Some(c) = &self.converge {
            out.push(c.markdown());
        }
        if let Some(r) = &self.reach {
            out.push(r.markdown());
        }
        if let Some(s) = &self.scale {
            out.push(s.markdown());
        }
        let mut t = Table::new().text("target").text("measured").text("");
        if let Some(d) = &self.data {
            t.row([
                format!("data path with policy >= {:.2}x without", d.target_ratio),
                format!(
                    "TCP {:.2}x, 64-byte frames {:.2}x (accepted by the first policy {:.2}x, established {:.2}x)",
                    d.tcp_ratio, d.fps_ratio, d.fps_first_ratio, d.fps_replied_ratio
                ),
                crate::exec::met(d.met()).to_string(),
            ]);
        }
        if let Some(a) = &self.add {
            t.row([
                format!(
                    "ADD p50 with {} policies / {} pods <= {:.1}x without",
                    a.cluster.policies, a.cluster.pods, a.target_ratio
                ),
                format!("{:.2}x (p99 {:.2}x)", a.p50_ratio, a.p99_ratio),
                crate::exec::met(a.met()).to_string(),
            ]);
        }
        if let Some(c) = &self.converge {
            let p99s: Vec<String> = c.runs.iter().map(|r| format!("{:.0} ms", r.all.p99)).collect();
            t.row([
                format!("convergence p99 < {:.0} ms", c.target_ms),
                p99s.join(", "),
                crate::exec::met(c.met()).to_string(),
            ]);
        }
        if let Some(r) = &self.reach {
            let measured = match r.judged() {
                Some(j) => format!(
                    "new pod -> other node p99 {:.1} ms, other node -> new pod p99 {:.1} ms, {} of {} probes failed; the lab as it is, announcements the other nodes applied: {:.0}",
                    j.out.p99,
                    j.into.p99,
                    j.out_failed + j.in_failed,
                    2 * j.pods.len(),
                    j.announcements.get("applied").copied().unwrap_or(0.0)
                ),
                None => "not run".into(),
            };
            t.row([
                format!(
                    "new-pod reachability from the ADD's answer, p99 < {:.0} ms",
                    r.target_ms
                ),
                measured,
                crate::exec::met(r.met()).to_string(),
            ]);
        }
        if let Some(s) = &self.scale {
            if let Some(p) = s.points.last() {
                t.row([
                    format!(
                        "a remote pod's arrival and a label change at {} pods and {} policies: kernel in step p99 < {:.0} ms",
                        p.cluster.pods, p.cluster.policies, s.kernel_target_ms
                    ),
                    format!(
                        "arrival p99 {:.1} ms, label change p99 {:.1} ms",
                        p.arrival_ms.p99, p.churn_ms.p99
                    ),
                    crate::exec::met(s.kernel_met()).to_string(),
                ]);
            }
            let rss: Vec<String> = s
                .points
                .iter()
                .map(|p| format!("{:.1} MiB at {} pods", p.rss_mib.max(p.restart_rss_mib), p.cluster.pods))
                .collect();
            t.row([
                format!("weftd VmRSS <= {:.0} MiB", s.rss_target_mib),
                rss.join(", "),
                crate::exec::met(s.rss_met()).to_string(),
            ]);
        }
        out.push(format!("Targets\n\n{t}"));
        out.join("\n")
    }
}

fn div(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The sum of metric `name`'s series from the weftd in `ns`.
fn metric(ns: &str, name: &str) -> Result<f64, String> {
    Ok(metric_sum(&metrics_in(ns)?, name, &[]))
}

/// Waits until the weftd in `ns` reports metric `name` at `at_least`.
fn wait_metric(ns: &str, name: &str, at_least: f64, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(v) = metric(ns, name)
            && v >= at_least
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{ns}: {name} did not reach {at_least} within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
