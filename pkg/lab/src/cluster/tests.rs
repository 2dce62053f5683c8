//! Loading lab files: what is accepted, what is refused and why.

use super::*;
use weft_topology::LinkKind;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Writes `text` as a lab file in a directory of its own and loads it.
fn load_text(text: &str) -> Result<Lab, LabError> {
    // One directory per call: tests run side by side, and two texts may be as long.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("weft-lab-load-{}-{call}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lab.yaml");
    fs::write(&file, text).unwrap();
    let lab = Lab::load(&file);
    let _ = fs::remove_dir_all(&dir);
    lab
}

#[test]
fn pods_without_a_namespace_keep_their_topology_namespace_and_netns() {
    let lab = Lab::load(&examples().join("lab.yaml")).unwrap();
    let r1 = lab.find_pod("r1").unwrap();
    assert_eq!(lab.namespace_of(r1), "lab", "the Topology's namespace");
    assert_eq!(lab.pod_ns("r1"), "wl-p-r1");
    assert_eq!(lab.pod_ns("lab/r1"), "wl-p-r1");
    // A pod without a Topology is in `default`.
    let shared = Lab::load(&examples().join("lab-shared.yaml")).unwrap();
    assert_eq!(shared.namespace_of(shared.find_pod("s1").unwrap()), "default");
    assert_eq!(shared.pods_of("n1"), ["s1", "s2"]);
}

#[test]
fn the_policy_example_names_pods_by_namespace() {
    let lab = Lab::load(&examples().join("lab-policy.yaml")).unwrap();
    assert_eq!(lab.policies.len(), 2);
    assert_eq!(lab.pod_ns("x/a"), "wp-p-x.a");
    assert_eq!(lab.pod_ns("y/a"), "wp-p-y.a");
    assert_eq!(lab.node_of("y/a"), Some("n2"));
    assert_eq!(lab.node_of("c"), Some("n3"), "a name only one pod has");
    let e = lab.find_pod("a").unwrap_err().to_string();
    assert!(e.contains("x/a, y/a"), "{e}");
    assert!(lab.find_pod("z/a").is_err());
    // Names more than one pod has come with their namespace.
    assert_eq!(lab.pods_of("n2"), ["x/b", "y/a"]);
    assert_eq!(lab.pods_of("n3"), ["c", "y/b"]);
    assert_eq!(lab.namespace_names().into_iter().collect::<Vec<_>>(), ["x", "y"]);
    let expect = fs::read_to_string(examples().join("lab-policy.expect")).unwrap();
    let tables = crate::matrix::parse_tables(&expect).unwrap();
    assert_eq!(tables.len(), 2);
    assert_eq!(tables[1].title, "81/tcp IPv4");
    let policies = fs::read_to_string(examples().join("policies/allow-clients.yaml")).unwrap();
    let p = crate::spec::checks::parse_policies(&policies, "allow-clients.yaml").unwrap();
    crate::spec::checks::check_policy(&p[0], &lab.namespace_names()).unwrap();
}

