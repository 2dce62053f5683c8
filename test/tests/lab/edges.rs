//! Topology edge cases in a two-node lab: links whose lower-named pod (the one that
//! builds or proposes) arrives first and arrives second, for every link kind; a link
//! removed from the Topology while both pods run; a malformed Topology, which is left
//! out with a clear log line while every other pod keeps its links; calls on the wire
//! port from outside the lab's nodes refused and counted.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use weft_lab::Lab;
use weft_tests::{LabDown, TempDir, bin, failed_checks, privileged};

fn has_link(lab: &Lab, pod: &str, intf: &str) -> bool {
    Command::new("ip")
        .args(["-n", &lab.pod_ns(pod), "link", "show", "dev", intf])
        .output()
        .unwrap()
        .status
        .success()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn link(uid: i64, peer: &str, local: &str, remote: &str, ip: (&str, &str), kind: &str) -> String {
    let kind = if kind.is_empty() {
        String::new()
    } else {
        format!(", kind: {kind}")
    };
    format!(
        "      - {{uid: {uid}, peer_pod: {peer}, local_intf: {local}, peer_intf: {remote}, local_ip: {}, peer_ip: {}{kind}}}\n",
        ip.0, ip.1
    )
}

fn topology(pod: &str, links: &[String]) -> String {
    format!(
        "  - apiVersion: networkop.co.uk/v1beta1\n    kind: Topology\n    metadata: {{name: {pod}, namespace: edge}}\n    spec:\n      links:\n{}",
        links.concat()
    )
}

/// One gRPC `weft.wire.v1.Wire/Ends` call to `node`'s wire port, made with curl from
/// namespace `ns` (an address that is no node of the lab), claiming to be `claim` if
/// given; returns the response's headers, where a refusal's `grpc-status` is.
fn ends_call(ns: &str, node: &str, claim: Option<&str>, dir: &Path) -> String {
    // EndsRequest { from: Hello { address } } by hand: field 1 (message), field 2 (string).
    let mut msg = Vec::new();
    if let Some(c) = claim {
        let mut hello = vec![0x12, c.len() as u8];
        hello.extend_from_slice(c.as_bytes());
        msg.extend([0x0a, hello.len() as u8]);
        msg.extend(hello);
    }
    let mut body = vec![0u8];
    body.extend((msg.len() as u32).to_be_bytes());
    body.extend(msg);
    let file = dir.join("ends.bin");
    std::fs::write(&file, body).unwrap();
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-s",
            "-i",
            "--max-time",
            "5",
            "--http2-prior-knowledge",
        ])
        .args([
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
        ])
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{node}:9385/weft.wire.v1.Wire/Ends"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_lowercase()
}

