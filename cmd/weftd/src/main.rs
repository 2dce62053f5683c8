//! weftd, the weft node daemon. This file only composes: flags, the store, start-up
//! recovery, the CNI and admin services on the UNIX socket, the HTTP endpoints, and
//! an orderly shutdown.

#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use tokio::sync::watch;
use tracing::{error, info};
use weft_daemon::service::{AdminService, CniService};
use weft_daemon::{
    Handler, KernelNetworking, NodeInfo, PodDefaults, WireCounters, WireInfo, WiredPod, Wiring, recover, server,
};
use weft_rpc::admin::admin_server::AdminServer;
use weft_rpc::cnirpc::cni_server::CniServer;
use weft_store::Store;
use weft_telemetry::metrics::RangeLabels;
use weft_telemetry::{CallLog, GrpcLayer, LogFormat, Metrics, Readiness};
use weft_topology::{LinkKind, TopologySource};
use weft_wires::{Engine, EngineConfig, LocalPod, WireService};

/// The weft node daemon: serves CNI calls relayed by the `weft` plugin.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// UNIX socket the plugin and weftctl connect to.
    #[arg(long, env = "WEFT_SOCKET", default_value = weft_cni::conf::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Directory holding the state database (weft.db).
    #[arg(long, env = "WEFT_STATE_DIR", default_value = "/var/lib/weft")]
    state_dir: PathBuf,
    /// Address of the HTTP endpoints (/healthz, /readyz, /metrics).
    #[arg(long, env = "WEFT_METRICS_ADDR", default_value = "0.0.0.0:9384")]
    metrics_addr: SocketAddr,
    /// This node's name (default: the hostname).
    #[arg(long, env = "WEFT_NODE_NAME")]
    node_name: Option<String>,
    /// Log format.
    #[arg(long, env = "WEFT_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
    /// Also forward host ports reached on 127.0.0.1 (enables `route_localnet`; packets
    /// to 127/8 from outside the node are then dropped).
    #[arg(long, env = "WEFT_HOSTPORTS_LOCALHOST")]
    hostports_localhost: bool,
    /// How often the kernel is checked against the store (host port table), seconds.
    #[arg(long, env = "WEFT_RECONCILE_INTERVAL", default_value_t = 60)]
    reconcile_interval: u64,
    /// How many finished CNI calls to keep for `weftctl calls`.
    #[arg(long, env = "WEFT_CALLS_HISTORY", default_value_t = 256)]
    calls_history: usize,
    /// Read Topology objects from YAML/JSON files in this directory instead of the
    /// Kubernetes API (labs outside a cluster; several daemons may share it).
    #[arg(long, env = "WEFT_TOPOLOGY_DIR")]
    topology_dir: Option<PathBuf>,
    /// Read Topology objects from the Kubernetes API (the default inside a cluster,
    /// where KUBERNETES_SERVICE_HOST is set).
    #[arg(long, env = "WEFT_KUBERNETES")]
    kubernetes: Option<bool>,
    /// TCP address of the node-to-node wire service (same port on every node).
    #[arg(long, env = "WEFT_WIRE_ADDR", default_value = "0.0.0.0:9385")]
    wire_addr: SocketAddr,
    /// This node's underlay address, the one peers reach it on (default: the Node's
    /// InternalIP, or the wire address when it is not a wildcard).
    #[arg(long, env = "WEFT_NODE_ADDRESS")]
    node_address: Option<IpAddr>,
    /// How links between pods on different nodes are carried unless the link says.
    #[arg(long, env = "WEFT_INTER_NODE_LINK", value_enum, default_value = "vxlan")]
    inter_node_link: InterNodeLink,
    /// MTU of wire ends (VXLAN ends get this minus the encapsulation).
    #[arg(long, env = "WEFT_WIRE_MTU", default_value_t = 1500)]
    wire_mtu: u32,
    /// How pod traffic reaches pods on other nodes: `auto` (a direct route where the
    /// node is on-link, VXLAN elsewhere), `direct`, `vxlan`, or `none` (an external
    /// router carries pod ranges; weft only reports).
    #[arg(long, env = "WEFT_POD_ROUTING", value_enum, default_value = "auto")]
    pod_routing: weft_nodenet::PodRouting,
    /// UDP port of the VXLAN device that carries pod traffic between nodes (not the
    /// wire VXLANs' 4789).
    #[arg(long, env = "WEFT_POD_VXLAN_PORT", default_value_t = weft_nodenet::DEFAULT_VXLAN_PORT)]
    pod_vxlan_port: u16,
    /// VNI of that VXLAN device (the same on every node).
    #[arg(long, env = "WEFT_POD_VXLAN_VNI", default_value_t = weft_nodenet::DEFAULT_VXLAN_VNI,
          value_parser = clap::value_parser!(u32).range(1..16_777_216))]
    pod_vxlan_vni: u32,
    /// Masquerade pod traffic to anything outside every node's pod ranges (and the
    /// `--no-masquerade-cidr`s) to the node's address.
    #[arg(long, env = "WEFT_MASQUERADE", default_value_t = true, action = clap::ArgAction::Set)]
    masquerade: bool,
    /// A destination never masqueraded (repeatable; comma-separated in the variable).
    #[arg(long = "no-masquerade-cidr", env = "WEFT_NO_MASQUERADE_CIDRS", value_delimiter = ',')]
    no_masquerade_cidrs: Vec<ipnet::IpNet>,
    /// How long to wait at start for a previous weftd (still exiting) to release the
    /// state directory, seconds.
    #[arg(long, env = "WEFT_LOCK_WAIT", default_value_t = 30)]
    lock_wait: u64,
}

