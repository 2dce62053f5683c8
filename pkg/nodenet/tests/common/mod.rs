//! Helpers of the node network's root tests: a node namespace with an uplink behind a
//! "router" namespace, passes run inside it, and the kernel read back with `ip`,
//! `bridge` and `nft`.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;
use weft_kernel::testutil::TempNetns;
use weft_nodenet::*;
use weft_topology::ClusterNode;

/// Runs a command inside the namespace at `ns` and returns its stdout; panics on failure.
pub fn sh(ns: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.display()))
        .args(args)
        .output()
        .expect("nsenter runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn json(ns: &std::path::Path, args: &[&str]) -> Value {
    let text = sh(ns, args);
    if text.trim().is_empty() {
        return Value::Array(vec![]);
    }
    serde_json::from_str(&text).unwrap()
}

pub fn node(name: &str, addr: &str, cidrs: &[&str]) -> ClusterNode {
    ClusterNode {
        name: name.into(),
        addresses: vec![addr.parse().unwrap()],
        pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        ..Default::default()
    }
}

/// A node namespace whose uplink (172.30.1.2/24, MTU `mtu`) faces a "router"
/// namespace (172.30.1.1), with every other subnet behind the router.
pub struct Node {
    pub ns: TempNetns,
    _router: TempNetns,
}

impl Node {
    pub fn new(mtu: u32) -> Self {
        let ns = TempNetns::new();
        let router = TempNetns::new();
        let m = mtu.to_string();
        sh(
            ns.path(),
            &[
                "ip", "link", "add", "uplink", "mtu", &m, "type", "veth", "peer", "name", "rt0", "mtu", &m,
            ],
        );
        // Move the far end into the router namespace: `ip` names a namespace by a pid,
        // and the thread that owns it has one (/proc/<pid>/task/<tid>/ns/net).
        let tid = router
            .path()
            .components()
            .nth(4)
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .to_string();
        sh(ns.path(), &["ip", "link", "set", "dev", "rt0", "netns", &tid]);
        sh(ns.path(), &["ip", "addr", "add", "172.30.1.2/24", "dev", "uplink"]);
        sh(ns.path(), &["ip", "link", "set", "uplink", "up"]);
        sh(ns.path(), &["ip", "link", "set", "lo", "up"]);
        sh(router.path(), &["ip", "addr", "add", "172.30.1.1/24", "dev", "rt0"]);
        sh(router.path(), &["ip", "link", "set", "rt0", "up"]);
        sh(ns.path(), &["ip", "route", "add", "default", "via", "172.30.1.1"]);
        Node { ns, _router: router }
    }

    pub fn kernel(&self) -> HostKernel {
        self.ns.run(|| HostKernel::new().unwrap())
    }

    /// One pass inside the namespace (sysctls and nft run there too).
    pub fn pass(&self, cfg: &Config, nodes: &[ClusterNode], previous: Option<&Desired>) -> (Desired, PassOutcome) {
        let mut k = self.kernel();
        let (cfg, nodes, previous) = (cfg.clone(), nodes.to_vec(), previous.cloned());
        self.ns
            .run(move || run_pass(&cfg, &nodes, &[], previous.as_ref(), &mut k))
    }

    /// weft's routes to peers (its unreachable routes left out: see [`Node::unreachable`]).
    pub fn routes(&self) -> Vec<(String, String, String)> {
        let v = json(self.ns.path(), &["ip", "-j", "route", "show", "proto", "75"]);
        let mut out: Vec<_> = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["type"] != "unreachable")
            .map(|r| {
                (
                    r["dst"].as_str().unwrap_or_default().to_string(),
                    r["gateway"].as_str().unwrap_or_default().to_string(),
                    r["dev"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// weft's unreachable routes (this node's pod ranges), both families.
    pub fn unreachable(&self) -> Vec<String> {
        let mut out = Vec::new();
        for family in ["-4", "-6"] {
            let v = json(
                self.ns.path(),
                &[
                    "ip",
                    family,
                    "-j",
                    "route",
                    "show",
                    "proto",
                    "75",
                    "type",
                    "unreachable",
                ],
            );
            out.extend(
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["dst"].as_str().unwrap_or_default().to_string()),
            );
        }
        out.sort();
        out
    }

    pub fn fdb(&self) -> Vec<(String, String)> {
        if self.link(VXLAN_DEVICE).is_none() {
            return Vec::new();
        }
        let v = json(self.ns.path(), &["bridge", "-j", "fdb", "show", "dev", VXLAN_DEVICE]);
        let mut out: Vec<_> = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["dst"].is_string())
            .map(|e| {
                (
                    e["mac"].as_str().unwrap().to_string(),
                    e["dst"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    pub fn neighbours(&self) -> Vec<(String, String)> {
        let v = json(
            self.ns.path(),
            &["ip", "-j", "neigh", "show", "dev", VXLAN_DEVICE, "nud", "permanent"],
        );
        let mut out: Vec<_> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["dst"].as_str().unwrap().to_string(),
                    e["lladdr"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    pub fn link(&self, name: &str) -> Option<Value> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path().display()))
            .args(["ip", "-j", "-d", "link", "show", name])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone())
    }

    pub fn masquerade_sets(&self) -> String {
        sh(self.ns.path(), &["nft", "list", "table", "inet", "weft-egress"])
    }
}
