//! Structural changes to an nftables table in one atomic nfnetlink batch written by
//! weftd itself: chains, rules, sets with their elements and named counters, added and
//! deleted, with no `nft` process (which costs milliseconds with a large table, most of
//! them reading the table back). A pod's ADD that needs a new chain and its sets builds
//! a [`Batch`] and commits it: either all of it is in the table afterwards, or none.
//!
//! Hand-written for the same reason as [`crate::nftset`] (the only pure-Rust nftables
//! netlink crate is GPL-licensed, the others wrap the C library), and in the same way:
//! one batch per call, every message acknowledged, the socket of an
//! [`nftset::Session`](crate::nftset::Session). Everything is encoded as `nft` 1.0.6
//! encodes the same text (sets: `set.rs`; rule expressions: `expr.rs`), so `nft list`
//! prints what this wrote exactly as what `nft -f` wrote, and the table stays
//! readable and diffable by the code that reads it back as JSON.
//!
//! The table itself, and base chains, are `nft -f`'s: only the family `inet`, regular
//! chains and the policy's vocabulary are here.

mod expr;
mod set;

use std::collections::HashMap;
use std::fmt;
use std::io;

pub use expr::{Addr, Expr, Iface, IpFamily, L4Proto, Per, Verdict, rule_text};
pub use set::{Element, KeyType, Set};

use crate::NetfilterMessage;
use crate::nftset::{NFPROTO_INET, Session, attr, message, nested, strz};

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFPROTO_UNSPEC: u8 = 0;

const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_DELOBJ: u16 = 20;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFT_OBJECT_COUNTER: u32 = 1;
/// The most bytes of elements one message carries (their list is one attribute, whose
/// length is 16 bits); more go in further messages of the same batch, as nft does.
const ELEMENTS_MAX: usize = 60_000;

/// One operation of a batch, kept as given so that an error can say which failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    AddChain(String),
    DeleteChain(String),
    FlushChain(String),
    AddCounter(String),
    DeleteCounter(String),
    AddSet(Set, Vec<Element>),
    DeleteSet(String),
    AddElements(Set, Vec<Element>),
    DeleteElements(Set, Vec<Element>),
    AddRule(String, Vec<Expr>),
    DeleteRule(String, u64),
}

/// The operation in nft's syntax (elements counted, not listed).
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::AddChain(c) => write!(f, "add chain {c}"),
            Op::DeleteChain(c) => write!(f, "delete chain {c}"),
            Op::FlushChain(c) => write!(f, "flush chain {c}"),
            Op::AddCounter(c) => write!(f, "add counter {c}"),
            Op::DeleteCounter(c) => write!(f, "delete counter {c}"),
            Op::AddSet(s, e) => write!(f, "add set {} {} with {} elements", s.name, s.declaration(), e.len()),
            Op::DeleteSet(s) => write!(f, "delete set {s}"),
            Op::AddElements(s, e) => write!(f, "add {} elements to set {}", e.len(), s.name),
            Op::DeleteElements(s, e) => write!(f, "delete {} elements from set {}", e.len(), s.name),
            Op::AddRule(c, r) => write!(f, "add rule {c} {}", rule_text(r)),
            Op::DeleteRule(c, h) => write!(f, "delete rule {c} handle {h}"),
        }
    }
}

/// A failed [`Batch::commit`]: nothing of the batch is in the table, unless its answers
/// could not be read (`op` is `None`, `what` says so), when the outcome is unknown and
/// the table must be read back.
#[derive(Debug, thiserror::Error)]
#[error("nftables batch on table inet {table}: {what}: {source}")]
pub struct BatchError {
    /// The table.
    pub table: String,
    /// The index of the operation that failed, in the order they were added to the
    /// batch; `None` when the batch failed as a whole (sending it, reading its answers,
    /// or its commit).
    pub op: Option<usize>,
    /// What failed, in words: the operation in nft's syntax, or the step.
    pub what: String,
    /// The kernel's answer (`ENOENT`: something named is missing; `EEXIST`: it exists
    /// otherwise; `EBUSY`: still referenced; `EINVAL`: malformed, such as a key of the
    /// wrong length), or why the operation could not be encoded.
    #[source]
    pub source: io::Error,
}

/// Changes to one table (family `inet`) that [`commit`](Batch::commit) applies in one
/// nfnetlink transaction, in the order they were added: a later operation may use what
/// an earlier one created (a rule, a set or a chain created before it; sets are
/// referenced by their batch id too, as nft does). Adding a chain, set, counter or
/// element that exists is not an error, as with nft's `add`; a rule is appended again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    table: String,
    ops: Vec<Op>,
}

