//! The network configuration weft reads from stdin: the spec's keys plus weft's own
//! (`socket`, `ranges`, `mtu`).
//!
//! ```json
//! {"cniVersion":"1.1.0","name":"weft","type":"weft","socket":"/run/weft/weftd.sock",
//!  "ranges":["10.244.1.0/24","fd00:10:244:1::/64"],"mtu":1500}
//! ```

use ipnet::IpNet;
use rscni_types::types::{CNIResult, Cmd, GcAttachment, NetConf, RuntimeConf};
use serde_json::Value;

use crate::version::{self, SpecVersion};
use crate::{CniError, code};

/// Largest network configuration accepted on stdin.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// MTU used when the config sets none.
pub const DEFAULT_MTU: u32 = 1500;

/// Default path of the daemon socket (config key `socket`).
pub const DEFAULT_SOCKET: &str = "/run/weft/weftd.sock";

/// Decodes stdin into the spec's network configuration (code 6 when it is not one,
/// code 7 when it is too large).
pub fn decode(bytes: &[u8]) -> Result<NetConf, CniError> {
    decode_split(bytes).map(|(conf, _)| conf)
}

/// Decodes stdin, taking `runtimeConfig.portMappings` out to be parsed by weft's own
/// rules ([`parse_port_mappings`]): runtimes spell its keys differently (containerd 1.6
/// sends `HostPort`, not `hostPort`), and a bad mapping is an invalid config (code 7),
/// not undecodable JSON.
fn decode_split(bytes: &[u8]) -> Result<(NetConf, Option<Value>), CniError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "network config is {} bytes, at most {MAX_CONFIG_BYTES} allowed",
                bytes.len()
            ),
        ));
    }
    let decode_err = |e: serde_json::Error| CniError::new(code::DECODE, format!("error decoding network config: {e}"));
    let mut v: Value = serde_json::from_slice(bytes).map_err(decode_err)?;
    let mappings = v
        .get_mut("runtimeConfig")
        .and_then(Value::as_object_mut)
        .and_then(|rc| rc.remove("portMappings"));
    let conf = serde_json::from_value(v).map_err(decode_err)?;
    Ok((conf, mappings))
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

/// Parses `runtimeConfig.portMappings`, accepting both spellings runtimes use
/// (`hostPort` and `HostPort`, ...). Invalid entries are code 7.
pub fn parse_port_mappings(v: Option<&Value>) -> Result<Vec<PortMappingConf>, CniError> {
    let bad = |d: String| CniError::new(code::INVALID_CONFIG, format!("runtimeConfig.portMappings: {d}"));
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(bad(format!("expected a list, got {other}"))),
    };
    let get = |o: &serde_json::Map<String, Value>, names: &[&str]| names.iter().find_map(|n| o.get(*n)).cloned();
    let port = |v: Option<Value>, what: &str, entry: &Value| -> Result<u16, CniError> {
        v.and_then(|p| p.as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| bad(format!("{what} must be a port number 1-65535 in {entry}")))
    };
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let Value::Object(o) = entry else {
            return Err(bad(format!("entry {entry} is not an object")));
        };
        let host_port = port(get(o, &["hostPort", "HostPort"]), "hostPort", entry)?;
        let container_port = port(get(o, &["containerPort", "ContainerPort"]), "containerPort", entry)?;
        let protocol = match get(o, &["protocol", "Protocol"]) {
            None | Some(Value::Null) => "tcp".to_string(),
            Some(Value::String(p)) if ["tcp", "udp", "sctp"].contains(&p.to_ascii_lowercase().as_str()) => {
                p.to_ascii_lowercase()
            }
            Some(p) => return Err(bad(format!("protocol {p} is not tcp, udp or sctp"))),
        };
        let host_ip = match get(o, &["hostIP", "HostIP", "hostIp"]) {
            None | Some(Value::Null) => HostIp::Any,
            Some(Value::String(s)) if s.is_empty() => HostIp::Any,
            Some(Value::String(s)) => match s.parse::<std::net::IpAddr>() {
                Ok(ip) if ip.is_unspecified() && ip.is_ipv4() => HostIp::AnyV4,
                Ok(ip) if ip.is_unspecified() => HostIp::AnyV6,
                Ok(ip) => HostIp::Addr(ip),
                Err(_) => return Err(bad(format!("hostIP {s:?} is not an IP address"))),
            },
            Some(other) => return Err(bad(format!("hostIP {other} is not a string"))),
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
}

