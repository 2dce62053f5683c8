//! A storm: 4 workers attach and detach pods through the real plugin, kubelet-style (a
//! failed ADD is followed by DEL until DEL succeeds; every pod has its own container id
//! and network namespace), for 60 s while weftd is SIGKILLed and started again every
//! 4 s. Afterwards: no address was ever held by two live pods at once, every failure was
//! CNI code 11, no live pod lost its networking, the store and the kernel agree, and the
//! final DELs leave nothing.
//!
//! The ranges are small (29 IPv4 and 30 IPv6 addresses) so that addresses are reused
//! hundreds of times during the storm, which is what gives the overlap check teeth.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_tests::{Call, CniOutput, Daemon, Netns, privileged};

const WORKERS: usize = 4;
const STORM: Duration = Duration::from_secs(60);
const KILL_EVERY: Duration = Duration::from_secs(4);
const V4: &str = "10.253.0.0/27";
const V6: &str = "fd00:253::/123";
/// How long a worker retries one DEL before it reports the pod stuck.
const DEL_PATIENCE: Duration = Duration::from_secs(30);
/// How long after the storm a worker keeps trying for its last pod.
const LAST_ADD_PATIENCE: Duration = Duration::from_secs(30);

/// One pod that ADD attached, and the interval in which it certainly held its addresses:
/// from the ADD's success (the daemon had answered) to the start of its first DEL
/// attempt (after that the daemon may tear it down at any moment, legitimately, even if
/// that attempt fails).
#[derive(Debug, Clone)]
struct Life {
    container: String,
    addrs: Vec<IpAddr>,
    added: Instant,
    /// `None` while the pod is still attached.
    del_start: Option<Instant>,
}

/// A plugin call that failed.
#[derive(Debug)]
struct Failure {
    command: &'static str,
    container: String,
    code: Option<u64>,
    output: String,
}

/// A pod still attached when the storm ended, with its namespace.
struct Live {
    life: Life,
    host_ifname: String,
    netns: Netns,
}

/// What one worker saw.
#[derive(Default)]
struct WorkerLog {
    lives: Vec<Life>,
    failures: Vec<Failure>,
    /// Broken promises: pods that did not hold their addresses while live, DELs that
    /// never succeeded.
    problems: Vec<String>,
    adds_ok: usize,
    last: Option<Live>,
}

impl WorkerLog {
    fn failed(&mut self, command: &'static str, container: &str, out: &CniOutput) {
        let code = if out.code == 1 {
            serde_json::from_str::<Value>(&out.stdout)
                .ok()
                .and_then(|v| v["code"].as_u64())
        } else {
            None
        };
        self.failures.push(Failure {
            command,
            container: container.to_string(),
            code,
            output: format!("exit {}: {} {}", out.code, out.stdout.trim(), out.stderr.trim()),
        });
    }

