//! The table itself: written by `nft -f` in one transaction, checked against what it
//! should hold, and UDP conntrack entries flushed for ports that change owner.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::{Entries, Hairpin, HostPort, Options, PortmapError, Protocol};

/// Name of weft's table (family `inet`).
pub const TABLE: &str = "weft";

const MAPS: [(&str, &str); 4] = [
    (
        "hostports_v4",
        "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service",
    ),
    (
        "hostports_v4_any",
        "inet_proto . inet_service : ipv4_addr . inet_service",
    ),
    (
        "hostports_v6",
        "ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service",
    ),
    (
        "hostports_v6_any",
        "inet_proto . inet_service : ipv6_addr . inet_service",
    ),
];

fn element_text(m: &HostPort) -> String {
    let key = match m.host_ip {
        Some(ip) => format!("{ip} . {} . {}", m.protocol, m.host_port),
        None => format!("{} . {}", m.protocol, m.host_port),
    };
    format!("{key} : {} . {}", m.container_ip, m.container_port)
}

const SETS: [(&str, &str); 2] = [
    ("hairpin_v4", "ifname . ipv4_addr"),
    ("hairpin_v6", "ifname . ipv6_addr"),
];

/// One base or regular chain of the table: its name, its hook line (base chains), and
/// its rules, in order. [`script`] writes them and [`matches`] counts them, so the two
/// never disagree about what the table holds.
struct Chain {
    name: &'static str,
    hook: Option<&'static str>,
    rules: Vec<&'static str>,
}

/// The chains the table holds with `opts`.
fn chains(opts: Options) -> Vec<Chain> {
    let mut guard = Vec::new();
    if opts.guard_localnet {
        // With route_localnet on, 127/8 is routable: never for packets from outside
        // (CVE-2020-8558). A filter chain ahead of DNAT sees every packet, not only a
        // connection's first.
        guard.push("iifname != \"lo\" ip daddr 127.0.0.0/8 drop");
    }
    let mut output = Vec::new();
    if !opts.localhost {
        // Loopback traffic DNATed to a pod is dropped by the kernel unless
        // route_localnet is on: left alone, the client gets a refusal at once.
        output.push("ip daddr 127.0.0.0/8 return");
    }
    // IPv6 has no route_localnet: ::1 is never DNATed.
    output.push("ip6 daddr ::1 return");
    output.push("fib daddr type local jump hostports");
    vec![
        Chain {
            name: "hostports",
            hook: None,
            rules: vec![
                "meta nfproto ipv4 dnat ip to ip daddr . meta l4proto . th dport map @hostports_v4",
                "meta nfproto ipv4 dnat ip to meta l4proto . th dport map @hostports_v4_any",
                "meta nfproto ipv6 dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostports_v6",
                "meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @hostports_v6_any",
            ],
        },
        Chain {
            name: "localnet_guard",
            hook: Some("type filter hook prerouting priority -150; policy accept;"),
            rules: guard,
        },
        Chain {
            name: "prerouting",
            hook: Some("type nat hook prerouting priority -100; policy accept;"),
            rules: vec!["fib daddr type local jump hostports"],
        },
        Chain {
            name: "output",
            hook: Some("type nat hook output priority -100; policy accept;"),
            rules: output,
        },
        Chain {
            name: "postrouting",
            hook: Some("type nat hook postrouting priority 100; policy accept;"),
            rules: vec![
                "ct status dnat ip saddr 127.0.0.0/8 masquerade",
                "ct status dnat iifname . ip daddr @hairpin_v4 masquerade",
                "ct status dnat iifname . ip6 daddr @hairpin_v6 masquerade",
            ],
        },
    ]
}

/// The nft script that replaces the table with one holding `entries`, atomically.
pub fn script(entries: &Entries, opts: Options) -> String {
    let mut s = format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    for (name, ty) in MAPS {
        s.push_str(&format!("  map {name} {{ type {ty} ; }}\n"));
    }
    for (name, ty) in SETS {
        s.push_str(&format!("  set {name} {{ type {ty} ; }}\n"));
    }
    for c in chains(opts) {
        s.push_str(&format!("  chain {} {{\n", c.name));
        if let Some(hook) = c.hook {
            s.push_str(&format!("    {hook}\n"));
        }
        for r in c.rules {
            s.push_str(&format!("    {r}\n"));
        }
        s.push_str("  }\n");
    }
    s.push_str("}\n");
    for (name, _) in MAPS {
        let elems: Vec<String> = entries
            .ports
            .iter()
            .filter(|m| m.map() == name)
            .map(element_text)
            .collect();
        if !elems.is_empty() {
            s.push_str(&format!("add element inet {TABLE} {name} {{ {} }}\n", elems.join(", ")));
        }
    }
    for (name, _) in SETS {
        let elems: Vec<String> = entries
            .hairpins
            .iter()
            .filter(|h| h.set() == name)
            .map(|h| format!("\"{}\" . {}", h.ifname, h.addr))
            .collect();
        if !elems.is_empty() {
            s.push_str(&format!("add element inet {TABLE} {name} {{ {} }}\n", elems.join(", ")));
        }
    }
    s
}

