//! Addresses on links.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::socket::Netlink;

pub(super) fn family_of(a: &IpAddr) -> AddressFamily {
    match a {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// Full prefix length of an address's family (/32 or /128).
pub(crate) fn host_prefix(a: &IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

/// The message naming `addr/prefix_len` on a link, for adding or deleting it. IPv4 wants
/// IFA_LOCAL (the address) as well as IFA_ADDRESS (the peer, the same on a
/// non-point-to-point link); IPv6 only IFA_ADDRESS.
pub(crate) fn address_message(index: u32, addr: IpAddr, prefix_len: u8) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = family_of(&addr);
    msg.header.prefix_len = prefix_len;
    msg.header.index = index;
    msg.attributes = if addr.is_ipv4() {
        vec![AddressAttribute::Local(addr), AddressAttribute::Address(addr)]
    } else {
        vec![AddressAttribute::Address(addr)]
    };
    msg
}

impl Netlink {
    /// Adds `addr/prefix_len` to a link, without duplicate address detection.
    pub fn add_address(&mut self, index: u32, addr: IpAddr, prefix_len: u8) -> io::Result<()> {
        let mut msg = address_message(index, addr, prefix_len);
        msg.header.scope = AddressScope::Universe;
        msg.header.flags = AddressHeaderFlags::Nodad | AddressHeaderFlags::Permanent;
        self.execute(RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// The addresses on a link, with their prefix lengths.
    pub fn addresses(&mut self, index: u32) -> io::Result<Vec<(IpAddr, u8)>> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        Ok(self
            .dump(RouteNetlinkMessage::GetAddress(msg))?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                    let prefix = a.header.prefix_len;
                    a.attributes.into_iter().find_map(|at| match at {
                        AddressAttribute::Address(ip) => Some((ip, prefix)),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect())
    }
}
