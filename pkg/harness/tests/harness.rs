//! The harness's own behaviour: plugin calls see exactly the environment and input
//! they are given and are killed past their limit, guards leave nothing running, and
//! (as root) named namespaces are entered and removed as promised.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_harness::{CallOptions, ChildGuard, CniExec, CniVars, HarnessError, NamedNetns, wait_for_socket};
use weft_kernel::testutil::privileged;

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("weft-harness-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn cni_vars_leave_out_an_empty_netns() {
    let mut vars = CniVars {
        command: "DEL",
        container_id: "c1",
        netns: "",
        ifname: "eth0",
        args: "K8S_POD_NAME=p",
    };
    let env = vars.env("/opt/cni/bin");
    assert!(env.iter().all(|(k, _)| k != "CNI_NETNS"), "{env:?}");
    assert!(env.contains(&("CNI_PATH".into(), "/opt/cni/bin".into())), "{env:?}");
    assert!(env.contains(&("CNI_COMMAND".into(), "DEL".into())), "{env:?}");
    vars.netns = "/run/netns/p";
    let env = vars.env("/x");
    assert!(env.contains(&("CNI_NETNS".into(), "/run/netns/p".into())), "{env:?}");
    assert_eq!(env.len(), 6);
}

#[test]
fn a_call_sees_only_its_environment_and_its_input() {
    let env = CniExec::new(Path::new("/usr/bin/env"));
    assert_eq!(env.cni_path, "/usr/bin");
    let out = env
        .run([("CNI_COMMAND", "VERSION")], b"", CallOptions::default())
        .unwrap();
    assert_eq!(out.stdout, b"CNI_COMMAND=VERSION\n", "nothing of the caller's leaks in");
    let config = b"{\"cniVersion\":\"1.1.0\"}";
    let out = CniExec::new(Path::new("/bin/cat"))
        .run([("X", "1")], config, CallOptions::default())
        .unwrap();
    assert_eq!(out.stdout, config);
    let out = CniExec::new(Path::new("/bin/sh"))
        .run(
            [("X", "1")],
            b"echo oops >&2; exit 3",
            CallOptions {
                capture_stderr: true,
                ..CallOptions::default()
            },
        )
        .unwrap();
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!(out.code, 3);
    assert!(!out.ok());
}

#[test]
fn stderr_is_dropped_unless_asked_for() {
    let out = CniExec::new(Path::new("/bin/sh"))
        .run([("X", "1")], b"echo out; echo err >&2", CallOptions::default())
        .unwrap();
    assert!(out.ok());
    assert_eq!(out.stdout, b"out\n");
    assert!(out.stderr.is_empty());
}

#[test]
fn a_call_past_its_limit_is_killed() {
    let start = Instant::now();
    let err = CniExec::new(Path::new("/bin/sh"))
        .run(
            [("X", "1")],
            b"exec /bin/sleep 30",
            CallOptions {
                limit: Some(Duration::from_millis(200)),
                ..CallOptions::default()
            },
        )
        .unwrap_err();
    assert!(matches!(err, HarnessError::TimedOut { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_guarded_child_is_killed_on_drop() {
    let child = Command::new("/bin/sleep")
        .arg("30")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard::new(child);
    let pid = guard.pid();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(guard);
    // Reaped too: no zombie is left under that pid.
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn output_within_gives_stdout_or_times_out() {
    let child = Command::new("/bin/echo")
        .arg("hi")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(
        ChildGuard::new(child).output_within(Duration::from_secs(10)).unwrap(),
        b"hi\n"
    );
    let child = Command::new("/bin/sleep")
        .arg("30")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let err = ChildGuard::new(child)
        .output_within(Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(err, HarnessError::TimedOut { .. }), "{err}");
}

#[test]
fn waiting_for_a_socket_ends_when_it_answers_or_its_server_is_gone() {
    let dir = scratch("sock");
    let path = dir.join("s.sock");
    let start = Instant::now();
    assert!(!wait_for_socket(&path, Duration::from_secs(10), || false));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "gave up as soon as the server was gone"
    );
    let _listener = UnixListener::bind(&path).unwrap();
    assert!(wait_for_socket(&path, Duration::from_secs(10), || true));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_named_namespace_is_entered_and_removed() {
    if !privileged() {
        return;
    }
    let name = format!("wh{}-ns", std::process::id());
    let here = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    {
        let ns = NamedNetns::create(&name).unwrap();
        assert!(NamedNetns::exists(&name));
        let inside = ns
            .within(|| std::fs::read_link("/proc/thread-self/ns/net").unwrap())
            .unwrap();
        assert_ne!(inside, here, "the closure ran in the namespace");
        assert_eq!(
            std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
            here,
            "the caller stayed"
        );
        // A process started inside it sees the namespace's interfaces: only lo.
        let mut cmd = Command::new("/bin/ls");
        cmd.arg("/proc/self/net/dev_snmp6").stdout(Stdio::piped());
        ns.enter_in_child(&mut cmd).unwrap();
        let out = cmd.output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "lo");
        // Made as `ip netns add` makes one: iproute2 lists it, enters it, and finds
        // lo up there.
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(
            String::from_utf8_lossy(&list.stdout)
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name.as_str())),
            "ip netns list shows it"
        );
        let lo = ns.command(["ip", "-o", "link", "show", "lo"]).output().unwrap();
        assert!(String::from_utf8_lossy(&lo.stdout).contains(",UP"), "lo is up: {lo:?}");
        // A second create of the same name fails and leaves the first alone.
        assert!(NamedNetns::create(&name).is_err());
        assert!(NamedNetns::exists(&name));
        // A plugin call on a "node" runs in the node's namespace, the caller stays.
        let out = CniExec::new(Path::new("/bin/sh"))
            .run(
                [("X", "1")],
                b"ls /proc/self/net/dev_snmp6",
                CallOptions {
                    node: Some(&ns),
                    ..CallOptions::default()
                },
            )
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "lo",
            "the plugin ran in the node"
        );
        assert_eq!(std::fs::read_link("/proc/thread-self/ns/net").unwrap(), here);
        // A handle on it does not remove it.
        drop(NamedNetns::existing(&name));
        assert!(NamedNetns::exists(&name));
    }
    assert!(!NamedNetns::exists(&name), "removed on drop");
    let kept = NamedNetns::create(&name).unwrap().keep();
    assert!(NamedNetns::exists(&kept));
    NamedNetns::existing(&kept).delete().unwrap();
    assert!(!NamedNetns::exists(&kept));
}
