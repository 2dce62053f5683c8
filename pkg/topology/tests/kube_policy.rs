//! `KubeSource`'s policy objects (Pods, Namespaces, NetworkPolicies,
//! ClusterNetworkPolicies) against the in-process fake API server: the snapshot, when
//! `policy_changes` moves (and when it must not), `synced`, `stale` across a lost watch,
//! a cluster without the ClusterNetworkPolicy CRD (404) or the RBAC to read it (403),
//! ClusterNetworkPolicy served at v1beta1, v1alpha2, both or neither, and policies read
//! strictly (unknown fields named, an object that does not decode left out alone).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use tokio::time::Instant;
use weft_fakekube::FakeApiServer;
use weft_topology::cnp::CNP_VERSIONS;
use weft_topology::{
    ClusterNetworkPolicy, KubeSource, NamedPort, PolicyObjects, PortProtocol, Topology, TopologySource, TopologySpec,
};

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

fn cluster_policy(name: &str, priority: i32) -> ClusterNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {
            "name": name,
            "generation": 1,
            "labels": {"team": "a"},
            "annotations": {"note": "x"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {
            "tier": "Admin",
            "priority": priority,
            "subject": {"namespaces": {"matchLabels": {"env": "prod"}}},
            "ingress": [{"name": "no-db", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"app": "db"}}}]}],
        },
    }))
    .expect("a ClusterNetworkPolicy")
}

/// The names of the snapshot's ClusterNetworkPolicies, in its order.
fn cluster_policies(o: &PolicyObjects) -> Vec<String> {
    (o.cluster_policies.iter())
        .map(|c| c.object.metadata.name.clone().unwrap_or_default())
        .collect()
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
    o.pods.values().map(|p| format!("{}/{}", p.namespace, p.name)).collect()
}

