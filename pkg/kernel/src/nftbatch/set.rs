//! Sets and their elements as nft declares and fills them: the key's datatype id,
//! length and userdata, and the interval flags, exactly as `nft` 1.0.6 sends them
//! (`nft --debug=mnl` shows the bytes), so that `nft list` prints a set made here the
//! same as one `nft -f` made; and elements encoded the way the set's kernel backend
//! takes them (hash: keys; rbtree: a start and an end per range; pipapo: a key and a
//! key end).

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::nftset::{attr, key_addr, key_ifname, key_port, key_proto, nested, strz};

const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_DESC_CONCAT: u16 = 2;
const NFTA_SET_FIELD_LEN: u16 = 1;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;
const NFT_SET_INTERVAL: u32 = 0x4;
const NFT_SET_CONCAT: u32 = 0x80;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;

/// One part of a key: nft's datatype id and length in bytes.
#[derive(Clone, Copy)]
struct Field {
    id: u32,
    len: u32,
    name: &'static str,
}

const IPV4: Field = Field {
    id: 7,
    len: 4,
    name: "ipv4_addr",
};
const IPV6: Field = Field {
    id: 8,
    len: 16,
    name: "ipv6_addr",
};
const PROTO: Field = Field {
    id: 12,
    len: 1,
    name: "inet_proto",
};
const SERVICE: Field = Field {
    id: 13,
    len: 2,
    name: "inet_service",
};
const IFNAME: Field = Field {
    id: 41,
    len: 16,
    name: "ifname",
};

/// The key of a set: the types weft's policy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// `ipv4_addr`.
    Ipv4Addr,
    /// `ipv6_addr`.
    Ipv6Addr,
    /// `ipv4_addr . inet_proto . inet_service`.
    Ipv4AddrProtoPort,
    /// `ipv6_addr . inet_proto . inet_service`.
    Ipv6AddrProtoPort,
    /// `ifname`.
    Ifname,
    /// `ifname . ifname`.
    IfnamePair,
}

impl KeyType {
    fn fields(self) -> &'static [Field] {
        match self {
            KeyType::Ipv4Addr => &[IPV4],
            KeyType::Ipv6Addr => &[IPV6],
            KeyType::Ipv4AddrProtoPort => &[IPV4, PROTO, SERVICE],
            KeyType::Ipv6AddrProtoPort => &[IPV6, PROTO, SERVICE],
            KeyType::Ifname => &[IFNAME],
            KeyType::IfnamePair => &[IFNAME, IFNAME],
        }
    }

    fn is_concat(self) -> bool {
        self.fields().len() > 1
    }

    /// The type in nft's syntax (`ipv4_addr . inet_proto . inet_service`).
    pub fn nft_type(self) -> String {
        self.fields().iter().map(|f| f.name).collect::<Vec<_>>().join(" . ")
    }

    /// The length of a key in bytes: each part of a concatenation takes whole 32-bit
    /// registers.
    pub fn key_len(self) -> usize {
        let padded = |f: &Field| {
            if self.is_concat() {
                f.len.next_multiple_of(4)
            } else {
                f.len
            }
        };
        self.fields().iter().map(padded).sum::<u32>() as usize
    }

    /// nft's datatype id: a concatenation's parts' ids, 6 bits each, first part highest.
    fn datatype(self) -> u32 {
        self.fields().iter().fold(0, |acc, f| (acc << 6) | f.id)
    }

    /// The userdata nft stores with the set, which it reads back to print the key: the
    /// key's byte order (big endian for addresses, host for names; none for a
    /// concatenation, which instead says it is one, of datatypes rather than `typeof`
    /// expressions).
    fn userdata(self) -> Vec<u8> {
        const KEYBYTEORDER: u8 = 0;
        const KEY_TYPEOF: u8 = 3;
        const EXPR_CONCAT: u32 = 13;
        let order: u32 = match self {
            KeyType::Ipv4Addr | KeyType::Ipv6Addr => 2,
            KeyType::Ifname => 1,
            _ => 0,
        };
        let mut u = vec![KEYBYTEORDER, 4];
        u.extend(order.to_ne_bytes());
        if self.is_concat() {
            // A nest: the expression type (concatenation), then its (empty) parts.
            u.extend([KEY_TYPEOF, 8, 0, 4]);
            u.extend(EXPR_CONCAT.to_ne_bytes());
            u.extend([1, 0]);
        }
        u
    }
}

/// A set of the table: its name, its key, whether it holds ranges. Describes a set to
/// create, and how to encode elements of one (created here or before).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    /// The name.
    pub name: String,
    /// The key.
    pub key: KeyType,
    /// `flags interval`: elements may be ranges.
    pub interval: bool,
    /// `flags timeout`: elements may carry a timeout, after which the kernel removes
    /// them.
    pub timeout: bool,
}

impl Set {
    /// A set of single keys.
    pub fn new(name: impl Into<String>, key: KeyType) -> Self {
        Set {
            name: name.into(),
            key,
            interval: false,
            timeout: false,
        }
    }

