//! NFQUEUE: packets a rule holds in the kernel until userspace gives each a verdict,
//! read from an nfnetlink socket bound to one queue in the caller's network namespace.
//! Unlike NFLOG the packet waits: what weft does with it (learn a DNS answer's
//! addresses) is done before the packet goes on.
//!
//! The queue is bound fail-open (`NFQA_CFG_F_FAIL_OPEN`): a packet the queue has no
//! room for is let through rather than dropped, and the rule that queues is written
//! with `bypass`, so packets pass while nobody is bound (weftd down or restarting).
//!
//! Hand-written on the kernel crate's nfnetlink socket as NFLOG is:
//! `netlink-packet-netfilter` has no NFQUEUE messages, and those used here are few and
//! stable (linux/netfilter/nfnetlink_queue.h).

use std::io;
use std::time::Duration;

use crate::nfattr::{attrs, be32};
use crate::nftset::attr;
use crate::{NetfilterMessage, NetlinkSocket, Nfnetlink};

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
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

/// What becomes of a held packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on through the rest of the hook.
    Accept,
    /// It is dropped.
    Drop,
}

/// A socket bound to one queue.
pub struct NfQueue {
    sock: NetlinkSocket<Nfnetlink>,
    queue: u16,
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
    /// packet, at most `max_len` packets held (past it they pass, fail-open). Fails
    /// when another socket holds the queue.
    pub fn bind(queue: u16, copy: u32, max_len: u32) -> io::Result<Self> {
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
        cfg.extend(attr(NFQA_CFG_FLAGS, &NFQA_CFG_F_FAIL_OPEN.to_be_bytes()));
        cfg.extend(attr(NFQA_CFG_MASK, &NFQA_CFG_F_FAIL_OPEN.to_be_bytes()));
        sock.execute(message(queue, NFQNL_MSG_CONFIG, &cfg), 0)?;
        Ok(Self { sock, queue })
    }

    /// Waits up to `timeout` for held packets; none when the wait ends. Each must be
    /// given a verdict ([`Self::verdict`]), or it stays held until the socket closes,
    /// which drops it.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Vec<Queued>> {
        Ok(self
            .sock
            .receive_unsolicited(timeout)?
            .into_iter()
            .filter(|m| m.message_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)
            .filter_map(|m| parse(&m.body))
            .collect())
    }

    /// Gives packet `id` its verdict.
    pub fn verdict(&mut self, id: u32, v: Verdict) -> io::Result<()> {
        let code = match v {
            Verdict::Accept => NF_ACCEPT,
            Verdict::Drop => NF_DROP,
        };
        let mut hdr = code.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        self.sock
            .notify(message(self.queue, NFQNL_MSG_VERDICT, &attr(NFQA_VERDICT_HDR, &hdr)))
    }
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
}
