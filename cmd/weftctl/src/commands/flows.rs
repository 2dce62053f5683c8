//! `weftctl flows`: the connections of the node's pods (or, with `--lab FILE`, of every
//! node of a lab), filtered, followed, aggregated, ranked by bytes (`top`) and drawn as
//! a map (`graph`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use weft_flows::{FlowRecord, Verdict, protocol_name, wire};
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{FlowAggregate, FlowFilter, FlowStats, FlowsRequest, flows_item};

/// How to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// One JSON object per line.
    Json,
}

/// Which flows: every option given must hold (one option given twice: either value).
#[derive(Debug, Clone, Args)]
pub struct Selection {
    /// Flows open at or begun within this long (`5m`, `1h`).
    #[arg(long)]
    since: Option<humantime::Duration>,
    /// The source: ns/pod, ns/ (a namespace), ns/Kind/name (a workload), an address or
    /// CIDR, node:NAME, or outside.
    #[arg(long)]
    from: Vec<String>,
    /// The destination, written as --from.
    #[arg(long)]
    to: Vec<String>,
    /// The destination port.
    #[arg(long)]
    port: Vec<u32>,
    /// tcp, udp, sctp, icmp, icmpv6 or a number.
    #[arg(long)]
    protocol: Vec<String>,
    /// forwarded, denied or audit.
    #[arg(long)]
    verdict: Vec<String>,
    /// The verdict the staged policies would give (`weft.dev/policy-mode: staged` or
    /// `staged-removal`): forwarded, denied or audit.
    #[arg(long)]
    staged: Vec<String>,
    /// A policy that took part: NS/NAME of a NetworkPolicy, NAME of a
    /// ClusterNetworkPolicy.
    #[arg(long)]
    policy: Vec<String>,
    /// Leave out the flows matching KEY=VALUE (KEY: from, to, port, protocol, verdict,
    /// staged, policy); several --not leave out what matches all of them.
    #[arg(long, value_name = "KEY=VALUE")]
    not: Vec<String>,
    /// Ask every node of a lab (`weftctl lab`) instead of the daemon at --socket (with
    /// --follow: every node at once).
    #[arg(long)]
    lab: Option<PathBuf>,
    /// Only the node at --socket: by default it asks every other node of the cluster
    /// over the node-to-node port and answers for all.
    #[arg(long, conflicts_with = "lab")]
    local: bool,
}

/// `weftctl flows`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FlowsArgs {
    #[command(subcommand)]
    action: Option<FlowsAction>,
    #[command(flatten)]
    sel: Selection,
    /// Keep going: print flows as they open and end.
    #[arg(long, short)]
    follow: bool,
    /// Sums per (source, destination, port, protocol, verdict, policy) over the span
    /// instead of flows.
    #[arg(long)]
    aggregate: bool,
    /// The newest this many flows per node (0: all kept).
    #[arg(long, default_value_t = 0)]
    limit: u32,
    /// table or json.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// What else `weftctl flows` does.
