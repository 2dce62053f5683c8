//! The wires crate's boundaries of a wire end ([`WireEnd`]), one function each: its
//! metric labels, its kernel counters, and the node-to-node `End` message it is told
//! to a peer node as (and read back from).

use std::net::IpAddr;

use crate::ids::wire_id;
use crate::metrics::WireLabels;
use crate::plane::GrpcEnd;
use weft_kernel::LinkStats;
use weft_link::{LinkKind, UnknownName, WireCounters, WireEnd, WireState};
use weft_rpc::wire::End;

/// An end's metric labels: the series of every per-wire family are keyed by them.
pub fn labels(end: &WireEnd) -> WireLabels {
    WireLabels {
        namespace: end.namespace.clone(),
        link_uid: end.link_uid.to_string(),
        pod: end.local_pod.clone(),
        intf: end.local_intf.clone(),
        peer_node: end.peer_node.clone(),
        kind: end.kind.as_str().to_string(),
    }
}

/// The worker a gRPC end needs, its peer end on the node at `peer`.
pub fn grpc_end(end: &WireEnd, peer: IpAddr) -> GrpcEnd {
    GrpcEnd {
        id: end.id,
        peer_id: end.peer_id,
        peer,
        labels: labels(end),
        up: end.state.is_up(),
    }
}

/// An end's interface counters as operators read them (tx: sent by the pod; rx:
/// delivered to it; drops either way).
pub fn counters(st: &LinkStats) -> WireCounters {
    WireCounters {
        tx_frames: st.tx_packets,
        tx_bytes: st.tx_bytes,
        rx_frames: st.rx_packets,
        rx_bytes: st.rx_bytes,
        dropped: st.rx_dropped + st.tx_dropped,
    }
}

/// The `Ends` message telling the peer node about `end`: `present` false says it is gone.
/// The message carries the identity, the kind and the VNI (0: none); interface names,
/// netns and state stay on this node.
pub(crate) fn to_message(end: &WireEnd, present: bool) -> End {
    End {
        namespace: end.namespace.clone(),
        link_uid: end.link_uid,
        pod: end.local_pod.clone(),
        peer_pod: end.peer_pod.clone(),
        kind: end.kind.as_str().into(),
        vni: end.vni.unwrap_or(0),
        present,
        wire_id: end.id,
        control: None,
    }
}

/// The caller's end as an `Ends` message describes it (on the called node, whose pod is
/// its peer): what the message does not carry is left empty, its state is `pending` (an
/// offer) or `down` (gone). A kind this binary does not know is refused.
pub(crate) fn from_message(m: &End) -> Result<WireEnd, UnknownName> {
    let kind: LinkKind = m.kind.parse()?;
    Ok(WireEnd {
        namespace: m.namespace.clone(),
        link_uid: m.link_uid,
        local_pod: m.pod.clone(),
        local_intf: String::new(),
        peer_pod: m.peer_pod.clone(),
        peer_intf: String::new(),
        peer_node: String::new(),
        kind,
        id: m.wire_id,
        peer_id: wire_id(&m.namespace, m.link_uid, &m.peer_pod),
        state: if m.present { WireState::Pending } else { WireState::Down },
        vni: (m.vni != 0).then_some(m.vni),
        netns: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(kind: LinkKind, vni: Option<u32>) -> WireEnd {
        WireEnd {
            namespace: "lab".into(),
            link_uid: 4,
            local_pod: "r1".into(),
            local_intf: "eth1".into(),
            peer_pod: "r2".into(),
            peer_intf: "eth2".into(),
            peer_node: "192.0.2.2".into(),
            kind,
            id: wire_id("lab", 4, "r1"),
            peer_id: wire_id("lab", 4, "r2"),
            state: WireState::Up,
            vni,
            netns: "/run/netns/r1".into(),
        }
    }

    #[test]
    fn a_message_reads_back_as_the_callers_end() {
        let ours = end(LinkKind::Vxlan, Some(5004));
        let m = to_message(&ours, true);
        assert_eq!((m.kind.as_str(), m.vni, m.wire_id), ("vxlan", 5004, ours.id));
        let theirs = from_message(&m).unwrap();
        assert_eq!((theirs.id, theirs.peer_id), (ours.id, ours.peer_id));
        assert_eq!(
            (theirs.kind, theirs.vni, theirs.state),
            (LinkKind::Vxlan, Some(5004), WireState::Pending)
        );
        assert_eq!((theirs.local_pod.as_str(), theirs.peer_pod.as_str()), ("r1", "r2"));

        let gone = from_message(&to_message(&end(LinkKind::Grpc, None), false)).unwrap();
        assert_eq!(
            (gone.kind, gone.vni, gone.state),
            (LinkKind::Grpc, None, WireState::Down)
        );
    }

    #[test]
    fn a_message_of_an_unknown_kind_is_refused() {
        let mut m = to_message(&end(LinkKind::Veth, None), true);
        m.kind = "geneve".into();
        assert_eq!(
            from_message(&m).unwrap_err().to_string(),
            "unknown link kind \"geneve\""
        );
    }

    #[test]
    fn labels_and_counters() {
        let l = labels(&end(LinkKind::Grpc, None));
        assert_eq!(
            (l.kind.as_str(), l.link_uid.as_str(), l.pod.as_str()),
            ("grpc", "4", "r1")
        );
        let st = LinkStats {
            rx_packets: 1,
            tx_packets: 2,
            rx_bytes: 3,
            tx_bytes: 4,
            rx_dropped: 5,
            tx_dropped: 6,
        };
        let c = counters(&st);
        assert_eq!(
            (c.tx_frames, c.tx_bytes, c.rx_frames, c.rx_bytes, c.dropped),
            (2, 4, 1, 3, 11)
        );
    }
}
