//! Network policy through the real plugin and daemon: weftd in a node namespace reads
//! Namespace, Pod and NetworkPolicy objects from a directory (as a lab's daemons do;
//! the test plays the API server and kubelet), pods are attached through the plugin,
//! and connections between them pass exactly as the policies say, from the moment
//! each ADD answers. Then what an operator sees: `weftctl policy explain`, `weftctl
//! policy denies`, the verdict metric, `weftctl status`; a policy change within a
//! second; a restart that keeps the table (never open); drift repaired; a lost source
//! (stale, still enforced); audit mode.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weft_tests::{
    Call, Daemon, Netns, Prometheus, TempDir, bin, dashboard_queries, is_policy_row, privileged, run, sh,
};

const RANGE: &str = "10.246.0.0/24";

/// Writes `objects` (Kubernetes objects) to `dir/name` atomically, as YAML documents.
fn write(dir: &Path, name: &str, objects: &[Value]) {
    let text: String = objects
        .iter()
        .map(|o| format!("---\n{}", serde_yaml_ng::to_string(o).unwrap()))
        .collect();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"ns": name}}})
}

fn pod(ns: &str, name: &str, node: &str, ip: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "serve-80", "containerPort": 80}]}]}});
    if let Some(ip) = ip {
        p["status"] = json!({"podIP": ip, "podIPs": [{"ip": ip}]});
    }
    p
}

fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

