//! Property tests for the input weft takes from runtimes: the network configuration,
//! `CNI_ARGS`, and ADD results rendered for every spec version (with prevResult
//! merged). The fuzz targets in `fuzz/` drive the same entry points with raw bytes;
//! these run in `cargo test` and check that parsing keeps what valid input says.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::prelude::*;
use rscni_types::types::CNIResultWithVersion;
use serde_json::{Value, json};
use weft_cni::conf::{DEFAULT_SOCKET, declared_version};
use weft_cni::result::{merge_prev, render};
use weft_cni::version::SUPPORTED;
use weft_cni::{
    CNIResult, Cmd, CniError, Code, Dns, HostIp, Interface, IpConfig, NetworkConfig, PluginConfig, Route, SpecVersion,
    parse_cni_args,
};

const CMDS: [Cmd; 6] = [Cmd::Add, Cmd::Del, Cmd::Check, Cmd::Gc, Cmd::Status, Cmd::Version];

fn known_code(e: &CniError) -> bool {
    Code::ALL.contains(&e.code)
}

// ---------------------------------------------------------------- network config

/// Arbitrary JSON built from the keys the config parser looks at, so that random
/// input reaches past the JSON decoder into weft's own checks.
fn config_like() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u16>().prop_map(Value::from),
        prop::sample::select(vec![
            "1.1.0",
            "1.0.0",
            "0.4.0",
            "0.3.1",
            "0.3.0",
            "0.2.0",
            "",
            "weft",
            "10.0.0.0/24",
            "10.0.0.1/24",
            "fd00::/64",
            "::",
            "0.0.0.0",
            "/run/x.sock",
            "tcp",
            "UDP",
        ])
        .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "hostPort",
                    "HostPort",
                    "containerPort",
                    "protocol",
                    "hostIP",
                    "HostIP",
                    "portMappings",
                    "interfaces",
                    "ips",
                    "routes",
                    "address",
                    "interface",
                    "dst",
                    "name",
                ]),
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    });
    prop::collection::btree_map(
        prop::sample::select(vec![
            "cniVersion",
            "name",
            "type",
            "ranges",
            "mtu",
            "socket",
            "ipam",
            "runtimeConfig",
            "prevResult",
            "cni.dev/valid-attachments",
        ]),
        value,
        0..8,
    )
    .prop_map(|m| serde_json::to_vec(&m).unwrap())
}

/// Checks what an accepted config promises the daemon, whatever the input was.
fn check_accepted(bytes: &[u8], cmd: Cmd) {
    match NetworkConfig::parse(bytes, cmd) {
        Ok(c) => {
            // The plugin relays whatever the daemon would accept.
            let p = PluginConfig::parse(bytes, cmd).expect("the plugin accepts what the daemon accepts");
            assert_eq!(p.version, c.version);
            assert!(SUPPORTED.contains(&c.version.to_string().as_str()));
            assert!(!c.name.is_empty());
            if matches!(cmd, Cmd::Add | Cmd::Check | Cmd::Status) {
                // Ranges may be left to the node; those given are usable.
                for (i, r) in c.ranges.iter().enumerate() {
                    assert_eq!(r.network(), r.addr(), "{r} has host bits");
                    for o in &c.ranges[i + 1..] {
                        assert!(!r.contains(o) && !o.contains(r), "{r} overlaps {o}");
                    }
                }
                if let Some(m) = c.mtu {
                    assert!((68..=65535).contains(&m));
                    if c.ranges.iter().any(|r| matches!(r, IpNet::V6(_))) {
                        assert!(m >= 1280, "an IPv6 range needs 1280, got {m}");
                    }
                }
            }
            if cmd != Cmd::Add {
                assert!(c.port_mappings.is_empty());
            }
            for m in &c.port_mappings {
                assert!(m.host_port > 0 && m.container_port > 0);
                assert!(["tcp", "udp", "sctp"].contains(&m.protocol.as_str()));
            }
            if let Some(prev) = &c.prev_result {
                let out: Value = serde_json::from_slice(&render(c.version, prev)).unwrap();
                assert_eq!(out["cniVersion"], c.version.to_string());
            }
        }
        Err(e) => {
            assert!(known_code(&e), "{e}");
            let v: Value = serde_json::from_slice(&e.to_json(&declared_version(bytes))).unwrap();
            assert_eq!(v["code"], e.code.number());
        }
    }
}