impl PluginConfig {
    /// Decodes and checks stdin for `cmd` as the plugin must before relaying it.
    pub fn parse(bytes: &[u8], cmd: Cmd) -> Result<Self, CniError> {
        let conf = decode(bytes)?;
        let version = version::negotiate(&conf.cni_version, cmd)?;
        Ok(Self {
            version,
            socket: socket_of(&conf)?,
        })
    }
}

fn socket_of(conf: &NetConf) -> Result<String, CniError> {
    match conf.custom.get("socket") {
        None | Some(Value::Null) => Ok(DEFAULT_SOCKET.to_string()),
        Some(Value::String(s)) if s.starts_with('/') => Ok(s.clone()),
        Some(other) => Err(CniError::new(
            code::INVALID_CONFIG,
            format!("`socket` must be an absolute path, got {other}"),
        )),
    }
}

/// The whole configuration, validated for one command, as the daemon uses it.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The negotiated spec version; results are reported under it.
    pub version: SpecVersion,
    /// The network name (attachments are keyed by it).
    pub name: String,
    /// Address ranges to allocate from, in the order given (validated for ADD and
    /// STATUS; may be empty for other commands).
    pub ranges: Vec<IpNet>,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// The previous plugin's result when weft is chained.
    pub prev_result: Option<CNIResult>,
    /// GC: the attachments the runtime still considers valid.
    pub valid_attachments: Option<Vec<GcAttachment>>,
    /// Capabilities arguments from the runtime.
    pub runtime_config: Option<RuntimeConf>,
    /// Host ports (`runtimeConfig.portMappings`), validated for ADD.
    pub port_mappings: Vec<PortMappingConf>,
}

impl NetworkConfig {
    /// Decodes and validates `bytes` for `cmd`. Ranges and MTU are required to be valid
    /// only where they are used (ADD, CHECK, STATUS), so a DEL or GC with a config that
    /// has since gone bad can still clean up.
    pub fn parse(bytes: &[u8], cmd: Cmd) -> Result<Self, CniError> {
        let (conf, mappings) = decode_split(bytes)?;
        let version = version::negotiate(&conf.cni_version, cmd)?;
        conf.validate_name()
            .map_err(|e| CniError::new(code::INVALID_CONFIG, e.details().to_string()))?;
        if conf.ipam.is_some() {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                "`ipam` is not supported: weft allocates addresses itself from `ranges`",
            ));
        }
        socket_of(&conf)?;
        let strict = matches!(cmd, Cmd::Add | Cmd::Check | Cmd::Status);
        let ranges = match parse_ranges(conf.custom.get("ranges")) {
            Ok(r) => r,
            Err(e) if strict => return Err(e),
            Err(_) => Vec::new(),
        };
        let mtu = match parse_mtu(conf.custom.get("mtu"), &ranges) {
            Ok(m) => m,
            Err(e) if strict => return Err(e),
            Err(_) => DEFAULT_MTU,
        };
        let port_mappings = if cmd == Cmd::Add {
            parse_port_mappings(mappings.as_ref())?
        } else {
            Vec::new()
        };
        Ok(Self {
            version,
            name: conf.name,
            ranges,
            mtu,
            prev_result: conf.prev_result,
            valid_attachments: conf.valid_attachments,
            runtime_config: conf.runtime_config,
            port_mappings,
        })
    }
}

/// Smallest usable IPv4 range: network, gateway and at least two pods.
pub const MAX_V4_PREFIX: u8 = 30;
/// Smallest usable IPv6 range.
pub const MAX_V6_PREFIX: u8 = 126;

