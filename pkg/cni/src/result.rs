//! ADD results: weft keeps them in the current (1.1.0) shape and converts them to the
//! version each request asks for, merging a previous plugin's result when chained.

use rscni_types::legacy;
use rscni_types::types::{CNIResult, CNIResultWithVersion};

use crate::version::SpecVersion;

/// Appends `ours` to a previous plugin's result, as a chained plugin must: our
/// interfaces follow the previous ones and our IPs' interface indices shift with them.
pub fn merge_prev(prev: Option<&CNIResult>, ours: &CNIResult) -> CNIResult {
    let Some(prev) = prev else {
        return ours.clone();
    };
    let mut out = prev.clone();
    let offset = u32::try_from(out.interfaces.len()).unwrap_or(u32::MAX);
    out.interfaces.extend(ours.interfaces.iter().cloned());
    out.ips.extend(ours.ips.iter().cloned().map(|mut ip| {
        ip.interface = ip.interface.map(|i| i.saturating_add(offset));
        ip
    }));
    out.routes.extend(ours.routes.iter().cloned());
    if out.dns.is_none() {
        out.dns.clone_from(&ours.dns);
    }
    out
}

/// Serializes `result` as the spec `version` lays it out: fields a version does not
/// know are dropped, and 0.3.x/0.4.0 get their per-IP `version` marker.
pub fn render(version: SpecVersion, result: &CNIResult) -> Vec<u8> {
    let mut r = result.clone();
    if version < SpecVersion::new(1, 1, 0) {
        strip_1_1_fields(&mut r);
    }
    let json = if version.is_legacy() {
        serde_json::to_vec(&legacy::CNIResult::new(version, r))
    } else {
        serde_json::to_vec(&CNIResultWithVersion::new(version, r))
    };
    json.expect("CNI results always serialize")
}

fn strip_1_1_fields(r: &mut CNIResult) {
    for i in &mut r.interfaces {
        i.mtu = None;
        i.socket_path = None;
        i.pci_id = None;
    }
    for rt in &mut r.routes {
        rt.mtu = None;
        rt.advmss = None;
        rt.priority = None;
        rt.table = None;
        rt.scope = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rscni_types::types::{Interface, IpConfig, Route};
    use serde_json::Value;

    fn sample() -> CNIResult {
        CNIResult {
            interfaces: vec![
                Interface {
                    name: "weft0123456789a".into(),
                    mac: "02:00:00:00:00:01".into(),
                    mtu: Some(1500),
                    sandbox: None,
                    socket_path: None,
                    pci_id: None,
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:02".into(),
                    mtu: Some(1500),
                    sandbox: Some("/run/netns/p".into()),
                    socket_path: None,
                    pci_id: None,
                },
            ],
            ips: vec![
                IpConfig {
                    interface: Some(1),
                    address: "10.244.1.2/32".parse().unwrap(),
                    gateway: Some("10.244.1.1".parse().unwrap()),
                },
                IpConfig {
                    interface: Some(1),
                    address: "fd00::2/128".parse().unwrap(),
                    gateway: Some("fd00::1".parse().unwrap()),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("10.244.1.1".parse().unwrap()),
                mtu: None,
                advmss: None,
                priority: None,
                table: None,
                scope: None,
            }],
            dns: None,
        }
    }

    fn render_json(v: &str) -> Value {
        serde_json::from_slice(&render(v.parse().unwrap(), &sample())).unwrap()
    }

    #[test]
    fn current_layout_keeps_mtu_and_has_no_ip_version() {
        let v = render_json("1.1.0");
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["interfaces"][1]["mtu"], 1500);
        assert_eq!(v["interfaces"][1]["sandbox"], "/run/netns/p");
        assert!(v["ips"][0].get("version").is_none());
        assert_eq!(v["ips"][0]["gateway"], "10.244.1.1");
    }

    #[test]
    fn one_zero_drops_1_1_fields() {
        let v = render_json("1.0.0");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(v["interfaces"][1].get("mtu").is_none());
        assert!(v["ips"][0].get("version").is_none());
    }

    #[test]
    fn legacy_layouts_mark_ip_versions() {
        for ver in ["0.3.0", "0.3.1", "0.4.0"] {
            let v = render_json(ver);
            assert_eq!(v["cniVersion"], ver);
            assert_eq!(v["ips"][0]["version"], "4");
            assert_eq!(v["ips"][1]["version"], "6");
            assert!(v["interfaces"][1].get("mtu").is_none());
        }
    }

    #[test]
    fn chaining_shifts_interface_indices() {
        let mut prev = sample();
        prev.interfaces.truncate(1);
        prev.ips.truncate(1);
        prev.ips[0].interface = Some(0);
        let merged = merge_prev(Some(&prev), &sample());
        assert_eq!(merged.interfaces.len(), 3);
        assert_eq!(merged.ips.len(), 3);
        assert_eq!(merged.ips[0].interface, Some(0));
        assert_eq!(merged.ips[1].interface, Some(2));
        assert_eq!(merged.routes.len(), 2);
    }

    #[test]
    fn no_prev_result_is_identity() {
        assert_eq!(merge_prev(None, &sample()), sample());
    }
}
