//! The rules of weft's policy table as a type ([`Rule`]): what the planner emits, what
//! is rendered to nft's language in one place ([`Rule`]'s `Display`), what is read back
//! from the kernel (`nft -j`, [`Rule::from_json`]) and compared as the same type, and
//! what the interpreter of the table runs ([`crate::interp`]) to check the planner
//! against the evaluator. The vocabulary is exactly what weft writes; a rule the kernel
//! holds that is not in it reads as `None`, which the diff repairs.

use std::fmt;

use serde_json::Value;
use weft_kernel::nftbatch as nb;
use weft_topology::PortProtocol;

use crate::direction::Direction;
use crate::names::{Chain, Counter, LogPrefix, SetName};

/// The NFLOG group denied (and audited) flows are logged to.
pub const LOG_GROUP: u16 = 21845;

/// The NFQUEUE queue where a new connection that a `domainNames` rule could allow, to
/// an address not learnt yet, waits until the learner has read every answer copied
/// before it (read on the same socket as the copies, in order), then goes through its
/// chain again with [`HELD_MARK`]: the connection opened the instant an answer arrives
/// finds the answer's addresses learnt. No bypass: with nobody reading, it is dropped
/// (what no answer allowed stays refused).
pub const HOLD_QUEUE: u16 = 21846;

/// The packet mark (not the conntrack mark) a held connection's first packet comes
/// back with: the hold rule lets it past, the rules after it decide.
pub const HELD_MARK: u32 = 0x0040_0000;

/// How many denied packets per second a group chain logs at most (a flood of one flow
/// must not drown the log; the rest are still counted).
pub const LOG_RATE: u32 = 20;

/// The conntrack mark bit a connection carries once this node's egress policy allowed
/// its first packet. A flow that sees no reply (a one-way UDP stream) stays `new` in
/// conntrack, so without it every one of its packets would walk the policy chains.
pub const ALLOWED_EGRESS_MARK: u32 = 0x0010_0000;

/// The same for ingress (both decide on the same conntrack entry on one node).
pub const ALLOWED_INGRESS_MARK: u32 = 0x0020_0000;

/// The conntrack mark bit of `dir`.
pub fn allowed_mark(dir: Direction) -> u32 {
    match dir {
        Direction::Egress => ALLOWED_EGRESS_MARK,
        Direction::Ingress => ALLOWED_INGRESS_MARK,
    }
}

/// Which address of a packet an address match reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// The source address (ingress rules match where traffic comes from).
    Source,
    /// The destination address (egress rules match where traffic goes).
    Destination,
}

impl Side {
    /// The side a peer of direction `dir` is on.
    pub fn of_peer(dir: Direction) -> Self {
        match dir {
            Direction::Ingress => Side::Source,
            Direction::Egress => Side::Destination,
        }
    }
}

/// What a packet must have for a rule to apply to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Match {
    /// Its address of `side` (of family `v6`) is in `set` (addresses or ranges).
    Addr {
        /// Which address.
        side: Side,
        /// The family.
        v6: bool,
        /// The set.
        set: SetName,
    },
    /// Its destination address, protocol and destination port are in `set` (a named
    /// port's).
    DestPort {
        /// The family.
        v6: bool,
        /// The set.
        set: SetName,
    },
    /// Its transport protocol, any port.
    Proto(PortProtocol),
    /// Its transport protocol and a destination port from `from` to `to`.
    Port {
        /// The protocol.
        protocol: PortProtocol,
        /// The first port.
        from: u16,
        /// The last port (`from` for one).
        to: u16,
    },
    /// The interface it came in by (`input`) or leaves by is in `set`.
    Iface {
        /// Whether it is the input interface.
        input: bool,
        /// The set.
        set: SetName,
    },
    /// Its (input, output) interface pair is in `set`.
    IfacePair(SetName),
    /// Its connection is established or related (conntrack state).
    Established,
    /// Its connection's conntrack mark has `dir`'s bit (that way allowed it before).
    Marked(Direction),
    /// It has not been held yet: its packet mark lacks [`HELD_MARK`].
    Unheld,
}

