//! `weftctl trace --lab FILE SRC DST PORT/PROTO`: a real probe from inside the source
//! pod, marked for nftables tracing (`meta nftrace set 1`) by a table of its own on
//! every node, followed through each node it crosses: the chains and rules it went
//! through with their verdicts (`nft monitor trace`, the kernel's own account), and the
//! route the node took for it (`ip route get ... iif`). What the kernel did, beside what
//! `policy explain` says it should do.
//!
//! The marking table hooks prerouting before conntrack (priority -350), so a packet is
//! traced on every node where it enters, from its pod's veth or from the underlay
//! (decapsulated first when it came over VXLAN), whatever weft's own tables then do. It
//! is removed when the trace ends, even on failure.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::{Lab, LabError};

/// What the probe is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
        let port: u16 = port.parse().map_err(|_| format!("{s:?}: PORT/tcp, PORT/udp or icmp"))?;
        match proto {
            "tcp" => Ok(Probe::Tcp(port)),
            "udp" => Ok(Probe::Udp(port)),
            other => Err(format!("{other:?}: tcp, udp or icmp")),
        }
    }

    /// The nft match of the probe's transport, for `family` (`ip` or `ip6`).
    fn nft_match(self, v6: bool) -> String {
        match self {
            Probe::Tcp(p) => format!("tcp dport {p}"),
            Probe::Udp(p) => format!("udp dport {p}"),
            Probe::Icmp if v6 => "meta l4proto ipv6-icmp".into(),
            Probe::Icmp => "meta l4proto icmp".into(),
        }
    }
}

/// One line of the kernel's trace that a rule or a chain's end gave a verdict in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hop {
    /// The node.
    pub node: String,
    /// The interface it came in on.
    pub iif: String,
    /// The interface it left by, when the trace says.
    pub oif: String,
    /// Where the node's routes send it (`ip route get`), if it was routed.
    pub route: String,
    /// The rules and chain ends it went through, in order (the marking table's left out).
    pub steps: Vec<Step>,
    /// The step that dropped it, if one did.
    pub dropped_by: Option<Step>,
}

/// A trace: the probe and each node it crossed, in the order it crossed them.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    /// The source pod.
    pub src: String,
    /// Its address the probe left from.
    pub src_ip: IpAddr,
    /// The destination address.
    pub dst_ip: IpAddr,
    /// The probe.
    pub probe: Probe,
    /// Whether the probe was answered (a TCP connection made, a ping answered; a UDP
    /// datagram is never known to arrive).
    pub answered: Option<bool>,
    /// The nodes, the source's first.
    pub hops: Vec<Hop>,
}

/// One parsed `nft monitor trace` line: its id, table (`family name`), chain, and what
/// follows.
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
/// its interfaces and its steps, leaving out `own_table`'s (the marking table).
pub fn parse_node(node: &str, text: &str, own_table: &str) -> Option<Hop> {
    let mut first: Option<&str> = None;
    let mut hop = Hop {
        node: node.to_string(),
        iif: String::new(),
        oif: String::new(),
        route: String::new(),
        steps: Vec::new(),
        dropped_by: None,
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
        if step.verdict == "drop" && hop.dropped_by.is_none() {
            hop.dropped_by = Some(step.clone());
        }
        hop.steps.push(step);
    }
    first.map(|_| hop)
}

/// Removes the marking table from a node when dropped.
struct Marked {
    ns: String,
    table: String,
}

impl Drop for Marked {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns, "nft", "delete", "table", "inet", &self.table])
            .stderr(Stdio::null())
            .status();
    }
}

