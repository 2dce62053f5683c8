//! The table in nft's language: the whole table for a first install or a repair
//! ([`install_script`]), the one transaction that takes the kernel from what it holds
//! to a plan ([`diff`]), and what the kernel holds, read back from `nft -j` ([`parse`])
//! as the same typed rules the plan holds, so a rule changed behind weft's back is
//! seen and repaired. Every script is applied by `nft -f` in one atomic transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::IpAddr;

use serde_json::Value;
use weft_topology::PortProtocol;

use crate::model::Direction;
use crate::names::{Chain, Counter, SetName};
use crate::plan::{Addition, Delta, Desired, Element, SetKind, TABLE, base_rules, dispatch_rule};
use crate::rule::{Rule, Verdict};

/// An address the learner puts in a learnt set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearntElement {
    /// The learnt set (of the address's family).
    pub set: SetName,
    /// The address.
    pub ip: std::net::IpAddr,
    /// How long it stays, in milliseconds.
    pub timeout_ms: u64,
    /// The name it was learnt for (the element's comment).
    pub name: String,
}

/// The base chains' hook declarations: filter type on the forward hook, egress just
/// before ingress, both ahead of kube-proxy's filter chains.
fn hook(dir: Direction) -> &'static str {
    match dir {
        Direction::Egress => "type filter hook forward priority -5; policy accept;",
        Direction::Ingress => "type filter hook forward priority -4; policy accept;",
    }
}

/// The priority of a direction's base chain.
fn priority(dir: Direction) -> i64 {
    match dir {
        Direction::Egress => -5,
        Direction::Ingress => -4,
    }
}

/// The declaration of the member sets (host interfaces) and of the hairpin set.
const IFNAME: &str = "type ifname;";
const IFNAME_PAIR: &str = "type ifname . ifname;";

/// What the kernel's table holds, as far as the diff needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Whether the table exists.
    pub present: bool,
    /// Whether the base chains are as weft writes them, and nothing weft does not
    /// write is in the table (else it is written again whole).
    pub base_ok: bool,
    /// Data sets and their elements.
    pub sets: BTreeMap<SetName, BTreeSet<Element>>,
    /// Regular chains and their rules; `None`: a rule weft does not write is in it.
    pub chains: BTreeMap<Chain, Option<Vec<Rule>>>,
    /// Named counters with their packet counts.
    pub counters: BTreeMap<Counter, u64>,
    /// The egress dispatch: host interface to entry chain (from the member sets).
    pub egress: BTreeMap<String, Chain>,
    /// The ingress dispatch.
    pub ingress: BTreeMap<String, Chain>,
    /// The entry chains that have a member set (empty ones too).
    pub member_sets: BTreeSet<Chain>,
    /// The rules of each dispatch chain, as entry chains; `None`: not all readable.
    pub dispatch: BTreeMap<Direction, Option<BTreeSet<Chain>>>,
    /// The host interfaces in the hairpin set.
    pub hairpin: BTreeSet<String>,
    /// The learnt sets' elements with their comment (the name they were learnt for)
    /// and the seconds left before they expire: what a restarted weftd learns back.
    pub learnt: Vec<(IpAddr, String, u32)>,
}

impl Observed {
    /// What the kernel holds once `d` was applied (the base of the next incremental
    /// change, between two reads of the kernel).
    pub fn after(d: &Desired) -> Self {
        Observed {
            present: true,
            base_ok: true,
            sets: d.sets.iter().map(|(k, v)| (k.clone(), v.elements.clone())).collect(),
            chains: d.chains.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect(),
            counters: d.counters.iter().map(|c| (c.clone(), 0)).collect(),
            egress: d.egress.clone(),
            ingress: d.ingress.clone(),
            member_sets: Direction::BOTH
                .iter()
                .flat_map(|dir| d.members(*dir).into_keys().cloned())
                .collect(),
            dispatch: Direction::BOTH
                .iter()
                .map(|dir| (*dir, Some(d.members(*dir).into_keys().cloned().collect())))
                .collect(),
            hairpin: d.hairpin().into_iter().map(str::to_string).collect(),
            learnt: Vec::new(),
        }
    }

