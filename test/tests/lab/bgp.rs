//! Pod ranges over real BGP (`bgp: true`, `examples/lab-bgp.yaml`): BIRD 2 in every node
//! learns the podCIDR weftd exports (`--export-table 119`) and announces it to BIRD in
//! the router; pods reach pods on the other nodes over `eth0` by those routes alone, and
//! a range leaving its Node object is withdrawn from the router in time. Also: the BIRD
//! and FRR configurations `docs/routed-cluster.md` gives parse with the daemons' own
//! parsers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use weft_lab::Lab;
use weft_tests::{LabDown, TempDir, bin, failed_checks, privileged};

/// The fenced blocks of `lang` in a Markdown text.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim() == format!("```{lang}") => current = Some(String::new()),
            Some(b) if line.trim() == "```" => {
                out.push(std::mem::take(b));
                current = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    out
}

fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is missing: test/install-deps.sh installs bird2 and frr");
}

/// Parses a BIRD configuration with BIRD itself (`bird -p`).
fn bird_parses(dir: &Path, name: &str, text: &str) {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    let out = Command::new(tool("bird"))
        .arg("-p")
        .arg("-c")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "BIRD refuses {name}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_documented_bird_and_frr_configurations_parse() {
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/routed-cluster.md")).unwrap();
    let dir = TempDir::new("bgpdoc");
    let bird = blocks(&doc, "bird");
    assert_eq!(bird.len(), 2, "the node's and the router's BIRD configurations");
    for (i, b) in bird.iter().enumerate() {
        bird_parses(dir.path(), &format!("doc-{i}.conf"), b);
    }
    // What `weftctl lab` writes, from the same templates.
    bird_parses(
        dir.path(),
        "lab-node.conf",
        &weft_lab::node_config("172.30.1.2", "172.30.1.1", 65001, weft_lab::EXPORT_TABLE),
    );
    let nodes = vec![
        ("n1".to_string(), "172.30.1.2".to_string(), 65001),
        ("node-b".to_string(), "172.30.2.2".to_string(), 65002),
    ];
    bird_parses(
        dir.path(),
        "lab-router.conf",
        &weft_lab::router_config("172.30.1.1", &nodes),
    );
    // A broken one is refused, so the checks above can fail.
    let file = dir.path().join("broken.conf");
    std::fs::write(&file, "protocol bgp x { neighbor as; }\n").unwrap();
    assert!(
        !Command::new(tool("bird"))
            .arg("-p")
            .arg("-c")
            .arg(&file)
            .status()
            .unwrap()
            .success()
    );

    let frr = blocks(&doc, "frr");
    assert_eq!(frr.len(), 1, "the FRR configuration");
    let file = dir.path().join("frr.conf");
    std::fs::write(&file, &frr[0]).unwrap();
    let out = Command::new(tool("vtysh"))
        .arg("--dryrun")
        .arg("-f")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "FRR refuses the documented configuration: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&file, "router bgp 65001\n neighbor 172.30.1.1 remote-as\n").unwrap();
    let out = Command::new(tool("vtysh"))
        .arg("--dryrun")
        .arg("-f")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "vtysh --dryrun checks what it reads");
}

/// `ip -n NS route` lines.
fn routes(ns: &str) -> String {
    let out = Command::new("ip").args(["-n", ns, "route"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn a_bgp_lab_routes_pods_by_what_bird_learnt_and_withdraws_a_range_in_time() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    tool("bird");
    let dir = TempDir::new("bgp");
    let name = format!("wt{}bgp", std::process::id());
    let example =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/lab-bgp.yaml")).unwrap();
    let spec = example.replace("name: wlb", &format!("name: {name}\nwire_security: insecure"));
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(dir.path().join("state"));
    let lab = LabDown(lab);
    lab.0.up().expect("lab up");

    let router = format!("{name}-rt");
    // BGP needs a moment after the daemons start: sessions, then the first scan.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(1..=3).all(|i| routes(&router).contains(&format!("10.244.{i}.0/24 via 172.30.{i}.2"))) {
        assert!(
            Instant::now() < deadline,
            "the router never learnt every range:\n{}",
            routes(&router)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let checks = lab.0.check_network(Duration::from_secs(10));
    let eth0 = checks.iter().filter(|c| c.kind == "eth0").count();
    assert_eq!(eth0, 10, "4 pods on 3 nodes: every pair on different nodes, both ways");
    assert!(failed_checks(&checks).is_empty(), "{:?}", failed_checks(&checks));

    for n in ["n1", "n2", "n3"] {
        let ns = format!("{name}-{n}");
        // The other ranges are BIRD's, through the router (each node's BIRD learns them
        // from the router a moment after the router learnt them: the pods reach each
        // other by the default route meanwhile); none of weft's goes there, and there
        // is no VXLAN device.
        let learnt = |r: &str| {
            (1..=3)
                .filter(|i| format!("n{i}") != n)
                .all(|i| r.contains(&format!("10.244.{i}.0/24 via 172.30.")))
                && r.contains("proto bird")
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut r = routes(&ns);
        while !learnt(&r) {
            assert!(Instant::now() < deadline, "{n} never learnt the other ranges:\n{r}");
            std::thread::sleep(Duration::from_millis(100));
            r = routes(&ns);
        }
        let weft_to_others = r
            .lines()
            .filter(|l| l.contains("proto 75") && !l.starts_with("unreachable"))
            .count();
        assert_eq!(weft_to_others, 0, "{n}:\n{r}");
        let vxlan = Command::new("ip")
            .args(["-n", &ns, "link", "show", "weft-vxlan"])
            .output()
            .unwrap();
        assert!(!vxlan.status.success(), "{n} has no VXLAN device");
    }

    // n3's range leaves its Node object: weftd withdraws its export, BIRD its route.
    let mut nodes = lab.0.node_objects();
    nodes.iter_mut().find(|n| n.name == "n3").unwrap().pod_cidrs.clear();
    let start = Instant::now();
    lab.0.publish_nodes(&nodes).unwrap();
    while routes(&router).contains("10.244.3.0/24") {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the router still routes n3's range 2 s after it left the Node object:\n{}",
            routes(&router)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "n3's range withdrawn from the router {:.0} ms after its Node object changed",
        start.elapsed().as_secs_f64() * 1000.0
    );
    // The others stay.
    assert!(routes(&router).contains("10.244.1.0/24") && routes(&router).contains("10.244.2.0/24"));
}