fn nft_in(ns: &str, script: &str) -> Result<(), LabError> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LabError::io("running nft", e))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|e| LabError::io("writing to nft", e))?;
    let out = child.wait_with_output().map_err(|e| LabError::io("running nft", e))?;
    if !out.status.success() {
        return Err(LabError::Command {
            what: format!("nft in {ns}"),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

impl Lab {
    /// Traces `probe` from pod `src` (`NS/NAME` or a unique `NAME`) to `dst` (a pod, or
    /// an address) through every node (see the module documentation).
    pub fn trace(&self, src: &str, dst: &str, probe: Probe) -> Result<Trace, LabError> {
        let bad = |detail: String| LabError::Command {
            what: "trace".into(),
            detail,
        };
        let src_node = self
            .node_of(src)
            .ok_or_else(|| bad(format!("{src}: no pod of the lab")))?;
        let dst_ip: IpAddr = match dst.parse() {
            Ok(ip) => ip,
            Err(_) => {
                self.node_of(dst)
                    .ok_or_else(|| bad(format!("{dst}: no pod of the lab, nor an address")))?;
                *self
                    .pod_addresses(dst)
                    .first()
                    .ok_or_else(|| bad(format!("{dst} has no address")))?
            }
        };
        let v6 = dst_ip.is_ipv6();
        let src_ip = self
            .pod_addresses(src)
            .into_iter()
            .find(|a| a.is_ipv6() == v6)
            .ok_or_else(|| bad(format!("{src} has no address of {dst_ip}'s family")))?;
        let table = format!("weft-trace-{}", std::process::id());
        let family = if v6 { "ip6" } else { "ip" };
        let script = format!(
            "table inet {table} {{\n  chain pre {{\n    type filter hook prerouting priority -350;\n    \
             {family} saddr {src_ip} {family} daddr {dst_ip} {} meta nftrace set 1\n  }}\n}}\n",
            probe.nft_match(v6)
        );
        let nodes: Vec<String> = self.spec.nodes.iter().map(|n| n.name.clone()).collect();
        let mut marked = Vec::new();
        let mut monitors = Vec::new();
        for node in &nodes {
            let ns = self.node_ns(node);
            // The monitor first: nothing traced before it listens.
            let mut child = Command::new("ip")
                .args(["netns", "exec", &ns, "nft", "monitor", "trace"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| LabError::io("running nft monitor trace", e))?;
            let out = child.stdout.take().expect("piped");
            let lines = Arc::new(Mutex::new(String::new()));
            let sink = lines.clone();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut s = sink.lock().expect("trace lines");
                    s.push_str(&line);
                    s.push('\n');
                }
            });
            monitors.push((node.clone(), child, reader, lines));
            nft_in(&ns, &script)?;
            marked.push(Marked {
                ns,
                table: table.clone(),
            });
        }
        // `nft monitor` says nothing once it listens: it is given a moment (under load,
        // more than it needs).
        std::thread::sleep(Duration::from_secs(1));
        let answered = self.send_probe(src, dst_ip, probe)?;
        // Until the source's node has told of the probe (at most 3 s), and a little
        // longer for the nodes after it.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let seen = |node: &str| {
            monitors
                .iter()
                .any(|(n, _, _, lines)| n == node && !lines.lock().expect("trace lines").is_empty())
        };
        while !seen(src_node) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        drop(marked);
        let mut hops = Vec::new();
        for (node, mut child, reader, lines) in monitors {
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
            let text = lines.lock().expect("trace lines").clone();
            if let Some(mut hop) = parse_node(&node, &text, &format!("inet {table}")) {
                hop.route = self.route(&node, src_ip, dst_ip, &hop.iif);
                hops.push(hop);
            }
        }
        hops.sort_by_key(|h| h.node != src_node);
        Ok(Trace {
            src: src.to_string(),
            src_ip,
            dst_ip,
            probe,
            answered,
            hops,
        })
    }

    /// Sends the probe from inside pod `src`; whether it was answered, when that can be
    /// known.
    fn send_probe(&self, src: &str, dst: IpAddr, probe: Probe) -> Result<Option<bool>, LabError> {
        let ns = self.pod_ns(src);
        let host = match dst {
            IpAddr::V6(a) => format!("[{a}]"),
            IpAddr::V4(a) => a.to_string(),
        };
        let (argv, knowable): (Vec<String>, bool) = match probe {
            Probe::Tcp(p) => (
                vec![
                    "timeout".into(),
                    "2".into(),
                    "bash".into(),
                    "-c".into(),
                    format!("exec 3<>/dev/tcp/{}/{p}", host.trim_matches(|c| c == '[' || c == ']')),
                ],
                true,
            ),
            Probe::Udp(p) => (
                vec![
                    "bash".into(),
                    "-c".into(),
                    format!(
                        "echo weft-trace > /dev/udp/{}/{p}",
                        host.trim_matches(|c| c == '[' || c == ']')
                    ),
                ],
                false,
            ),
            Probe::Icmp => (
                vec![
                    "ping".into(),
                    "-n".into(),
                    "-c".into(),
                    "1".into(),
                    "-W".into(),
                    "1".into(),
                    dst.to_string(),
                ],
                true,
            ),
        };
        let status = Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(&argv)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| LabError::io("sending the probe", e))?;
        Ok(knowable.then_some(status.success()))
    }

    /// `ip route get DST from SRC iif IIF` on `node`, or without `iif` when it came from
    /// the node itself.
    fn route(&self, node: &str, src: IpAddr, dst: IpAddr, iif: &str) -> String {
        let ns = self.node_ns(node);
        let (s, d) = (src.to_string(), dst.to_string());
        let mut args = vec!["-n", &ns, "route", "get", &d, "from", &s];
        if !iif.is_empty() {
            args.extend(["iif", iif]);
        }
        let out = Command::new("ip").args(&args).output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
            Ok(o) => format!("no route: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => format!("ip route get: {e}"),
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
        let hop = parse_node("n1", DROPPED, "inet weft-trace-7").expect("a hop");
        assert_eq!((hop.iif.as_str(), hop.oif.as_str()), ("veth1a2b", "veth9f"));
        assert_eq!(
            hop.steps.len(),
            2,
            "the marking table is left out, so is another packet: {hop:#?}"
        );
        let d = hop.dropped_by.expect("dropped");
        assert_eq!(
            (d.table.as_str(), d.chain.as_str(), d.rule.as_str(), d.verdict.as_str()),
            ("inet weft-policy", "g-x-in", "counter drop", "drop")
        );
        assert_eq!(hop.steps[0].verdict, "jump g-x-in");
    }

    #[test]
    fn no_trace_is_no_hop_and_probes_parse() {
        assert!(parse_node("n2", "", "inet t").is_none());
        assert_eq!(Probe::parse("80/tcp"), Ok(Probe::Tcp(80)));
        assert_eq!(Probe::parse("53/UDP"), Ok(Probe::Udp(53)));
        assert_eq!(Probe::parse("8080"), Ok(Probe::Tcp(8080)));
        assert_eq!(Probe::parse("icmp"), Ok(Probe::Icmp));
        assert!(Probe::parse("80/sctp").is_err());
        assert!(Probe::parse("http").is_err());
    }
}
