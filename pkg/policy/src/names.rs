//! The names of the objects of weft's policy table, in one place: what each name
//! stands for as a type ([`Chain`], [`SetName`], [`Counter`]), written to nft by
//! `Display` and read back from the kernel (and from NFLOG prefixes) by `parse`, so no
//! other module builds or takes apart a name by its letters.
//!
//! The grammar: a letter for the kind of object, a hash of what it holds (so a changed
//! policy gets new objects and a name says everything about its rules) or a policy's
//! id, a direction letter (`i`, `e`) or a family digit (`4`, `6`).
//!
//! | object | name |
//! |---|---|
//! | a NetworkPolicy's chain | `p<id><dir><hash4>` |
//! | a group chain (pods one namespace's policies isolate alike) | `g<hash10><dir>` |
//! | an Admin / Baseline tier chain | `a<hash10><dir>` / `b<hash10><dir>` |
//! | a NetworkPolicy's accept counter | `a<id><dir>` |
//! | a group's deny counter | `d<hash10><dir>` |
//! | a ClusterNetworkPolicy rule's counter | `k<id><dir><rule>` |
//! | a set of pods' addresses | `s<hash10><family>` |
//! | a set of pods' named ports | `n<hash10><family>` |
//! | a set of ranges (ipBlocks, networks, nodes) | `r<hash10><family>` |
//! | a set of addresses learnt for names (domainNames) | `f<hash10><family>` |
//! | the host interfaces entering an entry chain | `m<entry chain>` |
//! | the host interface pairs of hairpin traffic | `hairpin` |
//! | the base chains | `egress`, `ingress` |
//! | the dispatch chains | `egress_pods`, `ingress_pods` |

use std::fmt;

use crate::model::{Direction, PolicyId};

/// The length of a hash in a name, in hex digits.
const HASH: usize = 10;

/// The length of a policy chain's hash of its rules.
const RULES_HASH: usize = 4;

/// The length of a policy id in a name (see [`PolicyId`]'s `Display`).
const ID: usize = 12;

fn hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn dir_of(c: char) -> Option<Direction> {
    match c {
        'i' => Some(Direction::Ingress),
        'e' => Some(Direction::Egress),
        _ => None,
    }
}

/// A `<hash><direction letter>` tail.
fn hash_dir(s: &str) -> Option<(String, Direction)> {
    let (hash, d) = s.split_at_checked(s.len().checked_sub(1)?)?;
    (hash.len() == HASH && hex(hash)).then_some(())?;
    Some((hash.to_string(), dir_of(d.chars().next()?)?))
}

fn id_of(s: &str) -> Option<PolicyId> {
    (s.len() == ID && hex(s)).then_some(())?;
    u64::from_str_radix(s, 16).ok().map(PolicyId)
}

/// A chain of the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Chain {
    /// A base chain on the forward hook, one per direction.
    Base(Direction),
    /// The dispatch chain of a direction: a rule per entry chain.
    Dispatch(Direction),
    /// A NetworkPolicy's rules for one direction; `hash` of how they are written.
    Policy {
        /// The policy.
        id: PolicyId,
        /// The direction.
        direction: Direction,
        /// The hash of its rules (4 hex digits).
        hash: String,
    },
    /// The NetworkPolicy tier of a group of pods.
    Group {
        /// The hash of its jumps and mode.
        hash: String,
        /// The direction.
        direction: Direction,
    },
    /// The Admin tier's rules of a set of pods.
    Admin {
        /// The hash of its rules.
        hash: String,
        /// The direction.
        direction: Direction,
    },
    /// The Baseline tier's rules of a set of pods.
    Baseline {
        /// The hash of its rules.
        hash: String,
        /// The direction.
        direction: Direction,
    },
    /// Egress only: the one rule that holds a new connection a `domainNames` rule
    /// could allow (see [`HOLD_QUEUE`](crate::plan::HOLD_QUEUE)). A chain of its own
    /// because its rule is an xtables target `nft -f` cannot write: the nfnetlink
    /// batches write it, the scripts only declare the chain.
    Hold,
}

