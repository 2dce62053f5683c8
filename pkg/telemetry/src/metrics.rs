//! The Prometheus metrics weftd exports, and their exposition: OpenMetrics (with
//! trace-id exemplars) when the scraper asks for it, the classic text format otherwise.
//!
//! Every label value comes from a bounded set: command, CNI code, phase, gRPC method
//! and code, range (from the node's config). Container ids and pod names never become
//! labels: they are in the logs, the traces and `weftctl calls`.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::process::ProcessCollector;

/// Labels of the `grpc_server_*` family (as go-grpc-prometheus names them).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// `unary` for every weft RPC.
    pub grpc_type: &'static str,
    /// Fully qualified service, e.g. `weft.cnirpc.v1.CNI`.
    pub grpc_service: String,
    /// Method, e.g. `Add`.
    pub grpc_method: String,
}

/// [`GrpcLabels`] plus the status code name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcCodeLabels {
    /// `unary`.
    pub grpc_type: &'static str,
    /// Service.
    pub grpc_service: String,
    /// Method.
    pub grpc_method: String,
    /// Status code name, e.g. `OK`, `Unavailable`.
    pub grpc_code: &'static str,
}

/// Outcome of CNI calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CniLabels {
    /// `ADD`, `DEL`, `CHECK`, `STATUS`, `GC`.
    pub command: String,
    /// CNI error code, `0` for success.
    pub cni_code: String,
}

/// A phase of a CNI call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The command the phase belongs to.
    pub command: String,
    /// The phase: `lock_wait`, `ipam`, `veth`, `addresses`, `routes`, `store_commit`, ...
    pub phase: String,
}

/// Address usage of a range.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RangeLabels {
    /// The range's CIDR.
    pub range: String,
    /// `allocated` or `free`.
    pub state: &'static str,
}

/// Identity of one wire end (bounded by the node's wires).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireLabels {
    /// Topology namespace.
    pub namespace: String,
    /// The link's uid.
    pub link_uid: String,
    /// The local pod.
    pub pod: String,
    /// The interface in the pod.
    pub intf: String,
    /// The peer's node address (empty on the same node).
    pub peer_node: String,
    /// `veth`, `vxlan` or `grpc`.
    pub kind: String,
}

/// [`WireLabels`] plus a direction (`rx`, `tx`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireDirLabels {
    /// The wire.
    #[prometheus(flatten)]
    pub wire: WireLabels,
    /// `rx` (into the pod) or `tx` (out of the pod).
    pub direction: &'static str,
}

/// [`WireLabels`] plus a drop reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireDropLabels {
    /// The wire.
    #[prometheus(flatten)]
    pub wire: WireLabels,
    /// One of [`WIRE_DROP_REASONS`].
    pub reason: &'static str,
}

/// Why a wire end drops frames: its queue to the peer node is full, no stream to the
/// peer node is up, the peer end is down, the pod's interface refused a frame, or the
/// kernel dropped it on the interface (veth and VXLAN ends).
pub const WIRE_DROP_REASONS: [&str; 6] = [
    "queue_full",
    "no_stream",
    "peer_down",
    "pod_busy",
    "kernel_rx",
    "kernel_tx",
];

/// A peer node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The peer's node address.
    pub peer_node: String,
}

/// What the reconcile loop repaired.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    /// `veth`, `link_up`, `address`, `route`, `collected`, `hostports`, `wire`, `fdb`.
    pub kind: &'static str,
}

/// How pod traffic reaches a peer node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeModeLabels {
    /// `direct`, `vxlan`, `mixed`, `none` or `unreachable`.
    pub mode: &'static str,
}

/// A change weft made to the node's pod routing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeChangeLabels {
    /// `route`, `fdb`, `neighbour`, `device`, `address` or `masquerade`.
    pub kind: &'static str,
    /// `add` or `delete`.
    pub op: &'static str,
}

/// A kernel refusal while programming pod routing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeFailureLabels {
    /// `route`, `fdb`, `neighbour`, `device`, `address`, `masquerade` or `lookup`.
    pub kind: &'static str,
}

