use serde_json::{Value, json};

use super::*;

fn strict(spec: Value) -> Strict<ClusterNetworkPolicy> {
    weft_topology::strict::decode(&json!({
        "apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "c"}, "spec": spec
    }))
    .unwrap()
}

fn read(spec: Value) -> Read<ClusterPolicy> {
    ClusterPolicy::read(&strict(spec))
}

/// An Admin policy with one egress rule `rule`.
fn one_rule(rule: Value) -> Read<ClusterPolicy> {
    read(json!({"tier": "Admin", "priority": 10, "subject": {"namespaces": {}}, "egress": [rule]}))
}

fn ports_of(r: &ClusterRule) -> Vec<String> {
    r.ports.iter().flatten().map(ToString::to_string).collect()
}

/// Each way ports are written reads to the same ports, exactly as written.
#[test]
fn every_port_form_reads_as_written() {
    let to = json!([{"namespaces": {}}]);
    for (ports, want) in [
        (
            json!({"protocols": [{"tcp": {"destinationPort": {"number": 81}}}]}),
            vec!["81/tcp"],
        ),
        (
            json!({"protocols": [{"udp": {"destinationPort": {"range": {"start": 1000, "end": 1002}}}},
                                  {"sctp": {"destinationPort": {"number": 9}}}]}),
            vec!["1000-1002/udp", "9/sctp"],
        ),
        (
            json!({"protocols": [{"destinationNamedPort": "web"}]}),
            vec!["web/tcp", "web/udp", "web/sctp"],
        ),
        (
            json!({"match": [{"tcp": [{"port": {"number": 81}}, {"port": {"portRange": {"start": 90, "end": 99}}}]},
                             {"udp": []}, {"namedPort": "dns"}]}),
            vec!["81/tcp", "90-99/tcp", "udp", "dns/tcp", "dns/udp", "dns/sctp"],
        ),
        (
            json!({"ports": [{"portNumber": {"protocol": "TCP", "port": 81}},
                             {"portRange": {"protocol": "UDP", "start": 5, "end": 6}}, {"namedPort": "web"}]}),
            vec!["81/tcp", "5-6/udp", "web/tcp", "web/udp", "web/sctp"],
        ),
    ] {
        let mut rule = json!({"action": "Accept", "to": to});
        for (k, v) in ports.as_object().unwrap() {
            rule[k] = v.clone();
        }
        let r = one_rule(rule);
        assert!(r.problems.is_empty(), "{ports}: {:?}", r.problems);
        let p = r.policy.unwrap();
        assert_eq!(ports_of(&p.egress[0]), want, "{ports}");
        assert_eq!(p.egress[0].fail_closed, None);
    }
    let r = one_rule(json!({"action": "Deny", "to": to}));
    assert_eq!(r.policy.unwrap().egress[0].ports, None, "no ports: every port");
}

