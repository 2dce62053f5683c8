//! `weftctl bench`: weft beside the reference plugins, same run, same machine.

use std::path::PathBuf;

use anyhow::Context;

/// Options of `weftctl bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Pods attached and detached per round.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Concurrent workers issuing calls.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Rounds per plugin (alternating which goes first).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Directory of the reference plugins.
    #[arg(long, default_value = "/usr/lib/cni")]
    reference_dir: PathBuf,
    /// Directory of weft and weftd (default: beside weftctl).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// What weft is compared with: the reference plugins, or itself without OTLP
    /// trace export (with export on, spans go to a receiver inside the node), or the
    /// reference ptp + portmap chain with host ports.
    #[arg(long, value_enum, default_value = "reference")]
    compare: Compare,
    /// With `--compare hostports`: pods attached through the reference chain (its
    /// cost grows with every mapping).
    #[arg(long, default_value_t = 400)]
    reference_pods: usize,
}

/// What `weftctl bench` compares weft with.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Compare {
    /// Debian's ptp + host-local.
    Reference,
    /// weft without OTLP export (weft runs with export on).
    Otlp,
    /// ptp + portmap, each pod with one host port, as mappings accumulate.
    Hostports,
}

/// Runs the benchmark and prints the report.
pub fn run(args: BenchArgs, json: bool) -> anyhow::Result<()> {
    let bin_dir = match args.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .context("weftctl's directory")?
            .to_path_buf(),
    };
    let work_dir = std::env::temp_dir().join(format!("weft-bench-{}", std::process::id()));
    if let Compare::Hostports = args.compare {
        let opts = weft_bench::HostportOptions {
            weft: bin_dir.join("weft"),
            weftd: bin_dir.join("weftd"),
            reference_dir: args.reference_dir,
            weft_pods: args.pods,
            reference_pods: args.reference_pods,
            work_dir: work_dir.clone(),
        };
        let report = weft_bench::run_hostports(&opts).map_err(|e| anyhow::anyhow!(e));
        let _ = std::fs::remove_dir_all(&work_dir);
        let report = report?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.markdown());
        }
        return Ok(());
    }
    let opts = weft_bench::Options {
        weft: bin_dir.join("weft"),
        weftd: bin_dir.join("weftd"),
        reference_dir: args.reference_dir,
        pods: args.pods,
        workers: args.workers,
        rounds: args.rounds,
        work_dir: work_dir.clone(),
        comparison: match args.compare {
            Compare::Reference => weft_bench::Comparison::Reference,
            Compare::Otlp => weft_bench::Comparison::Otlp,
            Compare::Hostports => unreachable!("handled above"),
        },
    };
    let report = weft_bench::run(&opts).map_err(|e| anyhow::anyhow!(e));
    let _ = std::fs::remove_dir_all(&work_dir);
    let report = report?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}