/// The exemplar attached to latency observations: the trace that was slow.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    /// W3C trace id (32 hex digits).
    pub trace_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
}

type LatencyFamily<L> = Family<L, HistogramWithExemplars<TraceExemplar>>;

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 100 µs .. ~13 s, doubling.
    exponential_buckets(0.0001, 2.0, 18)
}

/// Every metric family weftd exports.
pub struct Metrics {
    /// `grpc_server_started_total`.
    pub grpc_started: Family<GrpcLabels, Counter>,
    /// `grpc_server_handled_total`.
    pub grpc_handled: Family<GrpcCodeLabels, Counter>,
    /// `grpc_server_msg_received_total`.
    pub grpc_msg_received: Family<GrpcLabels, Counter>,
    /// `grpc_server_msg_sent_total`.
    pub grpc_msg_sent: Family<GrpcLabels, Counter>,
    /// `grpc_server_handling_seconds`.
    pub grpc_handling: LatencyFamily<GrpcLabels>,
    /// `weft_cni_requests_total`.
    pub cni_requests: Family<CniLabels, Counter>,
    /// `weft_cni_phase_duration_seconds`.
    pub cni_phase: LatencyFamily<PhaseLabels>,
    /// `weft_ipam_addresses`.
    pub ipam_addresses: Family<RangeLabels, Gauge>,
    /// `weft_pods`.
    pub pods: Gauge,
    /// `weft_hostports`.
    pub hostports: Gauge,
    /// `weft_reconcile_repairs_total`.
    pub reconcile_repairs: Family<RepairLabels, Counter>,
    /// `weft_store_transaction_seconds`.
    pub store_transaction: Histogram,
    /// `weft_wire_frames_total`.
    pub wire_frames: Family<WireDirLabels, Counter>,
    /// `weft_wire_bytes_total`.
    pub wire_bytes: Family<WireDirLabels, Counter>,
    /// `weft_wire_drops_total`.
    pub wire_drops: Family<WireDropLabels, Counter>,
    /// `weft_wire_up`.
    pub wire_up: Family<WireLabels, Gauge>,
    /// `weft_peer_stream_up`.
    pub peer_stream_up: Family<PeerLabels, Gauge>,
    /// `weft_peer_stream_reconnects_total`.
    pub peer_reconnects: Family<PeerLabels, Counter>,
    /// `weft_peer_batch_frames`.
    pub peer_batch_frames: Family<PeerLabels, Histogram>,
    /// `weft_peer_queue_depth`.
    pub peer_queue_depth: Family<PeerLabels, Gauge>,
    /// `weft_node_peers`.
    pub node_peers: Family<NodeModeLabels, Gauge>,
    /// `weft_node_network_changes_total`.
    pub node_changes: Family<NodeChangeLabels, Counter>,
    /// `weft_node_network_failures_total`.
    pub node_failures: Family<NodeFailureLabels, Counter>,
    /// `weft_node_pod_cidr_changes_total`.
    pub node_pod_cidr_changes: Counter,
    /// `weft_node_pod_mtu`.
    pub node_pod_mtu: Gauge,
    registry: Registry,
}

impl Metrics {
    /// Removes every series of a wire end (it was removed: its series go with it).
    pub fn remove_wire(&self, wire: &WireLabels) {
        self.wire_up.remove(wire);
        for direction in ["rx", "tx"] {
            let l = WireDirLabels {
                wire: wire.clone(),
                direction,
            };
            self.wire_frames.remove(&l);
            self.wire_bytes.remove(&l);
        }
        for reason in WIRE_DROP_REASONS {
            self.wire_drops.remove(&WireDropLabels {
                wire: wire.clone(),
                reason,
            });
        }
    }

