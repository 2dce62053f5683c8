//! The nfnetlink batch against the real kernel and nft 1.0.6: every word of weft's
//! policy vocabulary written through it lists back exactly as the same text written by
//! `nft -f` (rules and sets alike), a batch applies whole or not at all and names the
//! operation that failed, deletions work, a rule written by it matches real packets,
//! and what a batch costs next to `nft -f` in a large table (printed).

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_kernel::nftbatch::{
    Addr, Batch, BatchError, Element, Expr, Iface, IpFamily, KeyType, L4Proto, Per, Set, Verdict, rule_text,
};
use weft_kernel::nftset::{self, NFPROTO_INET, Session, key_addr, key_port, key_proto};
use weft_kernel::testutil::{TempNetns, privileged};
use weft_kernel::{NetNs, nft, wire};

const TABLE: &str = "weft-policy";

/// Applies an nft script inside the namespace.
fn nft_f(ns: &TempNetns, script: &str) -> Result<(), String> {
    ns.run(|| nft::run(&["-f", "-"], Some(script)).map(|_| ()))
}

/// `nft -j ARGS` inside the namespace: the `nftables` array.
fn nft_json(ns: &TempNetns, args: &str) -> Vec<Value> {
    let args: Vec<&str> = ["-j"].into_iter().chain(args.split(' ')).collect();
    let out = ns.run(|| nft::run(&args, None)).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v["nftables"].as_array().unwrap().clone()
}

/// The table with one base chain, written by nft as weft writes it.
fn table(ns: &TempNetns) {
    nft_f(
        ns,
        &format!("table inet {TABLE} {{ chain forward {{ type filter hook forward priority 0; policy accept; }}\n}}"),
    )
    .unwrap();
}

fn commit(ns: &TempNetns, batch: &Batch) -> Result<(), BatchError> {
    ns.run(|| batch.commit(&mut Session::default()))
}

/// The expressions of each rule of a chain.
fn rules(ns: &TempNetns, chain: &str) -> Vec<Value> {
    nft_json(ns, &format!("list chain inet {TABLE} {chain}"))
        .into_iter()
        .filter_map(|o| o.get("rule").map(|r| r["expr"].clone()))
        .collect()
}

/// A set as nft lists it, without its name and handle.
fn set_listing(ns: &TempNetns, name: &str) -> Value {
    let list = nft_json(ns, &format!("list set inet {TABLE} {name}"));
    let mut set = list.iter().find_map(|o| o.get("set")).unwrap().clone();
    let obj = set.as_object_mut().unwrap();
    obj.remove("name");
    obj.remove("handle");
    set
}

/// Names of the whole table: chains, sets, counters.
fn names(ns: &TempNetns) -> Vec<String> {
    nft_json(ns, &format!("list table inet {TABLE}"))
        .iter()
        .filter_map(|o| {
            ["chain", "set", "counter"]
                .iter()
                .find_map(|k| o.get(k).map(|x| x["name"].as_str().unwrap().to_string()))
        })
        .collect()
}

