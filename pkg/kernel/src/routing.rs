//! Netlink operations for routing pod traffic between nodes: route lookups and routes of
//! one protocol, a VXLAN device living in the node's own namespace, its neighbour and
//! FDB entries, and addresses by owner. The wire and pod drivers use the rest of
//! [`Netlink`]; these are only what the node network needs on top.

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::Netlink;

/// What the kernel answers for "how is this address reached?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteLookup {
    /// The next hop, when the address is not on-link.
    pub gateway: Option<IpAddr>,
    /// The link the traffic leaves on.
    pub oif: Option<u32>,
    /// Whether the address is one of this namespace's own.
    pub local: bool,
}

impl RouteLookup {
    /// Reached on a directly connected link, without a gateway.
    pub fn on_link(&self) -> bool {
        !self.local && self.gateway.is_none() && self.oif.is_some()
    }
}

/// A route as the node network sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoRoute {
    /// Destination.
    pub dst: IpNet,
    /// Next hop.
    pub gateway: Option<IpAddr>,
    /// Output link.
    pub oif: Option<u32>,
    /// Whether it is an `unreachable` route (answered locally, never forwarded) rather
    /// than a route somewhere.
    pub unreachable: bool,
}

/// The parameters of a VXLAN device, as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanParams {
    /// VNI.
    pub vni: Option<u32>,
    /// UDP port.
    pub port: Option<u16>,
    /// Local (source) address.
    pub local: Option<IpAddr>,
}

fn family(v6: bool) -> AddressFamily {
    if v6 { AddressFamily::Inet6 } else { AddressFamily::Inet }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// A route's gateway and output link, as far as it names them.
fn next_hop(attrs: &[RouteAttribute]) -> (Option<IpAddr>, Option<u32>) {
    let gateway = attrs.iter().find_map(|a| match a {
        RouteAttribute::Gateway(g) => route_ip(g),
        _ => None,
    });
    let oif = attrs.iter().find_map(|a| match a {
        RouteAttribute::Oif(o) => Some(*o),
        _ => None,
    });
    (gateway, oif)
}

fn neighbour_ip(a: &NeighbourAddress) -> Option<IpAddr> {
    match a {
        NeighbourAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        NeighbourAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        NeighbourAddress::Other(b) => match b.len() {
            4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    }
}

fn neighbour_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

fn mac_of(attrs: &[NeighbourAttribute]) -> Option<[u8; 6]> {
    attrs.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => Some([l[0], l[1], l[2], l[3], l[4], l[5]]),
        _ => None,
    })
}

impl Netlink {
    /// Asks the kernel how `addr` is reached (`ip route get`).
    pub fn route_get(&mut self, addr: IpAddr) -> io::Result<Option<RouteLookup>> {
        self.route_get_from(addr, None, None)
    }