/// Valid, non-overlapping ranges: each from its own /16 (v4) or /32 (v6) block.
fn ranges() -> impl Strategy<Value = Vec<IpNet>> {
    let v4 = (any::<u32>(), 16u8..=30).prop_map(|(a, p)| Ipv4Net::new(Ipv4Addr::from(a), p).unwrap().trunc());
    let v6 = (any::<u128>(), 32u8..=126).prop_map(|(a, p)| Ipv6Net::new(Ipv6Addr::from(a), p).unwrap().trunc());
    (
        prop::collection::btree_map(any::<u16>(), v4, 0..3),
        prop::collection::btree_map(any::<u32>(), v6, 0..3),
    )
        .prop_filter("at least one range", |(a, b)| !a.is_empty() || !b.is_empty())
        .prop_map(|(v4, v6)| {
            // Pin each range into its own block so no two overlap.
            let v4 = v4.into_iter().map(|(block, n)| {
                let base = u32::from(n.network()) & 0xffff | (u32::from(block) << 16);
                IpNet::V4(Ipv4Net::new(Ipv4Addr::from(base), n.prefix_len()).unwrap().trunc())
            });
            let v6 = v6.into_iter().map(|(block, n)| {
                let base = u128::from(n.network()) & (u128::MAX >> 32) | (u128::from(block) << 96);
                IpNet::V6(Ipv6Net::new(Ipv6Addr::from(base), n.prefix_len()).unwrap().trunc())
            });
            v4.chain(v6).collect()
        })
}

#[derive(Debug, Clone)]
struct Mapping {
    host: u16,
    container: u16,
    protocol: Option<String>,
    host_ip: Option<String>,
    upper: bool,
}

fn mapping() -> impl Strategy<Value = Mapping> {
    (
        1u16..,
        1u16..,
        prop::option::of(prop::sample::select(vec!["tcp", "udp", "sctp", "TCP", "Udp", "SCTP"])),
        prop::option::of(prop_oneof![
            Just(String::new()),
            Just("0.0.0.0".to_string()),
            Just("::".to_string()),
            any::<IpAddr>()
                .prop_filter("specific", |a| !a.is_unspecified())
                .prop_map(|a| a.to_string()),
        ]),
        any::<bool>(),
    )
        .prop_map(|(host, container, protocol, host_ip, upper)| Mapping {
            host,
            container,
            protocol: protocol.map(str::to_string),
            host_ip,
            upper,
        })
}

impl Mapping {
    fn to_json(&self) -> Value {
        let k = |lower: &str, upper: &str| if self.upper { upper } else { lower }.to_string();
        let mut o = serde_json::Map::new();
        o.insert(k("hostPort", "HostPort"), json!(self.host));
        o.insert(k("containerPort", "ContainerPort"), json!(self.container));
        if let Some(p) = &self.protocol {
            o.insert(k("protocol", "Protocol"), json!(p));
        }
        if let Some(ip) = &self.host_ip {
            o.insert(k("hostIP", "HostIP"), json!(ip));
        }
        Value::Object(o)
    }

    fn expected_host_ip(&self) -> HostIp {
        match self.host_ip.as_deref() {
            None | Some("") => HostIp::Any,
            Some("0.0.0.0") => HostIp::AnyV4,
            Some("::") => HostIp::AnyV6,
            Some(s) => HostIp::Addr(s.parse().unwrap()),
        }
    }
}

#[derive(Debug, Clone)]
struct GoodConfig {
    version: &'static str,
    name: String,
    ranges: Vec<IpNet>,
    mtu: Option<u32>,
    socket: Option<String>,
    mappings: Vec<Mapping>,
}

fn good_config() -> impl Strategy<Value = GoodConfig> {
    (
        prop::sample::select(SUPPORTED.to_vec()),
        "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,30}",
        ranges(),
        prop::option::of(1280u32..=65535),
        prop::option::of("/[a-z0-9/._-]{0,40}"),
        prop::collection::vec(mapping(), 0..4),
    )
        .prop_map(|(version, name, ranges, mtu, socket, mappings)| GoodConfig {
            version,
            name,
            ranges,
            mtu,
            socket,
            mappings,
        })
}

impl GoodConfig {
    fn to_json(&self) -> Value {
        let mut v = json!({
            "cniVersion": self.version,
            "name": self.name,
            "type": "weft",
            "ranges": self.ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
        if let Some(m) = self.mtu {
            v["mtu"] = json!(m);
        }
        if let Some(s) = &self.socket {
            v["socket"] = json!(s);
        }
        if !self.mappings.is_empty() {
            v["runtimeConfig"] =
                json!({"portMappings": self.mappings.iter().map(Mapping::to_json).collect::<Vec<_>>()});
        }
        v
    }

    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).unwrap()
    }
}