    /// What the kernel holds once `add`'s transaction was applied to what this holds.
    pub fn add(&mut self, add: &Addition) {
        for (name, set) in &add.new.sets {
            self.sets.insert(name.clone(), set.elements.clone());
        }
        for (name, elements) in &add.elements {
            self.sets
                .entry(name.clone())
                .or_default()
                .extend(elements.iter().copied());
        }
        for (chain, rules) in &add.new.chains {
            self.chains.insert(chain.clone(), Some(rules.clone()));
        }
        for c in &add.new.counters {
            self.counters.insert(c.clone(), 0);
        }
        for entry in &add.entries {
            self.member_sets.insert(entry.clone());
            if let Some(Some(entries)) = self.dispatch.get_mut(&entry.direction()) {
                entries.insert(entry.clone());
            }
        }
        self.egress.extend(add.egress.clone());
        self.ingress.extend(add.ingress.clone());
        self.hairpin.extend(add.hairpin.iter().cloned());
    }

    /// The dispatch of `dir` (host interface to entry chain).
    fn map(&self, dir: Direction) -> &BTreeMap<String, Chain> {
        match dir {
            Direction::Egress => &self.egress,
            Direction::Ingress => &self.ingress,
        }
    }
}

/// Elements go in chunks: one `add element` line of a million elements is a script
/// nft parses slowly, and chunks keep each line readable in a debug dump.
const CHUNK: usize = 4096;

fn element_lines(out: &mut String, verb: &str, set: &SetName, list: &BTreeSet<Element>) {
    let v: Vec<&Element> = list.iter().collect();
    for chunk in v.chunks(CHUNK) {
        let text: Vec<String> = chunk.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "{verb} element inet {TABLE} {set} {{ {} }}", text.join(", "));
    }
}

fn quoted<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pairs<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("\"{n}\" . \"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn rules_of(out: &mut String, chain: &Chain, rules: &[Rule]) {
    // The hold's queue is an xtables target nft cannot write: the kernel writes it
    // over nfnetlink after the script (`PolicyKernel::copy_dns_answers`).
    for r in rules.iter().filter(|r| r.verdict != Verdict::Hold) {
        let _ = writeln!(out, "add rule inet {TABLE} {chain} {r}");
    }
}

/// Regular chains in the order they can be filled: a chain before those that jump to
/// it.
fn by_rank<'a>(chains: impl IntoIterator<Item = &'a Chain>) -> Vec<&'a Chain> {
    let mut v: Vec<&Chain> = chains.into_iter().collect();
    v.sort_by_key(|c| (c.rank(), (*c).clone()));
    v
}

/// The script that replaces the table with one holding exactly `d`, atomically.
pub fn install_script(d: &Desired) -> String {
    let mut s = format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    for (name, set) in &d.sets {
        let _ = writeln!(s, "  set {name} {{ {} }}", set.kind.declaration());
    }
    for dir in Direction::BOTH {
        for entry in d.members(dir).keys() {
            let _ = writeln!(s, "  set {} {{ {IFNAME} }}", SetName::Members((*entry).clone()));
        }
    }
    let _ = writeln!(s, "  set {} {{ {IFNAME_PAIR} }}", SetName::Hairpin);
    for name in &d.counters {
        let _ = writeln!(s, "  counter {name} {{ }}");
    }
    for name in d.chains.keys() {
        let _ = writeln!(s, "  chain {name} {{ }}");
    }
    for dir in Direction::BOTH {
        let _ = writeln!(s, "  chain {} {{ }}", Chain::Dispatch(dir));
        let _ = writeln!(s, "  chain {} {{\n    {}", Chain::Base(dir), hook(dir));
        for r in base_rules(dir) {
            let _ = writeln!(s, "    {r}");
        }
        s.push_str("  }\n");
    }
    s.push_str("}\n");
    for (name, set) in &d.sets {
        if !set.elements.is_empty() {
            element_lines(&mut s, "add", name, &set.elements);
        }
    }
    for dir in Direction::BOTH {
        for (entry, ifnames) in d.members(dir) {
            let _ = writeln!(
                s,
                "add element inet {TABLE} {} {{ {} }}",
                SetName::Members(entry.clone()),
                quoted(ifnames)
            );
        }
    }
    let hairpin = d.hairpin();
    if !hairpin.is_empty() {
        let _ = writeln!(
            s,
            "add element inet {TABLE} {} {{ {} }}",
            SetName::Hairpin,
            pairs(hairpin)
        );
    }
    for chain in by_rank(d.chains.keys()) {
        rules_of(&mut s, chain, &d.chains[chain]);
    }
    for dir in Direction::BOTH {
        rules_of(&mut s, &Chain::Dispatch(dir), &d.fixed_chain(&Chain::Dispatch(dir)));
    }
    s
}