impl Batch {
    /// An empty batch for the `inet` table `table`.
    pub fn new(table: impl Into<String>) -> Self {
        Batch {
            table: table.into(),
            ops: Vec::new(),
        }
    }

    /// The number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// Adds a regular chain (no hook).
    pub fn add_chain(&mut self, name: impl Into<String>) -> &mut Self {
        self.push(Op::AddChain(name.into()))
    }

    /// Deletes a chain with its rules; refused (`EBUSY`) while a rule jumps to it.
    pub fn delete_chain(&mut self, name: impl Into<String>) -> &mut Self {
        self.push(Op::DeleteChain(name.into()))
    }

    /// Deletes every rule of a chain.
    pub fn flush_chain(&mut self, name: impl Into<String>) -> &mut Self {
        self.push(Op::FlushChain(name.into()))
    }

    /// Adds a named counter (at zero).
    pub fn add_counter(&mut self, name: impl Into<String>) -> &mut Self {
        self.push(Op::AddCounter(name.into()))
    }

    /// Deletes a named counter; refused (`EBUSY`) while a rule counts into it.
    pub fn delete_counter(&mut self, name: impl Into<String>) -> &mut Self {
        self.push(Op::DeleteCounter(name.into()))
    }

    /// Adds a set holding `elements`.
    pub fn add_set(&mut self, set: &Set, elements: impl IntoIterator<Item = Element>) -> &mut Self {
        self.push(Op::AddSet(set.clone(), elements.into_iter().collect()))
    }

    /// Deletes a set with its elements; refused (`EBUSY`) while a rule looks it up.
    pub fn delete_set(&mut self, name: impl Into<String>) -> &mut Self {
        self.push(Op::DeleteSet(name.into()))
    }

    /// Adds elements to `set` (created here or before; its description says how to
    /// encode them).
    pub fn add_elements(&mut self, set: &Set, elements: impl IntoIterator<Item = Element>) -> &mut Self {
        self.push(Op::AddElements(set.clone(), elements.into_iter().collect()))
    }

    /// Deletes elements of `set` (a range as it was added).
    pub fn delete_elements(&mut self, set: &Set, elements: impl IntoIterator<Item = Element>) -> &mut Self {
        self.push(Op::DeleteElements(set.clone(), elements.into_iter().collect()))
    }

    /// Appends a rule to a chain.
    pub fn add_rule(&mut self, chain: impl Into<String>, exprs: impl IntoIterator<Item = Expr>) -> &mut Self {
        self.push(Op::AddRule(chain.into(), exprs.into_iter().collect()))
    }

    /// Deletes the rule of a chain with this handle (`nft -a list` shows handles).
    pub fn delete_rule(&mut self, chain: impl Into<String>, handle: u64) -> &mut Self {
        self.push(Op::DeleteRule(chain.into(), handle))
    }

    fn error(&self, op: Option<usize>, what: String, source: io::Error) -> BatchError {
        BatchError {
            table: self.table.clone(),
            op,
            what,
            source,
        }
    }

    fn op_error(&self, i: usize, source: io::Error) -> BatchError {
        self.error(Some(i), format!("operation {i} ({})", self.ops[i]), source)
    }

