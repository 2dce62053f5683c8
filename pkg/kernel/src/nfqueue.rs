//! NFQUEUE: packets a rule holds in the kernel until userspace gives each a verdict,
//! read from an nfnetlink socket bound to one queue in the caller's network namespace.
//! Unlike NFLOG the packet waits: what weft does first (learn the DNS answers that came
//! before it) is done before the packet goes on.
//!
//! The same socket may also be bound to an NFLOG group ([`NfQueue::log_too`]): the
//! kernel hands both kinds of message to the socket as the packets pass, so they are
//! read in the order the packets were seen (an answer's copy before the connection it
//! allowed). Whether a full queue passes or drops, and whether the rule passes while
//! nobody is bound (`bypass`), is the caller's choice: weft's hold drops (fails closed).
//!
//! Hand-written on the kernel crate's nfnetlink socket as NFLOG is:
//! `netlink-packet-netfilter` has no NFQUEUE messages, and those used here are few and
//! stable (linux/netfilter/nfnetlink_queue.h).

use std::io;
use std::time::Duration;

use crate::nfattr::{attrs, be32};
use crate::nflog::LoggedPacket;
use crate::nftset::attr;
use crate::{NetfilterMessage, NetlinkSocket, Nfnetlink};

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_MARK: u16 = 3;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_IPV6: u8 = 10;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NF_REPEAT: u32 = 4;

/// A packet held for a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// Its id, for the verdict.
    pub id: u32,
    /// Whether it is IPv6 (else IPv4).
    pub ipv6: bool,
    /// The packet from its network header on (as much as the queue copies).
    pub payload: Vec<u8>,
}

/// What the socket read: a held packet, or a copy an NFLOG rule handed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A packet waiting for its verdict.
    Held(Queued),
    /// A packet of the NFLOG group bound with [`NfQueue::log_too`].
    Logged(LoggedPacket),
}

/// What becomes of a held packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on through the rest of the hook.
    Accept,
    /// It is dropped.
    Drop,
    /// It goes through the hook's chain again from its start, with `mark` as its
    /// packet mark (so a rule can tell it was held already): the chain then decides
    /// with what changed meanwhile.
    Repeat {
        /// The packet's mark from now on.
        mark: u32,
    },
}

/// Whether a packet the full queue has no room for passes or is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Let through (`NFQA_CFG_F_FAIL_OPEN`).
    Pass,
    /// Dropped (the kernel's default).
    Drop,
}

/// A socket bound to one queue.
pub struct NfQueue {
    sock: NetlinkSocket<Nfnetlink>,
    queue: u16,
    /// The last held packet's id: a batch verdict up to past it frees every packet
    /// held, also those whose messages a full socket lost.
    last_id: u32,
}

fn message(queue: u16, kind: u16, attrs: &[u8]) -> NetfilterMessage {
    let mut body = vec![NFPROTO_UNSPEC, 0];
    body.extend_from_slice(&queue.to_be_bytes());
    body.extend_from_slice(attrs);
    NetfilterMessage {
        message_type: (NFNL_SUBSYS_QUEUE << 8) | kind,
        body,
    }
}

