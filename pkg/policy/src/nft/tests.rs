use super::*;
use crate::PolicyId;
use crate::names::SetRole;
use crate::plan::SetSpec;
use crate::rule::{Match, Side, Verdict};

fn group(c: char) -> Chain {
    Chain::Group {
        hash: c.to_string().repeat(10),
        direction: Direction::Ingress,
    }
}

fn pods4() -> SetName {
    SetName::Data {
        role: SetRole::Pods,
        hash: "0123456789".into(),
        v6: false,
    }
}

fn policy_chain() -> Chain {
    Chain::Policy {
        id: PolicyId(7),
        direction: Direction::Ingress,
        hash: "abcd".into(),
    }
}

fn desired() -> Desired {
    let mut d = Desired::default();
    d.sets.insert(
        pods4(),
        SetSpec {
            kind: SetKind::Addr4,
            elements: [Element::Addr("10.0.0.1".parse().unwrap())].into(),
        },
    );
    let nets = SetName::Data {
        role: SetRole::Ranges,
        hash: "9876543210".into(),
        v6: false,
    };
    d.sets.insert(
        nets,
        SetSpec {
            kind: SetKind::Net4,
            elements: [Element::Range(
                "10.1.0.0".parse().unwrap(),
                "10.1.255.255".parse().unwrap(),
            )]
            .into(),
        },
    );
    let counter = Counter::Policy {
        id: PolicyId(7),
        direction: Direction::Ingress,
    };
    d.counters.insert(counter.clone());
    d.chains.insert(
        policy_chain(),
        vec![Rule::allow(
            vec![Match::Addr {
                side: Side::Source,
                v6: false,
                set: pods4(),
            }],
            counter,
            Direction::Ingress,
        )],
    );
    d.chains.insert(
        group('a'),
        vec![
            Rule::new(vec![], Verdict::Jump(policy_chain())),
            Rule::new(vec![], Verdict::Drop),
        ],
    );
    d.ingress.insert("weft1".into(), group('a'));
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
        .get_mut(&pods4())
        .unwrap()
        .elements
        .insert(Element::Addr("10.0.0.2".parse().unwrap()));
    after.ingress.insert("weft2".into(), group('a'));
    let s = diff(&after, &Observed::after(&before)).unwrap();
    assert_eq!(
        s,
        "add element inet weft-policy s01234567894 { 10.0.0.2 }\n\
         add element inet weft-policy mgaaaaaaaaaai { \"weft2\" }\n\
         add element inet weft-policy hairpin { \"weft2\" . \"weft2\" }\n"
    );
}

/// The dispatch chain gets a rule per entry chain, rewritten when the entry chains
/// change; a member set goes with its entry chain, after the rule that used it.
#[test]
fn the_dispatch_follows_the_entry_chains() {
    let before = desired();
    let install = install_script(&before);
    for line in [
        "  set mgaaaaaaaaaai { type ifname; }\n",
        "  set hairpin { type ifname . ifname; }\n",
        "add element inet weft-policy mgaaaaaaaaaai { \"weft1\" }\n",
        "add element inet weft-policy hairpin { \"weft1\" . \"weft1\" }\n",
        "add rule inet weft-policy ingress_pods oifname @mgaaaaaaaaaai jump gaaaaaaaaaai\n",
        "    iifname . oifname @hairpin accept\n",
        "    ct mark and 0x00200000 == 0x00200000 accept\n",
        "    jump ingress_pods\n",
    ] {
        assert!(install.contains(line), "{line} in {install}");
    }
    let mut after = before.clone();
    after.chains.insert(group('b'), vec![Rule::new(vec![], Verdict::Drop)]);
    after.ingress.insert("weft1".into(), group('b'));
    after.chains.remove(&group('a'));
    let s = diff(&after, &Observed::after(&before)).unwrap();
    let lines: Vec<&str> = s.lines().collect();
    let pos = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in {s}"))
    };
    assert!(
        pos("add set inet weft-policy mgbbbbbbbbbbi { type ifname; }")
            < pos("add element inet weft-policy mgbbbbbbbbbbi")
    );
    assert!(
        pos("add element inet weft-policy mgbbbbbbbbbbi { \"weft1\" }")
            < pos("flush chain inet weft-policy ingress_pods")
    );
    assert!(
        pos("flush chain inet weft-policy ingress_pods")
            < pos("add rule inet weft-policy ingress_pods oifname @mgbbbbbbbbbbi jump gbbbbbbbbbbi")
    );
    assert!(
        pos("add rule inet weft-policy ingress_pods oifname @mgbbbbbbbbbbi")
            < pos("delete chain inet weft-policy gaaaaaaaaaai")
    );
    assert!(pos("delete chain inet weft-policy gaaaaaaaaaai") < pos("delete set inet weft-policy mgaaaaaaaaaai"));
    assert!(
        !s.contains("delete element inet weft-policy mgaaaaaaaaaai"),
        "the set goes whole: {s}"
    );
    assert!(!s.contains("hairpin"), "weft1 is still isolated: {s}");
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
    assert!(pos("flush chain inet weft-policy ingress_pods") < pos("flush chain inet weft-policy gaaaaaaaaaai"));
    assert!(pos("delete chain inet weft-policy gaaaaaaaaaai") < pos("delete set inet weft-policy mgaaaaaaaaaai"));
    assert!(pos("flush chain inet weft-policy gaaaaaaaaaai") < pos("delete chain inet weft-policy gaaaaaaaaaai"));
    assert!(pos("delete chain inet weft-policy gaaaaaaaaaai") < pos("delete chain inet weft-policy p"));
    assert!(pos("delete chain inet weft-policy p") < pos("delete set inet weft-policy s01234567894"));
    assert!(
        s.contains("delete element inet weft-policy hairpin { \"weft1\" . \"weft1\" }"),
        "{s}"
    );
    // A rule deleted or changed behind weft's back: the chain is flushed and filled again.
    let d = desired();
    for rules in [
        Some(vec![Rule::new(vec![], Verdict::Jump(policy_chain()))]),
        Some(vec![
            Rule::new(vec![], Verdict::Jump(policy_chain())),
            Rule::new(vec![], Verdict::Accept),
        ]),
        None,
    ] {
        let mut o = Observed::after(&d);
        o.chains.insert(group('a'), rules);
        let s = diff(&d, &o).unwrap();
        assert_eq!(
            s,
            "flush chain inet weft-policy gaaaaaaaaaai\n\
             add rule inet weft-policy gaaaaaaaaaai jump p000000000007iabcd\n\
             add rule inet weft-policy gaaaaaaaaaai drop\n"
        );
    }
}

