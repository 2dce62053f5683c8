//! A picture of the lab (`weftctl lab graph`) of the running example lab (three nodes,
//! seven pods, eight links of all three kinds): the SVG Graphviz renders names both
//! ends (`pod:intf`) of every link, each link's kind and its state (up), and a rate for
//! each, above 100 kbit/s on the link a ping flood crosses while the counters are
//! sampled. The DOT on standard output shows a link taken down by intent and a run-time
//! impairment; once the lab is down, every link is drawn down from the file alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_lab::Lab;
use weft_tests::webdriver::Browser;
use weft_tests::{ChildGuard, LabDown, TempDir, bin, failed_checks, privileged, wait_exit};

/// `weftctl ARGS` with the lab's state under `lab_dir`, killed after 60 s; it must
/// succeed. Its standard output.
fn weftctl(dir: &Path, lab_dir: &Path, args: &[&str]) -> String {
    let out = dir.join("weftctl.out");
    let err = dir.join("weftctl.err");
    let mut child = Command::new(bin("weftctl"))
        .env("WEFT_LAB_DIR", lab_dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(60));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "weftctl {args:?} ({status:?}): {stdout}{stderr}"
    );
    stdout
}

/// The text elements of an SVG, with the entities Graphviz writes decoded (it writes a
/// `-` as `&#45;`).
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1.split_once("</text>")?.0;
            Some(
                body.replace("&#45;", "-")
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&quot;", "\"")
                    .replace("&#39;", "'")
                    .replace("&amp;", "&"),
            )
        })
        .collect()
}

