//! The evaluator against hand-written truth tables, on the upstream e2e suite's cluster
//! (test/e2e/network/netpol): namespaces x, y, z labelled `ns=<name>`, pods a, b, c in
//! each labelled `pod=<name>`, serving 80 and 81 over TCP and UDP (ports named
//! `serve-80-tcp` etc.). A table has a row per source and a column per destination,
//! `.` passing and `X` blocked; a pod always reaches itself (its traffic never leaves
//! it).

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use weft_topology::{NamedPort, PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol, Strict};

use super::*;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];

fn ip_of(ns: usize, pod: usize) -> IpAddr {
    format!("10.244.{}.{}", ns + 1, pod + 10).parse().unwrap()
}

fn cluster(policies: &[Value]) -> ClusterView {
    let mut o = PolicyObjects {
        synced: true,
        ..PolicyObjects::default()
    };
    for (i, ns) in NAMESPACES.iter().enumerate() {
        o.namespaces.push(Arc::new(PolicyNamespace {
            name: ns.to_string(),
            labels: [("ns".to_string(), ns.to_string())].into(),
            audit: false,
            workload_flow_metrics: false,
        }));
        for (j, pod) in PODS.iter().enumerate() {
            let ports = [80u16, 81]
                .iter()
                .flat_map(|p| {
                    PortProtocol::ALL.iter().map(move |proto| NamedPort {
                        name: format!("serve-{p}-{proto}"),
                        port: *p,
                        protocol: *proto,
                    })
                })
                .collect();
            o.put_pod(Arc::new(PolicyPod {
                namespace: ns.to_string(),
                name: pod.to_string(),
                labels: [("pod".to_string(), pod.to_string())].into(),
                ips: vec![ip_of(i, j)],
                ports,
                node: format!("n{}", (i * 3 + j) % 3 + 1),
                host_network: false,
                workload: String::new(),
            }));
        }
    }
    for p in policies {
        o.policies.push(Arc::new(
            serde_json::from_value::<Strict<NetworkPolicy>>(p.clone()).unwrap(),
        ));
    }
    let v = ClusterView::new(&o, "n1", &[], &[]);
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    v
}

/// The truth table of the cluster for one port and protocol.
fn matrix(v: &ClusterView, proto: PortProtocol, port: u16) -> String {
    let mut out = String::new();
    for si in 0..3 {
        for sj in 0..3 {
            for di in 0..3 {
                for dj in 0..3 {
                    let pass = (si, sj) == (di, dj) || v.verdict(ip_of(si, sj), ip_of(di, dj), proto, port).passes();
                    out.push(if pass { '.' } else { 'X' });
                }
                out.push(' ');
            }
            out.pop();
            out.push('\n');
        }
    }
    out
}

/// A table written as nine rows (x/a .. z/c) of nine columns in groups of three.
fn table(rows: &[&str]) -> String {
    rows.iter().map(|r| format!("{r}\n")).collect()
}

fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

const ALL: [&str; 9] = [
    "... ... ...",
    "... ... ...",
    "... ... ...",
    "... ... ...",
    "... ... ...",
    "... ... ...",
    "... ... ...",
    "... ... ...",
    "... ... ...",
];

#[test]
fn without_policies_everything_passes() {
    assert_eq!(matrix(&cluster(&[]), PortProtocol::Tcp, 80), table(&ALL));
}

/// "should support a 'default-deny-ingress' policy": nothing reaches x's pods.
#[test]
fn default_deny_ingress() {
    let v = cluster(&[policy("x", "deny", json!({"podSelector": {}}))]);
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            ".XX ... ...",
            "X.X ... ...",
            "XX. ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
        ])
    );
}

/// "should support a 'default-deny-all' policy": no ingress and no egress in x.
#[test]
fn default_deny_all() {
    let v = cluster(&[policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    )]);
    assert_eq!(
        matrix(&v, PortProtocol::Udp, 81),
        table(&[
            ".XX XXX XXX",
            "X.X XXX XXX",
            "XX. XXX XXX",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
        ])
    );
}

