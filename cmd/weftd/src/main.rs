//! weftd, the weft node daemon. This file only composes: flags (`args.rs`) into a [`NodeConfig`],
//! telemetry, [`Node::start`], a signal, [`Node::shutdown`] (see `weft-node`); or,
//! for `weftd uninstall`, the same flags into `weft_node::uninstall`.

mod args;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tracing::error;
use weft_node::{Node, NodeConfig};
use weft_telemetry::Metrics;

use args::{Args, COMMIT, Command, VERSION};

#[tokio::main]
async fn main() -> ExitCode {
    // Process-wide, so here: the wire data plane's frame buffers stay warm in the heap.
    weft_kernel::tune_allocator();
    // Before any wire opens a socket: see `raise_open_files_limit`. A failure only
    // leaves the limit where it was, which small nodes never reach.
    let open_files = weft_kernel::limits::raise_open_files_limit();
    let mut args = Args::parse();
    if let Some(Command::Uninstall { force, keep_state }) = args.command.take() {
        return uninstall(weft_node::uninstall::UninstallConfig {
            export: args.export(),
            state_dir: args.state_dir,
            socket: args.socket,
            force,
            keep_state,
        })
        .await;
    }
    let (log_format, config) = (args.log_format, args.config());
    let metrics = Metrics::new(VERSION, COMMIT);
    let provider = match weft_telemetry::otel::provider(&config.node_name, VERSION) {
        Ok(p) => weft_telemetry::init(log_format, p, metrics.clone()),
        Err(e) => {
            eprintln!("weftd: {e}");
            return ExitCode::FAILURE;
        }
    };
    match open_files {
        Ok(n) => tracing::info!(open_files = n, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
    let outcome = serve(config, metrics).await;
    // Flush what is left of the traces; the exporter blocks, so not on a worker.
    let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "weftd stopped");
            ExitCode::FAILURE
        }
    }
}

/// `weftd uninstall`: says what it removed and put back, or why it would not.
async fn uninstall(cfg: weft_node::uninstall::UninstallConfig) -> ExitCode {
    match weft_node::uninstall::uninstall(&cfg).await {
        Ok(done) => {
            for t in &done.tables {
                println!("deleted table {t}");
            }
            for l in &done.links {
                println!("deleted link {l}");
            }
            println!("deleted {} route(s) of weft's", done.routes);
            for s in &done.sysctls {
                println!("put {s} back as weft found it");
            }
            if done.state_removed {
                println!("removed {}", cfg.state_dir.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weftd uninstall: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the node, serves until the first SIGTERM or SIGINT, and stops it in order.
async fn serve(config: NodeConfig, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    // Installed first, so a SIGTERM during start-up still means an orderly stop.
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let node = Node::start(config, metrics).await?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    node.shutdown().await;
    Ok(())
}
