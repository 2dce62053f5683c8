//! weftd's resident memory (`VmRSS`) as a node fills: idle, with pods attached, and
//! with gRPC wires on top. There is no reference daemon to set it beside (the
//! reference plugins keep no process), so the figures are reported against the target.
//!
//! Each round builds a two-node lab (`weft_lab::Lab`) from a file it writes: first no
//! pods, then the pods (node 1 holds all of them, node 2 the peers of the wires), then
//! Topology objects giving each of the first pods of node 1 one gRPC link to a pod of
//! node 2. Every wire is pinged across once before the last measurement, so its
//! buffers have been used. Node 1's daemon is measured.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::table::Table;
use crate::util::{End, LabGuard, metric_sum, metrics_in, status_kib, topology, wait_reachable};
use crate::{exec::met, median};

/// The target for weftd's resident memory with 250 pods and 100 gRPC wires.
pub const MEMORY_TARGET_MIB: f64 = 40.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct MemoryOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Pods on node 1.
    pub pods: usize,
    /// gRPC wires between node 1 and node 2 (at most `pods`).
    pub wires: usize,
    /// Rounds (a fresh lab each).
    pub rounds: usize,
    /// Scratch directory (lab file and state).
    pub work_dir: PathBuf,
}

/// One state of the node and what node 1's daemon held in it.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryState {
    /// What the node held.
    pub state: String,
    /// Pods attached on node 1.
    pub pods: usize,
    /// gRPC wire ends on node 1.
    pub wires: usize,
    /// VmRSS per round (KiB; the median of a few samples a round).
    pub rss_kib: Vec<u64>,
    /// VmHWM (the peak RSS so far) per round (KiB).
    pub hwm_kib: Vec<u64>,
    /// Median VmRSS over the rounds (MiB).
    pub rss_mib: f64,
    /// Median VmHWM over the rounds (MiB).
    pub hwm_mib: f64,
    /// `rss_mib` / the target.
    pub rss_over_target: f64,
}

/// The memory benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// Pods on node 1.
    pub pods: usize,
    /// gRPC wires.
    pub wires: usize,
    /// Rounds.
    pub rounds: usize,
    /// The target (MiB).
    pub target_mib: f64,
    /// Idle, with pods, with pods and wires.
    pub states: Vec<MemoryState>,
    /// Wires that did not answer a ping (each round).
    pub wire_ping_failures: usize,
}

/// The median of a few samples of `pid`'s VmRSS and its VmHWM (KiB): RSS moves a
/// little as allocator arenas are trimmed.
pub(crate) fn sample(pid: u32) -> Result<(u64, u64), String> {
    let mut rss = Vec::new();
    for i in 0..5 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
        rss.push(status_kib(pid, "VmRSS").ok_or_else(|| format!("reading /proc/{pid}/status"))? as f64);
    }
    let hwm = status_kib(pid, "VmHWM").unwrap_or(0);
    Ok((median(&rss) as u64, hwm))
}

/// `n`-th /30 of 10.250.0.0/16: (first host, second host).
fn pair(n: usize) -> (String, String) {
    let base = n * 4;
    let a = |off: usize| format!("10.250.{}.{}", (base + off) / 256, (base + off) % 256);
    (a(1), a(2))
}

fn spec(name: &str, opts: &MemoryOptions, pods: bool, wires: bool) -> serde_json::Value {
    let mut pod_list = Vec::new();
    if pods {
        pod_list.extend((0..opts.pods).map(|i| serde_json::json!({"name": format!("m{i}"), "node": "n1"})));
        pod_list.extend((0..opts.wires).map(|i| serde_json::json!({"name": format!("k{i}"), "node": "n2"})));
    }
    let mut topologies = Vec::new();
    if wires {
        for i in 0..opts.wires {
            let (a, b) = pair(i);
            let (m, k) = (format!("m{i}"), format!("k{i}"));
            let here = End {
                uid: i as u64 + 1,
                peer_pod: &k,
                local: ("g1", &a),
                peer: ("g1", &b),
                kind: Some("grpc"),
            };
            let there = End {
                uid: i as u64 + 1,
                peer_pod: &m,
                local: ("g1", &b),
                peer: ("g1", &a),
                kind: Some("grpc"),
            };
            topologies.push(topology(&m, vec![here.json()]));
            topologies.push(topology(&k, vec![there.json()]));
        }
    }
    serde_json::json!({
        "name": name,
        "inter_node_link": "grpc",
        // Ranges wide enough for hundreds of pods.
        "nodes": [{"name": "n1", "pod_range": "10.244.16.0/22"}, {"name": "n2", "pod_range": "10.244.20.0/22"}],
        "pods": pod_list,
        "topologies": topologies,
    })
}