/// "should enforce policy to allow traffic from pods within server namespace based on
/// PodSelector": x/a takes only x/b.
#[test]
fn pod_selector_in_the_own_namespace() {
    let v = cluster(&[policy(
        "x",
        "allow-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            "... ... ...",
            "... ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
        ])
    );
}

/// "should enforce policy based on NamespaceSelector with MatchExpressions": x/a
/// takes every pod of namespaces whose `ns` is not x... expressed as In (y).
#[test]
fn namespace_selector_with_match_expressions() {
    let v = cluster(&[policy(
        "x",
        "allow-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                   {"key": "ns", "operator": "In", "values": ["y"]}]}}]}]}),
    )]);
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            "... ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
        ])
    );
}

/// "should enforce policy based on PodSelector and NamespaceSelector" (both in one
/// peer: pod b of namespaces other than x) against the two peers apart ("OR").
#[test]
fn pod_and_namespace_selector_together_and_apart() {
    let both = cluster(&[policy(
        "x",
        "and",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                   {"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                   "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    assert_eq!(
        matrix(&both, PortProtocol::Tcp, 80),
        table(&[
            "... ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "... ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "... ... ...",
            "X.. ... ...",
        ])
    );
    let apart = cluster(&[policy(
        "x",
        "or",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                                     {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    assert_eq!(
        matrix(&apart, PortProtocol::Tcp, 80),
        table(&[
            "... ... ...",
            "... ... ...",
            "X.. ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "X.. ... ...",
            "X.. ... ...",
            "X.. ... ...",
        ])
    );
}

/// "should allow ingress access on one named port" and on a port number: only 81 of
/// x/a is open, named or numbered; 80 is not.
#[test]
fn ports_by_number_and_by_name() {
    for port in [json!(81), json!("serve-81-tcp")] {
        let v = cluster(&[policy(
            "x",
            "p81",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"ports": [{"port": port}]}]}),
        )]);
        assert_eq!(matrix(&v, PortProtocol::Tcp, 81), table(&ALL), "{port}");
        let closed = matrix(&v, PortProtocol::Tcp, 80);
        assert_eq!(closed.matches('X').count(), 8, "{port}:\n{closed}");
        assert_eq!(matrix(&v, PortProtocol::Udp, 81).matches('X').count(), 8, "TCP only");
    }
    // A name no pod has opens nothing.
    let v = cluster(&[policy(
        "x",
        "nope",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"port": "serve-82-tcp"}]}]}),
    )]);
    assert_eq!(matrix(&v, PortProtocol::Tcp, 80).matches('X').count(), 8);
}

/// "should enforce policy to allow ingress traffic from pods in all namespaces" with a
/// port range (endPort): 80-81 of x/a over UDP.
#[test]
fn end_port_ranges() {
    let v = cluster(&[policy(
        "x",
        "range",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {}}],
                            "ports": [{"protocol": "UDP", "port": 80, "endPort": 81}]}]}),
    )]);
    assert_eq!(matrix(&v, PortProtocol::Udp, 80), table(&ALL));
    assert_eq!(matrix(&v, PortProtocol::Udp, 81), table(&ALL));
    assert_eq!(matrix(&v, PortProtocol::Tcp, 80).matches('X').count(), 8);
    assert_eq!(matrix(&v, PortProtocol::Udp, 82).matches('X').count(), 8);
}

/// "should allow egress access to server in CIDR block" with `except`: x/a may reach
/// all of 10.244.0.0/16 but y's /24, only on 80.
#[test]
fn egress_ip_block_with_except() {
    let v = cluster(&[policy(
        "x",
        "cidr",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}],
                           "ports": [{"port": 80}]}]}),
    )]);
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            "... XXX ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
        ])
    );
    // And to an address outside the cluster (the masquerade's path, matched before NAT).
    let a = ip_of(0, 0);
    let outside: IpAddr = "198.51.100.2".parse().unwrap();
    assert!(!v.verdict(a, outside, PortProtocol::Tcp, 80).passes());
    let v2 = cluster(&[policy(
        "x",
        "out",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}]}),
    )]);
    let verdict = v2.verdict(a, outside, PortProtocol::Tcp, 80);
    assert!(verdict.passes());
    assert_eq!(
        verdict.egress.allowed_by,
        Some(RuleRef {
            policy: "x/out".into(),
            rule: 0
        })
    );
}