fn renamed(v: &Value, from: &str, to: &str) -> Value {
    serde_json::from_str(&v.to_string().replace(from, to)).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// One word (or sentence) of the vocabulary: its rule in nft's syntax, where `{s}`,
/// `{k}` and `{j}` stand for a set, a counter and a chain to jump to; and the same
/// through the batch.
struct Case {
    text: &'static str,
    /// Whether `text` is how the expressions print themselves (not an equivalent form).
    canonical: bool,
    /// The set the rule uses: its declaration in nft's syntax, and the same as a
    /// [`Set`] (whose name is replaced) with its elements.
    set: Option<(&'static str, Set, Vec<Element>)>,
    exprs: fn(&Names) -> Vec<Expr>,
}

struct Names {
    s: String,
    k: String,
    j: String,
}

impl Names {
    fn new(prefix: &str) -> Self {
        Names {
            s: format!("{prefix}s"),
            k: format!("{prefix}k"),
            j: format!("{prefix}j"),
        }
    }

    fn fill(&self, text: &str) -> String {
        text.replace("{s}", &self.s)
            .replace("{k}", &self.k)
            .replace("{j}", &self.j)
    }
}

fn cases() -> Vec<Case> {
    let app = |a: &str, proto: u8, port: u16| Element::addr_proto_port(ip(a), proto, port);
    let concat = |a: &str, proto: u8, port: u16| {
        let mut k = key_addr(ip(a));
        k.extend(key_proto(proto));
        k.extend(key_port(port));
        k
    };
    vec![
        Case {
            text: "ip saddr @{s}",
            canonical: true,
            set: Some((
                "type ipv4_addr; elements = { 10.0.0.1, 10.0.0.2 }",
                Set::new("", KeyType::Ipv4Addr),
                vec![Element::addr(ip("10.0.0.1")), Element::addr(ip("10.0.0.2"))],
            )),
            exprs: |n| {
                vec![Expr::AddrInSet {
                    family: IpFamily::V4,
                    addr: Addr::Source,
                    set: n.s.clone(),
                }]
            },
        },
        Case {
            text: "ip daddr @{s}",
            canonical: true,
            set: Some((
                "type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 172.16.0.1, 192.168.1.1-192.168.1.5, 255.255.255.0/24 }",
                Set::interval("", KeyType::Ipv4Addr),
                vec![
                    Element::net("10.0.0.0/8".parse().unwrap()),
                    Element::addr(ip("172.16.0.1")),
                    Element::Range(key_addr(ip("192.168.1.1")), key_addr(ip("192.168.1.5"))),
                    Element::net("255.255.255.0/24".parse().unwrap()),
                ],
            )),
            exprs: |n| {
                vec![Expr::AddrInSet {
                    family: IpFamily::V4,
                    addr: Addr::Destination,
                    set: n.s.clone(),
                }]
            },
        },
        Case {
            text: "ip6 saddr @{s}",
            canonical: true,
            set: Some((
                "type ipv6_addr; elements = { fd00::1, 2001:db8::2 }",
                Set::new("", KeyType::Ipv6Addr),
                vec![Element::addr(ip("fd00::1")), Element::addr(ip("2001:db8::2"))],
            )),
            exprs: |n| {
                vec![Expr::AddrInSet {
                    family: IpFamily::V6,
                    addr: Addr::Source,
                    set: n.s.clone(),
                }]
            },
        },
        Case {
            text: "ip6 daddr @{s}",
            canonical: true,
            set: Some((
                "type ipv6_addr; flags interval; elements = { ::/8, 2001:db8::/32, fd00::1-fd00::5 }",
                Set::interval("", KeyType::Ipv6Addr),
                vec![
                    Element::net("::/8".parse().unwrap()),
                    Element::net("2001:db8::/32".parse().unwrap()),
                    Element::Range(key_addr(ip("fd00::1")), key_addr(ip("fd00::5"))),
                ],
            )),
            exprs: |n| {
                vec![Expr::AddrInSet {
                    family: IpFamily::V6,
                    addr: Addr::Destination,
                    set: n.s.clone(),
                }]
            },
        },
        Case {
            text: "ip daddr . meta l4proto . th dport @{s}",
            canonical: true,
            set: Some((
                "type ipv4_addr . inet_proto . inet_service; elements = { 10.0.0.1 . tcp . 80, 10.0.0.2 . udp . 53 }",
                Set::new("", KeyType::Ipv4AddrProtoPort),
                vec![app("10.0.0.1", 6, 80), app("10.0.0.2", 17, 53)],
            )),
            exprs: |n| {
                vec![Expr::DaddrProtoPortInSet {
                    family: IpFamily::V4,
                    set: n.s.clone(),
                    interval: false,
                }]
            },
        },
        Case {
            text: "ip6 daddr . meta l4proto . th dport @{s}",
            canonical: true,
            set: Some((
                "type ipv6_addr . inet_proto . inet_service; elements = { fd00::1 . sctp . 9, fd00::2 . tcp . 443 }",
                Set::new("", KeyType::Ipv6AddrProtoPort),
                vec![app("fd00::1", 132, 9), app("fd00::2", 6, 443)],
            )),
            exprs: |n| {
                vec![Expr::DaddrProtoPortInSet {
                    family: IpFamily::V6,
                    set: n.s.clone(),
                    interval: false,
                }]
            },
        },
        // A concatenation with ranges (the pipapo backend).
        Case {
            text: "ip daddr . meta l4proto . th dport @{s}",
            canonical: true,
            set: Some((
                "type ipv4_addr . inet_proto . inet_service; flags interval; elements = { 10.0.0.0/8 . tcp . 80-90, 10.1.2.3 . udp . 53 }",
                Set::interval("", KeyType::Ipv4AddrProtoPort),
                vec![
                    Element::Range(concat("10.0.0.0", 6, 80), concat("10.255.255.255", 6, 90)),
                    app("10.1.2.3", 17, 53),
                ],
            )),
            exprs: |n| {
                vec![Expr::DaddrProtoPortInSet {
                    family: IpFamily::V4,
                    set: n.s.clone(),
                    interval: true,
                }]
            },
        },
        Case {
            text: "ip6 daddr . meta l4proto . th dport @{s}",
            canonical: true,
            set: Some((
                "type ipv6_addr . inet_proto . inet_service; flags interval; elements = { fd00::/64 . udp . 53, fd00:1::1 . sctp . 1000-2000 }",
                Set::interval("", KeyType::Ipv6AddrProtoPort),
                vec![
                    Element::Range(concat("fd00::", 17, 53), concat("fd00::ffff:ffff:ffff:ffff", 17, 53)),
                    Element::Range(concat("fd00:1::1", 132, 1000), concat("fd00:1::1", 132, 2000)),
                ],
            )),
            exprs: |n| {
                vec![Expr::DaddrProtoPortInSet {
                    family: IpFamily::V6,
                    set: n.s.clone(),
                    interval: true,
                }]
            },
        },
        Case {
            text: "meta l4proto tcp",
            canonical: true,
            set: None,
            exprs: |_| vec![Expr::L4Proto(L4Proto::Tcp)],
        },
        Case {
            text: "meta l4proto udp",
            canonical: true,
            set: None,
            exprs: |_| vec![Expr::L4Proto(L4Proto::Udp)],
        },
        Case {
            text: "meta l4proto sctp",
            canonical: true,
            set: None,
            exprs: |_| vec![Expr::L4Proto(L4Proto::Sctp)],
        },
        Case {
            text: "tcp dport 80",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![Expr::Dport {
                    proto: L4Proto::Tcp,
                    ports: 80..=80,
                }]
            },
        },
        Case {
            text: "udp dport 53",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![Expr::Dport {
                    proto: L4Proto::Udp,
                    ports: 53..=53,
                }]
            },
        },
        Case {
            text: "sctp dport 9",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![Expr::Dport {
                    proto: L4Proto::Sctp,
                    ports: 9..=9,
                }]
            },
        },
        Case {
            text: "tcp dport 80-90",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![Expr::Dport {
                    proto: L4Proto::Tcp,
                    ports: 80..=90,
                }]
            },
        },
        // The form weft's policy writes ports in.
        Case {
            text: "meta l4proto tcp th dport 80",
            canonical: false,
            set: None,
            exprs: |_| {
                vec![Expr::Dport {
                    proto: L4Proto::Tcp,
                    ports: 80..=80,
                }]
            },
        },
        Case {
            text: "meta l4proto udp th dport 1000-2000",
            canonical: false,
            set: None,
            exprs: |_| {
                vec![Expr::Dport {
                    proto: L4Proto::Udp,
                    ports: 1000..=2000,
                }]
            },
        },
        Case {
            text: "iifname @{s}",
            canonical: true,
            set: Some((
                "type ifname; elements = { \"weft1\", \"weft2\" }",
                Set::new("", KeyType::Ifname),
                vec![Element::ifname("weft1"), Element::ifname("weft2")],
            )),
            exprs: |n| {
                vec![Expr::IfnameInSet {
                    iface: Iface::Input,
                    set: n.s.clone(),
                }]
            },
        },
        Case {
            text: "oifname @{s}",
            canonical: true,
            set: Some((
                "type ifname; elements = { \"weft3\" }",
                Set::new("", KeyType::Ifname),
                vec![Element::ifname("weft3")],
            )),
            exprs: |n| {
                vec![Expr::IfnameInSet {
                    iface: Iface::Output,
                    set: n.s.clone(),
                }]
            },
        },
        Case {
            text: "iifname . oifname @{s}",
            canonical: true,
            set: Some((
                "type ifname . ifname; elements = { \"weft1\" . \"eth0\", \"weft2\" . \"weft3\" }",
                Set::new("", KeyType::IfnamePair),
                vec![
                    Element::ifname_pair("weft1", "eth0"),
                    Element::ifname_pair("weft2", "weft3"),
                ],
            )),
            exprs: |n| vec![Expr::IfnamesInSet { set: n.s.clone() }],
        },
        Case {
            text: "counter name \"{k}\"",
            canonical: true,
            set: None,
            exprs: |n| vec![Expr::Counter(n.k.clone())],
        },
        Case {
            text: "ct mark set ct mark or 0x00100000",
            canonical: true,
            set: None,
            exprs: |_| vec![Expr::CtMarkOr(0x0010_0000)],
        },
        Case {
            text: "ct direction reply",
            canonical: true,
            set: None,
            exprs: |_| vec![Expr::CtReply],
        },
        Case {
            text: "meta mark & 0x00400000 == 0x00000000",
            canonical: true,
            set: None,
            exprs: |_| vec![Expr::MarkClear(0x0040_0000)],
        },
        Case {
            text: "limit rate 20/second burst 20 packets",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![Expr::Limit {
                    rate: 20,
                    per: Per::Second,
                    burst: 20,
                }]
            },
        },
        Case {
            text: "log group 21845 prefix \"weft deny gabc\"",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![Expr::Log {
                    group: 21845,
                    prefix: "weft deny gabc".into(),
                }]
            },
        },
        Case {
            text: "accept",
            canonical: true,
            set: None,
            exprs: |_| vec![Verdict::Accept.into()],
        },
        Case {
            text: "drop",
            canonical: true,
            set: None,
            exprs: |_| vec![Verdict::Drop.into()],
        },
        Case {
            text: "jump {j}",
            canonical: true,
            set: None,
            exprs: |n| vec![Verdict::Jump(n.j.clone()).into()],
        },
        Case {
            text: "goto {j}",
            canonical: true,
            set: None,
            exprs: |n| vec![Verdict::Goto(n.j.clone()).into()],
        },
        Case {
            text: "return",
            canonical: true,
            set: None,
            exprs: |_| vec![Verdict::Return.into()],
        },
        // Whole rules as weft's policy writes them.
        Case {
            text: "ip saddr @{s} meta l4proto tcp th dport 80 counter name \"{k}\" ct mark set ct mark or 0x00100000 accept",
            canonical: false,
            set: Some((
                "type ipv4_addr; flags interval; elements = { 10.0.0.0/24, 10.0.2.0-10.0.3.255 }",
                Set::interval("", KeyType::Ipv4Addr),
                vec![
                    Element::net("10.0.0.0/24".parse().unwrap()),
                    Element::net("10.0.2.0/23".parse().unwrap()),
                ],
            )),
            exprs: |n| {
                vec![
                    Expr::AddrInSet {
                        family: IpFamily::V4,
                        addr: Addr::Source,
                        set: n.s.clone(),
                    },
                    Expr::Dport {
                        proto: L4Proto::Tcp,
                        ports: 80..=80,
                    },
                    Expr::Counter(n.k.clone()),
                    Expr::CtMarkOr(0x0010_0000),
                    Verdict::Accept.into(),
                ]
            },
        },
        Case {
            text: "ip6 daddr . meta l4proto . th dport @{s} counter name \"{k}\" ct mark set ct mark or 0x00200000 accept",
            canonical: true,
            set: Some((
                "type ipv6_addr . inet_proto . inet_service;",
                Set::new("", KeyType::Ipv6AddrProtoPort),
                vec![],
            )),
            exprs: |n| {
                vec![
                    Expr::DaddrProtoPortInSet {
                        family: IpFamily::V6,
                        set: n.s.clone(),
                        interval: false,
                    },
                    Expr::Counter(n.k.clone()),
                    Expr::CtMarkOr(0x0020_0000),
                    Verdict::Accept.into(),
                ]
            },
        },
        Case {
            text: "limit rate 20/second burst 20 packets log group 21845 prefix \"weft deny gabc\"",
            canonical: true,
            set: None,
            exprs: |_| {
                vec![
                    Expr::Limit {
                        rate: 20,
                        per: Per::Second,
                        burst: 20,
                    },
                    Expr::Log {
                        group: 21845,
                        prefix: "weft deny gabc".into(),
                    },
                ]
            },
        },
        Case {
            text: "oifname @{s} jump {j}",
            canonical: true,
            set: Some(("type ifname;", Set::new("", KeyType::Ifname), vec![])),
            exprs: |n| {
                vec![
                    Expr::IfnameInSet {
                        iface: Iface::Output,
                        set: n.s.clone(),
                    },
                    Verdict::Jump(n.j.clone()).into(),
                ]
            },
        },
        Case {
            text: "meta l4proto udp counter name \"{k}\" goto {j}",
            canonical: true,
            set: None,
            exprs: |n| {
                vec![
                    Expr::L4Proto(L4Proto::Udp),
                    Expr::Counter(n.k.clone()),
                    Verdict::Goto(n.j.clone()).into(),
                ]
            },
        },
    ]
}

