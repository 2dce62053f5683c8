//! Conntrack: the kernel's connection table, read as events (a connection confirmed,
//! changed, destroyed) from its nfnetlink multicast groups and as a full dump, in the
//! caller's network namespace. This is where a node's flow records come from: every
//! forwarded connection of a pod has an entry in the node's table, with byte and
//! packet counters each way (`nf_conntrack_acct`) and start and stop times
//! (`nf_conntrack_timestamp`) when those are on.
//!
//! Messages are decoded with `netlink-packet-netfilter` for what it types (tuples,
//! status, mark, TCP state); the attributes it leaves untyped (counters, timestamps,
//! the entry's id, ICMP's id/type/code) are read from the same attribute buffers with
//! `netlink-packet-core`'s iterators. Nothing is hand-framed.
//!
//! A burst larger than the socket's receive buffer makes the kernel drop events and
//! fail the next read with `ENOBUFS`: [`ReadError::Overflow`] says so, and the reader
//! recovers from a [`dump`]. No loss passes unseen.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{NetlinkBuffer, NlaBuffer, NlasIterator, ParseableParametrized};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Tuple,
};

use crate::{NetfilterMessage, NetlinkSocket, Nfnetlink};

/// nfnetlink's conntrack subsystem.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
/// The multicast groups of conntrack events (linux/netfilter/nfnetlink.h).
const NFNLGRP_CONNTRACK_NEW: u32 = 1;
const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
/// The netlink flag of a message that is part of a multipart answer (a dump).
const NLM_F_MULTI: u16 = 2;
/// `NLM_F_CREATE | NLM_F_EXCL` on a `NEW` event: the entry was just confirmed (an
/// update of an existing one carries neither).
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_EXCL: u16 = 0x200;

// Attributes netlink-packet-netfilter leaves untyped (linux/netfilter/nfnetlink_conntrack.h).
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_TIMESTAMP: u16 = 20;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
const CTA_TIMESTAMP_START: u16 = 1;
const CTA_TIMESTAMP_STOP: u16 = 2;
const CTA_PROTO_ICMP_ID: u16 = 4;
const CTA_PROTO_ICMP_TYPE: u16 = 5;
const CTA_PROTO_ICMP_CODE: u16 = 6;
const CTA_PROTO_ICMPV6_ID: u16 = 7;
const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
const CTA_PROTO_ICMPV6_CODE: u16 = 9;

/// What a message says happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtEventKind {
    /// The entry was confirmed: the connection's first packet left the node's hooks.
    New,
    /// The entry changed (its TCP state, its mark, its status).
    Update,
    /// The entry is gone (the connection ended or timed out): the message carries its
    /// final counters and times.
    Destroy,
    /// The entry as a dump lists it.
    Dumped,
}

/// ICMP's identity of an echo (or other query) in a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcmpTuple {
    /// The identifier.
    pub id: u16,
    /// The type.
    pub kind: u8,
    /// The code.
    pub code: u8,
}

/// One direction of a connection: who sent to whom, on which ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol number.
    pub protocol: u8,
    /// Source port (0 when the protocol has none).
    pub src_port: u16,
    /// Destination port (0 when the protocol has none).
    pub dst_port: u16,
    /// ICMP's identity, for ICMP and ICMPv6.
    pub icmp: Option<IcmpTuple>,
}

/// Packets and bytes one way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CtCounters {
    /// Packets.
    pub packets: u64,
    /// Bytes (of IP packets, headers included).
    pub bytes: u64,
}

/// The TCP state conntrack holds (`enum tcp_conntrack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TcpState {
    /// No state yet.
    None,
    /// SYN seen.
    SynSent,
    /// SYN/ACK seen.
    SynRecv,
    /// Established.
    Established,
    /// A FIN seen.
    FinWait,
    /// A FIN seen, the other side still open.
    CloseWait,
    /// The last ACK awaited.
    LastAck,
    /// Both FINs seen: closed normally.
    TimeWait,
    /// Reset (or never opened).
    Close,
    /// Simultaneous open.
    SynSent2,
    /// A state this code does not know.
    Other(u8),
}

