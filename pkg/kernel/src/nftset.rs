//! nftables set and map elements over nfnetlink: one batch per call, one message per
//! set, so adding a pod's elements costs the same however many elements the sets hold,
//! and no `nft` process is started on the hot path (the table's structure is written by
//! `nft -f` elsewhere; only elements change here). Named counters are read the same
//! way ([`counters`]): `nft list counters` would load every set element first.
//!
//! Hand-written because the only pure-Rust nftables netlink crate is GPL-licensed and
//! the others wrap the C library; element messages are small and stable
//! (linux/netfilter/nf_tables.h). The socket, headers, sequence numbers and
//! acknowledgements are this crate's netlink wrapper's.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

use crate::{NetfilterMessage, NetlinkSocket, Nfnetlink};

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFPROTO_UNSPEC: u8 = 0;
/// The `inet` family (both IPv4 and IPv6), where weft's tables live.
pub const NFPROTO_INET: u8 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
/// The most bytes of elements one message carries (see [`batch`]).
const ELEMENTS_MAX: usize = 60_000;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NLA_F_NESTED: u16 = 0x8000;

/// What an element of a map maps its key to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementData {
    /// A value (a data map: an address and port, say).
    Value(Vec<u8>),
}

/// One element: which set or map, its key and (for maps) its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetElement {
    /// The set or map.
    pub set: String,
    /// The key, as the kernel stores it (see the `key_*` helpers).
    pub key: Vec<u8>,
    /// What a map maps it to; `None` for a set (and for a removal).
    pub data: Option<ElementData>,
    /// For a set with `flags timeout`: when the kernel removes it, and the comment it
    /// carries (`timeout 1m comment "api.example.test"`).
    pub expiry: Option<Expiry>,
}

/// An element's timeout and comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// After how long the kernel removes the element, in milliseconds (re-adding it
    /// with another timeout sets the new one).
    pub timeout_ms: u64,
    /// A comment kept with the element (at most 127 bytes; longer is cut), listed by
    /// nft and read back by whoever wrote it.
    pub comment: String,
}

pub(crate) fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut v = Vec::with_capacity(len.next_multiple_of(4));
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(len.next_multiple_of(4), 0);
    v
}

pub(crate) fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    attr(ty | NLA_F_NESTED, &parts.concat())
}

