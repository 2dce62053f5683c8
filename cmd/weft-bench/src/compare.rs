//! The comparisons `weft-bench` runs and the flags that choose them.

use std::path::PathBuf;

use anyhow::Context;

/// Options of `weft-bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Pods attached and detached per round (default 100); with `--compare load`,
    /// pods attached to the one node and then removed (default 1000); with `--compare
    /// policy`, ADDs per round and side (default 100).
    #[arg(long)]
    pods: Option<usize>,
    /// Concurrent workers issuing calls.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Rounds per plugin (alternating which goes first); with `--compare memory` fresh
    /// labs, with `--compare wires` passes over every wire, with `--compare
    /// pod-network` passes over every path, with `--compare policy` data path passes and
    /// the ADD rounds per side that are timed (one watched round per side comes on top).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Directory of the reference plugins.
    #[arg(long, default_value = "/usr/lib/cni")]
    reference_dir: PathBuf,
    /// Directory of weft and weftd (default: beside weft-bench).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// What weft is compared with: the reference plugins, or itself without OTLP
    /// trace export (with export on, spans go to a receiver inside the node), or the
    /// reference ptp + portmap chain with host ports; or the plugin's exec cost beside
    /// the Go plugins', weftd's memory against its target, wire throughput beside
    /// kernel links; or itself, its last calls beside its first as a node fills up
    /// (`load`); or pod-to-pod traffic between nodes through its routing beside
    /// hand-made kernel routes and VXLAN (`pod-network`); or with network policy beside
    /// without it (`policy`).
    #[arg(long, value_enum, default_value = "reference")]
    compare: Compare,
    /// With `--compare hostports`: pods attached through the reference chain (its
    /// cost grows with every mapping).
    #[arg(long, default_value_t = 400)]
    reference_pods: usize,
    /// With `--compare exec`: timed execs per binary.
    #[arg(long, default_value_t = 300)]
    execs: usize,
    /// With `--compare memory`: pods on the measured node.
    #[arg(long, default_value_t = 250)]
    memory_pods: usize,
    /// With `--compare memory`: gRPC wires from the measured node to the other.
    #[arg(long, default_value_t = 100)]
    grpc_wires: usize,
    /// With `--compare wires` or `pod-network`: seconds of each iperf3 TCP run.
    #[arg(long, default_value_t = 5)]
    tcp_seconds: u64,
    /// With `--compare wires` or `pod-network`: seconds of each 64-byte UDP flood.
    #[arg(long, default_value_t = 3.0)]
    udp_seconds: f64,
    /// With `--compare reference` or `otlp`: exec every plugin, weft's and the
    /// reference's alike, through `nsenter --net` into the node namespace, as a runtime
    /// in another namespace does (one more exec per call on both sides).
    #[arg(long)]
    nsenter: bool,
    /// Every comparison, tiny and once (for CI; timings mean nothing); ignores the
    /// other options.
    #[arg(long)]
    smoke: bool,
}