impl Chain {
    /// The direction whose traffic it sees.
    pub fn direction(&self) -> Direction {
        match self {
            Chain::Base(d) | Chain::Dispatch(d) => *d,
            Chain::Hold => Direction::Egress,
            Chain::Policy { direction, .. }
            | Chain::Group { direction, .. }
            | Chain::Admin { direction, .. }
            | Chain::Baseline { direction, .. } => *direction,
        }
    }

    /// Its place in the order chains are added (and, reversed, removed) within one
    /// transaction: a chain comes before those that jump to it. Policy chains jump
    /// nowhere; group chains jump to policy chains; tier chains go to group chains and
    /// jump to the hold, which jumps nowhere.
    pub fn rank(&self) -> u8 {
        match self {
            Chain::Policy { .. } | Chain::Hold => 0,
            Chain::Group { .. } => 1,
            Chain::Baseline { .. } => 2,
            Chain::Admin { .. } => 3,
            Chain::Dispatch(_) => 4,
            Chain::Base(_) => 5,
        }
    }

    /// Reads a chain's name back; `None` for a name weft does not write.
    pub fn parse(s: &str) -> Option<Chain> {
        match s {
            "egress" => return Some(Chain::Base(Direction::Egress)),
            "ingress" => return Some(Chain::Base(Direction::Ingress)),
            "egress_pods" => return Some(Chain::Dispatch(Direction::Egress)),
            "ingress_pods" => return Some(Chain::Dispatch(Direction::Ingress)),
            "egress_hold" => return Some(Chain::Hold),
            _ => {}
        }
        let (letter, rest) = s.split_at_checked(1)?;
        match letter {
            "p" => {
                let (id, tail) = rest.split_at_checked(ID)?;
                let (d, hash) = tail.split_at_checked(1)?;
                (hash.len() == RULES_HASH && hex(hash)).then_some(())?;
                Some(Chain::Policy {
                    id: id_of(id)?,
                    direction: dir_of(d.chars().next()?)?,
                    hash: hash.to_string(),
                })
            }
            "g" | "a" | "b" => {
                let (hash, direction) = hash_dir(rest)?;
                Some(match letter {
                    "g" => Chain::Group { hash, direction },
                    "a" => Chain::Admin { hash, direction },
                    _ => Chain::Baseline { hash, direction },
                })
            }
            _ => None,
        }
    }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chain::Base(d) => f.write_str(d.as_str()),
            Chain::Dispatch(d) => write!(f, "{d}_pods"),
            Chain::Hold => f.write_str("egress_hold"),
            Chain::Policy { id, direction, hash } => write!(f, "p{id}{}{hash}", direction.letter()),
            Chain::Group { hash, direction } => write!(f, "g{hash}{}", direction.letter()),
            Chain::Admin { hash, direction } => write!(f, "a{hash}{}", direction.letter()),
            Chain::Baseline { hash, direction } => write!(f, "b{hash}{}", direction.letter()),
        }
    }
}

/// A named counter of the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// What a NetworkPolicy's rules accepted in one direction.
    Policy {
        /// The policy.
        id: PolicyId,
        /// The direction.
        direction: Direction,
    },
    /// What a group chain denied (or audited).
    Group {
        /// The group chain's hash.
        hash: String,
        /// The direction.
        direction: Direction,
    },
    /// What one ClusterNetworkPolicy rule matched.
    ClusterRule {
        /// The policy.
        id: PolicyId,
        /// The direction.
        direction: Direction,
        /// The rule's index.
        rule: usize,
    },
}