impl From<u8> for TcpState {
    fn from(v: u8) -> Self {
        match v {
            0 => TcpState::None,
            1 => TcpState::SynSent,
            2 => TcpState::SynRecv,
            3 => TcpState::Established,
            4 => TcpState::FinWait,
            5 => TcpState::CloseWait,
            6 => TcpState::LastAck,
            7 => TcpState::TimeWait,
            8 => TcpState::Close,
            9 => TcpState::SynSent2,
            other => TcpState::Other(other),
        }
    }
}

impl TcpState {
    /// Whether a FIN was seen: the connection is closing or closed normally.
    pub fn finishing(self) -> bool {
        matches!(
            self,
            TcpState::FinWait | TcpState::CloseWait | TcpState::LastAck | TcpState::TimeWait
        )
    }
}

/// One conntrack entry as a message describes it. Fields the message does not carry
/// are `None` (an update carries no counters; a destroy no TCP state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEntry {
    /// What happened.
    pub kind: CtEventKind,
    /// The entry's id, unique among live entries of the namespace.
    pub id: u32,
    /// The direction of the connection's first packet.
    pub original: CtTuple,
    /// The direction of its answers (differs from `original` reversed under NAT).
    pub reply: CtTuple,
    /// `IPS_*` status bits.
    pub status: u32,
    /// The connection mark.
    pub mark: u32,
    /// The zone, when not the default.
    pub zone: Option<u16>,
    /// The TCP state.
    pub tcp_state: Option<TcpState>,
    /// Counters of the original direction (with `nf_conntrack_acct`).
    pub original_counters: Option<CtCounters>,
    /// Counters of the reply direction.
    pub reply_counters: Option<CtCounters>,
    /// When the entry was created, nanoseconds since the Unix epoch (with
    /// `nf_conntrack_timestamp`).
    pub start_ns: Option<u64>,
    /// When it was destroyed, likewise.
    pub stop_ns: Option<u64>,
}

/// A conntrack message that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("conntrack message: {0}")]
pub struct CtDecodeError(String);

fn be_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn be_u16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?))
}

/// The (kind, value) of every attribute in `buf`; a malformed one ends the walk.
fn nlas(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    NlasIterator::new(buf)
        .map_while(Result::ok)
        .map(|nla: NlaBuffer<&[u8]>| {
            let kind = nla.kind();
            let len = nla.value_length();
            let value = &nla.into_inner()[4..4 + len];
            (kind, value)
        })
}

fn counters(value: &[u8]) -> CtCounters {
    let mut c = CtCounters::default();
    for (kind, v) in nlas(value) {
        match kind {
            CTA_COUNTERS_PACKETS => c.packets = be_u64(v).unwrap_or_default(),
            CTA_COUNTERS_BYTES => c.bytes = be_u64(v).unwrap_or_default(),
            _ => {}
        }
    }
    c
}