/// `--inter-node-link` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum InterNodeLink {
    /// Kernel VXLAN with unicast FDB entries.
    Vxlan,
    /// Frames carried by weftd over batched gRPC streams.
    Grpc,
}

/// The wire engine as the handler's wiring seam.
struct EngineWiring(Arc<Engine>);

impl Wiring for EngineWiring {
    fn pod_added(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            let local = LocalPod {
                netns: pod.netns,
                container_id: pod.container_id,
            };
            self.0.pod_added(&pod.namespace, &pod.name, local).await
        })
    }
    fn pod_removed(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move { self.0.pod_removed(&pod.namespace, &pod.name, &pod.container_id).await })
    }
    fn wires(&self) -> futures::future::BoxFuture<'_, Vec<WireInfo>> {
        Box::pin(async move {
            let report = match self.0.report().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the wire ends");
                    return Vec::new();
                }
            };
            report
                .into_iter()
                .map(|(r, st)| WireInfo {
                    id: r.id,
                    peer_id: r.peer_id,
                    namespace: r.namespace,
                    link_uid: r.link_uid,
                    pod: r.local_pod,
                    intf: r.local_intf,
                    peer_pod: r.peer_pod,
                    peer_intf: r.peer_intf,
                    peer_node: r.peer_node,
                    kind: r.kind,
                    state: r.state,
                    vni: r.vni.unwrap_or(0),
                    counters: st.map(|s| WireCounters {
                        tx_frames: s.tx_packets,
                        tx_bytes: s.tx_bytes,
                        rx_frames: s.rx_packets,
                        rx_bytes: s.rx_bytes,
                        dropped: s.rx_dropped + s.tx_dropped,
                    }),
                })
                .collect()
        })
    }
}

/// Where the cluster's objects (Topologies, Nodes) come from.
enum SourceKind {
    /// A directory of files (labs, standalone nodes).
    Dir,
    /// The Kubernetes API: pod ranges must come from this node's Node.
    Kube,
}

/// The source of Topology and Node objects the flags ask for, if any.
async fn topology_source(
    args: &Args,
    node_name: &str,
) -> anyhow::Result<Option<(Arc<dyn TopologySource>, SourceKind)>> {
    if let Some(dir) = &args.topology_dir {
        let src = weft_topology::DirSource::start(dir.clone(), node_name.to_string())
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("reading topologies from {}", dir.display()))?;
        return Ok(Some((src, SourceKind::Dir)));
    }
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    if args.kubernetes.unwrap_or(in_cluster) {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the Kubernetes API")?;
        return Ok(Some((
            weft_topology::KubeSource::start(client, node_name.to_string()),
            SourceKind::Kube,
        )));
    }
    Ok(None)
}

