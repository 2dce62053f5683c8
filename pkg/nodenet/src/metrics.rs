//! The node network's metric families (`weft_node_*`) and their label types, registered
//! with telemetry's registry when the engine is built.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use weft_telemetry::metrics::RepairLabels;
use weft_telemetry::{Families, Metrics};

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

/// What the node network counts: its peers, changes and failures, podCIDR changes and
/// the pod MTU; get it with `metrics.families::<NodeNetMetrics>()`.
pub struct NodeNetMetrics {
    /// `weft_node_peers`.
    pub peers: Family<NodeModeLabels, Gauge>,
    /// `weft_node_network_changes_total`.
    pub changes: Family<NodeChangeLabels, Counter>,
    /// `weft_node_network_failures_total`.
    pub failures: Family<NodeFailureLabels, Counter>,
    /// `weft_node_pod_cidr_changes_total`.
    pub pod_cidr_changes: Counter,
    /// `weft_node_pod_mtu`.
    pub pod_mtu: Gauge,
    /// `weft_node_network_lookups_total`.
    pub lookups: Counter,
    /// Telemetry's shared `weft_reconcile_repairs_total`, where drift the node network
    /// repaired is counted (`node_route`, `node_fdb`, ..., `masquerade`).
    pub repairs: Family<RepairLabels, Counter>,
}

impl Families for NodeNetMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = NodeNetMetrics {
            peers: Family::default(),
            changes: Family::default(),
            failures: Family::default(),
            pod_cidr_changes: Counter::default(),
            pod_mtu: Gauge::default(),
            lookups: Counter::default(),
            repairs: metrics.reconcile_repairs.clone(),
        };
        metrics.register(
            "weft_node_peers",
            "Peer nodes by how pod traffic reaches them (direct route, VXLAN, none)",
            m.peers.clone(),
        );
        metrics.register(
            "weft_node_network_changes",
            "Changes made to the node's pod routing (routes, FDB and neighbour entries, the VXLAN device, masquerade sets)",
            m.changes.clone(),
        );
        metrics.register(
            "weft_node_network_failures",
            "Kernel refusals while programming the node's pod routing",
            m.failures.clone(),
        );
        metrics.register(
            "weft_node_pod_cidr_changes",
            "Times this node's podCIDRs changed while weftd ran",
            m.pod_cidr_changes.clone(),
        );
        metrics.register(
            "weft_node_network_lookups",
            "Route lookups of peer addresses (whether each is on-link), asked only for addresses not known yet and again at each resync",
            m.lookups.clone(),
        );
        metrics.register(
            "weft_node_pod_mtu",
            "The MTU pods get when their network config sets none (0 while unknown)",
            m.pod_mtu.clone(),
        );
        m
    }
}
