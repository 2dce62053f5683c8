//! Samples of every link end from the daemons (their wires with counters, their link
//! settings), as `link stats`, `lab events`, `lab serve` and `lab graph` read them;
//! what a sample means is `weft_link::live`'s.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use weft_lab::Lab;
use weft_link::live::{EndSample, Sample};
use weft_link::{EmulationCounts, WireCounters};
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{LinkShowRequest, WiresRequest};

/// A daemon to ask: its node's name (empty outside a lab) and its socket.
pub type Daemon = (String, PathBuf);

/// Every node's daemon of `lab`.
pub fn lab_daemons(lab: &Lab) -> Vec<Daemon> {
    lab.spec
        .nodes
        .iter()
        .map(|n| (n.name.clone(), lab.socket(&n.name)))
        .collect()
}

/// An impairment map as `delay 20ms loss 1%` in the parameters' order (empty: none).
pub fn impairment_text(map: &HashMap<String, String>) -> String {
    let m: BTreeMap<&String, &String> = map.iter().collect();
    weft_link::Impairment::from_map(m)
        .map(|i| i.to_string())
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// What the daemons report now. A daemon that does not answer reports nothing: its
/// ends are missing from the sample (a lab that is down samples empty).
pub async fn sample(daemons: &[Daemon]) -> Sample {
    let mut ends = BTreeMap::new();
    for (node, socket) in daemons {
        let Ok(ch) = super::connect(socket).await else {
            continue;
        };
        let mut c = AdminClient::new(ch);
        let Ok(wires) = c.wires(WiresRequest {}).await else {
            continue;
        };
        let settings: HashMap<(String, String, String), weft_rpc::admin::LinkInfo> =
            match c.link_show(LinkShowRequest::default()).await {
                Ok(r) => r
                    .into_inner()
                    .links
                    .into_iter()
                    .map(|l| ((l.namespace.clone(), l.pod.clone(), l.intf.clone()), l))
                    .collect(),
                Err(_) => HashMap::new(),
            };
        for w in wires.into_inner().wires {
            let l = settings.get(&(w.namespace.clone(), w.pod.clone(), w.intf.clone()));
            let e = EndSample {
                node: node.clone(),
                counters: w.counted.then_some(WireCounters {
                    tx_frames: w.tx_frames,
                    tx_bytes: w.tx_bytes,
                    rx_frames: w.rx_frames,
                    rx_bytes: w.rx_bytes,
                    dropped: w.dropped,
                }),
                emulation: w.emulation.map(|m| EmulationCounts {
                    lost: m.lost,
                    overflow: m.overflow,
                    ecn_marked: m.ecn_marked,
                    corrupted: m.corrupted,
                    duplicated: m.duplicated,
                    reordered: m.reordered,
                }),
                down: l.is_some_and(|l| l.down),
                overridden: l.is_some_and(|l| l.overridden),
                impairment: l.map(|l| impairment_text(&l.active)).unwrap_or_default(),
                last_change: l.map(|l| l.last_change.clone()).unwrap_or_default(),
                namespace: w.namespace,
                link_uid: w.link_uid,
                pod: w.pod,
                intf: w.intf,
                peer_pod: w.peer_pod,
                peer_intf: w.peer_intf,
                kind: w.kind,
                state: w.state,
            };
            ends.insert(e.name(), e);
        }
    }
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Sample { at_ms, ends }
}
