//! Host ports under load: ADD latency of a pod with one host port as the node's count
//! of mappings grows, weft beside the reference `ptp` + `portmap` chain (libcni's
//! order: ptp ADD, then portmap ADD with ptp's result as `prevResult` and the mapping in
//! `runtimeConfig.portMappings`). The reference rewrites iptables chains per pod, so its
//! cost grows with the mappings; weft adds one map element.

use std::path::PathBuf;

use serde::Serialize;
use weft_harness::{CniExec, CniVars, DaemonConfig, NamedNetns, NodeDaemon};

use crate::table::Table;
use crate::{Percentiles, lab, ms};

/// What to run.
#[derive(Debug, Clone)]
pub struct HostportOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Directory of the reference plugins (ptp, host-local, portmap).
    pub reference_dir: PathBuf,
    /// Pods (each with one host port) attached through weft.
    pub weft_pods: usize,
    /// Pods attached through the reference chain.
    pub reference_pods: usize,
    /// Scratch directory.
    pub work_dir: PathBuf,
}

/// ADD latency (ms) of each pod, in order: the i-th had i mappings on the node before it.
#[derive(Debug, Clone, Serialize)]
pub struct HostportReport {
    /// weft.
    pub weft_add_ms: Vec<f64>,
    /// weft with the same pods but no host ports: what the pods alone cost as they
    /// accumulate, to tell it from what the host ports cost.
    pub weft_no_ports_add_ms: Vec<f64>,
    /// The reference chain (ptp + portmap, both execs).
    pub reference_add_ms: Vec<f64>,
    /// Failed calls, weft and reference.
    pub errors: (usize, usize),
}

/// Latency percentiles of the pods that found about `existing` mappings on the node:
/// the window of up to 21 pods around that count.
pub fn around(samples: &[f64], existing: usize) -> Option<Percentiles> {
    let lo = existing.saturating_sub(10);
    if lo >= samples.len() {
        return None;
    }
    let hi = (existing + 11).min(samples.len());
    Some(Percentiles::of(&samples[lo..hi]))
}

fn args(i: usize, tag: &str) -> (String, String) {
    let cid = format!("{tag}-c{i}");
    let a = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{i};K8S_POD_INFRA_CONTAINER_ID={cid}");
    (cid, a)
}

fn mapping(i: usize) -> serde_json::Value {
    serde_json::json!([{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}])
}

fn weft_side(opts: &HostportOptions, with_ports: bool, out: &mut Vec<f64>) -> Result<usize, String> {
    let tag = format!("wbh{}-{}", std::process::id(), if with_ports { "w" } else { "n" });
    let dir = opts.work_dir.join(&tag);
    let node = NamedNetns::create(&format!("{tag}-node")).map_err(lab)?;
    let mut daemon = NodeDaemon::start(&node, DaemonConfig::under(&opts.weftd, &dir, "bench")).map_err(lab)?;
    let exec = CniExec::new(&opts.weft);
    let mut errors = 0;
    let mut pods = Vec::with_capacity(opts.weft_pods);
    for i in 0..opts.weft_pods {
        let pod = NamedNetns::create(&format!("{tag}-p{i}")).map_err(lab)?;
        let mut conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "bench", "type": "weft", "socket": daemon.config().socket,
            "ranges": ["10.244.0.0/16"], "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": mapping(i)},
        });
        if !with_ports {
            conf["runtimeConfig"] = serde_json::json!({});
        }
        let (cid, a) = args(i, &tag);
        let o = exec
            .call(
                &node,
                &CniVars::add_eth0(&cid, &pod.path(), &a),
                conf.to_string().as_bytes(),
            )
            .map_err(lab)?;
        if o.ok() {
            out.push(ms(o.elapsed));
        } else {
            errors += 1;
        }
        pods.push(pod);
    }
    daemon.stop(crate::STOP_LIMIT);
    drop(pods);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(errors)
}

