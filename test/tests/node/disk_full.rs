//! A full disk under the state directory: weftd's state on a 4 MiB tmpfs that only it
//! sees (a mount namespace of its own, so nothing stays mounted on the host), filled
//! from outside through `/proc/<pid>/root`. An ADD then fails with code 11 naming the
//! cause and leaves nothing behind; `/readyz` and `weft_store_writable` say the store
//! cannot write; a DEL still succeeds (the pod is cut off now, its rows go once the
//! store writes again); and once the space is freed everything works again: ready, the
//! deleted pod's rows and address gone, a new pod attached, the other pod untouched.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weft_tests::{Call, Daemon, Netns, privileged, result_address, series_value, sh};

const V4: &str = "10.251.0.0/24";
const GATEWAY: &str = "10.251.0.1";
/// How long each condition the test waits for may take: the store is probed every 5 s.
const LIMIT: Duration = Duration::from_secs(15);

/// `/readyz`: its status code and body.
fn readyz(d: &Daemon) -> (u16, String) {
    let out = sh(d.node.cmd("curl").args([
        "-s",
        "--max-time",
        "5",
        "-w",
        "\n%{http_code}",
        "http://127.0.0.1:9384/readyz",
    ]));
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.trim().parse().unwrap_or(0), body.trim().to_string())
}

/// `weft_store_writable` on the metrics page (-1 when it is missing).
fn store_writable(d: &Daemon) -> f64 {
    let page = d.http_get("/metrics", "text/plain");
    if page.lines().any(|l| l.starts_with("weft_store_writable ")) {
        series_value(&page, "weft_store_writable")
    } else {
        -1.0
    }
}

/// Polls `f` every 100 ms until it holds or `limit` passes; how long it took.
fn within(limit: Duration, what: &str, d: &Daemon, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what} within {limit:?}:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    t.elapsed()
}

/// Writes `path` until the file system says it is full; how many bytes it took.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let chunk = vec![0x5a_u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    written
}

/// The spooled DELs waiting beside `d`'s socket.
fn spooled(d: &Daemon) -> Vec<PathBuf> {
    let dir = d.socket().parent().unwrap().join("del-spool");
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "del"))
        .collect()
}

