//! Reachability of a new pod, as Kubernetes perf-tests' network-policy-enforcement-latency
//! measures it: how soon after its ADD a new pod reaches, and is reached by, the pods
//! its policies allow, in a three-node lab (the lab's own daemons, plugin and wire
//! port, as `converge` builds it).
//!
//! Namespace x is isolated for ingress and allows only namespace y, on UDP
//! [`REACH_PORT`]; namespace y is isolated for ingress and allows only namespace x. A
//! UDP echo runs in x/a on n2. Then, pod after pod: the Pod object of a new pod y/new-i
//! on n1 is written as the API server has it before kubelet starts the sandbox (labels,
//! `spec.nodeName`, no addresses), its ADD runs on n1 through the plugin, and from the
//! instant the ADD answered two probes run at once, each one UDP socket sending every
//! millisecond until the first echo comes back (at most [`REACH_PROBE_LIMIT`]):
//!
//! - out: from the new pod to x/a's echo. n2 accepts it only once its sets hold the new
//!   pod's address: the other nodes' part, which the new pod's node announces at its
//!   ADD (before the ADD answers) or, without announcements, the watch brings once
//!   kubelet reported the address;
//! - in: from x/a to an echo in the new pod, which n1's own table must let in.
//!
//! The new pod's addresses are reported into the lab (kubelet's report, which the
//! watch path runs on) only once the probes are running, or a set delay after the ADD's
//! answer. `nft monitor` on n2 tells when n2's kernel took the address and from whom.
//! Then the pod is removed (DEL, Pod object) and its address is out of every node's
//! sets before the next pod: an address handed out again must not find the old pod's
//! elements.
//!
//! Untimed pods go first, the same way, until n1's peers take its announcements (or
//! nothing is announced at all): a peer that did not answer once, as one may while the
//! lab comes up, is skipped for a while, and the timed pods are to see the steady
//! state. Which announcements went and what became of them comes from the weftds'
//! metrics.
//!
//! Two runs when asked: the lab as it is (announcements), and the watch path alone,
//! its weftds started with [`NO_ANNOUNCE_ENV`] (the lab takes no extra flags for its
//! daemons, so a wrapper of weftd sets that environment and execs it).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use weft_harness::NamedNetns;
use weft_lab::PodSpec;

use super::nftmon::{Monitor, Transaction, nft};
use super::objects::policy;
use super::{LoadAvg, PolicyOptions};
use crate::table::Table;
use crate::util::{LabGuard, metric_sum, metrics_in};

/// The target: p99 from the ADD's answer to the first echo, each way, below (ms).
pub const REACH_TARGET_MS: f64 = 100.0;
/// The echoes' UDP port (x allows y on it).
pub const REACH_PORT: u16 = 7070;
/// New pods per run at the issue's size.
pub const REACH_PODS: usize = 50;
/// How long a probe waits for its first echo before it counts as failed.
pub const REACH_PROBE_LIMIT: Duration = Duration::from_secs(10);
/// The environment the watch-path run's weftds start with: the transport's switch
/// (`--policy-announce-timeout-ms 0`: new pods are not announced) and a marker naming
/// the run, visible in each daemon's `/proc/PID/environ`. One place to change should
/// the switch be named otherwise; an unknown variable changes nothing, which the report
/// shows as announcements taken in the run without them.
pub const NO_ANNOUNCE_ENV: [(&str, &str); 2] = [
    ("WEFT_BENCH_REACH_NO_ANNOUNCE", "1"),
    ("WEFT_POLICY_ANNOUNCE_TIMEOUT_MS", "0"),
];

/// How often a probe sends.
const PROBE_EVERY: Duration = Duration::from_millis(1);
/// How long the lab's nodes may take to let a removed pod's address go.
const GONE_LIMIT: Duration = Duration::from_secs(10);
/// What `weft_policy_announcements_total` counts an announcement received as.
const ANNOUNCE_RESULTS: [&str; 4] = ["applied", "kept", "known", "refused"];
/// What `weft_policy_announce_total` counts an announcement sent to a peer as.
const SENT_RESULTS: [&str; 4] = ["taken", "refused", "failed", "skipped"];
/// How long untimed pods may go first until n1's peers take its announcements: a peer
/// that did not answer once (one still starting as the lab came up) is skipped for 30 s.
const WARM_LIMIT: Duration = Duration::from_secs(40);

