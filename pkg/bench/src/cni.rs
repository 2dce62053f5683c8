//! The CNI benchmark: the plugins driven exactly as a runtime drives them (a process per
//! call, config on stdin), inside namespaces it creates and removes: a node namespace
//! per side and round (weftd runs inside it), and one namespace per pod. Two
//! comparisons: weft against Debian's reference `ptp` + `host-local`, and weft with
//! OTLP trace export against weft without it (the cost of observability).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use weft_harness::{CniExec, CniVars, DaemonConfig, NamedNetns, NodeDaemon};

use crate::load::{Snapshot, mean_between};
use crate::table::Table;
use crate::util::turns;
use crate::{Percentiles, STOP_LIMIT, lab, median, ms, otlp};

/// What is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// weft against the reference ptp + host-local.
    Reference,
    /// weft exporting traces over OTLP against weft without export.
    Otlp,
    /// weft on a node whose cluster features are on but idle (a cluster source with
    /// this node alone and no policy: the policy engine, flow records, the node
    /// network and the wire engine all running) against weft with them off (no
    /// source): what those features cost an ADD that uses none of them.
    Features,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Directory of the reference plugins (ptp, host-local).
    pub reference_dir: PathBuf,
    /// Pods per round.
    pub pods: usize,
    /// Concurrent workers issuing calls.
    pub workers: usize,
    /// Rounds per side.
    pub rounds: usize,
    /// Scratch directory (daemon state, host-local leases).
    pub work_dir: PathBuf,
    /// What is compared.
    pub comparison: Comparison,
    /// Exec every plugin (both sides) through `nsenter --net` into the node's
    /// namespace, as a runtime in another namespace does, instead of entering it in the
    /// child before the exec.
    pub nsenter: bool,
}

/// Where `nsenter` (util-linux) is looked for.
pub const NSENTER: &str = "/usr/bin/nsenter";

/// One side of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// weft (plugin + weftd), no trace export.
    Weft,
    /// weft exporting every span over OTLP/gRPC to a receiver on the node.
    WeftOtlp,
    /// The reference ptp + host-local.
    Reference,
    /// weft with the cluster features on and idle ([`Comparison::Features`]).
    WeftIdle,
}

impl Target {
    fn label(self) -> &'static str {
        match self {
            Target::Weft => "weft",
            Target::WeftOtlp => "weft + OTLP",
            Target::Reference => "reference",
            Target::WeftIdle => "weft, features idle",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Target::Weft => "w",
            Target::WeftOtlp => "o",
            Target::Reference => "r",
            Target::WeftIdle => "i",
        }
    }
}

/// Raw measurements of one side over all rounds.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Samples {
    /// Latency of each ADD (ms).
    pub add_ms: Vec<f64>,
    /// Latency of each DEL (ms).
    pub del_ms: Vec<f64>,
    /// Wall time of each round's ADD phase (s).
    pub add_wall_s: Vec<f64>,
    /// Wall time of each round's DEL phase (s).
    pub del_wall_s: Vec<f64>,
    /// Wall time from the first DEL until every veth was gone, per round (s).
    pub teardown_wall_s: Vec<f64>,
    /// Failed calls.
    pub errors: usize,
    /// Spans the OTLP receiver got (OTLP side only).
    pub spans_exported: u64,
    /// weft sides: what weftd's histograms gained over the ADD phases, as (sum s,
    /// count) per phase of `weft_cni_phase_duration_seconds{command="ADD"}`, and under
    /// [`HANDLER`] the gRPC handler's whole time.
    pub add_inside: BTreeMap<String, (f64, f64)>,
}

/// The key of [`Samples::add_inside`] that holds weftd's whole time per ADD
/// (`grpc_server_handling_seconds{grpc_method="Add"}`): what the plugin's latency has
/// beyond it is the plugin process, its connection and the relay.
pub const HANDLER: &str = "whole gRPC handler";

/// Summary of one side.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Which side.
    pub target: Target,
    /// ADD latency percentiles (ms).
    pub add: Percentiles,
    /// DEL latency percentiles (ms).
    pub del: Percentiles,
    /// Median ADD-phase wall time (s).
    pub add_wall_s: f64,
    /// Median DEL-phase wall time (s).
    pub del_wall_s: f64,
    /// Median time until every veth was removed after the DEL phase began (s).
    pub teardown_wall_s: f64,
    /// Pods attached per second (median round).
    pub add_pods_per_s: f64,
    /// Failed calls.
    pub errors: usize,
    /// Spans the OTLP receiver got.
    pub spans_exported: u64,
    /// weft sides: mean time per ADD of each of weftd's phases, and of its whole
    /// handler under [`HANDLER`] (ms).
    pub add_inside_ms: BTreeMap<String, f64>,
}

