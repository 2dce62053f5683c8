//! `weftctl lab`: a multi-node lab on this machine out of network namespaces (see
//! `weft_lab::cluster`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use weft_lab::Lab;

/// `weftctl lab` actions; each names the lab file first.
#[derive(Debug, Subcommand)]
pub enum LabAction {
    /// Builds what is missing (namespaces, daemons, pods); restarts crashed daemons.
    Up {
        /// The lab file.
        file: PathBuf,
    },
    /// Pings across every link, from both ends, and over the pod network (every pod to
    /// the pods of other nodes on `eth0`, to the other nodes, and to the outside);
    /// fails when one does not answer in time.
    Check {
        /// The lab file.
        file: PathBuf,
        /// Seconds each link may take to answer.
        #[arg(long, default_value_t = 10)]
        within: u64,
    },
    /// SIGKILLs a node's weftd (pods and kernel wires stay; `up` restarts it).
    Crash {
        /// The lab file.
        file: PathBuf,
        /// The node.
        node: String,
    },
    /// Runs a command inside a node's or a pod's network namespace.
    Exec {
        /// The lab file.
        file: PathBuf,
        /// The node or pod.
        name: String,
        /// The command (after `--`).
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// Writes a lab file: a ring of pods, each linked to its next neighbours until
    /// there are `--links` links, the pods spread over `--nodes` nodes (try weft at
    /// KNE's 1,500 links: `--pods 500 --links 1500 --nodes 3`).
    Gen {
        /// How many pods.
        #[arg(long)]
        pods: usize,
        /// How many links.
        #[arg(long)]
        links: usize,
        /// How many nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// How links between nodes are carried: grpc, vxlan, mixed (alternately), or
        /// veth (each node's pods a ring of their own, no link between nodes).
        #[arg(long, default_value = "grpc")]
        kind: weft_lab::generate::GenKind,
        /// The lab's name.
        #[arg(long, default_value = "gen")]
        name: String,
        /// Where to write it (default: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Draws the lab: nodes, their pods, and every link with its ends, kind, state,
    /// impairment and (when the lab is up) the rate it carries. DOT on standard output,
    /// or to `-o FILE` as .dot, or .svg/.png rendered by Graphviz's `dot`.
    Graph {
        /// The lab file.
        file: PathBuf,
        /// Where to write it (.svg, .png or .dot; default: DOT on standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// How long between the two counter samples a rate is made of (0s: no rates).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        sample: Duration,
    },
    /// Removes everything the lab made.
    Down {
        /// The lab file.
        file: PathBuf,
    },
}

fn load(file: &std::path::Path) -> anyhow::Result<Lab> {
    Lab::load(file).with_context(|| format!("loading {}", file.display()))
}

/// Runs a lab action.
pub fn run(action: LabAction, json: bool) -> anyhow::Result<()> {
    match action {
        LabAction::Up { file } => {
            let lab = load(&file)?;
            let started = lab.up()?;
            println!(
                "lab {} up: {} nodes, {} pods; weftd started on: {}",
                lab.spec.name,
                lab.spec.nodes.len(),
                lab.spec.pods.len(),
                if started.is_empty() {
                    "none (all running)".to_string()
                } else {
                    started.join(", ")
                }
            );
        }
        LabAction::Check { file, within } => {
            let lab = load(&file)?;
            let mut checks = lab.check(Duration::from_secs(within));
            super::link::mark_down_by_intent(&lab, &mut checks);
            checks.extend(lab.check_network(Duration::from_secs(within)));
            if json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                println!("{:<16} {:<34} {:<7} {:<5} {:>9}", "FROM", "TO", "KIND", "OK", "RTT(ms)");
                for c in &checks {
                    let rtt = c.rtt_ms.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"));
                    let ok = match (c.ok, c.down_by_intent) {
                        (true, _) => "ok",
                        (false, true) => "down",
                        (false, false) => "FAIL",
                    };
                    println!("{:<16} {:<34} {:<7} {:<5} {:>9}", c.from, c.to, c.kind, ok, rtt);
                }
            }
            if !json {
                // Why each failure failed, after the table: what to look at next.
                for c in checks.iter().filter(|c| !c.ok && !c.down_by_intent) {
                    if let Some(r) = &c.reason {
                        println!("FAIL {} -> {}: {r}", c.from, c.to);
                    }
                }
            }
            let failed = checks.iter().filter(|c| !c.ok && !c.down_by_intent).count();
            anyhow::ensure!(failed == 0, "{failed} of {} checks did not answer", checks.len());
        }
        LabAction::Crash { file, node } => load(&file)?.crash(&node)?,
        LabAction::Exec { file, name, argv } => {
            let status = load(&file)?.exec(&name, &argv)?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
        }
        LabAction::Gen {
            pods,
            links,
            nodes,
            kind,
            name,
            output,
        } => {
            let spec = weft_lab::generate::GenSpec {
                name,
                pods,
                links,
                nodes,
                kind,
            };
            let text = weft_lab::generate::generate(&spec).map_err(anyhow::Error::msg)?;
            match output {
                Some(path) => std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?,
                None => print!("{text}"),
            }
        }
        LabAction::Graph { file, output, sample } => super::lab_graph::run(&load(&file)?, output.as_deref(), sample)?,
        LabAction::Down { file } => load(&file)?.down()?,
    }
    Ok(())
}