/// ADD of pod `ns/name` through the plugin, as kubelet calls it; its address.
fn add(d: &Daemon, ns: &str, name: &str, netns: &Netns) -> String {
    let conf = d.conf("1.1.0", &[RANGE]);
    let out = Call::new("ADD", &format!("ctr-{ns}-{name}"), &netns.path(), &conf)
        .set(
            "CNI_ARGS",
            &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"),
        )
        .run()
        .ok();
    out["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Accepts connections on port 80 in `ns` until the returned guard goes.
struct Server(
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Option<std::thread::JoinHandle<()>>,
);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}

fn serve(ns: &Netns) -> Server {
    let l: TcpListener = ns.bind_tcp("0.0.0.0:80");
    l.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            if l.accept().is_err() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    Server(stop, Some(t))
}

fn reaches(from: &Netns, ip: &str) -> bool {
    reaches_within(from, ip, Duration::from_millis(500))
}

/// Whether a connection is accepted within `limit` (a blocked SYN is dropped: it times out).
fn reaches_within(from: &Netns, ip: &str, limit: Duration) -> bool {
    let target: SocketAddr = format!("{ip}:80").parse().unwrap();
    from.within(|| TcpStream::connect_timeout(&target, limit).is_ok())
}

fn weftctl(d: &Daemon, args: &[&str]) -> std::process::Output {
    run(Command::new(bin("weftctl"))
        .args(["--socket", d.socket().to_str().unwrap()])
        .args(args))
}

fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what} (waited {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn pods_are_policed_from_their_first_packet_and_operators_see_why() {
    let _area = weft_tests::area("cluster::policy");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("pol-objects");
    let mut d = Daemon::start_configured(Netns::new("pol"), "pol", |c| {
        c.args.extend(
            [
                "--topology-dir",
                dir.path().to_str().unwrap(),
                "--wire-insecure",
                "--node-address",
                "127.0.0.1",
                "--reconcile-interval",
                "1",
            ]
            .map(String::from),
        );
    });
    let node = d.node_name().to_string();
    // A real Prometheus scrapes the daemon: the dashboard's policy row is evaluated there.
    let prom = Prometheus::start(
        d.node.name(),
        &d.dir().join("prom"),
        19091,
        &[("127.0.0.1:9384", d.node_name())],
        None,
    );
    // x: nothing in but from pod b, on 80; its flow metrics per workload.
    let mut x = namespace("x");
    x["metadata"]["annotations"] = json!({"weft.dev/flow-metrics": "workload"});
    write(dir.path(), "namespaces.yaml", &[x]);
    write(
        dir.path(),
        "policies.yaml",
        &[
            policy("x", "deny", json!({"podSelector": {}})),
            policy(
                "x",
                "from-b",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                                    "ports": [{"port": "serve-80"}]}]}),
            ),
        ],
    );
    // The API server has the Pods before kubelet runs their sandboxes.
    write(
        dir.path(),
        "pods.yaml",
        &[
            pod("x", "a", &node, None),
            pod("x", "b", &node, None),
            pod("x", "c", &node, None),
        ],
    );
    eventually("the daemon never read the objects", Duration::from_secs(10), || {
        let out = weftctl(&d, &["--json", "status"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"policies\": 2")
    });
    let (na, nb, nc) = (Netns::new("pa"), Netns::new("pb"), Netns::new("pc"));
    let a = add(&d, "x", "a", &na);
    let _server = serve(&na);
    // Policed from the first packet: c tries the moment a's ADD has answered.
    let c = add(&d, "x", "c", &nc);
    assert!(!reaches(&nc, &a), "x/c reached x/a right after the ADDs");
    let b = add(&d, "x", "b", &nb);
    assert!(reaches(&nb, &a), "x/b is allowed into x/a on its named port 80");
    assert!(!reaches(&nc, &a));
    // kubelet reports the addresses.
    write(
        dir.path(),
        "pods.yaml",
        &[
            pod("x", "a", &node, Some(&a)),
            pod("x", "b", &node, Some(&b)),
            pod("x", "c", &node, Some(&c)),
        ],
    );

    // What an operator sees.
    let out = weftctl(&d, &["--json", "policy", "explain", "x/c", "x/a", "80/tcp"]);
    assert!(out.status.success(), "{out:?}");
    let ex: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ex["allowed"], false, "{ex}");
    assert_eq!(ex["ingress"]["isolating"], json!(["x/deny", "x/from-b"]), "{ex}");
    let ok: Value =
        serde_json::from_slice(&weftctl(&d, &["--json", "policy", "explain", "x/b", "x/a", "80"]).stdout).unwrap();
    assert_eq!(ok["allowed"], true, "{ok}");
    assert_eq!(ok["ingress"]["allowed_by"], "x/from-b", "{ok}");
    let text = String::from_utf8_lossy(&weftctl(&d, &["policy", "explain", "x/c", "x/a", "80/tcp"]).stdout).to_string();
    assert!(
        text.contains("DENIED") && text.contains("isolated by x/deny, x/from-b"),
        "{text}"
    );
    let denies = eventually("the denied flow was not reported", Duration::from_secs(5), || {
        String::from_utf8_lossy(&weftctl(&d, &["--json", "policy", "denies"]).stdout)
            .contains(&format!("\"dst_ip\":\"{a}\""))
    });
    println!("deny reported within {denies:?}");
    let line = String::from_utf8_lossy(&weftctl(&d, &["--json", "policy", "denies"]).stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["dst_ip"] == a.as_str())
        .unwrap();
    assert_eq!(
        (line["src"].as_str(), line["dst"].as_str()),
        (Some("x/c"), Some("x/a")),
        "{line}"
    );
    assert_eq!(line["policies"], json!(["x/deny", "x/from-b"]));
    assert_eq!(
        (line["port"].as_u64(), line["direction"].as_str()),
        (Some(80), Some("ingress"))
    );
    assert!(d.log().contains("connection denied by network policy"), "{}", d.log());
    let page = d.http_get("/metrics", "text/plain");
    for (series, what) in [
        (
            "weft_policy_verdicts_total{direction=\"ingress\",action=\"deny\",namespace=\"x\",policy=\"deny\"}",
            "deny",
        ),
        (
            "weft_policy_verdicts_total{direction=\"ingress\",action=\"allow\",namespace=\"x\",policy=\"from-b\"}",
            "allow",
        ),
    ] {
        assert!(weft_tests::series_value(&page, series) >= 1.0, "{what}: {page}");
    }
    let status = String::from_utf8_lossy(&weftctl(&d, &["status"]).stdout).to_string();
    assert!(
        status.contains("policy       in step; 2 policies, 0 cluster policies"),
        "{status}"
    );
    // Every query of the dashboard's network policy row returns data in Prometheus
    // (rates need two scrapes with the verdicts).
    prom.wait_for(
        "count_over_time(weft_policy_verdicts_total[1m]) >= 3",
        Duration::from_secs(30),
    );
    // The flows row's bytes are counted at each read of the conntrack table (every 10 s).
    prom.wait_for(
        "count_over_time(weft_flow_bytes_total[1m]) >= 2",
        Duration::from_secs(40),
    );
    let mut checked = 0;
    for q in dashboard_queries("weft.json").iter().filter(|q| is_policy_row(&q.row)) {
        let r = prom.query(&q.expr);
        assert!(!r.is_empty(), "panel {:?} query returns nothing: {}", q.title, q.expr);
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} policy and flow queries");
    // Per workload, as x asks (its pods have no controller: workload "none").
    let page = d.http_get("/metrics", "text/plain");
    assert!(
        page.lines().any(|l| l.starts_with("weft_workload_flow_bytes_total{")
            && l.contains("namespace=\"x\"")
            && l.contains("workload=\"none\"")),
        "{page}"
    );

    // A policy change reaches the kernel within a second of the file.
    write(
        dir.path(),
        "policies.yaml",
        &[
            policy("x", "deny", json!({"podSelector": {}})),
            policy(
                "x",
                "from-c",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
            ),
        ],
    );
    // Probed every 20 ms with short connection attempts, so the time measured is the
    // change's, not the probes'.
    let took = eventually("the new policy did not take", Duration::from_secs(3), || {
        reaches_within(&nc, &a, Duration::from_millis(50))
    });
    assert!(!reaches(&nb, &a), "from-b is gone");
    println!("policy change in the kernel within {took:?}");
    assert!(took < Duration::from_secs(1), "the change took {took:?}");

    // weftd dies: the table stays (never open) while it is away and after it is back.
    d.kill();
    assert!(!reaches(&nb, &a), "open while weftd is down");
    d.start_again();
    assert!(
        reaches(&nc, &a) && !reaches(&nb, &a),
        "enforcement changed across the restart"
    );

    // Drift: the table deleted behind weft's back is back within a reconcile interval.
    sh(d.node.cmd("nft").args(["delete", "table", "inet", "weft-policy"]));
    eventually("the deleted table was not repaired", Duration::from_secs(5), || {
        !reaches(&nb, &a)
    });
    assert!(
        weft_tests::series_value(
            &d.http_get("/metrics", "text/plain"),
            "weft_policy_changes_total{kind=\"repair\"}"
        ) >= 1.0
    );

    // The source is lost (the directory weftd watches is gone, as a watch would be):
    // the last objects stay enforced, and /readyz, the gauge and status say stale.
    let away = dir.path().with_extension("away");
    std::fs::rename(dir.path(), &away).unwrap();
    let lost = eventually(
        "the lost source was not reported stale",
        Duration::from_secs(10),
        || weft_tests::series_value(&d.http_get("/metrics", "text/plain"), "weft_policy_stale") == 1.0,
    );
    println!("source lost, stale reported within {lost:?}");
    assert!(
        d.http_get("/readyz", "text/plain").contains("stale"),
        "/readyz does not say stale"
    );
    let status = String::from_utf8_lossy(&weftctl(&d, &["status"]).stdout).into_owned();
    assert!(status.contains("STALE"), "{status}");
    assert!(
        reaches(&nc, &a) && !reaches(&nb, &a),
        "enforcement changed while the source was lost"
    );
    std::fs::rename(&away, dir.path()).unwrap();
    eventually("the source came back but stayed stale", Duration::from_secs(10), || {
        weft_tests::series_value(&d.http_get("/metrics", "text/plain"), "weft_policy_stale") == 0.0
    });
    assert!(
        reaches(&nc, &a) && !reaches(&nb, &a),
        "enforcement changed when the source came back"
    );

    // Audit mode: x's denies are forwarded, logged and counted as audits.
    let mut audited = namespace("x");
    audited["metadata"]["annotations"] = json!({"weft.dev/policy-mode": "audit"});
    write(dir.path(), "namespaces.yaml", &[audited]);
    // x no longer asks for flow metrics per workload: its series go (checked every 10 s).
    eventually("x's per-workload flow series stayed", Duration::from_secs(25), || {
        !d.http_get("/metrics", "text/plain")
            .contains("weft_workload_flow_bytes_total{")
    });
    eventually("audit mode did not take", Duration::from_secs(3), || {
        reaches_within(&nb, &a, Duration::from_millis(100))
    });
    eventually("the audited flow was not reported", Duration::from_secs(5), || {
        String::from_utf8_lossy(&weftctl(&d, &["--json", "policy", "denies"]).stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|v| v["action"] == "audit" && v["src"] == "x/b" && v["dst"] == "x/a")
    });
    let ex: Value =
        serde_json::from_slice(&weftctl(&d, &["--json", "policy", "explain", "x/b", "x/a", "80"]).stdout).unwrap();
    assert_eq!(
        (ex["allowed"].as_bool(), ex["passes"].as_bool()),
        (Some(false), Some(true)),
        "{ex}"
    );
    eventually("the audit verdict was not counted", Duration::from_secs(5), || {
        weft_tests::series_value(
            &d.http_get("/metrics", "text/plain"),
            "weft_policy_verdicts_total{direction=\"ingress\",action=\"audit\",namespace=\"x\",policy=\"deny\"}",
        ) >= 1.0
    });
}
