//! `weftctl lab graph`: the lab drawn (see `weft_lab::graph`), with what its nodes
//! report about each link end: kind, state, run-time impairment and, from two samples
//! of the wire byte counters, the rate it carries.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use weft_lab::Lab;
use weft_lab::graph::{EndReport, Graph};
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{LinkShowRequest, WiresRequest};

/// One node's answer: when it was asked, and each end's kind, state and bytes both
/// ways (`None` when the interface could not be read).
type Sample = (Instant, Vec<(String, String, String, Option<u64>)>);

async fn wires(client: &mut AdminClient<tonic::transport::Channel>) -> Option<Sample> {
    let reply = client.wires(WiresRequest {}).await.ok()?.into_inner();
    let at = Instant::now();
    let ends = reply
        .wires
        .into_iter()
        .map(|w| {
            let bytes = w.counted.then_some(w.tx_bytes.saturating_add(w.rx_bytes));
            (format!("{}:{}", w.pod, w.intf), w.kind, w.state, bytes)
        })
        .collect();
    Some((at, ends))
}

/// An impairment map as `delay 20ms loss 1%`, in the parameters' order.
fn impairment_text(map: &HashMap<String, String>) -> String {
    // A run-time setting of nothing clears the topology's: say so rather than print "-".
    if map.is_empty() {
        return "none".into();
    }
    let m: BTreeMap<&String, &String> = map.iter().collect();
    weft_link::Impairment::from_map(m)
        .map(|i| i.to_string())
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// What every node of `lab` reports by `pod:intf`; rates when `interval` is not zero.
/// A node that does not answer reports nothing (its links are drawn down), so a lab
/// that is not up is still drawn.
pub fn reports(lab: &Lab, interval: Duration) -> anyhow::Result<BTreeMap<String, EndReport>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut clients = Vec::new();
        for n in &lab.spec.nodes {
            if let Ok(ch) = super::connect(&lab.socket(&n.name)).await {
                clients.push(AdminClient::new(ch));
            }
        }
        let mut out = BTreeMap::new();
        let mut first = Vec::new();
        for c in &mut clients {
            first.push(wires(c).await);
            if let Ok(reply) = c.link_show(LinkShowRequest::default()).await {
                for l in reply.into_inner().links {
                    let r: &mut EndReport = out.entry(format!("{}:{}", l.pod, l.intf)).or_default();
                    r.down_by_intent = l.down;
                    if l.overridden {
                        r.runtime_impairment = Some(impairment_text(&l.active));
                    }
                }
            }
        }
        let answered = first.iter().any(Option::is_some);
        if answered && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        for (c, before) in clients.iter_mut().zip(first) {
            let Some((t0, ends0)) = before else { continue };
            let after = if interval.is_zero() { None } else { wires(c).await };
            let bytes0: BTreeMap<&String, Option<u64>> = ends0.iter().map(|(k, _, _, b)| (k, *b)).collect();
            let bytes0 = &bytes0;
            let rates: BTreeMap<String, f64> = after
                .iter()
                .flat_map(|(t1, ends1)| {
                    let secs = t1.duration_since(t0).as_secs_f64().max(1e-3);
                    ends1.iter().filter_map(move |(k, _, _, b1)| {
                        let b0 = (*bytes0.get(k)?)?;
                        // A counter that went back is a re-created interface: no rate.
                        let d = b1.as_ref()?.checked_sub(b0)?;
                        Some((k.clone(), d as f64 * 8.0 / secs))
                    })
                })
                .collect();
            for (key, kind, state, _) in ends0 {
                let rate = rates.get(&key).copied();
                let r = out.entry(key).or_default();
                r.kind = kind;
                r.state = state;
                r.rate_bps = rate;
            }
        }
        // A LinkShow row without a wire: no state to report, not "up".
        for r in out.values_mut() {
            if r.state.is_empty() {
                r.state = "down".into();
            }
        }
        Ok(out)
    })
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
