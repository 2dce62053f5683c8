//! Several networks in one pod (as Multus and podman attach secondary networks), the
//! routes each installs, and addresses and MACs the runtime asks for: the real `weft`
//! plugin against a real `weftd` inside a node namespace, pods as network namespaces.

use serde_json::{Value, json};
use weft_tests::{Call, Daemon, Netns, privileged, result_address};

const A4: &str = "10.244.1.0/24";
const A6: &str = "fd00:10:244:1::/64";
const B4: &str = "10.245.1.0/24";
const B6: &str = "fd00:10:245:1::/64";

/// A network config for `d` named `name` with `ranges` and whatever `extra` adds.
fn conf(d: &Daemon, name: &str, ranges: &[&str], extra: Value) -> String {
    let mut c = json!({
        "cniVersion": "1.1.0",
        "name": name,
        "type": "weft",
        "socket": d.socket(),
        "ranges": ranges,
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    c.to_string()
}

/// An ADD (or another command) of container `cid` with interface `ifname`.
fn call(command: &str, cid: &str, ns: &Netns, ifname: &str, conf: &str) -> Call {
    Call::new(command, cid, &ns.path(), conf).set("CNI_IFNAME", ifname)
}

/// The routes a result lists as (dst, gw).
fn routes(result: &Value) -> Vec<(String, String)> {
    result["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["dst"].as_str().unwrap().into(), r["gw"].as_str().unwrap().into()))
        .collect()
}

fn pair(dst: &str, gw: &str) -> (String, String) {
    (dst.into(), gw.into())
}

/// The pod's default routes of one family as (gateway, device).
fn defaults(p: &Netns, v6: bool) -> Vec<(String, String)> {
    p.ip_json(&[if v6 { "-6" } else { "-4" }, "route", "show", "default"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["gateway"].as_str().unwrap_or_default().into(),
                r["dev"].as_str().unwrap_or_default().into(),
            )
        })
        .collect()
}

/// The addresses of one family on `ifname` in the pod.
fn addresses(p: &Netns, ifname: &str, v6: bool) -> Vec<String> {
    let link = p.ip_json(&[if v6 { "-6" } else { "-4" }, "addr", "show", "dev", ifname]);
    link[0]["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect()
}

/// CHECK with the ADD result as prevResult, as runtimes send it.
fn check(cid: &str, ns: &Netns, ifname: &str, conf: &str, added: &Value) -> weft_tests::CniOutput {
    let mut c: Value = serde_json::from_str(conf).unwrap();
    c["prevResult"] = added.clone();
    call("CHECK", cid, ns, ifname, &c.to_string()).run()
}

/// The defect: a second network in a pod failed with code 102 "adding the pod default
/// route: File exists" and the pod got nothing. Now both interfaces get their
/// addresses, the pod keeps one default route per family (the first network's), the
/// second lists only the routes it installed, traffic flows on both, CHECK passes for
/// both, and DEL of one leaves the other whole.
#[test]
fn two_networks_in_one_pod_each_work_and_the_first_keeps_the_default_route() {
    let _area = weft_tests::area("node::networks");
    if !privileged() {
        return;
    }
    let d = Daemon::start("nets");
    let first = conf(&d, "weft", &[A4, A6], json!({}));
    let second = conf(
        &d,
        "second",
        &[B4, B6],
        json!({"routes": [{"dst": "10.245.0.0/16"}, {"dst": "fd00:10:245::/48"}]}),
    );
    let (p, q) = (Netns::new("p"), Netns::new("q"));
    let pa = call("ADD", "ctr-p", &p, "eth0", &first).run().ok();
    let pb = call("ADD", "ctr-p", &p, "net1", &second).run().ok();
    // q has only the second network, as its first: it gets that network's default routes.
    let qb = call("ADD", "ctr-q", &q, "eth0", &second).run().ok();

    assert_eq!(
        routes(&pa),
        vec![pair("0.0.0.0/0", "10.244.1.1"), pair("::/0", "fd00:10:244:1::1")]
    );
    assert_eq!(
        routes(&pb),
        vec![
            pair("10.245.0.0/16", "10.245.1.1"),
            pair("fd00:10:245::/48", "fd00:10:245:1::1")
        ],
        "the second network lists no default route"
    );
    assert_eq!(pb["interfaces"][1]["name"], "net1");
    assert_eq!(routes(&qb)[0], pair("0.0.0.0/0", "10.245.1.1"));

    // The kernel agrees: both interfaces hold their addresses, one default route each.
    assert_eq!(
        addresses(&p, "eth0", false),
        vec![format!("{}/32", result_address(&pa, false))]
    );
    assert_eq!(
        addresses(&p, "net1", false),
        vec![format!("{}/32", result_address(&pb, false))]
    );
    assert_eq!(
        addresses(&p, "net1", true),
        vec![format!("{}/128", result_address(&pb, true))]
    );
    assert_eq!(defaults(&p, false), vec![pair("10.244.1.1", "eth0")]);
    assert_eq!(defaults(&p, true), vec![pair("fd00:10:244:1::1", "eth0")]);

    // Traffic on both: the node reaches each address, and p reaches q over net1.
    for ip in [
        result_address(&pa, false),
        result_address(&pa, true),
        result_address(&pb, false),
        result_address(&pb, true),
    ] {
        assert!(d.node.ping(&ip), "the node cannot reach {ip}");
    }
    assert!(p.ping(&result_address(&qb, false)), "p cannot reach q over net1 (IPv4)");
    assert!(p.ping(&result_address(&qb, true)), "p cannot reach q over net1 (IPv6)");

    let ok = check("ctr-p", &p, "eth0", &first, &pa);
    assert_eq!(ok.code, 0, "{ok:?}");
    let ok = check("ctr-p", &p, "net1", &second, &pb);
    assert_eq!(ok.code, 0, "{ok:?}");
    // CHECK of the second looks at its own routes.
    weft_tests::sh(std::process::Command::new("ip").args(["-n", p.name(), "route", "del", "10.245.0.0/16"]));
    let broken = check("ctr-p", &p, "net1", &second, &pb);
    assert_eq!(broken.err_code(), 104);
    assert!(
        broken.json()["details"].as_str().unwrap().contains("10.245.0.0/16"),
        "{broken:?}"
    );
    // A repeated ADD returns the stored result.
    assert_eq!(call("ADD", "ctr-p", &p, "net1", &second).run().ok(), pb);

    // DEL of the second leaves the first whole.
    call("DEL", "ctr-p", &p, "net1", &second).run().ok();
    d.settle();
    assert!(!p.links().contains(&"net1".to_string()));
    assert_eq!(defaults(&p, false), vec![pair("10.244.1.1", "eth0")]);
    let ok = check("ctr-p", &p, "eth0", &first, &pa);
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(d.node.ping(&result_address(&pa, false)));

    call("DEL", "ctr-p", &p, "eth0", &first).run().ok();
    call("DEL", "ctr-q", &q, "eth0", &second).run().ok();
    d.assert_clean();
}

/// `defaultRoute: false` keeps a network from installing the default route even as the
/// pod's first; a later network then gets it; `defaultRoute: true` on a pod that has one
/// is refused with code 108 and leaves nothing.
#[test]
fn default_route_says_which_network_carries_the_default() {
    let _area = weft_tests::area("node::networks");
    if !privileged() {
        return;
    }
    let d = Daemon::start("defrt");
    let first = conf(&d, "weft", &[A4], json!({"defaultRoute": false}));
    let second = conf(&d, "second", &[B4], json!({}));
    let third = conf(&d, "third", &["10.246.1.0/24"], json!({"defaultRoute": true}));
    let p = Netns::new("p");
    let pa = call("ADD", "ctr-p", &p, "eth0", &first).run().ok();
    assert!(routes(&pa).is_empty(), "{pa}");
    assert!(defaults(&p, false).is_empty());
    let pb = call("ADD", "ctr-p", &p, "net1", &second).run().ok();
    assert_eq!(routes(&pb), vec![pair("0.0.0.0/0", "10.245.1.1")]);
    assert_eq!(defaults(&p, false), vec![pair("10.245.1.1", "net1")]);

    let node_links = d.node.links();
    let out = call("ADD", "ctr-p", &p, "net2", &third).run();
    assert_eq!(out.err_code(), 108, "{out:?}");
    assert!(
        out.json()["details"]
            .as_str()
            .unwrap()
            .contains("0.0.0.0/0 via 10.246.1.1 dev net2"),
        "{out:?}"
    );
    assert!(
        !p.links().contains(&"net2".to_string()),
        "the refused ADD left nothing in the pod"
    );
    d.settle();
    assert_eq!(d.node.links(), node_links, "nor on the node");
    assert_eq!(d.allocated(), 2);
    assert_eq!(defaults(&p, false), vec![pair("10.245.1.1", "net1")]);

    call("DEL", "ctr-p", &p, "net1", &second).run().ok();
    call("DEL", "ctr-p", &p, "eth0", &first).run().ok();
    d.assert_clean();
}

/// podman's `--ip`/`--mac-address` arrive as `CNI_ARGS` `IP=`/`MAC=`; with the `ips` and
/// `mac` capabilities as `runtimeConfig.ips`/`mac`. Both are honoured exactly; an
/// address another pod holds (107) or outside the ranges (7) is refused, leaving nothing.
#[test]
fn requested_addresses_and_macs_are_honoured_or_refused() {
    let _area = weft_tests::area("node::networks");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("reqip");
    let plain = conf(&d, "weft", &[A4], json!({}));
    let (p, q, r) = (Netns::new("p"), Netns::new("q"), Netns::new("r"));
    let kubelet_args = |cid: &str| format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-{cid}");

    let podman = call("ADD", "ctr-p", &p, "eth0", &plain)
        .set(
            "CNI_ARGS",
            &format!("{};IP=10.244.1.7;MAC=0a:58:0a:f4:01:07", kubelet_args("ctr-p")),
        )
        .run()
        .ok();
    assert_eq!(podman["ips"][0]["address"], "10.244.1.7/32");
    assert_eq!(podman["interfaces"][1]["mac"], "0a:58:0a:f4:01:07");
    assert_eq!(addresses(&p, "eth0", false), vec!["10.244.1.7/32"]);
    assert_eq!(p.ip_json(&["link", "show", "eth0"])[0]["address"], "0a:58:0a:f4:01:07");
    assert!(d.node.ping("10.244.1.7"));

    let capable = conf(
        &d,
        "weft",
        &[A4, A6],
        json!({
            "capabilities": {"ips": true, "mac": true},
            "runtimeConfig": {"ips": ["10.244.1.8/24", "fd00:10:244:1::8/64"], "mac": "0a:58:0a:f4:01:08"},
        }),
    );
    let cap = call("ADD", "ctr-q", &q, "eth0", &capable).run().ok();
    assert_eq!(addresses(&q, "eth0", false), vec!["10.244.1.8/32"]);
    assert_eq!(addresses(&q, "eth0", true), vec!["fd00:10:244:1::8/128"]);
    assert_eq!(q.ip_json(&["link", "show", "eth0"])[0]["address"], "0a:58:0a:f4:01:08");
    assert!(d.node.ping("fd00:10:244:1::8"));

    // Refused, and nothing is left: the address another pod holds...
    let allocated = d.allocated();
    let node_links = d.node.links();
    let taken = call("ADD", "ctr-r", &r, "eth0", &plain)
        .set("CNI_ARGS", &format!("{};IP=10.244.1.7", kubelet_args("ctr-r")))
        .run();
    assert_eq!(taken.err_code(), 107, "{taken:?}");
    let details = taken.json()["details"].as_str().unwrap().to_string();
    assert!(
        details.contains("10.244.1.7") && details.contains("pod default/pod-ctr-p"),
        "{details}"
    );
    // ...an address outside every range...
    let outside = call("ADD", "ctr-r", &r, "eth0", &plain)
        .set("CNI_ARGS", &format!("{};IP=10.88.0.7", kubelet_args("ctr-r")))
        .run();
    assert_eq!(outside.err_code(), 7, "{outside:?}");
    assert!(outside.stdout.contains(A4), "{outside:?}");
    // ...and a malformed one.
    let malformed = call("ADD", "ctr-r", &r, "eth0", &plain)
        .set("CNI_ARGS", &format!("{};IP=10.244.1", kubelet_args("ctr-r")))
        .run();
    assert_eq!(malformed.err_code(), 4, "{malformed:?}");
    assert_eq!(r.links(), vec!["lo"]);
    d.settle();
    assert_eq!(d.node.links(), node_links);
    assert_eq!(d.allocated(), allocated);

    // The MAC is kept with the attachment: after a restart the repair leaves it alone
    // and CHECK still agrees.
    d.restart();
    let ok = check("ctr-q", &q, "eth0", &capable, &cap);
    assert_eq!(ok.code, 0, "{ok:?}");
    assert_eq!(q.ip_json(&["link", "show", "eth0"])[0]["address"], "0a:58:0a:f4:01:08");

    call("DEL", "ctr-p", &p, "eth0", &plain).run().ok();
    call("DEL", "ctr-q", &q, "eth0", &capable).run().ok();
    d.assert_clean();
}