pub(crate) fn strz(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// An nfnetlink message: the nfgenmsg header, then the attributes.
pub(crate) fn message(ty: u16, family: u8, res_id: u16, attrs: &[u8]) -> NetfilterMessage {
    let mut body = Vec::with_capacity(4 + attrs.len());
    body.push(family);
    body.push(0); // NFNETLINK_V0
    body.extend_from_slice(&res_id.to_be_bytes());
    body.extend_from_slice(attrs);
    NetfilterMessage { message_type: ty, body }
}

/// An address as a key component: 4 or 16 bytes.
pub fn key_addr(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// A protocol number as a component of a concatenation (one 32-bit register).
pub fn key_proto(proto: u8) -> [u8; 4] {
    [proto, 0, 0, 0]
}

/// A port as a component of a concatenation (network order in one 32-bit register).
pub fn key_port(port: u16) -> [u8; 4] {
    let p = port.to_be_bytes();
    [p[0], p[1], 0, 0]
}

/// An interface name as a key (`ifname`): NUL-padded to IFNAMSIZ.
pub fn key_ifname(name: &str) -> Vec<u8> {
    let mut k = vec![0u8; 16];
    let n = name.len().min(15);
    k[..n].copy_from_slice(&name.as_bytes()[..n]);
    k
}

fn element(e: &SetElement) -> Vec<u8> {
    let mut parts = vec![nested(NFTA_SET_ELEM_KEY, &[attr(NFTA_DATA_VALUE, &e.key)])];
    if let Some(ElementData::Value(d)) = &e.data {
        parts.push(nested(NFTA_SET_ELEM_DATA, &[attr(NFTA_DATA_VALUE, d)]));
    }
    if let Some(x) = &e.expiry {
        parts.push(attr(NFTA_SET_ELEM_TIMEOUT, &x.timeout_ms.to_be_bytes()));
        if !x.comment.is_empty() {
            // nftables' user data: one TLV, type NFTNL_UDATA_SET_ELEM_COMMENT (0), the
            // comment with its NUL.
            let mut c = x.comment.as_bytes().to_vec();
            c.truncate(126);
            c.push(0);
            let mut udata = vec![0u8, c.len() as u8];
            udata.extend(c);
            parts.push(attr(NFTA_SET_ELEM_USERDATA, &udata));
        }
    }
    nested(NFTA_LIST_ELEM, &parts)
}

/// One batch: begin, a message per set (each asking for an acknowledgement), end; each
/// with its netlink flags.
pub fn batch(table: &str, family: u8, elements: &[SetElement], add: bool) -> Vec<(NetfilterMessage, u16)> {
    let mut by_set: BTreeMap<&str, Vec<&SetElement>> = BTreeMap::new();
    for e in elements {
        by_set.entry(e.set.as_str()).or_default().push(e);
    }
    let mut msgs = vec![(
        message(NFNL_MSG_BATCH_BEGIN, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES, &[]),
        NLM_F_REQUEST,
    )];
    let (ty, flags) = if add {
        (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE)
    } else {
        (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK)
    };
    for (set, es) in by_set {
        // The element list is one attribute, whose length is 16 bits: more elements
        // than fit go in further messages of the same batch, as nft does.
        let mut elems: Vec<Vec<u8>> = Vec::new();
        let mut size = 0;
        let flush = |elems: &mut Vec<Vec<u8>>, msgs: &mut Vec<(NetfilterMessage, u16)>| {
            let attrs = [
                attr(NFTA_SET_ELEM_LIST_TABLE, &strz(table)),
                attr(NFTA_SET_ELEM_LIST_SET, &strz(set)),
                nested(NFTA_SET_ELEM_LIST_ELEMENTS, elems),
            ]
            .concat();
            msgs.push((message((NFNL_SUBSYS_NFTABLES << 8) | ty, family, 0, &attrs), flags));
            elems.clear();
        };
        for e in es {
            let encoded = element(e);
            if size + encoded.len() > ELEMENTS_MAX && !elems.is_empty() {
                flush(&mut elems, &mut msgs);
                size = 0;
            }
            size += encoded.len();
            elems.push(encoded);
        }
        if !elems.is_empty() {
            flush(&mut elems, &mut msgs);
        }
    }
    msgs.push((
        message(NFNL_MSG_BATCH_END, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES, &[]),
        NLM_F_REQUEST,
    ));
    msgs
}

/// Adds (or, with `add` false, removes) `elements` of `table` in one batch, and waits
/// for every message's acknowledgement; the first error wins (the kernel then aborts the
/// whole batch). Adding an element that is there with the same data is not an error.
pub fn transact(table: &str, family: u8, elements: &[SetElement], add: bool) -> io::Result<()> {
    Session::default().transact(table, family, elements, add)
}

/// An nfnetlink socket kept from one [`transact`] to the next: opening one is a few
/// system calls more on every pod's ADD. It is opened on first use, in the calling
/// thread's network namespace (so a session serves one namespace), and dropped after
/// any error, so that a reply left over from a failed batch never meets the next one.
#[derive(Default)]
pub struct Session {
    sock: Option<NetlinkSocket<Nfnetlink>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("open", &self.sock.is_some()).finish()
    }
}

impl Session {
    /// [`transact`] on this session's socket.
    pub fn transact(&mut self, table: &str, family: u8, elements: &[SetElement], add: bool) -> io::Result<()> {
        if elements.is_empty() {
            return Ok(());
        }
        let done = self.socket()?.batch(batch(table, family, elements, add));
        if done.is_err() {
            self.sock = None;
        }
        done
    }

    /// The session's socket, opened on first use.
    pub(crate) fn socket(&mut self) -> io::Result<&mut NetlinkSocket<Nfnetlink>> {
        match self.sock {
            Some(ref mut s) => Ok(s),
            None => Ok(self.sock.insert(NetlinkSocket::new()?)),
        }
    }

    /// Drops the socket after a failed batch (see the type's doc).
    pub(crate) fn reset(&mut self) {
        self.sock = None;
    }
}

/// The attributes of a message body (after the 4-byte `nfgenmsg`), as (type without
/// flags, payload); a malformed tail ends the walk.
fn attributes(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            break;
        }
        out.push((ty, &b[4..len]));
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    out
}

