//! Load on one node: N pods attached through the real plugin, then all removed, and
//! whether the N-th call costs what the first did. Nothing is set beside it (the
//! reference keeps no node state that grows), so the figures are reported against the
//! target: ADD p50 of the last 100 calls at most 1.2x the first 100's.
//!
//! Everything happens in namespaces the run creates and removes: a node namespace
//! with weftd inside, and one namespace per pod, all made before the clock starts.
//! Calls are issued in a fixed order (call k attaches pod k; the DELs remove the pods
//! in the order they came) by a pool of workers taking the next call from a shared
//! counter, so "the k-th call" is the k-th issued, and found k-1 pods on the node.
//! The pool stops at the window boundaries so weftd's metrics can be read there: the
//! per-phase means of each window tell where a difference between the windows comes
//! from.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use weft_harness::{CniExec, CniVars, DaemonConfig, NamedNetns, NodeDaemon};

use crate::exec::met;
use crate::memory::sample;
use crate::table::Table;
use crate::util::{metric_sum, metrics_in};
use crate::{Percentiles, lab, ms};

mod pods;
use pods::links_besides_lo;
pub(crate) use pods::{create_pods, remove_pods};

/// The target: the last window's ADD p50 at most this multiple of the first's.
pub const LOAD_TARGET_RATIO: f64 = 1.2;

/// Calls per window (fewer when the run has fewer than twice as many pods).
pub const LOAD_WINDOW: usize = 100;

/// How long the veths may take to go after the last DEL answered.
const TEARDOWN_LIMIT: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Pods attached, then removed (at least 2).
    pub pods: usize,
    /// Concurrent workers issuing calls.
    pub workers: usize,
    /// Scratch directory (daemon socket, state, log).
    pub work_dir: PathBuf,
}

/// One window of calls and what weftd reported for it.
#[derive(Debug, Clone, Serialize)]
pub struct LoadWindow {
    /// Its first call (1-based, in the order issued).
    pub from: usize,
    /// Its last call (inclusive).
    pub to: usize,
    /// Latency of its successful calls, spawn to exit (ms).
    pub latency: Percentiles,
    /// Mean latency (ms).
    pub mean_ms: f64,
    /// Mean time weftd took to answer one of its calls
    /// (`grpc_server_handling_seconds`, ms); the rest of `mean_ms` is the exec, the
    /// plugin and its gRPC client.
    pub daemon_ms: f64,
    /// Mean time of one store job in the window (`weft_store_transaction_seconds`, ms).
    pub store_job_ms: f64,
    /// Mean duration of each phase that ran in the window
    /// (`weft_cni_phase_duration_seconds`, ms per occurrence).
    pub phases_ms: BTreeMap<String, f64>,
}

/// ADD or DEL: the first window beside the last.
#[derive(Debug, Clone, Serialize)]
pub struct LoadCommand {
    /// The first calls.
    pub first: LoadWindow,
    /// The last calls.
    pub last: LoadWindow,
    /// `last.latency.p50 / first.latency.p50`.
    pub p50_ratio: f64,
    /// Wall time of all the calls (s; the metric reads at the boundaries excluded).
    pub wall_s: f64,
    /// Calls per second.
    pub calls_per_s: f64,
    /// Latency of every call in the order issued (ms; 0 for a failed call).
    pub samples_ms: Vec<f64>,
}

/// A call that did not succeed: what the runtime would have seen.
#[derive(Debug, Clone, Serialize)]
pub struct CallFailure {
    /// `ADD` or `DEL`.
    pub command: String,
    /// Which call (1-based, in the order issued; the pod's number).
    pub call: usize,
    /// The plugin's exit status (-1: killed, or it could not be run).
    pub exit_code: i32,
    /// The CNI error code it printed, if it printed one.
    pub cni_code: Option<u64>,
    /// The CNI error message and details (or what it printed, or why it did not run).
    pub msg: String,
}

