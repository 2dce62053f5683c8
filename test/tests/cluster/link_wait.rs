//! Pods that start with their links (`waitForLinks`), through the real plugin and a
//! weftd in a node namespace reading topologies from a directory: a pod whose peer
//! appears 3 s later gets its ADD answered only once the link between them is up;
//! meanwhile its Topology status and `weftctl wires` say the link is pending and why.
//! A pod whose peer never comes gets a clear CNI error (code 11) when the network's
//! bound expires, and its Topology's own `wait_for_links` overrides the network's;
//! neither failed ADD leaves anything behind.

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_tests::{Call, Daemon, Netns, TempDir, bin, privileged, sh};

const RANGE: &str = "10.244.71.0/24";

/// Pod `pod`'s Topology (namespace `default`, as kubelet's pods here): one link, `uid`,
/// from its `e<uid>` to `peer`'s, addressed `10.71.<uid>.<1|2>/30` when `ips` says, with
/// `extra` spec fields.
fn topology(pod: &str, peer: &str, uid: i64, ips: Option<(u8, u8)>, extra: &str) -> String {
    let ips = ips
        .map(|(me, them)| format!(", local_ip: 10.71.{uid}.{me}/30, peer_ip: 10.71.{uid}.{them}/30"))
        .unwrap_or_default();
    format!(
        "apiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {{name: {pod}, namespace: default}}\nspec:\n{extra}  links:\n  - {{uid: {uid}, peer_pod: {peer}, local_intf: e{uid}, peer_intf: e{uid}{ips}}}\n---\n"
    )
}

