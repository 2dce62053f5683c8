//! Following one probe through a node's netfilter, as the kernel itself tells it: a
//! marking table of its own (`meta nftrace set 1`, hooked on prerouting before
//! conntrack) and `nft monitor trace` read while it is armed, then the route the node
//! took for the probe; and the probe itself, sent from inside a pod's namespace.
//!
//! The marking table hooks prerouting at priority -350, so a packet is traced on every
//! node where it enters, from its pod's veth or from the underlay (decapsulated first
//! when it came over VXLAN), whatever weft's own tables then do. It is removed when the
//! watch ends, even on failure or a panic.
//!
//! `nft` (package nftables) is run rather than the trace messages read from
//! nfnetlink: its monitor already prints each rule as it is written, which is what a
//! person reads, and weft's image carries it for the tables anyway.

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{KernelError, NetNs, Netlink, in_netns};

/// What a probe is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A TCP SYN to the port (a connection attempt).
    Tcp(u16),
    /// A UDP datagram to the port.
    Udp(u16),
    /// An ICMP (or ICMPv6) echo request.
    Icmp,
}

impl Probe {
    /// Reads `PORT/tcp`, `PORT/udp`, `PORT` (TCP) or `icmp`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        if s == "icmp" || s == "icmpv6" {
            return Ok(Probe::Icmp);
        }
        let (port, proto) = s.split_once('/').unwrap_or((&s, "tcp"));
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{s:?}: PORT/tcp, PORT/udp or icmp (a port of 1-65535)"))?;
        match proto {
            "tcp" => Ok(Probe::Tcp(port)),
            "udp" => Ok(Probe::Udp(port)),
            other => Err(format!("{other:?}: tcp, udp or icmp")),
        }
    }

    /// The nft match of the probe's transport.
    fn nft_match(self, v6: bool) -> String {
        match self {
            Probe::Tcp(p) => format!("tcp dport {p}"),
            Probe::Udp(p) => format!("udp dport {p}"),
            Probe::Icmp if v6 => "meta l4proto ipv6-icmp".into(),
            Probe::Icmp => "meta l4proto icmp".into(),
        }
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Tcp(p) => write!(f, "{p}/tcp"),
            Probe::Udp(p) => write!(f, "{p}/udp"),
            Probe::Icmp => f.write_str("icmp"),
        }
    }
}

/// One line of the kernel's trace in which a rule or a chain's end gave a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// `inet weft-policy`.
    pub table: String,
    /// The chain.
    pub chain: String,
    /// The rule as nft prints it (empty for a chain's policy or end).
    pub rule: String,
    /// `accept`, `drop`, `continue`, `jump CHAIN`, `return`...
    pub verdict: String,
}

/// What one node did with the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The interface it came in on.
    pub iif: String,
    /// The interface it left by, when the trace says.
    pub oif: String,
    /// Where the node's routes send it (as `ip route get` would say), if it was routed.
    pub route: String,
    /// The rules and chain ends it went through, in order (the marking table's left
    /// out).
    pub steps: Vec<Step>,
    /// The index in `steps` of the one that dropped it, if one did.
    pub dropped_at: Option<usize>,
}

/// One `nft monitor trace` line: its id, table (`family name`), chain, and the rest.
fn split_line(line: &str) -> Option<(&str, String, &str, &str)> {
    let rest = line.strip_prefix("trace id ")?;
    let mut it = rest.splitn(5, ' ');
    let id = it.next()?;
    let family = it.next()?;
    let table = it.next()?;
    let chain = it.next()?;
    let tail = it.next().unwrap_or("");
    Some((id, format!("{family} {table}"), chain, tail))
}

fn quoted_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.find(key)? + key.len();
    let rest = text[at..].strip_prefix('"')?;
    rest.split('"').next()
}

