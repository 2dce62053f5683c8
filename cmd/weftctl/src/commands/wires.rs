//! `weftctl wires`: the wire ends of a node with their state and counters, printed
//! straight from the admin API's messages.

use std::path::Path;

use serde::ser::{Serialize, SerializeMap, Serializer};
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{WireEnd, WiresRequest};

/// A wire end as `--json` prints it: the id in hex, the counters null when the
/// interface could not be read.
struct Json<'a>(&'a WireEnd);

impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let w = self.0;
        let mut m = s.serialize_map(Some(17))?;
        m.serialize_entry("id", &hex_id(w))?;
        m.serialize_entry("namespace", &w.namespace)?;
        m.serialize_entry("link_uid", &w.link_uid)?;
        m.serialize_entry("pod", &w.pod)?;
        m.serialize_entry("intf", &w.intf)?;
        m.serialize_entry("peer_pod", &w.peer_pod)?;
        m.serialize_entry("peer_intf", &w.peer_intf)?;
        m.serialize_entry("peer_node", &w.peer_node)?;
        m.serialize_entry("kind", &w.kind)?;
        m.serialize_entry("state", &w.state)?;
        m.serialize_entry("vni", &w.vni)?;
        for (name, v) in counters(w) {
            m.serialize_entry(name, &v)?;
        }
        m.serialize_entry("reason", &w.reason)?;
        m.end()
    }
}

fn hex_id(w: &WireEnd) -> String {
    format!("{:016x}", w.id)
}

/// The end's counters by name, `None` when the interface could not be read.
fn counters(w: &WireEnd) -> [(&'static str, Option<u64>); 5] {
    let c = |v: u64| w.counted.then_some(v);
    [
        ("tx_frames", c(w.tx_frames)),
        ("tx_bytes", c(w.tx_bytes)),
        ("rx_frames", c(w.rx_frames)),
        ("rx_bytes", c(w.rx_bytes)),
        ("dropped", c(w.dropped)),
    ]
}

/// Prints the wire ends.
pub async fn run(socket: &Path, json: bool) -> anyhow::Result<()> {
    let mut client = AdminClient::new(super::connect(socket).await?);
    let wires = client.wires(WiresRequest {}).await?.into_inner().wires;
    if json {
        let rows: Vec<Json<'_>> = wires.iter().map(Json).collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    outln!(
        "{:<24} {:<24} {:<6} {:<8} {:<16} {:>10} {:>10} {:>8} {:<16} REASON",
        "END",
        "PEER",
        "KIND",
        "STATE",
        "PEER NODE",
        "TX FRAMES",
        "RX FRAMES",
        "DROPPED",
        "WIRE ID"
    );
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for w in &wires {
        let node = if w.peer_node.is_empty() {
            "(this node)"
        } else {
            &w.peer_node
        };
        let [(_, tx_frames), _, (_, rx_frames), _, (_, dropped)] = counters(w);
        outln!(
            "{:<24} {:<24} {:<6} {:<8} {:<16} {:>10} {:>10} {:>8} {:<16} {}",
            format!("{}/{}:{}", w.namespace, w.pod, w.intf),
            format!("{}:{}", w.peer_pod, w.peer_intf),
            w.kind,
            w.state,
            node,
            n(tx_frames),
            n(rx_frames),
            n(dropped),
            hex_id(w),
            w.reason
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_rows_keep_their_keys_in_order_and_null_unread_counters() {
        let w = WireEnd {
            id: 0xab,
            namespace: "lab".into(),
            link_uid: 1,
            pod: "r1".into(),
            intf: "eth1".into(),
            peer_pod: "r2".into(),
            peer_intf: "eth2".into(),
            kind: "veth".into(),
            state: "up".into(),
            counted: false,
            tx_frames: 9,
            ..Default::default()
        };
        let out = serde_json::to_string(&Json(&w)).unwrap();
        assert_eq!(
            out,
            r#"{"id":"00000000000000ab","namespace":"lab","link_uid":1,"pod":"r1","intf":"eth1","peer_pod":"r2","peer_intf":"eth2","peer_node":"","kind":"veth","state":"up","vni":0,"tx_frames":null,"tx_bytes":null,"rx_frames":null,"rx_bytes":null,"dropped":null,"reason":""}"#
        );
        let counted = WireEnd { counted: true, ..w };
        let v: serde_json::Value = serde_json::to_value(Json(&counted)).unwrap();
        assert_eq!((v["tx_frames"].as_u64(), v["rx_frames"].as_u64()), (Some(9), Some(0)));
    }
}