    /// The batch's messages, each with its flags and the operation it belongs to:
    /// begin, a message per operation (and as many as a set's elements take), end.
    fn messages(&self) -> Result<Vec<(NetfilterMessage, u16, Option<usize>)>, BatchError> {
        let table = strz(&self.table);
        let msg =
            |ty: u16, attrs: &[Vec<u8>]| message((NFNL_SUBSYS_NFTABLES << 8) | ty, NFPROTO_INET, 0, &attrs.concat());
        let new = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
        let del = NLM_F_REQUEST | NLM_F_ACK;
        let mut out = vec![(
            message(NFNL_MSG_BATCH_BEGIN, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES, &[]),
            NLM_F_REQUEST,
            None,
        )];
        // The batch ids of the sets created so far (nft numbers them from 1).
        let mut ids: HashMap<&str, u32> = HashMap::new();
        let mut next_id = 1;
        // One message per chunk of elements: an attribute's length is 16 bits.
        let elements = |set: &Set, es: &[Element], id: Option<u32>, created: bool| -> io::Result<Vec<Vec<u8>>> {
            let mut head = vec![
                attr(NFTA_SET_ELEM_LIST_TABLE, &table),
                attr(NFTA_SET_ELEM_LIST_SET, &strz(&set.name)),
            ];
            if let Some(id) = id {
                head.push(attr(NFTA_SET_ELEM_LIST_SET_ID, &id.to_be_bytes()));
            }
            let mut chunks: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
            let mut size = 0;
            for e in set.encode_elements(es, created)? {
                if size + e.len() > ELEMENTS_MAX {
                    chunks.push(Vec::new());
                    size = 0;
                }
                size += e.len();
                chunks.last_mut().expect("one chunk at least").push(e);
            }
            Ok(chunks
                .iter()
                .map(|c| [head.concat(), nested(NFTA_SET_ELEM_LIST_ELEMENTS, c)].concat())
                .collect())
        };
        for (i, op) in self.ops.iter().enumerate() {
            let fail = |e| self.op_error(i, e);
            let mut push = |m: NetfilterMessage, flags| out.push((m, flags, Some(i)));
            match op {
                Op::AddChain(c) | Op::DeleteChain(c) => {
                    let attrs = [attr(NFTA_CHAIN_TABLE, &table), attr(NFTA_CHAIN_NAME, &strz(c))];
                    match op {
                        Op::AddChain(_) => push(msg(NFT_MSG_NEWCHAIN, &attrs), new),
                        _ => push(msg(NFT_MSG_DELCHAIN, &attrs), del),
                    }
                }
                Op::FlushChain(c) => push(
                    msg(
                        NFT_MSG_DELRULE,
                        &[attr(NFTA_RULE_TABLE, &table), attr(NFTA_RULE_CHAIN, &strz(c))],
                    ),
                    del,
                ),
                Op::AddCounter(c) => push(
                    msg(
                        NFT_MSG_NEWOBJ,
                        &[
                            attr(NFTA_OBJ_TABLE, &table),
                            attr(NFTA_OBJ_NAME, &strz(c)),
                            attr(NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes()),
                            nested(
                                NFTA_OBJ_DATA,
                                &[
                                    attr(NFTA_COUNTER_BYTES, &0u64.to_be_bytes()),
                                    attr(NFTA_COUNTER_PACKETS, &0u64.to_be_bytes()),
                                ],
                            ),
                        ],
                    ),
                    new,
                ),
                Op::DeleteCounter(c) => push(
                    msg(
                        NFT_MSG_DELOBJ,
                        &[
                            attr(NFTA_OBJ_TABLE, &table),
                            attr(NFTA_OBJ_NAME, &strz(c)),
                            attr(NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes()),
                        ],
                    ),
                    del,
                ),
                Op::AddSet(set, es) => {
                    let id = next_id;
                    next_id += 1;
                    ids.insert(&set.name, id);
                    push(msg(NFT_MSG_NEWSET, &[set.attributes(&self.table, id)]), new);
                    if !es.is_empty() {
                        for attrs in elements(set, es, Some(id), true).map_err(fail)? {
                            push(msg(NFT_MSG_NEWSETELEM, &[attrs]), new);
                        }
                    }
                }
                Op::DeleteSet(s) => {
                    ids.remove(s.as_str());
                    push(
                        msg(
                            NFT_MSG_DELSET,
                            &[attr(NFTA_SET_TABLE, &table), attr(NFTA_SET_NAME, &strz(s))],
                        ),
                        del,
                    );
                }
                Op::AddElements(set, es) | Op::DeleteElements(set, es) if !es.is_empty() => {
                    for attrs in elements(set, es, ids.get(set.name.as_str()).copied(), false).map_err(fail)? {
                        match op {
                            Op::AddElements(..) => push(msg(NFT_MSG_NEWSETELEM, &[attrs]), new),
                            _ => push(msg(NFT_MSG_DELSETELEM, &[attrs]), del),
                        }
                    }
                }
                Op::AddElements(..) | Op::DeleteElements(..) => {}
                Op::AddRule(c, exprs) => {
                    let mut list = Vec::new();
                    for e in exprs {
                        e.encode(&|s| ids.get(s).copied(), &mut list).map_err(fail)?;
                    }
                    let attrs = [
                        attr(NFTA_RULE_TABLE, &table),
                        attr(NFTA_RULE_CHAIN, &strz(c)),
                        nested(NFTA_RULE_EXPRESSIONS, &list),
                    ];
                    push(msg(NFT_MSG_NEWRULE, &attrs), new | NLM_F_APPEND);
                }
                Op::DeleteRule(c, handle) => push(
                    msg(
                        NFT_MSG_DELRULE,
                        &[
                            attr(NFTA_RULE_TABLE, &table),
                            attr(NFTA_RULE_CHAIN, &strz(c)),
                            attr(NFTA_RULE_HANDLE, &handle.to_be_bytes()),
                        ],
                    ),
                    del,
                ),
            }
        }
        out.push((
            message(NFNL_MSG_BATCH_END, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES, &[]),
            NLM_F_REQUEST,
            None,
        ));
        Ok(out)
    }

