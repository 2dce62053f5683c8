//! `--compare flows`, the part on a real kernel: what recording flows costs pod
//! traffic. Two labs as `podnet`'s direct-routing one (two nodes on one segment, a
//! weftd per node, pod `a` on n1 and pod `b` on n2), built side by side, one with
//! weftd's defaults (flows on: the conntrack reader, accounting and timestamps) and one
//! with `--flows=false`, measured in alternating order: TCP throughput a to b
//! (iperf3), and short TCP connections a to b per second (connect, the server closes,
//! the client closes: each a new conntrack entry, its events and a flow record on n1).
//! After the connection runs, the flow lab's readers say what they lost.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use weft_harness::NamedNetns;

use crate::median;
use crate::table::Table;
use crate::util::{LabGuard, build_pair, iperf_tcp, metric_sum, metrics_in, side_name, turns, wait_reachable};

/// The targets of issue 37: flows on over off.
pub const FLOW_TCP_TARGET: f64 = 0.97;
/// New connections per second, on over off.
pub const FLOW_CONNS_TARGET: f64 = 0.90;

/// The port the connection server listens on in pod b.
const CONN_PORT: u16 = 7000;

/// Where and how long.
#[derive(Debug, Clone)]
pub struct OverheadOptions {
    /// The plugin.
    pub weft: PathBuf,
    /// The daemon.
    pub weftd: PathBuf,
    /// Where the labs live while measured.
    pub work_dir: PathBuf,
    /// Passes, alternating which lab goes first.
    pub rounds: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// Seconds per connection run.
    pub conn_seconds: f64,
}

/// One lab's numbers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverheadSide {
    /// TCP throughput per pass (Gbit/s).
    pub tcp_gbps: Vec<f64>,
    /// Connections per second per pass.
    pub conns_per_s: Vec<f64>,
    /// Medians.
    pub tcp_gbps_median: f64,
    /// Medians.
    pub conns_per_s_median: f64,
}

/// Flows on beside off.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadReport {
    /// Passes.
    pub rounds: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// Seconds per connection run.
    pub conn_seconds: f64,
    /// Flows on.
    pub on: OverheadSide,
    /// Flows off.
    pub off: OverheadSide,
    /// TCP, on over off (medians).
    pub tcp_ratio: f64,
    /// Connections per second, on over off (medians).
    pub conns_ratio: f64,
    /// Connections opened in the flow lab in all.
    pub connections: u64,
    /// Conntrack entries its readers took in (`weft_flow_events_total{kind="entries"}`,
    /// n1 and n2).
    pub events_read: f64,
    /// Events lost and recovered (`weft_flow_events_lost_total`), and overflows.
    pub events_lost: f64,
    /// Times the kernel dropped events (`weft_flow_overflows_total`).
    pub overflows: f64,
}

fn spec(name: &str, flows: bool) -> serde_json::Value {
    json!({
        "name": name,
        "underlay": "shared",
        "pod_routing": "direct",
        "wire_security": "insecure",
        "nodes": ["n1", "n2"],
        "pods": [{"name": "a", "node": "n1"}, {"name": "b", "node": "n2"}],
        "weftd_args": [format!("--flows={flows}")],
    })
}

fn v4(lab: &weft_lab::Lab, pod: &str) -> Option<Ipv4Addr> {
    lab.pod_addresses(pod).into_iter().find_map(|a| match a {
        std::net::IpAddr::V4(v) => Some(v),
        std::net::IpAddr::V6(_) => None,
    })
}

struct Side {
    guard: LabGuard,
    dst: Ipv4Addr,
}

impl Side {
    fn build(dir: &Path, name: &str, flows: bool, o: &OverheadOptions) -> Result<Self, String> {
        let guard = LabGuard::up(dir, &spec(name, flows), &o.weftd, &o.weft)?;
        let dst = v4(&guard.lab, "b").ok_or("pod b has no IPv4 address")?;
        let a = guard.lab.pod_ns("a");
        if !wait_reachable(&a, &dst.to_string(), Duration::from_secs(30)) {
            return Err(format!("{name}: pod a does not reach b"));
        }
        Ok(Side { guard, dst })
    }

    fn ns(&self, pod: &str) -> String {
        self.guard.lab.pod_ns(pod)
    }
}

/// Short connections from `client` to `dst` in `server` for `seconds`: the number made.
fn connections(client: &str, server: &str, dst: Ipv4Addr, seconds: f64) -> Result<u64, String> {
    let listener = NamedNetns::existing(server)
        .within(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, CONN_PORT)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("listening in {server}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| format!("listener: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let accept = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    // Closed at once: the server closes first, as a short HTTP answer does.
                    Ok((c, _)) => drop(c),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(200))
                    }
                    Err(_) => {}
                }
            }
        })
    };
    let to = SocketAddr::from((dst, CONN_PORT));
    let made = NamedNetns::existing(client)
        .within(move || {
            let until = Instant::now() + Duration::from_secs_f64(seconds);
            let mut made = 0u64;
            let mut buf = [0u8; 1];
            while Instant::now() < until {
                if let Ok(mut c) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                    // Until the server's FIN: the connection went all the way.
                    let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                    if c.read(&mut buf).is_ok() {
                        made += 1;
                    }
                }
            }
            made
        })
        .map_err(|e| e.to_string())?;
    stop.store(true, Ordering::Relaxed);
    let _ = accept.join();
    Ok(made)
}