proptest! {
    #[test]
    fn config_parse_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        for cmd in CMDS {
            check_accepted(&bytes, cmd);
        }
    }

    #[test]
    fn config_parse_never_panics_on_config_like_json(bytes in config_like()) {
        for cmd in CMDS {
            check_accepted(&bytes, cmd);
        }
    }

    #[test]
    fn a_valid_config_parses_back_to_its_values(c in good_config()) {
        let bytes = c.bytes();
        let parsed = NetworkConfig::parse(&bytes, Cmd::Add).unwrap();
        prop_assert_eq!(parsed.version.to_string(), c.version);
        prop_assert_eq!(&parsed.name, &c.name);
        prop_assert_eq!(&parsed.ranges, &c.ranges);
        prop_assert_eq!(parsed.mtu, c.mtu);
        prop_assert!(parsed.prev_result.is_none());
        prop_assert_eq!(parsed.port_mappings.len(), c.mappings.len());
        for (got, want) in parsed.port_mappings.iter().zip(&c.mappings) {
            prop_assert_eq!(got.host_port, want.host);
            prop_assert_eq!(got.container_port, want.container);
            prop_assert_eq!(&got.protocol, &want.protocol.as_deref().unwrap_or("tcp").to_ascii_lowercase());
            prop_assert_eq!(got.host_ip, want.expected_host_ip());
        }
        let plugin = PluginConfig::parse(&bytes, Cmd::Add).unwrap();
        prop_assert_eq!(plugin.socket, c.socket.clone().unwrap_or_else(|| DEFAULT_SOCKET.to_string()));
        prop_assert_eq!(declared_version(&bytes), c.version);
        // DEL and, where the version allows them, CHECK and STATUS accept it too.
        for cmd in CMDS {
            if SpecVersion::allows(parsed.version, cmd).is_ok() {
                let again = NetworkConfig::parse(&bytes, cmd).unwrap();
                prop_assert_eq!(&again.ranges, &c.ranges);
            } else {
                prop_assert_eq!(NetworkConfig::parse(&bytes, cmd).unwrap_err().code, Code::IncompatibleVersion);
            }
        }
    }

    #[test]
    fn a_range_with_host_bits_is_code_7_for_add_only(c in good_config(), bit in any::<u128>()) {
        let mut v = c.to_json();
        let r = c.ranges[0];
        let host_bits = match r {
            IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) | (bit as u32 & u32::from(n.hostmask())).max(1))),
            IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | (bit & u128::from(n.hostmask())).max(1))),
        };
        let bad = format!("{host_bits}/{}", r.prefix_len());
        v["ranges"][0] = json!(bad);
        let bytes = serde_json::to_vec(&v).unwrap();
        let e = NetworkConfig::parse(&bytes, Cmd::Add).unwrap_err();
        prop_assert_eq!(e.code, Code::InvalidConfig);
        prop_assert!(e.details.contains(&r.to_string()), "{} should suggest {}", e.details, r);
        prop_assert!(NetworkConfig::parse(&bytes, Cmd::Del).is_ok());
    }

    #[test]
    fn an_mtu_out_of_bounds_is_code_7(c in good_config(), mtu in prop_oneof![0u64..68, 65536u64..65600, 65536u64..]) {
        let mut v = c.to_json();
        v["mtu"] = json!(mtu);
        let e = NetworkConfig::parse(&serde_json::to_vec(&v).unwrap(), Cmd::Add).unwrap_err();
        prop_assert_eq!(e.code, Code::InvalidConfig);
    }
}

// ---------------------------------------------------------------- CNI_ARGS

fn arg_key() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_]{0,24}"
}

fn arg_value() -> impl Strategy<Value = String> {
    // Anything but the pair separator; `=` is allowed in values.
    "[^;]{0,24}"
}

fn join_args(m: &BTreeMap<String, String>, trailing: bool) -> String {
    let mut s = m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";");
    if trailing {
        s.push(';');
    }
    s
}

