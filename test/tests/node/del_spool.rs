//! DEL never waits for a down weftd: the plugin spools it (beside weftd's socket,
//! root-only) and answers success; weftd replays the spool before it serves, so nothing
//! of the pods is left and an ADD of a spooled container gets a fresh attachment. A
//! spooled DEL that lands once weftd serves, or between its start-up replay and serving
//! (forced with pause points), is replayed at once by the spool watch, and in any case
//! ahead of that pod's ADD.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_tests::{Call, Daemon, Netns, privileged, result_address};

const V4: &str = "10.253.0.0/24";
const PODS: usize = 50;

/// The spool directory of `d`'s socket (what the plugin and weftd agree on).
fn spool_dir(d: &Daemon) -> PathBuf {
    d.socket().parent().unwrap().join("del-spool")
}

/// The spooled DELs waiting in `dir` (temporary and set-aside files are not).
fn spooled(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "del"))
        .collect()
}

/// The pod is set up as the result says and CHECK agrees.
fn assert_consistent(d: &Daemon, pod: &Netns, cid: &str, conf: &str, result: &Value) {
    let addr = result_address(result, false);
    assert!(d.node.ping(&addr), "node cannot reach {addr}");
    // CHECK gets the ADD result as prevResult, as runtimes send it.
    let mut with_prev: Value = serde_json::from_str(conf).unwrap();
    with_prev["prevResult"] = result.clone();
    Call::new("CHECK", cid, &pod.path(), &with_prev.to_string()).run().ok();
    let rows = d.store_attachments();
    let mine: Vec<_> = rows.iter().filter(|a| a.key.container_id == cid).collect();
    assert_eq!(mine.len(), 1, "one row for {cid}: {rows:?}");
    let allocated: Vec<String> = d.store_allocated().iter().map(ToString::to_string).collect();
    assert_eq!(allocated, vec![addr], "only the new pod's address is allocated");
}

/// Stops weftd, lets the plugin spool a DEL of `cid`, keeps the spool file out of
/// weftd's start-up replay and starts weftd again; returns the spool directory, where
/// the file belongs and where it is held, so the test puts it back as a plugin that
/// missed the restarting weftd would write it: late.
fn spool_one_late(d: &mut Daemon, pod: &Netns, cid: &str, conf: &str) -> (PathBuf, PathBuf, PathBuf) {
    d.stop().expect("weftd stops on SIGTERM");
    Call::new("DEL", cid, &pod.path(), conf).run().ok();
    let dir = spool_dir(d);
    let files = spooled(&dir);
    assert_eq!(files.len(), 1);
    let aside = d.dir().join("held.del");
    std::fs::rename(&files[0], &aside).unwrap();
    d.start_again();
    (dir, files[0].clone(), aside)
}