/// The version and commit weftd reports.
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("WEFT_COMMIT");

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let node_name = args.node_name.clone().unwrap_or_else(hostname);
    let metrics = Metrics::new(VERSION, COMMIT);
    let provider = match weft_telemetry::otel::provider(&node_name, VERSION) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("weftd: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let provider = weft_telemetry::init(args.log_format, provider, metrics.clone());
    let outcome = run(args, node_name, metrics).await;
    // Flush what is left of the traces; the exporter blocks, so not on a worker.
    let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "weftd stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, node_name: String, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    // Installed first, so a SIGTERM during start-up still means an orderly stop.
    let shutdown = shutdown_signal()?;
    let started_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    std::fs::create_dir_all(&args.state_dir).with_context(|| format!("creating {}", args.state_dir.display()))?;
    std::fs::set_permissions(&args.state_dir, std::fs::Permissions::from_mode(0o700))?;
    // One daemon per state directory, held for the process's life: a second weftd on
    // the same state would "recover" the first one's calls in flight.
    let _state_lock = lock_state_dir(&args.state_dir, Duration::from_secs(args.lock_wait)).await?;
    // Claim the socket before touching state, for the same reason; calls that arrive
    // now wait in the backlog until recovery is done.
    let listener = server::bind_unix(&args.socket).with_context(|| format!("binding {}", args.socket.display()))?;
    let db_path = args.state_dir.join("weft.db");
    let store_seconds = metrics.store_transaction.clone();
    let observer: weft_store::Observer = Arc::new(move |d: Duration| store_seconds.observe(d.as_secs_f64()));
    let store = Store::open_observed(&db_path, Some(observer))
        .with_context(|| format!("opening the state store {}", db_path.display()))?;
    let version = format!("{VERSION} ({COMMIT})");
    let (run_id, previous) = store
        .run(move |db| db.begin_run(&version))
        .await
        .context("recording the start")?;
    let previous_run = match &previous {
        weft_store::PreviousRun::None => "none (first start)",
        weft_store::PreviousRun::Stopped { .. } => "stopped cleanly",
        weft_store::PreviousRun::Crashed { .. } => "did not stop cleanly (killed or crashed)",
    };
    info!(node = %node_name, state = %db_path.display(), first_start = matches!(previous, weft_store::PreviousRun::None), previous_run, version = VERSION, commit = COMMIT, tracing_export = weft_telemetry::otel::export_configured(), "weftd starting");

    weft_kernel::enable_forwarding().context("enabling IP forwarding")?;
    if args.hostports_localhost {
        weft_kernel::sysctl::write("net/ipv4/conf/all/route_localnet", "1").context("enabling route_localnet")?;
    }
    let kernel = KernelNetworking {
        host_ports: weft_portmap::Options {
            localhost: args.hostports_localhost,
        },
    };
    let recovered = recover::recover(&store, &kernel)
        .await
        .map_err(|e| anyhow::anyhow!(e))
        .context("start-up recovery")?;
    info!(
        rolled_back = recovered.rolled_back,
        torn_down = recovered.torn_down,
        "start-up recovery done"
    );

    if args.pod_vxlan_port == weft_kernel::wire::VXLAN_PORT {
        anyhow::bail!(
            "--pod-vxlan-port {} is the port wire VXLANs use; pick another (default {})",
            args.pod_vxlan_port,
            weft_nodenet::DEFAULT_VXLAN_PORT
        );
    }
    let (source, source_kind) = match topology_source(&args, &node_name).await? {
        Some((s, k)) => (Some(s), Some(k)),
        None => (None, None),
    };
    // Routes to the other nodes' pod ranges, masquerade and the pod MTU: one pass before
    // serving, so the first ADD already gets this node's pod ranges.
    let nodenet = Arc::new(weft_nodenet::NodeNetwork::new(
        weft_nodenet::Config {
            node_name: node_name.clone(),
            node_address: args.node_address,
            routing: args.pod_routing,
            vxlan_port: args.pod_vxlan_port,
            vxlan_vni: args.pod_vxlan_vni,
            masquerade: args.masquerade,
            no_masquerade: args.no_masquerade_cidrs.clone(),
            resync: Duration::from_secs(args.reconcile_interval.max(1)),
        },
        source.clone(),
        weft_nodenet::HostKernel::new().context("opening netlink for pod routing")?,
        metrics.clone(),
        local_ranges(store.clone()),
    ));
    nodenet.pass().await;
    let engine = match &source {
        Some(source) => {
            let pods = store
                .run(|db| db.list(None, Some(weft_store::State::Ready)))
                .await
                .context("listing attachments")?
                .into_iter()
                .filter(|a| !a.pod.name.is_empty())
                .map(|a| {
                    let ns = if a.pod.namespace.is_empty() {
                        "default".to_string()
                    } else {
                        a.pod.namespace
                    };
                    let pod = LocalPod {
                        netns: a.netns,
                        container_id: a.key.container_id,
                    };
                    ((ns, a.pod.name), pod)
                })
                .collect();
            let cfg = EngineConfig {
                node_name: node_name.clone(),
                node_address: args
                    .node_address
                    .or_else(|| (!args.wire_addr.ip().is_unspecified()).then(|| args.wire_addr.ip())),
                wire_port: args.wire_addr.port(),
                default_kind: match args.inter_node_link {
                    InterNodeLink::Vxlan => LinkKind::Vxlan,
                    InterNodeLink::Grpc => LinkKind::Grpc,
                },
                mtu: args.wire_mtu,
                resync: Duration::from_secs(args.reconcile_interval.max(1)),
            };
            Some(Engine::start(cfg, source.clone(), store.clone(), metrics.clone(), pods).await)
        }
        None => None,
    };
    let mut handler = Handler::new(
        store.clone(),
        kernel,
        NodeInfo {
            name: node_name.clone(),
        },
    );
    let wiring = engine
        .as_ref()
        .map(|e| Arc::new(EngineWiring(e.clone())) as Arc<dyn Wiring>);
    if let Some(w) = &wiring {
        handler = handler.with_wiring(w.clone());
    }
    // With a source of Node objects, a network config may leave `ranges` and `mtu` to
    // the node; without one (a standalone node), the config must give its ranges.
    if source.is_some() {
        handler = handler.with_pod_defaults(pod_defaults(nodenet.view()));
    }
    let handler = Arc::new(handler);
    // Before serving: the kernel is made to match the store again (what went while
    // weftd was away is repaired, pods whose namespace is gone are collected).
    let repaired = handler
        .reconcile()
        .await
        .map_err(|e| anyhow::anyhow!(e))
        .context("start-up reconciliation")?;
    count_repairs(&metrics, &repaired);
    info!(?repaired, "start-up reconciliation done");
    let ready = Readiness::default();
    let pending = {
        let h = handler.clone();
        Arc::new(move || h.pending_teardowns()) as Arc<dyn Fn() -> usize + Send + Sync>
    };
    let calls = Arc::new(CallLog::new(args.calls_history));
    let mut admin = AdminService::new(
        store.clone(),
        node_name.clone(),
        started_at,
        ready.flag(),
        pending,
        calls.clone(),
    );
    if let Some(w) = wiring {
        admin = admin.with_wiring(w);
    }
    admin = admin.with_node_network(node_network_report(&nodenet, args.masquerade));

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let http = weft_telemetry::bind_http(args.metrics_addr)
        .await
        .with_context(|| format!("binding the HTTP endpoints on {}", args.metrics_addr))?;
    let http_task = tokio::spawn(weft_telemetry::serve_http(
        http,
        weft_telemetry::router(
            ready.clone(),
            metrics.clone(),
            Some(refresh_gauges(store.clone(), metrics.clone(), engine.clone())),
        ),
        stopped(stop_rx.clone()),
    ));

    // Cross-cutting behaviour of every call (span, metrics, access log, call log) is
    // this one layer; the services below know nothing of it.
    let grpc = tonic::transport::Server::builder()
        .layer(GrpcLayer::new(metrics.clone(), calls))
        .add_service(CniServer::new(CniService::new(handler.clone())))
        .add_service(AdminServer::new(admin))
        .serve_with_incoming_shutdown(server::root_only(listener), stopped(stop_rx.clone()));
    let grpc_task = tokio::spawn(grpc);
    let reconcile_task = tokio::spawn(reconcile(
        handler.clone(),
        metrics.clone(),
        Duration::from_secs(args.reconcile_interval.max(1)),
        stopped(stop_rx.clone()),
    ));
    let nodenet_task = tokio::spawn(nodenet.clone().run(stopped(stop_rx.clone())));
    let wire_task = match &engine {
        Some(engine) => {
            let wire = tokio::net::TcpListener::bind(args.wire_addr)
                .await
                .with_context(|| format!("binding the wire service on {}", args.wire_addr))?;
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(wire);
            let serve = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .initial_stream_window_size(Some(4 << 20))
                .initial_connection_window_size(Some(8 << 20))
                .max_frame_size(Some(weft_wires::dataplane::H2_MAX_FRAME))
                .add_service(WireService::server(engine.clone()))
                .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
            // On the wire data plane's own thread, beside the TAP readers.
            Some(weft_wires::dataplane::spawn(serve))
        }
        None => None,
    };
    match source {
        // Not ready before the caches are filled (an ADD must find its topology) and, in
        // a cluster, before this node has its podCIDRs (an ADD needs addresses to give).
        Some(source) => {
            let ready = ready.clone();
            let mut view = nodenet.view();
            let need_ranges = matches!(source_kind, Some(SourceKind::Kube));
            let node = node_name.clone();
            tokio::spawn(async move {
                while !source.ready() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                info!("topology and node caches synced");
                if need_ranges {
                    let mut said = false;
                    loop {
                        if !view.borrow_and_update().ranges.is_empty() {
                            break;
                        }
                        if !said {
                            info!(node = %node, "waiting for this node's podCIDRs (spec.podCIDRs of its Node) before serving ADDs");
                            said = true;
                        }
                        if view.changed().await.is_err() {
                            return;
                        }
                    }
                }
                ready.set(true);
            });
        }
        None => ready.set(true),
    }
    info!(socket = %args.socket.display(), http = %args.metrics_addr, "weftd ready");

    shutdown.await;
    info!("shutting down: finishing calls in flight");
    ready.set(false);
    let _ = stop_tx.send(true);
    let _ = grpc_task.await;
    let _ = reconcile_task.await;
    let _ = nodenet_task.await;
    if let Some(t) = wire_task {
        let _ = t.await;
    }
    let _ = std::fs::remove_file(&args.socket);
    if tokio::time::timeout(Duration::from_secs(10), handler.drain_teardowns())
        .await
        .is_err()
    {
        info!("teardowns still running at exit; the next start finishes them");
    }
    let _ = http_task.await;
    if let Err(e) = store.run(move |db| db.end_run(run_id)).await {
        tracing::warn!(error = %e, "could not record the clean stop");
    }
    info!("weftd stopped");
    Ok(())
}