/// The result of a benchmark run: side `a` (weft) against side `b`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Pods per round.
    pub pods: usize,
    /// Workers.
    pub workers: usize,
    /// Rounds.
    pub rounds: usize,
    /// Whether every plugin was exec'd through `nsenter`.
    pub nsenter: bool,
    /// The side measured.
    pub a: Summary,
    /// The side it is compared with.
    pub b: Summary,
    /// Raw samples, for anyone who wants to redo the statistics.
    pub samples: Vec<(Target, Samples)>,
}

impl Samples {
    fn summary(&self, target: Target, pods: usize) -> Summary {
        let add_wall = median(&self.add_wall_s);
        Summary {
            target,
            add: Percentiles::of(&self.add_ms),
            del: Percentiles::of(&self.del_ms),
            add_wall_s: add_wall,
            del_wall_s: median(&self.del_wall_s),
            teardown_wall_s: median(&self.teardown_wall_s),
            add_pods_per_s: if add_wall > 0.0 { pods as f64 / add_wall } else { 0.0 },
            errors: self.errors,
            spans_exported: self.spans_exported,
            add_inside_ms: self
                .add_inside
                .iter()
                .map(|(k, v)| (k.clone(), mean_between((0.0, 0.0), *v)))
                .collect(),
        }
    }
}

/// One call of a phase.
struct CallOutcome {
    pod: usize,
    ms: f64,
    ok: bool,
    stdout: Vec<u8>,
}

/// One phase (all ADDs, or all DELs) of a round.
struct Phase {
    wall: Duration,
    calls: Vec<CallOutcome>,
}

struct Round<'a> {
    opts: &'a Options,
    target: Target,
    tag: String,
}