/// The load benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Pods attached, then removed.
    pub pods: usize,
    /// Workers.
    pub workers: usize,
    /// Calls per window.
    pub window: usize,
    /// The target for `add.p50_ratio`.
    pub target_ratio: f64,
    /// The ADDs.
    pub add: LoadCommand,
    /// The DELs.
    pub del: LoadCommand,
    /// weftd's VmRSS once every pod was attached (MiB, median of a few samples).
    pub rss_after_add_mib: f64,
    /// weftd's VmHWM (peak RSS) at the same moment (MiB).
    pub hwm_after_add_mib: f64,
    /// `weft_pods` once every pod was attached.
    pub pods_after_add: f64,
    /// `weft_pods` once the teardowns were done.
    pub pods_after_del: f64,
    /// From the first DEL until the node held no interface but `lo` (s).
    pub teardown_s: f64,
    /// Interfaces other than `lo` still on the node when the run gave up waiting.
    pub links_left: usize,
    /// Every call that failed (the target is none).
    pub failures: Vec<CallFailure>,
}

/// What one call produced.
struct Outcome {
    ms: f64,
    ok: bool,
    stdout: Vec<u8>,
    failure: Option<CallFailure>,
}

/// A failed call's report, from what the plugin printed (a CNI error on stdout).
pub(crate) fn failure(command: &str, call: usize, exit_code: i32, stdout: &[u8]) -> CallFailure {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(stdout).ok();
    let cni_code = parsed.as_ref().and_then(|v| v["code"].as_u64());
    let msg = match &parsed {
        Some(v) if v["msg"].is_string() => {
            let (m, d) = (v["msg"].as_str().unwrap_or(""), v["details"].as_str().unwrap_or(""));
            if d.is_empty() {
                m.to_string()
            } else {
                format!("{m}: {d}")
            }
        }
        _ => String::from_utf8_lossy(stdout).chars().take(500).collect(),
    };
    CallFailure {
        command: command.to_string(),
        call: call + 1,
        exit_code,
        cni_code,
        msg,
    }
}

/// Sums and counts of weftd's histograms at one moment.
#[derive(Default)]
pub(crate) struct Snapshot {
    /// (command, phase) -> (sum s, count).
    pub(crate) phases: BTreeMap<(String, String), (f64, f64)>,
    /// gRPC method -> (sum s, count).
    pub(crate) grpc: BTreeMap<String, (f64, f64)>,
    /// Store jobs (sum s, count).
    store: (f64, f64),
    /// `weft_pods`.
    pods: f64,
}

/// The value of `key="..."` in a label set.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// Every series of metric `name` in a classic text page: (label set, value).
fn series<'a>(page: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (s, value) = l.rsplit_once(' ')?;
            let (metric, labels) = s.split_once('{').unwrap_or((s, ""));
            (metric == name).then(|| Some((labels, value.parse::<f64>().ok()?)))?
        })
        .collect()
}

impl Snapshot {
    fn parse(page: &str) -> Self {
        let mut s = Snapshot::default();
        let name = "weft_cni_phase_duration_seconds";
        for (suffix, slot) in [("_sum", 0), ("_count", 1)] {
            for (labels, v) in series(page, &format!("{name}{suffix}")) {
                if let (Some(c), Some(p)) = (label(labels, "command"), label(labels, "phase")) {
                    let e = s.phases.entry((c.to_string(), p.to_string())).or_default();
                    if slot == 0 { e.0 += v } else { e.1 += v }
                }
            }
            for (labels, v) in series(page, &format!("grpc_server_handling_seconds{suffix}")) {
                if let Some(m) = label(labels, "grpc_method") {
                    let e = s.grpc.entry(m.to_string()).or_default();
                    if slot == 0 { e.0 += v } else { e.1 += v }
                }
            }
        }
        s.store = (
            metric_sum(page, "weft_store_transaction_seconds_sum", &[]),
            metric_sum(page, "weft_store_transaction_seconds_count", &[]),
        );
        s.pods = metric_sum(page, "weft_pods", &[]);
        s
    }

    /// The histograms of the weftd serving metrics inside `ns`.
    pub(crate) fn take(ns: &NamedNetns) -> Result<Self, String> {
        Ok(Self::parse(&metrics_in(ns.name())?))
    }
}

/// Mean (ms) of what a histogram gained between two snapshots.
pub(crate) fn mean_between(before: (f64, f64), after: (f64, f64)) -> f64 {
    let n = after.1 - before.1;
    if n > 0.0 {
        (after.0 - before.0) / n * 1000.0
    } else {
        0.0
    }
}

