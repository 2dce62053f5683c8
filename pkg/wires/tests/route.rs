//! Property tests for the receiving side of gRPC wires: a frame from a peer node goes
//! into the end its wire id names, and only when that end's peer is the sender. A
//! batch decoded from any bytes is routed without panicking. `fuzz/` drives the same
//! code (`wire_batch`) with raw bytes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use prost::Message;
use weft_rpc::wire::{Frame, FrameBatch};
use weft_wires::dataplane::{Route, route};

/// A wire end as the router sees it; `id` lets a test see which end got a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
struct End {
    id: u64,
    peer: IpAddr,
}

fn node(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, i))
}

/// Ends keyed by id, their peers from a few nodes so that ids held for other peers
/// are common.
fn ends() -> impl Strategy<Value = HashMap<u64, End>> {
    prop::collection::hash_map(any::<u64>(), 1u8..=3, 0..12)
        .prop_map(|m| m.into_iter().map(|(id, n)| (id, End { id, peer: node(n) })).collect())
}

/// Ends plus frames whose ids are mostly ids of those ends, the rest anything.
fn ends_and_frames() -> impl Strategy<Value = (HashMap<u64, End>, Vec<Frame>, IpAddr)> {
    ends().prop_flat_map(|ends| {
        let ids: Vec<u64> = ends.keys().copied().collect();
        let id = if ids.is_empty() {
            any::<u64>().boxed()
        } else {
            prop_oneof![3 => prop::sample::select(ids), 1 => any::<u64>()].boxed()
        };
        let frame = (id, prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(wire_id, data)| Frame {
            wire_id,
            data: data.into(),
        });
        (
            Just(ends),
            prop::collection::vec(frame, 0..32),
            (1u8..=4).prop_map(node),
        )
    })
}

/// Routes `frames` as dispatch does and returns what each end received, in order.
fn deliver(ends: &HashMap<u64, End>, frames: &[Frame], from: IpAddr) -> HashMap<u64, Vec<Frame>> {
    let mut got: HashMap<u64, Vec<Frame>> = HashMap::new();
    for f in frames {
        match route(ends, |e| e.peer, from, f.wire_id) {
            Route::Deliver(end) => got.entry(end.id).or_default().push(f.clone()),
            Route::OtherPeer => assert!(
                ends[&f.wire_id].peer != from,
                "{f:?} dropped though its end is held for {from}"
            ),
            Route::Unknown => assert!(!ends.contains_key(&f.wire_id), "{f:?} dropped though its end exists"),
        }
    }
    got
}

proptest! {
    #[test]
    fn frames_never_cross_wires((ends, frames, from) in ends_and_frames()) {
        let got = deliver(&ends, &frames, from);
        for (id, received) in &got {
            let end = &ends[id];
            prop_assert_eq!(end.peer, from, "end {} got frames from {} but is held for {}", id, from, end.peer);
            for f in received {
                prop_assert_eq!(f.wire_id, *id, "a frame for wire {} reached wire {}", f.wire_id, id);
            }
        }
        // Nothing meant for a held end is lost, and order within a wire is kept.
        for (id, end) in &ends {
            let want: Vec<&Frame> = frames.iter().filter(|f| f.wire_id == *id && end.peer == from).collect();
            let have: Vec<&Frame> = got.get(id).map(|v| v.iter().collect()).unwrap_or_default();
            prop_assert_eq!(want, have);
        }
    }

    #[test]
    fn the_end_delivered_to_is_the_one_in_the_map((ends, frames, from) in ends_and_frames()) {
        for f in &frames {
            if let Route::Deliver(end) = route(&ends, |e| e.peer, from, f.wire_id) {
                prop_assert!(std::ptr::eq(end, &ends[&f.wire_id]));
            }
        }
    }

    #[test]
    fn an_encoded_batch_routes_the_same_after_decoding((ends, frames, from) in ends_and_frames()) {
        let bytes = FrameBatch { frames: frames.clone() }.encode_to_vec();
        let decoded = FrameBatch::decode(bytes.as_slice()).unwrap();
        prop_assert_eq!(&decoded.frames, &frames);
        prop_assert_eq!(deliver(&ends, &decoded.frames, from), deliver(&ends, &frames, from));
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panicking(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        (ends, _, from) in ends_and_frames(),
    ) {
        if let Ok(batch) = FrameBatch::decode(bytes.as_slice()) {
            deliver(&ends, &batch.frames, from);
            // Whatever decoded re-encodes to something that decodes the same.
            let again = FrameBatch::decode(batch.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(again, batch);
        }
    }
}
