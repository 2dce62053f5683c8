//! The table in nft's language: the whole table for a first install or a repair
//! ([`install_script`]), the one transaction that takes the kernel from what it holds
//! to a plan ([`diff`]), and what the kernel holds, read back from `nft -j`
//! ([`parse`]). Every script is applied by `nft -f` in one atomic transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::IpAddr;

use serde_json::Value;
use weft_topology::PortProtocol;

use crate::plan::{ALLOWED_EGRESS_MARK, ALLOWED_INGRESS_MARK, Desired, Element, SetKind, TABLE};

/// The base chains and the (empty) dispatch chains, the same on every node. A
/// connection whose first packet a direction allowed is accepted on its conntrack mark,
/// before any dispatch.
fn base() -> String {
    format!(
        "  chain {de} {{ }}
  chain {di} {{ }}
  chain egress {{
    type filter hook forward priority -5; policy accept;
    ct state established,related accept
    ct mark and {e:#010x} == {e:#010x} accept
    jump {de}
  }}
  chain ingress {{
    type filter hook forward priority -4; policy accept;
    ct state established,related accept
    ct mark and {i:#010x} == {i:#010x} accept
    jump {di}
  }}
",
        de = dispatch_chain(true),
        di = dispatch_chain(false),
        e = ALLOWED_EGRESS_MARK,
        i = ALLOWED_INGRESS_MARK
    )
}

/// The regular chain that sends a direction's isolated pods to their entry chains: one
/// rule per entry chain, matching the host interfaces in its member set.
///
/// Why sets and a rule per entry, not one verdict map from host interface to chain: a
/// map element that jumps makes the kernel validate the whole table at commit, every
/// chain again through every element (0.2 ms per ADD with 100 pods on the node and 242
/// chains, growing with both). A plain set element needs no validation. The price is a
/// set lookup per distinct entry chain of the node for a connection's first packet.
fn dispatch_chain(egress: bool) -> &'static str {
    if egress { "egress_pods" } else { "ingress_pods" }
}

/// The set of host interfaces whose traffic goes to entry chain `entry` (its pods).
pub(crate) fn member_set(entry: &str) -> String {
    format!("m{entry}")
}

/// The rule of `entry` in its direction's dispatch chain.
fn dispatch_rule(egress: bool, entry: &str) -> String {
    let side = if egress { "iifname" } else { "oifname" };
    format!("{side} @{} jump {entry}", member_set(entry))
}

/// A direction's entry chains, each with the host interfaces it serves.
fn members(map: &BTreeMap<String, String>) -> BTreeMap<&str, BTreeSet<&str>> {
    let mut out: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (ifname, chain) in map {
        out.entry(chain.as_str()).or_default().insert(ifname.as_str());
    }
    out
}

fn ifname_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the kernel's table holds, as far as the diff needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Whether the table exists.
    pub present: bool,
    /// Whether the base chains and maps are as weft writes them.
    pub base_ok: bool,
    /// Sets and their elements.
    pub sets: BTreeMap<String, BTreeSet<Element>>,
    /// Regular chains and how many rules each holds (a chain's name says what its
    /// rules are, so a count tells a chain someone changed).
    pub chains: BTreeMap<String, usize>,
    /// Named counters with their packet counts.
    pub counters: BTreeMap<String, u64>,
    /// The egress dispatch: host interface to entry chain (from the member sets).
    pub egress: BTreeMap<String, String>,
    /// The ingress dispatch.
    pub ingress: BTreeMap<String, String>,
    /// The member sets, by name (empty ones too).
    pub member_sets: BTreeSet<String>,
    /// The entry chains the egress dispatch chain's rules jump to.
    pub egress_entries: BTreeSet<String>,
    /// The same for ingress.
    pub ingress_entries: BTreeSet<String>,
}