proptest! {
    #[test]
    fn cni_args_never_panic_and_keep_only_real_pairs(raw in "\\PC{0,64}|[A-Za-z=;]{0,32}") {
        match parse_cni_args(&raw) {
            Ok(m) => {
                let pairs: Vec<&str> = raw.split(';').filter(|p| !p.is_empty()).collect();
                prop_assert!(m.len() <= pairs.len());
                for (k, v) in &m {
                    prop_assert!(!k.is_empty() && !k.contains('=') && !k.contains(';'));
                    prop_assert!(!v.contains(';'));
                    let pair = format!("{k}={v}");
                    prop_assert!(pairs.contains(&pair.as_str()), "{} is not in the input", pair);
                }
            }
            Err(e) => {
                prop_assert_eq!(e.code, Code::InvalidEnv);
                prop_assert!(e.details.starts_with("CNI_ARGS: "));
            }
        }
    }

    #[test]
    fn cni_args_round_trip(m in prop::collection::btree_map(arg_key(), arg_value(), 0..8), trailing in any::<bool>()) {
        prop_assert_eq!(parse_cni_args(&join_args(&m, trailing)).unwrap(), m);
    }

    #[test]
    fn a_pair_without_equals_is_code_4(
        m in prop::collection::btree_map(arg_key(), arg_value(), 0..6),
        garbage in "[^;=]{1,20}",
        at in any::<prop::sample::Index>(),
    ) {
        let mut pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.insert(at.index(pairs.len() + 1), garbage.clone());
        let e = parse_cni_args(&pairs.join(";")).unwrap_err();
        prop_assert_eq!(e.code, Code::InvalidEnv);
        prop_assert_eq!(e.details, format!("CNI_ARGS: invalid pair {garbage:?}, expected KEY=VALUE"));
    }

    #[test]
    fn an_empty_key_is_code_4(
        m in prop::collection::btree_map(arg_key(), arg_value(), 0..6),
        value in arg_value(),
        at in any::<prop::sample::Index>(),
    ) {
        let mut pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let bad = format!("={value}");
        pairs.insert(at.index(pairs.len() + 1), bad.clone());
        let e = parse_cni_args(&pairs.join(";")).unwrap_err();
        prop_assert_eq!(e.code, Code::InvalidEnv);
        prop_assert_eq!(e.details, format!("CNI_ARGS: empty key in {bad:?}"));
    }
}

// ---------------------------------------------------------------- results

fn ipnet() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (any::<Ipv4Addr>(), 0u8..=32).prop_map(|(a, p)| IpNet::V4(Ipv4Net::new(a, p).unwrap())),
        (any::<Ipv6Addr>(), 0u8..=128).prop_map(|(a, p)| IpNet::V6(Ipv6Net::new(a, p).unwrap())),
    ]
}

fn interface() -> impl Strategy<Value = Interface> {
    (
        "\\PC{1,15}",
        prop::option::of("[0-9a-f]{2}(:[0-9a-f]{2}){5}"),
        prop::option::of(any::<u32>()),
        prop::option::of("/\\PC{0,20}"),
        prop::option::of("\\PC{1,10}"),
        prop::option::of("[0-9a-f:.]{1,12}"),
    )
        .prop_map(|(name, mac, mtu, sandbox, socket_path, pci_id)| Interface {
            name,
            mac: mac.unwrap_or_default(),
            mtu,
            sandbox,
            socket_path,
            pci_id,
        })
}

fn route() -> impl Strategy<Value = Route> {
    (
        ipnet(),
        prop::option::of(any::<IpAddr>()),
        prop::array::uniform5(prop::option::of(any::<u32>())),
    )
        .prop_map(|(dst, gw, [mtu, advmss, priority, table, scope])| Route {
            dst,
            gw,
            mtu,
            advmss,
            priority,
            table,
            scope,
        })
}

fn dns() -> impl Strategy<Value = Option<Dns>> {
    prop::option::of(
        (
            prop::collection::vec(any::<IpAddr>().prop_map(|a| a.to_string()), 1..3),
            prop::option::of("[a-z.]{1,20}"),
        )
            .prop_map(|(nameservers, domain)| Dns {
                nameservers,
                domain,
                search: None,
                options: None,
            }),
    )
}

/// A result whose IPs name interfaces of the result (or none), as a plugin's does.
fn cni_result() -> impl Strategy<Value = CNIResult> {
    prop::collection::vec(interface(), 0..4)
        .prop_flat_map(|interfaces| {
            let n = interfaces.len() as u32;
            let index = if n == 0 {
                Just(None).boxed()
            } else {
                prop::option::of(0..n).boxed()
            };
            let ip = (ipnet(), index, prop::option::of(any::<IpAddr>())).prop_map(|(address, interface, gateway)| {
                IpConfig {
                    interface,
                    address,
                    gateway,
                }
            });
            (
                Just(interfaces),
                prop::collection::vec(ip, 0..5),
                prop::collection::vec(route(), 0..4),
                dns(),
            )
        })
        .prop_map(|(interfaces, ips, routes, dns)| CNIResult {
            interfaces,
            ips,
            routes,
            dns,
        })
}