/// The one transaction that takes a kernel holding `o` to `d`: `None` when there is
/// nothing to do. A missing table or base chain means the whole table is written again.
pub fn diff(d: &Desired, o: &Observed) -> Option<String> {
    if !o.present || !o.base_ok {
        return Some(install_script(d));
    }
    let mut s = String::new();
    // New objects first, then what goes into them, then what is taken out, so every
    // reference is valid at each step of the transaction.
    for (name, set) in &d.sets {
        if !o.sets.contains_key(name) {
            let _ = writeln!(s, "add set inet {TABLE} {name} {{ {} }}", set.kind.declaration());
        }
    }
    let wanted_members: BTreeSet<Chain> = Direction::BOTH
        .iter()
        .flat_map(|dir| d.members(*dir).into_keys().cloned())
        .collect();
    for entry in wanted_members.difference(&o.member_sets) {
        let _ = writeln!(
            s,
            "add set inet {TABLE} {} {{ {IFNAME} }}",
            SetName::Members(entry.clone())
        );
    }
    for name in &d.counters {
        if !o.counters.contains_key(name) {
            let _ = writeln!(s, "add counter inet {TABLE} {name}");
        }
    }
    for name in d.chains.keys() {
        if !o.chains.contains_key(name) {
            let _ = writeln!(s, "add chain inet {TABLE} {name}");
        }
    }
    let empty = BTreeSet::new();
    for (name, set) in &d.sets {
        let have = o.sets.get(name).unwrap_or(&empty);
        let add: BTreeSet<Element> = set.elements.difference(have).copied().collect();
        if !add.is_empty() {
            element_lines(&mut s, "add", name, &add);
        }
    }
    for dir in Direction::BOTH {
        for (entry, ifnames) in d.members(dir) {
            let new: Vec<&str> = ifnames
                .into_iter()
                .filter(|i| o.map(dir).get(*i) != Some(entry))
                .collect();
            if !new.is_empty() {
                let _ = writeln!(
                    s,
                    "add element inet {TABLE} {} {{ {} }}",
                    SetName::Members(entry.clone()),
                    quoted(new)
                );
            }
        }
    }
    let hairpin = d.hairpin();
    let new_pairs: Vec<&str> = hairpin.iter().copied().filter(|i| !o.hairpin.contains(*i)).collect();
    if !new_pairs.is_empty() {
        let _ = writeln!(
            s,
            "add element inet {TABLE} {} {{ {} }}",
            SetName::Hairpin,
            pairs(new_pairs)
        );
    }
    for chain in by_rank(d.chains.keys()) {
        let rules = &d.chains[chain];
        match o.chains.get(chain) {
            Some(Some(have)) if have == rules => continue,
            Some(_) => {
                let _ = writeln!(s, "flush chain inet {TABLE} {chain}");
            }
            None => {}
        }
        rules_of(&mut s, chain, rules);
    }
    // The dispatch is rewritten whole when its entry chains change (rules are compared
    // as a set: an ADD may have appended one).
    for dir in Direction::BOTH {
        let want: BTreeSet<Chain> = d.members(dir).into_keys().cloned().collect();
        if o.dispatch.get(&dir).and_then(Option::as_ref) != Some(&want) {
            let chain = Chain::Dispatch(dir);
            let _ = writeln!(s, "flush chain inet {TABLE} {chain}");
            for entry in &want {
                let _ = writeln!(s, "add rule inet {TABLE} {chain} {}", dispatch_rule(dir, entry));
            }
        }
    }
    for dir in Direction::BOTH {
        let want = d.dispatch(dir);
        for (ifname, chain) in o.map(dir) {
            // A member set that goes takes its elements with it.
            if want.get(ifname) != Some(chain) && wanted_members.contains(chain) {
                let _ = writeln!(
                    s,
                    "delete element inet {TABLE} {} {{ \"{ifname}\" }}",
                    SetName::Members(chain.clone())
                );
            }
        }
    }
    let gone_pairs: Vec<&str> = o
        .hairpin
        .iter()
        .map(String::as_str)
        .filter(|i| !hairpin.contains(i))
        .collect();
    if !gone_pairs.is_empty() {
        let _ = writeln!(
            s,
            "delete element inet {TABLE} {} {{ {} }}",
            SetName::Hairpin,
            pairs(gone_pairs)
        );
    }
    for (name, have) in &o.sets {
        // A learnt set's elements are the learner's, and expire in the kernel.
        if let Some(set) = d.sets.get(name).filter(|s| !s.kind.learnt()) {
            let gone: BTreeSet<Element> = have.difference(&set.elements).copied().collect();
            if !gone.is_empty() {
                element_lines(&mut s, "delete", name, &gone);
            }
        }
    }
    // Chains no longer wanted: the ones that jump first.
    let old: Vec<&Chain> = by_rank(o.chains.keys().filter(|n| !d.chains.contains_key(*n)))
        .into_iter()
        .rev()
        .collect();
    for name in &old {
        let _ = writeln!(s, "flush chain inet {TABLE} {name}");
    }
    for name in &old {
        let _ = writeln!(s, "delete chain inet {TABLE} {name}");
    }
    for name in o.sets.keys().filter(|n| !d.sets.contains_key(*n)) {
        let _ = writeln!(s, "delete set inet {TABLE} {name}");
    }
    for entry in o.member_sets.difference(&wanted_members) {
        let _ = writeln!(s, "delete set inet {TABLE} {}", SetName::Members(entry.clone()));
    }
    for name in o.counters.keys().filter(|n| !d.counters.contains(*n)) {
        let _ = writeln!(s, "delete counter inet {TABLE} {name}");
    }
    (!s.is_empty()).then_some(s)
}

