//! Deciding: from the Node objects, the configuration and a few kernel facts, the state
//! the kernel should be in ([`plan`]); from that and what the kernel holds, the changes
//! to make ([`diff`]). Both are pure, so every decision is unit-tested without root.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use weft_topology::ClusterNode;

use crate::model::*;

/// The MAC of a node's VXLAN device: derived from its name, so every node computes its
/// peers' MACs without asking them. Locally administered, unicast.
pub fn vxlan_mac(node_name: &str) -> Mac {
    let h = Sha256::digest(format!("weft-vxlan/{node_name}").as_bytes());
    let mut m = [h[0], h[1], h[2], h[3], h[4], h[5]];
    m[0] = (m[0] & 0xfe) | 0x02;
    m
}

/// The encapsulation overhead of VXLAN over an underlay of `local`'s family.
pub fn vxlan_overhead(local: IpAddr) -> u32 {
    if local.is_ipv4() {
        VXLAN_OVERHEAD_V4
    } else {
        VXLAN_OVERHEAD_V6
    }
}

/// This node's underlay address: the flag's, else its Node's first `InternalIP`.
pub fn local_address(cfg: &Config, nodes: &[ClusterNode]) -> Option<IpAddr> {
    cfg.node_address.or_else(|| {
        nodes
            .iter()
            .find(|n| n.name == cfg.node_name)
            .and_then(|n| n.addresses.first().copied())
    })
}

