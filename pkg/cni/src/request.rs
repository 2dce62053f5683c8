//! What a runtime asks for beyond the network config: an address per family and a MAC
//! for the pod's interface. They arrive two ways, and weft reads both:
//!
//! - `CNI_ARGS` `IP=` and `MAC=` (podman's `--ip` and `--mac-address`, the
//!   host-local and static conventions): `IgnoreUnknown=1;IP=10.88.0.7;MAC=...`;
//! - the `ips` and `mac` capabilities: `runtimeConfig.ips` and `runtimeConfig.mac`,
//!   when the config declares `"capabilities": {"ips": true, "mac": true}`.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::args::{IP, MAC};
use crate::{CniError, Code, NetworkConfig};

/// An address the runtime asks the pod to get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestedIp {
    /// The address (any prefix it came with is dropped).
    pub address: IpAddr,
    /// Where it was asked for, for error messages: `runtimeConfig.ips` or `CNI_ARGS IP`.
    pub source: &'static str,
}

/// Everything a runtime asks for, merged from `CNI_ARGS` and `runtimeConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requested {
    /// At most one address per family, IPv4 first.
    pub ips: Vec<RequestedIp>,
    /// The MAC of the pod's interface.
    pub mac: Option<[u8; 6]>,
}

/// Parses a list of addresses, each with or without a prefix, refusing two of one
/// family (a pod holds one address per family). Returns them IPv4 first.
pub fn parse_ips<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Vec<IpAddr>, String> {
    let mut out: Vec<IpAddr> = Vec::new();
    for item in items {
        let item = item.trim();
        let ip = item
            .parse::<IpAddr>()
            .or_else(|_| item.parse::<IpNet>().map(|n| n.addr()))
            .map_err(|_| format!("{item:?} is not an IP address"))?;
        match out.iter().find(|o| o.is_ipv4() == ip.is_ipv4()) {
            Some(o) if *o == ip => {}
            Some(o) => return Err(format!("asks for two addresses of one family, {o} and {ip}")),
            None => out.push(ip),
        }
    }
    out.sort_by_key(IpAddr::is_ipv6);
    Ok(out)
}

/// Parses a MAC (`0a:58:0a:f4:01:07`, `-` separators too, any case) and refuses what
/// an interface cannot carry: multicast or all zeros.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let mut mac = [0u8; 6];
    if parts.len() != 6 {
        return Err(format!("{s:?} is not a MAC address (six hex octets)"));
    }
    for (b, p) in mac.iter_mut().zip(&parts) {
        if p.len() != 2 {
            return Err(format!("{s:?} is not a MAC address (six hex octets)"));
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address (six hex octets)"))?;
    }
    if mac[0] & 1 == 1 {
        return Err(format!("{s} is a multicast MAC; an interface needs a unicast one"));
    }
    if mac == [0; 6] {
        return Err(format!("{s} is the all-zero MAC"));
    }
    Ok(mac)
}

/// What the runtime asks for: `conf`'s `runtimeConfig.ips`/`mac` and the `CNI_ARGS`
/// values `ip_arg` (`IP=`) and `mac_arg` (`MAC=`). A malformed `CNI_ARGS` value is code
/// 4; the two sources disagreeing (another address of one family, another MAC) is code
/// 7, naming both.
pub fn requested(conf: &NetworkConfig, ip_arg: Option<&str>, mac_arg: Option<&str>) -> Result<Requested, CniError> {
    let env = |d: String| CniError::new(Code::InvalidEnv, d);
    let from_args = match ip_arg.filter(|v| !v.is_empty()) {
        Some(v) => parse_ips(v.split(',')).map_err(|e| env(format!("CNI_ARGS {IP}: {e}")))?,
        None => Vec::new(),
    };
    let mut ips: Vec<RequestedIp> = conf
        .ips
        .iter()
        .map(|&address| RequestedIp {
            address,
            source: "runtimeConfig.ips",
        })
        .collect();
    for address in from_args {
        match ips.iter().find(|o| o.address.is_ipv4() == address.is_ipv4()) {
            Some(o) if o.address == address => {}
            Some(o) => {
                return Err(CniError::new(
                    Code::InvalidConfig,
                    format!(
                        "{} asks for {} but CNI_ARGS {IP} for {address}: one address per family",
                        o.source, o.address
                    ),
                ));
            }
            None => ips.push(RequestedIp {
                address,
                source: "CNI_ARGS IP",
            }),
        }
    }
    ips.sort_by_key(|r| r.address.is_ipv6());
    let arg_mac = match mac_arg.filter(|v| !v.is_empty()) {
        Some(v) => Some(parse_mac(v).map_err(|e| env(format!("CNI_ARGS {MAC}: {e}")))?),
        None => None,
    };
    let mac = match (conf.mac, arg_mac) {
        (Some(a), Some(b)) if a != b => {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "runtimeConfig.mac asks for {} but CNI_ARGS {MAC} for {}",
                    mac_string(&a),
                    mac_string(&b)
                ),
            ));
        }
        (a, b) => a.or(b),
    };
    Ok(Requested { ips, mac })
}

