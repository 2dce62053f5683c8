//! Rule expressions: the vocabulary of weft's policy rules ([`Expr`]), each encoded as
//! the very kernel expressions `nft` 1.0.6 sends for the same text (`nft
//! --debug=netlink` shows them), so that a rule written here lists back exactly as one
//! `nft -f` wrote. The vocabulary is the public surface; the raw encoders under it
//! (payload, meta, cmp, lookup, ...) stay private, so no caller can mix up registers.

use std::fmt;
use std::io;
use std::ops::RangeInclusive;

use crate::nftset::{attr, nested, strz};

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_SET_ID: u16 = 4;
const NFTA_OBJREF_IMM_TYPE: u16 = 1;
const NFTA_OBJREF_IMM_NAME: u16 = 2;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_CT_SREG: u16 = 4;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_BITWISE_OP: u16 = 6;
const NFTA_LIMIT_RATE: u16 = 1;
const NFTA_LIMIT_UNIT: u16 = 2;
const NFTA_LIMIT_BURST: u16 = 3;
const NFTA_LIMIT_TYPE: u16 = 4;
const NFTA_LIMIT_FLAGS: u16 = 5;
const NFTA_LOG_GROUP: u16 = 1;
const NFTA_LOG_PREFIX: u16 = 2;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_TARGET_NAME: u16 = 1;
const NFTA_TARGET_REV: u16 = 2;
const NFTA_TARGET_INFO: u16 = 3;
/// `NFQ_FLAG_BYPASS` of `struct xt_NFQ_info_v3`.
const NFQ_FLAG_BYPASS: u16 = 1;

const NFT_META_MARK: u32 = 3;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_LTE: u32 = 3;
const NFT_CMP_GTE: u32 = 5;
const NFT_CT_DIRECTION: u32 = 1;
const NFT_CT_MARK: u32 = 3;
const NFT_BYTEORDER_HTON: u32 = 1;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFT_LIMIT_PKTS: u32 = 0;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// An IP family, for matches on addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// IPv4 (`ip`).
    V4,
    /// IPv6 (`ip6`).
    V6,
}

/// Which address of a packet a match reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addr {
    /// `saddr`.
    Source,
    /// `daddr`.
    Destination,
}

/// Which interface of a packet a match reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Iface {
    /// `iifname`: the interface it came in on.
    Input,
    /// `oifname`: the interface it leaves by.
    Output,
}

/// A layer-4 protocol with ports, as weft's policy names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L4Proto {
    /// TCP (6).
    Tcp,
    /// UDP (17).
    Udp,
    /// SCTP (132).
    Sctp,
}

impl L4Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
            L4Proto::Sctp => 132,
        }
    }

    fn name(self) -> &'static str {
        match self {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
            L4Proto::Sctp => "sctp",
        }
    }
}

/// The time unit of a rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Per {
    /// `/second`.
    Second,
    /// `/minute`.
    Minute,
    /// `/hour`.
    Hour,
    /// `/day`.
    Day,
}

impl Per {
    fn seconds(self) -> u64 {
        match self {
            Per::Second => 1,
            Per::Minute => 60,
            Per::Hour => 3600,
            Per::Day => 86400,
        }
    }
}

/// What a rule does last.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `jump CHAIN`: evaluate the chain, then come back.
    Jump(String),
    /// `goto CHAIN`: evaluate the chain, not coming back.
    Goto(String),
    /// `return`: back to the chain that jumped here.
    Return,
}