/// Checks the kernel against the store every `every` until `stop` (see
/// [`Handler::reconcile`]), counting what it repaired.
async fn reconcile<I: weft_daemon::Ipam, K: weft_daemon::PodNetworking>(
    handler: Arc<Handler<I, K>>,
    metrics: Arc<Metrics>,
    every: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        reconcile_once(&handler, &metrics).await;
    }
}

/// Adds what a reconcile pass repaired to `weft_reconcile_repairs_total`.
fn count_repairs(metrics: &Metrics, repaired: &std::collections::BTreeMap<&'static str, u64>) {
    for (kind, n) in repaired {
        metrics
            .reconcile_repairs
            .get_or_create(&weft_telemetry::metrics::RepairLabels { kind })
            .inc_by(*n);
    }
}

/// One reconcile pass; what it repaired goes into `weft_reconcile_repairs_total`.
async fn reconcile_once<I: weft_daemon::Ipam, K: weft_daemon::PodNetworking>(
    handler: &Handler<I, K>,
    metrics: &Metrics,
) {
    match handler.reconcile().await {
        Ok(repaired) => {
            count_repairs(metrics, &repaired);
            if !repaired.is_empty() {
                info!(?repaired, "reconcile pass repaired kernel state");
            }
        }
        Err(e) => tracing::warn!(error = %e, "reconcile pass failed"),
    }
}

