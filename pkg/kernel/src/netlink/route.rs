//! Routes: adding, deleting and listing them.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::socket::Netlink;

/// A route as weft sees it (main table only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    /// Destination address.
    pub dst: Option<IpAddr>,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Next hop, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface index.
    pub oif: Option<u32>,
    /// The source address the node's own packets on this route take (`src`).
    pub prefsrc: Option<IpAddr>,
}

fn route_header(v6: bool, prefix_len: u8) -> RouteHeader {
    RouteHeader {
        address_family: if v6 { AddressFamily::Inet6 } else { AddressFamily::Inet },
        destination_prefix_length: prefix_len,
        table: RouteHeader::RT_TABLE_MAIN,
        protocol: RouteProtocol::from(crate::ROUTE_PROTOCOL),
        kind: RouteType::Unicast,
        ..RouteHeader::default()
    }
}

fn to_route(r: RouteMessage) -> Option<RouteEntry> {
    let table = r
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    let mut e = RouteEntry {
        dst: None,
        prefix_len: r.header.destination_prefix_length,
        gateway: None,
        oif: None,
        prefsrc: None,
    };
    for a in r.attributes {
        match a {
            RouteAttribute::Destination(d) => e.dst = route_ip(d),
            RouteAttribute::Gateway(g) => e.gateway = route_ip(g),
            RouteAttribute::Oif(o) => e.oif = Some(o),
            RouteAttribute::PrefSource(s) => e.prefsrc = route_ip(s),
            _ => {}
        }
    }
    Some(e)
}

fn route_ip(a: RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(v6)),
        _ => None,
    }
}

impl Netlink {
    /// Adds a route in the main table, marked with weft's protocol number.
    ///
    /// `dst`/`prefix_len` is the destination (`None` = default route), `gateway` the next
    /// hop (`None` = directly on the link), `oif` the output link.
    pub fn add_route(
        &mut self,
        dst: Option<IpAddr>,
        prefix_len: u8,
        gateway: Option<IpAddr>,
        oif: u32,
        v6: bool,
    ) -> io::Result<()> {
        let mut msg = RouteMessage::default();
        msg.header = route_header(v6, prefix_len);
        msg.header.scope = if gateway.is_none() && !v6 {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        if let Some(d) = dst {
            msg.attributes.push(RouteAttribute::Destination(RouteAddress::from(d)));
        }
        if let Some(g) = gateway {
            msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(g)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        self.execute(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Adds the link route to one address (a /32 or /128) out of `oif`, marked with
    /// weft's protocol number, whose packets from this namespace leave from `src` (the
    /// route's preferred source, which must be an address of this namespace already):
    /// the host's route to a pod, which answers from the pod's gateway.
    pub fn add_host_route(&mut self, dst: IpAddr, oif: u32, src: Option<IpAddr>) -> io::Result<()> {
        let v6 = dst.is_ipv6();
        let mut msg = RouteMessage::default();
        msg.header = route_header(v6, super::host_prefix(&dst));
        msg.header.scope = if v6 { RouteScope::Universe } else { RouteScope::Link };
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        if let Some(s) = src {
            msg.attributes.push(RouteAttribute::PrefSource(RouteAddress::from(s)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        self.execute(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Deletes a route of the main table; returns whether it existed.
    pub fn delete_route(&mut self, dst: Option<IpAddr>, prefix_len: u8, oif: u32, v6: bool) -> io::Result<bool> {
        let mut msg = RouteMessage::default();
        msg.header = route_header(v6, prefix_len);
        msg.header.protocol = RouteProtocol::Unspec;
        msg.header.kind = RouteType::Unspec;
        msg.header.scope = RouteScope::NoWhere;
        if let Some(d) = dst {
            msg.attributes.push(RouteAttribute::Destination(RouteAddress::from(d)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        self.execute_if_present(RouteNetlinkMessage::DelRoute(msg), libc::ESRCH)
    }

    /// Routes of the main table of one family.
    pub fn routes(&mut self, v6: bool) -> io::Result<Vec<RouteEntry>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
        Ok(self
            .dump(RouteNetlinkMessage::GetRoute(msg))?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => to_route(r),
                _ => None,
            })
            .collect())
    }
}
