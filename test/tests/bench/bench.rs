//! `weft-bench --smoke`: every comparison runs end to end at a tiny size (the CNI
//! benchmarks, host ports, exec cost, weftd's memory in a lab with gRPC wires, wire
//! throughput with iperf3 and UDP floods, the gRPC wire in plaintext and with mTLS,
//! pods attached to one node and removed under load, pod-to-pod traffic between nodes
//! through weft's routing and hand-made kernel routing), reports numbers in every
//! section, and leaves no namespace or process behind. Timings are not asserted.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_tests::{bin, privileged};

fn positive(v: &Value, what: &str) {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0, "{what} is {x}");
}

#[test]
fn smoke_runs_every_comparison() {
    let _area = weft_tests::area("bench::bench");
    if !privileged() {
        return;
    }
    let start = Instant::now();
    let mut child = Command::new(bin("weft-bench"))
        .args(["--json", "--smoke"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting weft-bench");
    let pid = child.id();
    // Read in threads so a full pipe cannot stall the child while it is timed out.
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out_pipe, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err_pipe, &mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(240) {
            // SIGINT is not enough to be sure; the guards inside run on error paths,
            // so this only happens when the run hangs.
            let _ = child.kill();
            let _ = child.wait();
            panic!("weft-bench --smoke still running after 240 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    eprintln!("weft-bench --smoke took {:.1} s", start.elapsed().as_secs_f64());
    assert!(status.success(), "weft-bench --smoke failed: {err}");
    let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));

    for section in ["reference", "otlp", "features"] {
        for side in ["a", "b"] {
            positive(&r[section][side]["add"]["p50"], &format!("{section}.{side} ADD p50"));
            positive(&r[section][side]["del"]["p50"], &format!("{section}.{side} DEL p50"));
        }
    }
    positive(&r["otlp"]["a"]["spans_exported"], "spans exported");
    for side in ["weft_add_ms", "weft_no_ports_add_ms", "reference_add_ms"] {
        let v = r["hostports"][side].as_array().expect("host port samples");
        assert!(!v.is_empty(), "no {side}");
        v.iter().for_each(|x| positive(x, side));
    }

    let sides = r["exec"]["sides"].as_array().expect("exec sides");
    let names: Vec<&str> = sides.iter().map(|s| s["binary"].as_str().unwrap()).collect();
    assert_eq!(names, ["weft", "host-local", "ptp", "true (floor)"]);
    for s in sides {
        positive(&s["latency"]["p50"], &format!("{} exec p50", s["binary"]));
        assert_eq!(s["errors"], 0, "{} VERSION failed", s["binary"]);
        let linking = s["linking"].as_str().expect("linking");
        assert!(
            ["static", "dynamic"].contains(&linking),
            "{} linking {linking}",
            s["binary"]
        );
    }
    positive(&r["exec"]["weft_over_host_local_p50"], "exec ratio");
    assert!(
        r["exec"]["weft_above_floor_p50_ms"].is_f64(),
        "weft above floor: {}",
        r["exec"]["weft_above_floor_p50_ms"]
    );

    let states = r["memory"]["states"].as_array().expect("memory states");
    assert_eq!(states.len(), 3, "idle, pods, pods + wires");
    for s in states {
        positive(&s["rss_mib"], &format!("RSS {}", s["state"]));
        positive(&s["rss_over_target"], &format!("RSS ratio {}", s["state"]));
    }
    assert_eq!(r["memory"]["wire_ping_failures"], 0, "every gRPC wire answers");

    let wires = r["wires"]["wires"].as_array().expect("wires");
    let kinds: Vec<&str> = wires.iter().map(|w| w["wire"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "weft_veth",
            "kernel_veth",
            "weft_vxlan",
            "kernel_vxlan",
            "weft_grpc",
            "weft_grpc_mtls"
        ]
    );
    for w in wires {
        positive(&w["tcp_gbps_median"], &format!("{} TCP", w["wire"]));
        positive(&w["udp_fps_median"], &format!("{} frames/s", w["wire"]));
    }
    let ratios = r["wires"]["ratios"].as_array().expect("wire ratios");
    let pairs: Vec<(&str, &str)> = ratios
        .iter()
        .map(|q| (q["a"].as_str().unwrap(), q["b"].as_str().unwrap()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("weft_veth", "kernel_veth"),
            ("weft_vxlan", "kernel_vxlan"),
            ("weft_grpc", "kernel_vxlan"),
            ("weft_grpc_mtls", "weft_grpc"),
        ]
    );
    for q in ratios {
        positive(&q["tcp"], "TCP ratio");
        positive(&q["fps"], "frames/s ratio");
    }
    // Reported, not asserted: a stream refused once while its nodes start and then
    // reconnected is no failure. That the mTLS row ran with TLS is checked by the bench
    // itself (`weft_wire_insecure` of each lab's nodes) before it measures.
    assert!(r["wires"]["grpc_mtls_rejected"].is_f64(), "mTLS refusals reported");

    let pn = &r["pod_network"];
    let paths = pn["paths"].as_array().expect("pod network paths");
    let names: Vec<&str> = paths.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "weft_direct",
            "kernel_direct",
            "weft_vxlan",
            "kernel_vxlan",
            "weft_bgp",
            "kernel_routed"
        ]
    );
    for p in paths {
        positive(&p["tcp_gbps_median"], &format!("{} TCP", p["path"]));
        positive(&p["udp_fps_median"], &format!("{} frames/s", p["path"]));
    }
    // Pods get the underlay's MTU with direct and BGP-learnt routes, 50 bytes less
    // through VXLAN, on weft's path and the hand-made one alike.
    let mtus: Vec<u64> = paths.iter().map(|p| p["pod_mtu"].as_u64().unwrap()).collect();
    assert_eq!(mtus, [1500, 1500, 1450, 1450, 1500, 1500], "pod MTUs: {pn}");
    let ratios = pn["ratios"].as_array().expect("pod network ratios");
    let modes: Vec<&str> = ratios.iter().map(|q| q["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["direct", "vxlan", "bgp"]);
    for q in ratios {
        positive(&q["tcp"], "pod network TCP ratio");
        positive(&q["fps"], "pod network frames/s ratio");
    }
    assert_eq!(
        pn["setup_differences"].as_array().map(Vec::len),
        Some(0),
        "the hand-made reference differs from weft's path: {}",
        pn["setup_differences"]
    );

    let load = &r["load"];
    assert_eq!(load["failures"].as_array().map(Vec::len), Some(0), "load: {load}");
    for cmd in ["add", "del"] {
        for w in ["first", "last"] {
            positive(&load[cmd][w]["latency"]["p50"], &format!("load {cmd} {w} p50"));
            positive(&load[cmd][w]["daemon_ms"], &format!("load {cmd} {w} weftd time"));
        }
        positive(&load[cmd]["p50_ratio"], &format!("load {cmd} ratio"));
    }
    positive(&load["rss_after_add_mib"], "load RSS");
    assert_eq!(load["pods_after_add"], 20.0, "load: {load}");
    assert_eq!(load["pods_after_del"], 0.0, "load: {load}");
    assert_eq!(load["links_left"], 0, "load: {load}");

    let pol = &r["policy"];
    let data = &pol["data"];
    for side in ["with_policy", "without_policy"] {
        positive(&data[side]["tcp_gbps_median"], &format!("policy data {side} TCP"));
        positive(&data[side]["udp_fps_median"], &format!("policy data {side} frames/s"));
    }
    // The policy side really is policed (both pods isolated on their nodes), the other
    // is not: otherwise the ratio compares nothing.
    assert_eq!(
        data["with_policy"]["isolated_pods"],
        serde_json::json!([2.0, 2.0]),
        "{data}"
    );
    assert_eq!(
        data["without_policy"]["isolated_pods"],
        serde_json::json!([0.0, 0.0]),
        "{data}"
    );
    positive(&data["tcp_ratio"], "policy data TCP ratio");
    positive(&data["fps_ratio"], "policy data frames/s ratio");
    let add = &pol["add"];
    assert_eq!(
        add["with_policy"]["failures"].as_array().map(Vec::len),
        Some(0),
        "{add}"
    );
    assert_eq!(
        add["without_policy"]["failures"].as_array().map(Vec::len),
        Some(0),
        "{add}"
    );
    positive(&add["p50_ratio"], "policy ADD p50 ratio");
    // Every ADD of the policy side found policy to place (the fast path or a full pass;
    // `paths` counts nothing, fast, full).
    let paths = &add["with_policy"]["paths"];
    let placed = paths[1].as_u64().unwrap() + paths[2].as_u64().unwrap();
    assert_eq!(placed, add["pods"].as_u64().unwrap(), "policy ADD paths {paths}");
    let conv = &pol["converge"]["runs"][0];
    for change in conv["changes"].as_array().expect("convergence changes") {
        // One transaction per node per change, and every node got it.
        assert_eq!(change["transactions"], serde_json::json!([1, 1, 1]), "{change}");
        positive(&change["all_ms"], "convergence time");
    }
    let point = &pol["scale"]["points"][0];
    positive(&point["start_to_table_s"], "scale: start to table");
    positive(&point["rss_mib"], "scale RSS");
    assert_eq!(
        point["table_after_restart"], point["table"],
        "a restarted weftd programs the same table"
    );
    for b in point["arrival_batches"].as_array().expect("arrival batches") {
        assert_eq!(b["elements_added"], 1, "a remote peer pod is one element: {b}");
    }

    // One weftd and 30 Node objects: every peer programmed, and a node's change costs
    // a constant handful of kernel writes and no lookup of the other peers.
    let nodes = &r["nodes"]["points"][0];
    assert_eq!(nodes["nodes"], 30, "{nodes}");
    assert_eq!(nodes["programmed"], serde_json::json!([29, 29, 29]), "{nodes}");
    positive(&nodes["start_to_programmed_s"], "nodes: start to programmed");
    positive(&nodes["rss_mib"], "nodes: RSS");
    for w in nodes["writes_per_change"].as_array().expect("writes") {
        assert_eq!(w.as_f64(), Some(4.0), "route and neighbour out and in: {nodes}");
    }
    for l in nodes["lookups_per_change"].as_array().expect("lookups") {
        assert_eq!(l.as_f64(), Some(0.0), "no peer looked up again: {nodes}");
    }
    assert_eq!(nodes["lookups_at_start"].as_f64(), Some(29.0), "{nodes}");

    // Everything the run made is gone: its namespaces are named after its pid, and
    // its daemons run from its scratch directory.
    let prefixes = [format!("wb{pid}"), format!("wbh{pid}"), format!("wbn{pid}")];
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    let scratch = format!("weft-bench-{pid}");
    let procs: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&scratch))
        .collect();
    assert!(procs.is_empty(), "processes left behind: {procs:?}");
}
