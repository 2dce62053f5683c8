//! `KubeSource`'s policy objects (Pods, Namespaces, NetworkPolicies) against the
//! in-process fake API server: the snapshot, when `policy_changes` moves (and when it
//! must not), `synced`, and `stale` across a lost watch.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use tokio::time::Instant;
use weft_topology::testing::FakeApiServer;
use weft_topology::{KubeSource, NamedPort, PolicyObjects, PortProtocol, Topology, TopologySource, TopologySpec};

const NODE: &str = "node-1";

fn pod(namespace: &str, name: &str, labels: Value, ips: &[&str]) -> Pod {
    let ips: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
    serde_json::from_value(json!({
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{
                "name": "web",
                "image": "nginx",
                "env": [{"name": "A", "value": "b"}],
                "ports": [
                    {"name": "http", "containerPort": 8080},
                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                    {"containerPort": 9000},
                ],
            }],
        },
        "status": {
            "phase": "Running",
            "podIP": ips.first().map(|i| i["ip"].clone()),
            "podIPs": ips,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("a Pod")
}

fn namespace(name: &str, labels: Value, audit: bool) -> Namespace {
    let mut annotations = json!({"owner": "team-a"});
    if audit {
        annotations["weft.dev/policy-mode"] = "audit".into();
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {"phase": "Active"},
    }))
    .expect("a Namespace")
}

fn policy(namespace: &str, name: &str, app: &str) -> NetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {
            "namespace": namespace,
            "name": name,
            "generation": 1,
            "labels": {"team": "a"},
            "annotations": {"note": "x"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "networking.k8s.io/v1"}],
        },
        "spec": {
            "podSelector": {"matchLabels": {"app": app}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": "http"}]}],
        },
    }))
    .expect("a NetworkPolicy")
}

/// Polls `cond` every 20 ms for up to 10 s; whether it became true.
async fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server with this node, so that the source gets ready.
fn server() -> FakeApiServer {
    let server = FakeApiServer::new();
    let mut node = Node::default();
    node.metadata.name = Some(NODE.into());
    server.put(&node);
    server
}

/// Starts a source and waits until its policy objects are synced.
async fn start(server: &FakeApiServer) -> Arc<KubeSource> {
    let source = KubeSource::start(server.client(), NODE.into());
    let synced = wait_for(|| source.policy_objects().synced).await;
    assert!(synced, "policy objects never synced; server log: {:?}", server.log());
    source
}

/// `namespace/name` of every pod in the snapshot, in its order.
fn pods(o: &PolicyObjects) -> Vec<String> {
    o.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect()
}

