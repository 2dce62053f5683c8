//! The handler on its own: the real SQLite store, and a scripted kernel that records
//! what it was asked and fails on demand.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use weft_cni::Code;
use weft_daemon::{CniCall, Handler, NodeInfo, PodDefaults, PodNetworking, TableSync, WiredPod, Wiring};
use weft_kernel::KernelError;
use weft_kernel::ptp::{PodNetwork, PodRoute, RouteRequest};
use weft_portmap::{Entries, HostPort};
use weft_store::Store;

/// Makes the error a scripted setup fails with.
type Failure = fn() -> KernelError;

/// A kernel that keeps "links" in a set, and the default route of each family of
/// each pod with the host end that installed it.
#[derive(Default, Clone)]
struct FakeNet {
    defaults: Arc<Mutex<HashMap<(PathBuf, bool), String>>>,
    setups: Arc<Mutex<Vec<(PodNetwork, RouteRequest)>>>,
    checked: Arc<Mutex<Vec<Vec<PodRoute>>>>,
    repaired: Arc<Mutex<Vec<Vec<PodRoute>>>>,
    ports: Arc<Mutex<HashSet<HostPort>>>,
    links: Arc<Mutex<HashSet<String>>>,
    fail_setup: Arc<Mutex<Option<Failure>>>,
    drift: Arc<Mutex<Option<weft_kernel::Drift>>>,
    gone: Arc<Mutex<HashSet<PathBuf>>>,
    removes: Arc<Mutex<usize>>,
    remove_delay: Arc<Mutex<Duration>>,
    /// The gateways the node holds once for all pods (IPv4), as the ptp driver does.
    gateways: Arc<Mutex<HashSet<std::net::IpAddr>>>,
}

impl FakeNet {
    /// Holds the node-held gateways of `net`, as the ptp driver does first thing.
    fn hold_gateways(&self, net: &PodNetwork) {
        let mut held = self.gateways.lock().unwrap();
        for a in net
            .addresses
            .iter()
            .filter(|a| a.holder() == weft_kernel::ptp::GatewayHolder::Node)
        {
            held.insert(a.gateway);
        }
    }
}

impl PodNetworking for FakeNet {
    async fn validate_netns(&self, path: PathBuf) -> Result<(), KernelError> {
        if path.starts_with("/ok") && !self.gone.lock().unwrap().contains(&path) {
            Ok(())
        } else {
            Err(KernelError::InvalidNetns {
                path: path.display().to_string(),
                reason: "does not exist".into(),
            })
        }
    }
    async fn setup(&self, net: PodNetwork, req: RouteRequest) -> Result<Vec<PodRoute>, KernelError> {
        self.setups.lock().unwrap().push((net.clone(), req.clone()));
        // Before anything can fail, as the driver: a failed setup leaves its gateway held.
        self.hold_gateways(&net);
        if let Some(f) = *self.fail_setup.lock().unwrap() {
            return Err(f());
        }
        // As the ptp driver: the default routes left to it where the pod has none, then
        // the routes asked for, refusing one the pod has (as the kernel's EEXIST).
        let mut defaults = self.defaults.lock().unwrap();
        let mut out = Vec::new();
        if req.default_unless_present {
            for a in &net.addresses {
                let v6 = a.address.is_ipv6();
                let listed = req.routes.iter().any(|r| r.is_default() && r.dst.is_ipv6() == v6);
                if !listed && !defaults.contains_key(&(net.netns.clone(), v6)) {
                    out.push(PodRoute::default_via(a.gateway));
                }
            }
        }
        out.extend(req.routes.iter().copied());
        for r in out.iter().filter(|r| r.is_default()) {
            if defaults.contains_key(&(net.netns.clone(), r.dst.is_ipv6())) {
                return Err(KernelError::os(
                    format!("adding the pod route {r} dev {}", net.ifname),
                    std::io::Error::from_raw_os_error(libc::EEXIST),
                ));
            }
        }
        for r in out.iter().filter(|r| r.is_default()) {
            defaults.insert((net.netns.clone(), r.dst.is_ipv6()), net.host_ifname.clone());
        }
        self.links.lock().unwrap().insert(net.host_ifname);
        Ok(out)
    }
    async fn check(&self, net: PodNetwork, routes: Vec<PodRoute>) -> Result<(), KernelError> {
        self.checked.lock().unwrap().push(routes);
        if let Some(d) = self.drift.lock().unwrap().clone() {
            return Err(KernelError::Drift(d));
        }
        assert!(self.links.lock().unwrap().contains(&net.host_ifname));
        Ok(())
    }
    async fn repair(&self, net: PodNetwork, routes: Vec<PodRoute>) -> Result<Vec<&'static str>, KernelError> {
        self.repaired.lock().unwrap().push(routes);
        self.hold_gateways(&net);
        // A missing link is rebuilt whole, as the ptp driver does.
        Ok(if self.links.lock().unwrap().insert(net.host_ifname) {
            vec!["veth"]
        } else {
            Vec::new()
        })
    }
    async fn disconnect(&self, host_ifname: String) -> Result<bool, KernelError> {
        Ok(self.links.lock().unwrap().contains(&host_ifname))
    }
    async fn release_gateways(&self, in_use: Vec<std::net::IpAddr>) -> Result<Vec<std::net::IpAddr>, KernelError> {
        let mut held = self.gateways.lock().unwrap();
        let released: Vec<_> = held.iter().filter(|g| !in_use.contains(g)).copied().collect();
        held.retain(|g| in_use.contains(g));
        Ok(released)
    }
    async fn add_host_ports(&self, entries: Entries) -> Result<(), KernelError> {
        self.ports.lock().unwrap().extend(entries.ports);
        Ok(())
    }
    async fn remove_host_ports(&self, entries: Entries) -> Result<(), KernelError> {
        let mut p = self.ports.lock().unwrap();
        for x in entries.ports {
            p.remove(&x);
        }
        Ok(())
    }
    async fn sync_host_ports(&self, entries: Entries) -> Result<TableSync, KernelError> {
        let want: HashSet<HostPort> = entries.ports.into_iter().collect();
        let mut p = self.ports.lock().unwrap();
        let drift = *p != want;
        *p = want;
        Ok(if drift { TableSync::Drifted } else { TableSync::InSync })
    }
    async fn remove(&self, host_ifname: String) -> Result<bool, KernelError> {
        let d = *self.remove_delay.lock().unwrap();
        tokio::time::sleep(d).await;
        *self.removes.lock().unwrap() += 1;
        self.defaults.lock().unwrap().retain(|_, owner| *owner != host_ifname);
        Ok(self.links.lock().unwrap().remove(&host_ifname))
    }
}

struct Env {
    _dir: tempfile::TempDir,
    store: Store,
    net: FakeNet,
    h: Arc<Handler<Store, FakeNet>>,
}

fn env() -> Env {
    env_with(|h| h)
}

/// An environment whose handler `f` finishes building (pod defaults, wiring).
fn env_with(f: impl FnOnce(Handler<Store, FakeNet>) -> Handler<Store, FakeNet>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    let net = FakeNet::default();
    let h = Arc::new(f(Handler::new(
        store.clone(),
        net.clone(),
        NodeInfo { name: "n1".into() },
    )));
    Env {
        _dir: dir,
        store,
        net,
        h,
    }
}

fn node_defaults(ranges: &[&str], mtu: Option<u32>) -> PodDefaults {
    PodDefaults {
        ranges: ranges.iter().map(|r| r.parse().unwrap()).collect(),
        mtu,
    }
}

const CONF: &str =
    r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","ranges":["10.1.0.0/29","fd01::/64"],"mtu":1450}"#;

