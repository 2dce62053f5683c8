//! Map elements over nfnetlink: one batch per call, one message per map, so a pod's
//! ports cost the same however many other mappings the maps hold.
//!
//! Hand-written because the only pure-Rust nftables netlink crate is GPL-licensed and
//! the others wrap the C library; only element messages are needed here, and their
//! layout is small and stable (linux/netfilter/nf_tables.h).

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::{HostPort, PortmapError, TABLE};

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NLA_F_NESTED: u16 = 0x8000;

fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut v = Vec::with_capacity(len.next_multiple_of(4));
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(len.next_multiple_of(4), 0);
    v
}

fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    attr(ty | NLA_F_NESTED, &parts.concat())
}

fn strz(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A netlink message with an nfgenmsg header.
fn message(ty: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) -> Vec<u8> {
    let len = 16 + 4 + attrs.len();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(len as u32).to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.push(family);
    v.push(0); // NFNETLINK_V0
    v.extend_from_slice(&res_id.to_be_bytes());
    v.extend_from_slice(attrs);
    v
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Concatenated set data: every component occupies whole 32-bit registers.
fn port_reg(port: u16) -> [u8; 4] {
    let p = port.to_be_bytes();
    [p[0], p[1], 0, 0]
}

/// The key of a mapping's element: `[daddr .] l4proto . dport`.
pub(crate) fn key(m: &HostPort) -> Vec<u8> {
    let mut k = m.host_ip.map(ip_bytes).unwrap_or_default();
    k.extend_from_slice(&[m.protocol.number(), 0, 0, 0]);
    k.extend_from_slice(&port_reg(m.host_port));
    k
}

/// The data of a mapping's element: `pod address . pod port`.
pub(crate) fn data(m: &HostPort) -> Vec<u8> {
    let mut d = ip_bytes(m.container_ip);
    d.extend_from_slice(&port_reg(m.container_port));
    d
}

fn element(m: &HostPort, with_data: bool) -> Vec<u8> {
    let mut parts = vec![nested(NFTA_SET_ELEM_KEY, &[attr(NFTA_DATA_VALUE, &key(m))])];
    if with_data {
        parts.push(nested(NFTA_SET_ELEM_DATA, &[attr(NFTA_DATA_VALUE, &data(m))]));
    }
    nested(NFTA_LIST_ELEM, &parts)
}

/// One batch (begin, a message per map, end) and the sequence numbers that are acked.
fn batch(mappings: &[HostPort], add: bool, first_seq: u32) -> (Vec<u8>, Vec<u32>) {
    let mut by_map: BTreeMap<&'static str, Vec<&HostPort>> = BTreeMap::new();
    for m in mappings {
        by_map.entry(m.map()).or_default().push(m);
    }
    let mut seq = first_seq;
    let mut buf = message(
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        seq,
        NFPROTO_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    let mut acked = Vec::new();
    for (map, ms) in by_map {
        seq += 1;
        let elems: Vec<Vec<u8>> = ms.iter().map(|m| element(m, add)).collect();
        let attrs = [
            attr(NFTA_SET_ELEM_LIST_TABLE, &strz(TABLE)),
            attr(NFTA_SET_ELEM_LIST_SET, &strz(map)),
            nested(NFTA_SET_ELEM_LIST_ELEMENTS, &elems),
        ]
        .concat();
        let (ty, flags) = if add {
            (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE)
        } else {
            (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK)
        };
        buf.extend(message(
            (NFNL_SUBSYS_NFTABLES << 8) | ty,
            flags,
            seq,
            NFPROTO_INET,
            0,
            &attrs,
        ));
        acked.push(seq);
    }
    seq += 1;
    buf.extend(message(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq,
        NFPROTO_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
        &[],
    ));
    (buf, acked)
}

/// Sends one batch and waits for every message's acknowledgement; the first error
/// wins (the kernel then aborts the whole batch).
fn transact(mappings: &[HostPort], add: bool) -> io::Result<()> {
    if mappings.is_empty() {
        return Ok(());
    }
    let mut sock = Socket::new(NETLINK_NETFILTER)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    nix::sys::socket::setsockopt(
        &sock,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(10, 0),
    )
    .map_err(io::Error::from)?;
    let (buf, mut pending) = batch(mappings, add, 1);
    sock.send(&buf, 0)?;
    let mut rx = vec![0u8; 16 * 1024];
    let mut first_error = None;
    while !pending.is_empty() {
        let n = sock.recv(&mut &mut rx[..], 0)?;
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes(rx[off..off + 4].try_into().unwrap()) as usize;
            let ty = u16::from_ne_bytes(rx[off + 4..off + 6].try_into().unwrap());
            let seq = u32::from_ne_bytes(rx[off + 8..off + 12].try_into().unwrap());
            if ty == NLMSG_ERROR && off + 20 <= n {
                let code = i32::from_ne_bytes(rx[off + 16..off + 20].try_into().unwrap());
                pending.retain(|s| *s != seq);
                if code != 0 && first_error.is_none() {
                    first_error = Some(io::Error::from_raw_os_error(-code));
                }
            }
            if len == 0 {
                break;
            }
            off += len.next_multiple_of(4);
        }
        if first_error.is_some() {
            break;
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Adds the mappings' elements to the maps (adding one that is there already, with the
/// same target, is not an error).
pub fn add(mappings: &[HostPort]) -> Result<(), PortmapError> {
    transact(mappings, true).map_err(|source| PortmapError::Netlink {
        step: "adding host port map elements",
        source,
    })
}

/// Removes the mappings' elements. Elements that are already gone are not an error.
pub fn remove(mappings: &[HostPort]) -> Result<(), PortmapError> {
    let err = |source| PortmapError::Netlink {
        step: "removing host port map elements",
        source,
    };
    match transact(mappings, false) {
        Ok(()) => Ok(()),
        // One missing element aborts the batch: remove them one by one instead.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            for m in mappings {
                match transact(std::slice::from_ref(m), false) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(err(e)),
                }
            }
            Ok(())
        }
        Err(e) => Err(err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Protocol;

    #[test]
    fn keys_and_data_use_whole_registers() {
        let m = HostPort {
            host_ip: Some("10.0.0.1".parse().unwrap()),
            host_port: 80,
            protocol: Protocol::Tcp,
            container_ip: "10.244.1.5".parse().unwrap(),
            container_port: 8080,
        };
        assert_eq!(key(&m), vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(data(&m), vec![10, 244, 1, 5, 0x1f, 0x90, 0, 0]);
        let any6 = HostPort {
            host_ip: None,
            container_ip: "fd00::5".parse().unwrap(),
            protocol: Protocol::Udp,
            ..m
        };
        assert_eq!(key(&any6), vec![17, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(data(&any6).len(), 20);
        assert_eq!(any6.map(), "hostports_v6_any");
    }

    #[test]
    fn a_batch_has_one_message_per_map_between_begin_and_end() {
        let m = |port| HostPort {
            host_ip: None,
            host_port: port,
            protocol: Protocol::Tcp,
            container_ip: "10.244.1.5".parse().unwrap(),
            container_port: 80,
        };
        let (buf, acked) = batch(
            &[
                m(1),
                m(2),
                HostPort {
                    host_ip: Some("10.0.0.1".parse().unwrap()),
                    ..m(3)
                },
            ],
            true,
            1,
        );
        assert_eq!(acked, vec![2, 3]);
        // Walk the messages: begin, two element messages, end.
        let mut types = Vec::new();
        let mut off = 0;
        while off < buf.len() {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            types.push(u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap()));
            off += len;
        }
        assert_eq!(types, vec![0x10, (10 << 8) | 12, (10 << 8) | 12, 0x11]);
    }
}