/// What a rule cannot be read fails closed as upstream says: an Accept rule matches
/// nothing, a Deny or Pass rule denies all; each is said, naming the field.
#[test]
fn a_rule_that_cannot_be_read_fails_closed_by_its_action() {
    let ns = json!([{"namespaces": {}}]);
    for (rule, field) in [
        (
            json!({"to": [{"serviceAccounts": {}}]}),
            "spec.egress[0].to[0].serviceAccounts",
        ),
        (json!({"to": [{}]}), "spec.egress[0].to[0]"),
        (
            json!({"to": ns, "protocols": [{"icmp": {}}]}),
            "spec.egress[0].protocols[0].icmp",
        ),
        (
            json!({"to": ns, "protocols": [{"tcp": {}}]}),
            "spec.egress[0].protocols[0].tcp",
        ),
        (
            json!({"to": ns, "protocols": [{"tcp": {"destinationPort": {}}}]}),
            "spec.egress[0].protocols[0].tcp.destinationPort",
        ),
        (
            json!({"to": ns, "protocols": [{"tcp": {"destinationPort": {"number": 80, "range": {"start": 1, "end": 2}}}}]}),
            "spec.egress[0].protocols[0].tcp.destinationPort",
        ),
        (
            json!({"to": ns, "protocols": [{"tcp": {"destinationPort": {"range": {"start": 9, "end": 9}}}}]}),
            "spec.egress[0].protocols[0].tcp.destinationPort.range",
        ),
        (
            json!({"to": ns, "protocols": [{"tcp": {"destinationPort": {"number": 70000}}}]}),
            "spec.egress[0].protocols[0].tcp.destinationPort.number",
        ),
        (json!({"to": ns, "protocols": []}), "spec.egress[0].protocols"),
        (
            json!({"to": ns, "protocols": [{"tcp": {"destinationPort": {"number": 1}}, "udp": {"destinationPort": {"number": 1}}}]}),
            "spec.egress[0].protocols[0]",
        ),
        (
            json!({"to": ns, "protocols": [{"tcp": {"destinationPort": {"number": 1}}}], "ports": [{"namedPort": "x"}]}),
            "spec.egress[0]",
        ),
        (json!({"to": ns, "sourcePorts": [1]}), "spec.egress[0].sourcePorts"),
        (
            json!({"to": [{"domainNames": ["example..com"]}]}),
            "spec.egress[0].to[0].domainNames[0]",
        ),
        (json!({"to": [{"domainNames": []}]}), "spec.egress[0].to[0].domainNames"),
        (
            json!({"to": [{"networks": ["10.0.0.0/8"]}], "protocols": [{"destinationNamedPort": "web"}]}),
            "spec.egress[0]",
        ),
        (
            json!({"to": [{"networks": ["10.0.0.0/33"]}]}),
            "spec.egress[0].to[0].networks[0]",
        ),
    ] {
        for action in ["Accept", "Deny", "Pass"] {
            let mut r = rule.clone();
            r["action"] = action.into();
            r["name"] = "r".into();
            let read = one_rule(r);
            let at = RuleAt {
                direction: Direction::Egress,
                index: 0,
            };
            assert_eq!(read.problems.len(), 1, "{rule} {action}: {:?}", read.problems);
            let e = &read.problems[0];
            assert_eq!(e.field, field, "{rule} {action}");
            let p = read.policy.expect("the policy stands");
            let got = &p.egress[0];
            assert!(got.fail_closed.is_some());
            assert_eq!(got.name, "r");
            if action == "Accept" {
                assert_eq!(e.effect, Effect::MatchesNothing(at), "{e}");
                assert!(got.peers.is_empty(), "{rule}: an Accept matches nothing");
                assert_eq!(got.action, CnpAction::Accept);
            } else {
                assert_eq!(e.effect, Effect::DeniesAll(at), "{e}");
                assert_eq!(got.peers, vec![ClusterPeer::All], "{rule} {action}: denies all");
                assert_eq!((got.action, got.ports.clone()), (CnpAction::Deny, None));
            }
        }
    }
}

#[test]
fn an_unknown_action_denies_all_and_a_field_outside_the_rules_closes_every_rule() {
    let read = one_rule(json!({"action": "Log", "to": [{"namespaces": {}}]}));
    assert_eq!(read.problems[0].field, "spec.egress[0].action");
    assert_eq!(read.policy.unwrap().egress[0].peers, vec![ClusterPeer::All]);
    let read = read_with_extra();
    let p = read.policy.unwrap();
    assert!(p.ingress[0].peers.is_empty(), "the Accept matches nothing");
    assert_eq!(p.egress[0].peers, vec![ClusterPeer::All], "the Deny denies all");
    assert_eq!(read.problems.len(), 1);
    assert_eq!(read.problems[0].effect, Effect::AllRulesFailClosed);
}

fn read_with_extra() -> Read<ClusterPolicy> {
    read(
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}}, "scope": "x",
                "ingress": [{"action": "Accept", "from": [{"namespaces": {}}]}],
                "egress": [{"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"tcp": {"destinationPort": {"number": 1}}}]}]}),
    )
}