/// The transaction that puts learnt addresses in their sets with their timeouts and
/// names: `None` when there are none.
pub fn learn_script(elements: &[LearntElement]) -> Option<String> {
    let mut s = String::new();
    for e in elements {
        let _ = writeln!(
            s,
            "add element inet {TABLE} {} {{ {} timeout {}ms comment \"{}\" }}",
            e.set,
            e.ip,
            e.timeout_ms,
            e.name.replace('"', "")
        );
    }
    (!s.is_empty()).then_some(s)
}

/// The transaction that adds one pod's [`Addition`], in nft's language (the kernel
/// seam may write the same with nfnetlink instead).
pub fn addition_script(add: &Addition) -> Option<String> {
    let mut s = String::new();
    for (name, set) in &add.new.sets {
        let _ = writeln!(s, "add set inet {TABLE} {name} {{ {} }}", set.kind.declaration());
    }
    for entry in &add.entries {
        let _ = writeln!(
            s,
            "add set inet {TABLE} {} {{ {IFNAME} }}",
            SetName::Members(entry.clone())
        );
    }
    for name in &add.new.counters {
        let _ = writeln!(s, "add counter inet {TABLE} {name}");
    }
    for name in add.new.chains.keys() {
        let _ = writeln!(s, "add chain inet {TABLE} {name}");
    }
    for (name, set) in &add.new.sets {
        if !set.elements.is_empty() {
            element_lines(&mut s, "add", name, &set.elements);
        }
    }
    for (set, elements) in &add.elements {
        element_lines(&mut s, "add", set, elements);
    }
    for chain in by_rank(add.new.chains.keys()) {
        rules_of(&mut s, chain, &add.new.chains[chain]);
    }
    for (ifname, chain) in add.egress.iter().chain(&add.ingress) {
        let _ = writeln!(
            s,
            "add element inet {TABLE} {} {{ \"{ifname}\" }}",
            SetName::Members(chain.clone())
        );
    }
    if !add.hairpin.is_empty() {
        let _ = writeln!(
            s,
            "add element inet {TABLE} {} {{ {} }}",
            SetName::Hairpin,
            pairs(add.hairpin.iter().map(String::as_str))
        );
    }
    for entry in &add.entries {
        let dir = entry.direction();
        let _ = writeln!(
            s,
            "add rule inet {TABLE} {} {}",
            Chain::Dispatch(dir),
            dispatch_rule(dir, entry)
        );
    }
    (!s.is_empty()).then_some(s)
}

