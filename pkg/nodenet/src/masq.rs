//! Egress masquerade (ip-masq-agent semantics, as kindnet does it with nftables): pod
//! traffic to anything outside every node's pod ranges and the configured exceptions
//! leaves with the node's address. It lives in a table of weft's own, `inet
//! weft-egress`, whose sets change element by element as nodes come and go; the table
//! is written whole only when it is missing or not in weft's shape.

use std::collections::BTreeSet;

use ipnet::IpNet;
use serde_json::Value;

use crate::model::MasqSets;

/// Name of the masquerade table (family `inet`).
pub const TABLE: &str = "weft-egress";

const SETS: [(&str, bool, bool); 4] = [
    // (name, holds pod ranges (else exceptions), IPv6)
    ("pods_v4", true, false),
    ("pods_v6", true, true),
    ("keep_v4", false, false),
    ("keep_v6", false, true),
];

/// What the kernel holds of the masquerade table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasqFound {
    /// No such table.
    Absent,
    /// A table of that name not in weft's shape (a chain or set missing or changed).
    Malformed,
    /// weft's table with these sets.
    Sets(MasqSets),
}

/// One change to the masquerade table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasqChange {
    /// Write the table whole, holding these sets.
    Install(MasqSets),
    /// Add and remove set elements.
    Update {
        /// Elements to add.
        add: MasqSets,
        /// Elements to remove.
        delete: MasqSets,
    },
    /// Remove the table (masquerade turned off).
    Remove,
}

impl MasqChange {
    /// How many set elements and tables it touches, for the change counters.
    pub fn size(&self) -> (u64, u64) {
        let n = |s: &MasqSets| (s.pods.len() + s.exceptions.len()) as u64;
        match self {
            MasqChange::Install(s) => (n(s).max(1), 0),
            MasqChange::Update { add, delete } => (n(add), n(delete)),
            MasqChange::Remove => (0, 1),
        }
    }
}

/// The change that takes the table from `found` to `want` (`None`: masquerade off), if
/// any.
pub fn masq_diff(want: Option<&MasqSets>, found: &MasqFound) -> Option<MasqChange> {
    match (want, found) {
        (None, MasqFound::Absent) => None,
        (None, _) => Some(MasqChange::Remove),
        (Some(w), MasqFound::Absent | MasqFound::Malformed) => Some(MasqChange::Install(w.clone())),
        (Some(w), MasqFound::Sets(f)) => {
            let sub = |a: &BTreeSet<IpNet>, b: &BTreeSet<IpNet>| a.difference(b).copied().collect::<BTreeSet<_>>();
            let add = MasqSets {
                pods: sub(&w.pods, &f.pods),
                exceptions: sub(&w.exceptions, &f.exceptions),
            };
            let delete = MasqSets {
                pods: sub(&f.pods, &w.pods),
                exceptions: sub(&f.exceptions, &w.exceptions),
            };
            if add == MasqSets::default() && delete == MasqSets::default() {
                None
            } else {
                Some(MasqChange::Update { add, delete })
            }
        }
    }
}

fn members(sets: &MasqSets, pods: bool, v6: bool) -> impl Iterator<Item = &IpNet> {
    let set = if pods { &sets.pods } else { &sets.exceptions };
    set.iter().filter(move |n| n.addr().is_ipv6() == v6)
}

fn element_lines(verb: &str, sets: &MasqSets) -> String {
    let mut s = String::new();
    for (name, pods, v6) in SETS {
        let elems: Vec<String> = members(sets, pods, v6).map(ToString::to_string).collect();
        if !elems.is_empty() {
            s.push_str(&format!(
                "{verb} element inet {TABLE} {name} {{ {} }}\n",
                elems.join(", ")
            ));
        }
    }
    s
}