/// Where a rule sends a packet it applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// Accepted (by this base chain: the next one still sees it).
    Accept,
    /// Dropped.
    Drop,
    /// To another chain, then back.
    Jump(Chain),
    /// To another chain, not back.
    Goto(Chain),
    /// Back to the chain that jumped here.
    Return,
    /// To the next rule (a rule that only logs).
    Continue,
    /// Held in [`HOLD_QUEUE`] until the DNS answers before it are learnt, then through
    /// the base chain again (marked, so not held twice). Only in [`Chain::Hold`]: nft
    /// cannot write it (see there).
    Hold,
}

/// One rule: its matches (all must hold), then what it does in order: log
/// (rate-limited), count, remember the direction in the conntrack mark, the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// The matches.
    pub matches: Vec<Match>,
    /// Log the packet to NFLOG with this prefix, at most [`LOG_RATE`] a second (over
    /// the rate, the rule does not apply: logging never decides).
    pub log: Option<LogPrefix>,
    /// Count it in this counter.
    pub counter: Option<Counter>,
    /// Set this direction's bit in its connection's conntrack mark.
    pub mark: Option<Direction>,
    /// The verdict.
    pub verdict: Verdict,
}

impl Rule {
    /// A rule of matches and a verdict.
    pub fn new(matches: Vec<Match>, verdict: Verdict) -> Self {
        Rule {
            matches,
            log: None,
            counter: None,
            mark: None,
            verdict,
        }
    }

    /// The rule that allows what `matches` takes in `dir`: counted in `counter`, the
    /// direction remembered on the connection, accepted.
    pub fn allow(matches: Vec<Match>, counter: Counter, dir: Direction) -> Self {
        Rule {
            counter: Some(counter),
            mark: Some(dir),
            ..Rule::new(matches, Verdict::Accept)
        }
    }

    /// The same rule counted in `counter`.
    pub fn counted(mut self, counter: Counter) -> Self {
        self.counter = Some(counter);
        self
    }

    /// The rule that logs what `matches` takes with `prefix` and goes on.
    pub fn log(matches: Vec<Match>, prefix: LogPrefix) -> Self {
        Rule {
            log: Some(prefix),
            ..Rule::new(matches, Verdict::Continue)
        }
    }

    /// The chain it jumps or goes to.
    pub fn target(&self) -> Option<&Chain> {
        match &self.verdict {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            Verdict::Accept | Verdict::Drop | Verdict::Return | Verdict::Continue | Verdict::Hold => None,
        }
    }

