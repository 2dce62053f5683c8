//! The start-up steps of a node, in the order [`crate::Node::start`] runs them. Each
//! builds one subsystem from the configuration and what the steps before it built;
//! what keeps running afterwards is handed to [`Running`], which stops it in reverse.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tracing::info;
use weft_daemon::service::AdminService;
use weft_daemon::{DelSpool, Handler, KernelNetworking, NodeInfo, Wiring, recover, server};
/// The node network over the host's kernel.
pub type NodeNetwork = weft_nodenet::NodeNetwork<weft_nodenet::HostKernel>;
use weft_store::Store;
use weft_telemetry::{CallLog, Metrics, Readiness};
use weft_topology::TopologySource;
use weft_wires::Engine;
use weft_wires::dataplane::DataPlaneRuntime;
use weft_wiretls::WireSecurity;

use crate::adapters;
use crate::announce::{AnnounceMetrics, PeerAnswers, PolicyService, WireAnnouncer};
use crate::config::{NodeConfig, WireTls};
use crate::lock::{self, StateLock};
use crate::metrics::NodeMetrics;
use crate::running::Running;
use crate::source::{self, SourceKind};
use crate::trace::NodeTrace;
use crate::{NodeError, RecoveryStep, loops, netpol, ready, servers, sysctls};

/// How often a store that cannot write is probed for room again.
const STORE_PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long an ADD waits for the cluster's policy objects to be listed once (after a
/// start) before it is answered "try again later".
const POLICY_SYNC_WAIT: Duration = Duration::from_secs(10);

/// How long start-up waits for the teardowns of replayed spooled DELs.
const SPOOL_TEARDOWN_WAIT: Duration = Duration::from_secs(30);

/// How long shutdown waits for teardowns still in flight.
const SHUTDOWN_TEARDOWN_WAIT: Duration = Duration::from_secs(10);

/// The concrete CNI handler of a node.
pub type NodeHandler = Handler<Store, KernelNetworking>;

/// The node's own state: its directory's lock, its socket, its store and this run.
pub struct State {
    /// Held for the process's life.
    pub lock: StateLock,
    /// The claimed socket, served once recovery is done.
    pub listener: UnixListener,
    /// The state store.
    pub store: Store,
    /// This run's id in the store.
    pub run_id: i64,
    /// The node's own metric families.
    pub metrics: Arc<NodeMetrics>,
}

