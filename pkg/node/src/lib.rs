//! Composing a node daemon out of the other crates: the start-up order, the adapters
//! between daemon, wires, store and topology, the periodic loops, the state-directory
//! lock, the servers, readiness, and the orderly shutdown.
//!
//! [`Node::start`] runs every start-up step in order and returns a node that serves;
//! [`Node::shutdown`] stops it. `weftd` only parses flags into a [`NodeConfig`] and
//! waits for a signal between the two.

pub mod adapters;
pub mod config;
pub mod error;
pub mod lock;
pub mod loops;
pub mod metrics;
pub mod netpol;
pub mod ready;
pub mod servers;
pub mod source;
pub mod sysctls;
pub mod uninstall;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;
use weft_daemon::service::AdminService;
use weft_daemon::{DelSpool, Handler, KernelNetworking, NodeInfo, Wiring, recover, server};
use weft_store::Store;
use weft_telemetry::{CallLog, Metrics, Readiness};
use weft_wires::dataplane::DataPlaneRuntime;
use weft_wires::{Engine, EngineConfig};

pub use config::NodeConfig;
pub use error::{NodeError, RecoveryStep};
pub use lock::{LockError, StateLock};

use adapters::EngineWiring;
use source::SourceKind;

/// How often a store that cannot write is probed for room again.
const STORE_PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long an ADD waits for the cluster's policy objects to be listed once (after a
/// start) before it is answered "try again later".
const POLICY_SYNC_WAIT: Duration = Duration::from_secs(10);

/// How long start-up waits for the teardowns of replayed spooled DELs.
const SPOOL_TEARDOWN_WAIT: Duration = Duration::from_secs(30);

/// A running node daemon: what [`Node::shutdown`] needs to stop it in order.
pub struct Node {
    socket: PathBuf,
    store: Store,
    run_id: i64,
    handler: Arc<Handler<Store, KernelNetworking>>,
    ready: Readiness,
    stop: watch::Sender<bool>,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    reconcile: JoinHandle<()>,
    nodenet: JoinHandle<()>,
    policy: Option<JoinHandle<()>>,
    /// The thread reading denied flows from the kernel, and what stops it.
    deny_reader: Option<(std::thread::JoinHandle<()>, Arc<std::sync::atomic::AtomicBool>)>,
    store_probe: JoinHandle<()>,
    wires: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    /// The thread the wire data plane and server run on, stopped last.
    wire_runtime: Option<DataPlaneRuntime>,
    http: JoinHandle<std::io::Result<()>>,
    // Held for the process's life; released when the node is dropped after shutdown.
    _lock: StateLock,
}

/// Resolves once `stop` says so (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

