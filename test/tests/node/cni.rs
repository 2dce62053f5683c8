//! The real `weft` plugin, run exactly as a runtime runs it, against a real `weftd`
//! inside a node namespace, with pods as network namespaces.

use std::time::Duration;

use serde_json::Value;
use weft_tests::{Call, Daemon, Netns, privileged, result_address};

const V4: &str = "10.244.1.0/24";
const V6: &str = "fd00:10:244:1::/64";

/// What most tests here begin with: their area, then, where privileged tests run, a
/// fresh daemon of their own.
fn start(tag: &str) -> Option<(weft_tests::AreaGuard, Daemon)> {
    let area = weft_tests::area("node::cni");
    privileged().then(|| (area, Daemon::start(tag)))
}

#[test]
fn pods_are_reachable_from_the_node_and_from_each_other() {
    let Some((_area, d)) = start("reach") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4, V6]);
    let (a, b) = (Netns::new("pa"), Netns::new("pb"));
    let ra = Call::new("ADD", "ctr-a", &a.path(), &conf).run().ok();
    let rb = Call::new("ADD", "ctr-b", &b.path(), &conf).run().ok();

    // The result describes what was built.
    assert_eq!(ra["cniVersion"], "1.1.0");
    let ifs = ra["interfaces"].as_array().unwrap();
    assert_eq!(ifs.len(), 2);
    let host_if = ifs[0]["name"].as_str().unwrap();
    assert!(host_if.starts_with("weft") && host_if.len() == 15, "{host_if}");
    assert!(ifs[0].get("sandbox").is_none());
    assert_eq!(ifs[1]["name"], "eth0");
    assert_eq!(ifs[1]["sandbox"], a.path());
    assert_eq!(ra["ips"][0]["gateway"], "10.244.1.1");
    assert_eq!(ra["ips"][1]["gateway"], "fd00:10:244:1::1");
    assert_eq!(ra["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(ra["routes"][1]["dst"], "::/0");

    // The kernel agrees with the result.
    let (a4, a6, b4, b6) = (
        result_address(&ra, false),
        result_address(&ra, true),
        result_address(&rb, false),
        result_address(&rb, true),
    );
    let eth0 = a.ip_json(&["addr", "show", "eth0"]);
    let local: Vec<String> = eth0[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["local"].as_str().unwrap().to_string())
        .collect();
    assert!(local.contains(&a4) && local.contains(&a6), "{local:?}");
    assert_eq!(eth0[0]["mtu"], 1500);
    assert_eq!(eth0[0]["address"], ifs[1]["mac"]);
    assert!(d.node.links().contains(&host_if.to_string()));
    let default = a.ip_json(&["-4", "route", "show", "default"]);
    assert_eq!(default[0]["gateway"], "10.244.1.1");

    // Node -> pod and pod -> pod, both families.
    for ip in [&a4, &a6, &b4, &b6] {
        assert!(d.node.ping(ip), "node cannot reach {ip}");
    }
    assert!(a.ping(&b4), "pod a cannot reach pod b over IPv4");
    assert!(b.ping(&a6), "pod b cannot reach pod a over IPv6");

    for (c, ns) in [("ctr-a", &a), ("ctr-b", &b)] {
        Call::new("DEL", c, &ns.path(), &conf).run().ok();
    }
    d.assert_clean();
}

#[test]
fn repeated_add_returns_the_same_result() {
    let Some((_area, d)) = start("again") else {
        return;
    };
    let conf = d.conf("1.0.0", &[V4]);
    let p = Netns::new("p");
    let first = Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    let second = Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    assert_eq!(first, second);
    assert_eq!(d.allocated(), 1);
    assert_eq!(p.links().len(), 2, "still one eth0 (and lo)");
    Call::new("DEL", "ctr-1", &p.path(), &conf).run().ok();
    d.assert_clean();
}

#[test]
fn check_passes_when_healthy_and_names_what_is_broken() {
    let Some((_area, d)) = start("check") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4]);
    let p = Netns::new("p");
    let r = Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    // CHECK gets the ADD result as prevResult, as runtimes send it.
    let mut with_prev: Value = serde_json::from_str(&conf).unwrap();
    with_prev["prevResult"] = r.clone();
    let check_conf = with_prev.to_string();
    let check = || Call::new("CHECK", "ctr-1", &p.path(), &check_conf).run();
    let ok = check();
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(ok.stdout.is_empty());

    weft_tests::sh(std::process::Command::new("ip").args(["-n", p.name(), "route", "del", "default"]));
    let broken = check();
    assert_eq!(broken.err_code(), 104);
    assert!(
        broken.json()["details"]
            .as_str()
            .unwrap()
            .contains("default route via 10.244.1.1"),
        "{broken:?}"
    );
    weft_tests::sh(std::process::Command::new("ip").args([
        "-n",
        p.name(),
        "route",
        "add",
        "default",
        "via",
        "10.244.1.1",
        "dev",
        "eth0",
    ]));
    assert_eq!(check().code, 0);

    let addr = result_address(&r, false);
    weft_tests::sh(std::process::Command::new("ip").args(["-n", d.node.name(), "route", "del", &addr]));
    let broken = check();
    assert_eq!(broken.err_code(), 104);
    assert!(
        broken.json()["details"]
            .as_str()
            .unwrap()
            .contains(&format!("host route to {addr}")),
        "{broken:?}"
    );

    // CHECK of something weft never attached.
    assert_eq!(
        Call::new("CHECK", "ctr-unknown", &p.path(), &check_conf)
            .run()
            .err_code(),
        3
    );
    // CHECK does not exist before 0.4.0.
    assert_eq!(
        Call::new("CHECK", "ctr-1", &p.path(), &d.conf("0.3.1", &[V4]))
            .run()
            .err_code(),
        1
    );

    Call::new("DEL", "ctr-1", &p.path(), &conf).run().ok();
    d.assert_clean();
}

