//! Link capture end to end in a two-node lab with one link of each kind (veth on n1,
//! VXLAN and gRPC from n1 to n2): `weftctl capture --lab FILE POD INTF -w F` while the
//! link carries pings, then Debian's `tcpdump -r` reads the pcapng and finds the ICMP
//! echo requests and replies between the link's two addresses, and the file's
//! direction flags say which way each went. The VXLAN and gRPC captures are taken at
//! the far pod, on n2 (found through the lab, and named with `--node`). Also: standard
//! output piped into `tcpdump -r -`, two captures of one link at once, the time bound
//! and Ctrl-C (each leaving a file tcpdump reads), no capture socket left in the pod
//! once a capture ends or its client is killed, and clear errors for an unknown pod,
//! interface or node.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_tests::{LabDown, TempDir, bin, privileged};

/// (pod, interface, its address, the far pod, its interface, its address, the kind).
type LinkRow = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const LINKS: [LinkRow; 3] = [
    ("a1", "e1", "10.78.1.1", "b1", "e1", "10.78.1.2", "veth"),
    ("a1", "e2", "10.78.2.1", "c2", "e2", "10.78.2.2", "vxlan"),
    ("b1", "e3", "10.78.3.1", "d2", "e3", "10.78.3.2", "grpc"),
];

fn lab_file(name: &str) -> String {
    weft_tests::kinds_lab_file(name, "cap", "10.78", &|_, _| String::new())
}

/// The lab of the test, its file, and where `weftctl --lab` finds its state.
struct Cap {
    lab: LabDown,
    file: PathBuf,
    lab_dir: PathBuf,
    dir: PathBuf,
}

/// A running `weftctl capture`, its standard error collected as it comes.
struct Capture {
    child: Child,
    stderr: Arc<Mutex<String>>,
    what: String,
}