/// What `weft-bench` compares weft with.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Compare {
    /// Debian's ptp + host-local.
    Reference,
    /// weft without OTLP export (weft runs with export on).
    Otlp,
    /// weft with no cluster source (its policy engine, flow records, node network and
    /// wire engine off), beside weft with them on and idle (a topology directory with
    /// the node alone, no policy): what those features cost an ADD that uses none.
    Features,
    /// ptp + portmap, each pod with one host port, as mappings accumulate.
    Hostports,
    /// CNI_COMMAND=VERSION of weft beside host-local and ptp: the cost of an exec.
    Exec,
    /// weftd's RSS idle, with pods, with pods and gRPC wires (against the target).
    Memory,
    /// TCP and 64-byte UDP across weft's veth, VXLAN and gRPC wires beside kernel veth
    /// and VXLAN.
    Wires,
    /// `--pods` pods attached to one node, then removed: the last 100 ADDs and DELs
    /// beside the first 100 (against the target), weftd's RSS, failed calls.
    Load,
    /// TCP and 64-byte UDP from a pod on one node to a pod on another over eth0,
    /// through weft's direct routes and its VXLAN device beside the same labs routed
    /// by hand (`ip route`, `ip link add ... type vxlan`).
    PodNetwork,
    /// Network policy against its targets: pod-to-pod TCP and 64-byte UDP with 100
    /// NetworkPolicies (1,000 peers) beside none; ADD with 1,000 policies and 5,000 pods
    /// in the cache beside none; a change to every node of a three-node lab in step; a
    /// new pod's first echo each way from its ADD's answer, with and without the nodes
    /// announcing new pods; one weftd as the cluster grows to 10,000 pods (start to
    /// table programmed, RSS, each remote pod's arrival and label change to the kernel
    /// and its batch). `WEFT_BENCH_POLICY_PARTS=data,add,converge,reach,scale` runs some
    /// of them.
    Policy,
    /// One weftd reading 100, 1,000 and 5,000 Node objects from the in-process fake
    /// API server (`WEFT_BENCH_NODE_SIZES=...` for others): start to kernel programmed,
    /// RSS, one node's change to the kernel and the kernel requests it costs.
    Nodes,
    /// Flow records: conntrack events decoded, attributed (policy's view of 1,000 pods
    /// and 100 policies) and aggregated per second on one core, replaying 100,000 flows
    /// framed as the kernel frames them; the RSS of 100,000 flows in the ring and an
    /// hour of aggregates for 1,000 pairs; and in two labs side by side, flows on over
    /// off: pod-to-pod TCP and new TCP connections per second across nodes.
    Flows,
    /// Egress by domain name: DNS lookups from a pod (p50, p99) and TCP to the name's
    /// address with a domainNames policy beside none (two labs with the lab's DNS), and
    /// one answer's set write into 1,000 and 100,000 learnt addresses, the learner's
    /// table of 10,000 names in memory.
    Fqdn,
}

/// The options of a traffic comparison (`wires`, `pod-network`) from the flags.
fn traffic(
    args: &BenchArgs,
    weft: std::path::PathBuf,
    weftd: std::path::PathBuf,
    work_dir: std::path::PathBuf,
) -> weft_bench::TrafficOptions {
    weft_bench::TrafficOptions {
        weft,
        weftd,
        rounds: args.rounds,
        tcp_seconds: args.tcp_seconds,
        udp_seconds: args.udp_seconds,
        work_dir,
    }
}

fn print<T: serde::Serialize>(report: &T, markdown: impl FnOnce(&T) -> String, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", markdown(report));
    }
    Ok(())
}

