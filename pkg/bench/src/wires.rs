//! Wire throughput per link kind, weft's wires beside plain kernel links of the same
//! kind in the same run: TCP (iperf3, one stream) and a 64-byte UDP flood (frames per
//! second received at the far end).
//!
//! weft's wires are built by a two-node lab (`weft_lab::Lab`) from a file this run
//! writes: a veth wire between two pods of node 1, and a VXLAN and a gRPC wire between
//! pods of node 1 and node 2. That lab's wire port is plaintext (`--wire-insecure`), so
//! the gRPC row means what it meant before the port had TLS. A second two-node lab,
//! up beside the first for the whole run, carries one gRPC wire with the default mutual
//! TLS: the cost of mTLS is its row over the plaintext one. The references live in
//! namespaces of their own: a kernel veth pair, and a kernel VXLAN tunnel whose sockets
//! sit in the first lab's node namespaces (as weft's VXLAN ends' do), so it crosses the
//! same routed underlay. Rounds go through the six wires in alternating order; the two
//! gRPC wires are next to each other, each first in every other round, so that drift
//! hits both alike.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;
use weft_harness::NamedNetns;

use crate::TrafficOptions;
use crate::exec::met;
use crate::table::Table;
use crate::traffic::Traffic;
use crate::udp::{PAYLOAD, flood};
use crate::util::{End, LabGuard, ip, iperf_tcp, metric_sum, metrics_in, topology, wait_reachable};

/// gRPC wire TCP throughput over the kernel VXLAN's, at least.
pub const GRPC_TCP_TARGET_RATIO: f64 = 0.5;
/// gRPC wire 64-byte frames per second received, at least.
pub const GRPC_FPS_TARGET: f64 = 100_000.0;
/// gRPC wire TCP throughput with mTLS over the plaintext gRPC wire's, at least.
pub const GRPC_MTLS_TCP_TARGET_RATIO: f64 = 0.8;
/// The reference VXLAN's UDP port (weft's ends use 4789 in the same node namespaces).
const REF_VXLAN_PORT: &str = "4799";

/// A wire measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Wire {
    /// weft's veth wire, two pods on one node.
    WeftVeth,
    /// weft's VXLAN wire between nodes.
    WeftVxlan,
    /// weft's gRPC wire between nodes.
    WeftGrpc,
    /// A kernel veth pair between two namespaces.
    KernelVeth,
    /// A kernel VXLAN tunnel over the lab's underlay.
    KernelVxlan,
    /// weft's gRPC wire between nodes whose wire port runs mutual TLS (the default);
    /// [`Wire::WeftGrpc`] is the same wire in plaintext.
    WeftGrpcMtls,
}

const WIRES: [Wire; 6] = [
    Wire::WeftVeth,
    Wire::KernelVeth,
    Wire::WeftVxlan,
    Wire::KernelVxlan,
    Wire::WeftGrpc,
    Wire::WeftGrpcMtls,
];

impl Wire {
    fn label(self) -> &'static str {
        match self {
            Wire::WeftVeth => "weft veth",
            Wire::WeftVxlan => "weft VXLAN",
            Wire::WeftGrpc => "weft gRPC",
            Wire::KernelVeth => "kernel veth",
            Wire::KernelVxlan => "kernel VXLAN",
            Wire::WeftGrpcMtls => "weft gRPC mTLS",
        }
    }

    /// The /30 each wire's ends are numbered from (10.251.0.<4i+1>, <4i+2>).
    fn addresses(self) -> (Ipv4Addr, Ipv4Addr) {
        let i = self as u8;
        (
            Ipv4Addr::new(10, 251, 0, 4 * i + 1),
            Ipv4Addr::new(10, 251, 0, 4 * i + 2),
        )
    }
}

/// One wire's results.
#[derive(Debug, Clone, Serialize)]
pub struct WireResult {
    /// Which wire.
    pub wire: Wire,
    /// TCP and UDP over the passes.
    #[serde(flatten)]
    pub traffic: Traffic,
}

