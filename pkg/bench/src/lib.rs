//! Benchmarks of weft beside what it is compared with. Claims count only when
//! measured beside the other thing in the same run on the same machine: rounds
//! alternate which side goes first, so drift hits both, and results are reported as
//! medians and ratios.
//!
//! The CNI benchmark (`cni`) drives the plugins exactly as a runtime does, weft against
//! Debian's reference `ptp` + `host-local`, and weft with OTLP trace export against
//! weft without it (the cost of observability).
//!
//! Three more measure weft against its targets beside the nearest reference: the
//! plugin's exec cost beside the Go plugins' (`exec`), weftd's resident memory as a node
//! fills with pods and gRPC wires (`memory`, against the target: no reference daemon
//! exists), and the throughput of each kind of wire beside a kernel link of that kind
//! (`wires`, the gRPC wire in plaintext and with mTLS). `load` attaches a thousand pods to one node and then removes them, and
//! sets the last calls beside the first (against the target: no reference keeps node
//! state that grows). `podnet` sets pod-to-pod traffic between nodes through weft's
//! routing (direct and VXLAN) beside the same labs routed by hand with the kernel's
//! own tools. `policy` measures network policy against its targets: traffic with
//! policies beside without, ADD with a cluster's policies in the cache beside without,
//! how fast a change reaches every node, how soon a new pod reaches and is reached by
//! pods of other nodes, and one node's cost as the cluster grows.
//! `nodes` simulates clusters of up to 5,000 Node objects against one weftd.
//! `smoke` runs everything small, for CI.

mod cni;
mod exec;
mod flow_overhead;
mod flows;
mod fqdn;
mod hostports;
mod load;
mod memory;
mod nodes;
mod otlp;
mod podnet;
mod policy;
mod simnode;
mod smoke;
mod stats;
mod table;
mod traffic;
mod udp;
mod util;
mod wires;

use std::path::PathBuf;
use std::time::Duration;

pub use cni::{Comparison, NSENTER, Options, Report, Samples, Summary, Target, run};
pub use exec::{EXEC_TARGET_P50_MS, ExecOptions, ExecReport, ExecSide, run_exec};
pub use flow_overhead::{
    FLOW_CONNS_TARGET, FLOW_TCP_TARGET, OverheadOptions, OverheadReport, OverheadSide, run_flow_overhead,
};
pub use flows::{FLOW_EVENTS_TARGET, FLOW_MEMORY_TARGET_MIB, FlowsOptions, FlowsReport, run_flows};
pub use fqdn::{FQDN_LOOKUP_TARGET, FQDN_TCP_TARGET, FqdnOptions, FqdnReport, FqdnScale, FqdnSide, run_fqdn};
pub use hostports::{HostportOptions, HostportReport, around, run_hostports};
pub use load::{
    CallFailure, LOAD_TARGET_RATIO, LOAD_WINDOW, LoadCommand, LoadOptions, LoadReport, LoadWindow, run_load,
};
pub use memory::{MEMORY_TARGET_MIB, MemoryOptions, MemoryReport, MemoryState, run_memory};
pub use nodes::{NODE_SIZES, NodeScaleOptions, NodeScalePoint, NodeScaleReport, run_nodes, sizes_from_env};
pub use podnet::{POD_NETWORK_TARGET_RATIO, PodMode, PodModeRatio, PodNetReport, PodPath, PodPathResult, run_podnet};
pub use policy::{
    ADD_TARGET_RATIO, AddPath, AddReport, AddSample, AddSide, BatchCounts, CONVERGE_TARGET_MS, Change, ChangeKind,
    ClusterSize, ClusterSource, ConvergeReport, ConvergeRun, DATA_PEERS, DATA_POLICIES, DATA_TARGET_RATIO,
    DataPathReport, FIRST_POLICY_PORT, LoadAvg, NO_ANNOUNCE_ENV, POLICY_PARTS, PolicyOptions, PolicyReport, Quantiles,
    REACH_PODS, REACH_PORT, REACH_PROBE_LIMIT, REACH_TARGET_MS, ReachPod, ReachReport, ReachRun, SCALE_ARRIVALS,
    SCALE_CHURN, SCALE_KERNEL_TARGET_MS, SCALE_LOCAL_PODS, SCALE_RSS_TARGET_MIB, ScalePoint, ScaleReport, TableSize,
    TrafficSide, run_policy, scaled,
};
pub use smoke::{SmokeOptions, SmokeReport, run_smoke};
pub use stats::{Percentiles, median};
pub use udp::Flood;
pub use wires::{
    GRPC_FPS_TARGET, GRPC_MTLS_TCP_TARGET_RATIO, GRPC_TCP_TARGET_RATIO, Wire, WireRatio, WireResult, WiresReport,
    run_wires,
};

/// What to run for a traffic comparison between namespaces (`wires`, `pod-network`).
#[derive(Debug, Clone)]
pub struct TrafficOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Passes over every path compared.
    pub rounds: usize,
    /// Seconds of each iperf3 TCP run.
    pub tcp_seconds: u64,
    /// Seconds of each UDP flood.
    pub udp_seconds: f64,
    /// Scratch directory (lab files and state).
    pub work_dir: PathBuf,
}

/// A lab error as the benchmarks report errors.
fn lab(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// How long a benchmark's weftd gets to finish its teardowns after SIGTERM.
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(60);

/// A duration in milliseconds.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
