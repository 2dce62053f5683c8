//! Kernel drift: someone deletes what weft made behind its back. The reconcile loop
//! (`--reconcile-interval`, one second here) must put back a deleted host route and a
//! deleted pod veth, collect a pod whose network namespace vanished (releasing its
//! addresses), restore a VXLAN wire end's unicast FDB entries, and count each repair in
//! `weft_reconcile_repairs_total{kind}`.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_lab::Lab;
use weft_tests::{Call, Daemon, LabDown, Netns, TempDir, bin, privileged, sh};

const V4: &str = "10.244.61.0/24";

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of `weft_reconcile_repairs_total{kind}` in a metrics page (0 when absent).
fn repairs(page: &str, kind: &str) -> f64 {
    let series = format!("weft_reconcile_repairs_total{{kind=\"{kind}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn ipv4_of(result: &Value) -> String {
    let cidr = result["ips"][0]["address"].as_str().unwrap();
    cidr.split('/').next().unwrap().to_string()
}

#[test]
fn reconcile_restores_routes_and_veths_and_collects_vanished_pods() {
    let _area = weft_tests::area("node::drift");
    if !privileged() {
        return;
    }
    let d = Daemon::start_with_env("drift", &[("WEFT_RECONCILE_INTERVAL", "1")]);
    let conf = d.conf("1.1.0", &[V4]);
    let (a, b, c) = (Netns::new("da"), Netns::new("db"), Netns::new("dc"));
    let ra = Call::new("ADD", "drift-a", &a.path(), &conf).run().ok();
    let rb = Call::new("ADD", "drift-b", &b.path(), &conf).run().ok();
    let rc = Call::new("ADD", "drift-c", &c.path(), &conf).run().ok();
    let (ipa, ipb) = (ipv4_of(&ra), ipv4_of(&rb));
    let host_b = rb["interfaces"][0]["name"].as_str().unwrap().to_string();
    let host_c = rc["interfaces"][0]["name"].as_str().unwrap().to_string();
    assert_eq!(d.allocated(), 3);
    let page = d.http_get("/metrics", "text/plain");
    for kind in ["route", "veth", "collected"] {
        assert_eq!(repairs(&page, kind), 0.0, "{kind} repaired before anything drifted");
    }

    // Behind weft's back: a's host route goes, b's veth pair goes (deleting one end takes
    // both), c's network namespace goes (the runtime lost the pod without a DEL).
    sh(d.node.cmd("ip").args(["route", "del", &format!("{ipa}/32")]));
    sh(d.node.cmd("ip").args(["link", "del", &host_b]));
    assert!(!d.node.ping(&ipa), "a answers without its host route");
    c.delete();

    wait_for("a's host route to come back", Duration::from_secs(10), || {
        d.node.weft_routes().iter().any(|r| r["dst"] == ipa)
    });
    wait_for("b's veth pair to come back", Duration::from_secs(10), || {
        d.node.links().contains(&host_b) && b.links().contains(&"eth0".to_string())
    });
    wait_for("c to be collected", Duration::from_secs(10), || {
        d.status()["attachments"] == 2
    });
    assert!(d.node.ping(&ipa), "a is unreachable after its route was restored");
    assert!(d.node.ping(&ipb), "b is unreachable after its veth was rebuilt");
    let eth0 = b.ip_json(&["-4", "addr", "show", "eth0"]);
    assert_eq!(
        eth0[0]["addr_info"][0]["local"].as_str(),
        Some(ipb.as_str()),
        "b's rebuilt eth0 has another address: {eth0}"
    );
    assert_eq!(d.allocated(), 2, "c's address is still allocated");
    assert!(!d.node.links().contains(&host_c), "c's host end remains");

    let page = d.http_get("/metrics", "text/plain");
    assert!(repairs(&page, "route") >= 1.0, "route repair not counted:\n{page}");
    assert!(repairs(&page, "veth") >= 1.0, "veth repair not counted:\n{page}");
    assert_eq!(repairs(&page, "collected"), 1.0, "collection not counted once:\n{page}");

    // Nothing drifts any more: the next passes repair nothing.
    std::thread::sleep(Duration::from_millis(2500));
    let again = d.http_get("/metrics", "text/plain");
    for kind in ["route", "veth", "collected"] {
        assert_eq!(
            repairs(&again, kind),
            repairs(&page, kind),
            "{kind} repaired again though nothing drifted"
        );
    }

    // The runtime's DELs, c's included (its namespace is long gone), leave nothing.
    Call::new("DEL", "drift-a", &a.path(), &conf).run().ok();
    Call::new("DEL", "drift-b", &b.path(), &conf).run().ok();
    Call::new("DEL", "drift-c", "", &conf).run().ok();
    d.assert_clean();
}

/// The FDB entries (MAC, VTEP) of `intf` in a pod of the lab.
fn fdb(lab: &Lab, pod: &str, intf: &str) -> Vec<(String, String)> {
    let out = sh(Command::new("ip").args([
        "netns",
        "exec",
        &lab.pod_ns(pod),
        "bridge",
        "-j",
        "fdb",
        "show",
        "dev",
        intf,
    ]));
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Array(vec![]));
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["mac"].as_str()?.to_string(), e["dst"].as_str()?.to_string())))
        .collect()
}