/// Nearest-rank percentiles, with the p95 perf-tests reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
    /// How many samples.
    pub n: usize,
}

impl Quantiles {
    /// Those of `samples`.
    pub fn of(samples: &[f64]) -> Self {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            if s.is_empty() {
                return 0.0;
            }
            s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
        };
        Self {
            p50: rank(0.5),
            p95: rank(0.95),
            p99: rank(0.99),
            max: s.last().copied().unwrap_or(0.0),
            n: s.len(),
        }
    }
}

/// One new pod.
#[derive(Debug, Clone, Serialize)]
pub struct ReachPod {
    /// Its name (in namespace y).
    pub name: String,
    /// Its IPv4 address.
    pub ip: String,
    /// Its ADD through the plugin, spawn to answer (ms).
    pub add_ms: f64,
    /// From the ADD's answer to the first echo from x/a (ms); `None`: none came.
    pub out_ms: Option<f64>,
    /// Datagrams the new pod sent until then.
    pub out_sent: u32,
    /// From the ADD's answer to the first echo from the new pod to x/a (ms).
    pub in_ms: Option<f64>,
    /// Datagrams x/a sent until then.
    pub in_sent: u32,
    /// From the ADD's answer to n2's kernel holding the new pod's address (the first
    /// line of that transaction in its `nft monitor`; negative: before the ADD
    /// answered); `None`: not seen.
    pub remote_kernel_ms: Option<f64>,
    /// The process that wrote that transaction (`weftd`: a batch of set elements).
    pub remote_by: String,
    /// From the ADD's answer to the addresses reported into the lab (ms).
    pub reported_ms: f64,
}

/// One run: with announcements or without.
#[derive(Debug, Clone, Serialize)]
pub struct ReachRun {
    /// Whether the weftds were left to announce new pods (the lab as it is); false:
    /// started with [`NO_ANNOUNCE_ENV`].
    pub announce: bool,
    /// Every new pod, in order.
    pub pods: Vec<ReachPod>,
    /// The ADDs (ms).
    pub add: Quantiles,
    /// New pod to x/a, the probes that got an echo (ms from the ADD's answer).
    pub out: Quantiles,
    /// x/a to the new pod.
    pub into: Quantiles,
    /// New pods whose probe to x/a got no echo within the limit.
    pub out_failed: usize,
    /// New pods x/a's probe got no echo from.
    pub in_failed: usize,
    /// n2's kernel holding the new pod's address (ms from the ADD's answer).
    pub remote_kernel: Quantiles,
    /// Announcements n2 and n3 received during the timed pods, by what became of them
    /// (`weft_policy_announcements_total`); all zero where nothing announces.
    pub announcements: BTreeMap<String, f64>,
    /// n1's announcements to its peers during the timed pods, one per peer and pod, by
    /// what became of them (`weft_policy_announce_total`: taken, refused, failed,
    /// skipped).
    pub sent: BTreeMap<String, f64>,
    /// Untimed pods that went first, until n1's peers took its announcements (or
    /// nothing was announced at all, or [`WARM_LIMIT`] passed).
    pub warm_pods: usize,
    /// The machine's load at the start and the end.
    pub load: (LoadAvg, LoadAvg),
}

/// Both runs.
#[derive(Debug, Clone, Serialize)]
pub struct ReachReport {
    /// New pods per run.
    pub pods: usize,
    /// From a Pod object written to its ADD (ms).
    pub object_lead_ms: f64,
    /// From the ADD's answer to its addresses reported (ms; at least until the probes
    /// started).
    pub report_delay_ms: f64,
    /// How long a probe waits for its echo (s).
    pub probe_limit_s: f64,
    /// The runs, with announcements first.
    pub runs: Vec<ReachRun>,
    /// The target (ms) for the p99 of both directions.
    pub target_ms: f64,
}