impl Observed {
    /// What the kernel holds once `d` was applied (the base of the next incremental
    /// change, between two reads of the kernel).
    pub fn after(d: &Desired) -> Self {
        Observed {
            present: true,
            base_ok: true,
            sets: d.sets.iter().map(|(k, v)| (k.clone(), v.elements.clone())).collect(),
            chains: d.chains.iter().map(|(k, v)| (k.clone(), v.len())).collect(),
            counters: d.counters.iter().map(|c| (c.clone(), 0)).collect(),
            egress: d.egress.clone(),
            ingress: d.ingress.clone(),
            member_sets: members(&d.egress)
                .into_keys()
                .chain(members(&d.ingress).into_keys())
                .map(member_set)
                .collect(),
            egress_entries: members(&d.egress).into_keys().map(str::to_string).collect(),
            ingress_entries: members(&d.ingress).into_keys().map(str::to_string).collect(),
        }
    }
}

/// Elements go in chunks: one `add element` line of a million elements is a script
/// nft parses slowly, and chunks keep each line readable in a debug dump.
const CHUNK: usize = 4096;

fn element_lines(out: &mut String, verb: &str, set: &str, list: &BTreeSet<Element>) {
    let v: Vec<&Element> = list.iter().collect();
    for chunk in v.chunks(CHUNK) {
        let text: Vec<String> = chunk.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "{verb} element inet {TABLE} {set} {{ {} }}", text.join(", "));
    }
}