fn args(cid: &str, conf: &str) -> CniCall {
    CniCall {
        container_id: cid.into(),
        netns: format!("/ok/{cid}"),
        ifname: "eth0".into(),
        args: HashMap::from([
            ("K8S_POD_NAME".into(), format!("pod-{cid}")),
            ("K8S_POD_NAMESPACE".into(), "default".into()),
        ]),
        config: conf.as_bytes().to_vec(),
    }
}

async fn allocated(store: &Store) -> usize {
    store.run(|db| db.allocated_addresses()).await.unwrap().len()
}

#[tokio::test]
async fn add_builds_the_result_and_repeats_return_it() {
    let e = env();
    let out = e.h.add(&args("c1", CONF)).await.unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(v["interfaces"][1]["name"], "eth0");
    assert_eq!(v["interfaces"][1]["sandbox"], "/ok/c1");
    assert_eq!(v["interfaces"][1]["mtu"], 1450);
    assert!(v["interfaces"][0]["name"].as_str().unwrap().starts_with("weft"));
    assert_eq!(v["ips"][0]["address"], "10.1.0.2/32");
    assert_eq!(v["ips"][0]["gateway"], "10.1.0.1");
    assert_eq!(v["ips"][0]["interface"], 1);
    assert_eq!(v["ips"][1]["address"], "fd01::2/128");
    assert_eq!(v["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(v["routes"][1]["dst"], "::/0");

    let again = e.h.add(&args("c1", CONF)).await.unwrap();
    assert_eq!(again, out, "a repeated ADD returns the same result");
    assert_eq!(allocated(&e.store).await, 2, "and allocates nothing more");

    // Asked under another version, the same attachment is reported in that layout.
    let old = CONF.replace("1.1.0", "0.4.0");
    let v: Value = serde_json::from_slice(&e.h.add(&args("c1", &old)).await.unwrap()).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["ips"][0]["version"], "4");
}

#[tokio::test]
async fn a_failed_kernel_setup_leaves_nothing() {
    let e = env();
    *e.net.fail_setup.lock().unwrap() =
        Some(|| KernelError::os("creating the veth pair", std::io::Error::from_raw_os_error(libc::EPERM)));
    let err = e.h.add(&args("c1", CONF)).await.unwrap_err();
    assert_eq!(err.code, Code::Kernel);
    assert!(err.details.contains("creating the veth pair"), "{}", err.details);
    assert_eq!(allocated(&e.store).await, 0);
    assert!(e.store.run(|db| db.list(None, None)).await.unwrap().is_empty());
    assert!(e.net.gateways.lock().unwrap().is_empty(), "nor the gateway it held");

    *e.net.fail_setup.lock().unwrap() = Some(|| KernelError::InterfaceExists { ifname: "eth0".into() });
    assert_eq!(
        e.h.add(&args("c1", CONF)).await.unwrap_err().code,
        Code::InterfaceExists
    );
    assert_eq!(allocated(&e.store).await, 0);
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_touched() {
    let e = env();
    let mut cases: Vec<(CniCall, Code)> = Vec::new();
    let mut a = args("c1", CONF);
    a.ifname = "a-very-long-ifname".into();
    cases.push((a, Code::InvalidEnv));
    let mut a = args("c1", CONF);
    a.ifname = "et/h0".into();
    cases.push((a, Code::InvalidEnv));
    let mut a = args("c1", CONF);
    a.container_id = "bad id".into();
    cases.push((a, Code::InvalidEnv));
    let mut a = args("c1", CONF);
    a.netns = "/missing/ns".into();
    cases.push((a, Code::InvalidNetns));
    cases.push((args("c1", "{nope"), Code::Decode));
    cases.push((args("c1", &CONF.replace("1.1.0", "9.9.9")), Code::IncompatibleVersion));
    cases.push((
        args("c1", &CONF.replace(r#""cniVersion":"1.1.0","#, "")),
        Code::IncompatibleVersion,
    ));
    cases.push((
        args("c1", &CONF.replace("10.1.0.0/29", "10.1.0.0/33")),
        Code::InvalidConfig,
    ));
    for (a, want) in cases {
        let err = e.h.add(&a).await.unwrap_err();
        assert_eq!(err.code, want, "{err}");
    }
    assert!(e.store.run(|db| db.list(None, None)).await.unwrap().is_empty());
    assert!(e.net.links.lock().unwrap().is_empty());
}

#[tokio::test]
async fn exhaustion_names_the_range_and_rolls_back() {
    let e = env();
    // A /29 holds five pods.
    for i in 0..5 {
        e.h.add(&args(&format!("c{i}"), CONF)).await.unwrap();
    }
    let err = e.h.add(&args("c9", CONF)).await.unwrap_err();
    assert_eq!(err.code, Code::RangeExhausted);
    assert!(err.details.contains("10.1.0.0/29"), "{}", err.details);
    assert_eq!(
        allocated(&e.store).await,
        10,
        "the failed ADD's IPv6 address was released"
    );
    // STATUS now says ADD cannot be served.
    let st = e.h.status(&args("", CONF)).await.unwrap_err();
    assert_eq!(st.code, Code::NotAvailable);
    assert!(st.details.contains("IPv4"), "{}", st.details);
}

#[tokio::test]
async fn del_is_idempotent_and_releases_addresses_after_teardown() {
    let e = env();
    e.h.add(&args("c1", CONF)).await.unwrap();
    *e.net.remove_delay.lock().unwrap() = Duration::from_millis(50);
    e.h.del(&args("c1", CONF)).await.unwrap();
    assert_eq!(allocated(&e.store).await, 2, "held until the teardown finishes");
    let mut no_netns = args("c1", CONF);
    no_netns.netns = String::new();
    e.h.del(&no_netns).await.unwrap();
    e.h.drain_teardowns().await;
    assert_eq!(allocated(&e.store).await, 0);
    assert!(e.net.links.lock().unwrap().is_empty());
    e.h.del(&no_netns).await.unwrap();
    e.h.del(&args("never-added", CONF)).await.unwrap();
    assert_eq!(*e.net.removes.lock().unwrap(), 1, "the veth was removed exactly once");
    // A DEL with a config that has gone bad still works.
    e.h.del(&args("c1", &CONF.replace("10.1.0.0/29", "garbage")))
        .await
        .unwrap();
}

/// The node holds a range's IPv4 gateway while a pod holds an address of the range,
/// and lets it go with the last one, whichever way it goes; the reconcile pass lets go
/// of one a DEL left behind.
#[tokio::test]
async fn the_nodes_gateway_goes_with_the_last_pod_of_its_range() {
    let e = env();
    let held = || {
        let mut g: Vec<String> = e.net.gateways.lock().unwrap().iter().map(|g| g.to_string()).collect();
        g.sort();
        g
    };
    e.h.add(&args("c1", CONF)).await.unwrap();
    e.h.add(&args("c2", CONF)).await.unwrap();
    assert_eq!(held(), ["10.1.0.1"], "IPv4 only: an IPv6 gateway stays on the host end");
    e.h.del(&args("c1", CONF)).await.unwrap();
    e.h.drain_teardowns().await;
    assert_eq!(held(), ["10.1.0.1"], "c2 still routes through it");
    e.h.del(&args("c2", CONF)).await.unwrap();
    e.h.drain_teardowns().await;
    assert!(held().is_empty(), "the last pod of the range took it along");

    e.h.add(&args("c3", CONF)).await.unwrap();
    e.net.gateways.lock().unwrap().insert("10.9.0.1".parse().unwrap());
    e.h.reconcile().await.unwrap();
    assert_eq!(
        held(),
        ["10.1.0.1"],
        "a gateway no range in use has is let go by the pass"
    );
}

#[tokio::test]
async fn add_after_del_waits_for_the_teardown_and_gets_a_new_address() {
    let e = env();
    let first: Value = serde_json::from_slice(&e.h.add(&args("c1", CONF)).await.unwrap()).unwrap();
    *e.net.remove_delay.lock().unwrap() = Duration::from_millis(100);
    e.h.del(&args("c1", CONF)).await.unwrap();
    let second: Value = serde_json::from_slice(&e.h.add(&args("c1", CONF)).await.unwrap()).unwrap();
    assert_eq!(*e.net.removes.lock().unwrap(), 1, "ADD waited for the old teardown");
    assert_ne!(
        first["ips"][0]["address"], second["ips"][0]["address"],
        "the address is not reused at once"
    );
    assert_eq!(allocated(&e.store).await, 2);
}

#[tokio::test]
async fn check_reports_unknown_and_drift() {
    let e = env();
    let mut a = args("c1", CONF);
    assert_eq!(e.h.check(&a).await.unwrap_err().code, Code::UnknownContainer);
    e.h.add(&a).await.unwrap();
    e.h.check(&a).await.unwrap();
    *e.net.drift.lock().unwrap() = Some(weft_kernel::Drift::DefaultRouteMissing {
        gateway: "10.1.0.1".parse().unwrap(),
        ifname: "eth0".into(),
    });
    let err = e.h.check(&a).await.unwrap_err();
    assert_eq!(err.code, Code::CheckFailed);
    assert_eq!(err.details, "default route via 10.1.0.1 dev eth0 is missing in the pod");
    *e.net.drift.lock().unwrap() = None;
    a.config = CONF
        .replace(
            "\"mtu\":1450",
            "\"mtu\":1450,\"prevResult\":{\"cniVersion\":\"1.1.0\",\"ips\":[{\"address\":\"10.9.9.9/32\"}]}",
        )
        .into_bytes();
    let err = e.h.check(&a).await.unwrap_err();
    assert_eq!(err.code, Code::CheckFailed);
    assert!(err.details.contains("prevResult"), "{}", err.details);
    let old = args("c1", &CONF.replace("1.1.0", "0.3.1"));
    assert_eq!(e.h.check(&old).await.unwrap_err().code, Code::IncompatibleVersion);
}

#[tokio::test]
async fn gc_removes_what_the_runtime_no_longer_lists() {
    let e = env();
    for c in ["keep", "drop1", "drop2"] {
        e.h.add(&args(c, CONF)).await.unwrap();
    }
    let gc_conf = CONF.replace(
        "\"mtu\":1450",
        "\"mtu\":1450,\"cni.dev/valid-attachments\":[{\"containerID\":\"keep\",\"ifname\":\"eth0\"}]",
    );
    assert_eq!(e.h.gc(&args("", &gc_conf)).await.unwrap(), 2);
    let left = e.store.run(|db| db.list(None, None)).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key.container_id, "keep");
    assert_eq!(allocated(&e.store).await, 2);
    assert_eq!(e.h.gc(&args("", &gc_conf)).await.unwrap(), 0);
    assert_eq!(e.h.gc(&args("", CONF)).await.unwrap_err().code, Code::InvalidConfig);
}

#[tokio::test]
async fn chained_add_appends_to_the_previous_result() {
    let e = env();
    let conf = CONF.replace(
        "\"mtu\":1450",
        "\"mtu\":1450,\"prevResult\":{\"cniVersion\":\"1.1.0\",\"interfaces\":[{\"name\":\"lo\"}],\"ips\":[{\"interface\":0,\"address\":\"127.0.0.1/8\"}]}",
    );
    let v: Value = serde_json::from_slice(&e.h.add(&args("c1", &conf)).await.unwrap()).unwrap();
    assert_eq!(v["interfaces"][0]["name"], "lo");
    assert_eq!(v["interfaces"].as_array().unwrap().len(), 3);
    assert_eq!(v["ips"][0]["address"], "127.0.0.1/8");
    assert_eq!(v["ips"][1]["interface"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_adds_and_dels_never_share_an_address() {
    let e = env();
    let conf = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","ranges":["10.2.0.0/22"]}"#;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let h = e.h.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..25 {
                let a = args(&format!("w{w}p{i}"), conf);
                let v: Value = serde_json::from_slice(&h.add(&a).await.unwrap()).unwrap();
                got.push(v["ips"][0]["address"].as_str().unwrap().to_string());
                if i % 2 == 0 {
                    h.del(&a).await.unwrap();
                }
            }
            got
        }));
    }
    let mut live = HashSet::new();
    for t in tasks {
        for (i, a) in t.await.unwrap().into_iter().enumerate() {
            if i % 2 == 1 {
                assert!(live.insert(a.clone()), "{a} held twice");
            }
        }
    }
    e.h.drain_teardowns().await;
    assert_eq!(allocated(&e.store).await, live.len());
}

#[tokio::test]
async fn host_ports_are_held_refused_when_taken_and_released_by_del() {
    let e = env();
    let with_ports = CONF.replace(
        "\"mtu\":1450",
        "\"mtu\":1450,\"runtimeConfig\":{\"portMappings\":[{\"HostPort\":8080,\"ContainerPort\":80,\"Protocol\":\"TCP\"}]}",
    );
    e.h.add(&args("c1", &with_ports)).await.unwrap();
    assert_eq!(e.net.ports.lock().unwrap().len(), 2, "one element per family");
    let taken = e.h.add(&args("c2", &with_ports)).await.unwrap_err();
    assert_eq!(taken.code, Code::HostPortInUse);
    assert!(
        taken.details.contains("0.0.0.0:8080/tcp") && taken.details.contains("pod default/pod-c1"),
        "{}",
        taken.details
    );
    assert_eq!(allocated(&e.store).await, 2, "the refused ADD left nothing");
    assert_eq!(e.net.links.lock().unwrap().len(), 1);
    // Someone drops the kernel's elements: the sync puts them back.
    e.net.ports.lock().unwrap().clear();
    assert_eq!(e.h.sync_host_ports().await.unwrap(), TableSync::Drifted);
    assert_eq!(e.net.ports.lock().unwrap().len(), 2);
    assert_eq!(
        e.h.sync_host_ports().await.unwrap(),
        TableSync::InSync,
        "nothing to repair"
    );
    // DEL frees the port before answering: the second pod gets it now.
    e.h.del(&args("c1", &with_ports)).await.unwrap();
    assert!(e.net.ports.lock().unwrap().is_empty());
    e.h.add(&args("c2", &with_ports)).await.unwrap();
    assert_eq!(e.net.ports.lock().unwrap().len(), 2);
    // A bad mapping is an invalid config.
    let bad = CONF.replace(
        "\"mtu\":1450",
        "\"mtu\":1450,\"runtimeConfig\":{\"portMappings\":[{\"hostPort\":0,\"containerPort\":80}]}",
    );
    assert_eq!(e.h.add(&args("c3", &bad)).await.unwrap_err().code, Code::InvalidConfig);
}

/// podman with two weft networks and `-p 18086:80`: the same `portMappings` reach both
/// networks' ADDs (eth0 and eth1, in either order), and `network reload` DELs both and
/// ADDs both again. Neither network is refused for the container's own mapping; the
/// kernel's mapping follows the attachment that asked first and passes to the other
/// when that one goes; another container is refused, named without an empty namespace.
#[tokio::test]
async fn one_container_on_two_networks_shares_its_host_ports() {
    let e = env();
    let ports = r#","runtimeConfig":{"portMappings":[{"hostPort":18086,"containerPort":80,"protocol":"tcp"}]}"#;
    let weft_a = format!(r#"{{"cniVersion":"1.0.0","name":"weftA","type":"weft","ranges":["10.123.0.0/24"]{ports}}}"#);
    let weft_b = format!(
        r#"{{"cniVersion":"1.0.0","name":"weftB","type":"weft","ranges":["10.124.0.0/24","fd00:124::/64"]{ports}}}"#
    );
    // As podman 4.3 calls a CNI plugin: the container's name, no namespace.
    let call = |cid: &str, conf: &str, ifname: &str| {
        let mut a = args(cid, conf);
        a.ifname = ifname.into();
        a.args = HashMap::from([
            ("K8S_POD_NAME".into(), "mp".into()),
            ("IgnoreUnknown".into(), "1".into()),
        ]);
        a
    };
    let kernel = |e: &Env| {
        let mut v: Vec<String> = e
            .net
            .ports
            .lock()
            .unwrap()
            .iter()
            .map(|p| format!("{}:{}", p.container_ip, p.host_port))
            .collect();
        v.sort();
        v
    };
    let address = |out: Vec<u8>, v6: bool| -> String {
        json(out)["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["address"].as_str().unwrap().split('/').next().unwrap().to_string())
            .find(|a| a.contains(':') == v6)
            .unwrap()
    };
    // Both orders of ADD and of the reload's DELs.
    for (first, second_net) in [
        ((&weft_a, "eth0"), (&weft_b, "eth1")),
        ((&weft_b, "eth0"), (&weft_a, "eth1")),
    ] {
        let a1 = e.h.add(&call("mp1", first.0, first.1)).await.unwrap();
        let a2 = e.h.add(&call("mp1", second_net.0, second_net.1)).await.unwrap();
        let v6 = address(if first.0 == &weft_b { a1.clone() } else { a2.clone() }, true);
        let (v4_first, v4_second) = (address(a1, false), address(a2, false));
        let mut want = vec![format!("{v4_first}:18086"), format!("{v6}:18086")];
        want.sort();
        assert_eq!(kernel(&e), want, "IPv4 follows the network that asked first");

        // Another container wants the port: refused, and named as podman names it.
        let taken = e.h.add(&call("other", &weft_a, "eth0")).await.unwrap_err();
        assert_eq!(taken.code, Code::HostPortInUse);
        assert!(taken.details.contains("held by pod mp"), "{}", taken.details);
        assert!(!taken.details.contains("/mp"), "{}", taken.details);

        // `network reload`: the first network's DEL hands IPv4 over to the second.
        e.h.del(&call("mp1", first.0, first.1)).await.unwrap();
        let left = kernel(&e);
        assert!(left.contains(&format!("{v4_second}:18086")), "{left:?}");
        assert_eq!(left.len(), if first.0 == &weft_b { 1 } else { 2 }, "{left:?}");
        e.h.del(&call("mp1", second_net.0, second_net.1)).await.unwrap();
        assert!(kernel(&e).is_empty(), "the last network out releases the port");
        e.h.drain_teardowns().await;
    }

    // `podman network connect`: a second network joins a running container with `-p`.
    e.h.add(&call("mp2", &weft_a, "eth0")).await.unwrap();
    e.h.add(&call("mp2", &weft_b, "eth1")).await.unwrap();
    assert_eq!(kernel(&e).len(), 2);
    assert_eq!(
        e.h.sync_host_ports().await.unwrap(),
        TableSync::InSync,
        "the store and the kernel agree"
    );
}

#[tokio::test]
async fn reconcile_repairs_drift_and_collects_pods_whose_namespace_is_gone() {
    let e = env();
    for c in ["c1", "c2", "c3"] {
        e.h.add(&args(c, CONF)).await.unwrap();
    }
    assert!(e.h.reconcile().await.unwrap().is_empty(), "nothing drifted yet");

    // c3's veth vanished; c2's namespace is gone. (Keep c1's link by name: a link
    // picked from the set at random was c2's now and then, and then both c1 and c3
    // had lost theirs.)
    let c1_link = weft_daemon::naming::host_ifname("c1", "eth0");
    assert!(e.net.links.lock().unwrap().contains(&c1_link));
    e.net.links.lock().unwrap().clear();
    e.net.links.lock().unwrap().insert(c1_link);
    e.net.gone.lock().unwrap().insert(PathBuf::from("/ok/c2"));
    let before = allocated(&e.store).await;
    let repaired = e.h.reconcile().await.unwrap();
    assert_eq!(repaired.get("collected"), Some(&1), "{repaired:?}");
    assert_eq!(repaired.get("veth"), Some(&1), "only c3 lost its link: {repaired:?}");
    assert_eq!(allocated(&e.store).await, before - 2, "c2's two addresses released");
    let left = e.store.run(|db| db.list(None, None)).await.unwrap();
    let cids: Vec<_> = left.iter().map(|a| a.key.container_id.as_str()).collect();
    assert_eq!(cids, ["c1", "c3"]);
    assert_eq!(e.net.links.lock().unwrap().len(), 2);
    assert!(e.h.reconcile().await.unwrap().is_empty(), "repaired for good");
}

/// The periodic pass checks the pods ready at the pass before it: a pod added since is
/// left for the next (its ADD has just set it up), then checked and repaired there.
#[tokio::test]
async fn a_periodic_reconcile_checks_the_pods_the_last_pass_knew() {
    let e = env();
    e.h.add(&args("old", CONF)).await.unwrap();
    let known = e.h.ready_ids().await.unwrap();
    assert_eq!(known.len(), 1);
    e.h.add(&args("new", CONF)).await.unwrap();
    // Both veths vanished.
    e.net.links.lock().unwrap().clear();
    let (repaired, now) = e.h.reconcile_known(Some(&known)).await.unwrap();
    assert_eq!(repaired.get("veth"), Some(&1), "the old pod only: {repaired:?}");
    assert_eq!(now.len(), 2, "both ready now: {now:?}");
    assert!(now.is_superset(&known));
    assert_eq!(e.net.links.lock().unwrap().len(), 1);
    let (repaired, _) = e.h.reconcile_known(Some(&now)).await.unwrap();
    assert_eq!(
        repaired.get("veth"),
        Some(&1),
        "the new pod at the next pass: {repaired:?}"
    );
    assert_eq!(e.net.links.lock().unwrap().len(), 2);
    let (repaired, _) = e.h.reconcile_known(None).await.unwrap();
    assert!(repaired.is_empty(), "repaired for good: {repaired:?}");
}

/// A network config without `ranges` and `mtu` (both left to the node).
const BARE: &str = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft"}"#;

fn json(out: Vec<u8>) -> Value {
    serde_json::from_slice(&out).unwrap()
}

async fn attachment(store: &Store, cid: &str, network: &str, ifname: &str) -> Option<weft_store::Attachment> {
    let key = weft_store::AttachmentKey {
        network: network.into(),
        container_id: cid.into(),
        ifname: ifname.into(),
    };
    store.run(move |db| db.get(&key)).await.unwrap()
}

#[tokio::test]
async fn the_node_gives_ranges_and_mtu_to_configs_that_leave_them_open() {
    let (tx, rx) = tokio::sync::watch::channel(node_defaults(&["10.3.0.0/29", "fd03::/64"], Some(1450)));
    let e = env_with(|h| h.with_pod_defaults(rx));
    let v = json(e.h.add(&args("c1", BARE)).await.unwrap());
    assert_eq!(v["ips"][0]["address"], "10.3.0.2/32");
    assert_eq!(v["ips"][1]["address"], "fd03::2/128");
    assert_eq!(v["interfaces"][0]["mtu"], 1450, "the host end");
    assert_eq!(v["interfaces"][1]["mtu"], 1450, "the pod end");
    assert_eq!(attachment(&e.store, "c1", "weft", "eth0").await.unwrap().mtu, 1450);
    assert_eq!(e.net.setups.lock().unwrap()[0].0.mtu, 1450, "the kernel built it so");
    // STATUS reads the node's ranges too.
    e.h.status(&args("", BARE)).await.unwrap();

    // What the config says wins over the node.
    let own = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","ranges":["10.4.0.0/29"],"mtu":9000}"#;
    let v = json(e.h.add(&args("c2", own)).await.unwrap());
    assert_eq!(v["ips"][0]["address"], "10.4.0.2/32");
    assert_eq!(v["ips"].as_array().unwrap().len(), 1);
    assert_eq!(v["interfaces"][1]["mtu"], 9000);
    // A config with ranges but no MTU takes the node's MTU.
    let ranges_only = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","ranges":["10.5.0.0/29"]}"#;
    assert_eq!(
        json(e.h.add(&args("c3", ranges_only)).await.unwrap())["interfaces"][1]["mtu"],
        1450
    );

    // The node's ranges change (another engineer's watch feeds them): the next ADD
    // follows; without an MTU from the node, 1500.
    tx.send(node_defaults(&["10.6.0.0/29"], None)).unwrap();
    let v = json(e.h.add(&args("c4", BARE)).await.unwrap());
    assert_eq!(v["ips"][0]["address"], "10.6.0.2/32");
    assert_eq!(v["interfaces"][1]["mtu"], 1500);
}

#[tokio::test]
async fn without_node_ranges_an_add_is_retried_later_and_leaves_nothing() {
    let (tx, rx) = tokio::sync::watch::channel(PodDefaults::default());
    let e = env_with(|h| h.with_pod_defaults(rx));
    let err = e.h.add(&args("c1", BARE)).await.unwrap_err();
    assert_eq!(err.code, Code::TryAgainLater);
    assert!(err.details.contains("no pod ranges yet"), "{}", err.details);
    assert!(err.details.contains("spec.podCIDRs"), "{}", err.details);
    let st = e.h.status(&args("", BARE)).await.unwrap_err();
    assert_eq!(st.code, Code::NotAvailable);
    assert!(e.store.run(|db| db.list(None, None)).await.unwrap().is_empty());
    assert!(e.net.setups.lock().unwrap().is_empty());
    // A config with its own ranges does not wait for the node.
    e.h.add(&args("c2", CONF)).await.unwrap();
    // Once the node has its ranges, the retry succeeds.
    tx.send(node_defaults(&["10.7.0.0/29"], None)).unwrap();
    e.h.add(&args("c1", BARE)).await.unwrap();

    // A standalone node (no pod defaults at all): the config must say.
    let standalone = env();
    let err = standalone.h.add(&args("c1", BARE)).await.unwrap_err();
    assert_eq!(err.code, Code::InvalidConfig);
    assert!(err.details.contains("`ranges` is missing"), "{}", err.details);
    assert_eq!(
        standalone.h.status(&args("", BARE)).await.unwrap_err().code,
        Code::InvalidConfig
    );
}

#[tokio::test]
async fn the_mtu_used_must_suit_the_ranges_used() {
    let (_tx, rx) = tokio::sync::watch::channel(node_defaults(&["10.3.0.0/29", "fd03::/64"], Some(1230)));
    let e = env_with(|h| h.with_pod_defaults(rx));
    let err = e.h.add(&args("c1", BARE)).await.unwrap_err();
    assert_eq!(err.code, Code::InvalidConfig);
    assert!(
        err.details.contains("1230") && err.details.contains("1280"),
        "{}",
        err.details
    );
    // Set in the config, the MTU is checked against the node's IPv6 range as well.
    let small = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","mtu":1000}"#;
    assert_eq!(e.h.add(&args("c1", small)).await.unwrap_err().code, Code::InvalidConfig);
    let fine = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","mtu":1280}"#;
    e.h.add(&args("c1", fine)).await.unwrap();
    assert_eq!(allocated(&e.store).await, 2, "only the good ADD holds addresses");
}

fn second(conf_extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"second","type":"weft","ranges":["10.20.0.0/29","fd20::/64"]{conf_extra}}}"#
    )
}

