//! Flow records in the node: the node's conntrack table read on a thread of its own
//! (events as they come, a dump at start, every [`FlowsConfig::dump_every`] and after
//! an overflow), the policy engine's denied packets, both attributed through the
//! engine's view of the cluster (the one `policy explain` evaluates), kept by a
//! [`Tracker`], counted in `weft_flow*` metrics and served to `weftctl flows`.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::broadcast;
use weft_daemon::service::{FlowsAdmin, FlowsStream};
use weft_flows::attribution::ViewResolver;
use weft_flows::export::FileExport;
use weft_flows::{
    Config, DeniedPacket, Effect, FlowRecord, Peer, PeerKind, PolicyHit, PolicySide, Resolve, Tracker, wire,
};
use weft_kernel::conntrack::{self, ConntrackEvents, ReadError};
use weft_policy::Direction;
use weft_rpc::admin::{FlowsItem, FlowsRequest, flows_item};
use weft_telemetry::{Families, Metrics};

use crate::netpol::Engine;

pub mod otlp;

use otlp::OtlpExport;

/// How flows are recorded (`weftd --flows*`).
#[derive(Debug, Clone)]
pub struct FlowsConfig {
    /// Whether flows are recorded at all.
    pub enabled: bool,
    /// Ended flows kept for listing.
    pub ring: usize,
    /// How long 15 s aggregates are kept.
    pub window: Duration,
    /// The conntrack event socket's receive buffer (bytes).
    pub receive_buffer: usize,
    /// How often the table is dumped to refresh open flows' counters.
    pub dump_every: Duration,
    /// Ended flows written to a file as JSON lines, if anywhere.
    pub file: Option<weft_flows::export::FileExportConfig>,
    /// Flows or aggregates exported as OTLP logs, if at all.
    pub otlp: Option<otlp::OtlpExportConfig>,
    /// Flow metrics per workload for every namespace (else only for those annotated
    /// `weft.dev/flow-metrics: workload`).
    pub workload_metrics: bool,
}

impl Default for FlowsConfig {
    fn default() -> Self {
        FlowsConfig {
            enabled: true,
            ring: weft_flows::tracker::DEFAULT_RING,
            window: Duration::from_secs(3600),
            receive_buffer: 8 << 20,
            dump_every: Duration::from_secs(10),
            file: None,
            otlp: None,
            workload_metrics: false,
        }
    }
}

/// The sysctls flows need on: per-connection byte and packet counters, and start and
/// stop times.
pub const SYSCTLS: [&str; 2] = [
    "net/netfilter/nf_conntrack_acct",
    "net/netfilter/nf_conntrack_timestamp",
];

/// A flow's verdict and kind, with the namespace of the pod this node reports it for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    /// `forwarded`, `denied` or `audit`.
    pub verdict: &'static str,
    /// `intra-node`, `inter-node`, `to-outside`, `from-outside`, `to-node`, `from-node`.
    pub kind: &'static str,
    /// The namespace of the pod the flow is reported for (the source pod, or the
    /// destination of a flow from outside or from a node).
    pub namespace: String,
}

/// A flow's verdict and kind, with the namespace and workload of the pod this node
/// reports it for: the labels of the per-workload families, for the namespaces that ask
/// (`weft.dev/flow-metrics: workload`) or all (`--flows-workload-metrics`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadFlowLabels {
    /// As [`FlowLabels::verdict`].
    pub verdict: &'static str,
    /// As [`FlowLabels::kind`].
    pub kind: &'static str,
    /// As [`FlowLabels::namespace`].
    pub namespace: String,
    /// The pod's workload, `Kind/name` (a Deployment's ReplicaSet as the Deployment), or
    /// `none` for pods no controller owns (never a pod's name: the series stay bounded
    /// by workloads).
    pub workload: String,
}

/// The workload label of a pod's workload (`Kind/name`, or empty).
fn workload_label(w: &str) -> String {
    if w.is_empty() { "none".into() } else { w.to_string() }
}

/// Conntrack entries read, by what they said.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `entries` (events and dumped entries), `denies`, `undecodable`.
    pub kind: &'static str,
}

/// Flow records kept, by state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecordLabels {
    /// `open` or `kept` (ended, in the ring), or `aggregates`.
    pub state: &'static str,
}

