//! The plan of one node: which pods get which chains, what the sets hold, what a
//! change of the cluster changes.

use std::sync::Arc;

use ipnet::IpNet;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use weft_topology::{NamedPort, PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol, Strict};

use super::*;
use crate::eval::LocalPod;
use crate::nft::{Observed, diff};

fn pod(ns: &str, name: &str, ip: &str, node: &str, labels: &[(&str, &str)]) -> Arc<PolicyPod> {
    Arc::new(PolicyPod {
        namespace: ns.into(),
        name: name.into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ips: ip.split(',').map(|a| a.parse().unwrap()).collect(),
        ports: vec![NamedPort {
            name: "http".into(),
            port: 8080,
            protocol: PortProtocol::Tcp,
        }],
        node: node.into(),
        host_network: false,
        workload: String::new(),
    })
}

fn np(ns: &str, name: &str, spec: Value) -> Arc<Strict<NetworkPolicy>> {
    Arc::new(serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap())
}

/// A chain's rules in nft's language.
fn lines(d: &Desired, chain: &Chain) -> Vec<String> {
    d.chains[chain].iter().map(ToString::to_string).collect()
}

fn local(p: &PolicyPod, ifname: &str) -> LocalPod {
    LocalPod {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        ips: p.ips.clone(),
        host_ifname: ifname.into(),
    }
}

struct World {
    objects: PolicyObjects,
    local: Vec<LocalPod>,
}

impl World {
    fn new() -> Self {
        let a = pod("x", "a", "10.244.1.10,fd00::a", "n1", &[("pod", "a")]);
        let b = pod("x", "b", "10.244.1.11", "n1", &[("pod", "b")]);
        let c = pod("y", "c", "10.244.2.10", "n2", &[("pod", "c")]);
        let local = vec![local(&a, "weft-a"), local(&b, "weft-b")];
        World {
            objects: PolicyObjects {
                pods: weft_topology::policy_pods([a, b, c]),
                namespaces: vec![
                    Arc::new(PolicyNamespace {
                        name: "x".into(),
                        labels: [("ns".to_string(), "x".to_string())].into(),
                        audit: false,
                        workload_flow_metrics: false,
                    }),
                    Arc::new(PolicyNamespace {
                        name: "y".into(),
                        labels: [("ns".to_string(), "y".to_string())].into(),
                        audit: false,
                        workload_flow_metrics: false,
                    }),
                ],
                policies: Vec::new(),
                synced: true,
                stale: false,
                cluster_policies: Vec::new(),
                unreadable: Vec::new(),
            },
            local,
        }
    }

    fn plan(&self) -> Desired {
        plan(&ClusterView::new(&self.objects, "n1", &self.local, &[]))
    }
}

/// The one set of `d` whose source `is`.
fn set_of(d: &Desired, is: impl Fn(&SetSource) -> bool) -> &SetSpec {
    let names: Vec<&SetName> = d.sources.iter().filter(|(_, s)| is(s)).map(|(n, _)| n).collect();
    assert_eq!(names.len(), 1, "one such set: {:?}", d.sources);
    &d.sets[names[0]]
}

#[test]
fn without_policies_the_table_holds_nothing_but_its_base() {
    let d = World::new().plan();
    assert_eq!(d, Desired::default());
}