/// Waits until node `ns`'s daemon reports `n` gRPC wire ends up.
fn wait_wires_up(ns: &str, n: usize, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut up = 0.0;
    while Instant::now() < deadline {
        if let Ok(page) = metrics_in(ns) {
            up = metric_sum(&page, "weft_wire_up", &["kind=\"grpc\""]);
            if up >= n as f64 {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(format!("only {up} of {n} gRPC wires up on {ns} after {within:?}"))
}

/// Pings across wires `0..n` from node 1's side, a few at a time; returns the failures.
fn ping_wires(lab: &weft_lab::Lab, n: usize) -> usize {
    let workers = 4;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    (w..n)
                        .step_by(workers)
                        .filter(|&i| {
                            !wait_reachable(&lab.pod_ns(&format!("m{i}")), &pair(i).1, Duration::from_secs(10))
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(n)).sum()
    })
}

/// Runs the memory benchmark.
pub fn run_memory(opts: &MemoryOptions) -> Result<MemoryReport, String> {
    for (what, p) in [("weft", &opts.weft), ("weftd", &opts.weftd)] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    if opts.wires > opts.pods {
        return Err(format!(
            "{} wires need at least as many pods ({})",
            opts.wires, opts.pods
        ));
    }
    let labels = [
        "idle".to_string(),
        format!("{} pods", opts.pods),
        format!("{} pods + {} gRPC wires", opts.pods, opts.wires),
    ];
    let mut taken: Vec<(Vec<u64>, Vec<u64>)> = vec![Default::default(); labels.len()];
    let mut failures = 0;
    let settle = Duration::from_secs(1);
    for round in 0..opts.rounds {
        let name = format!("wb{}m{round}", std::process::id());
        let dir = opts.work_dir.join(&name);
        let mut lab = LabGuard::up(&dir, &spec(&name, opts, false, false), &opts.weftd, &opts.weft)?;
        let mut record = |state: usize, pid: u32| -> Result<(), String> {
            std::thread::sleep(settle);
            let (rss, hwm) = sample(pid)?;
            taken[state].0.push(rss);
            taken[state].1.push(hwm);
            Ok(())
        };
        record(0, lab_pid(&lab)?)?;
        lab.update(&spec(&name, opts, true, false))?;
        record(1, lab_pid(&lab)?)?;
        lab.update(&spec(&name, opts, true, true))?;
        let n1 = lab.lab.node_ns("n1");
        wait_wires_up(&n1, opts.wires, Duration::from_secs(30 + opts.wires as u64 / 2))?;
        failures += ping_wires(&lab.lab, opts.wires);
        record(2, lab_pid(&lab)?)?;
        drop(lab);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let states = labels
        .iter()
        .zip(taken)
        .enumerate()
        .map(|(i, (label, (rss, hwm)))| {
            let mib = |v: &[u64]| median(&v.iter().map(|&k| k as f64 / 1024.0).collect::<Vec<_>>());
            let rss_mib = mib(&rss);
            MemoryState {
                state: label.clone(),
                pods: if i == 0 { 0 } else { opts.pods },
                wires: if i == 2 { opts.wires } else { 0 },
                hwm_mib: mib(&hwm),
                rss_kib: rss,
                hwm_kib: hwm,
                rss_mib,
                rss_over_target: rss_mib / MEMORY_TARGET_MIB,
            }
        })
        .collect();
    Ok(MemoryReport {
        pods: opts.pods,
        wires: opts.wires,
        rounds: opts.rounds,
        target_mib: MEMORY_TARGET_MIB,
        states,
        wire_ping_failures: failures,
    })
}

fn lab_pid(lab: &LabGuard) -> Result<u32, String> {
    lab.lab
        .daemon_pid("n1")
        .ok_or_else(|| "node n1's weftd is not running".to_string())
}

impl MemoryReport {
    /// The report as a markdown table.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "weftd resident memory on node 1 of a two-node lab, median of {} round(s) (pods attached through the plugin, gRPC wires to node 2, each pinged across once); no reference daemon, so against the target of {:.0} MiB\n\n",
            self.rounds, self.target_mib
        );
        let mut t = Table::new()
            .text("node 1 holds")
            .num("VmRSS (MiB)")
            .num("VmHWM (MiB)")
            .num("VmRSS / target");
        for s in &self.states {
            t.row([
                s.state.clone(),
                format!("{:.1}", s.rss_mib),
                format!("{:.1}", s.hwm_mib),
                format!("{:.2}", s.rss_over_target),
            ]);
        }
        out.push_str(&t.to_string());
        if let Some(last) = self.states.last() {
            out.push_str(&format!(
                "\ntarget: VmRSS <= {:.0} MiB with {}: {:.1} MiB, {}\n",
                self.target_mib,
                last.state,
                last.rss_mib,
                met(last.rss_mib <= self.target_mib)
            ));
        }
        out.push_str(&format!(
            "wires that did not answer a ping: {}\n",
            self.wire_ping_failures
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_addresses_do_not_overlap() {
        assert_eq!(pair(0), ("10.250.0.1".into(), "10.250.0.2".into()));
        assert_eq!(pair(64), ("10.250.1.1".into(), "10.250.1.2".into()));
        assert_eq!(pair(99), ("10.250.1.141".into(), "10.250.1.142".into()));
    }
}