/// A ratio between two wires' medians.
#[derive(Debug, Clone, Serialize)]
pub struct WireRatio {
    /// The wire measured.
    pub a: Wire,
    /// The wire it is set beside.
    pub b: Wire,
    /// TCP a / b.
    pub tcp: f64,
    /// 64-byte frames/s a / b.
    pub fps: f64,
}

/// The wire benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct WiresReport {
    /// Rounds.
    pub rounds: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// Seconds per UDP flood.
    pub udp_seconds: f64,
    /// UDP payload bytes.
    pub udp_payload: usize,
    /// Every wire.
    pub wires: Vec<WireResult>,
    /// weft's wires over the kernel's of the same kind, gRPC over kernel VXLAN, and
    /// gRPC with mTLS over gRPC in plaintext.
    pub ratios: Vec<WireRatio>,
    /// The gRPC TCP target (ratio to kernel VXLAN).
    pub grpc_tcp_target_ratio: f64,
    /// The gRPC 64-byte frames/s target.
    pub grpc_fps_target: f64,
    /// The gRPC mTLS TCP target (ratio to plaintext gRPC).
    pub grpc_mtls_tcp_target_ratio: f64,
    /// Frames the plaintext gRPC wire's ends dropped during the run, by reason, both
    /// nodes.
    pub grpc_drops: BTreeMap<String, f64>,
    /// Mean frames per batch on the plaintext gRPC streams (both directions).
    pub grpc_mean_batch_frames: f64,
    /// Frames the mTLS gRPC wire's ends dropped during the run, by reason, both nodes.
    pub grpc_mtls_drops: BTreeMap<String, f64>,
    /// Mean frames per batch on the mTLS gRPC streams (both directions).
    pub grpc_mtls_mean_batch_frames: f64,
    /// Connections the mTLS lab's wire ports refused during the run, both nodes. Short
    /// runs count one as the nodes start (the stream then connects), so this is
    /// reported, not held to zero.
    pub grpc_mtls_rejected: f64,
}

/// Where a wire's traffic goes: from the first namespace to the address in the second.
struct Path {
    client: String,
    server: String,
    dst: Ipv4Addr,
}

