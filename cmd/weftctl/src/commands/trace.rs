//! `weftctl trace SRC DST PORT/PROTO`: the source pod's node sends a real probe from
//! inside the pod, traced on every node it crosses (the admin service's `Trace`);
//! printed hop by hop beside what `policy explain` says of the same connection.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{TraceAnswer, TraceHop, TraceReply, TraceRequest};

/// `weftctl trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The source pod (NS/NAME, or NAME in namespace default): the probe leaves from
    /// inside it, so ask its node's weftd (or give --lab).
    src: String,
    /// The destination: a pod, or an address.
    dst: String,
    /// What is sent: PORT/tcp (a SYN), PORT/udp (a datagram) or icmp (an echo).
    probe: String,
    /// Ask the source pod's node of this lab rather than the daemon at --socket.
    #[arg(long)]
    lab: Option<PathBuf>,
}

/// Runs `weftctl trace`.
pub async fn run(args: TraceArgs, socket: &Path, json: bool) -> anyhow::Result<()> {
    let socket = match &args.lab {
        None => socket.to_path_buf(),
        Some(file) => {
            let lab = weft_lab::Lab::load(file).with_context(|| format!("loading lab {}", file.display()))?;
            let Some(node) = lab.node_of(&args.src) else {
                bail!("{}: no pod of lab {}", args.src, file.display());
            };
            lab.socket(node)
        }
    };
    let mut client = AdminClient::new(super::connect(&socket).await?);
    let t = client
        .trace(TraceRequest {
            src: args.src.clone(),
            dst: args.dst.clone(),
            probe: args.probe.clone(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("trace: {}", s.message()))?
        .into_inner();
    if json {
        outln!("{}", serde_json::to_string(&to_json(&t))?);
        return Ok(());
    }
    print(&t);
    Ok(())
}

/// What policy explain says, in a word.
fn expected(t: &TraceReply) -> Option<&'static str> {
    t.expected.as_ref().map(|e| match (e.allowed, e.passes) {
        (true, _) => "allowed",
        (false, true) => "denied in audit mode (forwarded)",
        (false, false) => "denied",
    })
}

fn answer(t: &TraceReply) -> Option<bool> {
    match TraceAnswer::try_from(t.answer).unwrap_or(TraceAnswer::Unknown) {
        TraceAnswer::Unknown => None,
        TraceAnswer::Answered => Some(true),
        TraceAnswer::NotAnswered => Some(false),
    }
}

fn hop_json(h: &TraceHop) -> serde_json::Value {
    let step = |s: &weft_rpc::admin::TraceStep| {
        serde_json::json!({
            "table": s.table, "chain": s.chain, "rule": s.rule, "verdict": s.verdict,
            "meaning": (!s.meaning.is_empty()).then_some(&s.meaning),
        })
    };
    let dropped = h.dropped_at.checked_sub(1).and_then(|i| h.steps.get(i as usize));
    serde_json::json!({
        "node": h.node, "iif": h.iif, "oif": h.oif, "route": h.route,
        "steps": h.steps.iter().map(step).collect::<Vec<_>>(),
        "dropped_by": dropped.map(step),
    })
}

fn to_json(t: &TraceReply) -> serde_json::Value {
    serde_json::json!({
        "trace": {
            "src": t.src, "src_ip": t.src_ip, "dst": t.dst, "dst_ip": t.dst_ip, "probe": t.probe,
            "answered": answer(t),
            "hops": t.hops.iter().map(hop_json).collect::<Vec<_>>(),
            "unwatched": t.unwatched,
        },
        "policy_explain": expected(t),
    })
}

fn print(t: &TraceReply) {
    let answered = match answer(t) {
        Some(true) => "answered",
        Some(false) => "not answered",
        None => "sent (a datagram is not answered)",
    };
    outln!(
        "trace {} ({}) -> {} ({}) {}: {answered}",
        t.src,
        t.src_ip,
        t.dst,
        t.dst_ip,
        t.probe
    );
    if let Some(e) = expected(t) {
        outln!("policy explain: {e}");
    }
    if t.hops.is_empty() {
        outln!("no node saw the probe (it never left the pod: its own routes or address)");
    }
    for h in &t.hops {
        out!("{}: in {}", h.node, if h.iif.is_empty() { "?" } else { &h.iif });
        if !h.oif.is_empty() {
            out!(", out {}", h.oif);
        }
        outln!();
        if !h.route.is_empty() {
            outln!("  route: {}", h.route);
        }
        for s in &h.steps {
            let rule = if s.rule.is_empty() { "(chain end)" } else { &s.rule };
            outln!("  {} {}: {rule} -> {}", s.table, s.chain, s.verdict);
            if !s.meaning.is_empty() {
                outln!("      {}", s.meaning);
            }
        }
        match h.dropped_at.checked_sub(1).and_then(|i| h.steps.get(i as usize)) {
            Some(d) => {
                let by = if d.meaning.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", d.meaning)
                };
                outln!(
                    "  DROPPED by {} chain {}: {}{by}",
                    d.table,
                    d.chain,
                    if d.rule.is_empty() { "its policy" } else { &d.rule }
                )
            }
            None => outln!("  passed"),
        }
    }
    for u in &t.unwatched {
        outln!("not watched: {u}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_rpc::admin::{PolicyExplainReply, TraceStep};

    #[test]
    fn the_json_names_the_dropping_step_and_what_it_stands_for() {
        let t = TraceReply {
            src: "y/a".into(),
            answer: TraceAnswer::NotAnswered as i32,
            hops: vec![TraceHop {
                node: "n1".into(),
                steps: vec![
                    TraceStep {
                        table: "inet weft-policy".into(),
                        chain: "ingress".into(),
                        verdict: "jump g1".into(),
                        ..Default::default()
                    },
                    TraceStep {
                        table: "inet weft-policy".into(),
                        chain: "g1".into(),
                        rule: "counter drop".into(),
                        verdict: "drop".into(),
                        meaning: "pods of x isolated (ingress) by x/deny".into(),
                    },
                ],
                dropped_at: 2,
                ..Default::default()
            }],
            expected: Some(PolicyExplainReply::default()),
            ..Default::default()
        };
        let v = to_json(&t);
        assert_eq!(v["trace"]["answered"], false);
        assert_eq!(v["policy_explain"], "denied");
        let d = &v["trace"]["hops"][0]["dropped_by"];
        assert_eq!(d["chain"], "g1");
        assert_eq!(d["meaning"], "pods of x isolated (ingress) by x/deny");
        assert!(v["trace"]["hops"][0]["steps"][0]["meaning"].is_null());
    }
}
