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

/// The nft script that replaces the table with one holding `entries`, atomically.
pub fn script(entries: &Entries, opts: Options) -> String {
    let mut s = format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    for (name, ty) in MAPS {
        s.push_str(&format!("  map {name} {{ type {ty} ; }}\n"));
    }
    for (name, ty) in SETS {
        s.push_str(&format!("  set {name} {{ type {ty} ; }}\n"));
    }
    s.push_str(
        "  chain hostports {\n\
         \x20   meta nfproto ipv4 dnat ip to ip daddr . meta l4proto . th dport map @hostports_v4\n\
         \x20   meta nfproto ipv4 dnat ip to meta l4proto . th dport map @hostports_v4_any\n\
         \x20   meta nfproto ipv6 dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostports_v6\n\
         \x20   meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @hostports_v6_any\n\
         \x20 }\n",
    );
    s.push_str("  chain prerouting {\n    type nat hook prerouting priority -100; policy accept;\n");
    if opts.localhost {
        // route_localnet lets 127/8 be routed; never for packets that came from outside.
        s.push_str("    iifname != \"lo\" ip daddr 127.0.0.0/8 drop\n");
    }
    s.push_str("    fib daddr type local jump hostports\n  }\n");
    s.push_str("  chain output {\n    type nat hook output priority -100; policy accept;\n    fib daddr type local jump hostports\n  }\n");
    s.push_str(
        "  chain postrouting {\n    type nat hook postrouting priority 100; policy accept;\n\
         \x20   ct status dnat ip saddr 127.0.0.0/8 masquerade\n\
         \x20   ct status dnat iifname . ip daddr @hairpin_v4 masquerade\n\
         \x20   ct status dnat iifname . ip6 daddr @hairpin_v6 masquerade\n  }\n}\n",
    );
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

/// Whether the kernel's table has every chain and rule weft writes and exactly the
/// elements `entries` call for.
pub fn matches(entries: &Entries, opts: Options) -> Result<bool, PortmapError> {
    let out = match nft(&["-j", "list", "table", "inet", TABLE], None) {
        Ok(o) => o,
        Err(PortmapError::Nft(e)) if e.contains("No such file") => return Ok(false),
        Err(e) => return Err(e),
    };
    let v: Value = serde_json::from_str(&out).map_err(|e| PortmapError::Nft(format!("parsing nft -j output: {e}")))?;
    let objects = v["nftables"].as_array().cloned().unwrap_or_default();
    let mut rules: std::collections::HashMap<String, usize> = Default::default();
    let mut chains = BTreeSet::new();
    let mut maps = BTreeSet::new();
    let mut found = BTreeSet::new();
    let mut sets = BTreeSet::new();
    let mut found_hairpins = BTreeSet::new();
    for o in &objects {
        if let Some(c) = o.get("chain") {
            chains.insert(c["name"].as_str().unwrap_or_default().to_string());
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
                    None => return Ok(false),
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
                    None => return Ok(false),
                }
            }
            sets.insert(m["name"].as_str().unwrap_or_default().to_string());
        }
    }
    let want_rules = [
        ("hostports", 4),
        ("prerouting", 1 + usize::from(opts.localhost)),
        ("output", 1),
        ("postrouting", 3),
    ];
    let structure = MAPS.iter().all(|(n, _)| maps.contains(*n))
        && SETS.iter().all(|(n, _)| sets.contains(*n))
        && want_rules
            .iter()
            .all(|(c, n)| chains.contains(*c) && rules.get(*c) == Some(n));
    let want: BTreeSet<HostPort> = entries.ports.iter().cloned().collect();
    let want_hairpins: BTreeSet<Hairpin> = entries.hairpins.iter().cloned().collect();
    Ok(structure && found == want && found_hairpins == want_hairpins)
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
        assert!(
            script(&Entries::default(), Options { localhost: true })
                .contains("iifname != \"lo\" ip daddr 127.0.0.0/8 drop")
        );
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
