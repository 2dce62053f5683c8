//! The observability contract, against the real binaries: log lines, metrics,
//! traces through a real OpenTelemetry collector (rotel), the dashboard and alerts in
//! a real Prometheus, and `weftctl calls`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_tests::otlp::{Collector, attr};
use weft_tests::{
    Call, Daemon, Netns, Prometheus, bin, dashboard_queries, is_node_network_row, is_wire_row, privileged, run, sh,
};

const RANGE: &str = "10.244.3.0/24";

/// A TRACEPARENT for call `i` of a test: trace and parent span ids are recognisable.
fn traceparent(test: u32, i: u32) -> (String, String, String) {
    let trace = format!("{test:08x}{:016x}{i:08x}", 0x7765_6674u64);
    let parent = format!("{:016x}", 0xfeed_0000u64 + u64::from(i));
    (format!("00-{trace}-{parent}-01"), trace, parent)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs `command` through the plugin for pod `i` with a known trace.
fn call(d: &Daemon, command: &str, i: u32, netns: &str, tp: &str) -> weft_tests::CniOutput {
    let conf = d.conf("1.1.0", &[RANGE]);
    let mut c = Call::new(command, &format!("obs-{i}"), netns, &conf).set("TRACEPARENT", tp);
    c = c.set(
        "CNI_ARGS",
        &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns-{i};K8S_POD_NAME=pod-{i};K8S_POD_UID=uid-{i};K8S_POD_INFRA_CONTAINER_ID=obs-{i}"),
    );
    c.run()
}

#[test]
fn every_log_line_of_a_call_carries_the_pod_fields() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let d = Daemon::start("logs");
    let pod = Netns::new("p");
    let calls = [
        ("ADD", pod.path(), 0),
        ("CHECK", pod.path(), 0),
        ("ADD", "/run/netns/wt-missing".to_string(), 8),
        ("DEL", pod.path(), 0),
    ];
    let mut traces = Vec::new();
    for (i, (cmd, netns, code)) in calls.iter().enumerate() {
        let (tp, trace, _) = traceparent(1, i as u32);
        let out = call(&d, cmd, 0, netns, &tp);
        assert_eq!(out.code, i32::from(*code != 0), "{cmd}: {out:?}");
        traces.push((trace, *cmd, netns.clone(), *code));
    }
    d.settle();
    let lines = d.log_json();
    for (trace, cmd, netns, code) in &traces {
        let mine: Vec<&Value> = lines.iter().filter(|l| l["trace_id"] == *trace).collect();
        assert!(!mine.is_empty(), "no log line carries trace {trace}");
        for l in &mine {
            for (k, want) in [
                ("k8s.pod.name", "pod-0"),
                ("k8s.namespace.name", "ns-0"),
                ("k8s.pod.uid", "uid-0"),
                ("container.id", "obs-0"),
                ("cni.ifname", "eth0"),
                ("cni.command", cmd),
                ("cni.netns", netns),
            ] {
                assert_eq!(l[k], want, "{k} on {l}");
            }
            assert!(l["span_id"].as_str().is_some_and(|s| s.len() == 16), "span_id on {l}");
            assert!(
                l["timestamp"].is_string() && l["level"].is_string() && l["message"].is_string(),
                "{l}"
            );
        }
        let access: Vec<&&Value> = mine.iter().filter(|l| l["target"] == "weft::access").collect();
        assert_eq!(
            access.len(),
            1,
            "exactly one access line for {cmd} ({trace}): {access:?}"
        );
        let a = access[0];
        assert_eq!(a["rpc.service"], "weft.cnirpc.v1.CNI");
        assert_eq!(
            a["rpc.method"],
            cmd.chars().next().unwrap().to_string() + &cmd[1..].to_lowercase()
        );
        assert_eq!(a["cni.code"], *code);
        assert_eq!(a["rpc.grpc.status_code"], if *code == 0 { 0 } else { 3 });
        assert!(a["duration_ms"].as_f64().is_some_and(|v| v > 0.0), "{a}");
    }
    // The handler's own lines are tagged too, without passing anything by hand.
    let attached = lines
        .iter()
        .find(|l| l["message"] == "pod attached")
        .expect("a 'pod attached' line");
    assert_eq!(attached["trace_id"], traces[0].0);
    assert_eq!(attached["k8s.pod.name"], "pod-0");
    let detached = lines
        .iter()
        .find(|l| l["message"] == "pod detached")
        .expect("a 'pod detached' line");
    assert_eq!(
        detached["trace_id"], traces[3].0,
        "the background teardown stays in its call's trace"
    );
    // Calls of the admin service get an access line but no CNI fields.
    assert!(
        lines
            .iter()
            .any(|l| l["target"] == "weft::access" && l["rpc.service"] == "weft.admin.v1.Admin")
    );
}

