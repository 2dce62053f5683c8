//! `weftctl status`: daemon health, per-range address usage, how pods reach other
//! nodes, and network policy.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use weft_rpc::admin::StatusRequest;
use weft_rpc::admin::admin_client::AdminClient;

#[derive(Serialize)]
struct Range {
    cidr: String,
    gateway: String,
    capacity: u64,
    allocated: u64,
    free: u64,
}

#[derive(Serialize)]
struct Peer {
    name: String,
    mode: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    problem: String,
}

#[derive(Serialize)]
struct NodeNetwork {
    routing: String,
    pod_cidrs: Vec<String>,
    pod_mtu: Option<u32>,
    address: String,
    masquerade: bool,
    peers: Vec<Peer>,
}

#[derive(Serialize)]
struct Status {
    node: String,
    version: String,
    ready: bool,
    uptime_seconds: i64,
    attachments: u64,
    pending_teardowns: u64,
    spooled_dels: u64,
    state_path: String,
    schema_version: u32,
    ranges: Vec<Range>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_network: Option<NodeNetwork>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<Policy>,
}

#[derive(Serialize)]
struct Policy {
    synced: bool,
    stale: bool,
    policies: u32,
    cluster_policies: u32,
    invalid: Vec<String>,
    isolated_ingress: u32,
    isolated_egress: u32,
}

fn human_duration(mut s: i64) -> String {
    let (d, h, m) = (s / 86400, (s / 3600) % 24, (s / 60) % 60);
    s %= 60;
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

/// Prints the daemon's status.
pub async fn run(socket: &Path, json: bool) -> anyhow::Result<()> {
    let mut client = AdminClient::new(super::connect(socket).await?);
    let r = client.status(StatusRequest {}).await?.into_inner();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let status = Status {
        node: r.node_name,
        version: r.version,
        ready: r.ready,
        uptime_seconds: (now - r.started_at).max(0),
        attachments: r.attachments,
        pending_teardowns: r.pending_teardowns,
        spooled_dels: r.spooled_dels,
        state_path: r.state_path,
        schema_version: r.schema_version,
        ranges: r
            .ranges
            .into_iter()
            .map(|g| Range {
                free: g.capacity.saturating_sub(g.allocated),
                cidr: g.cidr,
                gateway: g.gateway,
                capacity: g.capacity,
                allocated: g.allocated,
            })
            .collect(),
        node_network: r.node_network.map(|n| NodeNetwork {
            routing: n.routing,
            pod_cidrs: n.pod_cidrs,
            pod_mtu: (n.pod_mtu > 0).then_some(n.pod_mtu),
            address: n.address,
            masquerade: n.masquerade,
            peers: n
                .peers
                .into_iter()
                .map(|p| Peer {
                    name: p.name,
                    mode: p.mode,
                    problem: p.problem,
                })
                .collect(),
        }),
        policy: r.policy.map(|p| Policy {
            synced: p.synced,
            stale: p.stale,
            policies: p.policies,
            cluster_policies: p.cluster_policies,
            invalid: p.invalid,
            isolated_ingress: p.isolated_ingress,
            isolated_egress: p.isolated_egress,
        }),
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    outln!(
        "node         {} (weftd {}, up {}, {})",
        status.node,
        status.version,
        human_duration(status.uptime_seconds),
        if status.ready { "ready" } else { "NOT READY" }
    );
    outln!("state        {} (schema {})", status.state_path, status.schema_version);
    outln!(
        "attachments  {} ({} teardowns pending)",
        status.attachments,
        status.pending_teardowns
    );
    if status.spooled_dels > 0 {
        // Normally replayed at start; one left here waits for the next reconcile pass
        // or its pod's next ADD.
        outln!(
            "spooled DELs {} (recorded by the plugin while weftd was down)",
            status.spooled_dels
        );
    }
    outln!();
    outln!(
        "{:<28} {:<26} {:>10} {:>20} {:>7}",
        "RANGE",
        "GATEWAY",
        "ALLOCATED",
        "CAPACITY",
        "USED"
    );
    if status.ranges.is_empty() {
        outln!("(no ranges yet: they are recorded at the first ADD)");
    }
    for g in &status.ranges {
        let pct = if g.capacity == 0 {
            100.0
        } else {
            g.allocated as f64 * 100.0 / g.capacity as f64
        };
        outln!(
            "{:<28} {:<26} {:>10} {:>20} {:>6.1}%",
            g.cidr,
            g.gateway,
            g.allocated,
            g.capacity,
            pct
        );
    }
    if let Some(n) = &status.node_network {
        outln!();
        let or_none = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        outln!(
            "pod network  routing {}, podCIDRs {}, pod MTU {}, address {}, masquerade {}",
            n.routing,
            or_none(&n.pod_cidrs),
            n.pod_mtu.map_or_else(|| "unknown".to_string(), |m| m.to_string()),
            if n.address.is_empty() { "unknown" } else { &n.address },
            if n.masquerade { "on" } else { "off" }
        );
        if !n.peers.is_empty() {
            outln!();
            outln!("{:<24} {:<12} PROBLEM", "PEER NODE", "MODE");
            for p in &n.peers {
                outln!("{:<24} {:<12} {}", p.name, p.mode, p.problem);
            }
        }
    }
    if let Some(p) = &status.policy {
        outln!();
        let state = match (p.synced, p.stale) {
            (false, _) => "NOT SYNCED (the cluster's objects are not listed yet: the last table stays)",
            (true, true) => "STALE (a watch is lost: the last known policies stay enforced)",
            (true, false) => "in step",
        };
        outln!(
            "policy       {state}; {} policies, {} cluster policies, pods isolated: {} ingress, {} egress",
            p.policies,
            p.cluster_policies,
            p.isolated_ingress,
            p.isolated_egress
        );
        for i in &p.invalid {
            outln!("  not read in full: {i}");
        }
    }
    Ok(())
}