#[test]
fn a_full_state_disk_fails_adds_cleanly_keeps_dels_working_and_recovers_once_freed() {
    let _area = weft_tests::area("node::disk_full");
    if !privileged() {
        return;
    }
    let tag = "dfull";
    let d = Daemon::start_configured(Netns::new(tag), tag, |c| {
        c.state_fs_size = Some("4m".into());
    });
    // The state is on the small file system, the socket (and its DEL spool) is not.
    let mounts = sh(std::process::Command::new("cat").arg(format!("/proc/{}/mounts", d.pid())));
    let state = d.state_dir();
    assert!(
        mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(state.to_str().unwrap()) && l.contains("tmpfs")),
        "weftd's state dir is a tmpfs of its own:\n{mounts}"
    );
    let host_mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !host_mounts.contains(state.to_str().unwrap()),
        "nothing is mounted in the test's namespace"
    );
    let conf = d.conf("1.1.0", &[V4]);
    let cid = |i: usize| format!("ctr-{tag}-{i}");
    let pods: Vec<Netns> = (0..3).map(|i| Netns::new(&format!("{tag}-p{i}"))).collect();

    // Two pods, connected.
    let mut addresses = Vec::new();
    for (i, pod) in pods.iter().take(2).enumerate() {
        let r = Call::new("ADD", &cid(i), &pod.path(), &conf).run().ok();
        addresses.push(result_address(&r, false));
        assert!(pod.ping(GATEWAY), "pod {i} reaches its gateway before");
    }
    assert_eq!(readyz(&d).0, 200);
    assert_eq!(store_writable(&d), 1.0);
    let mut before = d.store_attachments();
    before.sort_by(|a, b| a.key.container_id.cmp(&b.key.container_id));
    assert_eq!(before.len(), 2);
    let host_links = d.node.links();

    // Fill the disk.
    let ballast = d.state_dir_seen().join("ballast");
    let filled = fill(&ballast);
    assert!(filled > 0, "the state file system had room to fill");

    // An ADD fails, naming the cause, and leaves nothing behind.
    let t_add = Instant::now();
    let out = Call::new("ADD", &cid(2), &pods[2].path(), &conf).run();
    let add_took = t_add.elapsed();
    assert_eq!(out.err_code(), 11, "try again later: {out:?}");
    let err = out.json();
    let details = err["details"].as_str().unwrap_or_default();
    assert!(
        details.starts_with("the state store cannot be written: ") && details.contains("disk is full"),
        "{err}"
    );
    assert_eq!(pods[2].links(), vec!["lo"], "no interface in the pod");
    assert_eq!(d.node.links(), host_links, "no new host end");

    // Not ready, and the metric says why.
    let not_ready = within(LIMIT, "/readyz 503 and weft_store_writable 0", &d, || {
        let (code, body) = readyz(&d);
        code == 503 && body.contains("the state store cannot be written") && store_writable(&d) == 0.0
    });

    // The other pods keep their connectivity.
    for (i, pod) in pods.iter().take(2).enumerate() {
        assert!(pod.ping(GATEWAY), "pod {i} reaches its gateway while the disk is full");
    }

    // DEL succeeds: the pod is cut off now; the DEL waits in the spool for the store.
    Call::new("DEL", &cid(0), &pods[0].path(), &conf).run().ok();
    assert_eq!(pods[0].links(), vec!["lo"], "the deleted pod's interface is gone");
    let host0 = &before[0].host_ifname;
    assert!(
        !d.node.links().contains(host0),
        "the deleted pod's host end {host0} is gone"
    );
    assert_eq!(spooled(&d).len(), 1, "the DEL waits in the spool");
    // A repeated DEL (runtimes retry) succeeds too.
    Call::new("DEL", &cid(0), &pods[0].path(), &conf).run().ok();
    assert!(pods[1].ping(GATEWAY), "the other pod is untouched");
    // A reconcile pass must not rebuild the deleted pod's veth meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!d.node.links().contains(host0), "{}", d.log());
    assert_eq!(pods[0].links(), vec!["lo"]);

    // Free the space.
    std::fs::remove_file(&ballast).unwrap();
    let ready_again = within(LIMIT, "/readyz 200 and weft_store_writable 1", &d, || {
        readyz(&d).0 == 200 && store_writable(&d) == 1.0
    });
    let rows_gone = within(LIMIT, "the deleted pod's rows gone", &d, || {
        spooled(&d).is_empty() && d.store_attachments().len() == 1
    });

    // Exactly the other pod's row is left, as it was; the deleted pod's address is free.
    let after = d.store_attachments();
    assert_eq!(after, vec![before[1].clone()], "rows once writable again");
    let allocated: Vec<String> = d.store_allocated().iter().map(ToString::to_string).collect();
    assert_eq!(
        allocated,
        vec![addresses[1].clone()],
        "only the remaining pod's address is held"
    );
    assert!(d.log().contains("spooled DEL replayed"), "{}", d.log());

    // A new pod is attached and connected; the remaining one still is.
    let r = Call::new("ADD", &cid(2), &pods[2].path(), &conf).run().ok();
    assert_ne!(result_address(&r, false), addresses[1]);
    assert!(pods[2].ping(GATEWAY), "the new pod reaches its gateway");
    assert!(pods[1].ping(GATEWAY), "the remaining pod reaches its gateway after");

    eprintln!(
        "disk full: ADD failed in {add_took:?}; not ready after {not_ready:?}; ready again {ready_again:?} after \
         the space was freed; the deleted pod's rows gone {rows_gone:?} after that; ballast {filled} bytes"
    );

    for (i, pod) in pods.iter().enumerate().skip(1) {
        Call::new("DEL", &cid(i), &pod.path(), &conf).run().ok();
    }
    d.assert_clean();
}