/// Each weft wire of a lab: the wire, its two pods (the first on n1) and its kind.
type LabWire = (Wire, &'static str, &'static str, Option<&'static str>);

/// The plaintext lab: every weft wire but the mTLS one.
const PLAIN_LAB: [LabWire; 3] = [
    (Wire::WeftVeth, "va", "vb", None),
    (Wire::WeftVxlan, "xa", "xb", Some("vxlan")),
    (Wire::WeftGrpc, "ga", "gb", Some("grpc")),
];

/// The mTLS lab: only the gRPC wire, which is all that TLS changes.
const MTLS_LAB: [LabWire; 1] = [(Wire::WeftGrpcMtls, "ga", "gb", Some("grpc"))];

/// A lab file for `wires`, with the wire port protected as `security` says (the lab
/// file's `wire_security`: `insecure` or `mtls`).
fn lab_spec(name: &str, wires: &[LabWire], security: &str) -> serde_json::Value {
    let mut pods = Vec::new();
    let mut topologies = Vec::new();
    for &(wire, a, b, kind) in wires {
        let b_node = if kind.is_some() { "n2" } else { "n1" };
        pods.push(serde_json::json!({"name": a, "node": "n1"}));
        pods.push(serde_json::json!({"name": b, "node": b_node}));
        let (ia, ib) = wire.addresses();
        let (ia, ib) = (ia.to_string(), ib.to_string());
        let uid = wire as u64 + 1;
        topologies.push(topology(
            a,
            vec![
                End {
                    uid,
                    peer_pod: b,
                    local: ("e1", &ia),
                    peer: ("e1", &ib),
                    kind,
                }
                .json(),
            ],
        ));
        topologies.push(topology(
            b,
            vec![
                End {
                    uid,
                    peer_pod: a,
                    local: ("e1", &ib),
                    peer: ("e1", &ia),
                    kind,
                }
                .json(),
            ],
        ));
    }
    serde_json::json!({
        "name": name,
        "nodes": ["n1", "n2"],
        "pods": pods,
        "topologies": topologies,
        "wire_security": security,
    })
}

/// The kernel references: namespaces that go away on drop, and with them the links.
struct References {
    _veth: (NamedNetns, NamedNetns),
    _vxlan: (NamedNetns, NamedNetns),
}

impl References {
    fn build(name: &str, lab: &weft_lab::Lab) -> Result<Self, String> {
        let err = |e: weft_harness::HarnessError| e.to_string();
        let veth = (
            NamedNetns::create(&format!("{name}-kv1")).map_err(err)?,
            NamedNetns::create(&format!("{name}-kv2")).map_err(err)?,
        );
        let vxlan = (
            NamedNetns::create(&format!("{name}-kx1")).map_err(err)?,
            NamedNetns::create(&format!("{name}-kx2")).map_err(err)?,
        );
        let refs = Self {
            _veth: veth,
            _vxlan: vxlan,
        };
        let (kv1, kv2, kx1, kx2) = (
            format!("{name}-kv1"),
            format!("{name}-kv2"),
            format!("{name}-kx1"),
            format!("{name}-kx2"),
        );
        ip(&[
            "-n", &kv1, "link", "add", "e1", "type", "veth", "peer", "name", "e1", "netns", &kv2,
        ])?;
        let u1 = lab.address_of("n1").ok_or("no address for n1")?;
        let u2 = lab.address_of("n2").ok_or("no address for n2")?;
        // Created from the node's namespace into the reference's: the device lives
        // there, its UDP socket on the node, as with weft's VXLAN ends.
        for (node, ns, local, remote) in [("n1", &kx1, &u1, &u2), ("n2", &kx2, &u2, &u1)] {
            ip(&[
                "-n",
                &lab.node_ns(node),
                "link",
                "add",
                "e1",
                "netns",
                ns,
                "mtu",
                "1450",
                "type",
                "vxlan",
                "id",
                "4242",
                "local",
                local,
                "remote",
                remote,
                "dstport",
                REF_VXLAN_PORT,
            ])?;
        }
        for (wire, a, b) in [(Wire::KernelVeth, &kv1, &kv2), (Wire::KernelVxlan, &kx1, &kx2)] {
            let (ia, ib) = wire.addresses();
            for (ns, addr) in [(a, ia), (b, ib)] {
                ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", "e1"])?;
                ip(&["-n", ns, "link", "set", "e1", "up"])?;
            }
        }
        Ok(refs)
    }
}

/// The two labs of a run: plaintext wire ports (with the references beside them) and
/// mTLS.
struct Labs<'a> {
    plain: &'a weft_lab::Lab,
    mtls: &'a weft_lab::Lab,
}

fn path(name: &str, labs: &Labs<'_>, wire: Wire) -> Path {
    let (client, server) = match wire {
        Wire::WeftVeth => (labs.plain.pod_ns("va"), labs.plain.pod_ns("vb")),
        Wire::WeftVxlan => (labs.plain.pod_ns("xa"), labs.plain.pod_ns("xb")),
        Wire::WeftGrpc => (labs.plain.pod_ns("ga"), labs.plain.pod_ns("gb")),
        Wire::WeftGrpcMtls => (labs.mtls.pod_ns("ga"), labs.mtls.pod_ns("gb")),
        Wire::KernelVeth => (format!("{name}-kv1"), format!("{name}-kv2")),
        Wire::KernelVxlan => (format!("{name}-kx1"), format!("{name}-kx2")),
    };
    Path {
        client,
        server,
        dst: wire.addresses().1,
    }
}

/// One iperf3 TCP run: (Gbit/s at the receiver, retransmissions).
fn tcp(p: &Path, seconds: u64) -> Result<(f64, u64), String> {
    iperf_tcp(&p.client, &p.server, p.dst, seconds).map(|t| (t.gbps, t.retransmits))
}

