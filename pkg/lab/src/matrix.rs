//! Which pods reach which (`weftctl lab matrix`): the truth tables of the upstream
//! network policy tests, measured. For each port, every pod gets a short-lived
//! listener (an echo server for UDP) made in its network namespace by this process,
//! every ordered pair of pods is probed from inside the source's namespace, and each
//! cell says `.` (reachable), `X` (blocked) or `?` (the probe failed for another
//! reason, which is an error, never "blocked").
//!
//! Blocked is what policy looks like from a pod: weft drops a denied packet, so a TCP
//! SYN goes unanswered (a refused connection means nothing listened, an error) and a
//! UDP datagram gets no echo. Probes of a source run at once from one thread in its
//! namespace, a bounded number of sources at a time, so a table takes about one probe
//! timeout however many pods there are.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockProtocol, SockType};
use serde_json::{Value, json};
use weft_harness::NamedNetns;

use crate::LabError;
use crate::cluster::Lab;

mod probe;
use probe::{Listener, PROBE_PORTS, Probe, StopOnDrop, new_socket, open_listeners, run_probes, serve};

mod expected;
pub use expected::{ExpectedTable, parse_tables};

/// How many source pods are probed from at the same time (a thread each).
pub const PARALLEL_SOURCES: usize = 32;

/// A transport protocol of a probed port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP: reachable when the connection is accepted.
    Tcp,
    /// UDP: reachable when the datagram is echoed.
    Udp,
    /// SCTP: as TCP (when the kernel has it).
    Sctp,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    fn socket(self) -> (SockType, Option<SockProtocol>) {
        match self {
            Protocol::Tcp => (SockType::Stream, None),
            Protocol::Udp => (SockType::Datagram, None),
            Protocol::Sctp => (SockType::Stream, Some(SockProtocol::Sctp)),
        }
    }
}

/// A port to probe: `80/tcp`, `53/udp`, `9/sctp` (`80` alone is TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Port {
    /// The port number.
    pub number: u16,
    /// Its protocol.
    pub protocol: Protocol,
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.number, self.protocol.as_str())
    }
}

impl FromStr for Port {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (n, proto) = s.split_once('/').unwrap_or((s, "tcp"));
        let number: u16 = n
            .parse()
            .ok()
            .filter(|&n| n != 0)
            .ok_or_else(|| format!("{s:?}: the port is 1 to 65535"))?;
        let protocol = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            _ => return Err(format!("{s:?}: the protocol is tcp, udp or sctp")),
        };
        Ok(Port { number, protocol })
    }
}

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    fn of(a: &IpAddr) -> Family {
        if a.is_ipv6() { Family::V6 } else { Family::V4 }
    }

    fn address_family(self) -> AddressFamily {
        match self {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

impl FromStr for Family {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "4" | "ipv4" | "v4" => Ok(Family::V4),
            "6" | "ipv6" | "v6" => Ok(Family::V6),
            _ => Err(format!("{s:?}: the family is 4 (IPv4) or 6 (IPv6)")),
        }
    }
}

/// What `lab matrix` measures.
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    /// The ports, a table each (per family).
    pub ports: Vec<Port>,
    /// The families; empty is every family the lab has.
    pub families: Vec<Family>,
    /// How long a probe may take before its pair counts as blocked.
    pub timeout: Duration,
}

/// One cell of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// The destination answered.
    Reachable,
    /// Nothing came back within the timeout: policy dropped it.
    Blocked,
    /// The probe failed otherwise (refused: no listener; unreachable; no address).
    Error(String),
}

impl Cell {
    /// `.`, `X` or `?`.
    pub fn symbol(&self) -> char {
        match self {
            Cell::Reachable => '.',
            Cell::Blocked => 'X',
            Cell::Error(_) => '?',
        }
    }
}

/// The truth table of one port and family.
#[derive(Debug, Clone)]
pub struct Table {
    /// The port.
    pub port: Port,
    /// The family.
    pub family: Family,
    /// The pods as `ns/name`, sorted by namespace then name: the rows (sources) and
    /// the columns (destinations).
    pub pods: Vec<String>,
    /// `cells[from][to]`.
    pub cells: Vec<Vec<Cell>>,
}

impl Table {
    /// `80/tcp IPv4`: the line above the table, and how an expectation names it.
    pub fn title(&self) -> String {
        format!("{} {}", self.port, self.family)
    }
}

