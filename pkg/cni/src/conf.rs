//! The network configuration weft reads from stdin: the spec's keys (`rscni_types`)
//! plus weft's own (`socket`, `ranges`, `mtu`, `routes`, `defaultRoute`,
//! `waitForLinks`, and `runtimeConfig`'s `ips`, `mac`, `portMappings`), decoded into
//! typed shapes (`keys`) and then judged here, each key with its own message.
//!
//! ```json
//! {"cniVersion":"1.1.0","name":"weft","type":"weft","socket":"/run/weft/weftd.sock",
//!  "ranges":["10.244.1.0/24","fd00:10:244:1::/64"],"mtu":1500}
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use rscni_types::types::{CNIResult, Cmd, GcAttachment, NetConf, RuntimeConf};
use serde::Deserialize;
use serde_json::Value;

mod keys;
use keys::{Given, PortMappingKeys, RouteKeys, WeftKeys};

use crate::version::{self, SpecVersion};
use crate::{CniError, Code};

/// Largest network configuration accepted on stdin.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// MTU used when neither the config nor the node sets one.
pub const DEFAULT_MTU: u32 = 1500;

/// The least MTU IPv6 allows on a link (RFC 8200).
pub const MIN_MTU_V6: u32 = 1280;

/// The least MTU IPv4 allows on a link (RFC 791).
pub const MIN_MTU_V4: u32 = 68;

/// Default path of the daemon socket: the config key `socket`'s default, and weftd's and
/// weftctl's `--socket`.
pub const DEFAULT_SOCKET: &str = "/run/weft/weftd.sock";

/// Decodes stdin into the spec's network configuration (code 6 when it is not one,
/// code 7 when it is too large).
pub fn decode(bytes: &[u8]) -> Result<NetConf, CniError> {
    decode_split(bytes).map(|(conf, _)| conf)
}

/// Decodes stdin into the spec's configuration and weft's keys ([`WeftKeys`]), taking
/// `runtimeConfig.portMappings` out to be read by weft's own rules
/// ([`parse_port_mappings`]): runtimes spell its keys differently (containerd 1.6 sends
/// `HostPort`, not `hostPort`), and a bad mapping is an invalid config (code 7), not
/// undecodable JSON.
fn decode_split(bytes: &[u8]) -> Result<(NetConf, WeftKeys), CniError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "network config is {} bytes, at most {MAX_CONFIG_BYTES} allowed",
                bytes.len()
            ),
        ));
    }
    let decode_err = |e: serde_json::Error| CniError::new(Code::Decode, format!("error decoding network config: {e}"));
    // Through a `Value` first, so a key given twice resolves the same way (the last
    // one wins) for the spec's keys, weft's and `declared_version`.
    let mut v: Value = serde_json::from_slice(bytes).map_err(decode_err)?;
    let mappings = v
        .get_mut("runtimeConfig")
        .and_then(Value::as_object_mut)
        .and_then(|rc| rc.remove("portMappings"));
    let conf = NetConf::deserialize(&v).map_err(decode_err)?;
    // Every weft key is read as `Given`, which takes any value: this fails only where
    // the spec's types did already.
    let mut keys = WeftKeys::deserialize(&v).map_err(decode_err)?;
    keys.port_mappings = mappings
        .filter(|m| !m.is_null())
        .map(|m| Given::deserialize(m).map_err(decode_err))
        .transpose()?;
    Ok((conf, keys))
}

/// Which node addresses a host port binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostIp {
    /// Every address of every family the pod has (`hostIP` absent or empty).
    Any,
    /// Every IPv4 address (`0.0.0.0`).
    AnyV4,
    /// Every IPv6 address (`::`).
    AnyV6,
    /// One address.
    Addr(std::net::IpAddr),
}

/// A host port the runtime asks for (`runtimeConfig.portMappings[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMappingConf {
    /// The port on the node.
    pub host_port: u16,
    /// The port in the pod.
    pub container_port: u16,
    /// `tcp` (default), `udp` or `sctp`.
    pub protocol: String,
    /// The node addresses bound.
    pub host_ip: HostIp,
}

