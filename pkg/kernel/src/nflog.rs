//! NFLOG: the packets an nftables `log group N` rule hands to userspace, read from an
//! nfnetlink socket bound to that group in the caller's network namespace. A copy of
//! each packet's head comes with the rule's prefix; the packet itself has gone on (or
//! been dropped) already, so nothing here is on the packet path.
//!
//! Hand-written on the kernel crate's nfnetlink socket, as the nftables elements are:
//! no crate reads NFLOG without the C library (libnetfilter_log), and the messages are
//! small and stable (linux/netfilter/nfnetlink_log.h).

use std::io;
use std::time::Duration;

use crate::nfattr::{attrs, be32};
use crate::nftset::attr;
use crate::{NetfilterMessage, NetlinkSocket, Nfnetlink};

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_IPV6: u8 = 10;

/// One packet a log rule handed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedPacket {
    /// The rule's prefix.
    pub prefix: String,
    /// Whether the packet is IPv6 (else IPv4).
    pub ipv6: bool,
    /// The head of the packet, from its network header on.
    pub payload: Vec<u8>,
    /// The interface it came in on, if any.
    pub indev: Option<u32>,
    /// The interface it was going out of, if known.
    pub outdev: Option<u32>,
}

/// A socket bound to one NFLOG group.
pub struct NflogSocket {
    sock: NetlinkSocket<Nfnetlink>,
}

fn config(group: u16, attrs: &[u8]) -> NetfilterMessage {
    let mut body = vec![NFPROTO_UNSPEC, 0];
    body.extend_from_slice(&group.to_be_bytes());
    body.extend_from_slice(attrs);
    NetfilterMessage {
        message_type: (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
        body,
    }
}

impl NflogSocket {
    /// Binds group `group` in the caller's namespace, asking for the first `copy`
    /// bytes of every packet. Fails when another socket holds the group.
    pub fn bind(group: u16, copy: u32) -> io::Result<Self> {
        let mut sock = NetlinkSocket::<Nfnetlink>::new()?;
        bind_group(&mut sock, group, copy, false)?;
        Ok(Self { sock })
    }

    /// Waits up to `timeout` for logged packets; none when the wait ends.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Vec<LoggedPacket>> {
        Ok(self
            .sock
            .receive_unsolicited(timeout)?
            .iter()
            .filter_map(logged)
            .collect())
    }
}

/// Binds group `group` to `sock` (which may be bound to other things, an NFQUEUE
/// queue say). With `at_once`, each packet's message is sent as the packet passes
/// (the kernel otherwise gathers up to 100 of them or a second's worth), so messages
/// of the group and of the queue arrive in the order the packets passed.
pub(crate) fn bind_group(sock: &mut NetlinkSocket<Nfnetlink>, group: u16, copy: u32, at_once: bool) -> io::Result<()> {
    sock.execute(config(group, &attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND])), 0)?;
    let mut mode = copy.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    let mut cfg = attr(NFULA_CFG_MODE, &mode);
    if at_once {
        cfg.extend(attr(NFULA_CFG_QTHRESH, &1u32.to_be_bytes()));
    }
    sock.execute(config(group, &cfg), 0)?;
    Ok(())
}

/// The packet an NFLOG message carries; `None` for any other message.
pub(crate) fn logged(m: &NetfilterMessage) -> Option<LoggedPacket> {
    if m.message_type != (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET {
        return None;
    }
    parse(&m.body)
}

/// Reads one NFULNL_MSG_PACKET body: the nfgenmsg header, then attributes.
fn parse(body: &[u8]) -> Option<LoggedPacket> {
    let family = *body.first()?;
    let mut p = LoggedPacket {
        prefix: String::new(),
        ipv6: family == NFPROTO_IPV6,
        payload: Vec::new(),
        indev: None,
        outdev: None,
    };
    for (ty, data) in attrs(body) {
        match ty {
            NFULA_PREFIX => p.prefix = String::from_utf8_lossy(data).trim_end_matches('\0').to_string(),
            NFULA_PAYLOAD => p.payload = data.to_vec(),
            NFULA_IFINDEX_INDEV => p.indev = be32(data),
            NFULA_IFINDEX_OUTDEV => p.outdev = be32(data),
            _ => {}
        }
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_message_reads_back() {
        let mut body = vec![2u8, 0, 0x55, 0x45];
        body.extend(attr(NFULA_PREFIX, b"weft deny gabc\0"));
        body.extend(attr(NFULA_IFINDEX_INDEV, &7u32.to_be_bytes()));
        body.extend(attr(NFULA_PAYLOAD, &[0x45, 0, 0, 20]));
        let p = parse(&body).unwrap();
        assert_eq!(p.prefix, "weft deny gabc");
        assert!(!p.ipv6);
        assert_eq!(p.indev, Some(7));
        assert_eq!(p.outdev, None);
        assert_eq!(p.payload, vec![0x45, 0, 0, 20]);
    }
}