/// What `lab matrix` measured.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// A table per port and family, ports in the order given, IPv4 first.
    pub tables: Vec<Table>,
    /// How long it took, listeners included.
    pub elapsed: Duration,
}

/// Pads `cells` (the first is the row's header) into columns of `width`.
fn row_text(cells: impl IntoIterator<Item = String>, width: usize) -> String {
    let line: Vec<String> = cells.into_iter().map(|c| format!("{c:<width$}")).collect();
    line.join(" ").trim_end().to_string()
}

impl Matrix {
    /// The tables as text: per table its title (`80/tcp IPv4`), a header row (`-`,
    /// then the destinations) and a row per source; tables apart by a blank line. The
    /// format `--expect` reads.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (i, t) in self.tables.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let width = t.pods.iter().map(String::len).max().unwrap_or(1).max(1);
            out.push_str(&t.title());
            out.push('\n');
            out.push_str(&row_text(
                std::iter::once("-".to_string()).chain(t.pods.iter().cloned()),
                width,
            ));
            out.push('\n');
            for (from, row) in t.pods.iter().zip(&t.cells) {
                let cells = row.iter().map(|c| c.symbol().to_string());
                out.push_str(&row_text(std::iter::once(from.clone()).chain(cells), width));
                out.push('\n');
            }
        }
        out
    }

    /// Every failed probe: `80/tcp IPv4 x/a -> y/b: why`.
    pub fn errors(&self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.tables {
            for (i, row) in t.cells.iter().enumerate() {
                for (j, c) in row.iter().enumerate() {
                    if let Cell::Error(e) = c {
                        out.push(format!("{} {} -> {}: {e}", t.title(), t.pods[i], t.pods[j]));
                    }
                }
            }
        }
        out
    }

    /// The tables as JSON: per table the port, the family, the pods, and `reachable`
    /// (rows by source: `true`, `false`, or `null` where the probe failed), with the
    /// failures in `errors`.
    pub fn to_json(&self) -> Value {
        let tables: Vec<Value> = self
            .tables
            .iter()
            .map(|t| {
                let reachable: Vec<Vec<Value>> = t
                    .cells
                    .iter()
                    .map(|row| {
                        row.iter()
                            .map(|c| match c {
                                Cell::Reachable => Value::Bool(true),
                                Cell::Blocked => Value::Bool(false),
                                Cell::Error(_) => Value::Null,
                            })
                            .collect()
                    })
                    .collect();
                let errors: Vec<Value> = t
                    .cells
                    .iter()
                    .enumerate()
                    .flat_map(|(i, row)| row.iter().enumerate().map(move |(j, c)| (i, j, c)))
                    .filter_map(|(i, j, c)| match c {
                        Cell::Error(e) => Some(json!({"from": t.pods[i], "to": t.pods[j], "error": e})),
                        _ => None,
                    })
                    .collect();
                json!({
                    "port": t.port.number,
                    "protocol": t.port.protocol.as_str(),
                    "family": t.family.to_string(),
                    "pods": t.pods,
                    "reachable": reachable,
                    "errors": errors,
                })
            })
            .collect();
        json!({"tables": tables, "elapsed_ms": self.elapsed.as_millis() as u64})
    }

    /// How these tables differ from `expected` (read by [`parse_tables`]): one line
    /// per differing cell (`80/tcp IPv4 x/a -> y/b: expected X, got .`), per table one
    /// side lacks, and per pod one side lacks; empty when they agree.
    pub fn differences(&self, expected: &[ExpectedTable]) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.tables {
            let title = t.title();
            let Some(e) = expected.iter().find(|e| e.title == title) else {
                out.push(format!("{title}: measured, but not in the expectation"));
                continue;
            };
            for p in e.rows.iter().chain(&e.columns) {
                if !t.pods.contains(p) && !out.contains(&format!("{title}: pod {p} is expected but not in the lab")) {
                    out.push(format!("{title}: pod {p} is expected but not in the lab"));
                }
            }
            for (i, from) in t.pods.iter().enumerate() {
                for (j, to) in t.pods.iter().enumerate() {
                    let got = t.cells[i][j].symbol();
                    match e.cells.get(&(from.clone(), to.clone())) {
                        None => out.push(format!("{title} {from} -> {to}: not in the expectation, got {got}")),
                        Some(&want) if want != got => {
                            out.push(format!("{title} {from} -> {to}: expected {want}, got {got}"))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        for e in expected {
            if !self.tables.iter().any(|t| t.title() == e.title) {
                out.push(format!(
                    "{}: expected, but not measured (no --port or family for it)",
                    e.title
                ));
            }
        }
        out
    }
}

/// Whether this kernel makes SCTP sockets (in namespace `ns`).
fn sctp_supported(ns: &str) -> Result<bool, LabError> {
    NamedNetns::existing(ns).within(|| match new_socket(Protocol::Sctp, Family::V4) {
        Ok(_) => true,
        Err(Errno::EPROTONOSUPPORT | Errno::ESOCKTNOSUPPORT | Errno::EAFNOSUPPORT) => false,
        Err(_) => true,
    })
}

/// Raises this process's open-file limit as far as it may go (a big matrix holds a
/// socket per pair being probed) and returns it.
fn open_files_limit() -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() => hard as usize,
        Ok((soft, _)) => soft as usize,
        Err(_) => 1024,
    }
}

impl Lab {
    /// Measures which pods reach which on each of `opts.ports` (see the module doc).
    /// Every pod must be attached. The listeners are bound before the first probe and
    /// closed before this returns, whatever happens.
    pub fn matrix(&self, opts: &MatrixOptions) -> Result<Matrix, LabError> {
        let started = Instant::now();
        let bad = |detail: String| LabError::Command {
            what: format!("lab matrix {}", self.spec.name),
            detail,
        };
        if opts.ports.is_empty() {
            return Err(bad("no port to probe (--port 80/tcp)".into()));
        }
        let mut families = opts.families.clone();
        if families.is_empty() {
            families.push(Family::V4);
            if self.spec.ipv6 {
                families.push(Family::V6);
            }
        }
        families.sort();
        families.dedup();
        if families.contains(&Family::V6) && !self.spec.ipv6 {
            return Err(bad("the lab has no IPv6 (`ipv6: true` in its file)".into()));
        }
        let mut ports = opts.ports.clone();
        ports.dedup();
        // Rows and columns: namespaces, then pods, by name.
        let mut sorted: Vec<(String, &str, String)> = self
            .spec
            .pods
            .iter()
            .map(|p| (self.namespace_of(p), p.name.as_str(), self.netns_of(p)))
            .collect();
        sorted.sort();
        let pods: Vec<(String, String)> = sorted
            .into_iter()
            .map(|(ns, name, netns)| (format!("{ns}/{name}"), netns))
            .collect();
        if pods.is_empty() {
            return Err(bad("the lab has no pods".into()));
        }
        for (pod, ns) in &pods {
            if !NamedNetns::exists(ns) {
                return Err(bad(format!("pod {pod} is not attached (run `weftctl lab up`)")));
            }
        }
        if ports.iter().any(|p| p.protocol == Protocol::Sctp) && !sctp_supported(&pods[0].1)? {
            return Err(bad(
                "this kernel has no SCTP (socket: protocol not supported; `modprobe sctp` where modules can be loaded): probe TCP or UDP ports instead".into(),
            ));
        }
        let addresses: Vec<Vec<IpAddr>> = pods.iter().map(|(_, ns)| crate::cluster::netns_addresses(ns)).collect();
        // (port, family) of each table.
        let tables: Vec<(Port, Family)> = ports
            .iter()
            .flat_map(|&p| families.iter().map(move |&f| (p, f)))
            .collect();
        // A source holds a socket per probe, two where a connection is retried: as
        // many sources at a time as the descriptors allow beside the listeners.
        let per_source = 2 * tables.len() * pods.len();
        let spare = open_files_limit().saturating_sub(tables.len() * pods.len() + 256);
        let workers = (spare / per_source).clamp(1, PARALLEL_SOURCES).min(pods.len());
        // UDP probes bind their source port from a block that moves on every run, so
        // a probe never reuses the 5-tuple of one a few seconds before: conntrack
        // would still hold that flow (30 s) and pass it as established whatever the
        // policy says now. Each source's n-th UDP probe gets the block's n-th port.
        let udp_per_source = tables.iter().filter(|(p, _)| p.protocol == Protocol::Udp).count() * pods.len();
        let span = (PROBE_PORTS.end - PROBE_PORTS.start) as usize;
        let udp_base = if udp_per_source == 0 || udp_per_source > span {
            None
        } else {
            self.with_live(|live| {
                let mut at = live.probe_ports as usize;
                if at + udp_per_source > span {
                    at = 0;
                }
                live.probe_ports = (at + udp_per_source) as u32;
                Ok(PROBE_PORTS.start as usize + at)
            })
            .ok()
        };

        // Every listener of every pod, opened a bounded number of pods at a time.
        let listeners: Mutex<Vec<Listener>> = Mutex::new(Vec::new());
        let failure: Mutex<Option<String>> = Mutex::new(None);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    while let Some((pod, ns)) = pods.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let opened = NamedNetns::existing(ns)
                            .within(|| open_listeners(&ports, &families))
                            .map_err(|e| e.to_string())
                            .and_then(|r| r);
                        match opened {
                            Ok(l) => listeners.lock().expect("not poisoned").extend(l),
                            Err(e) => {
                                failure
                                    .lock()
                                    .expect("not poisoned")
                                    .get_or_insert(format!("listening in {pod}: {e}"));
                            }
                        }
                    }
                });
            }
        });
        let listeners = listeners.into_inner().expect("not poisoned");
        if let Some(e) = failure.into_inner().expect("not poisoned") {
            // The listeners opened so far close as they drop.
            return Err(bad(e));
        }

        let mut cells: Vec<Vec<Vec<Option<Cell>>>> = vec![vec![vec![None; pods.len()]; pods.len()]; tables.len()];
        let results: Mutex<Vec<(usize, usize, usize, Cell)>> = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&stop);
            s.spawn(|| serve(&listeners, &stop));
            std::thread::scope(|probers| {
                for _ in 0..workers {
                    probers.spawn(|| {
                        loop {
                            let from = next.fetch_add(1, Ordering::Relaxed);
                            let Some((_, ns)) = pods.get(from) else { break };
                            let mut probes = Vec::new();
                            let mut unprobed = Vec::new();
                            let mut udp_index = 0;
                            for (t, &(port, family)) in tables.iter().enumerate() {
                                for (to, addrs) in addresses.iter().enumerate() {
                                    let Some(a) = addrs.iter().find(|a| Family::of(a) == family) else {
                                        unprobed.push((
                                            t,
                                            to,
                                            Cell::Error(format!("{} has no {family} address", pods[to].0)),
                                        ));
                                        continue;
                                    };
                                    let source_port = match (port.protocol, udp_base) {
                                        (Protocol::Udp, Some(base)) => {
                                            udp_index += 1;
                                            (base + udp_index - 1) as u16
                                        }
                                        _ => 0,
                                    };
                                    probes.push(Probe {
                                        at: (t, to),
                                        to: SocketAddr::new(*a, port.number),
                                        protocol: port.protocol,
                                        source_port,
                                        sockets: Vec::new(),
                                        last_send: Instant::now(),
                                        result: None,
                                    });
                                }
                            }
                            let ran = NamedNetns::existing(ns).within(|| {
                                run_probes(&mut probes, opts.timeout);
                                probes
                            });
                            let mut out = results.lock().expect("not poisoned");
                            match ran {
                                Ok(done) => out.extend(
                                    done.into_iter()
                                        .map(|p| (p.at.0, from, p.at.1, p.result.unwrap_or(Cell::Blocked))),
                                ),
                                Err(e) => {
                                    for (t, to) in tables
                                        .iter()
                                        .enumerate()
                                        .flat_map(|(t, _)| (0..pods.len()).map(move |to| (t, to)))
                                    {
                                        out.push((t, from, to, Cell::Error(format!("entering the pod: {e}"))));
                                    }
                                }
                            }
                            out.extend(unprobed.into_iter().map(|(t, to, c)| (t, from, to, c)));
                        }
                    });
                }
            });
        });
        drop(listeners);
        for (t, from, to, c) in results.into_inner().expect("not poisoned") {
            cells[t][from][to].get_or_insert(c);
        }
        let names: Vec<String> = pods.iter().map(|(p, _)| p.clone()).collect();
        Ok(Matrix {
            tables: tables
                .iter()
                .zip(cells)
                .map(|(&(port, family), rows)| Table {
                    port,
                    family,
                    pods: names.clone(),
                    cells: rows
                        .into_iter()
                        .map(|r| r.into_iter().map(|c| c.unwrap_or(Cell::Blocked)).collect())
                        .collect(),
                })
                .collect(),
            elapsed: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests;
