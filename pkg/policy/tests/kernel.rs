//! The compiled table on a real kernel: a node namespace with pods of two namespaces
//! and an address outside the cluster, each serving TCP 80 and 81; every connection
//! between them is tried and must pass exactly when the evaluator says so. Then a label
//! change is applied as elements only, and drift (a flushed chain, a deleted table) is
//! repaired from what the kernel reads back. A one-way UDP flow is decided once; the
//! ClusterNetworkPolicy tiers.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use weft_kernel::testutil::{TempNetns, privileged};
use weft_policy::names::Counter;
use weft_policy::nft::Observed;
use weft_policy::{ClusterView, Direction, LocalPod, NftKernel, PolicyKernel, plan};
use weft_topology::{PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol, Strict};

mod support;

use support::{Host, host, program};

/// Accepts on 80 and 81 until `stop`.
fn serve(h: &Host, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    support::serve(h, &[(PortProtocol::Tcp, 80), (PortProtocol::Tcp, 81)], stop)
}

/// Every connection between the hosts, tried at once: `(src, dst, port) -> passed`.
fn probe(hosts: &[Host]) -> HashMap<(usize, usize, u16), bool> {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, src) in hosts.iter().enumerate() {
            for (j, dst) in hosts.iter().enumerate() {
                if i == j {
                    continue;
                }
                for port in [80u16, 81] {
                    let target = SocketAddr::new(dst.ip, port);
                    handles.push((
                        (i, j, port),
                        s.spawn(move || {
                            src.ns
                                .run(|| TcpStream::connect_timeout(&target, Duration::from_millis(700)).is_ok())
                        }),
                    ));
                }
            }
        }
        handles.into_iter().map(|(k, h)| (k, h.join().unwrap())).collect()
    })
}

fn np(ns: &str, name: &str, spec: Value) -> Arc<Strict<NetworkPolicy>> {
    Arc::new(serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap())
}

fn objects(
    hosts: &[Host],
    labels: &HashMap<String, String>,
    policies: Vec<Arc<Strict<NetworkPolicy>>>,
) -> PolicyObjects {
    PolicyObjects {
        pods: weft_topology::policy_pods(hosts.iter().filter_map(|h| {
            let (ns, name) = h.pod.clone()?;
            Some(Arc::new(PolicyPod {
                labels: [("pod".to_string(), labels.get(&name).cloned().unwrap_or(name.clone()))].into(),
                namespace: ns,
                name,
                ips: vec![h.ip],
                node: "n1".into(),
                ..PolicyPod::default()
            }))
        })),
        namespaces: ["x", "y"]
            .iter()
            .map(|n| {
                Arc::new(PolicyNamespace {
                    name: n.to_string(),
                    labels: [("ns".to_string(), n.to_string())].into(),
                    audit: false,
                    workload_flow_metrics: false,
                })
            })
            .collect(),
        policies,
        synced: true,
        stale: false,
        cluster_policies: Vec::new(),
        unreadable: Vec::new(),
    }
}

fn view(hosts: &[Host], o: &PolicyObjects) -> ClusterView {
    let local: Vec<LocalPod> = hosts
        .iter()
        .filter_map(|h| {
            let (namespace, name) = h.pod.clone()?;
            Some(LocalPod {
                namespace,
                name,
                ips: vec![h.ip],
                host_ifname: h.host_ifname.clone(),
            })
        })
        .collect();
    ClusterView::new(o, "n1", &local, &[])
}

fn assert_matches_verdicts(hosts: &[Host], v: &ClusterView, what: &str) {
    let got = probe(hosts);
    let mut wrong = Vec::new();
    for ((i, j, port), passed) in &got {
        let want = v.verdict(hosts[*i].ip, hosts[*j].ip, PortProtocol::Tcp, *port).passes();
        if want != *passed {
            wrong.push(format!(
                "{} -> {}:{port}: kernel {}, evaluator {}",
                hosts[*i].ip,
                hosts[*j].ip,
                if *passed { "passed" } else { "blocked" },
                if want { "passes" } else { "blocks" }
            ));
        }
    }
    wrong.sort();
    assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
    assert!(
        got.values().any(|p| !p) && got.values().any(|p| *p),
        "{what}: the case tells nothing"
    );
}

