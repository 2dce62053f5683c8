//! Link emulation end to end in a two-node lab with one link of each kind (veth on n1,
//! VXLAN and gRPC from n1 to n2), each delayed 20 ms by its Topology: the delay shows in
//! the ping round trip (both directions), a run-time loss of 10% in a counted ping run,
//! a run-time rate of 50 mbit in iperf3; a reset restores the topology's delay; a run-time
//! setting survives both daemons being killed and restarted. Then each link is taken
//! down by intent (`weftctl link down`): the far pod's interface has no carrier within
//! 1 s, traffic stops, `lab check` reports the link down by intent rather than failed, a
//! restart of both daemons keeps it down, and `link up` restores traffic.
//!
//! The bands measure netem's emulated delay, loss and rate, not weft's speed: a 20 ms
//! delay each way is a 40 ms round trip (median within 35–60 ms); 10% loss each way
//! loses 19% of echo round trips (a 200-echo run within 8–32%, beyond four standard
//! deviations either side); 50 mbit gives iperf3 less than 80 Mbit/s. Every kind is
//! measured on any kernel: the gRPC link is impaired in weftd's worker; veth and VXLAN
//! ends by netem where the kernel has it, else through a link detour into weftd (a
//! rate alone by a token bucket), and the test checks which of the two is in place.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use weft_link::model::Distribution;
use weft_tests::{LabDown, TempDir, bin, privileged};

/// (pod, interface, its address, the far pod, its interface, its address, the kind).
const LINKS: [(&str, &str, &str, &str, &str, &str, &str); 3] = [
    ("a1", "e1", "10.77.1.1", "b1", "e1", "10.77.1.2", "veth"),
    ("a1", "e2", "10.77.2.1", "c2", "e2", "10.77.2.2", "vxlan"),
    ("b1", "e3", "10.77.3.1", "d2", "e3", "10.77.3.2", "grpc"),
];

/// The lab file: the veth link's delay on a1's entry only, the VXLAN link's on the far
/// pod's entry only, the gRPC link's on both (either entry gives both directions).
fn lab_file(name: &str) -> String {
    weft_tests::kinds_lab_file(name, "emu", "10.77", &|pod, uid| match (pod, uid) {
        ("a1", 1) | ("c2", 2) | ("b1", 3) | ("d2", 3) => ", delay: 20ms".to_string(),
        _ => String::new(),
    })
}

/// The lab of one test, its file, and where `weftctl --lab` finds its state.
struct Emu {
    lab: LabDown,
    file: PathBuf,
    lab_dir: PathBuf,
}

impl Emu {
    fn in_pod(&self, pod: &str, argv: &[&str]) -> Output {
        weft_tests::in_lab_pod(&self.lab.0, pod, argv)
    }