#[test]
fn pods_one_policy_isolates_share_a_group_chain() {
    let mut w = World::new();
    w.objects.policies.push(np(
        "x",
        "from-y",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                               "ports": [{"port": 80}, {"port": "http"}]}]}),
    ));
    let d = w.plan();
    assert!(d.egress.is_empty(), "egress is not isolated");
    assert_eq!(d.ingress.len(), 2);
    assert_eq!(d.ingress["weft-a"], d.ingress["weft-b"], "one group");
    let group = &d.ingress["weft-a"];
    assert_eq!(d.groups[group].policies, vec!["x/from-y"]);
    let rules = lines(&d, group);
    assert!(rules[0].starts_with("jump p"), "{rules:?}");
    assert!(rules.last().unwrap().ends_with("drop"), "{rules:?}");
    assert!(rules[rules.len() - 2].contains("log group 21845"), "{rules:?}");
    // The policy chain: y's pod in the peer sets, x's pods' named port resolved.
    let (chain, pc) = d.policy_chains.iter().next().unwrap();
    assert_eq!((pc.namespace.as_str(), pc.name.as_str()), ("x", "from-y"));
    let pods4 = set_of(&d, |s| matches!(s, SetSource::Pods { v6: false, .. }));
    assert_eq!(
        pods4.elements.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.244.2.10"]
    );
    let np4 = set_of(&d, |s| {
        matches!(
            s,
            SetSource::Named {
                dest: Some(_),
                v6: false,
                ..
            }
        )
    });
    assert_eq!(
        np4.elements.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.244.1.10 . tcp . 8080", "10.244.1.11 . tcp . 8080"]
    );
    let np6 = set_of(&d, |s| {
        matches!(
            s,
            SetSource::Named {
                dest: Some(_),
                v6: true,
                ..
            }
        )
    });
    assert_eq!(np6.elements.len(), 1, "a's IPv6 address");
    let rules = lines(&d, chain);
    assert!(
        rules
            .iter()
            .any(|r| r.contains("ip saddr @") && r.contains("tcp dport 80")),
        "{rules:?}"
    );
    assert!(
        !rules
            .iter()
            .any(|r| r.contains("ip saddr @") && r.contains("ip6 daddr")),
        "no rule mixes families: {rules:?}"
    );
}

/// A pod that arrives elsewhere in the cluster changes set elements here; one that
/// arrives here joins its group's map; neither rewrites a chain.
#[test]
fn arrivals_change_elements_only() {
    let mut w = World::new();
    w.objects.policies.push(np(
        "x",
        "from-y",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    ));
    let before = w.plan();
    w.objects.put_pod(pod("y", "d", "10.244.2.11", "n2", &[("pod", "d")]));
    let e = pod("x", "e", "10.244.1.12", "n1", &[("pod", "e")]);
    w.local.push(local(&e, "weft-e"));
    w.objects.put_pod(e);
    let after = w.plan();
    let script = diff(&after, &Observed::after(&before)).unwrap();
    for line in script.lines() {
        assert!(line.starts_with("add element "), "{script}");
    }
    assert_eq!(
        script.lines().count(),
        3,
        "an address, a member, its hairpin pair: {script}"
    );
}

/// Rules of different policies that take the same pods share one set (named after
/// what it takes), and a pod that arrives adds its address to it once; rules that take
/// other pods have their own.
#[test]
fn rules_that_take_the_same_pods_share_a_set() {
    let mut w = World::new();
    let from_c = json!({"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "c"}}}]}]});
    w.objects.policies.push(np("x", "one", from_c.clone()));
    w.objects.policies.push(np("x", "two", from_c));
    w.objects.policies.push(np(
        "x",
        "three",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    let d = w.plan();
    let pods4: Vec<(&SetName, &SetSource)> = d
        .sources
        .iter()
        .filter(|(_, s)| matches!(s, SetSource::Pods { v6: false, .. }))
        .collect();
    assert_eq!(pods4.len(), 2, "one set per distinct peer: {pods4:?}");
    let c_set = pods4
        .iter()
        .find(|(_, s)| matches!(s, SetSource::Pods { scope, .. } if scope.namespace().is_none()))
        .unwrap()
        .0;
    let users = d
        .chains
        .values()
        .filter(|rules| rules.iter().any(|r| r.to_string().contains(&format!("@{c_set} "))))
        .count();
    assert_eq!(users, 2, "both policies' chains match the one set");
    // Another pod labelled like c arrives in y: one element, in the one set.
    let view_before = ClusterView::new(&w.objects, "n1", &w.local, &[]);
    let arriving = pod("y", "c2", "10.244.2.12", "n2", &[("pod", "c")]);
    let add = crate::plan::addition(&view_before, &d, &arriving, None);
    assert_eq!(add.elements.len(), 1, "{add:?}");
    assert_eq!(add.elements[c_set].len(), 1);
    assert!(add.elements_only());
    // b's own namespace set takes only x's pods: c2 is not in it.
    let b_set = pods4.iter().find(|(n, _)| *n != c_set).unwrap().0;
    assert!(!add.elements.contains_key(b_set));
}

/// A local pod the API has no Pod object for yet is policed with no labels; an
/// `ipBlock` with `except` becomes ranges; audit mode accepts at the end.
#[test]
fn unknown_pods_blocks_and_audit() {
    let mut w = World::new();
    w.local.push(LocalPod {
        namespace: "x".into(),
        name: "new".into(),
        ips: vec!["10.244.1.20".parse().unwrap()],
        host_ifname: "weft-new".into(),
    });
    w.objects.policies.push(np(
        "x",
        "egress-cidr",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "DoesNotExist"}]},
               "policyTypes": ["Egress"],
               "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.244.0.0/16"]}}]}]}),
    ));
    let d = w.plan();
    assert_eq!(d.egress.keys().collect::<Vec<_>>(), ["weft-new"]);
    let nets = d
        .sets
        .iter()
        .find(|(n, _)| {
            matches!(
                n,
                SetName::Data {
                    role: SetRole::Ranges,
                    v6: false,
                    ..
                }
            )
        })
        .unwrap()
        .1;
    assert_eq!(
        nets.elements.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.0.0.0-10.243.255.255", "10.245.0.0-10.255.255.255"]
    );
    w.objects.namespaces[0] = Arc::new(PolicyNamespace {
        audit: true,
        workload_flow_metrics: false,
        ..(*w.objects.namespaces[0]).clone()
    });
    let d = w.plan();
    let group = &d.egress["weft-new"];
    assert!(d.groups[group].audit);
    let rules = lines(&d, group);
    assert!(rules.last().unwrap().ends_with("accept"));
    assert!(rules.iter().any(|r| r.contains("prefix \"weft audit")));
}