/// The transaction of a [`Delta`]: what goes, then what comes.
pub fn delta_script(delta: &Delta) -> Option<String> {
    let mut s = String::new();
    for (set, elements) in &delta.del {
        element_lines(&mut s, "delete", set, elements);
    }
    for (set, elements) in &delta.add {
        element_lines(&mut s, "add", set, elements);
    }
    (!s.is_empty()).then_some(s)
}

fn ip(v: &Value) -> Option<IpAddr> {
    v.as_str()?.parse().ok()
}

/// The last address of `addr/len`.
fn last_of(addr: IpAddr, len: u8) -> Option<IpAddr> {
    let net = ipnet::IpNet::new(addr, len).ok()?;
    Some(net.broadcast())
}

/// One element of `nft -j` output, in the canonical form of a set of `kind`.
fn element(kind: SetKind, v: &Value) -> Option<Element> {
    // An element with its own attributes (counter, timeout) wraps its value.
    let v = v.get("elem").and_then(|e| e.get("val")).unwrap_or(v);
    match kind {
        SetKind::Addr4 | SetKind::Addr6 | SetKind::Learnt4 | SetKind::Learnt6 => ip(v).map(Element::Addr),
        SetKind::Net4 | SetKind::Net6 => {
            if let Some(a) = ip(v) {
                return Some(Element::Range(a, a));
            }
            if let Some(p) = v.get("prefix") {
                let a = ip(&p["addr"])?;
                let len = u8::try_from(p["len"].as_u64()?).ok()?;
                return Some(Element::Range(a, last_of(a, len)?));
            }
            let r = v.get("range")?.as_array()?;
            Some(Element::Range(ip(r.first()?)?, ip(r.get(1)?)?))
        }
        SetKind::AddrPort4 | SetKind::AddrPort6 => {
            let c = v.get("concat")?.as_array()?;
            let proto = match c.get(1)? {
                Value::String(s) => PortProtocol::parse(Some(s))?,
                Value::Number(n) => PortProtocol::ALL
                    .into_iter()
                    .find(|p| u64::from(p.number()) == n.as_u64().unwrap_or(0))?,
                _ => return None,
            };
            Some(Element::AddrPort(
                ip(c.first()?)?,
                proto,
                u16::try_from(c.get(2)?.as_u64()?).ok()?,
            ))
        }
    }
}