#[test]
fn del_is_idempotent_without_netns_and_after_the_netns_vanished() {
    let Some((_area, d)) = start("del") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4, V6]);
    let p = Netns::new("p");
    Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    let del = Call::new("DEL", "ctr-1", &p.path(), &conf).run();
    assert_eq!(del.code, 0, "{del:?}");
    assert!(del.stdout.is_empty());
    // containerd's second DEL comes without a netns.
    Call::new("DEL", "ctr-1", "", &conf).run().ok();
    Call::new("DEL", "ctr-1", "", &conf).set("CNI_NETNS", "").run().ok();
    d.assert_clean();

    // The pod's namespace disappears before DEL (node reboot of a sandbox, runtime crash).
    let q = Netns::new("q");
    let path = q.path();
    Call::new("ADD", "ctr-2", &path, &conf).run().ok();
    q.delete();
    Call::new("DEL", "ctr-2", &path, &conf).run().ok();
    Call::new("DEL", "never-added", &path, &conf).run().ok();
    d.assert_clean();
}

#[test]
fn gc_removes_attachments_the_runtime_no_longer_lists() {
    let Some((_area, d)) = start("gc") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4]);
    let pods: Vec<Netns> = (0..3).map(|i| Netns::new(&format!("p{i}"))).collect();
    for (i, p) in pods.iter().enumerate() {
        Call::new("ADD", &format!("ctr-{i}"), &p.path(), &conf).run().ok();
    }
    let mut gc: Value = serde_json::from_str(&conf).unwrap();
    gc["cni.dev/valid-attachments"] = serde_json::json!([{"containerID": "ctr-1", "ifname": "eth0"}]);
    let out = Call::new("GC", "", "", &gc.to_string())
        .unset("CNI_CONTAINERID")
        .unset("CNI_IFNAME")
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    d.settle();
    assert_eq!(d.status()["attachments"], 1);
    assert_eq!(d.allocated(), 1);
    assert_eq!(pods[0].links(), vec!["lo"]);
    assert_eq!(pods[1].links().len(), 2);
    // GC is a 1.1.0 command.
    assert_eq!(Call::new("GC", "", "", &d.conf("1.0.0", &[V4])).run().err_code(), 1);
    Call::new("DEL", "ctr-1", &pods[1].path(), &conf).run().ok();
    d.assert_clean();
}