/// The script that replaces the table with one holding exactly `d`, atomically.
pub fn install_script(d: &Desired) -> String {
    let mut s = format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    for (name, set) in &d.sets {
        let _ = writeln!(s, "  set {name} {{ {} }}", set.kind.declaration());
    }
    let dispatch = [(true, members(&d.egress)), (false, members(&d.ingress))];
    for (_, entries) in &dispatch {
        for entry in entries.keys() {
            let _ = writeln!(s, "  set {} {{ type ifname; }}", member_set(entry));
        }
    }
    for name in &d.counters {
        let _ = writeln!(s, "  counter {name} {{ }}");
    }
    for name in d.chains.keys() {
        let _ = writeln!(s, "  chain {name} {{ }}");
    }
    s.push_str(&base());
    s.push_str("}\n");
    for (name, set) in &d.sets {
        if !set.elements.is_empty() {
            element_lines(&mut s, "add", name, &set.elements);
        }
    }
    for (_, entries) in &dispatch {
        for (entry, ifnames) in entries {
            let _ = writeln!(
                s,
                "add element inet {TABLE} {} {{ {} }}",
                member_set(entry),
                ifname_list(ifnames.iter().copied())
            );
        }
    }
    for (name, rules) in &d.chains {
        for r in rules {
            let _ = writeln!(s, "add rule inet {TABLE} {name} {r}");
        }
    }
    for (egress, entries) in &dispatch {
        for entry in entries.keys() {
            let _ = writeln!(
                s,
                "add rule inet {TABLE} {} {}",
                dispatch_chain(*egress),
                dispatch_rule(*egress, entry)
            );
        }
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
    let want = [
        (true, members(&d.egress), &o.egress, &o.egress_entries),
        (false, members(&d.ingress), &o.ingress, &o.ingress_entries),
    ];
    let wanted_members: BTreeSet<String> = want
        .iter()
        .flat_map(|(_, entries, _, _)| entries.keys().map(|e| member_set(e)))
        .collect();
    for name in &wanted_members {
        if !o.member_sets.contains(name) {
            let _ = writeln!(s, "add set inet {TABLE} {name} {{ type ifname; }}");
        }
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
    for (_, entries, have, _) in &want {
        for (entry, ifnames) in entries {
            let new: Vec<&str> = ifnames
                .iter()
                .copied()
                .filter(|i| have.get(*i).map(String::as_str) != Some(*entry))
                .collect();
            if !new.is_empty() {
                let _ = writeln!(
                    s,
                    "add element inet {TABLE} {} {{ {} }}",
                    member_set(entry),
                    ifname_list(new)
                );
            }
        }
    }
    // Policy chains before group chains (a group chain's rules jump to them).
    let order = |name: &String| (name.starts_with('g'), name.clone());
    let mut chains: Vec<&String> = d.chains.keys().collect();
    chains.sort_by_key(|n| order(n));
    for name in chains {
        let rules = &d.chains[name];
        match o.chains.get(name) {
            Some(n) if *n == rules.len() => continue,
            Some(_) => {
                let _ = writeln!(s, "flush chain inet {TABLE} {name}");
            }
            None => {}
        }
        for r in rules {
            let _ = writeln!(s, "add rule inet {TABLE} {name} {r}");
        }
    }
    // The dispatch is rewritten whole when its entry chains change (only a full pass
    // adds or removes an entry chain).
    for (egress, entries, _, dispatched) in &want {
        if !entries.keys().copied().eq(dispatched.iter().map(String::as_str)) {
            let chain = dispatch_chain(*egress);
            let _ = writeln!(s, "flush chain inet {TABLE} {chain}");
            for entry in entries.keys() {
                let _ = writeln!(s, "add rule inet {TABLE} {chain} {}", dispatch_rule(*egress, entry));
            }
        }
    }
    for (egress, map) in [(true, &d.egress), (false, &d.ingress)] {
        let have = if egress { &o.egress } else { &o.ingress };
        for (ifname, chain) in have {
            let set = member_set(chain);
            // A member set that goes takes its elements with it.
            if map.get(ifname) != Some(chain) && wanted_members.contains(&set) {
                let _ = writeln!(s, "delete element inet {TABLE} {set} {{ \"{ifname}\" }}");
            }
        }
    }
    for (name, have) in &o.sets {
        if let Some(set) = d.sets.get(name) {
            let gone: BTreeSet<Element> = have.difference(&set.elements).copied().collect();
            if !gone.is_empty() {
                element_lines(&mut s, "delete", name, &gone);
            }
        }
    }
    // Chains no longer wanted: group chains first (they jump to policy chains).
    let mut old: Vec<&String> = o.chains.keys().filter(|n| !d.chains.contains_key(*n)).collect();
    old.sort_by_key(|n| std::cmp::Reverse(order(n)));
    for name in &old {
        let _ = writeln!(s, "flush chain inet {TABLE} {name}");
    }
    for name in &old {
        let _ = writeln!(s, "delete chain inet {TABLE} {name}");
    }
    for name in o.sets.keys().filter(|n| !d.sets.contains_key(*n)) {
        let _ = writeln!(s, "delete set inet {TABLE} {name}");
    }
    for name in o.member_sets.difference(&wanted_members) {
        let _ = writeln!(s, "delete set inet {TABLE} {name}");
    }
    for name in o.counters.keys().filter(|n| !d.counters.contains(*n)) {
        let _ = writeln!(s, "delete counter inet {TABLE} {name}");
    }
    (!s.is_empty()).then_some(s)
}

/// The transaction that adds one pod's [`crate::plan::Addition`]: elements only.
pub fn addition_script(add: &crate::plan::Addition) -> Option<String> {
    let mut s = String::new();
    for (set, elements) in &add.elements {
        element_lines(&mut s, "add", set, elements);
    }
    for map in [&add.egress, &add.ingress] {
        for (ifname, chain) in map {
            let _ = writeln!(s, "add element inet {TABLE} {} {{ \"{ifname}\" }}", member_set(chain));
        }
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
        SetKind::Addr4 | SetKind::Addr6 => ip(v).map(Element::Addr),
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
    let interval = set["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "interval"));
    match &set["type"] {
        Value::String(t) if t == "ipv4_addr" => Some(if interval { SetKind::Net4 } else { SetKind::Addr4 }),
        Value::String(t) if t == "ipv6_addr" => Some(if interval { SetKind::Net6 } else { SetKind::Addr6 }),
        Value::Array(parts) if parts.first().is_some_and(|p| p == "ipv4_addr") => Some(SetKind::AddrPort4),
        Value::Array(parts) if parts.first().is_some_and(|p| p == "ipv6_addr") => Some(SetKind::AddrPort6),
        _ => None,
    }
}

impl Observed {
    /// Reads member set `name` (JSON `set`) into the dispatch it records; `false` when
    /// it is no set weft writes.
    fn member(&mut self, name: &str, set: &Value) -> bool {
        let Some(entry) = name.strip_prefix('m') else {
            return false;
        };
        let map = match entry.chars().last() {
            Some('e') => &mut self.egress,
            Some('i') => &mut self.ingress,
            _ => return false,
        };
        for e in set["elem"].as_array().into_iter().flatten() {
            let Some(ifname) = e.as_str() else { return false };
            map.insert(ifname.to_string(), entry.to_string());
        }
        self.member_sets.insert(name.to_string());
        true
    }
}

/// The entry chain a dispatch rule (JSON `rule`) jumps to, when it is the rule weft
/// writes for it: the member set of that chain matched, then the jump.
fn dispatch_target(rule: &Value, egress: bool) -> Option<String> {
    let expr = rule["expr"].as_array()?;
    let [matched, jump] = expr.as_slice() else { return None };
    let target = jump["jump"]["target"].as_str()?;
    let side = if egress { "iifname" } else { "oifname" };
    let set = matched["match"]["right"].as_str()?;
    (matched["match"]["left"]["meta"]["key"] == side && set.strip_prefix('@') == Some(member_set(target).as_str()))
        .then(|| target.to_string())
}

/// Reads `nft -j list table inet weft-policy` back. What weft never writes (a set of
/// another type, an element it cannot read) makes the table count as changed, and the
/// repair writes it again.
pub fn parse(json: &str) -> Result<Observed, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("reading nft -j output: {e}"))?;
    let mut o = Observed {
        present: true,
        ..Observed::default()
    };
    let mut base_rules: BTreeMap<String, usize> = BTreeMap::new();
    let mut dispatch_chains = 0;
    let mut unreadable = false;
    for obj in v["nftables"].as_array().into_iter().flatten() {
        if let Some(set) = obj.get("set") {
            let name = set["name"].as_str().unwrap_or_default().to_string();
            if set["type"] == "ifname" {
                if !o.member(&name, set) {
                    unreadable = true;
                }
                continue;
            }
            let Some(kind) = kind_of(set) else {
                unreadable = true;
                continue;
            };
            let mut elems = BTreeSet::new();
            for e in set["elem"].as_array().into_iter().flatten() {
                match element(kind, e) {
                    Some(x) => {
                        elems.insert(x);
                    }
                    None => unreadable = true,
                }
            }
            o.sets.insert(name, elems);
        } else if obj.get("map").is_some() {
            // weft writes no map (an older weftd's table): written again whole.
            unreadable = true;
        } else if let Some(chain) = obj.get("chain") {
            let name = chain["name"].as_str().unwrap_or_default().to_string();
            if chain.get("hook").is_some() {
                base_rules.entry(name).or_default();
            } else if name == dispatch_chain(true) || name == dispatch_chain(false) {
                dispatch_chains += 1;
            } else {
                o.chains.entry(name).or_default();
            }
        } else if let Some(rule) = obj.get("rule") {
            let chain = rule["chain"].as_str().unwrap_or_default().to_string();
            if let Some(n) = base_rules.get_mut(&chain) {
                *n += 1;
            } else if chain == dispatch_chain(true) || chain == dispatch_chain(false) {
                let egress = chain == dispatch_chain(true);
                let entries = if egress {
                    &mut o.egress_entries
                } else {
                    &mut o.ingress_entries
                };
                // A rule weft would not write counts as an entry no plan has, so the
                // dispatch is written again.
                entries.insert(dispatch_target(rule, egress).unwrap_or_default());
            } else {
                *o.chains.entry(chain).or_default() += 1;
            }
        } else if let Some(c) = obj.get("counter") {
            let name = c["name"].as_str().unwrap_or_default().to_string();
            o.counters.insert(name, c["packets"].as_u64().unwrap_or(0));
        }
    }
    o.base_ok = !unreadable
        && dispatch_chains == 2
        && base_rules.get("egress") == Some(&3)
        && base_rules.get("ingress") == Some(&3)
        && base_rules.len() == 2;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SetSpec;

    fn desired() -> Desired {
        let mut d = Desired::default();
        d.sets.insert(
            "pa_pods4".into(),
            SetSpec {
                kind: SetKind::Addr4,
                elements: [Element::Addr("10.0.0.1".parse().unwrap())].into(),
            },
        );
        d.sets.insert(
            "pa_nets4".into(),
            SetSpec {
                kind: SetKind::Net4,
                elements: [Element::Range(
                    "10.1.0.0".parse().unwrap(),
                    "10.1.255.255".parse().unwrap(),
                )]
                .into(),
            },
        );
        d.counters.insert("apa".into());
        d.chains.insert(
            "pa".into(),
            vec!["ip saddr @pa_pods4 counter name \"apa\" accept".into()],
        );
        d.chains.insert("gxe".into(), vec!["jump pa".into(), "drop".into()]);
        d.ingress.insert("weft1".into(), "gxe".into());
        d
    }

    #[test]
    fn nothing_to_do_after_applying_the_plan() {
        let d = desired();
        assert_eq!(diff(&d, &Observed::after(&d)), None);
        assert!(
            diff(&d, &Observed::default())
                .unwrap()
                .starts_with("table inet weft-policy {}\ndelete table")
        );
    }

    #[test]
    fn a_pod_that_comes_changes_elements_only() {
        let before = desired();
        let mut after = before.clone();
        after
            .sets
            .get_mut("pa_pods4")
            .unwrap()
            .elements
            .insert(Element::Addr("10.0.0.2".parse().unwrap()));
        after.ingress.insert("weft2".into(), "gxe".into());
        let s = diff(&after, &Observed::after(&before)).unwrap();
        assert_eq!(
            s,
            "add element inet weft-policy pa_pods4 { 10.0.0.2 }\n\
             add element inet weft-policy mgxe { \"weft2\" }\n"
        );
    }

    /// The dispatch chain gets a rule per entry chain, rewritten when the entry chains
    /// change; a member set goes with its entry chain, after the rule that used it.
    #[test]
    fn the_dispatch_follows_the_entry_chains() {
        let before = desired();
        let install = install_script(&before);
        assert!(install.contains("  set mgxe { type ifname; }\n"), "{install}");
        assert!(
            install.contains("add element inet weft-policy mgxe { \"weft1\" }\n"),
            "{install}"
        );
        assert!(
            install.contains("add rule inet weft-policy ingress_pods oifname @mgxe jump gxe\n"),
            "{install}"
        );
        let mut after = before.clone();
        after.chains.insert("gye".into(), vec!["drop".into()]);
        after.ingress.insert("weft1".into(), "gye".into());
        after.chains.remove("gxe");
        let s = diff(&after, &Observed::after(&before)).unwrap();
        let lines: Vec<&str> = s.lines().collect();
        let pos = |needle: &str| {
            lines
                .iter()
                .position(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("{needle} in {s}"))
        };
        assert!(pos("add set inet weft-policy mgye { type ifname; }") < pos("add element inet weft-policy mgye"));
        assert!(
            pos("add element inet weft-policy mgye { \"weft1\" }") < pos("flush chain inet weft-policy ingress_pods")
        );
        assert!(
            pos("flush chain inet weft-policy ingress_pods")
                < pos("add rule inet weft-policy ingress_pods oifname @mgye jump gye")
        );
        assert!(pos("add rule inet weft-policy ingress_pods oifname @mgye") < pos("delete chain inet weft-policy gxe"));
        assert!(pos("delete chain inet weft-policy gxe") < pos("delete set inet weft-policy mgxe"));
        assert!(
            !s.contains("delete element inet weft-policy mgxe"),
            "the set goes whole: {s}"
        );
        assert_eq!(diff(&after, &Observed::after(&after)), None);
    }

    #[test]
    fn gone_chains_go_after_their_users_and_a_changed_chain_is_refilled() {
        let before = desired();
        let after = Desired {
            counters: before.counters.clone(),
            ..Desired::default()
        };
        let s = diff(&after, &Observed::after(&before)).unwrap();
        let lines: Vec<&str> = s.lines().collect();
        let pos = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap();
        assert!(pos("flush chain inet weft-policy ingress_pods") < pos("flush chain inet weft-policy gxe"));
        assert!(pos("delete chain inet weft-policy gxe") < pos("delete set inet weft-policy mgxe"));
        assert!(pos("flush chain inet weft-policy gxe") < pos("delete chain inet weft-policy gxe"));
        assert!(pos("delete chain inet weft-policy gxe") < pos("delete chain inet weft-policy pa"));
        assert!(pos("delete chain inet weft-policy pa") < pos("delete set inet weft-policy pa_pods4"));
        // A rule deleted behind weft's back: the chain is flushed and filled again.
        let d = desired();
        let mut o = Observed::after(&d);
        o.chains.insert("gxe".into(), 1);
        let s = diff(&d, &o).unwrap();
        assert_eq!(
            s,
            "flush chain inet weft-policy gxe\nadd rule inet weft-policy gxe jump pa\nadd rule inet weft-policy gxe drop\n"
        );
    }

    #[test]
    fn nft_json_reads_back() {
        let json = r#"{"nftables": [
          {"metainfo": {"json_schema_version": 1}},
          {"table": {"family": "inet", "name": "weft-policy"}},
          {"set": {"family": "inet", "name": "pa_pods4", "table": "weft-policy", "type": "ipv4_addr", "elem": ["10.0.0.1"]}},
          {"set": {"family": "inet", "name": "pa_nets4", "table": "weft-policy", "type": "ipv4_addr", "flags": ["interval"],
                   "elem": [{"prefix": {"addr": "10.1.0.0", "len": 16}}, {"range": ["10.2.0.1", "10.2.0.9"]}, "10.3.0.1"]}},
          {"set": {"family": "inet", "name": "np", "table": "weft-policy", "type": ["ipv4_addr", "inet_proto", "inet_service"],
                   "elem": [{"concat": ["10.0.0.1", "tcp", 80]}]}},
          {"set": {"family": "inet", "name": "mgxe", "table": "weft-policy", "type": "ifname", "elem": ["weft1"]}},
          {"counter": {"family": "inet", "name": "apa", "table": "weft-policy", "packets": 7, "bytes": 420}},
          {"chain": {"family": "inet", "table": "weft-policy", "name": "egress", "type": "filter", "hook": "forward", "prio": -5, "policy": "accept"}},
          {"chain": {"family": "inet", "table": "weft-policy", "name": "ingress", "type": "filter", "hook": "forward", "prio": -4, "policy": "accept"}},
          {"chain": {"family": "inet", "table": "weft-policy", "name": "gxe"}},
          {"chain": {"family": "inet", "table": "weft-policy", "name": "egress_pods"}},
          {"chain": {"family": "inet", "table": "weft-policy", "name": "ingress_pods"}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "egress_pods", "expr": [
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "@mgxe"}},
            {"jump": {"target": "gxe"}}]}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "egress", "expr": []}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "egress", "expr": []}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "egress", "expr": []}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "ingress", "expr": []}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "ingress", "expr": []}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "ingress", "expr": []}},
          {"rule": {"family": "inet", "table": "weft-policy", "chain": "gxe", "expr": []}}
        ]}"#;
        let o = parse(json).unwrap();
        assert!(o.base_ok);
        assert_eq!(o.chains.get("gxe"), Some(&1));
        assert_eq!(o.counters.get("apa"), Some(&7));
        assert_eq!(o.egress.get("weft1").map(String::as_str), Some("gxe"));
        assert_eq!(o.egress_entries, ["gxe".to_string()].into());
        assert_eq!(o.member_sets, ["mgxe".to_string()].into());
        assert!(!o.sets.contains_key("mgxe"), "a member set is no set of the plan's");
        let nets: Vec<String> = o.sets["pa_nets4"].iter().map(ToString::to_string).collect();
        assert_eq!(nets, ["10.1.0.0-10.1.255.255", "10.2.0.1-10.2.0.9", "10.3.0.1"]);
        assert_eq!(o.sets["np"].iter().next().unwrap().to_string(), "10.0.0.1 . tcp . 80");
        let broken = json.replace(
            r#""chain": "ingress", "expr": []}},"#,
            r#""chain": "gxe", "expr": []}},"#,
        );
        assert!(!parse(&broken).unwrap().base_ok, "a base rule gone");
        let older = json.replace(
            r#"{"set": {"family": "inet", "name": "mgxe", "table": "weft-policy", "type": "ifname", "elem": ["weft1"]}},"#,
            r#"{"map": {"family": "inet", "name": "egress_pods", "table": "weft-policy", "type": "ifname", "map": "verdict"}},"#,
        );
        assert_ne!(older, json);
        assert!(
            !parse(&older).unwrap().base_ok,
            "an older weftd's verdict map: written again"
        );
        let altered = json.replace(
            r#""key": "iifname"}}, "right": "@mgxe""#,
            r#""key": "oifname"}}, "right": "@mgxe""#,
        );
        assert_eq!(
            parse(&altered).unwrap().egress_entries,
            [String::new()].into(),
            "a rule weft does not write"
        );
    }
}