/// Takes the state directory, claims the socket, opens the store (a damaged one moved
/// aside, a new one rebuilt from the kernel) and records the start of this run.
pub async fn state(config: &NodeConfig, metrics: &Metrics) -> Result<State, NodeError> {
    std::fs::create_dir_all(&config.state_dir).map_err(|source| NodeError::CreateStateDir {
        path: config.state_dir.clone(),
        source,
    })?;
    std::fs::set_permissions(&config.state_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(NodeError::StateDirMode)?;
    // One daemon per state directory, held for the process's life: a second weftd on
    // the same state would "recover" the first one's calls in flight.
    let lock = lock::lock_state_dir(&config.state_dir, config.lock_wait).await?;
    // Claim the socket before touching state, for the same reason; calls that arrive
    // now wait in the backlog until recovery is done.
    let listener = server::bind_unix(&config.socket).map_err(|source| NodeError::BindSocket {
        path: config.socket.clone(),
        source,
    })?;
    let db_path = config.state_dir.join("weft.db");
    let node_metrics = metrics.families::<NodeMetrics>();
    let store_seconds = node_metrics.store_transaction.clone();
    let observer: weft_store::Observer = Arc::new(move |d: Duration| store_seconds.observe(d.as_secs_f64()));
    // A damaged database is kept for people and replaced, never used blindly: the
    // state is rebuilt from the kernel below, as when the file was deleted.
    let moved_aside = weft_store::move_aside_if_damaged(&db_path).map_err(|source| NodeError::OpenStore {
        path: db_path.clone(),
        source,
    })?;
    if let Some(m) = &moved_aside {
        tracing::error!(state = %db_path.display(), moved_to = %m.to.display(), reason = %m.reason, "the state database is damaged; moved it aside, rebuilding the state from the kernel");
    }
    let store = Store::open_observed(&db_path, Some(observer)).map_err(|source| NodeError::OpenStore {
        path: db_path.clone(),
        source,
    })?;
    let version = format!("{} ({})", config.version, config.commit);
    let (run_id, previous) = store
        .run(move |db| db.begin_run(&version))
        .await
        .map_err(NodeError::BeginRun)?;
    let previous_run = match &previous {
        weft_store::PreviousRun::None => "none (first start)",
        weft_store::PreviousRun::Stopped { .. } => "stopped cleanly",
        weft_store::PreviousRun::Crashed { .. } => "did not stop cleanly (killed or crashed)",
    };
    info!(node = %config.node_name, state = %db_path.display(), first_start = matches!(previous, weft_store::PreviousRun::None), previous_run, version = config.version.as_str(), commit = config.commit.as_str(), tracing_export = weft_telemetry::otel::export_configured(), "weftd starting");

    let found = store.schema_found();
    if found != 0 && found < weft_store::SCHEMA_VERSION {
        info!(from = found, to = weft_store::SCHEMA_VERSION, state = %db_path.display(), "the state database was migrated in place from an older weft's schema");
    }
    if found == 0 {
        // A new database (deleted, moved aside, or a first start): the pods weft set up
        // before keep their addresses.
        let rebuilt = weft_daemon::rebuild::rebuild(&store)
            .await
            .map_err(|reason| NodeError::Recovery {
                step: RecoveryStep::Rebuild,
                reason,
            })?;
        if moved_aside.is_some() || rebuilt.attachments > 0 {
            node_metrics.store_rebuilds.inc();
            node_metrics
                .store_rebuilt_attachments
                .inc_by(rebuilt.attachments as u64);
            tracing::warn!(
                host_ends = rebuilt.host_ends,
                attachments = rebuilt.attachments,
                skipped = rebuilt.skipped,
                "state rebuilt from the kernel"
            );
        }
    }
    Ok(State {
        lock,
        listener,
        store,
        run_id,
        metrics: node_metrics,
    })
}

/// Turns IPv4 and IPv6 forwarding on (recording what the node had), and puts
/// `route_localnet` back when a previous weftd's `--hostports-localhost` is gone.
pub async fn sysctls(config: &NodeConfig, store: &Store) -> Result<(), NodeError> {
    settle_sysctl(store, sysctls::IPV4_FORWARDING, true).await?;
    if std::path::Path::new("/proc/sys")
        .join(sysctls::IPV6_FORWARDING)
        .exists()
    {
        settle_sysctl(store, sysctls::IPV6_FORWARDING, true).await?;
    }
    if !config.hostports_localhost {
        // Before the table loses its guard of 127/8 at the first reconcile.
        settle_sysctl(store, sysctls::ROUTE_LOCALNET, false).await?;
    }
    for name in crate::flows::SYSCTLS {
        // Absent until conntrack is loaded: flows then say why they have no counters.
        if std::path::Path::new("/proc/sys").join(name).exists() {
            settle_sysctl(store, name, config.flows.enabled).await?;
        }
    }
    Ok(())
}

/// Finishes or undoes what a crash interrupted (ADDs and DELs in flight).
pub async fn recovery(store: &Store, kernel: &KernelNetworking) -> Result<(), NodeError> {
    let recovered = recover::recover(store, kernel)
        .await
        .map_err(|reason| NodeError::Recovery {
            step: RecoveryStep::Interrupted,
            reason,
        })?;
    info!(
        rolled_back = recovered.rolled_back,
        torn_down = recovered.torn_down,
        "start-up recovery done"
    );
    Ok(())
}

/// Where the cluster's objects come from.
#[derive(Clone)]
pub struct Source {
    /// The cache of Topology, Node and policy objects.
    pub source: Arc<dyn TopologySource>,
    /// A directory or the Kubernetes API.
    pub kind: SourceKind,
}

/// The source of the cluster's objects: a topology directory, the Kubernetes API, or
/// none (a standalone node).
pub async fn source(config: &NodeConfig) -> Result<Option<Source>, NodeError> {
    if config.pod_vxlan_port == weft_kernel::wire::VXLAN_PORT {
        return Err(NodeError::PodVxlanPort {
            port: config.pod_vxlan_port,
            default: weft_nodenet::DEFAULT_VXLAN_PORT,
        });
    }
    Ok(source::topology_source(config)
        .await?
        .map(|(source, kind)| Source { source, kind }))
}

/// The node network (routes to the other nodes' pod ranges, masquerade, the pod MTU),
/// after one pass: the first ADD already gets this node's pod ranges.
pub async fn node_network(
    config: &NodeConfig,
    source: Option<&Source>,
    store: &Store,
    metrics: &Arc<Metrics>,
) -> Result<Arc<NodeNetwork>, NodeError> {
    let nodenet = Arc::new(weft_nodenet::NodeNetwork::new(
        config.node_network(),
        source.map(|s| s.source.clone()),
        weft_nodenet::HostKernel::new().map_err(NodeError::PodRouting)?,
        metrics,
        adapters::local_ranges(store.clone()),
    ));
    nodenet.pass().await;
    Ok(nodenet)
}

/// The wire engine and what serves its port.
pub struct Wires {
    /// The engine.
    pub engine: Arc<Engine>,
    /// How its port is protected.
    pub security: WireSecurity,
    /// The data plane's runtime: where the wire server runs.
    pub plane: tokio::runtime::Handle,
    /// The cluster's objects: the Node objects say who may call the port, and which
    /// nodes new pods are announced to.
    pub source: Arc<dyn TopologySource>,
}

/// The wire engine, on a data plane thread of its own (stopped last of all), with the
/// pods the store holds; only with a source of Topology objects.
pub async fn wires(
    config: &NodeConfig,
    source: Option<&Source>,
    store: &Store,
    metrics: &Arc<Metrics>,
    running: &mut Running,
) -> Result<Option<Wires>, NodeError> {
    let Some(source) = source else { return Ok(None) };
    let pods = adapters::engine_pods(store).await.map_err(NodeError::ListAttachments)?;
    let security = wire_security(config, &source.source, metrics).ok_or(NodeError::WireTlsUnset)?;
    let runtime = DataPlaneRuntime::start().map_err(NodeError::DataPlane)?;
    let cfg = config.wire_engine(&runtime, security.clone());
    let engine = Engine::start(cfg, source.source.clone(), store.clone(), metrics.clone(), pods).await;
    let plane = runtime.handle().clone();
    // Its tasks are dropped and its thread joined, off the async workers.
    running.then("wire data plane", async move {
        let _ = tokio::task::spawn_blocking(move || runtime.shutdown()).await;
    });
    Ok(Some(Wires {
        engine,
        security,
        plane,
        source: source.source.clone(),
    }))
}

/// The policy engine, where the cluster's objects come from somewhere (a cluster, a
/// lab).
pub fn policy(
    config: &NodeConfig,
    source: Option<&Source>,
    store: &Store,
    metrics: &Metrics,
) -> Option<Arc<netpol::Engine>> {
    let source = source?;
    Some(Arc::new(weft_policy::PolicyEngine::new(
        config.policy(POLICY_SYNC_WAIT),
        source.source.clone(),
        adapters::policed_pods(store.clone()),
        weft_policy::NftKernel::default(),
        metrics.families::<weft_policy::PolicyMetrics>(),
    )))
}

/// What the handler is built from besides the store and the kernel.
pub struct HandlerParts<'a> {
    /// The node network: new ranges poke it, and it gives pods their defaults.
    pub nodenet: &'a Arc<NodeNetwork>,
    /// The wires a pod's ADD builds.
    pub wiring: Option<Arc<dyn Wiring>>,
    /// The policies an ADD waits for.
    pub policy: Option<&'a Arc<netpol::Engine>>,
    /// Whether Node objects give pods their ranges and MTU.
    pub has_source: bool,
    /// The spool of DELs the plugin could not relay.
    pub spool: Arc<DelSpool>,
}

