//! Links: veth pairs, VXLAN devices and address holders created in one request each, their settings, state and counters, and lookups.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, Stats64,
};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};

use super::socket::Netlink;

/// A link as weft sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// Whether it is administratively up.
    pub up: bool,
    /// Hardware address.
    pub mac: Vec<u8>,
    /// MTU.
    pub mtu: u32,
}

/// A link with what [`NetlinkSocket::links_with_alias`] reads besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasedLink {
    /// The link.
    pub link: Link,
    /// Its alias, if any.
    pub alias: Option<String>,
    /// The index of its peer (a veth's other end), in the peer's namespace.
    pub peer_index: Option<u32>,
    /// The id of the peer's namespace, when the peer is in another one.
    pub peer_netnsid: Option<i32>,
}

/// Traffic counters of a link, from the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames dropped on receive.
    pub rx_dropped: u64,
    /// Frames dropped on send.
    pub tx_dropped: u64,
}

impl From<&Stats64> for LinkStats {
    fn from(s: &Stats64) -> Self {
        Self {
            rx_packets: s.rx_packets,
            tx_packets: s.tx_packets,
            rx_bytes: s.rx_bytes,
            tx_bytes: s.tx_bytes,
            rx_dropped: s.rx_dropped,
            tx_dropped: s.tx_dropped,
        }
    }
}

/// A link to create: its name and MAC, and the namespace it is born in.
#[derive(Debug, Clone, Copy)]
pub struct NewLink<'a> {
    /// Interface name.
    pub name: &'a str,
    /// MAC address.
    pub mac: [u8; 6],
    /// The namespace (an open fd of it) the link is born in; `None` for this socket's.
    pub netns: Option<i32>,
}

impl NewLink<'_> {
    fn attributes(&self, mtu: u32) -> Vec<LinkAttribute> {
        let mut attrs = vec![
            LinkAttribute::IfName(self.name.to_string()),
            LinkAttribute::Address(self.mac.to_vec()),
            LinkAttribute::Mtu(mtu),
        ];
        if let Some(fd) = self.netns {
            attrs.push(LinkAttribute::NetNsFd(fd));
        }
        attrs
    }
}

/// A veth pair to create (`Netlink::create_veth`).
#[derive(Debug, Clone, Copy)]
pub struct VethPair<'a> {
    /// The end the request names (a pod's host end, or one pod's end of a wire).
    pub local: NewLink<'a>,
    /// The other end.
    pub peer: NewLink<'a>,
    /// MTU of both ends.
    pub mtu: u32,
    /// An alias on the local end, marking it for humans and for reconciling.
    pub alias: Option<&'a str>,
}

/// A VXLAN device to create (`Netlink::create_vxlan`).
#[derive(Debug, Clone, Copy)]
pub struct VxlanDevice<'a> {
    /// Its name, MAC and the namespace it is born in.
    pub link: NewLink<'a>,
    /// VXLAN network id.
    pub vni: u32,
    /// The underlay address its UDP socket binds.
    pub local: IpAddr,
    /// UDP port.
    pub port: u16,
    /// MTU.
    pub mtu: u32,
    /// Whether to checksum the outer UDP header (IPv4; off is the kernel's default).
    pub udp_csum: bool,
}

fn to_link(l: LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        up: l.header.flags.contains(LinkFlags::Up),
        mac: Vec::new(),
        mtu: 0,
    };
    for a in l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Address(m) => link.mac = m,
            LinkAttribute::Mtu(m) => link.mtu = m,
            _ => {}
        }
    }
    link
}