#[test]
fn block_ranges_cut_out_every_except() {
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    let show = |v: Vec<(IpAddr, IpAddr)>| v.iter().map(|(a, b)| format!("{a}-{b}")).collect::<Vec<_>>();
    assert_eq!(show(block_ranges(&net("10.0.0.0/30"), &[])), ["10.0.0.0-10.0.0.3"]);
    assert_eq!(
        show(block_ranges(
            &net("10.0.0.0/24"),
            &[net("10.0.0.0/26"), net("10.0.0.128/26")]
        )),
        ["10.0.0.64-10.0.0.127", "10.0.0.192-10.0.0.255"]
    );
    assert!(block_ranges(&net("10.0.0.0/24"), &[net("10.0.0.0/25"), net("10.0.0.128/25")]).is_empty());
    assert_eq!(
        show(block_ranges(&net("fd00::/126"), &[net("fd00::1/128")])),
        ["fd00::-fd00::", "fd00::2-fd00::3"]
    );
}

mod additions {
    //! A pod's addition computed alone is what a full plan with the pod adds: for
    //! random clusters, policies and tiers, whether the pod is this node's or another's.

    use super::*;
    use proptest::prelude::*;

    fn labels_of(pick: u8) -> Vec<(&'static str, &'static str)> {
        let all = [("app", "web"), ("app", "db"), ("role", "client"), ("tier", "front")];
        all.iter()
            .enumerate()
            .filter(|(i, _)| pick & (1 << i) != 0)
            .map(|(_, l)| *l)
            .collect()
    }

