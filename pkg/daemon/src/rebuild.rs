//! Rebuilding the state from the kernel when the database was lost (deleted, or moved
//! aside as damaged): one `ready` attachment per weft host end, so the pods keep their
//! addresses and a later ADD does not hand those out again.
//!
//! The kernel says everything but one thing: the alias names the attachment, the host
//! routes its addresses, the host end's addresses its gateways, the pod's namespace its
//! routes and MAC. The prefix of the range an address came from is nowhere; each is
//! recorded under the narrowest range of its gateway that holds every address behind
//! that gateway ([`weft_store::narrowest_range`]), which is enough because allocations
//! are keyed by address: the real range of the next ADD sees them as taken.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use tracing::{info, warn};
use weft_kernel::hostends::{HostEnd, PodEnd, find_pod_end, host_ends, netns_candidates};
use weft_store::{Allocation, Attachment, AttachmentKey, InstalledRoute, PodRef, RebuiltAttachment, State, Store};

use crate::handler::{cni_result, pod_network};

/// Where runtimes put the pods' named network namespaces.
const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// What a rebuild did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Weft host ends found in the node's namespace.
    pub host_ends: usize,
    /// Attachments recorded from the kernel.
    pub attachments: usize,
    /// Host ends that could not be read back (a malformed alias, no address, no pod
    /// namespace found), left alone for people to look at.
    pub skipped: usize,
}

/// Reads an alias key `<network>/<container id>/<ifname>`.
fn parse_key(key: &str) -> Option<AttachmentKey> {
    let (network, rest) = key.split_once('/')?;
    let (container_id, ifname) = rest.rsplit_once('/')?;
    (!network.is_empty() && !container_id.is_empty() && !ifname.is_empty()).then(|| AttachmentKey {
        network: network.to_string(),
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
    })
}

/// The ADD result of a rebuilt attachment, as its ADD made it, so a repeated ADD is
/// answered as before.
fn result_of(r: &RebuiltAttachment) -> String {
    let att = Attachment {
        id: 0,
        key: r.key.clone(),
        netns: r.netns.clone(),
        pod: PodRef::default(),
        host_ifname: r.host_ifname.clone(),
        mtu: r.mtu,
        state: State::Ready,
        result: None,
        addresses: r.addresses.clone(),
        ports: Vec::new(),
        routes: r.routes.clone(),
        pod_mac: r.pod_mac,
    };
    let ours = cni_result(&att, &pod_network(&att), &att.routes);
    serde_json::to_string(&ours).expect("CNI results serialize")
}