#[test]
fn the_kernel_blocks_exactly_what_the_evaluator_says() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let hosts = vec![
        host(&node, 0, "10.9.0.10", "10.9.0.1", Some(("x", "a"))),
        host(&node, 1, "10.9.0.11", "10.9.0.1", Some(("x", "b"))),
        host(&node, 2, "10.9.0.12", "10.9.0.1", Some(("y", "c"))),
        host(&node, 3, "198.51.100.2", "198.51.100.1", None),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = hosts.iter().flat_map(|h| serve(h, stop.clone())).collect();

    let policies = vec![
        // x: nothing in but from y, on 80; a also takes b on any port.
        np("x", "deny", json!({"podSelector": {}})),
        np(
            "x",
            "from-y",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                                   "ports": [{"port": 80}]}]}),
        ),
        np(
            "x",
            "a-from-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
        // y's c goes out only to x's a (81..81 by range) and to the outside block but
        // 198.51.100.0/30.
        np(
            "y",
            "c-out",
            json!({"podSelector": {"matchLabels": {"pod": "c"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}}],
                               "ports": [{"port": 80, "endPort": 81}]},
                              {"to": [{"ipBlock": {"cidr": "198.51.100.0/24", "except": ["198.51.100.0/31"]}}]}]}),
        ),
    ];
    let mut labels = HashMap::new();
    let o = objects(&hosts, &labels, policies.clone());
    let v = view(&hosts, &o);
    let first = program(&node, &v).expect("a first install");
    assert!(first.starts_with("table inet weft-policy {}"), "{first}");
    assert_eq!(program(&node, &v), None, "nothing to do the second time");
    assert_matches_verdicts(&hosts, &v, "as installed");

    // b is relabelled `pod=a`: a-from-b now selects it too (and lets in pods labelled
    // b, of which none is left), and no longer lets it into a.
    labels.insert("b".to_string(), "a".to_string());
    let o2 = objects(&hosts, &labels, policies.clone());
    let v2 = view(&hosts, &o2);
    let script = program(&node, &v2).expect("a change");
    // b joins the group of a: elements change, and b's old group, now empty, goes
    // (with its rule in the dispatch, which is written again); nothing is built.
    for line in script.lines() {
        let dispatch = ["ingress_pods", "egress_pods"]
            .iter()
            .any(|c| line.starts_with(&format!("add rule inet weft-policy {c} ")));
        assert!(
            line.starts_with("add element")
                || line.starts_with("delete ")
                || line.starts_with("flush chain")
                || dispatch,
            "a label change builds nothing:\n{script}"
        );
    }
    assert_matches_verdicts(&hosts, &v2, "after the label change");

    // Drift: a group chain flushed, then the whole table deleted: each read back and
    // repaired.
    let d = plan(&v2);
    let group = d.ingress.values().next().unwrap().clone();
    node.run(|| {
        std::process::Command::new("nft")
            .args(["flush", "chain", "inet", "weft-policy", &group.to_string()])
            .status()
            .unwrap()
    });
    let repair = program(&node, &v2).expect("the flushed chain is seen");
    assert!(
        repair.contains(&format!("add rule inet weft-policy {group}")),
        "{repair}"
    );
    node.run(|| {
        std::process::Command::new("nft")
            .args(["delete", "table", "inet", "weft-policy"])
            .status()
            .unwrap()
    });
    assert!(program(&node, &v2).unwrap().starts_with("table inet weft-policy {}"));
    let read = node.run(|| NftKernel::default().observe().unwrap());
    let mut want = Observed::after(&d);
    want.counters = read.counters.clone();
    assert_eq!(read, want, "the kernel reads back as the plan");
    assert_matches_verdicts(&hosts, &v2, "after the repairs");

    // A new pod of this node, added alone over nfnetlink (an ADD's fast path): the
    // kernel then holds what a full plan with it holds, and it is policed.
    // It is labelled `pod=a`, so it joins the group of a and b: no chain to build.
    let mut hosts = hosts;
    hosts.push(host(&node, 4, "10.9.0.14", "10.9.0.1", Some(("x", "d"))));
    labels.insert("d".to_string(), "a".to_string());
    let o3 = objects(&hosts, &labels, policies.clone());
    let v3 = view(&hosts, &o3);
    let before = plan(&v2);
    let d_pod = v3.pod("x", "d").unwrap();
    let add = weft_policy::plan::addition(&v3, &before, &d_pod, Some(&hosts[4].host_ifname));
    assert!(add.elements_only(), "{add:?}");
    assert!(!add.ingress.is_empty(), "x/d is isolated by x/deny");
    node.run(|| NftKernel::default().add(&add)).unwrap();
    let mut want = Observed::after(&plan(&v3));
    let read = node.run(|| NftKernel::default().observe().unwrap());
    want.counters = read.counters.clone();
    assert_eq!(read, want, "the kernel holds the full plan with x/d");
    let servers_d = serve(&hosts[4], stop.clone());
    assert_matches_verdicts(&hosts, &v3, "with the pod added alone");

    // The first pod of a new group (x/e, labelled `pod=e`: x/deny and x/from-y isolate
    // it, x/a-from-b does not): its chains come with it, in one nfnetlink batch, and
    // the kernel again holds what a full plan holds.
    hosts.push(host(&node, 5, "10.9.0.15", "10.9.0.1", Some(("x", "e"))));
    let o4 = objects(&hosts, &labels, policies.clone());
    let v4 = view(&hosts, &o4);
    let before = plan(&v3);
    let e_pod = v4.pod("x", "e").unwrap();
    let add = weft_policy::plan::addition(&v4, &before, &e_pod, Some(&hosts[5].host_ifname));
    assert!(
        !add.elements_only() && !add.new.chains.is_empty(),
        "a new group: {add:?}"
    );
    node.run(|| NftKernel::default().add(&add)).unwrap();
    let mut want = Observed::after(&plan(&v4));
    let read = node.run(|| NftKernel::default().observe().unwrap());
    want.counters = read.counters.clone();
    assert_eq!(read, want, "the kernel holds the full plan with x/e");
    let servers_e = serve(&hosts[5], stop.clone());
    assert_matches_verdicts(&hosts, &v4, "with a new group's first pod added alone");
    let v2 = v4;

    // A denied connection's first packet comes back through NFLOG with its group's
    // name: what names the pods and policies of a deny event.
    let mut log = node.run(|| weft_kernel::nflog::NflogSocket::bind(weft_policy::plan::LOG_GROUP, 128).unwrap());
    let blocked = hosts
        .iter()
        .flat_map(|s| hosts.iter().map(move |d| (s, d)))
        .find(|(s, d)| s.ip != d.ip && d.pod.is_some() && !v2.verdict(s.ip, d.ip, PortProtocol::Tcp, 81).passes())
        .expect("a blocked pair");
    let target = SocketAddr::new(blocked.1.ip, 81);
    assert!(
        blocked
            .0
            .ns
            .run(|| TcpStream::connect_timeout(&target, Duration::from_millis(300)).is_err())
    );
    let packets = log.next(Duration::from_secs(2)).unwrap();
    let seen = packets
        .iter()
        .find_map(|p| weft_policy::denies::flow_of(&p.payload).map(|f| (p.prefix.clone(), f)))
        .expect("a logged packet");
    assert!(seen.0.starts_with("weft deny g"), "{seen:?}");
    assert_eq!(
        (seen.1.src, seen.1.dst, seen.1.port),
        (blocked.0.ip, blocked.1.ip, Some(81))
    );

    stop.store(true, Ordering::Relaxed);
    for s in servers.into_iter().chain(servers_d).chain(servers_e) {
        s.join().unwrap();
    }
}

