//! Every way a policy names ports, on a real kernel: for each form (NetworkPolicy's
//! `port`, `endPort`, named ports and protocol-only entries; ClusterNetworkPolicy's
//! released `protocols`, the drafts' `match` and AdminNetworkPolicy's `ports`), a
//! policy that lets pod y/b reach pod x/a on exactly the ports written, and probes on
//! either side of each port and range end: the kernel must pass exactly the written
//! ports, and say what the evaluator says. Then what passes without asking policy: ICMP
//! errors of an accepted connection (port unreachable, fragmentation needed) into a
//! pod that takes nothing in, and a pod reaching itself through a Service address
//! (hairpin) while it may reach nothing else. SCTP forms are left to the differential
//! test: the test machines have no SCTP module.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use weft_kernel::testutil::{TempNetns, privileged};
use weft_policy::{ClusterView, LocalPod};
use weft_topology::{NamedPort, PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol, Strict};

mod support;

use support::{Host, host, program, reaches};

use PortProtocol::{Tcp, Udp};

/// The node, x/a (the destination, with named ports `web` 8081/TCP and `dns` 5353/UDP)
/// and y/b (the source).
struct Lab {
    node: TempNetns,
    a: Host,
    b: Host,
}

fn lab(first: u8, net: u8) -> Lab {
    let node = TempNetns::new();
    node.run(weft_kernel::enable_forwarding).unwrap();
    let gw = format!("10.8.{net}.1");
    let a = host(&node, first, &format!("10.8.{net}.10"), &gw, Some(("x", "a")));
    let b = host(&node, first + 1, &format!("10.8.{net}.11"), &gw, Some(("y", "b")));
    Lab { node, a, b }
}

fn objects(l: &Lab, policies: Vec<Value>, cnps: Vec<Value>) -> PolicyObjects {
    let pod = |h: &Host, ports: Vec<NamedPort>| {
        let (ns, name) = h.pod.clone().unwrap();
        Arc::new(PolicyPod {
            labels: [("pod".to_string(), name.clone())].into(),
            namespace: ns,
            name,
            ips: vec![h.ip],
            ports,
            node: "n1".into(),
            host_network: false,
            workload: String::new(),
        })
    };
    let named = |name: &str, port: u16, protocol: PortProtocol| NamedPort {
        name: name.into(),
        port,
        protocol,
    };
    PolicyObjects {
        pods: weft_topology::policy_pods([
            pod(&l.a, vec![named("web", 8081, Tcp), named("dns", 5353, Udp)]),
            pod(&l.b, Vec::new()),
        ]),
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
        policies: policies
            .into_iter()
            .map(|v| Arc::new(serde_json::from_value::<Strict<_>>(v).unwrap()))
            .collect(),
        cluster_policies: cnps
            .into_iter()
            .map(|v| Arc::new(serde_json::from_value::<Strict<_>>(v).unwrap()))
            .collect(),
        synced: true,
        ..PolicyObjects::default()
    }
}

fn view(l: &Lab, o: &PolicyObjects) -> ClusterView {
    let local: Vec<LocalPod> = [&l.a, &l.b]
        .iter()
        .map(|h| {
            let (namespace, name) = h.pod.clone().unwrap();
            LocalPod {
                namespace,
                name,
                ips: vec![h.ip],
                host_ifname: h.host_ifname.clone(),
            }
        })
        .collect();
    ClusterView::new(o, "n1", &local, &[])
}

/// x/a takes from y only what `ports` (a NetworkPolicy's `ports`) says.
fn network_policy(ports: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": "x", "name": "only-ports"},
           "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": ports}]}})
}

