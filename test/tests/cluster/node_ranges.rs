//! Pod addresses from the Node object, through the real binaries: weftd reads its Node
//! from a Kubernetes API (the in-process fake, over HTTPS, in the node's namespace) and
//! serves ADDs of a network config without `ranges` from the Node's podCIDRs. It is not
//! ready, and ADD answers code 11, until the Node has podCIDRs; when they change, pods
//! keep their addresses, new pods get addresses from the new range, and the change is
//! logged and counted.

use std::time::{Duration, Instant};

use ipnet::IpNet;
use weft_fakekube::FakeApiServer;
use weft_tests::{Call, Daemon, Netns, TempDir, privileged, result_address};
use weft_topology::ClusterNode;

const TOKEN: &str = "node-ranges-token";

fn node(name: &str, cidrs: &[&str]) -> ClusterNode {
    ClusterNode {
        name: name.into(),
        addresses: vec!["127.0.0.1".parse().unwrap()],
        pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        ..Default::default()
    }
}

fn readyz(d: &Daemon) -> String {
    let out = d
        .node
        .cmd("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"])
        .arg("http://127.0.0.1:9384/readyz")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn until(what: &str, d: &Daemon, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: timed out; weftd log:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn pods_get_addresses_from_the_node_and_readiness_waits_for_them() {
    let _area = weft_tests::area("cluster::node_ranges");
    if !privileged() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _inside = rt.enter();
    let api = FakeApiServer::new();
    let node_ns = Netns::new("nodeapi");
    let endpoint = api.serve_https(node_ns.bind_tcp("127.0.0.1:0"), TOKEN).unwrap();
    let kube = TempDir::new("kubeconfig");
    let ca = kube.path().join("ca.crt");
    std::fs::write(&ca, &endpoint.ca_pem).unwrap();
    let config = kube.path().join("config");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"https://{}\", certificate-authority: \"{}\"}}\nusers:\n- name: u\n  user: {{token: {TOKEN}}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            endpoint.addr,
            ca.display()
        ),
    )
    .unwrap();
    let d = Daemon::start_in(
        node_ns,
        "ranges",
        // Wires are not what this test is about: their port runs in plaintext, which
        // weftd serves only when told so explicitly.
        &[
            ("WEFT_KUBERNETES", "true"),
            ("KUBECONFIG", config.to_str().unwrap()),
            ("WEFT_WIRE_INSECURE", "true"),
        ],
    );
    let conf = serde_json::json!({
        "cniVersion": "1.1.0", "name": "weft", "type": "weft", "socket": d.socket(),
    })
    .to_string();

    // No Node yet: not ready, and an ADD is told to come back.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(readyz(&d), "503", "ready without podCIDRs:\n{}", d.log());
    let p1 = Netns::new("p1");
    let out = Call::new("ADD", "ctr-1", &p1.path(), &conf).run();
    assert_eq!(out.err_code(), 11, "{out:?}");
    assert!(d.log().contains("waiting for this node's podCIDRs"), "{}", d.log());

    // The Node gets its podCIDR: ready, and pods get addresses from it.
    api.put(&node(d.node_name(), &["10.251.0.0/24"]).to_node());
    until("ready once the Node has podCIDRs", &d, || readyz(&d) == "200");
    let r1 = Call::new("ADD", "ctr-1", &p1.path(), &conf).run().ok();
    let a1: std::net::IpAddr = result_address(&r1, false).parse().unwrap();
    assert!("10.251.0.0/24".parse::<IpNet>().unwrap().contains(&a1), "{a1}");

    // The podCIDR changes: the first pod keeps its address, a new pod gets one from the
    // new range, and the change is said and counted.
    api.put(&node(d.node_name(), &["10.252.0.0/24"]).to_node());
    until("the change logged", &d, || {
        d.log().contains("this node's podCIDRs changed")
    });
    let p2 = Netns::new("p2");
    let r2 = Call::new("ADD", "ctr-2", &p2.path(), &conf).run().ok();
    let a2: std::net::IpAddr = result_address(&r2, false).parse().unwrap();
    assert!("10.252.0.0/24".parse::<IpNet>().unwrap().contains(&a2), "{a2}");
    // CHECK gets the ADD result as prevResult, as runtimes send it.
    let mut with_prev: serde_json::Value = serde_json::from_str(&conf).unwrap();
    with_prev["prevResult"] = r1.clone();
    let check = Call::new("CHECK", "ctr-1", &p1.path(), &with_prev.to_string()).run();
    assert_eq!(check.code, 0, "the first pod keeps its address: {check:?}");
    // Both ranges route on the node: the old pod reaches the new one.
    assert!(p1.ping(&a2.to_string()), "{a1} cannot reach {a2}");
    let metrics = d.http_get("/metrics", "text/plain");
    assert!(metrics.contains("weft_node_pod_cidr_changes_total 1"), "{metrics}");
    assert!(metrics.contains("weft_node_pod_mtu "), "{metrics}");
    for (cid, p) in [("ctr-1", &p1), ("ctr-2", &p2)] {
        assert_eq!(Call::new("DEL", cid, &p.path(), &conf).run().code, 0);
    }
    drop(endpoint);
}