impl Netlink {
    /// Creates the veth pair `pair` with one request: each end is born in its own
    /// namespace (`netns`), so nothing moves between namespaces afterwards.
    ///
    /// Both ends get one transmit and one receive queue, the number a veth uses
    /// anyway. Asked for nothing, the kernel allocates a queue of each per possible
    /// CPU (with a sysfs entry each) and then cuts the real count to one, and that
    /// cut waits for an expedited RCU grace period while holding the rtnl lock, which
    /// every other link, address and route change of the machine waits behind. At a
    /// lab's thousands of veths those waits took about a sixth of `lab up`
    /// (docs/BENCHMARKS.md, "Lab scale"). What is lost: raising a veth's channels
    /// later (`ethtool -L`), which weft never does.
    pub fn create_veth(&mut self, pair: &VethPair<'_>) -> io::Result<()> {
        let one_queue = [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)];
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes = pair.peer.attributes(pair.mtu);
        peer_msg.attributes.extend(one_queue.iter().cloned());
        let mut msg = LinkMessage::default();
        msg.attributes = pair.local.attributes(pair.mtu);
        msg.attributes.extend(one_queue);
        if let Some(alias) = pair.alias {
            msg.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        }
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.execute(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)?;
        if let Some(alias) = pair.alias {
            // The kernel ignores an alias in the request that creates a link (only a
            // change sets it), so it is set on the new host end afterwards.
            let mut set = LinkMessage::default();
            set.attributes = vec![
                LinkAttribute::IfName(pair.local.name.to_string()),
                LinkAttribute::IfAlias(alias.to_string()),
            ];
            self.execute(RouteNetlinkMessage::SetLink(set), 0)?;
        }
        Ok(())
    }

    /// Creates `name`, a device of this namespace that only holds addresses (a pod
    /// gateway the node answers on): a `dummy`, or where the kernel has no dummy driver
    /// (`EOPNOTSUPP`, as on some cloud kernels) a bridge without ports. Neither carries
    /// a frame; an address on either is one of the node's own (a local route), whatever
    /// the device's carrier.
    pub fn create_address_holder(&mut self, name: &str) -> io::Result<()> {
        let create = |nl: &mut Self, kind: InfoKind| {
            let mut msg = LinkMessage::default();
            msg.attributes = vec![
                LinkAttribute::IfName(name.to_string()),
                LinkAttribute::LinkInfo(vec![LinkInfo::Kind(kind)]),
            ];
            nl.execute(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
        };
        match create(self, InfoKind::Dummy) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => create(self, InfoKind::Bridge),
            other => other,
        }
    }

    /// Creates the VXLAN device `dev`: no learning, no remote, no group (frames go only
    /// where unicast FDB entries say). Its UDP socket stays in this socket's namespace
    /// (the node's underlay) even when the device is born in another (`netns`).
    pub fn create_vxlan(&mut self, dev: &VxlanDevice<'_>) -> io::Result<()> {
        let mut data = vec![
            InfoVxlan::Id(dev.vni),
            InfoVxlan::Port(dev.port),
            InfoVxlan::Learning(false),
        ];
        if dev.udp_csum {
            data.push(InfoVxlan::UDPCsum(true));
        }
        data.push(match dev.local {
            IpAddr::V4(v4) => InfoVxlan::Local(v4),
            IpAddr::V6(v6) => InfoVxlan::Local6(v6),
        });
        let mut msg = LinkMessage::default();
        msg.attributes = dev.link.attributes(dev.mtu);
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vxlan),
            LinkInfo::Data(InfoData::Vxlan(data)),
        ]));
        self.execute(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Sets a link's MAC address.
    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes = vec![LinkAttribute::Address(mac.to_vec())];
        self.execute(RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// Sets a link's MTU.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes = vec![LinkAttribute::Mtu(mtu)];
        self.execute(RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// Sets the largest GSO super-frame the stack may hand a link, for IPv6 and (since
    /// Linux 6.3, BIG TCP) IPv4 alike.
    pub fn set_gso_max_size(&mut self, index: u32, size: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes = vec![LinkAttribute::GsoMaxSize(size), LinkAttribute::GsoIpv4MaxSize(size)];
        self.execute(RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// A link's traffic counters; `None` when there is no such link.
    pub fn stats(&mut self, name: &str) -> io::Result<Option<(Link, LinkStats)>> {
        let mut msg = LinkMessage::default();
        msg.attributes = vec![LinkAttribute::IfName(name.to_string())];
        let seq = self.send(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST | NLM_F_ACK)?;
        match self.receive(seq) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => {
                    let stats = l
                        .attributes
                        .iter()
                        .find_map(|a| match a {
                            LinkAttribute::Stats64(s) => Some(LinkStats::from(s)),
                            _ => None,
                        })
                        .unwrap_or_default();
                    Some((to_link(l), stats))
                }
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Looks a link up by name; `None` when there is none.
    pub fn link_by_name(&mut self, name: &str) -> io::Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes = vec![LinkAttribute::IfName(name.to_string())];
        let seq = self.send(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST | NLM_F_ACK)?;
        match self.receive(seq) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(l)),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every link in the namespace.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        Ok(self
            .dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(l)),
                _ => None,
            })
            .collect())
    }

    /// Every link in the namespace with its traffic counters, from one dump: what a
    /// scrape reads for all of a node's pods at once, rather than one request per pod.
    pub fn links_with_stats(&mut self) -> io::Result<Vec<(Link, LinkStats)>> {
        Ok(self
            .dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => {
                    let stats = l
                        .attributes
                        .iter()
                        .find_map(|a| match a {
                            LinkAttribute::Stats64(s) => Some(LinkStats::from(s)),
                            _ => None,
                        })
                        .unwrap_or_default();
                    Some((to_link(l), stats))
                }
                _ => None,
            })
            .collect())
    }

    /// Every link in the namespace with its alias and, for one end of a pair, where
    /// the other end is.
    pub fn links_with_alias(&mut self) -> io::Result<Vec<AliasedLink>> {
        Ok(self
            .dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => {
                    let (mut alias, mut peer_index, mut peer_netnsid) = (None, None, None);
                    for a in &l.attributes {
                        match a {
                            LinkAttribute::IfAlias(s) => alias = Some(s.clone()),
                            LinkAttribute::Link(i) => peer_index = Some(*i),
                            LinkAttribute::LinkNetNsId(n) => peer_netnsid = Some(*n),
                            _ => {}
                        }
                    }
                    Some(AliasedLink {
                        link: to_link(l),
                        alias,
                        peer_index,
                        peer_netnsid,
                    })
                }
                _ => None,
            })
            .collect())
    }

    /// The id this namespace knows the namespace of file descriptor `fd` by (what a
    /// link's [`AliasedLink::peer_netnsid`] names); `None` when it has none.
    pub fn nsid_of(&mut self, fd: std::os::fd::RawFd) -> io::Result<Option<i32>> {
        let mut msg = NsidMessage::default();
        msg.attributes.push(NsidAttribute::Fd(fd as u32));
        Ok(self
            .request(RouteNetlinkMessage::GetNsId(msg))?
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewNsId(n) => n.attributes.into_iter().find_map(|a| match a {
                    NsidAttribute::Id(id) if id >= 0 => Some(id),
                    _ => None,
                }),
                _ => None,
            }))
    }

    /// Sets a link administratively up or down.
    pub fn set_up(&mut self, index: u32, up: bool) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = if up { LinkFlags::Up } else { LinkFlags::empty() };
        msg.header.change_mask = LinkFlags::Up;
        self.execute(RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// Sets link `index` up, with ARP off (`IFF_NOARP`): the node side of a wire end or
    /// detour, which carries a pod's frames only, so the node's stack must not answer
    /// an ARP request a pod broadcasts into it.
    pub fn set_up_without_arp(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up | LinkFlags::Noarp;
        msg.header.change_mask = LinkFlags::Up | LinkFlags::Noarp;
        self.execute(RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// Deletes a link by name. Deleting one that does not exist is not an error:
    /// returns whether it existed.
    pub fn delete_link(&mut self, name: &str) -> io::Result<bool> {
        let mut msg = LinkMessage::default();
        msg.attributes = vec![LinkAttribute::IfName(name.to_string())];
        self.execute_if_present(RouteNetlinkMessage::DelLink(msg), libc::ENODEV)
    }
}