/// `aa:bb:cc:dd:ee:ff`, for messages.
fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cmd;

    fn conf(runtime: &str) -> NetworkConfig {
        let c = format!(
            r#"{{"cniVersion":"1.1.0","name":"n","type":"weft","ranges":["10.0.0.0/24","fd00::/64"]{runtime}}}"#
        );
        NetworkConfig::parse(c.as_bytes(), Cmd::Add).unwrap()
    }

    #[test]
    fn addresses_parse_with_and_without_prefix_ipv4_first() {
        assert_eq!(
            parse_ips(["fd00::7/64", "10.0.0.7"]).unwrap(),
            vec!["10.0.0.7".parse::<IpAddr>().unwrap(), "fd00::7".parse().unwrap()]
        );
        assert_eq!(
            parse_ips(["10.0.0.7", "10.0.0.7/24"]).unwrap().len(),
            1,
            "the same twice"
        );
        assert!(
            parse_ips(["10.0.0.7", "10.0.0.8"])
                .unwrap_err()
                .contains("two addresses")
        );
        assert!(parse_ips(["10.0.0"]).is_err());
    }

    #[test]
    fn macs_must_be_unicast_and_well_formed() {
        assert_eq!(parse_mac("0A-58-0a-f4-01-07").unwrap(), [0x0a, 0x58, 0x0a, 0xf4, 1, 7]);
        for bad in [
            "",
            "0a:58:0a:f4:01",
            "0a:58:0a:f4:01:07:09",
            "0a:58:0a:f4:01:7",
            "zz:58:0a:f4:01:07",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad:?}");
        }
        assert!(parse_mac("01:00:5e:00:00:01").unwrap_err().contains("multicast"));
        assert!(parse_mac("00:00:00:00:00:00").is_err());
    }

    #[test]
    fn both_sources_merge_and_must_agree() {
        let c = conf(r#","runtimeConfig":{"ips":["fd00::9/64"],"mac":"0a:00:00:00:00:01"}"#);
        let r = requested(&c, Some("10.0.0.9"), Some("0a:00:00:00:00:01")).unwrap();
        assert_eq!(r.ips.len(), 2);
        assert_eq!(
            (r.ips[0].address.to_string(), r.ips[0].source),
            ("10.0.0.9".into(), "CNI_ARGS IP")
        );
        assert_eq!(r.ips[1].source, "runtimeConfig.ips");
        assert_eq!(r.mac, Some([0x0a, 0, 0, 0, 0, 1]));

        let e = requested(&c, Some("fd00::8"), None).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig);
        assert!(
            e.details.contains("fd00::9") && e.details.contains("fd00::8"),
            "{}",
            e.details
        );
        let e = requested(&c, None, Some("0a:00:00:00:00:02")).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig);
        assert_eq!(requested(&conf(""), None, None).unwrap(), Requested::default());
    }

    #[test]
    fn malformed_cni_args_are_code_4_and_malformed_runtime_config_code_7() {
        let c = conf("");
        assert_eq!(
            requested(&c, Some("10.0.0.300"), None).unwrap_err().code,
            Code::InvalidEnv
        );
        assert_eq!(requested(&c, None, Some("nope")).unwrap_err().code, Code::InvalidEnv);
        assert_eq!(
            requested(&c, Some("10.0.0.7,10.0.0.8"), None).unwrap_err().code,
            Code::InvalidEnv
        );
        for bad in [
            r#","runtimeConfig":{"ips":"10.0.0.7"}"#,
            r#","runtimeConfig":{"ips":["banana"]}"#,
            r#","runtimeConfig":{"ips":[7]}"#,
            r#","runtimeConfig":{"mac":"0a:00"}"#,
            r#","runtimeConfig":{"mac":7}"#,
        ] {
            let c = format!(r#"{{"cniVersion":"1.1.0","name":"n","type":"weft"{bad}}}"#);
            assert_eq!(
                NetworkConfig::parse(c.as_bytes(), Cmd::Add).unwrap_err().code,
                Code::InvalidConfig,
                "{bad}"
            );
            assert!(
                NetworkConfig::parse(c.as_bytes(), Cmd::Del).is_ok(),
                "DEL ignores it: {bad}"
            );
        }
    }
}