/// The CNI handler over the store and the kernel, with its seams; then the DELs the
/// plugin spooled while weftd was away are replayed and the kernel is reconciled with
/// the store, all before the first call is served.
pub async fn handler(
    config: &NodeConfig,
    store: &Store,
    kernel: KernelNetworking,
    parts: HandlerParts<'_>,
    metrics: &Metrics,
) -> Result<Arc<NodeHandler>, NodeError> {
    let nodenet = parts.nodenet.clone();
    let mut handler = Handler::new(
        store.clone(),
        kernel,
        NodeInfo {
            name: config.node_name.clone(),
        },
    )
    .on_new_range(Arc::new(move || nodenet.local_ranges_changed()));
    if let Some(w) = parts.wiring {
        handler = handler.with_wiring(w);
    }
    if let Some(engine) = parts.policy {
        // An ADD of a pod network answers once the pod's policies are in place.
        handler = handler.with_policy(Arc::new(adapters::EnginePolicy(engine.clone())));
    }
    // With a source of Node objects, a network config may leave `ranges` and `mtu` to
    // the node; without one (a standalone node), the config must give its ranges.
    if parts.has_source {
        handler = handler.with_pod_defaults(adapters::pod_defaults(parts.nodenet.view()));
    }
    let handler = Arc::new(handler.with_del_spool(parts.spool));
    // DELs the plugin spooled while weftd was away, before any ADD is served: an ADD of
    // the same pod must find its old attachment gone.
    let spooled = handler.replay_del_spool().await;
    // DEL answers before the veth and the addresses go; here, before serving, wait for
    // that too, so the node is clean when the first call sees it.
    if spooled.replayed > 0
        && tokio::time::timeout(SPOOL_TEARDOWN_WAIT, handler.drain_teardowns())
            .await
            .is_err()
    {
        tracing::warn!("teardowns of replayed DELs still running; serving anyway");
    }
    info!(
        replayed = spooled.replayed,
        failed = spooled.failed,
        set_aside = spooled.set_aside,
        "DEL spool replayed"
    );
    // Tests hold weftd here, between the start-up replay and serving, to land a DEL in
    // the spool in that window (debug builds only).
    weft_failpoint::pause!("start.spool_replayed");
    // The kernel is made to match the store again (what went while weftd was away is
    // repaired, pods whose namespace is gone are collected).
    let repaired = handler.reconcile().await.map_err(NodeError::Reconcile)?;
    loops::count_repairs(metrics, &repaired);
    info!(?repaired, "start-up reconciliation done");
    if config.hostports_localhost {
        // Only now: the reconcile above wrote the table with its guard of 127/8, which
        // must be in place before 127/8 becomes routable.
        settle_sysctl(store, sysctls::ROUTE_LOCALNET, true).await?;
    }
    Ok(handler)
}