/// One match or statement of a rule: exactly the vocabulary weft's policy rules use,
/// each the same kernel expressions as its text in nft (shown by `Display`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `ip saddr @SET` (or `daddr`, or `ip6`): an address in a set of addresses. In the
    /// `inet` family nft first checks the packet's family (`meta nfproto`); so does this.
    AddrInSet {
        /// The family of the address (and the set's key).
        family: IpFamily,
        /// Which address.
        addr: Addr,
        /// The set.
        set: String,
    },
    /// `ip daddr . meta l4proto . th dport @SET` (or `ip6`): destination, protocol and
    /// port together, in a set of `ipv4_addr . inet_proto . inet_service` keys.
    DaddrProtoPortInSet {
        /// The family of the address.
        family: IpFamily,
        /// The set.
        set: String,
        /// Whether the set has `flags interval`: nft then turns the protocol (a host
        /// order value) to network order for the ranges' comparisons, so the rule
        /// differs in the kernel though not in `nft list`.
        interval: bool,
    },
    /// `meta l4proto tcp`.
    L4Proto(L4Proto),
    /// `tcp dport 80`, or `tcp dport 80-90` for a range (nft writes both the same as
    /// `meta l4proto tcp th dport ...`; a range is two comparisons, not a `range`).
    Dport {
        /// The protocol.
        proto: L4Proto,
        /// The ports, both ends included (`80..=80` for one).
        ports: RangeInclusive<u16>,
    },
    /// `udp sport 53`: the source port (one).
    Sport {
        /// The protocol.
        proto: L4Proto,
        /// The port.
        port: u16,
    },
    /// `iifname @SET` or `oifname @SET`.
    IfnameInSet {
        /// Which interface.
        iface: Iface,
        /// The set (of `ifname`).
        set: String,
    },
    /// `iifname . oifname @SET`, in a set of `ifname . ifname`.
    IfnamesInSet {
        /// The set.
        set: String,
    },
    /// `counter name "NAME"`: counts into a named counter of the table.
    Counter(String),
    /// `ct direction reply`: the packet goes the way its connection's replies go (the
    /// other end opened it).
    CtReply,
    /// `meta mark & BITS == 0x00000000`: none of `BITS` is set in the packet's mark
    /// (a mark weft's verdict put on a packet it already held once).
    MarkClear(u32),
    /// `ct mark set ct mark or BITS`: sets bits of the connection's mark, keeping the
    /// others.
    CtMarkOr(u32),
    /// `limit rate RATE/UNIT burst BURST packets`.
    Limit {
        /// Packets per unit.
        rate: u64,
        /// The unit.
        per: Per,
        /// Packets let through at once.
        burst: u32,
    },
    /// `log group GROUP prefix "PREFIX"`: to an NFLOG group.
    Log {
        /// The NFLOG group.
        group: u16,
        /// The prefix.
        prefix: String,
    },
    /// `queue num NUM bypass`: hands the packet to NFQUEUE queue `num` and waits for
    /// its verdict; with `bypass`, passes when nobody is bound. This kernel has no
    /// native `queue` expression, so it is the xtables target `NFQUEUE` (revision 3)
    /// through nftables' compat layer, as `iptables-nft -j NFQUEUE` writes it (nft
    /// lists it the same way).
    Queue {
        /// The queue.
        num: u16,
        /// Whether packets pass while no program is bound to the queue.
        bypass: bool,
    },
    /// A verdict.
    Verdict(Verdict),
}

impl From<Verdict> for Expr {
    fn from(v: Verdict) -> Self {
        Expr::Verdict(v)
    }
}

/// A register as nft numbers it, from the index of a 32-bit register: one that begins
/// a 128-bit register goes by that register's number (`reg 1` is 32-bit registers 0-3).
fn reg(reg32: u32) -> u32 {
    if reg32.is_multiple_of(4) {
        1 + reg32 / 4
    } else {
        8 + reg32
    }
}

fn u32_attr(ty: u16, v: u32) -> Vec<u8> {
    attr(ty, &v.to_be_bytes())
}

fn data(ty: u16, bytes: &[u8]) -> Vec<u8> {
    nested(ty, &[attr(NFTA_DATA_VALUE, bytes)])
}

/// One expression of a rule's list: its name and its attributes.
fn expression(name: &str, attrs: &[Vec<u8>]) -> Vec<u8> {
    nested(
        NFTA_LIST_ELEM,
        &[attr(NFTA_EXPR_NAME, &strz(name)), nested(NFTA_EXPR_DATA, attrs)],
    )
}

