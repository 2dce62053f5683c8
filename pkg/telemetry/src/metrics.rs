//! The Prometheus registry weftd exports, the cross-cutting families (gRPC server, CNI
//! calls and phases, reconcile repairs, build info, process), and the exposition:
//! OpenMetrics (with trace-id exemplars) when the scraper asks for it, the classic text
//! format otherwise.
//!
//! Each domain defines its own families and label types in its own crate, as a struct
//! implementing [`Families`], and gets them with [`Metrics::families`], which registers
//! them here on first use.
//!
//! Every label value comes from a bounded set: command, CNI code, phase, gRPC method
//! and code, range (from the node's config). A call's pod, container and netns path
//! never label the call's series: they are in the logs, the traces and `weftctl calls`.
//! Pod names (a container id where the runtime named no pod) label only the series of
//! one of this node's pods (its wires, its traffic), bounded by the pods on the node
//! and gone with the pod.

use std::any::{Any, TypeId};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{EncodeLabelSet, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};

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

/// What a reconcile pass repaired. Shared: the node's reconcile loop, the node network
/// and the wire engine each count their own kinds into `weft_reconcile_repairs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    /// `veth`, `link_up`, `address`, `route`, `neighbour`, `collected`, `hostports`, `wire`, `fdb`,
    /// `node_route`, `node_fdb`, `node_neighbour`, `node_address`, `node_vxlan`,
    /// `masquerade`.
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

/// A domain's metric families: a struct of families (and their label types) defined in
/// the domain's crate, created and registered once per [`Metrics`] through
/// [`Metrics::families`].
pub trait Families: Send + Sync + 'static {
    /// Creates the families and registers each one with [`Metrics::register`] (or
    /// [`Metrics::register_with_unit`]). Called once per registry.
    fn register(metrics: &Metrics) -> Self;
}

/// The registry and the names registered in it (a family registered twice would be
/// exposed twice, which scrapers reject).
struct Registered {
    registry: Registry,
    names: BTreeSet<String>,
}

/// The cross-cutting metric families, the registry every domain registers its own
/// families with, and the exposition.
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
    /// `weft_reconcile_repairs_total`, shared by every domain that repairs drift.
    pub reconcile_repairs: Family<RepairLabels, Counter>,
    registered: Mutex<Registered>,
    /// Each domain's families by type, created on first use.
    domains: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Metrics {
    /// Creates the registry with the cross-cutting families. `version` and `commit` go
    /// into `weft_build_info`.
    pub fn new(version: &str, commit: &str) -> Arc<Self> {
        let make_latency = || HistogramWithExemplars::new(latency_buckets());
        let m = Self {
            grpc_started: Family::default(),
            grpc_handled: Family::default(),
            grpc_msg_received: Family::default(),
            grpc_msg_sent: Family::default(),
            grpc_handling: Family::new_with_constructor(make_latency),
            cni_requests: Family::default(),
            cni_phase: Family::new_with_constructor(make_latency),
            reconcile_repairs: Family::default(),
            registered: Mutex::new(Registered {
                registry: Registry::default(),
                names: BTreeSet::new(),
            }),
            domains: Mutex::new(HashMap::new()),
        };
        m.register(
            "grpc_server_started",
            "RPCs started on the server",
            m.grpc_started.clone(),
        );
        m.register(
            "grpc_server_handled",
            "RPCs completed on the server, regardless of success or failure",
            m.grpc_handled.clone(),
        );
        m.register(
            "grpc_server_msg_received",
            "RPC stream messages received on the server",
            m.grpc_msg_received.clone(),
        );
        m.register(
            "grpc_server_msg_sent",
            "gRPC stream messages sent on the server",
            m.grpc_msg_sent.clone(),
        );
        m.register(
            "grpc_server_handling_seconds",
            "Response latency of RPCs handled by the server, with the trace id as exemplar",
            m.grpc_handling.clone(),
        );
        m.register(
            "weft_cni_requests",
            "CNI calls handled, by command and CNI code (0 = success)",
            m.cni_requests.clone(),
        );
        m.register(
            "weft_cni_phase_duration_seconds",
            "Time spent in each phase of a CNI call, with the trace id as exemplar",
            m.cni_phase.clone(),
        );
        m.register(
            "weft_reconcile_repairs",
            "Kernel state found drifted from the store and repaired (or attachments collected), by kind",
            m.reconcile_repairs.clone(),
        );
        m.register(
            "weft_build",
            "The weft build running",
            Info::new(BuildLabels {
                version: version.to_string(),
                commit: commit.to_string(),
            }),
        );
        m.registered().registry.register_collector(Box::new(ProcessCollector));
        Arc::new(m)
    }

    fn registered(&self) -> MutexGuard<'_, Registered> {
        // The registry stays consistent across a panic elsewhere: every change to it
        // is one call.
        self.registered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a family (or any metric) under `name` (without the `_total` of a
    /// counter, which the encoder adds), with its help text.
    ///
    /// # Panics
    /// When `name` is already registered: it would be exposed twice and scrapers
    /// reject the whole exposition. Domains register through [`Metrics::families`],
    /// which registers each domain once.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        let mut r = self.registered();
        r.claim(name);
        r.registry.register(name, help, metric);
    }

    /// [`Metrics::register`] with a unit (which the name must end with, e.g.
    /// `_seconds` for [`Unit::Seconds`]).
    ///
    /// # Panics
    /// When `name` is already registered.
    pub fn register_with_unit(&self, name: &str, help: &str, unit: Unit, metric: impl Metric) {
        let mut r = self.registered();
        r.claim(name);
        r.registry.register_with_unit(name, help, unit, metric);
    }

    /// Registers a collector that encodes the families `names` itself at each scrape:
    /// for series that exist only while what they measure does (a pod's traffic), which
    /// a [`Family`] would keep exposing after it is gone. `names` are claimed as
    /// [`Metrics::register`] claims one.
    ///
    /// # Panics
    /// When one of `names` is already registered.
    pub fn register_collector(&self, names: &[&str], collector: impl Collector) {
        let mut r = self.registered();
        for name in names {
            r.claim(name);
        }
        r.registry.register_collector(Box::new(collector));
    }

    /// A domain's families: created and registered by the first caller, shared by
    /// every later one (an engine built again on the same registry finds the same
    /// series).
    pub fn families<F: Families>(&self) -> Arc<F> {
        // Held while `F` registers, so two first callers cannot both register it. A
        // domain's `register` must therefore not ask for other domains' families.
        let mut domains = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = domains
            .entry(TypeId::of::<F>())
            .or_insert_with(|| Arc::new(F::register(self)) as Arc<dyn Any + Send + Sync>)
            .clone();
        drop(domains);
        entry
            .downcast::<F>()
            .unwrap_or_else(|_| unreachable!("the entry under F's TypeId holds an F"))
    }

    /// The exposition for a scraper that sent `accept`: OpenMetrics 1.0 when asked for,
    /// the Prometheus text format 0.0.4 otherwise. Returns (content type, body).
    pub fn render(&self, accept: &str) -> (&'static str, String) {
        let mut om = String::new();
        if text::encode(&mut om, &self.registered().registry).is_err() {
            om = "# EOF\n".into();
        }
        if accept.contains("application/openmetrics-text") {
            ("application/openmetrics-text; version=1.0.0; charset=utf-8", om)
        } else {
            ("text/plain; version=0.0.4; charset=utf-8", openmetrics_to_classic(&om))
        }
    }
}