fn net1(cid: &str, conf: &str) -> CniCall {
    let mut a = args(cid, conf);
    a.ifname = "net1".into();
    a
}

fn route_dsts(v: &Value) -> Vec<(String, String)> {
    // An empty list is left out of the result.
    v["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["dst"].as_str().unwrap().to_string(),
                r["gw"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(dst: &str, gw: &str) -> (String, String) {
    (dst.to_string(), gw.to_string())
}

#[tokio::test]
async fn a_second_network_gets_no_default_route_and_lists_what_it_installed() {
    let e = env();
    let first = json(e.h.add(&args("c1", CONF)).await.unwrap());
    assert_eq!(
        route_dsts(&first),
        vec![pair("0.0.0.0/0", "10.1.0.1"), pair("::/0", "fd01::1")]
    );
    // The defect: the second network's ADD asked the kernel for another default route.
    let out = json(e.h.add(&net1("c1", &second(""))).await.unwrap());
    assert_eq!(out["interfaces"][1]["name"], "net1");
    assert_eq!(out["ips"][0]["address"], "10.20.0.2/32");
    assert!(route_dsts(&out).is_empty(), "no default route: {out}");
    let req = e.net.setups.lock().unwrap()[1].1.clone();
    assert!(req.default_unless_present && req.routes.is_empty(), "{req:?}");

    // Stored as installed, and CHECK and repair get exactly that.
    let att = attachment(&e.store, "c1", "second", "net1").await.unwrap();
    assert!(att.routes.is_empty());
    e.h.check(&net1("c1", &second(""))).await.unwrap();
    assert_eq!(e.net.checked.lock().unwrap().last().unwrap(), &Vec::<PodRoute>::new());
    e.h.check(&args("c1", CONF)).await.unwrap();
    assert_eq!(e.net.checked.lock().unwrap().last().unwrap().len(), 2);
    assert!(e.h.reconcile().await.unwrap().is_empty());
    let repaired = e.net.repaired.lock().unwrap().clone();
    assert_eq!(repaired.len(), 2);
    assert!(repaired.contains(&Vec::new()) && repaired.iter().any(|r| r.len() == 2));

    // A repeated ADD returns the stored result.
    assert_eq!(json(e.h.add(&net1("c1", &second(""))).await.unwrap()), out);

    // DEL of the second leaves the first intact.
    e.h.del(&net1("c1", &second(""))).await.unwrap();
    e.h.drain_teardowns().await;
    assert!(attachment(&e.store, "c1", "second", "net1").await.is_none());
    assert!(attachment(&e.store, "c1", "weft", "eth0").await.is_some());
    e.h.check(&args("c1", CONF)).await.unwrap();
    assert_eq!(allocated(&e.store).await, 2);
}

#[tokio::test]
async fn routes_and_default_route_choose_what_a_network_installs() {
    let e = env();
    // `routes` through the range gateway; `gw`, when given, must be that gateway.
    let conf = second(r#","routes":[{"dst":"10.0.0.0/8"},{"dst":"fd00::/8","gw":"fd20::1"}]"#);
    let v = json(e.h.add(&net1("c1", &conf)).await.unwrap());
    assert_eq!(
        route_dsts(&v),
        vec![
            pair("0.0.0.0/0", "10.20.0.1"),
            pair("::/0", "fd20::1"),
            pair("10.0.0.0/8", "10.20.0.1"),
            pair("fd00::/8", "fd20::1")
        ],
        "the pod's first network: default routes too"
    );
    let stored = attachment(&e.store, "c1", "second", "net1").await.unwrap();
    assert_eq!(stored.routes.len(), 4);

    // `defaultRoute: false`: none, even for a pod's only network.
    let no_default = CONF.replace("\"mtu\":1450", "\"mtu\":1450,\"defaultRoute\":false");
    assert!(route_dsts(&json(e.h.add(&args("c2", &no_default)).await.unwrap())).is_empty());

    // `defaultRoute: true` on a pod that has default routes: refused (108), nothing left.
    let before = allocated(&e.store).await;
    let err =
        e.h.add(&args(
            "c1",
            &CONF.replace("\"mtu\":1450", "\"mtu\":1450,\"defaultRoute\":true"),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::RouteExists);
    assert!(
        err.details.contains("0.0.0.0/0 via 10.1.0.1 dev eth0"),
        "{}",
        err.details
    );
    assert_eq!(allocated(&e.store).await, before);
    assert!(attachment(&e.store, "c1", "weft", "eth0").await.is_none());
    assert_eq!(e.net.links.lock().unwrap().len(), 2);

    // A route of a family the pod has no address in is skipped.
    let v4_only = r#"{"cniVersion":"1.1.0","name":"v4","type":"weft","ranges":["10.30.0.0/29"],"routes":[{"dst":"fd00::/8"}],"defaultRoute":false}"#;
    let mut a = args("c3", v4_only);
    a.ifname = "net2".into();
    assert!(route_dsts(&json(e.h.add(&a).await.unwrap())).is_empty());

    // A `gw` that is not a gateway of the network: refused before anything is touched.
    let bad = second(r#","routes":[{"dst":"10.0.0.0/8","gw":"10.20.0.3"}]"#);
    let err = e.h.add(&net1("c4", &bad)).await.unwrap_err();
    assert_eq!(err.code, Code::InvalidConfig);
    assert!(err.details.contains("10.20.0.1 for 10.20.0.0/29"), "{}", err.details);
    assert!(attachment(&e.store, "c4", "second", "net1").await.is_none());
}

fn with_cni_args(mut a: CniCall, extra: &[(&str, &str)]) -> CniCall {
    for (k, v) in extra {
        a.args.insert((*k).into(), (*v).into());
    }
    a
}

#[tokio::test]
async fn a_requested_address_and_mac_are_honoured_or_refused_whole() {
    let e = env();
    // podman --ip / --mac-address: CNI_ARGS IP= and MAC=.
    let a = with_cni_args(
        args("c1", CONF),
        &[("IgnoreUnknown", "1"), ("IP", "10.1.0.5"), ("MAC", "0a:58:0a:01:00:05")],
    );
    let v = json(e.h.add(&a).await.unwrap());
    assert_eq!(v["ips"][0]["address"], "10.1.0.5/32");
    assert_eq!(v["ips"][1]["address"], "fd01::2/128", "the other family as usual");
    assert_eq!(v["interfaces"][1]["mac"], "0a:58:0a:01:00:05");
    assert_eq!(
        e.net.setups.lock().unwrap()[0].0.pod_mac,
        [0x0a, 0x58, 0x0a, 0x01, 0x00, 0x05]
    );
    let stored = attachment(&e.store, "c1", "weft", "eth0").await.unwrap();
    assert_eq!(stored.pod_mac, Some([0x0a, 0x58, 0x0a, 0x01, 0x00, 0x05]));
    assert_eq!(json(e.h.add(&a).await.unwrap()), v, "a repeated ADD returns the same");

    // The `ips` and `mac` capabilities: runtimeConfig.ips (with a prefix) and .mac.
    let rc = CONF.replace(
        "\"mtu\":1450",
        "\"mtu\":1450,\"runtimeConfig\":{\"ips\":[\"10.1.0.6/29\",\"fd01::6/64\"],\"mac\":\"0a:58:0a:01:00:06\"}",
    );
    let v = json(e.h.add(&args("c2", &rc)).await.unwrap());
    assert_eq!(v["ips"][0]["address"], "10.1.0.6/32");
    assert_eq!(v["ips"][1]["address"], "fd01::6/128");
    assert_eq!(v["interfaces"][1]["mac"], "0a:58:0a:01:00:06");

    let before = allocated(&e.store).await;
    let refused = |a: CniCall, want: Code, says: &'static str| {
        let h = e.h.clone();
        async move {
            let err = h.add(&a).await.unwrap_err();
            assert_eq!(err.code, want, "{err}");
            assert!(err.details.contains(says), "{}", err.details);
        }
    };
    // Taken: 107, naming the holder.
    refused(
        with_cni_args(args("c3", CONF), &[("IP", "10.1.0.5")]),
        Code::AddressInUse,
        "pod default/pod-c1",
    )
    .await;
    // Outside every range: 7, naming the ranges.
    refused(
        with_cni_args(args("c3", CONF), &[("IP", "10.88.0.7")]),
        Code::InvalidConfig,
        "10.1.0.0/29",
    )
    .await;
    // The gateway is no pod address.
    refused(
        with_cni_args(args("c3", CONF), &[("IP", "10.1.0.1")]),
        Code::InvalidConfig,
        "gateway",
    )
    .await;
    // Malformed in CNI_ARGS: 4.
    refused(
        with_cni_args(args("c3", CONF), &[("IP", "10.1.0")]),
        Code::InvalidEnv,
        "CNI_ARGS IP",
    )
    .await;
    refused(
        with_cni_args(args("c3", CONF), &[("MAC", "01:00:5e:00:00:01")]),
        Code::InvalidEnv,
        "multicast",
    )
    .await;
    // Two sources disagreeing: 7.
    refused(
        with_cni_args(args("c3", &rc), &[("IP", "10.1.0.4")]),
        Code::InvalidConfig,
        "one address per family",
    )
    .await;
    // The same attachment asked for with another address: 7.
    refused(
        with_cni_args(args("c1", CONF), &[("IP", "10.1.0.4")]),
        Code::InvalidConfig,
        "DEL it",
    )
    .await;
    assert_eq!(allocated(&e.store).await, before, "the refusals left no address");
    assert!(attachment(&e.store, "c3", "weft", "eth0").await.is_none());
    assert_eq!(e.net.links.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_requested_address_being_released_is_waited_for() {
    let e = env();
    let ip = |cid: &str| with_cni_args(args(cid, CONF), &[("IP", "10.1.0.5")]);
    e.h.add(&ip("c1")).await.unwrap();
    *e.net.remove_delay.lock().unwrap() = Duration::from_millis(100);
    e.h.del(&ip("c1")).await.unwrap();
    // The address is still held by c1's teardown when c2 asks for it.
    let v = json(e.h.add(&ip("c2")).await.unwrap());
    assert_eq!(v["ips"][0]["address"], "10.1.0.5/32");
    assert_eq!(*e.net.removes.lock().unwrap(), 1);
}

/// Records what the wiring seam is told; `links_fail` makes every wait for links
/// end with that reason.
#[derive(Default)]
struct FakeWiring {
    calls: Mutex<Vec<String>>,
    links_fail: Option<String>,
}

impl Wiring for FakeWiring {
    fn wait_links(
        &self,
        pod: WiredPod,
        default: Option<Duration>,
    ) -> futures::future::BoxFuture<'_, Result<(), String>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("wait {} {default:?}", pod.name));
        let r = self.links_fail.clone().map_or(Ok(()), Err);
        Box::pin(async move { r })
    }
    fn pod_added(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()> {
        self.calls.lock().unwrap().push(format!("added {}", pod.name));
        Box::pin(async {})
    }
    fn pod_removed(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()> {
        self.calls.lock().unwrap().push(format!("removed {}", pod.name));
        Box::pin(async {})
    }
    fn wires(&self) -> futures::future::BoxFuture<'_, Vec<weft_link::WireReport>> {
        Box::pin(async { Vec::new() })
    }
}

#[tokio::test]
async fn the_pods_wires_go_with_its_last_network_only() {
    let w = Arc::new(FakeWiring::default());
    let wiring = w.clone();
    let e = env_with(move |h| h.with_wiring(wiring));
    e.h.add(&args("c1", CONF)).await.unwrap();
    e.h.add(&net1("c1", &second(""))).await.unwrap();
    e.h.del(&net1("c1", &second(""))).await.unwrap();
    assert!(
        !w.calls.lock().unwrap().iter().any(|c| c.starts_with("removed")),
        "{:?}",
        w.calls.lock().unwrap()
    );
    e.h.del(&args("c1", CONF)).await.unwrap();
    assert_eq!(w.calls.lock().unwrap().last().unwrap(), "removed pod-c1");
}

#[tokio::test]
async fn an_add_whose_links_do_not_come_up_fails_and_leaves_nothing() {
    let w = Arc::new(FakeWiring {
        links_fail: Some(
            "links not up within 2s: e1 (to r2:e1): pending: peer pod r2 is not running on any node yet".into(),
        ),
        ..Default::default()
    });
    let wiring = w.clone();
    let e = env_with(move |h| h.with_wiring(wiring));
    let before = allocated(&e.store).await;
    let conf = CONF.replacen('{', r#"{"waitForLinks":"2s","#, 1);
    let err = e.h.add(&args("c1", &conf)).await.unwrap_err();
    assert_eq!(err.code, weft_cni::Code::TryAgainLater);
    assert!(
        err.details.contains("peer pod r2 is not running") && err.details.contains("can be retried"),
        "{}",
        err.details
    );
    assert_eq!(
        *w.calls.lock().unwrap(),
        ["added pod-c1", "wait pod-c1 Some(2s)", "removed pod-c1"]
    );
    assert!(
        attachment(&e.store, "c1", "weft", "eth0").await.is_none(),
        "the row stayed"
    );
    assert_eq!(allocated(&e.store).await, before, "the address stayed allocated");
    assert!(e.net.links.lock().unwrap().is_empty(), "the veth stayed");
}

#[tokio::test]
async fn an_add_whose_links_come_up_answers_with_its_result() {
    let w = Arc::new(FakeWiring::default());
    let wiring = w.clone();
    let e = env_with(move |h| h.with_wiring(wiring));
    let v = json(e.h.add(&args("c1", CONF)).await.unwrap());
    assert!(v["ips"][0]["address"].is_string());
    assert_eq!(*w.calls.lock().unwrap(), ["added pod-c1", "wait pod-c1 None"]);
}

/// A spooled DEL as the plugin writes it when weftd cannot be reached.
fn spooled(cid: &str) -> weft_cni::spool::SpooledDel {
    let a = args(cid, CONF);
    weft_cni::spool::SpooledDel {
        network: "weft".into(),
        container_id: a.container_id,
        ifname: a.ifname,
        netns: a.netns,
        args: a.args.into_iter().collect(),
        config: CONF.into(),
        spooled_at_ms: weft_cni::spool::now_ms(),
    }
}

#[tokio::test]
async fn a_spooled_del_is_done_before_the_same_pods_next_add() {
    let spool_dir = tempfile::tempdir().unwrap();
    let dir = spool_dir.path().join("del-spool");
    let spool = Arc::new(weft_daemon::DelSpool::new(dir.clone()));
    let e = env_with(|h| h.with_del_spool(spool.clone()));
    let first = json(e.h.add(&args("c1", CONF)).await.unwrap());
    weft_cni::spool::write(&dir, &spooled("c1")).unwrap();
    assert_eq!(spool.pending(), 1);
    // Without the spool this ADD would return the stored result again; the DEL the
    // runtime made before it comes first, so the pod gets a new attachment.
    let second = json(e.h.add(&args("c1", CONF)).await.unwrap());
    assert_eq!(spool.pending(), 0);
    assert_eq!(*e.net.removes.lock().unwrap(), 1, "the old veth went first");
    assert_ne!(first["ips"][0]["address"], second["ips"][0]["address"]);
    assert_eq!(allocated(&e.store).await, 2);
    // A pod without a spooled DEL is not touched.
    e.h.add(&args("c2", CONF)).await.unwrap();
    assert_eq!(*e.net.removes.lock().unwrap(), 1);
}

#[tokio::test]
async fn the_spool_replay_does_every_entry_and_sets_unreadable_ones_aside() {
    let spool_dir = tempfile::tempdir().unwrap();
    let dir = spool_dir.path().join("del-spool");
    let counted = Arc::new(Mutex::new(0u64));
    let spool = {
        let counted = counted.clone();
        Arc::new(weft_daemon::DelSpool::new(dir.clone()).on_replayed(Arc::new(move |n| *counted.lock().unwrap() += n)))
    };
    let e = env_with(|h| h.with_del_spool(spool.clone()));
    for cid in ["c1", "c2"] {
        e.h.add(&args(cid, CONF)).await.unwrap();
        weft_cni::spool::write(&dir, &spooled(cid)).unwrap();
    }
    // A DEL of a pod weft never set up is done too (nothing to remove).
    weft_cni::spool::write(&dir, &spooled("never-added")).unwrap();
    std::fs::write(dir.join("0000000000000000.del"), b"not a DEL").unwrap();
    // A DEL refused for its own input never succeeds: set aside, not retried forever.
    let mut undecodable = spooled("c3");
    undecodable.config = "{not json".into();
    let refused = weft_cni::spool::write(&dir, &undecodable).unwrap();
    let done = e.h.replay_del_spool().await;
    assert_eq!(
        done,
        weft_daemon::Replayed {
            replayed: 3,
            failed: 0,
            set_aside: 2
        }
    );
    assert!(refused.with_extension("bad").exists());
    assert_eq!(*counted.lock().unwrap(), 3);
    assert_eq!(spool.pending(), 0);
    assert!(dir.join("0000000000000000.bad").exists(), "kept for a human");
    e.h.drain_teardowns().await;
    assert_eq!(allocated(&e.store).await, 0);
    assert!(e.net.links.lock().unwrap().is_empty());
    // Nothing left: a second pass does nothing.
    assert_eq!(e.h.replay_del_spool().await, weft_daemon::Replayed::default());
}

/// The real store, whose writes fail as on a full disk while `full` is set (reads go
/// through, as SQLite's do then).
#[derive(Clone)]
struct FillableStore {
    store: Store,
    full: Arc<std::sync::atomic::AtomicBool>,
}

impl FillableStore {
    fn refuse(&self) -> Result<(), weft_store::StoreError> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            Err(weft_store::StoreError::disk_full())
        } else {
            Ok(())
        }
    }
}

impl weft_daemon::Ipam for FillableStore {
    async fn begin_add(&self, spec: weft_store::NewAttachment) -> Result<weft_store::BeginAdd, weft_store::StoreError> {
        self.refuse()?;
        self.store.begin_add(spec).await
    }
    async fn finish_add(
        &self,
        id: i64,
        result_json: String,
        routes: Vec<weft_store::InstalledRoute>,
    ) -> Result<(), weft_store::StoreError> {
        self.refuse()?;
        self.store.finish_add(id, result_json, routes).await
    }
    async fn remove(&self, id: i64) -> Result<(), weft_store::StoreError> {
        self.refuse()?;
        weft_daemon::Ipam::remove(&self.store, id).await
    }
    async fn begin_del(
        &self,
        key: weft_store::AttachmentKey,
    ) -> Result<Option<weft_store::Attachment>, weft_store::StoreError> {
        self.refuse()?;
        self.store.begin_del(key).await
    }
    async fn get(
        &self,
        key: weft_store::AttachmentKey,
    ) -> Result<Option<weft_store::Attachment>, weft_store::StoreError> {
        weft_daemon::Ipam::get(&self.store, key).await
    }
    async fn container_attachments(
        &self,
        container_id: String,
    ) -> Result<Vec<weft_store::Attachment>, weft_store::StoreError> {
        self.store.container_attachments(container_id).await
    }
    async fn list(
        &self,
        network: Option<String>,
        state: Option<weft_store::State>,
    ) -> Result<Vec<weft_store::Attachment>, weft_store::StoreError> {
        weft_daemon::Ipam::list(&self.store, network, state).await
    }
    async fn usage_of(&self, ranges: Vec<ipnet::IpNet>) -> Result<Vec<weft_store::RangeUsage>, weft_store::StoreError> {
        self.store.usage_of(ranges).await
    }
    async fn held_ports(&self) -> Result<Vec<weft_store::HeldPort>, weft_store::StoreError> {
        self.store.held_ports().await
    }
    async fn gateways_in_use(&self) -> Result<Vec<std::net::IpAddr>, weft_store::StoreError> {
        self.store.gateways_in_use().await
    }
}

#[tokio::test]
async fn a_full_disk_fails_add_with_try_again_and_a_del_is_spooled_until_the_store_writes() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    let fillable = FillableStore {
        store: store.clone(),
        full: Arc::default(),
    };
    let spool_dir = dir.path().join("del-spool");
    let spool = Arc::new(weft_daemon::DelSpool::new(spool_dir.clone()));
    let net = FakeNet::default();
    let h = Handler::new(fillable.clone(), net.clone(), NodeInfo { name: "n1".into() }).with_del_spool(spool.clone());
    let with_port = r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","ranges":["10.1.0.0/29"],"mtu":1450,
        "runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}}"#;
    let c1 = args("c1", with_port);
    h.add(&c1).await.unwrap();
    h.add(&args("c2", &with_port.replace("8080", "8081"))).await.unwrap();
    let c1_host = attachment(&store, "c1", "weft", "eth0").await.unwrap().host_ifname;
    assert_eq!(net.ports.lock().unwrap().len(), 2);

    fillable.full.store(true, Ordering::SeqCst);
    // ADD: try again later, naming the cause; nothing touched.
    let err = h.add(&args("c3", CONF)).await.unwrap_err();
    assert_eq!(err.code, Code::TryAgainLater);
    assert_eq!(
        err.details,
        "the state store cannot be written: database or disk is full; weftd takes pods again once it can write \
         (see /readyz)"
    );
    assert_eq!(
        net.setups.lock().unwrap().len(),
        2,
        "the kernel was not asked to set c3 up"
    );

    // DEL: answered success, the pod cut off now, the DEL kept in the spool.
    h.del(&c1).await.unwrap();
    assert_eq!(spool.pending(), 1);
    assert!(!net.links.lock().unwrap().contains(&c1_host), "c1's veth pair is gone");
    assert_eq!(net.ports.lock().unwrap().len(), 1, "c1's host port is gone");
    assert_eq!(
        store.run(|db| db.list(None, None)).await.unwrap().len(),
        2,
        "the rows stay"
    );
    // Reconcile neither rebuilds c1's veth nor puts its host port back.
    h.reconcile().await.unwrap();
    assert!(!net.links.lock().unwrap().contains(&c1_host));
    assert_eq!(net.ports.lock().unwrap().len(), 1);
    // Nor does a replay while the store still cannot write lose the DEL.
    let done = h.replay_del_spool().await;
    assert_eq!((done.replayed, done.failed), (0, 1));
    assert_eq!(spool.pending(), 1);
    // An ADD of the same pod must wait for that DEL.
    let err = h.add(&c1).await.unwrap_err();
    assert_eq!(err.code, Code::TryAgainLater);
    assert!(err.details.contains("waiting in the DEL spool"), "{err:?}");

    // Room again: the replay releases c1's rows and addresses, c2 is untouched.
    fillable.full.store(false, Ordering::SeqCst);
    let done = h.replay_del_spool().await;
    assert_eq!((done.replayed, done.failed), (1, 0));
    h.drain_teardowns().await;
    assert_eq!(spool.pending(), 0);
    let rows = store.run(|db| db.list(None, None)).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key.container_id, "c2");
    assert_eq!(allocated(&store).await, 1);
    assert_eq!(net.ports.lock().unwrap().len(), 1);
}

/// A policy hook that records the pods it is given and refuses on demand.
#[derive(Default)]
struct FakePolicy {
    attached: Mutex<Vec<weft_daemon::PolicedPod>>,
    detached: Mutex<usize>,
    refuse: Mutex<Option<String>>,
}

impl weft_daemon::PolicyHook for FakePolicy {
    fn pod_attached(&self, pod: weft_daemon::PolicedPod) -> futures::future::BoxFuture<'_, Result<(), String>> {
        self.attached.lock().unwrap().push(pod);
        let refuse = self.refuse.lock().unwrap().clone();
        Box::pin(async move { refuse.map_or(Ok(()), Err) })
    }
    fn pod_detached(&self, _: &str) {
        *self.detached.lock().unwrap() += 1;
    }
}

/// The pod network's ADD answers only once its policies are in place; one whose
/// policies cannot be placed fails (try again) and leaves nothing; a second network is
/// not policed; DEL is heard.
#[tokio::test]
async fn an_add_answers_once_its_policies_are_in_place() {
    let policy = Arc::new(FakePolicy::default());
    let e = env_with(|h| h.with_policy(policy.clone()));
    e.h.add(&args("c1", CONF)).await.unwrap();
    {
        let seen = policy.attached.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].namespace.as_str(), seen[0].name.as_str()),
            ("default", "pod-c1")
        );
        assert_eq!(seen[0].ips.len(), 2);
    }
    e.h.add(&net1("c1", &second(""))).await.unwrap();
    assert_eq!(policy.attached.lock().unwrap().len(), 1, "net1 is not the pod network");

    *policy.refuse.lock().unwrap() = Some("network policy state not known yet".into());
    let err = e.h.add(&args("c2", CONF)).await.unwrap_err();
    assert_eq!(err.code, Code::TryAgainLater);
    assert!(err.details.contains("not known yet"), "{}", err.details);
    assert!(
        attachment(&e.store, "c2", "weft", "eth0").await.is_none(),
        "nothing left"
    );
    assert_eq!(allocated(&e.store).await, 4, "c1's two networks only");

    *policy.refuse.lock().unwrap() = None;
    let before = *policy.detached.lock().unwrap();
    e.h.del(&args("c1", CONF)).await.unwrap();
    assert!(*policy.detached.lock().unwrap() > before);
}

/// Policies are placed while the pod's network is set up: when the setup fails after
/// they were placed, the engine is told to take them back, and the ADD fails with the
/// setup's error, leaving nothing.
#[tokio::test]
async fn a_failed_setup_takes_back_the_policies_placed_beside_it() {
    let policy = Arc::new(FakePolicy::default());
    let e = env_with(|h| h.with_policy(policy.clone()));
    *e.net.fail_setup.lock().unwrap() =
        Some(|| KernelError::os("creating the veth pair", std::io::Error::from_raw_os_error(libc::EPERM)));
    let err = e.h.add(&args("c1", CONF)).await.unwrap_err();
    assert_eq!(err.code, Code::Kernel, "{}", err.details);
    assert_eq!(policy.attached.lock().unwrap().len(), 1, "placed beside the setup");
    assert_eq!(*policy.detached.lock().unwrap(), 1, "and taken back");
    assert_eq!(allocated(&e.store).await, 0);
    assert!(e.store.run(|db| db.list(None, None)).await.unwrap().is_empty());
}