fn meta(key: u32, reg32: u32) -> Vec<u8> {
    expression(
        "meta",
        &[u32_attr(NFTA_META_KEY, key), u32_attr(NFTA_META_DREG, reg(reg32))],
    )
}

fn payload(base: u32, offset: u32, len: u32, reg32: u32) -> Vec<u8> {
    expression(
        "payload",
        &[
            u32_attr(NFTA_PAYLOAD_DREG, reg(reg32)),
            u32_attr(NFTA_PAYLOAD_BASE, base),
            u32_attr(NFTA_PAYLOAD_OFFSET, offset),
            u32_attr(NFTA_PAYLOAD_LEN, len),
        ],
    )
}

/// Compares register 1 with `value`.
/// `reg 1 = (reg 1 & mask) ^ xor` on a host-order 32-bit word (a mark).
fn bitwise(mask: u32, xor: u32) -> Vec<u8> {
    expression(
        "bitwise",
        &[
            u32_attr(NFTA_BITWISE_SREG, reg(0)),
            u32_attr(NFTA_BITWISE_DREG, reg(0)),
            u32_attr(NFTA_BITWISE_OP, 0),
            u32_attr(NFTA_BITWISE_LEN, 4),
            data(NFTA_BITWISE_MASK, &mask.to_ne_bytes()),
            data(NFTA_BITWISE_XOR, &xor.to_ne_bytes()),
        ],
    )
}

fn cmp(op: u32, value: &[u8]) -> Vec<u8> {
    expression(
        "cmp",
        &[
            u32_attr(NFTA_CMP_SREG, reg(0)),
            u32_attr(NFTA_CMP_OP, op),
            data(NFTA_CMP_DATA, value),
        ],
    )
}

/// Looks register 1 (and those after it, for a concatenation) up in `set`; `id` when
/// the set is created in the same batch, as nft sends it.
fn lookup(set: &str, id: Option<u32>) -> Vec<u8> {
    let mut attrs = vec![u32_attr(NFTA_LOOKUP_SREG, reg(0)), attr(NFTA_LOOKUP_SET, &strz(set))];
    if let Some(id) = id {
        attrs.push(u32_attr(NFTA_LOOKUP_SET_ID, id));
    }
    expression("lookup", &attrs)
}

/// nft's implicit dependency of an `ip`/`ip6` match in the `inet` family.
fn nfproto(family: IpFamily) -> [Vec<u8>; 2] {
    let proto = match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    };
    [meta(NFT_META_NFPROTO, 0), cmp(NFT_CMP_EQ, &[proto])]
}

/// The offset and length of an address in the network header.
fn address(family: IpFamily, addr: Addr) -> (u32, u32) {
    match (family, addr) {
        (IpFamily::V4, Addr::Source) => (12, 4),
        (IpFamily::V4, Addr::Destination) => (16, 4),
        (IpFamily::V6, Addr::Source) => (8, 16),
        (IpFamily::V6, Addr::Destination) => (24, 16),
    }
}

fn verdict(v: &Verdict) -> Vec<u8> {
    let (code, chain): (i32, Option<&str>) = match v {
        Verdict::Drop => (0, None),
        Verdict::Accept => (1, None),
        Verdict::Jump(c) => (-3, Some(c)),
        Verdict::Goto(c) => (-4, Some(c)),
        Verdict::Return => (-5, None),
    };
    let mut parts = vec![attr(NFTA_VERDICT_CODE, &code.to_be_bytes())];
    if let Some(c) = chain {
        parts.push(attr(NFTA_VERDICT_CHAIN, &strz(c)));
    }
    expression(
        "immediate",
        &[
            u32_attr(NFTA_IMMEDIATE_DREG, 0),
            nested(NFTA_IMMEDIATE_DATA, &[nested(NFTA_DATA_VERDICT, &parts)]),
        ],
    )
}