/// Two policies selecting one pod allow the union of their rules; the verdict names
/// every isolating policy and the rule that allowed.
#[test]
fn policies_add_up_and_the_verdict_explains() {
    let v = cluster(&[
        policy(
            "x",
            "from-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
        policy(
            "x",
            "from-y",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        ),
    ]);
    let (xa, xb, xc, ya) = (ip_of(0, 0), ip_of(0, 1), ip_of(0, 2), ip_of(1, 0));
    let from_y = v.verdict(ya, xa, PortProtocol::Tcp, 80);
    assert!(from_y.passes());
    assert_eq!(from_y.ingress.isolating, vec!["x/from-b", "x/from-y"]);
    assert_eq!(from_y.ingress.allowed_by.as_ref().unwrap().policy, "x/from-y");
    assert!(!from_y.egress.policed || from_y.egress.isolating.is_empty());
    let from_c = v.verdict(xc, xa, PortProtocol::Tcp, 80);
    assert!(!from_c.passes());
    assert_eq!(from_c.ingress.allowed_by, None);
    assert!(v.verdict(xb, xa, PortProtocol::Tcp, 80).passes());
    assert!(
        !v.verdict(xa, xb, PortProtocol::Tcp, 80).passes(),
        "from-y isolates b too"
    );
}

/// A namespace in audit mode forwards what it would deny, and says it would.
#[test]
fn audit_mode_forwards_and_says_so() {
    let mut o = PolicyObjects::default();
    o.namespaces.push(Arc::new(PolicyNamespace {
        name: "x".into(),
        labels: Default::default(),
        audit: true,
        workload_flow_metrics: false,
    }));
    let pod = |name: &str, ip: &str| {
        Arc::new(PolicyPod {
            namespace: "x".into(),
            name: name.into(),
            ips: vec![ip.parse().unwrap()],
            node: "n1".into(),
            ..PolicyPod::default()
        })
    };
    o.pods = weft_topology::policy_pods([pod("a", "10.0.0.1"), pod("b", "10.0.0.2")]);
    o.policies.push(Arc::new(
        serde_json::from_value(policy("x", "deny", json!({"podSelector": {}}))).unwrap(),
    ));
    let v = ClusterView::new(&o, "n1", &[], &[]);
    let verdict = v.verdict(
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        PortProtocol::Tcp,
        80,
    );
    assert!(!verdict.allowed());
    assert!(verdict.passes());
    assert!(verdict.ingress.audit);
}

/// Traffic from a pod's own node is never policed; a host-network pod is never policed
/// and is no pod peer; a local pod the API does not know yet is policed with no labels.
#[test]
fn node_traffic_host_network_and_unknown_local_pods() {
    let mut o = PolicyObjects::default();
    o.put_pod(Arc::new(PolicyPod {
        namespace: "x".into(),
        name: "a".into(),
        labels: [("pod".to_string(), "a".to_string())].into(),
        ips: vec!["10.0.0.1".parse().unwrap()],
        node: "n1".into(),
        ..PolicyPod::default()
    }));
    o.put_pod(Arc::new(PolicyPod {
        namespace: "x".into(),
        name: "h".into(),
        labels: [("pod".to_string(), "h".to_string())].into(),
        ips: vec!["172.30.1.2".parse().unwrap()],
        node: "n1".into(),
        host_network: true,
        ..PolicyPod::default()
    }));
    o.policies.push(Arc::new(
        serde_json::from_value(policy(
            "x",
            "only-h",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "h"}}}]}]}),
        ))
        .unwrap(),
    ));
    let node = |name: &str, ip: &str| NodeInfo {
        name: name.into(),
        addresses: vec![ip.parse().unwrap()],
        ..NodeInfo::default()
    };
    let nodes = [node("n1", "172.30.1.2"), node("n2", "172.30.2.2")];
    let local = [LocalPod {
        namespace: "x".into(),
        name: "new".into(),
        ips: vec!["10.0.0.9".parse().unwrap()],
        host_ifname: "weft0".into(),
    }];
    let v = ClusterView::new(&o, "n1", &local, &nodes);
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    assert!(
        v.verdict("172.30.1.2".parse().unwrap(), a, PortProtocol::Tcp, 80)
            .passes(),
        "own node"
    );
    assert!(
        !v.verdict("172.30.2.2".parse().unwrap(), a, PortProtocol::Tcp, 80)
            .passes(),
        "another node"
    );
    assert_eq!(v.unknown_local, vec![("x".to_string(), "new".to_string())]);
    let new: IpAddr = "10.0.0.9".parse().unwrap();
    assert!(
        !v.verdict(a, new, PortProtocol::Tcp, 80).passes(),
        "{{}} selects an unlabelled pod"
    );
    assert!(v.verdict(new, a, PortProtocol::Tcp, 80).ingress.policed);
}