fn parse_ranges(v: Option<&Value>) -> Result<Vec<IpNet>, CniError> {
    let bad = |d: String| CniError::new(code::INVALID_CONFIG, d);
    let list = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(bad(
                "`ranges` is missing or empty: give at least one CIDR, e.g. [\"10.244.1.0/24\"]".into(),
            ));
        }
        Some(other) => {
            return Err(bad(format!("`ranges` must be a list of CIDR strings, got {other}")));
        }
    };
    let mut out: Vec<IpNet> = Vec::with_capacity(list.len());
    for item in list {
        let Value::String(s) = item else {
            return Err(bad(format!("range {item} is not a CIDR string")));
        };
        let net: IpNet = s.parse().map_err(|_| bad(format!("range {s:?} is not a valid CIDR")))?;
        if net.network() != net.addr() {
            return Err(bad(format!(
                "range {s:?} has host bits set; did you mean {}?",
                net.trunc()
            )));
        }
        let max = match net {
            IpNet::V4(_) => MAX_V4_PREFIX,
            IpNet::V6(_) => MAX_V6_PREFIX,
        };
        if net.prefix_len() > max {
            return Err(bad(format!(
                "range {s:?} is too small: the prefix may be at most /{max}"
            )));
        }
        if let Some(o) = out.iter().find(|o| o.contains(&net) || net.contains(*o)) {
            return Err(bad(format!("range {s:?} overlaps range {o}")));
        }
        out.push(net);
    }
    Ok(out)
}