/// Removes the scratch directory however the run ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the benchmark and prints the report.
pub fn run(args: BenchArgs, json: bool) -> anyhow::Result<()> {
    let bin_dir = match args.bin_dir.clone() {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .context("weft-bench's directory")?
            .to_path_buf(),
    };
    let work = WorkDir(std::env::temp_dir().join(format!("weft-bench-{}", std::process::id())));
    let work_dir = work.0.clone();
    let (weft, weftd) = (bin_dir.join("weft"), bin_dir.join("weftd"));
    let fail = |e: String| anyhow::anyhow!(e);
    let pods = args.pods.unwrap_or(match args.compare {
        Compare::Load => 1000,
        _ => 100,
    });
    if args.smoke {
        let report = weft_bench::run_smoke(&weft_bench::SmokeOptions {
            weft,
            weftd,
            reference_dir: args.reference_dir,
            work_dir,
        })
        .map_err(fail)?;
        return print(&report, weft_bench::SmokeReport::markdown, json);
    }
    let comparison = match args.compare {
        Compare::Hostports => {
            let opts = weft_bench::HostportOptions {
                weft,
                weftd,
                reference_dir: args.reference_dir,
                weft_pods: pods,
                reference_pods: args.reference_pods,
                work_dir,
            };
            let report = weft_bench::run_hostports(&opts).map_err(fail)?;
            return print(&report, weft_bench::HostportReport::markdown, json);
        }
        Compare::Exec => {
            let opts = weft_bench::ExecOptions {
                weft,
                reference_dir: args.reference_dir,
                execs: args.execs,
            };
            let report = weft_bench::run_exec(&opts).map_err(fail)?;
            return print(&report, weft_bench::ExecReport::markdown, json);
        }
        Compare::Memory => {
            let opts = weft_bench::MemoryOptions {
                weft,
                weftd,
                pods: args.memory_pods,
                wires: args.grpc_wires,
                rounds: args.rounds,
                work_dir,
            };
            let report = weft_bench::run_memory(&opts).map_err(fail)?;
            return print(&report, weft_bench::MemoryReport::markdown, json);
        }
        Compare::Wires => {
            let report = weft_bench::run_wires(&traffic(&args, weft, weftd, work_dir)).map_err(fail)?;
            return print(&report, weft_bench::WiresReport::markdown, json);
        }
        Compare::Load => {
            let opts = weft_bench::LoadOptions {
                weft,
                weftd,
                pods,
                workers: args.workers,
                work_dir,
            };
            let report = weft_bench::run_load(&opts).map_err(fail)?;
            return print(&report, weft_bench::LoadReport::markdown, json);
        }
        Compare::PodNetwork => {
            let report = weft_bench::run_podnet(&traffic(&args, weft, weftd, work_dir)).map_err(fail)?;
            return print(&report, weft_bench::PodNetReport::markdown, json);
        }
        Compare::Policy => {
            let mut opts = weft_bench::PolicyOptions::issue(weft, weftd, work_dir, args.rounds, pods);
            if std::env::var_os("WEFT_BENCH_POLICY_SIZES").is_none() {
                opts.tcp_seconds = args.tcp_seconds;
                opts.udp_seconds = args.udp_seconds;
            }
            let report = weft_bench::run_policy(&opts).map_err(fail)?;
            return print(&report, weft_bench::PolicyReport::markdown, json);
        }
        Compare::Nodes => {
            let opts = weft_bench::NodeScaleOptions {
                weftd,
                sizes: weft_bench::sizes_from_env().map_err(fail)?,
                work_dir,
            };
            let report = weft_bench::run_nodes(&opts).map_err(fail)?;
            return print(&report, weft_bench::NodeScaleReport::markdown, json);
        }
        Compare::Flows => {
            let mut opts = weft_bench::FlowsOptions::issue(args.rounds);
            opts.overhead = Some(weft_bench::OverheadOptions {
                weft,
                weftd,
                work_dir,
                rounds: args.rounds,
                tcp_seconds: args.tcp_seconds,
                conn_seconds: 3.0,
            });
            let report = weft_bench::run_flows(&opts).map_err(fail)?;
            return print(&report, weft_bench::FlowsReport::markdown, json);
        }
        Compare::Fqdn => {
            let opts = weft_bench::FqdnOptions::issue(weft, weftd, work_dir, args.rounds, args.tcp_seconds);
            let report = weft_bench::run_fqdn(&opts).map_err(fail)?;
            return print(&report, weft_bench::FqdnReport::markdown, json);
        }
        Compare::Reference => weft_bench::Comparison::Reference,
        Compare::Otlp => weft_bench::Comparison::Otlp,
        Compare::Features => weft_bench::Comparison::Features,
    };
    let opts = weft_bench::Options {
        weft,
        weftd,
        reference_dir: args.reference_dir,
        pods,
        workers: args.workers,
        rounds: args.rounds,
        work_dir,
        comparison,
        nsenter: args.nsenter,
    };
    let report = weft_bench::run(&opts).map_err(fail)?;
    print(&report, weft_bench::Report::markdown, json)
}
