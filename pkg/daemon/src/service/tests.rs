//! The services over fake seams: CNI calls relayed and their errors as statuses, the
//! admin calls' answers.

use weft_store::{AttachmentKey, HeldPort, PodRef, PortMapping, RangeUsage, StoreError};

use super::*;
use crate::seams::StateSummary;

/// Node state from memory; `None` answers as a store that cannot be reached.
struct FakeState {
    summary: Option<StateSummary>,
    ports: Vec<HeldPort>,
}

impl AdminState for FakeState {
    async fn summary(&self) -> Result<StateSummary, StoreError> {
        self.summary.clone().ok_or(StoreError::Closed)
    }
    async fn host_ports(&self) -> Result<Vec<HeldPort>, StoreError> {
        Ok(self.ports.clone())
    }
    fn location(&self) -> String {
        "/var/lib/weft/state.db".into()
    }
}

fn admin(state: FakeState) -> AdminService<FakeState> {
    AdminService::new(
        state,
        "node-a".into(),
        42,
        {
            let ready = Readiness::default();
            ready.set(true);
            ready
        },
        Arc::new(|| 3),
        Arc::new(CallLog::new(8)),
    )
}

#[tokio::test]
async fn status_and_ports_report_the_node_state() {
    let range: ipnet::IpNet = "10.244.1.0/24".parse().unwrap();
    let held = HeldPort {
        mapping: PortMapping {
            host_ip: None,
            host_port: 8080,
            protocol: "tcp".into(),
            container_ip: "10.244.1.5".parse().unwrap(),
            container_port: 80,
        },
        key: AttachmentKey {
            network: "weft".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
        },
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
            uid: String::new(),
        },
        host_ifname: "weft0123456789a".into(),
    };
    let svc = admin(FakeState {
        summary: Some(StateSummary {
            ranges: vec![RangeUsage {
                range,
                gateway: "10.244.1.1".parse().unwrap(),
                capacity: 253,
                allocated: 7,
            }],
            ready_attachments: 5,
        }),
        ports: vec![held],
    });

    let status = svc.status(Request::new(StatusRequest {})).await.unwrap().into_inner();
    assert_eq!(status.node_name, "node-a");
    assert_eq!(status.attachments, 5);
    assert_eq!(status.pending_teardowns, 3);
    assert!(status.ready);
    assert_eq!(status.state_path, "/var/lib/weft/state.db");
    assert_eq!(status.schema_version, SCHEMA_VERSION);
    assert_eq!(
        status.ranges,
        vec![RangeUsageMsg {
            cidr: "10.244.1.0/24".into(),
            gateway: "10.244.1.1".into(),
            capacity: 253,
            allocated: 7,
        }]
    );

    let ports = svc
        .ports(Request::new(PortsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .ports;
    assert_eq!(ports.len(), 1);
    let p = &ports[0];
    assert_eq!(
        (p.host_ip.as_str(), p.host_port, p.protocol.as_str()),
        ("", 8080, "tcp"),
        "a wildcard host address travels as empty"
    );
    assert_eq!((p.container_ip.as_str(), p.container_port), ("10.244.1.5", 80));
    assert_eq!(
        (p.pod_namespace.as_str(), p.pod_name.as_str(), p.container_id.as_str()),
        ("default", "web", "c1")
    );
    // Without a wire engine there are no wire ends to report.
    let wires = svc.wires(Request::new(WiresRequest {})).await.unwrap().into_inner();
    assert!(wires.wires.is_empty());
}

#[tokio::test]
async fn a_state_that_cannot_answer_makes_status_unavailable() {
    let svc = admin(FakeState {
        summary: None,
        ports: Vec::new(),
    });
    let err = svc.status(Request::new(StatusRequest {})).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("closed"), "{}", err.message());
}

/// A wiring whose captures yield endless 100-byte frames of pod r1's e1 only.
struct CapturingWiring;