impl Round<'_> {
    fn config(&self, dir: &Path, socket: &Path) -> Vec<u8> {
        let v = match self.target {
            Target::Weft | Target::WeftOtlp | Target::WeftIdle => serde_json::json!({
                "cniVersion": "1.0.0", "name": "bench", "type": "weft",
                "socket": socket, "ranges": ["10.244.0.0/16"], "mtu": 1500,
            }),
            Target::Reference => serde_json::json!({
                "cniVersion": "1.0.0", "name": "bench", "type": "ptp", "ipMasq": false, "mtu": 1500,
                "ipam": {"type": "host-local", "dataDir": dir.join("ipam"),
                         "ranges": [[{"subnet": "10.244.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]},
            }),
        };
        serde_json::to_vec(&v).expect("config serializes")
    }

    fn plugin(&self) -> PathBuf {
        match self.target {
            Target::Weft | Target::WeftOtlp | Target::WeftIdle => self.opts.weft.clone(),
            Target::Reference => self.opts.reference_dir.join("ptp"),
        }
    }

    /// Runs `op` over every pod (pod `i` gets `configs[i]`) with the configured number
    /// of workers, and returns the phase's wall time and each call's outcome.
    fn phase(&self, node: &NamedNetns, exec: &CniExec, op: &str, configs: &[Vec<u8>], pods: &[NamedNetns]) -> Phase {
        let workers = self.opts.workers.max(1);
        let start = Instant::now();
        let calls = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    s.spawn(move || {
                        (w..pods.len())
                            .step_by(workers)
                            .map(|i| {
                                let cid = format!("{}-c{i}", self.tag);
                                let args = format!(
                                    "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{i};K8S_POD_INFRA_CONTAINER_ID={cid}"
                                );
                                match exec.call(node, &CniVars { command: op, container_id: &cid, netns: &pods[i].path(), ifname: "eth0", args: &args }, &configs[i]) {
                                    Ok(o) => CallOutcome { pod: i, ms: ms(o.elapsed), ok: o.ok(), stdout: o.stdout },
                                    Err(_) => CallOutcome { pod: i, ms: 0.0, ok: false, stdout: Vec::new() },
                                }
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
        });
        Phase {
            wall: start.elapsed(),
            calls,
        }
    }

    fn run(&self, samples: &mut Samples) -> Result<(), String> {
        let dir = self.opts.work_dir.join(&self.tag);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let node = NamedNetns::create(&format!("{}-node", self.tag)).map_err(lab)?;
        let mut config = DaemonConfig::under(&self.opts.weftd, &dir, "bench");
        let socket = config.socket.clone();
        let sink = match self.target {
            Target::WeftOtlp => Some(otlp::Sink::start(&node)?),
            _ => None,
        };
        let env: Vec<(String, String)> = sink
            .iter()
            .map(|s| ("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), s.endpoint.clone()))
            .collect();
        let daemon = match self.target {
            Target::Weft | Target::WeftOtlp | Target::WeftIdle => {
                config.env = env;
                if self.target == Target::WeftIdle {
                    config.args = idle_features(&dir)?;
                }
                Some(NodeDaemon::start(&node, config).map_err(lab)?)
            }
            Target::Reference => None,
        };
        let pods: Vec<NamedNetns> = (0..self.opts.pods)
            .map(|i| NamedNetns::create(&format!("{}-p{i}", self.tag)))
            .collect::<Result<_, _>>()
            .map_err(lab)?;
        let exec = CniExec::new(&self.plugin()).through_nsenter(self.opts.nsenter.then(|| PathBuf::from(NSENTER)));
        let conf = self.config(&dir, &socket);
        let configs = vec![conf.clone(); pods.len()];
        let add = self.phase(&node, &exec, "ADD", &configs, &pods);
        if daemon.is_some() {
            // Each round's weftd starts at zero: what its histograms hold now is this
            // round's ADDs.
            let snap = Snapshot::take(&node)?;
            let add_phases = snap.phases.iter().filter(|((c, _), _)| c == "ADD");
            let handler = snap.grpc.get("Add").map(|v| (HANDLER.to_string(), *v));
            for (name, (sum, count)) in add_phases.map(|((_, p), v)| (p.clone(), *v)).chain(handler) {
                let e = samples.add_inside.entry(name).or_default();
                e.0 += sum;
                e.1 += count;
            }
        }
        let mut results = vec![Vec::new(); pods.len()];
        for c in &add.calls {
            results[c.pod].clone_from(&c.stdout);
        }
        // DEL gets the ADD result as prevResult, as libcni sends it.
        let del_configs: Vec<Vec<u8>> = results
            .iter()
            .map(|r| {
                let mut c: serde_json::Value = serde_json::from_slice(&conf).expect("own config");
                if let Ok(prev) = serde_json::from_slice::<serde_json::Value>(r) {
                    c["prevResult"] = prev;
                }
                serde_json::to_vec(&c).expect("config serializes")
            })
            .collect();
        let del_start = Instant::now();
        let del = self.phase(&node, &exec, "DEL", &del_configs, &pods);
        if let Some(mut d) = daemon {
            // SIGTERM makes weftd finish every teardown in flight, and flush its
            // traces, before it exits.
            d.stop(STOP_LIMIT);
        }
        samples.teardown_wall_s.push(del_start.elapsed().as_secs_f64());
        samples.add_wall_s.push(add.wall.as_secs_f64());
        samples.del_wall_s.push(del.wall.as_secs_f64());
        for (phase, lat) in [(&add, &mut samples.add_ms), (&del, &mut samples.del_ms)] {
            for c in &phase.calls {
                if c.ok {
                    lat.push(c.ms);
                } else {
                    samples.errors += 1;
                }
            }
        }
        if let Some(s) = sink {
            samples.spans_exported += s.spans();
        }
        drop(pods);
        drop(node);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}

/// weftd's flags for a node with its cluster features on and idle: a topology
/// directory (written under `dir`) that holds this node alone, with the benchmark's pod
/// range and an address, and no policy.
fn idle_features(dir: &Path) -> Result<Vec<String>, String> {
    let topo = dir.join("topology");
    std::fs::create_dir_all(&topo).map_err(|e| format!("creating {}: {e}", topo.display()))?;
    let node = weft_lab::kinds::node(&weft_topology::ClusterNode {
        name: "bench".into(),
        addresses: vec![std::net::Ipv4Addr::LOCALHOST.into()],
        pod_cidrs: vec!["10.244.0.0/16".parse().expect("a range")],
        ..Default::default()
    });
    weft_lab::kinds::write_file(&topo, "node.yaml", &node.to_string()).map_err(|e| e.to_string())?;
    Ok([
        "--topology-dir",
        &topo.display().to_string(),
        "--node-address",
        "127.0.0.1",
        "--wire-insecure",
    ]
    .map(String::from)
    .to_vec())
}

/// Runs the CNI benchmark: `rounds` rounds, each attaching and detaching `pods` pods
/// on both sides of the comparison, alternating which goes first.
pub fn run(opts: &Options) -> Result<Report, String> {
    let (a, b) = match opts.comparison {
        Comparison::Reference => (Target::Weft, Target::Reference),
        Comparison::Otlp => (Target::WeftOtlp, Target::Weft),
        Comparison::Features => (Target::WeftIdle, Target::Weft),
    };
    let mut needed = vec![("weft", opts.weft.clone()), ("weftd", opts.weftd.clone())];
    if b == Target::Reference {
        needed.push(("ptp", opts.reference_dir.join("ptp")));
    }
    if opts.nsenter {
        needed.push(("nsenter", PathBuf::from(NSENTER)));
    }
    for (what, p) in needed {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    let (mut sa, mut sb) = (Samples::default(), Samples::default());
    for round in 0..opts.rounds {
        for target in turns(round).map(|i| [a, b][i]) {
            let r = Round {
                opts,
                target,
                tag: format!("wb{}-{}{round}", std::process::id(), target.tag()),
            };
            r.run(if target == a { &mut sa } else { &mut sb })?;
        }
    }
    Ok(Report {
        pods: opts.pods,
        workers: opts.workers,
        rounds: opts.rounds,
        nsenter: opts.nsenter,
        a: sa.summary(a, opts.pods),
        b: sb.summary(b, opts.pods),
        samples: vec![(a, sa), (b, sb)],
    })
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.2}", a / b) } else { "-".into() }
}

impl Report {
    /// The report as a markdown table.
    pub fn markdown(&self) -> String {
        let (a, b) = (&self.a, &self.b);
        let what = match b.target {
            Target::Reference => "reference = ptp + host-local",
            Target::Weft if a.target == Target::WeftIdle => {
                "weft with the policy engine, flow records, node network and wire engine on and idle (a topology directory with this node alone, no policy) against weft without a cluster source (all of them off)"
            }
            _ => "weft with OTLP trace export against weft without it",
        };
        let via = if self.nsenter {
            "; every plugin exec'd through nsenter --net into the node namespace"
        } else {
            ""
        };
        let mut out = format!(
            "CNI ADD/DEL, {} pods x {} rounds, {} worker(s); {what}{via}\n\n",
            self.pods, self.rounds, self.workers,
        );
        let mut t = Table::new()
            .text("metric")
            .num(a.target.label())
            .num(b.target.label())
            .num(format!("{} / {}", a.target.label(), b.target.label()));
        let mut row = |name: &str, x: f64, y: f64, unit: &str| {
            t.row([
                format!("{name} ({unit})"),
                format!("{x:.2}"),
                format!("{y:.2}"),
                ratio(x, y),
            ]);
        };
        row("ADD p50", a.add.p50, b.add.p50, "ms");
        row("ADD p90", a.add.p90, b.add.p90, "ms");
        row("ADD p99", a.add.p99, b.add.p99, "ms");
        row("DEL p50", a.del.p50, b.del.p50, "ms");
        row("DEL p90", a.del.p90, b.del.p90, "ms");
        row("DEL p99", a.del.p99, b.del.p99, "ms");
        row("ADD phase wall", a.add_wall_s, b.add_wall_s, "s");
        row("DEL phase wall", a.del_wall_s, b.del_wall_s, "s");
        row("DEL until all veths gone", a.teardown_wall_s, b.teardown_wall_s, "s");
        row("ADD throughput", a.add_pods_per_s, b.add_pods_per_s, "pods/s");
        out.push_str(&t.to_string());
        out.push_str(&format!(
            "\nfailed calls: {} {}, {} {}\n",
            a.target.label(),
            a.errors,
            b.target.label(),
            b.errors
        ));
        if a.target == Target::WeftOtlp {
            out.push_str(&format!("spans received by the OTLP receiver: {}\n", a.spans_exported));
        }
        out.push_str(&self.inside_markdown());
        out
    }

    /// Where weft's ADD time goes inside weftd: each phase's mean per ADD, for every
    /// weft side; phases run partly side by side (policy beside the network set-up),
    /// so they need not add up to the handler's time.
    fn inside_markdown(&self) -> String {
        let sides: Vec<&Summary> = [&self.a, &self.b]
            .into_iter()
            .filter(|s| !s.add_inside_ms.is_empty())
            .collect();
        if sides.is_empty() {
            return String::new();
        }
        let mut t = Table::new().text("inside weftd, per ADD (mean ms)");
        for s in &sides {
            t = t.num(s.target.label());
        }
        let mut names: Vec<&String> = sides.iter().flat_map(|s| s.add_inside_ms.keys()).collect();
        names.sort_by_key(|n| (n.as_str() != HANDLER, n.as_str()));
        names.dedup();
        for name in names {
            let cells = sides
                .iter()
                .map(|s| s.add_inside_ms.get(name).map_or("-".to_string(), |v| format!("{v:.3}")));
            t.row(std::iter::once(name.clone()).chain(cells).collect::<Vec<_>>());
        }
        format!("\n{t}")
    }
}
