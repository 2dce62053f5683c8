//! Nodes from the Kubernetes API to the kernel: the kube source's Node cache, against
//! the in-process list/watch server, drives the node network's run loop in a node
//! namespace. After each change to the Node objects (a node added, its podCIDRs
//! changed, its address changed, deleted, and a relist after `410 Gone`) the kernel
//! holds exactly the routes and FDB entries the objects say.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Node, node};
use weft_fakekube::FakeApiServer;
use weft_kernel::testutil::privileged;
use weft_nodenet::*;
use weft_topology::{ClusterNode, KubeSource, TopologySource};

fn put(server: &FakeApiServer, n: &ClusterNode) {
    server.put(&n.to_node());
}

/// Waits (up to 10 s) until the kernel holds what `want` says; panics with what it
/// holds otherwise. Returns how long it took.
fn until<T: PartialEq + std::fmt::Debug>(what: &str, mut read: impl FnMut() -> T, want: T) -> Duration {
    let start = Instant::now();
    loop {
        let got = read();
        if got == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: still {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mac(name: &str) -> String {
    mac_string(&vxlan_mac(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_events_reach_the_kernel() {
    if !privileged() {
        return;
    }
    let server = FakeApiServer::new();
    put(&server, &node("n1", "172.30.1.2", &["10.244.1.0/24"]));
    put(&server, &node("n2", "172.30.1.3", &["10.244.2.0/24"]));
    let source = KubeSource::start(server.client(), "n1".into());
    let host = Node::new(1500);
    let kernel = host.kernel();
    let metrics = weft_telemetry::Metrics::new("test", "test");
    let engine = Arc::new(NodeNetwork::new(
        Config {
            node_name: "n1".into(),
            node_address: None,
            routing: PodRouting::Auto,
            vxlan_port: DEFAULT_VXLAN_PORT,
            vxlan_vni: 7,
            masquerade: true,
            no_masquerade: vec![],
            // Long: every change below must be picked up from the watch, not a resync.
            resync: Duration::from_secs(3600),
            export: None,
        },
        Some(source.clone() as Arc<dyn TopologySource>),
        kernel,
        &metrics,
        Arc::new(|| Box::pin(async { Vec::new() })),
    ));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(engine.clone().run(async move {
        let _ = stop_rx.await;
    }));
    let mut view = engine.view();

    let h = &host;
    let routes = move || tokio::task::block_in_place(|| h.routes());
    let fdb = move || tokio::task::block_in_place(|| h.fdb());

    until(
        "n2 on-link: a direct route",
        routes,
        vec![("10.244.2.0/24".into(), "172.30.1.3".into(), "uplink".into())],
    );
    view.wait_for(|v| v.ranges == vec!["10.244.1.0/24".parse().unwrap()])
        .await
        .unwrap();

    // Added: n3 behind the router, through VXLAN.
    put(&server, &node("n3", "172.30.3.2", &["10.244.3.0/24"]));
    let took = until(
        "n3 added",
        routes,
        vec![
            ("10.244.2.0/24".into(), "172.30.1.3".into(), "uplink".into()),
            ("10.244.3.0/24".into(), "10.244.3.0".into(), VXLAN_DEVICE.into()),
        ],
    );
    assert!(took < Duration::from_secs(2), "n3 reached the kernel in {took:?}");
    until("n3's FDB entry", fdb, vec![(mac("n3"), "172.30.3.2".into())]);

    // podCIDRs changed.
    put(&server, &node("n2", "172.30.1.3", &["10.244.12.0/24"]));
    until(
        "n2's podCIDR changed",
        routes,
        vec![
            ("10.244.12.0/24".into(), "172.30.1.3".into(), "uplink".into()),
            ("10.244.3.0/24".into(), "10.244.3.0".into(), VXLAN_DEVICE.into()),
        ],
    );

    // Address changed.
    put(&server, &node("n3", "172.30.7.2", &["10.244.3.0/24"]));
    until("n3 readdressed", fdb, vec![(mac("n3"), "172.30.7.2".into())]);

    // Deleted.
    assert!(server.delete::<k8s_openapi::api::core::v1::Node>(None, "n3"));
    until(
        "n3 deleted",
        routes,
        vec![("10.244.12.0/24".into(), "172.30.1.3".into(), "uplink".into())],
    );
    until("n3's FDB entry gone", fdb, vec![]);
    assert!(host.link(VXLAN_DEVICE).is_none(), "no VXLAN peer left: no device");

    // The watch is cut and the history compacted while n4 arrives: the watcher is told
    // 410 Gone, relists, and n4 reaches the kernel.
    server.disconnect::<k8s_openapi::api::core::v1::Node>();
    put(&server, &node("n4", "172.30.4.2", &["10.244.4.0/24"]));
    server.compact();
    server.reconnect::<k8s_openapi::api::core::v1::Node>();
    until(
        "n4 after the relist",
        routes,
        vec![
            ("10.244.12.0/24".into(), "172.30.1.3".into(), "uplink".into()),
            ("10.244.4.0/24".into(), "10.244.4.0".into(), VXLAN_DEVICE.into()),
        ],
    );
    assert!(server.count("list nodes") >= 2, "relisted: {:?}", server.log());

    // This node's own podCIDRs changed: announced to the handler, counted.
    put(&server, &node("n1", "172.30.1.2", &["10.244.100.0/24"]));
    view.wait_for(|v| v.ranges == vec!["10.244.100.0/24".parse().unwrap()])
        .await
        .unwrap();
    assert_eq!(
        metrics
            .families::<weft_nodenet::NodeNetMetrics>()
            .pod_cidr_changes
            .get(),
        1
    );

    let _ = stop_tx.send(());
    run.await.unwrap();
}