impl Expr {
    /// Appends this expression's kernel expressions to `out`; `set_id` gives the id of
    /// a set created earlier in the same batch. Refuses what nft would refuse to write.
    pub(super) fn encode(&self, set_id: &dyn Fn(&str) -> Option<u32>, out: &mut Vec<Vec<u8>>) -> io::Result<()> {
        match self {
            Expr::AddrInSet { family, addr, set } => {
                let (offset, len) = address(*family, *addr);
                out.extend(nfproto(*family));
                out.push(payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len, 0));
                out.push(lookup(set, set_id(set)));
            }
            Expr::DaddrProtoPortInSet { family, set, interval } => {
                let (offset, len) = address(*family, Addr::Destination);
                out.extend(nfproto(*family));
                // Each part of a concatenation starts on a 32-bit register of its own.
                out.push(payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len, 0));
                out.push(meta(NFT_META_L4PROTO, len / 4));
                if *interval {
                    // One byte in 16-bit units: nft's conversion, a no-op in effect.
                    let r = reg(len / 4);
                    out.push(expression(
                        "byteorder",
                        &[
                            u32_attr(NFTA_BYTEORDER_SREG, r),
                            u32_attr(NFTA_BYTEORDER_DREG, r),
                            u32_attr(NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON),
                            u32_attr(NFTA_BYTEORDER_LEN, 1),
                            u32_attr(NFTA_BYTEORDER_SIZE, 2),
                        ],
                    ));
                }
                out.push(payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, len / 4 + 1));
                out.push(lookup(set, set_id(set)));
            }
            Expr::L4Proto(p) => {
                out.push(meta(NFT_META_L4PROTO, 0));
                out.push(cmp(NFT_CMP_EQ, &[p.number()]));
            }
            Expr::Dport { proto, ports } => {
                if ports.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("an empty port range {}-{}", ports.start(), ports.end()),
                    ));
                }
                out.push(meta(NFT_META_L4PROTO, 0));
                out.push(cmp(NFT_CMP_EQ, &[proto.number()]));
                out.push(payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, 0));
                if ports.start() == ports.end() {
                    out.push(cmp(NFT_CMP_EQ, &ports.start().to_be_bytes()));
                } else {
                    out.push(cmp(NFT_CMP_GTE, &ports.start().to_be_bytes()));
                    out.push(cmp(NFT_CMP_LTE, &ports.end().to_be_bytes()));
                }
            }
            Expr::Sport { proto, port } => {
                out.push(meta(NFT_META_L4PROTO, 0));
                out.push(cmp(NFT_CMP_EQ, &[proto.number()]));
                out.push(payload(NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2, 0));
                out.push(cmp(NFT_CMP_EQ, &port.to_be_bytes()));
            }
            Expr::IfnameInSet { iface, set } => {
                let key = match iface {
                    Iface::Input => NFT_META_IIFNAME,
                    Iface::Output => NFT_META_OIFNAME,
                };
                out.push(meta(key, 0));
                out.push(lookup(set, set_id(set)));
            }
            Expr::IfnamesInSet { set } => {
                out.push(meta(NFT_META_IIFNAME, 0));
                out.push(meta(NFT_META_OIFNAME, 4));
                out.push(lookup(set, set_id(set)));
            }
            Expr::Counter(name) => out.push(expression(
                "objref",
                &[
                    u32_attr(NFTA_OBJREF_IMM_TYPE, NFT_OBJECT_COUNTER),
                    attr(NFTA_OBJREF_IMM_NAME, &strz(name)),
                ],
            )),
            Expr::CtReply => {
                out.push(expression(
                    "ct",
                    &[u32_attr(NFTA_CT_KEY, NFT_CT_DIRECTION), u32_attr(NFTA_CT_DREG, reg(0))],
                ));
                // IP_CT_DIR_REPLY, one byte.
                out.push(cmp(NFT_CMP_EQ, &[1]));
            }
            Expr::MarkClear(bits) => {
                // The mark is a host-order word: (mark & bits) ^ 0 == 0.
                out.push(meta(NFT_META_MARK, 0));
                out.push(bitwise(*bits, 0));
                out.push(cmp(NFT_CMP_EQ, &0u32.to_ne_bytes()));
            }
            Expr::CtMarkOr(bits) => {
                // The mark is a host-order word: (mark & !bits) ^ bits.
                out.push(expression(
                    "ct",
                    &[u32_attr(NFTA_CT_KEY, NFT_CT_MARK), u32_attr(NFTA_CT_DREG, reg(0))],
                ));
                out.push(bitwise(!bits, *bits));
                out.push(expression(
                    "ct",
                    &[u32_attr(NFTA_CT_KEY, NFT_CT_MARK), u32_attr(NFTA_CT_SREG, reg(0))],
                ));
            }
            Expr::Limit { rate, per, burst } => out.push(expression(
                "limit",
                &[
                    attr(NFTA_LIMIT_RATE, &rate.to_be_bytes()),
                    attr(NFTA_LIMIT_UNIT, &per.seconds().to_be_bytes()),
                    u32_attr(NFTA_LIMIT_BURST, *burst),
                    u32_attr(NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS),
                    u32_attr(NFTA_LIMIT_FLAGS, 0),
                ],
            )),
            Expr::Log { group, prefix } => out.push(expression(
                "log",
                &[
                    attr(NFTA_LOG_PREFIX, &strz(prefix)),
                    attr(NFTA_LOG_GROUP, &group.to_be_bytes()),
                ],
            )),
            Expr::Queue { num, bypass } => {
                // struct xt_NFQ_info_v3 { u16 queuenum, queues_total, flags }, host
                // order, padded to 8 bytes as xtables aligns it.
                let mut info = Vec::with_capacity(8);
                info.extend_from_slice(&num.to_ne_bytes());
                info.extend_from_slice(&1u16.to_ne_bytes());
                info.extend_from_slice(&(if *bypass { NFQ_FLAG_BYPASS } else { 0 }).to_ne_bytes());
                info.resize(8, 0);
                out.push(expression(
                    "target",
                    &[
                        attr(NFTA_TARGET_NAME, &strz("NFQUEUE")),
                        attr(NFTA_TARGET_REV, &3u32.to_be_bytes()),
                        attr(NFTA_TARGET_INFO, &info),
                    ],
                ))
            }
            Expr::Verdict(v) => out.push(verdict(v)),
        }
        Ok(())
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
            Verdict::Return => f.write_str("return"),
        }
    }
}