/// A rate label (`1.5 Mbit/s`) in bits per second.
fn rate(text: &str) -> Option<f64> {
    let (n, unit) = text.split_once(' ')?;
    let scale = match unit {
        "bit/s" => 1.0,
        "kbit/s" => 1e3,
        "Mbit/s" => 1e6,
        "Gbit/s" => 1e9,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

#[test]
fn lab_graph_draws_every_link_of_the_example_lab() {
    let _alone = weft_tests::alone("lab");
    if !privileged() {
        return;
    }
    let dir = TempDir::new("labgraph");
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let name = format!("wt{}gr", std::process::id());
    let spec = std::fs::read_to_string(examples.join("lab.yaml"))
        .unwrap()
        .replace("name: wl", &format!("name: {name}"))
        .replace(
            "topology_dir: topologies",
            &format!("topology_dir: {}", examples.join("topologies").display()),
        );
    assert!(spec.contains(&name), "the example lab is named `wl`");
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let file_arg = file.to_str().unwrap();
    let lab_dir = dir.path().join("labs");
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(lab_dir.join(&name));
    let lab = LabDown(lab);
    lab.0.up().expect("lab up");
    let checks = lab.0.check(Duration::from_secs(10));
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after up: {:?}",
        failed_checks(&checks)
    );
    // Each link once, `a:x -- b:y` with the ends in either order, and its kind as the
    // nodes report it.
    let mut links: Vec<(String, String, String)> = Vec::new();
    for c in &checks {
        if !links.iter().any(|(a, b, _)| (a, b) == (&c.to, &c.from)) {
            links.push((c.from.clone(), c.to.clone(), c.kind.clone()));
        }
    }
    assert_eq!(links.len(), 8, "the example's 8 links: {links:?}");
    let kinds: BTreeSet<&str> = links.iter().map(|(_, _, k)| k.as_str()).collect();
    assert_eq!(kinds, ["grpc", "veth", "vxlan"].into_iter().collect(), "every kind");

    // Frames on r1:e1 -- r2:e1 while the counters are sampled: 100 echoes of 1 kB a
    // second each way is about 1.7 Mbit/s.
    let flood = ChildGuard::new(
        Command::new("ip")
            .args(["netns", "exec", &lab.0.pod_ns("r1")])
            .args(["ping", "-q", "-i", "0.01", "-s", "1000", "-w", "20", "192.168.1.2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let svg_path = dir.path().join("x.svg");
    weftctl(
        dir.path(),
        &lab_dir,
        &["lab", "graph", file_arg, "-o", svg_path.to_str().unwrap()],
    );
    drop(flood);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let head = svg.trim_start();
    assert!(
        head.starts_with("<?xml") || head.starts_with("<svg"),
        "not SVG: {}",
        &svg[..svg.len().min(200)]
    );
    assert!(
        svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
        "not a whole SVG"
    );
    let texts = svg_texts(&svg);
    for (a, b, kind) in &links {
        let i = texts
            .iter()
            .position(|t| *t == format!("{a} -- {b}") || *t == format!("{b} -- {a}"))
            .unwrap_or_else(|| panic!("link {a} -- {b} not named in the SVG: {texts:?}"));
        // The lines of an edge's label follow each other: kind and state, then the rate.
        assert_eq!(texts.get(i + 1), Some(&format!("{kind}, up")), "{a} -- {b}: {texts:?}");
        let r = texts.get(i + 2).and_then(|t| rate(t));
        assert!(r.is_some(), "{a} -- {b}: no rate: {texts:?}");
        if a == "r1:e1" || b == "r1:e1" {
            assert!(
                r.unwrap() > 100e3,
                "{a} -- {b} under a ping flood: {:?}",
                texts.get(i + 2)
            );
        }
    }
    for node in ["n1", "n2", "n3"] {
        assert!(
            texts.contains(&format!("node {node}")),
            "node {node} missing: {texts:?}"
        );
    }

    // DOT on standard output, with a link down by intent and a run-time impairment
    // (on a gRPC link, impaired in weftd's worker on any kernel).
    weftctl(dir.path(), &lab_dir, &["link", "down", "r2", "e2", "--lab", file_arg]);
    weftctl(
        dir.path(),
        &lab_dir,
        &["link", "set", "r3", "e2", "--delay", "5ms", "--lab", file_arg],
    );
    let dot = weftctl(dir.path(), &lab_dir, &["lab", "graph", file_arg, "--sample", "0s"]);
    assert!(
        dot.starts_with("graph ") && dot.trim_end().ends_with('}'),
        "not DOT: {dot}"
    );
    assert_eq!(dot.matches("\" -- \"").count(), 8, "one edge per link: {dot}");
    for (a, b, _) in &links {
        assert!(
            dot.contains(&format!("{a} -- {b}")) || dot.contains(&format!("{b} -- {a}")),
            "{a} -- {b} missing: {dot}"
        );
    }
    assert!(dot.contains("grpc, down by intent"), "r2:e2 down by intent: {dot}");
    assert!(dot.contains("delay 5ms (run time)"), "r3:e2's run-time delay: {dot}");
    assert!(!dot.contains("bit/s"), "no rate without sampling: {dot}");
    weftctl(dir.path(), &lab_dir, &["link", "up", "r2", "e2", "--lab", file_arg]);

    live_view_in_a_browser(dir.path(), &lab_dir, &file, &lab.0);

    // Down, the lab is drawn from its file: every link down, no rates.
    lab.0.down().unwrap();
    let dot = weftctl(dir.path(), &lab_dir, &["lab", "graph", file_arg]);
    assert_eq!(dot.matches("\" -- \"").count(), 8, "{dot}");
    assert_eq!(
        dot.matches(", down\\n").count() + dot.matches(", down\"").count(),
        8,
        "{dot}"
    );
    assert!(!dot.contains("bit/s"), "no rate with the lab down: {dot}");
}

/// `weftctl lab serve` in a real headless browser (Chromium through chromedriver): the
/// page shows every pod and link of the running lab, all up; a click on a link shows
/// its settings, counters and rate history; a link taken down turns red within two
/// seconds, and green again once brought up.
fn live_view_in_a_browser(dir: &Path, lab_dir: &Path, file: &Path, lab: &Lab) {
    let out = dir.join("serve.out");
    let mut serve = ChildGuard::new(
        Command::new(bin("weftctl"))
            .env("WEFT_LAB_DIR", lab_dir)
            .args(["lab", "serve"])
            .arg(file)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if let Some(u) = text.split_whitespace().find(|w| w.starts_with("http://127.0.0.1:")) {
            break u.to_string();
        }
        assert!(Instant::now() < deadline, "lab serve printed no address: {text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let browser = Browser::start(&dir.join("chromium-profile"));
    browser.goto(&url);
    let seen = "return {pods: [...document.querySelectorAll('[data-pod]')].map(e => e.dataset.pod), \
                links: [...document.querySelectorAll('path[data-link]')].map(e => [e.dataset.link, e.dataset.state || '', e.getAttribute('stroke') || ''])};";
    let deadline = Instant::now() + Duration::from_secs(20);
    let v = loop {
        let v = browser.script(seen);
        let links = v["links"].as_array().map_or(0, Vec::len);
        if links == 8 && v["links"].as_array().unwrap().iter().all(|l| l[1] == "up") {
            break v;
        }
        assert!(Instant::now() < deadline, "the page never showed 8 links up: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut pods: Vec<&str> = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    pods.sort_unstable();
    let mut want: Vec<&str> = lab.spec.pods.iter().map(|p| p.name.as_str()).collect();
    want.sort_unstable();
    assert_eq!(pods, want, "every pod of the lab on the page");
    assert!(
        v["links"].as_array().unwrap().iter().all(|l| l[2] == "#2ca02c"),
        "every link green: {v}"
    );

    // A click on r1:e1's link: its settings, both ends' counters, its rate history.
    let id = browser.script(
        "const p = [...document.querySelectorAll('path[data-link]')].find(p => p.firstChild.textContent.includes('r1:e1')); \
         p.dispatchEvent(new MouseEvent('click', {bubbles: true})); return p.dataset.link;",
    );
    let id = id.as_str().expect("r1:e1's link on the page").to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let panel = browser.script(
            "const h = document.querySelector('[data-panel]'); \
             return h ? [h.textContent, document.getElementById('panel').textContent, !!document.getElementById('history')] : null;",
        );
        if panel[2] == true {
            assert!(panel[0].as_str().unwrap().contains("r1:e1"), "{panel}");
            let text = panel[1].as_str().unwrap();
            assert!(
                text.contains("sent") && text.contains("frames"),
                "counters shown: {text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no panel with a history: {panel}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Down: red within two seconds of asking.
    let stroke = format!("return document.querySelector('path[data-link=\"{id}\"]').getAttribute('stroke');");
    let file_arg = file.to_str().unwrap();
    let asked = Instant::now();
    weftctl(dir, lab_dir, &["link", "down", "r1", "e1", "--lab", file_arg]);
    while browser.script(&stroke) != "#d62728" {
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "the link was not red 2 s after it went down"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "lab serve: r1:e1 red {} ms after `link down` was asked",
        asked.elapsed().as_millis()
    );
    let state = browser.script("return document.getElementById('panel-state').textContent;");
    assert_eq!(state, "down by intent");
    weftctl(dir, lab_dir, &["link", "up", "r1", "e1", "--lab", file_arg]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while browser.script(&stroke) != "#2ca02c" {
        assert!(Instant::now() < deadline, "the link did not turn green again");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(browser);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.pid() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = serve.wait_within(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "lab serve ends on Ctrl-C: {status:?}"
    );
}