    /// DEL until it succeeds, as kubelet does.
    fn del_until_ok(&mut self, container: &str, ns: &Netns, conf: &str) {
        let deadline = Instant::now() + DEL_PATIENCE;
        loop {
            let out = Call::new("DEL", container, &ns.path(), conf).run();
            if out.code == 0 {
                return;
            }
            self.failed("DEL", container, &out);
            if Instant::now() > deadline {
                self.problems
                    .push(format!("{container}: DEL did not succeed within {DEL_PATIENCE:?}"));
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn addrs_of(result: &Value) -> Vec<IpAddr> {
    result["ips"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses on `eth0` in `ns` (empty when there is no `eth0`).
fn eth0_addrs(ns: &Netns) -> BTreeSet<IpAddr> {
    let out = weft_tests::run(std::process::Command::new("ip").args(["-j", "-n", ns.name(), "addr", "show", "eth0"]));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["addr_info"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["local"].as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether `ns`'s `eth0` holds exactly the pod's addresses (besides link-local ones).
fn holds(ns: &Netns, addrs: &[IpAddr]) -> Result<(), String> {
    let on: BTreeSet<IpAddr> = eth0_addrs(ns)
        .into_iter()
        .filter(|a| !matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .collect();
    let want: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    if on == want {
        Ok(())
    } else {
        Err(format!("eth0 holds {on:?}, the ADD result names {want:?}"))
    }
}

fn worker(w: usize, conf: &str, stop: &AtomicBool) -> WorkerLog {
    let mut log = WorkerLog::default();
    let mut stopped_at = None;
    for n in 0.. {
        // Once the storm is over, each worker ends with one pod left attached, so the
        // final comparison of store and kernel has something to compare.
        let last_round = stop.load(Ordering::SeqCst);
        if last_round && stopped_at.is_none() {
            stopped_at = Some(Instant::now());
        }
        let container = format!("storm-{w}-{n}");
        let ns = Netns::new(&format!("s{w}"));
        let out = Call::new("ADD", &container, &ns.path(), conf).run();
        if out.code != 0 {
            log.failed("ADD", &container, &out);
            log.del_until_ok(&container, &ns, conf);
            // A daemon that died for good (or a killer that panicked) must fail the
            // test, not hang it: the last round gets a bounded number of tries.
            if stopped_at.is_some_and(|t| t.elapsed() > LAST_ADD_PATIENCE) {
                log.problems.push(format!(
                    "{container}: no ADD succeeded within {LAST_ADD_PATIENCE:?} after the storm"
                ));
                return log;
            }
            continue;
        }
        let added = Instant::now();
        log.adds_ok += 1;
        let result = out.json();
        let addrs = addrs_of(&result);
        if addrs.len() != 2 {
            log.problems.push(format!(
                "{container}: ADD succeeded with {} addresses: {result}",
                addrs.len()
            ));
        }
        if let Err(e) = holds(&ns, &addrs) {
            log.problems.push(format!("{container}: right after ADD: {e}"));
        }
        let mut life = Life {
            container: container.clone(),
            addrs,
            added,
            del_start: None,
        };
        if last_round {
            let host_ifname = result["interfaces"][0]["name"].as_str().unwrap_or_default().to_string();
            log.last = Some(Live {
                life,
                host_ifname,
                netns: ns,
            });
            return log;
        }
        // Live for a moment, as long as a kill may land in it.
        std::thread::sleep(Duration::from_millis(rand::random_range(0..30)));
        if let Err(e) = holds(&ns, &life.addrs) {
            log.problems.push(format!("{container}: while live, before DEL: {e}"));
        }
        life.del_start = Some(Instant::now());
        log.lives.push(life);
        log.del_until_ok(&container, &ns, conf);
    }
    unreachable!()
}

/// Pairs of pods that held the same address in overlapping intervals.
fn overlaps(lives: &[Life]) -> Vec<String> {
    let mut by_addr: BTreeMap<IpAddr, Vec<&Life>> = BTreeMap::new();
    for l in lives {
        for a in &l.addrs {
            by_addr.entry(*a).or_default().push(l);
        }
    }
    let mut out = Vec::new();
    for (addr, holders) in by_addr {
        for (i, a) in holders.iter().enumerate() {
            for b in &holders[i + 1..] {
                let a_before_b_ends = b.del_start.is_none_or(|end| a.added < end);
                let b_before_a_ends = a.del_start.is_none_or(|end| b.added < end);
                if a_before_b_ends && b_before_a_ends {
                    out.push(format!("{addr} held by {} and {} at once", a.container, b.container));
                }
            }
        }
    }
    out
}

/// How many addresses were handed to more than one pod over the storm.
fn reused(lives: &[Life]) -> usize {
    let mut count: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for l in lives {
        for a in &l.addrs {
            *count.entry(*a).or_default() += 1;
        }
    }
    count.values().filter(|&&n| n > 1).count()
}

/// Sets the flag when dropped, so the workers stop even when the killer panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The store and the kernel describe the same pods: every row is ready and has its host
/// end, its routes and (in the pod) its addresses; the node has no other weft link or
/// route; the allocations are exactly the rows' addresses.
fn assert_store_matches_kernel(d: &Daemon, live: &[Live]) {
    let rows = d.store_attachments();
    let by_container: BTreeMap<&str, &Live> = live.iter().map(|l| (l.life.container.as_str(), l)).collect();
    let row_containers: BTreeSet<&str> = rows.iter().map(|r| r.key.container_id.as_str()).collect();
    assert_eq!(
        row_containers,
        by_container.keys().copied().collect(),
        "the store's attachments are not the pods left attached: {rows:?}"
    );
    let mut links: BTreeSet<String> = BTreeSet::from(["lo".to_string()]);
    let mut routes = BTreeSet::new();
    let mut allocated = BTreeSet::new();
    for r in &rows {
        assert_eq!(r.state, weft_store::State::Ready, "{r:?}");
        let l = by_container[r.key.container_id.as_str()];
        assert_eq!(r.host_ifname, l.host_ifname, "{r:?}");
        let addrs: Vec<IpAddr> = r.addresses.iter().map(|a| a.address).collect();
        assert_eq!(
            addrs, l.life.addrs,
            "the store holds other addresses than ADD answered: {r:?}"
        );
        holds(&l.netns, &addrs).unwrap_or_else(|e| panic!("{}: {e}", r.key));
        links.insert(r.host_ifname.clone());
        for a in addrs {
            routes.insert((a.to_string(), r.host_ifname.clone()));
            allocated.insert(a);
        }
    }
    let node_links: BTreeSet<String> = d.node.links_but_gateway().into_iter().collect();
    assert_eq!(node_links, links, "node links and store rows differ");
    let node_routes: BTreeSet<(String, String)> = d
        .node
        .weft_routes()
        .iter()
        .map(|r| {
            (
                r["dst"].as_str().unwrap_or_default().to_string(),
                r["dev"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(node_routes, routes, "node routes and store rows differ");
    let store_allocated: BTreeSet<IpAddr> = d.store_allocated().into_iter().collect();
    assert_eq!(store_allocated, allocated, "allocations besides the attached pods'");
    assert_eq!(
        d.allocated(),
        allocated.len() as u64,
        "weftctl status disagrees with the store"
    );
}

#[test]
fn kill_storm_keeps_addresses_unique_and_state_consistent() {
    let _area = weft_tests::area("node::storm");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("storm");
    let conf = d.conf("1.1.0", &[V4, V6]);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut restarts = 0;
    let mut slowest_restart = Duration::ZERO;
    let logs: Vec<WorkerLog> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (conf, stop) = (&conf, &stop);
                s.spawn(move || worker(w, conf, stop))
            })
            .collect();
        let _stop = StopOnDrop(&stop);
        while started.elapsed() + KILL_EVERY <= STORM {
            std::thread::sleep(KILL_EVERY);
            let t = Instant::now();
            d.restart();
            slowest_restart = slowest_restart.max(t.elapsed());
            restarts += 1;
        }
        std::thread::sleep(STORM.saturating_sub(started.elapsed()));
        drop(_stop);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect()
    });
    let storm_time = started.elapsed();

    let mut lives = Vec::new();
    let mut failures = Vec::new();
    let mut problems = Vec::new();
    let mut live = Vec::new();
    let mut adds_ok = 0;
    for mut log in logs {
        adds_ok += log.adds_ok;
        lives.append(&mut log.lives);
        failures.append(&mut log.failures);
        problems.append(&mut log.problems);
        if let Some(l) = log.last {
            lives.push(l.life.clone());
            live.push(l);
        }
    }

    // What the storm saw, printed before any assertion so a failure has its context.
    let by_code = failures.iter().fold(BTreeMap::<String, usize>::new(), |mut m, f| {
        *m.entry(format!("{} {:?}", f.command, f.code)).or_default() += 1;
        m
    });
    eprintln!(
        "storm: {storm_time:.1?}, {restarts} restarts (slowest {slowest_restart:.1?}), {adds_ok} ADDs succeeded, \
         {} pods lived, {} addresses reused, failures by command and code: {by_code:?}",
        lives.len(),
        reused(&lives)
    );
    let overlapping = overlaps(&lives);
    for line in overlapping.iter().chain(&problems) {
        eprintln!("{line}");
    }
    let print_not_eleven = |failures: &[Failure]| {
        for f in failures.iter().filter(|f| f.code != Some(11)) {
            eprintln!("{} {} failed with {:?}: {}", f.command, f.container, f.code, f.output);
        }
    };
    print_not_eleven(&failures);

    // One more crash with pods attached: they must come through it untouched.
    d.restart();
    d.settle();
    assert_store_matches_kernel(&d, &live);

    // Detach what is left, kubelet-style, and check that nothing remains.
    let mut final_log = WorkerLog::default();
    for l in &live {
        final_log.del_until_ok(&l.life.container, &l.netns, &conf);
    }
    print_not_eleven(&final_log.failures);
    failures.append(&mut final_log.failures);
    problems.append(&mut final_log.problems);
    d.assert_clean();
    assert!(
        d.store_attachments().is_empty(),
        "rows left: {:?}",
        d.store_attachments()
    );
    assert!(
        d.store_allocated().is_empty(),
        "addresses left: {:?}",
        d.store_allocated()
    );
    for l in &live {
        assert_eq!(l.netns.links(), vec!["lo"], "{} still has interfaces", l.netns.name());
    }

    let not_eleven = failures.iter().filter(|f| f.code != Some(11)).count();
    assert!(
        overlapping.is_empty(),
        "addresses held twice:\n{}",
        overlapping.join("\n")
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(not_eleven == 0, "{not_eleven} failures were not CNI code 11 (above)");
    // The storm must have been one: enough pods, enough crashes, addresses reused.
    assert!(restarts >= 10, "only {restarts} restarts");
    assert!(
        adds_ok >= 100,
        "only {adds_ok} pods attached: the storm was too weak to mean anything"
    );
    assert!(
        reused(&lives) >= 20,
        "addresses were hardly reused: the overlap check saw nothing"
    );
}

/// The overlap check itself: it must see a shared address, and only when lives overlap.
#[test]
fn overlap_check_finds_an_address_held_twice() {
    let _area = weft_tests::area("node::storm");
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let a: IpAddr = "10.253.0.2".parse().unwrap();
    let life = |c: &str, from: u64, to: Option<u64>| Life {
        container: c.into(),
        addrs: vec![a],
        added: at(from),
        del_start: to.map(at),
    };
    assert!(overlaps(&[life("x", 0, Some(10)), life("y", 10, Some(20))]).is_empty());
    assert_eq!(overlaps(&[life("x", 0, Some(10)), life("y", 9, Some(20))]).len(), 1);
    assert_eq!(overlaps(&[life("x", 0, None), life("y", 50, Some(60))]).len(), 1);
    assert_eq!(reused(&[life("x", 0, Some(1)), life("y", 2, None)]), 1);
}