impl NfQueue {
    /// Binds queue `queue` in the caller's namespace: the first `copy` bytes of each
    /// packet, at most `max_len` packets held (past it, `overflow` says what becomes of
    /// them). Fails when another socket holds the queue.
    pub fn bind(queue: u16, copy: u32, max_len: u32, overflow: Overflow) -> io::Result<Self> {
        let mut sock = NetlinkSocket::<Nfnetlink>::new()?;
        // command, pad, pf (big-endian u16; unused by the kernel since 3.8)
        sock.execute(
            message(
                queue,
                NFQNL_MSG_CONFIG,
                &attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]),
            ),
            0,
        )?;
        let mut params = copy.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_PACKET);
        let mut cfg = attr(NFQA_CFG_PARAMS, &params);
        cfg.extend(attr(NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes()));
        let flags = match overflow {
            Overflow::Pass => NFQA_CFG_F_FAIL_OPEN,
            Overflow::Drop => 0,
        };
        cfg.extend(attr(NFQA_CFG_FLAGS, &flags.to_be_bytes()));
        cfg.extend(attr(NFQA_CFG_MASK, &NFQA_CFG_F_FAIL_OPEN.to_be_bytes()));
        sock.execute(message(queue, NFQNL_MSG_CONFIG, &cfg), 0)?;
        Ok(Self {
            sock,
            queue,
            last_id: 0,
        })
    }

    /// Binds NFLOG group `group` to this socket too (the first `copy` bytes of each
    /// packet, each sent as it passes): its packets arrive among the held ones, in the
    /// order they were seen.
    pub fn log_too(&mut self, group: u16, copy: u32) -> io::Result<()> {
        crate::nflog::bind_group(&mut self.sock, group, copy, true)
    }

    /// Makes the socket's receive buffer `bytes` (needs `CAP_NET_ADMIN`): past it the
    /// kernel drops messages and the next read fails with `ENOBUFS`.
    pub fn receive_buffer(&mut self, bytes: usize) -> io::Result<()> {
        self.sock.force_receive_buffer(bytes)
    }

    /// Waits up to `timeout` for held packets and logged copies; none when the wait
    /// ends. Each held packet must be given a verdict ([`Self::verdict`]), or it stays
    /// held until the socket closes, which drops it.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Vec<Event>> {
        let mut out = Vec::new();
        for m in self.sock.receive_unsolicited(timeout)? {
            if m.message_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
                if let Some(q) = parse(&m.body) {
                    self.last_id = q.id;
                    out.push(Event::Held(q));
                }
            } else if let Some(p) = crate::nflog::logged(&m) {
                out.push(Event::Logged(p));
            }
        }
        Ok(out)
    }

    /// Gives packet `id` its verdict.
    pub fn verdict(&mut self, id: u32, v: Verdict) -> io::Result<()> {
        self.sock
            .notify(message(self.queue, NFQNL_MSG_VERDICT, &verdict_attrs(id, v)))
    }

    /// Gives every packet held now the same verdict, also those whose messages were
    /// lost (`ENOBUFS`): nothing stays held for a message nobody will read.
    pub fn verdict_all(&mut self, v: Verdict) -> io::Result<()> {
        // Ids grow by one per packet; the batch takes every id up to this one (in
        // serial-number order), so half the id space ahead covers what is held.
        let up_to = self.last_id.wrapping_add(1 << 30);
        self.sock
            .notify(message(self.queue, NFQNL_MSG_VERDICT_BATCH, &verdict_attrs(up_to, v)))
    }
}

/// A verdict's attributes: the header (verdict, id), then the mark it sets, if any.
fn verdict_attrs(id: u32, v: Verdict) -> Vec<u8> {
    let code = match v {
        Verdict::Accept => NF_ACCEPT,
        Verdict::Drop => NF_DROP,
        Verdict::Repeat { .. } => NF_REPEAT,
    };
    let mut hdr = code.to_be_bytes().to_vec();
    hdr.extend_from_slice(&id.to_be_bytes());
    let mut out = attr(NFQA_VERDICT_HDR, &hdr);
    if let Verdict::Repeat { mark } = v {
        out.extend(attr(NFQA_MARK, &mark.to_be_bytes()));
    }
    out
}

/// Reads one NFQNL_MSG_PACKET body.
fn parse(body: &[u8]) -> Option<Queued> {
    let family = *body.first()?;
    let mut id = None;
    let mut payload = Vec::new();
    for (ty, data) in attrs(body) {
        match ty {
            NFQA_PACKET_HDR => id = be32(data),
            NFQA_PAYLOAD => payload = data.to_vec(),
            _ => {}
        }
    }
    Some(Queued {
        id: id?,
        ipv6: family == NFPROTO_IPV6,
        payload,
    })
}

/// The UDP payload of an IPv4 or IPv6 packet (no IPv6 extension headers: a DNS
/// answer carries none), with the packet's destination; `None` for anything else.
pub fn udp_payload(packet: &[u8]) -> Option<(std::net::IpAddr, &[u8])> {
    let (dst, l4): (std::net::IpAddr, &[u8]) = match packet.first()? >> 4 {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            if packet.get(9) != Some(&17) {
                return None;
            }
            let d: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            (d.into(), packet.get(ihl..)?)
        }
        6 => {
            if packet.get(6) != Some(&17) {
                return None;
            }
            let d: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            (d.into(), packet.get(40..)?)
        }
        _ => return None,
    };
    Some((dst, l4.get(8..)?))
}