/// Sets the gauges read from the store (addresses per range, pods) and the kernel
/// wires' counters before a scrape.
fn refresh_gauges(store: Store, metrics: Arc<Metrics>, engine: Option<Arc<Engine>>) -> weft_telemetry::Refresh {
    Arc::new(move || {
        let (store, metrics, engine) = (store.clone(), metrics.clone(), engine.clone());
        Box::pin(async move {
            if let Some(engine) = engine {
                engine.sample_counters().await;
            }
            let read = store.run(|db| Ok((db.range_usage()?, db.counts()?, db.ports()?.len())));
            if let Ok((usage, counts, ports)) = read.await {
                metrics.hostports.set(i64::try_from(ports).unwrap_or(i64::MAX));
                for u in usage {
                    let range = u.range.to_string();
                    let free = u.capacity.saturating_sub(u.allocated);
                    for (state, v) in [("allocated", u.allocated), ("free", free)] {
                        metrics
                            .ipam_addresses
                            .get_or_create(&RangeLabels {
                                range: range.clone(),
                                state,
                            })
                            .set(i64::try_from(v).unwrap_or(i64::MAX));
                    }
                }
                metrics.pods.set(i64::try_from(counts.1).unwrap_or(i64::MAX));
            }
        })
    })
}

/// Takes the state directory's lock. A weftd that is still exiting (seconds after a
/// SIGKILL, while the kernel tears its sockets down) holds it a little longer: wait for
/// it, up to `wait`, saying so once, rather than fail a restart that would succeed.
async fn lock_state_dir(dir: &std::path::Path, wait: Duration) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = dir.join("weftd.lock");
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                if said {
                    info!(state = %dir.display(), "the previous weftd released the state directory");
                }
                return Ok(lock);
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if tokio::time::Instant::now() < deadline => {
                if !said {
                    info!(state = %dir.display(), wait_seconds = wait.as_secs(), "another weftd holds the state directory; waiting for it to exit");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err((_, e)) => {
                anyhow::bail!(
                    "another weftd is running on state directory {} ({e}); waited {} s for it to exit",
                    dir.display(),
                    wait.as_secs()
                )
            }
        }
    }
}