#[derive(Debug, Subcommand)]
pub enum FlowsAction {
    /// The talkers that moved the most bytes: workloads (or pods, nodes, addresses)
    /// with what they sent and received.
    Top {
        #[command(flatten)]
        sel: Selection,
        /// How many.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
        /// table or json.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Who talks to whom, drawn with Graphviz: workloads as boxes, an edge per
    /// (source, destination, port) with its bytes, coloured by verdict.
    Graph {
        #[command(flatten)]
        sel: Selection,
        /// Where: .svg, .png or .dot (without: the DOT on standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Selection {
    /// Whether the daemon asked answers for the whole cluster (a lab's nodes are each
    /// asked instead).
    fn cluster(&self) -> bool {
        self.lab.is_none() && !self.local
    }

    /// The filter as the daemon reads it; checked here first, so a typo fails before
    /// any daemon is asked.
    fn filter(&self) -> anyhow::Result<FlowFilter> {
        let mut not = FlowFilter::default();
        for c in &self.not {
            let (k, v) = c
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--not {c:?}: KEY=VALUE, KEY one of {}", weft_flows::filter::KEYS))?;
            match k {
                "from" => not.from.push(v.into()),
                "to" => not.to.push(v.into()),
                "port" => not
                    .ports
                    .push(v.parse().map_err(|_| anyhow::anyhow!("--not port={v}: a port"))?),
                "protocol" => not.protocols.push(v.into()),
                "verdict" => not.verdicts.push(v.into()),
                "staged" => not.staged.push(v.into()),
                "policy" => not.policies.push(v.into()),
                other => anyhow::bail!("--not {other}=...: KEY one of {}", weft_flows::filter::KEYS),
            }
        }
        let f = FlowFilter {
            from: self.from.clone(),
            to: self.to.clone(),
            ports: self.port.clone(),
            protocols: self.protocol.clone(),
            verdicts: self.verdict.clone(),
            staged: self.staged.clone(),
            policies: self.policy.clone(),
            since_unix_ms: self
                .since
                .map_or(0, |d| now_ms() - i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            not: (not != FlowFilter::default()).then(|| Box::new(not)),
        };
        wire::filter_of(&f).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(f)
    }
}

/// What the nodes answered.
#[derive(Default)]
struct Answers {
    stats: Vec<FlowStats>,
    flows: Vec<FlowRecord>,
    aggregates: Vec<FlowAggregate>,
}

async fn ask(sockets: &[PathBuf], request: &FlowsRequest) -> anyhow::Result<Answers> {
    let mut out = Answers::default();
    for socket in sockets {
        let mut client = AdminClient::new(super::connect(socket).await?);
        let mut stream = client
            .flows(request.clone())
            .await
            .map_err(|s| anyhow::anyhow!("{}: {}", socket.display(), s.message()))?
            .into_inner();
        while let Some(item) = stream.message().await? {
            match item.item {
                Some(flows_item::Item::Stats(s)) => out.stats.push(s),
                Some(flows_item::Item::Flow(f)) => {
                    out.flows.push(wire::record_of(f).map_err(|e| anyhow::anyhow!("{e}"))?)
                }
                Some(flows_item::Item::Aggregate(a)) => out.aggregates.push(a),
                None => {}
            }
        }
    }
    out.flows.sort_by_key(|f| (f.start_ms, f.id));
    Ok(out)
}

/// Runs `weftctl flows`.
pub async fn run(args: FlowsArgs, socket: &Path, json: bool) -> anyhow::Result<()> {
    match args.action {
        Some(FlowsAction::Top { sel, count, output }) => top(&sel, count, output, json, socket).await,
        Some(FlowsAction::Graph { sel, output }) => graph(&sel, output.as_deref(), socket).await,
        None => {
            list(
                &args.sel,
                args.follow,
                args.aggregate,
                args.limit,
                args.output,
                json,
                socket,
            )
            .await
        }
    }
}

async fn list(
    sel: &Selection,
    follow: bool,
    aggregate: bool,
    limit: u32,
    output: Output,
    json: bool,
    socket: &Path,
) -> anyhow::Result<()> {
    let json = json || output == Output::Json;
    let request = FlowsRequest {
        filter: Some(sel.filter()?),
        follow: false,
        limit,
        aggregate,
        per_bucket: false,
        cluster: sel.cluster(),
    };
    let all = super::daemons(socket, sel.lab.as_deref())?;
    let answers = ask(&all, &request).await?;
    for s in &answers.stats {
        print_stats(s, json);
    }
    if aggregate {
        if !json {
            outln!(
                "{:<28} {:<28} {:<10} {:<12} {:<9} {:>6} {:>10} {:>10}  POLICY",
                "SRC",
                "DST",
                "PORT",
                "KIND",
                "VERDICT",
                "FLOWS",
                "BYTES->",
                "BYTES<-"
            );
        }
        let mut aggs = answers.aggregates;
        aggs.sort_by_key(|a| std::cmp::Reverse(agg_bytes(a)));
        for a in &aggs {
            print_aggregate(a, json);
        }
        return Ok(());
    }
    if !json {
        outln!(
            "{:<12} {:<8} {:<30} {:<30} {:<7} {:<12} {:<9} {:>9} {:>9} {:<7}  POLICY",
            "START",
            "NODE",
            "SRC",
            "DST",
            "PROTO",
            "KIND",
            "VERDICT",
            "BYTES->",
            "BYTES<-",
            "END"
        );
    }
    for f in &answers.flows {
        print_flow(f, json);
    }
    if !follow {
        return Ok(());
    }
    // Every node at once, each on its own task; lines as they come.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<anyhow::Result<FlowRecord>>(1024);
    for socket in all {
        let tx = tx.clone();
        let request = FlowsRequest {
            follow: true,
            limit: 1,
            ..request.clone()
        };
        tokio::spawn(async move {
            let run = async {
                let mut client = AdminClient::new(super::connect(&socket).await?);
                let mut stream = client
                    .flows(request)
                    .await
                    .map_err(|s| anyhow::anyhow!("{}: {}", socket.display(), s.message()))?
                    .into_inner();
                // The kept ones were printed already: skip the stats and the newest.
                let mut skip = 2;
                while let Some(item) = stream.message().await? {
                    if skip > 0 {
                        skip -= 1;
                        continue;
                    }
                    if let Some(flows_item::Item::Flow(f)) = item.item {
                        let r = wire::record_of(f).map_err(|e| anyhow::anyhow!("{e}"))?;
                        if tx.send(Ok(r)).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                anyhow::Ok(())
            };
            if let Err(e) = run.await {
                let _ = tx.send(Err(e)).await;
            }
        });
    }
    drop(tx);
    while let Some(r) = rx.recv().await {
        print_flow(&r?, json);
    }
    Ok(())
}

fn agg_bytes(a: &FlowAggregate) -> u64 {
    a.forward.as_ref().map_or(0, |c| c.bytes) + a.reverse.as_ref().map_or(0, |c| c.bytes)
}

/// Bytes as people read them.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

fn print_stats(s: &FlowStats, json: bool) {
    let gaps: Vec<serde_json::Value> = s
        .gaps
        .iter()
        .map(|g| serde_json::json!({"from_unix_ms": g.from_unix_ms, "to_unix_ms": g.to_unix_ms, "reason": g.reason}))
        .collect();
    if json {
        let v = serde_json::json!({"stats": {
            "node": s.node, "enabled": s.enabled, "problem": s.problem, "entries": s.entries,
            "undecodable": s.undecodable, "overflows": s.overflows, "lost_events": s.lost_events,
            "denies": s.denies, "open": s.open, "kept": s.kept, "ring": s.ring,
            "aggregates": s.aggregates, "gaps": gaps,
        }});
        outln!("{v}");
        return;
    }
    if !s.enabled {
        outln!("# {}: flows are not recorded: {}", s.node, s.problem);
        return;
    }
    outln!(
        "# {}: {} open, {} ended kept (ring {}), {} conntrack entries read, {} denied packets",
        s.node,
        s.open,
        s.kept,
        s.ring,
        s.entries,
        s.denies
    );
    if s.overflows > 0 {
        outln!(
            "# {}: EVENTS LOST: the kernel's buffer overflowed {} times; {} flow events recovered from a dump (flows first seen there, or gone from it and ended as lost)",
            s.node,
            s.overflows,
            s.lost_events
        );
    }
    for g in s.gaps.iter().filter(|g| g.reason != "start") {
        outln!(
            "# {}: flows may be missing from {} to {} ({})",
            s.node,
            super::clock(g.from_unix_ms),
            super::clock(g.to_unix_ms),
            g.reason
        );
    }
    if let Some(g) = s.gaps.iter().rev().find(|g| g.reason == "start") {
        outln!(
            "# {}: recording since {}: flows that ended before are not known",
            s.node,
            super::clock(g.to_unix_ms)
        );
    }
}

fn print_flow(f: &FlowRecord, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(f).unwrap_or_default());
        return;
    }
    let end = |p: &weft_flows::Peer| {
        if p.port == 0 {
            p.to_string()
        } else {
            format!("{p}:{}", p.port)
        }
    };
    let mut policy = f
        .policies
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if let Some(s) = &f.staged {
        let hits: Vec<String> = s.policies.iter().map(ToString::to_string).collect();
        policy += &format!(" [staged: {}", s.verdict.as_str());
        if !hits.is_empty() {
            policy += &format!(", {}", hits.join("; "));
        }
        policy += "]";
    }
    outln!(
        "{:<12} {:<8} {:<30} {:<30} {:<7} {:<12} {:<9} {:>9} {:>9} {:<7}  {policy}",
        super::clock(f.start_ms),
        f.node,
        end(&f.src),
        end(&f.dst),
        protocol_name(f.protocol),
        f.kind.as_str(),
        f.verdict.as_str(),
        bytes(f.forward.bytes),
        bytes(f.reverse.bytes),
        f.end.as_str(),
    );
}

fn print_aggregate(a: &FlowAggregate, json: bool) {
    let (fwd, rev) = (a.forward.unwrap_or_default(), a.reverse.unwrap_or_default());
    if json {
        let v = serde_json::json!({
            "start_unix_ms": a.start_unix_ms, "end_unix_ms": a.end_unix_ms, "src": a.src, "dst": a.dst,
            "port": a.port, "protocol": protocol_name(a.protocol as u8), "kind": a.kind, "verdict": a.verdict,
            "policy": a.policy, "flows": a.flows,
            "forward": {"packets": fwd.packets, "bytes": fwd.bytes},
            "reverse": {"packets": rev.packets, "bytes": rev.bytes},
        });
        outln!("{v}");
        return;
    }
    outln!(
        "{:<28} {:<28} {:<10} {:<12} {:<9} {:>6} {:>10} {:>10}  {}",
        a.src,
        a.dst,
        format!("{}/{}", a.port, protocol_name(a.protocol as u8)),
        a.kind,
        a.verdict,
        a.flows,
        bytes(fwd.bytes),
        bytes(rev.bytes),
        a.policy
    );
}

/// The aggregates over the selection, merged across nodes.
async fn aggregates(sel: &Selection, socket: &Path) -> anyhow::Result<Vec<FlowAggregate>> {
    let request = FlowsRequest {
        filter: Some(sel.filter()?),
        aggregate: true,
        cluster: sel.cluster(),
        ..FlowsRequest::default()
    };
    Ok(ask(&super::daemons(socket, sel.lab.as_deref())?, &request)
        .await?
        .aggregates)
}

/// A talker's totals.
#[derive(Default, Clone, Copy)]
struct Talker {
    sent: u64,
    received: u64,
    flows: u64,
}

async fn top(sel: &Selection, count: usize, output: Output, json: bool, socket: &Path) -> anyhow::Result<()> {
    let aggs = aggregates(sel, socket).await?;
    let mut talkers: BTreeMap<String, Talker> = BTreeMap::new();
    for a in &aggs {
        let (fwd, rev) = (a.forward.unwrap_or_default(), a.reverse.unwrap_or_default());
        let s = talkers.entry(a.src.clone()).or_default();
        s.sent += fwd.bytes;
        s.received += rev.bytes;
        s.flows += a.flows;
        let d = talkers.entry(a.dst.clone()).or_default();
        d.sent += rev.bytes;
        d.received += fwd.bytes;
        d.flows += a.flows;
    }
    let mut ranked: Vec<(String, Talker)> = talkers.into_iter().collect();
    ranked.sort_by(|a, b| {
        (b.1.sent + b.1.received)
            .cmp(&(a.1.sent + a.1.received))
            .then(a.0.cmp(&b.0))
    });
    ranked.truncate(count);
    if json || output == Output::Json {
        for (name, t) in &ranked {
            outln!(
                "{}",
                serde_json::json!({"talker": name, "bytes_sent": t.sent, "bytes_received": t.received, "flows": t.flows})
            );
        }
        return Ok(());
    }
    outln!(
        "{:<40} {:>10} {:>10} {:>10} {:>7}",
        "TALKER",
        "TOTAL",
        "SENT",
        "RECEIVED",
        "FLOWS"
    );
    for (name, t) in &ranked {
        outln!(
            "{name:<40} {:>10} {:>10} {:>10} {:>7}",
            bytes(t.sent + t.received),
            bytes(t.sent),
            bytes(t.received),
            t.flows
        );
    }
    Ok(())
}

/// A DOT string literal.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// An edge of the map: source, destination, port, protocol, verdict.
type Edge = (String, String, u32, u32, String);

/// The map of `aggs` as DOT: a box per group, an edge per (source, destination, port,
/// protocol, verdict) labelled with its bytes and flows, green when forwarded, red when
/// denied, orange when audited.
fn to_dot(aggs: &[FlowAggregate]) -> String {
    let mut edges: BTreeMap<Edge, (u64, u64)> = BTreeMap::new();
    for a in aggs {
        let e = edges
            .entry((a.src.clone(), a.dst.clone(), a.port, a.protocol, a.verdict.clone()))
            .or_default();
        e.0 += agg_bytes(a);
        e.1 += a.flows;
    }
    let mut nodes: BTreeMap<&str, ()> = BTreeMap::new();
    for (src, dst, ..) in edges.keys() {
        nodes.insert(src, ());
        nodes.insert(dst, ());
    }
    let mut dot =
        String::from("digraph flows {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"sans\"];\n");
    for n in nodes.keys() {
        let shape = if n.parse::<std::net::IpAddr>().is_ok() {
            ", shape=ellipse"
        } else if n.starts_with("node/") {
            ", shape=box3d"
        } else {
            ""
        };
        dot.push_str(&format!("  {} [label={}{shape}];\n", quoted(n), quoted(n)));
    }
    for ((src, dst, port, protocol, verdict), (b, flows)) in &edges {
        let colour = match Verdict::parse(verdict) {
            Some(Verdict::Forwarded) => "darkgreen",
            Some(Verdict::Denied) => "red",
            Some(Verdict::Audit) => "orange",
            None => "gray",
        };
        let label = format!(
            "{port}/{} {} ({flows} flows)",
            protocol_name(*protocol as u8),
            bytes(*b)
        );
        dot.push_str(&format!(
            "  {} -> {} [label={}, color={colour}, fontcolor={colour}{}];\n",
            quoted(src),
            quoted(dst),
            quoted(&label),
            if verdict == "denied" { ", style=dashed" } else { "" }
        ));
    }
    dot.push_str("}\n");
    dot
}

async fn graph(sel: &Selection, output: Option<&Path>, socket: &Path) -> anyhow::Result<()> {
    let dot = to_dot(&aggregates(sel, socket).await?);
    match output {
        None => {
            out!("{dot}");
            Ok(())
        }
        Some(path) => super::lab_graph::render(&dot, path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_rpc::admin::FlowCounters;

    #[test]
    fn the_selection_is_checked_before_any_daemon_is_asked() {
        let sel = |not: &[&str], from: &[&str]| Selection {
            since: None,
            from: from.iter().map(|s| s.to_string()).collect(),
            to: vec![],
            port: vec![],
            protocol: vec![],
            verdict: vec![],
            staged: vec![],
            policy: vec![],
            not: not.iter().map(|s| s.to_string()).collect(),
            lab: None,
            local: false,
        };
        let f = sel(&["verdict=denied", "port=53", "staged=denied"], &["x/"])
            .filter()
            .unwrap();
        let not = f.not.unwrap();
        assert_eq!((not.verdicts, not.ports), (vec!["denied".to_string()], vec![53]));
        assert_eq!(not.staged, ["denied"]);
        assert!(sel(&["staged=maybe"], &[]).filter().is_err());
        assert!(sel(&["colour=red"], &[]).filter().is_err());
        assert!(sel(&["port=dns"], &[]).filter().is_err());
        assert!(sel(&[], &["a//b"]).filter().is_err(), "a bad end fails here");
        assert!(sel(&[], &[]).filter().unwrap().not.is_none());
    }

    #[test]
    fn the_map_has_a_box_per_group_and_a_coloured_edge_per_pair() {
        let agg = |src: &str, dst: &str, verdict: &str, b: u64| FlowAggregate {
            src: src.into(),
            dst: dst.into(),
            port: 80,
            protocol: 6,
            verdict: verdict.into(),
            flows: 2,
            forward: Some(FlowCounters { packets: 1, bytes: b }),
            ..FlowAggregate::default()
        };
        let dot = to_dot(&[
            agg("x/Deployment/web", "y/b", "forwarded", 1500),
            agg("x/Deployment/web", "y/b", "forwarded", 500),
            agg("x/a", "198.51.100.1", "denied", 0),
        ]);
        assert!(dot.contains("\"x/Deployment/web\" -> \"y/b\" [label=\"80/tcp 2.0kB (4 flows)\", color=darkgreen"));
        assert!(dot.contains("\"198.51.100.1\" [label=\"198.51.100.1\", shape=ellipse]"));
        assert!(dot.contains("color=red, fontcolor=red, style=dashed"));
        assert_eq!(dot.matches(" -> ").count(), 2);
        assert_eq!(bytes(999), "999B");
        assert_eq!(bytes(1_234_567), "1.2MB");
    }
}