/// The flow families; get them with `metrics.families::<FlowMetrics>()`.
pub struct FlowMetrics {
    /// `weft_flows_total{verdict, kind, namespace}`: flows begun (or refused).
    pub flows: Family<FlowLabels, Counter>,
    /// `weft_flow_bytes_total{verdict, kind, namespace}`: bytes both ways, counted as
    /// they grow (each read of the table adds what the flows moved since the last).
    pub bytes: Family<FlowLabels, Counter>,
    /// `weft_flow_events_total{kind}`.
    pub events: Family<EventLabels, Counter>,
    /// `weft_flow_events_lost_total`: flows whose end was lost with dropped kernel
    /// events, and flows first seen in a recovery dump.
    pub lost: Counter,
    /// `weft_flow_overflows_total`: times the kernel dropped events.
    pub overflows: Counter,
    /// `weft_flow_records{state}`.
    pub records: Family<RecordLabels, Gauge>,
    /// `weft_workload_flows_total{verdict, kind, namespace, workload}`: as `flows`, per
    /// workload, where asked for.
    pub workload_flows: Family<WorkloadFlowLabels, Counter>,
    /// `weft_workload_flow_bytes_total{verdict, kind, namespace, workload}`.
    pub workload_bytes: Family<WorkloadFlowLabels, Counter>,
    /// `weft_flow_updated_timestamp_seconds`: when the flows (and their aggregates) were
    /// last brought up to date from the kernel; `time() - it` is the aggregation lag.
    pub updated: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Families for FlowMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = FlowMetrics {
            flows: Family::default(),
            bytes: Family::default(),
            events: Family::default(),
            lost: Counter::default(),
            overflows: Counter::default(),
            records: Family::default(),
            workload_flows: Family::default(),
            workload_bytes: Family::default(),
            updated: Gauge::default(),
        };
        metrics.register(
            "weft_workload_flows",
            "Flows begun (or refused) per workload, for the namespaces annotated weft.dev/flow-metrics=workload (or all, with --flows-workload-metrics)",
            m.workload_flows.clone(),
        );
        metrics.register(
            "weft_workload_flow_bytes",
            "Bytes flows moved, both ways, per workload, where asked for (as weft_workload_flows)",
            m.workload_bytes.clone(),
        );
        metrics.register(
            "weft_flow_updated_timestamp_seconds",
            "When flows were last brought up to date from the kernel (Unix seconds): time() minus it is the aggregation lag",
            m.updated.clone(),
        );
        metrics.register(
            "weft_flows",
            "Flows of this node's pods begun (or refused), by verdict, kind and the reported pod's namespace",
            m.flows.clone(),
        );
        metrics.register(
            "weft_flow_bytes",
            "Bytes flows moved, both ways, by verdict, kind and namespace (counted at each read of the conntrack table)",
            m.bytes.clone(),
        );
        metrics.register(
            "weft_flow_events",
            "Conntrack entries and denied packets read",
            m.events.clone(),
        );
        metrics.register(
            "weft_flow_events_lost",
            "Flow events lost when the kernel's buffer overflowed (ends recovered from a dump, as lost)",
            m.lost.clone(),
        );
        metrics.register(
            "weft_flow_overflows",
            "Times the kernel dropped conntrack events (ENOBUFS), each recovered by a dump",
            m.overflows.clone(),
        );
        metrics.register("weft_flow_records", "Flow records held, by state", m.records.clone());
        m
    }
}

fn now_ms() -> i64 {
    weft_policy::denies::now_ms()
}

/// The flows of this node, shared by the reader thread, the deny relay and the admin
/// service.
pub struct NodeFlows {
    node: String,
    cfg: FlowsConfig,
    tracker: Mutex<Tracker>,
    changes: broadcast::Sender<FlowRecord>,
    engine: Arc<Engine>,
    metrics: Arc<FlowMetrics>,
    /// When events were last lost (Unix ms; 0: never), for readiness's note.
    last_overflow_ms: AtomicI64,
    /// Why flows are not recorded, when the reader could not start.
    problem: Mutex<Option<String>>,
    /// When a listing last refreshed the counters (Unix ms).
    last_refresh_ms: AtomicI64,
    /// The export file, when one is configured and could be opened.
    export: Option<Mutex<FileExport>>,
    /// The OTLP export, when one is configured.
    otlp: Option<Mutex<OtlpExport>>,
    /// The last view the engine published and its staged preview (see `staged_view`).
    staged: Mutex<StagedCache>,
    /// The other nodes, once the announcer runs (cluster-wide listings).
    peers: std::sync::OnceLock<Arc<dyn PeerFlows>>,
    /// The label sets of `weft_flows_total` and `weft_flow_bytes_total` in use: those of
    /// a namespace that is gone are removed.
    labels: Mutex<HashSet<FlowLabels>>,
    /// The same for the per-workload families (removed too when the workload is gone or
    /// its namespace stops asking).
    workload_labels: Mutex<HashSet<WorkloadFlowLabels>>,
}

