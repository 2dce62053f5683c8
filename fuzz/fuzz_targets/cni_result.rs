//! ADD results: a result (as a previous plugin writes it, in any layout) is merged with
//! weft's own and rendered for every supported version; the output always parses and
//! keeps every interface, IP and route, with interface indices shifted past prevResult.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use weft_cni::result::{merge_prev, render};
use weft_cni::version::SUPPORTED;
use weft_cni::{CNIResult, Interface, IpConfig, SpecVersion};

/// weft's own part of a chained result: one interface and one address on it.
fn ours() -> CNIResult {
    CNIResult {
        interfaces: vec![Interface {
            name: "eth0".into(),
            mac: "02:00:00:00:00:02".into(),
            mtu: Some(1500),
            sandbox: Some("/run/netns/p".into()),
            socket_path: None,
            pci_id: None,
        }],
        ips: vec![IpConfig {
            interface: Some(0),
            address: "10.244.1.2/24".parse().unwrap(),
            gateway: Some("10.244.1.1".parse().unwrap()),
        }],
        routes: Vec::new(),
        dns: None,
    }
}

fn check_render(r: &CNIResult) {
    for v in SUPPORTED {
        let version: SpecVersion = v.parse().unwrap();
        let json: Value = serde_json::from_slice(&render(version, r)).expect("a rendered result is JSON");
        assert_eq!(json["cniVersion"], v);
        let len = |k: &str| json.get(k).and_then(Value::as_array).map_or(0, Vec::len);
        assert_eq!(len("interfaces"), r.interfaces.len());
        assert_eq!(len("ips"), r.ips.len());
        assert_eq!(len("routes"), r.routes.len());
        let back: CNIResult = serde_json::from_value(json.clone()).expect("a rendered result reads back");
        assert_eq!(back.ips, r.ips);
        assert_eq!(
            back.routes.iter().map(|r| (r.dst, r.gw)).collect::<Vec<_>>(),
            r.routes.iter().map(|r| (r.dst, r.gw)).collect::<Vec<_>>()
        );
        if version.is_legacy() {
            for (j, ip) in json["ips"].as_array().into_iter().flatten().zip(&r.ips) {
                let family = if ip.address.addr().to_canonical().is_ipv4() {
                    "4"
                } else {
                    "6"
                };
                assert_eq!(j["version"], family);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(prev) = serde_json::from_slice::<CNIResult>(data) else {
        return;
    };
    check_render(&prev);
    let ours = ours();
    let merged = merge_prev(Some(&prev), &ours);
    let n = prev.interfaces.len();
    assert_eq!(merged.interfaces.len(), n + 1);
    assert_eq!(&merged.ips[..prev.ips.len()], &prev.ips[..]);
    let shifted = merged.ips[prev.ips.len()].interface.unwrap() as usize;
    assert_eq!(merged.interfaces[shifted], ours.interfaces[0]);
    check_render(&merged);
    // weft's result as the previous one of another weft (chained twice).
    let twice = merge_prev(Some(&ours), &prev);
    assert_eq!(twice.ips.len(), prev.ips.len() + 1);
    for (m, p) in twice.ips[1..].iter().zip(&prev.ips) {
        assert_eq!(m.interface, p.interface.map(|i| i.saturating_add(1)));
    }
    check_render(&twice);
});