fn spec(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "nodes": ["n1", "n2", "n3"],
        "namespaces": [{"name": "x", "labels": {"ns": "x"}}, {"name": "y", "labels": {"ns": "y"}}],
        "pods": [
            {"name": "a", "namespace": "x", "node": "n2", "labels": {"pod": "a"}},
            {"name": "b", "namespace": "x", "node": "n3", "labels": {"pod": "b"}},
            // y's group on n1 exists before the first new pod, as on a busy node.
            {"name": "a", "namespace": "y", "node": "n1", "labels": {"pod": "a"}},
        ],
        "policies": [
            policy("x", "allow-y-on-echo", json!({
                "podSelector": {},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                             "ports": [{"protocol": "UDP", "port": REACH_PORT}]}],
            })),
            policy("y", "allow-x", json!({
                "podSelector": {},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}],
            })),
        ],
    })
}

/// A weftd that starts with [`NO_ANNOUNCE_ENV`]: a script in `dir` that sets it and
/// execs `weftd` (same pid, so the lab's pid file still names the daemon).
fn no_announce_weftd(dir: &Path, weftd: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let weftd = std::fs::canonicalize(weftd).map_err(|e| format!("{}: {e}", weftd.display()))?;
    let quoted = format!("'{}'", weftd.display().to_string().replace('\'', r"'\''"));
    let env: Vec<String> = NO_ANNOUNCE_ENV.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let text = format!(
        "#!/bin/sh\n# weftd for the watch-path run of weft-bench's reach part: new pods not announced.\nexport {}\nexec {quoted} \"$@\"\n",
        env.join(" ")
    );
    let path = dir.join("weftd-no-announce");
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", path.display()))?;
    Ok(path)
}

/// A UDP socket bound to `port` on every address inside network namespace `ns`.
fn bind_in(ns: &str, port: u16) -> Result<UdpSocket, String> {
    NamedNetns::existing(ns)
        .within(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
        .map_err(|e| format!("entering {ns}: {e}"))?
        .map_err(|e| format!("binding UDP {port} in {ns}: {e}"))
}

/// Answers every datagram with itself until `stop`.
fn echo(sock: &UdpSocket, stop: &AtomicBool) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(&buf[..n], from);
        }
    }
}

/// Sends a datagram to `to` every [`PROBE_EVERY`] from one socket until the first
/// echo from `to` comes back or `limit` has passed since `t0`: when it came (ms after
/// `t0`) and how many datagrams went.
fn probe(sock: &UdpSocket, to: SocketAddr, t0: Instant, limit: Duration) -> (Option<f64>, u32) {
    let mut buf = [0u8; 64];
    let mut sent = 0u32;
    while t0.elapsed() < limit {
        // Refused or unroutable at first (no route yet): sent again a moment later.
        let _ = sock.send_to(&sent.to_be_bytes(), to);
        sent += 1;
        let next = Instant::now() + PROBE_EVERY;
        loop {
            let now = Instant::now();
            if now >= next {
                break;
            }
            let _ = sock.set_read_timeout(Some(next - now));
            match sock.recv_from(&mut buf) {
                Ok((_, from)) if from == to => return (Some(t0.elapsed().as_secs_f64() * 1000.0), sent),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => std::thread::sleep(next.saturating_duration_since(Instant::now())),
            }
        }
    }
    (None, sent)
}

/// Milliseconds from `t0` to `t`, negative when `t` came first.
fn signed_ms(t: Instant, t0: Instant) -> f64 {
    match t.checked_duration_since(t0) {
        Some(d) => d.as_secs_f64() * 1000.0,
        None => -(t0.duration_since(t).as_secs_f64() * 1000.0),
    }
}

fn ipv4(ips: &[IpAddr], what: &str) -> Result<Ipv4Addr, String> {
    ips.iter()
        .find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
        .ok_or_else(|| format!("{what} has no IPv4 address"))
}

