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
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "network config is {} bytes, at most {MAX_CONFIG_BYTES} allowed",
                bytes.len()
            ),
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| CniError::new(code::DECODE, format!("error decoding network config: {e}")))
}

/// The `cniVersion` a config declares, read leniently so an error about the rest of
/// the config can still be reported under it, as the spec asks. Falls back to weft's
/// own version when the config declares none or is not JSON.
pub fn declared_version(bytes: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Only {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
    }
    serde_json::from_slice::<Only>(bytes)
        .ok()
        .and_then(|o| o.cni_version)
        .filter(|v| !v.is_empty())
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
}

impl NetworkConfig {
    /// Decodes and validates `bytes` for `cmd`. Ranges and MTU are required to be valid
    /// only where they are used (ADD, CHECK, STATUS), so a DEL or GC with a config that
    /// has since gone bad can still clean up.
    pub fn parse(bytes: &[u8], cmd: Cmd) -> Result<Self, CniError> {
        let conf = decode(bytes)?;
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
        Ok(Self {
            version,
            name: conf.name,
            ranges,
            mtu,
            prev_result: conf.prev_result,
            valid_attachments: conf.valid_attachments,
            runtime_config: conf.runtime_config,
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
                "`ranges` is missing or empty: give at least one CIDR, e.g. [\"10.244.1.0/24\"]"
                    .into(),
            ));
        }
        Some(other) => {
            return Err(bad(format!(
                "`ranges` must be a list of CIDR strings, got {other}"
            )));
        }
    };
    let mut out: Vec<IpNet> = Vec::with_capacity(list.len());
    for item in list {
        let Value::String(s) = item else {
            return Err(bad(format!("range {item} is not a CIDR string")));
        };
        let net: IpNet = s
            .parse()
            .map_err(|_| bad(format!("range {s:?} is not a valid CIDR")))?;
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
            NetworkConfig::parse(b"{not json", Cmd::Add)
                .unwrap_err()
                .code,
            code::DECODE
        );
        assert_eq!(
            NetworkConfig::parse(b"", Cmd::Add).unwrap_err().code,
            code::DECODE
        );
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
        assert!(
            NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"mtu":0"#), Cmd::Add).is_err()
        );
        assert!(
            NetworkConfig::parse(&conf(r#","ranges":["fd00::/64"],"mtu":1000"#), Cmd::Add).is_err()
        );
        assert!(
            NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"mtu":"9000""#), Cmd::Add)
                .is_err()
        );
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
    fn declared_version_is_lenient() {
        assert_eq!(declared_version(br#"{"cniVersion":"0.4.0","x":"#), "1.1.0");
        assert_eq!(declared_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(declared_version(br#"{"cniVersion":"7.0.0"}"#), "7.0.0");
        assert_eq!(declared_version(br#"{"name":"x"}"#), "1.1.0");
    }
}