/// The link states weftd wrote into `pod`'s Topology status: (interface, state, reason).
fn link_states(dir: &Path, pod: &str) -> Vec<(String, String, String)> {
    let Ok(body) = std::fs::read(dir.join(".status/default").join(format!("{pod}.json"))) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_slice(&body).expect("status JSON");
    v["links"]
        .as_array()
        .map(|links| {
            links
                .iter()
                .map(|l| {
                    let s = |k: &str| l[k].as_str().unwrap_or_default().to_string();
                    (s("local_intf"), s("state"), s("reason"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether interface `name` exists in `ns` and is administratively up.
fn link_up(ns: &Netns, name: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", ns.name(), "-j", "link", "show", name])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP"))
}

fn conf(d: &Daemon, wait: &str) -> String {
    let mut c: Value = serde_json::from_str(&d.conf("1.1.0", &[RANGE])).unwrap();
    c["waitForLinks"] = wait.into();
    c.to_string()
}

#[test]
fn an_add_waits_for_its_links_and_gives_up_clearly_at_its_bound() {
    let _area = weft_tests::area("cluster::link_wait");
    if !privileged() {
        return;
    }
    let topo = TempDir::new("lw-topo");
    let files = [
        topology("pod-a", "pod-b", 1, Some((1, 2)), ""),
        topology("pod-b", "pod-a", 1, Some((2, 1)), ""),
        topology("pod-c", "pod-never", 2, None, ""),
        topology("pod-e", "pod-never", 3, None, "  wait_for_links: 1s\n"),
    ];
    std::fs::write(topo.path().join("lab.yaml"), files.concat()).unwrap();
    let d = Daemon::start_configured(Netns::new("lw"), "linkwait", |c| {
        c.args.extend(
            [
                "--topology-dir",
                topo.path().to_str().unwrap(),
                "--wire-insecure",
                "--node-address",
                "127.0.0.1",
            ]
            .map(String::from),
        );
    });
    let socket = d.socket();
    let wait10 = conf(&d, "10s");
    let (a, b, c, e) = (
        Netns::new("lwa"),
        Netns::new("lwb"),
        Netns::new("lwc"),
        Netns::new("lwe"),
    );

    // pod-a comes first; its peer, 3 s later.
    let (tx, rx) = mpsc::channel();
    let call_a = Call::new("ADD", "a", &a.path(), &wait10);
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        let out = call_a.run();
        tx.send(()).unwrap();
        (out, started.elapsed())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        rx.try_recv().is_err(),
        "pod-a's ADD was answered before its peer existed"
    );
    assert_eq!(
        link_states(topo.path(), "pod-a"),
        [(
            "e1".to_string(),
            "pending".to_string(),
            "peer pod pod-b is not running on any node yet".to_string()
        )],
        "pod-a's Topology status while it waits"
    );
    let wires = sh(Command::new(bin("weftctl")).args(["--socket", socket.to_str().unwrap(), "wires"]));
    let row = wires
        .lines()
        .find(|l| l.contains("pod-a:e1"))
        .unwrap_or_else(|| panic!("{wires}"));
    assert!(
        row.contains("pending") && row.contains("peer pod pod-b is not running on any node yet"),
        "weftctl wires does not say why the link is pending:\n{wires}"
    );

    let page = d.http_get("/metrics", "text/plain");
    assert!(
        page.lines().any(|l| l == r#"weft_links{state="pending"} 1"#),
        "weft_links does not count the pending link:\n{}",
        page.lines()
            .filter(|l| l.starts_with("weft_links"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    let b_added = Instant::now();
    Call::new("ADD", "b", &b.path(), &wait10).run().ok();
    let (out_a, took_a) = waiter.join().unwrap();
    out_a.ok();
    assert!(took_a >= Duration::from_secs(3), "pod-a answered after {took_a:?}");
    eprintln!(
        "pod-b's ADD and pod-a's answer together took {:?} (pod-a waited {took_a:?} in all)",
        b_added.elapsed().min(took_a)
    );
    assert!(
        link_up(&a, "e1") && link_up(&b, "e1"),
        "the link is not up in both pods"
    );
    assert!(a.ping("10.71.1.2"), "pod-a cannot reach pod-b over the link");
    for pod in ["pod-a", "pod-b"] {
        assert_eq!(
            link_states(topo.path(), pod),
            [("e1".to_string(), "up".to_string(), String::new())],
            "{pod}'s Topology status once up"
        );
    }
    let held = d.allocated();
    assert_eq!(held, 2);

    // pod-c's peer never comes: the network's bound (2 s) expires.
    let started = Instant::now();
    let out = Call::new("ADD", "c", &c.path(), &conf(&d, "2s")).run();
    let took = started.elapsed();
    assert_eq!(out.err_code(), 11, "{out:?}");
    let err = out.json();
    let details = err["details"].as_str().unwrap_or_default();
    assert!(
        details.contains("links not up within 2s")
            && details.contains("e2 (to pod-never:e2): pending: peer pod pod-never is not running on any node yet"),
        "{err}"
    );
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
    eprintln!("pod-c's ADD gave up after {took:?} (bound 2 s)");

    // pod-e's Topology says 1 s, the network 10 s: the Topology wins.
    let started = Instant::now();
    let out = Call::new("ADD", "e", &e.path(), &wait10).run();
    let took = started.elapsed();
    assert_eq!(out.err_code(), 11, "{out:?}");
    assert!(
        out.json()["details"]
            .as_str()
            .unwrap_or_default()
            .contains("links not up within 1s"),
        "{out:?}"
    );
    assert!(
        took < Duration::from_secs(9),
        "pod-e waited the network's 10 s ({took:?})"
    );

    // The failed ADDs left nothing: no interfaces in the pods, no rows, no addresses,
    // no host ends.
    for (ns, intf) in [(&c, "e2"), (&e, "e3")] {
        let links = ns.links();
        assert!(
            !links.iter().any(|l| l == "eth0" || l == intf),
            "{} kept {links:?}",
            ns.name()
        );
    }
    assert_eq!(d.allocated(), held, "a failed ADD kept its address");
    assert_eq!(d.status()["attachments"], 2);
    let host_ends = d
        .node
        .links_but_gateway()
        .into_iter()
        .filter(|l| l.starts_with("weft"))
        .count();
    assert_eq!(host_ends, 2, "host ends: {:?}", d.node.links());
    assert!(
        link_states(topo.path(), "pod-c").is_empty(),
        "pod-c's status was not cleared"
    );

    for (id, ns) in [("a", &a), ("b", &b)] {
        Call::new("DEL", id, &ns.path(), &wait10).run().ok();
    }
    // DEL answers once the pod is cut off; the addresses follow the veth's removal.
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.allocated() != 0 {
        assert!(Instant::now() < deadline, "addresses still held after the DELs");
        std::thread::sleep(Duration::from_millis(100));
    }
}
