//! Every comparison at a size that runs in well under a minute, so CI exercises all of
//! the benchmark code (namespaces, labs, iperf3, the floods, the reports) and it
//! cannot rot between the runs that measure. Nothing about the timings is asserted.

use std::path::PathBuf;

use serde::Serialize;

use crate::{
    Comparison, ExecOptions, ExecReport, HostportOptions, HostportReport, LoadOptions, LoadReport, MemoryOptions,
    MemoryReport, NodeScaleOptions, NodeScaleReport, Options, PodNetReport, PolicyOptions, PolicyReport, Report,
    WiresReport,
};

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct SmokeOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Directory of the reference plugins.
    pub reference_dir: PathBuf,
    /// Scratch directory.
    pub work_dir: PathBuf,
}

/// Every comparison, tiny.
#[derive(Debug, Clone, Serialize)]
pub struct SmokeReport {
    /// weft beside ptp + host-local.
    pub reference: Report,
    /// weft with OTLP export beside weft without.
    pub otlp: Report,
    /// weft with its cluster features on and idle beside weft with them off.
    pub features: Report,
    /// Host ports beside ptp + portmap.
    pub hostports: HostportReport,
    /// Exec cost beside the Go plugins.
    pub exec: ExecReport,
    /// weftd's RSS.
    pub memory: MemoryReport,
    /// Wire throughput beside kernel links.
    pub wires: WiresReport,
    /// Pods attached to one node and removed, the last calls beside the first.
    pub load: LoadReport,
    /// Pod-to-pod traffic between nodes, weft's routing beside hand-made routing.
    pub pod_network: PodNetReport,
    /// Network policy: traffic, ADD, convergence and scale, each tiny.
    pub policy: PolicyReport,
    /// One weftd reading a few dozen Node objects.
    pub nodes: NodeScaleReport,
    /// Flow records replayed through the tracker, tiny.
    pub flows: crate::FlowsReport,
    /// Egress by domain name, tiny.
    pub fqdn: crate::FqdnReport,
}

/// Runs every comparison once, small.
pub fn run_smoke(o: &SmokeOptions) -> Result<SmokeReport, String> {
    let cni = |comparison| Options {
        weft: o.weft.clone(),
        weftd: o.weftd.clone(),
        reference_dir: o.reference_dir.clone(),
        pods: 3,
        workers: 1,
        rounds: 1,
        work_dir: o.work_dir.clone(),
        // The reference comparison runs as a runtime in another namespace would, so the
        // nsenter path is exercised too.
        nsenter: comparison == Comparison::Reference,
        comparison,
    };
    let reference = crate::run(&cni(Comparison::Reference)).map_err(|e| format!("reference: {e}"))?;
    let otlp = crate::run(&cni(Comparison::Otlp)).map_err(|e| format!("otlp: {e}"))?;
    let features = crate::run(&cni(Comparison::Features)).map_err(|e| format!("features: {e}"))?;
    let hostports = crate::run_hostports(&HostportOptions {
        weft: o.weft.clone(),
        weftd: o.weftd.clone(),
        reference_dir: o.reference_dir.clone(),
        weft_pods: 3,
        reference_pods: 3,
        work_dir: o.work_dir.clone(),
    })
    .map_err(|e| format!("hostports: {e}"))?;
    let exec = crate::run_exec(&ExecOptions {
        weft: o.weft.clone(),
        reference_dir: o.reference_dir.clone(),
        execs: 20,
    })
    .map_err(|e| format!("exec: {e}"))?;
    let memory = crate::run_memory(&MemoryOptions {
        weft: o.weft.clone(),
        weftd: o.weftd.clone(),
        pods: 4,
        wires: 2,
        rounds: 1,
        work_dir: o.work_dir.clone(),
    })
    .map_err(|e| format!("memory: {e}"))?;
    let traffic = crate::TrafficOptions {
        weft: o.weft.clone(),
        weftd: o.weftd.clone(),
        rounds: 1,
        tcp_seconds: 1,
        udp_seconds: 0.5,
        work_dir: o.work_dir.clone(),
    };
    let wires = crate::run_wires(&traffic).map_err(|e| format!("wires: {e}"))?;
    // Two workers, so the smoke run goes through the concurrent path too.
    let load = crate::run_load(&LoadOptions {
        weft: o.weft.clone(),
        weftd: o.weftd.clone(),
        pods: 20,
        workers: 2,
        work_dir: o.work_dir.clone(),
    })
    .map_err(|e| format!("load: {e}"))?;
    let pod_network = crate::run_podnet(&traffic).map_err(|e| format!("pod network: {e}"))?;
    let policy = crate::run_policy(&PolicyOptions::smoke(
        o.weft.clone(),
        o.weftd.clone(),
        o.work_dir.clone(),
    ))
    .map_err(|e| format!("policy: {e}"))?;
    let nodes = crate::run_nodes(&NodeScaleOptions {
        weftd: o.weftd.clone(),
        sizes: vec![30],
        work_dir: o.work_dir.clone(),
    })
    .map_err(|e| format!("nodes: {e}"))?;
    let flows = crate::run_flows(&crate::FlowsOptions {
        overhead: Some(crate::OverheadOptions {
            weft: o.weft.clone(),
            weftd: o.weftd.clone(),
            work_dir: o.work_dir.clone(),
            rounds: 1,
            tcp_seconds: 1,
            conn_seconds: 0.5,
        }),
        ..crate::FlowsOptions::smoke()
    })
    .map_err(|e| format!("flows: {e}"))?;
    let fqdn = crate::run_fqdn(&crate::FqdnOptions {
        weft: o.weft.clone(),
        weftd: o.weftd.clone(),
        work_dir: o.work_dir.clone(),
        rounds: 1,
        lookups: 50,
        tcp_seconds: 1,
        scale_addresses: 2000,
        scale_names: 200,
    })
    .map_err(|e| format!("fqdn: {e}"))?;
    Ok(SmokeReport {
        flows,
        fqdn,
        reference,
        otlp,
        features,
        hostports,
        exec,
        memory,
        wires,
        load,
        pod_network,
        policy,
        nodes,
    })
}

impl SmokeReport {
    /// Every report's markdown, one after the other.
    pub fn markdown(&self) -> String {
        [
            self.reference.markdown(),
            self.otlp.markdown(),
            self.features.markdown(),
            self.hostports.markdown(),
            self.exec.markdown(),
            self.memory.markdown(),
            self.wires.markdown(),
            self.load.markdown(),
            self.pod_network.markdown(),
            self.policy.markdown(),
            self.nodes.markdown(),
            self.flows.markdown(),
            self.fqdn.markdown(),
        ]
        .join("\n")
    }
}
