//! Pod-to-pod traffic between nodes over `eth0`, through weft's pod routing beside the
//! same kind of lab routed by hand with the kernel's own tools, in the same run: TCP
//! (iperf3, one stream) and a 64-byte UDP flood (frames per second received).
//!
//! Four two-node labs, one pod per node, pod `a` on n1 sending to pod `b` on n2:
//!
//! - weft `direct`: nodes on one shared segment, `--pod-routing direct` (a route to the
//!   peer's podCIDR via the peer's underlay address);
//! - kernel direct: the same lab with `--pod-routing none` (weft attaches pods and
//!   masquerades, nothing more) and `ip route add <peer podCIDR> via <peer address>`;
//! - weft `vxlan`: nodes in different subnets behind a router, `--pod-routing vxlan`;
//! - kernel VXLAN: the same lab with `--pod-routing none` and a VXLAN device made with
//!   `ip link` exactly like weft's (VNI, port, no learning, UDP checksums, MTU underlay
//!   minus 50, no DAD), its address, permanent neighbour and FDB entries and an onlink
//!   route, and the pods' MTU lowered to the device's, as weft gives them.
//!
//! - weft over BGP: nodes in different subnets, `bgp: true` (BIRD in every node and the
//!   router, weftd exporting each node's podCIDR, `--pod-routing none`): the routes BIRD
//!   learnt;
//! - kernel routed: the same routed lab with `--pod-routing none`, no BIRD, and the same
//!   routes made with `ip route` on both nodes and the router.
//!
//! weft's modes are named rather than `auto`, so the pods' MTU never depends on when a
//! daemon learned its peer; the bench checks the kernel holds what the mode means.
//! Passes go through the four paths in alternating order.

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::TrafficOptions;
use crate::exec::met;
use crate::median;
use crate::table::Table;
use crate::traffic::Traffic;
use crate::udp::{PAYLOAD, flood};
use crate::util::{iperf_tcp, wait_reachable};

mod setup;
use setup::compare_setups;

mod lab;
use lab::{PathLab, build, ip_json};

/// weft over the hand-made kernel path, TCP and 64-byte frames, in both modes: at least.
pub const POD_NETWORK_TARGET_RATIO: f64 = 0.95;
/// weft's defaults (`--pod-vxlan-port`, `--pod-vxlan-vni`), which the reference copies.
const VXLAN_PORT: &str = "8472";
const VXLAN_VNI: &str = "1";
/// What VXLAN adds over an IPv4 underlay (outer IPv4, UDP, VXLAN, inner Ethernet).
const VXLAN_OVERHEAD: u32 = 50;
/// The hand-made device: any name but weft's, which weft would remove as stale.
const REF_DEVICE: &str = "kvxlan";

/// How pod traffic crosses from node to node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodMode {
    /// A plain route to the peer's pod range via the peer (nodes on one segment).
    Direct,
    /// Encapsulated in unicast VXLAN (nodes in different subnets).
    Vxlan,
    /// Routed through the router by routes BGP learnt from weft's export (nodes in
    /// different subnets).
    Bgp,
}

/// A path measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodPath {
    /// weft's direct routes.
    WeftDirect,
    /// Routes made with `ip route`.
    KernelDirect,
    /// weft's VXLAN device and entries.
    WeftVxlan,
    /// A VXLAN device and entries made with `ip`.
    KernelVxlan,
    /// BIRD's routes, learnt over BGP from weft's exported ranges.
    WeftBgp,
    /// The same routes through the router, made with `ip route`.
    KernelRouted,
}

const PATHS: [PodPath; 6] = [
    PodPath::WeftDirect,
    PodPath::KernelDirect,
    PodPath::WeftVxlan,
    PodPath::KernelVxlan,
    PodPath::WeftBgp,
    PodPath::KernelRouted,
];