/// The nft script for a change, applied by `nft -f -` in one transaction.
pub fn script(change: &MasqChange) -> String {
    match change {
        MasqChange::Install(sets) => {
            let mut s = format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
            for (name, _, v6) in SETS {
                let ty = if v6 { "ipv6_addr" } else { "ipv4_addr" };
                s.push_str(&format!("  set {name} {{ type {ty} ; flags interval ; }}\n"));
            }
            s.push_str(
                "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n\
                 \x20   ip saddr @pods_v4 ip daddr != @pods_v4 ip daddr != @keep_v4 masquerade\n\
                 \x20   ip6 saddr @pods_v6 ip6 daddr != @pods_v6 ip6 daddr != @keep_v6 masquerade\n  }\n}\n",
            );
            s.push_str(&element_lines("add", sets));
            s
        }
        MasqChange::Update { add, delete } => {
            // Deletions first: a range that shrank or grew is removed before its new
            // form is added, so the interval sets never see an overlap.
            let mut s = element_lines("delete", delete);
            s.push_str(&element_lines("add", add));
            s
        }
        MasqChange::Remove => format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\n"),
    }
}

fn element(v: &Value, v6: bool) -> Option<IpNet> {
    match v {
        Value::String(s) => {
            let ip: std::net::IpAddr = s.parse().ok()?;
            (ip.is_ipv6() == v6).then(|| IpNet::from(ip))
        }
        Value::Object(o) => {
            let p = o.get("prefix")?;
            let addr: std::net::IpAddr = p.get("addr")?.as_str()?.parse().ok()?;
            let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
            IpNet::new(addr, len).ok().filter(|_| addr.is_ipv6() == v6)
        }
        _ => None,
    }
}

