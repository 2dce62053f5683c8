//! `--compare flows`, the parts that need no lab: how many conntrack events weftd's
//! flow reader decodes, attributes and aggregates per second on one core, replaying
//! events framed as the kernel frames them (`weft_kernel::conntrack::frame`) through
//! the same decoder, the same tracker and the same attribution (policy's view of a
//! cluster of 1,000 pods in 10 namespaces with 100 NetworkPolicies, each new flow
//! evaluated); and the memory a full ring and an hour of 15 s aggregates take.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde::Serialize;
use weft_flows::attribution::ViewResolver;
use weft_flows::{Config, Tracker};
use weft_kernel::conntrack::{self, CtCounters, CtEntry, CtEventKind, CtTuple, TcpState};
use weft_policy::ClusterView;
use weft_topology::{PolicyNamespace, PolicyObjects, PolicyPod, Strict};

use crate::table::Table;
use crate::util::own_rss_kib;

/// The capacity target of issue 37: events decoded, attributed and aggregated per
/// second on one core.
pub const FLOW_EVENTS_TARGET: f64 = 200_000.0;

/// The memory target: a full ring of 100,000 flows and an hour of aggregates for 1,000
/// pairs, at most this many MiB.
pub const FLOW_MEMORY_TARGET_MIB: f64 = 64.0;

/// How big the replay and the memory fill are.
#[derive(Debug, Clone)]
pub struct FlowsOptions {
    /// Pods of the simulated cluster.
    pub pods: usize,
    /// Flows replayed (three events each: new, FIN, destroy with counters).
    pub flows: usize,
    /// Rounds of the replay (the best is reported beside the median).
    pub rounds: usize,
    /// Flows in the ring for the memory part.
    pub ring: usize,
    /// Workload pairs of the aggregates for the memory part.
    pub pairs: usize,
    /// 15 s buckets of the aggregates (240: an hour).
    pub buckets: usize,
    /// The overhead on a real kernel (two labs), when measured.
    pub overhead: Option<crate::flow_overhead::OverheadOptions>,
}

impl FlowsOptions {
    /// The issue's sizes.
    pub fn issue(rounds: usize) -> Self {
        FlowsOptions {
            pods: 1000,
            flows: 100_000,
            rounds: rounds.max(1),
            ring: 100_000,
            pairs: 1000,
            buckets: 240,
            overhead: None,
        }
    }

    /// Tiny, for the smoke run.
    pub fn smoke() -> Self {
        FlowsOptions {
            pods: 20,
            flows: 200,
            rounds: 1,
            ring: 100,
            pairs: 10,
            buckets: 4,
            overhead: None,
        }
    }
}

/// What one replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct FlowsReport {
    /// The sizes.
    pub pods: usize,
    /// NetworkPolicies in the view.
    pub policies: usize,
    /// Flows per round.
    pub flows: usize,
    /// Events per round.
    pub events: usize,
    /// Events per second of each round.
    pub per_second: Vec<f64>,
    /// Flow records the replay produced per round (every flow ends once).
    pub records: u64,
    /// RSS the tracker added with a full ring and the aggregates (MiB).
    pub memory_mib: f64,
    /// The ring's flows and the aggregates' entries held for it.
    pub ring: usize,
    /// Aggregate entries held (pairs × buckets).
    pub aggregate_entries: u64,
    /// Flows on over off in two labs, when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<crate::flow_overhead::OverheadReport>,
}

fn pod_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, (i / 250) as u8, (i % 250 + 2) as u8))
}

