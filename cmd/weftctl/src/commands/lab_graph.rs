//! `weftctl lab graph`: the lab drawn (see `weft_lab::graph`), with what its nodes
//! report about each link end: kind, state, run-time impairment and, from two samples
//! of the wire byte counters, the rate it carries.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use weft_lab::Lab;
use weft_lab::graph::{EndReport, Graph};
use weft_link::live::{Rates, Sample};

/// What every node of `lab` reports by `pod:intf`; rates when `interval` is not zero.
/// A node that does not answer reports nothing (its links are drawn down), so a lab
/// that is not up is still drawn.
pub fn reports(lab: &Lab, interval: Duration) -> anyhow::Result<BTreeMap<String, EndReport>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let daemons = super::live::lab_daemons(lab);
        let first = super::live::sample(&daemons).await;
        let rates = if interval.is_zero() || first.ends.is_empty() {
            BTreeMap::new()
        } else {
            tokio::time::sleep(interval).await;
            weft_link::live::rates(&first, &super::live::sample(&daemons).await)
        };
        Ok(end_reports(&first, &rates))
    })
}

/// The graph's view of a sample: each end by `pod:intf`, with its rate both ways.
pub fn end_reports(s: &Sample, rates: &BTreeMap<String, Rates>) -> BTreeMap<String, EndReport> {
    s.ends
        .iter()
        .map(|(name, e)| {
            let r = EndReport {
                kind: e.kind.clone(),
                state: e.state.clone(),
                down_by_intent: e.down,
                // A run-time setting of nothing clears the topology's: say so.
                runtime_impairment: e.overridden.then(|| {
                    if e.impairment.is_empty() {
                        "none".to_string()
                    } else {
                        e.impairment.clone()
                    }
                }),
                rate_bps: rates.get(name).map(|r| r.tx_bps + r.rx_bps),
            };
            (format!("{}:{}", e.pod, e.intf), r)
        })
        .collect()
}

/// Draws `lab` to `output` (DOT, SVG or PNG by its extension) or, without one, prints
/// the DOT.
pub fn run(lab: &Lab, output: Option<&Path>, interval: Duration) -> anyhow::Result<()> {
    let ends = reports(lab, interval)?;
    let dot = Graph::new(&lab.spec, &lab.topologies, &ends).to_dot();
    let Some(path) = output else {
        out!("{dot}");
        return Ok(());
    };
    render(&dot, path)
}

/// Writes `dot` to `path`: as DOT, or drawn by Graphviz as SVG or PNG, by its extension.
pub fn render(dot: &str, path: &Path) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
    let format = match ext.to_ascii_lowercase().as_str() {
        "dot" | "gv" => {
            return std::fs::write(path, dot).with_context(|| format!("writing {}", path.display()));
        }
        "svg" => "svg",
        "png" => "png",
        _ => bail!("{}: say .svg, .png or .dot", path.display()),
    };
    let mut child = match Command::new("dot")
        .arg(format!("-T{format}"))
        .arg("-o")
        .arg(path)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "drawing {format} needs Graphviz's `dot`, which is not installed: `apt-get install graphviz` (Debian package graphviz), or write DOT with -o {}",
            path.with_extension("dot").display()
        ),
        Err(e) => return Err(e).context("running Graphviz's dot"),
    };
    // dot reads all of its input before writing, so one write then wait cannot block.
    child.stdin.take().context("dot's input")?.write_all(dot.as_bytes())?;
    let out = child.wait_with_output().context("running Graphviz's dot")?;
    anyhow::ensure!(
        out.status.success(),
        "Graphviz's dot failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
