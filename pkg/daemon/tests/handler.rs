//! The handler on its own: the real SQLite store, and a scripted kernel that records
//! what it was asked and fails on demand.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use weft_cni::code;
use weft_daemon::{Handler, NodeInfo, PodNetworking};
use weft_kernel::KernelError;
use weft_kernel::ptp::PodNetwork;
use weft_portmap::{Entries, HostPort};
use weft_rpc::cnirpc::CniArgs;
use weft_store::Store;

/// Makes the error a scripted setup fails with.
type Failure = fn() -> KernelError;

/// A kernel that keeps "links" in a set.
#[derive(Default, Clone)]
struct FakeNet {
    ports: Arc<Mutex<HashSet<HostPort>>>,
    links: Arc<Mutex<HashSet<String>>>,
    fail_setup: Arc<Mutex<Option<Failure>>>,
    drift: Arc<Mutex<Option<String>>>,
    gone: Arc<Mutex<HashSet<PathBuf>>>,
    removes: Arc<Mutex<usize>>,
    remove_delay: Arc<Mutex<Duration>>,
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
    async fn setup(&self, net: PodNetwork) -> Result<(), KernelError> {
        if let Some(f) = *self.fail_setup.lock().unwrap() {
            return Err(f());
        }
        self.links.lock().unwrap().insert(net.host_ifname);
        Ok(())
    }
    async fn check(&self, net: PodNetwork) -> Result<(), KernelError> {
        if let Some(d) = self.drift.lock().unwrap().clone() {
            return Err(KernelError::Drift(d));
        }
        assert!(self.links.lock().unwrap().contains(&net.host_ifname));
        Ok(())
    }
    async fn repair(&self, net: PodNetwork) -> Result<Vec<&'static str>, KernelError> {
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
    async fn sync_host_ports(&self, entries: Entries) -> Result<bool, KernelError> {
        let want: HashSet<HostPort> = entries.ports.into_iter().collect();
        let mut p = self.ports.lock().unwrap();
        let drift = *p != want;
        *p = want;
        Ok(drift)
    }
    async fn remove(&self, host_ifname: String) -> Result<bool, KernelError> {
        let d = *self.remove_delay.lock().unwrap();
        tokio::time::sleep(d).await;
        *self.removes.lock().unwrap() += 1;
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
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    let net = FakeNet::default();
    let h = Arc::new(Handler::new(store.clone(), net.clone(), NodeInfo { name: "n1".into() }));
    Env {
        _dir: dir,
        store,
        net,
        h,
    }
}

const CONF: &str =
    r#"{"cniVersion":"1.1.0","name":"weft","type":"weft","ranges":["10.1.0.0/29","fd01::/64"],"mtu":1450}"#;

fn args(cid: &str, conf: &str) -> CniArgs {
    CniArgs {
        container_id: cid.into(),
        netns: format!("/ok/{cid}"),
        ifname: "eth0".into(),
        args: HashMap::from([
            ("K8S_POD_NAME".into(), format!("pod-{cid}")),
            ("K8S_POD_NAMESPACE".into(), "default".into()),
        ]),
        path: "/opt/cni/bin".into(),
        stdin_data: conf.as_bytes().to_vec(),
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
    assert_eq!(err.code, code::KERNEL);
    assert!(err.details.contains("creating the veth pair"), "{}", err.details);
    assert_eq!(allocated(&e.store).await, 0);
    assert!(e.store.run(|db| db.list(None, None)).await.unwrap().is_empty());

    *e.net.fail_setup.lock().unwrap() = Some(|| KernelError::InterfaceExists { ifname: "eth0".into() });
    assert_eq!(
        e.h.add(&args("c1", CONF)).await.unwrap_err().code,
        code::INTERFACE_EXISTS
    );
    assert_eq!(allocated(&e.store).await, 0);
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_touched() {
    let e = env();
    let mut cases: Vec<(CniArgs, u32)> = Vec::new();
    let mut a = args("c1", CONF);
    a.ifname = "a-very-long-ifname".into();
    cases.push((a, code::INVALID_ENV));
    let mut a = args("c1", CONF);
    a.ifname = "et/h0".into();
    cases.push((a, code::INVALID_ENV));
    let mut a = args("c1", CONF);
    a.container_id = "bad id".into();
    cases.push((a, code::INVALID_ENV));
    let mut a = args("c1", CONF);
    a.netns = "/missing/ns".into();
    cases.push((a, code::INVALID_NETNS));
    cases.push((args("c1", "{nope"), code::DECODE));
    cases.push((args("c1", &CONF.replace("1.1.0", "9.9.9")), code::INCOMPATIBLE_VERSION));
    cases.push((
        args("c1", &CONF.replace(r#""cniVersion":"1.1.0","#, "")),
        code::INCOMPATIBLE_VERSION,
    ));
    cases.push((
        args("c1", &CONF.replace("10.1.0.0/29", "10.1.0.0/33")),
        code::INVALID_CONFIG,
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
    assert_eq!(err.code, code::RANGE_EXHAUSTED);
    assert!(err.details.contains("10.1.0.0/29"), "{}", err.details);
    assert_eq!(
        allocated(&e.store).await,
        10,
        "the failed ADD's IPv6 address was released"
    );
    // STATUS now says ADD cannot be served.
    let st = e.h.status(&args("", CONF)).await.unwrap_err();
    assert_eq!(st.code, code::NOT_AVAILABLE);
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
    assert_eq!(e.h.check(&a).await.unwrap_err().code, code::UNKNOWN_CONTAINER);
    e.h.add(&a).await.unwrap();
    e.h.check(&a).await.unwrap();
    *e.net.drift.lock().unwrap() = Some("default route via 10.1.0.1 is missing in the pod".into());
    let err = e.h.check(&a).await.unwrap_err();
    assert_eq!(err.code, code::CHECK_FAILED);
    assert!(err.details.contains("default route"));
    *e.net.drift.lock().unwrap() = None;
    a.stdin_data = CONF
        .replace(
            "\"mtu\":1450",
            "\"mtu\":1450,\"prevResult\":{\"cniVersion\":\"1.1.0\",\"ips\":[{\"address\":\"10.9.9.9/32\"}]}",
        )
        .into_bytes();
    let err = e.h.check(&a).await.unwrap_err();
    assert_eq!(err.code, code::CHECK_FAILED);
    assert!(err.details.contains("prevResult"), "{}", err.details);
    let old = args("c1", &CONF.replace("1.1.0", "0.3.1"));
    assert_eq!(e.h.check(&old).await.unwrap_err().code, code::INCOMPATIBLE_VERSION);
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
    assert_eq!(e.h.gc(&args("", CONF)).await.unwrap_err().code, code::INVALID_CONFIG);
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
    assert_eq!(taken.code, code::HOST_PORT_IN_USE);
    assert!(
        taken.details.contains("0.0.0.0:8080/tcp") && taken.details.contains("pod default/pod-c1"),
        "{}",
        taken.details
    );
    assert_eq!(allocated(&e.store).await, 2, "the refused ADD left nothing");
    assert_eq!(e.net.links.lock().unwrap().len(), 1);
    // Someone drops the kernel's elements: the sync puts them back.
    e.net.ports.lock().unwrap().clear();
    assert!(e.h.sync_host_ports().await.unwrap());
    assert_eq!(e.net.ports.lock().unwrap().len(), 2);
    assert!(!e.h.sync_host_ports().await.unwrap(), "nothing to repair");
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
    assert_eq!(e.h.add(&args("c3", &bad)).await.unwrap_err().code, code::INVALID_CONFIG);
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