impl Node {
    /// Starts a node: takes the state directory, claims the socket, opens the store,
    /// finishes what a crash interrupted, brings the node network and the wires in step,
    /// reconciles the kernel with the store, and serves. Returns once it serves (it
    /// turns ready on its own once its caches are filled).
    pub async fn start(config: NodeConfig, metrics: Arc<Metrics>) -> Result<Node, NodeError> {
        let node_name = config.node_name.clone();
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
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
        let node_metrics = metrics.families::<crate::metrics::NodeMetrics>();
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
        info!(node = %node_name, state = %db_path.display(), first_start = matches!(previous, weft_store::PreviousRun::None), previous_run, version = config.version.as_str(), commit = config.commit.as_str(), tracing_export = weft_telemetry::otel::export_configured(), "weftd starting");

        let found = store.schema_found();
        if found != 0 && found < weft_store::SCHEMA_VERSION {
            info!(from = found, to = weft_store::SCHEMA_VERSION, state = %db_path.display(), "the state database was migrated in place from an older weft's schema");
        }
        if found == 0 {
            // A new database (deleted, moved aside, or a first start): the pods weft
            // set up before keep their addresses.
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

        settle_sysctl(&store, sysctls::IPV4_FORWARDING, true).await?;
        if std::path::Path::new("/proc/sys")
            .join(sysctls::IPV6_FORWARDING)
            .exists()
        {
            settle_sysctl(&store, sysctls::IPV6_FORWARDING, true).await?;
        }
        if !config.hostports_localhost {
            // A previous weftd's flag is gone: route_localnet goes back to what weft
            // found, before the table loses its guard at the first reconcile.
            settle_sysctl(&store, sysctls::ROUTE_LOCALNET, false).await?;
        }
        let kernel = KernelNetworking::new(config.hostports_localhost);
        let recovered = recover::recover(&store, &kernel)
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

        if config.pod_vxlan_port == weft_kernel::wire::VXLAN_PORT {
            return Err(NodeError::PodVxlanPort {
                port: config.pod_vxlan_port,
                default: weft_nodenet::DEFAULT_VXLAN_PORT,
            });
        }
        let (source, source_kind) = match source::topology_source(&config).await? {
            Some((s, k)) => (Some(s), Some(k)),
            None => (None, None),
        };
        // Routes to the other nodes' pod ranges, masquerade and the pod MTU: one pass
        // before serving, so the first ADD already gets this node's pod ranges.
        let nodenet = Arc::new(weft_nodenet::NodeNetwork::new(
            weft_nodenet::Config {
                node_name: node_name.clone(),
                node_address: config.node_address,
                routing: config.pod_routing,
                vxlan_port: config.pod_vxlan_port,
                vxlan_vni: config.pod_vxlan_vni,
                masquerade: config.masquerade,
                no_masquerade: config.no_masquerade_cidrs.clone(),
                resync: config.resync(),
            },
            source.clone(),
            weft_nodenet::HostKernel::new().map_err(NodeError::PodRouting)?,
            &metrics,
            adapters::local_ranges(store.clone()),
        ));
        nodenet.pass().await;
        let engine = match &source {
            Some(source) => {
                let pods = adapters::engine_pods(&store)
                    .await
                    .map_err(NodeError::ListAttachments)?;
                let security = wire_security(&config, source, &metrics).ok_or(NodeError::WireTlsUnset)?;
                let runtime = DataPlaneRuntime::start().map_err(NodeError::DataPlane)?;
                let cfg = EngineConfig {
                    node_name: node_name.clone(),
                    node_address: config.wire_node_address(),
                    wire_port: config.wire_addr.port(),
                    default_kind: config.inter_node_link,
                    mtu: config.wire_mtu,
                    resync: config.resync(),
                    dataplane_runtime: Some(runtime.handle().clone()),
                    security: security.clone(),
                };
                let engine = Engine::start(cfg, source.clone(), store.clone(), metrics.clone(), pods).await;
                Some((engine, (runtime, security)))
            }
            None => None,
        };
        let (engine, wire_runtime) = engine.unzip();
        let mut handler = Handler::new(
            store.clone(),
            kernel,
            NodeInfo {
                name: node_name.clone(),
            },
        )
        .on_new_range({
            let n = nodenet.clone();
            Arc::new(move || n.local_ranges_changed())
        });
        let wiring = engine
            .as_ref()
            .map(|e| Arc::new(EngineWiring(e.clone())) as Arc<dyn Wiring>);
        if let Some(w) = &wiring {
            handler = handler.with_wiring(w.clone());
        }
        // Network policy, where the cluster's objects come from somewhere (a cluster, a
        // lab): an ADD of a pod network answers once the pod's policies are in place.
        let policy = match &source {
            Some(source) => {
                let engine = Arc::new(weft_policy::PolicyEngine::new(
                    weft_policy::Config {
                        node_name: node_name.clone(),
                        resync: config.resync(),
                        sync_wait: POLICY_SYNC_WAIT,
                    },
                    source.clone(),
                    adapters::policed_pods(store.clone()),
                    weft_policy::NftKernel,
                    metrics.families::<weft_policy::PolicyMetrics>(),
                ));
                handler = handler.with_policy(Arc::new(adapters::EnginePolicy(engine.clone())));
                Some(engine)
            }
            None => None,
        };
        // With a source of Node objects, a network config may leave `ranges` and `mtu`
        // to the node; without one (a standalone node), the config must give its ranges.
        if source.is_some() {
            handler = handler.with_pod_defaults(adapters::pod_defaults(nodenet.view()));
        }
        let spool = {
            let replayed = node_metrics.del_spool_replayed.clone();
            Arc::new(
                DelSpool::new(weft_cni::spool::dir_for_socket(&config.socket)).on_replayed(Arc::new(move |n| {
                    replayed.inc_by(n);
                })),
            )
        };
        handler = handler.with_del_spool(spool.clone());
        let handler = Arc::new(handler);
        // DELs the plugin spooled while weftd was away, before any ADD is served: an ADD
        // of the same pod must find its old attachment gone.
        let spooled = handler.replay_del_spool().await;
        // DEL answers before the veth and the addresses go; here, before serving, wait
        // for that too, so the node is clean when the first call sees it.
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
        // Before serving: the kernel is made to match the store again (what went while
        // weftd was away is repaired, pods whose namespace is gone are collected).
        let repaired = handler.reconcile().await.map_err(NodeError::Reconcile)?;
        loops::count_repairs(&metrics, &repaired);
        info!(?repaired, "start-up reconciliation done");
        if config.hostports_localhost {
            // Only now: the reconcile above wrote the table with its guard of 127/8,
            // which must be in place before 127/8 becomes routable.
            settle_sysctl(&store, sysctls::ROUTE_LOCALNET, true).await?;
        }
        let ready = Readiness::default();
        {
            let store = store.clone();
            ready::require_writable_store(&ready, move || store.writable());
        }
        let pending = {
            let h = handler.clone();
            Arc::new(move || h.pending_teardowns()) as Arc<dyn Fn() -> usize + Send + Sync>
        };
        let calls = Arc::new(CallLog::new(config.calls_history));
        let mut admin = AdminService::new(
            store.clone(),
            node_name.clone(),
            started_at,
            ready.clone(),
            pending,
            calls.clone(),
        );
        if let Some(w) = wiring {
            admin = admin.with_wiring(w);
        }
        if let Some(engine) = &policy {
            admin = admin.with_policy(Arc::new(netpol::EnginePolicyAdmin::new(engine.clone())));
        }
        admin = admin
            .with_node_network(adapters::node_network_report(&nodenet, config.masquerade))
            .with_del_spool(spool)
            .with_captures(weft_daemon::capture::Captures::default().with_metrics(&metrics));

        let (stop, stop_rx) = watch::channel(false);
        let http = servers::serve_http(
            config.metrics_addr,
            ready.clone(),
            metrics.clone(),
            loops::refresh_gauges(store.clone(), node_metrics, engine.clone(), policy.clone()),
            stopped(stop_rx.clone()),
        )
        .await?;
        let grpc = servers::serve_socket(
            listener,
            metrics.clone(),
            calls,
            handler.clone(),
            admin,
            stopped(stop_rx.clone()),
        );
        let reconcile = tokio::spawn(loops::reconcile(
            handler.clone(),
            metrics.clone(),
            config.resync(),
            stopped(stop_rx.clone()),
        ));
        let nodenet_task = tokio::spawn(nodenet.clone().run(stopped(stop_rx.clone())));
        let policy_task = policy
            .clone()
            .map(|engine| tokio::spawn(engine.run(stopped(stop_rx.clone()))));
        let deny_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let deny_reader = policy
            .clone()
            .map(|engine| netpol::read_denies(engine, deny_stop.clone()))
            .transpose()
            .map_err(NodeError::DenyLogReader)?;
        let store_probe = {
            let h = handler.clone();
            tokio::spawn(ready::probe_unwritable_store(
                store.clone(),
                STORE_PROBE_EVERY,
                stopped(stop_rx.clone()),
                move || {
                    let h = h.clone();
                    async move {
                        let spooled = h.replay_del_spool().await;
                        info!(?spooled, "the state store writes again: DEL spool replayed");
                    }
                },
            ))
        };
        let wires = match (&engine, &wire_runtime) {
            (Some(engine), Some((runtime, security))) => Some(
                servers::serve_wires(
                    config.wire_addr,
                    engine.clone(),
                    security.clone(),
                    runtime,
                    stopped(stop_rx.clone()),
                )
                .await?,
            ),
            _ => None,
        };
        match source {
            Some(source) => {
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
                    source_kind == Some(SourceKind::Kube),
                    node_name.clone(),
                );
            }
            None => ready.set(true),
        }
        info!(socket = %config.socket.display(), http = %config.metrics_addr, "weftd ready");
        Ok(Node {
            socket: config.socket,
            store,
            run_id,
            handler,
            ready,
            stop,
            grpc,
            reconcile,
            nodenet: nodenet_task,
            policy: policy_task,
            deny_reader: deny_reader.map(|t| (t, deny_stop)),
            store_probe,
            wires,
            wire_runtime: wire_runtime.map(|(rt, _)| rt),
            http,
            _lock: lock,
        })
    }