fn kind_of(set: &Value) -> Option<SetKind> {
    let flag = |name: &str| set["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == name));
    let interval = flag("interval");
    match &set["type"] {
        Value::String(t) if t == "ipv4_addr" && flag("timeout") => Some(SetKind::Learnt4),
        Value::String(t) if t == "ipv6_addr" && flag("timeout") => Some(SetKind::Learnt6),
        Value::String(t) if t == "ipv4_addr" => Some(if interval { SetKind::Net4 } else { SetKind::Addr4 }),
        Value::String(t) if t == "ipv6_addr" => Some(if interval { SetKind::Net6 } else { SetKind::Addr6 }),
        Value::Array(parts) if parts.first().is_some_and(|p| p == "ipv4_addr") => Some(SetKind::AddrPort4),
        Value::Array(parts) if parts.first().is_some_and(|p| p == "ipv6_addr") => Some(SetKind::AddrPort6),
        _ => None,
    }
}

/// Reads `nft -j list table inet weft-policy` back. What weft never writes (an object
/// whose name is not one of weft's, a set of another type, an element or base rule it
/// cannot read) makes the table count as changed, and the repair writes it again.
pub fn parse(json: &str) -> Result<Observed, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("reading nft -j output: {e}"))?;
    let mut o = Observed {
        present: true,
        ..Observed::default()
    };
    let mut base: BTreeMap<Direction, Vec<Option<Rule>>> = BTreeMap::new();
    let mut base_hooks = 0;
    let mut unreadable = false;
    for obj in v["nftables"].as_array().into_iter().flatten() {
        if let Some(set) = obj.get("set") {
            let Some(name) = set["name"].as_str().and_then(SetName::parse) else {
                unreadable = true;
                continue;
            };
            match (&name, &set["type"]) {
                (SetName::Members(entry), Value::String(t)) if t == "ifname" => {
                    let map = match entry.direction() {
                        Direction::Egress => &mut o.egress,
                        Direction::Ingress => &mut o.ingress,
                    };
                    for e in set["elem"].as_array().into_iter().flatten() {
                        match e.as_str() {
                            Some(ifname) => {
                                map.insert(ifname.to_string(), entry.clone());
                            }
                            None => unreadable = true,
                        }
                    }
                    o.member_sets.insert(entry.clone());
                }
                (SetName::Hairpin, Value::Array(t)) if t.len() == 2 && t.iter().all(|x| x == "ifname") => {
                    for e in set["elem"].as_array().into_iter().flatten() {
                        let pair: Vec<&str> = e
                            .get("concat")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        match pair.as_slice() {
                            [a, b] if a == b => {
                                o.hairpin.insert(a.to_string());
                            }
                            _ => unreadable = true,
                        }
                    }
                }
                (SetName::Data { .. }, _) => {
                    let Some(kind) = kind_of(set) else {
                        unreadable = true;
                        continue;
                    };
                    let mut elems = BTreeSet::new();
                    for e in set["elem"].as_array().into_iter().flatten() {
                        match element(kind, e) {
                            Some(x) => {
                                if let (true, Element::Addr(ip)) = (kind.learnt(), x) {
                                    let el = &e["elem"];
                                    let name = el["comment"].as_str().unwrap_or_default();
                                    let left = el["expires"].as_u64().unwrap_or(0);
                                    if !name.is_empty() && left > 0 {
                                        o.learnt
                                            .push((ip, name.to_string(), u32::try_from(left).unwrap_or(u32::MAX)));
                                    }
                                }
                                elems.insert(x);
                            }
                            None => unreadable = true,
                        }
                    }
                    o.sets.insert(name, elems);
                }
                _ => unreadable = true,
            }
        } else if obj.get("map").is_some() {
            // weft writes no map (an older weftd's table): written again whole.
            unreadable = true;
        } else if let Some(chain) = obj.get("chain") {
            match chain["name"].as_str().and_then(Chain::parse) {
                Some(Chain::Base(dir)) => {
                    let right = chain["hook"] == "forward"
                        && chain["type"] == "filter"
                        && chain["prio"].as_i64() == Some(priority(dir))
                        && chain["policy"] == "accept";
                    if right {
                        base_hooks += 1;
                        base.entry(dir).or_default();
                    } else {
                        unreadable = true;
                    }
                }
                Some(Chain::Dispatch(dir)) => {
                    o.dispatch.entry(dir).or_insert_with(|| Some(BTreeSet::new()));
                }
                Some(c) if chain.get("hook").is_none() => {
                    o.chains.entry(c).or_insert_with(|| Some(Vec::new()));
                }
                _ => unreadable = true,
            }
        } else if let Some(rule) = obj.get("rule") {
            let read = rule["expr"].as_array().and_then(|e| Rule::from_json(e));
            match rule["chain"].as_str().and_then(Chain::parse) {
                Some(Chain::Base(dir)) => base.entry(dir).or_default().push(read),
                Some(Chain::Dispatch(dir)) => {
                    let entry = read.filter(|r| r.target().is_some_and(|t| *r == dispatch_rule(dir, t)));
                    let slot = o.dispatch.entry(dir).or_insert_with(|| Some(BTreeSet::new()));
                    match (slot.as_mut(), entry.and_then(|r| r.target().cloned())) {
                        (Some(set), Some(target)) => {
                            set.insert(target);
                        }
                        // A rule weft would not write: the dispatch is written again.
                        _ => *slot = None,
                    }
                }
                Some(c) => {
                    let slot = o.chains.entry(c).or_insert_with(|| Some(Vec::new()));
                    match (slot.as_mut(), read) {
                        (Some(rules), Some(r)) => rules.push(r),
                        _ => *slot = None,
                    }
                }
                None => unreadable = true,
            }
        } else if let Some(c) = obj.get("counter") {
            match c["name"].as_str().and_then(Counter::parse) {
                Some(name) => {
                    o.counters.insert(name, c["packets"].as_u64().unwrap_or(0));
                }
                None => unreadable = true,
            }
        }
    }
    let base_right = Direction::BOTH.iter().all(|dir| {
        base.get(dir)
            .is_some_and(|rules| rules.iter().cloned().collect::<Option<Vec<_>>>() == Some(base_rules(*dir)))
    });
    o.base_ok = !unreadable && base_hooks == 2 && base_right && o.dispatch.len() == 2;
    Ok(o)
}

#[cfg(test)]
mod tests;
