//! Egress by domain name on a lab with its own DNS (dnsmasq in the outside), real
//! kernel: a ClusterNetworkPolicy lets namespace x reach some names on 80/TCP and
//! nothing else of the outside. Exact and wildcard names allow exactly what they
//! match, over IPv4 and IPv6 (AAAA answers, the outside reached over IPv6); a CNAME chain is followed; a name with 120 addresses; an answer that changes
//! moves what is allowed; a pod that resolves and connects at once is never refused
//! (1,000 times, each a name never seen), and with the learner stopped the answer
//! still arrives at once while the connection waits for the learner; TTL expiry stops new connections and leaves
//! an open one; weftd SIGKILLed while a pod resolves in a loop: DNS keeps answering
//! (the longest gap is printed), learnt addresses stay allowed, nothing else opens; a
//! Deny rule with domainNames is refused.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weft_fqdn::answer::build::query;
use weft_kernel::{NetNs, in_netns};
use weft_tests::{LabDown, TempDir, load_lab, privileged};

/// How many names the race loop resolves, one address each in the lab's names block.
const RACE: usize = 1000;

fn lab_text(name: &str) -> String {
    let mut dns = String::from(
        "dns:\n\
         \x20 - {name: api.example.test, addresses: [198.51.100.10, 198.51.100.11], ttl: 300}\n\
         \x20 - {name: short.example.test, addresses: [198.51.100.12], ttl: 1}\n\
         \x20 - {name: deb.mirror.test, addresses: [198.51.100.20]}\n\
         \x20 - {name: mirror.test, addresses: [198.51.100.21]}\n\
         \x20 - {name: other.test, addresses: [198.51.100.30]}\n\
         \x20 - {name: www.example.test, cname: edge.cdn.test}\n\
         \x20 - {name: edge.cdn.test, addresses: [198.51.100.40], ttl: 60}\n\
         \x20 - {name: changing.example.test, addresses: [198.51.100.50]}\n\
         \x20 - {name: after.race.test, addresses: [198.51.100.60]}\n\
         \x20 - {name: held.race.test, addresses: [198.51.100.61]}\n\
         \x20 - {name: v6.example.test, addresses: [198.51.100.70, \"2001:db8:104::10\", \"2001:db8:104::11\"]}\n\
         \x20 - {name: other6.test, addresses: [\"2001:db8:104::30\"]}\n",
    );
    let many: Vec<String> = (0..120).map(|i| format!("198.51.100.{}", 100 + i)).collect();
    dns.push_str(&format!(
        "  - {{name: many.example.test, addresses: [{}]}}\n",
        many.join(", ")
    ));
    for i in 0..RACE {
        dns.push_str(&format!(
            "  - {{name: r{i}.race.test, addresses: [198.51.{}.{}], ttl: 60}}\n",
            104 + i / 250,
            i % 250 + 1
        ));
    }
    format!(
        "name: {name}\nnodes: [n1, n2]\nunderlay: shared\nipv6: true\n\
         weftd_args: [\"--policy-dns-min-ttl=2\"]\n\
         namespaces:\n  - {{name: x, labels: {{ns: x}}}}\n  - {{name: y, labels: {{ns: y}}}}\n\
         pods:\n  - {{name: a, namespace: x, node: n1}}\n  - {{name: a, namespace: y, node: n2}}\n\
         policies:\n\
         \x20 - apiVersion: policy.networking.k8s.io/v1alpha2\n\
         \x20   kind: ClusterNetworkPolicy\n\
         \x20   metadata: {{name: egress-by-name}}\n\
         \x20   spec:\n\
         \x20     tier: Admin\n\
         \x20     priority: 10\n\
         \x20     subject: {{namespaces: {{matchLabels: {{ns: x}}}}}}\n\
         \x20     egress:\n\
         \x20       - {{name: dns, action: Accept, to: [{{networks: [198.51.100.2/32]}}], protocols: [{{udp: {{destinationPort: {{number: 53}}}}}}]}}\n\
         \x20       - name: names\n\
         \x20         action: Accept\n\
         \x20         to: [{{domainNames: [api.example.test, short.example.test, \"*.mirror.test\", www.example.test, many.example.test, changing.example.test, v6.example.test, \"*.race.test\"]}}]\n\
         \x20         protocols: [{{tcp: {{destinationPort: {{number: 80}}}}}}]\n\
         \x20       - {{name: rest, action: Deny, to: [{{networks: [198.51.100.0/24, 198.51.104.0/22, \"2001:db8:100::/64\", \"2001:db8:104::/48\"]}}]}}\n\
         {dns}"
    )
}