    /// A set whose elements expire (`flags timeout`).
    pub fn timeout(name: impl Into<String>, key: KeyType) -> Self {
        Set {
            timeout: true,
            ..Set::new(name, key)
        }
    }

    /// A set of ranges (`flags interval`).
    pub fn interval(name: impl Into<String>, key: KeyType) -> Self {
        Set {
            interval: true,
            ..Set::new(name, key)
        }
    }

    /// The declaration in nft's syntax (`{ type ipv4_addr; flags interval; }`).
    pub fn declaration(&self) -> String {
        let flags = match (self.interval, self.timeout) {
            (true, true) => " flags interval,timeout;",
            (true, false) => " flags interval;",
            (false, true) => " flags timeout;",
            (false, false) => "",
        };
        format!("{{ type {};{flags} }}", self.key.nft_type())
    }

    fn flags(&self) -> u32 {
        let ranges = match (self.interval, self.key.is_concat()) {
            (false, _) => 0,
            (true, false) => NFT_SET_INTERVAL,
            (true, true) => NFT_SET_INTERVAL | NFT_SET_CONCAT,
        };
        ranges | if self.timeout { NFT_SET_TIMEOUT } else { 0 }
    }

    /// The attributes of the `NEWSET` message creating this set in `table` with batch
    /// id `id`. The lengths of a concatenation's parts go along only for ranges (the
    /// pipapo backend needs them), as nft sends them.
    pub(super) fn attributes(&self, table: &str, id: u32) -> Vec<u8> {
        let mut attrs = vec![
            attr(NFTA_SET_TABLE, &strz(table)),
            attr(NFTA_SET_NAME, &strz(&self.name)),
            attr(NFTA_SET_FLAGS, &self.flags().to_be_bytes()),
            attr(NFTA_SET_KEY_TYPE, &self.key.datatype().to_be_bytes()),
            attr(NFTA_SET_KEY_LEN, &(self.key.key_len() as u32).to_be_bytes()),
            attr(NFTA_SET_ID, &id.to_be_bytes()),
        ];
        if self.interval && self.key.is_concat() {
            let fields: Vec<Vec<u8>> = (self.key.fields().iter())
                .map(|f| nested(NFTA_LIST_ELEM, &[attr(NFTA_SET_FIELD_LEN, &f.len.to_be_bytes())]))
                .collect();
            attrs.push(nested(NFTA_SET_DESC, &[nested(NFTA_SET_DESC_CONCAT, &fields)]));
        }
        attrs.push(attr(NFTA_SET_USERDATA, &self.key.userdata()));
        attrs.concat()
    }

    /// The set's elements as an element list (`NFTA_LIST_ELEM` each). `created`: the set
    /// is created in the same batch, where nft starts a range set with the end of the
    /// range below its lowest one (the key zero, flagged as an end) unless a range
    /// starts at zero.
    pub(super) fn encode_elements(&self, elements: &[Element], created: bool) -> io::Result<Vec<Vec<u8>>> {
        let len = self.key.key_len();
        let mut out = Vec::new();
        let key = |ty, k: &[u8]| nested(ty, &[attr(NFTA_DATA_VALUE, k)]);
        if created && self.interval && !self.key.is_concat() {
            let zero = vec![0; len];
            if !elements.iter().any(|e| e.first() == zero.as_slice()) {
                out.push(end_element(&zero));
            }
        }
        for e in elements {
            match (self.interval, self.key.is_concat(), e) {
                (false, _, Element::Key(k)) => out.push(nested(NFTA_LIST_ELEM, &[key(NFTA_SET_ELEM_KEY, k)])),
                (false, _, Element::Range(..)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("a range in set {}, which has no flags interval", self.name),
                    ));
                }
                // pipapo: every element is a range, a single key one of itself.
                (true, true, e) => out.push(nested(
                    NFTA_LIST_ELEM,
                    &[key(NFTA_SET_ELEM_KEY, e.first()), key(NFTA_SET_ELEM_KEY_END, e.last())],
                )),
                // rbtree: a start, and an end just past the range's last key, unless
                // it ends at the top (then nft marks the start as an open interval).
                (true, false, e) => match successor(e.last()) {
                    Some(end) => {
                        out.push(nested(NFTA_LIST_ELEM, &[key(NFTA_SET_ELEM_KEY, e.first())]));
                        out.push(end_element(&end));
                    }
                    None => {
                        const ELEM_FLAGS: u8 = 1;
                        const INTERVAL_OPEN: u32 = 1;
                        let mut open = vec![ELEM_FLAGS, 4];
                        open.extend(INTERVAL_OPEN.to_ne_bytes());
                        out.push(nested(
                            NFTA_LIST_ELEM,
                            &[key(NFTA_SET_ELEM_KEY, e.first()), attr(NFTA_SET_ELEM_USERDATA, &open)],
                        ));
                    }
                },
            }
        }
        Ok(out)
    }
}