impl Counter {
    /// Reads a counter's name back.
    pub fn parse(s: &str) -> Option<Counter> {
        let (letter, rest) = s.split_at_checked(1)?;
        match letter {
            "a" => {
                let (id, d) = rest.split_at_checked(ID)?;
                (d.len() == 1).then_some(())?;
                Some(Counter::Policy {
                    id: id_of(id)?,
                    direction: dir_of(d.chars().next()?)?,
                })
            }
            "d" => {
                let (hash, direction) = hash_dir(rest)?;
                Some(Counter::Group { hash, direction })
            }
            "k" => {
                let (id, tail) = rest.split_at_checked(ID)?;
                let (d, rule) = tail.split_at_checked(1)?;
                (!rule.is_empty() && rule.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
                Some(Counter::ClusterRule {
                    id: id_of(id)?,
                    direction: dir_of(d.chars().next()?)?,
                    rule: rule.parse().ok()?,
                })
            }
            _ => None,
        }
    }

    /// The group chain whose drops a group counter counts.
    pub fn group_chain(&self) -> Option<Chain> {
        match self {
            Counter::Group { hash, direction } => Some(Chain::Group {
                hash: hash.clone(),
                direction: *direction,
            }),
            Counter::Policy { .. } | Counter::ClusterRule { .. } => None,
        }
    }
}

impl fmt::Display for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Counter::Policy { id, direction } => write!(f, "a{id}{}", direction.letter()),
            Counter::Group { hash, direction } => write!(f, "d{hash}{}", direction.letter()),
            Counter::ClusterRule { id, direction, rule } => write!(f, "k{id}{}{rule}", direction.letter()),
        }
    }
}

/// What a set holds, as its name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetRole {
    /// Pods' addresses.
    Pods,
    /// Pods' named ports (address, protocol, port).
    Named,
    /// Address ranges.
    Ranges,
    /// Addresses learnt from DNS answers for names (`domainNames`), each with its
    /// timeout.
    Learnt,
}

impl SetRole {
    fn letter(self) -> char {
        match self {
            SetRole::Pods => 's',
            SetRole::Named => 'n',
            SetRole::Ranges => 'r',
            SetRole::Learnt => 'f',
        }
    }
}

/// A set of the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetName {
    /// A set of addresses or ports, named after what it holds.
    Data {
        /// What kind of elements.
        role: SetRole,
        /// The hash of what decides its elements.
        hash: String,
        /// The family.
        v6: bool,
    },
    /// The host interfaces whose traffic enters an entry chain.
    Members(Chain),
    /// Pairs of host interfaces (in, out) of hairpin traffic: a pod's own.
    Hairpin,
}

impl SetName {
    /// Reads a set's name back.
    pub fn parse(s: &str) -> Option<SetName> {
        if s == "hairpin" {
            return Some(SetName::Hairpin);
        }
        let (letter, rest) = s.split_at_checked(1)?;
        let role = match letter {
            "m" => return Some(SetName::Members(Chain::parse(rest)?)),
            "s" => SetRole::Pods,
            "n" => SetRole::Named,
            "r" => SetRole::Ranges,
            "f" => SetRole::Learnt,
            _ => return None,
        };
        let (hash, fam) = rest.split_at_checked(HASH)?;
        hex(hash).then_some(())?;
        let v6 = match fam {
            "4" => false,
            "6" => true,
            _ => return None,
        };
        Some(SetName::Data {
            role,
            hash: hash.to_string(),
            v6,
        })
    }
}

impl fmt::Display for SetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetName::Data { role, hash, v6 } => write!(f, "{}{hash}{}", role.letter(), if *v6 { 6 } else { 4 }),
            SetName::Members(chain) => write!(f, "m{chain}"),
            SetName::Hairpin => f.write_str("hairpin"),
        }
    }
}

/// The prefix weft's NFLOG log rules give a packet: which chain or rule logged it and
/// why. Read back from NFLOG to name the policies of a denied flow.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogPrefix {
    /// A group chain's end: nothing allowed the packet (`audit`: forwarded anyway).
    Group {
        /// The group chain.
        chain: Chain,
        /// Whether its namespace is in audit mode.
        audit: bool,
    },
    /// A ClusterNetworkPolicy Deny rule, by its counter.
    ClusterDeny(Counter),
}

