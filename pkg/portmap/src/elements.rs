//! Map elements over nfnetlink: one batch per call, one message per map, so a pod's
//! ports cost the same however many other mappings the maps hold.
//!
//! Hand-written because the only pure-Rust nftables netlink crate is GPL-licensed and
//! the others wrap the C library; only element messages are needed here, and their
//! layout is small and stable (linux/netfilter/nf_tables.h). The socket, headers,
//! sequence numbers and acknowledgements are the kernel crate's netlink wrapper's.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

use weft_kernel::{NetfilterMessage, NetlinkSocket, Nfnetlink};

use crate::{Entries, Hairpin, HostPort, PortmapError, TABLE};

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

/// An nfnetlink message: the nfgenmsg header, then the attributes.
fn message(ty: u16, family: u8, res_id: u16, attrs: &[u8]) -> NetfilterMessage {
    let mut body = Vec::with_capacity(4 + attrs.len());
    body.push(family);
    body.push(0); // NFNETLINK_V0
    body.extend_from_slice(&res_id.to_be_bytes());
    body.extend_from_slice(attrs);
    NetfilterMessage { message_type: ty, body }
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

/// The key of a hairpin element: `ifname . address`, the name NUL-padded to IFNAMSIZ.
pub(crate) fn hairpin_key(h: &Hairpin) -> Vec<u8> {
    let mut k = vec![0u8; 16];
    let n = h.ifname.len().min(15);
    k[..n].copy_from_slice(&h.ifname.as_bytes()[..n]);
    k.extend(ip_bytes(h.addr));
    k
}

/// One element: which set or map, its key and (for maps) its data.
struct Elem {
    set: &'static str,
    key: Vec<u8>,
    data: Option<Vec<u8>>,
}

fn elems(entries: &Entries, add: bool) -> Vec<Elem> {
    let ports = entries.ports.iter().map(|m| Elem {
        set: m.map(),
        key: key(m),
        data: add.then(|| data(m)),
    });
    let hairpins = entries.hairpins.iter().map(|h| Elem {
        set: h.set(),
        key: hairpin_key(h),
        data: None,
    });
    ports.chain(hairpins).collect()
}

fn element(e: &Elem) -> Vec<u8> {
    let mut parts = vec![nested(NFTA_SET_ELEM_KEY, &[attr(NFTA_DATA_VALUE, &e.key)])];
    if let Some(d) = &e.data {
        parts.push(nested(NFTA_SET_ELEM_DATA, &[attr(NFTA_DATA_VALUE, d)]));
    }
    nested(NFTA_LIST_ELEM, &parts)
}

/// One batch: begin, a message per set (each asking for an acknowledgement), end; each
/// with its netlink flags.
fn batch(elements: &[Elem], add: bool) -> Vec<(NetfilterMessage, u16)> {
    let mut by_map: BTreeMap<&'static str, Vec<&Elem>> = BTreeMap::new();
    for e in elements {
        by_map.entry(e.set).or_default().push(e);
    }
    let mut msgs = vec![(
        message(NFNL_MSG_BATCH_BEGIN, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES, &[]),
        NLM_F_REQUEST,
    )];
    for (map, ms) in by_map {
        let elems: Vec<Vec<u8>> = ms.iter().map(|e| element(e)).collect();
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
        msgs.push((
            message((NFNL_SUBSYS_NFTABLES << 8) | ty, NFPROTO_INET, 0, &attrs),
            flags,
        ));
    }
    msgs.push((
        message(NFNL_MSG_BATCH_END, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES, &[]),
        NLM_F_REQUEST,
    ));
    msgs
}

/// Sends one batch and waits for every message's acknowledgement; the first error
/// wins (the kernel then aborts the whole batch).
fn transact(elements: &[Elem], add: bool) -> io::Result<()> {
    if elements.is_empty() {
        return Ok(());
    }
    NetlinkSocket::<Nfnetlink>::new()?.batch(batch(elements, add))
}

/// Adds the elements (adding one that is there already, with the same data, is not an
/// error).
pub fn add(entries: &Entries) -> Result<(), PortmapError> {
    transact(&elems(entries, true), true).map_err(|source| PortmapError::Netlink {
        step: "adding host port elements",
        source,
    })
}

/// Removes the elements. Elements that are already gone are not an error.
pub fn remove(entries: &Entries) -> Result<(), PortmapError> {
    let err = |source| PortmapError::Netlink {
        step: "removing host port elements",
        source,
    };
    let all = elems(entries, false);
    match transact(&all, false) {
        Ok(()) => Ok(()),
        // One missing element aborts the batch: remove them one by one instead.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            for one in all {
                match transact(std::slice::from_ref(&one), false) {
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
        let entries = Entries {
            ports: vec![
                m(1),
                m(2),
                HostPort {
                    host_ip: Some("10.0.0.1".parse().unwrap()),
                    ..m(3)
                },
            ],
            hairpins: vec![Hairpin {
                ifname: "weftabc".into(),
                addr: "10.244.1.5".parse().unwrap(),
            }],
        };
        let msgs = batch(&elems(&entries, true), true);
        // Begin, three element messages (one per map or set), end; only the element
        // messages ask for an acknowledgement.
        let types: Vec<u16> = msgs.iter().map(|(m, _)| m.message_type).collect();
        assert_eq!(types, vec![0x10, (10 << 8) | 12, (10 << 8) | 12, (10 << 8) | 12, 0x11]);
        let acked: Vec<bool> = msgs.iter().map(|(_, f)| f & NLM_F_ACK != 0).collect();
        assert_eq!(acked, vec![false, true, true, true, false]);
        assert!(msgs.iter().all(|(m, _)| m.body.len() % 4 == 0), "attributes are padded");
        let h = hairpin_key(&entries.hairpins[0]);
        assert_eq!(h.len(), 20);
        assert_eq!(&h[..8], b"weftabc\0");
    }
}