fn policies(o: &PolicyObjects) -> Vec<String> {
    (o.policies.iter())
        .map(|p| {
            let m = &p.metadata;
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

fn ips(source: &KubeSource, namespace: &str, name: &str) -> Option<Vec<String>> {
    let o = source.policy_objects();
    let p = o.pods.iter().find(|p| p.namespace == namespace && p.name == name)?;
    Some(p.ips.iter().map(ToString::to_string).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_namespaces_and_policies_arrive_sorted_and_slimmed() {
    let server = server();
    server.put(&pod("web", "b", json!({"app": "web"}), &["10.244.1.5", "fd00::5"]));
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.4"]));
    server.put(&pod("db", "z", json!({"app": "db"}), &[]));
    server.put(&namespace("web", json!({"env": "prod"}), true));
    server.put(&namespace("db", json!({}), false));
    server.put(&policy("web", "allow-web", "web"));
    server.put(&policy("db", "deny-db", "db"));
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");

    assert_eq!(pods(&o), ["db/z", "web/a", "web/b"]);
    let b = &o.pods[2];
    assert_eq!(b.labels, [("app".to_string(), "web".to_string())].into());
    assert_eq!(
        b.ips,
        [
            "10.244.1.5".parse::<std::net::IpAddr>().unwrap(),
            "fd00::5".parse().unwrap()
        ]
    );
    assert_eq!(b.node, NODE);
    assert!(!b.host_network);
    let named = |name: &str, port, protocol| NamedPort {
        name: name.into(),
        port,
        protocol,
    };
    assert_eq!(
        b.ports,
        [
            named("http", 8080, PortProtocol::Tcp),
            named("dns", 53, PortProtocol::Udp)
        ]
    );
    assert!(o.pods[0].ips.is_empty(), "no address reported yet");

    let namespaces: Vec<_> = o.namespaces.iter().map(|n| (n.name.as_str(), n.audit)).collect();
    assert_eq!(namespaces, [("db", false), ("web", true)]);
    assert_eq!(o.namespaces[1].labels["env"], "prod");
    assert_eq!(o.namespaces[1].labels["kubernetes.io/metadata.name"], "web");

    assert_eq!(policies(&o), ["db/deny-db", "web/allow-web"]);
    let allow = &o.policies[1];
    assert_eq!(allow.spec, policy("web", "allow-web", "web").spec);
    // Only what policy reads is cached: no managedFields, labels or annotations.
    let meta = serde_json::to_value(&allow.metadata).unwrap();
    let mut keys: Vec<_> = meta.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["generation", "name", "namespace", "uid"], "{meta}");

    // Reads come from the caches: one list of each kind.
    for plural in ["pods", "namespaces", "networkpolicies"] {
        assert_eq!(server.count(&format!("list {plural}")), 1, "{:?}", server.log());
        assert_eq!(server.count(&format!("get {plural}")), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_changes_moves_once_per_change_that_policy_reads() {
    let server = server();
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.4"]));
    server.put(&namespace("web", json!({}), false));
    server.put(&policy("web", "allow-web", "web"));
    let source = start(&server).await;
    assert!(wait_for(|| source.ready()).await);
    let policy_changes = source.policy_changes();
    let changes = source.changes();
    let topology_changes = *changes.borrow();
    let mut expected = *policy_changes.borrow();
    // Waits until the snapshot shows `cond` and the counter reached `expected`, then
    // checks it moved exactly once per change.
    macro_rules! settles {
        ($what:literal, $cond:expr) => {
            assert!(
                wait_for(|| $cond && *policy_changes.borrow() >= expected).await,
                "{}: {:?} {:?}",
                $what,
                source.policy_objects(),
                server.log()
            );
            assert_eq!(
                *policy_changes.borrow(),
                expected,
                "{}: one bump per change",
                $what
            );
        };
    }

    server.put(&pod(
        "web",
        "a",
        json!({"app": "web", "tier": "front"}),
        &["10.244.1.4"],
    ));
    expected += 1;
    settles!("labels", source.policy_objects().pods[0].labels.contains_key("tier"));

    server.put(&pod(
        "web",
        "a",
        json!({"app": "web", "tier": "front"}),
        &["10.244.1.9"],
    ));
    expected += 1;
    settles!("podIPs", ips(&source, "web", "a") == Some(vec!["10.244.1.9".into()]));

    // A status rewrite kubelet makes all the time (conditions, a new phase with the same
    // addresses): nothing policy reads changed, so nothing moves; the next change counts
    // one.
    let mut busy = pod("web", "a", json!({"app": "web", "tier": "front"}), &["10.244.1.9"]);
    let status = busy.status.as_mut().unwrap();
    status.conditions.as_mut().unwrap()[0].status = "False".into();
    status.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2024-01-01T00:00:00Z".parse().unwrap(),
    ));
    server.put(&busy);
    // A policy relabelled (its spec and generation unchanged) is the same policy too.
    let mut relabelled = policy("web", "allow-web", "web");
    relabelled.metadata.labels = Some([("team".to_string(), "b".to_string())].into());
    server.put(&relabelled);
    server.put(&pod("web", "b", json!({"app": "web"}), &["10.244.1.10"]));
    expected += 1;
    settles!("after no-op updates", ips(&source, "web", "b").is_some());

    // A finished pod's addresses are free again: it keeps none.
    let mut done = pod("web", "b", json!({"app": "web"}), &["10.244.1.10"]);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    server.put(&done);
    expected += 1;
    settles!("finished", ips(&source, "web", "b") == Some(vec![]));

    server.put(&namespace("web", json!({"env": "prod"}), false));
    expected += 1;
    settles!(
        "namespace labels",
        source.policy_objects().namespaces[0].labels.contains_key("env")
    );
    server.put(&namespace("web", json!({"env": "prod"}), true));
    expected += 1;
    settles!("audit mode", source.policy_objects().namespaces[0].audit);

    let mut changed = policy("web", "allow-web", "api");
    changed.metadata.generation = Some(2);
    server.put(&changed);
    expected += 1;
    settles!("policy spec", source.policy_objects().policies[0].spec == changed.spec);

    assert!(server.delete::<Pod>(Some("web"), "a"));
    expected += 1;
    settles!("pod deleted", pods(&source.policy_objects()) == ["web/b"]);
    assert!(server.delete::<NetworkPolicy>(Some("web"), "allow-web"));
    expected += 1;
    settles!("policy deleted", source.policy_objects().policies.is_empty());
    assert!(server.delete::<Namespace>(None, "web"));
    expected += 1;
    settles!("namespace deleted", source.policy_objects().namespaces.is_empty());

    // None of it moved the counter the topology and node engines wake on.
    assert_eq!(*changes.borrow(), topology_changes);
    server.put(&Topology::new("r1", TopologySpec::default()));
    assert!(wait_for(|| source.topology("default", "r1").is_some()).await);
    assert_eq!(*changes.borrow(), topology_changes + 1);
    assert_eq!(*policy_changes.borrow(), expected, "a Topology is not a policy object");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_only_once_all_three_kinds_listed_and_ready_does_not_wait() {
    let server = server();
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.4"]));
    server.put(&namespace("web", json!({}), false));
    server.put(&policy("web", "allow-web", "web"));
    server.disconnect::<Pod>();
    server.disconnect::<Namespace>();
    server.disconnect::<NetworkPolicy>();
    let source = KubeSource::start(server.client(), NODE.into());
    let policy_changes = source.policy_changes();

    // Topologies and Nodes are listed: the source is ready without policy objects.
    assert!(wait_for(|| source.ready()).await, "{:?}", server.log());
    let o = source.policy_objects();
    assert!(!o.synced && !o.stale, "{o:?}");
    assert!(o.pods.is_empty() && o.namespaces.is_empty() && o.policies.is_empty());

    server.reconnect::<Pod>();
    assert!(
        wait_for(|| !source.policy_objects().pods.is_empty()).await,
        "{:?}",
        server.log()
    );
    assert!(!source.policy_objects().synced, "synced with two kinds unlisted");
    server.reconnect::<NetworkPolicy>();
    assert!(wait_for(|| !source.policy_objects().policies.is_empty()).await);
    assert!(!source.policy_objects().synced, "synced with Namespaces unlisted");
    // Held for longer than a lost watch takes to show: unlisted kinds are not stale.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!source.policy_objects().stale);
    let before = *policy_changes.borrow();
    server.reconnect::<Namespace>();
    assert!(wait_for(|| source.policy_objects().synced).await, "{:?}", server.log());
    let o = source.policy_objects();
    assert!(!o.stale);
    assert_eq!((o.pods.len(), o.namespaces.len(), o.policies.len()), (1, 1, 1));
    assert!(*policy_changes.borrow() > before);
}

/// Cuts the watch of `K`, checks the last objects stay while it is stale, and that after
/// it is back the source converges (through a relist, the history being compacted).
async fn lost_watch<K: kube::Resource<DynamicType = ()>>() {
    let server = server();
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.4"]));
    server.put(&pod("web", "b", json!({"app": "web"}), &["10.244.1.5"]));
    server.put(&namespace("web", json!({}), false));
    server.put(&policy("web", "allow-web", "web"));
    let source = start(&server).await;
    let before = source.policy_objects();
    let policy_changes = source.policy_changes();
    let moved = *policy_changes.borrow();

    server.disconnect::<K>();
    assert!(
        wait_for(|| source.policy_objects().stale).await,
        "never stale: {:?}",
        server.log()
    );
    assert!(*policy_changes.borrow() > moved, "stale is announced");
    // Meanwhile everything changes and the history is forgotten.
    server.delete::<Pod>(Some("web"), "b");
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.40"]));
    server.put(&namespace("web", json!({"env": "prod"}), false));
    server.put(&policy("web", "allow-web", "api"));
    server.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = source.policy_objects();
    assert!(during.stale && during.synced);
    // The cut kind kept its last objects (the others may have moved on).
    match K::plural(&()).as_ref() {
        "pods" => assert_eq!(during.pods, before.pods),
        "namespaces" => assert_eq!(during.namespaces, before.namespaces),
        _ => assert_eq!(during.policies, before.policies),
    }

    server.reconnect::<K>();
    let converged = || {
        let o = source.policy_objects();
        !o.stale
            && pods(&o) == ["web/a"]
            && ips(&source, "web", "a") == Some(vec!["10.244.1.40".into()])
            && o.namespaces[0].labels.contains_key("env")
            && o.policies[0].spec == policy("web", "allow-web", "api").spec
    };
    assert!(
        wait_for(converged).await,
        "{:?} {:?}",
        source.policy_objects(),
        server.log()
    );
    assert!(source.policy_objects().synced);
    // Through a 410 and a second list of the cut kind, not through its expired watch.
    let plural = K::plural(&());
    assert_eq!(server.count(&format!("expired {plural}")), 1, "{:?}", server.log());
    assert_eq!(server.count(&format!("list {plural}")), 2, "{:?}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_pod_watch_keeps_the_pods_and_is_stale_until_back() {
    lost_watch::<Pod>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_namespace_watch_keeps_the_namespaces_and_is_stale_until_back() {
    lost_watch::<Namespace>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_policy_watch_keeps_the_policies_and_is_stale_until_back() {
    lost_watch::<NetworkPolicy>().await;
}