/// Reads one node's `nft monitor trace` output: the first packet traced (by trace id),
/// its interfaces and its steps, leaving out `own_table`'s (the marking table). `None`
/// when nothing was traced: the probe did not cross the node.
pub fn parse_hop(text: &str, own_table: &str) -> Option<Hop> {
    let mut first: Option<&str> = None;
    let mut hop = Hop {
        iif: String::new(),
        oif: String::new(),
        route: String::new(),
        steps: Vec::new(),
        dropped_at: None,
    };
    for line in text.lines() {
        let Some((id, table, chain, tail)) = split_line(line.trim()) else {
            continue;
        };
        match first {
            None => first = Some(id),
            Some(f) if f != id => continue,
            Some(_) => {}
        }
        if let Some(packet) = tail.strip_prefix("packet: ") {
            if hop.iif.is_empty() {
                hop.iif = quoted_after(packet, "iif ").unwrap_or_default().to_string();
            }
            if hop.oif.is_empty() {
                hop.oif = quoted_after(packet, "oif ").unwrap_or_default().to_string();
            }
            continue;
        }
        if table == own_table {
            continue;
        }
        let step = if let Some(rule) = tail.strip_prefix("rule ") {
            // `RULE (verdict VERDICT)`
            let (rule, verdict) = match rule.rfind(" (verdict ") {
                Some(i) => (&rule[..i], rule[i + 10..].trim_end_matches(')')),
                None => (rule, ""),
            };
            Step {
                table,
                chain: chain.to_string(),
                rule: rule.to_string(),
                verdict: verdict.to_string(),
            }
        } else if let Some(v) = tail.strip_prefix("verdict ").or_else(|| tail.strip_prefix("policy ")) {
            Step {
                table,
                chain: chain.to_string(),
                rule: String::new(),
                verdict: v.to_string(),
            }
        } else {
            continue;
        };
        if step.verdict == "drop" && hop.dropped_at.is_none() {
            hop.dropped_at = Some(hop.steps.len());
        }
        hop.steps.push(step);
    }
    first.map(|_| hop)
}

/// The marking table's script: packets from `src` to `dst` matching `probe` are traced.
fn marking_script(table: &str, src: IpAddr, dst: IpAddr, probe: Probe) -> String {
    let family = if dst.is_ipv6() { "ip6" } else { "ip" };
    format!(
        "table inet {table} {{\n  chain pre {{\n    type filter hook prerouting priority -350;\n    \
         {family} saddr {src} {family} daddr {dst} {} meta nftrace set 1\n  }}\n}}\n",
        probe.nft_match(dst.is_ipv6())
    )
}

/// A trace armed in the calling thread's network namespace: the monitor listening, the
/// marking table in place. [`Watch::finish`] reads what it saw; dropping it unarmed
/// removes the table too.
pub struct Watch {
    table: String,
    monitor: Child,
    reader: Option<std::thread::JoinHandle<()>>,
    lines: Arc<Mutex<String>>,
    src: IpAddr,
    dst: IpAddr,
}

impl Watch {
    /// Arms a trace of `probe` from `src` to `dst`; `table` names the marking table
    /// (`weft-trace-…`, one per trace so that two never meet).
    pub fn start(table: &str, src: IpAddr, dst: IpAddr, probe: Probe) -> Result<Watch, KernelError> {
        if src.is_ipv6() != dst.is_ipv6() {
            return Err(KernelError::os(
                "arming a trace",
                std::io::Error::other(format!("{src} and {dst} are of different families")),
            ));
        }
        // The monitor first: nothing traced before it listens.
        let mut monitor = Command::new("nft")
            .args(["monitor", "trace"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| KernelError::os("running nft monitor trace (package nftables)", e))?;
        let out = monitor.stdout.take().expect("piped");
        let lines = Arc::new(Mutex::new(String::new()));
        let sink = lines.clone();
        let reader = std::thread::Builder::new()
            .name("weft-trace".into())
            .spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut s = sink.lock().expect("trace lines");
                    s.push_str(&line);
                    s.push('\n');
                }
            })
            .map_err(|e| KernelError::os("spawning the trace reader", e))?;
        let w = Watch {
            table: table.to_string(),
            monitor,
            reader: Some(reader),
            lines,
            src,
            dst,
        };
        crate::nft::run(&["-f", "-"], Some(&marking_script(table, src, dst, probe)))
            .map_err(|e| KernelError::os("adding the trace's marking table", std::io::Error::other(e)))?;
        // `nft monitor` says nothing once it listens: it is given a moment, after the
        // table (whose write it does not trace) so both waits are one.
        std::thread::sleep(Duration::from_millis(300));
        w.lines.lock().expect("trace lines").clear();
        Ok(w)
    }

    /// Whether the probe has been seen here yet.
    pub fn seen(&self) -> bool {
        !self.lines.lock().expect("trace lines").is_empty()
    }

    /// Waits up to `for_at_most` for the probe to be seen; whether it was.
    pub fn wait_seen(&self, for_at_most: Duration) -> bool {
        let deadline = Instant::now() + for_at_most;
        while !self.seen() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Disarms and reads the trace: what this node did with the first packet traced,
    /// and its route; `None` if the probe never crossed this node.
    pub fn finish(mut self) -> Option<Hop> {
        self.disarm();
        let text = self.lines.lock().expect("trace lines").clone();
        let mut hop = parse_hop(&text, &format!("inet {}", self.table))?;
        hop.route = route(self.src, self.dst, &hop.iif);
        Some(hop)
    }

    fn disarm(&mut self) {
        let _ = crate::nft::run(&["delete", "table", "inet", &self.table], None);
        let _ = self.monitor.kill();
        let _ = self.monitor.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.reader.is_some() {
            self.disarm();
        }
    }
}

