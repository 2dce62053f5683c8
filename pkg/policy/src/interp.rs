//! Runs a plan as the kernel would: the path a connection's first packet takes through
//! the base chains, the dispatch and the chains they jump to, with every set lookup,
//! counter and verdict ([`Table::run`]). What the planner means by its rules is read off
//! here, without root, and compared with what the evaluator says of the same flow; the
//! kernel tests then check that the kernel does what the rules say.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use weft_topology::PortProtocol;

use crate::model::Direction;
use crate::names::{Chain, Counter, LogPrefix, SetName};
use crate::plan::{Desired, Element, allowed_mark};
use crate::rule::{Match, Rule, Side, Verdict};

/// A packet on the node's forward path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The interface it came in by (a pod's host end, or the uplink).
    pub iif: String,
    /// The interface it leaves by.
    pub oif: String,
    /// Its source address.
    pub src: IpAddr,
    /// Its destination address.
    pub dst: IpAddr,
    /// Its transport protocol and destination port (`None`: another protocol, ICMP).
    pub l4: Option<(PortProtocol, u16)>,
    /// Whether conntrack has its connection as established or related.
    pub established: bool,
    /// Its connection's conntrack mark.
    pub mark: u32,
}

/// What the table did with a packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Whether it is forwarded.
    pub accepted: bool,
    /// The counters it was counted in, in order.
    pub counters: Vec<Counter>,
    /// The log prefixes it was logged with, in order.
    pub logged: Vec<LogPrefix>,
    /// Its connection's conntrack mark after it.
    pub mark: u32,
}

/// A plan made ready to run: its sets indexed.
pub struct Table<'d> {
    d: &'d Desired,
    members: HashMap<Chain, HashSet<String>>,
    hairpin: BTreeSet<String>,
}

/// How deep chains may jump before the walk counts as a loop (the kernel refuses
/// loops and allows 16 levels; weft's tables use 4).
const MAX_DEPTH: usize = 16;

impl<'d> Table<'d> {
    /// The table `d` describes.
    pub fn new(d: &'d Desired) -> Self {
        let mut members: HashMap<Chain, HashSet<String>> = HashMap::new();
        for dir in Direction::BOTH {
            for (ifname, chain) in d.dispatch(dir) {
                members.entry(chain.clone()).or_default().insert(ifname.clone());
            }
        }
        Table {
            d,
            members,
            hairpin: d.hairpin().into_iter().map(str::to_string).collect(),
        }
    }

    fn in_set(&self, set: &SetName, key: &Element) -> bool {
        self.d.sets.get(set).is_some_and(|s| {
            s.elements.iter().any(|e| match (e, key) {
                (Element::Range(a, b), Element::Addr(ip)) => a <= ip && ip <= b && a.is_ipv6() == ip.is_ipv6(),
                _ => e == key,
            })
        })
    }

    fn matches(&self, m: &Match, p: &Packet) -> bool {
        match m {
            Match::Addr { side, v6, set } => {
                let ip = match side {
                    Side::Source => p.src,
                    Side::Destination => p.dst,
                };
                ip.is_ipv6() == *v6 && self.in_set(set, &Element::Addr(ip))
            }
            Match::DestPort { v6, set } => {
                p.dst.is_ipv6() == *v6
                    && p.l4
                        .is_some_and(|(proto, port)| self.in_set(set, &Element::AddrPort(p.dst, proto, port)))
            }
            Match::Proto(proto) => p.l4.is_some_and(|(x, _)| x == *proto),
            Match::Port { protocol, from, to } => {
                p.l4.is_some_and(|(x, port)| x == *protocol && (*from..=*to).contains(&port))
            }
            Match::Iface { input, set } => {
                let ifname = if *input { &p.iif } else { &p.oif };
                match set {
                    SetName::Members(chain) => self.members.get(chain).is_some_and(|m| m.contains(ifname)),
                    SetName::Data { .. } | SetName::Hairpin => false,
                }
            }
            Match::IfacePair(set) => *set == SetName::Hairpin && p.iif == p.oif && self.hairpin.contains(&p.iif),
            Match::Established => p.established,
            Match::Marked(dir) => p.mark & allowed_mark(*dir) != 0,
            // The hold's repeat sees the same sets as the rules before it do here (the
            // plan's sets are what the learner had written): the first pass is the one
            // that decides, so every packet is taken as not held yet.
            Match::Unheld => true,
        }
    }

    fn rules(&self, chain: &Chain) -> Vec<Rule> {
        self.d.fixed_chain(chain)
    }

