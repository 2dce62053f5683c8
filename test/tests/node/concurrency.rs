//! Many pods at once: 8 workers attach 400 pods through the real plugin, then detach
//! them. No address may be handed out twice; nothing may be left behind.

use std::collections::HashSet;
use std::sync::Mutex;

use weft_tests::{Call, Daemon, Netns, privileged};

#[test]
fn eight_workers_attach_and_detach_400_pods() {
    let _area = weft_tests::area("node::concurrency");
    if !privileged() {
        return;
    }
    const WORKERS: usize = 8;
    const PODS: usize = 400;
    let d = Daemon::start("conc");
    let conf = d.conf("1.1.0", &["10.250.0.0/16", "fd00:250::/64"]);
    let pods: Vec<Netns> = (0..PODS).map(|i| Netns::new(&format!("c{i}"))).collect();
    let addrs = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (pods, conf, addrs) = (&pods, &conf, &addrs);
            s.spawn(move || {
                for i in (w..PODS).step_by(WORKERS) {
                    let r = Call::new("ADD", &format!("ctr-{i}"), &pods[i].path(), conf).run().ok();
                    for ip in r["ips"].as_array().unwrap() {
                        addrs.lock().unwrap().push(ip["address"].as_str().unwrap().to_string());
                    }
                }
            });
        }
    });
    let addrs = addrs.into_inner().unwrap();
    assert_eq!(addrs.len(), 2 * PODS);
    let unique: HashSet<_> = addrs.iter().collect();
    assert_eq!(unique.len(), addrs.len(), "an address was handed out twice");
    assert_eq!(d.allocated(), 2 * PODS as u64);
    assert_eq!(d.node.links_but_gateway().len(), PODS + 1);
    assert!(
        d.node.links().iter().any(|l| l == weft_kernel::GATEWAY_DEVICE),
        "the pods' gateway is held on the node"
    );
    // Every pod answers.
    for probe in [0, PODS / 2, PODS - 1] {
        let ip = addrs[2 * probe].split('/').next().unwrap().to_string();
        assert!(d.node.ping(&ip), "{ip} unreachable");
    }

    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (pods, conf) = (&pods, &conf);
            s.spawn(move || {
                for i in (w..PODS).step_by(WORKERS) {
                    Call::new("DEL", &format!("ctr-{i}"), &pods[i].path(), conf).run().ok();
                }
            });
        }
    });
    d.assert_clean();
    for p in &pods {
        assert_eq!(p.links(), vec!["lo"], "{} still has interfaces", p.name());
    }
}