fn policies(o: &PolicyObjects) -> Vec<String> {
    (o.policies.iter())
        .map(|p| {
            let m = &p.object.metadata;
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
    let p = o.pods.values().find(|p| p.namespace == namespace && p.name == name)?;
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
    let b = &o.pods.values().nth(2).expect("a pod");
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
    assert!(
        o.pods.values().next().expect("a pod").ips.is_empty(),
        "no address reported yet"
    );

    let namespaces: Vec<_> = o.namespaces.iter().map(|n| (n.name.as_str(), n.audit)).collect();
    assert_eq!(namespaces, [("db", false), ("web", true)]);
    assert_eq!(o.namespaces[1].labels["env"], "prod");
    assert_eq!(o.namespaces[1].labels["kubernetes.io/metadata.name"], "web");

    assert_eq!(policies(&o), ["db/deny-db", "web/allow-web"]);
    let allow = &o.policies[1];
    assert_eq!(allow.object.spec, policy("web", "allow-web", "web").spec);
    // Only what policy reads is cached: no managedFields, labels or annotations.
    let meta = serde_json::to_value(&allow.object.metadata).unwrap();
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
    settles!(
        "labels",
        source
            .policy_objects()
            .pods
            .values()
            .next()
            .expect("a pod")
            .labels
            .contains_key("tier")
    );

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
    settles!(
        "policy spec",
        source.policy_objects().policies[0].object.spec == changed.spec
    );

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
async fn synced_only_once_all_four_kinds_listed_and_ready_does_not_wait() {
    let server = server();
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.4"]));
    server.put(&namespace("web", json!({}), false));
    server.put(&policy("web", "allow-web", "web"));
    server.put(&cluster_policy("deny-db", 10));
    server.disconnect::<Pod>();
    server.disconnect::<Namespace>();
    server.disconnect::<NetworkPolicy>();
    // Unreachable is not absent: ClusterNetworkPolicies are waited for like the rest.
    server.disconnect::<ClusterNetworkPolicy>();
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
    server.reconnect::<Namespace>();
    assert!(wait_for(|| !source.policy_objects().namespaces.is_empty()).await);
    assert!(
        !source.policy_objects().synced,
        "synced with ClusterNetworkPolicies unlisted"
    );
    let before = *policy_changes.borrow();
    server.reconnect::<ClusterNetworkPolicy>();
    assert!(wait_for(|| source.policy_objects().synced).await, "{:?}", server.log());
    let o = source.policy_objects();
    assert!(!o.stale);
    assert_eq!((o.pods.len(), o.namespaces.len(), o.policies.len()), (1, 1, 1));
    assert_eq!(cluster_policies(&o), ["deny-db"]);
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
    server.put(&cluster_policy("deny-db", 10));
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
    server.put(&cluster_policy("deny-db", 20));
    server.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = source.policy_objects();
    assert!(during.stale && during.synced);
    // The cut kind kept its last objects (the others may have moved on).
    match K::plural(&()).as_ref() {
        "pods" => assert_eq!(during.pods, before.pods),
        "namespaces" => assert_eq!(during.namespaces, before.namespaces),
        "networkpolicies" => assert_eq!(during.policies, before.policies),
        _ => assert_eq!(during.cluster_policies, before.cluster_policies),
    }

    server.reconnect::<K>();
    let converged = || {
        let o = source.policy_objects();
        !o.stale
            && pods(&o) == ["web/a"]
            && ips(&source, "web", "a") == Some(vec!["10.244.1.40".into()])
            && o.namespaces[0].labels.contains_key("env")
            && o.policies[0].object.spec == policy("web", "allow-web", "api").spec
            && o.cluster_policies
                .first()
                .is_some_and(|c| c.object.spec.priority == Some(20))
    };
    assert!(
        wait_for(converged).await,
        "{:?} {:?}",
        source.policy_objects(),
        server.log()
    );
    assert!(source.policy_objects().synced);
    // Through a 410 and a second list of the cut kind, not through its expired watch
    // (each version's watch, for ClusterNetworkPolicy).
    let plural = K::plural(&());
    let versions = match plural.as_ref() {
        "clusternetworkpolicies" => CNP_VERSIONS.to_vec(),
        _ => vec!["v1"],
    };
    for v in versions {
        // The other version may be converging still (its relist comes after a backoff).
        let relisted = || server.count(&format!("list {plural}@{v}")) >= 2;
        assert!(wait_for(relisted).await, "{:?}", server.versioned_log());
        let log = server.versioned_log();
        assert_eq!(server.count(&format!("expired {plural}@{v}")), 1, "{log:?}");
        assert_eq!(server.count(&format!("list {plural}@{v}")), 2, "{log:?}");
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cluster_policy_watch_keeps_the_cluster_policies_and_is_stale_until_back() {
    lost_watch::<ClusterNetworkPolicy>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policies_arrive_sorted_and_slimmed_and_move_policy_changes_once_per_change() {
    let server = server();
    server.put(&cluster_policy("deny-db", 10));
    server.put(&cluster_policy("baseline", 900));
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(cluster_policies(&o), ["baseline", "deny-db"]);
    assert_eq!(o.cluster_policies[1].object.spec, cluster_policy("deny-db", 10).spec);
    // Only what policy reads is cached: no resourceVersion, managedFields, labels or
    // annotations (and, cluster-scoped, no namespace).
    let meta = serde_json::to_value(&o.cluster_policies[1].object.metadata).unwrap();
    let mut keys: Vec<_> = meta.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["generation", "name", "uid"], "{meta}");
    // One list at each version (the cluster serves both).
    for v in CNP_VERSIONS {
        let what = format!("list clusternetworkpolicies@{v}");
        assert_eq!(server.count(&what), 1, "{:?}", server.versioned_log());
    }

    let policy_changes = source.policy_changes();
    let mut expected = *policy_changes.borrow();
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

    let mut changed = cluster_policy("deny-db", 20);
    changed.metadata.generation = Some(2);
    server.put(&changed);
    expected += 1;
    settles!(
        "spec",
        source.policy_objects().cluster_policies[1].object.spec.priority == Some(20)
    );

    // Relabelled and annotated anew (a new resourceVersion, the same spec and
    // generation): the same policy, nothing moves; the next change counts one.
    let mut relabelled = changed.clone();
    relabelled.metadata.labels = Some([("team".to_string(), "b".to_string())].into());
    relabelled.metadata.annotations = None;
    server.put(&relabelled);
    server.put(&cluster_policy("allow-dns", 5));
    expected += 1;
    settles!(
        "after a no-op update",
        cluster_policies(&source.policy_objects()) == ["allow-dns", "baseline", "deny-db"]
    );

    assert!(server.delete::<ClusterNetworkPolicy>(None, "deny-db"));
    expected += 1;
    settles!(
        "deleted",
        cluster_policies(&source.policy_objects()) == ["allow-dns", "baseline"]
    );
    assert!(!source.policy_objects().stale);
}

/// Polls `cond` every 100 ms of (paused, so virtual) time for up to `secs`; whether it
/// became true.
async fn wait_virtual(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..secs * 10 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cond()
}

/// Paused time: the rechecks of a missing CRD wait up to a minute.
#[tokio::test(start_paused = true)]
async fn without_the_crd_policy_objects_are_synced_with_no_cluster_policies_and_a_later_crd_is_picked_up() {
    let server = server();
    server.put(&pod("web", "a", json!({"app": "web"}), &["10.244.1.4"]));
    server.put(&policy("web", "allow-web", "web"));
    server.unserve::<ClusterNetworkPolicy>();
    let source = KubeSource::start(server.client(), NODE.into());
    assert!(
        wait_virtual(10, || source.policy_objects().synced).await,
        "{:?}",
        server.log()
    );
    let o = source.policy_objects();
    assert!(!o.stale && o.cluster_policies.is_empty(), "{o:?}");
    assert_eq!((o.pods.len(), o.policies.len()), (1, 1));
    let policy_changes = source.policy_changes();
    let moved = *policy_changes.borrow();

    // Asked for again slower and slower, up to once a minute (each version on its own);
    // neither stale nor moving.
    let lists = || server.count("list clusternetworkpolicies@v1beta1");
    let at = lists();
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!source.policy_objects().stale, "absent is not stale");
    }
    // After 1, 2, 4, 8, 16, 32 s, then every 60 s: 9 or 10 in five minutes, not 300.
    let asked = lists() - at;
    assert!((8..=11).contains(&asked), "{asked} lists in 300 s: {:?}", server.log());
    assert_eq!(*policy_changes.borrow(), moved);

    // The CRD is installed and a policy created: picked up at the next look.
    server.put(&cluster_policy("deny-db", 10));
    server.serve::<ClusterNetworkPolicy>();
    assert!(
        wait_virtual(61, || cluster_policies(&source.policy_objects()) == ["deny-db"]).await,
        "{:?}",
        server.log()
    );
    assert!(!source.policy_objects().stale);
    assert_eq!(*policy_changes.borrow(), moved + 1);
    // Watched from then on, as any kind.
    server.put(&cluster_policy("baseline", 900));
    assert!(wait_virtual(5, || source.policy_objects().cluster_policies.len() == 2).await);

    // The CRD goes (and its objects with it): none again, synced, not stale.
    server.unserve::<ClusterNetworkPolicy>();
    assert!(wait_virtual(10, || source.policy_objects().cluster_policies.is_empty()).await);
    let o = source.policy_objects();
    assert!(o.synced && !o.stale && o.pods.len() == 1, "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_cluster_policies_are_synced_but_stale_and_the_rest_is_enforced() {
    let server = server();
    server.put(&policy("web", "allow-web", "web"));
    server.put(&cluster_policy("deny-db", 10));
    server.forbid::<ClusterNetworkPolicy>();
    // Synced (an ADD does not wait for it), but stale: none of them is known.
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(
        o.stale && o.cluster_policies.is_empty() && o.policies.len() == 1,
        "{o:?}"
    );

    // The RBAC fixed: picked up at the next look (a second or two after the first).
    server.serve::<ClusterNetworkPolicy>();
    let picked_up = || {
        let o = source.policy_objects();
        !o.stale && cluster_policies(&o) == ["deny-db"]
    };
    assert!(wait_for(picked_up).await, "{:?}", server.log());

    // Refused once listed: the last ones stay, stale, until readable again.
    server.forbid::<ClusterNetworkPolicy>();
    assert!(wait_for(|| source.policy_objects().stale).await, "{:?}", server.log());
    server.put(&cluster_policy("deny-db", 20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let o = source.policy_objects();
    assert!(o.synced && o.stale);
    assert_eq!(o.cluster_policies[0].object.spec.priority, Some(10), "the last known");
    server.serve::<ClusterNetworkPolicy>();
    let back = || {
        let o = source.policy_objects();
        !o.stale
            && o.cluster_policies
                .first()
                .is_some_and(|c| c.object.spec.priority == Some(20))
    };
    assert!(wait_for(back).await, "{:?}", server.log());
}

/// A server serving ClusterNetworkPolicy at `versions` only (of [`CNP_VERSIONS`]).
fn serving(versions: &[&str]) -> FakeApiServer {
    let server = server();
    for v in CNP_VERSIONS.iter().filter(|v| !versions.contains(v)) {
        server.unserve_version::<ClusterNetworkPolicy>(v);
    }
    server
}

/// The priority of the snapshot's ClusterNetworkPolicy `name`, as JSON.
fn priority(o: &PolicyObjects, name: &str) -> Option<i64> {
    let c = (o.cluster_policies.iter()).find(|c| c.object.metadata.name.as_deref() == Some(name))?;
    serde_json::to_value(&c.object.spec).unwrap()["priority"].as_i64()
}

/// A cluster serving one version only (either): its objects arrive, and its changes;
/// the other version's 404 neither holds `synced` back nor makes it stale.
async fn one_version_only(version: &str) {
    let server = serving(&[version]);
    server.put(&cluster_policy("deny-db", 10));
    server.put(&cluster_policy("baseline", 900));
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(cluster_policies(&o), ["baseline", "deny-db"]);
    let other = CNP_VERSIONS.iter().find(|v| **v != version).unwrap();
    assert!(server.count(&format!("list clusternetworkpolicies@{other}")) >= 1);

    let mut changed = cluster_policy("deny-db", 20);
    changed.metadata.generation = Some(2);
    server.put(&changed);
    let moved = || priority(&source.policy_objects(), "deny-db") == Some(20);
    assert!(wait_for(moved).await, "{:?}", server.versioned_log());
    assert!(server.delete::<ClusterNetworkPolicy>(None, "baseline"));
    let gone = || cluster_policies(&source.policy_objects()) == ["deny-db"];
    assert!(wait_for(gone).await, "{:?}", server.versioned_log());
    assert!(!source.policy_objects().stale);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_only_v1beta1_gives_its_cluster_policies() {
    one_version_only("v1beta1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_only_v1alpha2_gives_its_cluster_policies() {
    one_version_only("v1alpha2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_neither_version_is_synced_with_no_cluster_policies() {
    let server = serving(&[]);
    server.put(&policy("web", "allow-web", "web"));
    server.put(&cluster_policy("deny-db", 10));
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale && o.cluster_policies.is_empty(), "{o:?}");
    assert_eq!(o.policies.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_both_versions_gives_each_cluster_policy_once() {
    let server = serving(&CNP_VERSIONS);
    server.put(&cluster_policy("deny-db", 10));
    // Written at the other version: the same resource, served at both.
    let mut baseline = serde_json::to_value(cluster_policy("baseline", 900)).unwrap();
    baseline["apiVersion"] = "policy.networking.k8s.io/v1alpha2".into();
    server.put_json(baseline);
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(cluster_policies(&o), ["baseline", "deny-db"], "each once");
    for v in CNP_VERSIONS {
        let what = format!("list clusternetworkpolicies@{v}");
        assert_eq!(server.count(&what), 1, "{:?}", server.versioned_log());
    }

    // A change reaches both watches, and moves `policy_changes` once.
    let policy_changes = source.policy_changes();
    let at = *policy_changes.borrow();
    let mut changed = cluster_policy("deny-db", 20);
    changed.metadata.generation = Some(2);
    server.put(&changed);
    let moved = || priority(&source.policy_objects(), "deny-db") == Some(20);
    assert!(wait_for(moved).await, "{:?}", server.versioned_log());
    // Both watches have had their event by the time a later object shows.
    server.put(&cluster_policy("allow-dns", 5));
    let next = || cluster_policies(&source.policy_objects()).len() == 3;
    assert!(wait_for(next).await, "{:?}", server.versioned_log());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*policy_changes.borrow(), at + 2, "one move per change, not per version");

    // No longer served at v1beta1: still at v1alpha2, so nothing goes.
    let asked = || {
        let at = |verb| server.count(&format!("{verb} clusternetworkpolicies@v1beta1"));
        at("list") + at("watch")
    };
    let before = asked();
    server.unserve_version::<ClusterNetworkPolicy>("v1beta1");
    assert!(wait_for(|| asked() > before).await, "{:?}", server.versioned_log());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(cluster_policies(&o), ["allow-dns", "baseline", "deny-db"]);
    assert_eq!(priority(&o, "deny-db"), Some(20));
    // Deleted (at the version still served): gone.
    assert!(server.delete::<ClusterNetworkPolicy>(None, "allow-dns"));
    let gone = || cluster_policies(&source.policy_objects()) == ["baseline", "deny-db"];
    assert!(wait_for(gone).await, "{:?}", server.versioned_log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_from_the_api_name_the_fields_weft_does_not_know() {
    let server = server();
    let mut np = serde_json::to_value(policy("web", "allow-web", "web")).unwrap();
    np["apiVersion"] = "networking.k8s.io/v1".into();
    np["kind"] = "NetworkPolicy".into();
    np["spec"]["ingress"][0]["from"][0]["serviceAccount"] = "b".into();
    server.put_json(np);
    let mut cnp = serde_json::to_value(cluster_policy("deny-db", 10)).unwrap();
    cnp["apiVersion"] = "policy.networking.k8s.io/v1alpha2".into();
    cnp["spec"]["ingress"][0]["protocols"] = json!([{"icmp": {"type": 8}}]);
    server.put_json(cnp);
    let source = start(&server).await;
    let o = source.policy_objects();
    assert_eq!(o.policies.len(), 1, "{o:?}");
    assert_eq!(o.policies[0].unknown, ["spec.ingress[0].from[0].serviceAccount"]);
    assert_eq!(o.cluster_policies.len(), 1, "{o:?}");
    assert_eq!(o.cluster_policies[0].unknown, ["spec.ingress[0].protocols[0].icmp"]);
    // Still slimmed: the raw object's metadata is not kept.
    let meta = serde_json::to_value(&o.policies[0].object.metadata).unwrap();
    assert!(
        meta.get("managedFields").is_none() && meta.get("labels").is_none(),
        "{meta}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_does_not_decode_is_left_out_and_the_rest_of_its_kind_arrives() {
    let server = server();
    server.put(&policy("web", "allow-web", "web"));
    // A port that is neither a number nor a name.
    let mut bad = serde_json::to_value(policy("web", "bad", "web")).unwrap();
    bad["apiVersion"] = "networking.k8s.io/v1".into();
    bad["kind"] = "NetworkPolicy".into();
    bad["spec"]["ingress"][0]["ports"][0]["port"] = json!({"x": 1});
    server.put_json(bad.clone());
    server.put(&cluster_policy("deny-db", 10));
    // A priority that is not a number, at both versions.
    let mut odd = serde_json::to_value(cluster_policy("odd", 1)).unwrap();
    odd["spec"]["priority"] = "high".into();
    server.put_json(odd);
    let source = start(&server).await;
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(policies(&o), ["web/allow-web"]);
    assert_eq!(cluster_policies(&o), ["deny-db"]);
    // Left out, but said: the snapshot names each (once, though both versions saw it).
    let unreadable: Vec<(String, String, String)> = o
        .unreadable
        .iter()
        .map(|u| (u.kind.clone(), u.namespace.clone(), u.name.clone()))
        .collect();
    assert_eq!(
        unreadable,
        [
            ("ClusterNetworkPolicy".to_string(), String::new(), "odd".to_string()),
            ("NetworkPolicy".to_string(), "web".to_string(), "bad".to_string()),
        ]
    );
    assert!(o.unreadable.iter().all(|u| !u.error.is_empty()));

    // Later objects and changes keep arriving; a good version of the bad one is read.
    server.put(&policy("db", "deny-db", "db"));
    bad["spec"]["ingress"][0]["ports"][0]["port"] = json!(8080);
    server.put_json(bad);
    let all = || policies(&source.policy_objects()) == ["db/deny-db", "web/allow-web", "web/bad"];
    assert!(wait_for(all).await, "{:?}", source.policy_objects());
    server.put(&cluster_policy("odd", 2));
    let fixed = || cluster_policies(&source.policy_objects()) == ["deny-db", "odd"];
    assert!(wait_for(fixed).await, "{:?}", source.policy_objects());
    assert!(!source.policy_objects().stale);
    // Each version's watch clears its own word of the object: the second may come a
    // moment after the first made the list whole.
    let said = || source.policy_objects().unreadable.is_empty();
    assert!(
        wait_for(said).await,
        "read now: no longer said: {:?}",
        source.policy_objects().unreadable
    );
}

/// Paused time: the rechecks of a missing version wait up to a minute.
#[tokio::test(start_paused = true)]
async fn a_version_installed_later_is_picked_up_by_the_recheck() {
    let server = serving(&["v1alpha2"]);
    server.put(&cluster_policy("deny-db", 10));
    let source = KubeSource::start(server.client(), NODE.into());
    let synced = || {
        let o = source.policy_objects();
        o.synced && cluster_policies(&o) == ["deny-db"]
    };
    assert!(wait_virtual(10, synced).await, "{:?}", server.versioned_log());
    let watches = || server.count("watch clusternetworkpolicies@v1beta1");
    assert_eq!(watches(), 0, "never served yet");

    // v1beta1 served from now on: the next look lists and watches it.
    server.serve_version::<ClusterNetworkPolicy>("v1beta1");
    assert!(wait_virtual(61, || watches() > 0).await, "{:?}", server.versioned_log());
    // Shown by taking v1alpha2 away: the objects stay, read at v1beta1 now.
    let asked = || {
        let at = |verb| server.count(&format!("{verb} clusternetworkpolicies@v1alpha2"));
        at("list") + at("watch")
    };
    let before = asked();
    server.unserve_version::<ClusterNetworkPolicy>("v1alpha2");
    assert!(
        wait_virtual(5, || asked() > before).await,
        "{:?}",
        server.versioned_log()
    );
    assert_eq!(cluster_policies(&source.policy_objects()), ["deny-db"]);
    server.put(&cluster_policy("deny-db", 20));
    let moved = || priority(&source.policy_objects(), "deny-db") == Some(20);
    assert!(wait_virtual(5, moved).await, "{:?}", server.versioned_log());
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");
}

/// Paused time. A version taken away and served again (a CRD edited twice): its watch
/// goes on from where it was, so the objects that did not change meanwhile come back
/// with those that did.
#[tokio::test(start_paused = true)]
async fn a_version_served_again_comes_back_with_its_objects() {
    let server = serving(&["v1beta1"]);
    server.put(&cluster_policy("deny-db", 10));
    server.put(&cluster_policy("baseline", 900));
    let source = KubeSource::start(server.client(), NODE.into());
    let listed = || cluster_policies(&source.policy_objects()) == ["baseline", "deny-db"];
    assert!(wait_virtual(10, listed).await, "{:?}", server.versioned_log());

    server.unserve_version::<ClusterNetworkPolicy>("v1beta1");
    let none = || {
        let o = source.policy_objects();
        o.synced && !o.stale && o.cluster_policies.is_empty()
    };
    assert!(wait_virtual(10, none).await, "{:?}", server.versioned_log());
    server.put(&cluster_policy("allow-dns", 5));
    server.serve_version::<ClusterNetworkPolicy>("v1beta1");
    let back = || cluster_policies(&source.policy_objects()) == ["allow-dns", "baseline", "deny-db"];
    assert!(
        wait_virtual(61, back).await,
        "{:?} {:?}",
        source.policy_objects(),
        server.versioned_log()
    );
    assert!(!source.policy_objects().stale);
}