#[test]
fn status_and_add_report_an_exhausted_range() {
    let Some((_area, d)) = start("full") else {
        return;
    };
    let conf = d.conf("1.1.0", &["10.244.9.0/30"]);
    let status = || Call::new("STATUS", "", "", &conf).run();
    assert_eq!(status().code, 0);
    let p1 = Netns::new("p1");
    Call::new("ADD", "ctr-1", &p1.path(), &conf).run().ok();
    let st = status();
    assert_eq!(st.err_code(), 50);
    assert!(st.stdout.contains("10.244.9.0/30"), "{st:?}");
    let p2 = Netns::new("p2");
    let full = Call::new("ADD", "ctr-2", &p2.path(), &conf).run();
    assert_eq!(full.err_code(), 101);
    assert!(
        full.json()["details"].as_str().unwrap().contains("10.244.9.0/30"),
        "{full:?}"
    );
    assert_eq!(p2.links(), vec!["lo"], "the failed ADD left nothing in the pod");
    assert_eq!(d.allocated(), 1);
    Call::new("DEL", "ctr-2", &p2.path(), &conf).run().ok();
    Call::new("DEL", "ctr-1", &p1.path(), &conf).run().ok();
    d.assert_clean();
    assert_eq!(status().code, 0);
}

#[test]
fn every_spec_version_gets_its_result_layout() {
    let Some((_area, d)) = start("vers") else {
        return;
    };
    for (i, v) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"].iter().enumerate() {
        let conf = d.conf(v, &[V4, V6]);
        let p = Netns::new("p");
        let r = Call::new("ADD", &format!("ctr-{i}"), &p.path(), &conf).run().ok();
        assert_eq!(r["cniVersion"], *v);
        let legacy = v.starts_with("0.");
        for ip in r["ips"].as_array().unwrap() {
            let want = if ip["address"].as_str().unwrap().contains(':') {
                "6"
            } else {
                "4"
            };
            if legacy {
                assert_eq!(ip["version"], want, "{v}: {r}");
            } else {
                assert!(ip.get("version").is_none(), "{v}: {r}");
            }
        }
        assert_eq!(r["interfaces"][1].get("mtu").is_some(), *v == "1.1.0", "{v}: {r}");
        assert_eq!(r["interfaces"][1]["sandbox"], p.path());
        Call::new("DEL", &format!("ctr-{i}"), &p.path(), &conf).run().ok();
    }
    d.assert_clean();
}