/// The peer addresses whose reachability [`plan`] needs to know (for [`Facts::on_link`]).
pub fn addresses_to_look_up(cfg: &Config, nodes: &[ClusterNode]) -> Vec<IpAddr> {
    if !matches!(cfg.routing, PodRouting::Auto | PodRouting::Direct) {
        return Vec::new();
    }
    let mut out: Vec<IpAddr> = nodes
        .iter()
        .filter(|n| n.name != cfg.node_name)
        .flat_map(|n| n.addresses.iter().copied())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Decides the kernel state. `local_ranges` are pod ranges this node serves beyond its
/// Node's podCIDRs (from network configs): never masqueraded among themselves, never
/// routed elsewhere.
pub fn plan(cfg: &Config, nodes: &[ClusterNode], local_ranges: &[IpNet], facts: &Facts) -> Desired {
    let me = nodes.iter().find(|n| n.name == cfg.node_name);
    let ranges: Vec<IpNet> = me.map(|n| n.pod_cidrs.clone()).unwrap_or_default();
    let local = local_address(cfg, nodes);
    let ours: Vec<IpNet> = ranges.iter().chain(local_ranges).copied().collect();
    let mut d = Desired {
        ranges: ranges.clone(),
        unreachable: ours.iter().map(IpNet::trunc).collect(),
        // Only the Node's podCIDRs: a network config's own ranges are not the
        // cluster's to route.
        exported: match cfg.export {
            Some(_) => ranges.iter().map(IpNet::trunc).collect(),
            None => BTreeSet::new(),
        },
        export: cfg.export,
        ..Desired::default()
    };
    let mut peers_with_ranges = 0usize;
    for peer in nodes.iter().filter(|n| n.name != cfg.node_name) {
        let mut modes = BTreeSet::new();
        let mut problems = Vec::new();
        if peer.pod_cidrs.is_empty() {
            problems.push("it has no podCIDRs".to_string());
        } else {
            peers_with_ranges += 1;
        }
        for cidr in &peer.pod_cidrs {
            if let Some(o) = ours.iter().find(|o| o.contains(cidr) || cidr.contains(*o)) {
                problems.push(format!("its podCIDR {cidr} overlaps this node's {o}"));
                continue;
            }
            if cfg.routing == PodRouting::None {
                modes.insert(PeerMode::None);
                continue;
            }
            let v6 = cidr.addr().is_ipv6();
            if matches!(cfg.routing, PodRouting::Auto | PodRouting::Direct) {
                let hop = peer
                    .address_of_family(v6)
                    .filter(|a| facts.on_link.get(a).copied().unwrap_or(false));
                if let Some(gateway) = hop {
                    d.routes.insert(PeerRoute {
                        dst: *cidr,
                        gateway,
                        over_vxlan: false,
                    });
                    modes.insert(PeerMode::Direct);
                    continue;
                }
                if cfg.routing == PodRouting::Direct {
                    problems.push(match peer.address_of_family(v6) {
                        Some(a) => format!("{cidr}: its address {a} is not on-link (direct routing needs one)"),
                        None => format!(
                            "{cidr}: it has no {} address (direct routing needs one)",
                            if v6 { "IPv6" } else { "IPv4" }
                        ),
                    });
                    continue;
                }
            }
            let Some(local) = local else {
                problems.push(format!(
                    "{cidr}: this node's own address is unknown, so VXLAN has no source"
                ));
                continue;
            };
            let Some(vtep) = peer.address_of_family(local.is_ipv6()) else {
                problems.push(format!(
                    "{cidr}: it has no {} address to tunnel to",
                    if local.is_ipv6() { "IPv6" } else { "IPv4" }
                ));
                continue;
            };
            let mac = vxlan_mac(&peer.name);
            let next_hop = cidr.network();
            d.routes.insert(PeerRoute {
                dst: *cidr,
                gateway: next_hop,
                over_vxlan: true,
            });
            d.neighbours.insert((next_hop, mac));
            d.fdb.insert((mac, vtep));
            modes.insert(PeerMode::Vxlan);
        }
        let mode = match (modes.len(), modes.first()) {
            (0, _) => PeerMode::Unreachable,
            // Some ranges may still be unreached: `problem` says why.
            (1, Some(m)) => *m,
            _ => PeerMode::Mixed,
        };
        d.peers.push(PeerReport {
            name: peer.name.clone(),
            mode,
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
        });
    }
    let uses_vxlan = d.routes.iter().any(|r| r.over_vxlan);
    if let (true, Some(local)) = (uses_vxlan, local) {
        let mtu = facts.underlay_mtu.map_or(1500 - vxlan_overhead(local), |m| {
            m.saturating_sub(vxlan_overhead(local))
        });
        d.vxlan = Some(VxlanSpec {
            vni: cfg.vxlan_vni,
            port: cfg.vxlan_port,
            local,
            mac: vxlan_mac(&cfg.node_name),
            mtu,
        });
        d.vxlan_addresses = ranges.iter().map(|r| r.network()).collect();
    }
    d.pod_mtu = match (facts.underlay_mtu, local) {
        (Some(mtu), Some(local)) => {
            // In `auto`, before any peer with pod ranges is known, assume the worst: a
            // pod MTU too small costs a little throughput, one too large black-holes
            // big packets to peers that turn out to need VXLAN.
            let encapsulated = match cfg.routing {
                PodRouting::Vxlan => true,
                PodRouting::Direct | PodRouting::None => false,
                PodRouting::Auto => uses_vxlan || peers_with_ranges == 0,
            };
            Some(if encapsulated {
                mtu.saturating_sub(vxlan_overhead(local))
            } else {
                mtu
            })
        }
        _ => None,
    };
    if cfg.masquerade {
        let pods: Vec<IpNet> = nodes
            .iter()
            .flat_map(|n| n.pod_cidrs.iter().copied())
            .chain(local_ranges.iter().copied())
            .collect();
        d.masquerade = Some(MasqSets {
            pods: IpNet::aggregate(&pods).into_iter().collect(),
            exceptions: IpNet::aggregate(&cfg.no_masquerade).into_iter().collect(),
        });
    }
    d
}

/// The changes that take the kernel from `o` to `d`, in an order the kernel accepts:
/// the device first, then deletions (routes before the entries they resolve through),
/// then additions (entries before the routes that use them).
pub fn diff(d: &Desired, o: &Observed) -> Vec<Change> {
    let mut out = Vec::new();
    let mut tail = Vec::new();
    // Whether what is on the device can be trusted to stay: a device recreated loses
    // its routes, FDB and neighbour entries and addresses.
    let mut fresh = false;
    let mut vxlan_index = None;
    match (&d.vxlan, &o.vxlan) {
        (Some(spec), None) => {
            out.push(Change::CreateVxlan(spec.clone()));
            fresh = true;
        }
        (Some(spec), Some(found)) => {
            let same = found.vni == Some(spec.vni) && found.port == Some(spec.port) && found.local == Some(spec.local);
            if same {
                vxlan_index = Some(found.index);
                if found.mac != spec.mac {
                    out.push(Change::SetVxlanMac(spec.mac));
                }
                if found.mtu != spec.mtu {
                    out.push(Change::SetVxlanMtu(spec.mtu));
                }
                if !found.up {
                    out.push(Change::SetVxlanUp);
                }
            } else {
                out.push(Change::DeleteVxlan);
                out.push(Change::CreateVxlan(spec.clone()));
                fresh = true;
            }
        }
        (None, Some(_)) => tail.push(Change::DeleteVxlan),
        (None, None) => {}
    }
    // What is on the device now: nothing if it is being recreated.
    type OnDevice<'a> = (&'a [IpAddr], &'a [(Mac, IpAddr)], &'a [(IpAddr, Mac)]);
    let on_device: OnDevice = if fresh {
        (&[], &[], &[])
    } else {
        (&o.vxlan_addresses, &o.fdb, &o.neighbours)
    };
    let (addresses, fdb, neighbours) = on_device;
    let routes: Vec<ObservedRoute> = if fresh {
        // Direct routes survive a device being recreated; the device's own do not.
        o.routes
            .iter()
            .filter(|r| o.vxlan.as_ref().is_none_or(|v| r.oif != Some(v.index)))
            .cloned()
            .collect()
    } else {
        o.routes.clone()
    };

    // Indexed once: a pass compares every wanted entry with every found one, which at
    // 5,000 peers must not be a scan per entry.
    let found_by_dst: BTreeMap<IpNet, Vec<&ObservedRoute>> = routes.iter().fold(BTreeMap::new(), |mut m, r| {
        m.entry(r.dst).or_insert_with(Vec::new).push(r);
        m
    });
    let wanted_by_dst: BTreeMap<IpNet, Vec<&PeerRoute>> = d.routes.iter().fold(BTreeMap::new(), |mut m, r| {
        m.entry(r.dst).or_insert_with(Vec::new).push(r);
        m
    });
    let matches = |r: &PeerRoute, found: &ObservedRoute| {
        !found.unreachable
            && found.dst == r.dst
            && found.gateway == Some(r.gateway)
            && (if r.over_vxlan {
                vxlan_index.is_some() && found.oif == vxlan_index
            } else {
                vxlan_index.is_none() || found.oif != vxlan_index
            })
    };
    for found in &routes {
        let wanted = if found.unreachable {
            d.unreachable.contains(&found.dst)
        } else {
            wanted_by_dst
                .get(&found.dst)
                .is_some_and(|rs| rs.iter().any(|r| matches(r, found)))
        };
        if !wanted {
            out.push(Change::DeleteRoute(found.clone()));
        }
    }
    let wanted_neigh: BTreeMap<IpAddr, Mac> = d.neighbours.iter().copied().collect();
    let (found_fdb, found_neigh, found_addr): (BTreeSet<_>, BTreeSet<_>, BTreeSet<_>) = (
        fdb.iter().copied().collect(),
        neighbours.iter().copied().collect(),
        addresses.iter().copied().collect(),
    );
    for (ip, _) in neighbours {
        if !wanted_neigh.contains_key(ip) {
            out.push(Change::DeleteNeighbour(*ip));
        }
    }
    for entry in fdb {
        if !d.fdb.contains(entry) {
            out.push(Change::DeleteFdb(entry.0, entry.1));
        }
    }
    for a in addresses {
        if !d.vxlan_addresses.contains(a) {
            out.push(Change::DeleteAddress(*a));
        }
    }
    if d.vxlan.is_some() {
        for a in &d.vxlan_addresses {
            if !found_addr.contains(a) {
                out.push(Change::AddAddress(*a));
            }
        }
        for entry in &d.fdb {
            if !found_fdb.contains(entry) {
                out.push(Change::AddFdb(entry.0, entry.1));
            }
        }
        for (ip, mac) in &d.neighbours {
            if !found_neigh.contains(&(*ip, *mac)) {
                out.push(Change::AddNeighbour(*ip, *mac));
            }
        }
    }
    let found = |dst: &IpNet| found_by_dst.get(dst).map(Vec::as_slice).unwrap_or_default();
    for dst in &d.unreachable {
        if !found(dst).iter().any(|f| f.unreachable) {
            out.push(Change::AddUnreachable(*dst));
        }
    }
    for r in &d.routes {
        if r.over_vxlan && d.vxlan.is_none() {
            continue;
        }
        if !found(&r.dst).iter().any(|f| matches(r, f)) || (r.over_vxlan && fresh) {
            out.push(Change::AddRoute(r.clone()));
        }
    }
    if let Some(e) = d.export {
        for dst in &o.exported {
            if !d.exported.contains(dst) {
                out.push(Change::Withdraw(*dst, e));
            }
        }
        let exported: BTreeSet<&IpNet> = o.exported.iter().collect();
        for dst in &d.exported {
            if !exported.contains(dst) {
                out.push(Change::Export(*dst, e));
            }
        }
    }
    out.extend(tail);
    out
}

#[cfg(test)]
mod tests;
