//! weft-bench: weft beside the reference plugins, same run, same machine; a thin
//! `main` over `compare`.

mod compare;

use clap::Parser;

/// Benchmark weft beside the reference plugins (ptp + host-local) and its other
/// references, in namespaces it creates and removes. Needs root.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    args: compare::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    compare::run(cli.args, cli.json)
}