/// The other nodes' flows, for a cluster-wide listing: the wire port's `Policy.Flows`
/// ([`crate::announce::WireAnnouncer`] asks over its channels to every peer).
pub trait PeerFlows: Send + Sync + 'static {
    /// Asks every other node at once (`request` with `cluster` off); each answer, by
    /// its node's name, as its stream of items, or why there is none.
    fn flows(&self, request: FlowsRequest) -> BoxFuture<'static, Vec<(String, Result<FlowsStream, String>)>>;
}

/// The staged preview of the last view the policy engine published, made once per view
/// and only while a policy is staged.
///
/// It names its view by a weak handle, and keeps nothing while nothing is staged: the
/// engine changes its latest view in place at a pass of pods only (`Arc::make_mut`), and
/// a second strong handle here would have it copy the whole view, every pod of the
/// cluster, at each of those passes (one per pod another node announces).
#[derive(Default)]
struct StagedCache(Option<(std::sync::Weak<weft_policy::ClusterView>, Arc<weft_policy::ClusterView>)>);

impl StagedCache {
    /// The staged preview of `view` ([`weft_policy::ClusterView::staged`]).
    fn preview(&mut self, view: &Arc<weft_policy::ClusterView>) -> Option<Arc<weft_policy::ClusterView>> {
        if !view.has_staged() {
            self.0 = None;
            return None;
        }
        match &self.0 {
            // A weak handle keeps its allocation: an address equal to it is this view.
            Some((of, staged)) if std::ptr::eq(of.as_ptr(), Arc::as_ptr(view)) => Some(staged.clone()),
            _ => {
                let staged = Arc::new(view.staged()?);
                self.0 = Some((Arc::downgrade(view), staged.clone()));
                Some(staged)
            }
        }
    }
}

/// How soon a closed flow (FIN, RST) is announced at most: its counters come from a
/// dump (conntrack's update events carry none), taken this often while flows close.
pub const CLOSING_READ_EVERY: Duration = Duration::from_secs(1);

/// How long after an overflow `/readyz` mentions it.
pub const OVERFLOW_NOTE_FOR: Duration = Duration::from_secs(600);

impl NodeFlows {
    /// Flows of node `node`, attributed through `engine`; an error when an export asked
    /// for cannot start. Must be called inside a tokio runtime (the OTLP exporter's).
    pub fn new(node: &str, cfg: FlowsConfig, engine: Arc<Engine>, metrics: &Metrics) -> Result<Arc<Self>, String> {
        let bucket_ms = 15_000;
        let export = cfg.file.clone().and_then(|f| {
            let path = f.path.clone();
            match FileExport::open(f) {
                Ok(e) => Some(Mutex::new(e)),
                Err(e) => {
                    tracing::error!(error = %e, path = %path.display(), "cannot open the flow export file: flows are not written to it");
                    None
                }
            }
        });
        let otlp = match cfg.otlp.clone() {
            Some(o) => Some(Mutex::new(OtlpExport::start(node, o)?)),
            None => None,
        };
        let tracker = Tracker::new(Config {
            node: node.into(),
            ring: cfg.ring,
            bucket_ms,
            buckets: (cfg.window.as_millis() as i64 / bucket_ms).max(1) as usize,
            ..Config::default()
        });
        Ok(Arc::new(NodeFlows {
            node: node.into(),
            cfg,
            tracker: Mutex::new(tracker),
            changes: broadcast::channel(4096).0,
            engine,
            metrics: metrics.families::<FlowMetrics>(),
            last_overflow_ms: AtomicI64::new(0),
            problem: Mutex::new(None),
            last_refresh_ms: AtomicI64::new(0),
            export,
            otlp,
            staged: Mutex::default(),
            peers: std::sync::OnceLock::new(),
            labels: Mutex::new(HashSet::new()),
            workload_labels: Mutex::new(HashSet::new()),
        }))
    }

    /// Lets cluster-wide listings ask the other nodes through `peers`.
    pub fn set_peers(&self, peers: Arc<dyn PeerFlows>) {
        let _ = self.peers.set(peers);
    }