fn reference_side(opts: &HostportOptions, out: &mut Vec<f64>) -> Result<usize, String> {
    let tag = format!("wbh{}-r", std::process::id());
    let dir = opts.work_dir.join(&tag);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let node = NamedNetns::create(&format!("{tag}-node")).map_err(lab)?;
    let ptp = CniExec::new(&opts.reference_dir.join("ptp"));
    let portmap = CniExec::new(&opts.reference_dir.join("portmap"));
    let mut errors = 0;
    let mut pods = Vec::with_capacity(opts.reference_pods);
    for i in 0..opts.reference_pods {
        let pod = NamedNetns::create(&format!("{tag}-p{i}")).map_err(lab)?;
        let (cid, a) = args(i, &tag);
        let ptp_conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "bench", "type": "ptp", "ipMasq": false, "mtu": 1500,
            "ipam": {"type": "host-local", "dataDir": dir.join("ipam"),
                     "ranges": [[{"subnet": "10.244.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]},
        });
        let first = ptp
            .call(
                &node,
                &CniVars::add_eth0(&cid, &pod.path(), &a),
                ptp_conf.to_string().as_bytes(),
            )
            .map_err(lab)?;
        if !first.ok() {
            errors += 1;
            pods.push(pod);
            continue;
        }
        let prev: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap_or_default();
        let pm_conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "bench", "type": "portmap",
            "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": mapping(i)},
            "prevResult": prev,
        });
        let second = portmap
            .call(
                &node,
                &CniVars::add_eth0(&cid, &pod.path(), &a),
                pm_conf.to_string().as_bytes(),
            )
            .map_err(lab)?;
        if second.ok() {
            out.push(ms(first.elapsed + second.elapsed));
        } else {
            errors += 1;
        }
        pods.push(pod);
    }
    // Deleting the node namespace takes the veths and every iptables chain with it.
    drop(pods);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(errors)
}

/// Runs the host port benchmark: the reference first (it is the slow one), then weft.
pub fn run_hostports(opts: &HostportOptions) -> Result<HostportReport, String> {
    for (what, p) in [
        ("weft", opts.weft.clone()),
        ("weftd", opts.weftd.clone()),
        ("ptp", opts.reference_dir.join("ptp")),
        ("portmap", opts.reference_dir.join("portmap")),
    ] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    let (mut w, mut n, mut r) = (Vec::new(), Vec::new(), Vec::new());
    let re = reference_side(opts, &mut r)?;
    let we = weft_side(opts, true, &mut w)? + weft_side(opts, false, &mut n)?;
    Ok(HostportReport {
        weft_add_ms: w,
        weft_no_ports_add_ms: n,
        reference_add_ms: r,
        errors: (we, re),
    })
}

impl HostportReport {
    /// The report as a markdown table: ADD latency with 1, 400 and 1,000 mappings on
    /// the node (percentiles over the 21 pods around each count).
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "CNI ADD of a pod with one host port, by host ports already on the node; weft {} pods, reference (ptp + portmap) {} pods\n\n",
            self.weft_add_ms.len(),
            self.reference_add_ms.len()
        );
        let mut t = Table::new()
            .num("existing mappings")
            .num("weft p50 (ms)")
            .num("weft p90 (ms)")
            .num("weft without ports p50 (ms)")
            .num("reference p50 (ms)")
            .num("reference p90 (ms)")
            .num("weft / reference (p50)");
        for n in [1usize, 100, 400, 1000] {
            let w = around(&self.weft_add_ms, n);
            let np = around(&self.weft_no_ports_add_ms, n);
            let r = around(&self.reference_add_ms, n);
            if w.is_none() && r.is_none() {
                continue;
            }
            let f =
                |p: Option<Percentiles>, q: fn(&Percentiles) -> f64| p.map_or("-".into(), |p| format!("{:.2}", q(&p)));
            let ratio = match (w, r) {
                (Some(w), Some(r)) if r.p50 > 0.0 => format!("{:.3}", w.p50 / r.p50),
                _ => "-".into(),
            };
            t.row([
                n.to_string(),
                f(w, |p| p.p50),
                f(w, |p| p.p90),
                f(np, |p| p.p50),
                f(r, |p| p.p50),
                f(r, |p| p.p90),
                ratio,
            ]);
        }
        out.push_str(&t.to_string());
        out.push_str(&format!(
            "\nfailed calls: weft {}, reference {}\n",
            self.errors.0, self.errors.1
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_around_a_count() {
        let v: Vec<f64> = (0..100).map(f64::from).collect();
        let p = around(&v, 50).unwrap();
        assert_eq!(p.n, 21);
        assert_eq!(p.p50, 50.0);
        assert_eq!(around(&v, 1).unwrap().n, 12);
        assert_eq!(
            around(&v, 100).unwrap().n,
            10,
            "the last pods, when the count is the total"
        );
        assert!(around(&v, 110).is_none());
    }
}