/// Turns the host ends into attachments to record; `find` looks up the pod end of a
/// host end, by the pod's interface name. Returns them with the names of the ends it
/// skipped.
pub fn plan(
    ends: &[HostEnd],
    find: impl Fn(&HostEnd, &str) -> Option<PodEnd>,
) -> (Vec<RebuiltAttachment>, Vec<(String, &'static str)>) {
    // Every address behind each gateway, so one gateway gets one range.
    let mut behind: BTreeMap<IpAddr, Vec<IpAddr>> = BTreeMap::new();
    for end in ends {
        for a in &end.pod_addresses {
            if let Some(gw) = end.gateways.iter().find(|g| g.is_ipv4() == a.is_ipv4()) {
                behind.entry(*gw).or_default().push(*a);
            }
        }
    }
    let ranges: BTreeMap<IpAddr, _> = behind
        .iter()
        .filter_map(|(gw, addrs)| Some((*gw, weft_store::narrowest_range(*gw, addrs)?)))
        .collect();
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for end in ends {
        let Some(key) = parse_key(&end.key) else {
            skipped.push((end.name.clone(), "its alias names no attachment"));
            continue;
        };
        let addresses: Vec<Allocation> = end
            .pod_addresses
            .iter()
            .filter_map(|a| {
                let gateway = *end.gateways.iter().find(|g| g.is_ipv4() == a.is_ipv4())?;
                Some(Allocation {
                    address: *a,
                    range: *ranges.get(&gateway)?,
                    gateway,
                })
            })
            .collect();
        if addresses.is_empty() {
            skipped.push((end.name.clone(), "no pod address routed through it"));
            continue;
        }
        // Without its namespace the attachment could be neither checked nor torn down
        // cleanly (reconcile would collect it at once); a pod whose namespace no process
        // and no bind mount holds is gone anyway.
        let Some(pod) = find(end, &key.ifname) else {
            skipped.push((end.name.clone(), "the pod's network namespace was not found"));
            continue;
        };
        let routes = pod
            .routes
            .iter()
            .filter_map(|(dst, prefix, gateway)| {
                Some(InstalledRoute {
                    dst: format!("{dst}/{prefix}").parse().ok()?,
                    gateway: *gateway,
                })
            })
            .collect();
        let mut att = RebuiltAttachment {
            key,
            netns: pod.netns.display().to_string(),
            host_ifname: end.name.clone(),
            mtu: end.mtu,
            addresses,
            routes,
            pod_mac: Some(pod.mac),
            result: None,
        };
        att.result = Some(result_of(&att));
        out.push(att);
    }
    (out, skipped)
}

/// Records an attachment for every weft host end of the node's namespace that the
/// store does not know. Meant for a store that starts empty.
pub async fn rebuild(store: &Store) -> Result<Rebuilt, String> {
    let (found, planned, skipped) = tokio::task::spawn_blocking(|| {
        let ends = host_ends().map_err(|e| e.to_string())?;
        let dirs: Vec<&Path> = NETNS_DIRS.iter().map(Path::new).collect();
        let candidates = netns_candidates(&dirs);
        let (planned, skipped) = plan(&ends, |end, ifname| find_pod_end(&candidates, end, ifname));
        Ok::<_, String>((ends.len(), planned, skipped))
    })
    .await
    .map_err(|e| e.to_string())??;
    let mut done = Rebuilt {
        host_ends: found,
        skipped: skipped.len(),
        ..Rebuilt::default()
    };
    for (name, why) in skipped {
        warn!(host_ifname = %name, reason = why, "a weft host end could not be rebuilt into the state; left alone");
    }
    for att in planned {
        let addresses: Vec<String> = att.addresses.iter().map(|a| a.address.to_string()).collect();
        let (key, host_ifname, netns) = (att.key.clone(), att.host_ifname.clone(), att.netns.clone());
        if store
            .run(move |db| db.record_rebuilt(&att))
            .await
            .map_err(|e| e.to_string())?
        {
            info!(attachment = %key, host_ifname = %host_ifname, netns = %netns, addresses = %addresses.join(","), "rebuilt an attachment from the kernel");
            done.attachments += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn end(name: &str, key: &str, gws: &[&str], pods: &[&str]) -> HostEnd {
        HostEnd {
            name: name.into(),
            key: key.into(),
            mtu: 1450,
            gateways: gws.iter().map(|g| ip(g)).collect(),
            pod_addresses: pods.iter().map(|p| ip(p)).collect(),
            peer_index: Some(2),
            peer_netnsid: Some(0),
        }
    }

    #[test]
    fn host_ends_become_ready_attachments_under_one_range_per_gateway() {
        let ends = [
            end(
                "weft1",
                "weft/c1/eth0",
                &["10.244.1.1", "fd00::1"],
                &["10.244.1.2", "fd00::2"],
            ),
            end("weft2", "weft/c2/eth0", &["10.244.1.1"], &["10.244.1.9"]),
            end("weft3", "bad", &["10.244.1.1"], &["10.244.1.3"]),
            end("weft4", "weft/c4/net1", &["10.244.1.1"], &[]),
        ];
        let (planned, skipped) = plan(&ends, |end, ifname| {
            (end.name == "weft1")
                .then(|| PodEnd {
                    netns: PathBuf::from("/run/netns/p1"),
                    mac: [2, 1, 2, 3, 4, 5],
                    routes: vec![
                        (ip("0.0.0.0"), 0, ip("10.244.1.1")),
                        (ip("10.0.0.0"), 8, ip("10.244.1.1")),
                    ],
                })
                .filter(|_| ifname == "eth0")
        });
        assert_eq!(
            skipped.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
            ["weft2", "weft3", "weft4"],
            "{skipped:?}"
        );
        // A pod whose namespace was not found is left alone.
        assert_eq!(skipped[0].1, "the pod's network namespace was not found");
        assert_eq!(planned.len(), 1);
        let a = &planned[0];
        assert_eq!(a.key.to_string(), "weft/c1/eth0");
        assert_eq!(a.netns, "/run/netns/p1");
        assert_eq!(a.pod_mac, Some([2, 1, 2, 3, 4, 5]));
        assert_eq!(a.routes.len(), 2);
        assert_eq!(a.routes[1].dst.to_string(), "10.0.0.0/8");
        // The IPv4 pods share the range of their gateway, the narrowest holding .2 and
        // .9 (weft2's address counts, though its pod was not found).
        assert_eq!(a.addresses[0].range.to_string(), "10.244.1.0/28");
        assert_eq!(a.addresses[1].range.to_string(), "fd00::/126");
        assert_eq!(a.addresses[1].gateway, ip("fd00::1"));
        // The result a repeated ADD answers with names what the kernel shows.
        let result: serde_json::Value = serde_json::from_str(a.result.as_deref().unwrap()).unwrap();
        assert_eq!(result["ips"][0]["address"], "10.244.1.2/32", "{result}");
        assert_eq!(result["interfaces"][0]["name"], "weft1", "{result}");
        assert_eq!(result["interfaces"][1]["sandbox"], "/run/netns/p1", "{result}");
    }

    #[test]
    fn alias_keys_split_on_the_first_and_last_slash() {
        let k = parse_key("net-a/abc123/eth0").unwrap();
        assert_eq!(
            (k.network.as_str(), k.container_id.as_str(), k.ifname.as_str()),
            ("net-a", "abc123", "eth0")
        );
        assert!(parse_key("net/eth0").is_none());
        assert!(parse_key("/c/eth0").is_none());
    }
}