    /// Sends what the OTLP export has queued and stops it (blocks: call it off the
    /// runtime's workers).
    pub fn shutdown_export(&self) {
        if let Some(o) = &self.otlp {
            o.lock().expect("flow OTLP export lock").shutdown();
        }
    }

    /// Hands the buckets that closed to the OTLP export, when it exports aggregates.
    fn export_aggregates(&self) {
        let Some(o) = &self.otlp else { return };
        let t = self.tracker.lock().expect("flow tracker lock");
        o.lock()
            .expect("flow OTLP export lock")
            .aggregates(t.aggregates(), now_ms());
    }

    /// Whether events were lost within [`OVERFLOW_NOTE_FOR`].
    pub fn lost_recently(&self) -> bool {
        let t = self.last_overflow_ms.load(Ordering::Relaxed);
        t != 0 && now_ms() - t < OVERFLOW_NOTE_FOR.as_millis() as i64
    }

    /// The staged preview of `view` (see [`StagedCache`]).
    fn staged_view(&self, view: &Arc<weft_policy::ClusterView>) -> Option<Arc<weft_policy::ClusterView>> {
        self.staged.lock().expect("staged view lock").preview(view)
    }

    fn with_tracker<R>(&self, f: impl FnOnce(&mut Tracker, &dyn Resolve) -> R) -> R {
        let latest = self.engine.latest();
        let staged = latest.as_ref().and_then(|l| self.staged_view(&l.view));
        let resolver = ViewResolver {
            view: latest.as_ref().map(|l| &*l.view),
            staged: staged.as_deref(),
        };
        let mut t = self.tracker.lock().expect("flow tracker lock");
        let out = f(&mut t, &resolver);
        let changes = t.take_changes();
        let growth = t.take_growth();
        let stats = t.stats();
        drop(t);
        let per_workload = |ns: &str| self.per_workload(latest.as_ref().map(|l| &*l.view), ns);
        for ((verdict, kind, namespace, workload), bytes) in growth {
            let labels = FlowLabels {
                verdict: verdict.as_str(),
                kind: kind.as_str(),
                namespace: namespace.to_string(),
            };
            self.metrics.bytes.get_or_create(&labels).inc_by(bytes);
            self.labels.lock().expect("flow labels lock").insert(labels);
            if per_workload(&namespace) {
                let labels = WorkloadFlowLabels {
                    verdict: verdict.as_str(),
                    kind: kind.as_str(),
                    namespace: namespace.to_string(),
                    workload: workload_label(&workload),
                };
                self.metrics.workload_bytes.get_or_create(&labels).inc_by(bytes);
                self.workload_labels.lock().expect("flow labels lock").insert(labels);
            }
        }
        self.metrics.updated.set(now_ms() as f64 / 1000.0);
        if let Some(export) = &self.export {
            let mut export = export.lock().expect("flow export lock");
            for r in &changes {
                if let Err(e) = export.write(r) {
                    tracing::warn!(error = %e, "writing a flow to the export file failed");
                    break;
                }
            }
        }
        if let Some(o) = &self.otlp {
            let mut o = o.lock().expect("flow OTLP export lock");
            let now = now_ms();
            for r in &changes {
                o.flow(r, now);
            }
        }
        for r in changes {
            self.count(&r, per_workload);
            let _ = self.changes.send(r);
        }
        for (state, n) in [
            ("open", stats.open),
            ("kept", stats.kept),
            ("aggregates", stats.aggregates),
        ] {
            self.metrics
                .records
                .get_or_create(&RecordLabels { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        out
    }

    /// Whether namespace `ns` has flow metrics per workload.
    fn per_workload(&self, view: Option<&weft_policy::ClusterView>, ns: &str) -> bool {
        self.cfg.workload_metrics
            || view
                .and_then(|v| v.namespaces.get(ns))
                .is_some_and(|n| n.workload_flow_metrics)
    }

    fn count(&self, r: &FlowRecord, per_workload: impl Fn(&str) -> bool) {
        // Once per flow: as it opens, or as it is refused.
        if r.end != weft_flows::EndReason::Open && r.end != weft_flows::EndReason::Denied {
            return;
        }
        let pod = if r.src.kind == PeerKind::Pod { &r.src } else { &r.dst };
        let labels = FlowLabels {
            verdict: r.verdict.as_str(),
            kind: r.kind.as_str(),
            namespace: pod.namespace.to_string(),
        };
        self.metrics.flows.get_or_create(&labels).inc();
        self.labels.lock().expect("flow labels lock").insert(labels);
        if per_workload(&pod.namespace) {
            let labels = WorkloadFlowLabels {
                verdict: r.verdict.as_str(),
                kind: r.kind.as_str(),
                namespace: pod.namespace.to_string(),
                workload: workload_label(&pod.workload),
            };
            self.metrics.workload_flows.get_or_create(&labels).inc();
            self.workload_labels.lock().expect("flow labels lock").insert(labels);
        }
    }

    /// Reads the node's conntrack table until `stop`, on a thread of its own in the
    /// calling thread's network namespace (weftd's, the node's).
    pub fn read(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("flows-conntrack".into())
            .spawn(move || me.read_loop(&stop))
    }

    fn read_loop(&self, stop: &AtomicBool) {
        let mut events = match ConntrackEvents::subscribe(self.cfg.receive_buffer) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "cannot read conntrack events: flows are not recorded");
                *self.problem.lock().expect("lock") = Some(format!("conntrack events: {e}"));
                return;
            }
        };
        let _ = events.set_timeout(Duration::from_millis(250));
        let started = now_ms();
        let _ = self.dump(false);
        self.with_tracker(|t, _| t.gap(0, started, "start"));
        let mut last_dump = Instant::now();
        let mut last_closing_dump = Instant::now();
        let mut batch = Vec::with_capacity(256);
        while !stop.load(Ordering::Relaxed) {
            batch.clear();
            match events.next(&mut batch) {
                Ok(bad) => {
                    let now = now_ms();
                    self.metrics
                        .events
                        .get_or_create(&EventLabels { kind: "entries" })
                        .inc_by(batch.len() as u64);
                    if bad > 0 {
                        self.metrics
                            .events
                            .get_or_create(&EventLabels { kind: "undecodable" })
                            .inc_by(bad as u64);
                    }
                    if !batch.is_empty() || bad > 0 {
                        self.with_tracker(|t, r| {
                            t.undecodable(bad as u64);
                            for e in &batch {
                                t.apply(e, r, now);
                            }
                        });
                    }
                }
                Err(ReadError::Overflow) => {
                    let at = now_ms();
                    self.metrics.overflows.inc();
                    self.last_overflow_ms.store(at, Ordering::Relaxed);
                    tracing::warn!(
                        buffer = self.cfg.receive_buffer,
                        "conntrack events were dropped (the receive buffer overflowed): recovering from a dump"
                    );
                    // The kernel drops silently until the queue is read empty: drain
                    // first, then dump (see `ConntrackEvents::drain`).
                    batch.clear();
                    let bad = events.drain(&mut batch).unwrap_or(0);
                    self.with_tracker(|t, r| {
                        t.overflowed();
                        t.undecodable(bad as u64);
                        for e in &batch {
                            t.apply(e, r, at);
                        }
                    });
                    let lost = self.dump(true);
                    self.with_tracker(|t, _| t.gap(at, now_ms(), "overflow"));
                    tracing::warn!(
                        lost,
                        drained = batch.len(),
                        "conntrack events recovered: flows first seen in the dump, or gone from it (ended as lost)"
                    );
                    last_dump = Instant::now();
                }
                Err(ReadError::Io(e)) => {
                    tracing::warn!(error = %e, "reading conntrack events failed");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            if last_dump.elapsed() >= self.cfg.dump_every {
                let _ = self.dump(false);
                self.forget_gone_namespaces();
                last_dump = Instant::now();
            }
            if last_closing_dump.elapsed() >= CLOSING_READ_EVERY && self.read_closing() {
                last_closing_dump = Instant::now();
            }
            self.export_aggregates();
        }
    }

    /// When flows closed since the last call, dumps the table to read their counters and
    /// announce their ends; whether it dumped.
    fn read_closing(&self) -> bool {
        if self.tracker.lock().expect("flow tracker lock").closing() == 0 {
            return false;
        }
        match conntrack::dump() {
            Ok(entries) => {
                let now = now_ms();
                self.with_tracker(|t, r| t.read_closing(&entries, r, now));
            }
            Err(e) => tracing::warn!(error = %e, "dumping the conntrack table failed"),
        }
        true
    }

    /// Dumps the table and reconciles the open flows with it; returns the events found
    /// lost.
    fn dump(&self, after_loss: bool) -> u64 {
        match conntrack::dump() {
            Ok(entries) => {
                let now = now_ms();
                let lost = self.with_tracker(|t, r| {
                    let before = t.stats().lost_events;
                    t.reconcile(&entries, r, now, after_loss);
                    t.stats().lost_events - before
                });
                self.metrics.lost.inc_by(lost);
                lost
            }
            Err(e) => {
                tracing::warn!(error = %e, "dumping the conntrack table failed");
                0
            }
        }
    }

    /// Removes the flow series of namespaces the cluster no longer has (their count
    /// would otherwise grow with every namespace ever seen).
    fn forget_gone_namespaces(&self) {
        let Some(latest) = self.engine.latest() else { return };
        // A source that lists no Namespace objects knows none gone.
        if latest.view.namespaces.is_empty() {
            return;
        }
        let view = &latest.view;
        let mut seen = self.labels.lock().expect("flow labels lock");
        for l in gone(&mut seen, |l| view.namespaces.contains_key(&l.namespace)) {
            self.metrics.flows.remove(&l);
            self.metrics.bytes.remove(&l);
        }
        drop(seen);
        let workloads: HashSet<(&str, String)> = view
            .pods
            .iter()
            .map(|p| (p.namespace.as_str(), workload_label(&p.workload)))
            .collect();
        let mut seen = self.workload_labels.lock().expect("flow labels lock");
        let kept = |l: &WorkloadFlowLabels| {
            self.per_workload(Some(view), &l.namespace)
                && view.namespaces.contains_key(&l.namespace)
                && workloads.contains(&(l.namespace.as_str(), l.workload.clone()))
        };
        for l in gone(&mut seen, kept) {
            self.metrics.workload_flows.remove(&l);
            self.metrics.workload_bytes.remove(&l);
        }
    }

    /// Refreshes open flows' counters now (a listing shows what the kernel counts, not
    /// what the last periodic dump read), at most every 250 ms however many ask.
    /// Flows that closed and wait for their counters are read at once: a listing never
    /// shows an ended flow without what it moved.
    fn refresh(&self) {
        let now = now_ms();
        let closing = self.tracker.lock().expect("flow tracker lock").closing() > 0;
        if closing || now - self.last_refresh_ms.load(Ordering::Relaxed) >= 250 {
            self.last_refresh_ms.store(now, Ordering::Relaxed);
            let _ = self.dump(false);
        }
    }

    /// Relays the policy engine's denied packets into the tracker until `stop`.
    pub async fn relay_denies(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut rx = self.engine.denies().subscribe();
        tokio::pin!(stop);
        loop {
            let ev = tokio::select! {
                _ = &mut stop => return,
                ev = rx.recv() => ev,
            };
            match ev {
                Ok(ev) => {
                    self.metrics.events.get_or_create(&EventLabels { kind: "denies" }).inc();
                    let d = DeniedPacket {
                        at_ms: ev.at_ms,
                        src: ev.flow.src,
                        dst: ev.flow.dst,
                        protocol: ev.flow.protocol,
                        port: ev.flow.port.unwrap_or(0),
                        src_port: 0,
                        side: match ev.direction {
                            Direction::Egress => PolicySide::Egress,
                            Direction::Ingress => PolicySide::Ingress,
                        },
                        audit: ev.audit,
                    };
                    self.with_tracker(|t, r| t.denied(&d, r));
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "flows fell behind the deny log");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn stats_item(&self) -> FlowsItem {
        let stats = self.tracker.lock().expect("flow tracker lock").stats();
        let mut s = wire::stats(&self.node, &stats, self.cfg.ring);
        if let Some(p) = self.problem.lock().expect("lock").clone() {
            s.enabled = false;
            s.problem = p;
        }
        FlowsItem {
            item: Some(flows_item::Item::Stats(s)),
        }
    }
}

impl FlowsAdmin for NodeFlows {
    fn flows(&self, request: FlowsRequest) -> Result<FlowsStream, String> {
        let local = self.local_flows(request.clone())?;
        let Some(peers) = self.peers.get().filter(|_| request.cluster).cloned() else {
            return Ok(local);
        };
        let follow = request.follow;
        let remote = futures::stream::once(async move {
            peers
                .flows(FlowsRequest {
                    cluster: false,
                    ..request
                })
                .await
        })
        .flat_map(move |answers| {
            let streams: Vec<FlowsStream> = answers
                .into_iter()
                .map(|(node, answer)| match answer {
                    Ok(s) => s,
                    Err(why) => Box::pin(futures::stream::iter([Ok(unanswered(&node, &why))])) as FlowsStream,
                })
                .collect();
            if follow {
                Box::pin(futures::stream::select_all(streams)) as FlowsStream
            } else {
                Box::pin(futures::stream::iter(streams).flatten())
            }
        });
        Ok(if follow {
            Box::pin(futures::stream::select(local, remote))
        } else {
            Box::pin(local.chain(remote))
        })
    }
}

/// The stats item of a node that did not answer a cluster-wide listing.
fn unanswered(node: &str, why: &str) -> FlowsItem {
    FlowsItem {
        item: Some(flows_item::Item::Stats(weft_rpc::admin::FlowStats {
            node: node.to_string(),
            enabled: false,
            problem: format!("did not answer: {why}"),
            ..Default::default()
        })),
    }
}

impl NodeFlows {
    /// This node's own answer to a Flows request.
    fn local_flows(&self, request: FlowsRequest) -> Result<FlowsStream, String> {
        let filter = wire::filter_of(&request.filter.unwrap_or_default())?;
        // Subscribed before the kept ones are read: none falls between the two.
        let live = request.follow.then(|| self.changes.subscribe());
        self.refresh();
        let mut items = vec![Ok(self.stats_item())];
        {
            let t = self.tracker.lock().expect("flow tracker lock");
            if request.aggregate {
                let since = filter.since_ms.unwrap_or(i64::MIN);
                for a in t.aggregates().query(since, request.per_bucket, |_| true) {
                    if aggregate_matches(&filter, &a) {
                        items.push(Ok(FlowsItem {
                            item: Some(flows_item::Item::Aggregate(wire::aggregate(&a))),
                        }));
                    }
                }
            } else {
                for r in t.list(|r| filter.matches(r), request.limit as usize) {
                    items.push(Ok(FlowsItem {
                        item: Some(flows_item::Item::Flow(wire::flow(&r))),
                    }));
                }
            }
        }
        let kept = futures::stream::iter(items);
        let Some(rx) = live else {
            return Ok(Box::pin(kept));
        };
        let live = futures::stream::unfold((rx, filter), |(mut rx, filter)| async move {
            loop {
                match rx.recv().await {
                    Ok(r) if filter.matches(&r) => {
                        let item = FlowsItem {
                            item: Some(flows_item::Item::Flow(wire::flow(&r))),
                        };
                        return Some((Ok(item), (rx, filter)));
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(Box::pin(futures::StreamExt::chain(kept, live)))
    }
}

/// Takes out of `seen` the label sets `kept` does not keep (a namespace or workload
/// gone), and returns them.
fn gone<L: Clone + Eq + std::hash::Hash>(seen: &mut HashSet<L>, kept: impl Fn(&L) -> bool) -> Vec<L> {
    let out: Vec<L> = seen.iter().filter(|l| !kept(l)).cloned().collect();
    for l in &out {
        seen.remove(l);
    }
    out
}

/// Whether an aggregate falls within a filter: its groups and port, protocol, verdict
/// and policy (ends by pod name cannot match a group of many pods; they match the
/// group of a pod no controller owns, named as the pod).
pub(crate) fn aggregate_matches(f: &weft_flows::Filter, a: &weft_flows::Aggregate) -> bool {
    let probe = FlowRecord {
        id: 0,
        node: "".into(),
        start_ms: a.start_ms,
        end_ms: Some(a.end_ms),
        updated_ms: a.end_ms,
        src: group_peer(&a.key.src),
        dst: group_peer(&a.key.dst),
        dialled: None,
        protocol: a.key.protocol,
        icmp: None,
        kind: a.key.kind,
        verdict: a.key.verdict,
        policies: if a.key.policy.is_empty() {
            Vec::new().into()
        } else {
            Arc::from(vec![PolicyHit {
                domain: "".into(),
                side: PolicySide::Egress,
                kind: "".into(),
                name: a.key.policy.clone(),
                rule: None,
                rule_name: "".into(),
                effect: Effect::Allow,
            }])
        },
        staged: None,
        forward: a.value.forward,
        reverse: a.value.reverse,
        end: weft_flows::EndReason::Timeout,
    };
    let mut probe = probe;
    probe.dst.port = a.key.port;
    f.matches(&probe)
}

/// A peer standing for an aggregate's group (`ns/Kind/name`, `ns/pod`, `node/NAME`,
/// an address).
fn group_peer(g: &str) -> Peer {
    if let Ok(ip) = g.parse::<IpAddr>() {
        return Peer::outside(ip, 0);
    }
    let unspecified: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    if let Some(node) = g.strip_prefix("node/") {
        return Peer {
            kind: PeerKind::Node,
            node: node.into(),
            ..Peer::outside(unspecified, 0)
        };
    }
    let parts: Vec<&str> = g.splitn(2, '/').collect();
    let (ns, rest) = (parts[0], parts.get(1).copied().unwrap_or_default());
    let (pod, workload) = if rest.contains('/') { ("", rest) } else { (rest, "") };
    Peer {
        ip: unspecified,
        port: 0,
        kind: PeerKind::Pod,
        namespace: ns.into(),
        pod: pod.into(),
        workload: workload.into(),
        node: "".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache never holds the view itself: while nothing is staged it keeps nothing,
    /// and with a staged policy it keeps the preview of the view it was made of, made
    /// again for another view.
    #[test]
    fn the_staged_cache_never_holds_the_engine_s_view() {
        let mut cache = StagedCache::default();
        let plain = Arc::new(weft_policy::ClusterView::default());
        assert!(cache.preview(&plain).is_none());
        assert_eq!(Arc::strong_count(&plain), 1);
        let np: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "preview", "namespace": "x"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}
        }))
        .unwrap();
        let mut policy = weft_policy::Policy::from_k8s(&np).policy.expect("a policy that reads");
        policy.mode = weft_policy::PolicyMode::Staged;
        let with_staged = || {
            let mut v = weft_policy::ClusterView::default();
            v.staged_policies.push(Arc::new(policy.clone()));
            Arc::new(v)
        };
        let a = with_staged();
        let first = cache.preview(&a).expect("a preview while a policy is staged");
        assert_eq!(first.policies.len(), 1, "the staged policy, as if enforced");
        assert_eq!(Arc::strong_count(&a), 1, "the view is not held");
        assert!(Arc::ptr_eq(&first, &cache.preview(&a).unwrap()), "made once per view");
        let b = with_staged();
        assert!(
            !Arc::ptr_eq(&first, &cache.preview(&b).unwrap()),
            "made again for another view"
        );
        assert!(cache.preview(&plain).is_none());
        assert!(cache.0.is_none(), "nothing kept while nothing is staged");
    }

    #[test]
    fn series_of_a_namespace_that_is_gone_are_removed() {
        let metrics = Metrics::new("test", "test");
        let m = metrics.families::<FlowMetrics>();
        let labels = |ns: &str| FlowLabels {
            verdict: "forwarded",
            kind: "intra-node",
            namespace: ns.into(),
        };
        let mut seen: HashSet<FlowLabels> = [labels("x"), labels("gone")].into();
        m.flows.get_or_create(&labels("x")).inc();
        m.flows.get_or_create(&labels("gone")).inc();
        for l in gone(&mut seen, |l| l.namespace == "x") {
            m.flows.remove(&l);
        }
        assert_eq!(seen, [labels("x")].into());
        let (_, text) = metrics.render("text/plain");
        assert!(text.contains("namespace=\"x\""), "{text}");
        assert!(!text.contains("namespace=\"gone\""), "{text}");
    }

    #[test]
    fn an_aggregate_group_stands_for_its_pods_in_a_filter() {
        let mut f = weft_flows::Filter::default();
        f.add("from=x/Deployment/web").unwrap();
        f.add("to=y/").unwrap();
        let key = |src: &str, dst: &str| weft_flows::AggKey {
            src: src.into(),
            dst: dst.into(),
            port: 80,
            protocol: 6,
            kind: weft_flows::FlowKind::IntraNode,
            verdict: weft_flows::Verdict::Forwarded,
            policy: "".into(),
        };
        let agg = |k| weft_flows::Aggregate {
            start_ms: 0,
            end_ms: 15_000,
            key: k,
            value: weft_flows::AggValue::default(),
        };
        assert!(aggregate_matches(&f, &agg(key("x/Deployment/web", "y/b"))));
        assert!(!aggregate_matches(&f, &agg(key("x/a", "y/b"))));
        assert!(!aggregate_matches(&f, &agg(key("x/Deployment/web", "node/n1"))));
        let mut g = weft_flows::Filter::default();
        g.add("to=outside").unwrap();
        assert!(aggregate_matches(&g, &agg(key("x/a", "198.51.100.1"))));
    }
}