/// Where this namespace's routes send a packet from `src` to `dst` that came in on
/// `iif` (none: sent by the node itself), written as `ip route get` writes it.
pub fn route(src: IpAddr, dst: IpAddr, iif: &str) -> String {
    let answer = (|| -> std::io::Result<String> {
        let mut nl = Netlink::new()?;
        let iif_index = match iif {
            "" => None,
            name => nl.link_by_name(name)?.map(|l| l.index),
        };
        let Some(r) = nl.route_get_from(dst, Some(src), iif_index)? else {
            return Ok(format!("{dst} unreachable"));
        };
        if r.local {
            return Ok(format!("local {dst}"));
        }
        let dev = match r.oif {
            Some(i) => nl
                .links()?
                .into_iter()
                .find(|l| l.index == i)
                .map_or_else(|| format!("if{i}"), |l| l.name),
            None => "?".into(),
        };
        Ok(match r.gateway {
            Some(g) => format!("{dst} via {g} dev {dev}"),
            None => format!("{dst} dev {dev}"),
        })
    })();
    answer.unwrap_or_else(|e| format!("no route: {e}"))
}

/// How long a TCP or ICMP probe waits for its answer.
pub const PROBE_WAIT: Duration = Duration::from_secs(2);

/// Sends `probe` to `dst` from inside `ns` (a pod's namespace): whether it was
/// answered (a TCP connection made, a ping answered), or `None` for a UDP datagram,
/// which is never known to arrive.
pub fn send_probe(ns: &NetNs, dst: IpAddr, probe: Probe) -> Result<Option<bool>, KernelError> {
    in_netns(ns, || {
        let os = |what: &str, e: std::io::Error| KernelError::os(format!("sending the probe ({what})"), e);
        match probe {
            Probe::Tcp(p) => Ok(Some(
                TcpStream::connect_timeout(&SocketAddr::new(dst, p), PROBE_WAIT).is_ok(),
            )),
            Probe::Udp(p) => {
                let any: IpAddr = if dst.is_ipv6() {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                };
                let s = UdpSocket::bind(SocketAddr::new(any, 0)).map_err(|e| os("udp", e))?;
                s.send_to(b"weft-trace\n", SocketAddr::new(dst, p))
                    .map_err(|e| os("udp", e))?;
                Ok(None)
            }
            Probe::Icmp => ping(dst).map(Some).map_err(|e| os("icmp", e)),
        }
    })
}

