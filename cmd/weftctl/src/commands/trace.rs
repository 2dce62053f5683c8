//! `weftctl trace --lab FILE SRC DST PORT/PROTO`: the lab's trace (`weft_lab::trace`),
//! printed hop by hop beside what `policy explain` says of the same flow.

use std::path::PathBuf;

use clap::Args;
use weft_lab::trace::{Probe, Trace};
use weft_rpc::admin::PolicyExplainRequest;
use weft_rpc::admin::admin_client::AdminClient;

/// `weftctl trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The source pod (NS/NAME, or a unique NAME).
    src: String,
    /// The destination: a pod, or an address.
    dst: String,
    /// What is sent: PORT/tcp (a SYN), PORT/udp (a datagram) or icmp (an echo).
    probe: String,
    /// The lab whose nodes are traced.
    #[arg(long)]
    lab: PathBuf,
}

/// Runs `weftctl trace`.
pub async fn run(args: TraceArgs, json: bool) -> anyhow::Result<()> {
    let probe = Probe::parse(&args.probe).map_err(|e| anyhow::anyhow!("{e}"))?;
    let lab = weft_lab::Lab::load(&args.lab).map_err(|e| anyhow::anyhow!("loading lab {}: {e}", args.lab.display()))?;
    let (src, dst) = (args.src.clone(), args.dst.clone());
    let trace = {
        let lab = lab.clone();
        tokio::task::spawn_blocking(move || lab.trace(&src, &dst, probe))
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))?
    };
    let expected = explain(&lab, &args, &trace, probe).await;
    if json {
        let v = serde_json::json!({"trace": trace, "policy_explain": expected});
        outln!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    print(&trace, expected.as_deref());
    Ok(())
}

/// What `policy explain` says of the flow on the source's node (none for ICMP, which
/// it is not asked about, or when the node does not answer).
async fn explain(lab: &weft_lab::Lab, args: &TraceArgs, trace: &Trace, probe: Probe) -> Option<String> {
    let (port, protocol) = match probe {
        Probe::Tcp(p) => (p, "tcp"),
        Probe::Udp(p) => (p, "udp"),
        Probe::Icmp => return None,
    };
    let node = lab.node_of(&args.src)?;
    let mut client = AdminClient::new(super::connect(&lab.socket(node)).await.ok()?);
    let dst = if args.dst.parse::<std::net::IpAddr>().is_ok() {
        trace.dst_ip.to_string()
    } else {
        args.dst.clone()
    };
    let r = client
        .policy_explain(PolicyExplainRequest {
            src: args.src.clone(),
            dst,
            protocol: protocol.into(),
            port: u32::from(port),
        })
        .await
        .ok()?
        .into_inner();
    Some(
        match (r.allowed, r.passes) {
            (true, _) => "allowed",
            (false, true) => "denied in audit mode (forwarded)",
            (false, false) => "denied",
        }
        .to_string(),
    )
}

fn print(t: &Trace, expected: Option<&str>) {
    let probe = match t.probe {
        Probe::Tcp(p) => format!("{p}/tcp"),
        Probe::Udp(p) => format!("{p}/udp"),
        Probe::Icmp => "icmp".into(),
    };
    let answered = match t.answered {
        Some(true) => "answered",
        Some(false) => "not answered",
        None => "sent (a datagram is not answered)",
    };
    outln!("trace {} ({}) -> {} {probe}: {answered}", t.src, t.src_ip, t.dst_ip);
    if let Some(e) = expected {
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
        }
        match &h.dropped_by {
            Some(d) => outln!(
                "  DROPPED by {} chain {}: {}",
                d.table,
                d.chain,
                if d.rule.is_empty() { "its policy" } else { &d.rule }
            ),
            None => outln!("  passed"),
        }
    }
}