/// Who a policy covers, or where it stands, cannot be guessed: such a policy is refused.
#[test]
fn what_cannot_be_made_safe_is_refused() {
    for (spec, field) in [
        (json!({"priority": 1, "subject": {"namespaces": {}}}), "spec.tier"),
        (
            json!({"tier": "Developer", "priority": 1, "subject": {"namespaces": {}}}),
            "spec.tier",
        ),
        (
            json!({"tier": "Admin", "priority": 1001, "subject": {"namespaces": {}}}),
            "spec.priority",
        ),
        (json!({"tier": "Admin", "subject": {"namespaces": {}}}), "spec.priority"),
        (json!({"tier": "Admin", "priority": 1, "subject": {}}), "spec.subject"),
        (
            json!({"tier": "Admin", "priority": 1, "subject": {"nodes": {}}}),
            "spec.subject.nodes",
        ),
        (
            json!({"tier": "Admin", "priority": 1, "subject": {"pods": {"namespaceSelector": {}}}}),
            "spec.subject.pods.podSelector",
        ),
        (
            json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}}),
            "spec.subject.namespaces",
        ),
    ] {
        let r = read(spec.clone());
        assert!(r.policy.is_none(), "{spec}");
        assert!(
            r.problems
                .iter()
                .any(|p| p.field == field && p.effect == Effect::Refused),
            "{spec}: {:?}",
            r.problems
        );
        assert!(
            r.problems
                .iter()
                .all(|p| p.to_string().starts_with("ClusterNetworkPolicy c: "))
        );
    }
}

#[test]
fn peers_of_every_kind_read() {
    let r = one_rule(json!({"action": "Deny", "to": [
        {"namespaces": {"matchLabels": {"a": "b"}}},
        {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"p": "q"}}}},
        {"networks": ["10.0.0.7/8", "fd00::/64"]},
        {"nodes": {}},
        {"nodes": {"matchLabels": {"role": "db"}}}
    ]}));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let peers = &r.policy.unwrap().egress[0].peers;
    assert!(matches!(&peers[0], ClusterPeer::Pods { pods, .. } if pods.is_everything()));
    assert!(
        matches!(&peers[1], ClusterPeer::Pods { namespaces, pods } if namespaces.is_everything() && !pods.is_everything())
    );
    assert_eq!(
        peers[2],
        ClusterPeer::Networks(vec!["10.0.0.0/8".parse().unwrap(), "fd00::/64".parse().unwrap()])
    );
    assert_eq!(peers[3], ClusterPeer::Nodes(Selector::everything()));
    assert!(matches!(&peers[4], ClusterPeer::Nodes(s) if s.to_string() == "role=db"));
    let r = read(json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                        "ingress": [{"action": "Deny", "from": [{"networks": ["10.0.0.0/8"]}]}]}));
    assert_eq!(
        r.problems[0].field, "spec.ingress[0].from[0]",
        "networks are egress peers"
    );
}

/// `domainNames` reads in an Accept rule, exact names and wildcards as written; a Deny
/// or Pass rule with them is refused as the API refuses it (and denies all, as any
/// rule weft cannot read).
#[test]
fn domain_names_are_accept_peers_only() {
    let r = one_rule(json!({"action": "Accept", "name": "api", "to": [
        {"domainNames": ["api.example.test", "*.mirror.example.test."]}
    ], "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]}));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let p = r.policy.unwrap();
    assert_eq!(
        p.egress[0].peers,
        vec![ClusterPeer::Domains(vec![
            DomainPattern::Exact("api.example.test".into()),
            DomainPattern::Wildcard("mirror.example.test".into()),
        ])]
    );
    for action in ["Deny", "Pass"] {
        let r = one_rule(json!({"action": action, "to": [{"domainNames": ["api.example.test"]}]}));
        assert_eq!(r.problems.len(), 1, "{action}: {:?}", r.problems);
        assert_eq!(r.problems[0].field, "spec.egress[0]");
        assert!(
            r.problems[0].reason.contains("only in Accept rules"),
            "{}",
            r.problems[0]
        );
        assert_eq!(
            r.policy.unwrap().egress[0].peers,
            vec![ClusterPeer::All],
            "{action}: denies all"
        );
    }
    let r = read(json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                        "ingress": [{"action": "Accept", "from": [{"domainNames": ["a.example.test"]}]}]}));
    assert_eq!(r.problems[0].field, "spec.ingress[0].from[0]", "an egress peer");
}