/// Everything the servers and loops need, built by the steps before.
pub struct Serving {
    /// The node's state.
    pub store: Store,
    /// The claimed socket.
    pub listener: UnixListener,
    /// The CNI handler.
    pub handler: Arc<NodeHandler>,
    /// Finished calls, for `weftctl calls`.
    pub calls: Arc<CallLog>,
    /// The node network.
    pub nodenet: Arc<NodeNetwork>,
    /// The wire engine, if any.
    pub wires: Option<Wires>,
    /// The policy engine, if any.
    pub policy: Option<Arc<netpol::Engine>>,
    /// The node's flows, when recorded (they need the policy engine's view).
    pub flows: Option<Arc<crate::flows::NodeFlows>>,
    /// The node's own metric families.
    pub node_metrics: Arc<NodeMetrics>,
    /// The wires, as the handler and the admin service see them.
    pub wiring: Option<Arc<dyn Wiring>>,
    /// The DEL spool.
    pub spool: Arc<DelSpool>,
    /// The watch on the spool directory, if one could be taken.
    pub spool_watch: Option<crate::spool_watch::SpoolWatch>,
    /// When the node started (Unix seconds).
    pub started_at: i64,
}

/// The admin service of `weftctl`, over what the steps built.
fn admin(
    config: &NodeConfig,
    s: &Serving,
    trace: Option<&NodeTrace>,
    ready: &Readiness,
    metrics: &Metrics,
) -> AdminService {
    let pending = {
        let h = s.handler.clone();
        Arc::new(move || h.pending_teardowns()) as Arc<dyn Fn() -> usize + Send + Sync>
    };
    let mut admin = AdminService::new(
        s.store.clone(),
        config.node_name.clone(),
        s.started_at,
        ready.clone(),
        pending,
        s.calls.clone(),
    );
    if let Some(w) = &s.wiring {
        admin = admin.with_wiring(w.clone());
    }
    if let Some(engine) = &s.policy {
        admin = admin.with_policy(Arc::new(netpol::EnginePolicyAdmin::new(engine.clone())));
    }
    if let Some(flows) = &s.flows {
        admin = admin.with_flows(flows.clone());
    }
    if let Some(t) = trace {
        admin = admin.with_trace(Arc::new(t.clone()));
    }
    admin
        .with_node_network(adapters::node_network_report(&s.nodenet, config.masquerade))
        .with_del_spool(s.spool.clone())
        .with_captures(weft_daemon::capture::Captures::default().with_metrics(metrics))
        .with_link_changes(weft_daemon::changes::LinkChanges::default().with_metrics(metrics))
}