/// The pod ranges of this node's network configs (every range the store has seen):
/// the masquerade keeps them inside the pod network too.
fn local_ranges(store: Store) -> weft_nodenet::LocalRanges {
    Arc::new(move || {
        let store = store.clone();
        Box::pin(async move {
            store
                .run(|db| db.range_usage())
                .await
                .map(|u| u.into_iter().map(|r| r.range).collect())
                .unwrap_or_default()
        })
    })
}

/// What `weftctl status` shows of the pod network between nodes: the last pass's view.
fn node_network_report(
    nodenet: &weft_nodenet::NodeNetwork<weft_nodenet::HostKernel>,
    masquerade: bool,
) -> weft_daemon::service::NodeNetworkReport {
    let view = nodenet.view();
    let routing = nodenet.config().routing.as_str();
    Arc::new(move || {
        let v = view.borrow();
        v.synced.then(|| weft_rpc::admin::NodeNetwork {
            routing: routing.to_string(),
            pod_cidrs: v.ranges.iter().map(ToString::to_string).collect(),
            pod_mtu: v.pod_mtu.unwrap_or(0),
            address: v.address.map(|a| a.to_string()).unwrap_or_default(),
            masquerade,
            peers: v
                .peers
                .iter()
                .map(|p| weft_rpc::admin::PeerNode {
                    name: p.name.clone(),
                    mode: p.mode.as_str().to_string(),
                    problem: p.problem.clone().unwrap_or_default(),
                })
                .collect(),
        })
    })
}

/// Follows the node network's decisions with the defaults ADDs are served with.
fn pod_defaults(mut view: watch::Receiver<weft_nodenet::NodeView>) -> watch::Receiver<PodDefaults> {
    let of = |v: &weft_nodenet::NodeView| PodDefaults {
        ranges: v.ranges.clone(),
        mtu: v.pod_mtu,
    };
    let (tx, rx) = watch::channel(of(&view.borrow_and_update()));
    tokio::spawn(async move {
        while view.changed().await.is_ok() {
            let next = of(&view.borrow_and_update());
            tx.send_if_modified(|d| {
                if *d == next {
                    false
                } else {
                    *d = next;
                    true
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Resolves at the first SIGTERM or SIGINT; the handlers are in place once this returns.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    })
}