/// The window of calls `range` (indices into `calls`), between snapshots `a` and `b`.
fn window(
    command: &str,
    method: &str,
    calls: &[Outcome],
    range: Range<usize>,
    a: &Snapshot,
    b: &Snapshot,
) -> LoadWindow {
    let ok: Vec<f64> = calls[range.clone()].iter().filter(|c| c.ok).map(|c| c.ms).collect();
    let mean = if ok.is_empty() {
        0.0
    } else {
        ok.iter().sum::<f64>() / ok.len() as f64
    };
    let phases_ms = b
        .phases
        .iter()
        .filter(|((c, _), _)| c == command)
        .filter_map(|(k, after)| {
            let before = a.phases.get(k).copied().unwrap_or_default();
            (after.1 > before.1).then(|| (k.1.clone(), mean_between(before, *after)))
        })
        .collect();
    let grpc = |s: &Snapshot| s.grpc.get(method).copied().unwrap_or_default();
    LoadWindow {
        from: range.start + 1,
        to: range.end,
        latency: Percentiles::of(&ok),
        mean_ms: mean,
        daemon_ms: mean_between(grpc(a), grpc(b)),
        store_job_ms: mean_between(a.store, b.store),
        phases_ms,
    }
}

/// The node, its pods, and the plugin: what every call needs.
struct Node<'a> {
    ns: &'a NamedNetns,
    pods: &'a [NamedNetns],
    exec: CniExec,
    workers: usize,
    tag: &'a str,
}