    /// `weftctl ARGS --lab FILE`, which must succeed; its standard output.
    fn weftctl(&self, args: &[&str]) -> String {
        let out = Command::new(bin("weftctl"))
            .env("WEFT_LAB_DIR", &self.lab_dir)
            .args(args)
            .arg("--lab")
            .arg(&self.file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "weftctl {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Round trips of `count` echoes from `pod` to `addr`, `interval` apart: (the
    /// answered ones' times in ms, how many were sent).
    fn ping(&self, pod: &str, addr: &str, count: u32, interval: &str) -> (Vec<f64>, u32) {
        let out = self.in_pod(
            pod,
            &["ping", "-n", "-c", &count.to_string(), "-i", interval, "-W", "1", addr],
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let times = text
            .lines()
            .filter_map(|l| l.split("time=").nth(1))
            .filter_map(|t| t.split_whitespace().next()?.parse().ok())
            .collect();
        (times, count)
    }

    fn median_rtt(&self, pod: &str, addr: &str) -> f64 {
        let (mut t, n) = self.ping(pod, addr, 20, "0.05");
        assert!(t.len() as u32 >= n / 2, "{pod} -> {addr}: {} of {n} answered", t.len());
        t.sort_by(|a, b| a.total_cmp(b));
        t[t.len() / 2]
    }

    /// Waits (bounded) until `pod` reaches `addr`.
    fn wait_reachable(&self, pod: &str, addr: &str) {
        weft_tests::wait_lab_reachable(&self.lab.0, pod, addr);
    }

    /// The flags of `pod`'s interface `intf` (`UP`, `NO-CARRIER`, …).
    fn flags(&self, pod: &str, intf: &str) -> Vec<String> {
        let out = self.in_pod(pod, &["ip", "-j", "link", "show", "dev", intf]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v[0]["flags"]
            .as_array()
            .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }

    fn qdisc(&self, pod: &str, intf: &str) -> String {
        String::from_utf8_lossy(&self.in_pod(pod, &["tc", "qdisc", "show", "dev", intf]).stdout).to_string()
    }

    /// Whether what `pod` sends on `intf` is steered through a link detour (weft's tc
    /// program on its egress).
    fn detoured(&self, pod: &str, intf: &str) -> bool {
        let filters = self.in_pod(pod, &["tc", "filter", "show", "dev", intf, "egress"]);
        String::from_utf8_lossy(&filters.stdout).contains("weft_steer")
    }

    /// How many link detours' interfaces `pod` has.
    fn detours_in(&self, pod: &str) -> usize {
        let links = self.in_pod(pod, &["ip", "-o", "link", "show"]);
        String::from_utf8_lossy(&links.stdout).matches(": wd").count()
    }

    /// Asserts how `pod`'s end `intf` is emulated: by netem showing `netem_shows`, or,
    /// without netem, through a link detour and no qdisc of weft's.
    fn assert_emulated(&self, netem: bool, pod: &str, intf: &str, netem_shows: &[&str]) {
        let q = self.qdisc(pod, intf);
        if netem {
            assert!(netem_shows.iter().all(|w| q.contains(w)), "{pod}:{intf}: {q}");
            assert!(!self.detoured(pod, intf), "{pod}:{intf}: netem and a detour");
        } else {
            assert!(!q.contains("netem") && !q.contains("tbf"), "{pod}:{intf}: {q}");
            assert!(self.detoured(pod, intf), "{pod}:{intf}: no link detour");
        }
    }

    /// Kills both daemons and lets `lab up` start them again.
    fn restart_daemons(&self) {
        for n in ["n1", "n2"] {
            self.lab.0.crash(n).expect("crash");
        }
        self.lab.0.up().expect("lab up after the crash");
        // The first pass after a start re-applies what the store holds.
        std::thread::sleep(Duration::from_secs(1));
    }

    /// iperf3 from `pod` to `server_pod` at `addr` for 3 s: the receiver's bits/s.
    fn iperf(&self, pod: &str, server_pod: &str, addr: &str) -> f64 {
        let log = self.lab_dir.join(format!("iperf3-{server_pod}.log"));
        let mut server: Child = Command::new("ip")
            .args(["netns", "exec", &self.lab.0.pod_ns(server_pod)])
            .args(["iperf3", "-s", "-B", addr, "--forceflush"])
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Listening once the server says so (bounded).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("listening") {
            assert!(Instant::now() < deadline, "iperf3 server in {server_pod} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = self.in_pod(pod, &["iperf3", "-c", addr, "-t", "3", "-J"]);
        if !out.status.success() {
            out = self.in_pod(pod, &["iperf3", "-c", addr, "-t", "3", "-J"]);
        }
        let _ = server.kill();
        let _ = server.wait();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("iperf3 {pod} -> {addr}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        v["end"]["sum_received"]["bits_per_second"].as_f64().unwrap_or_else(|| {
            panic!(
                "iperf3 {pod} -> {addr}: {v}; server: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })
    }
}

fn up(tag: &str, dir: &TempDir) -> Emu {
    up_with(tag, dir, "")
}

/// [`up`], with `more` (top-level keys) added to the lab file.
fn up_with(tag: &str, dir: &TempDir, more: &str) -> Emu {
    let name = format!("wt{}{tag}", std::process::id());
    let text = format!("{}{more}", lab_file(&name));
    let (lab, file, lab_dir) = weft_tests::load_lab(dir.path(), &name, &text);
    let emu = Emu {
        lab: LabDown(lab),
        file,
        lab_dir,
    };
    emu.lab.0.up().expect("lab up");
    for (pod, _, _, _, _, far, _) in LINKS {
        emu.wait_reachable(pod, far);
    }
    emu
}

fn assert_band(what: &str, v: f64, lo: f64, hi: f64) {
    assert!((lo..=hi).contains(&v), "{what}: {v:.2} outside {lo}..{hi}");
    eprintln!("{what}: {v:.2} (band {lo}..{hi})");
}

/// Whether the kernel has netem (distribution kernels do, as module `sch_netem`; some
/// CI and microVM kernels are built without it), tried on `pod`'s loopback.
fn netem_available(emu: &Emu, pod: &str) -> bool {
    let ok = emu
        .in_pod(
            pod,
            &["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        )
        .status
        .success();
    if ok {
        emu.in_pod(pod, &["tc", "qdisc", "del", "dev", "lo", "root"]);
    }
    ok
}

#[test]
fn impairments_from_the_topology_and_at_run_time_on_every_kind() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("impair");
    let emu = up("imp", &dir);
    // gRPC ends are impaired by weftd's worker on any kernel; veth and VXLAN ends by
    // netem, which this kernel may lack: then through a link detour into weftd.
    let netem = netem_available(&emu, "a1");
    if !netem {
        eprintln!(
            "this kernel has no netem (CONFIG_NET_SCH_NETEM): veth and VXLAN ends are emulated through link detours"
        );
    }

    // The topology's 20 ms each way, on every kind, whichever entry carries it.
    let show = emu.weftctl(&["link", "show"]);
    assert!(!show.contains("NOT IN FORCE"), "{show}");
    for (pod, intf, _, far_pod, far_intf, far, kind) in LINKS {
        assert_band(
            &format!("{kind} RTT (topology delay 20ms), ms"),
            emu.median_rtt(pod, far),
            35.0,
            60.0,
        );
        if kind != "grpc" {
            for (p, i) in [(pod, intf), (far_pod, far_intf)] {
                emu.assert_emulated(netem, p, i, &["netem", "delay 20ms"]);
            }
        }
    }
    assert!(show.contains("delay 20ms") && show.contains("topology"), "{show}");

    // Run time: 10% loss replaces the delay, in both directions.
    for (pod, intf, _, far_pod, far_intf, far, kind) in LINKS {
        let out = emu.weftctl(&["link", "set", pod, intf, "--loss", "10%"]);
        assert!(
            out.contains("loss 10%") && out.contains("overrides the topology's: delay 20ms"),
            "{out}"
        );
        if kind != "grpc" {
            emu.assert_emulated(netem, far_pod, far_intf, &["loss 10%"]);
            assert!(!emu.qdisc(far_pod, far_intf).contains("delay"));
        }
        let (answered, sent) = emu.ping(pod, far, 200, "0.01");
        let lost = 100.0 * f64::from(sent - answered.len() as u32) / f64::from(sent);
        assert_band(&format!("{kind} echo loss (10% each way), %"), lost, 8.0, 32.0);
    }

    // A rate limit shows in iperf3 (on a kernel without netem, veth and VXLAN ends
    // hold a rate alone with a token bucket, and their detours go).
    for (pod, intf, _, far_pod, far_intf, far, kind) in LINKS {
        emu.weftctl(&["link", "set", pod, intf, "--rate", "50mbit"]);
        if kind != "grpc" {
            for (p, i) in [(pod, intf), (far_pod, far_intf)] {
                let q = emu.qdisc(p, i);
                assert!(q.contains(if netem { "netem" } else { "tbf" }), "{p}:{i}: {q}");
                assert!(!emu.detoured(p, i), "{p}:{i}: a rate alone needs no detour");
            }
        }
        let bps = emu.iperf(pod, far_pod, far);
        assert_band(&format!("{kind} iperf3 at 50mbit, Mbit/s"), bps / 1e6, 5.0, 80.0);
    }
    // The detours that went took their interfaces with them.
    for pod in ["a1", "b1", "c2"] {
        assert_eq!(emu.detours_in(pod), 0, "{pod}");
    }

    // A reset brings back the topology's delay.
    for (pod, intf, _, _, _, far, kind) in LINKS {
        let out = emu.weftctl(&["link", "reset", pod, intf]);
        assert!(out.contains("delay 20ms") && out.contains("the topology's"), "{out}");
        assert_band(
            &format!("{kind} RTT after reset, ms"),
            emu.median_rtt(pod, far),
            35.0,
            60.0,
        );
    }

    // A run-time setting survives both daemons being killed and started again.
    for (pod, intf, ..) in LINKS {
        emu.weftctl(&["link", "set", pod, intf, "--delay", "40ms", "--jitter", "1ms"]);
    }
    emu.restart_daemons();
    for (pod, intf, _, far_pod, far_intf, far, kind) in LINKS {
        if kind != "grpc" {
            for (p, i) in [(pod, intf), (far_pod, far_intf)] {
                emu.assert_emulated(netem, p, i, &["delay 40ms", "1ms"]);
            }
        }
        assert_band(
            &format!("{kind} RTT after restart (40ms±1ms), ms"),
            emu.median_rtt(pod, far),
            75.0,
            100.0,
        );
    }
    // Every end shows its run-time setting over the topology's.
    let show = emu.weftctl(&["link", "show"]);
    assert_eq!(show.matches("run time (topology: delay 20ms)").count(), 6, "{show}");

    emu.lab.0.down().unwrap();
}

#[test]
fn links_down_by_intent_lose_carrier_at_both_ends_and_stay_down_across_restarts() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("linkstate");
    let emu = up("lst", &dir);

    for (pod, intf, _, far_pod, far_intf, far, kind) in LINKS {
        let start = Instant::now();
        let out = emu.weftctl(&["link", "down", pod, intf]);
        assert!(out.contains("link down"), "{out}");
        let deadline = start + Duration::from_secs(3);
        while !emu.flags(far_pod, far_intf).iter().any(|f| f == "NO-CARRIER") {
            assert!(
                Instant::now() < deadline,
                "{kind}: {far_pod}:{far_intf} keeps its carrier"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = start.elapsed();
        eprintln!(
            "{kind}: far end NO-CARRIER {} ms after `link down` started",
            took.as_millis()
        );
        assert!(took < Duration::from_secs(1), "{kind}: carrier lost after {took:?}");
        let (answered, _) = emu.ping(pod, far, 3, "0.2");
        assert!(answered.is_empty(), "{kind}: traffic still flows");
    }
    // `lab check` says down by intent, not failed.
    let check = Command::new(bin("weftctl"))
        .env("WEFT_LAB_DIR", &emu.lab_dir)
        .args(["--json", "lab", "check", "--within", "2"])
        .arg(&emu.file)
        .output()
        .unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    for (pod, intf, _, far_pod, far_intf, ..) in LINKS {
        for from in [format!("{pod}:{intf}"), format!("{far_pod}:{far_intf}")] {
            let r = rows.iter().find(|r| r["from"] == from.as_str()).unwrap();
            assert_eq!(r["down_by_intent"], true, "{r}");
        }
    }
    assert!(
        check.status.success(),
        "down links fail the check: {}",
        String::from_utf8_lossy(&check.stderr)
    );

    emu.restart_daemons();
    for (_, _, _, far_pod, far_intf, _, kind) in LINKS {
        assert!(
            emu.flags(far_pod, far_intf).iter().any(|f| f == "NO-CARRIER"),
            "{kind}: up again after the restart"
        );
    }
    for (pod, intf, _, _, _, far, _) in LINKS {
        emu.weftctl(&["link", "up", pod, intf]);
        emu.wait_reachable(pod, far);
    }
    // A flap ends up.
    let out = emu.weftctl(&["link", "flap", "a1", "e2", "--every", "200ms", "--count", "2"]);
    assert_eq!(out.lines().count(), 4, "{out}");
    emu.wait_reachable("a1", "10.77.2.2");

    emu.lab.0.down().unwrap();
}

/// What `n` numbered datagrams from `from` to `to_addr` gave: each received one's
/// number and one-way delay (µs, both ends on this machine's monotonic clock) in the
/// order they arrived. Sent `gap` apart (paced, so the sender never outruns the link).
fn udp_run(emu: &Emu, from: &str, to: &str, to_addr: &str, n: u32, gap: Duration) -> Vec<(u32, u64)> {
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    let base = Instant::now();
    let open = |pod: &str| {
        weft_kernel::NetNs::open(&PathBuf::from("/run/netns").join(emu.lab.0.pod_ns(pod))).expect("the pod's namespace")
    };
    let (src, dst) = (open(from), open(to));
    let to_addr = to_addr.to_string();
    let rx = weft_kernel::in_netns(&dst, || {
        let s = UdpSocket::bind((to_addr.as_str(), 40999)).unwrap();
        nix::sys::socket::setsockopt(&s.as_fd(), nix::sys::socket::sockopt::RcvBufForce, &(32 << 20)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        Ok(s)
    })
    .unwrap();
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok(len) = rx.recv(&mut buf) {
            if len >= 12 {
                let seq = u32::from_be_bytes(buf[..4].try_into().unwrap());
                let sent = u64::from_be_bytes(buf[4..12].try_into().unwrap());
                got.push((seq, (base.elapsed().as_micros() as u64).saturating_sub(sent)));
            }
        }
        got
    });
    let addr = to_addr.clone();
    weft_kernel::in_netns(&src, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let start = Instant::now();
        for i in 0..n {
            while start.elapsed() < gap * i {
                std::hint::spin_loop();
            }
            let mut p = i.to_be_bytes().to_vec();
            p.extend_from_slice(&(base.elapsed().as_micros() as u64).to_be_bytes());
            s.send_to(&p, (addr.as_str(), 40999)).unwrap();
        }
        Ok(())
    })
    .unwrap();
    receiver.join().unwrap()
}

/// The loss rate and the mean length of loss bursts of a run of `n`.
fn loss_stats(got: &[(u32, u64)], n: u32) -> (f64, f64) {
    let mut seen = vec![false; n as usize];
    for (seq, _) in got {
        seen[*seq as usize] = true;
    }
    let lost = seen.iter().filter(|s| !**s).count();
    let bursts = seen.windows(2).filter(|w| w[0] && !w[1]).count() + usize::from(!seen[0]);
    (lost as f64 / f64::from(n), lost as f64 / bursts.max(1) as f64)
}

/// The median of `xs` and their median absolute deviation from it.
fn median_mad(xs: &[f64]) -> (f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    let mut dev: Vec<f64> = v.iter().map(|x| (x - median).abs()).collect();
    dev.sort_by(f64::total_cmp);
    (median, dev[dev.len() / 2])
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (mean, (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt())
}

/// netem's richer models through weft's detour (on any kernel: weft's netem writer
/// does not encode them), measured on real traffic over a veth link and a gRPC link:
/// Gilbert-Elliott loss (`gemodel 1% 10%`: 1/11 of 100,000 datagrams lost, in bursts
/// of 10 on average), correlated random loss (`2% 50%`: 2 %, bursts of 2.04), delay
/// from the normal and Pareto tables (mean the delay, spread the jitter, Pareto's floor
/// 0.63 jitter under the mean), and slots (`5ms packets 20`: datagrams arrive in
/// bursts 5 ms apart). Bands are four standard deviations of each statistic wide, or
/// wider where the path's own scheduling adds to a delay; a delay's spread is read as
/// its median absolute deviation against the model's, with the path's own (measured
/// with the delay alone) added.
#[test]
fn loss_models_delay_distributions_and_slots_through_the_detour() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("models");
    let emu = up("mod", &dir);
    let set = |pod: &str, intf: &str, flags: &[&str]| {
        let mut args = vec!["link", "set", pod, intf];
        args.extend_from_slice(flags);
        emu.weftctl(&args);
    };

    // Where the kernel has netem, models, distributions, slots and ECN are netem's
    // (the statistics below then measure the kernel's netem); a correlation is not.
    let netem = netem_available(&emu, "a1");
    if netem {
        set(
            "a1",
            "e1",
            &[
                "--delay",
                "20ms",
                "--jitter",
                "5ms",
                "--distribution",
                "normal",
                "--loss",
                "gemodel 1% 10%",
                "--slot",
                "800us 1ms packets 32",
                "--ecn",
                "on",
            ],
        );
        let q = emu.qdisc("a1", "e1");
        for word in ["netem", "loss gemodel", "slot", "ecn"] {
            assert!(q.contains(word), "netem has {word}: {q}");
        }
        assert!(!emu.detoured("a1", "e1"), "netem applies it: no detour");
        set("a1", "e1", &["--loss", "2% 50%"]);
        assert!(emu.detoured("a1", "e1"), "a correlation runs in the detour");
    } else {
        eprintln!(
            "this kernel has no netem: the models run through weft's detour only (the netem path is checked on kernels that have it)"
        );
    }

    // Gilbert-Elliott on the veth link, a1 to b1.
    set("a1", "e1", &["--loss", "gemodel 1% 10%"]);
    assert_eq!(
        emu.detoured("a1", "e1"),
        !netem,
        "a model runs in netem, else in the detour"
    );
    let n = 100_000;
    let got = udp_run(&emu, "a1", "b1", "10.77.1.2", n, Duration::from_micros(20));
    let (rate, burst) = loss_stats(&got, n);
    assert_band("gemodel 1% 10%: loss, %", rate * 100.0, 7.6, 10.6);
    assert_band("gemodel 1% 10%: mean loss burst", burst, 8.5, 11.5);
    // `link stats` counts the emulation's drops apart from the kernel's: every datagram
    // that did not arrive is one the loss model took (give or take the odd ARP frame).
    // (netem's drops are the kernel's qdisc's: weft counts only its own emulation.)
    if !netem {
        let stats = emu.weftctl(&["link", "stats", "a1", "-o", "json", "--interval", "300ms"]);
        let e1: serde_json::Value = stats
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["end"] == "emu/a1:e1")
            .unwrap_or_else(|| panic!("{stats}"));
        let lost = e1["emulation"]["lost"].as_u64().unwrap();
        let missing = u64::from(n) - got.len() as u64;
        eprintln!("link stats: a1:e1 lost {lost} by the emulation, {missing} datagrams missing: {e1}");
        assert!(
            lost.abs_diff(missing) <= 20,
            "lost {lost} against {missing} missing: {e1}"
        );
        // The interface counts what left the emulation; with what it took, all that was sent.
        let left = e1["counters"]["tx_frames"].as_u64().unwrap();
        assert!(left + lost >= u64::from(n) && left < u64::from(n), "{e1}");
        assert_eq!(e1["counters"]["dropped"], 0, "the kernel dropped nothing: {e1}");
        assert!(e1["rates"]["tx_bps"].is_number(), "rates over the interval: {e1}");
    }

    // Correlated random loss on the gRPC link, b1 (n1) to d2 (n2).
    set("b1", "e3", &["--loss", "2% 50%"]);
    let n = 50_000;
    let got = udp_run(&emu, "b1", "d2", "10.77.3.2", n, Duration::from_micros(20));
    let (rate, burst) = loss_stats(&got, n);
    assert_band("loss 2% 50%: loss, %", rate * 100.0, 1.6, 2.4);
    assert_band("loss 2% 50%: mean loss burst", burst, 1.8, 2.3);

    // Delay distributions on the veth link: the delay's mean and spread. The path adds
    // a spread of its own (the detour's millisecond timer, the sender's and the
    // receiver's scheduling), measured here with the delay alone. The spread is read as
    // the median absolute deviation, against the model's own (from its table): on a
    // busy machine the scheduler holds back a few percent of the datagrams by
    // milliseconds, which moved a standard deviation by more than a millisecond from
    // one run to the next (5 ms asked read 4.48 and 6.03 over the path's), and moves
    // the median's deviation hardly at all.
    set("a1", "e1", &["--delay", "20ms"]);
    let got = udp_run(&emu, "a1", "b1", "10.77.1.2", 20_000, Duration::from_micros(100));
    assert!(got.len() > 19_900, "delay alone: {} of 20,000 arrived", got.len());
    let alone: Vec<f64> = got.iter().map(|(_, d)| *d as f64).collect();
    let (_, path_sd) = mean_sd(&alone);
    let (_, path_mad) = median_mad(&alone);
    eprintln!(
        "20ms alone: the path's own standard deviation {:.2} ms, median absolute deviation {:.2} ms",
        path_sd / 1e3,
        path_mad / 1e3
    );
    assert!(
        path_sd < 4_000.0,
        "the path alone spreads a delay by {path_sd:.0} µs: too busy to read a 5 ms spread over"
    );
    for (dist, floor) in [(Distribution::Normal, None), (Distribution::Pareto, Some(16_500.0))] {
        let name = dist.as_str();
        set(
            "a1",
            "e1",
            &["--delay", "20ms", "--jitter", "5ms", "--distribution", name],
        );
        let got = udp_run(&emu, "a1", "b1", "10.77.1.2", 20_000, Duration::from_micros(100));
        assert!(got.len() > 19_900, "{name}: {} of 20,000 arrived", got.len());
        let delays: Vec<f64> = got.iter().map(|(_, d)| *d as f64).collect();
        let (mean, sd) = mean_sd(&delays);
        // The detour's timer wakes on the millisecond: up to 1 ms more.
        assert_band(
            &format!("{name} 20ms ± 5ms: mean one-way delay, ms"),
            mean / 1e3,
            19.7,
            22.5,
        );
        eprintln!("{name} 20ms ± 5ms: standard deviation measured {:.2} ms", sd / 1e3);
        // The model's deviation (its table's, an entry of 8192 one standard deviation,
        // times 5 ms) with the path's added as independent spreads add. A uniform
        // jitter of ±5 ms reads 0.74 of a normal's, none reads near 0, the jitter
        // applied twice 1.41.
        let table: Vec<f64> = (dist.netem_table().expect("a table"))
            .iter()
            .map(|e| f64::from(*e) / 8192.0 * 5_000.0)
            .collect();
        let (_, model_mad) = median_mad(&table);
        let (_, mad) = median_mad(&delays);
        assert_band(
            &format!("{name} 20ms ± 5ms: its median absolute deviation over the model's with the path's"),
            mad / (model_mad * model_mad + path_mad * path_mad).sqrt(),
            0.85,
            1.2,
        );
        if let Some(floor) = floor {
            let min = delays.iter().fold(f64::MAX, |a, b| a.min(*b));
            assert!(min >= floor, "{name}: a delay of {min} µs, below its floor");
        }
    }

    // Slots: 1 ms delay, then slots drawn 5 ms after a frame finds none pending, each
    // taking up to 20 datagrams; sent one every 0.5 ms, they arrive eleven at a time,
    // 5.5 ms apart (the bands allow for a busy machine's sender slipping).
    set("a1", "e1", &["--delay", "1ms", "--slot", "5ms packets 20"]);
    let got = udp_run(&emu, "a1", "b1", "10.77.1.2", 2_000, Duration::from_micros(500));
    assert!(got.len() > 1_990, "{} of 2,000 arrived", got.len());
    let arrivals: Vec<u64> = got.iter().map(|(seq, d)| u64::from(*seq) * 500 + d).collect();
    let mut sorted = arrivals.clone();
    sorted.sort_unstable();
    let gaps: Vec<u64> = sorted.windows(2).map(|w| w[1] - w[0]).collect();
    let bursts = 1 + gaps.iter().filter(|g| **g > 2_000).count();
    assert_band(
        "slot 5ms: datagrams per burst",
        got.len() as f64 / bursts as f64,
        8.0,
        16.0,
    );
    let between: Vec<f64> = gaps.iter().filter(|g| **g > 2_000).map(|g| *g as f64).collect();
    assert_band("slot 5ms: time between bursts, ms", mean_sd(&between).0 / 1e3, 4.0, 8.0);
    emu.weftctl(&["link", "reset", "a1", "e1"]);
    emu.weftctl(&["link", "reset", "b1", "e3"]);
}

/// A scenario (`weftctl link scenario run`): a set, a down and an up, a ramp of the
/// delay in five changes, then a step on a link that does not exist. Every change is
/// made at its time (how late each was is printed), the failing step stops the run
/// with its number and link named, and the link stays as the last change set it.
#[test]
fn a_scenario_runs_its_steps_on_time_and_stops_at_a_failing_one() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("scenario");
    // The lab file names a scenario of its own on b1:e3, which `lab up` starts: its
    // last step is far off, so it still runs when the test stops it.
    std::fs::write(
        dir.path().join("bg.yaml"),
        "name: bg\nsteps:\n\
         - {at: 0s, links: [b1:e3], set: {delay: 7ms}}\n\
         - {at: 200ms, links: [b1:e3], down: true}\n\
         - {at: 400ms, links: [b1:e3], up: true}\n\
         - {at: 600s, links: [b1:e3], reset: true}\n",
    )
    .unwrap();
    let emu = up_with("scn", &dir, "scenario: bg.yaml\n");
    let log = emu.lab.0.scenario_log();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&log).unwrap_or_default().lines().count() < 3 {
        assert!(
            Instant::now() < deadline,
            "the lab's scenario made no 3 steps: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(emu.lab.0.scenario_pid().is_some(), "the lab's scenario runs on");
    let bg = emu.weftctl(&["--json", "link", "show", "b1"]);
    let e3 = bg
        .split("\n}\n")
        .find(|o| o.contains("\"intf\": \"e3\""))
        .unwrap_or_else(|| panic!("{bg}"));
    assert!(e3.contains("\"delay\": \"7ms\""), "{e3}");
    assert!(e3.contains(r#""what": "scenario \"bg\" step 3: up""#), "{e3}");
    emu.lab.0.stop_scenario();
    assert!(emu.lab.0.scenario_pid().is_none(), "stopped");
    let ended = std::fs::read_to_string(&log).unwrap();
    assert!(
        ended.contains("scenario \"bg\" stopped before step 4"),
        "the log says where it stopped: {ended}"
    );

    // `lab events --follow` watches while the scenario below runs.
    let events_log = dir.path().join("events.jsonl");
    let events = Command::new(bin("weftctl"))
        .env("WEFT_LAB_DIR", &emu.lab_dir)
        .args(["lab", "events"])
        .arg(&emu.file)
        .args(["--follow", "--interval", "100ms"])
        .stdout(std::fs::File::create(&events_log).unwrap())
        .spawn()
        .unwrap();
    let events = weft_harness::ChildGuard::new(events);
    // Its first sample (every end, `added`) before the scenario starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&events_log)
        .unwrap_or_default()
        .contains("\"added\"")
    {
        assert!(Instant::now() < deadline, "lab events printed nothing");
        std::thread::sleep(Duration::from_millis(50));
    }

    let file = dir.path().join("scenario.yaml");
    std::fs::write(
        &file,
        "name: t\nsteps:\n\
         - {at: 0s, links: [a1:e1], set: {delay: 5ms}}\n\
         - {at: 300ms, links: [a1:e1], down: true}\n\
         - {at: 600ms, links: [a1:e1], up: true}\n\
         - {at: 700ms, links: [a1:e1], ramp: {param: delay, from: 10ms, to: 30ms, over: 400ms, every: 100ms}}\n\
         - {at: 1300ms, links: [a1:nope], down: true}\n",
    )
    .unwrap();
    let out = Command::new(bin("weftctl"))
        .env("WEFT_LAB_DIR", &emu.lab_dir)
        .args(["--json", "link", "scenario", "run"])
        .arg(&file)
        .arg("--lab")
        .arg(&emu.file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the failing step fails the run: {stdout}");
    assert!(
        stderr.contains("step 5 (due at 1.300s, down) failed on a1:nope"),
        "{stderr}"
    );
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let actions: Vec<&str> = lines.iter().map(|l| l["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        [
            "set delay 5ms",
            "down",
            "up",
            "set delay 10ms",
            "set delay 15ms",
            "set delay 20ms",
            "set delay 25ms",
            "set delay 30ms"
        ]
    );
    let late: Vec<f64> = lines.iter().map(|l| l["late_ms"].as_f64().unwrap()).collect();
    let worst = late.iter().fold(0.0f64, |a, b| a.max(*b));
    eprintln!("scenario: each change made {late:?} ms after it was due (worst {worst:.1} ms)");
    assert!(worst < 250.0, "a change {worst} ms late");
    let show = emu.weftctl(&["--json", "link", "show", "a1"]);
    let e1 = show
        .split("\n}\n")
        .find(|o| o.contains("\"intf\": \"e1\""))
        .unwrap_or_else(|| panic!("{show}"));
    assert!(e1.contains("\"delay\": \"30ms\""), "the last change stays: {e1}");
    assert!(e1.contains("\"down_by_intent\": false"), "{e1}");
    // The steps are visible: which step made the link's last change, and the node's
    // count of the scenario's changes (8 made; the failing one is not counted).
    assert!(
        e1.contains(r#""what": "scenario \"t\" step 4: set delay 30ms""#),
        "link show names the step: {e1}"
    );
    let node = emu.lab.0.node_of("a1").unwrap().to_string();
    let page = weft_tests::node_metrics(&emu.lab.0, &node);
    assert!(
        page.lines()
            .any(|l| l == r#"weft_scenario_steps_total{scenario="t"} 8"#),
        "{}",
        page.lines()
            .filter(|l| l.contains("scenario"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(page.lines().any(|l| l == r#"weft_scenario_step{scenario="t"} 4"#));

    // The events: every end first, then the scenario's changes as they were seen.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(events.pid() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    events.output_within(Duration::from_secs(5)).unwrap();
    let out = std::fs::read_to_string(&events_log).unwrap();
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |kind: &'static str| {
        lines
            .iter()
            .filter(move |l| l["event"] == kind && l["end"] == "emu/a1:e1")
    };
    assert_eq!(of("added").count(), 1, "{out}");
    assert!(
        of("state").any(|l| l["to"] == "down(intent)") && of("state").any(|l| l["from"] == "down(intent)"),
        "down and up seen: {out}"
    );
    assert!(of("impairment").any(|l| l["to"] == "delay 30ms"), "{out}");
    assert!(
        of("change").any(|l| l["what"].as_str().unwrap().starts_with("scenario \"t\" step")),
        "{out}"
    );
    assert!(
        of("counters").any(|l| l["rates"]["tx_pps"].is_number() && l["counters"]["tx_frames"].is_number()),
        "counter samples with rates: {out}"
    );
}