#[test]
fn version_is_answered_by_the_plugin_alone() {
    let _area = weft_tests::area("node::cni");
    // No daemon, no root needed: VERSION never leaves the plugin.
    let out = Call::default().set("CNI_COMMAND", "VERSION").run();
    let v = out.ok();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(
        v["supportedVersions"],
        serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
    let about = Call::default().run();
    assert_eq!(about.code, 0);
    assert!(about.stderr.contains("CNI protocol versions supported"), "{about:?}");
}

#[test]
fn bad_input_gets_its_code_and_leaves_nothing() {
    let Some((_area, d)) = start("bad") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4]);
    let p = Netns::new("p");
    let add = || Call::new("ADD", "ctr-1", &p.path(), &conf);
    let file = weft_tests::TempDir::new("f");
    let regular = file.path().join("not-a-netns");
    std::fs::write(&regular, "x").unwrap();
    let cases: Vec<(&str, Call, u64)> = vec![
        (
            "malformed JSON",
            Call {
                stdin: "{\"cniVersion\":".into(),
                ..add()
            },
            6,
        ),
        (
            "empty stdin",
            Call {
                stdin: String::new(),
                ..add()
            },
            6,
        ),
        ("missing CNI_CONTAINERID", add().unset("CNI_CONTAINERID"), 4),
        ("missing CNI_NETNS", add().unset("CNI_NETNS"), 4),
        ("missing CNI_IFNAME", add().unset("CNI_IFNAME"), 4),
        ("missing CNI_PATH", add().unset("CNI_PATH"), 4),
        ("unknown CNI_COMMAND", add().set("CNI_COMMAND", "FROB"), 4),
        (
            "unknown cniVersion",
            Call {
                stdin: d.conf("9.9.9", &[V4]),
                ..add()
            },
            1,
        ),
        (
            "missing cniVersion",
            Call {
                stdin: conf.replace("\"cniVersion\":\"1.1.0\",", ""),
                ..add()
            },
            1,
        ),
        ("ifname too long", add().set("CNI_IFNAME", "eth0123456789abc"), 4),
        ("ifname with /", add().set("CNI_IFNAME", "et/h0"), 4),
        ("ifname with whitespace", add().set("CNI_IFNAME", "eth 0"), 4),
        ("invalid container id", add().set("CNI_CONTAINERID", "bad/id"), 4),
        ("malformed CNI_ARGS", add().set("CNI_ARGS", "K8S_POD_NAME"), 4),
        (
            "netns does not exist",
            add().set("CNI_NETNS", "/run/netns/wt-does-not-exist"),
            8,
        ),
        (
            "netns is a regular file",
            add().set("CNI_NETNS", regular.to_str().unwrap()),
            8,
        ),
        (
            "netns is not a network namespace",
            add().set("CNI_NETNS", "/proc/self/ns/uts"),
            8,
        ),
        (
            "invalid range",
            Call {
                stdin: d.conf("1.1.0", &["10.244.1.7/24"]),
                ..add()
            },
            7,
        ),
        (
            "range not a CIDR",
            Call {
                stdin: d.conf("1.1.0", &["banana"]),
                ..add()
            },
            7,
        ),
        (
            "no ranges",
            Call {
                stdin: d.conf("1.1.0", &[]),
                ..add()
            },
            7,
        ),
        (
            "ipam section",
            Call {
                stdin: conf.replace("\"mtu\":1500", "\"mtu\":1500,\"ipam\":{\"type\":\"host-local\"}"),
                ..add()
            },
            2,
        ),
        (
            "oversized config",
            Call {
                stdin: format!("{}{}", conf, " ".repeat(2 << 20)),
                ..add()
            },
            7,
        ),
    ];
    for (what, call, code) in cases {
        let out = call.run();
        assert_eq!(out.err_code(), code, "{what}: {out:?}");
        let e = out.json();
        assert!(e["msg"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {e}");
        assert!(out.stderr.is_empty() || code == 0, "{what}: stderr {}", out.stderr);
    }
    // An exhausted range, the last bad input, leaves nothing either.
    let small = d.conf("1.1.0", &["10.244.2.0/30"]);
    let q = Netns::new("q");
    Call::new("ADD", "ctr-q", &q.path(), &small).run().ok();
    assert_eq!(
        Call {
            stdin: small.clone(),
            ..add()
        }
        .run()
        .err_code(),
        101
    );
    assert_eq!(p.links(), vec!["lo"]);
    Call::new("DEL", "ctr-q", &q.path(), &small).run().ok();
    d.assert_clean();
}

#[test]
fn an_unreachable_daemon_means_try_again_later() {
    let Some((_area, mut d)) = start("down") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4]);
    let p = Netns::new("p");
    d.stop().expect("weftd stops on SIGTERM");
    assert!(!d.socket().exists(), "a clean stop removes the socket");
    let out = Call::new("ADD", "ctr-1", &p.path(), &conf).run();
    assert_eq!(out.err_code(), 11, "{out:?}");
    assert!(
        out.json()["details"].as_str().unwrap().contains("cannot reach weftd"),
        "{out:?}"
    );
    // DEL does not wait for it: it is spooled for weftd to replay (tests/del_spool.rs).
    Call::new("DEL", "ctr-1", &p.path(), &conf).run().ok();
    assert_eq!(
        Call::new("STATUS", "", "", &conf).run().err_code(),
        50,
        "STATUS says: not available"
    );
    assert_eq!(p.links(), vec!["lo"]);

    // A daemon that hangs (stopped, socket still accepting) is no different.
    d.start_again();
    d.signal(nix::sys::signal::Signal::SIGSTOP);
    let out = Call::new("ADD", "ctr-1", &p.path(), &conf).run();
    d.signal(nix::sys::signal::Signal::SIGCONT);
    assert_eq!(out.err_code(), 11, "{out:?}");
    // It did not half-make the pod, or if the call reached it, DEL cleans up.
    Call::new("DEL", "ctr-1", &p.path(), &conf).run().ok();
    d.assert_clean();
}