/// Serves: the HTTP endpoints, the socket (its end removes the socket and waits for
/// teardowns in flight), the periodic loops, the deny log reader and the wire port,
/// each ending on `stop`.
pub async fn serve(
    config: &NodeConfig,
    s: Serving,
    ready: &Readiness,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
    running: &mut Running,
) -> Result<(), NodeError> {
    let stopped = || crate::stopped(stop.clone());
    // Probes traced from this node's pods, and other nodes' probes watched here.
    let trace = s.policy.as_ref().map(|engine| {
        NodeTrace::new(
            &config.node_name,
            Arc::new(crate::trace::EngineTracePolicy(engine.clone())),
            crate::trace::local_pods(s.store.clone()),
            Arc::new(crate::trace::KernelTrace),
        )
    });
    let admin = admin(config, &s, trace.as_ref(), ready, metrics);
    let http = servers::serve_http(
        config.metrics_addr,
        ready.clone(),
        metrics.clone(),
        loops::refresh_gauges(
            s.store.clone(),
            s.node_metrics,
            s.wires.as_ref().map(|w| w.engine.clone()),
            s.policy.clone(),
        ),
        stopped(),
    )
    .await?;
    running.task("http", http);
    // Before the socket serves: no ADD answers without telling the other nodes.
    if let (Some(w), Some(engine)) = (&s.wires, &s.policy)
        && let Some(announcer) = announcer(config, w, metrics)
    {
        engine.set_announcer(Arc::new(announcer.clone()));
        if let Some(flows) = &s.flows {
            flows.set_peers(Arc::new(announcer.clone()));
        }
        if let Some(t) = &trace {
            t.set_peers(Arc::new(announcer.clone()));
        }
        running.task("policy announcer", tokio::spawn(announcer.run(stopped())));
    }
    let grpc = servers::serve_socket(
        s.listener,
        metrics.clone(),
        s.calls,
        s.handler.clone(),
        admin,
        stopped(),
    );
    let (socket, handler) = (config.socket.clone(), s.handler.clone());
    running.then("socket", async move {
        let _ = grpc.await;
        let _ = std::fs::remove_file(&socket);
        if tokio::time::timeout(SHUTDOWN_TEARDOWN_WAIT, handler.drain_teardowns())
            .await
            .is_err()
        {
            info!("teardowns still running at exit; the next start finishes them");
        }
    });
    running.task(
        "reconcile",
        tokio::spawn(loops::reconcile(
            s.handler.clone(),
            metrics.clone(),
            config.resync(),
            stopped(),
        )),
    );
    running.task("node network", tokio::spawn(s.nodenet.clone().run(stopped())));
    if let Some(watch) = s.spool_watch {
        running.task(
            "spool watch",
            tokio::spawn({
                let handler = s.handler.clone();
                crate::spool_watch::replay_as_they_land(
                    watch,
                    move || {
                        let handler = handler.clone();
                        async move { handler.replay_del_spool().await }
                    },
                    stopped(),
                )
            }),
        );
    }
    if let Some(engine) = &s.policy {
        running.task("policy", tokio::spawn(engine.clone().run(stopped())));
        let deny_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = netpol::read_denies(engine.clone(), deny_stop.clone()).map_err(NodeError::DenyLogReader)?;
        running.then("deny log reader", async move {
            deny_stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || reader.join()).await;
        });
        let dns_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = netpol::read_dns_answers(engine.clone(), dns_stop.clone()).map_err(NodeError::DnsAnswerReader)?;
        running.then("DNS answer reader", async move {
            dns_stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || reader.join()).await;
        });
    }
    if let Some(flows) = &s.flows {
        running.task("flow denies", tokio::spawn(flows.clone().relay_denies(stopped())));
        let flow_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = flows.read(flow_stop.clone()).map_err(NodeError::FlowReader)?;
        let f = flows.clone();
        running.then("flow reader", async move {
            flow_stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || {
                let _ = reader.join();
                // What the reader ended last goes out before weftd does.
                f.shutdown_export();
            })
            .await;
        });
        let f = flows.clone();
        ready.note(
            "flow events were lost in the last 10 minutes (the kernel's buffer overflowed): recovered from a dump, see weftctl flows",
            move || f.lost_recently(),
        );
    }
    let h = s.handler.clone();
    running.task(
        "store probe",
        tokio::spawn(ready::probe_unwritable_store(
            s.store.clone(),
            STORE_PROBE_EVERY,
            stopped(),
            move || {
                let h = h.clone();
                async move {
                    let spooled = h.replay_del_spool().await;
                    info!(?spooled, "the state store writes again: DEL spool replayed");
                }
            },
        )),
    );
    if let Some(w) = &s.wires {
        // The other nodes' announcements, taken on this runtime (see `PolicyService`).
        // And their cluster-wide flow listings.
        let policy = s.policy.clone().map(|engine| {
            PolicyService::with_answers(
                engine,
                w.source.clone(),
                w.engine.metrics().rejected.clone(),
                tokio::runtime::Handle::current(),
                PeerAnswers {
                    flows: s.flows.clone().map(|f| f as Arc<dyn weft_daemon::service::FlowsAdmin>),
                    trace: trace.clone(),
                },
            )
        });
        let task = servers::serve_wires(
            config.wire_addr,
            w.engine.clone(),
            w.security.clone(),
            policy,
            &w.plane,
            stopped(),
        )
        .await?;
        running.task("wire port", task);
    }
    Ok(())
}