/// Reads `runtimeConfig.portMappings`, accepting both spellings runtimes use
/// (`hostPort` and `HostPort`, ...). Invalid entries are code 7.
fn parse_port_mappings(v: Option<&Given<Vec<Value>>>) -> Result<Vec<PortMappingConf>, CniError> {
    let bad = |d: String| CniError::new(Code::InvalidConfig, format!("runtimeConfig.portMappings: {d}"));
    let list = match v {
        None => return Ok(Vec::new()),
        Some(Given::Typed(a)) => a,
        Some(Given::Other(other)) => return Err(bad(format!("expected a list, got {other}"))),
    };
    let port = |v: Option<&Given<u64>>, what: &str, entry: &Value| -> Result<u16, CniError> {
        match v {
            Some(Given::Typed(p)) => u16::try_from(*p).ok().filter(|p| *p > 0),
            _ => None,
        }
        .ok_or_else(|| bad(format!("{what} must be a port number 1-65535 in {entry}")))
    };
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let Some(o) = entry
            .is_object()
            .then(|| PortMappingKeys::deserialize(entry).ok())
            .flatten()
        else {
            return Err(bad(format!("entry {entry} is not an object")));
        };
        let host_port = port(o.host_port(), "hostPort", entry)?;
        let container_port = port(o.container_port(), "containerPort", entry)?;
        let protocol = match o.protocol() {
            None => "tcp".to_string(),
            Some(Given::Typed(p)) if ["tcp", "udp", "sctp"].contains(&p.to_ascii_lowercase().as_str()) => {
                p.to_ascii_lowercase()
            }
            Some(Given::Typed(p)) => return Err(bad(format!("protocol {} is not tcp, udp or sctp", json(p)))),
            Some(Given::Other(p)) => return Err(bad(format!("protocol {p} is not tcp, udp or sctp"))),
        };
        let host_ip = match o.host_ip() {
            None => HostIp::Any,
            Some(Given::Typed(s)) if s.is_empty() => HostIp::Any,
            Some(Given::Typed(s)) => match s.parse::<std::net::IpAddr>() {
                Ok(ip) if ip.is_unspecified() && ip.is_ipv4() => HostIp::AnyV4,
                Ok(ip) if ip.is_unspecified() => HostIp::AnyV6,
                Ok(ip) => HostIp::Addr(ip),
                Err(_) => return Err(bad(format!("hostIP {s:?} is not an IP address"))),
            },
            Some(Given::Other(other)) => return Err(bad(format!("hostIP {other} is not a string"))),
        };
        out.push(PortMappingConf {
            host_port,
            container_port,
            protocol,
            host_ip,
        });
    }
    Ok(out)
}

/// A string as JSON spells it (how errors show a value that was given).
fn json(s: &str) -> Value {
    Value::String(s.to_string())
}

/// The `cniVersion` a config declares, read leniently so an error about the rest of
/// the config can still be reported under it, as the spec asks. Falls back to weft's
/// own version when the config declares none or is not JSON.
pub fn declared_version(bytes: &[u8]) -> String {
    // Read through a `Value`, as `decode` does: a key given twice then resolves the same
    // way (the last one wins) here as there, so an error is reported under the version
    // the config is handled as.
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| match v.get("cniVersion") {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| version::CURRENT.to_string())
}

/// What the plugin needs from the config: the negotiated version and the socket.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The config's `cniVersion`, checked against `cmd`.
    pub version: SpecVersion,
    /// Path of the daemon socket.
    pub socket: String,
    /// The network's `name`: with the container id and interface it keys a DEL the
    /// plugin spools when weftd cannot be reached.
    pub name: String,
}

impl PluginConfig {
    /// Decodes and checks stdin for `cmd` as the plugin must before relaying it.
    pub fn parse(bytes: &[u8], cmd: Cmd) -> Result<Self, CniError> {
        let (conf, keys) = decode_split(bytes)?;
        let version = version::negotiate(&conf.cni_version, cmd)?;
        Ok(Self {
            version,
            socket: socket_of(keys.socket.as_ref())?,
            name: conf.name,
        })
    }
}

fn socket_of(v: Option<&Given<String>>) -> Result<String, CniError> {
    let bad = |got: String| {
        CniError::new(
            Code::InvalidConfig,
            format!("`socket` must be an absolute path, got {got}"),
        )
    };
    match v {
        None => Ok(DEFAULT_SOCKET.to_string()),
        Some(Given::Typed(s)) if s.starts_with('/') => Ok(s.clone()),
        Some(Given::Typed(s)) => Err(bad(json(s).to_string())),
        Some(Given::Other(other)) => Err(bad(other.to_string())),
    }
}

/// A route the config asks weft to install in the pod (`routes[]`, as host-local
/// spells them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConf {
    /// The destination; `0.0.0.0/0` or `::/0` is a default route.
    pub dst: IpNet,
    /// The next hop the config names. A weft pod has one neighbour, the host end, so
    /// the only usable next hop is the gateway of the pod's range in `dst`'s family:
    /// the daemon refuses any other. `None`: that gateway.
    pub gw: Option<IpAddr>,
}

