//! `weftctl wires`: the wire ends of a node with their state and counters.

use std::path::Path;

use serde::Serialize;
use weft_rpc::admin::WiresRequest;
use weft_rpc::admin::admin_client::AdminClient;

#[derive(Serialize)]
struct Wire {
    id: String,
    namespace: String,
    link_uid: i64,
    pod: String,
    intf: String,
    peer_pod: String,
    peer_intf: String,
    peer_node: String,
    kind: String,
    state: String,
    vni: u32,
    tx_frames: Option<u64>,
    tx_bytes: Option<u64>,
    rx_frames: Option<u64>,
    rx_bytes: Option<u64>,
    dropped: Option<u64>,
}

/// Prints the wire ends.
pub async fn run(socket: &Path, json: bool) -> anyhow::Result<()> {
    let mut client = AdminClient::new(super::connect(socket).await?);
    let wires: Vec<Wire> = client
        .wires(WiresRequest {})
        .await?
        .into_inner()
        .wires
        .into_iter()
        .map(|w| {
            let c = |v: u64| w.counted.then_some(v);
            Wire {
                id: format!("{:016x}", w.id),
                namespace: w.namespace,
                link_uid: w.link_uid,
                pod: w.pod,
                intf: w.intf,
                peer_pod: w.peer_pod,
                peer_intf: w.peer_intf,
                peer_node: w.peer_node,
                kind: w.kind,
                state: w.state,
                vni: w.vni,
                tx_frames: c(w.tx_frames),
                tx_bytes: c(w.tx_bytes),
                rx_frames: c(w.rx_frames),
                rx_bytes: c(w.rx_bytes),
                dropped: c(w.dropped),
            }
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&wires)?);
        return Ok(());
    }
    println!(
        "{:<24} {:<24} {:<6} {:<8} {:<16} {:>10} {:>10} {:>8} {:<16}",
        "END", "PEER", "KIND", "STATE", "PEER NODE", "TX FRAMES", "RX FRAMES", "DROPPED", "WIRE ID"
    );
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for w in &wires {
        let node = if w.peer_node.is_empty() {
            "(this node)"
        } else {
            &w.peer_node
        };
        println!(
            "{:<24} {:<24} {:<6} {:<8} {:<16} {:>10} {:>10} {:>8} {:<16}",
            format!("{}/{}:{}", w.namespace, w.pod, w.intf),
            format!("{}:{}", w.peer_pod, w.peer_intf),
            w.kind,
            w.state,
            node,
            n(w.tx_frames),
            n(w.rx_frames),
            n(w.dropped),
            w.id
        );
    }
    Ok(())
}
