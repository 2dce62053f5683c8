//! One path's lab: two nodes joined as weft's routing or the hand-made reference joins
//! them, with a pod on each.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use crate::TrafficOptions;
use crate::util::{LabGuard, ip};

use super::setup::sysctl;

use super::{PodMode, PodPath, REF_DEVICE, VXLAN_OVERHEAD, VXLAN_PORT, VXLAN_VNI};

/// Runs `ip args` and returns its stdout.
pub(super) fn ip_out(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

pub(super) fn ip_json(args: &[&str]) -> Result<serde_json::Value, String> {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let text = ip_out(&all)?;
    serde_json::from_str(&text).map_err(|e| format!("ip {}: {e}", args.join(" ")))
}

/// A lab of one path, with what the traffic needs.
pub(super) struct PathLab {
    pub(super) path: PodPath,
    pub(super) guard: LabGuard,
    /// Pod `b`'s IPv4 address.
    pub(super) dst: Ipv4Addr,
}

impl PathLab {
    pub(super) fn client(&self) -> String {
        self.guard.lab.pod_ns("a")
    }

    pub(super) fn server(&self) -> String {
        self.guard.lab.pod_ns("b")
    }

    fn nodes(&self) -> Result<[(String, String, String); 2], String> {
        // (namespace, underlay address, pod range) of n1 and n2.
        let lab = &self.guard.lab;
        let one = |n: &str| -> Result<(String, String, String), String> {
            let spec = lab.spec.nodes.iter().find(|s| s.name == n).ok_or("no such node")?;
            Ok((
                lab.node_ns(n),
                lab.address_of(n).ok_or_else(|| format!("no address for {n}"))?,
                spec.pod_range.clone(),
            ))
        };
        Ok([one("n1")?, one("n2")?])
    }

    /// Routes pods across the nodes by hand, as the path's mode does.
    fn route_by_hand(&self) -> Result<(), String> {
        let [n1, n2] = self.nodes()?;
        match self.path.mode() {
            PodMode::Direct => {
                for ((ns, _, _), (_, peer, peer_range)) in [(&n1, &n2), (&n2, &n1)] {
                    ip(&["-n", ns, "route", "add", peer_range, "via", peer])?;
                }
            }
            PodMode::Bgp => {
                // What BIRD would install: each node's range via the router, and on the
                // router via the node.
                let lab = &self.guard.lab;
                let router = lab.router();
                for ((ns, _, _), (_, peer, peer_range)) in [(&n1, &n2), (&n2, &n1)] {
                    let gw = gateway_of(lab, ns)?;
                    ip(&["-n", ns, "route", "add", peer_range, "via", &gw])?;
                    ip(&["-n", &router, "route", "add", peer_range, "via", peer])?;
                }
            }
            PodMode::Vxlan => {
                let mtu = (self.guard.lab.spec.underlay_mtu - VXLAN_OVERHEAD).to_string();
                let macs = ["02:6b:76:78:00:01", "02:6b:76:78:00:02"];
                let nodes = [&n1, &n2];
                for i in 0..2 {
                    let (ns, local, range) = nodes[i];
                    let (_, peer, peer_range) = nodes[1 - i];
                    let (mac, peer_mac) = (macs[i], macs[1 - i]);
                    let network = |r: &str| r.split('/').next().unwrap_or_default().to_string();
                    ip(&[
                        "-n",
                        ns,
                        "link",
                        "add",
                        REF_DEVICE,
                        "address",
                        mac,
                        "mtu",
                        &mtu,
                        "type",
                        "vxlan",
                        "id",
                        VXLAN_VNI,
                        "local",
                        local,
                        "dstport",
                        VXLAN_PORT,
                        "nolearning",
                        "udpcsum",
                    ])?;
                    sysctl(ns, &format!("net.ipv6.conf.{REF_DEVICE}.accept_dad=0"))?;
                    ip(&["-n", ns, "link", "set", REF_DEVICE, "up"])?;
                    ip(&[
                        "-n",
                        ns,
                        "addr",
                        "add",
                        &format!("{}/32", network(range)),
                        "dev",
                        REF_DEVICE,
                    ])?;
                    ip(&[
                        "-n",
                        ns,
                        "neigh",
                        "replace",
                        &network(peer_range),
                        "lladdr",
                        peer_mac,
                        "dev",
                        REF_DEVICE,
                        "nud",
                        "permanent",
                    ])?;
                    // The unicast FDB entry: the peer's MAC behind the peer's address.
                    let out = Command::new("bridge")
                        .args([
                            "-n",
                            ns,
                            "fdb",
                            "append",
                            peer_mac,
                            "dev",
                            REF_DEVICE,
                            "dst",
                            peer,
                            "self",
                            "permanent",
                        ])
                        .output()
                        .map_err(|e| format!("running bridge: {e}"))?;
                    if !out.status.success() {
                        return Err(format!(
                            "bridge fdb append: {}",
                            String::from_utf8_lossy(&out.stderr).trim()
                        ));
                    }
                    ip(&[
                        "-n",
                        ns,
                        "route",
                        "add",
                        peer_range,
                        "via",
                        &network(peer_range),
                        "dev",
                        REF_DEVICE,
                        "onlink",
                    ])?;
                }
                // The pods' MTU as weft gives it under VXLAN: both ends of each veth.
                for (pod, ns) in [("a", &n1.0), ("b", &n2.0)] {
                    let pod_ns = self.guard.lab.pod_ns(pod);
                    let addr = self.guard.lab.pod_addresses(pod).into_iter().find(IpAddr::is_ipv4);
                    let addr = addr
                        .ok_or_else(|| format!("pod {pod} has no IPv4 address"))?
                        .to_string();
                    let route = ip_json(&["-n", ns, "route", "get", &addr])?;
                    let host_end = route[0]["dev"].as_str().ok_or("no route to the pod")?.to_string();
                    ip(&["-n", &pod_ns, "link", "set", "eth0", "mtu", &mtu])?;
                    ip(&["-n", ns, "link", "set", &host_end, "mtu", &mtu])?;
                }
            }
        }
        Ok(())
    }

    /// Checks that the node holds what the path means: weft's route of the mode, or
    /// none of weft's routes and the hand-made ones.
    pub(super) fn check_routing(&self) -> Result<(), String> {
        let [(ns, _, _), (_, peer, peer_range)] = self.nodes()?;
        let weft_routes = ip_json(&["-n", &ns, "-4", "route", "show", "proto", "75"])?;
        // The node's own range has an unreachable route in every mode: not a route to a peer.
        let routes: Vec<_> = weft_routes
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r["type"] != "unreachable")
            .collect();
        let to_peer = routes.iter().find(|r| r["dst"].as_str() == Some(peer_range.as_str()));
        let fail = |what: &str| Err(format!("{}: {what} (routes of weft: {weft_routes})", self.path.label()));
        match self.path {
            PodPath::WeftDirect => match to_peer {
                Some(r) if r["gateway"].as_str() == Some(peer.as_str()) && r["dev"] != "weft-vxlan" => Ok(()),
                _ => fail("no direct route to the peer's pods"),
            },
            PodPath::WeftVxlan => match to_peer {
                Some(r) if r["dev"] == "weft-vxlan" => Ok(()),
                _ => fail("no route to the peer's pods through weft-vxlan"),
            },
            PodPath::WeftBgp | PodPath::KernelRouted => {
                // Neither weft's route nor its device: the route is BIRD's (or ours).
                let all = ip_json(&["-n", &ns, "-4", "route", "show", &peer_range])?;
                let proto = all[0]["protocol"].as_str().unwrap_or_default().to_string();
                // `ip` leaves `boot`, its own default, unsaid.
                let ours = if self.path == PodPath::WeftBgp {
                    proto == "bird"
                } else {
                    all.as_array().is_some_and(|a| !a.is_empty()) && (proto.is_empty() || proto == "boot")
                };
                if !routes.is_empty() {
                    fail("weft routes pods although its routing is off")
                } else if !ours {
                    fail(&format!("the route to the peer's pods is not the path's own: {all}"))
                } else {
                    Ok(())
                }
            }
            PodPath::KernelDirect | PodPath::KernelVxlan if !routes.is_empty() => {
                fail("weft routes pods although its routing is off")
            }
            PodPath::KernelDirect | PodPath::KernelVxlan => Ok(()),
        }
    }

    pub(super) fn pod_mtu(&self) -> u32 {
        ip_json(&["-n", &self.client(), "link", "show", "eth0"])
            .ok()
            .and_then(|v| v[0]["mtu"].as_u64())
            .unwrap_or(0) as u32
    }
}

/// The router's address on node namespace `ns`'s subnet (its default gateway).
fn gateway_of(lab: &weft_lab::Lab, ns: &str) -> Result<String, String> {
    let route = ip_json(&["-n", ns, "-4", "route", "show", "default"])?;
    route[0]["gateway"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no default route in {ns}", lab.spec.name))
}

pub(super) fn build(path: PodPath, opts: &TrafficOptions, name: &str) -> Result<PathLab, String> {
    let dir = opts.work_dir.join(name);
    let guard = LabGuard::up(&dir, &path.spec(name), &opts.weftd, &opts.weft)?;
    let dst = guard
        .lab
        .pod_addresses("b")
        .into_iter()
        .find_map(|a| match a {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .ok_or("pod b has no IPv4 address")?;
    let lab = PathLab { path, guard, dst };
    if !path.weft() {
        lab.route_by_hand().map_err(|e| format!("{}: {e}", path.label()))?;
    }
    Ok(lab)
}