/// The whole configuration, validated for one command, as the daemon uses it.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The negotiated spec version; results are reported under it.
    pub version: SpecVersion,
    /// The network name (attachments are keyed by it).
    pub name: String,
    /// Address ranges to allocate from, in the order given; validated for ADD, CHECK
    /// and STATUS. Empty when the config gives none: the node's pod ranges apply then
    /// (the daemon decides; a standalone node has none).
    pub ranges: Vec<IpNet>,
    /// MTU of both veth ends, when the config sets one (checked against IPv6 only
    /// where `ranges` are given; the daemon checks the MTU it uses against the ranges
    /// it uses). `None`: the node's default.
    pub mtu: Option<u32>,
    /// ADD: routes to install in the pod besides the default route, in order.
    pub routes: Vec<RouteConf>,
    /// ADD: `defaultRoute`. `Some(true)`: a default route per family through this
    /// network (it must not exist yet); `Some(false)`: none; `None`: one per family the
    /// pod has no default route for yet (its first network gets them).
    pub default_route: Option<bool>,
    /// ADD: addresses the runtime asks for (`runtimeConfig.ips`, the `ips`
    /// capability), at most one per family; a prefix given with one is dropped.
    pub ips: Vec<IpAddr>,
    /// ADD: the MAC the runtime asks for on the pod's interface (`runtimeConfig.mac`,
    /// the `mac` capability).
    pub mac: Option<[u8; 6]>,
    /// The previous plugin's result when weft is chained.
    pub prev_result: Option<CNIResult>,
    /// GC: the attachments the runtime still considers valid.
    pub valid_attachments: Option<Vec<GcAttachment>>,
    /// Capabilities arguments from the runtime.
    pub runtime_config: Option<RuntimeConf>,
    /// Host ports (`runtimeConfig.portMappings`), validated for ADD.
    pub port_mappings: Vec<PortMappingConf>,
    /// ADD: `waitForLinks`, how long the ADD of a pod with a Topology waits for all its
    /// links to be up before answering (a pod's own Topology may say otherwise).
    /// `None` or zero: the ADD answers once `eth0` is up and the links are started.
    pub wait_for_links: Option<std::time::Duration>,
}

impl NetworkConfig {
    /// Decodes and validates `bytes` for `cmd`. Ranges and MTU are required to be valid
    /// only where they are used (ADD, CHECK, STATUS), and routes and what the runtime
    /// asks for only for ADD, so a DEL or GC with a config that has since gone bad can
    /// still clean up.
    pub fn parse(bytes: &[u8], cmd: Cmd) -> Result<Self, CniError> {
        let (conf, keys) = decode_split(bytes)?;
        let version = version::negotiate(&conf.cni_version, cmd)?;
        conf.validate_name()
            .map_err(|e| CniError::new(Code::InvalidConfig, e.details().to_string()))?;
        if conf.ipam.is_some() {
            return Err(CniError::new(
                Code::UnsupportedField,
                "`ipam` is not supported: weft allocates addresses itself from `ranges`",
            ));
        }
        socket_of(keys.socket.as_ref())?;
        let strict = matches!(cmd, Cmd::Add | Cmd::Check | Cmd::Status);
        let ranges = match parse_ranges(keys.ranges.as_ref()) {
            Ok(r) => r,
            Err(e) if strict => return Err(e),
            Err(_) => Vec::new(),
        };
        let mtu = match parse_mtu(keys.mtu.as_ref(), &ranges) {
            Ok(m) => m,
            Err(e) if strict => return Err(e),
            Err(_) => None,
        };
        let add = cmd == Cmd::Add;
        let wait_for_links = if add {
            parse_wait_for_links(keys.wait_for_links.as_ref())?
        } else {
            None
        };
        let (routes, default_route, ips, mac, port_mappings) = if add {
            let routes = parse_routes(keys.routes.as_ref())?;
            let default_route = parse_default_route(keys.default_route.as_ref(), &routes)?;
            // Not an object: the spec's types refused the config already.
            let runtime = match &keys.runtime_config {
                Some(Given::Typed(rc)) => Some(rc),
                _ => None,
            };
            let ips = parse_runtime_ips(runtime.and_then(|rc| rc.ips.as_ref()))?;
            let mac = parse_runtime_mac(runtime.and_then(|rc| rc.mac.as_ref()))?;
            (
                routes,
                default_route,
                ips,
                mac,
                parse_port_mappings(keys.port_mappings.as_ref())?,
            )
        } else {
            (Vec::new(), None, Vec::new(), None, Vec::new())
        };
        Ok(Self {
            version,
            name: conf.name,
            ranges,
            mtu,
            routes,
            default_route,
            ips,
            mac,
            prev_result: conf.prev_result,
            valid_attachments: conf.valid_attachments,
            runtime_config: conf.runtime_config,
            port_mappings,
            wait_for_links,
        })
    }
}

