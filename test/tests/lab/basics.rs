//! The lab end to end (`weftctl lab`): three nodes in different subnets behind a router
//! namespace, seven pods wired by every link kind from the example meshnet topology.
//! Checks that every link passes traffic, that a crashed daemon leaves veth and VXLAN
//! links working and its gRPC wires come back within 2 s of the restart, that a
//! deleted pod's peers go down and come back with it, and that a pod moving to another
//! node is re-wired (new kind, new node) within 2 s.
//!
//! Network policy in a lab (`weftctl lab apply|delete|label|matrix`): three nodes,
//! namespaces x and y with pods of one name in both, and the truth table of which pod
//! reaches which before any policy, after a default-deny in x with an allow from y on a
//! named port, after a pod's and a namespace's labels change, and after the delete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use weft_lab::Lab;
use weft_tests::{
    LabDown, Prometheus, TempDir, bin, dashboard_queries, failed_checks, is_wire_row, load_lab, node_metrics,
    privileged,
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
    let _alone = weft_tests::alone("lab");
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
    // The emulation's panels have nothing to show without impairments: their queries
    // must still be ones Prometheus runs.
    for q in dashboard_queries("weft.json")
        .into_iter()
        .filter(|q| weft_tests::is_emulation_row(&q.row))
    {
        prom.query(&q.expr);
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

/// `weftctl ARGS` with the lab's state under `lab_dir`.
fn weftctl(lab_dir: &Path, args: &[&str]) -> Output {
    Command::new(bin("weftctl"))
        .env("WEFT_LAB_DIR", lab_dir)
        .args(args)
        .output()
        .unwrap()
}

/// `weftctl ARGS`, which must succeed; its standard output.
fn weftctl_ok(lab_dir: &Path, args: &[&str]) -> String {
    let out = weftctl(lab_dir, args);
    assert!(
        out.status.success(),
        "weftctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `weftctl lab matrix` against `expected` until it matches (within 15 s) and
/// returns how long after `since` the first matching run started; prints it.
fn wait_for_matrix(lab_dir: &Path, file: &str, what: &str, expected: &str, since: Instant) -> Duration {
    let expect = lab_dir.join(format!("expect-{}.txt", what.replace(' ', "-")));
    std::fs::write(&expect, expected).unwrap();
    let expect_arg = expect.display().to_string();
    let args = [
        "lab",
        "matrix",
        file,
        "--port",
        "80/tcp",
        "--port",
        "81/udp",
        "--expect",
        &expect_arg,
    ];
    let mut runs = 0;
    loop {
        let started = Instant::now();
        let out = weftctl(lab_dir, &args);
        runs += 1;
        let took = started.elapsed();
        if out.status.success() {
            let after = started.duration_since(since);
            println!(
                "{what}: the matrix matched in a run started {:.2} s after the change (run {runs}, {:.2} s long)",
                after.as_secs_f64(),
                took.as_secs_f64()
            );
            return after;
        }
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "{what}: the matrix does not match after {runs} runs in 15 s:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The two tables of a phase (80/tcp and 81/udp), from the rows of each.
fn tables(tcp80: &str, udp81: &str) -> String {
    let header = "-         default/c x/a       x/b       y/a       y/b\n";
    format!("80/tcp IPv4\n{header}{tcp80}\n81/udp IPv4\n{header}{udp81}")
}

const ALL_REACHABLE: &str = "\
default/c .         .         .         .         .
x/a       .         .         .         .         .
x/b       .         .         .         .         .
y/a       .         .         .         .         .
y/b       .         .         .         .         .
";

/// Every pod of x isolated for ingress (UDP from anyone blocked), 80/TCP allowed from
/// the pods of namespaces labelled `ns: y` and from pods of x labelled `role: client`,
/// on the named port `serve-80`, which x/a declares and x/b does not.
const UDP_ISOLATED: &str = "\
default/c .         X         X         .         .
x/a       .         .         X         .         .
x/b       .         X         .         .         .
y/a       .         X         X         .         .
y/b       .         X         X         .         .
";

const POLICIES: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y-on-serve-80, namespace: x}
spec:
  podSelector: {}
  ingress:
    - from:
        - namespaceSelector: {matchLabels: {ns: y}}
        - podSelector: {matchLabels: {role: client}}
      ports: [{protocol: TCP, port: serve-80}]
";

#[test]
fn lab_matrix_follows_policies_labels_and_deletes() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("labpol");
    let name = format!("wt{}pol", std::process::id());
    // x/a and y/a (and x/b, y/b) share names; c names no namespace: `default`, its
    // network namespace named as before namespaces.
    let text = format!(
        "name: {name}
wire_security: insecure
nodes: [n1, n2, n3]
namespaces:
  - {{name: x, labels: {{ns: x}}}}
  - {{name: y, labels: {{ns: y}}}}
pods:
  - {{name: a, namespace: x, node: n1, labels: {{pod: a}}, ports: [{{name: serve-80, containerPort: 80}}]}}
  - {{name: b, namespace: x, node: n2, labels: {{pod: b}}}}
  - {{name: a, namespace: y, node: n3, labels: {{pod: a}}}}
  - {{name: b, namespace: y, node: n1, labels: {{pod: b}}}}
  - {{name: c, node: n2}}
"
    );
    let (lab, file, lab_dir) = load_lab(dir.path(), &name, &text);
    let lab = LabDown(lab);
    let file = file.display().to_string();
    assert_eq!(lab.0.pod_ns("c"), format!("{name}-p-c"));
    assert_eq!(lab.0.pod_ns("x/a"), format!("{name}-p-x.a"));
    lab.0.up().expect("lab up");

    // The lab is the API server: a Pod object per pod with its node, labels, ports and
    // (after its ADD) addresses, a Namespace per namespace, `default` too.
    let topology = lab.0.topology_dir();
    let pod = std::fs::read_to_string(topology.join("lab-pod-x_a.yaml")).unwrap();
    let addr = lab.0.pod_addresses("x/a")[0].to_string();
    for want in ["nodeName: n1", "name: serve-80", "containerPort: 80", "podIPs", &addr] {
        assert!(pod.contains(want), "no {want:?} in x/a's Pod object:\n{pod}");
    }
    let ns = std::fs::read_to_string(topology.join("lab-namespace-default.yaml")).unwrap();
    assert!(ns.contains("kubernetes.io/metadata.name: default"), "{ns}");

    // Pods by NS/NAME, or by a name only one pod has; an ambiguous one names the
    // candidates.
    let out = weftctl(&lab_dir, &["lab", "exec", &file, "a", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("x/a, y/a"), "{err}");
    let ip = weftctl_ok(
        &lab_dir,
        &[
            "lab", "exec", &file, "y/a", "--", "ip", "-o", "addr", "show", "dev", "eth0",
        ],
    );
    assert!(ip.contains(&lab.0.pod_addresses("y/a")[0].to_string()), "{ip}");
    weftctl_ok(&lab_dir, &["lab", "exec", &file, "c", "--", "true"]);

    // No policy: every pod reaches every pod, on TCP and UDP, across all nodes.
    let since = Instant::now();
    wait_for_matrix(
        &lab_dir,
        &file,
        "no policy",
        &tables(ALL_REACHABLE, ALL_REACHABLE),
        since,
    );
    let json = weftctl_ok(&lab_dir, &["--json", "lab", "matrix", &file, "--port", "80/tcp"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v["tables"][0]["pods"],
        serde_json::json!(["default/c", "x/a", "x/b", "y/a", "y/b"])
    );
    assert_eq!(v["tables"][0]["reachable"][1][3], true);
    // SCTP is refused clearly where the kernel has none.
    let sctp = weftctl(
        &lab_dir,
        &["lab", "matrix", &file, "--port", "9/sctp", "--timeout", "300ms"],
    );
    let err = String::from_utf8_lossy(&sctp.stderr);
    assert!(sctp.status.success() || err.contains("no SCTP"), "{err}");

    // A default-deny in x and the allow from y on the named port.
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, POLICIES).unwrap();
    let policies = policies.display().to_string();
    let out = weftctl_ok(&lab_dir, &["lab", "apply", &file, &policies]);
    assert_eq!(
        out,
        "networkpolicy x/deny-ingress created\nnetworkpolicy x/allow-y-on-serve-80 created\n"
    );
    let mut took = Vec::new();
    let isolated = "\
default/c .         X         X         .         .
x/a       .         .         X         .         .
x/b       .         X         .         .         .
y/a       .         .         X         .         .
y/b       .         .         X         .         .
";
    took.push(wait_for_matrix(
        &lab_dir,
        &file,
        "policies applied",
        &tables(isolated, UDP_ISOLATED),
        Instant::now(),
    ));
    assert!(weftctl_ok(&lab_dir, &["lab", "apply", &file, &policies]).contains("unchanged"));

    // A pod label: x/b becomes a client, and reaches x/a on 80.
    let out = weftctl_ok(&lab_dir, &["lab", "label", &file, "pod", "x/b", "role=client"]);
    assert_eq!(out, "pod x/b labeled: pod=b,role=client\n");
    let since = Instant::now();
    let client = "\
default/c .         X         X         .         .
x/a       .         .         X         .         .
x/b       .         .         .         .         .
y/a       .         .         X         .         .
y/b       .         .         X         .         .
";
    took.push(wait_for_matrix(
        &lab_dir,
        &file,
        "pod labelled",
        &tables(client, UDP_ISOLATED),
        since,
    ));

    // A namespace label: default now looks like y to the policy.
    weftctl_ok(&lab_dir, &["lab", "label", &file, "namespace", "default", "ns=y"]);
    let since = Instant::now();
    let default_as_y = "\
default/c .         .         X         .         .
x/a       .         .         X         .         .
x/b       .         .         .         .         .
y/a       .         .         X         .         .
y/b       .         .         X         .         .
";
    took.push(wait_for_matrix(
        &lab_dir,
        &file,
        "namespace labelled",
        &tables(default_as_y, UDP_ISOLATED),
        since,
    ));
    // And back, with kubectl's `KEY-`.
    let out = weftctl_ok(&lab_dir, &["lab", "label", &file, "ns", "default", "ns-"]);
    assert_eq!(
        out,
        "namespace default unlabeled: kubernetes.io/metadata.name=default\n"
    );
    let since = Instant::now();
    took.push(wait_for_matrix(
        &lab_dir,
        &file,
        "namespace label removed",
        &tables(client, UDP_ISOLATED),
        since,
    ));

    // The delete: everything reachable again; deleting again finds nothing.
    let out = weftctl_ok(&lab_dir, &["lab", "delete", &file, &policies]);
    assert_eq!(
        out,
        "networkpolicy x/deny-ingress deleted\nnetworkpolicy x/allow-y-on-serve-80 deleted\n"
    );
    let since = Instant::now();
    took.push(wait_for_matrix(
        &lab_dir,
        &file,
        "policies deleted",
        &tables(ALL_REACHABLE, ALL_REACHABLE),
        since,
    ));
    let again = weftctl(&lab_dir, &["lab", "delete", &file, &policies]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not found: networkpolicy x/deny-ingress"));

    // A wrong expectation names the cells that differ.
    let wrong = lab_dir.join("wrong.txt");
    std::fs::write(&wrong, tables(isolated, UDP_ISOLATED)).unwrap();
    let wrong = wrong.display().to_string();
    let out = weftctl(
        &lab_dir,
        &[
            "lab", "matrix", &file, "--port", "80/tcp", "--port", "81/udp", "--expect", &wrong,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("differs: 80/tcp IPv4 default/c -> x/a: expected X, got ."),
        "{stdout}"
    );

    // Each change showed in the first or second matrix started after it: weftd applies
    // a change in one pass. (A run lasts about a second when a cell is blocked; one
    // that allows more shows on the run's second try half-way through, one that
    // blocks more only in the next run, whose first connection comes after it.)
    for t in &took {
        assert!(*t < Duration::from_secs(4), "a change took {t:?} to show: {took:?}");
    }
    lab.0.down().unwrap();
}