/// 1,000 pods of 10 namespaces (`app=<i % 20>`), each namespace with 10 policies
/// allowing ingress on 80 from two apps.
fn view(pods: usize) -> (ClusterView, usize) {
    let mut o = PolicyObjects {
        synced: true,
        ..PolicyObjects::default()
    };
    let namespaces = 10.min(pods.max(1));
    for n in 0..namespaces {
        o.namespaces.push(Arc::new(PolicyNamespace {
            name: format!("ns{n}"),
            labels: [("kubernetes.io/metadata.name".to_string(), format!("ns{n}"))].into(),
            audit: false,
            workload_flow_metrics: false,
        }));
    }
    for i in 0..pods {
        o.put_pod(Arc::new(PolicyPod {
            namespace: format!("ns{}", i % namespaces),
            name: format!("p{i}"),
            labels: [("app".to_string(), format!("a{}", i % 20))].into(),
            ips: vec![pod_ip(i)],
            ports: vec![],
            node: format!("n{}", i % 3),
            host_network: false,
            workload: format!("Deployment/a{}", i % 20),
        }));
    }
    let mut policies = 0;
    for n in 0..namespaces {
        for k in 0..10 {
            let p = weft_lab::kinds::network_policy(
                &format!("ns{n}"),
                &format!("allow-{k}"),
                serde_json::json!({"podSelector": {"matchLabels": {"app": format!("a{}", (n + k) % 20)}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("a{}", k % 20)}}},
                                               {"podSelector": {"matchLabels": {"app": format!("a{}", (k + 1) % 20)}}}],
                                      "ports": [{"port": 80}]}]}),
            );
            let np: Strict<NetworkPolicy> = serde_json::from_value(p).expect("a policy of ours");
            o.policies.push(Arc::new(np));
            policies += 1;
        }
    }
    (ClusterView::new(&o, "n0", &[], &[]), policies)
}

/// The three events of flow `i`, framed, one datagram each as the kernel sends them.
fn events(i: usize, pods: usize) -> [Vec<u8>; 3] {
    // Sources on node n0 (so the tracker reports every flow), destinations anywhere.
    let src = (i * 3) % pods - (i * 3) % pods % 3;
    let dst = (i * 7 + 1) % pods;
    let original = CtTuple {
        src: pod_ip(src),
        dst: pod_ip(dst),
        protocol: 6,
        src_port: 10_000 + (i % 50_000) as u16,
        dst_port: 80,
        icmp: None,
    };
    let reply = CtTuple {
        src: original.dst,
        dst: original.src,
        src_port: 80,
        dst_port: original.src_port,
        ..original
    };
    let base = CtEntry {
        kind: CtEventKind::New,
        id: i as u32,
        original,
        reply,
        status: 0x8,
        mark: 0,
        zone: None,
        tcp_state: Some(TcpState::SynSent),
        original_counters: None,
        reply_counters: None,
        start_ns: None,
        stop_ns: None,
    };
    let fin = CtEntry {
        kind: CtEventKind::Update,
        status: 0x19e,
        tcp_state: Some(TcpState::TimeWait),
        ..base.clone()
    };
    let destroy = CtEntry {
        kind: CtEventKind::Destroy,
        tcp_state: None,
        original_counters: Some(CtCounters {
            packets: 12,
            bytes: 4_000,
        }),
        reply_counters: Some(CtCounters {
            packets: 10,
            bytes: 20_000,
        }),
        start_ns: Some(1_795_000_000_000_000_000 + i as u64 * 1_000),
        stop_ns: Some(1_795_000_000_000_000_000 + i as u64 * 1_000 + 5_000_000),
        ..base.clone()
    };
    [
        conntrack::frame(&base),
        conntrack::frame(&fin),
        conntrack::frame(&destroy),
    ]
}