#[test]
fn pods_are_unique_by_namespace_and_name_and_network_namespace() {
    let base = "name: t\nnodes: [n1]\npods:\n";
    assert!(
        load_text(&format!(
            "{base}  - {{name: a, node: n1, namespace: x}}\n  - {{name: a, node: n1, namespace: y}}\n"
        ))
        .is_ok()
    );
    let e = load_text(&format!(
        "{base}  - {{name: a, node: n1, namespace: x}}\n  - {{name: a, node: n1, namespace: x}}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("pod x/a: listed twice"), "{e}");
    // Both would be `t-p-a`.
    let e = load_text(&format!(
        "{base}  - {{name: a, node: n1}}\n  - {{name: a, node: n1, namespace: default}}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("listed twice"), "{e}");
    for (bad, want) in [
        ("  - {name: a, node: n1, namespace: X}\n", "namespace \"X\""),
        ("  - {name: a, node: n1, labels: {'a b': c}}\n", "label key"),
        (
            "  - {name: a, node: n1, ports: [{containerPort: 80, protocol: ICMP}]}\n",
            "not TCP, UDP or SCTP",
        ),
        (
            "  - {name: a, node: n1, ports: [{name: HTTP, containerPort: 80}]}\n",
            "port name",
        ),
        ("  - {name: n1, node: n1}\n", "no node's name"),
    ] {
        let e = load_text(&format!("{base}{bad}")).unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
    }
    // A policy's namespace must be the lab's.
    let policy = "policies:\n  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: p, namespace: z}, spec: {podSelector: {}}}\n";
    let e = load_text(&format!("{base}  - {{name: a, node: n1}}\n{policy}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("namespace z is not in the lab"), "{e}");
    let ok = format!("{base}  - {{name: a, node: n1}}\nnamespaces: [{{name: z}}]\n{policy}");
    assert_eq!(load_text(&ok).unwrap().policies[0]["metadata"]["namespace"], "z");
}

#[test]
fn link_kinds_and_pod_routing_are_typed_and_refused_by_name() {
    let base = "name: t\nnodes: [n1]\npods: [{name: p, node: n1}]\n";
    let lab = load_text(&format!("{base}inter_node_link: grpc\npod_routing: direct\n")).unwrap();
    assert_eq!(lab.spec.inter_node_link, LinkKind::Grpc);
    assert_eq!(lab.spec.pod_routing, weft_nodenet::PodRouting::Direct);
    let lab = load_text(base).unwrap();
    assert_eq!(
        (lab.spec.inter_node_link, lab.spec.pod_routing),
        (LinkKind::Vxlan, weft_nodenet::PodRouting::Auto),
        "the defaults"
    );
    let veth = load_text(&format!("{base}inter_node_link: veth\n"))
        .unwrap_err()
        .to_string();
    assert!(veth.contains("inter_node_link \"veth\": vxlan or grpc"), "{veth}");
    let bogus = load_text(&format!("{base}pod_routing: bgp\n")).unwrap_err().to_string();
    assert!(bogus.contains("pod_routing") && bogus.contains("bgp"), "{bogus}");
}

#[test]
fn a_bgp_lab_is_routed_leaves_routing_to_bgp_and_is_ipv4() {
    let base = "name: t\nnodes: [n1, n2]\npods: [{name: p, node: n1}]\nbgp: true\n";
    let lab = load_text(&format!("{base}pod_routing: none\n")).unwrap();
    assert!(lab.spec.bgp);
    assert_eq!(lab.node_as(&lab.spec.nodes[1]), 65002);
    for (extra, says) in [
        ("", "pod_routing: none"),
        ("pod_routing: none\nunderlay: shared\n", "underlay: routed"),
        ("pod_routing: none\nipv6: true\n", "IPv4 pod ranges only"),
    ] {
        let e = load_text(&format!("{base}{extra}")).unwrap_err().to_string();
        assert!(e.contains(says), "{extra:?}: {e}");
    }
    // The router's configuration has a session per node, by its address and AS.
    let nodes = vec![("n-1".to_string(), "172.30.1.2".to_string(), 65001)];
    let conf = crate::router_config("172.30.1.1", &nodes);
    assert!(
        conf.contains("protocol bgp node_n_1 from node { neighbor 172.30.1.2 as 65001; }"),
        "{conf}"
    );
    let node = crate::node_config("172.30.1.2", "172.30.1.1", 65001, 119);
    assert!(
        node.contains("kernel table 119;") && node.contains("neighbor 172.30.1.1 as 65000;"),
        "{node}"
    );
}

#[test]
fn a_scenario_is_checked_at_load_and_its_links_must_be_the_labs() {
    let dir = std::env::temp_dir().join(format!("weft-lab-scenario-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let lab = "name: s\nnodes: [n1]\npods: [{name: r1, node: n1}]\nscenario: sc.yaml\n";
    fs::write(dir.join("lab.yaml"), lab).unwrap();
    let load = |scenario: &str| {
        fs::write(dir.join("sc.yaml"), scenario).unwrap();
        Lab::load(&dir.join("lab.yaml")).map(|l| l.scenario.clone())
    };
    let ok = load("name: x\nsteps: [{at: 1s, links: [r1:e1], down: true}]\n").unwrap();
    assert_eq!(ok, Some(dir.join("sc.yaml")));
    let e = load("name: x\nsteps: [{at: 1s, links: [r9:e1], down: true}]\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("step 1: link r9:e1: pod \"r9\" is not in the lab"),
        "{e}"
    );
    let e = load("name: x\nsteps: [{at: 1s, links: [r1:e1], sideways: true}]\n").unwrap_err();
    assert!(e.to_string().contains("sc.yaml"), "{e}");
    fs::remove_file(dir.join("sc.yaml")).unwrap();
    let e = Lab::load(&dir.join("lab.yaml")).unwrap_err();
    assert!(e.to_string().contains("sc.yaml"), "a missing file is named: {e}");
    let _ = fs::remove_dir_all(&dir);
}
