//! Reading back, without changing anything, the pod attachments weft made on this node:
//! each host end carries the alias `weft:<network>/<container id>/<ifname>` and a host
//! route per pod address, which names the pod's IPv4 gateway as its source; an IPv6
//! gateway is an address of the host end (and so was an IPv4 one, on a pod built
//! before the node held them: [`crate::ptp`]). What the node daemon rebuilds its state
//! from when its database is lost.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::netlink::{Netlink, host_prefix};
use crate::{KernelError, NetNs, in_netns};

/// The prefix of the alias weft puts on every host end.
pub const ALIAS_PREFIX: &str = "weft:";

/// A weft host end found in the calling thread's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEnd {
    /// Its name.
    pub name: String,
    /// Its alias, without [`ALIAS_PREFIX`] (`<network>/<container id>/<ifname>`).
    pub key: String,
    /// Its MTU.
    pub mtu: u32,
    /// The gateways of the pod's addresses: its host routes' sources and its own
    /// host addresses (/32 or /128).
    pub gateways: Vec<IpAddr>,
    /// The pod addresses routed through it (host routes, /32 or /128).
    pub pod_addresses: Vec<IpAddr>,
    /// The pod end's index in the pod's namespace.
    pub peer_index: Option<u32>,
    /// The id this namespace knows the pod's namespace by.
    pub peer_netnsid: Option<i32>,
}

/// Every weft host end of the calling thread's namespace.
pub fn host_ends() -> Result<Vec<HostEnd>, KernelError> {
    let os = |what: &'static str| move |e| KernelError::os(what, e);
    let mut nl = Netlink::new().map_err(os("opening netlink"))?;
    let links = nl.links_with_alias().map_err(os("listing links"))?;
    let mut routes = nl.routes(false).map_err(os("listing IPv4 routes"))?;
    routes.extend(nl.routes(true).map_err(os("listing IPv6 routes"))?);
    let mut out = Vec::new();
    for l in links {
        let Some(key) = l.alias.as_deref().and_then(|a| a.strip_prefix(ALIAS_PREFIX)) else {
            continue;
        };
        let link = l.link;
        let host_routes: Vec<_> = routes
            .iter()
            .filter(|r| r.oif == Some(link.index) && r.gateway.is_none())
            .filter(|r| r.dst.is_some_and(|d| r.prefix_len == host_prefix(&d)))
            .collect();
        let mut gateways: Vec<IpAddr> = host_routes.iter().filter_map(|r| r.prefsrc).collect();
        for (a, p) in nl.addresses(link.index).map_err(os("listing addresses"))? {
            if p == host_prefix(&a) && !is_link_local(&a) && !gateways.contains(&a) {
                gateways.push(a);
            }
        }
        let pod_addresses = host_routes.iter().filter_map(|r| r.dst).collect();
        out.push(HostEnd {
            name: link.name,
            key: key.to_string(),
            mtu: link.mtu,
            gateways,
            pod_addresses,
            peer_index: l.peer_index,
            peer_netnsid: l.peer_netnsid,
        });
    }
    Ok(out)
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The pod end of an attachment, found in a pod's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEnd {
    /// The namespace's path.
    pub netns: PathBuf,
    /// The pod end's MAC.
    pub mac: [u8; 6],
    /// The pod's routes through a gateway over that interface: (destination, prefix
    /// length, gateway); a default route has the unspecified address as destination.
    pub routes: Vec<(IpAddr, u8, IpAddr)>,
}

/// The namespaces a pod end may be in: the named ones under `dirs` (`/run/netns`,
/// where runtimes bind theirs), then every process's (`/proc/<pid>/ns/net`: a runtime
/// that binds none still runs the pod's sandbox process in it).
pub fn netns_candidates(dirs: &[&Path]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .collect();
    if let Ok(procs) = std::fs::read_dir("/proc") {
        out.extend(
            procs
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
                .map(|e| e.path().join("ns/net")),
        );
    }
    out
}

/// Finds, among `candidates` (see [`netns_candidates`]), the namespace holding `end`'s
/// pod end, named `ifname`: the namespace the calling thread's namespace knows by the
/// host end's peer namespace id, so a pod end of the same name and address elsewhere
/// is never taken for it.
pub fn find_pod_end(candidates: &[PathBuf], end: &HostEnd, ifname: &str) -> Option<PodEnd> {
    let (peer_nsid, peer_index) = (end.peer_netnsid?, end.peer_index?);
    let mut nl = Netlink::new().ok()?;
    for path in candidates.iter().cloned() {
        let Ok(ns) = NetNs::open(&path) else { continue };
        if nl.nsid_of(ns.raw_fd()).ok().flatten() != Some(peer_nsid) {
            continue;
        }
        let found = in_netns(&ns, || {
            let os = |what: &'static str| move |e| KernelError::os(what, e);
            let mut nl = Netlink::new().map_err(os("opening netlink"))?;
            let Some(link) = nl.link_by_name(ifname).map_err(os("looking up the pod end"))? else {
                return Ok(None);
            };
            if link.index != peer_index {
                return Ok(None);
            }
            let mut routes = nl.routes(false).map_err(os("listing routes"))?;
            routes.extend(nl.routes(true).map_err(os("listing routes"))?);
            let routes = routes
                .into_iter()
                .filter(|r| r.oif == Some(link.index))
                .filter_map(|r| {
                    let gw = r.gateway?;
                    let dst = r.dst.unwrap_or(if gw.is_ipv4() {
                        IpAddr::from([0u8; 4])
                    } else {
                        IpAddr::from([0u8; 16])
                    });
                    Some((dst, r.prefix_len, gw))
                })
                .collect();
            let mut mac = [0u8; 6];
            if link.mac.len() == 6 {
                mac.copy_from_slice(&link.mac);
            }
            Ok(Some((mac, routes)))
        });
        if let Ok(Some((mac, routes))) = found {
            return Some(PodEnd {
                netns: path,
                mac,
                routes,
            });
        }
    }
    None
}
