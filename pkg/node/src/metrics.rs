//! The node's own metric families: the gauges refreshed from the store before each
//! scrape (addresses per range, pods, host ports), the store's transaction time, the
//! DELs replayed from the spool, the rebuilds of a lost state database and whether the
//! store can write; each pod's traffic ([`pod_traffic`]) and the node's conntrack table
//! ([`conntrack`]), which collectors encode at scrape time.
//! Reconcile repairs go into telemetry's shared `weft_reconcile_repairs_total`.

pub mod conntrack;
pub mod pod_traffic;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use weft_telemetry::{Families, Metrics};

/// Address usage of a range.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RangeLabels {
    /// The range's CIDR.
    pub range: String,
    /// `allocated` or `free`.
    pub state: &'static str,
}

/// The node's families; get them with `metrics.families::<NodeMetrics>()`.
pub struct NodeMetrics {
    /// `weft_ipam_addresses`: a float gauge, since an IPv6 /64 holds more addresses
    /// than an i64 counts (`weftctl status` shows the same numbers, exactly).
    pub ipam_addresses: Family<RangeLabels, Gauge<f64, AtomicU64>>,
    /// `weft_pods`.
    pub pods: Gauge,
    /// `weft_hostports`.
    pub hostports: Gauge,
    /// `weft_store_transaction_seconds`.
    pub store_transaction: Histogram,
    /// `weft_del_spool_replayed_total`.
    pub del_spool_replayed: Counter,
    /// `weft_store_rebuilds_total`.
    pub store_rebuilds: Counter,
    /// `weft_store_rebuilt_attachments_total`.
    pub store_rebuilt_attachments: Counter,
    /// `weft_store_writable`: 1 or 0, set from [`weft_store::Store::writable`] before
    /// each scrape.
    pub store_writable: Gauge,
    /// `weft_pod_network_*`: the sample of every pod interface's counters, replaced
    /// before each scrape.
    pub pod_traffic: Arc<pod_traffic::PodTraffic>,
}

impl Families for NodeMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = NodeMetrics {
            ipam_addresses: Family::default(),
            pods: Gauge::default(),
            hostports: Gauge::default(),
            // 10 µs .. ~1.3 s, doubling.
            store_transaction: Histogram::new(exponential_buckets(0.00001, 2.0, 18)),
            del_spool_replayed: Counter::default(),
            store_rebuilds: Counter::default(),
            store_rebuilt_attachments: Counter::default(),
            store_writable: Gauge::default(),
            pod_traffic: Arc::default(),
        };
        metrics.register(
            "weft_ipam_addresses",
            "Pod addresses per range, allocated and free",
            m.ipam_addresses.clone(),
        );
        metrics.register("weft_pods", "Pod attachments set up on this node", m.pods.clone());
        metrics.register(
            "weft_hostports",
            "Host ports held on this node (one per address family)",
            m.hostports.clone(),
        );
        metrics.register(
            "weft_store_transaction_seconds",
            "Time the state store spent on each transaction",
            m.store_transaction.clone(),
        );
        metrics.register(
            "weft_store_rebuilds",
            "Starts that found the state database damaged or missing and rebuilt it from the kernel",
            m.store_rebuilds.clone(),
        );
        metrics.register(
            "weft_store_rebuilt_attachments",
            "Pod attachments rebuilt from the kernel into a new state database",
            m.store_rebuilt_attachments.clone(),
        );
        metrics.register(
            "weft_store_writable",
            "1 while the state store can write, 0 while it cannot (disk full, I/O error, read-only or damaged file)",
            m.store_writable.clone(),
        );
        metrics.register(
            "weft_del_spool_replayed",
            "DELs the plugin spooled while weftd was down, replayed by weftd",
            m.del_spool_replayed.clone(),
        );
        metrics.register_collector(&pod_traffic::family_names(), m.pod_traffic.clone());
        metrics.register_collector(&conntrack::family_names(), conntrack::ConntrackCollector::default());
        m
    }
}