/// A counter object's name and packets from one `NEWOBJ` message body, if it is one.
fn parse_counter(body: &[u8]) -> Option<(String, u64)> {
    let attrs = attributes(body.get(4..)?);
    let find = |ty| attrs.iter().find(|(t, _)| *t == ty).map(|(_, p)| *p);
    let ty = u32::from_be_bytes(find(NFTA_OBJ_TYPE)?.try_into().ok()?);
    if ty != NFT_OBJECT_COUNTER {
        return None;
    }
    let name = find(NFTA_OBJ_NAME)?;
    let name = String::from_utf8_lossy(name.split(|b| *b == 0).next()?).into_owned();
    let data = attributes(find(NFTA_OBJ_DATA)?);
    let packets = data.iter().find(|(t, _)| *t == NFTA_COUNTER_PACKETS)?.1;
    Some((name, u64::from_be_bytes(packets.try_into().ok()?)))
}

/// The packet counts of `table`'s named counters, by name, in one dump that the kernel
/// filters to that table and to counters: no set element is read. An absent table
/// holds none.
pub fn counters(table: &str, family: u8) -> io::Result<BTreeMap<String, u64>> {
    let attrs = [
        attr(NFTA_OBJ_TABLE, &strz(table)),
        attr(NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes()),
    ]
    .concat();
    let request = message((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ, family, 0, &attrs);
    let answer = match NetlinkSocket::<Nfnetlink>::new()?.dump(request) {
        Ok(a) => a,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    Ok(answer
        .iter()
        .filter(|m| m.message_type == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ)
        .filter_map(|m| parse_counter(&m.body))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_use_whole_registers_and_data_nests() {
        let mut k = key_addr("10.0.0.1".parse().unwrap());
        k.extend(key_proto(6));
        k.extend(key_port(80));
        assert_eq!(k, vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(&key_ifname("weftabc")[..8], b"weftabc\0");
        let mapped = element(&SetElement {
            set: "m".into(),
            key: key_ifname("weft1"),
            data: Some(ElementData::Value(vec![10, 0, 0, 9])),
            expiry: None,
        });
        assert!(mapped.windows(6).any(|w| w == b"weft1\0"), "the key travels");
        assert!(mapped.windows(4).any(|w| w == [10, 0, 0, 9]), "and the data");
        let msgs = batch(
            "t",
            NFPROTO_INET,
            &[SetElement {
                set: "s".into(),
                key: vec![1, 2, 3, 4],
                data: None,
                expiry: None,
            }],
            true,
        );
        let types: Vec<u16> = msgs.iter().map(|(m, _)| m.message_type).collect();
        assert_eq!(types, vec![0x10, (10 << 8) | 12, 0x11]);
        // Many elements of one set: several messages, none past a 16-bit attribute.
        let many: Vec<SetElement> = (0..10_000u32)
            .map(|i| SetElement {
                set: "s".into(),
                key: i.to_be_bytes().to_vec(),
                data: None,
                expiry: Some(Expiry {
                    timeout_ms: 1000,
                    comment: "a-name-of-some-length.example.test".into(),
                }),
            })
            .collect();
        let msgs = batch("t", NFPROTO_INET, &many, true);
        assert!(msgs.len() > 3, "split: {}", msgs.len());
        assert!(msgs.iter().all(|(m, _)| m.body.len() < 65_536));
        assert!(msgs.iter().all(|(m, _)| m.body.len() % 4 == 0), "attributes are padded");
    }

    #[test]
    fn a_counter_object_is_read_by_name_and_packets() {
        let body = message(
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ,
            NFPROTO_INET,
            0,
            &[
                attr(NFTA_OBJ_TABLE, &strz("t")),
                attr(NFTA_OBJ_NAME, &strz("allow_x")),
                attr(NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes()),
                nested(
                    NFTA_OBJ_DATA,
                    &[
                        attr(1, &9000u64.to_be_bytes()),
                        attr(NFTA_COUNTER_PACKETS, &7u64.to_be_bytes()),
                    ],
                ),
            ]
            .concat(),
        )
        .body;
        assert_eq!(parse_counter(&body), Some(("allow_x".into(), 7)));
        // A quota (type 2) with the same layout is not a counter.
        let quota = message(
            0,
            NFPROTO_INET,
            0,
            &[
                attr(NFTA_OBJ_NAME, &strz("q")),
                attr(NFTA_OBJ_TYPE, &2u32.to_be_bytes()),
            ]
            .concat(),
        )
        .body;
        assert_eq!(parse_counter(&quota), None);
        assert_eq!(parse_counter(&[1, 0]), None, "a short body is no counter");
    }
}