struct FqdnLab {
    lab: LabDown,
    file: PathBuf,
    lab_dir: PathBuf,
    _dir: TempDir,
}

impl FqdnLab {
    fn in_ns<R: Send>(&self, ns: &str, f: impl FnOnce() -> R + Send) -> R {
        let ns = NetNs::open(&PathBuf::from("/run/netns").join(ns)).unwrap();
        in_netns(&ns, || Ok(f())).unwrap()
    }

    fn in_pod<R: Send>(&self, pod: &str, f: impl FnOnce() -> R + Send) -> R {
        self.in_ns(&self.lab.0.pod_ns(pod), f)
    }
}

/// The addresses of `name` (A, or AAAA), asked of the lab's DNS over UDP from the
/// calling thread's namespace; an error when no answer comes within `wait`.
fn resolve(name: &str, aaaa: bool, wait: Duration) -> std::io::Result<Vec<IpAddr>> {
    let s = UdpSocket::bind("0.0.0.0:0")?;
    s.set_read_timeout(Some(wait))?;
    s.send_to(&query(name, 0x5eed, aaaa), (weft_lab::OUTSIDE_ADDRESS, 53))?;
    let mut buf = [0u8; 4096];
    let n = s.recv(&mut buf)?;
    let a = weft_fqdn::read_response(&buf[..n])
        .map_err(std::io::Error::other)?
        .ok_or_else(|| std::io::Error::other(format!("{name}: no answer")))?;
    Ok(a.addresses.iter().map(|l| l.ip).collect())
}

fn connect(ip: IpAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&SocketAddr::new(ip, 80), Duration::from_millis(700))
}