fn nft(args: &[&str], stdin: Option<&str>) -> Result<String, PortmapError> {
    weft_kernel::nft::run(args, stdin).map_err(PortmapError::Nft)
}

/// Replaces the table with one holding exactly `entries`, in one transaction.
pub fn install(entries: &Entries, opts: Options) -> Result<(), PortmapError> {
    nft(&["-f", "-"], Some(&script(entries, opts)))?;
    Ok(())
}

fn proto_of(v: &Value) -> Option<Protocol> {
    match v {
        Value::String(s) => Protocol::parse(s),
        Value::Number(n) => match n.as_u64()? {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            132 => Some(Protocol::Sctp),
            _ => None,
        },
        _ => None,
    }
}

fn port_of(v: &Value) -> Option<u16> {
    v.as_u64().and_then(|p| u16::try_from(p).ok())
}

/// Parses one element of `nft -j` output back into a mapping.
fn parse_elem(map: &str, elem: &Value) -> Option<HostPort> {
    let pair = elem.as_array()?;
    let key = pair.first()?.get("concat")?.as_array()?;
    let data = pair.get(1)?.get("concat")?.as_array()?;
    let specific = !map.ends_with("_any");
    let (host_ip, rest) = if specific {
        (Some(key.first()?.as_str()?.parse::<IpAddr>().ok()?), &key[1..])
    } else {
        (None, &key[..])
    };
    Some(HostPort {
        host_ip,
        protocol: proto_of(rest.first()?)?,
        host_port: port_of(rest.get(1)?)?,
        container_ip: data.first()?.as_str()?.parse().ok()?,
        container_port: port_of(data.get(1)?)?,
    })
}

/// Parses one hairpin set element of `nft -j` output.
fn parse_hairpin(elem: &Value) -> Option<Hairpin> {
    let c = elem.get("concat")?.as_array()?;
    Some(Hairpin {
        ifname: c.first()?.as_str()?.to_string(),
        addr: c.get(1)?.as_str()?.parse().ok()?,
    })
}

/// How the kernel's table compares with what it should hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// There is no table.
    Absent,
    /// Every chain, rule and element is as it should be.
    Same,
    /// Its chains or rules differ from what `opts` call for (other options, or someone
    /// changed them).
    OtherRules,
    /// Its chains and rules are right, its elements are not those of the store.
    OtherElements,
}

/// Whether the kernel's table has every chain and rule weft writes and exactly the
/// elements `entries` call for.
pub fn matches(entries: &Entries, opts: Options) -> Result<bool, PortmapError> {
    Ok(compare(entries, opts)? == Found::Same)
}