    /// Runs one base chain; `Some(false)` when the packet is dropped.
    fn run_base(&self, dir: Direction, p: &mut Packet, out: &mut Outcome) -> Result<bool, String> {
        // A stack of (chain, next rule); a jump pushes, a goto replaces the top, a
        // return or a chain's end pops, and the base chain's end is its policy: accept.
        let mut stack: Vec<(Chain, usize)> = vec![(Chain::Base(dir), 0)];
        let mut rules_of: HashMap<Chain, Vec<Rule>> = HashMap::new();
        while let Some((chain, i)) = stack.last().cloned() {
            let rules = rules_of.entry(chain.clone()).or_insert_with(|| self.rules(&chain));
            let Some(rule) = rules.get(i).cloned() else {
                stack.pop();
                continue;
            };
            stack.last_mut().expect("a chain").1 += 1;
            if !rule.matches.iter().all(|m| self.matches(m, p)) {
                continue;
            }
            if let Some(prefix) = &rule.log {
                out.logged.push(prefix.clone());
            }
            if let Some(c) = &rule.counter {
                out.counters.push(c.clone());
            }
            if let Some(d) = rule.mark {
                p.mark |= allowed_mark(d);
            }
            match &rule.verdict {
                Verdict::Accept => return Ok(true),
                Verdict::Drop => return Ok(false),
                // Held, then through the chain again past the hold: what the rules
                // after it say (the sets unchanged here, see `Match::Unheld`).
                Verdict::Continue | Verdict::Hold => {}
                Verdict::Return => {
                    stack.pop();
                }
                Verdict::Jump(c) => {
                    if !self.exists(c) {
                        return Err(format!("{chain} jumps to {c}, which the plan does not have"));
                    }
                    stack.push((c.clone(), 0));
                }
                Verdict::Goto(c) => {
                    if !self.exists(c) {
                        return Err(format!("{chain} goes to {c}, which the plan does not have"));
                    }
                    *stack.last_mut().expect("a chain") = (c.clone(), 0);
                }
            }
            if stack.len() > MAX_DEPTH {
                return Err(format!("chains nest deeper than {MAX_DEPTH} from {}", Chain::Base(dir)));
            }
        }
        Ok(true)
    }

    fn exists(&self, c: &Chain) -> bool {
        matches!(c, Chain::Base(_) | Chain::Dispatch(_)) || self.d.chains.contains_key(c)
    }

    /// What the table does with `packet`: both base chains in their order (egress,
    /// then ingress; an accept in one still meets the other, a drop is final). An error
    /// when the plan is broken (a jump to a chain it lacks, a loop).
    pub fn run(&self, packet: &Packet) -> Result<Outcome, String> {
        let mut p = packet.clone();
        let mut out = Outcome {
            accepted: true,
            ..Outcome::default()
        };
        for dir in [Direction::Egress, Direction::Ingress] {
            if !self.run_base(dir, &mut p, &mut out)? {
                out.accepted = false;
                break;
            }
        }
        out.mark = p.mark;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::SetRole;
    use crate::plan::{SetKind, SetSpec};

    /// The walk follows jumps, gotos, returns and chain ends as the kernel does.
    #[test]
    fn chains_jump_go_and_return() {
        let mut d = Desired::default();
        let group = Chain::Group {
            hash: "0123456789".into(),
            direction: Direction::Ingress,
        };
        let allow = Chain::Policy {
            id: crate::PolicyId(1),
            direction: Direction::Ingress,
            hash: "abcd".into(),
        };
        let set = SetName::Data {
            role: SetRole::Pods,
            hash: "0123456789".into(),
            v6: false,
        };
        d.sets.insert(
            set.clone(),
            SetSpec {
                kind: SetKind::Addr4,
                elements: [Element::Addr("10.0.0.1".parse().unwrap())].into(),
            },
        );
        let counter = Counter::Policy {
            id: crate::PolicyId(1),
            direction: Direction::Ingress,
        };
        d.chains.insert(
            allow.clone(),
            vec![Rule::allow(
                vec![
                    Match::Addr {
                        side: Side::Source,
                        v6: false,
                        set,
                    },
                    Match::Port {
                        protocol: PortProtocol::Tcp,
                        from: 80,
                        to: 80,
                    },
                ],
                counter.clone(),
                Direction::Ingress,
            )],
        );
        d.chains.insert(
            group.clone(),
            vec![
                Rule::new(vec![], Verdict::Jump(allow)),
                Rule::new(vec![], Verdict::Drop),
            ],
        );
        d.ingress.insert("weft1".into(), group);
        let t = Table::new(&d);
        let packet = |src: &str, port: u16, oif: &str| Packet {
            iif: "eth0".into(),
            oif: oif.into(),
            src: src.parse().unwrap(),
            dst: "10.0.0.9".parse().unwrap(),
            l4: Some((PortProtocol::Tcp, port)),
            established: false,
            mark: 0,
        };
        let ok = t.run(&packet("10.0.0.1", 80, "weft1")).unwrap();
        assert!(ok.accepted);
        assert_eq!(ok.counters, vec![counter]);
        assert_eq!(ok.mark, allowed_mark(Direction::Ingress));
        assert!(!t.run(&packet("10.0.0.1", 81, "weft1")).unwrap().accepted);
        assert!(!t.run(&packet("10.0.0.2", 80, "weft1")).unwrap().accepted);
        assert!(
            t.run(&packet("10.0.0.2", 80, "weft2")).unwrap().accepted,
            "not isolated"
        );
        let mut est = packet("10.0.0.2", 80, "weft1");
        est.established = true;
        assert!(t.run(&est).unwrap().accepted, "replies pass");
        let mut hairpin = packet("10.0.0.9", 80, "weft1");
        hairpin.iif = "weft1".into();
        assert!(t.run(&hairpin).unwrap().accepted, "a pod to itself");
    }
}
