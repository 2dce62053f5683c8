//! Host ports through the real plugin and daemon: a client namespace reaches a pod
//! through the node's address, the node reaches it through its own address and
//! 127.0.0.1, the pod reaches itself through its own host port, a taken port is refused cleanly, DEL closes the port, and a flushed table
//! comes back.

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weft_tests::{Call, Daemon, Netns, bin, privileged, run, sh};

const RANGES: [&str; 2] = ["10.244.5.0/24", "fd00:10:244:5::/64"];

/// A client namespace joined to the node by a veth: node 192.168.77.1 / fd77::1,
/// client 192.168.77.2 / fd77::2.
fn client_for(d: &Daemon) -> Netns {
    let c = Netns::new("client");
    sh(Command::new("ip").args([
        "-n",
        d.node.name(),
        "link",
        "add",
        "up0",
        "type",
        "veth",
        "peer",
        "name",
        "dn0",
        "netns",
        c.name(),
    ]));
    for (ns, dev, v4, v6) in [
        (d.node.name(), "up0", "192.168.77.1/24", "fd77::1/64"),
        (c.name(), "dn0", "192.168.77.2/24", "fd77::2/64"),
    ] {
        sh(Command::new("ip").args(["-n", ns, "addr", "add", v4, "dev", dev]));
        sh(Command::new("ip").args(["-n", ns, "addr", "add", v6, "dev", dev, "nodad"]));
        sh(Command::new("ip").args(["-n", ns, "link", "set", dev, "up"]));
    }
    c
}

fn conf_with_ports(d: &Daemon, ports: Value) -> String {
    let mut c: Value = serde_json::from_str(&d.conf("1.1.0", &RANGES)).unwrap();
    c["runtimeConfig"] = json!({"portMappings": ports});
    c.to_string()
}

/// `curl` from `ns`; true when the pod's HTTP server answered.
fn http_ok(ns: &Netns, url: &str) -> bool {
    run(ns.cmd("curl").args(["-sfg", "--max-time", "3", "-o", "/dev/null", url]))
        .status
        .success()
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn host_ports_reach_the_pod_and_go_away_with_it() {
    if !privileged() {
        return;
    }
    let d = Daemon::start_with_env(
        "hp",
        &[("WEFT_HOSTPORTS_LOCALHOST", "true"), ("WEFT_RECONCILE_INTERVAL", "1")],
    );
    let client = client_for(&d);
    let pod = Netns::new("pod");
    let mappings = json!([
        {"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"},
        {"HostPort": 18053, "ContainerPort": 5353, "Protocol": "UDP"},
    ]);
    let conf = conf_with_ports(&d, mappings.clone());
    Call::new("ADD", "ctr-hp", &pod.path(), &conf).run().ok();
    let _http = pod.spawn(
        "python3",
        &["-m", "http.server", "8080", "--bind", "::"],
        &d.dir().join("http.log"),
    );
    eventually("the pod's server did not start", || {
        run(pod
            .cmd("curl")
            .args(["-sf", "--max-time", "1", "-o", "/dev/null", "http://127.0.0.1:8080/"]))
        .status
        .success()
    });

    // From another host, over IPv4 and IPv6; from the node to its own address and to
    // localhost.
    assert!(
        http_ok(&client, "http://192.168.77.1:18080/"),
        "client -> node IPv4 host port"
    );
    assert!(
        http_ok(&client, "http://[fd77::1]:18080/"),
        "client -> node IPv6 host port"
    );
    assert!(http_ok(&d.node, "http://192.168.77.1:18080/"), "node -> own address");
    assert!(http_ok(&d.node, "http://127.0.0.1:18080/"), "node -> 127.0.0.1");
    assert!(
        http_ok(&pod, "http://192.168.77.1:18080/"),
        "the pod -> its own host port (hairpin)"
    );

    // UDP, from the client.
    let pod_udp = pod.within(|| UdpSocket::bind("0.0.0.0:5353").unwrap());
    let client_udp = client.within(|| UdpSocket::bind("0.0.0.0:0").unwrap());
    client_udp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    pod_udp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    client_udp.send_to(b"ping", "192.168.77.1:18053").unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = pod_udp.recv_from(&mut buf).expect("the pod got the datagram");
    assert_eq!(&buf[..n], b"ping");
    pod_udp.send_to(b"pong", from).unwrap();
    let (n, _) = client_udp
        .recv_from(&mut buf)
        .expect("the reply came back through the node");
    assert_eq!(&buf[..n], b"pong");

    // What the node says it holds.
    let ports: Vec<Value> = serde_json::from_str(&sh(Command::new(bin("weftctl")).args([
        "--socket",
        d.socket().to_str().unwrap(),
        "--json",
        "ports",
    ])))
    .unwrap();
    assert_eq!(ports.len(), 4, "tcp and udp, each over IPv4 and IPv6: {ports:?}");
    assert!(ports.iter().all(|p| p["pod"] == "pod-ctr-hp"));
    assert!(d.http_get("/metrics", "text/plain").contains("weft_hostports 4"));

    // A second pod asking for the same port is refused and left clean.
    let other = Netns::new("other");
    let refused = Call::new("ADD", "ctr-other", &other.path(), &conf).run();
    assert_eq!(refused.err_code(), 106, "{refused:?}");
    let details = refused.json()["details"].as_str().unwrap().to_string();
    assert!(
        details.contains("18080/tcp") && details.contains("pod default/pod-ctr-hp"),
        "{details}"
    );
    assert_eq!(other.links(), vec!["lo"]);
    assert_eq!(d.allocated(), 2, "only the first pod's addresses");

    // Someone flushes weft's table: the reconcile loop writes it back from the store.
    // (Whether a connection between the flush and the repair fails is a race with the
    // one-second loop; the logged repair proves the flush was seen.)
    sh(d.node.cmd("nft").args(["flush", "table", "inet", "weft"]));
    eventually("the table repair was not logged", || {
        d.log().contains("the host port table had drifted")
    });
    eventually("the host port table was not restored", || {
        http_ok(&client, "http://192.168.77.1:18080/")
    });

    // DEL closes the port at once; the other pod can then have it.
    Call::new("DEL", "ctr-hp", &pod.path(), &conf).run().ok();
    assert!(
        !http_ok(&client, "http://192.168.77.1:18080/"),
        "the port still reaches something after DEL"
    );
    Call::new("ADD", "ctr-other", &other.path(), &conf).run().ok();
    Call::new("DEL", "ctr-other", &other.path(), &conf).run().ok();
    d.settle();
    let ports: Vec<Value> = serde_json::from_str(&sh(Command::new(bin("weftctl")).args([
        "--socket",
        d.socket().to_str().unwrap(),
        "--json",
        "ports",
    ])))
    .unwrap();
    assert!(ports.is_empty());
    let table = sh(d.node.cmd("nft").args(["list", "table", "inet", "weft"]));
    assert!(!table.contains("18080"), "no element left:\n{table}");
    // Only weft's own table and the client link are left on the node.
    assert_eq!(d.node.links(), vec!["lo", "up0"]);
}