/// Serves 80/TCP on every address of the outside: each connection is echoed.
fn serve_outside(lab: &FqdnLab, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    // Both families: a v6 socket takes IPv4 too (mapped), as Linux binds by default.
    let listener = lab.in_ns(&lab.lab.0.outside_ns(), || TcpListener::bind("[::]:80").unwrap());
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut c, _)) => {
                    std::thread::spawn(move || {
                        c.set_nonblocking(false).unwrap();
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = c.read(&mut buf) {
                            if n == 0 || c.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    })
}

#[test]
fn names_allow_what_their_answers_gave_and_nothing_else() {
    if !privileged() {
        return;
    }
    let _area = weft_tests::area("cluster::fqdn");
    let dir = TempDir::new("fqdn");
    let name = format!("wt{}fq", std::process::id());
    let (lab, file, lab_dir) = load_lab(dir.path(), &name, &lab_text(&name));
    let lab = FqdnLab {
        lab: LabDown(lab),
        file,
        lab_dir,
        _dir: dir,
    };
    lab.lab.0.up().expect("lab up");
    let stop = Arc::new(AtomicBool::new(false));
    let server = serve_outside(&lab, stop.clone());

    // The policy in place: the outside's addresses are refused until a name allows.
    let deadline = Instant::now() + Duration::from_secs(20);
    while lab.in_pod("x/a", || connect("198.51.100.10".parse().unwrap())).is_ok() {
        assert!(Instant::now() < deadline, "the policy never landed");
        std::thread::sleep(Duration::from_millis(200));
    }
    // y is no subject: it reaches the outside without asking.
    assert!(lab.in_pod("y/a", || connect("198.51.100.30".parse().unwrap())).is_ok());

    // A peer cannot teach the learner: an answer nobody asked for (y/a, from port 53,
    // to x/a, giving api.example.test other.test's address) is not read.
    let xa = lab
        .lab
        .0
        .pod_addresses("x/a")
        .into_iter()
        .find(IpAddr::is_ipv4)
        .expect("x/a's address");
    let forged = weft_fqdn::answer::build::response(
        "api.example.test",
        weft_fqdn::answer::build::ResponseCode::NoError,
        &[weft_fqdn::answer::build::Rec::Addr(
            "api.example.test",
            300,
            "198.51.100.30".parse().unwrap(),
        )],
    );
    lab.in_pod("y/a", || {
        let s = UdpSocket::bind("0.0.0.0:53").unwrap();
        for _ in 0..3 {
            s.send_to(&forged, (xa, 40053)).unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        lab.in_pod("x/a", || connect("198.51.100.30".parse().unwrap())).is_err(),
        "a forged answer opened other.test's address"
    );

    // Exact, wildcard, CNAME: what the answer gave is allowed at once; the rest not.
    let allowed = |name: &str| -> Vec<(IpAddr, bool)> {
        lab.in_pod("x/a", || {
            let ips = resolve(name, false, Duration::from_secs(2)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!ips.is_empty(), "{name} has addresses");
            ips.into_iter().map(|ip| (ip, connect(ip).is_ok())).collect()
        })
    };
    for name in ["api.example.test", "deb.mirror.test", "www.example.test"] {
        let got = allowed(name);
        assert!(got.iter().all(|(_, ok)| *ok), "{name} is allowed: {got:?}");
    }
    assert_eq!(allowed("api.example.test").len(), 2, "both of api's addresses");
    // IPv6: an AAAA answer's addresses go into the rule's IPv6 set; another name's
    // IPv6 address stays refused.
    let v6 = lab.in_pod("x/a", || {
        let ips = resolve("v6.example.test", true, Duration::from_secs(2)).expect("an AAAA answer");
        ips.into_iter().map(|ip| (ip, connect(ip).is_ok())).collect::<Vec<_>>()
    });
    assert_eq!(v6.len(), 2, "{v6:?}");
    assert!(v6.iter().all(|(ip, ok)| ip.is_ipv6() && *ok), "AAAA allowed: {v6:?}");
    let other6 = lab.in_pod("x/a", || {
        let ips = resolve("other6.test", true, Duration::from_secs(2)).expect("an AAAA answer");
        ips.into_iter().map(|ip| (ip, connect(ip).is_ok())).collect::<Vec<_>>()
    });
    assert!(
        other6.len() == 1 && !other6[0].1,
        "a name no rule takes stays refused over IPv6: {other6:?}"
    );
    let reached_v4 = allowed("v6.example.test");
    assert!(reached_v4.iter().all(|(_, ok)| *ok), "and its A answer: {reached_v4:?}");
    // Seen: the node lists what it learnt, and explain names the answer.
    let weftctl = |args: &[&str]| -> String {
        let out = std::process::Command::new(weft_tests::bin("weftctl"))
            .env("WEFT_LAB_DIR", &lab.lab_dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "weftctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let file = lab.file.to_str().unwrap();
    let names = weftctl(&["--json", "policy", "names", "--lab", file]);
    let learnt: Vec<serde_json::Value> = names.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(
        learnt.iter().any(|v| v["node"] == "n1"
            && v["name"] == "api.example.test"
            && v["address"] == "198.51.100.10"
            && v["ttl_left_s"].as_i64().is_some_and(|t| t > 200)),
        "{names}"
    );
    assert!(
        learnt.iter().all(|v| v["node"] == "n1"),
        "only x/a's node learnt: {names}"
    );
    let why = weftctl(&["policy", "explain", "x/a", "198.51.100.10", "80/tcp", "--lab", file]);
    assert!(
        why.contains("ALLOWED") && why.contains("rule 1 (names), as the answer for api.example.test gave the address"),
        "{why}"
    );
    // Its flows name the domain too.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = weftctl(&["flows", "--lab", file, "--from", "x/a", "--port", "80", "-o", "json"]);
        let named = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|f| {
                f["dst"]["ip"] == "198.51.100.10"
                    && f["policies"].as_array().is_some_and(|p| {
                        p.iter()
                            .any(|h| h["domain"] == "api.example.test" && h["name"] == "egress-by-name")
                    })
            });
        if named {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no flow to api.example.test names its domain: {text}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    for name in ["other.test", "mirror.test"] {
        let got = allowed(name);
        assert!(
            got.iter().all(|(_, ok)| !ok),
            "{name} is not taken by any rule: {got:?}"
        );
    }
    // 120 addresses for one name, every one allowed.
    let many = allowed("many.example.test");
    assert_eq!(many.len(), 120);
    assert!(
        many.iter().all(|(_, ok)| *ok),
        "{:?}",
        many.iter().filter(|(_, ok)| !ok).collect::<Vec<_>>()
    );

    // The race: a name never seen, resolved and connected to with no delay, 1,000
    // times: the address is in the set before the answer reaches the pod.
    let refused: Vec<String> = lab.in_pod("x/a", || {
        (0..RACE)
            .filter_map(|i| {
                let name = format!("r{i}.race.test");
                let ip = resolve(&name, false, Duration::from_secs(2)).ok()?.first().copied()?;
                connect(ip).err().map(|e| format!("{name} {ip}: {e}"))
            })
            .collect()
    });
    assert!(
        refused.is_empty(),
        "{} of {RACE} refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );
    let held = weft_tests::series_value(
        &weft_tests::node_metrics(&lab.lab.0, "n1"),
        "weft_policy_dns_held_total",
    );
    println!(
        "race: {RACE} names resolved and connected at once, none refused ({held} connections held for the learner)"
    );

    // The hold, shown: with the learner stopped (SIGSTOP), a new name's answer still
    // arrives at once, and the connection opened on it waits until the learner goes on
    // (SIGCONT 300 ms later), then passes: released only after the answer is learnt.
    let pid = nix::unistd::Pid::from_raw(lab.lab.0.daemon_pid("n1").expect("n1's weftd") as i32);
    struct Resume(nix::unistd::Pid);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let resume = Resume(pid);
    let (answered, connected) = lab.in_pod("x/a", || {
        let t = Instant::now();
        let ip = resolve("held.race.test", false, Duration::from_secs(2)).expect("answered with weftd stopped")[0];
        let answered = t.elapsed();
        let resumer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(resume);
        });
        let t = Instant::now();
        let c = TcpStream::connect_timeout(&SocketAddr::new(ip, 80), Duration::from_secs(3));
        resumer.join().unwrap();
        (answered, c.map(|_| t.elapsed()))
    });
    let connected = connected.expect("released once the learner read the answer");
    println!(
        "held: answer in {answered:?} with the learner stopped, connection in {connected:?} (learner resumed at 300 ms)"
    );
    assert!(answered < Duration::from_millis(250), "the answer waited: {answered:?}");
    assert!(
        connected >= Duration::from_millis(200),
        "the connection was not held: {connected:?}"
    );
    assert!(
        connected < Duration::from_millis(900),
        "the held SYN was lost (the client's retransmission, a second later, passed): {connected:?}"
    );

    // TTL expiry (1 s, held 2 s by --policy-dns-min-ttl): a connection opened in time
    // stays open; a new one after is refused.
    let short: IpAddr = "198.51.100.12".parse().unwrap();
    let mut open = lab.in_pod("x/a", || {
        resolve("short.example.test", false, Duration::from_secs(2)).unwrap();
        connect(short).expect("allowed within its TTL")
    });
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        lab.in_pod("x/a", || connect(short)).is_err(),
        "expired: new connections refused"
    );
    open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    open.write_all(b"still here").unwrap();
    let mut buf = [0u8; 10];
    open.read_exact(&mut buf).expect("the open connection is left alone");
    assert_eq!(&buf, b"still here");

    // An answer that changes: the new address is allowed once answered.
    let mut changed = lab.lab.0.clone();
    changed
        .spec
        .dns
        .iter_mut()
        .find(|r| r.name == "changing.example.test")
        .unwrap()
        .addresses = vec!["198.51.100.51".parse().unwrap()];
    assert!(
        allowed("changing.example.test")
            .iter()
            .all(|(ip, ok)| *ok && ip.to_string() == "198.51.100.50")
    );
    changed.dns_restart().unwrap();
    let now = allowed("changing.example.test");
    assert_eq!(now.len(), 1);
    assert_eq!((now[0].0.to_string().as_str(), now[0].1), ("198.51.100.51", true));

    // weftd SIGKILLed on x/a's node while x/a resolves in a loop: DNS answers on (only
    // the learning waits), the longest gap is measured; what was learnt stays allowed;
    // nothing else opens.
    let looping = Arc::new(AtomicBool::new(true));
    let ns = lab.lab.0.pod_ns("x/a");
    let go = looping.clone();
    let resolver = std::thread::spawn(move || {
        let ns = NetNs::open(&PathBuf::from("/run/netns").join(ns)).unwrap();
        in_netns(&ns, || {
            let (mut longest, mut since_ok) = (Duration::ZERO, Instant::now());
            let mut answered = 0u32;
            while go.load(Ordering::Relaxed) {
                if resolve("deb.mirror.test", false, Duration::from_millis(200)).is_ok() {
                    longest = longest.max(since_ok.elapsed());
                    since_ok = Instant::now();
                    answered += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok((longest.max(since_ok.elapsed()), answered))
        })
        .unwrap()
    });
    std::thread::sleep(Duration::from_millis(500));
    lab.lab.0.crash("n1").unwrap();
    assert!(
        lab.in_pod("x/a", || connect("198.51.100.10".parse().unwrap())).is_ok(),
        "learnt before: allowed with weftd down"
    );
    assert!(lab.in_pod("x/a", || connect("198.51.100.30".parse().unwrap())).is_err());
    lab.lab.0.up().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    looping.store(false, Ordering::Relaxed);
    let (gap, answered) = resolver.join().unwrap();
    println!("DNS through a weftd SIGKILL and restart: longest gap between answers {gap:?} ({answered} answered)");
    assert!(
        gap < Duration::from_secs(1),
        "DNS stopped for {gap:?} while weftd was down"
    );
    assert!(
        lab.in_pod("x/a", || connect("198.51.100.10".parse().unwrap())).is_ok(),
        "learnt before the restart: allowed after it"
    );
    assert!(lab.in_pod("x/a", || connect("198.51.100.30".parse().unwrap())).is_err());
    // It knows what its predecessor learnt (the kernel's elements name it).
    let names = weftctl(&["--json", "policy", "names", "--lab", file]);
    assert!(
        names
            .lines()
            .any(|l| l.contains("\"name\":\"api.example.test\"") && l.contains("198.51.100.10")),
        "read back after the restart: {names}"
    );
    // The restarted weftd learns again: a name first asked now.
    assert!(lab.in_pod("x/a", || connect("198.51.100.60".parse().unwrap())).is_err());
    let got = allowed("after.race.test");
    assert!(got.iter().all(|(_, ok)| *ok), "{got:?}");

    // A Deny rule with domainNames is refused, as the API refuses it.
    let bad = lab.file.with_file_name("deny-by-name.yaml");
    std::fs::write(
        &bad,
        "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: deny-by-name}\n\
         spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, egress: [{action: Deny, to: [{domainNames: [other.test]}]}]}\n",
    )
    .unwrap();
    let out = std::process::Command::new(weft_tests::bin("weftctl"))
        .env("WEFT_LAB_DIR", &lab.lab_dir)
        .args(["lab", "apply", lab.file.to_str().unwrap(), bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("only in Accept rules"), "{err}");

    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

/// The example lab (`examples/lab-dns.yaml`) reaches by name what its file says
/// (`examples/lab-dns.expect`, as `weftctl lab names` prints it).
#[test]
fn the_dns_example_reaches_the_names_it_says() {
    if !privileged() {
        return;
    }
    let _area = weft_tests::area("cluster::fqdn");
    let dir = TempDir::new("fqdnex");
    let name = format!("wt{}fe", std::process::id());
    let text = include_str!("../../../examples/lab-dns.yaml").replace("name: wd", &format!("name: {name}"));
    let (lab, file, lab_dir) = load_lab(dir.path(), &name, &text);
    let lab = LabDown(lab);
    lab.0.up().expect("lab up");
    // Until the policy is in place on both nodes: other.test blocked from x.
    let deadline = Instant::now() + Duration::from_secs(20);
    let table = loop {
        let out = std::process::Command::new(weft_tests::bin("weftctl"))
            .env("WEFT_LAB_DIR", &lab_dir)
            .args(["lab", "names", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let table = String::from_utf8(out.stdout).unwrap();
        if table == include_str!("../../../examples/lab-dns.expect") || Instant::now() > deadline {
            break table;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(table, include_str!("../../../examples/lab-dns.expect"));
}