/// Runs the comparison.
pub fn run_flow_overhead(o: &OverheadOptions) -> Result<OverheadReport, String> {
    let base = format!("wf{}", std::process::id());
    let (on, off) = build_pair("flow overhead", |on| {
        let name = side_name(&base, on);
        Side::build(&o.work_dir.join(&name), &name, on, o)
    })?;
    let sides = [&on, &off];
    let mut results = [OverheadSide::default(), OverheadSide::default()];
    let mut connections_on = 0;
    for round in 0..o.rounds {
        for i in turns(round) {
            let s = sides[i];
            let (a, b) = (s.ns("a"), s.ns("b"));
            let t = iperf_tcp(&a, &b, s.dst, o.tcp_seconds)?;
            results[i].tcp_gbps.push(t.gbps);
            let n = connections(&a, &b, s.dst, o.conn_seconds)?;
            if i == 0 {
                connections_on += n;
            }
            results[i].conns_per_s.push(n as f64 / o.conn_seconds);
        }
    }
    let (mut read, mut lost, mut overflows) = (0.0, 0.0, 0.0);
    for node in ["n1", "n2"] {
        let page = metrics_in(&on.guard.lab.node_ns(node))?;
        read += metric_sum(&page, "weft_flow_events_total", &["kind=\"entries\""]);
        lost += metric_sum(&page, "weft_flow_events_lost_total", &[]);
        overflows += metric_sum(&page, "weft_flow_overflows_total", &[]);
    }
    drop(on);
    drop(off);
    for on in [true, false] {
        let _ = std::fs::remove_dir_all(o.work_dir.join(side_name(&base, on)));
    }
    for r in &mut results {
        r.tcp_gbps_median = median(&r.tcp_gbps);
        r.conns_per_s_median = median(&r.conns_per_s);
    }
    let [on, off] = results;
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Ok(OverheadReport {
        rounds: o.rounds,
        tcp_seconds: o.tcp_seconds,
        conn_seconds: o.conn_seconds,
        tcp_ratio: div(on.tcp_gbps_median, off.tcp_gbps_median),
        conns_ratio: div(on.conns_per_s_median, off.conns_per_s_median),
        on,
        off,
        connections: connections_on,
        events_read: read,
        events_lost: lost,
        overflows,
    })
}

impl OverheadReport {
    /// Whether both ratios reach their targets.
    pub fn met(&self) -> bool {
        self.tcp_ratio >= FLOW_TCP_TARGET && self.conns_ratio >= FLOW_CONNS_TARGET
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let list = |v: &[f64], digits: usize| v.iter().map(|x| format!("{x:.digits$}")).collect::<Vec<_>>().join(", ");
        let mut s = String::from("## Flows: overhead on a real kernel (flows on over off, same lab)\n\n");
        s.push_str(&format!(
            "Two 2-node labs side by side (pod a on n1, pod b on n2, direct routes), one with weftd's defaults \
             (flows on), one with `--flows=false`; {} passes alternating the order; TCP {} s per run (iperf3, one \
             stream), short TCP connections {:.1} s per run (connect, server closes, client closes; one client).\n\n",
            self.rounds, self.tcp_seconds, self.conn_seconds
        ));
        let mut t = Table::new()
            .text("measure")
            .text("flows on")
            .text("flows off")
            .text("on / off")
            .text("target");
        t.row([
            format!(
                "pod-to-pod TCP across nodes (Gbit/s, median; passes: {} / {})",
                list(&self.on.tcp_gbps, 2),
                list(&self.off.tcp_gbps, 2)
            ),
            format!("{:.2}", self.on.tcp_gbps_median),
            format!("{:.2}", self.off.tcp_gbps_median),
            format!("{:.3}x", self.tcp_ratio),
            format!(">= {FLOW_TCP_TARGET:.2}x"),
        ]);
        t.row([
            format!(
                "new TCP connections per second across nodes (median; passes: {} / {})",
                list(&self.on.conns_per_s, 0),
                list(&self.off.conns_per_s, 0)
            ),
            format!("{:.0}", self.on.conns_per_s_median),
            format!("{:.0}", self.off.conns_per_s_median),
            format!("{:.3}x", self.conns_ratio),
            format!(">= {FLOW_CONNS_TARGET:.2}x"),
        ]);
        s.push_str(&t.to_string());
        s.push_str(&format!(
            "\nFlow lab readers (n1 + n2) over {} connections: {:.0} conntrack entries read, {:.0} events lost and \
             recovered, {:.0} overflows.\n",
            self.connections, self.events_read, self.events_lost, self.overflows
        ));
        s.push_str(&format!("\ntargets {}\n", if self.met() { "met" } else { "MISSED" }));
        s
    }
}