#[test]
fn dels_while_weftd_is_down_are_spooled_and_replayed_before_it_serves() {
    let _area = weft_tests::area("node::del_spool");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("spool");
    let conf = d.conf("1.1.0", &[V4]);
    let pods: Vec<Netns> = (0..PODS).map(|_| Netns::new("sp")).collect();
    let cid = |i: usize| format!("ctr-spool-{i}");
    for (i, p) in pods.iter().enumerate() {
        Call::new("ADD", &cid(i), &p.path(), &conf).run().ok();
    }
    assert_eq!(d.status()["attachments"], PODS as u64);
    let veths = d.node.links_but_gateway().len() - 1;
    assert_eq!(veths, PODS, "one host end per pod");

    d.stop().expect("weftd stops on SIGTERM");
    let mut slowest = Duration::ZERO;
    for (i, p) in pods.iter().enumerate() {
        let t = Instant::now();
        let out = Call::new("DEL", &cid(i), &p.path(), &conf).run();
        slowest = slowest.max(t.elapsed());
        assert_eq!(out.code, 0, "DEL {i} with weftd down: {out:?}");
        assert!(out.stdout.trim().is_empty(), "{out:?}");
    }
    eprintln!("{PODS} DELs with weftd down; slowest answered in {slowest:?}");
    let dir = spool_dir(&d);
    let files = spooled(&dir);
    assert_eq!(files.len(), PODS, "one spool entry per DEL: {files:?}");
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    for f in &files {
        assert_eq!(
            std::fs::metadata(f).unwrap().permissions().mode() & 0o777,
            0o600,
            "{}",
            f.display()
        );
    }
    // Nothing was torn down meanwhile: weftd does it.
    assert_eq!(d.node.links_but_gateway().len() - 1, PODS);

    let t = Instant::now();
    d.start_again();
    eprintln!("weftd replayed {PODS} spooled DELs and served within {:?}", t.elapsed());
    assert!(spooled(&dir).is_empty(), "replayed before serving: {:?}", spooled(&dir));
    d.assert_clean();
    assert!(d.store_attachments().is_empty(), "rows left");
    assert!(d.store_allocated().is_empty(), "addresses left");
    let metrics = d.http_get("/metrics", "text/plain");
    assert!(
        metrics.contains(&format!("weft_del_spool_replayed_total {PODS}")),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("spool"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // A spooled container id comes back: a fresh, consistent attachment.
    let r = Call::new("ADD", &cid(0), &pods[0].path(), &conf).run().ok();
    assert_consistent(&d, &pods[0], &cid(0), &conf, &r);
    Call::new("DEL", &cid(0), &pods[0].path(), &conf).run().ok();
    d.assert_clean();
    for p in pods {
        p.delete();
    }
}

#[test]
fn a_del_spooled_while_weftd_restarted_is_done_before_the_pods_next_add() {
    let _area = weft_tests::area("node::del_spool");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("spool-add");
    let conf = d.conf("1.1.0", &[V4]);
    let pod = Netns::new("sa");
    let cid = "ctr-spool-add";
    let first = Call::new("ADD", cid, &pod.path(), &conf).run().ok();
    let host_if = first["interfaces"][0]["name"].as_str().unwrap().to_string();

    let (dir, file, aside) = spool_one_late(&mut d, &pod, cid, &conf);
    assert!(d.node.links().contains(&host_if), "the old attachment is still there");
    std::fs::rename(&aside, &file).unwrap();
    // The spool watch may replay it first; if not, the ADD must do it before anything.
    let second = Call::new("ADD", cid, &pod.path(), &conf).run().ok();
    assert!(spooled(&dir).is_empty(), "the ADD did the spooled DEL first");
    assert_eq!(d.status()["spooled_dels"], 0);
    d.settle();
    assert_consistent(&d, &pod, cid, &conf, &second);
    let links = d.node.links_but_gateway();
    assert_eq!(links.len(), 2, "lo and the new pod's host end: {links:?}");
    Call::new("DEL", cid, &pod.path(), &conf).run().ok();
    d.assert_clean();
    pod.delete();
}

#[test]
fn a_del_spooled_while_weftd_serves_is_replayed_without_a_call_for_the_pod() {
    let _area = weft_tests::area("node::del_spool");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start_with_env("spool-tick", &[("WEFT_RECONCILE_INTERVAL", "1")]);
    let conf = d.conf("1.1.0", &[V4]);
    let pod = Netns::new("st");
    let cid = "ctr-spool-tick";
    Call::new("ADD", cid, &pod.path(), &conf).run().ok();
    let (dir, file, aside) = spool_one_late(&mut d, &pod, cid, &conf);
    assert_eq!(d.status()["attachments"], 1);
    std::fs::rename(&aside, &file).unwrap();
    // No call for the pod comes: the spool watch (or, without one, the next reconcile
    // pass) does the DEL.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !spooled(&dir).is_empty() {
        assert!(Instant::now() < deadline, "it was never replayed:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    d.assert_clean();
    pod.delete();
}

/// Waits until `file` exists (a pause point says it holds its process there).
fn wait_paused(file: &Path, who: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(Instant::now() < deadline, "{who} never reached its pause point");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The window the start-up replay leaves: a plugin that gave up on the down weftd but
/// writes its spool file only after the restarted weftd has read the spool. Both are
/// held at pause points to force exactly that order; with the reconcile pass ten
/// minutes away, only the spool watch can replay the DEL, and it must do so at once.
#[test]
fn a_del_spooled_after_the_start_up_replay_read_the_spool_is_replayed_at_once() {
    let _area = weft_tests::area("node::del_spool");
    if !privileged() {
        return;
    }
    let long = [("WEFT_RECONCILE_INTERVAL", "600")];
    let mut d = Daemon::start_with_env("spool-window", &long);
    let conf = d.conf("1.1.0", &[V4]);
    let pod = Netns::new("sw");
    let cid = "ctr-spool-window";
    Call::new("ADD", cid, &pod.path(), &conf).run().ok();
    d.stop().expect("weftd stops on SIGTERM");

    // The plugin finds no weftd and stops just before writing its spool file.
    let plugin_release = d.dir().join("release-plugin");
    let plugin_paused = d.dir().join("release-plugin.paused");
    let mut del = Call::new("DEL", cid, &pod.path(), &conf);
    del.env.push((
        "WEFT_PAUSE".into(),
        format!("plugin.spool={}", plugin_release.display()),
    ));
    let plugin = std::thread::spawn(move || del.run());
    wait_paused(&plugin_paused, "the plugin");

    // weftd starts, replays an empty spool, and is held before it serves.
    let weftd_release = d.dir().join("release-weftd");
    let weftd_paused = d.dir().join("release-weftd.paused");
    let pause = format!("start.spool_replayed={}", weftd_release.display());
    d.set_env(&[long[0], ("WEFT_PAUSE", &pause)]);
    d.spawn_again();
    wait_paused(&weftd_paused, "weftd");
    let dir = spool_dir(&d);
    assert!(spooled(&dir).is_empty(), "nothing was spooled before the read");

    // Now the plugin writes: after the read, before weftd serves.
    std::fs::write(&plugin_release, "").unwrap();
    let out = plugin.join().unwrap();
    assert_eq!(out.code, 0, "the DEL succeeds by spooling: {out:?}");
    assert_eq!(spooled(&dir).len(), 1, "the DEL waits in the spool");

    std::fs::write(&weftd_release, "").unwrap();
    let released = Instant::now();
    d.wait_serving();
    while !spooled(&dir).is_empty() || d.status()["attachments"] != 0 {
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "the late DEL was not replayed (spool: {:?}):\n{}",
            spooled(&dir),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "the DEL spooled after the start-up replay was done {:?} after weftd went on",
        released.elapsed()
    );
    d.settle();
    d.assert_clean();
    let metrics = d.http_get("/metrics", "text/plain");
    assert!(metrics.contains("weft_del_spool_replayed_total 1"), "counted once");
    pod.delete();
}
