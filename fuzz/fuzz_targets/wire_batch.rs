//! A frame batch from a peer node, as the wire service receives it: any bytes decode
//! to a batch or fail, never panic, and routing the decoded frames never hands a
//! frame to an end other than the one its wire id names, held for the sender.

#![no_main]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use prost::Message;
use weft_rpc::wire::FrameBatch;
use weft_wires::dataplane::{Route, route};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
const C: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 3));

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = FrameBatch::decode(data) else {
        return;
    };
    // Ends by id, each tagged with its own id so a misroute shows.
    let ends: HashMap<u64, (u64, IpAddr)> = [
        (0, A),
        (1, A),
        (2, B),
        (3, A),
        (0x0102_0304_0506_0708, B),
        (u64::MAX, C),
    ]
    .into_iter()
    .map(|(id, peer)| (id, (id, peer)))
    .collect();
    for from in [A, B, C] {
        for f in &batch.frames {
            match route(&ends, |e| e.1, from, f.wire_id) {
                Route::Deliver(end) => {
                    assert_eq!(end.0, f.wire_id, "frame for {} went to {}", f.wire_id, end.0);
                    assert_eq!(end.1, from);
                }
                Route::OtherPeer => assert_ne!(ends[&f.wire_id].1, from),
                Route::Unknown => assert!(!ends.contains_key(&f.wire_id)),
            }
        }
    }
    let again = FrameBatch::decode(batch.encode_to_vec().as_slice()).expect("re-encoded batch decodes");
    assert_eq!(again, batch);
});