/// Each mode with weft's path and the hand-made one it is compared with.
const PAIRS: [(PodMode, PodPath, PodPath); 3] = [
    (PodMode::Direct, PodPath::WeftDirect, PodPath::KernelDirect),
    (PodMode::Vxlan, PodPath::WeftVxlan, PodPath::KernelVxlan),
    (PodMode::Bgp, PodPath::WeftBgp, PodPath::KernelRouted),
];

impl PodPath {
    fn label(self) -> &'static str {
        match self {
            PodPath::WeftDirect => "weft direct",
            PodPath::KernelDirect => "kernel direct",
            PodPath::WeftVxlan => "weft VXLAN",
            PodPath::KernelVxlan => "kernel VXLAN",
            PodPath::WeftBgp => "weft export + BGP",
            PodPath::KernelRouted => "kernel routes via router",
        }
    }

    fn mode(self) -> PodMode {
        match self {
            PodPath::WeftDirect | PodPath::KernelDirect => PodMode::Direct,
            PodPath::WeftVxlan | PodPath::KernelVxlan => PodMode::Vxlan,
            PodPath::WeftBgp | PodPath::KernelRouted => PodMode::Bgp,
        }
    }

    fn weft(self) -> bool {
        matches!(self, PodPath::WeftDirect | PodPath::WeftVxlan | PodPath::WeftBgp)
    }

    /// The suffix of its lab's name.
    fn tag(self) -> &'static str {
        match self {
            PodPath::WeftDirect => "pd",
            PodPath::KernelDirect => "kd",
            PodPath::WeftVxlan => "pv",
            PodPath::KernelVxlan => "kv",
            PodPath::WeftBgp => "pb",
            PodPath::KernelRouted => "kr",
        }
    }

    fn spec(self, name: &str) -> serde_json::Value {
        let underlay = match self.mode() {
            PodMode::Direct => "shared",
            PodMode::Vxlan | PodMode::Bgp => "routed",
        };
        let routing = match self {
            PodPath::WeftDirect => "direct",
            PodPath::WeftVxlan => "vxlan",
            PodPath::KernelDirect | PodPath::KernelVxlan | PodPath::WeftBgp | PodPath::KernelRouted => "none",
        };
        serde_json::json!({
            "name": name,
            "underlay": underlay,
            "pod_routing": routing,
            "bgp": self == PodPath::WeftBgp,
            "nodes": ["n1", "n2"],
            "pods": [{"name": "a", "node": "n1"}, {"name": "b", "node": "n2"}],
        })
    }
}

/// One path's results.
#[derive(Debug, Clone, Serialize)]
pub struct PodPathResult {
    /// Which path.
    pub path: PodPath,
    /// Its mode.
    pub mode: PodMode,
    /// The MTU of the sending pod's `eth0`.
    pub pod_mtu: u32,
    /// TCP and UDP over the passes.
    #[serde(flatten)]
    pub traffic: Traffic,
    /// The sending iperf3's CPU (% of one CPU, user + system) per pass.
    pub tcp_sender_cpu: Vec<f64>,
    /// The receiving iperf3's CPU per pass.
    pub tcp_receiver_cpu: Vec<f64>,
}

/// weft over the kernel path in one mode.
#[derive(Debug, Clone, Serialize)]
pub struct PodModeRatio {
    /// The mode.
    pub mode: PodMode,
    /// TCP, weft / kernel (medians).
    pub tcp: f64,
    /// 64-byte frames/s received, weft / kernel (medians).
    pub fps: f64,
    /// The ratios of every pass (weft over the kernel of the same pass): TCP.
    pub tcp_per_pass: Vec<f64>,
    /// The same for 64-byte frames/s.
    pub fps_per_pass: Vec<f64>,
    /// Both at least the target.
    pub met: bool,
}

/// The pod network benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct PodNetReport {
    /// Passes.
    pub rounds: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// Seconds per UDP flood.
    pub udp_seconds: f64,
    /// UDP payload bytes.
    pub udp_payload: usize,
    /// The underlay MTU of every lab.
    pub underlay_mtu: u32,
    /// Every path.
    pub paths: Vec<PodPathResult>,
    /// weft over the kernel, per mode.
    pub ratios: Vec<PodModeRatio>,
    /// The target ratio.
    pub target_ratio: f64,
    /// Where the reference's set-up differs from weft's (device attributes, offloads,
    /// pod MTU); empty when it matches.
    pub setup_differences: Vec<String>,
    /// Whether the offloads were compared (`ethtool -k`; skipped without ethtool).
    pub offloads_compared: bool,
}