    fn selector(pick: u8) -> Value {
        match pick % 5 {
            0 => json!({}),
            1 => json!({"matchLabels": {"app": "web"}}),
            2 => json!({"matchExpressions": [{"key": "role", "operator": "Exists"}]}),
            3 => json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}),
            _ => json!({"matchLabels": {"tier": "front"}}),
        }
    }

    fn peer(pick: u8) -> Value {
        match pick % 4 {
            0 => json!({"podSelector": selector(pick / 4)}),
            1 => json!({"namespaceSelector": {"matchLabels": {"ns": if pick & 8 == 0 { "x" } else { "y" }}}}),
            2 => json!({"namespaceSelector": {}, "podSelector": selector(pick / 4)}),
            _ => json!({"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}),
        }
    }

    fn ports(pick: u8) -> Value {
        match pick % 4 {
            0 => json!([]),
            1 => json!([{"port": 80}]),
            2 => json!([{"port": "http"}]),
            _ => json!([{"protocol": "UDP", "port": 1000, "endPort": 2000}, {"port": "http"}]),
        }
    }

    fn policy_spec(sel: u8, kind: u8, p: u8, q: u8) -> Value {
        let rule = json!({"from": [peer(p)], "ports": ports(q)});
        let egress = json!({"to": [peer(p)], "ports": ports(q)});
        match kind % 3 {
            0 => json!({"podSelector": selector(sel), "ingress": [rule]}),
            1 => json!({"podSelector": selector(sel), "policyTypes": ["Egress"], "egress": [egress]}),
            _ => {
                json!({"podSelector": selector(sel), "policyTypes": ["Ingress", "Egress"], "ingress": [rule], "egress": [egress]})
            }
        }
    }

    fn cnp_spec(tier: u8, action: u8, sel: u8, p: u8, q: u8) -> Value {
        let action = ["Accept", "Deny", "Pass"][usize::from(action % 3)];
        let peer = match p % 2 {
            0 => json!({"namespaces": {"matchLabels": {"ns": "y"}}}),
            _ => json!({"pods": {"namespaceSelector": {}, "podSelector": selector(p / 2)}}),
        };
        let m = match q % 3 {
            0 => Value::Null,
            1 => json!([{"tcp": [{"port": {"number": 80}}]}]),
            _ => json!([{"namedPort": "http"}]),
        };
        json!({"tier": if tier.is_multiple_of(2) { "Admin" } else { "Baseline" }, "priority": i32::from(sel % 4),
               "subject": {"pods": {"namespaceSelector": {}, "podSelector": selector(sel)}},
               "ingress": [{"action": action, "from": [peer.clone()], "match": m}],
               "egress": [{"action": action, "to": [peer], "match": m}]})
    }

    #[derive(Debug, Clone)]
    struct Case {
        pods: Vec<(u8, u8, bool)>,
        policies: Vec<(u8, u8, u8, u8, u8)>,
        cnps: Vec<(u8, u8, u8, u8, u8)>,
        new_pod: (u8, u8, bool),
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..6),
            proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 0..4),
            proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 0..3),
            (any::<u8>(), any::<u8>(), any::<bool>()),
        )
            .prop_map(|(pods, policies, cnps, new_pod)| Case {
                pods,
                policies,
                cnps,
                new_pod,
            })
    }

    /// The pod of index `i`: namespace, labels, whether it runs on this node.
    fn make_pod(i: usize, (ns, labels, here): (u8, u8, bool)) -> (Arc<PolicyPod>, bool) {
        let ns = if ns % 2 == 0 { "x" } else { "y" };
        let ips = if i.is_multiple_of(3) {
            format!("10.244.1.{},fd00::{:x}", 10 + i, 10 + i)
        } else {
            format!("10.244.{}.{}", 1 + i % 2, 10 + i)
        };
        let mut p = (*pod(
            ns,
            &format!("p{i}"),
            &ips,
            if here { "n1" } else { "n2" },
            &labels_of(labels),
        ))
        .clone();
        if labels & 0x10 != 0 {
            p.ports.clear();
        }
        (Arc::new(p), here)
    }

    fn build(c: &Case, with_new: bool) -> (ClusterView, Arc<PolicyPod>, bool) {
        let mut w = World::new();
        w.objects.pods.clear();
        w.local.clear();
        let mut pods: Vec<(Arc<PolicyPod>, bool)> = c.pods.iter().enumerate().map(|(i, p)| make_pod(i, *p)).collect();
        let new = make_pod(50, c.new_pod);
        if with_new {
            pods.push(new.clone());
        }
        for (p, here) in &pods {
            w.objects.put_pod(p.clone());
            if *here {
                w.local.push(local(p, &format!("weft-{}", p.name)));
            }
        }
        for (i, (sel, kind, p, q, ns)) in c.policies.iter().enumerate() {
            let ns = if ns % 2 == 0 { "x" } else { "y" };
            w.objects
                .policies
                .push(np(ns, &format!("np{i}"), policy_spec(*sel, *kind, *p, *q)));
        }
        for (i, (tier, action, sel, p, q)) in c.cnps.iter().enumerate() {
            w.objects.cluster_policies.push(Arc::new(
                serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1beta1",
                    "kind": "ClusterNetworkPolicy", "metadata": {"name": format!("c{i}")},
                    "spec": cnp_spec(*tier, *action, *sel, *p, *q)}))
                .unwrap(),
            ));
        }
        let v = ClusterView::new(&w.objects, "n1", &w.local, &[]);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        (v, new.0, new.1)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// A pod of another node that comes, goes, or changes its labels or address:
        /// its delta, computed from the addresses it touches only, takes the plan to
        /// what a full plan of the new cluster holds, and the view it updates in place
        /// is the view built anew.
        #[test]
        fn a_remote_change_is_what_a_full_plan_changes(c in case(), which in any::<usize>(), how in 0u8..4, labels in any::<u8>()) {
            let (before, _, _) = build(&c, true);
            let remote: Vec<Arc<PolicyPod>> = before.pods.iter().filter(|p| !before.local.contains_key(&(p.namespace.clone(), p.name.clone()))).cloned().collect();
            prop_assume!(!remote.is_empty());
            let old = remote[which % remote.len()].clone();
            let key = (old.namespace.clone(), old.name.clone());
            let new = match how {
                0 => None,
                1 => Some(Arc::new(PolicyPod { labels: labels_of(labels).iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..(*old).clone() })),
                2 => Some(Arc::new(PolicyPod { ips: vec!["10.244.3.77".parse().unwrap()], ..(*old).clone() })),
                _ => Some(Arc::new(PolicyPod { name: "arrived".into(), ips: vec!["10.244.2.99".parse().unwrap(), "fd00::99".parse().unwrap()], ..(*old).clone() })),
            };
            let key = if how == 3 { (old.namespace.clone(), "arrived".to_string()) } else { key };
            let mut d = plan(&before);
            let mut view = before.clone();
            let ips = view.set_pod(key, new);
            let delta = crate::plan::delta(&view, &d, &ips);
            delta.apply_to(&mut d);
            let full = plan(&view);
            prop_assert_eq!(&d, &full);
            // The view kept in place keeps its indexes as a view built anew does: every
            // claim is a pod of the view, every address's owner is chosen by the one rule.
            for (ip, claims) in &view.claims {
                for c in claims {
                    prop_assert!(view.pods.iter().any(|p| Arc::ptr_eq(p, c)), "{} claims {ip} but is gone", c.name);
                }
                prop_assert_eq!(view.by_ip.get(ip).map(|o| o.name.clone()), view.owner(claims).map(|o| o.name.clone()));
            }
            for p in &view.pods {
                for ip in &p.ips {
                    prop_assert!(view.claims[ip].iter().any(|c| Arc::ptr_eq(c, p)), "{} claims {}", p.name, ip);
                }
            }
            // The kernel after the delta's transaction is the full plan's kernel.
            let mut o = crate::nft::Observed::after(&plan(&before));
            for (set, elements) in &delta.del {
                let s = o.sets.get_mut(set).unwrap();
                for e in elements {
                    prop_assert!(s.remove(e), "{e} was in {set}");
                }
            }
            for (set, elements) in &delta.add {
                for e in elements {
                    prop_assert!(o.sets.get_mut(set).unwrap().insert(*e), "{e} was not in {set}");
                }
            }
            prop_assert_eq!(crate::nft::diff(&full, &o), None);
        }

        #[test]
        fn an_addition_is_what_a_full_plan_adds(c in case()) {
            let (before, _, _) = build(&c, false);
            let (after, new, here) = build(&c, true);
            let mut d = plan(&before);
            let full = plan(&after);
            let ifname = format!("weft-{}", new.name);
            let pod = after.pod(&new.namespace, &new.name).unwrap();
            let add = addition(&after, &d, &pod, here.then_some(ifname.as_str()));
            prop_assert!(here || add.elements_only(), "a pod of another node adds elements only");
            let mut o = crate::nft::Observed::after(&d);
            add.apply_to(&mut d);
            prop_assert_eq!(&d, &full);
            // The kernel after the addition's transaction is the full plan's kernel.
            o.add(&add);
            prop_assert_eq!(crate::nft::diff(&full, &o), None);
        }
    }
}