fn cnp(name: &str, spec: Value) -> Arc<Strict<weft_topology::ClusterNetworkPolicy>> {
    Arc::new(
        serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1beta1",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": name}, "spec": spec}))
        .unwrap(),
    )
}

/// The ClusterNetworkPolicy tiers in the kernel: Admin Deny over a NetworkPolicy that
/// allows, Admin Accept over a NetworkPolicy that denies, Pass to NetworkPolicy, the
/// Baseline tier for pods no NetworkPolicy isolates, egress to networks; every
/// connection passes exactly when the evaluator says; a priority change swaps the
/// admin chain in one transaction.
#[test]
fn cluster_network_policy_tiers_in_the_kernel() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let hosts = vec![
        host(&node, 10, "10.9.1.10", "10.9.1.1", Some(("x", "a"))),
        host(&node, 11, "10.9.1.11", "10.9.1.1", Some(("x", "b"))),
        host(&node, 12, "10.9.1.12", "10.9.1.1", Some(("y", "c"))),
        host(&node, 13, "198.51.100.3", "198.51.100.1", None),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = hosts.iter().flat_map(|h| serve(h, stop.clone())).collect();
    let policies = vec![
        np("x", "deny", json!({"podSelector": {}})),
        np(
            "x",
            "from-y",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        ),
    ];
    let cnps = |admin_priority: i32| {
        vec![
            cnp(
                "admin-no-y-81",
                json!({"tier": "Admin", "priority": admin_priority, "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                       "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}],
                                    "match": [{"tcp": [{"port": {"number": 81}}]}]},
                                   {"action": "Pass", "from": [{"namespaces": {}}]}]}),
            ),
            cnp(
                "admin-b-ok",
                json!({"tier": "Admin", "priority": 20, "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                       "ingress": [{"action": "Accept", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}}]}]}),
            ),
            cnp(
                "baseline-y",
                json!({"tier": "Baseline", "priority": 1, "subject": {"namespaces": {"matchLabels": {"ns": "y"}}},
                       "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}],
                       "egress": [{"action": "Deny", "to": [{"networks": ["198.51.100.0/24"]}], "ports": [{"portNumber": {"protocol": "TCP", "port": 80}}]}]}),
            ),
        ]
    };
    let labels = HashMap::new();
    let mut o = objects(&hosts, &labels, policies.clone());
    o.cluster_policies = cnps(10);
    let v = view(&hosts, &o);
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    program(&node, &v).expect("a first install");
    assert_eq!(program(&node, &v), None);
    assert_matches_verdicts(&hosts, &v, "with the tiers");

    // admin-no-y-81 after admin-b-ok: b's Accept now comes first for b.
    o.cluster_policies = cnps(30);
    let v2 = view(&hosts, &o);
    program(&node, &v2).expect("a change");
    assert_matches_verdicts(&hosts, &v2, "after the priority change");

    stop.store(true, Ordering::Relaxed);
    for s in servers {
        s.join().unwrap();
    }
}

