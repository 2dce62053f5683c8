//! `--compare fqdn`: what egress by domain name costs. Two one-node labs with the
//! lab's DNS side by side, one whose ClusterNetworkPolicy allows pod `a` a name (its
//! DNS answers are copied to weftd's learner as they pass; a new connection the name
//! alone could allow waits only if it overtakes the learner) and one
//! with no policy, measured in alternating order: DNS lookups from the pod (UDP, one
//! at a time, the name's answer each time), and TCP throughput to the name's address
//! (iperf3 in the outside). Then the scale part on a real kernel, in a namespace of its
//! own: the set write of one answer (two addresses, one nfnetlink transaction) into a
//! learnt set holding 1,000 and then 100,000 addresses, and the learner's table of
//! 10,000 names with 100,000 addresses in memory.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use weft_harness::NamedNetns;

use crate::table::Table;
use crate::util::{LabGuard, build_pair, iperf_tcp, own_rss_kib, side_name, turns};
use crate::{Percentiles, median};

/// The issue's targets: lookup p50, policy over none.
pub const FQDN_LOOKUP_TARGET: f64 = 1.2;
/// Throughput to the allowed name's address, policy over none.
pub const FQDN_TCP_TARGET: f64 = 0.97;

/// The name measured, and its address (the outside holds it).
const NAME: &str = "api.bench.test";
const ADDRESS: &str = "198.51.100.10";

/// Where and how much.
#[derive(Debug, Clone)]
pub struct FqdnOptions {
    /// The plugin.
    pub weft: PathBuf,
    /// The daemon.
    pub weftd: PathBuf,
    /// Where the labs live while measured.
    pub work_dir: PathBuf,
    /// Passes, alternating which lab goes first.
    pub rounds: usize,
    /// Lookups per pass.
    pub lookups: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// Addresses in the learnt set for the scale part.
    pub scale_addresses: usize,
    /// Names in the learner's table for the scale part (the addresses spread over them).
    pub scale_names: usize,
}

impl FqdnOptions {
    /// The issue's sizes.
    pub fn issue(weft: PathBuf, weftd: PathBuf, work_dir: PathBuf, rounds: usize, tcp_seconds: u64) -> Self {
        FqdnOptions {
            weft,
            weftd,
            work_dir,
            rounds: rounds.max(1),
            lookups: 2000,
            tcp_seconds,
            scale_addresses: 100_000,
            scale_names: 10_000,
        }
    }
}

/// One lab's numbers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FqdnSide {
    /// Lookup latency over every pass (µs).
    pub lookup_us: Option<Percentiles>,
    /// TCP throughput per pass (Gbit/s).
    pub tcp_gbps: Vec<f64>,
    /// Its median.
    pub tcp_gbps_median: f64,
}

/// The scale part.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FqdnScale {
    /// Addresses in the set at the second measure.
    pub addresses: usize,
    /// One answer's write (two addresses) into a set of 1,000 (µs, median of 200).
    pub write_small_us: f64,
    /// The same into a set of `addresses`.
    pub write_large_us: f64,
    /// Names in the learner's table.
    pub names: usize,
    /// What the table of `names` names with `addresses` addresses takes (MiB of RSS).
    pub table_mib: f64,
}

/// Policy beside none.
#[derive(Debug, Clone, Serialize)]
pub struct FqdnReport {
    /// Passes.
    pub rounds: usize,
    /// Lookups per pass.
    pub lookups: usize,
    /// Seconds per TCP run.
    pub tcp_seconds: u64,
    /// With a domainNames policy.
    pub on: FqdnSide,
    /// Without.
    pub off: FqdnSide,
    /// Lookup p50, on over off.
    pub lookup_p50_ratio: f64,
    /// Lookup p99, on over off (stated).
    pub lookup_p99_ratio: f64,
    /// TCP, on over off (medians).
    pub tcp_ratio: f64,
    /// The scale part.
    pub scale: FqdnScale,
}

fn spec(name: &str, policy: bool) -> serde_json::Value {
    let mut s = json!({
        "name": name,
        "wire_security": "insecure",
        "nodes": ["n1"],
        "namespaces": [{"name": "x", "labels": {"ns": "x"}}],
        "pods": [{"name": "a", "namespace": "x", "node": "n1"}],
        "dns": [{"name": NAME, "addresses": [ADDRESS], "ttl": 300}],
    });
    if policy {
        s["policies"] = json!([{
            "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "bench-by-name"},
            "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                     "egress": [
                        {"action": "Accept", "to": [{"networks": ["198.51.100.2/32"]}],
                         "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                        {"action": "Accept", "to": [{"domainNames": [NAME]}]},
                        {"action": "Deny", "to": [{"networks": ["198.51.100.0/24"]}]}]}
        }]);
    }
    s
}

