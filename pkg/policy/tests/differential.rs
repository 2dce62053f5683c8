//! One meaning for every policy: the table the planner writes, run by the interpreter
//! (`weft_policy::interp`), must decide every flow as the evaluator behind `weftctl
//! policy explain` does. Clusters are generated (namespaces and nodes with labels, pods
//! on this node and another with labels, named ports, IPv4 and IPv6 addresses, host-
//! network pods; NetworkPolicies and ClusterNetworkPolicies of every peer, port and
//! action form, including parts weft must fail closed on), every flow between their
//! ends that crosses this node's forward path is decided both ways, and proptest
//! shrinks a disagreement to a small cluster. No root: the kernel tests check that the
//! kernel does what the interpreter says of the same rules.
//!
//! The check must be able to fail: `planted` runs it against planted bugs on each
//! side (a planner that drops `except`, widens port ranges, passes on Pass; an
//! evaluator that ignores the Baseline tier, named ports, or a NotIn's absent key) and
//! asserts each is found.

use std::net::IpAddr;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use weft_policy::interp::{Packet, Table};
use weft_policy::plan::Desired;
use weft_policy::{ClusterView, LocalPod, NodeInfo, plan};
use weft_topology::{NamedPort, PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol, Strict};

/// This node's name.
const HERE: &str = "n1";

/// The interface traffic from or to anything but this node's pods uses.
const UPLINK: &str = "uplink";

/// How many clusters a run generates (`WEFT_DIFFERENTIAL_CASES` to change it).
fn cases() -> u32 {
    std::env::var("WEFT_DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

// ---- the generated cluster ----

/// A pod: namespace (index), labels (bits), node (here or not), host network, IPv6 too,
/// named ports (bits), whether the API knows it yet (a local pod may be known only to
/// the store).
#[derive(Debug, Clone)]
struct PodGen {
    ns: u8,
    labels: u8,
    here: bool,
    host_network: bool,
    v6: bool,
    ports: u8,
    known: bool,
}

#[derive(Debug, Clone)]
struct ClusterGen {
    ns_labels: [u8; 3],
    node_labels: [u8; 2],
    audit: bool,
    pods: Vec<PodGen>,
    policies: Vec<Value>,
    cnps: Vec<Value>,
}

const NAMESPACES: [&str; 3] = ["x", "y", "z"];

fn pod_labels(bits: u8) -> Vec<(&'static str, &'static str)> {
    let all = [("app", "web"), ("app", "db"), ("role", "client"), ("tier", "front")];
    let mut out: Vec<(&str, &str)> = Vec::new();
    for (i, l) in all.iter().enumerate() {
        // One value per key: "app" takes the first of its values asked for.
        if bits & (1 << i) != 0 && !out.iter().any(|(k, _)| *k == l.0) {
            out.push(*l);
        }
    }
    out
}

fn named_ports(bits: u8) -> Vec<NamedPort> {
    let all = [
        ("http", 8080, PortProtocol::Tcp),
        ("dns", 53, PortProtocol::Udp),
        ("web", 80, PortProtocol::Tcp),
        ("chat", 9, PortProtocol::Sctp),
    ];
    all.iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, (name, port, protocol))| NamedPort {
            name: name.to_string(),
            port: *port,
            protocol: *protocol,
        })
        .collect()
}

fn node_addrs(node: usize) -> Vec<IpAddr> {
    vec![
        format!("172.30.{}.1", node + 1).parse().unwrap(),
        format!("fd00:30:{}::1", node + 1).parse().unwrap(),
    ]
}

fn pod_ips(i: usize, p: &PodGen) -> Vec<IpAddr> {
    let node = usize::from(!p.here);
    if p.host_network {
        return node_addrs(node);
    }
    let mut ips = vec![format!("10.244.{}.{}", node + 1, i + 10).parse().unwrap()];
    if p.v6 {
        ips.push(format!("fd00:244:{}::{:x}", node + 1, i + 10).parse().unwrap());
    }
    ips
}

fn selector(pick: u8) -> Value {
    match pick % 8 {
        0 => json!({}),
        1 => json!({"matchLabels": {"app": "web"}}),
        2 => json!({"matchExpressions": [{"key": "role", "operator": "Exists"}]}),
        3 => json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}),
        4 => json!({"matchLabels": {"tier": "front"}}),
        5 => json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "web"]}]}),
        6 => json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
        _ => json!({"matchLabels": {"app": "db", "role": "client"}}),
    }
}

