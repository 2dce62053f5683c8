//! The store's unit tests, by topic; the helpers they share are here.

use std::collections::HashSet;
use std::net::IpAddr;

use weft_link::{LinkKind, WireEnd, WireState};

use super::*;

mod alloc;
mod faults;
mod host_ports;
mod schema;
mod wires;

fn spec(cid: &str, ranges: &[&str]) -> NewAttachment {
    NewAttachment {
        key: AttachmentKey {
            network: "weft".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
        },
        netns: format!("/run/netns/{cid}"),
        pod: PodRef {
            namespace: "default".into(),
            name: cid.into(),
            uid: String::new(),
        },
        host_ifname: format!("h{cid}"),
        mtu: 1500,
        ranges: ranges.iter().map(|r| r.parse().unwrap()).collect(),
        ports: Vec::new(),
        requested: Vec::new(),
        pod_mac: None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn route(dst: &str, gw: &str) -> InstalledRoute {
    InstalledRoute {
        dst: dst.parse().unwrap(),
        gateway: ip(gw),
    }
}

fn port(host: Option<&str>, p: u16, proto: &str) -> PortRequest {
    PortRequest {
        host_ip: host.map(|h| h.parse().unwrap()),
        family: None,
        host_port: p,
        protocol: proto.into(),
        container_port: 80,
    }
}

fn created(b: BeginAdd) -> Attachment {
    match b {
        BeginAdd::Created(a) => a,
        BeginAdd::Existing(a) => panic!("expected a new attachment, got existing {a:?}"),
    }
}

fn open() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("weft.db")).unwrap();
    (dir, db)
}

#[test]
fn a_pod_without_a_namespace_is_in_default() {
    let pod = |namespace: &str| PodRef {
        namespace: namespace.into(),
        name: "web".into(),
        uid: String::new(),
    };
    assert_eq!(pod("").namespace_or_default(), "default");
    assert_eq!(pod("default").namespace_or_default(), "default");
    assert_eq!(pod("shop").namespace_or_default(), "shop");
    // What people read keeps telling the two apart: the runtime gave no namespace.
    assert_eq!(pod("").describe("c1"), "pod web");
}