/// The expression in nft's syntax, as a rule written by `nft -f` would say it.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = |family: &IpFamily| match family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        match self {
            Expr::AddrInSet { family, addr, set } => {
                let side = match addr {
                    Addr::Source => "saddr",
                    Addr::Destination => "daddr",
                };
                write!(f, "{} {side} @{set}", ip(family))
            }
            Expr::DaddrProtoPortInSet { family, set, .. } => {
                write!(f, "{} daddr . meta l4proto . th dport @{set}", ip(family))
            }
            Expr::L4Proto(p) => write!(f, "meta l4proto {}", p.name()),
            Expr::Dport { proto, ports } if ports.start() == ports.end() => {
                write!(f, "{} dport {}", proto.name(), ports.start())
            }
            Expr::Dport { proto, ports } => write!(f, "{} dport {}-{}", proto.name(), ports.start(), ports.end()),
            Expr::Sport { proto, port } => write!(f, "{} sport {port}", proto.name()),
            Expr::IfnameInSet {
                iface: Iface::Input,
                set,
            } => write!(f, "iifname @{set}"),
            Expr::IfnameInSet {
                iface: Iface::Output,
                set,
            } => write!(f, "oifname @{set}"),
            Expr::IfnamesInSet { set } => write!(f, "iifname . oifname @{set}"),
            Expr::Counter(name) => write!(f, "counter name \"{name}\""),
            Expr::CtReply => f.write_str("ct direction reply"),
            Expr::MarkClear(bits) => write!(f, "meta mark & {bits:#010x} == 0x00000000"),
            Expr::CtMarkOr(bits) => write!(f, "ct mark set ct mark or {bits:#010x}"),
            Expr::Limit { rate, per, burst } => {
                let unit = match per {
                    Per::Second => "second",
                    Per::Minute => "minute",
                    Per::Hour => "hour",
                    Per::Day => "day",
                };
                write!(f, "limit rate {rate}/{unit} burst {burst} packets")
            }
            Expr::Log { group, prefix } => write!(f, "log group {group} prefix \"{prefix}\""),
            Expr::Queue { num, bypass } => write!(f, "queue num {num}{}", if *bypass { " bypass" } else { "" }),
            Expr::Verdict(v) => v.fmt(f),
        }
    }
}