/// A tuple from the crate's typed parts; ICMP's identity comes from the proto
/// attribute's raw value (the crate leaves it untyped).
fn tuple(parts: &[Tuple], raw: &[u8]) -> Result<CtTuple, CtDecodeError> {
    let (mut src, mut dst, mut protocol, mut src_port, mut dst_port) = (None, None, 0u8, 0, 0);
    for part in parts {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(n) => protocol = u8::from(*n),
                        ProtoTuple::SourcePort(n) => src_port = *n,
                        ProtoTuple::DestinationPort(n) => dst_port = *n,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let icmp = if matches!(protocol, 1 | 58) {
        let mut t = IcmpTuple {
            id: 0,
            kind: 0,
            code: 0,
        };
        for (_, proto) in nlas(raw).filter(|(k, _)| *k == CTA_TUPLE_PROTO) {
            for (kind, v) in nlas(proto) {
                match kind {
                    CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID => t.id = be_u16(v).unwrap_or_default(),
                    CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => t.kind = v.first().copied().unwrap_or_default(),
                    CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => t.code = v.first().copied().unwrap_or_default(),
                    _ => {}
                }
            }
        }
        Some(t)
    } else {
        None
    };
    match (src, dst) {
        (Some(src), Some(dst)) => Ok(CtTuple {
            src,
            dst,
            protocol,
            src_port,
            dst_port,
            icmp,
        }),
        _ => Err(CtDecodeError("a tuple without both addresses".into())),
    }
}

/// Decodes one nfnetlink message (its netlink type and flags, and its body from the
/// `nfgenmsg` header on). `None` for a message that is not about a conntrack entry
/// (an expectation, a statistics answer).
pub fn decode(message_type: u16, flags: u16, body: &[u8]) -> Result<Option<CtEntry>, CtDecodeError> {
    if message_type >> 8 != NFNL_SUBSYS_CTNETLINK {
        return Ok(None);
    }
    let kind = match message_type & 0xff {
        IPCTNL_MSG_CT_NEW if flags & NLM_F_MULTI != 0 => CtEventKind::Dumped,
        IPCTNL_MSG_CT_NEW if flags & (NLM_F_CREATE | NLM_F_EXCL) != 0 => CtEventKind::New,
        IPCTNL_MSG_CT_NEW => CtEventKind::Update,
        IPCTNL_MSG_CT_DELETE => CtEventKind::Destroy,
        _ => return Ok(None),
    };
    let attrs = body
        .get(4..)
        .ok_or_else(|| CtDecodeError("shorter than its header".into()))?;
    // The crate's typed view.
    let msg = ConntrackMessage::parse_with_param(attrs, (message_type & 0xff) as u8)
        .map_err(|e| CtDecodeError(e.to_string()))?;
    let typed = match &msg {
        ConntrackMessage::New(a) | ConntrackMessage::Delete(a) | ConntrackMessage::Get(a) => a.as_slice(),
        _ => return Ok(None),
    };
    let (mut original_parts, mut reply_parts) = (None, None);
    let mut entry_status = 0;
    let mut mark = 0;
    let mut tcp_state = None;
    for a in typed {
        match a {
            ConntrackAttribute::CtaTupleOrig(p) => original_parts = Some(p.as_slice()),
            ConntrackAttribute::CtaTupleReply(p) => reply_parts = Some(p.as_slice()),
            ConntrackAttribute::CtaStatus(s) => entry_status = s.bits(),
            ConntrackAttribute::CtaMark(m) => mark = *m,
            ConntrackAttribute::CtaProtoInfo(infos) => {
                for info in infos {
                    if let ProtoInfo::TCP(tcp) = info {
                        for t in tcp {
                            if let ProtoInfoTCP::State(s) = t {
                                tcp_state = Some(TcpState::from(*s));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    // What the crate does not type, from the same attributes.
    let (mut original_raw, mut reply_raw): (&[u8], &[u8]) = (&[], &[]);
    let (mut id, mut zone) = (0, None);
    let (mut original_counters, mut reply_counters, mut start_ns, mut stop_ns) = (None, None, None, None);
    for (k, v) in nlas(attrs) {
        match k {
            CTA_TUPLE_ORIG => original_raw = v,
            CTA_TUPLE_REPLY => reply_raw = v,
            CTA_COUNTERS_ORIG => original_counters = Some(counters(v)),
            CTA_COUNTERS_REPLY => reply_counters = Some(counters(v)),
            CTA_ID => id = be_u32(v).unwrap_or_default(),
            CTA_ZONE => zone = be_u16(v),
            CTA_TIMESTAMP => {
                for (tk, tv) in nlas(v) {
                    match tk {
                        CTA_TIMESTAMP_START => start_ns = be_u64(tv),
                        CTA_TIMESTAMP_STOP => stop_ns = be_u64(tv),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let (Some(original), Some(reply)) = (original_parts, reply_parts) else {
        return Err(CtDecodeError("an entry without its two tuples".into()));
    };
    let (original, reply) = (tuple(original, original_raw)?, tuple(reply, reply_raw)?);
    Ok(Some(CtEntry {
        kind,
        id,
        original,
        reply,
        status: entry_status,
        mark,
        zone,
        tcp_state,
        original_counters,
        reply_counters,
        start_ns,
        stop_ns,
    }))
}

/// Calls `f` with the type, flags and body of every netlink message in `datagram`
/// (control messages skipped).
pub fn messages(datagram: &[u8], mut f: impl FnMut(u16, u16, &[u8])) {
    let mut off = 0;
    while off < datagram.len() {
        let Ok(buf) = NetlinkBuffer::new_checked(&datagram[off..]) else {
            return;
        };
        let len = buf.length() as usize;
        // NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN: not an entry.
        if buf.message_type() >= 16 {
            f(buf.message_type(), buf.flags(), buf.payload());
        }
        if len == 0 {
            return;
        }
        off += len.next_multiple_of(4);
    }
}

/// Frames `e` as the kernel sends it: a netlink message (header, `nfgenmsg`, the
/// attributes), an event of its kind (a dumped entry as part of a multipart answer),
/// IPv4 or IPv6 by its addresses. For replays (the flows benchmark) and tests: what
/// [`decode`] reads back is `e`, but for what the kernel leaves out of an event of
/// that kind (a zone of `None` stays out).
pub fn frame(e: &CtEntry) -> Vec<u8> {
    use netlink_packet_core::{DefaultNla, Emitable, NetlinkHeader};
    use netlink_packet_netfilter::conntrack::{Protocol, Status};

    fn nested(attrs: &[DefaultNla]) -> Vec<u8> {
        let mut v = vec![0; attrs.buffer_len()];
        attrs.emit(&mut v);
        v
    }
    fn parts(t: &CtTuple) -> Vec<Tuple> {
        let mut proto = vec![ProtoTuple::Protocol(Protocol::from(t.protocol))];
        match t.icmp {
            Some(i) => {
                let v6 = t.protocol == 58;
                let (id, ty, code) = if v6 {
                    (CTA_PROTO_ICMPV6_ID, CTA_PROTO_ICMPV6_TYPE, CTA_PROTO_ICMPV6_CODE)
                } else {
                    (CTA_PROTO_ICMP_ID, CTA_PROTO_ICMP_TYPE, CTA_PROTO_ICMP_CODE)
                };
                proto.push(ProtoTuple::Other(DefaultNla::new(id, i.id.to_be_bytes().to_vec())));
                proto.push(ProtoTuple::Other(DefaultNla::new(ty, vec![i.kind])));
                proto.push(ProtoTuple::Other(DefaultNla::new(code, vec![i.code])));
            }
            None => {
                proto.push(ProtoTuple::SourcePort(t.src_port));
                proto.push(ProtoTuple::DestinationPort(t.dst_port));
            }
        }
        vec![
            Tuple::Ip(vec![IPTuple::SourceAddress(t.src), IPTuple::DestinationAddress(t.dst)]),
            Tuple::Proto(proto),
        ]
    }
    let counters = |kind: u16, c: CtCounters| {
        ConntrackAttribute::Other(DefaultNla::new(
            kind,
            nested(&[
                DefaultNla::new(CTA_COUNTERS_PACKETS, c.packets.to_be_bytes().to_vec()),
                DefaultNla::new(CTA_COUNTERS_BYTES, c.bytes.to_be_bytes().to_vec()),
            ]),
        ))
    };
    let mut attrs = vec![
        ConntrackAttribute::CtaTupleOrig(parts(&e.original)),
        ConntrackAttribute::CtaTupleReply(parts(&e.reply)),
        ConntrackAttribute::CtaStatus(Status::from_bits_retain(e.status)),
        ConntrackAttribute::CtaMark(e.mark),
    ];
    if let Some(s) = e.tcp_state {
        let v = match s {
            TcpState::None => 0,
            TcpState::SynSent => 1,
            TcpState::SynRecv => 2,
            TcpState::Established => 3,
            TcpState::FinWait => 4,
            TcpState::CloseWait => 5,
            TcpState::LastAck => 6,
            TcpState::TimeWait => 7,
            TcpState::Close => 8,
            TcpState::SynSent2 => 9,
            TcpState::Other(v) => v,
        };
        attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(vec![
            ProtoInfoTCP::State(v),
        ])]));
    }
    if let Some(c) = e.original_counters {
        attrs.push(counters(CTA_COUNTERS_ORIG, c));
    }
    if let Some(c) = e.reply_counters {
        attrs.push(counters(CTA_COUNTERS_REPLY, c));
    }
    attrs.push(ConntrackAttribute::Other(DefaultNla::new(
        CTA_ID,
        e.id.to_be_bytes().to_vec(),
    )));
    if let Some(z) = e.zone {
        attrs.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            z.to_be_bytes().to_vec(),
        )));
    }
    let mut ts = Vec::new();
    if let Some(v) = e.start_ns {
        ts.push(DefaultNla::new(CTA_TIMESTAMP_START, v.to_be_bytes().to_vec()));
    }
    if let Some(v) = e.stop_ns {
        ts.push(DefaultNla::new(CTA_TIMESTAMP_STOP, v.to_be_bytes().to_vec()));
    }
    if !ts.is_empty() {
        attrs.push(ConntrackAttribute::Other(DefaultNla::new(CTA_TIMESTAMP, nested(&ts))));
    }
    let (msg, ty, flags) = match e.kind {
        CtEventKind::New => (
            ConntrackMessage::New(attrs),
            IPCTNL_MSG_CT_NEW,
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        CtEventKind::Update => (ConntrackMessage::New(attrs), IPCTNL_MSG_CT_NEW, 0),
        CtEventKind::Destroy => (ConntrackMessage::Delete(attrs), IPCTNL_MSG_CT_DELETE, 0),
        CtEventKind::Dumped => (ConntrackMessage::New(attrs), IPCTNL_MSG_CT_NEW, NLM_F_MULTI),
    };
    let family: u8 = if e.original.src.is_ipv4() { 2 } else { 10 };
    let body_len = 4 + msg.buffer_len();
    let mut header = NetlinkHeader::default();
    header.message_type = (NFNL_SUBSYS_CTNETLINK << 8) | ty;
    header.flags = flags;
    header.length = (16 + body_len) as u32;
    let mut out = vec![0; 16 + body_len];
    header.emit(&mut out[..16]);
    out[16] = family;
    msg.emit(&mut out[20..]);
    out
}

/// Decodes every entry of a datagram (see [`messages`]) into `out`; returns how many
/// messages could not be decoded.
pub fn decode_datagram(datagram: &[u8], out: &mut Vec<CtEntry>) -> usize {
    decode_into(datagram, out)
}

/// Why reading events failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The kernel dropped events: the socket's buffer overflowed (`ENOBUFS`). The
    /// socket goes on working; what was lost must be recovered from a dump.
    #[error("conntrack events were lost: the receive buffer overflowed")]
    Overflow,
    /// The socket failed.
    #[error("reading conntrack events: {0}")]
    Io(#[from] io::Error),
}

/// A socket subscribed to the conntrack events of the caller's network namespace.
pub struct ConntrackEvents {
    sock: NetlinkSocket<Nfnetlink>,
}

impl ConntrackEvents {
    /// Subscribes to new, update and destroy events, with a receive buffer of
    /// `receive_buffer` bytes (forced past the system's maximum).
    pub fn subscribe(receive_buffer: usize) -> io::Result<Self> {
        let mut sock = NetlinkSocket::<Nfnetlink>::new()?;
        sock.force_receive_buffer(receive_buffer)?;
        for g in [
            NFNLGRP_CONNTRACK_NEW,
            NFNLGRP_CONNTRACK_UPDATE,
            NFNLGRP_CONNTRACK_DESTROY,
        ] {
            sock.join_group(g)?;
        }
        Ok(Self { sock })
    }

    /// The receive buffer the kernel granted.
    pub fn receive_buffer(&self) -> io::Result<usize> {
        self.sock.receive_buffer()
    }

    /// Sets how long [`ConntrackEvents::next_datagram`] waits.
    pub fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.sock.set_receive_timeout(timeout)
    }

    /// The next datagram of events, undecoded (walk it with [`messages`]); empty when
    /// the timeout passed first.
    pub fn next_datagram(&mut self) -> Result<&[u8], ReadError> {
        read_result(self.sock.receive_datagram(true))
    }

    /// Reads and decodes every event already queued, without waiting, into `out`.
    ///
    /// After an [`ReadError::Overflow`] the kernel drops every event, *without
    /// reporting it again*, until the queue has been read empty: a reader recovers by
    /// draining first and dumping the table after, so the dump sees what the dropped
    /// events said. Returns the number of undecodable messages.
    pub fn drain(&mut self, out: &mut Vec<CtEntry>) -> Result<usize, ReadError> {
        let mut bad = 0;
        loop {
            let datagram = match read_result(self.sock.receive_datagram(false)) {
                Ok(d) => d,
                // A second overflow while draining: keep draining, the dump follows.
                Err(ReadError::Overflow) => continue,
                Err(e) => return Err(e),
            };
            if datagram.is_empty() {
                return Ok(bad);
            }
            bad += decode_into(datagram, out);
        }
    }

    /// Waits up to the timeout for the next datagram and decodes its entries into
    /// `out`; a message that cannot be decoded is counted in the returned number and
    /// skipped.
    pub fn next(&mut self, out: &mut Vec<CtEntry>) -> Result<usize, ReadError> {
        let datagram = self.next_datagram()?;
        Ok(decode_into(datagram, out))
    }
}

fn read_result(r: io::Result<&[u8]>) -> Result<&[u8], ReadError> {
    match r {
        Ok(d) => Ok(d),
        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Err(ReadError::Overflow),
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// Decodes the entries of one datagram into `out`; returns how many messages could
/// not be decoded.
fn decode_into(datagram: &[u8], out: &mut Vec<CtEntry>) -> usize {
    let mut bad = 0;
    messages(datagram, |ty, flags, body| match decode(ty, flags, body) {
        Ok(Some(e)) => out.push(e),
        Ok(None) => {}
        Err(_) => bad += 1,
    });
    bad
}

/// Every entry of the caller's namespace's table, both families.
pub fn dump() -> io::Result<Vec<CtEntry>> {
    let mut sock = NetlinkSocket::<Nfnetlink>::new()?;
    // A large table comes in many datagrams; the default buffer holds a few.
    let _ = sock.force_receive_buffer(4 << 20);
    let answer = sock.dump(NetfilterMessage {
        message_type: (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET,
        // nfgenmsg: AF_UNSPEC (every family), version 0, resource id 0.
        body: vec![0, 0, 0, 0],
    })?;
    Ok(answer
        .iter()
        .filter_map(|m| decode(m.message_type, NLM_F_MULTI, &m.body).ok().flatten())
        .collect())
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{DefaultNla, Emitable, NetlinkHeader};
    use netlink_packet_netfilter::conntrack::{Protocol, Status};

    use super::*;

    fn nested(attrs: &[DefaultNla]) -> Vec<u8> {
        let mut v = vec![0; attrs.buffer_len()];
        attrs.emit(&mut v);
        v
    }

    fn counters_nla(kind: u16, packets: u64, bytes: u64) -> ConntrackAttribute {
        ConntrackAttribute::Other(DefaultNla::new(
            kind,
            nested(&[
                DefaultNla::new(CTA_COUNTERS_PACKETS, packets.to_be_bytes().to_vec()),
                DefaultNla::new(CTA_COUNTERS_BYTES, bytes.to_be_bytes().to_vec()),
            ]),
        ))
    }

    fn tuple_parts(src: &str, dst: &str, protocol: u8, sport: u16, dport: u16) -> Vec<Tuple> {
        let mut proto = vec![ProtoTuple::Protocol(Protocol::from(protocol))];
        if protocol == 1 {
            proto.push(ProtoTuple::Other(DefaultNla::new(
                CTA_PROTO_ICMP_ID,
                77u16.to_be_bytes().to_vec(),
            )));
            proto.push(ProtoTuple::Other(DefaultNla::new(CTA_PROTO_ICMP_TYPE, vec![8])));
            proto.push(ProtoTuple::Other(DefaultNla::new(CTA_PROTO_ICMP_CODE, vec![0])));
        } else {
            proto.push(ProtoTuple::SourcePort(sport));
            proto.push(ProtoTuple::DestinationPort(dport));
        }
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(proto),
        ]
    }

    /// A message body as the kernel sends it: `nfgenmsg`, then the attributes.
    fn body(msg: ConntrackMessage) -> Vec<u8> {
        let mut v = vec![2, 0, 0, 0];
        let at = v.len();
        v.resize(at + msg.buffer_len(), 0);
        msg.emit(&mut v[at..]);
        v
    }

    fn tcp_attrs() -> Vec<ConntrackAttribute> {
        vec![
            ConntrackAttribute::CtaTupleOrig(tuple_parts("10.0.0.2", "10.0.1.3", 6, 40000, 80)),
            ConntrackAttribute::CtaTupleReply(tuple_parts("10.0.1.3", "10.0.0.2", 6, 80, 40000)),
            ConntrackAttribute::CtaStatus(Status::from_bits_retain(0x19e)),
            ConntrackAttribute::CtaMark(0x0030_0000),
            ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(vec![ProtoInfoTCP::State(7)])]),
            counters_nla(CTA_COUNTERS_ORIG, 12, 3456),
            counters_nla(CTA_COUNTERS_REPLY, 10, 98765),
            ConntrackAttribute::Other(DefaultNla::new(CTA_ID, 4242u32.to_be_bytes().to_vec())),
            ConntrackAttribute::Other(DefaultNla::new(
                CTA_TIMESTAMP,
                nested(&[
                    DefaultNla::new(CTA_TIMESTAMP_START, 1_000u64.to_be_bytes().to_vec()),
                    DefaultNla::new(CTA_TIMESTAMP_STOP, 5_000u64.to_be_bytes().to_vec()),
                ]),
            )),
        ]
    }

    const NEW: u16 = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
    const DELETE: u16 = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE;

    #[test]
    fn every_field_of_an_entry_is_read() {
        let e = decode(DELETE, 0, &body(ConntrackMessage::Delete(tcp_attrs())))
            .unwrap()
            .unwrap();
        assert_eq!(e.kind, CtEventKind::Destroy);
        assert_eq!(e.id, 4242);
        assert_eq!(e.original.src.to_string(), "10.0.0.2");
        assert_eq!(
            (e.original.src_port, e.original.dst_port, e.original.protocol),
            (40000, 80, 6)
        );
        assert_eq!(e.reply.src.to_string(), "10.0.1.3");
        assert_eq!(e.status, 0x19e);
        assert_eq!(e.mark, 0x0030_0000);
        assert_eq!(e.tcp_state, Some(TcpState::TimeWait));
        assert!(e.tcp_state.unwrap().finishing());
        assert_eq!(
            e.original_counters,
            Some(CtCounters {
                packets: 12,
                bytes: 3456
            })
        );
        assert_eq!(
            e.reply_counters,
            Some(CtCounters {
                packets: 10,
                bytes: 98765
            })
        );
        assert_eq!((e.start_ns, e.stop_ns), (Some(1_000), Some(5_000)));
        assert_eq!(e.original.icmp, None);
    }

    #[test]
    fn the_message_type_and_flags_say_what_happened() {
        let b = body(ConntrackMessage::New(tcp_attrs()));
        let kind = |flags| decode(NEW, flags, &b).unwrap().unwrap().kind;
        assert_eq!(kind(NLM_F_CREATE | NLM_F_EXCL), CtEventKind::New);
        assert_eq!(kind(0), CtEventKind::Update);
        assert_eq!(kind(NLM_F_MULTI), CtEventKind::Dumped);
        // Another subsystem (nftables, say) and expectations are not entries.
        assert_eq!(decode(10 << 8, 0, &b).unwrap(), None);
        assert_eq!(decode((NFNL_SUBSYS_CTNETLINK << 8) | 3, 0, &b).unwrap(), None);
    }

    #[test]
    fn icmp_echo_identity_and_missing_counters() {
        let attrs = vec![
            ConntrackAttribute::CtaTupleOrig(tuple_parts("fd00::2", "fd00::3", 1, 0, 0)),
            ConntrackAttribute::CtaTupleReply(tuple_parts("fd00::3", "fd00::2", 1, 0, 0)),
        ];
        let e = decode(NEW, NLM_F_CREATE, &body(ConntrackMessage::New(attrs)))
            .unwrap()
            .unwrap();
        assert_eq!(
            e.original.icmp,
            Some(IcmpTuple {
                id: 77,
                kind: 8,
                code: 0
            })
        );
        assert_eq!(e.original_counters, None, "a message without counters says so");
        assert_eq!(e.tcp_state, None);
        assert_eq!(e.zone, None);
    }

    #[test]
    fn an_entry_without_its_tuples_is_an_error_not_a_guess() {
        let attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple_parts(
            "10.0.0.2", "10.0.1.3", 6, 1, 2,
        ))];
        assert!(decode(NEW, 0, &body(ConntrackMessage::New(attrs))).is_err());
        assert!(decode(NEW, 0, &[2, 0]).is_err(), "shorter than nfgenmsg");
    }

    #[test]
    fn a_framed_entry_reads_back_as_itself() {
        let mut out = Vec::new();
        let b = body(ConntrackMessage::Delete(tcp_attrs()));
        let e = decode(DELETE, 0, &b).unwrap().unwrap();
        for kind in [
            CtEventKind::New,
            CtEventKind::Update,
            CtEventKind::Destroy,
            CtEventKind::Dumped,
        ] {
            let mut e = CtEntry { kind, ..e.clone() };
            e.zone = Some(3);
            out.clear();
            assert_eq!(decode_datagram(&frame(&e), &mut out), 0);
            assert_eq!(out, vec![e]);
        }
        let icmp = decode(
            NEW,
            NLM_F_CREATE,
            &body(ConntrackMessage::New(vec![
                ConntrackAttribute::CtaTupleOrig(tuple_parts("10.0.0.2", "10.0.0.3", 1, 0, 0)),
                ConntrackAttribute::CtaTupleReply(tuple_parts("10.0.0.3", "10.0.0.2", 1, 0, 0)),
            ])),
        )
        .unwrap()
        .unwrap();
        out.clear();
        decode_datagram(&frame(&icmp), &mut out);
        assert_eq!(out[0].original.icmp, icmp.original.icmp);
    }

    #[test]
    fn every_message_of_a_datagram_is_walked() {
        let mut datagram = Vec::new();
        for (ty, flags) in [(NEW, NLM_F_CREATE), (2u16, 0), (DELETE, 0)] {
            let payload = body(ConntrackMessage::New(tcp_attrs()));
            let mut h = NetlinkHeader::default();
            h.message_type = ty;
            h.flags = flags;
            h.length = (16 + payload.len()) as u32;
            let mut hb = vec![0; 16];
            h.emit(&mut hb);
            datagram.extend_from_slice(&hb);
            datagram.extend_from_slice(&payload);
            datagram.resize(datagram.len().next_multiple_of(4), 0);
        }
        let mut seen = Vec::new();
        messages(&datagram, |ty, flags, _| seen.push((ty, flags)));
        assert_eq!(
            seen,
            vec![(NEW, NLM_F_CREATE), (DELETE, 0)],
            "the error message (type 2) is skipped"
        );
        let mut out = Vec::new();
        assert_eq!(decode_into(&datagram, &mut out), 0);
        assert_eq!(
            out.iter().map(|e| e.kind).collect::<Vec<_>>(),
            [CtEventKind::New, CtEventKind::Destroy]
        );
    }
}