/// What a version before 1.1.0 can carry of `r`, derived independently of the code
/// under test from the spec's list of 1.1.0 additions.
fn without_1_1(r: &CNIResult) -> CNIResult {
    let mut r = r.clone();
    for i in &mut r.interfaces {
        (i.mtu, i.socket_path, i.pci_id) = (None, None, None);
    }
    for rt in &mut r.routes {
        (rt.mtu, rt.advmss, rt.priority, rt.table, rt.scope) = (None, None, None, None, None);
    }
    r
}

fn check_rendered(version: &str, r: &CNIResult) -> Result<(), TestCaseError> {
    let v: SpecVersion = version.parse().unwrap();
    let bytes = render(v, r);
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    prop_assert_eq!(&json["cniVersion"], version);
    match version {
        "1.1.0" => {
            let back: CNIResultWithVersion = serde_json::from_slice(&bytes).unwrap();
            prop_assert_eq!(back.cni_version(), v);
            prop_assert_eq!(&back.into_result(), r);
        }
        "1.0.0" => {
            let back: CNIResultWithVersion = serde_json::from_slice(&bytes).unwrap();
            prop_assert_eq!(back.cni_version(), v);
            prop_assert_eq!(back.into_result(), without_1_1(r));
        }
        _ => {
            let ips = json["ips"].as_array().map_or(&[][..], Vec::as_slice);
            prop_assert_eq!(ips.len(), r.ips.len());
            for (j, ip) in ips.iter().zip(&r.ips) {
                let family = if ip.address.addr().to_canonical().is_ipv4() {
                    "4"
                } else {
                    "6"
                };
                prop_assert_eq!(&j["version"], family);
            }
            // Legacy layouts always carry `dns`, `{}` when there is none.
            let mut want = without_1_1(r);
            want.dns = Some(want.dns.unwrap_or_default());
            let back: CNIResult = serde_json::from_slice(&bytes).unwrap();
            prop_assert_eq!(back, want);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn results_render_for_every_version_keeping_ips_and_routes(r in cni_result()) {
        for version in SUPPORTED {
            check_rendered(version, &r)?;
        }
    }

    #[test]
    fn merging_prev_result_keeps_everything_and_shifts_indices(prev in cni_result(), ours in cni_result()) {
        let merged = merge_prev(Some(&prev), &ours);
        let n = prev.interfaces.len();
        prop_assert_eq!(&merged.interfaces[..n], &prev.interfaces[..]);
        prop_assert_eq!(&merged.interfaces[n..], &ours.interfaces[..]);
        prop_assert_eq!(&merged.ips[..prev.ips.len()], &prev.ips[..]);
        prop_assert_eq!(merged.ips.len(), prev.ips.len() + ours.ips.len());
        for (m, o) in merged.ips[prev.ips.len()..].iter().zip(&ours.ips) {
            prop_assert_eq!(m.address, o.address);
            prop_assert_eq!(m.gateway, o.gateway);
            // The index still names the same interface of ours.
            match (m.interface, o.interface) {
                (None, None) => {}
                (Some(mi), Some(oi)) => {
                    prop_assert_eq!(&merged.interfaces[mi as usize], &ours.interfaces[oi as usize]);
                    prop_assert_eq!(mi as usize, oi as usize + n);
                }
                other => prop_assert!(false, "interface index changed presence: {:?}", other),
            }
        }
        let mut routes = prev.routes.clone();
        routes.extend(ours.routes.iter().cloned());
        prop_assert_eq!(&merged.routes, &routes);
        prop_assert_eq!(&merged.dns, if prev.dns.is_some() { &prev.dns } else { &ours.dns });
        for version in SUPPORTED {
            check_rendered(version, &merged)?;
        }
        prop_assert_eq!(merge_prev(None, &ours), ours);
    }

    #[test]
    fn prev_result_in_a_config_is_read_back(c in good_config(), prev in cni_result()) {
        let mut v = c.to_json();
        v["prevResult"] = serde_json::from_slice(&render(c.version.parse().unwrap(), &prev)).unwrap();
        let parsed = NetworkConfig::parse(&serde_json::to_vec(&v).unwrap(), Cmd::Add).unwrap();
        let got = parsed.prev_result.expect("prevResult is kept");
        prop_assert_eq!(&got.ips, &prev.ips);
        prop_assert_eq!(got.routes.len(), prev.routes.len());
        prop_assert_eq!(got.interfaces.len(), prev.interfaces.len());
    }
}
