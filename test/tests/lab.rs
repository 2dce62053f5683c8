//! The lab end to end (`weftctl lab`): three nodes in different subnets behind a router
//! namespace, seven pods wired by every link kind from the example meshnet topology.
//! Checks that every link passes traffic, that a crashed daemon leaves veth and VXLAN
//! links working and its gRPC wires come back within 2 s of the restart, that a
//! deleted pod's peers go down and come back with it, and that a pod moving to another
//! node is re-wired (new kind, new node) within 2 s.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use weft_lab::Lab;
use weft_tests::{
    LabDown, Prometheus, TempDir, bin, dashboard_queries, failed_checks, is_wire_row, node_metrics, privileged,
};

fn is_up(lab: &Lab, pod: &str, intf: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", &lab.pod_ns(pod), "-o", "link", "show", intf])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let flags = text
        .split('<')
        .nth(1)
        .and_then(|s| s.split('>').next())
        .unwrap_or_default()
        .to_string();
    flags.split(',').any(|f| f == "UP")
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn lab_wires_survive_crashes_deletes_and_moves() {
    if !privileged() {
        return;
    }
    let dir = TempDir::new("lab");
    let topologies = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/topologies");
    let example =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/lab.yaml")).unwrap();
    let name = format!("wt{}lab", std::process::id());
    let spec = example.replace("name: wl", &format!("name: {name}")).replace(
        "topology_dir: topologies",
        &format!("topology_dir: {}", topologies.display()),
    );
    assert!(spec.contains(&name), "the example lab is named `wl`");
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(dir.path().join("state"));
    let lab = LabDown(lab);

    let started = lab.0.up().expect("lab up");
    assert_eq!(started.len(), 3, "a daemon per node");
    let checks = lab.0.check(Duration::from_secs(5));
    assert_eq!(checks.len(), 16, "8 links, both directions");
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after up: {:?}",
        failed_checks(&checks)
    );
    let kinds: std::collections::BTreeSet<_> = checks.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["grpc", "veth", "vxlan"].into_iter().collect(),
        "every link kind in use"
    );

    // A crashed daemon: kernel links keep working, gRPC wires through it stop...
    lab.0.crash("n2").unwrap();
    let during = lab.0.check(Duration::from_secs(1));
    for c in &during {
        if c.kind != "grpc" {
            assert!(
                c.ok,
                "{} -> {} ({}) broke while n2's daemon was down",
                c.from, c.to, c.kind
            );
        }
    }
    assert!(
        !failed_checks(&during).is_empty(),
        "gRPC wires through n2 cannot carry frames without its daemon"
    );
    // ... and resume within 2 s of the restart.
    assert_eq!(lab.0.up().unwrap(), vec!["n2".to_string()]);
    let after = lab.0.check(Duration::from_secs(2));
    assert!(
        failed_checks(&after).is_empty(),
        "links not back within 2 s of the restart: {:?}",
        failed_checks(&after)
    );

    // The wire rows of the dashboard, in a real Prometheus scraping n1 (which holds every
    // kind of wire end: veth, VXLAN, gRPC): every panel query returns a series, and
    // frames are counted on every kind.
    let prom = Prometheus::start(
        &lab.0.node_ns("n1"),
        &dir.path().join("prom"),
        19091,
        &[("127.0.0.1:9384", "n1")],
        None,
    );
    prom.wait_for("count_over_time(weft_wire_up[1m]) >= 3", Duration::from_secs(30));
    // Traffic between scrapes, so the rates have two samples that differ.
    let _ = lab.0.check(Duration::from_secs(2));
    prom.wait_for("count_over_time(weft_wire_up[1m]) >= 5", Duration::from_secs(30));
    let wire_queries: Vec<_> = dashboard_queries("weft.json")
        .into_iter()
        .filter(|q| is_wire_row(&q.row))
        .collect();
    assert!(
        wire_queries.len() >= 9,
        "only {} wire panel queries",
        wire_queries.len()
    );
    for q in &wire_queries {
        let r = prom.query(&q.expr);
        assert!(!r.is_empty(), "wire panel {:?} returns nothing: {}", q.title, q.expr);
    }
    for kind in ["veth", "vxlan", "grpc"] {
        let frames = prom.query(&format!("sum(weft_wire_frames_total{{kind=\"{kind}\"}}) > 0"));
        assert!(!frames.is_empty(), "no frames counted on n1's {kind} wires");
    }
    drop(prom);

    // A deleted pod: its remote peers' ends go down, and come back with it.
    lab.0.remove_pod("r3").unwrap();
    wait_for("r1:e2 (VXLAN to r3) going down", || !is_up(&lab.0, "r1", "e2"));
    wait_for("r5:e1 (gRPC to r3) going down", || !is_up(&lab.0, "r5", "e1"));
    // r3's own ends are gone, and their series with them.
    let n2 = node_metrics(&lab.0, "n2");
    let left: Vec<&str> = n2
        .lines()
        .filter(|l| l.starts_with("weft_wire_") && l.contains("pod=\"r3\""))
        .collect();
    assert!(left.is_empty(), "series of r3's removed wire ends remain: {left:?}");
    assert!(
        n2.lines()
            .any(|l| l.starts_with("weft_wire_up{") && l.contains("pod=\"r4\"")),
        "n2 lost the series of its other pod"
    );
    lab.0.up().unwrap();
    let back = lab.0.check(Duration::from_secs(2));
    assert!(
        failed_checks(&back).is_empty(),
        "links not back with r3: {:?}",
        failed_checks(&back)
    );

    // A pod moving from n2 to n3: re-wired where it now runs within 2 s.
    lab.0.remove_pod("r4").unwrap();
    let mut moved = LabDown(lab.0.clone());
    std::mem::forget(lab);
    moved.0.place("r4", "n3");
    moved.0.up().unwrap();
    let after_move = moved.0.check(Duration::from_secs(2));
    assert!(
        failed_checks(&after_move).is_empty(),
        "links not re-wired after the move: {:?}",
        failed_checks(&after_move)
    );
    let r4 = |from: &str| {
        after_move
            .iter()
            .find(|c| c.from == from)
            .map(|c| c.kind.clone())
            .unwrap()
    };
    assert_eq!(r4("r4:e2"), "veth", "r4 and r5 now share n3");
    assert_eq!(r4("r4:e1"), "grpc", "r4 to r2 still crosses nodes");

    moved.0.down().unwrap();
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&name))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "lab down left namespaces: {left:?}");
}