mod tiers;

/// A flow without ports (ICMP) is taken by a rule naming no ports only: a rule with
/// ports never matches it.
#[test]
fn a_flow_without_ports_is_taken_only_by_a_rule_without_ports() {
    let (a, b) = (ip_of(0, 0), ip_of(1, 1));
    let ported = cluster(&[policy(
        "y",
        "web",
        json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Ingress"],
               "ingress": [{"ports": [{"port": 80}]}]}),
    )]);
    assert!(ported.verdict(a, b, PortProtocol::Tcp, 80).passes());
    assert!(!ported.verdict_l4(a, b, None).passes(), "ICMP is no port 80");
    let open = cluster(&[policy(
        "y",
        "any",
        json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Ingress"], "ingress": [{}]}),
    )]);
    let v = open.verdict_l4(a, b, None);
    assert!(v.passes());
    assert_eq!(v.ingress.allowed_by.unwrap().policy, "y/any");
}

fn with_mode(mut p: Value, mode: &str) -> Value {
    p["metadata"]["annotations"] = json!({"weft.dev/policy-mode": mode});
    p
}

/// A staged policy is evaluated only in the staged view; one staged for removal is
/// enforced and gone from the staged view; a mode weft does not know enforces the policy
/// as written and says so.
#[test]
fn staged_policies_preview_without_enforcing() {
    let deny_x = policy("x", "deny", json!({"podSelector": {}}));
    let (y, x) = (ip_of(1, 0), ip_of(0, 0));
    let v = cluster(&[with_mode(deny_x.clone(), "staged")]);
    assert!(v.policies.is_empty(), "a staged policy is not enforced");
    assert!(v.verdict(y, x, PortProtocol::Tcp, 80).passes());
    let staged = v.staged().expect("a staged view");
    let sv = staged.verdict(y, x, PortProtocol::Tcp, 80);
    assert!(!sv.passes(), "the preview denies");
    assert_eq!(sv.ingress.isolating, ["x/deny"]);

    let v = cluster(&[with_mode(deny_x.clone(), "staged-removal")]);
    assert!(!v.verdict(y, x, PortProtocol::Tcp, 80).passes(), "still enforced");
    assert!(v.staged().unwrap().verdict(y, x, PortProtocol::Tcp, 80).passes());

    assert!(
        cluster(std::slice::from_ref(&deny_x)).staged().is_none(),
        "nothing staged, no preview"
    );

    let mut o = PolicyObjects::default();
    o.policies.push(Arc::new(
        serde_json::from_value::<Strict<NetworkPolicy>>(with_mode(deny_x, "stagged")).unwrap(),
    ));
    let v = ClusterView::new(&o, "n1", &[], &[]);
    assert_eq!(v.policies.len(), 1, "an unknown mode is enforced");
    assert_eq!(v.problems.len(), 1);
    assert_eq!(v.problems[0].effect, Effect::EnforcedAsWritten);
    assert!(v.problems[0].to_string().contains("stagged"), "{}", v.problems[0]);
}