    /// Creates and registers every family. `version` and `commit` go into
    /// `weft_build_info`.
    pub fn new(version: &str, commit: &str) -> Arc<Self> {
        let mut registry = Registry::default();
        let make_latency = || HistogramWithExemplars::new(latency_buckets());
        let m = Self {
            grpc_started: Family::default(),
            grpc_handled: Family::default(),
            grpc_msg_received: Family::default(),
            grpc_msg_sent: Family::default(),
            grpc_handling: Family::new_with_constructor(make_latency),
            cni_requests: Family::default(),
            cni_phase: Family::new_with_constructor(make_latency),
            ipam_addresses: Family::default(),
            pods: Gauge::default(),
            hostports: Gauge::default(),
            reconcile_repairs: Family::default(),
            store_transaction: Histogram::new(exponential_buckets(0.00001, 2.0, 18)),
            wire_frames: Family::default(),
            wire_bytes: Family::default(),
            wire_drops: Family::default(),
            wire_up: Family::default(),
            peer_stream_up: Family::default(),
            peer_reconnects: Family::default(),
            peer_batch_frames: Family::new_with_constructor(|| Histogram::new(exponential_buckets(1.0, 2.0, 10))),
            peer_queue_depth: Family::default(),
            node_peers: Family::default(),
            node_changes: Family::default(),
            node_failures: Family::default(),
            node_pod_cidr_changes: Counter::default(),
            node_pod_mtu: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "grpc_server_started",
            "RPCs started on the server",
            m.grpc_started.clone(),
        );
        registry.register(
            "grpc_server_handled",
            "RPCs completed on the server, regardless of success or failure",
            m.grpc_handled.clone(),
        );
        registry.register(
            "grpc_server_msg_received",
            "RPC stream messages received on the server",
            m.grpc_msg_received.clone(),
        );
        registry.register(
            "grpc_server_msg_sent",
            "gRPC stream messages sent on the server",
            m.grpc_msg_sent.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "Response latency of RPCs handled by the server, with the trace id as exemplar",
            m.grpc_handling.clone(),
        );
        registry.register(
            "weft_cni_requests",
            "CNI calls handled, by command and CNI code (0 = success)",
            m.cni_requests.clone(),
        );
        registry.register(
            "weft_cni_phase_duration_seconds",
            "Time spent in each phase of a CNI call, with the trace id as exemplar",
            m.cni_phase.clone(),
        );
        registry.register(
            "weft_ipam_addresses",
            "Pod addresses per range, allocated and free",
            m.ipam_addresses.clone(),
        );
        registry.register("weft_pods", "Pod attachments set up on this node", m.pods.clone());
        registry.register(
            "weft_hostports",
            "Host ports held on this node (one per address family)",
            m.hostports.clone(),
        );
        registry.register(
            "weft_reconcile_repairs",
            "Kernel state found drifted from the store and repaired (or attachments collected), by kind",
            m.reconcile_repairs.clone(),
        );
        registry.register(
            "weft_store_transaction_seconds",
            "Time the state store spent on each transaction",
            m.store_transaction.clone(),
        );
        registry.register(
            "weft_wire_frames",
            "Frames carried by a wire end, by direction",
            m.wire_frames.clone(),
        );
        registry.register(
            "weft_wire_bytes",
            "Bytes carried by a wire end, by direction",
            m.wire_bytes.clone(),
        );
        registry.register(
            "weft_wire_drops",
            "Frames a wire end dropped, by reason",
            m.wire_drops.clone(),
        );
        registry.register(
            "weft_wire_up",
            "Whether a wire end is up (1) or waiting for its peer (0)",
            m.wire_up.clone(),
        );
        registry.register(
            "weft_peer_stream_up",
            "Whether the frame stream to a peer node is established",
            m.peer_stream_up.clone(),
        );
        registry.register(
            "weft_peer_stream_reconnects",
            "Times the frame stream to a peer node was re-established",
            m.peer_reconnects.clone(),
        );
        registry.register(
            "weft_peer_batch_frames",
            "Frames per batch sent to a peer node",
            m.peer_batch_frames.clone(),
        );
        registry.register(
            "weft_peer_queue_depth",
            "Frames waiting to be sent to a peer node",
            m.peer_queue_depth.clone(),
        );
        registry.register(
            "weft_node_peers",
            "Peer nodes by how pod traffic reaches them (direct route, VXLAN, none)",
            m.node_peers.clone(),
        );
        registry.register(
            "weft_node_network_changes",
            "Changes made to the node's pod routing (routes, FDB and neighbour entries, the VXLAN device, masquerade sets)",
            m.node_changes.clone(),
        );
        registry.register(
            "weft_node_network_failures",
            "Kernel refusals while programming the node's pod routing",
            m.node_failures.clone(),
        );
        registry.register(
            "weft_node_pod_cidr_changes",
            "Times this node's podCIDRs changed while weftd ran",
            m.node_pod_cidr_changes.clone(),
        );
        registry.register(
            "weft_node_pod_mtu",
            "The MTU pods get when their network config sets none (0 while unknown)",
            m.node_pod_mtu.clone(),
        );
        registry.register(
            "weft_build",
            "The weft build running",
            Info::new(BuildLabels {
                version: version.to_string(),
                commit: commit.to_string(),
            }),
        );
        registry.register_collector(Box::new(ProcessCollector));
        Arc::new(Self { registry, ..m })
    }