impl Node<'_> {
    /// Issues `command` for calls `range` (call k is pod k, with `config(k)`) from the
    /// worker pool, and returns the outcomes in call order.
    fn calls(&self, command: &str, range: Range<usize>, config: &(dyn Fn(usize) -> Vec<u8> + Sync)) -> Vec<Outcome> {
        let next = AtomicUsize::new(range.start);
        let mut done: Vec<(usize, Outcome)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.workers.max(1))
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            if k >= range.end {
                                return mine;
                            }
                            mine.push((k, self.call(command, k, &config(k))));
                        }
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
        });
        done.sort_by_key(|(k, _)| *k);
        done.into_iter().map(|(_, o)| o).collect()
    }

    fn call(&self, command: &str, k: usize, config: &[u8]) -> Outcome {
        let cid = format!("{}-c{k}", self.tag);
        let args =
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{k};K8S_POD_INFRA_CONTAINER_ID={cid}");
        match self.exec.call(
            self.ns,
            &CniVars {
                command,
                container_id: &cid,
                netns: &self.pods[k].path(),
                ifname: "eth0",
                args: &args,
            },
            config,
        ) {
            Ok(o) if o.ok() => Outcome {
                ms: ms(o.elapsed),
                ok: true,
                stdout: o.stdout,
                failure: None,
            },
            Ok(o) => Outcome {
                ms: 0.0,
                ok: false,
                failure: Some(failure(command, k, o.code, &o.stdout)),
                stdout: o.stdout,
            },
            Err(e) => Outcome {
                ms: 0.0,
                ok: false,
                stdout: Vec::new(),
                failure: Some(CallFailure {
                    command: command.to_string(),
                    call: k + 1,
                    exit_code: -1,
                    cni_code: None,
                    msg: e.to_string(),
                }),
            },
        }
    }

    /// Runs every call of `command` in three stretches (the first window, the middle,
    /// the last window), reading weftd's metrics at each boundary.
    fn phase(
        &self,
        command: &str,
        method: &str,
        window_len: usize,
        config: &(dyn Fn(usize) -> Vec<u8> + Sync),
    ) -> Result<(LoadCommand, Vec<Outcome>, Snapshot), String> {
        let n = self.pods.len();
        let bounds = [0, window_len, n - window_len, n];
        let mut snaps = vec![Snapshot::take(self.ns)?];
        let mut calls = Vec::with_capacity(n);
        let mut wall = Duration::ZERO;
        for b in bounds.windows(2) {
            let start = Instant::now();
            calls.extend(self.calls(command, b[0]..b[1], config));
            wall += start.elapsed();
            snaps.push(Snapshot::take(self.ns)?);
        }
        let first = window(command, method, &calls, 0..window_len, &snaps[0], &snaps[1]);
        let last = window(command, method, &calls, n - window_len..n, &snaps[2], &snaps[3]);
        let summary = LoadCommand {
            p50_ratio: ratio(last.latency.p50, first.latency.p50),
            first,
            last,
            wall_s: wall.as_secs_f64(),
            calls_per_s: if wall.is_zero() {
                0.0
            } else {
                n as f64 / wall.as_secs_f64()
            },
            samples_ms: calls.iter().map(|c| c.ms).collect(),
        };
        Ok((summary, calls, snaps.pop().unwrap_or_default()))
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Runs the load benchmark.
pub fn run_load(opts: &LoadOptions) -> Result<LoadReport, String> {
    for (what, p) in [("weft", &opts.weft), ("weftd", &opts.weftd)] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    if opts.pods < 2 {
        return Err(format!("the load benchmark needs at least 2 pods, not {}", opts.pods));
    }
    let n = opts.pods;
    let window_len = LOAD_WINDOW.min(n / 2);
    let tag = format!("wb{}-l", std::process::id());
    let dir = opts.work_dir.join(&tag);
    let node_ns = NamedNetns::create(&format!("{tag}-node")).map_err(lab)?;
    let config = DaemonConfig::under(&opts.weftd, &dir, "bench");
    let socket = config.socket.clone();
    let mut daemon = NodeDaemon::start(&node_ns, config).map_err(lab)?;
    let pid = daemon.pid().ok_or("weftd is not running")?;
    let pods = create_pods(&tag, n)?;
    let node = Node {
        ns: &node_ns,
        pods: &pods,
        exec: CniExec::new(&opts.weft),
        workers: opts.workers.max(1),
        tag: &tag,
    };
    // A /16: room for far more pods than any run attaches.
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "weft",
        "socket": socket, "ranges": ["10.244.0.0/16"], "mtu": 1500,
    });
    let add_conf = serde_json::to_vec(&conf).expect("config serializes");
    let (add, add_calls, after_add) = node.phase("ADD", "Add", window_len, &|_| add_conf.clone())?;
    let (rss, hwm) = sample(pid)?;

    // DEL gets the ADD result as prevResult, as libcni sends it.
    let del_conf = |k: usize| {
        let mut c = conf.clone();
        if let Ok(prev) = serde_json::from_slice::<serde_json::Value>(&add_calls[k].stdout) {
            c["prevResult"] = prev;
        }
        serde_json::to_vec(&c).expect("config serializes")
    };
    let del_start = Instant::now();
    let (del, del_calls, _) = node.phase("DEL", "Del", window_len, &del_conf)?;
    // DEL answers once the pod is cut off; the veths go right after.
    let deadline = Instant::now() + TEARDOWN_LIMIT;
    let mut links_left = links_besides_lo(node_ns.name())?;
    while links_left > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        links_left = links_besides_lo(node_ns.name())?;
    }
    let teardown_s = del_start.elapsed().as_secs_f64();
    let after_del = Snapshot::take(&node_ns)?;

    let failures = add_calls
        .into_iter()
        .chain(del_calls)
        .filter_map(|c| c.failure)
        .collect();
    // SIGTERM: weftd finishes whatever teardown is still in flight before it exits.
    daemon.stop(crate::STOP_LIMIT);
    remove_pods(pods);
    drop(node_ns);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(LoadReport {
        pods: n,
        workers: opts.workers.max(1),
        window: window_len,
        target_ratio: LOAD_TARGET_RATIO,
        add,
        del,
        rss_after_add_mib: rss as f64 / 1024.0,
        hwm_after_add_mib: hwm as f64 / 1024.0,
        pods_after_add: after_add.pods,
        pods_after_del: after_del.pods,
        teardown_s,
        links_left,
        failures,
    })
}

/// Phases in the order a call passes them; any other phase follows, by name.
const PHASE_ORDER: [&str; 11] = [
    "lock_wait",
    "ipam",
    "veth",
    "addresses",
    "routes",
    "nftables",
    "store_commit",
    "wires",
    "disconnect",
    "teardown",
    "check",
];