/// The announcer of this node's new pods to the others, over the wire port (the same
/// port on every node); none when `--policy-announce-timeout-ms` is 0.
fn announcer(config: &NodeConfig, w: &Wires, metrics: &Metrics) -> Option<WireAnnouncer> {
    if config.policy_announce_timeout.is_zero() {
        info!(
            "new pods are not announced to the other nodes (--policy-announce-timeout-ms 0): their policies learn of them from the API server"
        );
        return None;
    }
    Some(WireAnnouncer::new(
        config.node_name.clone(),
        config.wire_node_address(),
        config.wire_addr.port(),
        w.security.clone(),
        w.source.clone(),
        config.policy_announce_timeout,
        metrics.families::<AnnounceMetrics>(),
    ))
}

/// The DEL spool and the watch on its directory, taken before the handler's start-up
/// replay reads it (see `spool_watch`).
pub fn spool(config: &NodeConfig, metrics: &NodeMetrics) -> (Arc<DelSpool>, Option<crate::spool_watch::SpoolWatch>) {
    let spool = crate::spool_watch::del_spool(config, metrics);
    let watch = crate::spool_watch::watch(&spool);
    (spool, watch)
}

/// What readiness waits for: a writable store always; with a source, its caches
/// listed once (and this node's pod ranges known, from the API), and its policy
/// objects listed; without one, nothing more.
pub fn readiness(config: &NodeConfig, ready: &Readiness, store: &Store, source: Option<Source>, nodenet: &NodeNetwork) {
    let store = store.clone();
    ready::require_writable_store(ready, move || store.writable());
    let Some(Source { source, kind }) = source else {
        ready.set(true);
        return;
    };
    let policy_source = source.clone();
    ready.require("network policy objects not listed yet", move || {
        policy_source.policy_objects().synced
    });
    let policy_source = source.clone();
    ready.note(
        "network policy objects are stale (a watch is lost): the last known policies stay enforced",
        move || policy_source.policy_objects().stale,
    );
    ready::when_synced(
        ready.clone(),
        move || source.ready(),
        nodenet.view(),
        kind == SourceKind::Kube,
        config.node_name.clone(),
    );
}