/// What a lab's gRPC wire ends counted over the run, both nodes.
struct GrpcCounters {
    /// Frames dropped, by reason.
    drops: BTreeMap<String, f64>,
    /// Mean frames per batch.
    mean_batch_frames: f64,
    /// Connections refused on the wire port (`weft_peer_rejected_total`).
    rejected: f64,
}

/// The gRPC wire ends' drops by reason, the mean batch size and the refused
/// connections, from both nodes.
fn grpc_counters(lab: &weft_lab::Lab) -> GrpcCounters {
    let mut drops = BTreeMap::new();
    let (mut sum, mut count, mut rejected) = (0.0, 0.0, 0.0);
    for node in ["n1", "n2"] {
        let Ok(page) = metrics_in(&lab.node_ns(node)) else {
            continue;
        };
        rejected += metric_sum(&page, "weft_peer_rejected_total", &[]) + metric_sum(&page, "weft_peer_rejected", &[]);
        for reason in ["queue_full", "no_stream", "peer_down", "pod_busy"] {
            let r = format!("reason=\"{reason}\"");
            let n = metric_sum(&page, "weft_wire_drops_total", &["kind=\"grpc\"", &r])
                + metric_sum(&page, "weft_wire_drops", &["kind=\"grpc\"", &r]);
            *drops.entry(reason.to_string()).or_insert(0.0) += n;
        }
        sum += metric_sum(&page, "weft_peer_batch_frames_sum", &[]);
        count += metric_sum(&page, "weft_peer_batch_frames_count", &[]);
    }
    GrpcCounters {
        drops,
        mean_batch_frames: if count > 0.0 { sum / count } else { 0.0 },
        rejected,
    }
}

/// Fails unless both nodes of `lab` say their wire port runs as asked
/// (`weft_wire_insecure` 1 for plaintext, 0 for mTLS): a row labelled mTLS must not
/// have been measured in plaintext, nor the other way round.
fn check_security(lab: &weft_lab::Lab, insecure: bool) -> Result<(), String> {
    let want = if insecure { 1.0 } else { 0.0 };
    for node in ["n1", "n2"] {
        let ns = lab.node_ns(node);
        let page = metrics_in(&ns)?;
        if !page.lines().any(|l| l.starts_with("weft_wire_insecure ")) {
            return Err(format!("{ns}: weftd reports no weft_wire_insecure"));
        }
        let got = metric_sum(&page, "weft_wire_insecure", &[]);
        if got != want {
            return Err(format!("{ns}: weft_wire_insecure is {got}, this lab wants {want}"));
        }
    }
    Ok(())
}

/// Fails unless every pair of the lab's pods passes traffic and each `wires` pod's
/// `e1` is carried by the kind it was given.
fn check_lab(what: &str, lab: &weft_lab::Lab, wires: &[LabWire]) -> Result<(), String> {
    let checks = lab.check(Duration::from_secs(20));
    let down: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{} -> {}", c.from, c.to))
        .collect();
    if !down.is_empty() {
        return Err(format!("{what}: weft wires not passing traffic: {}", down.join(", ")));
    }
    for &(_, pod, _, kind) in wires {
        let want = kind.unwrap_or("veth");
        let from = format!("{pod}:e1");
        if let Some(c) = checks.iter().find(|c| c.from == from)
            && c.kind != want
        {
            return Err(format!("{what}: {from} is carried by {}, not {want}", c.kind));
        }
    }
    Ok(())
}