/// The DNS message a packet from port 53 carries: a UDP datagram's payload, or a TCP
/// segment's that holds one whole message after its two-byte length (a message split
/// over segments is not read: `None`, as for anything else).
pub fn dns_message(packet: &[u8]) -> Option<&[u8]> {
    if let Some((_, p)) = udp_payload(packet) {
        return Some(p);
    }
    let l4 = match packet.first()? >> 4 {
        4 if packet.get(9) == Some(&6) => packet.get(usize::from(packet[0] & 0x0f) * 4..)?,
        6 if packet.get(6) == Some(&6) => packet.get(40..)?,
        _ => return None,
    };
    let data = l4.get(usize::from(l4.get(12)? >> 4) * 4..)?;
    let len = usize::from(u16::from_be_bytes([*data.first()?, *data.get(1)?]));
    (len > 0 && data.len() == len + 2).then(|| &data[2..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_packet_reads_back() {
        let mut body = vec![2u8, 0, 0, 5];
        let mut hdr = 42u32.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0x08, 0x00, 1]);
        body.extend(attr(NFQA_PACKET_HDR, &hdr));
        body.extend(attr(NFQA_PAYLOAD, &[0x45, 0, 0, 20]));
        assert_eq!(
            parse(&body),
            Some(Queued {
                id: 42,
                ipv6: false,
                payload: vec![0x45, 0, 0, 20]
            })
        );
        assert_eq!(parse(&[2, 0, 0, 5]), None, "no id, no packet");
    }

    #[test]
    fn a_repeat_carries_its_mark() {
        let a = verdict_attrs(7, Verdict::Repeat { mark: 0x0040_0000 });
        let mut want = attr(NFQA_VERDICT_HDR, &[0, 0, 0, 4, 0, 0, 0, 7]);
        want.extend(attr(NFQA_MARK, &[0, 0x40, 0, 0]));
        assert_eq!(a, want);
        assert_eq!(
            verdict_attrs(7, Verdict::Accept),
            attr(NFQA_VERDICT_HDR, &[0, 0, 0, 1, 0, 0, 0, 7]),
            "no mark unless repeated"
        );
    }

    #[test]
    fn the_udp_payload_of_either_family() {
        let mut v4 = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        v4.extend_from_slice(&[0, 53, 0x99, 0x99, 0, 12, 0, 0, b'd', b'n', b's', b'!']);
        let (dst, p) = udp_payload(&v4).unwrap();
        assert_eq!((dst.to_string().as_str(), p), ("10.0.0.2", &b"dns!"[..]));
        let mut v6 = vec![0x60, 0, 0, 0, 0, 12, 17, 64];
        v6.extend_from_slice(&[0; 16]);
        let mut d = [0u8; 16];
        d[0] = 0xfd;
        d[15] = 2;
        v6.extend_from_slice(&d);
        v6.extend_from_slice(&[0, 53, 0x99, 0x99, 0, 12, 0, 0, b'd', b'n', b's', b'!']);
        let (dst, p) = udp_payload(&v6).unwrap();
        assert_eq!((dst.to_string().as_str(), p), ("fd00::2", &b"dns!"[..]));
        let mut tcp = v4.clone();
        tcp[9] = 6;
        assert_eq!(udp_payload(&tcp), None);
    }

    #[test]
    fn a_dns_message_over_udp_or_in_one_tcp_segment() {
        let mut udp = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        udp.extend_from_slice(&[0, 53, 0x99, 0x99, 0, 12, 0, 0, b'd', b'n', b's', b'!']);
        assert_eq!(dns_message(&udp), Some(&b"dns!"[..]));
        let mut tcp = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        let mut header = vec![0u8; 20];
        header[1] = 53;
        header[12] = 5 << 4;
        tcp.extend_from_slice(&header);
        let whole = [&tcp[..], &[0, 4], b"dns!"].concat();
        assert_eq!(dns_message(&whole), Some(&b"dns!"[..]));
        let part = [&tcp[..], &[0, 9], b"dns!"].concat();
        assert_eq!(dns_message(&part), None, "the rest is in the next segment");
        assert_eq!(dns_message(&tcp), None, "an ACK carries nothing");
    }
}