fn end_element(key: &[u8]) -> Vec<u8> {
    nested(
        NFTA_LIST_ELEM,
        &[
            attr(NFTA_SET_ELEM_FLAGS, &NFT_SET_ELEM_INTERVAL_END.to_be_bytes()),
            nested(NFTA_SET_ELEM_KEY, &[attr(NFTA_DATA_VALUE, key)]),
        ],
    )
}

/// The key one above `k` (big endian), or `None` past the top.
fn successor(k: &[u8]) -> Option<Vec<u8>> {
    let mut next = k.to_vec();
    for b in next.iter_mut().rev() {
        let (v, carry) = b.overflowing_add(1);
        *b = v;
        if !carry {
            return Some(next);
        }
    }
    None
}

/// An element of a set: one key, or (in an interval set) every key from the first to
/// the last, both included. Keys are bytes as the kernel stores them; the constructors
/// below build the ones weft uses, and the `nftset::key_*` helpers their parts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Element {
    /// One key.
    Key(Vec<u8>),
    /// A range of keys, both ends included.
    Range(Vec<u8>, Vec<u8>),
}

impl Element {
    /// An address (`ipv4_addr` or `ipv6_addr`).
    pub fn addr(ip: IpAddr) -> Self {
        Element::Key(key_addr(ip))
    }

    /// A network: the range of its addresses (for an interval set).
    pub fn net(net: IpNet) -> Self {
        Element::Range(key_addr(net.network()), key_addr(net.broadcast()))
    }

    /// An address, protocol and port (`ipv4_addr . inet_proto . inet_service`).
    pub fn addr_proto_port(ip: IpAddr, proto: u8, port: u16) -> Self {
        let mut k = key_addr(ip);
        k.extend(key_proto(proto));
        k.extend(key_port(port));
        Element::Key(k)
    }

    /// An interface name (`ifname`).
    pub fn ifname(name: &str) -> Self {
        Element::Key(key_ifname(name))
    }

    /// An input and an output interface name (`ifname . ifname`).
    pub fn ifname_pair(input: &str, output: &str) -> Self {
        let mut k = key_ifname(input);
        k.extend(key_ifname(output));
        Element::Key(k)
    }

    fn first(&self) -> &[u8] {
        match self {
            Element::Key(k) | Element::Range(k, _) => k,
        }
    }

    fn last(&self) -> &[u8] {
        match self {
            Element::Key(k) | Element::Range(_, k) => k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_declared_as_nft_declares_them() {
        // Values from `nft --debug=mnl` of sets of each type.
        assert_eq!(KeyType::Ipv4AddrProtoPort.datatype(), 0x730d);
        assert_eq!(KeyType::IfnamePair.datatype(), 0xa69);
        assert_eq!(KeyType::Ifname.datatype(), 41);
        assert_eq!(KeyType::Ipv6AddrProtoPort.key_len(), 24);
        assert_eq!(KeyType::IfnamePair.key_len(), 32);
        assert_eq!(KeyType::Ipv4Addr.key_len(), 4);
        assert_eq!(
            KeyType::Ipv4Addr.userdata(),
            [&[0, 4][..], &2u32.to_ne_bytes()].concat()
        );
        assert_eq!(KeyType::IfnamePair.userdata().len(), 16);
        assert_eq!(
            Set::interval("n", KeyType::Ipv4AddrProtoPort).declaration(),
            "{ type ipv4_addr . inet_proto . inet_service; flags interval; }"
        );
        assert_eq!(Set::interval("n", KeyType::Ipv6AddrProtoPort).flags(), 0x84);
    }

    #[test]
    fn ranges_take_the_form_of_their_backend() {
        let net = Element::net("10.0.0.0/8".parse().unwrap());
        let top = Element::net("255.255.255.0/24".parse().unwrap());
        let rb = Set::interval("n", KeyType::Ipv4Addr);
        // Zero end, start, end; then a start marked open.
        let out = rb.encode_elements(&[net.clone(), top], true).unwrap();
        assert_eq!(out.len(), 4);
        assert!(
            out[2].windows(4).any(|w| w == [11, 0, 0, 0]),
            "the end is past the range"
        );
        assert!(out[3].windows(6).any(|w| w == [1, 4, 1, 0, 0, 0]), "open at the top");
        assert_eq!(rb.encode_elements(std::slice::from_ref(&net), false).unwrap().len(), 2);
        let zero = Element::net("0.0.0.0/8".parse().unwrap());
        assert_eq!(rb.encode_elements(&[zero], true).unwrap().len(), 2, "no zero end");
        let hash = Set::new("s", KeyType::Ipv4Addr);
        assert!(hash.encode_elements(&[net], false).is_err());
        assert_eq!(successor(&[0, 255]), Some(vec![1, 0]));
        assert_eq!(successor(&[255, 255]), None);
    }
}