/// The internet checksum of `data` (RFC 1071), for an ICMPv4 echo (the kernel computes
/// ICMPv6's itself).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// One echo request to `dst` on a raw socket; whether its reply came within
/// [`PROBE_WAIT`].
fn ping(dst: IpAddr) -> std::io::Result<bool> {
    use socket2::{Domain, Protocol, Socket, Type};
    let v6 = dst.is_ipv6();
    let (domain, proto, request, reply) = if v6 {
        (Domain::IPV6, Protocol::ICMPV6, 128u8, 129u8)
    } else {
        (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8)
    };
    let sock = Socket::new(domain, Type::RAW, Some(proto))?;
    let id = (std::process::id() as u16) ^ 0x7765;
    let mut msg = vec![request, 0, 0, 0];
    msg.extend_from_slice(&id.to_be_bytes());
    msg.extend_from_slice(&1u16.to_be_bytes());
    msg.extend_from_slice(b"weft-trace");
    if !v6 {
        let c = checksum(&msg);
        msg[2..4].copy_from_slice(&c.to_be_bytes());
    }
    sock.send_to(&msg, &SocketAddr::new(dst, 0).into())?;
    let deadline = Instant::now() + PROBE_WAIT;
    let mut buf = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        sock.set_read_timeout(Some(left))?;
        let n = match (&sock).read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        // An IPv4 raw socket reads the IP header too (its source checked here); an
        // IPv6 one does not, and the echo's id tells ours.
        let icmp = match dst {
            IpAddr::V6(_) => &buf[..n],
            IpAddr::V4(d) => {
                let ihl = usize::from(buf[0] & 0x0f) * 4;
                if n < 20 || buf[12..16] != d.octets() {
                    continue;
                }
                match buf.get(ihl..n) {
                    Some(b) => b,
                    None => continue,
                }
            }
        };
        if icmp.len() >= 8 && icmp[0] == reply && icmp[4..6] == id.to_be_bytes() {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DROPPED: &str = r#"trace id 9a1b2c3d inet weft-trace-7 pre packet: iif "veth1a2b" ether saddr 02:00:00:00:00:01 ip saddr 10.244.2.3 ip daddr 10.244.1.2 tcp dport 81 tcp flags == syn
trace id 9a1b2c3d inet weft-trace-7 pre rule ip saddr 10.244.2.3 ip daddr 10.244.1.2 tcp dport 81 meta nftrace set 1 (verdict continue)
trace id 9a1b2c3d inet weft-trace-7 pre verdict continue
trace id 9a1b2c3d inet weft-trace-7 pre policy accept
trace id 9a1b2c3d inet weft-policy forward packet: iif "eth0" oif "veth9f" ip saddr 10.244.2.3 ip daddr 10.244.1.2
trace id 9a1b2c3d inet weft-policy forward rule oifname "veth9f" jump g-x-in (verdict jump g-x-in)
trace id 9a1b2c3d inet weft-policy g-x-in rule counter drop (verdict drop)
trace id 77777777 inet weft-policy forward rule ct state established accept (verdict accept)
"#;

    #[test]
    fn a_drop_is_named_with_its_table_chain_and_rule() {
        let hop = parse_hop(DROPPED, "inet weft-trace-7").expect("a hop");
        assert_eq!((hop.iif.as_str(), hop.oif.as_str()), ("veth1a2b", "veth9f"));
        assert_eq!(
            hop.steps.len(),
            2,
            "the marking table is left out, so is another packet: {hop:#?}"
        );
        let d = &hop.steps[hop.dropped_at.expect("dropped")];
        assert_eq!(
            (d.table.as_str(), d.chain.as_str(), d.rule.as_str(), d.verdict.as_str()),
            ("inet weft-policy", "g-x-in", "counter drop", "drop")
        );
        assert_eq!(hop.steps[0].verdict, "jump g-x-in");
    }

    #[test]
    fn no_trace_is_no_hop_and_probes_parse() {
        assert!(parse_hop("", "inet t").is_none());
        assert_eq!(Probe::parse("80/tcp"), Ok(Probe::Tcp(80)));
        assert_eq!(Probe::parse("53/UDP"), Ok(Probe::Udp(53)));
        assert_eq!(Probe::parse("8080"), Ok(Probe::Tcp(8080)));
        assert_eq!(Probe::parse("icmp"), Ok(Probe::Icmp));
        assert!(Probe::parse("80/sctp").is_err());
        assert!(Probe::parse("http").is_err());
        assert!(Probe::parse("0/tcp").is_err());
        assert_eq!(Probe::Udp(53).to_string(), "53/udp");
    }

    #[test]
    fn the_marking_rule_matches_only_the_probe() {
        let s = marking_script(
            "weft-trace-1",
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            Probe::Tcp(80),
        );
        assert!(
            s.contains("ip saddr 10.0.0.1 ip daddr 10.0.0.2 tcp dport 80 meta nftrace set 1"),
            "{s}"
        );
        assert!(s.contains("priority -350"), "before conntrack: {s}");
        let s = marking_script("t", "fd00::1".parse().unwrap(), "fd00::2".parse().unwrap(), Probe::Icmp);
        assert!(
            s.contains("ip6 saddr fd00::1 ip6 daddr fd00::2 meta l4proto ipv6-icmp"),
            "{s}"
        );
    }

    #[test]
    fn the_checksum_is_rfc_1071s() {
        // An echo request, id 0x1234 seq 1, no data: 0x0800 + 0x1234 + 0x0001 = 0x1a35.
        assert_eq!(checksum(&[8, 0, 0, 0, 0x12, 0x34, 0, 1]), !0x1a35);
        // An odd length is padded with a zero byte.
        assert_eq!(checksum(&[0xff]), !0xff00);
    }
}