/// `# TYPE` of every family in classic text.
fn types(classic: &str) -> HashMap<String, String> {
    classic
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// The label names of the first sample of `name`.
fn label_names(classic: &str, name: &str) -> Vec<String> {
    let line = classic
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no sample of {name}"));
    let inner = &line[line.find('{').unwrap() + 1..line.find('}').unwrap()];
    let mut v: Vec<String> = inner
        .split(',')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
        .collect();
    v.sort();
    v
}

/// An IPv6 /64 has more free addresses than an integer gauge holds: the metric says
/// what `weftctl status` says (to a float's precision), not i64::MAX.
#[test]
fn a_v6_range_reports_its_free_addresses_alike_in_metrics_and_status() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let d = Daemon::start("v6free");
    let pod = Netns::new("p");
    Call::new("ADD", "v6free-0", &pod.path(), &d.conf("1.1.0", &["fd00:124::/64"]))
        .run()
        .ok();
    let status = d.status();
    let range = status["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cidr"] == "fd00:124::/64")
        .unwrap_or_else(|| panic!("{status}"))
        .clone();
    let free = range["free"].as_u64().unwrap();
    assert_eq!(
        free,
        u64::MAX - 2,
        "a /64 less the router anycast, gateway and one pod: {range}"
    );
    let classic = d.http_get("/metrics", "text/plain");
    let metric: f64 = classic
        .lines()
        .find_map(|l| l.strip_prefix("weft_ipam_addresses{range=\"fd00:124::/64\",state=\"free\"} "))
        .unwrap_or_else(|| panic!("{classic}"))
        .parse()
        .unwrap();
    assert_eq!(metric, free as f64);
    assert!(metric > i64::MAX as f64, "not capped: {metric}");
}