impl Registered {
    fn claim(&mut self, name: &str) {
        assert!(
            self.names.insert(name.to_string()),
            "metric family {name} registered twice"
        );
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
    use prometheus_client::metrics::gauge::Gauge;

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

    /// A domain's families, as a domain crate defines them.
    struct Sample {
        requests: Family<CniLabels, Counter>,
        temperature: Gauge,
    }

    impl Families for Sample {
        fn register(metrics: &Metrics) -> Self {
            let s = Sample {
                requests: Family::default(),
                temperature: Gauge::default(),
            };
            metrics.register("sample_requests", "Requests seen", s.requests.clone());
            metrics.register_with_unit(
                "sample_temperature",
                "How warm it is",
                Unit::Celsius,
                s.temperature.clone(),
            );
            s
        }
    }

    #[test]
    fn a_domain_registers_its_families_once_and_they_are_exposed() {
        let m = Metrics::new("0.1.0", "abc");
        let a = m.families::<Sample>();
        let b = m.families::<Sample>();
        assert!(Arc::ptr_eq(&a, &b));
        a.requests
            .get_or_create(&CniLabels {
                command: "ADD".into(),
                cni_code: "0".into(),
            })
            .inc();
        b.temperature.set(21);
        let (_, om) = m.render("application/openmetrics-text");
        assert_eq!(om.matches("# TYPE sample_requests counter\n").count(), 1, "{om}");
        assert!(om.contains("# HELP sample_requests Requests seen.\n"), "{om}");
        assert!(
            om.contains("sample_requests_total{command=\"ADD\",cni_code=\"0\"} 1\n"),
            "{om}"
        );
        assert!(om.contains("# UNIT sample_temperature_celsius celsius\n"), "{om}");
        assert!(om.contains("sample_temperature_celsius 21\n"), "{om}");
        let (_, classic) = m.render("text/plain");
        assert!(classic.contains("# TYPE sample_requests_total counter\n"), "{classic}");
        assert!(!classic.contains("# UNIT"), "{classic}");
    }

    /// A collector that writes nothing: only its registration is under test.
    #[derive(Debug)]
    struct Nothing;

    impl Collector for Nothing {
        fn encode(&self, _: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
            Ok(())
        }
    }

    /// A collector's families are claimed like any other: one named like a family
    /// already registered is refused.
    #[test]
    #[should_panic(expected = "weft_pods registered twice")]
    fn a_collector_claims_its_names() {
        let m = Metrics::new("0.1.0", "abc");
        m.register("weft_pods", "pods", Counter::<u64>::default());
        m.register_collector(&["weft_other", "weft_pods"], Nothing);
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn a_name_registered_twice_is_refused() {
        let m = Metrics::new("0.1.0", "abc");
        m.register("weft_cni_requests", "again", Counter::<u64>::default());
    }
}
