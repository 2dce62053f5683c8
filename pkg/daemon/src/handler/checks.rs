//! Checks of a call's requests against the ranges and an existing attachment, made
//! before anything is touched.

use ipnet::IpNet;
use weft_cni::request::Requested;
use weft_cni::{CniError, Code, NetworkConfig};
use weft_store::{Attachment, Family};

use crate::naming;

/// Refuses a route `gw` that cannot be the pod's next hop before anything is touched:
/// a weft pod has one neighbour, the host end, which holds the gateway of the pod's
/// range of each family; so a `gw` must be the gateway of one of `ranges`.
pub(super) fn check_route_gateways(conf: &NetworkConfig, ranges: &[IpNet]) -> Result<(), CniError> {
    for r in &conf.routes {
        let Some(gw) = r.gw else { continue };
        let family: Vec<&IpNet> = ranges.iter().filter(|n| n.addr().is_ipv4() == gw.is_ipv4()).collect();
        if !family.iter().any(|n| weft_store::gateway(n) == gw) {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "`routes`: the route to {} names gw {gw}, but a pod's only next hop is the gateway of its range \
                     (the first address: {}); leave `gw` out",
                    r.dst,
                    if family.is_empty() {
                        "the network has no range of that family".to_string()
                    } else {
                        family
                            .iter()
                            .map(|n| format!("{} for {n}", weft_store::gateway(n)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a requested address outside every range before anything is touched,
/// naming where it was asked for and the ranges. (The store refuses the rest in the
/// ADD's transaction: an address that is no pod address of its range, or is taken.)
pub(super) fn check_requested(req: &Requested, ranges: &[IpNet]) -> Result<(), CniError> {
    for r in &req.ips {
        if ranges.iter().any(|n| n.contains(&r.address)) {
            continue;
        }
        let family = if r.address.is_ipv4() { Family::V4 } else { Family::V6 };
        let same: Vec<String> = ranges
            .iter()
            .filter(|n| n.addr().is_ipv4() == r.address.is_ipv4())
            .map(ToString::to_string)
            .collect();
        return Err(CniError::new(
            Code::InvalidConfig,
            if same.is_empty() {
                format!(
                    "{} asks for {}, but the network has no {family} range (ranges: {})",
                    r.source,
                    r.address,
                    ranges.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                )
            } else {
                format!(
                    "{} asks for {}, which is outside every {family} range of the network: {}",
                    r.source,
                    r.address,
                    same.join(", ")
                )
            },
        ));
    }
    Ok(())
}

/// Refuses to return an attachment that exists already for an ADD asking for
/// another address or MAC than it has: the runtime would believe the pod has them.
pub(super) fn check_existing_matches(att: &Attachment, req: &Requested) -> Result<(), CniError> {
    let differs = |what: String| {
        Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "attachment {} exists already with {what}; DEL it before asking for another",
                att.key
            ),
        ))
    };
    for r in &req.ips {
        if !att.addresses.iter().any(|a| a.address == r.address) {
            let held: Vec<String> = att.addresses.iter().map(|a| a.address.to_string()).collect();
            return differs(format!(
                "address {} ({} asks for {})",
                held.join(", "),
                r.source,
                r.address
            ));
        }
    }
    if let Some(mac) = req.mac {
        let has = att
            .pod_mac
            .unwrap_or_else(|| naming::macs(&att.key.container_id, &att.key.ifname).1);
        if has != mac {
            return differs(format!(
                "MAC {} (this ADD asks for {})",
                naming::mac_string(&has),
                naming::mac_string(&mac)
            ));
        }
    }
    Ok(())
}