/// Whether the policy table in `ns` names `ip` (as a set element).
fn table_holds(ns: &str, ip: &str) -> bool {
    let table = nft(ns, "list table inet weft-policy").unwrap_or_default();
    table.contains(&format!("{ip},")) || table.contains(&format!("{ip} "))
}

/// Waits until the policy table in `ns` names `ip` (`holds`) or does not.
fn wait_table(ns: &str, ip: &str, holds: bool, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while table_holds(ns, ip) != holds {
        if Instant::now() > deadline {
            return Err(format!(
                "{ns}: the policy table {} {ip} after {limit:?}",
                if holds { "never held" } else { "still holds" }
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Counter `name` of the weftds in `namespaces`, summed, by each of `results`.
fn by_result(namespaces: &[String], name: &str, results: &[&str]) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    for ns in namespaces {
        let page = metrics_in(ns)?;
        for r in results {
            *out.entry(r.to_string()).or_default() += metric_sum(&page, name, &[&format!("result=\"{r}\"")]);
        }
    }
    Ok(out)
}

/// What each count of `after` gained since `before`.
fn gained(before: &BTreeMap<String, f64>, after: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .into_iter()
        .map(|(k, v)| {
            let was = before.get(&k).copied().unwrap_or(0.0);
            (k, v - was)
        })
        .collect()
}

/// Whether `t` adds `ip` to a set.
fn adds(t: &Transaction, ip: &str) -> bool {
    t.has(&["add element", &format!("{ip} ")]) || t.has(&["add element", &format!("{ip},")])
}

fn one_run(o: &PolicyOptions, announce: bool, tag: &str) -> Result<ReachRun, String> {
    let load_start = LoadAvg::now();
    let dir = o.work_dir.join(tag);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let weftd = if announce {
        o.weftd.clone()
    } else {
        no_announce_weftd(&dir, &o.weftd)?
    };
    let mut guard = LabGuard::up(&dir, &spec(tag), &weftd, &o.weft)?;
    let lab = &guard.lab;
    let (xa_ns, ya_ns) = (lab.pod_ns("x/a"), lab.pod_ns("y/a"));
    let xa = ipv4(&lab.pod_addresses("x/a"), "pod x/a")?;
    let ya = ipv4(&lab.pod_addresses("y/a"), "pod y/a")?;
    let (n1, n2, n3) = (lab.node_ns("n1"), lab.node_ns("n2"), lab.node_ns("n3"));
    // The lab's own pods in every table that needs them before anything is timed.
    for (ns, ip) in [(&n2, ya), (&n3, ya), (&n1, xa)] {
        wait_table(ns, &ip.to_string(), true, Duration::from_secs(60)).map_err(|e| format!("{tag}: {e}"))?;
    }
    let xa_echo = bind_in(&xa_ns, REACH_PORT)?;
    let stop = AtomicBool::new(false);
    let remote = [n2.clone(), n3.clone()];
    let result = std::thread::scope(|s| {
        s.spawn(|| echo(&xa_echo, &stop));
        let r = (|| {
            // The lab's policies and x/a's echo work before any new pod is timed.
            let check = bind_in(&ya_ns, 0)?;
            if probe(
                &check,
                SocketAddr::from((xa, REACH_PORT)),
                Instant::now(),
                REACH_PROBE_LIMIT,
            )
            .0
            .is_none()
            {
                return Err(format!(
                    "{tag}: y/a does not reach x/a's echo on UDP {REACH_PORT}: the lab is wrong"
                ));
            }
            let monitors: Vec<Monitor> = remote.iter().map(|n| Monitor::start(n)).collect::<Result<_, _>>()?;
            for m in &monitors {
                m.settle(Duration::from_millis(300), Duration::from_secs(20));
            }
            let sender = [n1.clone()];
            let sent = || by_result(&sender, "weft_policy_announce_total", &SENT_RESULTS);
            let received = || by_result(&remote, "weft_policy_announcements_total", &ANNOUNCE_RESULTS);
            // Untimed pods until n1's peers take its announcements: the steady state,
            // not a peer skipped because it was still starting.
            let warm_until = Instant::now() + WARM_LIMIT;
            let mut warm_pods = 0;
            loop {
                let before = sent()?;
                one_pod(o, &mut guard, &monitors, &xa_ns, xa, &format!("warm-{warm_pods}"))
                    .map_err(|e| format!("{tag}: {e}"))?;
                warm_pods += 1;
                let d = gained(&before, sent()?);
                let all: f64 = d.values().sum();
                if all == 0.0 || d["taken"] >= remote.len() as f64 || Instant::now() > warm_until {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let (sent_before, received_before) = (sent()?, received()?);
            let mut pods = Vec::with_capacity(o.reach_pods);
            for i in 0..o.reach_pods {
                pods.push(
                    one_pod(o, &mut guard, &monitors, &xa_ns, xa, &format!("new-{i}"))
                        .map_err(|e| format!("{tag}: {e}"))?,
                );
            }
            let sent = gained(&sent_before, sent()?);
            let received = gained(&received_before, received()?);
            Ok((pods, received, sent, warm_pods))
        })();
        stop.store(true, Ordering::Relaxed);
        r
    });
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    let (pods, announcements, sent, warm_pods) = result?;
    let ok = |f: fn(&ReachPod) -> Option<f64>| Quantiles::of(&pods.iter().filter_map(f).collect::<Vec<_>>());
    Ok(ReachRun {
        announce,
        add: Quantiles::of(&pods.iter().map(|p| p.add_ms).collect::<Vec<_>>()),
        out: ok(|p| p.out_ms),
        into: ok(|p| p.in_ms),
        out_failed: pods.iter().filter(|p| p.out_ms.is_none()).count(),
        in_failed: pods.iter().filter(|p| p.in_ms.is_none()).count(),
        remote_kernel: ok(|p| p.remote_kernel_ms),
        pods,
        announcements,
        sent,
        warm_pods,
        load: (load_start, LoadAvg::now()),
    })
}

/// New pod y/`name`: its object, its ADD, the probes and the report, then its removal.
fn one_pod(
    o: &PolicyOptions,
    guard: &mut LabGuard,
    monitors: &[Monitor],
    xa_ns: &str,
    xa: Ipv4Addr,
    name: &str,
) -> Result<ReachPod, String> {
    let name = name.to_string();
    let reference = format!("y/{name}");
    let pod = PodSpec {
        name: name.clone(),
        node: "n1".into(),
        namespace: Some("y".into()),
        labels: [("pod".to_string(), "new".to_string())].into(),
        ports: Vec::new(),
    };
    guard.lab.spec.pods.push(pod.clone());
    let lab = &guard.lab;
    let written = Instant::now();
    // Its Pod object as the API server has it once scheduled: no addresses yet.
    lab.publish_objects()
        .map_err(|e| format!("writing {reference}'s Pod: {e}"))?;
    // The sandbox's namespace and the sockets in it are ready before the ADD, so the
    // probes start the moment it answers.
    let netns = lab.netns_of(&pod);
    NamedNetns::create(&netns).map_err(|e| e.to_string())?.keep();
    let out_sock = bind_in(&netns, 0)?;
    let new_echo = bind_in(&netns, REACH_PORT)?;
    let in_sock = bind_in(xa_ns, 0)?;
    std::thread::sleep(o.reach_object_lead.saturating_sub(written.elapsed()));
    // n2's monitor (the first): where x/a's ingress must take the new pod.
    let mark = monitors[0].mark();
    let called = Instant::now();
    let ips = lab
        .attach_unreported(&reference)
        .map_err(|e| format!("ADD of {reference}: {e}"))?;
    let t0 = Instant::now();
    let add_ms = t0.duration_since(called).as_secs_f64() * 1000.0;
    let ip = ipv4(&ips, &reference)?;
    let stop = AtomicBool::new(false);
    let ((out_ms, out_sent), (in_ms, in_sent), reported) = std::thread::scope(|s| {
        s.spawn(|| echo(&new_echo, &stop));
        let out = s.spawn(|| probe(&out_sock, SocketAddr::from((xa, REACH_PORT)), t0, REACH_PROBE_LIMIT));
        let into = s.spawn(|| probe(&in_sock, SocketAddr::from((ip, REACH_PORT)), t0, REACH_PROBE_LIMIT));
        // kubelet's report, once the probes run.
        std::thread::sleep(o.reach_report_delay.saturating_sub(t0.elapsed()));
        let reported = lab
            .report_pod_ips(&pod, ips.clone())
            .map(|()| t0.elapsed().as_secs_f64() * 1000.0);
        let out = out.join().unwrap_or((None, 0));
        let into = into.join().unwrap_or((None, 0));
        stop.store(true, Ordering::Relaxed);
        (out, into, reported)
    });
    let reported_ms = reported.map_err(|e| format!("reporting {reference}'s addresses: {e}"))?;
    let ip_text = ip.to_string();
    let (txs, seen) = monitors[0].wait(mark, Duration::from_secs(5), |txs| {
        txs.iter().any(|t| adds(t, &ip_text))
    });
    let first = seen.then(|| txs.iter().find(|t| adds(t, &ip_text))).flatten();
    let remote_kernel_ms = first.map(|t| signed_ms(t.first, t0));
    let remote_by = first.map(|t| t.by.clone()).unwrap_or_default();
    // Gone from every node before the next pod, whose address may be this one.
    lab.remove_pod(&reference)
        .map_err(|e| format!("removing {reference}: {e}"))?;
    for m in monitors {
        wait_table(m.ns(), &ip_text, false, GONE_LIMIT)?;
    }
    for m in monitors {
        m.settle(Duration::from_millis(50), Duration::from_secs(5));
    }
    guard.lab.spec.pods.retain(|p| p != &pod);
    Ok(ReachPod {
        name,
        ip: ip_text,
        add_ms,
        out_ms,
        out_sent,
        in_ms,
        in_sent,
        remote_kernel_ms,
        remote_by,
        reported_ms,
    })
}

/// Runs the reachability measurement: the lab as it is, then (when asked) without
/// announcements.
pub(crate) fn run_reach(o: &PolicyOptions) -> Result<ReachReport, String> {
    let mut runs = Vec::new();
    for announce in [true, false] {
        if !announce && !o.reach_watch_only_run {
            continue;
        }
        let tag = format!("wb{}r{}", std::process::id(), u8::from(!announce));
        runs.push(one_run(o, announce, &tag)?);
    }
    Ok(ReachReport {
        pods: o.reach_pods,
        object_lead_ms: o.reach_object_lead.as_secs_f64() * 1000.0,
        report_delay_ms: o.reach_report_delay.as_secs_f64() * 1000.0,
        probe_limit_s: REACH_PROBE_LIMIT.as_secs_f64(),
        runs,
        target_ms: REACH_TARGET_MS,
    })
}

impl ReachRun {
    /// Whether both directions' p99 are under `target_ms` and no probe failed.
    pub fn met(&self, target_ms: f64) -> bool {
        self.out.n > 0
            && self.into.n > 0
            && self.out_failed == 0
            && self.in_failed == 0
            && self.out.p99 < target_ms
            && self.into.p99 < target_ms
    }

    /// How the report names the run.
    pub fn describe(&self) -> &'static str {
        if self.announce {
            "announcing (the lab as it is)"
        } else {
            "watch path only (no announcements)"
        }
    }
}

impl ReachReport {
    /// The run the target is judged on: the lab as it is (announcements).
    pub fn judged(&self) -> Option<&ReachRun> {
        self.runs.iter().find(|r| r.announce)
    }

    /// Whether the lab as it is meets the target.
    pub fn met(&self) -> bool {
        self.judged().is_some_and(|r| r.met(self.target_ms))
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Reachability of a new pod (perf-tests' network-policy-enforcement-latency): a three-node lab, x isolated for ingress allowing only y on UDP {REACH_PORT}, y isolated allowing only x, a UDP echo in x/a on n2; {} new pods y/new-i on n1 per run, one after the other: the Pod object (no addresses) written, {:.0} ms later the ADD through the plugin; from the ADD's answer one UDP socket each way sends every 1 ms until the first echo (at most {:.0} s): new pod -> x/a (n2's sets must hold the new pod) and x/a -> an echo in the new pod (n1's own table); the addresses reported into the lab {:.0} ms after the ADD's answer, once the probes run (the watch path); the pod removed and its address out of every node's sets before the next; untimed pods first until n1's peers take its announcements (at most {:.0} s)\n\n",
            self.pods,
            self.object_lead_ms,
            self.probe_limit_s,
            self.report_delay_ms,
            WARM_LIMIT.as_secs_f64(),
        );
        let mut t = Table::new()
            .text("weftds")
            .text("ADD p50 / p99 (ms)")
            .num("new pod -> x/a p50")
            .num("p95")
            .num("p99")
            .num("max")
            .num("failed")
            .num("x/a -> new pod p50")
            .num("p95")
            .num("p99")
            .num("max")
            .num("failed")
            .text("n2's kernel holds the new pod, from the ADD's answer p50 / max (ms)")
            .text("n1's announcements to its peers: taken / refused / failed / skipped")
            .text("announcements n2 and n3 received: applied / kept / known / refused")
            .num("untimed pods first")
            .text("load start / end")
            .text(format!("target p99 < {:.0} ms", self.target_ms));
        for r in &self.runs {
            let a = |k: &str| r.announcements.get(k).copied().unwrap_or(0.0);
            let sent = |k: &str| r.sent.get(k).copied().unwrap_or(0.0);
            t.row([
                r.describe().to_string(),
                format!("{:.1} / {:.1}", r.add.p50, r.add.p99),
                format!("{:.1}", r.out.p50),
                format!("{:.1}", r.out.p95),
                format!("{:.1}", r.out.p99),
                format!("{:.1}", r.out.max),
                r.out_failed.to_string(),
                format!("{:.1}", r.into.p50),
                format!("{:.1}", r.into.p95),
                format!("{:.1}", r.into.p99),
                format!("{:.1}", r.into.max),
                r.in_failed.to_string(),
                format!(
                    "{:.1} / {:.1} (n={})",
                    r.remote_kernel.p50, r.remote_kernel.max, r.remote_kernel.n
                ),
                format!(
                    "{:.0} / {:.0} / {:.0} / {:.0}",
                    sent("taken"),
                    sent("refused"),
                    sent("failed"),
                    sent("skipped")
                ),
                format!(
                    "{:.0} / {:.0} / {:.0} / {:.0}",
                    a("applied"),
                    a("kept"),
                    a("known"),
                    a("refused")
                ),
                r.warm_pods.to_string(),
                format!("{} / {}", r.load.0, r.load.1),
                if r.announce {
                    crate::exec::met(r.met(self.target_ms))
                } else {
                    "(not judged)"
                }
                .to_string(),
            ]);
        }
        out.push_str(&t.to_string());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let q = Quantiles::of(&v);
        assert_eq!((q.p50, q.p95, q.p99, q.max, q.n), (50.0, 95.0, 99.0, 100.0, 100));
        assert_eq!(Quantiles::of(&[]), Quantiles::default());
    }

    #[test]
    fn signed_ms_says_which_came_first() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        assert_eq!(signed_ms(later, t0), 5.0);
        assert_eq!(signed_ms(t0, later), -5.0);
    }

    #[test]
    fn the_watch_path_weftd_sets_its_environment_and_execs_weftd() {
        let dir = std::env::temp_dir().join(format!("weft-bench-reach-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let weftd = dir.join("it's weftd");
        std::fs::write(&weftd, "").unwrap();
        let script = std::fs::read_to_string(no_announce_weftd(&dir, &weftd).unwrap()).unwrap();
        assert!(script.contains("export WEFT_BENCH_REACH_NO_ANNOUNCE=1 WEFT_POLICY_ANNOUNCE_TIMEOUT_MS=0\n"));
        assert!(script.contains(r"it'\''s weftd' "), "{script}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