    /// Whether the node is ready now (what `/readyz` answers).
    pub fn ready(&self) -> bool {
        self.ready.get()
    }

    /// Stops the node: no new calls, calls in flight finish, the loops and the wire
    /// service end (and the data plane's thread with them), the socket goes, teardowns
    /// in flight get up to 10 s, and the store records a clean stop.
    pub async fn shutdown(self) {
        info!("shutting down: finishing calls in flight");
        self.ready.set(false);
        let _ = self.stop.send(true);
        let _ = self.grpc.await;
        let _ = self.reconcile.await;
        let _ = self.nodenet.await;
        if let Some(t) = self.policy {
            let _ = t.await;
        }
        if let Some((thread, stop)) = self.deny_reader {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let _ = self.store_probe.await;
        if let Some(t) = self.wires {
            let _ = t.await;
        }
        // Its tasks are dropped and its thread joined, off the async workers.
        if let Some(rt) = self.wire_runtime {
            let _ = tokio::task::spawn_blocking(move || rt.shutdown()).await;
        }
        let _ = std::fs::remove_file(&self.socket);
        if tokio::time::timeout(Duration::from_secs(10), self.handler.drain_teardowns())
            .await
            .is_err()
        {
            info!("teardowns still running at exit; the next start finishes them");
        }
        let _ = self.http.await;
        let run_id = self.run_id;
        if let Err(e) = self.store.run(move |db| db.end_run(run_id)).await {
            tracing::warn!(error = %e, "could not record the clean stop");
        }
        info!("weftd stopped");
    }
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
    source: &Arc<dyn weft_topology::TopologySource>,
    metrics: &Arc<Metrics>,
) -> Option<weft_wiretls::WireSecurity> {
    let wire_metrics = metrics.families::<weft_wires::metrics::WireMetrics>();
    match &config.wire_tls {
        None => None,
        Some(config::WireTls::Insecure) => {
            tracing::warn!(addr = %config.wire_addr, "the wire port runs in plaintext (--wire-insecure): any host at a node's address can open frame streams into pods' links");
            wire_metrics.insecure.set(1);
            Some(weft_wiretls::WireSecurity::Insecure)
        }
        Some(config::WireTls::Dir(dir)) => {
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
            Some(weft_wiretls::WireSecurity::Mtls(tls))
        }
    }
}