#[test]
fn reconcile_restores_deleted_vxlan_fdb_entries() {
    let _area = weft_tests::area("node::drift");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("fdb");
    let name = format!("wt{}fdb", std::process::id());
    let spec = format!(
        "name: {name}\ninter_node_link: vxlan\nreconcile_interval: 1\nnodes: [n1, n2]\npods:\n  - {{name: p1, node: n1}}\n  - {{name: p2, node: n2}}\ntopologies:\n\
         - {{apiVersion: networkop.co.uk/v1beta1, kind: Topology, metadata: {{name: p1, namespace: fdb}}, spec: {{links: [{{uid: 1, peer_pod: p2, local_intf: e1, peer_intf: e1, local_ip: 10.9.7.1/30, peer_ip: 10.9.7.2/30}}]}}}}\n\
         - {{apiVersion: networkop.co.uk/v1beta1, kind: Topology, metadata: {{name: p2, namespace: fdb}}, spec: {{links: [{{uid: 1, peer_pod: p1, local_intf: e1, peer_intf: e1, local_ip: 10.9.7.2/30, peer_ip: 10.9.7.1/30}}]}}}}\n"
    );
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let lab = LabDown(
        Lab::load(&file)
            .unwrap()
            .with_binaries(bin("weftd"), bin("weft"))
            .with_state_dir(dir.path().join("state")),
    );
    lab.0.up().expect("lab up");
    let checks = lab.0.check(Duration::from_secs(5));
    assert!(
        checks.len() == 2 && checks.iter().all(|c| c.ok && c.kind == "vxlan"),
        "the VXLAN link does not pass: {checks:?}"
    );
    let before = fdb(&lab.0, "p1", "e1");
    assert_eq!(
        before.len(),
        2,
        "p1:e1 should have the default and the peer entry: {before:?}"
    );

    for (mac, dst) in &before {
        sh(Command::new("ip").args([
            "netns",
            "exec",
            &lab.0.pod_ns("p1"),
            "bridge",
            "fdb",
            "del",
            mac,
            "dev",
            "e1",
            "dst",
            dst,
        ]));
    }
    assert!(fdb(&lab.0, "p1", "e1").is_empty(), "the FDB entries were not deleted");

    wait_for("p1:e1's FDB entries to come back", Duration::from_secs(10), || {
        let mut now = fdb(&lab.0, "p1", "e1");
        let mut want = before.clone();
        now.sort();
        want.sort();
        now == want
    });
    let checks = lab.0.check(Duration::from_secs(2));
    assert!(
        checks.iter().all(|c| c.ok),
        "the VXLAN link does not pass after the repair: {checks:?}"
    );
    let page = sh(Command::new("ip").args([
        "netns",
        "exec",
        &lab.0.node_ns("n1"),
        "curl",
        "-sf",
        "http://127.0.0.1:9384/metrics",
    ]));
    assert!(repairs(&page, "fdb") >= 1.0, "FDB repair not counted on n1:\n{page}");
    lab.0.down().unwrap();
}