impl LogPrefix {
    /// The words every prefix of weft's starts with.
    pub const START: &'static str = "weft ";

    /// Reads a prefix back; `None` for one weft does not write.
    pub fn parse(s: &str) -> Option<LogPrefix> {
        let mut words = s.strip_prefix(Self::START)?.split_whitespace();
        let (kind, name) = (words.next()?, words.next()?);
        match kind {
            "deny" | "audit" => Some(LogPrefix::Group {
                chain: Chain::parse(name).filter(|c| matches!(c, Chain::Group { .. }))?,
                audit: kind == "audit",
            }),
            "cnp" => Some(LogPrefix::ClusterDeny(
                Counter::parse(name).filter(|c| matches!(c, Counter::ClusterRule { .. }))?,
            )),
            _ => None,
        }
    }
}

impl fmt::Display for LogPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogPrefix::Group { chain, audit } => {
                write!(f, "{}{} {chain}", Self::START, if *audit { "audit" } else { "deny" })
            }
            LogPrefix::ClusterDeny(c) => write!(f, "{}cnp {c}", Self::START),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name weft writes reads back as what it was written from, and nothing
    /// else reads as one of weft's.
    #[test]
    fn every_name_reads_back() {
        let id = PolicyId::of("x", "a");
        let h = "0123456789".to_string();
        let chains = [
            Chain::Base(Direction::Egress),
            Chain::Dispatch(Direction::Ingress),
            Chain::Policy {
                id,
                direction: Direction::Egress,
                hash: "ab12".into(),
            },
            Chain::Group {
                hash: h.clone(),
                direction: Direction::Ingress,
            },
            Chain::Admin {
                hash: h.clone(),
                direction: Direction::Egress,
            },
            Chain::Baseline {
                hash: h.clone(),
                direction: Direction::Ingress,
            },
        ];
        for c in &chains {
            assert_eq!(Chain::parse(&c.to_string()).as_ref(), Some(c), "{c}");
            let m = SetName::Members(c.clone());
            assert_eq!(SetName::parse(&m.to_string()), Some(m));
        }
        for c in [
            Counter::Policy {
                id,
                direction: Direction::Ingress,
            },
            Counter::Group {
                hash: h.clone(),
                direction: Direction::Egress,
            },
            Counter::ClusterRule {
                id,
                direction: Direction::Ingress,
                rule: 17,
            },
        ] {
            assert_eq!(Counter::parse(&c.to_string()), Some(c.clone()), "{c}");
        }
        for role in [SetRole::Pods, SetRole::Named, SetRole::Ranges, SetRole::Learnt] {
            for v6 in [false, true] {
                let s = SetName::Data {
                    role,
                    hash: h.clone(),
                    v6,
                };
                assert_eq!(SetName::parse(&s.to_string()), Some(s.clone()), "{s}");
            }
        }
        assert_eq!(SetName::parse("hairpin"), Some(SetName::Hairpin));
        for p in [
            LogPrefix::Group {
                chain: chains[3].clone(),
                audit: true,
            },
            LogPrefix::ClusterDeny(Counter::ClusterRule {
                id,
                direction: Direction::Egress,
                rule: 0,
            }),
        ] {
            assert_eq!(LogPrefix::parse(&p.to_string()), Some(p.clone()));
        }
        for junk in [
            "",
            "p",
            "g123e",
            "gXYZ4567890e",
            "s01234567895",
            "x0123456789i",
            "egress_podz",
            "m",
            "mfoo",
        ] {
            assert_eq!(Chain::parse(junk), None, "{junk}");
            assert_eq!(SetName::parse(junk), None, "{junk}");
            assert_eq!(Counter::parse(junk), None, "{junk}");
        }
        assert_eq!(LogPrefix::parse("weft deny egress"), None, "a group chain only");
    }
}