/// Runs the pod network benchmark.
pub fn run_podnet(opts: &TrafficOptions) -> Result<PodNetReport, String> {
    for (what, p) in [("weft", &opts.weft), ("weftd", &opts.weftd)] {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    if Command::new("iperf3").arg("--version").output().is_err() {
        return Err("iperf3 is not installed (test/install-deps.sh installs it)".into());
    }
    let base = format!("wb{}", std::process::id());
    // The four labs come up side by side; each one's guard takes it down whatever
    // happens to the others.
    let built: Vec<Result<PathLab, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = PATHS
            .iter()
            .map(|&p| {
                let name = format!("{base}{}", p.tag());
                s.spawn(move || build(p, opts, &name))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("building a lab panicked".into())))
            .collect()
    });
    let mut labs = Vec::new();
    let mut errors = Vec::new();
    for b in built {
        match b {
            Ok(l) => labs.push(l),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    let lab_of = |p: PodPath| labs.iter().find(|l| l.path == p).expect("every path has its lab");
    for l in &labs {
        for (from, to) in [("a", l.dst.to_string()), ("b", first_v4(&l.guard.lab, "a"))] {
            if !wait_reachable(&l.guard.lab.pod_ns(from), &to, Duration::from_secs(20)) {
                return Err(format!("{}: pod {from} does not reach {to}", l.path.label()));
            }
        }
        l.check_routing()?;
    }
    let mut setup_differences = Vec::new();
    let mut offloads_compared = true;
    for (_, w, k) in PAIRS {
        let (d, compared) = compare_setups(lab_of(w), lab_of(k))?;
        setup_differences.extend(d);
        offloads_compared &= compared;
    }
    let mut results: Vec<PodPathResult> = PATHS
        .iter()
        .map(|&p| PodPathResult {
            path: p,
            mode: p.mode(),
            pod_mtu: lab_of(p).pod_mtu(),
            traffic: Traffic::default(),
            tcp_sender_cpu: Vec::new(),
            tcp_receiver_cpu: Vec::new(),
        })
        .collect();
    for round in 0..opts.rounds {
        let mut order = PATHS.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for p in order {
            let l = lab_of(p);
            let t = iperf_tcp(&l.client(), &l.server(), l.dst, opts.tcp_seconds)
                .map_err(|e| format!("{}: {e}", p.label()))?;
            let f =
                flood(&l.client(), &l.server(), l.dst, opts.udp_seconds).map_err(|e| format!("{}: {e}", p.label()))?;
            let r = results.iter_mut().find(|r| r.path == p).expect("every path");
            r.traffic.push(t.gbps, t.retransmits, f);
            r.tcp_sender_cpu.push(t.sender_cpu);
            r.tcp_receiver_cpu.push(t.receiver_cpu);
        }
    }
    let underlay_mtu = labs[0].guard.lab.spec.underlay_mtu;
    drop(labs);
    for p in PATHS {
        let _ = std::fs::remove_dir_all(opts.work_dir.join(format!("{base}{}", p.tag())));
    }
    for r in &mut results {
        r.traffic.settle();
    }
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let ratios = PAIRS
        .into_iter()
        .map(|(mode, w, k)| {
            let (rw, rk) = (
                results.iter().find(|r| r.path == w).expect("weft"),
                results.iter().find(|r| r.path == k).expect("kernel"),
            );
            let tcp = div(rw.traffic.tcp_gbps_median, rk.traffic.tcp_gbps_median);
            let fps = div(rw.traffic.udp_fps_median, rk.traffic.udp_fps_median);
            PodModeRatio {
                mode,
                tcp,
                fps,
                tcp_per_pass: rw
                    .traffic
                    .tcp_gbps
                    .iter()
                    .zip(&rk.traffic.tcp_gbps)
                    .map(|(a, b)| div(*a, *b))
                    .collect(),
                fps_per_pass: rw
                    .traffic
                    .udp
                    .iter()
                    .zip(&rk.traffic.udp)
                    .map(|(a, b)| div(a.received_per_s(), b.received_per_s()))
                    .collect(),
                met: tcp >= POD_NETWORK_TARGET_RATIO && fps >= POD_NETWORK_TARGET_RATIO,
            }
        })
        .collect();
    Ok(PodNetReport {
        rounds: opts.rounds,
        tcp_seconds: opts.tcp_seconds,
        udp_seconds: opts.udp_seconds,
        udp_payload: PAYLOAD,
        underlay_mtu,
        paths: results,
        ratios,
        target_ratio: POD_NETWORK_TARGET_RATIO,
        setup_differences,
        offloads_compared,
    })
}

fn first_v4(lab: &weft_lab::Lab, pod: &str) -> String {
    lab.pod_addresses(pod)
        .into_iter()
        .find(IpAddr::is_ipv4)
        .map(|a| a.to_string())
        .unwrap_or_default()
}

impl PodNetReport {
    /// The report as markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Pod to pod across two nodes over eth0 (pod on n1 -> pod on n2), weft's pod routing beside hand-made kernel routing in the same kind of lab (weft's routing off), medians of {} pass(es) in alternating order: iperf3 TCP one stream {} s; UDP flood of {}-byte datagrams {} s (sendmmsg/recvmmsg, frames/s received at the far end); underlay MTU {}\n\n",
            self.rounds, self.tcp_seconds, self.udp_payload, self.udp_seconds, self.underlay_mtu
        );
        let mut t = Table::new()
            .text("path")
            .text("underlay")
            .num("pod MTU")
            .num("TCP (Gbit/s)")
            .num("TCP retransmits (median)")
            .num("iperf3 CPU % sender / receiver")
            .num("64-byte frames/s received")
            .num("frames/s sent");
        for r in &self.paths {
            let retr = r.traffic.retransmits_median();
            t.row([
                r.path.label().to_string(),
                match r.mode {
                    PodMode::Direct => "shared segment",
                    PodMode::Vxlan | PodMode::Bgp => "routed",
                }
                .to_string(),
                r.pod_mtu.to_string(),
                format!("{:.2}", r.traffic.tcp_gbps_median),
                format!("{retr:.0}"),
                format!("{:.0} / {:.0}", median(&r.tcp_sender_cpu), median(&r.tcp_receiver_cpu)),
                format!("{:.0}", r.traffic.udp_fps_median),
                format!("{:.0}", r.traffic.udp_sent_fps_median),
            ]);
        }
        let mut ratios = Table::new()
            .text("ratio")
            .num("TCP")
            .num("64-byte frames/s")
            .text("TCP per pass")
            .text("frames/s per pass")
            .text(format!("target >= {:.2}", self.target_ratio));
        let list = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
        for q in &self.ratios {
            let (_, w, k) = PAIRS
                .into_iter()
                .find(|(m, ..)| *m == q.mode)
                .expect("every mode has a pair");
            ratios.row([
                format!("{} / {}", w.label(), k.label()),
                format!("{:.2}", q.tcp),
                format!("{:.2}", q.fps),
                list(&q.tcp_per_pass),
                list(&q.fps_per_pass),
                met(q.met).to_string(),
            ]);
        }
        out.push_str(&format!("{t}\n{ratios}"));
        out.push_str(&format!(
            "\nreference set up like weft's path ({}): {}\n",
            if self.offloads_compared {
                "pod MTU, VXLAN device attributes and offloads"
            } else {
                "pod MTU and VXLAN device attributes; offloads not compared, no ethtool"
            },
            if self.setup_differences.is_empty() {
                "yes".to_string()
            } else {
                format!("no: {}", self.setup_differences.join("; "))
            }
        ));
        out
    }
}
