//! The wires' metric families (`weft_wire_*` per wire end, `weft_peer_*` per peer node)
//! and their label types, registered with telemetry's registry when the engine or the
//! data plane is built. An end's labels are built in one place, [`crate::labels`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use weft_telemetry::metrics::RepairLabels;
use weft_telemetry::{Families, Metrics};

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

/// [`WireLabels`] plus an impairment parameter (`delay`, `jitter`, `loss`, `rate`,
/// `corrupt`, `duplicate`, `reorder`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireParamLabels {
    /// The wire.
    #[prometheus(flatten)]
    pub wire: WireLabels,
    /// The parameter.
    pub param: &'static str,
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

/// What a wire pass looked at.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    /// `pods` (the pods that moved and those linked to them) or `every`.
    pub scope: &'static str,
}

/// A peer node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The peer's node address.
    pub peer_node: String,
}

/// Why the wire port refused a connection (one of [`weft_wiretls::REFUSALS`]), a call
/// (one of [`crate::service::Refusal`]'s reasons; weftd's `Policy` service beside it
/// adds `ambiguous_node`, an address several Node objects have, and `bad_announcement`)
/// or a frame (`other_peer_wire`: it names a wire held for another peer node;
/// `unknown_wire`: no end here has its id; `oversized_batch`: a stream message over the
/// limit, `malformed_batch`: one that does not decode; either ends that stream).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// The reason, as above.
    pub reason: &'static str,
}

/// Whether re-reading the wire TLS files gave usable certificates.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` or `error` (the previous certificates stay in use).
    pub result: &'static str,
}

/// [`WireLabels`] plus what the emulation did to a frame (one of
/// [`weft_link::EmulationCounts::by_outcome`]'s names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireOutcomeLabels {
    /// The wire.
    #[prometheus(flatten)]
    pub wire: WireLabels,
    /// The outcome.
    pub outcome: &'static str,
}

/// A state of a pod's link (`pending`, `up`, `down`, `failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LinkStateLabels {
    /// The state, as the Topology status names it.
    pub state: &'static str,
}

/// What the wires count; get it with `metrics.families::<WireMetrics>()`.
pub struct WireMetrics {
    /// `weft_wire_frames_total`.
    pub frames: Family<WireDirLabels, Counter>,
    /// `weft_wire_bytes_total`.
    pub bytes: Family<WireDirLabels, Counter>,
    /// `weft_wire_drops_total`.
    pub drops: Family<WireDropLabels, Counter>,
    /// `weft_wire_emulation_total`: what weft's own emulation did to an end's frames
    /// (its drops apart from the kernel's).
    pub emulation: Family<WireOutcomeLabels, Counter>,
    /// `weft_wire_up`.
    pub up: Family<WireLabels, Gauge>,
    /// `weft_wire_impairment`: the active setting of each parameter an end applies
    /// (seconds, ratio, bits per second).
    pub impairment: Family<WireParamLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `weft_wire_down_by_intent`: 1 while an operator holds the link down.
    pub down_by_intent: Family<WireLabels, Gauge>,
    /// `weft_links`: the links of this node's pods, by state, as the last pass saw them
    /// (pods waiting for links, links that failed).
    pub links: Family<LinkStateLabels, Gauge>,
    /// `weft_wire_pass_seconds`: how long the wire passes took, by what they looked at.
    pub pass_seconds: Family<PassLabels, Histogram>,
    /// `weft_peer_stream_up`.
    pub peer_stream_up: Family<PeerLabels, Gauge>,
    /// `weft_peer_stream_reconnects_total`.
    pub peer_reconnects: Family<PeerLabels, Counter>,
    /// `weft_peer_batch_frames`.
    pub peer_batch_frames: Family<PeerLabels, Histogram>,
    /// `weft_peer_queue_depth`.
    pub peer_queue_depth: Family<PeerLabels, Gauge>,
    /// `weft_peer_rejected_total`.
    pub rejected: Family<RejectLabels, Counter>,
    /// `weft_wire_insecure`: 1 when the wire port runs without TLS.
    pub insecure: Gauge,
    /// `weft_wire_tls_reloads_total`.
    pub tls_reloads: Family<ReloadLabels, Counter>,
    /// Telemetry's shared `weft_reconcile_repairs_total`, where restored VXLAN FDB
    /// entries are counted (`fdb`).
    pub repairs: Family<RepairLabels, Counter>,
}

impl WireMetrics {
    /// Removes every series of a wire end (it was removed: its series go with it).
    pub fn remove_wire(&self, wire: &WireLabels) {
        self.up.remove(wire);
        self.down_by_intent.remove(wire);
        self.set_impairment(wire, &weft_link::Impairment::default());
        for direction in ["rx", "tx"] {
            let l = WireDirLabels {
                wire: wire.clone(),
                direction,
            };
            self.frames.remove(&l);
            self.bytes.remove(&l);
        }
        for reason in WIRE_DROP_REASONS {
            self.drops.remove(&WireDropLabels {
                wire: wire.clone(),
                reason,
            });
        }
        for (outcome, _) in weft_link::EmulationCounts::default().by_outcome() {
            self.emulation.remove(&WireOutcomeLabels {
                wire: wire.clone(),
                outcome,
            });
        }
    }
}