/// Runs the wire benchmark.
pub fn run_wires(opts: &TrafficOptions) -> Result<WiresReport, String> {
    for (what, p) in [("weft", &opts.weft), ("weftd", &opts.weftd)] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    if std::process::Command::new("iperf3").arg("--version").output().is_err() {
        return Err("iperf3 is not installed (test/install-deps.sh installs it)".into());
    }
    let name = format!("wb{}w", std::process::id());
    let mtls_name = format!("wb{}m", std::process::id());
    let dir = opts.work_dir.join(&name);
    let mtls_dir = opts.work_dir.join(&mtls_name);
    let lab = LabGuard::up(&dir, &lab_spec(&name, &PLAIN_LAB, "insecure"), &opts.weftd, &opts.weft)?;
    let mtls_lab = LabGuard::up(
        &mtls_dir,
        &lab_spec(&mtls_name, &MTLS_LAB, "mtls"),
        &opts.weftd,
        &opts.weft,
    )?;
    let refs = References::build(&name, &lab.lab)?;
    check_lab("plaintext lab", &lab.lab, &PLAIN_LAB)?;
    check_lab("mTLS lab", &mtls_lab.lab, &MTLS_LAB)?;
    check_security(&lab.lab, true)?;
    check_security(&mtls_lab.lab, false)?;
    let labs = Labs {
        plain: &lab.lab,
        mtls: &mtls_lab.lab,
    };
    for wire in [Wire::KernelVeth, Wire::KernelVxlan] {
        let p = path(&name, &labs, wire);
        if !wait_reachable(&p.client, &p.dst.to_string(), Duration::from_secs(10)) {
            return Err(format!("{} does not pass traffic", wire.label()));
        }
    }
    let mut results: BTreeMap<Wire, WireResult> = WIRES
        .iter()
        .map(|&w| {
            (
                w,
                WireResult {
                    wire: w,
                    traffic: Traffic::default(),
                },
            )
        })
        .collect();
    for round in 0..opts.rounds {
        let mut order = WIRES.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for wire in order {
            let p = path(&name, &labs, wire);
            let (gbps, retransmits) = tcp(&p, opts.tcp_seconds).map_err(|e| format!("{}: {e}", wire.label()))?;
            let f =
                flood(&p.client, &p.server, p.dst, opts.udp_seconds).map_err(|e| format!("{}: {e}", wire.label()))?;
            let r = results.get_mut(&wire).expect("every wire");
            r.traffic.push(gbps, retransmits, f);
        }
    }
    let plain = grpc_counters(&lab.lab);
    let mtls = grpc_counters(&mtls_lab.lab);
    drop(refs);
    drop(lab);
    drop(mtls_lab);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&mtls_dir);
    for r in results.values_mut() {
        r.traffic.settle();
    }
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let ratio = |a: Wire, b: Wire| WireRatio {
        a,
        b,
        tcp: div(results[&a].traffic.tcp_gbps_median, results[&b].traffic.tcp_gbps_median),
        fps: div(results[&a].traffic.udp_fps_median, results[&b].traffic.udp_fps_median),
    };
    let ratios = vec![
        ratio(Wire::WeftVeth, Wire::KernelVeth),
        ratio(Wire::WeftVxlan, Wire::KernelVxlan),
        ratio(Wire::WeftGrpc, Wire::KernelVxlan),
        ratio(Wire::WeftGrpcMtls, Wire::WeftGrpc),
    ];
    Ok(WiresReport {
        rounds: opts.rounds,
        tcp_seconds: opts.tcp_seconds,
        udp_seconds: opts.udp_seconds,
        udp_payload: PAYLOAD,
        wires: WIRES.iter().map(|w| results[w].clone()).collect(),
        ratios,
        grpc_tcp_target_ratio: GRPC_TCP_TARGET_RATIO,
        grpc_fps_target: GRPC_FPS_TARGET,
        grpc_mtls_tcp_target_ratio: GRPC_MTLS_TCP_TARGET_RATIO,
        grpc_drops: plain.drops,
        grpc_mean_batch_frames: plain.mean_batch_frames,
        grpc_mtls_drops: mtls.drops,
        grpc_mtls_mean_batch_frames: mtls.mean_batch_frames,
        grpc_mtls_rejected: mtls.rejected,
    })
}

