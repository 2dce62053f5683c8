//! The announcements over real gRPC on loopback: the service's admission and the node
//! it hands the engine (a real policy engine over a fake kernel), and the announcer
//! against peers that answer, answer late, or are not there.
//!
//! Every peer listens on its own loopback address (127.0.0.2, .3, ...) and the same
//! port, as nodes do on the wire port; the announcer calls from 127.0.0.1.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::TcpListener;
use weft_policy::nft::Observed;
use weft_policy::{Announced, Announcer, PolicyEngine, PolicyKernel, PolicyMetrics, Taken};
use weft_rpc::wire::policy_client::PolicyClient;
use weft_rpc::wire::{AnnounceOutcome, AnnounceReply, AnnounceRequest, AnnouncedPod, Hello};
use weft_telemetry::Metrics;
use weft_topology::{ClusterNode, MemorySource, PolicyPod, TopologySource};
use weft_wires::metrics::RejectLabels;
use weft_wiretls::{NoObserver, WireConnector, WireSecurity};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn node(name: &str, address: &str, cidr: &str) -> ClusterNode {
    ClusterNode {
        name: name.into(),
        addresses: vec![ip(address)],
        pod_cidrs: vec![cidr.parse().unwrap()],
        ..ClusterNode::default()
    }
}

/// A kernel that holds nothing and takes every transaction.
struct NullKernel;

impl PolicyKernel for NullKernel {
    fn observe(&mut self) -> Result<Observed, weft_kernel::KernelError> {
        Ok(Observed::default())
    }
    fn apply(&mut self, _: &str) -> Result<(), weft_kernel::KernelError> {
        Ok(())
    }
    fn copy_dns_answers(&mut self, _: bool) -> Result<(), weft_kernel::KernelError> {
        Ok(())
    }
}

/// Serves `Policy` over `sink` on `addr` (its port 0: any), the wire port's way
/// (`weft_wiretls::incoming`); returns the bound address and the refusals' counter.
async fn serve<A: Announcements>(
    addr: SocketAddr,
    sink: Arc<A>,
    source: Arc<dyn TopologySource>,
    security: WireSecurity,
) -> (SocketAddr, Family<RejectLabels, Counter>) {
    let listener = TcpListener::bind(addr).await.unwrap();
    let bound = listener.local_addr().unwrap();
    let rejected = Family::<RejectLabels, Counter>::default();
    let incoming = weft_wiretls::incoming(
        listener,
        security,
        Arc::new(NoObserver),
        &tokio::runtime::Handle::current(),
    );
    let server = tonic::transport::Server::builder()
        .add_service(PolicyService::server(
            sink,
            source,
            rejected.clone(),
            tokio::runtime::Handle::current(),
        ))
        .serve_with_incoming(incoming);
    tokio::spawn(server);
    (bound, rejected)
}

async fn client(to: SocketAddr) -> PolicyClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{to}"))
        .unwrap()
        .connect_with_connector(WireConnector::new(WireSecurity::Insecure))
        .await
        .unwrap();
    PolicyClient::new(channel)
}

