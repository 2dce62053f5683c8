//! What the exec, memory and wire benchmarks share beyond the harness: labs removed
//! however a run ends, iperf3 runs, and small probes (reachability, `/proc`, a node's
//! metrics).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use weft_harness::{ChildGuard, NamedNetns};
use weft_lab::{DownOnDrop, Lab};

/// Starts `argv` inside namespace `ns` (through `ip netns exec`, which execs in place,
/// so the pid is the program's), stdout piped.
pub(crate) fn spawn_in(ns: &str, argv: &[&str]) -> Result<ChildGuard, String> {
    let child = NamedNetns::existing(ns)
        .command(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {} in {ns}: {e}", argv.join(" ")))?;
    Ok(ChildGuard::new(child))
}

/// Runs `ip args` and fails with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    weft_harness::ip(args).map(drop).map_err(|e| e.to_string())
}

/// Pings from `ns` until `addr` answers or `within` has passed.
pub(crate) fn wait_reachable(ns: &str, addr: &str, within: Duration) -> bool {
    NamedNetns::existing(ns).wait_reachable(addr, within)
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// This process's resident memory in KiB.
pub(crate) fn own_rss_kib() -> u64 {
    status_kib(std::process::id(), "VmRSS").unwrap_or(0)
}

/// Builds the two sides of a comparison at once (each a lab of its own, built in
/// parallel to halve the wait): `build(true)`, the side with the feature on, and
/// `build(false)`; fails with `what` and the first error.
pub(crate) fn build_pair<S: Send>(
    what: &str,
    build: impl Fn(bool) -> Result<S, String> + Sync,
) -> Result<(S, S), String> {
    let build = &build;
    let (a, b) = std::thread::scope(|s| {
        let (a, b) = (s.spawn(move || build(true)), s.spawn(move || build(false)));
        (
            a.join().unwrap_or_else(|_| Err("building a lab panicked".into())),
            b.join().unwrap_or_else(|_| Err("building a lab panicked".into())),
        )
    });
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(e), _) | (_, Err(e)) => Err(format!("{what}: {e}")),
    }
}

/// The name of one side of a comparison (its lab and work directory): `base` and `on`
/// or `of`.
pub(crate) fn side_name(base: &str, on: bool) -> String {
    format!("{base}{}", if on { "on" } else { "of" })
}

/// The order the two sides of a comparison run in, round by round: they take turns
/// going first, so neither always meets a machine the other has just warmed or loaded.
pub(crate) fn turns(round: usize) -> [usize; 2] {
    if round.is_multiple_of(2) { [0, 1] } else { [1, 0] }
}

/// Whether a process in some namespace listens on TCP `port`: its own view of the
/// namespace's sockets (`/proc/<pid>/net/tcp*`) shows it in state LISTEN.
pub(crate) fn listening(pid: u32, port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
            })
        })
    })
}

pub(crate) use weft_harness::metrics::{metric_sum, page_in as metrics_in};

/// A lab built from a file this run writes, taken down (pods, daemons, namespaces,
/// state) on drop whatever happened in between.
pub(crate) struct LabGuard {
    /// The lab as last loaded (taken down when the guard drops).
    pub(crate) lab: DownOnDrop,
    file: PathBuf,
    weftd: PathBuf,
    weft: PathBuf,
    state: PathBuf,
}

impl LabGuard {
    /// Writes `spec` (a lab file as JSON, which is YAML) under `dir`, loads it with the
    /// given binaries, and builds it.
    pub(crate) fn up(dir: &Path, spec: &serde_json::Value, weftd: &Path, weft: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let file = dir.join("lab.yaml");
        let state = dir.join("state");
        let lab = Self::load(&file, spec, weftd, weft, &state)?;
        let guard = Self {
            lab: DownOnDrop(lab),
            file,
            weftd: weftd.to_path_buf(),
            weft: weft.to_path_buf(),
            state,
        };
        guard.lab.up().map_err(|e| format!("lab up: {e}"))?;
        Ok(guard)
    }

    fn load(file: &Path, spec: &serde_json::Value, weftd: &Path, weft: &Path, state: &Path) -> Result<Lab, String> {
        std::fs::write(file, serde_json::to_vec_pretty(spec).expect("spec serializes"))
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
        Ok(Lab::load(file)
            .map_err(|e| e.to_string())?
            .with_binaries(weftd.to_path_buf(), weft.to_path_buf())
            .with_state_dir(state.to_path_buf()))
    }

