//! The lab end to end (`weftctl lab`): three nodes in different subnets behind a router
//! namespace, seven pods wired by every link kind from the example meshnet topology.
//! Checks that every link passes traffic, that a crashed daemon leaves veth and VXLAN
//! links working and its gRPC wires come back within 2 s of the restart, that a
//! deleted pod's peers go down and come back with it, and that a pod moving to another
//! node is re-wired (new kind, new node) within 2 s.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use weft_lab::{Lab, LinkCheck};
use weft_tests::{TempDir, bin, privileged};

/// Takes the lab down whatever happens to the test.
struct Down(Lab);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

fn failed(checks: &[LinkCheck]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{} -> {} ({})", c.from, c.to, c.kind))
        .collect()
}

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
    let topology = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/lab-topology.yaml");
    let example =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/lab.yaml")).unwrap();
    let name = format!("wt{}lab", std::process::id());
    let spec = example.replace("name: wl", &format!("name: {name}")).replace(
        "topology: lab-topology.yaml",
        &format!("topology: {}", topology.display()),
    );
    assert!(spec.contains(&name), "the example lab is named `wl`");
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(dir.path().join("state"));
    let lab = Down(lab);

    let started = lab.0.up().expect("lab up");
    assert_eq!(started.len(), 3, "a daemon per node");
    let checks = lab.0.check(Duration::from_secs(5));
    assert_eq!(checks.len(), 16, "8 links, both directions");
    assert!(failed(&checks).is_empty(), "links down after up: {:?}", failed(&checks));
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
        !failed(&during).is_empty(),
        "gRPC wires through n2 cannot carry frames without its daemon"
    );
    // ... and resume within 2 s of the restart.
    assert_eq!(lab.0.up().unwrap(), vec!["n2".to_string()]);
    let after = lab.0.check(Duration::from_secs(2));
    assert!(
        failed(&after).is_empty(),
        "links not back within 2 s of the restart: {:?}",
        failed(&after)
    );

    // Every metric the wires dashboard charts is exported by a node holding every kind
    // of wire end (n1: veth, VXLAN, gRPC), with per-wire series for each kind.
    let metrics = weft_tests::sh(Command::new("ip").args([
        "netns",
        "exec",
        &lab.0.node_ns("n1"),
        "curl",
        "-sf",
        "http://127.0.0.1:9384/metrics",
    ]));
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards/weft-wires.json"))
            .unwrap(),
    )
    .unwrap();
    let mut charted = std::collections::BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("weft_") {
                    charted.insert(word.to_string());
                }
            }
        }
    }
    assert!(charted.len() >= 6, "the wires dashboard charts {charted:?}");
    for m in &charted {
        assert!(metrics.lines().any(|l| l.starts_with(m.as_str())), "n1 exports no {m}");
    }
    for kind in ["veth", "vxlan", "grpc"] {
        let frames = metrics
            .lines()
            .filter(|l| l.starts_with("weft_wire_frames_total{") && l.contains(&format!("kind=\"{kind}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        assert!(frames > 0.0, "no frames counted on n1's {kind} wires:\n{metrics}");
    }

    // A deleted pod: its remote peers' ends go down, and come back with it.
    lab.0.remove_pod("r3").unwrap();
    wait_for("r1:e2 (VXLAN to r3) going down", || !is_up(&lab.0, "r1", "e2"));
    wait_for("r5:e1 (gRPC to r3) going down", || !is_up(&lab.0, "r5", "e1"));
    lab.0.up().unwrap();
    let back = lab.0.check(Duration::from_secs(2));
    assert!(failed(&back).is_empty(), "links not back with r3: {:?}", failed(&back));

    // A pod moving from n2 to n3: re-wired where it now runs within 2 s.
    lab.0.remove_pod("r4").unwrap();
    let mut moved = Down(lab.0.clone());
    std::mem::forget(lab);
    moved.0.spec.nodes[1].pods.retain(|p| p != "r4");
    moved.0.spec.nodes[2].pods.push("r4".into());
    moved.0.up().unwrap();
    let after_move = moved.0.check(Duration::from_secs(2));
    assert!(
        failed(&after_move).is_empty(),
        "links not re-wired after the move: {:?}",
        failed(&after_move)
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