/// A trace through the table names what each chain and counted rule stands for: the
/// NetworkPolicy that accepts, the group whose end drops.
#[test]
fn a_trace_step_is_read_back_as_the_policy_it_stands_for() {
    let mut w = World::new();
    w.objects.policies.push(np(
        "x",
        "from-y",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                               "ports": [{"port": 80}]}]}),
    ));
    let d = w.plan();
    let group = d.ingress["weft-a"].to_string();
    let rules = lines(&d, &d.ingress["weft-a"]);
    let drop = rules.last().unwrap();
    assert_eq!(
        d.meaning(&group, drop).as_deref(),
        Some("pods of x isolated (ingress) by x/from-y: no rule allows"),
        "{drop}"
    );
    assert_eq!(
        d.meaning(&group, "").as_deref(),
        Some("pods of x isolated (ingress) by x/from-y"),
        "a chain's end"
    );
    let (chain, _) = d.policy_chains.iter().next().unwrap();
    let accept = lines(&d, chain)
        .into_iter()
        .find(|r| r.contains("accept"))
        .expect("an accepting rule");
    assert_eq!(
        d.meaning(&chain.to_string(), &accept).as_deref(),
        Some("NetworkPolicy x/from-y (ingress): allows"),
        "{accept}"
    );
    let jump = rules.iter().find(|r| r.starts_with("jump p")).expect("a jump");
    assert_eq!(
        d.meaning(&group, jump).as_deref(),
        Some("to NetworkPolicy x/from-y (ingress)"),
        "{jump}"
    );
    assert_eq!(d.meaning("ingress", "").as_deref(), Some("weft's ingress base chain"));
    assert_eq!(d.meaning("forward", ""), None, "not a chain weft writes");
}