    /// The sets its matches use.
    pub fn sets(&self) -> impl Iterator<Item = &SetName> {
        self.matches.iter().filter_map(|m| match m {
            Match::Addr { set, .. }
            | Match::DestPort { set, .. }
            | Match::Iface { set, .. }
            | Match::IfacePair(set) => Some(set),
            Match::Proto(_) | Match::Port { .. } | Match::Established | Match::Marked(_) | Match::Unheld => None,
        })
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = |v6: bool| if v6 { "ip6" } else { "ip" };
        match self {
            Match::Addr { side, v6, set } => {
                let field = match side {
                    Side::Source => "saddr",
                    Side::Destination => "daddr",
                };
                write!(f, "{} {field} @{set}", family(*v6))
            }
            Match::DestPort { v6, set } => write!(f, "{} daddr . meta l4proto . th dport @{set}", family(*v6)),
            Match::Proto(p) => write!(f, "meta l4proto {p}"),
            // nft lists `meta l4proto tcp th dport 80` as `tcp dport 80`: written so.
            Match::Port { protocol, from, to } if from == to => write!(f, "{protocol} dport {from}"),
            Match::Port { protocol, from, to } => write!(f, "{protocol} dport {from}-{to}"),
            Match::Iface { input, set } => write!(f, "{} @{set}", if *input { "iifname" } else { "oifname" }),
            Match::IfacePair(set) => write!(f, "iifname . oifname @{set}"),
            Match::Established => f.write_str("ct state established,related"),
            Match::Marked(d) => write!(
                f,
                "ct mark and {:#010x} == {:#010x}",
                allowed_mark(*d),
                allowed_mark(*d)
            ),
            Match::Unheld => write!(f, "meta mark & {HELD_MARK:#010x} == 0x00000000"),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.matches.iter().map(ToString::to_string).collect();
        if let Some(p) = &self.log {
            parts.push(format!(
                "limit rate {LOG_RATE}/second burst {LOG_RATE} packets log group {LOG_GROUP} prefix \"{p}\""
            ));
        }
        if let Some(c) = &self.counter {
            parts.push(format!("counter name \"{c}\""));
        }
        if let Some(d) = self.mark {
            parts.push(format!("ct mark set ct mark or {:#010x}", allowed_mark(d)));
        }
        match &self.verdict {
            Verdict::Accept => parts.push("accept".into()),
            Verdict::Drop => parts.push("drop".into()),
            Verdict::Jump(c) => parts.push(format!("jump {c}")),
            Verdict::Goto(c) => parts.push(format!("goto {c}")),
            Verdict::Return => parts.push("return".into()),
            Verdict::Hold => parts.push(format!("queue num {HOLD_QUEUE}")),
            Verdict::Continue => {}
        }
        f.write_str(&parts.join(" "))
    }
}

/// The kernel's protocol of a port protocol.
fn l4(p: PortProtocol) -> nb::L4Proto {
    match p {
        PortProtocol::Tcp => nb::L4Proto::Tcp,
        PortProtocol::Udp => nb::L4Proto::Udp,
        PortProtocol::Sctp => nb::L4Proto::Sctp,
    }
}

impl Rule {
    /// The rule as the kernel's expressions (written over nfnetlink, the same rule as
    /// its text: `weft_kernel::nftbatch` is checked against nft for every word);
    /// `None` for a base chain's rule, which only `nft -f` writes.
    pub fn exprs(&self) -> Option<Vec<nb::Expr>> {
        let family = |v6: bool| if v6 { nb::IpFamily::V6 } else { nb::IpFamily::V4 };
        let mut out = Vec::new();
        for m in &self.matches {
            out.push(match m {
                Match::Addr { side, v6, set } => nb::Expr::AddrInSet {
                    family: family(*v6),
                    addr: match side {
                        Side::Source => nb::Addr::Source,
                        Side::Destination => nb::Addr::Destination,
                    },
                    set: set.to_string(),
                },
                // Named-port sets are never interval sets.
                Match::DestPort { v6, set } => nb::Expr::DaddrProtoPortInSet {
                    family: family(*v6),
                    set: set.to_string(),
                    interval: false,
                },
                Match::Proto(p) => nb::Expr::L4Proto(l4(*p)),
                Match::Port { protocol, from, to } => nb::Expr::Dport {
                    proto: l4(*protocol),
                    ports: *from..=*to,
                },
                Match::Iface { input, set } => nb::Expr::IfnameInSet {
                    iface: if *input { nb::Iface::Input } else { nb::Iface::Output },
                    set: set.to_string(),
                },
                Match::IfacePair(set) => nb::Expr::IfnamesInSet { set: set.to_string() },
                Match::Unheld => nb::Expr::MarkClear(HELD_MARK),
                Match::Established | Match::Marked(_) => return None,
            });
        }
        if let Some(p) = &self.log {
            out.push(nb::Expr::Limit {
                rate: u64::from(LOG_RATE),
                per: nb::Per::Second,
                burst: LOG_RATE,
            });
            out.push(nb::Expr::Log {
                group: LOG_GROUP,
                prefix: p.to_string(),
            });
        }
        if let Some(c) = &self.counter {
            out.push(nb::Expr::Counter(c.to_string()));
        }
        if let Some(d) = self.mark {
            out.push(nb::Expr::CtMarkOr(allowed_mark(d)));
        }
        match &self.verdict {
            Verdict::Accept => out.push(nb::Verdict::Accept.into()),
            Verdict::Drop => out.push(nb::Verdict::Drop.into()),
            Verdict::Jump(c) => out.push(nb::Verdict::Jump(c.to_string()).into()),
            Verdict::Goto(c) => out.push(nb::Verdict::Goto(c.to_string()).into()),
            Verdict::Return => out.push(nb::Verdict::Return.into()),
            Verdict::Hold => out.push(nb::Expr::Queue {
                num: HOLD_QUEUE,
                bypass: false,
            }),
            Verdict::Continue => {}
        }
        Some(out)
    }
}

fn set_ref(v: &Value) -> Option<SetName> {
    SetName::parse(v.as_str()?.strip_prefix('@')?)
}

fn meta_key(v: &Value) -> Option<&str> {
    v.get("meta")?.get("key")?.as_str()
}

fn payload(v: &Value) -> Option<(&str, &str)> {
    let p = v.get("payload")?;
    Some((p.get("protocol")?.as_str()?, p.get("field")?.as_str()?))
}

fn protocol(s: &str) -> Option<PortProtocol> {
    PortProtocol::ALL.into_iter().find(|p| p.as_str() == s)
}

fn port(v: &Value) -> Option<(u16, u16)> {
    if let Some(n) = v.as_u64() {
        let n = u16::try_from(n).ok()?;
        return Some((n, n));
    }
    let r = v.get("range")?.as_array()?;
    Some((
        u16::try_from(r.first()?.as_u64()?).ok()?,
        u16::try_from(r.get(1)?.as_u64()?).ok()?,
    ))
}

/// One `match` expression of `nft -j`.
fn read_match(m: &Value) -> Option<Match> {
    let (left, right) = (m.get("left")?, m.get("right")?);
    let op = m.get("op")?.as_str()?;
    if op == "in" {
        let states: Vec<&str> = right.as_array()?.iter().filter_map(Value::as_str).collect();
        return (left.get("ct")?.get("key")? == "state" && states == ["established", "related"])
            .then_some(Match::Established);
    }
    if op != "==" {
        return None;
    }
    if let Some((proto, field)) = payload(left) {
        return match (proto, field) {
            ("ip" | "ip6", "saddr" | "daddr") => Some(Match::Addr {
                side: if field == "saddr" {
                    Side::Source
                } else {
                    Side::Destination
                },
                v6: proto == "ip6",
                set: set_ref(right)?,
            }),
            (p, "dport") => {
                let (from, to) = port(right)?;
                Some(Match::Port {
                    protocol: protocol(p)?,
                    from,
                    to,
                })
            }
            _ => None,
        };
    }
    if let Some(key) = meta_key(left) {
        return match key {
            "l4proto" => Some(Match::Proto(protocol(right.as_str()?)?)),
            "iifname" | "oifname" => Some(Match::Iface {
                input: key == "iifname",
                set: set_ref(right)?,
            }),
            _ => None,
        };
    }
    if let Some(parts) = left.get("concat").and_then(Value::as_array) {
        let set = set_ref(right)?;
        if let [a, b] = parts.as_slice()
            && meta_key(a) == Some("iifname")
            && meta_key(b) == Some("oifname")
        {
            return Some(Match::IfacePair(set));
        }
        if let [addr, proto, dport] = parts.as_slice()
            && let Some((family @ ("ip" | "ip6"), "daddr")) = payload(addr)
            && meta_key(proto) == Some("l4proto")
            && payload(dport) == Some(("th", "dport"))
        {
            return Some(Match::DestPort {
                v6: family == "ip6",
                set,
            });
        }
        return None;
    }
    if let Some(and) = left.get("&").and_then(Value::as_array) {
        let bit = right.as_u64()?;
        if meta_key(and.first()?) == Some("mark") {
            return (bit == 0 && and.get(1)?.as_u64()? == u64::from(HELD_MARK)).then_some(Match::Unheld);
        }
        let dir = Direction::BOTH
            .into_iter()
            .find(|d| u64::from(allowed_mark(*d)) == bit)?;
        return (and.first()?.get("ct")?.get("key")? == "mark" && and.get(1)?.as_u64()? == bit)
            .then_some(Match::Marked(dir));
    }
    None
}

impl Rule {
    /// Reads a rule's `expr` list from `nft -j`; `None` when it is not a rule weft
    /// writes (any expression outside the vocabulary, or in another order).
    pub fn from_json(exprs: &[Value]) -> Option<Rule> {
        let mut rule = Rule::new(Vec::new(), Verdict::Continue);
        let mut stage = 0; // matches, then limit+log, counter, mark, verdict, in order
        let mut i = 0;
        while i < exprs.len() {
            let e = &exprs[i];
            i += 1;
            if let Some(m) = e.get("match") {
                if stage > 0 {
                    return None;
                }
                rule.matches.push(read_match(m)?);
            } else if let Some(limit) = e.get("limit") {
                let log = exprs.get(i)?.get("log")?;
                i += 1;
                let expected = limit.get("rate")?.as_u64()? == u64::from(LOG_RATE)
                    && limit.get("burst")?.as_u64()? == u64::from(LOG_RATE)
                    && limit.get("per")? == "second"
                    && log.get("group")?.as_u64()? == u64::from(LOG_GROUP);
                if stage > 0 || !expected {
                    return None;
                }
                rule.log = Some(LogPrefix::parse(log.get("prefix")?.as_str()?)?);
                stage = 1;
            } else if let Some(c) = e.get("counter") {
                if stage > 1 {
                    return None;
                }
                rule.counter = Some(Counter::parse(c.as_str()?)?);
                stage = 2;
            } else if let Some(m) = e.get("mangle") {
                let or = m.get("value")?.get("|")?.as_array()?;
                let bit = or.get(1)?.as_u64()?;
                let dir = Direction::BOTH
                    .into_iter()
                    .find(|d| u64::from(allowed_mark(*d)) == bit)?;
                let ct_mark = |v: &Value| v.get("ct").and_then(|c| c.get("key")).is_some_and(|k| k == "mark");
                if stage > 2 || !ct_mark(m.get("key")?) || !ct_mark(or.first()?) {
                    return None;
                }
                rule.mark = Some(dir);
                stage = 3;
            } else {
                let verdict = if e.get("accept").is_some() {
                    Verdict::Accept
                } else if e.get("drop").is_some() {
                    Verdict::Drop
                } else if e.get("return").is_some() {
                    Verdict::Return
                } else if let Some(j) = e.get("jump") {
                    Verdict::Jump(Chain::parse(j.get("target")?.as_str()?)?)
                } else if let Some(g) = e.get("goto") {
                    Verdict::Goto(Chain::parse(g.get("target")?.as_str()?)?)
                } else if let Some(xt) = e.get("xt") {
                    // nft's JSON names an xtables target only: NFQUEUE is weft's hold
                    // (the one queue its policy rules use).
                    if xt.get("type")? != "target" || xt.get("name")? != "NFQUEUE" {
                        return None;
                    }
                    Verdict::Hold
                } else {
                    return None;
                };
                if i != exprs.len() {
                    return None;
                }
                rule.verdict = verdict;
                stage = 4;
            }
        }
        Some(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PolicyId;
    use crate::names::SetRole;

    fn set(role: SetRole, v6: bool) -> SetName {
        SetName::Data {
            role,
            hash: "0123456789".into(),
            v6,
        }
    }

    /// Every rule of the vocabulary, as nft 1.0.6 lists it back (`nft -j list chain`
    /// of these rules written by `nft -f`, in a namespace of its own): each reads back
    /// as the rule it was rendered from.
    #[test]
    fn rules_read_back_from_nft_json_as_rendered() {
        let id = PolicyId::of("x", "a");
        let group = Chain::Group {
            hash: "0123456789".into(),
            direction: Direction::Egress,
        };
        let counter = Counter::Policy {
            id,
            direction: Direction::Egress,
        };
        let rules = [
            Rule::allow(
                vec![Match::Addr {
                    side: Side::Source,
                    v6: false,
                    set: set(SetRole::Pods, false),
                }],
                counter.clone(),
                Direction::Egress,
            ),
            Rule::new(
                vec![
                    Match::Addr {
                        side: Side::Destination,
                        v6: true,
                        set: set(SetRole::Ranges, true),
                    },
                    Match::Port {
                        protocol: PortProtocol::Udp,
                        from: 1000,
                        to: 2000,
                    },
                ],
                Verdict::Drop,
            )
            .counted(counter.clone()),
            Rule::new(
                vec![Match::DestPort {
                    v6: false,
                    set: set(SetRole::Named, false),
                }],
                Verdict::Return,
            ),
            Rule::new(vec![Match::Proto(PortProtocol::Sctp)], Verdict::Goto(group.clone())),
            Rule::log(
                vec![],
                LogPrefix::Group {
                    chain: group.clone(),
                    audit: false,
                },
            ),
            Rule::new(
                vec![Match::Iface {
                    input: true,
                    set: SetName::Members(group.clone()),
                }],
                Verdict::Jump(group.clone()),
            ),
            Rule::new(vec![Match::IfacePair(SetName::Hairpin)], Verdict::Accept),
            Rule::new(vec![Match::Established], Verdict::Accept),
            Rule::new(vec![Match::Marked(Direction::Ingress)], Verdict::Accept),
            Rule::new(
                vec![Match::Port {
                    protocol: PortProtocol::Tcp,
                    from: 80,
                    to: 80,
                }],
                Verdict::Accept,
            ),
            Rule::new(
                vec![
                    Match::Unheld,
                    Match::Port {
                        protocol: PortProtocol::Tcp,
                        from: 443,
                        to: 443,
                    },
                ],
                Verdict::Hold,
            ),
        ];
        // What nft 1.0.6 printed for these rules (`nft -j list chain`, expr lists; the
        // queue is an xtables target, which its JSON names only).
        let listed = [
            r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@s01234567894"}}, {"counter": "a%ID%e"}, {"mangle": {"key": {"ct": {"key": "mark"}}, "value": {"|": [{"ct": {"key": "mark"}}, 1048576]}}}, {"accept": null}]"#,
            r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": "@r01234567896"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": {"range": [1000, 2000]}}}, {"counter": "a%ID%e"}, {"drop": null}]"#,
            r#"[{"match": {"op": "==", "left": {"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "right": "@n01234567894"}}, {"return": null}]"#,
            r#"[{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "sctp"}}, {"goto": {"target": "g0123456789e"}}]"#,
            r#"[{"limit": {"rate": 20, "burst": 20, "per": "second"}}, {"log": {"prefix": "weft deny g0123456789e", "group": 21845}}]"#,
            r#"[{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "@mg0123456789e"}}, {"jump": {"target": "g0123456789e"}}]"#,
            r#"[{"match": {"op": "==", "left": {"concat": [{"meta": {"key": "iifname"}}, {"meta": {"key": "oifname"}}]}, "right": "@hairpin"}}, {"accept": null}]"#,
            r#"[{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]"#,
            r#"[{"match": {"op": "==", "left": {"&": [{"ct": {"key": "mark"}}, 2097152]}, "right": 2097152}}, {"accept": null}]"#,
            r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}, {"accept": null}]"#,
            r#"[{"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 4194304]}, "right": 0}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 443}}, {"xt": {"type": "target", "name": "NFQUEUE"}}]"#,
        ];
        assert_eq!(rules.len(), listed.len());
        for (rule, json) in rules.iter().zip(listed) {
            let exprs: Vec<Value> = serde_json::from_str(&json.replace("%ID%", &id.to_string())).unwrap();
            assert_eq!(Rule::from_json(&exprs).as_ref(), Some(rule), "{rule}");
        }
        // Out of the vocabulary, or out of order: not weft's.
        for junk in [
            r#"[{"match": {"op": "!=", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"accept": null}]"#,
            r#"[{"counter": "a000000000000e"}, {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"accept": null}]"#,
            r#"[{"accept": null}, {"counter": "a000000000000e"}]"#,
            r#"[{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 1}}, {"accept": null}]"#,
            r#"[{"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 1]}, "right": 0}}, {"accept": null}]"#,
            r#"[{"xt": {"type": "target", "name": "TPROXY"}}]"#,
            r#"[{"limit": {"rate": 5, "burst": 20, "per": "second"}}, {"log": {"prefix": "weft deny g0123456789e", "group": 21845}}]"#,
        ] {
            let exprs: Vec<Value> = serde_json::from_str(junk).unwrap();
            assert_eq!(Rule::from_json(&exprs), None, "{junk}");
        }
    }

    /// The kernel's expressions of a rule print as the rule's own text: one rule,
    /// two renderings that say the same.
    #[test]
    fn the_kernel_expressions_say_what_the_text_says() {
        let id = PolicyId::of("x", "a");
        let group = Chain::Group {
            hash: "0123456789".into(),
            direction: Direction::Egress,
        };
        let counter = Counter::ClusterRule {
            id,
            direction: Direction::Egress,
            rule: 2,
        };
        for r in [
            Rule::allow(
                vec![
                    Match::Addr {
                        side: Side::Destination,
                        v6: true,
                        set: set(SetRole::Pods, true),
                    },
                    Match::Port {
                        protocol: PortProtocol::Sctp,
                        from: 9,
                        to: 10,
                    },
                ],
                counter.clone(),
                Direction::Egress,
            ),
            Rule::log(
                vec![Match::DestPort {
                    v6: false,
                    set: set(SetRole::Named, false),
                }],
                LogPrefix::ClusterDeny(counter.clone()),
            ),
            Rule::new(vec![Match::Proto(PortProtocol::Udp)], Verdict::Goto(group.clone())).counted(counter),
            Rule::new(
                vec![Match::Iface {
                    input: false,
                    set: SetName::Members(group.clone()),
                }],
                Verdict::Jump(group),
            ),
            Rule::new(vec![], Verdict::Return),
        ] {
            let text = nb::rule_text(&r.exprs().unwrap());
            assert_eq!(text.replace("tcp dport 80-80", "tcp dport 80"), r.to_string());
        }
        assert_eq!(Rule::new(vec![Match::Established], Verdict::Accept).exprs(), None);
    }

    #[test]
    fn rules_render_in_nfts_language() {
        let r = Rule::allow(
            vec![
                Match::Addr {
                    side: Side::Destination,
                    v6: false,
                    set: set(SetRole::Pods, false),
                },
                Match::Port {
                    protocol: PortProtocol::Tcp,
                    from: 80,
                    to: 81,
                },
            ],
            Counter::Policy {
                id: PolicyId(1),
                direction: Direction::Egress,
            },
            Direction::Egress,
        );
        assert_eq!(
            r.to_string(),
            "ip daddr @s01234567894 tcp dport 80-81 counter name \"a000000000001e\" ct mark set ct mark or 0x00100000 accept"
        );
    }
}