/// Replays the events and fills the memory; no kernel, no root.
pub fn run_flows(o: &FlowsOptions) -> Result<FlowsReport, String> {
    let (view, policies) = view(o.pods);
    let datagrams: Vec<[Vec<u8>; 3]> = (0..o.flows).map(|i| events(i, o.pods)).collect();
    let mut per_second = Vec::new();
    let mut records = 0;
    for _ in 0..o.rounds {
        let mut tracker = Tracker::new(Config {
            node: "n0".into(),
            ring: 16_384,
            ..Config::default()
        });
        let resolver = ViewResolver {
            view: Some(&view),
            staged: None,
        };
        let mut batch = Vec::with_capacity(4);
        let now = 1_795_000_000_000i64;
        let start = Instant::now();
        for (i, flow) in datagrams.iter().enumerate() {
            for d in flow {
                batch.clear();
                let bad = conntrack::decode_datagram(d, &mut batch);
                if bad != 0 {
                    return Err(format!("a framed event did not decode (flow {i})"));
                }
                for e in &batch {
                    tracker.apply(e, &resolver, now + i as i64);
                }
            }
            // The node hands what changed to followers after each batch.
            if i % 64 == 0 {
                tracker.take_changes();
            }
        }
        let secs = start.elapsed().as_secs_f64();
        per_second.push((o.flows * 3) as f64 / secs);
        records = tracker.stats().ended;
        if records != o.flows as u64 {
            return Err(format!("{} flows replayed, {records} records", o.flows));
        }
    }
    // Memory: a ring of `ring` ended flows and `pairs` keys in each of `buckets`
    // buckets, in this process, measured as its RSS before and after.
    let before = own_rss_kib();
    let mut tracker = Tracker::new(Config {
        node: "n0".into(),
        ring: o.ring,
        buckets: o.buckets,
        ..Config::default()
    });
    let resolver = ViewResolver {
        view: Some(&view),
        staged: None,
    };
    let mut batch = Vec::new();
    let bucket_ms = 15_000i64;
    let pairs = o.pairs.max(1);
    let fills = o.ring.max(pairs * o.buckets);
    for i in 0..fills {
        // Every pair in every bucket, in time order; a pair is its own destination port.
        let (pair, bucket) = (i % pairs, (i / pairs) % o.buckets);
        let at = bucket as i64 * bucket_ms + 1_795_000_000_000;
        for d in events(pair, o.pods) {
            batch.clear();
            conntrack::decode_datagram(&d, &mut batch);
            for e in &batch {
                let mut e = e.clone();
                e.id = i as u32;
                e.original.src_port = (i % 60_000) as u16;
                e.original.dst_port = 1000 + pair as u16;
                e.reply.src_port = e.original.dst_port;
                e.reply.dst_port = e.original.src_port;
                tracker.apply(&e, &resolver, at);
            }
        }
        tracker.take_changes();
    }
    let stats = tracker.stats();
    let after = own_rss_kib();
    drop(tracker);
    Ok(FlowsReport {
        pods: o.pods,
        policies,
        flows: o.flows,
        events: o.flows * 3,
        per_second,
        records,
        memory_mib: after.saturating_sub(before) as f64 / 1024.0,
        ring: stats.kept as usize,
        aggregate_entries: stats.aggregates,
        overhead: match &o.overhead {
            Some(lab) => Some(crate::flow_overhead::run_flow_overhead(lab)?),
            None => None,
        },
    })
}

impl FlowsReport {
    /// Whether the targets hold: the best round at the capacity target, memory under
    /// its target.
    pub fn met(&self) -> bool {
        crate::median(&self.per_second) >= FLOW_EVENTS_TARGET
            && self.memory_mib <= FLOW_MEMORY_TARGET_MIB
            && self.overhead.as_ref().is_none_or(|o| o.met())
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::from("## Flows: capacity and memory (replay, no kernel)\n\n");
        s.push_str(&format!(
            "{} flows (new, FIN, destroy with counters: {} events) between pods of a {}-pod view with {} NetworkPolicies, \
             each new flow evaluated; one core.\n\n",
            self.flows, self.events, self.pods, self.policies
        ));
        let mut t = Table::new().text("measure").text("value").text("target");
        let rounds: Vec<String> = self.per_second.iter().map(|v| format!("{v:.0}")).collect();
        t.row([
            "events decoded, attributed and aggregated per second".to_string(),
            format!(
                "median {:.0} (rounds: {})",
                crate::median(&self.per_second),
                rounds.join(", ")
            ),
            format!(">= {FLOW_EVENTS_TARGET:.0}"),
        ]);
        t.row([
            format!(
                "RSS of {} flows in the ring and {} aggregate entries",
                self.ring, self.aggregate_entries
            ),
            format!("{:.1} MiB", self.memory_mib),
            format!("<= {FLOW_MEMORY_TARGET_MIB:.0} MiB"),
        ]);
        s.push_str(&t.to_string());
        if let Some(o) = &self.overhead {
            s.push('\n');
            s.push_str(&o.markdown());
        }
        s.push_str(&format!("\ntargets {}\n", if self.met() { "met" } else { "MISSED" }));
        s
    }
}
