//! A generated lab at a size CI can afford, driven through `weftctl` as a user drives
//! it: `lab gen` a ring of 100 pods on 3 nodes with 300 links (gRPC, VXLAN and veth),
//! `lab up`, `lab check` with every link end and every pod-network probe answering,
//! `lab down` leaving no namespace, daemon or state behind. The daemons start with a
//! soft open-file limit of 512 and must raise it themselves. The 1,500-link run is in
//! docs/BENCHMARKS.md.

use std::process::Command;
use std::time::{Duration, Instant};

use weft_tests::{TempDir, bin, privileged};

const PODS: usize = 100;
const LINKS: usize = 300;

/// This process's hard limit on open files (raising it needs more than root in some
/// containers, so the test keeps it).
fn hard_nofile() -> String {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    line.split_whitespace().nth(4).unwrap().to_string()
}

fn weftctl(state: &std::path::Path, args: &[&str]) -> std::process::Output {
    // A low soft limit (what many service managers give) under the hard one: weftd
    // raises its own.
    Command::new("prlimit")
        .arg(format!("--nofile=512:{}", hard_nofile()))
        .arg(bin("weftctl"))
        .args(args)
        .env("WEFT_LAB_DIR", state)
        .output()
        .expect("running weftctl")
}

fn lab_namespaces(name: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{name}-")))
        .map(str::to_string)
        .collect()
}

/// Takes the lab down if the test stops half-way.
struct Down<'a>(&'a std::path::Path, &'a std::path::Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = weftctl(self.0, &["lab", "down", &self.1.display().to_string()]);
    }
}

#[test]
fn a_generated_300_link_lab_passes_every_check_and_leaves_nothing() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("scale");
    let state = dir.path().join("state");
    let name = format!("ws{}", std::process::id());
    let file = dir.path().join("lab.yaml");
    let f = file.display().to_string();
    let out = weftctl(
        &state,
        &[
            "lab",
            "gen",
            "--pods",
            &PODS.to_string(),
            "--links",
            &LINKS.to_string(),
            "--nodes",
            "3",
            "--kind",
            "mixed",
            "--name",
            &name,
            "-o",
            &f,
        ],
    );
    assert!(
        out.status.success(),
        "lab gen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _down = Down(&state, &file);

    let t = Instant::now();
    let out = weftctl(&state, &["lab", "up", &f]);
    assert!(out.status.success(), "lab up: {}", String::from_utf8_lossy(&out.stderr));
    let up = t.elapsed();

    // The daemons raised their soft open-file limit from the 512 they were given.
    for n in ["n1", "n2", "n3"] {
        let pid = std::fs::read_to_string(state.join(&name).join("nodes").join(n).join("weftd.pid")).unwrap();
        let pid = pid.split_whitespace().next().unwrap();
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        assert_eq!(
            line.split_whitespace().nth(3),
            Some(hard_nofile().as_str()),
            "weftd on {n} raises its soft limit to the hard one: {line}"
        );
    }

    let t = Instant::now();
    let out = weftctl(&state, &["--json", "lab", "check", &f]);
    let check = t.elapsed();
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("lab check --json");
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c["ok"] != true)
        .map(|c| format!("{} -> {} ({}): {}", c["from"], c["to"], c["kind"], c["reason"]))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} checks failed, e.g. {:?}",
        failed.len(),
        checks.len(),
        &failed[..failed.len().min(10)]
    );
    assert!(out.status.success());
    let links: Vec<&serde_json::Value> = checks
        .iter()
        .filter(|c| !["eth0", "node", "outside"].contains(&c["kind"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(links.len(), 2 * LINKS, "every link, from both ends");
    let kinds: std::collections::BTreeSet<&str> = links.iter().filter_map(|c| c["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        ["grpc", "veth", "vxlan"].into_iter().collect(),
        "every link kind in use"
    );
    // Every pod reaches every pod of the other nodes, the other nodes and the outside.
    let per_pod = 2 * PODS / 3 + 2 + 1;
    assert!(
        checks.len() - links.len() >= PODS * (per_pod - 1),
        "pod-network probes: {}",
        checks.len() - links.len()
    );
    eprintln!(
        "{LINKS} links, {PODS} pods on 3 nodes: lab up {:.1} s, lab check {:.1} s ({} checks)",
        up.as_secs_f64(),
        check.as_secs_f64(),
        checks.len()
    );
    assert!(check < Duration::from_secs(60), "lab check took {check:?}");

    let pids: Vec<String> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| {
            let p = std::fs::read_to_string(state.join(&name).join("nodes").join(n).join("weftd.pid")).unwrap();
            p.split_whitespace().next().unwrap().to_string()
        })
        .collect();
    let out = weftctl(&state, &["lab", "down", &f]);
    assert!(
        out.status.success(),
        "lab down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lab_namespaces(&name), Vec::<String>::new(), "namespaces left behind");
    assert!(!state.join(&name).exists(), "state left behind");
    for pid in pids {
        // A daemon gone, or at most a zombie whose parent has not reaped it yet.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty() || stat.contains(") Z"), "weftd {pid} still runs");
    }
    let record = std::path::Path::new(weft_lab::neigh::DIR).join(
        state
            .join(&name)
            .display()
            .to_string()
            .trim_start_matches('/')
            .replace('/', "_"),
    );
    assert!(!record.exists(), "the lab's neighbour-table record is left behind");
}
