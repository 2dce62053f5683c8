//! Benchmarks of weft beside the reference CNI plugins. Claims count only when
//! measured beside what they are compared with, in the same run on the same machine:
//! rounds alternate which plugin goes first, so drift hits both, and results are
//! reported as medians and ratios.
//!
//! The CNI benchmark drives weft and Debian's reference `ptp` + `host-local`
//! exactly as a runtime does (a process per call, config on stdin), inside
//! namespaces it creates and removes: a node namespace per plugin and round (weftd
//! runs inside it), and one namespace per pod.

mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use weft_lab::{CniExec, DaemonPaths, LabError, NamedNetns, NodeDaemon};

pub use stats::{Percentiles, median};

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
    /// Rounds per plugin.
    pub rounds: usize,
    /// Scratch directory (daemon state, host-local leases).
    pub work_dir: PathBuf,
}

/// The two things compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// weft (plugin + weftd).
    Weft,
    /// The reference ptp + host-local.
    Reference,
}

/// Raw measurements of one target over all rounds.
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
}

/// Summary of one target.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
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
}

/// The result of a CNI benchmark run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Pods per round.
    pub pods: usize,
    /// Workers.
    pub workers: usize,
    /// Rounds.
    pub rounds: usize,
    /// weft.
    pub weft: Summary,
    /// The reference.
    pub reference: Summary,
    /// Raw samples, for anyone who wants to redo the statistics.
    pub samples: Vec<(Target, Samples)>,
}

impl Samples {
    fn summary(&self, pods: usize) -> Summary {
        let add_wall = median(&self.add_wall_s);
        Summary {
            add: Percentiles::of(&self.add_ms),
            del: Percentiles::of(&self.del_ms),
            add_wall_s: add_wall,
            del_wall_s: median(&self.del_wall_s),
            teardown_wall_s: median(&self.teardown_wall_s),
            add_pods_per_s: if add_wall > 0.0 {
                pods as f64 / add_wall
            } else {
                0.0
            },
            errors: self.errors,
        }
    }
}

fn lab(e: LabError) -> String {
    e.to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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
            Target::Weft => serde_json::json!({
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
            Target::Weft => self.opts.weft.clone(),
            Target::Reference => self.opts.reference_dir.join("ptp"),
        }
    }

    /// Runs `op` over every pod (pod `i` gets `configs[i]`) with the configured number
    /// of workers, and returns the phase's wall time and each call's outcome.
    fn phase(
        &self,
        node: &NamedNetns,
        exec: &CniExec,
        op: &str,
        configs: &[Vec<u8>],
        pods: &[NamedNetns],
    ) -> Phase {
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
                                match exec.call(node, op, &cid, &pods[i].path(), "eth0", &args, &configs[i]) {
                                    Ok(o) => CallOutcome { pod: i, ms: ms(o.elapsed), ok: o.ok(), stdout: o.stdout },
                                    Err(_) => CallOutcome { pod: i, ms: 0.0, ok: false, stdout: Vec::new() },
                                }
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
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
        let paths = DaemonPaths::under(&self.opts.weftd, &dir);
        let daemon = match self.target {
            Target::Weft => {
                Some(NodeDaemon::start(&node, paths.clone(), "bench", &[]).map_err(lab)?)
            }
            Target::Reference => None,
        };
        let pods: Vec<NamedNetns> = (0..self.opts.pods)
            .map(|i| NamedNetns::create(&format!("{}-p{i}", self.tag)))
            .collect::<Result<_, _>>()
            .map_err(lab)?;
        let exec = CniExec::new(&self.plugin());
        let conf = self.config(&dir, &paths.socket);
        let configs = vec![conf.clone(); pods.len()];
        let add = self.phase(&node, &exec, "ADD", &configs, &pods);
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
        if let Some(d) = daemon {
            // SIGTERM makes weftd finish every teardown in flight before it exits.
            d.stop().map_err(lab)?;
        }
        samples
            .teardown_wall_s
            .push(del_start.elapsed().as_secs_f64());
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
        drop(pods);
        drop(node);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}

/// Runs the CNI benchmark: `rounds` rounds, each attaching and detaching `pods` pods
/// with weft and with the reference, alternating which goes first.
pub fn run(opts: &Options) -> Result<Report, String> {
    for (what, p) in [
        ("weft", &opts.weft),
        ("weftd", &opts.weftd),
        ("ptp", &opts.reference_dir.join("ptp")),
    ] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    let mut weft = Samples::default();
    let mut reference = Samples::default();
    for round in 0..opts.rounds {
        let order = if round % 2 == 0 {
            [Target::Weft, Target::Reference]
        } else {
            [Target::Reference, Target::Weft]
        };
        for target in order {
            let t = match target {
                Target::Weft => "w",
                Target::Reference => "r",
            };
            let r = Round {
                opts,
                target,
                tag: format!("wb{}-{t}{round}", std::process::id()),
            };
            let s = match target {
                Target::Weft => &mut weft,
                Target::Reference => &mut reference,
            };
            r.run(s)?;
        }
    }
    Ok(Report {
        pods: opts.pods,
        workers: opts.workers,
        rounds: opts.rounds,
        weft: weft.summary(opts.pods),
        reference: reference.summary(opts.pods),
        samples: vec![(Target::Weft, weft), (Target::Reference, reference)],
    })
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

impl Report {
    /// The report as a markdown table.
    pub fn markdown(&self) -> String {
        let (w, r) = (&self.weft, &self.reference);
        let mut out = format!(
            "CNI ADD/DEL, {} pods x {} rounds, {} worker(s); reference = ptp + host-local\n\n\
             | metric | weft | reference | weft / reference |\n|---|---:|---:|---:|\n",
            self.pods, self.rounds, self.workers
        );
        let mut row = |name: &str, a: f64, b: f64, unit: &str| {
            out.push_str(&format!(
                "| {name} ({unit}) | {a:.2} | {b:.2} | {} |\n",
                ratio(a, b)
            ));
        };
        row("ADD p50", w.add.p50, r.add.p50, "ms");
        row("ADD p90", w.add.p90, r.add.p90, "ms");
        row("ADD p99", w.add.p99, r.add.p99, "ms");
        row("DEL p50", w.del.p50, r.del.p50, "ms");
        row("DEL p90", w.del.p90, r.del.p90, "ms");
        row("DEL p99", w.del.p99, r.del.p99, "ms");
        row("ADD phase wall", w.add_wall_s, r.add_wall_s, "s");
        row("DEL phase wall", w.del_wall_s, r.del_wall_s, "s");
        row(
            "DEL until all veths gone",
            w.teardown_wall_s,
            r.teardown_wall_s,
            "s",
        );
        row(
            "ADD throughput",
            w.add_pods_per_s,
            r.add_pods_per_s,
            "pods/s",
        );
        out.push_str(&format!(
            "\nfailed calls: weft {}, reference {}\n",
            w.errors, r.errors
        ));
        out
    }
}