fn ns_selector(pick: u8) -> Value {
    match pick % 5 {
        0 => json!({}),
        1 => json!({"matchLabels": {"team": "a"}}),
        2 => json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}),
        3 => json!({"matchLabels": {"kubernetes.io/metadata.name": "y"}}),
        _ => json!({"matchExpressions": [{"key": "team", "operator": "Exists"}]}),
    }
}

fn node_selector(pick: u8) -> Value {
    match pick % 3 {
        0 => json!({}),
        1 => json!({"matchLabels": {"role": "db"}}),
        _ => json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
    }
}

/// A NetworkPolicy peer of every form (and one weft must fail closed on).
fn np_peer(pick: u8, arg: u8) -> Value {
    match pick % 8 {
        0 => json!({"podSelector": selector(arg)}),
        1 => json!({"namespaceSelector": ns_selector(arg)}),
        2 => json!({"namespaceSelector": ns_selector(arg), "podSelector": selector(arg / 5)}),
        3 => json!({"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}),
        4 => json!({"ipBlock": {"cidr": "198.51.100.0/24"}}),
        5 => json!({"ipBlock": {"cidr": "fd00:244::/32", "except": ["fd00:244:2::/48"]}}),
        6 => json!({"ipBlock": {"cidr": "172.30.0.0/16"}}),
        // Unknown to weft: the rule allows nothing.
        _ => json!({"podSelector": {}, "serviceAccountSelector": {}}),
    }
}

/// A NetworkPolicy rule's ports of every form (absent included).
fn np_ports(pick: u8) -> Value {
    match pick % 9 {
        0 => Value::Null,
        1 => json!([{"port": 80}]),
        2 => json!([{"port": "http"}]),
        3 => json!([{"protocol": "UDP", "port": 50, "endPort": 60}, {"port": "web"}]),
        4 => json!([{"protocol": "UDP"}]),
        5 => json!([{"protocol": "SCTP", "port": "chat"}]),
        6 => json!([{"port": 80, "endPort": 81}]),
        7 => json!([{"protocol": "UDP", "port": "dns"}, {"port": 8080}]),
        _ => json!([]),
    }
}

fn np_rule(dir: &str, peers: &[(u8, u8)], ports: u8) -> Value {
    let word = if dir == "ingress" { "from" } else { "to" };
    let mut r = json!({});
    if !peers.is_empty() {
        r[word] = Value::Array(peers.iter().map(|(p, a)| np_peer(*p, *a)).collect());
    }
    let ports = np_ports(ports);
    if !ports.is_null() {
        r["ports"] = ports;
    }
    r
}

#[allow(clippy::type_complexity)]
fn network_policy(i: usize, (ns, sel, kind): (u8, u8, u8), rules: &[(bool, Vec<(u8, u8)>, u8)]) -> Value {
    let mut spec = json!({"podSelector": selector(sel)});
    let ingress: Vec<Value> = rules
        .iter()
        .filter(|r| r.0)
        .map(|r| np_rule("ingress", &r.1, r.2))
        .collect();
    let egress: Vec<Value> = rules
        .iter()
        .filter(|r| !r.0)
        .map(|r| np_rule("egress", &r.1, r.2))
        .collect();
    match kind % 4 {
        0 => spec["ingress"] = Value::Array(ingress),
        1 => {
            spec["policyTypes"] = json!(["Egress"]);
            spec["egress"] = Value::Array(egress);
        }
        2 => {
            spec["policyTypes"] = json!(["Ingress", "Egress"]);
            spec["ingress"] = Value::Array(ingress);
            spec["egress"] = Value::Array(egress);
        }
        _ => {
            // policyTypes by default: Ingress, and Egress when egress is given.
            if !ingress.is_empty() {
                spec["ingress"] = Value::Array(ingress);
            }
            if !egress.is_empty() {
                spec["egress"] = Value::Array(egress);
            }
        }
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": NAMESPACES[usize::from(ns % 3)], "name": format!("np{i}")}, "spec": spec})
}

/// A ClusterNetworkPolicy peer of every kind (egress-only ones only for egress).
fn cnp_peer(dir: &str, pick: u8, arg: u8) -> Value {
    let n = if dir == "ingress" { 3 } else { 8 };
    match pick % n {
        0 => json!({"namespaces": ns_selector(arg)}),
        1 => json!({"pods": {"namespaceSelector": ns_selector(arg), "podSelector": selector(arg / 5)}}),
        // Unknown to weft: fails closed by the rule's action.
        2 => json!({"serviceAccounts": {"namespace": "x"}}),
        3 => json!({"networks": ["198.51.100.0/25", "fd00:244:1::/48"]}),
        4 => json!({"networks": ["10.244.1.0/24"]}),
        5 => json!({"nodes": node_selector(arg)}),
        6 => json!({"domainNames": ["api.example.test"]}),
        _ => json!({"networks": ["0.0.0.0/0"]}),
    }
}

/// A ClusterNetworkPolicy rule's ports in the three forms weft reads (and absent).
fn cnp_ports(pick: u8) -> (&'static str, Value) {
    match pick % 10 {
        0 => ("", Value::Null),
        1 => ("protocols", json!([{"tcp": {"destinationPort": {"number": 80}}}])),
        2 => (
            "protocols",
            json!([{"udp": {"destinationPort": {"range": {"start": 50, "end": 60}}}}, {"sctp": {"destinationPort": {"number": 9}}}]),
        ),
        3 => ("protocols", json!([{"destinationNamedPort": "http"}])),
        4 => (
            "match",
            json!([{"tcp": [{"port": {"portRange": {"start": 80, "end": 81}}}]}, {"udp": []}]),
        ),
        5 => ("match", json!([{"namedPort": "web"}])),
        6 => (
            "ports",
            json!([{"portNumber": {"protocol": "UDP", "port": 53}}, {"namedPort": "dns"}]),
        ),
        7 => (
            "ports",
            json!([{"portRange": {"protocol": "TCP", "start": 8000, "end": 8080}}]),
        ),
        // Unknown to weft: fails closed.
        8 => ("protocols", json!([{"icmp": {"type": 8}}])),
        _ => ("protocols", json!([{"tcp": {"destinationPort": {"number": 81}}}])),
    }
}

fn cnp_rule(dir: &str, action: u8, peers: &[(u8, u8)], ports: u8) -> Value {
    let word = if dir == "ingress" { "from" } else { "to" };
    let action = ["Accept", "Deny", "Pass"][usize::from(action % 3)];
    let peers: Vec<Value> = peers.iter().map(|(p, a)| cnp_peer(dir, *p, *a)).collect();
    let mut r = json!({"action": action});
    r[word] = Value::Array(peers);
    let (key, ports) = cnp_ports(ports);
    if !ports.is_null() {
        r[key] = ports;
    }
    r
}

#[allow(clippy::type_complexity)]
fn cluster_policy(i: usize, (tier, priority, subject): (u8, u8, u8), rules: &[(bool, u8, Vec<(u8, u8)>, u8)]) -> Value {
    let subject = if subject % 2 == 0 {
        json!({"namespaces": ns_selector(subject / 2)})
    } else {
        json!({"pods": {"namespaceSelector": ns_selector(subject / 2), "podSelector": selector(subject / 10)}})
    };
    let dir_rules = |ingress: bool| -> Vec<Value> {
        rules
            .iter()
            .filter(|r| r.0 == ingress)
            .map(|r| cnp_rule(if ingress { "ingress" } else { "egress" }, r.1, &r.2, r.3))
            .collect()
    };
    let api_version = ["policy.networking.k8s.io/v1beta1", "policy.networking.k8s.io/v1alpha2"][i % 2];
    json!({"apiVersion": api_version,
           "kind": "ClusterNetworkPolicy", "metadata": {"name": format!("cnp{i}")},
           "spec": {"tier": if tier % 2 == 0 { "Admin" } else { "Baseline" }, "priority": i32::from(priority % 4),
                    "subject": subject, "ingress": dir_rules(true), "egress": dir_rules(false)}})
}

fn peers() -> impl Strategy<Value = Vec<(u8, u8)>> {
    prop::collection::vec((any::<u8>(), any::<u8>()), 0..3)
}

fn cluster() -> impl Strategy<Value = ClusterGen> {
    let pod = (
        any::<u8>(),
        any::<u8>(),
        any::<bool>(),
        0u8..12,
        any::<bool>(),
        any::<u8>(),
        0u8..10,
    )
        .prop_map(|(ns, labels, here, hn, v6, ports, known)| PodGen {
            ns,
            labels,
            here,
            host_network: hn == 0,
            v6,
            ports,
            known: known != 0,
        });
    let np = (
        (any::<u8>(), any::<u8>(), any::<u8>()),
        prop::collection::vec((any::<bool>(), peers(), any::<u8>()), 0..3),
    );
    let cnp = (
        (any::<u8>(), any::<u8>(), any::<u8>()),
        prop::collection::vec(
            (
                any::<bool>(),
                any::<u8>(),
                prop::collection::vec((any::<u8>(), any::<u8>()), 1..3),
                any::<u8>(),
            ),
            0..4,
        ),
    );
    (
        any::<[u8; 3]>(),
        any::<[u8; 2]>(),
        any::<bool>(),
        prop::collection::vec(pod, 1..8),
        prop::collection::vec(np, 0..4),
        prop::collection::vec(cnp, 0..3),
    )
        .prop_map(|(ns_labels, node_labels, audit, pods, nps, cnps)| ClusterGen {
            ns_labels,
            node_labels,
            audit,
            pods,
            policies: nps
                .iter()
                .enumerate()
                .map(|(i, (head, rules))| network_policy(i, *head, rules))
                .collect(),
            cnps: cnps
                .iter()
                .enumerate()
                .map(|(i, (head, rules))| cluster_policy(i, *head, rules))
                .collect(),
        })
}

/// The cluster, as this node's engine would see it.
struct World {
    view: ClusterView,
    /// Every end of a flow: each pod's addresses (local pods with their host
    /// interface), outside addresses, the nodes' addresses.
    ends: Vec<End>,
}

#[derive(Debug, Clone)]
struct End {
    ip: IpAddr,
    /// The host interface of a pod of this node (not host-network).
    ifname: Option<String>,
    /// Whether it is this node's own address.
    own_node: bool,
}

fn world(c: &ClusterGen) -> World {
    let mut o = PolicyObjects {
        synced: true,
        ..PolicyObjects::default()
    };
    for (i, ns) in NAMESPACES.iter().enumerate() {
        let bits = c.ns_labels[i];
        let mut labels = std::collections::BTreeMap::from([
            ("kubernetes.io/metadata.name".to_string(), ns.to_string()),
            ("ns".to_string(), ns.to_string()),
        ]);
        if bits & 1 != 0 {
            labels.insert("team".into(), if bits & 2 != 0 { "a" } else { "b" }.into());
        }
        if bits & 4 != 0 {
            labels.insert("env".into(), "prod".into());
        }
        o.namespaces.push(Arc::new(PolicyNamespace {
            name: ns.to_string(),
            labels,
            audit: c.audit && i == 2,
            workload_flow_metrics: false,
        }));
    }
    let mut local = Vec::new();
    let mut ends = Vec::new();
    for (i, p) in c.pods.iter().enumerate() {
        let pod = PolicyPod {
            namespace: NAMESPACES[usize::from(p.ns % 3)].to_string(),
            name: format!("p{i}"),
            labels: pod_labels(p.labels)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ips: pod_ips(i, p),
            ports: named_ports(p.ports),
            node: if p.here { HERE } else { "n2" }.to_string(),
            host_network: p.host_network,
            workload: String::new(),
        };
        if p.host_network {
            // Its addresses are its node's, which are ends already.
            if p.known {
                o.put_pod(Arc::new(pod));
            }
            continue;
        }
        let ifname = format!("weft{i}");
        if p.here {
            local.push(LocalPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                ips: pod.ips.clone(),
                host_ifname: ifname.clone(),
            });
        }
        for ip in &pod.ips {
            ends.push(End {
                ip: *ip,
                ifname: p.here.then(|| ifname.clone()),
                own_node: false,
            });
        }
        // A pod of this node the API has no object for yet is known to the store only.
        if p.known || !p.here {
            o.put_pod(Arc::new(pod));
        }
    }
    for v in &c.policies {
        o.policies
            .push(Arc::new(serde_json::from_value::<Strict<_>>(v.clone()).unwrap()));
    }
    for v in &c.cnps {
        o.cluster_policies
            .push(Arc::new(serde_json::from_value::<Strict<_>>(v.clone()).unwrap()));
    }
    let nodes: Vec<NodeInfo> = (0..2)
        .map(|n| {
            let bits = c.node_labels[n];
            let mut labels = std::collections::BTreeMap::new();
            if bits & 1 != 0 {
                labels.insert("role".to_string(), "db".to_string());
            }
            if bits & 2 != 0 {
                labels.insert("zone".to_string(), "a".to_string());
            }
            NodeInfo {
                name: format!("n{}", n + 1),
                addresses: node_addrs(n),
                labels,
            }
        })
        .collect();
    for (n, node) in nodes.iter().enumerate() {
        for ip in &node.addresses {
            ends.push(End {
                ip: *ip,
                ifname: None,
                own_node: n == 0,
            });
        }
    }
    for ip in [
        "198.51.100.7",
        "203.0.113.9",
        "fd00:244:1::99",
        "2001:db8::7",
        "10.244.1.200",
    ] {
        ends.push(End {
            ip: ip.parse().unwrap(),
            ifname: None,
            own_node: false,
        });
    }
    World {
        view: ClusterView::new(&o, HERE, &local, &nodes),
        ends,
    }
}

/// The ports every flow is tried on.
const PORTS: [(PortProtocol, u16); 8] = [
    (PortProtocol::Tcp, 80),
    (PortProtocol::Tcp, 81),
    (PortProtocol::Tcp, 8080),
    (PortProtocol::Udp, 53),
    (PortProtocol::Udp, 55),
    (PortProtocol::Udp, 61),
    (PortProtocol::Sctp, 9),
    (PortProtocol::Tcp, 7999),
];

/// What the evaluator says the node's forward path does with a flow: the source's
/// egress if it is this node's pod, the destination's ingress if it is.
type Evaluate = dyn Fn(&ClusterView, &End, &End, PortProtocol, u16) -> bool;

fn evaluator(v: &ClusterView, src: &End, dst: &End, proto: PortProtocol, port: u16) -> bool {
    let verdict = v.verdict(src.ip, dst.ip, proto, port);
    (src.ifname.is_none() || verdict.egress.passes()) && (dst.ifname.is_none() || verdict.ingress.passes())
}

/// What a run decided: flows, of them dropped, clusters with parts read closed.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    flows: u64,
    dropped: u64,
    closed: u64,
}

/// Compares the plan of `w` (by `planner`) run through the interpreter with `evaluate`
/// for every flow that crosses this node's forward path.
fn check(w: &World, planner: &dyn Fn(&ClusterView) -> Desired, evaluate: &Evaluate) -> Result<Tally, String> {
    let d = planner(&w.view);
    let table = Table::new(&d);
    let mut tally = Tally {
        closed: u64::from(!w.view.problems.is_empty()),
        ..Tally::default()
    };
    for src in &w.ends {
        for dst in &w.ends {
            // Only flows from or to a pod of this node cross its forward hook (its own
            // addresses are input and output, never forward).
            if src.ip.is_ipv6() != dst.ip.is_ipv6()
                || (src.ifname.is_none() && dst.ifname.is_none())
                || src.own_node
                || dst.own_node
                || (src.ip == dst.ip && src.ifname.is_none())
            {
                continue;
            }
            for (proto, port) in PORTS {
                let packet = Packet {
                    iif: src.ifname.clone().unwrap_or_else(|| UPLINK.into()),
                    oif: dst.ifname.clone().unwrap_or_else(|| UPLINK.into()),
                    src: src.ip,
                    dst: dst.ip,
                    l4: Some((proto, port)),
                    established: false,
                    mark: 0,
                };
                let kernel = table.run(&packet)?.accepted;
                let want = evaluate(&w.view, src, dst, proto, port);
                tally.flows += 1;
                tally.dropped += u64::from(!kernel);
                if kernel != want {
                    let mut chains = String::new();
                    for (c, rules) in &d.chains {
                        chains.push_str(&format!("  {c}:\n"));
                        for r in rules {
                            chains.push_str(&format!("    {r}\n"));
                        }
                    }
                    return Err(format!(
                        "{} -> {} {proto}/{port}: the table {}, the evaluator {}\n\
                         evaluator: {:?}\negress {:?}\ningress {:?}\nchains:\n{chains}sets: {:?}\nproblems: {:?}",
                        src.ip,
                        dst.ip,
                        if kernel { "forwards" } else { "drops" },
                        if want { "forwards" } else { "drops" },
                        w.view.verdict(src.ip, dst.ip, proto, port),
                        d.egress,
                        d.ingress,
                        d.sets,
                        w.view.problems,
                    ));
                }
            }
        }
    }
    Ok(tally)
}

fn run(cases: u32, planner: &dyn Fn(&ClusterView) -> Desired, evaluate: &Evaluate) -> Result<Tally, String> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let total = std::cell::Cell::new(Tally::default());
    runner
        .run(&cluster(), |c| {
            let w = world(&c);
            let t = check(&w, planner, evaluate).map_err(TestCaseError::fail)?;
            let sum = total.get();
            total.set(Tally {
                flows: sum.flows + t.flows,
                dropped: sum.dropped + t.dropped,
                closed: sum.closed + t.closed,
            });
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(total.get())
}

/// The differential test itself: thousands of clusters, every flow.
#[test]
fn the_table_decides_every_flow_as_the_evaluator_does() {
    let n = cases();
    let t = run(n, &plan, &evaluator).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{n} clusters ({} with parts read closed), {} flows ({} dropped): the table and the evaluator agree",
        t.closed, t.flows, t.dropped
    );
    assert!(t.flows > u64::from(n), "the clusters have flows to decide");
    assert!(
        t.dropped * 10 > t.flows && t.dropped * 10 < t.flows * 9,
        "both verdicts are common: {t:?}"
    );
    assert!(
        u64::from(n) < t.closed * 20,
        "clusters with parts read closed are common: {t:?}"
    );
}

mod planted {
    //! Planted bugs, one per side and kind: each must be found (and shrunk) within the
    //! run's clusters.

    use weft_policy::names::{SetName, SetRole};
    use weft_policy::plan::Element;
    use weft_policy::rule::{Match, Verdict};
    use weft_topology::CnpTier;

    use super::*;

    fn found(planner: &dyn Fn(&ClusterView) -> Desired, evaluate: &Evaluate) -> String {
        match run(cases(), planner, evaluate) {
            Ok(t) => panic!("a planted bug went unnoticed over {} flows", t.flows),
            Err(e) => e,
        }
    }

    #[test]
    fn a_planner_that_forgets_except_is_caught() {
        let e = found(
            &|v| {
                let mut d = plan(v);
                for (name, set) in &mut d.sets {
                    if let SetName::Data {
                        role: SetRole::Ranges, ..
                    } = name
                    {
                        let all: Vec<IpAddr> = set
                            .elements
                            .iter()
                            .flat_map(|e| match e {
                                Element::Range(a, b) => vec![*a, *b],
                                _ => vec![],
                            })
                            .collect();
                        let (lo, hi) = (*all.iter().min().unwrap(), *all.iter().max().unwrap());
                        set.elements = [Element::Range(lo, hi)].into();
                    }
                }
                d
            },
            &evaluator,
        );
        eprintln!("found: {}", e.lines().next().unwrap_or_default());
    }

    #[test]
    fn a_planner_that_widens_port_ranges_is_caught() {
        found(
            &|v| {
                let mut d = plan(v);
                for rules in d.chains.values_mut() {
                    for r in rules {
                        for m in &mut r.matches {
                            if let Match::Port { to, .. } = m {
                                *to = to.saturating_add(1);
                            }
                        }
                    }
                }
                d
            },
            &evaluator,
        );
    }

    #[test]
    fn a_planner_that_accepts_on_pass_is_caught() {
        found(
            &|v| {
                let mut d = plan(v);
                for rules in d.chains.values_mut() {
                    for r in rules {
                        if r.counter.is_some() && matches!(r.verdict, Verdict::Goto(_) | Verdict::Return) {
                            r.verdict = Verdict::Accept;
                        }
                    }
                }
                d
            },
            &evaluator,
        );
    }

    #[test]
    fn an_evaluator_that_forgets_the_baseline_tier_is_caught() {
        found(&plan, &|v, s, d, proto, port| {
            let mut v2 = v.clone();
            v2.cluster_policies.retain(|c| c.tier != CnpTier::Baseline);
            evaluator(&v2, s, d, proto, port)
        });
    }

    #[test]
    fn an_evaluator_that_forgets_named_ports_is_caught() {
        found(&plan, &|v, s, d, proto, port| {
            let mut v2 = v.clone();
            for p in v2.by_ip.values_mut() {
                let mut q = (**p).clone();
                q.ports.clear();
                *p = Arc::new(q);
            }
            evaluator(&v2, s, d, proto, port)
        });
    }

    #[test]
    fn an_evaluator_that_sees_a_label_a_pod_lacks_is_caught() {
        found(&plan, &|v, s, d, proto, port| {
            // A pod without `app` read as `app=db`: `app notin (db)` and `tier`-less
            // selectors among others then decide wrongly.
            let mut v2 = v.clone();
            for p in v2.by_ip.values_mut() {
                if !p.labels.contains_key("app") {
                    let mut q = (**p).clone();
                    q.labels.insert("app".into(), "db".into());
                    *p = Arc::new(q);
                }
            }
            evaluator(&v2, s, d, proto, port)
        });
    }
}