/// What `nft -j` lists (nft 1.0.6's own output for a table like weft's) reads back as
/// what the plan holds; anything else counts as changed.
#[test]
fn nft_json_reads_back() {
    let json = r#"{"nftables": [
      {"metainfo": {"json_schema_version": 1}},
      {"table": {"family": "inet", "name": "weft-policy"}},
      {"set": {"family": "inet", "name": "s01234567894", "table": "weft-policy", "type": "ipv4_addr", "elem": ["10.0.0.1"]}},
      {"set": {"family": "inet", "name": "r98765432104", "table": "weft-policy", "type": "ipv4_addr", "flags": ["interval"],
               "elem": [{"prefix": {"addr": "10.1.0.0", "len": 16}}, {"range": ["10.2.0.1", "10.2.0.9"]}, "10.3.0.1"]}},
      {"set": {"family": "inet", "name": "n01234567894", "table": "weft-policy", "type": ["ipv4_addr", "inet_proto", "inet_service"],
               "elem": [{"concat": ["10.0.0.1", "tcp", 80]}]}},
      {"set": {"family": "inet", "name": "mgaaaaaaaaaai", "table": "weft-policy", "type": "ifname", "elem": ["weft1"]}},
      {"set": {"family": "inet", "name": "hairpin", "table": "weft-policy", "type": ["ifname", "ifname"], "elem": [{"concat": ["weft1", "weft1"]}]}},
      {"counter": {"family": "inet", "name": "a000000000007i", "table": "weft-policy", "packets": 7, "bytes": 420}},
      {"chain": {"family": "inet", "table": "weft-policy", "name": "egress", "type": "filter", "hook": "forward", "prio": -5, "policy": "accept"}},
      {"chain": {"family": "inet", "table": "weft-policy", "name": "ingress", "type": "filter", "hook": "forward", "prio": -4, "policy": "accept"}},
      {"chain": {"family": "inet", "table": "weft-policy", "name": "gaaaaaaaaaai"}},
      {"chain": {"family": "inet", "table": "weft-policy", "name": "egress_pods"}},
      {"chain": {"family": "inet", "table": "weft-policy", "name": "ingress_pods"}},
      {"rule": {"family": "inet", "table": "weft-policy", "chain": "ingress_pods", "expr": [
        {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "@mgaaaaaaaaaai"}},
        {"jump": {"target": "gaaaaaaaaaai"}}]}},
      BASE_egress
      BASE_ingress
      {"rule": {"family": "inet", "table": "weft-policy", "chain": "gaaaaaaaaaai", "expr": [{"drop": null}]}}
    ]}"#;
    let base = |dir: &str, bit: u32| {
        format!(
            r#"{{"rule": {{"chain": "{dir}", "expr": [{{"match": {{"op": "in", "left": {{"ct": {{"key": "state"}}}}, "right": ["established", "related"]}}}}, {{"accept": null}}]}}}},
      {{"rule": {{"chain": "{dir}", "expr": [{{"match": {{"op": "==", "left": {{"&": [{{"ct": {{"key": "mark"}}}}, {bit}]}}, "right": {bit}}}}}, {{"accept": null}}]}}}},
      {{"rule": {{"chain": "{dir}", "expr": [{{"match": {{"op": "==", "left": {{"concat": [{{"meta": {{"key": "iifname"}}}}, {{"meta": {{"key": "oifname"}}}}]}}, "right": "@hairpin"}}}}, {{"accept": null}}]}}}},
      {{"rule": {{"chain": "{dir}", "expr": [{{"jump": {{"target": "{dir}_pods"}}}}]}}}},"#
        )
    };
    let json = json
        .replace("BASE_egress", &base("egress", 0x0010_0000))
        .replace("BASE_ingress", &base("ingress", 0x0020_0000));
    let o = parse(&json).unwrap();
    assert!(o.base_ok, "{o:?}");
    assert_eq!(
        o.chains.get(&group('a')),
        Some(&Some(vec![Rule::new(vec![], Verdict::Drop)]))
    );
    assert_eq!(
        o.counters.get(&Counter::Policy {
            id: PolicyId(7),
            direction: Direction::Ingress
        }),
        Some(&7)
    );
    assert_eq!(o.ingress.get("weft1"), Some(&group('a')));
    assert_eq!(o.dispatch[&Direction::Ingress], Some([group('a')].into()));
    assert_eq!(o.dispatch[&Direction::Egress], Some(BTreeSet::new()));
    assert_eq!(o.member_sets, [group('a')].into());
    assert_eq!(o.hairpin, ["weft1".to_string()].into());
    let nets: Vec<String> = o.sets[&SetName::parse("r98765432104").unwrap()]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(nets, ["10.1.0.0-10.1.255.255", "10.2.0.1-10.2.0.9", "10.3.0.1"]);
    assert_eq!(
        o.sets[&SetName::parse("n01234567894").unwrap()]
            .iter()
            .next()
            .unwrap()
            .to_string(),
        "10.0.0.1 . tcp . 80"
    );
    let broken = json.replace(
        r#""right": "@hairpin"}}, {"accept": null}]}}"#,
        r#""right": "@hairpin"}}, {"drop": null}]}}"#,
    );
    assert_ne!(broken, json);
    assert!(!parse(&broken).unwrap().base_ok, "a base rule changed");
    let older = json.replace(
        r#"{"set": {"family": "inet", "name": "mgaaaaaaaaaai", "table": "weft-policy", "type": "ifname", "elem": ["weft1"]}},"#,
        r#"{"map": {"family": "inet", "name": "egress_pods", "table": "weft-policy", "type": "ifname", "map": "verdict"}},"#,
    );
    assert_ne!(older, json);
    assert!(
        !parse(&older).unwrap().base_ok,
        "an older weftd's verdict map: written again"
    );
    let foreign = json.replace(r#""name": "s01234567894""#, r#""name": "pa_pods4""#);
    assert!(!parse(&foreign).unwrap().base_ok, "a name weft does not write");
    let altered = json.replace(
        r#""key": "oifname"}}, "right": "@mgaaaaaaaaaai""#,
        r#""key": "iifname"}}, "right": "@mgaaaaaaaaaai""#,
    );
    assert_eq!(
        parse(&altered).unwrap().dispatch[&Direction::Ingress],
        None,
        "a rule weft does not write"
    );
    let changed = json.replace(
        r#""chain": "gaaaaaaaaaai", "expr": [{"drop": null}]"#,
        r#""chain": "gaaaaaaaaaai", "expr": [{"accept": null}]"#,
    );
    assert_eq!(
        parse(&changed).unwrap().chains[&group('a')],
        Some(vec![Rule::new(vec![], Verdict::Accept)]),
        "read as it is, so the diff sees it differs"
    );
}