impl Capture {
    /// Waits (bounded) until the daemon holds the capture open (weftctl says so).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.stderr.lock().unwrap().contains("capturing") {
            assert!(
                Instant::now() < deadline,
                "{}: never started: {}",
                self.what,
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) for weftctl to end by itself: its status and standard error.
    fn finish(mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader thread drains what is left.
                std::thread::sleep(Duration::from_millis(50));
                return (status, self.stderr.lock().unwrap().clone());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{}: did not end: {}", self.what, self.stderr.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a pcapng file holds of ICMP echoes between two addresses.
#[derive(Debug, Default)]
struct Echoes {
    /// tcpdump's lines of echo requests from the first address to the second.
    requests: usize,
    /// tcpdump's lines of echo replies from the second address to the first.
    replies: usize,
}

impl Cap {
    fn weftctl(&self) -> Command {
        let mut c = Command::new(bin("weftctl"));
        c.env("WEFT_LAB_DIR", &self.lab_dir);
        c
    }

    /// Starts `weftctl capture ARGS --lab FILE`, its standard output to `stdout`.
    fn capture(&self, args: &[&str], stdout: Stdio) -> Capture {
        let mut child = self
            .weftctl()
            .arg("capture")
            .args(args)
            .arg("--lab")
            .arg(&self.file)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Capture {
            child,
            stderr,
            what: format!("capture {args:?}"),
        }
    }

    /// `weftctl capture ARGS --lab FILE`, which must fail: its standard error.
    fn capture_fails(&self, args: &[&str]) -> String {
        let out = self
            .weftctl()
            .arg("capture")
            .args(args)
            .arg("--lab")
            .arg(&self.file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "capture {args:?} succeeded: {err}");
        err
    }

    fn in_pod(&self, pod: &str, argv: &[&str]) -> std::process::Output {
        weft_tests::in_lab_pod(&self.lab.0, pod, argv)
    }

    /// `count` echoes from `pod` to `addr`, 50 ms apart; how many were answered.
    fn ping(&self, pod: &str, addr: &str, count: u32) -> usize {
        let out = self.in_pod(
            pod,
            &["ping", "-n", "-c", &count.to_string(), "-i", "0.05", "-W", "1", addr],
        );
        String::from_utf8_lossy(&out.stdout).matches("time=").count()
    }

    fn wait_reachable(&self, pod: &str, addr: &str) {
        weft_tests::wait_lab_reachable(&self.lab.0, pod, addr);
    }

    /// Packet sockets open in `pod`'s namespace (a capture's socket lives there).
    fn packet_sockets(&self, pod: &str) -> usize {
        let out = self.in_pod(pod, &["cat", "/proc/net/packet"]);
        String::from_utf8_lossy(&out.stdout).lines().skip(1).count()
    }

    /// Waits (bounded) until `pod` has `n` packet sockets.
    fn wait_packet_sockets(&self, pod: &str, n: usize, why: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.packet_sockets(pod) != n {
            assert!(
                Instant::now() < deadline,
                "{pod}: {} packet sockets, not {n} ({why})",
                self.packet_sockets(pod)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Counts, in what `tcpdump` listed, the echoes from `from` to `to` and the replies.
fn echoes(tcpdump_lines: &str, from: &str, to: &str) -> Echoes {
    let lines: Vec<&str> = tcpdump_lines.lines().filter(|l| l.contains(" IP")).collect();
    Echoes {
        requests: lines
            .iter()
            .filter(|l| l.contains(&format!("IP {from} > {to}: ICMP echo request")))
            .count(),
        replies: lines
            .iter()
            .filter(|l| l.contains(&format!("IP {to} > {from}: ICMP echo reply")))
            .count(),
    }
}

/// `tcpdump -nn -r FILE [filter]`, which must read the file: what it lists.
fn tcpdump(file: &Path, filter: &[&str]) -> String {
    let out = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(file)
        .args(filter)
        .output()
        .expect("tcpdump (Debian package tcpdump) runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "tcpdump -r {}: {}{text}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The direction flags (pcapng `epb_flags`: 1 in, 2 out) of the ICMP echoes in `file`,
/// as (requests out, requests in, replies out, replies in).
fn directions(file: &Path) -> (usize, usize, usize, usize) {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
    use pcap_file::pcapng::{Block, PcapNgReader};
    let mut r = PcapNgReader::new(std::fs::File::open(file).unwrap()).unwrap();
    let mut counts = (0, 0, 0, 0);
    while let Some(block) = r.next_block() {
        let Block::EnhancedPacket(p) = block.unwrap() else {
            continue;
        };
        let d = &p.data;
        // Ethernet, IPv4, ICMP: the type past the IP header.
        if d.len() < 35 || d[12..14] != [0x08, 0x00] || d[23] != 1 {
            continue;
        }
        let icmp_type = d[14 + usize::from(d[14] & 0x0f) * 4];
        let out = p.options.contains(&EnhancedPacketOption::Flags(2));
        let inb = p.options.contains(&EnhancedPacketOption::Flags(1));
        match (icmp_type, out, inb) {
            (8, true, false) => counts.0 += 1,
            (8, false, true) => counts.1 += 1,
            (0, true, false) => counts.2 += 1,
            (0, false, true) => counts.3 += 1,
            other => panic!("an echo without one direction: {other:?}"),
        }
    }
    counts
}

fn up(dir: &TempDir) -> Cap {
    let name = format!("wt{}cap", std::process::id());
    let (lab, file, lab_dir) = weft_tests::load_lab(dir.path(), &name, &lab_file(&name));
    let cap = Cap {
        lab: LabDown(lab),
        file,
        lab_dir,
        dir: dir.path().to_path_buf(),
    };
    cap.lab.0.up().expect("lab up");
    for (pod, _, _, _, _, far, _) in LINKS {
        cap.wait_reachable(pod, far);
    }
    cap
}

#[test]
fn captures_of_every_link_kind_read_back_in_tcpdump() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("capture");
    let cap = up(&dir);
    // Nothing captures yet: no packet socket in any pod (a gRPC end's own socket is
    // in its node's namespace).
    for pod in ["a1", "b1", "c2", "d2"] {
        assert_eq!(cap.packet_sockets(pod), 0, "{pod} before any capture");
    }

    // One capture per kind, at the near pod (veth) or the far one, on n2 (VXLAN by the
    // lab's word, gRPC with --node), 20 frames while 20 echoes cross.
    for (pod, _, addr, far_pod, far_intf, far, kind) in LINKS {
        let (at, at_intf, node) = match kind {
            "veth" => (pod, "e1", None),
            "vxlan" => (far_pod, far_intf, None),
            _ => (far_pod, far_intf, Some("n2")),
        };
        let f = cap.file(&format!("{kind}.pcapng"));
        let f_arg = f.to_str().unwrap();
        let mut args = vec![at, at_intf, "-w", f_arg, "--count", "20", "--duration", "10s"];
        if let Some(n) = node {
            args.extend(["--node", n]);
        }
        let c = cap.capture(&args, Stdio::null());
        c.wait_ready();
        assert_eq!(cap.packet_sockets(at), 1, "{kind}: the capture's socket in {at}");
        let answered = cap.ping(pod, far, 20);
        let (status, err) = c.finish();
        assert!(status.success(), "{kind}: {err}");
        assert!(err.contains("20 frames"), "{kind}: {err}");
        let all = tcpdump(&f, &[]);
        let e = echoes(&tcpdump(&f, &["icmp"]), addr, far);
        eprintln!(
            "{kind} (captured at {at}:{at_intf}): {} frames, {} echo requests {addr} > {far}, {} replies; {answered} of 20 pings answered",
            all.lines().count(),
            e.requests,
            e.replies
        );
        for other in all.lines().filter(|l| !l.contains("ICMP echo")) {
            eprintln!("  {kind}, not an echo: {other}");
        }
        assert_eq!(all.lines().count(), 20, "{kind}: {all}");
        assert!(e.requests >= 5 && e.replies >= 5, "{kind}: {e:?}: {all}");
        // Directions as the capturing pod sees them: the pinging pod sends requests, the
        // far pod sends replies.
        let (req_out, req_in, rep_out, rep_in) = directions(&f);
        if at == pod {
            assert_eq!((req_in, rep_out), (0, 0), "{kind}");
            assert!(req_out >= 5 && rep_in >= 5, "{kind}: {:?}", directions(&f));
        } else {
            assert_eq!((req_out, rep_in), (0, 0), "{kind}");
            assert!(req_in >= 5 && rep_out >= 5, "{kind}: {:?}", directions(&f));
        }
        cap.wait_packet_sockets(at, 0, "the capture ended");
    }

    // Standard output, piped into tcpdump as a live reader.
    let mut c = cap.capture(&["a1", "e1", "--count", "10", "--duration", "10s"], Stdio::piped());
    let pipe = c.child.stdout.take().unwrap();
    let reader = Command::new("tcpdump")
        .args(["-nn", "-r", "-", "icmp"])
        .stdin(pipe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.wait_ready();
    cap.ping("a1", "10.78.1.2", 10);
    let (status, err) = c.finish();
    assert!(status.success(), "stdout capture: {err}");
    let out = reader.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tcpdump -r -: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = echoes(&text, "10.78.1.1", "10.78.1.2");
    eprintln!(
        "stdout | tcpdump -r -: {} echo requests, {} replies",
        e.requests, e.replies
    );
    assert!(e.requests >= 2 && e.replies >= 2, "{e:?}: {text}");

    // Two captures of one link at once (the gRPC end at b1, on n1) both see the echoes.
    let files = [cap.file("both-1.pcapng"), cap.file("both-2.pcapng")];
    let both: Vec<Capture> = files
        .iter()
        .map(|f| {
            cap.capture(
                &[
                    "b1",
                    "e3",
                    "-w",
                    f.to_str().unwrap(),
                    "--count",
                    "20",
                    "--duration",
                    "10s",
                ],
                Stdio::null(),
            )
        })
        .collect();
    for c in &both {
        c.wait_ready();
    }
    assert_eq!(cap.packet_sockets("b1"), 2, "a socket per capture");
    cap.ping("b1", "10.78.3.2", 20);
    for (c, f) in both.into_iter().zip(&files) {
        let (status, err) = c.finish();
        assert!(status.success(), "{err}");
        let e = echoes(&tcpdump(f, &["icmp"]), "10.78.3.1", "10.78.3.2");
        eprintln!(
            "concurrent capture {}: {} echo requests, {} replies",
            f.display(),
            e.requests,
            e.replies
        );
        assert!(e.requests >= 5 && e.replies >= 5, "{}: {e:?}", f.display());
    }
    cap.wait_packet_sockets("b1", 0, "both captures ended");

    // Time ends a capture of an idle link; Ctrl-C ends one early; both leave a whole
    // file.
    let idle = cap.file("idle.pcapng");
    let start = Instant::now();
    let c = cap.capture(
        &["c2", "e2", "-w", idle.to_str().unwrap(), "--duration", "1s"],
        Stdio::null(),
    );
    let (status, err) = c.finish();
    assert!(status.success(), "{err}");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(8), "a 1 s capture took {took:?}");
    tcpdump(&idle, &[]);
    let interrupted = cap.file("interrupted.pcapng");
    let c = cap.capture(
        &["d2", "e3", "-w", interrupted.to_str().unwrap(), "--duration", "60s"],
        Stdio::null(),
    );
    c.wait_ready();
    cap.ping("b1", "10.78.3.2", 3);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let (status, err) = c.finish();
    assert!(status.success() && err.contains("interrupted"), "{err}");
    let e = echoes(&tcpdump(&interrupted, &["icmp"]), "10.78.3.1", "10.78.3.2");
    assert!(e.requests >= 1 && e.replies >= 1, "{e:?}");
    cap.wait_packet_sockets("d2", 0, "the interrupted capture ended");

    // A client killed outright: the daemon closes its socket all the same.
    let mut c = cap.capture(
        &["a1", "e2", "-w", cap.file("killed.pcapng").to_str().unwrap()],
        Stdio::null(),
    );
    c.wait_ready();
    assert_eq!(cap.packet_sockets("a1"), 1);
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    cap.wait_packet_sockets("a1", 0, "the client was killed");

    // Unknown pod, interface or node: a clear error, non-zero exit.
    let err = cap.capture_fails(&["nosuch", "e1", "-w", cap.file("x.pcapng").to_str().unwrap()]);
    assert!(err.contains("pod nosuch is not in lab"), "{err}");
    let err = cap.capture_fails(&["a1", "e9", "-w", cap.file("x.pcapng").to_str().unwrap()]);
    assert!(
        err.contains("cannot capture a1:e9") && err.contains("no wire end a1:e9"),
        "{err}"
    );
    let err = cap.capture_fails(&["a1", "e1", "--node", "n9"]);
    assert!(err.contains("node n9 is not in lab"), "{err}");

    cap.lab.0.down().unwrap();
}
