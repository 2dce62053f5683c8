//! What the node gives pods whose network config leaves it open: its pod ranges
//! (`ranges`) and the pod MTU (`mtu`). In a cluster weftd learns them from its Node
//! object (`spec.podCIDRs`) and the underlay, and feeds them to the handler through a
//! watch channel ([`crate::Handler::with_pod_defaults`]); a standalone node has none,
//! so its configs must say.

use ipnet::IpNet;
use weft_cni::conf::{DEFAULT_MTU, check_ranges, min_mtu};
use weft_cni::{Cmd, CniError, Code, NetworkConfig};

/// What the node gives pods whose network config leaves it open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDefaults {
    /// The node's pod ranges (its Node's spec.podCIDRs), in order; empty while unknown.
    pub ranges: Vec<IpNet>,
    /// The pod MTU when the config sets none (underlay MTU minus encapsulation); None: 1500.
    pub mtu: Option<u32>,
}

/// The ranges and MTU an ADD or STATUS uses: the config's, else the node's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Effective {
    /// Ranges to allocate from, in order.
    pub ranges: Vec<IpNet>,
    /// MTU of both veth ends.
    pub mtu: u32,
}

/// Resolves `conf`'s ranges and MTU for `cmd` (ADD or STATUS) against the node's
/// `defaults` (`None`: a standalone node, which has none).
///
/// Without ranges anywhere: code 7 on a standalone node (the config must give them);
/// in a cluster whose Node has no `spec.podCIDRs` yet, ADD is code 11 (the runtime
/// retries until the node is given its ranges) and STATUS is code 50 (the network is
/// not ready). The MTU used is checked against the ranges used.
pub(crate) fn resolve(conf: &NetworkConfig, defaults: Option<&PodDefaults>, cmd: Cmd) -> Result<Effective, CniError> {
    let from_node = conf.ranges.is_empty();
    let ranges = if !from_node {
        conf.ranges.clone()
    } else {
        match defaults {
            None => {
                return Err(CniError::new(
                    Code::InvalidConfig,
                    "`ranges` is missing or empty, and this node has no pod ranges to fall back on (weftd runs \
                     outside a cluster): give at least one CIDR, e.g. [\"10.244.1.0/24\"]",
                ));
            }
            Some(d) if d.ranges.is_empty() => {
                return Err(CniError::new(
                    if cmd == Cmd::Status {
                        Code::NotAvailable
                    } else {
                        Code::TryAgainLater
                    },
                    "the node has no pod ranges yet: the network config sets no `ranges` and this node's Node \
                     object has no spec.podCIDRs (yet)",
                ));
            }
            Some(d) => {
                check_ranges(&d.ranges).map_err(|e| {
                    CniError::new(
                        Code::InvalidConfig,
                        format!("the node's pod ranges (spec.podCIDRs) cannot be used: {e}; set `ranges` in the network config"),
                    )
                })?;
                d.ranges.clone()
            }
        }
    };
    let (mtu, whence) = match (conf.mtu, defaults.and_then(|d| d.mtu)) {
        (Some(m), _) => (m, "`mtu`"),
        (None, Some(m)) => (m, "the node's pod MTU (its underlay MTU minus encapsulation)"),
        (None, None) => (DEFAULT_MTU, "the default MTU"),
    };
    let min = min_mtu(&ranges);
    if !(min..=65535).contains(&mtu) {
        return Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "{whence} is {mtu}, but pods with addresses from {} need {min}-65535{}; set `mtu` in the network config",
                ranges.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                if min >= 1280 { " (IPv6 needs at least 1280)" } else { "" },
            ),
        ));
    }
    Ok(Effective { ranges, mtu })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> NetworkConfig {
        let c = format!(r#"{{"cniVersion":"1.1.0","name":"n","type":"weft"{extra}}}"#);
        NetworkConfig::parse(c.as_bytes(), Cmd::Add).unwrap()
    }

    fn node(ranges: &[&str], mtu: Option<u32>) -> PodDefaults {
        PodDefaults {
            ranges: ranges.iter().map(|r| r.parse().unwrap()).collect(),
            mtu,
        }
    }

    #[test]
    fn the_config_wins_and_the_node_fills_in() {
        let n = node(&["10.244.1.0/24", "fd00::/64"], Some(1450));
        let e = resolve(&conf(r#","ranges":["10.9.0.0/24"],"mtu":9000"#), Some(&n), Cmd::Add).unwrap();
        assert_eq!((e.ranges, e.mtu), (vec!["10.9.0.0/24".parse().unwrap()], 9000));
        let e = resolve(&conf(""), Some(&n), Cmd::Add).unwrap();
        assert_eq!((e.ranges, e.mtu), (n.ranges.clone(), 1450));
        let e = resolve(&conf(r#","ranges":["10.9.0.0/24"]"#), None, Cmd::Add).unwrap();
        assert_eq!(e.mtu, 1500);
    }

    #[test]
    fn no_ranges_anywhere_is_7_standalone_and_11_or_50_while_the_node_waits() {
        let e = resolve(&conf(""), None, Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig);
        assert!(e.details.contains("`ranges` is missing"), "{}", e.details);
        let waiting = node(&[], Some(1450));
        let e = resolve(&conf(""), Some(&waiting), Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::TryAgainLater);
        assert!(e.details.contains("no pod ranges yet"), "{}", e.details);
        assert_eq!(
            resolve(&conf(""), Some(&waiting), Cmd::Status).unwrap_err().code,
            Code::NotAvailable
        );
    }

    #[test]
    fn the_mtu_used_is_checked_against_the_ranges_used() {
        // The config's small MTU is fine for its own IPv4 range, not for the node's IPv6.
        let n = node(&["10.244.1.0/24", "fd00::/64"], None);
        let e = resolve(&conf(r#","mtu":1200"#), Some(&n), Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig);
        assert!(e.details.contains("1280"), "{}", e.details);
        let small = node(&["fd00::/64"], Some(1230));
        let e = resolve(&conf(""), Some(&small), Cmd::Add).unwrap_err();
        assert!(e.details.contains("the node's pod MTU"), "{}", e.details);
        let bad = node(&["10.244.1.1/24"], None);
        let e = resolve(&conf(""), Some(&bad), Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig);
        assert!(e.details.contains("spec.podCIDRs"), "{}", e.details);
    }
}
