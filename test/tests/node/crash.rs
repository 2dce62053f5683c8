//! Crash consistency, one failpoint at a time: weftd is aborted at every step of ADD and
//! DEL (each name of `weft_failpoint::ALL`, armed through `WEFT_FAILPOINT`), then
//! started again without it. A crashed ADD never answers success; after the restart the
//! pod exists completely or not at all; a DEL repeated after the restart leaves nothing.
//!
//! The pods ask for a host port, so the host-port steps are crossed too and a leftover
//! map element would be seen.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weft_tests::{Call, Daemon, Netns, privileged, sh};

const V4: &str = "10.252.0.0/24";
const V6: &str = "fd00:252::/64";
const HOST_PORT: u16 = 18099;
const CID: &str = "ctr-crash";

fn conf(d: &Daemon) -> String {
    let mut c: Value = serde_json::from_str(&d.conf("1.1.0", &[V4, V6])).unwrap();
    c["runtimeConfig"] = json!({"portMappings": [{"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}]});
    c.to_string()
}

/// What a crash at a failpoint must leave once weftd has started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The pod as a successful ADD leaves it.
    Complete,
    /// Nothing of the pod.
    Absent,
}

/// An ADD's pod survives a crash only once its row is committed `ready` (the crash
/// then only lost the answer); before, the row is `creating` and start-up recovery rolls
/// it back. A DEL's pod never survives: after the `deleting` intent is committed,
/// recovery finishes the teardown; before, the plugin spooled the DEL it could not
/// finish and weftd replays it at start.
fn expected(failpoint: &str) -> Outcome {
    match failpoint {
        "add.done" => Outcome::Complete,
        _ => Outcome::Absent,
    }
}

/// Whether weft's nftables table in the node holds the test's host port.
fn host_port_mapped(d: &Daemon) -> bool {
    sh(d.node.cmd("nft").args(["list", "ruleset"])).contains(&HOST_PORT.to_string())
}

/// Routes of the main table in `ns`, both families.
fn routes(ns: &Netns) -> Vec<Value> {
    let mut v = ns.ip_json(&["-4", "route", "show"]).as_array().unwrap().clone();
    v.extend(ns.ip_json(&["-6", "route", "show"]).as_array().unwrap().iter().cloned());
    v
}

/// Nothing of the pod is left: no interface or route on either side, no row, no
/// allocated address, no host port.
fn assert_absent(fp: &str, d: &Daemon, pod: &Netns) {
    assert_eq!(d.node.links(), vec!["lo"], "{fp}: interfaces left on the node");
    assert!(
        d.node.weft_routes().is_empty(),
        "{fp}: routes left: {:?}",
        d.node.weft_routes()
    );
    assert_eq!(pod.links(), vec!["lo"], "{fp}: interfaces left in the pod");
    assert!(
        routes(pod).is_empty(),
        "{fp}: routes left in the pod: {:?}",
        routes(pod)
    );
    let rows = d.store_attachments();
    assert!(rows.is_empty(), "{fp}: rows left in the store: {rows:?}");
    assert!(
        d.store_allocated().is_empty(),
        "{fp}: addresses left: {:?}",
        d.store_allocated()
    );
    assert_eq!(d.allocated(), 0, "{fp}: weftctl status counts allocated addresses");
    assert!(!host_port_mapped(d), "{fp}: the host port is still mapped");
}

/// The pod is all there, as one successful ADD leaves it: its row is ready and holds
/// the addresses, the veth has both ends, the addresses and routes are in place on both
/// sides, the host port is mapped, the node reaches the pod, CHECK passes, and ADD
/// repeated returns one and the same result. Returns that result.
fn assert_complete(fp: &str, d: &Daemon, pod: &Netns, conf: &str) -> Value {
    let rows = d.store_attachments();
    assert_eq!(rows.len(), 1, "{fp}: {rows:?}");
    assert_eq!(rows[0].state, weft_store::State::Ready, "{fp}: {rows:?}");
    let host_if = rows[0].host_ifname.clone();
    // Look at the kernel before any call: the repeated ADD below must not be what
    // builds the pod.
    assert_eq!(
        d.node.links_but_gateway(),
        vec!["lo".to_string(), host_if.clone()],
        "{fp}"
    );
    assert_eq!(pod.links(), vec!["lo", "eth0"], "{fp}");

    let r = Call::new("ADD", CID, &pod.path(), conf).run().ok();
    assert_eq!(r["interfaces"][0]["name"], host_if.as_str(), "{fp}: {r}");
    let addrs: Vec<String> = r["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["address"].as_str().unwrap().split('/').next().unwrap().to_string())
        .collect();
    let stored: Vec<String> = rows[0].addresses.iter().map(|a| a.address.to_string()).collect();
    assert_eq!(addrs, stored, "{fp}: the result names other addresses than the store");
    assert_eq!(addrs.len(), 2, "{fp}: {r}");
    let mut allocated: Vec<String> = d.store_allocated().iter().map(|a| a.to_string()).collect();
    allocated.sort();
    let mut want = addrs.clone();
    want.sort();
    assert_eq!(allocated, want, "{fp}: allocations besides the pod's");

    let eth0 = pod.ip_json(&["addr", "show", "eth0"]);
    let local: Vec<&str> = eth0[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["local"].as_str().unwrap())
        .collect();
    let node_routes: Vec<(String, String)> = d
        .node
        .weft_routes()
        .iter()
        .map(|r| {
            (
                r["dst"].as_str().unwrap().to_string(),
                r["dev"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for a in &addrs {
        assert!(local.contains(&a.as_str()), "{fp}: {a} is not on eth0: {local:?}");
        assert!(
            node_routes.contains(&(a.clone(), host_if.clone())),
            "{fp}: no node route to {a} via {host_if}: {node_routes:?}"
        );
        assert!(d.node.ping(a), "{fp}: the node cannot reach {a}");
    }
    for fam in ["-4", "-6"] {
        let default = pod.ip_json(&[fam, "route", "show", "default"]);
        assert_eq!(
            default.as_array().unwrap().len(),
            1,
            "{fp}: pod default route {fam}: {default}"
        );
    }
    assert!(host_port_mapped(d), "{fp}: the host port is not mapped");

    let mut with_prev: Value = serde_json::from_str(conf).unwrap();
    with_prev["prevResult"] = r.clone();
    let check = Call::new("CHECK", CID, &pod.path(), &with_prev.to_string()).run();
    assert_eq!(check.code, 0, "{fp}: CHECK failed: {check:?}");
    let again = Call::new("ADD", CID, &pod.path(), conf).run().ok();
    assert_eq!(again, r, "{fp}: ADD repeated returned another result");
    assert_eq!(
        d.node.links_but_gateway().len(),
        2,
        "{fp}: the repeated ADD built another veth"
    );
    r
}

/// Starts weftd again without the failpoint once the armed one has died of it.
fn expect_abort_and_restart(fp: &str, d: &mut Daemon) {
    let st = d
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("{fp}: weftd did not die at the failpoint:\n{}", d.log()));
    assert_eq!(
        st.signal(),
        Some(libc::SIGABRT),
        "{fp}: weftd ended otherwise than by the failpoint ({st}):\n{}",
        d.log()
    );
    d.set_env(&[]);
    d.start_again();
}

/// The state either outcome allows, then the one this failpoint must produce.
fn assert_outcome(fp: &str, d: &Daemon, pod: &Netns, conf: &str) -> Option<Value> {
    let found = if d.store_attachments().is_empty() && d.node.links() == ["lo"] {
        assert_absent(fp, d, pod);
        Outcome::Absent
    } else {
        Outcome::Complete
    };
    let result = (found == Outcome::Complete).then(|| assert_complete(fp, d, pod, conf));
    assert_eq!(found, expected(fp), "{fp}: wrong outcome after the restart");
    result
}

/// ADD crashes at `fp`; after the restart the pod is complete or absent; DEL cleans up.
fn crash_in_add(fp: &str) {
    let mut d = Daemon::start_with_env("cra", &[("WEFT_FAILPOINT", fp)]);
    let conf = conf(&d);
    let pod = Netns::new("pod");
    let out = Call::new("ADD", CID, &pod.path(), &conf).run();
    assert_ne!(
        out.code, 0,
        "{fp}: an ADD answered success from a crashed call: {out:?}"
    );
    assert_eq!(out.err_code(), 11, "{fp}: {out:?}");
    expect_abort_and_restart(fp, &mut d);
    assert_outcome(fp, &d, &pod, &conf);
    Call::new("DEL", CID, &pod.path(), &conf).run().ok();
    d.assert_clean();
    assert_absent(fp, &d, &pod);
}

/// ADD succeeds; DEL crashes at `fp`; after the restart the pod is complete or absent;
/// DEL repeated leaves nothing.
fn crash_in_del(fp: &str) {
    let mut d = Daemon::start("crd");
    let conf = conf(&d);
    let pod = Netns::new("pod");
    let added = Call::new("ADD", CID, &pod.path(), &conf).run().ok();
    d.kill();
    d.set_env(&[("WEFT_FAILPOINT", fp)]);
    d.start_again();
    // DEL answers once the pod is cut off, so a crash in the teardown after that may
    // follow a success; a crash before the answer leaves the DEL in the spool, which
    // is a success too.
    let out = Call::new("DEL", CID, &pod.path(), &conf).run();
    assert_eq!(out.code, 0, "{fp}: {out:?}");
    expect_abort_and_restart(fp, &mut d);
    if let Some(r) = assert_outcome(fp, &d, &pod, &conf) {
        assert_eq!(r, added, "{fp}: the surviving pod is not the one ADD made");
    }
    Call::new("DEL", CID, &pod.path(), &conf).run().ok();
    d.assert_clean();
    assert_absent(fp, &d, &pod);
}

#[test]
fn every_failpoint_leaves_all_or_nothing() {
    let _area = weft_tests::area("node::crash");
    if !privileged() {
        return;
    }
    if !cfg!(debug_assertions) {
        // Failpoints exist only with debug assertions; the binaries beside this test
        // were built with the same profile.
        eprintln!("release build: failpoints are compiled out, nothing to test");
        return;
    }
    let mut report = Vec::new();
    for &fp in weft_failpoint::ALL {
        let t = Instant::now();
        match fp.split('.').next() {
            Some("add") => crash_in_add(fp),
            Some("del") => crash_in_del(fp),
            _ => panic!("failpoint {fp} is neither ADD's nor DEL's: teach this test about it"),
        }
        report.push(format!("{fp}: {:?} ({:.1?})", expected(fp), t.elapsed()));
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn an_unarmed_daemon_ignores_other_failpoint_names() {
    let _area = weft_tests::area("node::crash");
    if !privileged() {
        return;
    }
    // A name that is no failpoint arms nothing: the whole life cycle runs through.
    let d = Daemon::start_with_env("crn", &[("WEFT_FAILPOINT", "add.nothing,del.nothing")]);
    let conf = conf(&d);
    let pod = Netns::new("pod");
    Call::new("ADD", CID, &pod.path(), &conf).run().ok();
    Call::new("DEL", CID, &pod.path(), &conf).run().ok();
    d.assert_clean();
}