impl LoadReport {
    /// The report as markdown: latency of the first and last windows, the target,
    /// memory, failures, and weftd's own account of each window.
    pub fn markdown(&self) -> String {
        let w = self.window;
        let mut out = format!(
            "CNI ADD/DEL under load: {} pods attached on one node through the plugin, then removed, {} worker(s); windows of {w} calls (ADDs: the first {w} found 0..{} pods on the node, the last {w} found {}..{}; DELs in the same order)\n\n",
            self.pods,
            self.workers,
            w - 1,
            self.pods - w,
            self.pods - 1,
        );
        let mut t = Table::new()
            .text("command")
            .num(format!("first {w} p50 (ms)"))
            .num("p90")
            .num("p99")
            .num(format!("last {w} p50 (ms)"))
            .num("p90")
            .num("p99")
            .num("last / first (p50)");
        for (name, c) in [("ADD", &self.add), ("DEL", &self.del)] {
            t.row([
                name.to_string(),
                format!("{:.2}", c.first.latency.p50),
                format!("{:.2}", c.first.latency.p90),
                format!("{:.2}", c.first.latency.p99),
                format!("{:.2}", c.last.latency.p50),
                format!("{:.2}", c.last.latency.p90),
                format!("{:.2}", c.last.latency.p99),
                format!("{:.2}", c.p50_ratio),
            ]);
        }
        out.push_str(&t.to_string());
        out.push_str(&format!(
            "\ntarget: ADD p50 of the last {w} within {:.1}x the first {w}'s: {:.2}x, {}\n",
            self.target_ratio,
            self.add.p50_ratio,
            met(self.add.p50_ratio > 0.0 && self.add.p50_ratio <= self.target_ratio)
        ));
        out.push_str(&format!(
            "weftd with {} pods: VmRSS {:.1} MiB (VmHWM {:.1} MiB); weft_pods {} after the ADDs, {} after the teardowns\n",
            self.pods, self.rss_after_add_mib, self.hwm_after_add_mib, self.pods_after_add, self.pods_after_del
        ));
        out.push_str(&format!(
            "ADDs {:.1} s ({:.0}/s), DELs {:.1} s ({:.0}/s); every veth gone {:.1} s after the first DEL{}\n",
            self.add.wall_s,
            self.add.calls_per_s,
            self.del.wall_s,
            self.del.calls_per_s,
            self.teardown_s,
            if self.links_left > 0 {
                format!(" -- NOT: {} interfaces left", self.links_left)
            } else {
                String::new()
            }
        ));
        out.push_str(&format!("failed calls: {}\n", self.failures.len()));
        for f in self.failures.iter().take(20) {
            out.push_str(&format!(
                "- {} #{}: exit {}, CNI code {}: {}\n",
                f.command,
                f.call,
                f.exit_code,
                f.cni_code.map_or("-".to_string(), |c| c.to_string()),
                f.msg
            ));
        }
        if self.failures.len() > 20 {
            out.push_str(&format!("- ... and {} more (see --json)\n", self.failures.len() - 20));
        }

        out.push_str("\nWhere the time goes, mean per call (ms): weftd's own histograms over each window\n\n");
        let mut time = Table::new()
            .text("")
            .num(format!("ADD first {w}"))
            .num(format!("ADD last {w}"))
            .num(format!("DEL first {w}"))
            .num(format!("DEL last {w}"));
        let windows = [&self.add.first, &self.add.last, &self.del.first, &self.del.last];
        let mut row = |name: &str, f: &dyn Fn(&LoadWindow) -> Option<f64>| {
            let cells = windows
                .iter()
                .map(|x| f(x).map_or("-".to_string(), |v| format!("{v:.3}")));
            time.row(std::iter::once(name.to_string()).chain(cells));
        };
        row("call, spawn to exit", &|x| Some(x.mean_ms));
        row("weftd handling (gRPC)", &|x| Some(x.daemon_ms));
        row("outside weftd (exec, plugin, client)", &|x| {
            Some(x.mean_ms - x.daemon_ms)
        });
        row("store job", &|x| Some(x.store_job_ms));
        let mut phases: Vec<&String> = windows.iter().flat_map(|x| x.phases_ms.keys()).collect();
        phases.sort_by_key(|p| (PHASE_ORDER.iter().position(|o| o == p).unwrap_or(PHASE_ORDER.len()), *p));
        phases.dedup();
        for p in phases {
            row(&format!("phase {p}"), &|x| x.phases_ms.get(p).copied());
        }
        out.push_str(&time.to_string());
        out
    }
}

#[cfg(test)]
mod tests;