/// A rule's expressions in nft's syntax, separated by spaces.
pub fn rule_text(exprs: &[Expr]) -> String {
    exprs.iter().map(Expr::to_string).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(exprs: &[Vec<u8>]) -> Vec<String> {
        // The name is the first attribute of the expression's nest: after the list
        // element's header (4 bytes) and the name's header (4 bytes).
        exprs
            .iter()
            .map(|e| {
                let len = u16::from_ne_bytes([e[4], e[5]]) as usize;
                String::from_utf8(e[8..4 + len - 1].to_vec()).unwrap()
            })
            .collect()
    }

    #[test]
    fn registers_are_numbered_as_nft_numbers_them() {
        // 128-bit register 1, then 32-bit registers 9 and 10; a 16-byte address
        // pushes the next part to 128-bit register 2, then 32-bit register 13.
        assert_eq!([reg(0), reg(1), reg(2), reg(4), reg(5)], [1, 9, 10, 2, 13]);
    }

    #[test]
    fn each_word_encodes_to_the_expressions_nft_sends() {
        let no_ids = |_: &str| None;
        let cases: Vec<(Expr, &[&str])> = vec![
            (
                Expr::AddrInSet {
                    family: IpFamily::V6,
                    addr: Addr::Source,
                    set: "s".into(),
                },
                &["meta", "cmp", "payload", "lookup"],
            ),
            (
                Expr::DaddrProtoPortInSet {
                    family: IpFamily::V4,
                    set: "s".into(),
                    interval: false,
                },
                &["meta", "cmp", "payload", "meta", "payload", "lookup"],
            ),
            (
                Expr::DaddrProtoPortInSet {
                    family: IpFamily::V6,
                    set: "s".into(),
                    interval: true,
                },
                &["meta", "cmp", "payload", "meta", "byteorder", "payload", "lookup"],
            ),
            (
                Expr::Dport {
                    proto: L4Proto::Tcp,
                    ports: 80..=90,
                },
                &["meta", "cmp", "payload", "cmp", "cmp"],
            ),
            (Expr::CtMarkOr(0x0010_0000), &["ct", "bitwise", "ct"]),
            (Expr::MarkClear(0x0040_0000), &["meta", "bitwise", "cmp"]),
            (Expr::Verdict(Verdict::Jump("x".into())), &["immediate"]),
        ];
        for (e, want) in cases {
            let mut out = Vec::new();
            e.encode(&no_ids, &mut out).unwrap();
            assert_eq!(names(&out), *want, "{e}");
            assert!(out.iter().all(|x| x.len() % 4 == 0), "{e}: padded");
        }
        let mut out = Vec::new();
        let empty = Expr::Dport {
            proto: L4Proto::Udp,
            ports: RangeInclusive::new(90, 80),
        };
        assert!(empty.encode(&no_ids, &mut out).is_err(), "an empty range is refused");
    }

    #[test]
    fn display_is_nft_syntax() {
        let rule = [
            Expr::DaddrProtoPortInSet {
                family: IpFamily::V6,
                set: "np".into(),
                interval: false,
            },
            Expr::Counter("a1e".into()),
            Expr::CtMarkOr(0x0010_0000),
            Expr::Verdict(Verdict::Accept),
        ];
        assert_eq!(
            rule_text(&rule),
            "ip6 daddr . meta l4proto . th dport @np counter name \"a1e\" ct mark set ct mark or 0x00100000 accept"
        );
        let ports = Expr::Dport {
            proto: L4Proto::Sctp,
            ports: 9..=9,
        };
        assert_eq!(ports.to_string(), "sctp dport 9");
    }
}
