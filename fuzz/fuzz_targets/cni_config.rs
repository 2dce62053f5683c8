//! The network configuration as the daemon and the plugin read it from stdin: any
//! bytes give a config or a CNI error, never a panic, and an accepted config keeps the
//! promises the daemon relies on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_cni::conf::declared_version;
use weft_cni::result::render;
use weft_cni::version::SUPPORTED;
use weft_cni::{Cmd, NetworkConfig, PluginConfig, code};

const CMDS: [Cmd; 6] = [Cmd::Add, Cmd::Del, Cmd::Check, Cmd::Gc, Cmd::Status, Cmd::Version];

fuzz_target!(|data: &[u8]| {
    let declared = declared_version(data);
    for cmd in CMDS {
        match NetworkConfig::parse(data, cmd) {
            Ok(c) => {
                // The plugin relays what the daemon accepts, under the same version.
                let p = PluginConfig::parse(data, cmd).expect("plugin accepts what the daemon accepts");
                assert_eq!(p.version, c.version);
                assert!(p.socket.starts_with('/'));
                assert!(SUPPORTED.contains(&c.version.to_string().as_str()));
                assert_eq!(declared, c.version.to_string());
                assert!(!c.name.is_empty());
                if matches!(cmd, Cmd::Add | Cmd::Check | Cmd::Status) {
                    // `ranges` may be left to the node (its Node's podCIDRs).
                    for (i, r) in c.ranges.iter().enumerate() {
                        assert_eq!(r.network(), r.addr());
                        for o in &c.ranges[i + 1..] {
                            assert!(!r.contains(o) && !o.contains(r), "{r} overlaps {o}");
                        }
                    }
                    assert!(c.mtu.is_none_or(|m| (68..=65535).contains(&m)));
                } else {
                    assert!(c.port_mappings.is_empty());
                }
                for m in &c.port_mappings {
                    assert!(m.host_port > 0 && m.container_port > 0);
                    assert!(["tcp", "udp", "sctp"].contains(&m.protocol.as_str()));
                }
                // The daemon renders the previous result under the config's version.
                if let Some(prev) = &c.prev_result {
                    let out: serde_json::Value = serde_json::from_slice(&render(c.version, prev)).unwrap();
                    assert_eq!(out["cniVersion"], c.version.to_string());
                }
            }
            Err(e) => {
                assert!(
                    code::ALL.iter().any(|(c, _)| *c == e.code),
                    "undocumented code {}",
                    e.code
                );
                let _: serde_json::Value = serde_json::from_slice(&e.to_json(&declared)).unwrap();
            }
        }
    }
});
