//! Flows on the policy lab (`examples/lab-policy.yaml`: x isolated for ingress but
//! from y on 80/TCP; x/a on n1, x/b and y/a on n2, x/c and y/b on n3), real kernel:
//! a TCP transfer of a known size is one flow with its bytes and both pods named and
//! the rule that allowed it; a refused connection names the policies that isolate;
//! intra-node UDP, ICMP both ways of the verdict, a flow to the outside; aggregates,
//! `top` and the map; then a weftd restarted with a tiny event buffer under a burst of
//! new flows counts the loss and recovers every flow from a dump, and says since when
//! it records.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_kernel::{NetNs, in_netns};
use weft_tests::otlp::{Collector, attr, int_attr};
use weft_tests::{LabDown, TempDir, bin, in_lab_pod, load_lab, privileged};

/// The policy lab, under its own name.
struct FlowLab {
    lab: LabDown,
    file: String,
    lab_dir: PathBuf,
    dir: TempDir,
}

impl FlowLab {
    fn up(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let name = format!("wt{}{tag}", std::process::id());
        // Besides the example: IPv6 too, and z, in audit mode, whose pod z/a (n3) is
        // isolated.
        let text = include_str!("../../../examples/lab-policy.yaml")
            .replace("name: wp", &format!("name: {name}\nipv6: true"))
            .replace(
                "  - {name: y, labels: {ns: y}}\n",
                "  - {name: y, labels: {ns: y}}\n  - {name: z, labels: {ns: z}, annotations: {weft.dev/policy-mode: audit}}\n",
            )
            .replace(
                "  - {name: b, namespace: y, node: n3, labels: {pod: b}}\n",
                "  - {name: b, namespace: y, node: n3, labels: {pod: b}}\n  - {name: a, namespace: z, node: n3, labels: {pod: a}}\n",
            )
            + "  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: deny, namespace: z},\n     spec: {podSelector: {}, policyTypes: [Ingress]}}\n";
        let (lab, file, lab_dir) = load_lab(dir.path(), &name, &text);
        let lab = LabDown(lab);
        lab.0.up().expect("lab up");
        FlowLab {
            lab,
            file: file.display().to_string(),
            lab_dir,
            dir,
        }
    }

    fn weftctl(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(bin("weftctl"))
            .env("WEFT_LAB_DIR", &self.lab_dir)
            .envs(env.iter().copied())
            .args(args)
            .output()
            .unwrap()
    }