impl Wiring for CapturingWiring {
    fn pod_added(&self, _: crate::seams::WiredPod) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn pod_removed(&self, _: crate::seams::WiredPod) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn wires(&self) -> futures::future::BoxFuture<'_, Vec<WireReport>> {
        Box::pin(async { Vec::new() })
    }
    fn capture(
        &self,
        link: LinkRef,
        snaplen: u32,
    ) -> futures::future::BoxFuture<'_, Result<crate::seams::FrameStream, LinkError>> {
        Box::pin(async move {
            if (link.pod.as_str(), link.intf.as_str()) != ("r1", "e1") {
                return Err(LinkError::NotFound(weft_link::EndNotFound::Missing {
                    namespace: link.namespace,
                    pod: link.pod,
                    intf: link.intf,
                }));
            }
            let frames = futures::stream::repeat_with(move || {
                Ok(weft_link::CapturedFrame {
                    unix_nanos: 7,
                    outgoing: true,
                    original_len: 100,
                    data: vec![1; 100.min(snaplen as usize)],
                })
            });
            Ok(frames.boxed())
        })
    }
}

fn capture_request(pod: &str, max_frames: u64) -> Request<CaptureRequest> {
    Request::new(CaptureRequest {
        link: Some(LinkRefMsg {
            namespace: String::new(),
            pod: pod.into(),
            intf: "e1".into(),
        }),
        max_frames,
        snaplen: 60,
        ..Default::default()
    })
}

#[tokio::test]
async fn a_capture_streams_bounded_frames_and_refuses_what_it_cannot_serve() {
    let state = || FakeState {
        summary: None,
        ports: Vec::new(),
    };
    let err = admin(state()).capture(capture_request("r1", 3)).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "no wiring");

    let svc = admin(state())
        .with_wiring(Arc::new(CapturingWiring))
        .with_captures(Captures::new(1));
    let err = svc.capture(capture_request("r9", 3)).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("r9:e1"), "{}", err.message());

    let stream = svc.capture(capture_request("r1", 3)).await.unwrap().into_inner();
    let err = svc.capture(capture_request("r1", 3)).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "one at a time here");
    assert!(err.message().contains("runs 1 captures already"), "{}", err.message());
    let frames: Vec<_> = stream.collect().await;
    assert_eq!(frames.len(), 3, "the count ends it");
    let f = frames[0].as_ref().unwrap();
    assert_eq!(
        (f.data.len(), f.original_length, f.outgoing, f.unix_nanos),
        (60, 100, true, 7)
    );
    assert!(
        svc.capture(capture_request("r1", 1)).await.is_ok(),
        "the place is free again"
    );
}

#[test]
fn a_wire_end_is_listed_with_its_names_and_counters() {
    use weft_link::{LinkKind, WireCounters, WireEnd, WireState};
    let end = WireEnd {
        namespace: "lab".into(),
        link_uid: 3,
        local_pod: "r1".into(),
        local_intf: "eth1".into(),
        peer_pod: "r2".into(),
        peer_intf: "eth2".into(),
        peer_node: "192.0.2.2".into(),
        kind: LinkKind::Vxlan,
        id: 7,
        peer_id: 8,
        state: WireState::Down,
        vni: Some(5003),
        netns: "/run/netns/r1".into(),
    };
    let counters = WireCounters {
        tx_frames: 1,
        tx_bytes: 2,
        rx_frames: 3,
        rx_bytes: 4,
        dropped: 5,
    };
    let m = wire_message(WireReport {
        end: end.clone(),
        counters: Some(counters),
        emulation: Some(weft_link::EmulationCounts {
            lost: 5,
            overflow: 1,
            ..Default::default()
        }),
        reason: String::new(),
    });
    assert_eq!(
        (m.pod.as_str(), m.intf.as_str(), m.peer_node.as_str()),
        ("r1", "eth1", "192.0.2.2")
    );
    assert_eq!((m.kind.as_str(), m.state.as_str(), m.vni), ("vxlan", "down", 5003));
    assert_eq!((m.id, m.peer_id, m.link_uid), (7, 8, 3));
    assert!(m.counted);
    assert_eq!(
        (m.tx_frames, m.tx_bytes, m.rx_frames, m.rx_bytes, m.dropped),
        (1, 2, 3, 4, 5)
    );
    let e = m.emulation.expect("emulation counts");
    assert_eq!((e.lost, e.overflow, e.ecn_marked), (5, 1, 0));

    let m = wire_message(WireReport {
        end: WireEnd {
            kind: LinkKind::Grpc,
            vni: None,
            ..end
        },
        counters: None,
        emulation: None,
        reason: "peer pod r2 is not running on any node yet".into(),
    });
    assert_eq!((m.kind.as_str(), m.vni, m.counted, m.tx_frames), ("grpc", 0, false, 0));
    assert_eq!(m.reason, "peer pod r2 is not running on any node yet");
    assert!(m.emulation.is_none());
}
