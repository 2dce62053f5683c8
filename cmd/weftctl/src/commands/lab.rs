//! `weftctl lab`: a multi-node lab on this machine out of network namespaces (see
//! `weft_lab::cluster`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use weft_lab::Lab;

/// `weftctl lab` arguments.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// The lab file.
    #[arg(long, short = 'f', default_value = "examples/lab.yaml")]
    file: PathBuf,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Builds what is missing (namespaces, daemons, pods); restarts crashed daemons.
    Up,
    /// Pings across every link; fails when one does not answer in time.
    Check {
        /// Seconds each link may take to answer.
        #[arg(long, default_value_t = 10)]
        within: u64,
    },
    /// SIGKILLs a node's weftd (pods and kernel wires stay).
    Crash {
        /// The node.
        node: String,
    },
    /// Runs a command inside a pod.
    Exec {
        /// The pod.
        pod: String,
        /// The command.
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// Removes everything the lab made.
    Down,
}

/// Runs a lab action.
pub fn run(args: LabArgs, json: bool) -> anyhow::Result<()> {
    let lab = Lab::load(&args.file).with_context(|| format!("loading {}", args.file.display()))?;
    match args.action {
        Action::Up => {
            let started = lab.up()?;
            println!(
                "lab {} up: {} nodes, {} pods; weftd started on: {}",
                lab.spec.name,
                lab.spec.nodes.len(),
                lab.spec.nodes.iter().map(|n| n.pods.len()).sum::<usize>(),
                if started.is_empty() {
                    "none (all running)".to_string()
                } else {
                    started.join(", ")
                }
            );
        }
        Action::Check { within } => {
            let checks = lab.check(Duration::from_secs(within));
            if json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                println!("{:<20} {:<20} {:<6} {:<5} {:>8}", "FROM", "TO", "KIND", "OK", "MS");
                for c in &checks {
                    println!("{:<20} {:<20} {:<6} {:<5} {:>8}", c.from, c.to, c.kind, c.ok, c.millis);
                }
            }
            let failed = checks.iter().filter(|c| !c.ok).count();
            anyhow::ensure!(failed == 0, "{failed} of {} links did not answer", checks.len());
        }
        Action::Crash { node } => lab.crash(&node)?,
        Action::Exec { pod, argv } => {
            let status = lab.exec(&pod, &argv)?;
            anyhow::ensure!(status.success(), "{status}");
        }
        Action::Down => lab.down()?,
    }
    Ok(())
}