impl WireMetrics {
    /// Shows `imp` as an end's active impairment: one series per parameter set, none
    /// for those left off.
    pub fn set_impairment(&self, wire: &WireLabels, imp: &weft_link::Impairment) {
        for param in weft_link::impair::PARAMS {
            let l = WireParamLabels {
                wire: wire.clone(),
                param,
            };
            match imp.gauge(param) {
                Some(v) => {
                    self.impairment.get_or_create(&l).set(v);
                }
                None => {
                    self.impairment.remove(&l);
                }
            }
        }
    }
}

impl Families for WireMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = WireMetrics {
            frames: Family::default(),
            bytes: Family::default(),
            drops: Family::default(),
            emulation: Family::default(),
            up: Family::default(),
            impairment: Family::default(),
            down_by_intent: Family::default(),
            links: Family::default(),
            // 100 µs .. about 26 s, doubling.
            pass_seconds: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 19))),
            peer_stream_up: Family::default(),
            peer_reconnects: Family::default(),
            // 1 .. 512 frames, doubling.
            peer_batch_frames: Family::new_with_constructor(|| Histogram::new(exponential_buckets(1.0, 2.0, 10))),
            peer_queue_depth: Family::default(),
            rejected: Family::default(),
            insecure: Gauge::default(),
            tls_reloads: Family::default(),
            repairs: metrics.reconcile_repairs.clone(),
        };
        metrics.register(
            "weft_wire_frames",
            "Frames carried by a wire end, by direction",
            m.frames.clone(),
        );
        metrics.register(
            "weft_wire_bytes",
            "Bytes carried by a wire end, by direction",
            m.bytes.clone(),
        );
        metrics.register(
            "weft_wire_drops",
            "Frames a wire end dropped, by reason",
            m.drops.clone(),
        );
        metrics.register(
            "weft_wire_emulation",
            "Frames weft's own link emulation acted on, by outcome: lost and overflow are the emulation's drops, apart from weft_wire_drops_total",
            m.emulation.clone(),
        );
        metrics.register(
            "weft_wire_pass_seconds",
            "How long a wire pass took, by scope: pods (the pods that moved and the pods linked to them) or every (every local pod, its kernel objects read back)",
            m.pass_seconds.clone(),
        );
        metrics.register(
            "weft_wire_up",
            "Whether a wire end is up (1) or waiting for its peer (0)",
            m.up.clone(),
        );
        metrics.register(
            "weft_wire_impairment",
            "Active impairment of what a wire end sends, by parameter: delay and jitter in seconds, loss, corrupt, duplicate and reorder as a ratio, rate in bits per second",
            m.impairment.clone(),
        );
        metrics.register(
            "weft_wire_down_by_intent",
            "Whether an operator holds the wire's link down (weftctl link down): 1, or not: 0",
            m.down_by_intent.clone(),
        );
        metrics.register(
            "weft_links",
            "Links of this node's pods by state: pending, up, down (by intent) or failed",
            m.links.clone(),
        );
        metrics.register(
            "weft_peer_stream_up",
            "Whether the frame stream to a peer node is established",
            m.peer_stream_up.clone(),
        );
        metrics.register(
            "weft_peer_stream_reconnects",
            "Times the frame stream to a peer node was re-established",
            m.peer_reconnects.clone(),
        );
        metrics.register(
            "weft_peer_batch_frames",
            "Frames per batch sent to a peer node",
            m.peer_batch_frames.clone(),
        );
        metrics.register(
            "weft_peer_queue_depth",
            "Frames waiting to be sent to a peer node",
            m.peer_queue_depth.clone(),
        );
        metrics.register(
            "weft_peer_rejected",
            "Calls and frames on the wire port refused, by reason",
            m.rejected.clone(),
        );
        metrics.register(
            "weft_wire_insecure",
            "Whether the wire port runs in plaintext (--wire-insecure): 1, or with mutual TLS: 0",
            m.insecure.clone(),
        );
        metrics.register(
            "weft_wire_tls_reloads",
            "Times the wire TLS files changed and were read again, by result",
            m.tls_reloads.clone(),
        );
        m
    }
}

/// The TLS layer reports its refusals and reloads into these families.
impl weft_wiretls::TlsObserver for WireMetrics {
    fn refused(&self, reason: &'static str) {
        self.rejected.get_or_create(&RejectLabels { reason }).inc();
    }

    fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.tls_reloads.get_or_create(&ReloadLabels { result }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> WireLabels {
        WireLabels {
            namespace: "lab".into(),
            link_uid: "4".into(),
            pod: "r1".into(),
            intf: "eth1".into(),
            peer_node: "192.0.2.2".into(),
            kind: "grpc".into(),
        }
    }

    #[test]
    fn a_removed_wire_leaves_no_series() {
        let metrics = Metrics::new("test", "test");
        let m = metrics.families::<WireMetrics>();
        let other = WireLabels {
            pod: "r2".into(),
            ..wire()
        };
        for w in [wire(), other.clone()] {
            m.up.get_or_create(&w).set(1);
            m.frames
                .get_or_create(&WireDirLabels {
                    wire: w.clone(),
                    direction: "rx",
                })
                .inc();
            m.drops
                .get_or_create(&WireDropLabels {
                    wire: w,
                    reason: "pod_busy",
                })
                .inc();
        }
        m.remove_wire(&wire());
        let (_, text) = metrics.render("text/plain");
        assert!(!text.contains("pod=\"r1\""), "{text}");
        assert_eq!(text.matches("pod=\"r2\"").count(), 3, "{text}");
        assert!(text.contains("# TYPE weft_wire_drops_total counter\n"), "{text}");
    }
}
