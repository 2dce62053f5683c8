//! Host ports through the real plugin and daemon: a client namespace reaches a pod
//! through the node's address, the node reaches it through its own address and
//! 127.0.0.1, the pod reaches itself through its own host port, a taken port is refused
//! cleanly, DEL closes the port, and a flushed table comes back. Then the defects found
//! under podman: traffic for a pod deleted while weftd was away never leaves the node,
//! `route_localnet` goes back as weft found it (and 127/8 is guarded whenever it is on),
//! loopback clients are refused at once instead of hanging, one container may ask for
//! the same host port on two networks, and a start or a spool replay reports no drift.
//! Last, `weftd uninstall` leaves the node as weft found it.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
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
    let _area = weft_tests::area("node::hostports");
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

/// How a TCP connection from `ns` to `addr` ends: `Ok` when it was accepted, else the
/// kind of error (refused and unreachable come at once; a timeout means it hung).
fn connect(ns: &Netns, addr: &str) -> Result<(), std::io::ErrorKind> {
    let addr: SocketAddr = addr.parse().unwrap();
    ns.within(|| {
        TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .map(|_| ())
            .map_err(|e| e.kind())
    })
}

/// A capture (`tcpdump`) of what leaves through `dev` of `ns` matching `filter`.
struct Capture {
    child: Child,
    out: std::path::PathBuf,
}

impl Capture {
    fn start(ns: &Netns, dev: &str, filter: &str, out: std::path::PathBuf) -> Self {
        let mut child = ns
            .cmd("tcpdump")
            .args(["-i", dev, "-n", "-l", "-Q", "out", filter])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (package tcpdump)");
        // It says so once its socket is open: nothing sent after that is missed.
        let mut said = String::new();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        while !said.contains("listening") {
            let n = err.read_line(&mut said).unwrap();
            assert!(n > 0, "tcpdump ended: {said}");
        }
        Self { child, out }
    }