/// An addition's script adds what the plan with the pod holds beyond the plan
/// without it, in an order the kernel takes (objects, then what refers to them).
#[test]
fn an_addition_adds_objects_before_their_users() {
    let before = desired();
    let newg = group('b');
    let mut add = Addition::default();
    add.new
        .chains
        .insert(newg.clone(), vec![Rule::new(vec![], Verdict::Jump(policy_chain()))]);
    add.ingress.insert("weft9".into(), newg.clone());
    add.entries.insert(newg.clone());
    add.hairpin.insert("weft9".into());
    let s = addition_script(&add).unwrap();
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(
        lines,
        [
            "add set inet weft-policy mgbbbbbbbbbbi { type ifname; }",
            "add chain inet weft-policy gbbbbbbbbbbi",
            "add rule inet weft-policy gbbbbbbbbbbi jump p000000000007iabcd",
            "add element inet weft-policy mgbbbbbbbbbbi { \"weft9\" }",
            "add element inet weft-policy hairpin { \"weft9\" . \"weft9\" }",
            "add rule inet weft-policy ingress_pods oifname @mgbbbbbbbbbbi jump gbbbbbbbbbbi",
        ]
    );
    let mut after = before.clone();
    add.apply_to(&mut after);
    assert_eq!(after.ingress.get("weft9"), Some(&newg));
}