/// Smallest usable IPv4 range: network, gateway and at least two pods.
pub const MAX_V4_PREFIX: u8 = 30;
/// Smallest usable IPv6 range.
pub const MAX_V6_PREFIX: u8 = 126;

fn parse_ranges(v: Option<&Given<Vec<Given<String>>>>) -> Result<Vec<IpNet>, CniError> {
    let bad = |d: String| CniError::new(Code::InvalidConfig, d);
    let list = match v {
        Some(Given::Typed(a)) => a,
        // Left to the node: the daemon falls back to the node's pod ranges.
        None => return Ok(Vec::new()),
        Some(Given::Other(other)) => {
            return Err(bad(format!("`ranges` must be a list of CIDR strings, got {other}")));
        }
    };
    let mut out: Vec<IpNet> = Vec::with_capacity(list.len());
    for item in list {
        let s = match item {
            Given::Typed(s) => s,
            Given::Other(item) => return Err(bad(format!("range {item} is not a CIDR string"))),
        };
        let net: IpNet = s.parse().map_err(|_| bad(format!("range {s:?} is not a valid CIDR")))?;
        out.push(net);
    }
    check_ranges(&out).map_err(bad)?;
    Ok(out)
}

/// Checks ranges as weft needs them: network addresses (no host bits), at most /30
/// (IPv4) or /126 (IPv6) so a pod fits beside the gateway, none overlapping another.
/// Used for the config's `ranges` and for the node's pod ranges alike; the error
/// names the first bad range.
pub fn check_ranges(ranges: &[IpNet]) -> Result<(), String> {
    for (i, net) in ranges.iter().enumerate() {
        if net.network() != net.addr() {
            return Err(format!(
                "range \"{net}\" has host bits set; did you mean {}?",
                net.trunc()
            ));
        }
        let max = match net {
            IpNet::V4(_) => MAX_V4_PREFIX,
            IpNet::V6(_) => MAX_V6_PREFIX,
        };
        if net.prefix_len() > max {
            return Err(format!(
                "range \"{net}\" is too small: the prefix may be at most /{max}"
            ));
        }
        if let Some(o) = ranges[..i].iter().find(|o| o.contains(net) || net.contains(*o)) {
            return Err(format!("range \"{net}\" overlaps range {o}"));
        }
    }
    Ok(())
}

/// The least MTU a pod with addresses from `ranges` may have: 1280 with an IPv6
/// range, else 68.
pub fn min_mtu(ranges: &[IpNet]) -> u32 {
    if ranges.iter().any(|r| matches!(r, IpNet::V6(_))) {
        MIN_MTU_V6
    } else {
        MIN_MTU_V4
    }
}

fn parse_mtu(v: Option<&Given<u64>>, ranges: &[IpNet]) -> Result<Option<u32>, CniError> {
    let (mtu, got) = match v {
        None => return Ok(None),
        Some(Given::Typed(m)) => (Some(*m), m.to_string()),
        Some(Given::Other(other)) => (None, other.to_string()),
    };
    let min = min_mtu(ranges);
    match mtu {
        Some(m) if (u64::from(min)..=65535).contains(&m) => Ok(Some(m as u32)),
        _ => Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "`mtu` must be an integer between {min} and 65535{}, got {got}",
                if min == MIN_MTU_V6 { " (IPv6 needs 1280)" } else { "" },
            ),
        )),
    }
}