    fn weftctl_ok(&self, args: &[&str]) -> String {
        let out = self.weftctl(args, &[]);
        assert!(
            out.status.success(),
            "weftctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `weftctl flows --lab FILE ARGS -o json`: the stats lines and the records.
    fn flows(&self, args: &[&str]) -> (Vec<Value>, Vec<Value>) {
        let mut argv = vec!["flows", "--lab", &self.file, "-o", "json"];
        argv.extend_from_slice(args);
        let text = self.weftctl_ok(&argv);
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let (stats, flows): (Vec<Value>, Vec<Value>) = lines.into_iter().partition(|v| v.get("stats").is_some());
        (stats, flows)
    }

    /// Polls `flows ARGS` until `done` holds for the records (20 s: two of the
    /// readers' periodic dumps, which name an end the node learnt of late). On failure,
    /// says what every node holds.
    fn flows_until(&self, args: &[&str], what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, flows) = self.flows(args);
            if done(&flows) {
                return flows;
            }
            if Instant::now() >= deadline {
                let (stats, all) = self.flows(&[]);
                panic!("{what}: flows {args:?}: {flows:#?}\nevery node's stats: {stats:#?}\nall flows: {all:#?}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The pod's IPv4 address.
    fn ip(&self, pod: &str) -> IpAddr {
        let out = in_lab_pod(&self.lab.0, pod, &["ip", "-4", "-o", "addr", "show", "eth0"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let cidr = text
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("{pod}: {text}"));
        cidr.split('/').next().unwrap().parse().unwrap()
    }

    /// The pod's IPv6 address (global scope).
    fn ip6(&self, pod: &str) -> IpAddr {
        let out = in_lab_pod(
            &self.lab.0,
            pod,
            &["ip", "-6", "-o", "addr", "show", "eth0", "scope", "global"],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let cidr = text
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("{pod}: {text}"));
        cidr.split('/').next().unwrap().parse().unwrap()
    }

    /// Sends `bytes` over TCP from pod `from` to pod `to` at `addr` port `port` (retrying
    /// the connect for 10 s while policies land) and returns the client's port once the
    /// server has read them all.
    /// Sends `bytes` from `from` to `to` at `addr`:`port` and waits until they are all
    /// read; returns the client's port and the bytes TCP sent again (which the flow's
    /// counters rightly include).
    fn send(&self, from: &str, to: &str, addr: IpAddr, port: u16, bytes: usize) -> (u16, u64) {
        let bind = SocketAddr::new(
            if addr.is_ipv6() {
                "::".parse().unwrap()
            } else {
                "0.0.0.0".parse().unwrap()
            },
            port,
        );
        let listener = self.in_pod(to, || TcpListener::bind(bind).unwrap());
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            c.read_to_end(&mut buf).unwrap();
            buf.len()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let sent = loop {
            let r = self.in_pod(from, || -> std::io::Result<(u16, u64)> {
                let mut c = TcpStream::connect_timeout(&SocketAddr::new(addr, port), Duration::from_secs(1))?;
                c.write_all(&vec![7u8; bytes])?;
                c.shutdown(std::net::Shutdown::Write)?;
                // The server closes once it has read everything: every byte acked.
                c.read_to_end(&mut Vec::new())?;
                Ok((c.local_addr()?.port(), retransmitted(&c)))
            });
            match r {
                Ok(p) => break p,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "{from} never reached {to} at {addr} on {port}: {e}"
                ),
            }
        };
        assert_eq!(server.join().unwrap(), bytes);
        sent
    }

    /// Runs `f` inside the pod's network namespace.
    fn in_pod<R: Send>(&self, pod: &str, f: impl FnOnce() -> R + Send) -> R {
        let ns = NetNs::open(&PathBuf::from("/run/netns").join(self.lab.0.pod_ns(pod))).unwrap();
        in_netns(&ns, || Ok(f())).unwrap()
    }

    fn ping(&self, from: &str, to: &str) -> bool {
        in_lab_pod(&self.lab.0, from, &["ping", "-n", "-c", "1", "-W", "1", to])
            .status
            .success()
    }
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

#[test]
fn flows_name_pods_bytes_verdicts_and_policies_and_losses_are_counted_and_recovered() {
    if !privileged() {
        return;
    }
    let _area = weft_tests::area("cluster::flows");
    let lab = FlowLab::up("fl");
    let (xa, ya, yb) = (lab.ip("x/a"), lab.ip("y/a"), lab.ip("y/b"));

    // A TCP transfer of a known size, y/a (n2) to x/a (n1) on 80: allowed by x's policy.
    const SENT: usize = 1_000_000;
    let listener = lab.in_pod("x/a", || TcpListener::bind("0.0.0.0:80").unwrap());
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut buf = Vec::new();
        c.read_to_end(&mut buf).unwrap();
        c.write_all(&[1u8; 1000]).unwrap();
        buf.len()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let (client_port, resent) = loop {
        // Policies may still be landing right after `lab up`: retry the connect.
        let r = lab.in_pod("y/a", || -> std::io::Result<(u16, u64)> {
            let mut c = TcpStream::connect_timeout(&SocketAddr::new(xa, 80), Duration::from_secs(1))?;
            let port = c.local_addr()?.port();
            c.write_all(&vec![7u8; SENT])?;
            c.shutdown(std::net::Shutdown::Write)?;
            let mut back = Vec::new();
            c.read_to_end(&mut back)?;
            assert_eq!(back.len(), 1000);
            Ok((port, retransmitted(&c)))
        });
        match r {
            Ok(p) => break p,
            Err(e) => assert!(Instant::now() < deadline, "y/a never reached x/a on 80: {e}"),
        }
    };
    assert_eq!(server.join().unwrap(), SENT);
    let flows = lab.flows_until(&["--from", "y/a", "--to", "x/a", "--port", "80"], "the transfer", |f| {
        f.iter().any(|r| r["src"]["port"] == client_port && r["end"] == "fin")
    });
    let f = flows.iter().find(|r| r["src"]["port"] == client_port).unwrap();
    let fwd = s(f, &["forward", "bytes"]).as_u64().unwrap();
    let rev = s(f, &["reverse", "bytes"]).as_u64().unwrap();
    // Headers are well under 1 % with segmentation offload; a segment TCP sent again
    // crossed the wire twice and is rightly counted twice.
    assert!(
        fwd >= SENT as u64 && fwd <= SENT as u64 * 101 / 100 + resent,
        "forward bytes within 1 % of the {SENT} sent (+{resent} sent again): {fwd}"
    );
    assert!(
        (1000..=1000 * 3 + 100 * 60).contains(&rev),
        "the answer's bytes apart: {rev}"
    );
    assert_eq!(
        (f["src"]["namespace"].as_str(), f["src"]["pod"].as_str()),
        (Some("y"), Some("a"))
    );
    assert_eq!(
        (f["dst"]["namespace"].as_str(), f["dst"]["pod"].as_str()),
        (Some("x"), Some("a"))
    );
    assert_eq!(f["dst"]["ip"].as_str(), Some(xa.to_string().as_str()));
    assert_eq!(
        (f["kind"].as_str(), f["verdict"].as_str(), f["node"].as_str()),
        (Some("inter-node"), Some("forwarded"), Some("n2"))
    );
    let p = &f["policies"][0];
    assert_eq!(
        (
            p["name"].as_str(),
            p["effect"].as_str(),
            p["rule"].as_u64(),
            p["side"].as_str()
        ),
        (Some("x/allow-y-on-http"), Some("allow"), Some(0), Some("ingress")),
        "{f:#}"
    );
    assert_eq!(
        flows.iter().filter(|r| r["src"]["port"] == client_port).count(),
        1,
        "one flow, reported once"
    );
    // Cluster-wide from one node: n3 (which saw none of it) asks the others over the
    // node-to-node port and answers with n2's record, and every node's stats.
    let n3 = lab.lab.0.socket("n3");
    let text = lab.weftctl_ok(&[
        "--socket",
        n3.to_str().unwrap(),
        "flows",
        "--from",
        "y/a",
        "--to",
        "x/a",
        "--port",
        "80",
        "-o",
        "json",
    ]);
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut nodes: Vec<&str> = lines.iter().filter_map(|v| v["stats"]["node"].as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n3"], "{text}");
    assert!(
        lines
            .iter()
            .all(|v| v.get("stats").is_none() || v["stats"]["enabled"] == true),
        "every node answered: {text}"
    );
    let via = lines
        .iter()
        .filter(|v| v["src"]["port"] == client_port)
        .collect::<Vec<_>>();
    assert_eq!(via.len(), 1, "the transfer, once, through n3: {text}");
    assert_eq!(via[0]["node"], "n2");
    let local = lab.weftctl_ok(&[
        "--socket",
        n3.to_str().unwrap(),
        "flows",
        "--local",
        "--from",
        "y/a",
        "-o",
        "json",
    ]);
    assert!(
        !local.contains(&format!("\"port\":{client_port}")),
        "--local: n3's own flows only: {local}"
    );

    // IPv6: the same allowed path, y/a (n2) to x/a (n1) on 80, over the pods' IPv6
    // addresses: one flow with the v6 ends, its bytes and the rule.
    let xa6 = lab.ip6("x/a");
    const SENT6: usize = 1_000_000;
    let (port6, resent6) = lab.send("y/a", "x/a", xa6, 80, SENT6);
    let v6 = lab.flows_until(
        &["--from", "y/a", "--to", &xa6.to_string(), "--port", "80"],
        "the IPv6 transfer",
        |f| f.iter().any(|r| r["src"]["port"] == port6 && r["end"] == "fin"),
    );
    let f6 = v6.iter().find(|r| r["src"]["port"] == port6).unwrap();
    let fwd6 = s(f6, &["forward", "bytes"]).as_u64().unwrap();
    assert!(
        fwd6 >= SENT6 as u64 && fwd6 <= SENT6 as u64 * 101 / 100 + resent6,
        "IPv6 forward bytes within 1 % of {SENT6} (+{resent6} sent again): {fwd6}: {v6:#?}"
    );
    assert_eq!(
        (
            f6["dst"]["pod"].as_str(),
            f6["kind"].as_str(),
            f6["policies"][0]["name"].as_str()
        ),
        (Some("a"), Some("inter-node"), Some("x/allow-y-on-http")),
        "{f6:#}"
    );
    assert!(f6["src"]["ip"].as_str().unwrap().contains(':'), "{f6:#}");

    // Refused: y/a to x/a on 81.
    let refused = lab.in_pod("y/a", || {
        TcpStream::connect_timeout(&SocketAddr::new(xa, 81), Duration::from_secs(1))
    });
    assert!(refused.is_err(), "81 is not allowed");
    let denied = lab.flows_until(
        &["--from", "y/a", "--port", "81", "--verdict", "denied"],
        "the refusal",
        |f| !f.is_empty(),
    );
    let names: Vec<&str> = denied[0]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"x/default-deny-ingress"), "{denied:#?}");
    assert!(
        denied[0]["policies"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["effect"] == "isolate")
    );

    // The kernel's account, hop by hop: the refused SYN crosses n2 and is dropped on
    // n1 by the policy table; the allowed one crosses both and is delivered. As in a
    // cluster: y/a's node (n2) is asked over its socket, and asks n1 and n3 to watch
    // over the node-to-node port.
    let n2 = lab.lab.0.socket("n2");
    let trace = |probe: &str| -> Value {
        let text = lab.weftctl_ok(&["--socket", n2.to_str().unwrap(), "--json", "trace", "y/a", "x/a", probe]);
        serde_json::from_str(text.trim()).unwrap()
    };
    let denied_trace = trace("81/tcp");
    let hops = denied_trace["trace"]["hops"].as_array().unwrap();
    let nodes: Vec<&str> = hops.iter().map(|h| h["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["n2", "n1"], "{denied_trace:#}");
    assert!(hops[0]["dropped_by"].is_null(), "n2 forwards it: {denied_trace:#}");
    assert!(
        hops[0]["route"].as_str().unwrap().contains(&xa.to_string()),
        "n2's route to x/a: {denied_trace:#}"
    );
    let drop = &hops[1]["dropped_by"];
    assert_eq!(drop["table"], "inet weft-policy", "{denied_trace:#}");
    assert_eq!(drop["verdict"], "drop");
    assert!(
        drop["meaning"]
            .as_str()
            .is_some_and(|m| m.contains("pods of x isolated (ingress) by") && m.contains("x/default-deny-ingress")),
        "n1 names the policies whose chain dropped it: {denied_trace:#}"
    );
    assert_eq!(
        denied_trace["trace"]["unwatched"].as_array().map(Vec::len),
        Some(0),
        "n1 and n3 both watched: {denied_trace:#}"
    );
    assert_eq!(denied_trace["trace"]["answered"], false);
    assert_eq!(denied_trace["policy_explain"], "denied");
    let allowed_trace = trace("80/tcp");
    let hops = allowed_trace["trace"]["hops"].as_array().unwrap();
    assert_eq!(hops.len(), 2, "{allowed_trace:#}");
    assert!(hops.iter().all(|h| h["dropped_by"].is_null()), "{allowed_trace:#}");
    assert_eq!(allowed_trace["policy_explain"], "allowed");
    let allowed_by = hops[1]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["meaning"].as_str())
        .collect::<Vec<_>>();
    assert!(
        allowed_by
            .iter()
            .any(|m| m.contains("x/allow-y-on-http") && m.ends_with("allows")),
        "n1 names the policy whose rule accepted it: {allowed_trace:#}"
    );
    // `--lab` finds the source's node; the table names the dropping rule.
    let table = lab.weftctl_ok(&["trace", "--lab", &lab.file, "y/a", "x/a", "81/tcp"]);
    assert!(table.contains("DROPPED by inet weft-policy"), "{table}");
    // Another node refuses: the probe leaves from inside the pod.
    let n1 = lab.lab.0.socket("n1");
    let out = lab.weftctl(
        &["--socket", n1.to_str().unwrap(), "trace", "y/a", "x/a", "80/tcp"],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not run on node n1"), "{err}");

    // Intra-node UDP: x/b and y/a share n2. A policy isolating y, staged: the flow is
    // forwarded, and shows the verdict the staged policy would give.
    let staged = lab.dir.path().join("staged.yaml");
    std::fs::write(
        &staged,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {name: staged-deny, namespace: y, annotations: {weft.dev/policy-mode: staged}}\n\
         spec: {podSelector: {}, policyTypes: [Ingress]}\n",
    )
    .unwrap();
    lab.weftctl_ok(&["lab", "apply", &lab.file, staged.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let u = loop {
        // A new flow each time: the verdicts are a flow's when it is first seen.
        let xb_port = lab.in_pod("x/b", || {
            let u = UdpSocket::bind("0.0.0.0:0").unwrap();
            u.send_to(b"hello", SocketAddr::new(ya, 5353)).unwrap();
            u.local_addr().unwrap().port()
        });
        let mine = |r: &Value| r["src"]["port"].as_u64() == Some(u64::from(xb_port));
        let udp = lab.flows_until(&["--from", "x/b", "--protocol", "udp"], "intra-node UDP", |f| {
            // Counted once a dump has read the entry (a listing dumps, at most every 250 ms).
            f.iter().any(|r| mine(r) && r["forward"]["packets"].as_u64() >= Some(1))
        });
        let u = udp.into_iter().find(|r| mine(r)).unwrap();
        if u["staged"]["verdict"] == "denied" {
            break u;
        }
        assert!(Instant::now() < deadline, "the staged policy never showed: {u:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        (u["kind"].as_str(), u["verdict"].as_str(), u["dst"]["ip"].as_str()),
        (Some("intra-node"), Some("forwarded"), Some(ya.to_string().as_str()))
    );
    assert_eq!(s(&u, &["forward", "packets"]).as_u64(), Some(1));
    let sp = &u["staged"]["policies"][0];
    assert_eq!(
        (sp["name"].as_str(), sp["effect"].as_str()),
        (Some("y/staged-deny"), Some("isolate")),
        "{u:#}"
    );
    let (_, previewed) = lab.flows(&["--from", "x/b", "--staged", "denied"]);
    assert!(!previewed.is_empty() && previewed.iter().all(|r| r["staged"]["verdict"] == "denied"));
    lab.weftctl_ok(&["lab", "delete", &lab.file, staged.to_str().unwrap()]);

    // Audit: z isolates z/a but is in audit mode; y/b (n3) reaches it, as an audit.
    assert!(lab.ping("y/b", &lab.ip("z/a").to_string()), "audit mode forwards");
    let audit = lab.flows_until(
        &["--from", "y/b", "--to", "z/", "--verdict", "audit"],
        "the audit",
        |f| !f.is_empty(),
    );
    assert_eq!(
        (audit[0]["policies"][0]["name"].as_str(), audit[0]["node"].as_str()),
        (Some("z/deny"), Some("n3")),
        "{audit:#?}"
    );

    // ICMP: y/a to y/b passes (no policy), y/a to x/a does not (x takes 80/TCP only).
    assert!(lab.ping("y/a", &yb.to_string()));
    assert!(!lab.ping("y/a", &xa.to_string()));
    let icmp = lab.flows_until(&["--from", "y/a", "--protocol", "icmp"], "ICMP", |f| {
        f.iter().any(|r| r["verdict"] == "forwarded") && f.iter().any(|r| r["verdict"] == "denied")
    });
    let ok = icmp.iter().find(|r| r["verdict"] == "forwarded").unwrap();
    assert_eq!(
        (ok["dst"]["pod"].as_str(), ok["icmp"][0].as_u64()),
        (Some("b"), Some(8)),
        "{ok:#}"
    );

    // To the outside (masqueraded on the way).
    assert!(lab.ping("y/b", weft_lab::OUTSIDE_ADDRESS));
    let out = lab.flows_until(&["--from", "y/b", "--to", "outside"], "to the outside", |f| {
        !f.is_empty()
    });
    assert_eq!(
        (
            out[0]["kind"].as_str(),
            out[0]["dst"]["ip"].as_str(),
            out[0]["node"].as_str()
        ),
        (Some("to-outside"), Some(weft_lab::OUTSIDE_ADDRESS), Some("n3"))
    );

    // Aggregates, top and the map.
    let agg = lab.weftctl_ok(&[
        "flows",
        "--lab",
        &lab.file,
        "--aggregate",
        "--from",
        "y/a",
        "--port",
        "80",
        "-o",
        "json",
    ]);
    let row = agg
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["src"] == "y/a" && v["dst"] == "x/a")
        .unwrap_or_else(|| panic!("an aggregate y/a -> x/a: {agg}"));
    assert!(
        s(&row, &["forward", "bytes"]).as_u64().unwrap() >= SENT as u64,
        "{row:#}"
    );
    assert_eq!(row["policy"], "x/allow-y-on-http");
    let top = lab.weftctl_ok(&["flows", "top", "--lab", &lab.file, "-n", "2"]);
    assert!(
        top.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("x/a") || l.starts_with("y/a")),
        "{top}"
    );
    let map = lab.dir.path().join("map.dot");
    lab.weftctl_ok(&["flows", "graph", "--lab", &lab.file, "-o", map.to_str().unwrap()]);
    let dot = std::fs::read_to_string(&map).unwrap();
    assert!(dot.contains("\"y/a\" -> \"x/a\""), "{dot}");
    assert!(dot.contains("color=red"), "a denied edge: {dot}");

    // n2's weftd restarted with a buffer too small for a burst.
    let before_restart = weft_policy_now_ms();
    lab.weftctl_ok(&["lab", "crash", &lab.file, "n2"]);
    let export = lab.dir.path().join("n2-flows.jsonl");
    // A real collector in n2's namespace: n2 exports y's ended flows as OTLP logs.
    let collector = Collector::start(&lab.lab.0.node_ns("n2"));
    let up = lab.weftctl(
        &["lab", "up", &lab.file],
        &[
            ("WEFT_FLOWS_RECEIVE_BUFFER", "4096"),
            ("WEFT_FLOWS_FILE", export.to_str().unwrap()),
            ("WEFT_FLOWS_FILE_FILTER", "verdict=denied"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", weft_tests::otlp::ENDPOINT),
            ("OTEL_BLRP_SCHEDULE_DELAY", "100"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("WEFT_FLOWS_OTLP", "flows"),
            ("WEFT_FLOWS_OTLP_FILTER", "from=y/"),
        ],
    );
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let n2_stats = |lab: &FlowLab| {
        let (stats, _) = lab.flows(&["--from", "y/a", "--to", "y/b", "--port", "9"]);
        stats.into_iter().find(|v| v["stats"]["node"] == "n2").unwrap()["stats"].clone()
    };
    let st = n2_stats(&lab);
    let start = st["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["reason"] == "start")
        .unwrap()
        .clone();
    assert!(
        start["to_unix_ms"].as_i64().unwrap() >= before_restart,
        "the restart is said: {st:#}"
    );
    otlp_records_carry_the_conventions_attributes(&lab, &collector);

    const BURST: usize = 500;
    lab.in_pod("y/a", || {
        for _ in 0..BURST {
            let u = UdpSocket::bind("0.0.0.0:0").unwrap();
            u.send_to(b"x", SocketAddr::new(yb, 9)).unwrap();
        }
    });
    // What the node's kernel tracked (a datagram of the burst may be dropped before
    // conntrack confirms it): weft must have every one of those, once.
    let n2 = NetNs::open(&PathBuf::from("/run/netns").join(lab.lab.0.node_ns("n2"))).unwrap();
    let tracked = in_netns(&n2, || {
        weft_kernel::conntrack::dump().map_err(|e| weft_kernel::KernelError::os("dump", e))
    })
    .unwrap()
    .into_iter()
    .filter(|e| e.original.src == ya && e.original.dst == yb && e.original.dst_port == 9)
    .count();
    assert!(tracked > BURST * 9 / 10, "the kernel tracked {tracked} of {BURST}");
    let burst = lab.flows_until(
        &["--from", "y/a", "--to", "y/b", "--port", "9", "--protocol", "udp"],
        "the burst",
        |f| f.len() >= tracked,
    );
    assert_eq!(burst.len(), tracked, "every flow of the burst the kernel tracked, once");
    let st = n2_stats(&lab);
    assert!(
        st["overflows"].as_u64().unwrap() >= 1,
        "the overflow is counted: {st:#}"
    );
    assert!(st["lost_events"].as_u64().unwrap() >= 1, "{st:#}");
    assert!(
        st["gaps"].as_array().unwrap().iter().any(|g| g["reason"] == "overflow"),
        "the loss's span is said: {st:#}"
    );
    let table = lab.weftctl_ok(&["flows", "--lab", &lab.file, "--from", "y/a", "--port", "9"]);
    assert!(table.contains("# n2: EVENTS LOST"), "{table}");

    // The export file of n2 (denied flows only): a refusal on the node (y/a to x/b on
    // 81, both on n2) is written at once; the burst (forwarded) is not.
    let xb = lab.ip("x/b");
    let refused = lab.in_pod("y/a", || {
        TcpStream::connect_timeout(&SocketAddr::new(xb, 81), Duration::from_secs(1))
    });
    assert!(refused.is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&export).unwrap_or_default();
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        if lines.iter().any(|l| l["dst"]["pod"] == "b" && l["dst"]["port"] == 81) {
            break lines;
        }
        assert!(Instant::now() < deadline, "the refusal in {}: {text}", export.display());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        lines.iter().all(|l| l["verdict"] == "denied" && l["node"] == "n2"),
        "{lines:#?}"
    );
}

/// n2 exports y's ended flows over OTLP (see the restart above): an allowed transfer
/// y/a to x/b on 80 (both on n2) arrives in the collector at its FIN with the semantic
/// conventions' attributes, its bytes and the rule that allowed it; x/b's own flow to
/// y/a does not pass the filter.
fn otlp_records_carry_the_conventions_attributes(lab: &FlowLab, collector: &Collector) {
    const SENT: usize = 200_000;
    let (ya, xb) = (lab.ip("y/a"), lab.ip("x/b"));
    let (client_port, resent) = lab.send("y/a", "x/b", xb, 80, SENT);
    lab.in_pod("x/b", || {
        UdpSocket::bind("0.0.0.0:0")
            .unwrap()
            .send_to(b"not y's", SocketAddr::new(ya, 5353))
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let (resource, record) = loop {
        let found = collector.logs().into_iter().find_map(|rl| {
            let resource = rl.resource.clone()?.attributes;
            rl.scope_logs
                .iter()
                .flat_map(|sl| sl.log_records.iter())
                .find(|r| int_attr(&r.attributes, "source.port") == Some(i64::from(client_port)))
                .cloned()
                .map(|r| (resource, r))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "y/a's flow did not reach the collector: {:#?}\nrotel: {}",
            collector.logs(),
            collector.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let a = &record.attributes;
    for (k, v) in [
        ("source.address", ya.to_string()),
        ("destination.address", xb.to_string()),
        ("network.transport", "tcp".into()),
        ("network.type", "ipv4".into()),
        ("k8s.namespace.name", "y".into()),
        ("k8s.pod.name", "a".into()),
        ("weft.destination.namespace", "x".into()),
        ("weft.destination.pod", "b".into()),
        ("weft.flow.kind", "intra-node".into()),
        ("weft.flow.verdict", "forwarded".into()),
        ("weft.flow.end", "fin".into()),
    ] {
        assert_eq!(attr(a, k), Some(v.as_str()), "{k}: {record:#?}");
    }
    assert_eq!(int_attr(a, "destination.port"), Some(80));
    let fwd = int_attr(a, "weft.flow.forward.bytes").unwrap();
    assert!(
        fwd >= SENT as i64 && fwd <= SENT as i64 * 101 / 100 + resent as i64,
        "forward bytes within 1 % of {SENT} (+{resent} sent again): {fwd}"
    );
    assert!(
        format!("{:?}", a).contains("ingress allowed by networkpolicy x/allow-y-on-http rule 0"),
        "the allowing rule: {record:#?}"
    );
    assert_eq!(record.event_name, "weft.flow");
    assert_eq!(attr(&resource, "k8s.node.name"), Some("n2"));
    assert_eq!(attr(&resource, "service.name"), Some("weftd"));
    let all: Vec<_> = collector
        .logs()
        .into_iter()
        .flat_map(|rl| rl.scope_logs.into_iter().flat_map(|sl| sl.log_records))
        .collect();
    assert!(
        all.iter()
            .all(|r| attr(&r.attributes, "k8s.namespace.name") == Some("y")),
        "the filter keeps y's flows only: {all:#?}"
    );
}

fn weft_policy_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The bytes TCP sent again on `c` (`tcpi_bytes_retrans`).
fn retransmitted(c: &TcpStream) -> u64 {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain data; the kernel fills at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket, a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_bytes_retrans
}