/// Compares the kernel's table with the one `entries` and `opts` call for.
pub fn compare(entries: &Entries, opts: Options) -> Result<Found, PortmapError> {
    let out = match nft(&["-j", "list", "table", "inet", TABLE], None) {
        Ok(o) => o,
        Err(PortmapError::Nft(e)) if e.contains("No such file") => return Ok(Found::Absent),
        Err(e) => return Err(e),
    };
    let v: Value = serde_json::from_str(&out).map_err(|e| PortmapError::Nft(format!("parsing nft -j output: {e}")))?;
    let objects = v["nftables"].as_array().cloned().unwrap_or_default();
    let mut rules: std::collections::HashMap<String, usize> = Default::default();
    let mut found_chains = BTreeSet::new();
    let mut maps = BTreeSet::new();
    let mut found = BTreeSet::new();
    let mut sets = BTreeSet::new();
    let mut found_hairpins = BTreeSet::new();
    for o in &objects {
        if let Some(c) = o.get("chain") {
            found_chains.insert(c["name"].as_str().unwrap_or_default().to_string());
        }
        if let Some(r) = o.get("rule") {
            *rules
                .entry(r["chain"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
        if let Some(m) = o.get("map") {
            let name = m["name"].as_str().unwrap_or_default().to_string();
            for e in m["elem"].as_array().into_iter().flatten() {
                match parse_elem(&name, e) {
                    Some(hp) => {
                        found.insert(hp);
                    }
                    None => return Ok(Found::OtherElements),
                }
            }
            maps.insert(name);
        }
        if let Some(m) = o.get("set") {
            for e in m["elem"].as_array().into_iter().flatten() {
                match parse_hairpin(e) {
                    Some(h) => {
                        found_hairpins.insert(h);
                    }
                    None => return Ok(Found::OtherElements),
                }
            }
            sets.insert(m["name"].as_str().unwrap_or_default().to_string());
        }
    }
    let structure = MAPS.iter().all(|(n, _)| maps.contains(*n))
        && SETS.iter().all(|(n, _)| sets.contains(*n))
        && chains(opts)
            .iter()
            .all(|c| found_chains.contains(c.name) && rules.get(c.name).copied().unwrap_or(0) == c.rules.len());
    let want: BTreeSet<HostPort> = entries.ports.iter().cloned().collect();
    let want_hairpins: BTreeSet<Hairpin> = entries.hairpins.iter().cloned().collect();
    Ok(if !structure {
        Found::OtherRules
    } else if found == want && found_hairpins == want_hairpins {
        Found::Same
    } else {
        Found::OtherElements
    })
}

/// Deletes UDP conntrack entries to the mappings' host ports, so flows created before a
/// mapping changed do not keep going to the old place. Uses `conntrack` (package
/// conntrack); a missing tool only skips the flush.
pub fn flush_udp_conntrack(mappings: &[HostPort]) {
    for m in mappings.iter().filter(|m| m.protocol == Protocol::Udp) {
        let family = if m.is_v6() { "ipv6" } else { "ipv4" };
        let port = m.host_port.to_string();
        let status = Command::new("conntrack")
            .args(["-D", "-f", family, "-p", "udp", "--orig-port-dst", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Err(e) = status {
            tracing::warn!(error = %e, "could not flush UDP conntrack entries (is package conntrack installed?)");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(host: Option<&str>, port: u16, proto: Protocol, pod: &str) -> HostPort {
        HostPort {
            host_ip: host.map(|h| h.parse().unwrap()),
            host_port: port,
            protocol: proto,
            container_ip: pod.parse().unwrap(),
            container_port: 80,
        }
    }

    #[test]
    fn script_replaces_the_table_and_lists_elements_per_map() {
        let s = script(
            &Entries {
                ports: vec![
                    hp(Some("10.0.0.1"), 8080, Protocol::Tcp, "10.244.1.5"),
                    hp(None, 53, Protocol::Udp, "fd00::5"),
                ],
                hairpins: vec![Hairpin {
                    ifname: "weftabc".into(),
                    addr: "10.244.1.5".parse().unwrap(),
                }],
            },
            Options::default(),
        );
        assert!(
            s.contains("add element inet weft hairpin_v4 { \"weftabc\" . 10.244.1.5 }"),
            "{s}"
        );
        assert!(s.starts_with("table inet weft {}\ndelete table inet weft\n"));
        assert!(
            s.contains("add element inet weft hostports_v4 { 10.0.0.1 . tcp . 8080 : 10.244.1.5 . 80 }"),
            "{s}"
        );
        assert!(
            s.contains("add element inet weft hostports_v6_any { udp . 53 : fd00::5 . 80 }"),
            "{s}"
        );
        assert!(!s.contains("127.0.0.0/8 drop"));
        assert!(s.contains("ip daddr 127.0.0.0/8 return"), "loopback is not DNATed: {s}");
        let both = Options {
            localhost: true,
            guard_localnet: true,
        };
        let s = script(&Entries::default(), both);
        assert!(s.contains("iifname != \"lo\" ip daddr 127.0.0.0/8 drop"), "{s}");
        assert!(!s.contains("ip daddr 127.0.0.0/8 return"), "{s}");
        assert!(s.contains("ip6 daddr ::1 return"), "::1 is never DNATed: {s}");
    }

    /// The guard goes with route_localnet, not with the flag: a node whose
    /// route_localnet someone else turned on is guarded too.
    #[test]
    fn the_guard_follows_its_option_alone() {
        let guard = |o: Options| script(&Entries::default(), o).contains("127.0.0.0/8 drop");
        assert!(guard(Options {
            localhost: false,
            guard_localnet: true
        }));
        assert!(!guard(Options {
            localhost: true,
            guard_localnet: false
        }));
    }

    #[test]
    fn nft_json_elements_parse_back() {
        let e: Value =
            serde_json::from_str(r#"[{"concat": ["10.0.0.1", "tcp", 80]}, {"concat": ["10.244.1.5", 8080]}]"#).unwrap();
        let m = parse_elem("hostports_v4", &e).unwrap();
        assert_eq!(m.host_ip, Some("10.0.0.1".parse().unwrap()));
        assert_eq!((m.host_port, m.protocol, m.container_port), (80, Protocol::Tcp, 8080));
        let e: Value = serde_json::from_str(r#"[{"concat": ["udp", 53]}, {"concat": ["fd00::5", 5353]}]"#).unwrap();
        let m = parse_elem("hostports_v6_any", &e).unwrap();
        assert_eq!(m.host_ip, None);
        assert_eq!(m.container_ip, "fd00::5".parse::<IpAddr>().unwrap());
    }
}