impl WiresReport {
    /// The wire's results.
    pub fn wire(&self, w: Wire) -> Option<&WireResult> {
        self.wires.iter().find(|r| r.wire == w)
    }

    /// The report as markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Wire throughput, medians of {} round(s) in alternating order: iperf3 TCP one stream {} s, UDP flood of {}-byte datagrams {} s (sendmmsg/recvmmsg, frames/s received at the far end)\n\n",
            self.rounds, self.tcp_seconds, self.udp_payload, self.udp_seconds
        );
        let mut t = Table::new()
            .text("wire")
            .num("TCP (Gbit/s)")
            .num("TCP retransmits (median)")
            .num("64-byte frames/s received")
            .num("frames/s sent")
            .num("received / sent");
        for r in &self.wires {
            let retr = r.traffic.retransmits_median();
            let share = if r.traffic.udp_sent_fps_median > 0.0 {
                r.traffic.udp_fps_median / r.traffic.udp_sent_fps_median
            } else {
                0.0
            };
            t.row([
                r.wire.label().to_string(),
                format!("{:.2}", r.traffic.tcp_gbps_median),
                format!("{retr:.0}"),
                format!("{:.0}", r.traffic.udp_fps_median),
                format!("{:.0}", r.traffic.udp_sent_fps_median),
                format!("{share:.2}"),
            ]);
        }
        let mut ratios = Table::new()
            .text("ratio")
            .num(format!("TCP, 1 stream {} s", self.tcp_seconds))
            .num(format!("{}-byte frames/s", self.udp_payload));
        for q in &self.ratios {
            ratios.row([
                format!("{} / {}", q.a.label(), q.b.label()),
                format!("{:.2}", q.tcp),
                format!("{:.2}", q.fps),
            ]);
        }
        out.push_str(&format!("{t}\n{ratios}"));
        if let (Some(g), Some(q)) = (
            self.wire(Wire::WeftGrpc),
            self.ratios.iter().find(|q| q.a == Wire::WeftGrpc),
        ) {
            out.push_str(&format!(
                "\ntargets: gRPC / kernel VXLAN TCP >= {:.1}: {:.2}, {}; gRPC 64-byte frames/s >= {:.0}: {:.0} ({:.2}x), {}\n",
                self.grpc_tcp_target_ratio,
                q.tcp,
                met(q.tcp >= self.grpc_tcp_target_ratio),
                self.grpc_fps_target,
                g.traffic.udp_fps_median,
                g.traffic.udp_fps_median / self.grpc_fps_target,
                met(g.traffic.udp_fps_median >= self.grpc_fps_target)
            ));
        }
        if let Some(q) = self.ratios.iter().find(|q| q.a == Wire::WeftGrpcMtls) {
            out.push_str(&format!(
                "target: gRPC mTLS / plaintext TCP (1 stream, {} s) >= {:.1}: {:.2}, {}; {}-byte frames/s mTLS / plaintext: {:.2}\n",
                self.tcp_seconds,
                self.grpc_mtls_tcp_target_ratio,
                q.tcp,
                met(q.tcp >= self.grpc_mtls_tcp_target_ratio),
                self.udp_payload,
                q.fps
            ));
        }
        let drops = |d: &BTreeMap<String, f64>| {
            let v: Vec<String> = d
                .iter()
                .filter(|(_, n)| **n > 0.0)
                .map(|(r, n)| format!("{r} {n:.0}"))
                .collect();
            if v.is_empty() { "none".to_string() } else { v.join(", ") }
        };
        out.push_str(&format!(
            "gRPC wire drops over the run (both nodes): plaintext {}, mTLS {}; mean frames per batch: plaintext {:.1}, mTLS {:.1}; mTLS connections refused: {:.0}\n",
            drops(&self.grpc_drops),
            drops(&self.grpc_mtls_drops),
            self.grpc_mean_batch_frames,
            self.grpc_mtls_mean_batch_frames,
            self.grpc_mtls_rejected
        ));
        out
    }
}
