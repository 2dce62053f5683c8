//! The one netlink socket wrapper weft uses: a blocking socket of one protocol family
//! (`NETLINK_ROUTE` for links, addresses, routes and neighbours; `NETLINK_NETFILTER`
//! for nftables batches) bound to the network namespace of the thread that created it,
//! with request/ACK, dump and batch helpers, and the handful of link, address and route
//! operations weft needs.

use std::io;
use std::marker::PhantomData;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, Stats64,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{
    SocketAddr,
    protocols::{NETLINK_NETFILTER, NETLINK_ROUTE},
};

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
}

/// A netlink protocol family: which socket protocol it is and what its messages are.
pub trait Protocol {
    /// The socket protocol (`NETLINK_*`).
    const PROTOCOL: isize;
    /// Its messages, without the netlink header (which the socket writes and reads).
    type Message: NetlinkSerializable + NetlinkDeserializable;
    /// Sets the family's own socket options on a fresh socket.
    fn configure(_sock: &mut netlink_sys::Socket) {}
}

/// rtnetlink (`NETLINK_ROUTE`): links, addresses, routes, neighbours.
#[derive(Debug)]
pub enum Rtnetlink {}

impl Protocol for Rtnetlink {
    const PROTOCOL: isize = NETLINK_ROUTE;
    type Message = RouteNetlinkMessage;

    fn configure(sock: &mut netlink_sys::Socket) {
        // Strict checking makes the kernel filter dumps by the header we send.
        let _ = sock.set_netlink_get_strict_chk(true);
        let _ = sock.set_ext_ack(true);
    }
}

/// nfnetlink (`NETLINK_NETFILTER`): nftables' messages, sent in batches.
#[derive(Debug)]
pub enum Nfnetlink {}

impl Protocol for Nfnetlink {
    const PROTOCOL: isize = NETLINK_NETFILTER;
    type Message = NetfilterMessage;
}

/// One nfnetlink message as its user writes it: no crate models nftables' messages
/// under a licence weft can use, so the caller lays out the body and the socket adds
/// the netlink header, sequence numbers and acknowledgements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetfilterMessage {
    /// The message type: `(subsystem << 8) | message`, or a batch delimiter.
    pub message_type: u16,
    /// Everything after the netlink header: the `nfgenmsg` header and the attributes,
    /// padded to 4 bytes.
    pub body: Vec<u8>,
}

impl NetlinkSerializable for NetfilterMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.body.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.body);
    }
}

impl NetlinkDeserializable for NetfilterMessage {
    type Error = std::convert::Infallible;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        Ok(Self {
            message_type: header.message_type,
            body: payload.to_vec(),
        })
    }
}

/// A blocking netlink socket of protocol family `P` in the caller's network namespace.
pub struct NetlinkSocket<P: Protocol> {
    sock: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
    protocol: PhantomData<P>,
}

/// A blocking rtnetlink socket in the caller's network namespace.
pub type Netlink = NetlinkSocket<Rtnetlink>;