    /// The exposition for a scraper that sent `accept`: OpenMetrics 1.0 when asked for,
    /// the Prometheus text format 0.0.4 otherwise. Returns (content type, body).
    pub fn render(&self, accept: &str) -> (&'static str, String) {
        let mut om = String::new();
        if text::encode(&mut om, &self.registry).is_err() {
            om = "# EOF\n".into();
        }
        if accept.contains("application/openmetrics-text") {
            ("application/openmetrics-text; version=1.0.0; charset=utf-8", om)
        } else {
            ("text/plain; version=0.0.4; charset=utf-8", openmetrics_to_classic(&om))
        }
    }
}

/// Rewrites OpenMetrics text as the classic Prometheus text format: counters are
/// declared under their `_total` sample name, info metrics become gauges named
/// `<name>_info`, and `# UNIT`, `# EOF` and exemplars (which the classic format cannot
/// carry) are dropped.
pub fn openmetrics_to_classic(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut pending_help: Option<(&str, &str)> = None;
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "histogram" | "gauge" | "summary" => (name.to_string(), kind),
                _ => (name.to_string(), "untyped"),
            };
            if let Some((_, help)) = pending_help.take() {
                out.push_str(&format!("# HELP {name} {help}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        // A sample; cut off an exemplar (" # {...} value").
        let sample = match line.find(" # {") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(sample);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> GrpcLabels {
        GrpcLabels {
            grpc_type: "unary",
            grpc_service: "weft.cnirpc.v1.CNI".into(),
            grpc_method: "Add".into(),
        }
    }

    #[test]
    fn openmetrics_carries_exemplars_and_classic_does_not() {
        let m = Metrics::new("0.1.0", "abc");
        m.grpc_handling.get_or_create(&labels()).observe(
            0.003,
            Some(TraceExemplar {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            }),
            None,
        );
        m.grpc_started.get_or_create(&labels()).inc();
        let (ct, om) = m.render("application/openmetrics-text; version=1.0.0");
        assert!(ct.starts_with("application/openmetrics-text"));
        assert!(
            om.contains("# {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.003"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"));
        let (ct, classic) = m.render("text/plain");
        assert!(ct.starts_with("text/plain; version=0.0.4"));
        assert!(!classic.contains("trace_id"));
        assert!(!classic.contains("# EOF"));
        assert!(
            classic.contains("# TYPE grpc_server_started_total counter\n"),
            "{classic}"
        );
        assert!(
            classic.contains("grpc_server_started_total{grpc_type=\"unary\""),
            "{classic}"
        );
        assert!(classic.contains("# TYPE weft_build_info gauge\n"), "{classic}");
        assert!(
            classic.contains("weft_build_info{version=\"0.1.0\",commit=\"abc\"} 1"),
            "{classic}"
        );
        assert!(
            classic.contains("# TYPE process_resident_memory_bytes gauge"),
            "{classic}"
        );
    }
}