#[test]
fn metrics_have_their_families_types_labels_and_exemplars() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let d = Daemon::start("metrics");
    let pod = Netns::new("p");
    let (tp, trace, _) = traceparent(2, 0);
    // The refused call first: a bucket's exemplar is its last observation, and a quick
    // ADD lands in the refused call's bucket (seen in CI), whose exemplar would then be
    // the refused call's.
    call(&d, "ADD", 1, "/run/netns/wt-missing", &traceparent(2, 1).0);
    call(&d, "ADD", 0, &pod.path(), &tp).ok();
    let classic = d.http_get("/metrics", "text/plain");
    let t = types(&classic);
    for (name, kind) in [
        ("grpc_server_started_total", "counter"),
        ("grpc_server_handled_total", "counter"),
        ("grpc_server_msg_received_total", "counter"),
        ("grpc_server_msg_sent_total", "counter"),
        ("grpc_server_handling_seconds", "histogram"),
        ("weft_cni_requests_total", "counter"),
        ("weft_cni_phase_duration_seconds", "histogram"),
        ("weft_ipam_addresses", "gauge"),
        ("weft_pods", "gauge"),
        ("weft_store_transaction_seconds", "histogram"),
        ("weft_store_writable", "gauge"),
        ("weft_build_info", "gauge"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("process_open_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
        ("weft_node_peers", "gauge"),
        ("weft_node_pod_mtu", "gauge"),
        ("weft_node_network_changes_total", "counter"),
        ("weft_node_pod_cidr_changes_total", "counter"),
        ("weft_pod_network_receive_bytes_total", "counter"),
        ("weft_pod_network_transmit_bytes_total", "counter"),
        ("weft_pod_network_receive_packets_total", "counter"),
        ("weft_pod_network_transmit_packets_total", "counter"),
        ("weft_pod_network_receive_drops_total", "counter"),
        ("weft_pod_network_transmit_drops_total", "counter"),
    ] {
        assert_eq!(t.get(name).map(String::as_str), Some(kind), "{name} in:\n{classic}");
    }
    for (name, labels) in [
        (
            "grpc_server_started_total",
            vec!["grpc_method", "grpc_service", "grpc_type"],
        ),
        (
            "grpc_server_handled_total",
            vec!["grpc_code", "grpc_method", "grpc_service", "grpc_type"],
        ),
        (
            "grpc_server_handling_seconds_bucket",
            vec!["grpc_method", "grpc_service", "grpc_type", "le"],
        ),
        ("weft_cni_requests_total", vec!["cni_code", "command"]),
        ("weft_cni_phase_duration_seconds_bucket", vec!["command", "le", "phase"]),
        ("weft_ipam_addresses", vec!["range", "state"]),
        ("weft_build_info", vec!["commit", "version"]),
        ("weft_node_peers", vec!["mode"]),
        ("weft_node_network_changes_total", vec!["kind", "op"]),
        (
            "weft_pod_network_transmit_bytes_total",
            vec!["interface", "namespace", "pod"],
        ),
        (
            "weft_pod_network_receive_drops_total",
            vec!["interface", "namespace", "pod"],
        ),
    ] {
        assert_eq!(label_names(&classic, name), labels, "{name}");
    }
    assert!(
        classic.contains("weft_cni_requests_total{command=\"ADD\",cni_code=\"0\"} 1"),
        "{classic}"
    );
    assert!(
        classic.contains("weft_cni_requests_total{command=\"ADD\",cni_code=\"8\"} 1"),
        "{classic}"
    );
    assert!(
        classic.contains("weft_ipam_addresses{range=\"10.244.3.0/24\",state=\"allocated\"} 1.0"),
        "{classic}"
    );
    assert!(classic.contains("weft_pods 1"), "{classic}");
    assert!(
        classic
            .contains("weft_pod_network_receive_packets_total{namespace=\"ns-0\",pod=\"pod-0\",interface=\"eth0\"} "),
        "{classic}"
    );
    assert!(classic.contains("weft_store_writable 1"), "{classic}");
    for phase in ["lock_wait", "ipam", "veth", "addresses", "routes", "store_commit"] {
        assert!(
            classic.contains(&format!("command=\"ADD\",phase=\"{phase}\"")),
            "phase {phase} missing"
        );
    }
    // Bounded labels: no container id or netns path becomes a label value, and pod
    // names and namespaces label only the series of a pod this node holds (which go
    // with it).
    for unbounded in ["obs-0", "/run/netns"] {
        assert!(
            !classic.contains(&format!("=\"{unbounded}")),
            "{unbounded} used as a label value"
        );
    }
    for line in classic.lines().filter(|l| !l.starts_with("weft_pod_network_")) {
        for pod_label in ["pod-0", "ns-0"] {
            assert!(
                !line.contains(&format!("=\"{pod_label}")),
                "{pod_label} used as a label value: {line}"
            );
        }
    }
    // promtool accepts the exposition.
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    use std::io::Write;
    promtool.stdin.take().unwrap().write_all(classic.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // OpenMetrics when asked for it, with the call's trace id as exemplar.
    let om = d.http_get("/metrics", "application/openmetrics-text; version=1.0.0");
    assert!(om.ends_with("# EOF\n"));
    let exemplar = format!("# {{trace_id=\"{trace}\"}}");
    assert!(
        om.lines()
            .any(|l| l.starts_with("grpc_server_handling_seconds_bucket") && l.contains(&exemplar)),
        "no exemplar with trace {trace} on the latency histogram:\n{om}"
    );
    assert!(
        om.lines()
            .any(|l| l.starts_with("weft_cni_phase_duration_seconds_bucket") && l.contains(&exemplar))
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn traces_go_through_a_real_collector_one_per_call() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let node = Netns::new("otel");
    let collector = Collector::start(node.name());
    let d = Daemon::start_in(
        node,
        "otel",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", weft_tests::otlp::ENDPOINT),
            ("OTEL_SERVICE_NAME", "weftd-under-test"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let pod = Netns::new("p");
    let mut expect = Vec::new();
    for (i, cmd) in ["ADD", "CHECK", "DEL"].iter().enumerate() {
        let (tp, trace, parent) = traceparent(3, i as u32);
        call(&d, cmd, 0, &pod.path(), &tp).ok();
        expect.push((trace, parent, *cmd));
    }
    d.settle();

    // Wait for every call's server span to arrive at the receiver.
    let deadline = Instant::now() + Duration::from_secs(40);
    let spans = loop {
        let all = collector.spans();
        let flat: Vec<_> = all
            .iter()
            .flat_map(|rs| {
                rs.scope_spans
                    .iter()
                    .flat_map(move |ss| ss.spans.iter().map(move |s| (rs, s)))
            })
            .map(|(rs, s)| (rs.resource.clone(), s.clone()))
            .collect();
        let done = expect.iter().all(|(t, _, _)| {
            flat.iter()
                .any(|(_, s)| hex(&s.trace_id) == *t && s.name.starts_with("weft.cnirpc.v1.CNI/"))
        });
        let teardown = flat.iter().any(|(_, s)| s.name == "teardown");
        if done && teardown {
            break flat;
        }
        assert!(
            Instant::now() < deadline,
            "spans did not arrive; got {:?}\nrotel log:\n{}\nweftd log tail:\n{}",
            flat.iter().map(|(_, s)| &s.name).collect::<Vec<_>>(),
            collector.log(),
            d.log().lines().rev().take(5).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    for (trace, parent, cmd) in &expect {
        let mine: Vec<_> = spans.iter().filter(|(_, s)| hex(&s.trace_id) == *trace).collect();
        let servers: Vec<_> = mine
            .iter()
            .filter(|(_, s)| s.name.starts_with("weft.cnirpc.v1.CNI/"))
            .collect();
        assert_eq!(servers.len(), 1, "one server span for {cmd}");
        let (resource, server) = servers[0];
        assert_eq!(
            hex(&server.parent_span_id),
            *parent,
            "the daemon's span is the plugin's child"
        );
        assert_eq!(server.kind, 2, "server span kind");
        for (k, v) in [
            ("k8s.pod.name", "pod-0"),
            ("k8s.namespace.name", "ns-0"),
            ("k8s.pod.uid", "uid-0"),
            ("container.id", "obs-0"),
            ("cni.ifname", "eth0"),
            ("cni.command", *cmd),
            ("cni.netns", pod.path().as_str()),
            ("rpc.service", "weft.cnirpc.v1.CNI"),
        ] {
            assert_eq!(attr(&server.attributes, k), Some(v), "{k} on the {cmd} span");
        }
        let res = &resource.as_ref().expect("resource").attributes;
        assert_eq!(attr(res, "service.name"), Some("weftd-under-test"));
        assert_eq!(attr(res, "k8s.node.name"), Some(d.node_name()));
        assert_eq!(attr(res, "service.version"), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(attr(res, "deployment.environment"), Some("test"));
        let phases: BTreeMap<&str, &[u8]> = mine
            .iter()
            .filter(|(_, s)| s.span_id != server.span_id && s.parent_span_id == server.span_id)
            .map(|(_, s)| (s.name.as_str(), s.parent_span_id.as_slice()))
            .collect();
        let want: &[&str] = match *cmd {
            "ADD" => &["addresses", "ipam", "lock_wait", "routes", "store_commit", "veth"],
            "CHECK" => &["check", "ipam", "lock_wait"],
            _ => &["disconnect", "ipam", "lock_wait", "teardown"],
        };
        for p in want {
            assert!(
                phases.contains_key(p),
                "{cmd}: phase {p} is not a child of the call span; children: {:?}",
                phases.keys()
            );
        }
    }
    // One trace per call: no other trace ids among the CNI spans.
    let cni_traces: HashSet<String> = spans
        .iter()
        .filter(|(_, s)| s.name.starts_with("weft.cnirpc.v1.CNI/"))
        .map(|(_, s)| hex(&s.trace_id))
        .collect();
    assert_eq!(cni_traces.len(), expect.len(), "{cni_traces:?}");
}

#[test]
fn dashboard_queries_and_alerts_work_in_prometheus() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let rules = workspace().join("dashboards/alerts.yaml");
    let out = run(std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules));
    assert!(
        out.status.success(),
        "promtool check rules: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    let d = Daemon::start("prom");
    let dir = d.dir().join("prom");
    std::fs::create_dir_all(&dir).unwrap();
    // The rules as shipped, with their `for` durations shortened so an alert can fire
    // within the test; the expressions are evaluated unchanged.
    let shipped = std::fs::read_to_string(&rules).unwrap();
    let fast: String = shipped
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("for:") {
                l.split("for:").next().unwrap().to_string() + "for: 0s"
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.join("rules.yml"), fast).unwrap();
    let prom = Prometheus::start(
        d.node.name(),
        &dir,
        19090,
        &[("127.0.0.1:9384", d.node_name())],
        Some(&dir.join("rules.yml")),
    );

    // Real traffic: pods come and go.
    let pods: Vec<Netns> = (0..3).map(|i| Netns::new(&format!("p{i}"))).collect();
    for (i, p) in pods.iter().enumerate() {
        call(&d, "ADD", i as u32, &p.path(), &traceparent(4, i as u32).0).ok();
    }
    call(&d, "DEL", 2, &pods[2].path(), &traceparent(4, 9).0).ok();
    // Wait for a few scrapes after the calls.
    prom.wait_for("count_over_time(weft_pods[1m]) >= 3", Duration::from_secs(30));
    let firing = "ALERTS{alertname=\"WeftCniErrorRate\",alertstate=\"firing\"}";
    assert!(prom.query(firing).is_empty(), "the error alert fires without errors");

    // Now failures, spread over several scrapes (a rate needs two samples of the new
    // series): the error-rate alert must fire.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while prom.query(firing).is_empty() {
        assert!(Instant::now() < deadline, "WeftCniErrorRate did not fire");
        assert_eq!(
            call(&d, "ADD", 100 + i, "/run/netns/wt-missing", &traceparent(5, i).0).err_code(),
            8
        );
        i += 1;
        std::thread::sleep(Duration::from_millis(400));
    }
    let alert = &prom.query(firing)[0];
    assert_eq!(alert["metric"]["node"], d.node_name());

    // Every panel query of the dashboard returns at least one series (the wire rows
    // need wires: the lab test evaluates those).
    let mut n = 0;
    for q in dashboard_queries("weft.json").iter().filter(|q| {
        !is_wire_row(&q.row)
            && !is_node_network_row(&q.row)
            && !weft_tests::is_policy_row(&q.row)
            && !weft_tests::is_emulation_row(&q.row)
    }) {
        let r = prom.query(&q.expr);
        assert!(!r.is_empty(), "panel {:?} query returns nothing: {}", q.title, q.expr);
        n += 1;
    }
    assert!(n >= 15, "only {n} queries checked");
    // Every alert's expression evaluates there, and the conntrack fill that
    // WeftConntrackNearlyFull compares is there (the node's table is far from full).
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&shipped).unwrap();
    for rule in doc["groups"][0]["rules"].as_sequence().expect("rules") {
        prom.query(rule["expr"].as_str().expect("an expression"));
    }
    let fill = prom.query("max by (node) (weft_conntrack_entries) / max by (node) (weft_conntrack_limit)");
    assert_eq!(fill.len(), 1, "conntrack fill: {fill:?}");
    assert!(prom.query("ALERTS{alertname=\"WeftConntrackNearlyFull\"}").is_empty());
    // The node variable lists this node.
    let nodes = prom.query("group by (node) (weft_build_info)");
    assert_eq!(nodes[0]["metric"]["node"], d.node_name());
}

#[test]
fn dashboard_matches_the_grafana_schema() {
    let _area = weft_tests::area("node::observability");
    let validator = workspace().join("test/grafana/validate.mjs");
    assert!(
        workspace().join("test/grafana/node_modules/@grafana/schema").exists(),
        "test/grafana/node_modules is missing: run test/install-deps.sh (npm ci in test/grafana)"
    );
    let out = run(std::process::Command::new("node")
        .arg(&validator)
        .arg(workspace().join("dashboards/weft.json")));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The validator can fail: a dashboard with a wrong type is refused.
    let bad = weft_tests::TempDir::new("dash");
    let mut d: Value =
        serde_json::from_str(&std::fs::read_to_string(workspace().join("dashboards/weft.json")).unwrap()).unwrap();
    d["panels"][1]["gridPos"]["h"] = Value::from("tall");
    std::fs::write(bad.path().join("bad.json"), d.to_string()).unwrap();
    let out = run(std::process::Command::new("node")
        .arg(&validator)
        .arg(bad.path().join("bad.json")));
    assert!(!out.status.success(), "a broken dashboard passed validation");
}

#[test]
fn weftctl_calls_lists_recent_calls() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let d = Daemon::start("calls");
    let pod = Netns::new("p");
    let (tp, trace, _) = traceparent(6, 0);
    call(&d, "ADD", 0, &pod.path(), &tp).ok();
    call(&d, "ADD", 1, "/run/netns/wt-missing", &traceparent(6, 1).0);
    let ctl = |args: &[&str]| -> Vec<Value> {
        let out = sh(std::process::Command::new(bin("weftctl"))
            .args(["--socket", d.socket().to_str().unwrap(), "--json", "calls"])
            .args(args));
        serde_json::from_str(&out).unwrap()
    };
    let all = ctl(&[]);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0]["command"], "ADD");
    assert_eq!(all[0]["pod"], "pod-0");
    assert_eq!(all[0]["pod_namespace"], "ns-0");
    assert_eq!(all[0]["ifname"], "eth0");
    assert_eq!(all[0]["cni_code"], 0);
    assert_eq!(all[0]["trace_id"], trace);
    assert!(all[0]["duration_ms"].as_f64().unwrap() > 0.0);
    let failed = ctl(&["--failed"]);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["cni_code"], 8);
    assert!(failed[0]["error"].as_str().unwrap().contains("does not exist"));
    assert_eq!(ctl(&["--pod", "pod-0"]).len(), 1);
    let table =
        sh(std::process::Command::new(bin("weftctl")).args(["--socket", d.socket().to_str().unwrap(), "calls"]));
    assert!(
        table.contains("TRACE") && table.contains(&trace) && table.contains("ns-0/pod-0"),
        "{table}"
    );
}

/// A pod interface's series on a metrics page: namespace, pod and interface as
/// [`call`] names pod `i`.
fn pod_series(family: &str, i: u32) -> String {
    format!("weft_pod_network_{family}_total{{namespace=\"ns-{i}\",pod=\"pod-{i}\",interface=\"eth0\"}}")
}

/// The kernel's own counter of `eth0` inside pod namespace `pod`: `dir` `rx` or `tx`,
/// `what` `bytes` or `packets`.
fn pod_interface_counter(pod: &Netns, dir: &str, what: &str) -> f64 {
    let link = pod.ip_json(&["-s", "link", "show", "eth0"]);
    link[0]["stats64"][dir][what]
        .as_f64()
        .unwrap_or_else(|| panic!("no {dir} {what} in {link}"))
}

/// What a pod interface's counters grew by between two readings.
struct Grown {
    /// `weft_pod_network_*_bytes_total` of the pod's host end, in the pod's direction.
    metric_bytes: f64,
    /// `weft_pod_network_*_packets_total`, likewise.
    metric_packets: f64,
    /// The same direction's bytes counted by the pod's own interface.
    interface_bytes: f64,
}

/// Ethernet (14), IPv4 (20) and TCP with timestamps (32) headers: what a frame carries
/// besides the TCP payload iperf3 counts.
const TCP_FRAME_HEADERS: f64 = 14.0 + 20.0 + 32.0;

/// Per-pod traffic from real TCP between two pods of one node, and conntrack.
///
/// iperf3 (`-J`) reports TCP payload; the veth counters count whole frames, headers
/// and segments sent again included. Both are allowed for explicitly: the metric's
/// bytes less 66 bytes (Ethernet, IPv4, TCP with timestamps) per packet the metric
/// counted, must be within 1 % of iperf3's bytes plus its retransmitted segments (one
/// MSS each). Taking the packet count from the counters, rather than assuming
/// MSS-sized frames, keeps this right whether or not the veths segment (GSO hands them
/// up to 64 KiB per packet, so the header overhead is anywhere between 0.1 % and
/// 4.5 %). As that uses the metric's own packet count, the metric is also held against
/// the kernel's counters of the pod's interface read inside the pod's namespace (the
/// veth's other end sees every frame the host end does, the other way round): within
/// 1 %, which also proves the direction (the sender's transmit is its host end's
/// receive).
#[test]
fn pod_traffic_follows_iperf3_and_goes_with_the_pod() {
    let _area = weft_tests::area("node::observability");
    if !privileged() {
        return;
    }
    let d = Daemon::start("traffic");
    let pods = [Netns::new("sender"), Netns::new("receiver")];
    let results: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| call(&d, "ADD", i as u32, &p.path(), &traceparent(7, i as u32).0).ok())
        .collect();
    let (sender, receiver) = (&pods[0], &pods[1]);
    let server_addr = weft_tests::result_address(&results[1], false);
    let log = d.dir().join("iperf3-server.log");
    let _server = receiver.spawn("iperf3", &["-s", "-B", &server_addr, "--forceflush"], &log);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("listening") {
        assert!(Instant::now() < deadline, "the iperf3 server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let read = |page: &str| {
        (
            (
                weft_tests::series_value(page, &pod_series("transmit_bytes", 0)),
                weft_tests::series_value(page, &pod_series("transmit_packets", 0)),
                pod_interface_counter(sender, "tx", "bytes"),
            ),
            (
                weft_tests::series_value(page, &pod_series("receive_bytes", 1)),
                weft_tests::series_value(page, &pod_series("receive_packets", 1)),
                pod_interface_counter(receiver, "rx", "bytes"),
            ),
        )
    };
    let before = d.http_get("/metrics", "text/plain");
    for i in 0..2 {
        assert!(before.contains(&pod_series("receive_bytes", i)), "pod-{i}:\n{before}");
    }
    let (tx0, rx0) = read(&before);

    let client = sender
        .cmd("iperf3")
        .args(["-c", &server_addr, "-t", "3", "-J"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("iperf3");
    // While the test's connections are open, the node's table tracks them: pod to pod
    // traffic is routed through the node's namespace.
    std::thread::sleep(Duration::from_millis(1500));
    let during = d.http_get("/metrics", "text/plain");
    let t = types(&during);
    for (name, kind) in [
        ("weft_conntrack_entries", "gauge"),
        ("weft_conntrack_limit", "gauge"),
        ("weft_conntrack_insert_failed_total", "counter"),
        ("weft_conntrack_early_drop_total", "counter"),
        ("weft_conntrack_drops_total", "counter"),
    ] {
        assert_eq!(t.get(name).map(String::as_str), Some(kind), "{name} in:\n{during}");
    }
    let entries = weft_tests::series_value(&during, "weft_conntrack_entries");
    assert!(entries >= 1.0, "{entries} conntrack entries with a connection open");
    assert!(weft_tests::series_value(&during, "weft_conntrack_limit") >= entries);

    let out = client.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "iperf3: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J output");
    let sent = report["end"]["sum_sent"]["bytes"].as_f64().expect("bytes sent");
    let received = report["end"]["sum_received"]["bytes"].as_f64().expect("bytes received");
    assert!(sent > 1e6, "iperf3 moved only {sent} bytes");
    let after = d.http_get("/metrics", "text/plain");
    let (tx1, rx1) = read(&after);
    let grown = |a: (f64, f64, f64), b: (f64, f64, f64)| Grown {
        metric_bytes: b.0 - a.0,
        metric_packets: b.1 - a.1,
        interface_bytes: b.2 - a.2,
    };
    // Every segment TCP sent again left the sender's interface twice; it reached the
    // receiver's twice too unless the first copy was lost before its host end.
    let resent = report["end"]["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0)
        * report["start"]["tcp_mss_default"].as_f64().expect("the MSS");
    for (who, g, low, high) in [
        ("the sender's transmit", grown(tx0, tx1), sent + resent, sent + resent),
        ("the receiver's receive", grown(rx0, rx1), received, received + resent),
    ] {
        let payload = g.metric_bytes - g.metric_packets * TCP_FRAME_HEADERS;
        assert!(
            payload > low * 0.99 && payload < high * 1.01,
            "{who}: {} bytes in {} packets, {payload} without headers, not within 1 % of iperf3's {low}..{high}",
            g.metric_bytes,
            g.metric_packets,
        );
        let off = (g.metric_bytes - g.interface_bytes).abs() / g.interface_bytes;
        assert!(
            off < 0.01,
            "{who}: {} bytes, the pod's interface counted {} ({:.3} % off)",
            g.metric_bytes,
            g.interface_bytes,
            off * 100.0
        );
    }

    // After the receiver's DEL, its series are gone from the next scrape; the
    // sender's stay.
    call(&d, "DEL", 1, &receiver.path(), &traceparent(7, 3).0).ok();
    let page = d.http_get("/metrics", "text/plain");
    assert!(!page.contains("pod=\"pod-1\""), "{page}");
    assert!(page.contains(&pod_series("transmit_bytes", 0)), "{page}");
}