    /// Rewrites the lab file as `spec` (same name) and brings the lab up to it: new
    /// pods are attached, changed topologies reach the daemons.
    pub(crate) fn update(&mut self, spec: &serde_json::Value) -> Result<(), String> {
        // In place: replacing the guard would take the running lab down.
        self.lab.0 = Self::load(&self.file, spec, &self.weftd, &self.weft, &self.state)?;
        self.lab.up().map_err(|e| format!("lab up: {e}"))?;
        Ok(())
    }
}

/// A meshnet Topology object for `pod` with `links`, in the namespace the lab gives
/// pods that were attached before any Topology named them ("default").
pub(crate) fn topology(pod: &str, links: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "networkop.co.uk/v1beta1", "kind": "Topology",
        "metadata": {"name": pod, "namespace": "default"},
        "spec": {"links": links},
    })
}

/// One end of a point-to-point link: `uid`, this end's and the peer's interface and
/// /30 address, and how it is carried across nodes (`None`: veth on one node).
pub(crate) struct End<'a> {
    pub(crate) uid: u64,
    pub(crate) peer_pod: &'a str,
    pub(crate) local: (&'a str, &'a str),
    pub(crate) peer: (&'a str, &'a str),
    pub(crate) kind: Option<&'a str>,
}

impl End<'_> {
    /// The link as it appears in the Topology's `spec.links`.
    pub(crate) fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "uid": self.uid, "peer_pod": self.peer_pod,
            "local_intf": self.local.0, "local_ip": format!("{}/30", self.local.1),
            "peer_intf": self.peer.0, "peer_ip": format!("{}/30", self.peer.1),
        });
        if let Some(k) = self.kind {
            v["kind"] = k.into();
        }
        v
    }
}

/// One iperf3 TCP run (one stream), as the receiver saw it.
pub(crate) struct Tcp {
    /// Throughput at the receiver, Gbit/s.
    pub gbps: f64,
    /// Retransmissions of the sender.
    pub retransmits: u64,
    /// CPU the sending host used, percent.
    pub sender_cpu: f64,
    /// CPU the receiving host used, percent.
    pub receiver_cpu: f64,
}

/// The port iperf3 listens on in the server's namespace.
const IPERF_PORT: u16 = 5201;

/// Runs iperf3 for `seconds` from namespace `client` to `dst` in namespace `server`.
pub(crate) fn iperf_tcp(client: &str, server: &str, dst: std::net::Ipv4Addr, seconds: u64) -> Result<Tcp, String> {
    let dst = dst.to_string();
    let port = IPERF_PORT.to_string();
    let srv = spawn_in(server, &["iperf3", "-s", "-1", "-J", "-B", &dst, "-p", &port])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !listening(srv.pid(), IPERF_PORT) {
        if std::time::Instant::now() > deadline {
            return Err(format!("iperf3 -s in {server} did not listen"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = seconds.to_string();
    let cli = spawn_in(
        client,
        &[
            "iperf3",
            "-c",
            &dst,
            "-p",
            &port,
            "-t",
            &secs,
            "-J",
            "--connect-timeout",
            "3000",
        ],
    )?;
    let out = cli
        .output_within(Duration::from_secs(seconds + 20))
        .map_err(|e| format!("iperf3 from {client}: {e}"))?;
    let _ = srv.output_within(Duration::from_secs(5));
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| format!("iperf3 output from {client}: {e}"))?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("iperf3 from {client}: {e}"));
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| format!("iperf3 from {client} reported no throughput"))?;
    let cpu = &v["end"]["cpu_utilization_percent"];
    Ok(Tcp {
        gbps: bps / 1e9,
        retransmits: v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        sender_cpu: cpu["host_total"].as_f64().unwrap_or(0.0),
        receiver_cpu: cpu["remote_total"].as_f64().unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_matching_series() {
        let page = "# TYPE weft_wire_up gauge\n\
                    weft_wire_up{pod=\"a\",kind=\"grpc\"} 1\n\
                    weft_wire_up{pod=\"b\",kind=\"grpc\"} 0\n\
                    weft_wire_up{pod=\"c\",kind=\"veth\"} 1\n\
                    weft_wire_up_other{kind=\"grpc\"} 5\n";
        assert_eq!(metric_sum(page, "weft_wire_up", &["kind=\"grpc\""]), 1.0);
        assert_eq!(metric_sum(page, "weft_wire_up", &[]), 2.0);
    }
}
