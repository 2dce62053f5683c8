//! Forwarding-database and neighbour entries (the pod VXLAN device and the wires).

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::addr::family_of;
use super::socket::Netlink;

impl Netlink {
    fn fdb_message(index: u32, mac: [u8; 6], dst: IpAddr) -> NeighbourMessage {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.header.flags = NeighbourFlags::Own;
        msg.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(mac.to_vec()),
            NeighbourAttribute::Destination(match dst {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }),
        ];
        msg
    }

    /// Makes `dst` the only VTEP of the unicast FDB entry for `mac` on a VXLAN device
    /// (the all-zeros MAC is the entry for every other destination). VXLAN does not
    /// support replacing an entry, so a stale one is deleted first.
    pub fn set_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> io::Result<()> {
        let existing: Vec<IpAddr> = self
            .fdb(index)?
            .into_iter()
            .filter(|(m, _)| *m == mac)
            .map(|(_, d)| d)
            .collect();
        if existing == [dst] {
            return Ok(());
        }
        for old in existing {
            match self.execute(RouteNetlinkMessage::DelNeighbour(Self::fdb_message(index, mac, old)), 0) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        self.execute(
            RouteNetlinkMessage::NewNeighbour(Self::fdb_message(index, mac, dst)),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Adds the unicast FDB entry `mac` -> `dst` on VXLAN device `index` without
    /// looking at what the device holds: for a caller that knows the MAC has no other
    /// entry (it removed the stale ones first). [`Netlink::set_fdb`] reads the whole
    /// table to replace an entry, which at thousands of entries costs a dump per add.
    pub fn add_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> io::Result<()> {
        self.execute(
            RouteNetlinkMessage::NewNeighbour(Self::fdb_message(index, mac, dst)),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// The FDB entries of a VXLAN device: (MAC, VTEP).
    pub fn fdb(&mut self, index: u32) -> io::Result<Vec<([u8; 6], IpAddr)>> {
        // Dumped unfiltered (a pod holds few links) and filtered here: the kernel's
        // ifindex filter applies to bridge ports, which a VXLAN end is not.
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        Ok(self
            .dump(RouteNetlinkMessage::GetNeighbour(msg))?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) if n.header.ifindex == index => {
                    let mut mac = None;
                    let mut dst = None;
                    for a in n.attributes {
                        match a {
                            NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => {
                                mac = Some([l[0], l[1], l[2], l[3], l[4], l[5]]);
                            }
                            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => dst = Some(IpAddr::V4(v4)),
                            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => dst = Some(IpAddr::V6(v6)),
                            // A bridge-family message carries the VTEP as raw bytes.
                            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                                dst = match b.len() {
                                    4 => Some(IpAddr::from(<[u8; 4]>::try_from(b.as_slice()).expect("4 bytes"))),
                                    16 => Some(IpAddr::from(<[u8; 16]>::try_from(b.as_slice()).expect("16 bytes"))),
                                    _ => None,
                                }
                            }
                            _ => {}
                        }
                    }
                    Some((mac?, dst?))
                }
                _ => None,
            })
            .collect())
    }

    /// Sets (replacing) a permanent neighbour entry: `ip` is at `mac` on the link.
    pub fn set_neighbour(&mut self, index: u32, ip: IpAddr, mac: [u8; 6]) -> io::Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family_of(&ip);
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.attributes = vec![
            NeighbourAttribute::Destination(match ip {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }),
            NeighbourAttribute::LinkLayerAddress(mac.to_vec()),
        ];
        self.execute(
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_CREATE | netlink_packet_core::NLM_F_REPLACE,
        )
    }
}