/// Reads `nft -j list table inet weft-egress`: the sets if the table is in weft's shape.
pub fn parse(json: &str) -> MasqFound {
    let Ok(v) = serde_json::from_str::<Value>(json) else {
        return MasqFound::Malformed;
    };
    let Some(items) = v.get("nftables").and_then(Value::as_array) else {
        return MasqFound::Malformed;
    };
    let mut sets = MasqSets::default();
    let mut seen_sets = 0;
    let mut rules = 0;
    let mut chain = false;
    for item in items {
        if let Some(set) = item.get("set") {
            let name = set.get("name").and_then(Value::as_str).unwrap_or_default();
            let Some((_, pods, v6)) = SETS.iter().find(|(n, _, _)| *n == name) else {
                return MasqFound::Malformed;
            };
            let interval = set
                .get("flags")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x == "interval"));
            let ty = if *v6 { "ipv6_addr" } else { "ipv4_addr" };
            if !interval || set.get("type").and_then(Value::as_str) != Some(ty) {
                return MasqFound::Malformed;
            }
            seen_sets += 1;
            for e in set.get("elem").and_then(Value::as_array).into_iter().flatten() {
                let Some(net) = element(e, *v6) else {
                    return MasqFound::Malformed;
                };
                if *pods {
                    sets.pods.insert(net);
                } else {
                    sets.exceptions.insert(net);
                }
            }
        } else if let Some(c) = item.get("chain") {
            if c.get("name").and_then(Value::as_str) != Some("postrouting")
                || c.get("hook").and_then(Value::as_str) != Some("postrouting")
                || c.get("type").and_then(Value::as_str) != Some("nat")
            {
                return MasqFound::Malformed;
            }
            chain = true;
        } else if let Some(r) = item.get("rule") {
            let masquerades = r
                .get("expr")
                .and_then(Value::as_array)
                .is_some_and(|e| e.iter().any(|x| x.get("masquerade").is_some()) && e.len() == 4);
            if !masquerades {
                return MasqFound::Malformed;
            }
            rules += 1;
        }
    }
    if seen_sets != SETS.len() || !chain || rules != 2 {
        return MasqFound::Malformed;
    }
    MasqFound::Sets(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn sets(pods: &[&str], keep: &[&str]) -> MasqSets {
        MasqSets {
            pods: pods.iter().map(|p| net(p)).collect(),
            exceptions: keep.iter().map(|p| net(p)).collect(),
        }
    }

    #[test]
    fn install_writes_the_table_whole_with_its_elements() {
        let s = script(&MasqChange::Install(sets(
            &["10.244.0.0/16", "fd00:10:244::/56"],
            &["192.0.2.0/24"],
        )));
        assert!(
            s.starts_with("table inet weft-egress {}\ndelete table inet weft-egress\n"),
            "{s}"
        );
        assert!(
            s.contains("add element inet weft-egress pods_v4 { 10.244.0.0/16 }"),
            "{s}"
        );
        assert!(
            s.contains("add element inet weft-egress pods_v6 { fd00:10:244::/56 }"),
            "{s}"
        );
        assert!(
            s.contains("add element inet weft-egress keep_v4 { 192.0.2.0/24 }"),
            "{s}"
        );
        assert!(!s.contains("keep_v6 {  }"), "no empty element lists: {s}");
    }

    #[test]
    fn updates_touch_only_changed_elements_deleting_first() {
        let want = sets(&["10.244.1.0/24", "10.244.3.0/24"], &[]);
        let found = MasqFound::Sets(sets(&["10.244.1.0/24", "10.244.2.0/24"], &[]));
        let change = masq_diff(Some(&want), &found).unwrap();
        let s = script(&change);
        assert_eq!(
            s,
            "delete element inet weft-egress pods_v4 { 10.244.2.0/24 }\nadd element inet weft-egress pods_v4 { 10.244.3.0/24 }\n"
        );
        assert_eq!(change.size(), (1, 1));
        assert_eq!(masq_diff(Some(&want), &MasqFound::Sets(want.clone())), None);
    }

    #[test]
    fn a_missing_or_foreign_table_is_installed_and_off_means_removed() {
        let want = sets(&["10.244.1.0/24"], &[]);
        assert!(matches!(
            masq_diff(Some(&want), &MasqFound::Absent),
            Some(MasqChange::Install(_))
        ));
        assert!(matches!(
            masq_diff(Some(&want), &MasqFound::Malformed),
            Some(MasqChange::Install(_))
        ));
        assert_eq!(masq_diff(None, &MasqFound::Malformed), Some(MasqChange::Remove));
        assert_eq!(masq_diff(None, &MasqFound::Absent), None);
    }

    #[test]
    fn reads_the_table_nft_prints() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
          {"table": {"family": "inet", "name": "weft-egress", "handle": 7}},
          {"chain": {"family": "inet", "table": "weft-egress", "name": "postrouting", "handle": 5, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
          {"rule": {"family": "inet", "table": "weft-egress", "chain": "postrouting", "handle": 6, "expr": [{"match": {}}, {"match": {}}, {"match": {}}, {"masquerade": null}]}},
          {"rule": {"family": "inet", "table": "weft-egress", "chain": "postrouting", "handle": 7, "expr": [{"match": {}}, {"match": {}}, {"match": {}}, {"masquerade": null}]}},
          {"set": {"family": "inet", "name": "pods_v4", "table": "weft-egress", "type": "ipv4_addr", "handle": 1, "flags": ["interval"], "elem": [{"prefix": {"addr": "10.244.1.0", "len": 24}}, "10.9.9.9"]}},
          {"set": {"family": "inet", "name": "pods_v6", "table": "weft-egress", "type": "ipv6_addr", "handle": 2, "flags": ["interval"]}},
          {"set": {"family": "inet", "name": "keep_v4", "table": "weft-egress", "type": "ipv4_addr", "handle": 3, "flags": ["interval"], "elem": [{"prefix": {"addr": "192.0.2.0", "len": 24}}]}},
          {"set": {"family": "inet", "name": "keep_v6", "table": "weft-egress", "type": "ipv6_addr", "handle": 4, "flags": ["interval"]}}]}"#;
        assert_eq!(
            parse(json),
            MasqFound::Sets(sets(&["10.244.1.0/24", "10.9.9.9/32"], &["192.0.2.0/24"]))
        );
        let no_chain = json.replace("\"postrouting\", \"handle\": 5", "\"other\", \"handle\": 5");
        assert_eq!(parse(&no_chain), MasqFound::Malformed);
        let one_rule = json.replacen("{\"masquerade\": null}", "{\"accept\": null}", 1);
        assert_eq!(parse(&one_rule), MasqFound::Malformed);
        assert_eq!(parse("not json"), MasqFound::Malformed);
    }
}