/// An Admin tier that accepts from y into x what `key: ports` says and denies the rest.
fn cluster_policy(version: &str, key: &str, ports: Value) -> Value {
    let mut accept =
        json!({"name": "ports", "action": "Accept", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}]});
    accept[key] = ports;
    json!({"apiVersion": format!("policy.networking.k8s.io/{version}"), "kind": "ClusterNetworkPolicy",
           "metadata": {"name": "only-ports"},
           "spec": {"tier": "Admin", "priority": 10, "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                    "ingress": [accept, {"name": "rest", "action": "Deny", "from": [{"namespaces": {}}]}]}})
}

/// The form, the policies that write it, and the ports it opens (of those probed).
struct Form {
    what: &'static str,
    policies: Vec<Value>,
    cnps: Vec<Value>,
    open: Vec<(PortProtocol, u16)>,
}

fn forms() -> Vec<Form> {
    let np = |what, ports: Value, open: Vec<(PortProtocol, u16)>| Form {
        what,
        policies: vec![network_policy(ports)],
        cnps: Vec::new(),
        open,
    };
    let cnp = |what, version, key, ports: Value, open: Vec<(PortProtocol, u16)>| Form {
        what,
        policies: Vec::new(),
        cnps: vec![cluster_policy(version, key, ports)],
        open,
    };
    vec![
        np("NetworkPolicy port", json!([{"port": 81}]), vec![(Tcp, 81)]),
        np(
            "NetworkPolicy port and endPort",
            json!([{"protocol": "UDP", "port": 1000, "endPort": 1002}]),
            vec![(Udp, 1000), (Udp, 1001), (Udp, 1002)],
        ),
        np("NetworkPolicy named port", json!([{"port": "web"}]), vec![(Tcp, 8081)]),
        np(
            "NetworkPolicy protocol only",
            json!([{"protocol": "UDP"}]),
            vec![
                (Udp, 81),
                (Udp, 999),
                (Udp, 1000),
                (Udp, 1001),
                (Udp, 1002),
                (Udp, 1003),
                (Udp, 5353),
            ],
        ),
        cnp(
            "protocols tcp destinationPort number (v1beta1)",
            "v1beta1",
            "protocols",
            json!([{"tcp": {"destinationPort": {"number": 81}}}]),
            vec![(Tcp, 81)],
        ),
        cnp(
            "protocols udp destinationPort range (v1alpha2)",
            "v1alpha2",
            "protocols",
            json!([{"udp": {"destinationPort": {"range": {"start": 1000, "end": 1002}}}}]),
            vec![(Udp, 1000), (Udp, 1001), (Udp, 1002)],
        ),
        cnp(
            "protocols destinationNamedPort",
            "v1beta1",
            "protocols",
            json!([{"destinationNamedPort": "dns"}]),
            vec![(Udp, 5353)],
        ),
        cnp(
            "match tcp number",
            "v1alpha2",
            "match",
            json!([{"tcp": [{"port": {"number": 81}}]}]),
            vec![(Tcp, 81)],
        ),
        cnp(
            "match udp portRange",
            "v1alpha2",
            "match",
            json!([{"udp": [{"port": {"portRange": {"start": 1000, "end": 1002}}}]}]),
            vec![(Udp, 1000), (Udp, 1001), (Udp, 1002)],
        ),
        cnp(
            "match namedPort",
            "v1alpha2",
            "match",
            json!([{"namedPort": "web"}]),
            vec![(Tcp, 8081)],
        ),
        cnp(
            "ports portNumber",
            "v1beta1",
            "ports",
            json!([{"portNumber": {"protocol": "TCP", "port": 81}}]),
            vec![(Tcp, 81)],
        ),
        cnp(
            "ports portRange",
            "v1beta1",
            "ports",
            json!([{"portRange": {"protocol": "UDP", "start": 1000, "end": 1002}}]),
            vec![(Udp, 1000), (Udp, 1001), (Udp, 1002)],
        ),
        cnp(
            "ports namedPort",
            "v1beta1",
            "ports",
            json!([{"namedPort": "dns"}]),
            vec![(Udp, 5353)],
        ),
    ]
}

/// Every port probed: either side of each port and range end the forms write.
const PROBES: [(PortProtocol, u16); 13] = [
    (Tcp, 80),
    (Tcp, 81),
    (Tcp, 82),
    (Tcp, 8080),
    (Tcp, 8081),
    (Tcp, 8082),
    (Udp, 999),
    (Udp, 1000),
    (Udp, 1001),
    (Udp, 1002),
    (Udp, 1003),
    (Udp, 5353),
    (Udp, 81),
];

/// The kernel passes exactly the ports each form writes, and the evaluator agrees.
#[test]
fn each_port_form_opens_exactly_the_ports_written() {
    if !privileged() {
        return;
    }
    let l = lab(40, 40);
    let stop = Arc::new(AtomicBool::new(false));
    let servers = support::serve(&l.a, &PROBES, stop.clone());
    let mut wrong = Vec::new();
    for form in forms() {
        let o = objects(&l, form.policies.clone(), form.cnps.clone());
        let v = view(&l, &o);
        assert!(v.problems.is_empty(), "{}: {:?}", form.what, v.problems);
        program(&l.node, &v);
        let open: BTreeSet<(PortProtocol, u16)> = form.open.iter().copied().collect();
        // Tried at once: a blocked one waits for its timeout.
        let got: Vec<bool> = std::thread::scope(|s| {
            let tries: Vec<_> = PROBES
                .iter()
                .map(|(proto, port)| s.spawn(|| reaches(&l.b, l.a.ip, *proto, *port)))
                .collect();
            tries.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for ((proto, port), kernel) in PROBES.into_iter().zip(got) {
            let want = open.contains(&(proto, port));
            let evaluator = v.verdict(l.b.ip, l.a.ip, proto, port).passes();
            if kernel != want || evaluator != want {
                wrong.push(format!(
                    "{}: {port}/{proto}: kernel {kernel}, evaluator {evaluator}, written {want}",
                    form.what
                ));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in servers {
        s.join().unwrap();
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// x/a takes nothing in, but the ICMP errors of a connection it opened are that
/// connection's (conntrack: related) and reach it: a port unreachable from y/b, and a
/// fragmentation-needed from a router on the way to an address outside the cluster.
#[test]
fn icmp_errors_of_an_accepted_connection_pass_with_it() {
    if !privileged() {
        return;
    }
    let l = lab(44, 44);
    // A router outside the cluster, and behind it a host on a link of MTU 1000.
    let router = host(&l.node, 46, "198.51.100.20", "198.51.100.1", None);
    let far = TempNetns::new();
    router
        .ns
        .run(|| {
            weft_kernel::enable_forwarding().map_err(|e| std::io::Error::other(e.to_string()))?;
            let sh = |cmd: &str| {
                let ok = std::process::Command::new("sh").args(["-c", cmd]).status()?.success();
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::other(cmd.to_string()))
                }
            };
            sh(&format!(
                "ip link add rfar type veth peer name eth0 netns {far} && ip link set rfar mtu 1000 up && \
                 ip addr add 203.0.113.1/24 dev rfar",
                far = far.path().display()
            ))
        })
        .unwrap();
    far.run(|| {
        std::process::Command::new("sh")
            .args([
                "-c",
                "ip link set lo up && ip link set eth0 mtu 1000 up && ip addr add 203.0.113.2/24 dev eth0 && \
                 ip route add default via 203.0.113.1",
            ])
            .status()
    })
    .unwrap();
    l.node
        .run(|| {
            std::process::Command::new("ip")
                .args(["route", "add", "203.0.113.0/24", "via", "198.51.100.20"])
                .status()
        })
        .unwrap();
    let policies = vec![json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"namespace": "x", "name": "nothing-in"},
               "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"]}})];
    let v = view(&l, &objects(&l, policies, Vec::new()));
    program(&l.node, &v);
    assert!(!reaches(&l.b, l.a.ip, Udp, 9), "x/a takes nothing in");

    // Port unreachable: a UDP datagram to a port of y/b nobody listens on.
    let refused = l.a.ns.run(|| {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.connect(SocketAddr::new(l.b.ip, 9)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        s.send(b"anyone?").unwrap();
        let mut buf = [0u8; 8];
        s.recv(&mut buf).map_err(|e| e.kind())
    });
    assert_eq!(
        refused,
        Err(std::io::ErrorKind::ConnectionRefused),
        "the port unreachable came back"
    );

    // Fragmentation needed: a datagram too large for the far link, sent whole (Linux
    // sets DF on a UDP datagram that fits the path's MTU as it knows it).
    let far_ip: IpAddr = "203.0.113.2".parse().unwrap();
    let route_mtu = || {
        l.a.ns.run(|| {
            let out = std::process::Command::new("ip")
                .args(["route", "get", &far_ip.to_string()])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).to_string()
        })
    };
    assert!(!route_mtu().contains("mtu 1000"), "{}", route_mtu());
    l.a.ns.run(|| {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.send_to(&[0u8; 1400], SocketAddr::new(far_ip, 9)).unwrap();
    });
    let mut learnt = String::new();
    for _ in 0..20 {
        learnt = route_mtu();
        if learnt.contains("mtu 1000") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        learnt.contains("mtu 1000"),
        "the fragmentation-needed came back and set the path MTU: {learnt}"
    );
}

/// A pod's traffic to itself through a Service address (DNAT back to it, as kube-proxy
/// does, with its hairpin masquerade) is not policed (network-policy-api PR #390),
/// while the same pod may reach nothing else.
#[test]
fn a_pod_reaches_itself_through_a_service_but_nothing_else() {
    if !privileged() {
        return;
    }
    let l = lab(48, 48);
    let vip = "10.96.0.10";
    let a = l.a.ip;
    l.node
        .run(|| {
            weft_kernel::nft::run(
                &["-f", "-"],
                Some(&format!(
                    "table ip svc {{\n\
                       chain pre {{ type nat hook prerouting priority -100; ip daddr {vip} tcp dport 80 dnat to {a}:80; }}\n\
                       chain post {{ type nat hook postrouting priority 100; ip saddr {a} ip daddr {a} masquerade; }}\n\
                     }}\n"
                )),
            )
        })
        .unwrap();
    let policies = vec![json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"namespace": "x", "name": "nothing"},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})];
    let v = view(&l, &objects(&l, policies, Vec::new()));
    program(&l.node, &v);
    let stop = Arc::new(AtomicBool::new(false));
    let servers = support::serve(&l.a, &[(Tcp, 80)], stop.clone());
    let servers_b = support::serve(&l.b, &[(Tcp, 80)], stop.clone());
    assert!(
        reaches(&l.a, vip.parse().unwrap(), Tcp, 80),
        "x/a reaches itself through the Service"
    );
    assert!(v.verdict(a, a, Tcp, 80).passes(), "the evaluator agrees");
    assert!(!reaches(&l.a, l.b.ip, Tcp, 80), "x/a reaches nothing else");
    assert!(!reaches(&l.b, a, Tcp, 80), "nothing reaches x/a");
    stop.store(true, Ordering::Relaxed);
    for s in servers.into_iter().chain(servers_b) {
        s.join().unwrap();
    }
}