fn parse_mtu(v: Option<&Value>, ranges: &[IpNet]) -> Result<u32, CniError> {
    let mtu = match v {
        None | Some(Value::Null) => return Ok(DEFAULT_MTU),
        Some(Value::Number(n)) => n.as_u64(),
        Some(_) => None,
    };
    let min = if ranges.iter().any(|r| matches!(r, IpNet::V6(_))) {
        1280
    } else {
        68
    };
    match mtu {
        Some(m) if (min..=65535).contains(&m) => Ok(m as u32),
        _ => Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "`mtu` must be an integer between {min} and 65535, got {}",
                v.map_or(String::new(), |v| v.to_string())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> Vec<u8> {
        format!(r#"{{"cniVersion":"1.1.0","name":"weft","type":"weft"{extra}}}"#).into_bytes()
    }

    #[test]
    fn dual_stack_config_parses() {
        let c = NetworkConfig::parse(
            &conf(r#","ranges":["10.244.1.0/24","fd00:10:244:1::/64"],"mtu":1400"#),
            Cmd::Add,
        )
        .unwrap();
        assert_eq!(c.name, "weft");
        assert_eq!(c.ranges.len(), 2);
        assert_eq!(c.mtu, 1400);
    }

    #[test]
    fn plugin_view_defaults_the_socket() {
        let p = PluginConfig::parse(&conf(r#","ranges":["10.0.0.0/24"]"#), Cmd::Add).unwrap();
        assert_eq!(p.socket, DEFAULT_SOCKET);
        let p = PluginConfig::parse(&conf(r#","socket":"/tmp/x.sock""#), Cmd::Add).unwrap();
        assert_eq!(p.socket, "/tmp/x.sock");
    }

    #[test]
    fn malformed_json_is_code_6() {
        assert_eq!(
            NetworkConfig::parse(b"{not json", Cmd::Add).unwrap_err().code,
            code::DECODE
        );
        assert_eq!(NetworkConfig::parse(b"", Cmd::Add).unwrap_err().code, code::DECODE);
        // `type` is required by the spec.
        assert_eq!(
            NetworkConfig::parse(br#"{"cniVersion":"1.1.0","name":"x"}"#, Cmd::Add)
                .unwrap_err()
                .code,
            code::DECODE
        );
    }

    #[test]
    fn invalid_ranges_are_code_7_for_add_but_not_del() {
        for bad in [
            r#","ranges":["10.0.0.1/24"]"#,
            r#","ranges":["10.0.0.0/31"]"#,
            r#","ranges":["nonsense"]"#,
            r#","ranges":[]"#,
            r#","ranges":"10.0.0.0/24""#,
            r#","ranges":["10.0.0.0/16","10.0.1.0/24"]"#,
            "",
        ] {
            let e = NetworkConfig::parse(&conf(bad), Cmd::Add).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}: {e}");
            assert!(NetworkConfig::parse(&conf(bad), Cmd::Del).is_ok(), "{bad}");
        }
    }

    #[test]
    fn host_bits_error_suggests_the_network() {
        let e = NetworkConfig::parse(&conf(r#","ranges":["10.0.0.1/24"]"#), Cmd::Add).unwrap_err();
        assert!(e.details.contains("10.0.0.0/24"), "{}", e.details);
    }

    #[test]
    fn mtu_bounds() {
        assert!(NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"mtu":0"#), Cmd::Add).is_err());
        assert!(NetworkConfig::parse(&conf(r#","ranges":["fd00::/64"],"mtu":1000"#), Cmd::Add).is_err());
        assert!(NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"mtu":"9000""#), Cmd::Add).is_err());
    }

    #[test]
    fn ipam_section_is_unsupported() {
        let e = NetworkConfig::parse(
            &conf(r#","ranges":["10.0.0.0/24"],"ipam":{"type":"host-local"}"#),
            Cmd::Add,
        )
        .unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
    }

    #[test]
    fn bad_network_name_is_code_7() {
        let e = NetworkConfig::parse(
            br#"{"cniVersion":"1.1.0","name":"bad name","type":"weft","ranges":["10.0.0.0/24"]}"#,
            Cmd::Add,
        )
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
    }

    #[test]
    fn oversized_config_is_code_7() {
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        assert_eq!(decode(&big).unwrap_err().code, code::INVALID_CONFIG);
    }

    #[test]
    fn port_mappings_accept_both_spellings() {
        let c = NetworkConfig::parse(
            &conf(
                r#","ranges":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[
                {"hostPort":8080,"containerPort":80,"protocol":"tcp"},
                {"HostPort":53,"ContainerPort":5353,"Protocol":"UDP","HostIP":"10.1.1.1"},
                {"hostPort":443,"containerPort":8443,"hostIP":"0.0.0.0"},
                {"hostPort":444,"containerPort":8443,"hostIP":"::"}]}"#,
            ),
            Cmd::Add,
        )
        .unwrap();
        let m = &c.port_mappings;
        assert_eq!(m.len(), 4);
        assert_eq!(
            (
                m[0].host_port,
                m[0].container_port,
                m[0].protocol.as_str(),
                m[0].host_ip
            ),
            (8080, 80, "tcp", HostIp::Any)
        );
        assert_eq!(
            (m[1].protocol.as_str(), m[1].host_ip),
            ("udp", HostIp::Addr("10.1.1.1".parse().unwrap()))
        );
        assert_eq!(m[2].host_ip, HostIp::AnyV4);
        assert_eq!(m[3].host_ip, HostIp::AnyV6);
    }

    #[test]
    fn bad_port_mappings_are_code_7() {
        for bad in [
            r#"[{"hostPort":0,"containerPort":80}]"#,
            r#"[{"hostPort":70000,"containerPort":80}]"#,
            r#"[{"containerPort":80}]"#,
            r#"[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]"#,
            r#"[{"hostPort":80,"containerPort":80,"hostIP":"nope"}]"#,
            r#"{"hostPort":80}"#,
        ] {
            let c = conf(&format!(
                r#","ranges":["10.0.0.0/24"],"runtimeConfig":{{"portMappings":{bad}}}"#
            ));
            assert_eq!(
                NetworkConfig::parse(&c, Cmd::Add).unwrap_err().code,
                code::INVALID_CONFIG,
                "{bad}"
            );
            assert!(
                NetworkConfig::parse(&c, Cmd::Del).is_ok(),
                "DEL ignores mappings: {bad}"
            );
        }
    }

    #[test]
    fn declared_version_is_lenient() {
        assert_eq!(declared_version(br#"{"cniVersion":"0.4.0","x":"#), "1.1.0");
        assert_eq!(declared_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(declared_version(br#"{"cniVersion":"7.0.0"}"#), "7.0.0");
        assert_eq!(declared_version(br#"{"name":"x"}"#), "1.1.0");
    }

    /// Found by the `cni_config` fuzz target: with `cniVersion` given twice, errors were
    /// reported under 1.1.0 (the typed reader refused the duplicate) while the config was
    /// handled as the last one given.
    #[test]
    fn a_repeated_cni_version_is_read_as_the_config_is() {
        let bytes = br#"{"name":"weft","type":"weft","ranges":["10.0.0.0/24"],"cniVersion":"1","cniVersion":"1.0.0"}"#;
        let c = NetworkConfig::parse(bytes, Cmd::Del).unwrap();
        assert_eq!(c.version.to_string(), "1.0.0");
        assert_eq!(declared_version(bytes), "1.0.0");
        let bad = br#"{"name":"weft","type":"weft","cniVersion":"1.1.0","ranges":["x"],"cniVersion":"0.3.1"}"#;
        assert_eq!(declared_version(bad), "0.3.1");
        assert_eq!(
            NetworkConfig::parse(bad, Cmd::Add).unwrap_err().code,
            code::INVALID_CONFIG
        );
    }
}
