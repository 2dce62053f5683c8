//! A full node: 4 workers attach 1,000 pods through the real plugin, then remove them
//! all. The store serves the four at once, so its writer sees contention the whole
//! time; none of it may reach the runtime as an error. Every address is distinct,
//! the daemon counts 1,000 allocated in the middle and none at the end, and nothing
//! is left on the node or in a pod. Timing is not asserted: that is what
//! `weft-bench --compare load` measures.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_tests::{Call, CniOutput, Daemon, Netns, privileged};

const PODS: usize = 1000;
const WORKERS: usize = 4;

/// Runs `f(i)` for every pod from `WORKERS` threads, each taking the next pod from a
/// shared counter, and returns the results in pod order.
fn each_pod<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, T)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= PODS {
                            return mine;
                        }
                        mine.push((i, f(i)));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
}

/// Every failed call of a phase, as the runtime saw it: exit code and the CNI error.
fn failures(command: &str, outs: &[CniOutput]) -> Vec<String> {
    outs.iter()
        .enumerate()
        .filter(|(_, o)| o.code != 0)
        .map(|(i, o)| format!("{command} pod {i}: exit {}: {}", o.code, o.stdout.trim()))
        .collect()
}

#[test]
fn a_thousand_pods_attach_and_detach_on_one_node() {
    let _area = weft_tests::area("bench::load");
    if !privileged() {
        return;
    }
    let start = Instant::now();
    let d = Daemon::start("load");
    // IPv4 only: one address per pod, so "allocated" counts pods.
    let conf = d.conf("1.1.0", &["10.250.0.0/16"]);
    // Namespaces are made (and, on drop, removed) by the same pool of threads: a
    // thousand `ip netns add` one by one take a while.
    let pods: Vec<Netns> = each_pod(|i| Netns::new(&format!("l{i}")));
    let made = start.elapsed();

    let cid = |i: usize| format!("load-{i}");
    let adds = each_pod(|i| Call::new("ADD", &cid(i), &pods[i].path(), &conf).run());
    let added = start.elapsed();
    let failed = failures("ADD", &adds);
    assert!(
        failed.is_empty(),
        "{} of {PODS} ADDs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    let addrs: Vec<String> = adds
        .iter()
        .map(|o| {
            let ips = o.json()["ips"].as_array().cloned().unwrap_or_default();
            assert_eq!(ips.len(), 1, "one address per pod: {}", o.stdout);
            ips[0]["address"].as_str().unwrap().to_string()
        })
        .collect();
    let unique: HashSet<&String> = addrs.iter().collect();
    assert_eq!(unique.len(), PODS, "an address was handed out twice");
    let st = d.status();
    assert_eq!(st["attachments"], PODS, "{st}");
    assert_eq!(d.allocated(), PODS as u64, "{st}");
    assert_eq!(d.node.links_but_gateway().len(), PODS + 1, "a veth per pod, and lo");
    // The first and the last pod answer from the node.
    for i in [0, PODS - 1] {
        let ip = addrs[i].split('/').next().unwrap();
        assert!(d.node.ping(ip), "pod {i} ({ip}) unreachable");
    }

    // DEL as libcni sends it: the ADD result as prevResult.
    let base: Value = serde_json::from_str(&conf).unwrap();
    let dels = each_pod(|i| {
        let mut c = base.clone();
        c["prevResult"] = adds[i].json();
        Call::new("DEL", &cid(i), &pods[i].path(), &c.to_string()).run()
    });
    let deleted = start.elapsed();
    let failed = failures("DEL", &dels);
    assert!(
        failed.is_empty(),
        "{} of {PODS} DELs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );

    // DEL answers once the pod is cut off and removes the veth right after; wait for
    // the last of those before looking (assert_clean waits too, but only 20 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    while d.status()["pending_teardowns"].as_u64() != Some(0) {
        assert!(Instant::now() < deadline, "teardowns still pending after 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    d.assert_clean();
    let left: Vec<String> = each_pod(|i| (pods[i].links() != ["lo"]).then(|| pods[i].name().to_string()))
        .into_iter()
        .flatten()
        .collect();
    assert!(left.is_empty(), "pods still holding interfaces: {left:?}");
    eprintln!(
        "load: namespaces {:.1} s, {PODS} ADDs {:.1} s, {PODS} DELs {:.1} s, checks and teardown {:.1} s",
        made.as_secs_f64(),
        (added - made).as_secs_f64(),
        (deleted - added).as_secs_f64(),
        (start.elapsed() - deleted).as_secs_f64()
    );
    // Removing a thousand namespaces one by one takes a while too (on a failure
    // above, drop removes them, just more slowly).
    let mut pods = pods;
    std::thread::scope(|s| {
        while !pods.is_empty() {
            let chunk: Vec<Netns> = pods.drain(..PODS.div_ceil(WORKERS).min(pods.len())).collect();
            s.spawn(move || chunk.into_iter().for_each(Netns::delete));
        }
    });
}