/// `n` lookups of the name from inside `ns`, one at a time: each one's time (µs).
fn lookups(ns: &str, n: usize) -> Result<Vec<f64>, String> {
    NamedNetns::existing(ns)
        .within(move || -> Result<Vec<f64>, String> {
            let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(2)))
                .map_err(|e| e.to_string())?;
            let mut out = Vec::with_capacity(n);
            let mut buf = [0u8; 1500];
            for i in 0..n {
                let q = weft_fqdn::answer::build::query(NAME, i as u16, false);
                let t = Instant::now();
                s.send_to(&q, (weft_lab::OUTSIDE_ADDRESS, 53))
                    .map_err(|e| e.to_string())?;
                let got = s.recv(&mut buf).map_err(|e| format!("lookup {i}: {e}"))?;
                out.push(t.elapsed().as_secs_f64() * 1e6);
                let a = weft_fqdn::read_response(&buf[..got])?.ok_or("no answer")?;
                if a.addresses.is_empty() {
                    return Err(format!("{NAME}: no address"));
                }
            }
            Ok(out)
        })
        .map_err(|e| e.to_string())?
}

/// The scale part (see the module documentation).
fn scale(o: &FqdnOptions, name: &str) -> Result<FqdnScale, String> {
    use weft_kernel::nftset::{Expiry, NFPROTO_INET, Session, SetElement, key_addr};
    let ns = NamedNetns::create(name).map_err(|e| format!("the scale namespace: {e}"))?;
    let addr = |i: usize| IpAddr::V4(Ipv4Addr::from(0x0a00_0000u32 + i as u32));
    let element = |i: usize| SetElement {
        set: "f0000000000".into(),
        key: key_addr(addr(i)),
        data: None,
        expiry: Some(Expiry {
            timeout_ms: 600_000,
            comment: format!("n{}.bench.test", i % o.scale_names.max(1)),
        }),
    };
    let r = ns
        .within(|| -> Result<(f64, f64), String> {
            weft_kernel::nft::run(
                &["-f", "-"],
                Some("table inet weft-bench {\n set f0000000000 {\n  type ipv4_addr; flags timeout;\n }\n}\n"),
            )
            .map_err(|e| format!("the learnt set: {e}"))?;
            let mut session = Session::default();
            let fill = |session: &mut Session, from: usize, to: usize| -> Result<(), String> {
                let all: Vec<SetElement> = (from..to).map(element).collect();
                for chunk in all.chunks(2000) {
                    session
                        .transact("weft-bench", NFPROTO_INET, chunk, true)
                        .map_err(|e| format!("filling the learnt set: {e}"))?;
                }
                Ok(())
            };
            // One answer: two new addresses past the filled ones, each time.
            let mut next = o.scale_addresses + 10;
            let mut time = |session: &mut Session| -> Result<f64, String> {
                let mut t = Vec::with_capacity(200);
                for _ in 0..200 {
                    let answer = [element(next), element(next + 1)];
                    next += 2;
                    let s = Instant::now();
                    session
                        .transact("weft-bench", NFPROTO_INET, &answer, true)
                        .map_err(|e| format!("writing an answer: {e}"))?;
                    t.push(s.elapsed().as_secs_f64() * 1e6);
                }
                Ok(median(&t))
            };
            fill(&mut session, 0, 1000)?;
            let small = time(&mut session)?;
            fill(&mut session, 1000, o.scale_addresses)?;
            let large = time(&mut session)?;
            Ok((small, large))
        })
        .map_err(|e| e.to_string())??;
    drop(ns);
    let _ = weft_harness::NamedNetns::existing(name).delete();
    let before = own_rss_kib();
    let mut t = weft_fqdn::Learnt::new(weft_fqdn::Limits {
        total: o.scale_addresses.max(1),
        ..weft_fqdn::Limits::default()
    });
    for i in 0..o.scale_addresses {
        t.learn(&format!("n{}.bench.test", i % o.scale_names.max(1)), addr(i), 600, 0);
    }
    let after = own_rss_kib();
    let held = t.addresses();
    drop(t);
    Ok(FqdnScale {
        addresses: held,
        write_small_us: r.0,
        write_large_us: r.1,
        names: o.scale_names,
        table_mib: after.saturating_sub(before) as f64 / 1024.0,
    })
}

struct Side {
    guard: LabGuard,
}

impl Side {
    fn build(dir: &Path, name: &str, policy: bool, o: &FqdnOptions) -> Result<Self, String> {
        let guard = LabGuard::up(dir, &spec(name, policy), &o.weftd, &o.weft)?;
        let a = guard.lab.pod_ns("x/a");
        // The policy in place and the name learnt once: the lookup path is what is
        // measured, not the first learning.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if lookups(&a, 1).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{name}: pod a never resolved {NAME}"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Side { guard })
    }
}