/// A flow that never sees a reply stays `new` in conntrack: its first packet is decided
/// by the policy chains and the rest by the mark the allowing rule left on its entry,
/// while every packet of a denied flow is decided (and counted) again.
#[test]
fn a_one_way_udp_flow_walks_the_policy_chains_once() {
    if !privileged() {
        return;
    }
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let hosts = vec![
        host(&node, 20, "10.9.2.10", "10.9.2.1", Some(("x", "a"))),
        host(&node, 21, "10.9.2.11", "10.9.2.1", Some(("x", "b"))),
    ];
    let policies = vec![np(
        "x",
        "a-from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                            "ports": [{"protocol": "UDP", "port": 5000}]}]}),
    )];
    let o = objects(&hosts, &HashMap::new(), policies);
    let v = view(&hosts, &o);
    assert_eq!(
        node.run(|| NftKernel::default().counters()).unwrap(),
        Default::default(),
        "no table, no counters"
    );
    program(&node, &v).expect("a first install");

    let rx = hosts[0].ns.run(|| UdpSocket::bind(("0.0.0.0", 5000)).unwrap());
    rx.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let tx = hosts[1].ns.run(|| UdpSocket::bind(("0.0.0.0", 0)).unwrap());
    const PACKETS: u64 = 100;
    for port in [5000u16, 5001] {
        for _ in 0..PACKETS {
            tx.send_to(b"x", (hosts[0].ip, port)).unwrap();
        }
    }
    let mut received = 0;
    let mut buf = [0u8; 16];
    while rx.recv(&mut buf).is_ok() {
        received += 1;
    }
    assert_eq!(received, PACKETS, "the allowed flow's packets all arrive");

    let observed = node.run(|| NftKernel::default().observe()).unwrap();
    let counted = |policy: bool| -> u64 {
        observed
            .counters
            .iter()
            .filter(|(c, _)| match c {
                Counter::Policy { direction, .. } => policy && direction == &Direction::Ingress,
                Counter::Group { direction, .. } => !policy && direction == &Direction::Ingress,
                Counter::ClusterRule { .. } => false,
            })
            .map(|(_, n)| *n)
            .sum()
    };
    assert_eq!(
        counted(true),
        1,
        "the allowed flow is decided by its first packet only: {observed:?}"
    );
    assert_eq!(
        counted(false),
        PACKETS,
        "every packet of the denied flow is decided: {observed:?}"
    );
    // The metrics read the counters over nfnetlink, not through `nft`: the same numbers.
    let dumped = node.run(|| NftKernel::default().counters()).unwrap();
    let listed: std::collections::BTreeMap<String, u64> =
        observed.counters.iter().map(|(c, n)| (c.to_string(), *n)).collect();
    assert_eq!(dumped, listed, "nfnetlink's counters are nft's");
    assert!(dumped.values().any(|n| *n > 0), "{dumped:?}");
}