/// Turns sysctl `name` on when `needed` (recording what the node had), else puts back
/// what weft found, on the blocking pool (the store and /proc are blocking).
async fn settle_sysctl(store: &Store, name: &'static str, needed: bool) -> Result<(), NodeError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || sysctls::settle(&mut sysctls::HostSysctls(store), name, needed))
        .await
        .map_err(|source| NodeError::TaskFailed {
            what: format!("settling {name}"),
            source,
        })?
        .map(|_| ())
        .map_err(|source| NodeError::Sysctl { name, source })
}

/// The wire port's security from the configuration: mutual TLS with the files of
/// `--wire-tls-dir` (peers' certificates checked against the Node objects of
/// `source`), or plaintext when `--wire-insecure` says so (warned and exposed as
/// `weft_wire_insecure`). `None` when neither is configured: wires are not served
/// unprotected by default.
fn wire_security(
    config: &NodeConfig,
    source: &Arc<dyn TopologySource>,
    metrics: &Arc<Metrics>,
) -> Option<WireSecurity> {
    let wire_metrics = metrics.families::<weft_wires::metrics::WireMetrics>();
    match &config.wire_tls {
        None => None,
        Some(WireTls::Insecure) => {
            tracing::warn!(addr = %config.wire_addr, "the wire port runs in plaintext (--wire-insecure): any host at a node's address can open frame streams into pods' links");
            wire_metrics.insecure.set(1);
            Some(WireSecurity::Insecure)
        }
        Some(WireTls::Dir(dir)) => {
            let nodes = source.clone();
            let names = move |addr: std::net::IpAddr| {
                nodes
                    .nodes()
                    .into_iter()
                    .find(|n| n.addresses.contains(&addr))
                    .map(|n| n.name)
            };
            // Files not provisioned yet cost the node its wires to other nodes, not its
            // pods' networking: the wire port refuses every connection until they load.
            let (tls, problem) = weft_wiretls::TlsDir::open_pending(dir.clone(), Arc::new(names), wire_metrics.clone());
            wire_metrics.insecure.set(0);
            match problem {
                None => info!(dir = %dir.display(), "the wire port uses mutual TLS"),
                Some(e) => {
                    tracing::error!(error = %e, "the wire TLS files are not usable: wires to other nodes wait until they are (the wire port refuses every connection meanwhile)");
                    wire_metrics
                        .tls_reloads
                        .get_or_create(&weft_wires::metrics::ReloadLabels { result: "error" })
                        .inc();
                }
            }
            Some(WireSecurity::Mtls(tls))
        }
    }
}
