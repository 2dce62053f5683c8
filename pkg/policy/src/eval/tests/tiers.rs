//! ClusterNetworkPolicy tiers against the same truth tables: Admin before NetworkPolicy,
//! Baseline after, priorities, Pass.

use super::*;

fn cnp(name: &str, tier: &str, priority: i32, spec: Value) -> Arc<Strict<weft_topology::ClusterNetworkPolicy>> {
    let mut s = spec;
    s["tier"] = tier.into();
    s["priority"] = priority.into();
    Arc::new(
        serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": name}, "spec": s}))
        .unwrap(),
    )
}

fn tiered(policies: &[Value], cnps: Vec<Arc<Strict<weft_topology::ClusterNetworkPolicy>>>) -> ClusterView {
    let base = cluster(policies);
    let mut o = PolicyObjects {
        synced: true,
        namespaces: base.namespaces.values().cloned().collect(),
        pods: weft_topology::policy_pods(base.pods.iter().cloned()),
        cluster_policies: cnps,
        ..PolicyObjects::default()
    };
    for p in policies {
        o.policies.push(Arc::new(
            serde_json::from_value::<Strict<NetworkPolicy>>(p.clone()).unwrap(),
        ));
    }
    let v = ClusterView::new(&o, "n1", &[], &[]);
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    v
}

fn ns_is(ns: &str) -> Value {
    json!({"matchLabels": {"ns": ns}})
}

/// network-policy-api conformance, Admin tier: a Deny from y into x wins over a
/// NetworkPolicy that allows y; an Accept from z wins over x's default deny; the
/// verdict names the deciding rule.
#[test]
fn the_admin_tier_decides_before_network_policy() {
    let v = tiered(
        &[
            policy("x", "deny", json!({"podSelector": {}})),
            policy(
                "x",
                "from-y",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
            ),
        ],
        vec![cnp(
            "admin",
            "Admin",
            10,
            json!({"subject": {"namespaces": ns_is("x")}, "ingress": [
                {"name": "no-y", "action": "Deny", "from": [{"namespaces": ns_is("y")}]},
                {"name": "z-ok", "action": "Accept", "from": [{"namespaces": ns_is("z")}]}]}),
        )],
    );
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            ".XX ... ...",
            "X.X ... ...",
            "XX. ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "XXX ... ...",
            "... ... ...",
            "... ... ...",
            "... ... ...",
        ])
    );
    let verdict = v.verdict(ip_of(1, 0), ip_of(0, 0), PortProtocol::Tcp, 80);
    let d = verdict.ingress.cluster.unwrap();
    assert_eq!(
        (d.policy.as_str(), d.rule, d.rule_name.as_str(), d.action),
        ("admin", 0, "no-y", weft_topology::CnpAction::Deny)
    );
}

/// Pass hands over to NetworkPolicy, and without one to the Baseline tier; a lower
/// priority goes first.
#[test]
fn pass_priorities_and_the_baseline_tier() {
    let v = tiered(
        &[policy("y", "deny", json!({"podSelector": {}}))],
        vec![
            cnp(
                "first",
                "Admin",
                5,
                json!({"subject": {"namespaces": {}}, "ingress": [{"action": "Pass", "from": [{"namespaces": ns_is("z")}]}]}),
            ),
            cnp(
                "then",
                "Admin",
                50,
                json!({"subject": {"namespaces": {}}, "ingress": [{"action": "Deny", "from": [{"namespaces": ns_is("z")}]}]}),
            ),
            cnp(
                "baseline",
                "Baseline",
                1,
                json!({"subject": {"namespaces": {}}, "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
            ),
        ],
    );
    // z is passed by "first" (so "then" never denies it), then: into y the NetworkPolicy
    // decides (deny), into x and z the baseline denies everything.
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            ".XX XXX XXX",
            "X.X XXX XXX",
            "XX. XXX XXX",
            "XXX .XX XXX",
            "XXX X.X XXX",
            "XXX XX. XXX",
            "XXX XXX .XX",
            "XXX XXX X.X",
            "XXX XXX XX.",
        ])
    );
    let into_y = v.verdict(ip_of(2, 0), ip_of(1, 0), PortProtocol::Tcp, 80);
    assert_eq!(into_y.ingress.cluster, None, "NetworkPolicy decided");
    assert_eq!(into_y.ingress.isolating, vec!["y/deny"]);
    let into_x = v.verdict(ip_of(2, 0), ip_of(0, 0), PortProtocol::Tcp, 80);
    assert_eq!(into_x.ingress.cluster.unwrap().policy, "baseline");
}

/// Egress to networks by the Admin tier, with ports in both forms.
#[test]
fn admin_egress_to_networks_and_ports() {
    let v = tiered(
        &[],
        vec![cnp(
            "egress",
            "Admin",
            1,
            json!({"subject": {"pods": {"namespaceSelector": ns_is("x"), "podSelector": {"matchLabels": {"pod": "a"}}}},
                   "egress": [
                       {"action": "Accept", "to": [{"networks": ["10.244.2.10/32"]}], "match": [{"tcp": [{"port": {"number": 80}}]}]},
                       {"action": "Deny", "to": [{"networks": ["10.244.0.0/16"]}], "ports": [{"portNumber": {"protocol": "TCP", "port": 80}}]}]}),
        )],
    );
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 80),
        table(&[
            ".XX .XX XXX",
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
    assert_eq!(
        matrix(&v, PortProtocol::Tcp, 81),
        table(&ALL),
        "other ports are left alone"
    );
}

/// A `domainNames` Accept allows what the node learnt for a matching name, and only
/// that, until the learnt address is forgotten; the rest of x's egress is denied.
#[test]
fn a_domain_rule_allows_what_was_learnt_for_its_names() {
    let v = tiered(
        &[],
        vec![cnp(
            "egress-by-name",
            "Admin",
            5,
            json!({"subject": {"namespaces": ns_is("x")}, "egress": [
                {"name": "api", "action": "Accept", "to": [{"domainNames": ["api.example.test", "*.mirror.test"]}]},
                {"name": "rest", "action": "Deny", "to": [{"networks": ["0.0.0.0/0", "::/0"]}]}]}),
        )],
    );
    let api: std::net::IpAddr = "192.0.2.10".parse().unwrap();
    let mirror: std::net::IpAddr = "192.0.2.20".parse().unwrap();
    let other: std::net::IpAddr = "192.0.2.30".parse().unwrap();
    let x = ip_of(0, 0);
    let allowed = |dst| v.verdict(x, dst, PortProtocol::Tcp, 443).allowed();
    assert!(!allowed(api), "nothing learnt yet");
    {
        let mut l = v.learnt.write().unwrap();
        l.learn("api.example.test", api, 60, 0);
        l.learn("deb.mirror.test", mirror, 60, 0);
        l.learn("mirror.test", other, 60, 0);
    }
    assert!(allowed(api));
    assert!(allowed(mirror), "*.mirror.test takes deb.mirror.test");
    assert!(!allowed(other), "not mirror.test itself");
    let d = v.verdict(x, api, PortProtocol::Tcp, 443).egress.cluster.unwrap();
    assert_eq!((d.policy.as_str(), d.rule_name.as_str()), ("egress-by-name", "api"));
    v.learnt.write().unwrap().expire(60_000);
    assert!(!allowed(api), "forgotten at its TTL's end");
}
