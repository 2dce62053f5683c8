//! Tests of the carriers' pure decisions and of the registry.

use weft_link::{DownBy, LinkKind};

use super::{Carriers, grpc, veth, vxlan};
use crate::dataplane::DataPlane;

#[test]
fn carrier_by_intent_depends_on_the_kind() {
    assert!(!veth::admin_up(Some(DownBy::Named)));
    // The far end of a pair stays up, so it shows NO-CARRIER.
    assert!(veth::admin_up(Some(DownBy::Peer)));
    assert!(veth::admin_up(None));
    assert!(vxlan::proto_down(Some(DownBy::Peer)));
    assert!(vxlan::proto_down(Some(DownBy::Named)));
    assert!(!vxlan::proto_down(None));
    assert!(!grpc::node_end_up(Some(DownBy::Named)));
    assert!(!grpc::node_end_up(Some(DownBy::Peer)));
    assert!(grpc::node_end_up(None));
}

#[test]
fn every_kind_has_its_carrier() {
    let all = Carriers::<DataPlane>::standard();
    for &kind in LinkKind::ALL {
        assert_eq!(all.get(kind).kind(), kind);
    }
    assert!(!all.get(LinkKind::Grpc).kernel_counters());
    assert!(all.get(LinkKind::Vxlan).kernel_counters());
    assert!(all.get(LinkKind::Vxlan).waiting("r2").contains("VNI"));
    assert!(all.get(LinkKind::Grpc).waiting("r2").contains("to build its end"));
}