#[test]
fn a_daemon_restarted_between_add_and_del_cleans_up() {
    let Some((_area, mut d)) = start("restart") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4, V6]);
    let p = Netns::new("p");
    let r = Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    d.restart(); // SIGKILL, then start again on the same state
    assert!(
        d.log().contains("\"first_start\":false"),
        "the second start knows it is a restart"
    );
    assert!(d.node.ping(&result_address(&r, false)), "the pod kept its connectivity");
    let again = Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    assert_eq!(again, r, "the stored result survives the restart");
    Call::new("DEL", "ctr-1", &p.path(), &conf).run().ok();
    d.assert_clean();
}

#[test]
fn the_socket_is_private_and_non_root_peers_are_refused() {
    let _area = weft_tests::area("node::cni");
    if !privileged() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start("perm");
    let mode = std::fs::metadata(d.socket()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Open the file up so only the peer-credential check stands in the way.
    weft_tests::chmod(&d.socket(), 0o666);
    weft_tests::chmod(d.socket().parent().unwrap(), 0o755);
    let conf = d.conf("1.1.0", &[V4]);
    let out = Call::new("STATUS", "", "", &conf).run_as(Some(65534));
    assert_eq!(out.err_code(), 50, "{out:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !d.log().contains("refused a connection from a non-root peer") {
        assert!(std::time::Instant::now() < deadline, "no refusal logged:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(Call::new("STATUS", "", "", &conf).run().code, 0, "root is served");
}

#[test]
fn a_stale_socket_is_replaced_but_a_live_one_is_not_stolen() {
    let Some((_area, mut d)) = start("stale") else {
        return;
    };
    let st = d.start_second(false);
    assert!(!st.success(), "a second daemon must refuse a live socket");
    assert!(d.log().contains("another weftd is serving"), "{}", d.log());
    let st = d.start_second(true);
    assert!(!st.success(), "a second daemon must refuse a state directory in use");
    assert!(
        d.log().contains("another weftd is running on state directory"),
        "{}",
        d.log()
    );
    let conf = d.conf("1.1.0", &[V4]);
    assert_eq!(
        Call::new("STATUS", "", "", &conf).run().code,
        0,
        "the first daemon still serves"
    );
    d.kill();
    assert!(d.socket().exists(), "a crash leaves the socket file behind");
    d.start_again();
    assert_eq!(Call::new("STATUS", "", "", &conf).run().code, 0);
}

#[test]
fn weftctl_status_shows_usage_per_range() {
    let Some((_area, d)) = start("ctl") else {
        return;
    };
    let conf = d.conf("1.1.0", &[V4, V6]);
    let p = Netns::new("p");
    Call::new("ADD", "ctr-1", &p.path(), &conf).run().ok();
    let st = d.status();
    assert_eq!(st["ready"], true);
    assert_eq!(st["node"], "node-ctl");
    assert_eq!(st["attachments"], 1);
    let ranges = st["ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 2);
    assert_eq!(ranges[0]["cidr"], V4);
    assert_eq!(ranges[0]["allocated"], 1);
    assert_eq!(ranges[0]["capacity"], 253);
    assert_eq!(ranges[0]["free"], 252);
    let table = weft_tests::sh(std::process::Command::new(weft_tests::bin("weftctl")).args([
        "--socket",
        d.socket().to_str().unwrap(),
        "status",
    ]));
    assert!(table.contains("10.244.1.0/24") && table.contains("ready"), "{table}");
    Call::new("DEL", "ctr-1", &p.path(), &conf).run().ok();
    d.assert_clean();
}