fn request(claimed: &str, claimed_name: &str, pods: &[(&str, &[&str])]) -> AnnounceRequest {
    AnnounceRequest {
        from: Some(Hello {
            node: claimed_name.into(),
            address: claimed.into(),
        }),
        pods: pods
            .iter()
            .map(|(name, ips)| AnnouncedPod {
                namespace: "x".into(),
                name: (*name).into(),
                ips: ips.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
    }
}

fn outcomes(reply: &AnnounceReply) -> Vec<(AnnounceOutcome, String)> {
    reply.results.iter().map(|r| (r.outcome(), r.reason.clone())).collect()
}

fn count(rejected: &Family<RejectLabels, Counter>, reason: &'static str) -> u64 {
    rejected.get_or_create(&RejectLabels { reason }).get()
}

#[test]
fn the_caller_is_the_one_node_at_its_address() {
    let nodes = [
        node("n1", "10.0.0.1", "10.1.1.0/24"),
        node("n2", "10.0.0.2", "10.1.2.0/24"),
        node("n3", "10.0.0.3", "10.1.3.0/24"),
        node("n3-twin", "10.0.0.3", "10.1.4.0/24"),
    ];
    assert_eq!(caller(Some(ip("10.0.0.2")), None, &nodes), Ok("n2".into()));
    assert_eq!(caller(Some(ip("10.0.0.2")), Some("10.0.0.2"), &nodes), Ok("n2".into()));
    let refused = [
        (caller(None, None, &nodes), "no_address"),
        (caller(Some(ip("10.0.0.2")), Some("n2"), &nodes), "bad_claim"),
        (
            caller(Some(ip("10.0.0.2")), Some("10.0.0.1"), &nodes),
            "address_mismatch",
        ),
        (caller(Some(ip("10.0.0.9")), None, &nodes), "unknown_node"),
        (caller(Some(ip("10.0.0.3")), None, &nodes), "ambiguous_node"),
    ];
    for (r, reason) in refused {
        let r = r.unwrap_err();
        assert_eq!(r.reason(), reason);
        assert_ne!(r.status().code(), tonic::Code::Ok);
    }
    let unknown = caller(Some(ip("10.0.0.9")), None, &nodes).unwrap_err().status();
    assert_eq!(unknown.code(), tonic::Code::PermissionDenied);
    assert!(unknown.message().contains("no node of the cluster"), "{unknown:?}");
}

/// The real engine behind the real service: the node it is told of is the one at the
/// connection's address, whatever the `Hello` names; strangers, liars and oversized
/// calls are refused and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_hands_the_engine_the_node_at_the_callers_address() {
    let source = Arc::new(MemorySource::default());
    // This node (the server) at 127.0.0.2; the caller, n2, at 127.0.0.1.
    source.put_node(node("n1", "127.0.0.2", "10.0.1.0/24"));
    source.put_node(node("n2", "127.0.0.1", "10.0.2.0/24"));
    source.put_node(node("n3", "127.0.0.3", "10.0.3.0/24"));
    let pod = |name: &str, node: &str, ips: &[&str]| PolicyPod {
        namespace: "x".into(),
        name: name.into(),
        node: node.into(),
        ips: ips.iter().map(|s| ip(s)).collect(),
        ..PolicyPod::default()
    };
    source.put_pod(pod("old", "n2", &["10.0.2.5"]));
    source.put_pod(pod("starting", "n2", &[]));
    source.put_pod(pod("elsewhere", "n3", &[]));
    let metrics = Metrics::new("test", "test");
    let engine = Arc::new(PolicyEngine::new(
        weft_policy::Config {
            node_name: "n1".into(),
            resync: Duration::from_secs(60),
            sync_wait: Duration::from_secs(1),
            learnt: weft_fqdn::Limits::default(),
        },
        source.clone(),
        Arc::new(|| Box::pin(async { Ok(weft_policy::LocalListing::new()) })),
        NullKernel,
        metrics.families::<PolicyMetrics>(),
    ));
    let (addr, rejected) = serve(
        "127.0.0.2:0".parse().unwrap(),
        engine,
        source.clone(),
        WireSecurity::Insecure,
    )
    .await;
    let mut c = client(addr).await;

    // The Hello names n3; the connection comes from n2's address: n2 it is.
    let reply = c
        .announce(request(
            "127.0.0.1",
            "n3",
            &[
                ("new", &["10.0.2.9"]),
                ("lie", &["10.0.3.9"]),
                ("old", &["10.0.2.5"]),
                ("starting", &["10.0.2.6"]),
                ("elsewhere", &["10.0.2.7"]),
                ("bad", &["10.0.2.300"]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    let got = outcomes(&reply);
    assert_eq!(got.len(), 6, "{got:?}");
    assert_eq!(
        got[0],
        (AnnounceOutcome::Kept, String::new()),
        "not in the cache yet: kept"
    );
    assert_eq!(got[1].0, AnnounceOutcome::Refused);
    assert!(
        got[1].1.contains("announced by node n2") && got[1].1.contains("not in the node's pod ranges"),
        "judged as n2's, not the n3 the Hello names: {got:?}"
    );
    assert_eq!(got[2], (AnnounceOutcome::Known, String::new()));
    assert_eq!(got[3], (AnnounceOutcome::Applied, String::new()));
    assert_eq!(got[4].0, AnnounceOutcome::Refused);
    assert!(got[4].1.contains("runs on node \"n3\""), "{got:?}");
    assert_eq!(got[5].0, AnnounceOutcome::Refused);
    assert!(got[5].1.contains("bad address"), "{got:?}");
    assert_eq!(count(&rejected, "bad_announcement"), 1);
    let (_, text) = metrics.render("text/plain");
    for (result, n) in [("applied", 1), ("kept", 1), ("known", 1), ("refused", 2)] {
        let line = format!("weft_policy_announcements_total{{result=\"{result}\"}} {n}\n");
        assert!(text.contains(&line), "{line} in\n{text}");
    }

    // A probe (no pods) of an admitted caller.
    let reply = c.announce(request("127.0.0.1", "n2", &[])).await.unwrap().into_inner();
    assert!(reply.results.is_empty());

    // Claiming another node's address.
    let e = c
        .announce(request("127.0.0.3", "n3", &[("new", &["10.0.3.9"])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(count(&rejected, "address_mismatch"), 1);

    // Too many pods at once.
    let many: Vec<(&str, &[&str])> = (0..=MAX_PODS).map(|_| ("p", &["10.0.2.9"][..])).collect();
    let e = c.announce(request("127.0.0.1", "n2", &many)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(count(&rejected, "bad_announcement"), 2);

    // A second Node object at the caller's address: which node calls is not known.
    source.put_node(node("n2-twin", "127.0.0.1", "10.0.4.0/24"));
    let e = c
        .announce(request("127.0.0.1", "n2", &[("new", &["10.0.2.9"])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(count(&rejected, "ambiguous_node"), 1);

    // No Node object at the caller's address any more: a stranger.
    source.remove_node("n2");
    source.remove_node("n2-twin");
    let e = c
        .announce(request("127.0.0.1", "n2", &[("new", &["10.0.2.9"])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("no node of the cluster"), "{e:?}");
    assert_eq!(count(&rejected, "unknown_node"), 1);

    // Nor may it list this node's flows; a node of the cluster may (this service was
    // given no flows: it says so).
    let flows = || weft_rpc::wire::PeerFlowsRequest {
        from: request("127.0.0.1", "n2", &[]).from,
        request: Some(Default::default()),
    };
    let e = c.flows(flows()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(count(&rejected, "unknown_node"), 2);
    source.put_node(node("n2", "127.0.0.1", "10.0.2.0/24"));
    let e = c.flows(flows()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
}

/// A peer's side: records what it was told, after a delay that the test sets.
#[derive(Default)]
struct Recorder {
    delay: Mutex<Duration>,
    got: Mutex<Vec<(String, Announced)>>,
}

impl Recorder {
    fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }
    fn got(&self) -> Vec<(String, Announced)> {
        self.got.lock().unwrap().clone()
    }
}

impl Announcements for Recorder {
    fn pod_announced(self: Arc<Self>, node: String, pod: Announced) -> BoxFuture<'static, Result<Taken, String>> {
        Box::pin(async move {
            let d = *self.delay.lock().unwrap();
            tokio::time::sleep(d).await;
            self.got.lock().unwrap().push((node, pod));
            Ok(Taken::Applied)
        })
    }
}

/// Nodes n1 (the announcer, 127.0.0.1), n2 and n3 (peers that serve), n4 (127.0.0.4:
/// nothing listens there).
struct Cluster {
    source: Arc<MemorySource>,
    port: u16,
    n2: Arc<Recorder>,
    n3: Arc<Recorder>,
    registry: Arc<Metrics>,
    metrics: Arc<AnnounceMetrics>,
}

async fn cluster(security: impl Fn(&str) -> WireSecurity) -> Cluster {
    let c = cluster_without_n3(&security).await;
    c.serve_n3(security("n3")).await;
    c
}

/// The same with n3 not serving yet (see [`Cluster::serve_n3`]).
async fn cluster_without_n3(security: impl Fn(&str) -> WireSecurity) -> Cluster {
    let source = Arc::new(MemorySource::default());
    source.put_node(node("n1", "127.0.0.1", "10.0.1.0/24"));
    let (n2, n3) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
    let (a2, _) = serve(
        "127.0.0.2:0".parse().unwrap(),
        n2.clone(),
        source.clone(),
        security("n2"),
    )
    .await;
    let port = a2.port();
    source.put_node(node("n2", "127.0.0.2", "10.0.2.0/24"));
    source.put_node(node("n3", "127.0.0.3", "10.0.3.0/24"));
    source.put_node(node("n4", "127.0.0.4", "10.0.4.0/24"));
    let registry = Metrics::new("test", "test");
    let metrics = registry.families::<AnnounceMetrics>();
    Cluster {
        source,
        port,
        n2,
        n3,
        registry,
        metrics,
    }
}

impl Cluster {
    /// n3 starts serving.
    async fn serve_n3(&self, security: WireSecurity) {
        let addr = SocketAddr::new(ip("127.0.0.3"), self.port);
        serve(addr, self.n3.clone(), self.source.clone(), security).await;
    }

    fn announcer(&self, bound: Duration, security: WireSecurity) -> WireAnnouncer {
        WireAnnouncer::new(
            "n1".into(),
            Some(ip("127.0.0.1")),
            self.port,
            security,
            self.source.clone(),
            bound,
            self.metrics.clone(),
        )
    }

    fn counts(&self) -> BTreeMap<&'static str, u64> {
        RESULTS
            .iter()
            .map(|r| {
                (
                    *r,
                    self.metrics.peers.get_or_create(&AnnounceLabels { result: r }).get(),
                )
            })
            .collect()
    }
}

fn pod(name: &str, ip: &str) -> Announced {
    Announced {
        namespace: "x".into(),
        name: name.into(),
        ips: vec![ip.parse().unwrap()],
    }
}

fn counts(taken: u64, refused: u64, failed: u64, skipped: u64) -> BTreeMap<&'static str, u64> {
    BTreeMap::from([
        ("taken", taken),
        ("refused", refused),
        ("failed", failed),
        ("skipped", skipped),
    ])
}

/// Waits (up to 10 s) until `ok` holds.
async fn eventually(what: &str, ok: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every peer that answers takes the pod, by this node's name, before `announce`
/// returns; the dead one fails once and is skipped from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_take_the_pod_before_the_announcement_returns_and_a_dead_one_is_skipped() {
    let c = cluster(|_| WireSecurity::Insecure).await;
    let a = c.announcer(Duration::from_secs(5), WireSecurity::Insecure);
    a.announce(pod("p1", "10.0.1.7")).await;
    for peer in [&c.n2, &c.n3] {
        assert_eq!(peer.got(), vec![("n1".to_string(), pod("p1", "10.0.1.7"))]);
    }
    assert_eq!(c.counts(), counts(2, 0, 1, 0), "n4 is not there");
    assert_eq!(
        a.peer_states(),
        BTreeMap::from([("n2".into(), true), ("n3".into(), true), ("n4".into(), false)])
    );
    a.announce(pod("p2", "10.0.1.8")).await;
    assert_eq!(c.counts(), counts(4, 0, 1, 1), "n4 skipped after its failure");
    assert_eq!(c.n2.got().len(), 2);
    assert_eq!(c.n3.got().len(), 2);
}

/// A peer slower than the bound costs one ADD the bound (not its delay), and no ADD
/// after it while it is skipped; its call still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_peer_costs_the_bound_once_then_is_skipped() {
    let c = cluster(|_| WireSecurity::Insecure).await;
    c.source.remove_node("n4");
    c.n3.set_delay(Duration::from_secs(3));
    let bound = Duration::from_millis(200);
    let a = c.announcer(bound, WireSecurity::Insecure);
    let started = std::time::Instant::now();
    a.announce(pod("p1", "10.0.1.7")).await;
    let took = started.elapsed();
    assert!(took >= bound, "returned before the bound with n3 outstanding: {took:?}");
    assert!(took < Duration::from_secs(2), "the bound did not hold: {took:?}");
    assert!(c.n3.got().is_empty(), "returned before the slow peer answered");
    assert_eq!(c.n2.got().len(), 1);
    assert_eq!(c.counts(), counts(1, 0, 1, 0));
    assert_eq!(a.peer_states().get("n3"), Some(&false));

    a.announce(pod("p2", "10.0.1.8")).await;
    assert_eq!(c.counts(), counts(2, 0, 1, 1), "n3 skipped");
    // The first call went on in the background and landed; the second was never sent.
    eventually("the late call lands", || c.n3.got().len() == 1).await;
    assert_eq!(c.n3.got()[0].1, pod("p1", "10.0.1.7"));
    let (_, text) = c.registry.render("text/plain");
    assert!(
        text.contains("weft_policy_announce_seconds_count 2\n"),
        "one observation per announcement:\n{text}"
    );
}

/// After the window, the next announcement goes to the peer in the background (the ADD
/// does not wait for it); once it answered, ADDs wait for it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_peer_is_tried_again_after_the_window_without_holding_an_add() {
    let c = cluster(|_| WireSecurity::Insecure).await;
    c.source.remove_node("n4");
    c.n3.set_delay(Duration::from_secs(2));
    let a = c
        .announcer(Duration::from_millis(100), WireSecurity::Insecure)
        .with_retries(Duration::from_millis(300), Duration::from_millis(300));
    a.announce(pod("p1", "10.0.1.7")).await;
    assert_eq!(a.peer_states().get("n3"), Some(&false));
    c.n3.set_delay(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The window is over: this one goes to n3 in the background.
    a.announce(pod("p2", "10.0.1.8")).await;
    assert_eq!(c.counts(), counts(2, 0, 1, 1));
    eventually("n3 is back", || a.peer_states().get("n3") == Some(&true)).await;
    assert!(c.n3.got().iter().any(|(_, p)| p.name == "p2"), "{:?}", c.n3.got());
    a.announce(pod("p3", "10.0.1.9")).await;
    assert_eq!(c.counts(), counts(4, 0, 1, 1), "asked and waited for again");
    assert!(c.n3.got().iter().any(|(_, p)| p.name == "p3"));
}

/// `run` learns the peers from the Node objects and probes them: a dead node is known
/// before the first ADD, which then waits for nobody dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_probes_new_peers_before_any_add() {
    let c = cluster(|_| WireSecurity::Insecure).await;
    let a = c.announcer(Duration::from_secs(5), WireSecurity::Insecure);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(a.clone().run(async move {
        let _ = stopped.await;
    }));
    eventually("n4 is known down", || a.peer_states().get("n4") == Some(&false)).await;
    assert_eq!(a.peer_states().get("n2"), Some(&true));
    // A node that joins later is picked up as the source changes.
    c.source.remove_node("n3");
    eventually("n3 is gone", || !a.peer_states().contains_key("n3")).await;
    a.announce(pod("p1", "10.0.1.7")).await;
    assert_eq!(c.counts(), counts(1, 0, 0, 1), "n2 taken, n4 skipped, n3 gone");
    assert!(c.n3.got().is_empty());
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
}

/// A node whose weftd is not serving yet when this one starts (every node's, as a lab or
/// a cluster starts) is taken back within moments of serving, not after [`SKIP_FOR`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_serves_late_is_taken_back_within_moments() {
    let c = cluster_without_n3(|_| WireSecurity::Insecure).await;
    c.source.remove_node("n4");
    let a = c.announcer(Duration::from_secs(5), WireSecurity::Insecure);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(a.clone().run(async move {
        let _ = stopped.await;
    }));
    eventually("n3 is known down", || a.peer_states().get("n3") == Some(&false)).await;
    a.announce(pod("p1", "10.0.1.7")).await;
    assert_eq!(c.counts(), counts(1, 0, 0, 1), "n3 left out while it does not serve");
    c.serve_n3(WireSecurity::Insecure).await;
    let started = std::time::Instant::now();
    eventually("n3 is back", || a.peer_states().get("n3") == Some(&true)).await;
    assert!(started.elapsed() < SKIP_FOR / 3, "back after {:?}", started.elapsed());
    a.announce(pod("p2", "10.0.1.8")).await;
    assert_eq!(c.counts(), counts(3, 0, 0, 1));
    assert!(
        c.n3.got().contains(&("n1".to_string(), pod("p2", "10.0.1.8"))),
        "{:?}",
        c.n3.got()
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
}

/// The same over mutual TLS, with the certificates the lab makes: the announcer dials
/// with the wire port's connector and each side proves it is the node at its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_go_over_mutual_tls() {
    use weft_wiretls::issue::{Authority, write_tls_dir};
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::generate("test").unwrap();
    let names: Arc<MemorySource> = Arc::new(MemorySource::default());
    let tls = |name: &str, address: &str| {
        let path = dir.path().join(name);
        write_tls_dir(&path, ca.cert_pem(), &ca.issue(name, &[ip(address)]).unwrap()).unwrap();
        let nodes = names.clone();
        let node_at = move |a: IpAddr| {
            nodes
                .nodes()
                .into_iter()
                .find(|n| n.addresses.contains(&a))
                .map(|n| n.name)
        };
        WireSecurity::Mtls(weft_wiretls::TlsDir::open(path, Arc::new(node_at), Arc::new(NoObserver)).unwrap())
    };
    let c = cluster(|n| tls(n, if n == "n2" { "127.0.0.2" } else { "127.0.0.3" })).await;
    for n in c.source.nodes() {
        names.put_node(n);
    }
    c.source.remove_node("n4");
    let a = c.announcer(Duration::from_secs(5), tls("n1", "127.0.0.1"));
    a.announce(pod("p1", "10.0.1.7")).await;
    assert_eq!(c.counts(), counts(2, 0, 0, 0));
    assert_eq!(c.n2.got(), vec![("n1".to_string(), pod("p1", "10.0.1.7"))]);

    // An announcer without a certificate the CA issued is not let in: no answer.
    let stranger = Authority::generate("other").unwrap();
    let path = dir.path().join("stranger");
    write_tls_dir(
        &path,
        stranger.cert_pem(),
        &stranger.issue("n1", &[ip("127.0.0.1")]).unwrap(),
    )
    .unwrap();
    let b = c.announcer(
        Duration::from_secs(5),
        WireSecurity::Mtls(weft_wiretls::TlsDir::open(path, Arc::new(|_| None), Arc::new(NoObserver)).unwrap()),
    );
    b.announce(pod("p2", "10.0.1.8")).await;
    assert_eq!(c.counts(), counts(2, 0, 2, 0));
    assert_eq!(c.n2.got().len(), 1);
}