    /// Stops it and returns the packets it saw.
    fn stop(mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// weft's unreachable routes in the node namespace (its pod ranges), both families.
fn unreachable_routes(d: &Daemon) -> Vec<String> {
    let mut out = Vec::new();
    for family in ["-4", "-6"] {
        let v = d
            .node
            .ip_json(&[family, "route", "show", "proto", "75", "type", "unreachable"]);
        out.extend(
            v.as_array()
                .unwrap()
                .iter()
                .map(|r| r["dst"].as_str().unwrap().to_string()),
        );
    }
    out.sort();
    out
}

/// A pod with a host port is deleted while weftd is stopped: its namespace and veth go,
/// the DNAT to its address stays. A connection to the host port is then answered on
/// the node (no route to the pod's address) and nothing for the pod ranges leaves
/// through the node's uplink, from the node itself or from a client outside.
#[test]
fn traffic_for_a_pod_deleted_while_weftd_is_away_never_leaves_the_node() {
    let _area = weft_tests::area("node::hostports");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("hpgone");
    let client = client_for(&d);
    // The uplink is the node's way out: a default route through the client, as a
    // node's through its router.
    sh(d.node
        .cmd("ip")
        .args(["route", "add", "default", "via", "192.168.77.2"]));
    sh(d.node
        .cmd("ip")
        .args(["-6", "route", "add", "default", "via", "fd77::2"]));
    let pod = Netns::new("pod");
    let conf = conf_with_ports(&d, json!([{"hostPort": 18081, "containerPort": 80, "protocol": "tcp"}]));
    Call::new("ADD", "ctr-gone", &pod.path(), &conf).run().ok();
    let mut want: Vec<String> = RANGES.iter().map(ToString::to_string).collect();
    want.sort();
    eventually("the node's ranges got no unreachable route", || {
        unreachable_routes(&d) == want
    });
    assert!(
        !d.log().contains("had drifted"),
        "a first start is no drift:\n{}",
        d.log()
    );

    d.stop().expect("weftd stops on SIGTERM");
    pod.delete();
    eventually("the pod's host end did not go with its namespace", || {
        d.node.links_but_gateway() == vec!["lo", "up0"]
    });
    let table = sh(d
        .node
        .cmd("nft")
        .args(["list", "map", "inet", "weft", "hostports_v4_any"]));
    assert!(
        table.contains("18081"),
        "the DNAT is still there, as after a crash:\n{table}"
    );

    let capture = Capture::start(
        &d.node,
        "up0",
        "net 10.244.5.0/24 or net fd00:10:244:5::/64",
        d.dir().join("uplink.txt"),
    );
    let from_client = connect(&client, "192.168.77.1:18081");
    let v6 = connect(&client, "[fd77::1]:18081");
    // The node's own connections are dropped where the kernel routes them again after
    // the DNAT (it reports no error to a connecting socket, which waits): what matters
    // is that nothing leaves.
    let from_node = connect(&d.node, "192.168.77.1:18081");
    let unused = connect(&d.node, "10.244.5.200:80");
    let leaked = capture.stop();
    assert!(
        leaked.is_empty(),
        "pod-range traffic left the node:\n{}",
        leaked.join("\n")
    );
    for (what, got) in [
        ("client -> the node's host port", from_client),
        ("client -> the node's IPv6 host port", v6),
        ("node -> an address no pod holds", unused),
    ] {
        // ICMP host unreachable (IPv6: no route), sent by the node.
        assert!(
            matches!(
                got,
                Err(std::io::ErrorKind::HostUnreachable | std::io::ErrorKind::NetworkUnreachable)
            ),
            "{what}: {got:?}, not answered by the node at once"
        );
    }
    assert!(from_node.is_err(), "node -> its own host port: {from_node:?}");

    // weftd back: the attachment of the vanished pod is collected, its port released.
    d.start_again();
    eventually("the vanished pod was not collected", || d.allocated() == 0);
    let table = sh(d
        .node
        .cmd("nft")
        .args(["list", "map", "inet", "weft", "hostports_v4_any"]));
    assert!(!table.contains("18081"), "{table}");
    assert_eq!(unreachable_routes(&d), want, "the ranges stay the node's");
}

fn route_localnet(d: &Daemon) -> String {
    sh(d.node.cmd("cat").arg("/proc/sys/net/ipv4/conf/all/route_localnet"))
        .trim()
        .to_string()
}

/// Whether weft's table drops packets to 127/8 that come from outside the node.
fn guarded(d: &Daemon) -> bool {
    let out = run(d
        .node
        .cmd("nft")
        .args(["list", "chain", "inet", "weft", "localnet_guard"]));
    String::from_utf8_lossy(&out.stdout).contains("127.0.0.0/8 drop")
}

/// `--hostports-localhost` turns `route_localnet` on; a crash keeps the table's guard
/// beside it; a start without the flag puts the value weft found back and drops the
/// guard; a `route_localnet` someone else turned on is guarded too, and never turned
/// off by weft.
#[test]
fn route_localnet_goes_back_without_the_flag_and_is_guarded_whenever_it_is_on() {
    let _area = weft_tests::area("node::hostports");
    if !privileged() {
        return;
    }
    let node = Netns::new("rl");
    assert_eq!(
        String::from_utf8_lossy(&run(node.cmd("cat").arg("/proc/sys/net/ipv4/conf/all/route_localnet")).stdout).trim(),
        "0",
        "a new namespace starts with route_localnet off"
    );
    let mut d = Daemon::start_in(
        node,
        "rl",
        &[("WEFT_HOSTPORTS_LOCALHOST", "true"), ("WEFT_RECONCILE_INTERVAL", "1")],
    );
    assert_eq!(route_localnet(&d), "1");
    assert!(guarded(&d), "127/8 is routable: the guard must be there");

    d.kill();
    assert_eq!(route_localnet(&d), "1", "a crash changes nothing");
    assert!(guarded(&d), "and the table keeps its guard");

    d.set_env(&[("WEFT_RECONCILE_INTERVAL", "1")]);
    d.start_again();
    assert_eq!(route_localnet(&d), "0", "no flag: back to what weft found");
    assert!(!guarded(&d));
    assert!(
        !d.log().contains("had drifted"),
        "new options are no drift:\n{}",
        d.log()
    );

    // Someone else (kube-proxy, an operator) turns it on: guarded within a pass.
    sh(d.node.cmd("sysctl").args(["-qw", "net.ipv4.conf.all.route_localnet=1"]));
    eventually("the guard did not follow route_localnet", || guarded(&d));
    d.stop().expect("weftd stops on SIGTERM");
    d.start_again();
    assert_eq!(route_localnet(&d), "1", "not weft's to turn off");
    assert!(guarded(&d));
}

/// A pod serving on 8080 with host port `port`, from the client namespace's node.
fn serving_pod(d: &Daemon, cid: &str, port: u16) -> (Netns, weft_tests::ChildGuard) {
    let pod = Netns::new("pod");
    let conf = conf_with_ports(d, json!([{"hostPort": port, "containerPort": 8080, "protocol": "tcp"}]));
    Call::new("ADD", cid, &pod.path(), &conf).run().ok();
    let http = pod.spawn(
        "python3",
        &["-m", "http.server", "8080", "--bind", "::"],
        &d.dir().join(format!("{cid}.log")),
    );
    eventually("the pod's server did not start", || {
        run(pod
            .cmd("curl")
            .args(["-sf", "--max-time", "1", "-o", "/dev/null", "http://127.0.0.1:8080/"]))
        .status
        .success()
    });
    (pod, http)
}

/// Loopback traffic weft cannot deliver is not DNATed, so the client is refused at
/// once: 127.0.0.1 without `--hostports-localhost`, ::1 always. With the flag,
/// 127.0.0.1 reaches the pod.
#[test]
fn loopback_clients_are_refused_at_once_unless_weft_can_deliver() {
    let _area = weft_tests::area("node::hostports");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("lo");
    let _client = client_for(&d);
    let (_pod, _http) = serving_pod(&d, "ctr-lo", 18082);
    assert!(http_ok(&d.node, "http://192.168.77.1:18082/"), "the node's own address");
    assert_eq!(
        connect(&d.node, "127.0.0.1:18082"),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    assert_eq!(
        connect(&d.node, "[::1]:18082"),
        Err(std::io::ErrorKind::ConnectionRefused)
    );

    d.set_env(&[("WEFT_HOSTPORTS_LOCALHOST", "true")]);
    d.restart();
    assert!(http_ok(&d.node, "http://127.0.0.1:18082/"), "127.0.0.1 with the flag");
    assert_eq!(
        connect(&d.node, "[::1]:18082"),
        Err(std::io::ErrorKind::ConnectionRefused),
        "IPv6 has no route_localnet"
    );
}

/// podman with `--network weftA,weftB -p 18086:8080`: the same `portMappings` reach
/// both networks. Neither is refused; the port reaches the container through whichever
/// network holds it, also while `network reload` DELs one and then the other, and in
/// either ADD order; a second container is refused, named as podman names it.
#[test]
fn one_container_on_two_networks_keeps_its_host_port_through_a_reload() {
    let _area = weft_tests::area("node::hostports");
    if !privileged() {
        return;
    }
    let d = Daemon::start("mp");
    let client = client_for(&d);
    let pod = Netns::new("mp");
    let net = |name: &str, ranges: &[&str]| {
        json!({
            "cniVersion": "1.0.0", "name": name, "type": "weft", "socket": d.socket(),
            "ranges": ranges, "mtu": 1500,
            "runtimeConfig": {"portMappings": [{"hostPort": 18086, "containerPort": 8080, "protocol": "tcp"}]},
        })
        .to_string()
    };
    let weft_a = net("weftA", &["10.123.0.0/24"]);
    let weft_b = net("weftB", &["10.124.0.0/24", "fd00:124::/64"]);
    // podman 4.3's CNI_ARGS: the container's name, no Kubernetes namespace.
    let call = |cmd: &str, cid: &str, ns: &Netns, conf: &str, ifname: &str| {
        Call::new(cmd, cid, &ns.path(), conf)
            .set("CNI_IFNAME", ifname)
            .set("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=mp")
            .run()
    };
    // Where the node's IPv4 mapping of the port points.
    let target = || {
        let map = sh(d
            .node
            .cmd("nft")
            .args(["list", "map", "inet", "weft", "hostports_v4_any"]));
        map.split("18086 : ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
    };
    // The port from the node, with the gateway of the network holding the mapping as the
    // source: the pod answers that through the same interface, whatever its default
    // route (a network left alone by a reload has none; see docs/configuration.md).
    let via = |gw: &str| {
        run(d.node.cmd("curl").args([
            "-sf",
            "--max-time",
            "3",
            "-o",
            "/dev/null",
            "--interface",
            gw,
            "http://192.168.77.1:18086/",
        ]))
        .status
        .success()
    };
    let gateway = |conf: &str| {
        if conf.contains("weftA") {
            "10.123.0.1"
        } else {
            "10.124.0.1"
        }
    };
    let range = |conf: &str| {
        if conf.contains("weftA") {
            "10.123.0."
        } else {
            "10.124.0."
        }
    };
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
    for (first, second) in [
        ((&weft_a, "eth0"), (&weft_b, "eth1")),
        ((&weft_b, "eth0"), (&weft_a, "eth1")),
    ] {
        call("ADD", "ctr-mp", &pod, first.0, first.1).ok();
        call("ADD", "ctr-mp", &pod, second.0, second.1).ok();
        assert!(
            target().is_some_and(|t| t.starts_with(range(first.0))),
            "IPv4 follows the network that asked first: {:?}",
            target()
        );
        assert!(http_ok(&client, "http://192.168.77.1:18086/"), "a client, over IPv4");
        assert!(
            http_ok(&client, "http://[fd77::1]:18086/"),
            "a client, over IPv6 (weftB)"
        );

        let other = Netns::new("other");
        let refused = call("ADD", "ctr-other", &other, &weft_a, "eth0");
        assert_eq!(refused.err_code(), 106, "{refused:?}");
        let details = refused.json()["details"].as_str().unwrap().to_string();
        assert!(
            details.contains("held by pod mp") && !details.contains("/mp"),
            "{details}"
        );

        // `podman network reload`: every network's DEL, then every ADD again.
        call("DEL", "ctr-mp", &pod, first.0, first.1).ok();
        assert!(
            target().is_some_and(|t| t.starts_with(range(second.0))),
            "the port passed to the network that is left: {:?}",
            target()
        );
        assert!(
            via(gateway(second.0)),
            "the port reaches the pod through the network left"
        );
        call("DEL", "ctr-mp", &pod, second.0, second.1).ok();
        assert_eq!(target(), None, "the last network out closes it");
        assert!(!http_ok(&client, "http://192.168.77.1:18086/"));
        d.settle();
    }
    assert!(!d.log().contains("had drifted"), "{}", d.log());
}

/// A DEL spooled while weftd was down and replayed at its start is no drift of the
/// host port table: nothing is reported, and the port is closed.
#[test]
fn a_spooled_del_of_a_pod_with_host_ports_is_replayed_without_drift() {
    let _area = weft_tests::area("node::hostports");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("hpspool");
    let client = client_for(&d);
    let (pod, _http) = serving_pod(&d, "ctr-sp", 18087);
    assert!(http_ok(&client, "http://192.168.77.1:18087/"));
    d.kill();
    let conf = conf_with_ports(
        &d,
        json!([{"hostPort": 18087, "containerPort": 8080, "protocol": "tcp"}]),
    );
    Call::new("DEL", "ctr-sp", &pod.path(), &conf).run().ok();
    d.start_again();
    assert!(d.log().contains("spooled DEL replayed"), "{}", d.log());
    assert!(!d.log().contains("had drifted"), "{}", d.log());
    assert!(
        !http_ok(&client, "http://192.168.77.1:18087/"),
        "the port went with the DEL"
    );
}

fn sysctl(ns: &Netns, name: &str) -> String {
    sh(ns.cmd("cat").arg(format!("/proc/sys/{name}"))).trim().to_string()
}

/// Stopping weftd leaves its tables, routes and settings (pods keep their networking
/// over a restart); `weftd uninstall` takes them away and puts back every sysctl weft
/// changed, refusing while weftd runs or while pods are attached.
#[test]
fn weftd_uninstall_leaves_the_node_as_weft_found_it() {
    let _area = weft_tests::area("node::hostports");
    if !privileged() {
        return;
    }
    let node = Netns::new("un");
    let settings = [
        "net/ipv4/ip_forward",
        "net/ipv6/conf/all/forwarding",
        "net/ipv4/conf/all/route_localnet",
    ];
    let before: Vec<String> = settings.iter().map(|s| sysctl(&node, s)).collect();
    assert_eq!(before, vec!["0", "0", "0"], "a new namespace forwards nothing");
    let mut d = Daemon::start_in(node, "un", &[("WEFT_HOSTPORTS_LOCALHOST", "true")]);
    let _client = client_for(&d);
    let (pod, _http) = serving_pod(&d, "ctr-un", 18088);
    let uninstall = |d: &Daemon, force: bool| {
        let mut c = d.node.cmd(bin("weftd").to_str().unwrap());
        c.arg("--state-dir")
            .arg(d.state_dir())
            .arg("--socket")
            .arg(d.socket())
            .arg("uninstall");
        if force {
            c.arg("--force");
        }
        run(&mut c)
    };
    let refused = uninstall(&d, false);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is running"),
        "{refused:?}"
    );

    d.stop().expect("weftd stops on SIGTERM");
    let after: Vec<String> = settings.iter().map(|s| sysctl(&d.node, s)).collect();
    assert_eq!(after, vec!["1", "1", "1"], "a stopped weftd leaves what pods need");
    let refused = uninstall(&d, false);
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        !refused.status.success() && said.contains("pod default/pod-ctr-un"),
        "{said}"
    );

    // The pod goes (as its runtime would DEL it, weftd down: spooled) and weft with it.
    let conf = conf_with_ports(
        &d,
        json!([{"hostPort": 18088, "containerPort": 8080, "protocol": "tcp"}]),
    );
    Call::new("DEL", "ctr-un", &pod.path(), &conf).run().ok();
    let out = uninstall(&d, true);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("deleted table inet weft"), "{said}");
    let tables = sh(d.node.cmd("nft").args(["list", "tables"]));
    assert!(!tables.contains("weft"), "{tables}");
    assert!(unreachable_routes(&d).is_empty());
    let routes = d.node.ip_json(&["route", "show", "proto", "74"]);
    assert_eq!(routes, json!([]), "no pod route");
    assert_eq!(d.node.links(), vec!["lo", "up0"], "no host end, no VXLAN device");
    let after: Vec<String> = settings.iter().map(|s| sysctl(&d.node, s)).collect();
    assert_eq!(after, before, "every setting as weft found it");
    assert!(!d.state_dir().exists());
    assert!(!d.socket().exists());
}