    /// Applies the batch in one transaction on `session`'s socket (the calling
    /// thread's network namespace when it opens it) and waits for every message's
    /// acknowledgement. The kernel aborts the whole transaction on any error; the error
    /// names the first operation that failed (later ones may fail only because of it).
    pub fn commit(&self, session: &mut Session) -> Result<(), BatchError> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let messages = self.messages()?;
        let owners: Vec<Option<usize>> = messages.iter().map(|(_, _, op)| *op).collect();
        let sock = session
            .socket()
            .map_err(|e| self.error(None, "opening an nfnetlink socket".into(), e))?;
        let failed = match sock.batch_checked(messages.into_iter().map(|(m, flags, _)| (m, flags))) {
            Ok(()) => return Ok(()),
            Err(f) => f,
        };
        session.reset();
        Err(match failed.message.map(|m| owners[m]) {
            Some(Some(i)) => self.op_error(i, failed.error),
            // The begin message: nfnetlink answers a failed commit there.
            Some(None) => self.error(None, "the batch as a whole".into(), failed.error),
            None => self.error(None, "sending the batch or reading its answers".into(), failed.error),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_framed_and_each_message_belongs_to_its_operation() {
        let s4 = Set::interval("s4", KeyType::Ipv4Addr);
        let mut b = Batch::new("t");
        b.add_chain("c")
            .add_set(&s4, [Element::net("10.0.0.0/8".parse().unwrap())])
            .add_elements(&s4, [])
            .add_rule(
                "c",
                [
                    Expr::AddrInSet {
                        family: IpFamily::V4,
                        addr: Addr::Source,
                        set: "s4".into(),
                    },
                    Verdict::Accept.into(),
                ],
            );
        let msgs = b.messages().unwrap();
        let types: Vec<u16> = msgs.iter().map(|(m, _, _)| m.message_type).collect();
        assert_eq!(types, vec![0x10, 0xa03, 0xa09, 0xa0c, 0xa06, 0x11]);
        let owners: Vec<Option<usize>> = msgs.iter().map(|(_, _, o)| *o).collect();
        assert_eq!(
            owners,
            vec![None, Some(0), Some(1), Some(1), Some(3), None],
            "no message for no elements"
        );
        // The rule's lookup carries the set's batch id (1) after its name.
        let rule = &msgs[4].0.body;
        assert!(rule.windows(8).any(|w| w == [8, 0, 4, 0, 0, 0, 0, 1]), "lookup set id");
        assert!(msgs.iter().all(|(m, _, _)| m.body.len() % 4 == 0));
        assert_eq!(msgs[4].1 & NLM_F_APPEND, NLM_F_APPEND, "rules are appended");
    }

    #[test]
    fn many_elements_take_several_messages_of_one_operation() {
        let s = Set::new("s", KeyType::Ipv6Addr);
        let many = (0..10_000u128).map(|i| Element::addr(std::net::IpAddr::from(i.to_be_bytes())));
        let mut b = Batch::new("t");
        b.add_counter("k").add_elements(&s, many);
        let msgs = b.messages().unwrap();
        assert!(msgs.len() > 5, "{}", msgs.len());
        assert!(
            msgs[2..msgs.len() - 1]
                .iter()
                .all(|(m, _, op)| *op == Some(1) && m.body.len() < 65_536)
        );
    }

    #[test]
    fn an_operation_that_cannot_be_encoded_is_named() {
        let mut b = Batch::new("t");
        b.add_chain("c").add_set(
            &Set::new("s", KeyType::Ipv4Addr),
            [Element::net("10.0.0.0/8".parse().unwrap())],
        );
        let e = b.messages().unwrap_err();
        assert_eq!(e.op, Some(1));
        assert!(
            e.to_string().contains("operation 1 (add set s { type ipv4_addr; }"),
            "{e}"
        );
    }
}