    /// [`Self::route_get`] for a packet from `src` that came in on link `iif` (as
    /// `ip route get ADDR from SRC iif IIF` asks): the route a forwarded packet takes.
    pub fn route_get_from(
        &mut self,
        addr: IpAddr,
        src: Option<IpAddr>,
        iif: Option<u32>,
    ) -> io::Result<Option<RouteLookup>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family(addr.is_ipv6());
        msg.header.destination_prefix_length = if addr.is_ipv4() { 32 } else { 128 };
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(addr)));
        if let Some(s) = src {
            msg.header.source_prefix_length = if s.is_ipv4() { 32 } else { 128 };
            msg.attributes.push(RouteAttribute::Source(RouteAddress::from(s)));
        }
        if let Some(i) = iif {
            msg.attributes.push(RouteAttribute::Iif(i));
        }
        match self.request(RouteNetlinkMessage::GetRoute(msg)) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => {
                    let (gateway, oif) = next_hop(&r.attributes);
                    Some(RouteLookup {
                        local: r.header.kind == RouteType::Local,
                        gateway,
                        oif,
                    })
                }
                _ => None,
            })),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The main table's routes of one family marked with routing protocol `proto`.
    pub fn routes_of_protocol(&mut self, v6: bool, proto: u8) -> io::Result<Vec<ProtoRoute>> {
        Ok(self
            .table_routes(v6, u32::from(RouteHeader::RT_TABLE_MAIN), proto)?
            .into_iter()
            .map(|(r, _)| r)
            .collect())
    }

    /// The `blackhole` routes of one family in table `table` marked with `proto` (what
    /// weft exports to a routing daemon): their destinations.
    pub fn blackholes_in_table(&mut self, v6: bool, table: u32, proto: u8) -> io::Result<Vec<IpNet>> {
        Ok(self
            .table_routes(v6, table, proto)?
            .into_iter()
            .filter(|(_, kind)| *kind == RouteType::BlackHole)
            .map(|(r, _)| r.dst)
            .collect())
    }

    /// Adds `blackhole dst` to table `table`, marked with `proto`. An existing route to
    /// `dst` there is never replaced (it may not be weft's): that is `EEXIST`.
    pub fn add_blackhole_route(&mut self, dst: IpNet, table: u32, proto: u8) -> io::Result<()> {
        let msg = Self::blackhole_message(dst, table, proto);
        self.execute(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Deletes `blackhole dst` from table `table` when it is marked with `proto` (a
    /// route of another protocol is never matched). Returns whether it existed.
    pub fn delete_blackhole_route(&mut self, dst: IpNet, table: u32, proto: u8) -> io::Result<bool> {
        let mut msg = Self::blackhole_message(dst, table, proto);
        msg.header.scope = RouteScope::NoWhere;
        self.execute_if_present(RouteNetlinkMessage::DelRoute(msg), libc::ESRCH)
    }

    fn blackhole_message(dst: IpNet, table: u32, proto: u8) -> RouteMessage {
        let mut msg = Self::proto_route_message(dst, None, None, proto);
        msg.header.kind = RouteType::BlackHole;
        // Tables above 255 exist only as the attribute; the header says "see it".
        msg.header.table = u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
        msg.attributes.push(RouteAttribute::Table(table));
        msg
    }

    /// The routes of one family in table `table` marked with `proto`, with their type.
    fn table_routes(&mut self, v6: bool, table: u32, proto: u8) -> io::Result<Vec<(ProtoRoute, RouteType)>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family(v6);
        let mut out = Vec::new();
        for m in self.dump(RouteNetlinkMessage::GetRoute(msg))? {
            let RouteNetlinkMessage::NewRoute(r) = m else { continue };
            let in_table = r
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Table(t) => Some(*t),
                    _ => None,
                })
                .unwrap_or(u32::from(r.header.table));
            if in_table != table || r.header.protocol != RouteProtocol::from(proto) {
                continue;
            }
            let len = r.header.destination_prefix_length;
            let dst_ip = r
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Destination(d) => route_ip(d),
                    _ => None,
                })
                .unwrap_or(if v6 {
                    IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                } else {
                    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
                });
            let Ok(dst) = IpNet::new(dst_ip, len) else { continue };
            let (gateway, oif) = next_hop(&r.attributes);
            out.push((
                ProtoRoute {
                    dst,
                    gateway,
                    oif,
                    unreachable: r.header.kind == RouteType::Unreachable,
                },
                r.header.kind,
            ));
        }
        Ok(out)
    }

    fn proto_route_message(dst: IpNet, gateway: Option<IpAddr>, oif: Option<u32>, proto: u8) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header = RouteHeader {
            address_family: family(dst.addr().is_ipv6()),
            destination_prefix_length: dst.prefix_len(),
            table: RouteHeader::RT_TABLE_MAIN,
            protocol: RouteProtocol::from(proto),
            kind: RouteType::Unicast,
            scope: RouteScope::Universe,
            ..RouteHeader::default()
        };
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst.network())));
        if let Some(g) = gateway {
            msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(g)));
        }
        if let Some(o) = oif {
            msg.attributes.push(RouteAttribute::Oif(o));
        }
        msg
    }

    /// Adds `dst via gateway`, marked with `proto`. With `onlink_oif` the gateway is taken
    /// to be on that link whatever its addresses say (`onlink`, as a VXLAN next hop is);
    /// without, the kernel finds the link the gateway is on. An existing route to `dst`
    /// is never replaced (it may not be weft's): that is `EEXIST`.
    pub fn add_proto_route(
        &mut self,
        dst: IpNet,
        gateway: IpAddr,
        onlink_oif: Option<u32>,
        proto: u8,
    ) -> io::Result<()> {
        let mut msg = Self::proto_route_message(dst, Some(gateway), onlink_oif, proto);
        if onlink_oif.is_some() {
            msg.header.flags = RouteFlags::Onlink;
        }
        self.execute(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Adds `unreachable dst`, marked with `proto`: traffic to `dst` that no more
    /// specific route takes is answered locally (ICMP unreachable, or `EHOSTUNREACH` to
    /// a local sender) instead of following the default route out. An existing route
    /// to `dst` is never replaced: that is `EEXIST`.
    pub fn add_unreachable_route(&mut self, dst: IpNet, proto: u8) -> io::Result<()> {
        let mut msg = Self::proto_route_message(dst, None, None, proto);
        msg.header.kind = RouteType::Unreachable;
        self.execute(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Deletes a route marked with `proto` (a route of another protocol to the same
    /// destination is never matched), an `unreachable` one when `unreachable`. Returns
    /// whether it existed.
    pub fn delete_proto_route(
        &mut self,
        dst: IpNet,
        gateway: Option<IpAddr>,
        oif: Option<u32>,
        proto: u8,
        unreachable: bool,
    ) -> io::Result<bool> {
        let mut msg = Self::proto_route_message(dst, gateway, oif, proto);
        msg.header.scope = RouteScope::NoWhere;
        if unreachable {
            msg.header.kind = RouteType::Unreachable;
        }
        self.execute_if_present(RouteNetlinkMessage::DelRoute(msg), libc::ESRCH)
    }

    /// The VXLAN parameters of link `name`: `None` when there is no such link;
    /// parameters all `None` when it is not a VXLAN device.
    pub fn vxlan_params(&mut self, name: &str) -> io::Result<Option<VxlanParams>> {
        let mut msg = LinkMessage::default();
        msg.attributes = vec![LinkAttribute::IfName(name.to_string())];
        let msgs = match self.request(RouteNetlinkMessage::GetLink(msg)) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(link) = msgs.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(l),
            _ => None,
        }) else {
            return Ok(None);
        };
        let mut p = VxlanParams {
            vni: None,
            port: None,
            local: None,
        };
        for a in link.attributes {
            let LinkAttribute::LinkInfo(infos) = a else { continue };
            for info in infos {
                let LinkInfo::Data(InfoData::Vxlan(data)) = info else {
                    continue;
                };
                for d in data {
                    match d {
                        InfoVxlan::Id(v) => p.vni = Some(v),
                        InfoVxlan::Port(v) => p.port = Some(v),
                        InfoVxlan::Local(v4) => p.local = Some(IpAddr::V4(v4)),
                        InfoVxlan::Local6(v6) => p.local = Some(IpAddr::V6(v6)),
                        _ => {}
                    }
                }
            }
        }
        Ok(Some(p))
    }

    /// The permanent IPv4 and IPv6 neighbour entries of one link (those someone
    /// programmed, not those the kernel learned): (address, MAC).
    pub fn permanent_neighbours(&mut self, index: u32) -> io::Result<Vec<(IpAddr, [u8; 6])>> {
        let mut out = Vec::new();
        for v6 in [false, true] {
            let mut msg = NeighbourMessage::default();
            msg.header.family = family(v6);
            for m in self.dump(RouteNetlinkMessage::GetNeighbour(msg))? {
                let RouteNetlinkMessage::NewNeighbour(n) = m else {
                    continue;
                };
                if n.header.ifindex != index || n.header.state != NeighbourState::Permanent {
                    continue;
                }
                let ip = n.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(d) => neighbour_ip(d),
                    _ => None,
                });
                if let (Some(ip), Some(mac)) = (ip, mac_of(&n.attributes)) {
                    out.push((ip, mac));
                }
            }
        }
        Ok(out)
    }

    /// The neighbour entry of `ip` on link `index`: its MAC and whether it is
    /// permanent. One lookup, not a dump: the kernel keeps one neighbour table for
    /// every namespace of the machine, and a dump walks all of it (at a lab's thousands
    /// of pods, each pod's dump walked every pod's entries).
    pub fn neighbour(&mut self, index: u32, ip: IpAddr) -> io::Result<Option<([u8; 6], bool)>> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family(ip.is_ipv6());
        msg.header.ifindex = index;
        msg.attributes = vec![NeighbourAttribute::Destination(neighbour_address(ip))];
        match self.request(RouteNetlinkMessage::GetNeighbour(msg)) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => {
                    mac_of(&n.attributes).map(|mac| (mac, n.header.state == NeighbourState::Permanent))
                }
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the neighbour entry of `ip` on a link; returns whether it existed.
    pub fn delete_neighbour(&mut self, index: u32, ip: IpAddr) -> io::Result<bool> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family(ip.is_ipv6());
        msg.header.ifindex = index;
        msg.attributes = vec![NeighbourAttribute::Destination(neighbour_address(ip))];
        self.execute_if_present(RouteNetlinkMessage::DelNeighbour(msg), libc::ENOENT)
    }

    /// Deletes the unicast FDB entry `mac` -> `dst` of a VXLAN device; returns whether it
    /// existed.
    pub fn delete_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> io::Result<bool> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.ifindex = index;
        msg.header.flags = NeighbourFlags::Own;
        msg.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(mac.to_vec()),
            NeighbourAttribute::Destination(neighbour_address(dst)),
        ];
        self.execute_if_present(RouteNetlinkMessage::DelNeighbour(msg), libc::ENOENT)
    }

    /// The link that holds address `addr`, if any.
    pub fn address_owner(&mut self, addr: IpAddr) -> io::Result<Option<u32>> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(addr.is_ipv6());
        Ok(self
            .dump(RouteNetlinkMessage::GetAddress(msg))?
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a)
                    if a.attributes.iter().any(
                        |at| matches!(at, AddressAttribute::Address(ip) | AddressAttribute::Local(ip) if *ip == addr),
                    ) =>
                {
                    Some(a.header.index)
                }
                _ => None,
            }))
    }

    /// Removes `addr/prefix_len` from a link; returns whether it was there.
    pub fn delete_address(&mut self, index: u32, addr: IpAddr, prefix_len: u8) -> io::Result<bool> {
        let msg = crate::netlink::address_message(index, addr, prefix_len);
        self.execute_if_present(RouteNetlinkMessage::DelAddress(msg), libc::EADDRNOTAVAIL)
    }
}