/// Parses `routes`: `[{"dst": CIDR, "gw": IP?}, ...]`. Keys other than `dst` and
/// `gw` are refused rather than ignored (weft installs none of them), as are host
/// bits, a `gw` of another family, and a destination listed twice.
fn parse_routes(v: Option<&Given<Vec<Value>>>) -> Result<Vec<RouteConf>, CniError> {
    let bad = |d: String| CniError::new(Code::InvalidConfig, format!("`routes`: {d}"));
    let list = match v {
        None => return Ok(Vec::new()),
        Some(Given::Typed(a)) => a,
        Some(Given::Other(other)) => {
            return Err(bad(format!(
                "expected a list of {{\"dst\": CIDR}} objects, got {other}"
            )));
        }
    };
    let mut out: Vec<RouteConf> = Vec::with_capacity(list.len());
    for entry in list {
        let Some(o) = entry.is_object().then(|| RouteKeys::deserialize(entry).ok()).flatten() else {
            return Err(bad(format!("entry {entry} is not an object")));
        };
        if let Some(k) = o.other.keys().next() {
            return Err(bad(format!(
                "key `{k}` in {entry} is not supported: a weft route has `dst` and optionally `gw`"
            )));
        }
        let dst: IpNet = match &o.dst {
            Some(Given::Typed(s)) => s.parse().map_err(|_| bad(format!("dst {s:?} is not a CIDR")))?,
            _ => return Err(bad(format!("{entry} has no `dst` CIDR string"))),
        };
        if dst.network() != dst.addr() {
            return Err(bad(format!(
                "dst \"{dst}\" has host bits set; did you mean {}?",
                dst.trunc()
            )));
        }
        let gw = match &o.gw {
            None => None,
            Some(Given::Typed(s)) => {
                let gw: IpAddr = s.parse().map_err(|_| bad(format!("gw {s:?} is not an IP address")))?;
                if gw.is_ipv4() != dst.addr().is_ipv4() {
                    return Err(bad(format!("gw {gw} is not of the family of dst {dst}")));
                }
                Some(gw)
            }
            Some(Given::Other(other)) => return Err(bad(format!("gw {other} is not a string"))),
        };
        if out.iter().any(|r| r.dst == dst) {
            return Err(bad(format!("dst {dst} is listed twice")));
        }
        out.push(RouteConf { dst, gw });
    }
    Ok(out)
}

/// Parses `waitForLinks`: a duration string ("30s", "500ms"), bounded.
fn parse_wait_for_links(v: Option<&Given<String>>) -> Result<Option<std::time::Duration>, CniError> {
    let bad = |d: String| CniError::new(Code::InvalidConfig, format!("`waitForLinks`: {d}"));
    match v {
        None => Ok(None),
        Some(Given::Typed(s)) => weft_link::parse_link_wait(s).map(Some).map_err(bad),
        Some(Given::Other(other)) => Err(bad(format!("must be a duration string such as \"30s\", got {other}"))),
    }
}

fn parse_default_route(v: Option<&Given<bool>>, routes: &[RouteConf]) -> Result<Option<bool>, CniError> {
    let choice = match v {
        None => None,
        Some(Given::Typed(b)) => Some(*b),
        Some(Given::Other(other)) => {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!("`defaultRoute` must be true or false, got {other}"),
            ));
        }
    };
    if choice == Some(false)
        && let Some(r) = routes.iter().find(|r| r.dst.prefix_len() == 0)
    {
        return Err(CniError::new(
            Code::InvalidConfig,
            format!("`defaultRoute` is false but `routes` lists the default route {}", r.dst),
        ));
    }
    Ok(choice)
}

/// Parses `runtimeConfig.ips` (the `ips` capability): a list of addresses, each with
/// or without a prefix (podman sends `10.88.0.7/16`); the prefix is dropped, as pods
/// hold a /32 or /128. At most one per family.
fn parse_runtime_ips(v: Option<&Given<Vec<Given<String>>>>) -> Result<Vec<IpAddr>, CniError> {
    let bad = |d: String| CniError::new(Code::InvalidConfig, format!("runtimeConfig.ips: {d}"));
    let list = match v {
        None => return Ok(Vec::new()),
        Some(Given::Typed(a)) => a,
        Some(Given::Other(other)) => return Err(bad(format!("expected a list of addresses, got {other}"))),
    };
    let mut items = Vec::with_capacity(list.len());
    for item in list {
        match item {
            Given::Typed(s) => items.push(s.as_str()),
            Given::Other(item) => return Err(bad(format!("{item} is not an address string"))),
        }
    }
    crate::request::parse_ips(items).map_err(bad)
}

/// Parses `runtimeConfig.mac` (the `mac` capability).
fn parse_runtime_mac(v: Option<&Given<String>>) -> Result<Option<[u8; 6]>, CniError> {
    let bad = |d: String| CniError::new(Code::InvalidConfig, format!("runtimeConfig.mac: {d}"));
    match v {
        None => Ok(None),
        Some(Given::Typed(s)) => crate::request::parse_mac(s).map(Some).map_err(bad),
        Some(Given::Other(other)) => Err(bad(format!("{other} is not a MAC address string"))),
    }
}

#[cfg(test)]
mod tests;