/// Runs the comparison.
pub fn run_fqdn(o: &FqdnOptions) -> Result<FqdnReport, String> {
    let base = format!("wq{}", std::process::id());
    let (on, off) = build_pair("fqdn", |on| {
        let name = side_name(&base, on);
        Side::build(&o.work_dir.join(&name), &name, on, o)
    })?;
    let sides = [&on, &off];
    let mut lookup_us: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut results = [FqdnSide::default(), FqdnSide::default()];
    let dst: Ipv4Addr = ADDRESS.parse().expect("an address");
    for round in 0..o.rounds {
        for i in turns(round) {
            let lab = &sides[i].guard.lab;
            let a = lab.pod_ns("x/a");
            lookup_us[i].extend(lookups(&a, o.lookups)?);
            let t = iperf_tcp(&a, &lab.outside_ns(), dst, o.tcp_seconds)?;
            results[i].tcp_gbps.push(t.gbps);
        }
    }
    drop(on);
    drop(off);
    for on in [true, false] {
        let _ = std::fs::remove_dir_all(o.work_dir.join(side_name(&base, on)));
    }
    for (r, l) in results.iter_mut().zip(&lookup_us) {
        r.lookup_us = Some(Percentiles::of(l));
        r.tcp_gbps_median = median(&r.tcp_gbps);
    }
    let scale = scale(o, &format!("{base}sc"))?;
    let [on, off] = results;
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let (p_on, p_off) = (on.lookup_us.unwrap_or_default(), off.lookup_us.unwrap_or_default());
    Ok(FqdnReport {
        rounds: o.rounds,
        lookups: o.lookups,
        tcp_seconds: o.tcp_seconds,
        lookup_p50_ratio: div(p_on.p50, p_off.p50),
        lookup_p99_ratio: div(p_on.p99, p_off.p99),
        tcp_ratio: div(on.tcp_gbps_median, off.tcp_gbps_median),
        on,
        off,
        scale,
    })
}

impl FqdnReport {
    /// Whether the ratios reach their targets.
    pub fn met(&self) -> bool {
        self.lookup_p50_ratio <= FQDN_LOOKUP_TARGET && self.tcp_ratio >= FQDN_TCP_TARGET
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let p = |s: &FqdnSide| s.lookup_us.unwrap_or_default();
        let (on, off) = (p(&self.on), p(&self.off));
        let mut s = String::from("## Egress by domain name (a domainNames policy over none, same lab)\n\n");
        s.push_str(&format!(
            "Two one-node labs with the lab's DNS (dnsmasq in the outside) side by side, one whose \
             ClusterNetworkPolicy allows pod x/a `{NAME}` (its answers are copied to weftd's learner as they pass; \
             a new connection only the name allows waits if it overtakes the learner), one with no policy; {} passes alternating the order; {} lookups per pass (UDP, \
             one at a time, each answered with the address); TCP {} s per run (iperf3, one stream, to the name's \
             address in the outside).\n\n",
            self.rounds, self.lookups, self.tcp_seconds
        ));
        let mut t = Table::new()
            .text("measure")
            .text("policy")
            .text("none")
            .text("policy / none")
            .text("target");
        t.row([
            "DNS lookup p50 (µs)".to_string(),
            format!("{:.0}", on.p50),
            format!("{:.0}", off.p50),
            format!("{:.2}x", self.lookup_p50_ratio),
            format!("<= {FQDN_LOOKUP_TARGET:.1}x"),
        ]);
        t.row([
            "DNS lookup p99 (µs)".to_string(),
            format!("{:.0}", on.p99),
            format!("{:.0}", off.p99),
            format!("{:.2}x", self.lookup_p99_ratio),
            "stated".to_string(),
        ]);
        t.row([
            "TCP to the name's address (Gbit/s, median)".to_string(),
            format!("{:.2}", self.on.tcp_gbps_median),
            format!("{:.2}", self.off.tcp_gbps_median),
            format!("{:.3}x", self.tcp_ratio),
            format!(">= {FQDN_TCP_TARGET:.2}x"),
        ]);
        s.push_str(&t.to_string());
        let sc = &self.scale;
        s.push_str(&format!(
            "\nScale, real kernel: one answer's set write (two addresses, one nfnetlink transaction, with their \
             timeout and name) takes {:.0} µs into a learnt set of 1,000 addresses and {:.0} µs into one of {} \
             ({:.2}x); the learner's table of {} names with {} addresses takes {:.1} MiB.\n",
            sc.write_small_us,
            sc.write_large_us,
            sc.addresses,
            if sc.write_small_us > 0.0 {
                sc.write_large_us / sc.write_small_us
            } else {
                0.0
            },
            sc.names,
            sc.addresses,
            sc.table_mib
        ));
        s.push_str(&format!("\ntargets {}\n", if self.met() { "met" } else { "MISSED" }));
        s
    }
}