#[test]
fn links_come_up_whoever_arrives_first_and_follow_topology_edits() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("edge");
    let name = format!("wt{}edge", std::process::id());
    let a = ("10.9.1.1/30", "10.9.1.2/30");
    let b = ("10.9.1.2/30", "10.9.1.1/30");
    // Link 1 (veth): b1 arrives before a1, which builds it. Link 2 (VXLAN): x2 arrives
    // before c1, which proposes its VNI. Link 3 (gRPC): g1 arrives before h2. Link 4
    // (veth) is removed later. `lone` has no Topology until a malformed one appears.
    let topologies = [
        topology(
            "a1",
            &[
                link(1, "b1", "e1", "e1", a, ""),
                link(4, "c1", "e4", "e4", ("10.9.4.1/30", "10.9.4.2/30"), ""),
            ],
        ),
        topology("b1", &[link(1, "a1", "e1", "e1", b, "")]),
        topology(
            "c1",
            &[
                link(2, "x2", "e2", "e2", ("10.9.2.1/30", "10.9.2.2/30"), "vxlan"),
                link(4, "a1", "e4", "e4", ("10.9.4.2/30", "10.9.4.1/30"), ""),
            ],
        ),
        topology(
            "x2",
            &[link(2, "c1", "e2", "e2", ("10.9.2.2/30", "10.9.2.1/30"), "vxlan")],
        ),
        topology(
            "g1",
            &[link(3, "h2", "e3", "e3", ("10.9.3.1/30", "10.9.3.2/30"), "grpc")],
        ),
        topology(
            "h2",
            &[link(3, "g1", "e3", "e3", ("10.9.3.2/30", "10.9.3.1/30"), "grpc")],
        ),
    ];
    let spec = format!(
        "name: {name}\nwire_security: insecure\nnodes: [n1, n2]\npods:\n  - {{name: b1, node: n1}}\n  - {{name: x2, node: n2}}\n  - {{name: a1, node: n1}}\n  - {{name: c1, node: n1}}\n  - {{name: g1, node: n1}}\n  - {{name: h2, node: n2}}\n  - {{name: lone, node: n1}}\ntopologies:\n{}",
        topologies.concat()
    );
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(dir.path().join("state"));
    let mut lab = LabDown(lab);

    lab.0.up().expect("lab up");
    let checks = lab.0.check(Duration::from_secs(5));
    assert_eq!(checks.len(), 8, "4 links, both ends");
    assert!(
        failed_checks(&checks).is_empty(),
        "links down: {:?}",
        failed_checks(&checks)
    );
    let kind = |from: &str| checks.iter().find(|c| c.from == from).unwrap().kind.clone();
    assert_eq!(
        [kind("a1:e1"), kind("c1:e2"), kind("g1:e3"), kind("a1:e4")],
        ["veth", "vxlan", "grpc", "veth"]
    );

    // In plaintext (this lab's `wire_security: insecure`; tests/wire_attacks.rs covers
    // mTLS) the wire port still refuses a caller that is no node of the topologies, and
    // one that claims another node's address, counts each, and the links keep passing.
    let (n1, n2) = (lab.0.address_of("n1").unwrap(), lab.0.address_of("n2").unwrap());
    let outside = lab.0.outside_ns();
    let rejected = |reason: &str| {
        weft_tests::lab_metric(
            &lab.0,
            "n1",
            &format!("weft_peer_rejected_total{{reason=\"{reason}\"}}"),
        )
    };
    // The nodes themselves were never refused (they are Node objects of the lab).
    assert_eq!(
        rejected("unknown_node"),
        0.0,
        "a node of the lab was refused as a stranger"
    );
    let unknown = ends_call(&outside, &n1, None, dir.path());
    assert!(unknown.contains("grpc-status: 7"), "not refused: {unknown}");
    let posing = ends_call(&outside, &n1, Some(&n2), dir.path());
    assert!(posing.contains("grpc-status: 7"), "not refused: {posing}");
    assert_eq!(rejected("unknown_node"), 1.0);
    assert_eq!(rejected("address_mismatch"), 1.0);
    let checks = lab.0.check(Duration::from_secs(5));
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after refused calls: {:?}",
        failed_checks(&checks)
    );

    // Link 4 leaves both Topologies while both pods run: both ends go, nothing else.
    for t in &mut lab.0.topologies {
        t.spec.links.retain(|l| l.uid != 4);
    }
    lab.0.up().unwrap();
    wait_for("a1:e4 and c1:e4 removed", || {
        !has_link(&lab.0, "a1", "e4") && !has_link(&lab.0, "c1", "e4")
    });
    let checks = lab.0.check(Duration::from_secs(5));
    assert_eq!(checks.len(), 6);
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after the edit: {:?}",
        failed_checks(&checks)
    );

    // A malformed Topology (the same interface twice) for `lone`: left out, with a log
    // line that names it and says why; the others keep their links.
    let bad = "apiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: lone, namespace: edge}\nspec:\n  links:\n    - {uid: 7, peer_pod: a1, local_intf: e7, peer_intf: e7}\n    - {uid: 8, peer_pod: b1, local_intf: e7, peer_intf: e8}\n";
    std::fs::write(lab.0.topology_dir().join("bad.yaml"), bad).unwrap();
    let log = Path::new(&dir.path().join("state/nodes/n1/weftd.log")).to_path_buf();
    wait_for("the malformed Topology to be reported", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("topology left out") && l.contains("edge/lone") && l.contains("already used"))
    });
    lab.0.up().unwrap();
    let checks = lab.0.check(Duration::from_secs(5));
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after a bad Topology: {:?}",
        failed_checks(&checks)
    );
    assert!(!has_link(&lab.0, "a1", "e7") && !has_link(&lab.0, "lone", "e7"));

    lab.0.down().unwrap();
}