fn family_of(a: &IpAddr) -> AddressFamily {
    match a {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// Full prefix length of an address's family (/32 or /128).
pub(crate) fn host_prefix(a: &IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

impl<P: Protocol> NetlinkSocket<P> {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> io::Result<Self> {
        let mut sock = netlink_sys::Socket::new(P::PROTOCOL)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        P::configure(&mut sock);
        // A reply that never comes must fail the call, not hang it.
        nix::sys::socket::setsockopt(
            &sock,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(10, 0),
        )
        .map_err(io::Error::from)?;
        Ok(Self {
            sock,
            seq: 0,
            buf: vec![0; 64 * 1024],
            protocol: PhantomData,
        })
    }

    /// Appends `msg` with the next sequence number to `out`, returning the number.
    fn encode(&mut self, msg: P::Message, flags: u16, out: &mut Vec<u8>) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let at = out.len();
        out.resize(at + nl.buffer_len(), 0);
        nl.serialize(&mut out[at..]);
        // Messages sharing a datagram start on 4-byte boundaries.
        out.resize(out.len().next_multiple_of(4), 0);
        self.seq
    }

    fn send(&mut self, msg: P::Message, flags: u16) -> io::Result<u32> {
        let mut out = Vec::new();
        let seq = self.encode(msg, flags, &mut out);
        self.sock.send(&out, 0)?;
        Ok(seq)
    }

    /// Receives every message answering `seq` until the ACK/error or the end of a dump.
    fn receive(&mut self, seq: u32) -> io::Result<Vec<P::Message>> {
        let mut out = Vec::new();
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = decode::<P>(&self.buf[off..n])?;
                let len = msg.header.length as usize;
                off += if len == 0 { n } else { (len + 3) & !3 };
                if msg.header.sequence_number != seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out),
                            Some(_) => Err(e.to_io()),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    _ => {}
                }
            }
        }
    }

    /// Sends a request and waits for its ACK.
    pub fn execute(&mut self, msg: P::Message, extra_flags: u16) -> io::Result<()> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_ACK | extra_flags)?;
        self.receive(seq).map(|_| ())
    }

    /// Sends a request that is answered with messages (a `GET` of one object) and
    /// collects them until its ACK.
    pub fn request(&mut self, msg: P::Message) -> io::Result<Vec<P::Message>> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_ACK)?;
        self.receive(seq)
    }

    /// Sends a request that removes something and waits for its ACK; returns whether it
    /// existed (`absent` is the errno the kernel answers when it did not).
    pub fn execute_if_present(&mut self, msg: P::Message, absent: i32) -> io::Result<bool> {
        match self.execute(msg, 0) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(absent) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends a dump request and collects every message of the answer.
    pub fn dump(&mut self, msg: P::Message) -> io::Result<Vec<P::Message>> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_DUMP)?;
        self.receive(seq)
    }

    /// Sends `msgs` (each with its flags) in one datagram, as nftables takes a batch
    /// (begin, the changes, end), and waits for the acknowledgement of every message
    /// that asks for one (`NLM_F_ACK`). The first error wins: the kernel aborts the
    /// whole batch then, so nothing more is waited for.
    pub fn batch(&mut self, msgs: impl IntoIterator<Item = (P::Message, u16)>) -> io::Result<()> {
        let mut out = Vec::new();
        let mut pending = Vec::new();
        for (msg, flags) in msgs {
            let seq = self.encode(msg, flags, &mut out);
            if flags & NLM_F_ACK != 0 {
                pending.push(seq);
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        self.sock.send(&out, 0)?;
        while !pending.is_empty() {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            let mut first_error = None;
            while off < n {
                let msg = decode::<P>(&self.buf[off..n])?;
                let len = msg.header.length as usize;
                off += if len == 0 { n } else { (len + 3) & !3 };
                if let NetlinkPayload::Error(e) = msg.payload {
                    pending.retain(|s| *s != msg.header.sequence_number);
                    if e.code.is_some() && first_error.is_none() {
                        first_error = Some(e.to_io());
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for messages the kernel sends on its own (as NFLOG hands
    /// over logged packets) and returns those of the next datagram; none when the wait
    /// ends. Acknowledgements and errors are skipped.
    pub fn receive_unsolicited(&mut self, timeout: std::time::Duration) -> io::Result<Vec<P::Message>> {
        let tv = nix::sys::time::TimeVal::new(
            i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            i64::from(timeout.subsec_micros()),
        );
        nix::sys::socket::setsockopt(&self.sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
            .map_err(io::Error::from)?;
        let n = match self.sock.recv(&mut &mut self.buf[..], 0) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        let mut off = 0;
        while off < n {
            let msg = decode::<P>(&self.buf[off..n])?;
            let len = msg.header.length as usize;
            off += if len == 0 { n } else { (len + 3) & !3 };
            if let NetlinkPayload::InnerMessage(m) = msg.payload {
                out.push(m);
            }
        }
        Ok(out)
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

fn decode<P: Protocol>(buf: &[u8]) -> io::Result<NetlinkMessage<P::Message>> {
    NetlinkMessage::<P::Message>::deserialize(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decoding netlink reply: {e}")))
}

impl Netlink {
    /// Creates the veth pair `pair` with one request: each end is born in its own
    /// namespace (`netns`), so nothing moves between namespaces afterwards.
    pub fn create_veth(&mut self, pair: &VethPair<'_>) -> io::Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes = pair.peer.attributes(pair.mtu);
        let mut msg = LinkMessage::default();
        msg.attributes = pair.local.attributes(pair.mtu);
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
    };
    for a in r.attributes {
        match a {
            RouteAttribute::Destination(d) => e.dst = route_ip(d),
            RouteAttribute::Gateway(g) => e.gateway = route_ip(g),
            RouteAttribute::Oif(o) => e.oif = Some(o),
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