/// A `domainNames` rule plans a learnt set per family (`flags timeout`, no elements:
/// the learner's), matched by the rule, and says which names fill it.
#[test]
fn a_domain_rule_plans_learnt_sets_the_learner_fills() {
    let mut w = World::new();
    w.objects.cluster_policies.push(Arc::new(
        serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": "by-name"},
            "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                     "egress": [{"action": "Accept", "to": [{"domainNames": ["*.example.test", "api.example.test"]}]}]}}))
        .unwrap(),
    ));
    let d = w.plan();
    assert_eq!(d.learnt.len(), 2, "one set per family: {:?}", d.learnt);
    for (name, names) in &d.learnt {
        let spec = &d.sets[name];
        assert!(spec.kind.learnt() && spec.elements.is_empty(), "{spec:?}");
        assert!(spec.kind.declaration().contains("flags timeout"));
        assert_eq!(
            names.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["api.example.test", "*.example.test"],
            "sorted"
        );
        let used = d
            .chains
            .values()
            .flatten()
            .any(|r| r.to_string().contains(&format!("@{name}")));
        assert!(used, "a rule matches {name}: {:?}", d.chains);
    }
}

/// A `domainNames` rule holds, after its own rules, the new connections it could
/// allow once an answer is learnt (its ports, no address): the hold then lets them
/// through the chain again. A rule without names holds nothing.
#[test]
fn a_domain_rule_holds_what_it_could_allow_after_its_rules() {
    let mut w = World::new();
    w.objects.cluster_policies.push(Arc::new(
        serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": "by-name"},
            "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                     "egress": [
                        {"action": "Accept", "to": [{"networks": ["192.0.2.0/24"]}]},
                        {"action": "Accept", "to": [{"domainNames": ["api.example.test"]}],
                         "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]},
                        {"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}]}}))
        .unwrap(),
    ));
    let d = w.plan();
    let chain: Vec<String> = d
        .chains
        .values()
        .find(|rules| {
            rules
                .iter()
                .any(|r| r.verdict == crate::rule::Verdict::Jump(Chain::Hold))
        })
        .expect("a chain holds")
        .iter()
        .map(ToString::to_string)
        .collect();
    let hold = chain.iter().position(|r| r.contains("jump egress_hold")).unwrap();
    assert_eq!(
        chain[hold],
        format!("meta mark & {HELD_MARK:#010x} == 0x00000000 tcp dport 443 jump egress_hold")
    );
    assert_eq!(
        d.chains[&Chain::Hold]
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [format!("queue num {HOLD_QUEUE}")],
        "the hold chain's one rule"
    );
    let learnt: Vec<usize> = (0..chain.len())
        .filter(|i| d.learnt.keys().any(|s| chain[*i].contains(&format!("@{s}"))))
        .collect();
    assert_eq!(learnt.len(), 2, "{chain:#?}");
    assert!(learnt.iter().all(|i| *i < hold), "the learnt sets first: {chain:#?}");
    assert!(
        chain[hold + 1..].iter().any(|r| r.contains("drop")),
        "the deny after it: {chain:#?}"
    );
    assert!(
        chain.iter().filter(|r| r.contains("egress_hold")).count() == 1,
        "only the domain rule holds: {chain:#?}"
    );
}
