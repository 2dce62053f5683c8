//! weftctl, the operator CLI: a thin `main` over `commands/`.

/// `print!` that ends weftctl quietly when the reader of its output has gone
/// (`weftctl flows | head`), as command-line tools do: the standard macro panics on a
/// broken pipe. Other write errors still panic.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}

/// `println!` with [`out!`]'s behaviour on a broken pipe.
macro_rules! outln {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod commands;
mod stdout;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Inspect and operate weft.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// weftd's UNIX socket.
    #[arg(long, global = true, env = "WEFT_SOCKET", default_value = weft_cni::conf::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print JSON for machines instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Daemon health and per-range address usage.
    Status,
    /// The most recent finished CNI calls (time, command, pod, ifname, duration, CNI
    /// code, trace id): the first thing to look at when a pod is stuck.
    Calls(commands::calls::CallsArgs),
    /// The host ports held on the node and the pods they lead to.
    Ports,
    /// The node's wire ends (links between pods) with their state and counters.
    Wires,
    /// Link emulation at run time: impairments (set, reset, show) and link state by
    /// intent (down, up, flap), at both ends of a link; `--lab FILE` finds the pod's node.
    #[command(subcommand)]
    Link(commands::link::LinkAction),
    /// Captures the frames of a link end as pcapng, to a file (-w) or standard output
    /// (`| tcpdump -r -`, `| wireshark -k -i -`); bounded by --count, --duration and the
    /// daemon's caps; `--lab FILE` finds the pod's node.
    Capture(commands::capture::CaptureArgs),
    /// Network policy: why a connection is allowed or denied (`explain`), and the flows
    /// it denied (`denies`).
    #[command(subcommand)]
    Policy(commands::policy::PolicyAction),
    /// Flows: every connection of the node's pods (or a lab's, with --lab) with bytes,
    /// verdict and the policy that decided; filtered, followed (-f), aggregated, ranked
    /// (`top`) and drawn (`graph`).
    Flows(Box<commands::flows::FlowsArgs>),
    /// A real probe from a pod, traced through every node it crosses (`meta nftrace`):
    /// each node's chains and rules with their verdicts and the policy each stands for,
    /// the rule that dropped it, the route it took; beside what `policy explain` says.
    /// Ask the source pod's node (or give --lab).
    Trace(commands::trace::TraceArgs),
    /// A multi-node lab on this machine out of network namespaces: nodes in different
    /// subnets behind a router, a weftd per node, pods wired from Topology objects.
    /// Needs root.
    #[command(subcommand)]
    Lab(commands::lab::LabAction),
    /// Prints the CustomResourceDefinitions (Topology, WireState) as YAML.
    Crds,
    /// Makes the wire port's certificates: a CA, and per node a certificate naming the
    /// node (see manifests/wire-tls/README.md).
    #[command(subcommand)]
    Certs(commands::certs::CertsAction),
    /// Installs the plugin and the network config on this node, each atomically (the
    /// DaemonSet's init container runs it).
    InstallCni(commands::install::InstallArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Lab(args) => commands::lab::run(args, cli.json),
        Command::Crds => commands::crds::run(),
        Command::Certs(action) => commands::certs::run(action),
        Command::InstallCni(args) => commands::install::run(args, cli.json),
        command => async_command(command, &cli.socket, cli.json),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weftctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a command that talks to weftd.
fn async_command(command: Command, socket: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        match command {
            Command::Status => commands::status::run(socket, json).await,
            Command::Calls(args) => commands::calls::run(socket, args, json).await,
            Command::Ports => commands::ports::run(socket, json).await,
            Command::Wires => commands::wires::run(socket, json).await,
            Command::Link(action) => commands::link::run(action, socket, json).await,
            Command::Capture(args) => commands::capture::run(args, socket).await,
            Command::Policy(action) => commands::policy::run(action, socket, json).await,
            Command::Flows(args) => commands::flows::run(*args, socket, json).await,
            Command::Trace(args) => commands::trace::run(args, socket, json).await,
            Command::Lab(_) | Command::Crds | Command::Certs(_) | Command::InstallCni(_) => {
                unreachable!("run outside the runtime")
            }
        }
    })
}