#[test]
fn every_word_of_the_vocabulary_lists_back_as_nfts_own() {
    if !privileged() {
        return;
    }
    let ns = TempNetns::new();
    table(&ns);
    let cases = cases();
    // Case i: nft's chain n{i}_c (with its set n{i}_s, counter n{i}_k, jump target
    // n{i}_j), all in one script; the batch's b{i}_c and the rest, all in one batch.
    let mut script = String::new();
    let mut batch = Batch::new(TABLE);
    for (i, case) in cases.iter().enumerate() {
        let (n, b) = (Names::new(&format!("n{i}_")), Names::new(&format!("b{i}_")));
        script += &format!("add chain inet {TABLE} {}\nadd counter inet {TABLE} {}\n", n.j, n.k);
        batch.add_chain(&b.j).add_counter(&b.k);
        if let Some((decl, set, elements)) = &case.set {
            script += &format!("add set inet {TABLE} {} {{ {decl} }}\n", n.s);
            let set = Set {
                name: b.s.clone(),
                ..set.clone()
            };
            batch.add_set(&set, elements.clone());
        }
        script += &format!(
            "add chain inet {TABLE} n{i}_c\nadd rule inet {TABLE} n{i}_c {}\n",
            n.fill(case.text)
        );
        batch
            .add_chain(format!("b{i}_c"))
            .add_rule(format!("b{i}_c"), (case.exprs)(&b));
        if case.canonical {
            assert_eq!(
                rule_text(&(case.exprs)(&b)),
                b.fill(case.text),
                "the rule prints as nft's text"
            );
        }
    }
    nft_f(&ns, &script).unwrap();
    commit(&ns, &batch).unwrap();

    // What the kernel holds, as nft's netlink debugging prints it: registers, data
    // lengths, and every element including the ends of ranges (sorted: each hash set
    // has a seed of its own).
    let raw = |what: &str, name: &str| {
        let args = ["--debug=netlink", "list", what, "inet", TABLE, name];
        let out = ns
            .run(|| std::process::Command::new("nft").args(args).output())
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A chain's listing prints every set's elements too: its rules' lines only.
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .take_while(|l| !l.starts_with("table "))
            .filter(|l| l.starts_with(if what == "chain" { "  [" } else { "\t" }))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    let text = |what: &str, name: &str| ns.run(|| nft::run(&["list", what, "inet", TABLE, name], None)).unwrap();
    for (i, case) in cases.iter().enumerate() {
        let (n, b) = (format!("n{i}_"), format!("b{i}_"));
        let what = format!("rule {i} `{}`", case.text);
        // The JSON weft's policy reads back.
        let (by_nft, by_batch) = (rules(&ns, &format!("{n}c")), rules(&ns, &format!("{b}c")));
        assert_eq!(by_nft.len(), 1, "{what}");
        assert_eq!(
            renamed(&by_nft[0], &n, &b),
            by_batch[0],
            "{what}: nft's listing, then the batch's"
        );
        if case.set.is_some() {
            assert_eq!(
                set_listing(&ns, &format!("{n}s")),
                set_listing(&ns, &format!("{b}s")),
                "set of {what}"
            );
        }
        // The kernel's own, and nft's text.
        let mut kinds = vec![("chain", "c")];
        kinds.extend(case.set.as_ref().map(|_| ("set", "s")));
        for (kind, x) in kinds {
            let by_nft: Vec<String> = (raw(kind, &format!("{n}{x}")).iter())
                .map(|l| l.replace(&n, &b))
                .collect();
            let by_batch = raw(kind, &format!("{b}{x}"));
            let empty = kind == "set" && case.set.as_ref().is_some_and(|(_, _, e)| e.is_empty());
            assert_eq!(by_batch.is_empty(), empty, "{what}: the {kind}'s lines");
            assert_eq!(by_nft, by_batch, "the kernel's {kind} of {what}");
            let by_nft = text(kind, &format!("{n}{x}")).replace(&n, &b);
            assert_eq!(
                by_nft,
                text(kind, &format!("{b}{x}")),
                "nft's text of the {kind} of {what}"
            );
        }
    }
}

#[test]
fn a_batch_applies_whole_or_not_at_all_and_names_what_failed() {
    if !privileged() {
        return;
    }
    let ns = TempNetns::new();
    table(&ns);
    let pods = Set::new("pods", KeyType::Ipv4Addr);
    let mut b = Batch::new(TABLE);
    b.add_set(
        &pods,
        ["10.1.0.1", "10.1.0.2", "10.1.0.3"].map(|a| Element::addr(ip(a))),
    )
    .add_counter("allowed")
    .add_chain("group")
    .add_chain("policy")
    .add_rule(
        "policy",
        [
            Expr::AddrInSet {
                family: IpFamily::V4,
                addr: Addr::Source,
                set: "pods".into(),
            },
            Expr::Counter("allowed".into()),
            Verdict::Accept.into(),
        ],
    )
    .add_rule("group", [Verdict::Jump("policy".into()).into()])
    .add_rule("group", [Verdict::Drop.into()])
    .add_rule("forward", [Verdict::Jump("group".into()).into()]);
    commit(&ns, &b).unwrap();
    let have = names(&ns);
    for n in ["pods", "allowed", "group", "policy"] {
        assert!(have.contains(&n.to_string()), "{n} in {have:?}");
    }
    assert_eq!(rules(&ns, "group").len(), 2);
    assert_eq!(
        rules(&ns, "forward")[0],
        serde_json::json!([{"jump": {"target": "group"}}])
    );
    assert_eq!(
        set_listing(&ns, "pods")["elem"],
        serde_json::json!(["10.1.0.1", "10.1.0.2", "10.1.0.3"])
    );

    // A jump to a chain that does not exist: the fourth operation fails, the kernel
    // aborts the lot.
    let before = names(&ns);
    let mut bad = Batch::new(TABLE);
    bad.add_set(&Set::new("more", KeyType::Ipv4Addr), [Element::addr(ip("10.2.0.1"))])
        .add_counter("c2")
        .add_chain("z")
        .add_rule("z", [Verdict::Jump("nowhere".into()).into()])
        .add_rule("z", [Verdict::Accept.into()]);
    let err = commit(&ns, &bad).unwrap_err();
    assert_eq!(err.op, Some(3), "{err}");
    assert_eq!(err.source.raw_os_error(), Some(libc::ENOENT), "{err}");
    assert!(
        err.to_string().contains("operation 3 (add rule z jump nowhere)"),
        "{err}"
    );
    assert_eq!(names(&ns), before, "nothing of the failed batch is left");

    // An element of the wrong length, in a set created by the same batch or before.
    for (i, bad) in [
        Batch::new(TABLE)
            .add_chain("z")
            .add_set(&Set::new("short", KeyType::Ipv4Addr), [Element::Key(vec![10, 0, 0])])
            .clone(),
        Batch::new(TABLE)
            .add_chain("z")
            .add_counter("c3")
            .add_elements(&pods, [Element::addr(ip("10.1.0.9")), Element::Key(vec![10, 0, 0])])
            .clone(),
    ]
    .into_iter()
    .enumerate()
    {
        let err = commit(&ns, &bad).unwrap_err();
        assert_eq!(err.op, Some(1 + i), "{err}");
        assert_eq!(err.source.raw_os_error(), Some(libc::EINVAL), "{err}");
        assert_eq!(names(&ns), before, "{err}");
    }
    assert_eq!(set_listing(&ns, "pods")["elem"].as_array().unwrap().len(), 3);

    // The session survives a failed batch (it reopens its socket).
    ns.run(|| {
        let mut s = Session::default();
        assert!(bad.commit(&mut s).is_err());
        let mut ok = Batch::new(TABLE);
        ok.add_counter("after");
        ok.commit(&mut s).unwrap();
    });
    assert!(names(&ns).contains(&"after".to_string()));
}

#[test]
fn chains_rules_sets_elements_and_counters_are_deleted() {
    if !privileged() {
        return;
    }
    let ns = TempNetns::new();
    table(&ns);
    let nets = Set::interval("nets", KeyType::Ipv4Addr);
    let ranges = [
        Element::net("10.0.0.0/16".parse().unwrap()),
        Element::net("10.2.0.0/16".parse().unwrap()),
        Element::Range(key_addr(ip("10.4.0.1")), key_addr(ip("10.4.0.9"))),
    ];
    let mut b = Batch::new(TABLE);
    b.add_set(&nets, ranges.clone())
        .add_counter("k")
        .add_chain("x")
        .add_chain("y")
        .add_rule("x", [Verdict::Jump("y".into()).into()])
        .add_rule("x", [Verdict::Accept.into()])
        .add_rule(
            "y",
            [
                Expr::AddrInSet {
                    family: IpFamily::V4,
                    addr: Addr::Destination,
                    set: "nets".into(),
                },
                Expr::Counter("k".into()),
            ],
        )
        .add_rule("y", [Verdict::Return.into()]);
    commit(&ns, &b).unwrap();
    // The same set by nft, for the deletion of a range.
    // (Two transactions: nft 1.0.6 does not delete an element added in the same one.)
    nft_f(
        &ns,
        &format!(
            "add set inet {TABLE} nets2 {{ type ipv4_addr; flags interval; elements = {{ 10.0.0.0/16, 10.2.0.0/16, 10.4.0.1-10.4.0.9 }} }}"
        ),
    )
    .unwrap();
    nft_f(&ns, &format!("delete element inet {TABLE} nets2 {{ 10.2.0.0/16 }}")).unwrap();
    let mut del = Batch::new(TABLE);
    del.delete_elements(&nets, [ranges[1].clone()]);
    commit(&ns, &del).unwrap();
    assert_eq!(set_listing(&ns, "nets"), set_listing(&ns, "nets2"));
    assert_eq!(
        set_listing(&ns, "nets")["elem"].as_array().unwrap().len(),
        2,
        "{}",
        set_listing(&ns, "nets")
    );

    // One rule by its handle.
    let list = nft_json(&ns, &format!("list chain inet {TABLE} y"));
    let handle = list.iter().find_map(|o| o.get("rule")).unwrap()["handle"]
        .as_u64()
        .unwrap();
    let mut del = Batch::new(TABLE);
    del.delete_rule("y", handle);
    commit(&ns, &del).unwrap();
    assert_eq!(rules(&ns, "y"), vec![serde_json::json!([{"return": null}])]);

    // What a rule still references cannot go (and the batch says which).
    let mut early = Batch::new(TABLE);
    early.delete_chain("y");
    let err = commit(&ns, &early).unwrap_err();
    assert_eq!(
        (err.op, err.source.raw_os_error()),
        (Some(0), Some(libc::EBUSY)),
        "{err}"
    );

    // Flushed chains reference nothing; then everything goes, in one batch.
    let mut gone = Batch::new(TABLE);
    gone.flush_chain("x")
        .delete_chain("y")
        .delete_chain("x")
        .delete_set("nets")
        .delete_counter("k");
    commit(&ns, &gone).unwrap();
    assert_eq!(names(&ns), ["nets2", "forward"].map(String::from).to_vec());
}

#[test]
fn a_rule_written_by_the_batch_matches_real_packets() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    let (a, b) = (TempNetns::new(), TempNetns::new());
    let open = |t: &TempNetns| NetNs::open(t.path()).unwrap();
    node.run(|| {
        wire::veth_between(
            wire::PodEnd {
                pod: &open(&a),
                name: "e1",
                mac: [2, 0, 0, 0, 1, 1],
            },
            wire::PodEnd {
                pod: &open(&b),
                name: "e2",
                mac: [2, 0, 0, 0, 2, 1],
            },
            1500,
        )
    })
    .unwrap();
    for (t, name, mac, addr) in [
        (&a, "e1", [2, 0, 0, 0, 1, 1], "10.77.0.1"),
        (&b, "e2", [2, 0, 0, 0, 2, 1], "10.77.0.2"),
    ] {
        let mut s = wire::socket_in(&open(t)).unwrap();
        wire::configure(&mut s, name, mac, 1500, Some((ip(addr), 24)), true).unwrap();
    }
    nft_f(
        &b,
        &format!("table inet {TABLE} {{ chain input {{ type filter hook input priority 0; policy accept; }}\n}}"),
    )
    .unwrap();
    let peers = Set::new("peers", KeyType::Ipv4Addr);
    let others = Set::new("others", KeyType::Ipv4Addr);
    let rule = |set: &str, counter: &str| {
        [
            Expr::AddrInSet {
                family: IpFamily::V4,
                addr: Addr::Source,
                set: set.into(),
            },
            Expr::Dport {
                proto: L4Proto::Tcp,
                ports: 80..=80,
            },
            Expr::Counter(counter.into()),
        ]
    };
    let mut batch = Batch::new(TABLE);
    batch
        .add_set(&peers, [Element::addr(ip("10.77.0.1"))])
        .add_set(&others, [Element::addr(ip("10.77.0.9"))])
        .add_counter("hit")
        .add_counter("miss")
        .add_counter("port81")
        .add_chain("http")
        .add_rule("http", rule("peers", "hit"))
        .add_rule("http", rule("others", "miss"))
        .add_rule(
            "http",
            [
                Expr::Dport {
                    proto: L4Proto::Tcp,
                    ports: 81..=90,
                },
                Expr::Counter("port81".into()),
            ],
        )
        .add_rule("input", [Verdict::Jump("http".into()).into()]);
    commit(&b, &batch).unwrap();
    // A SYN to a closed port: answered by a reset, seen by the input hook first.
    let to = SocketAddr::new(ip("10.77.0.2"), 80);
    a.run(|| {
        let e = TcpStream::connect_timeout(&to, Duration::from_secs(3)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    });
    let counters = b.run(|| nftset::counters(TABLE, NFPROTO_INET)).unwrap();
    assert_eq!(counters["hit"], 1, "{counters:?}");
    assert_eq!(counters["miss"], 0, "{counters:?}");
    assert_eq!(counters["port81"], 0, "{counters:?}");
}

/// A batch larger than the socket's default buffers (a set of 40000 addresses, 2000
/// chains acknowledged one by one) goes through whole.
#[test]
fn a_large_batch_goes_through_whole() {
    if !privileged() {
        return;
    }
    let ns = TempNetns::new();
    table(&ns);
    let addrs: Vec<Element> = (0..40_000u32)
        .map(|i| Element::addr(IpAddr::from((0x0a00_0000 + i).to_be_bytes())))
        .collect();
    let mut b = Batch::new(TABLE);
    b.add_set(&Set::new("many", KeyType::Ipv4Addr), addrs);
    for c in 0..2000 {
        b.add_chain(format!("c{c}"));
    }
    commit(&ns, &b).unwrap();
    assert_eq!(set_listing(&ns, "many")["elem"].as_array().unwrap().len(), 40_000);
    assert_eq!(names(&ns).len(), 2002);
}

/// An ADD's batch (a chain of 5 rules, a set of 10 elements, a counter) in a table of
/// 400 chains and 60 sets of 100 elements, through the batch and through `nft -f`.
#[test]
fn a_batch_costs_less_than_nft_f_in_a_large_table() {
    if !privileged() {
        return;
    }
    let ns = TempNetns::new();
    table(&ns);
    let mut big = String::new();
    for s in 0..60 {
        let elems: Vec<String> = (0..100).map(|e| format!("10.{s}.{}.{}", e / 50, e % 50 + 1)).collect();
        big += &format!(
            "add set inet {TABLE} s{s} {{ type ipv4_addr; elements = {{ {} }} }}\n",
            elems.join(", ")
        );
    }
    for c in 0..400 {
        big += &format!("add counter inet {TABLE} k{c}\nadd chain inet {TABLE} c{c}\n");
        big += &format!(
            "add rule inet {TABLE} c{c} ip saddr @s{} meta l4proto tcp th dport 80 counter name \"k{c}\" ct mark set ct mark or 0x00100000 accept\n",
            c % 60
        );
    }
    nft_f(&ns, &big).unwrap();

    let add = |r: usize| {
        let (chain, set, counter) = (format!("add{r}"), format!("addset{r}"), format!("addk{r}"));
        let elements: Vec<IpAddr> = (1..=10).map(|e| ip(&format!("10.200.{r}.{e}"))).collect();
        let mut b = Batch::new(TABLE);
        b.add_chain(&chain)
            .add_set(
                &Set::new(&set, KeyType::Ipv4Addr),
                elements.iter().map(|a| Element::addr(*a)),
            )
            .add_counter(&counter);
        let allow = |m: Expr| {
            [
                m,
                Expr::Counter(counter.clone()),
                Expr::CtMarkOr(0x0010_0000),
                Verdict::Accept.into(),
            ]
        };
        let src = Expr::AddrInSet {
            family: IpFamily::V4,
            addr: Addr::Source,
            set: set.clone(),
        };
        let port = |p| Expr::Dport {
            proto: L4Proto::Tcp,
            ports: p,
        };
        let rules: Vec<Vec<Expr>> = vec![
            allow(src.clone()).to_vec(),
            [
                vec![src.clone(), port(80..=80)],
                allow(Expr::L4Proto(L4Proto::Tcp)).to_vec(),
            ]
            .concat(),
            vec![
                src.clone(),
                port(8000..=8080),
                Expr::Counter(counter.clone()),
                Verdict::Accept.into(),
            ],
            vec![
                Expr::Limit {
                    rate: 20,
                    per: Per::Second,
                    burst: 20,
                },
                Expr::Log {
                    group: 21845,
                    prefix: format!("weft deny {chain}"),
                },
            ],
            vec![Expr::Counter(counter.clone()), Verdict::Drop.into()],
        ];
        let mut script = format!(
            "add chain inet {TABLE} {chain}\nadd set inet {TABLE} {set} {{ type ipv4_addr; elements = {{ {} }} }}\nadd counter inet {TABLE} {counter}\n",
            elements.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        );
        for r in &rules {
            b.add_rule(&chain, r.clone());
            script += &format!("add rule inet {TABLE} {chain} {}\n", rule_text(r));
        }
        (b, script)
    };

    const RUNS: usize = 15;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (batch_times, first) = ns.run(|| {
        let mut session = Session::default();
        let mut times = Vec::new();
        let (b, _) = add(0);
        let t = Instant::now();
        b.commit(&mut session).unwrap();
        let first = t.elapsed();
        for r in 1..=RUNS {
            let (b, _) = add(r);
            let t = Instant::now();
            b.commit(&mut session).unwrap();
            times.push(t.elapsed());
        }
        (times, first)
    });
    let nft_times: Vec<Duration> = (100..100 + RUNS)
        .map(|r| {
            let (_, script) = add(r);
            let t = Instant::now();
            nft_f(&ns, &script).unwrap();
            t.elapsed()
        })
        .collect();
    // Both ways wrote the same rules.
    let generic = |r: usize| -> Vec<Value> {
        let names = [("addset", "S"), ("addk", "K"), ("deny add", "C")];
        rules(&ns, &format!("add{r}"))
            .iter()
            .map(|x| {
                names.iter().fold(x.clone(), |x, (n, to)| {
                    renamed(&x, &format!("{n}{r}\""), &format!("{to}\""))
                })
            })
            .collect()
    };
    assert_eq!(generic(1), generic(101));
    println!(
        "ADD batch (1 chain, 5 rules, set of 10, counter) in a table of 400 chains and 60 sets of 100: \
         batch median {:?} (min {:?}, first on a new socket {:?}), nft -f median {:?} (min {:?}), {RUNS} runs each",
        median(batch_times.clone()),
        batch_times.iter().min().unwrap(),
        first,
        median(nft_times.clone()),
        nft_times.iter().min().unwrap(),
    );
}
