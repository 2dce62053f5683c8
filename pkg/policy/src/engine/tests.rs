//! The engine against a fake kernel and an in-memory cluster, without root.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::watch;
use weft_kernel::KernelError;
use weft_telemetry::Metrics;
use weft_topology::{
    ClusterNode, PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol, SourceError, Topology, TopologySource,
    TopologyStatus, WireEnd,
};

use super::*;
use crate::engine::{Announced, Taken};

/// A kernel that records the transactions it is given and reads back what a test says.
#[derive(Clone, Default)]
struct FakeKernel {
    applied: Arc<Mutex<Vec<String>>>,
    /// How many times the kernel was read back.
    observed: Arc<std::sync::atomic::AtomicUsize>,
    holds: Arc<Mutex<Observed>>,
    /// Whether DNS answers are held, as last asked.
    copy_dns_answers: Arc<Mutex<Option<bool>>>,
}

impl PolicyKernel for FakeKernel {
    fn observe(&mut self) -> Result<Observed, KernelError> {
        self.observed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(self.holds.lock().unwrap().clone())
    }
    fn apply(&mut self, script: &str) -> Result<(), KernelError> {
        self.applied.lock().unwrap().push(script.to_string());
        Ok(())
    }
    fn copy_dns_answers(&mut self, on: bool) -> Result<(), KernelError> {
        *self.copy_dns_answers.lock().unwrap() = Some(on);
        Ok(())
    }
}

/// A cluster in memory: only what policy reads.
struct Cluster {
    objects: Mutex<Arc<PolicyObjects>>,
    tx: watch::Sender<u64>,
    nodes: Mutex<Vec<ClusterNode>>,
    /// Moves with the topologies and the nodes, as a source's `changes` does.
    topo: watch::Sender<u64>,
}

impl Cluster {
    fn new(synced: bool) -> Arc<Self> {
        Arc::new(Cluster {
            objects: Mutex::new(Arc::new(PolicyObjects {
                synced,
                namespaces: vec![Arc::new(PolicyNamespace {
                    name: "x".into(),
                    ..PolicyNamespace::default()
                })],
                ..PolicyObjects::default()
            })),
            tx: watch::channel(0).0,
            nodes: Mutex::default(),
            topo: watch::channel(0).0,
        })
    }

    fn change(&self, f: impl FnOnce(&mut PolicyObjects)) {
        let mut o = self.objects.lock().unwrap();
        let mut next = (**o).clone();
        f(&mut next);
        *o = Arc::new(next);
        self.tx.send_modify(|g| *g += 1);
    }
}

impl TopologySource for Cluster {
    fn topology(&self, _: &str, _: &str) -> Option<Arc<Topology>> {
        None
    }
    fn topologies(&self) -> weft_topology::Topologies {
        weft_topology::Topologies::new()
    }
    fn node_address(&self) -> Option<std::net::IpAddr> {
        None
    }
    fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes.lock().unwrap().clone()
    }
    fn set_status<'a>(&'a self, _: &'a str, _: &'a str, _: TopologyStatus) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async { Ok(()) })
    }
    fn set_wire_state(&self, _: Vec<WireEnd>) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(async { Ok(()) })
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.topo.subscribe()
    }
    fn ready(&self) -> bool {
        true
    }
    fn policy_objects(&self) -> Arc<PolicyObjects> {
        self.objects.lock().unwrap().clone()
    }
    fn policy_changes(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

fn policy(
    name: &str,
    spec: serde_json::Value,
) -> Arc<weft_topology::Strict<k8s_openapi::api::networking::v1::NetworkPolicy>> {
    Arc::new(serde_json::from_value(json!({"metadata": {"namespace": "x", "name": name}, "spec": spec})).unwrap())
}

type Local = Arc<Mutex<Vec<LocalPod>>>;

/// An engine of node n1 over `cluster`, its pods listed by `pods`, reading the kernel
/// back every `resync`.
fn engine_over(
    cluster: Arc<Cluster>,
    pods: LocalPods,
    kernel: FakeKernel,
    metrics: &Metrics,
    resync: Duration,
) -> PolicyEngine<FakeKernel> {
    PolicyEngine::new(
        Config {
            node_name: "n1".into(),
            resync,
            sync_wait: Duration::from_millis(300),
            learnt: weft_fqdn::Limits::default(),
        },
        cluster,
        pods,
        kernel,
        metrics.families::<PolicyMetrics>(),
    )
}

fn engine_with(
    cluster: Arc<Cluster>,
    local: Vec<LocalPod>,
) -> (Arc<PolicyEngine<FakeKernel>>, FakeKernel, Arc<Metrics>, Local) {
    let kernel = FakeKernel::default();
    let metrics = Metrics::new("test", "test");
    let local = Arc::new(Mutex::new(local));
    let handle = local.clone();
    // As the store's listing: the same `Arc` while the pods are unchanged.
    let last: Mutex<LocalListing> = Mutex::default();
    let pods: LocalPods = Arc::new(move || {
        let now = local_listing(local.lock().unwrap().iter().cloned());
        let mut last = last.lock().unwrap();
        if *last != now {
            *last = now;
        }
        let l = last.clone();
        Box::pin(async move { Ok(l) })
    });
    let e = engine_over(cluster, pods, kernel.clone(), &metrics, Duration::from_secs(60));
    (Arc::new(e), kernel, metrics, handle)
}

fn engine(cluster: Arc<Cluster>, local: Vec<LocalPod>) -> (Arc<PolicyEngine<FakeKernel>>, FakeKernel, Arc<Metrics>) {
    let (e, k, m, _) = engine_with(cluster, local);
    (e, k, m)
}

fn local(name: &str, ip: &str) -> LocalPod {
    LocalPod {
        namespace: "x".into(),
        name: name.into(),
        ips: vec![ip.parse().unwrap()],
        host_ifname: format!("weft-{name}"),
    }
}

#[tokio::test]
async fn nothing_is_touched_before_the_cluster_is_listed_and_adds_wait_for_it() {
    let cluster = Cluster::new(false);
    let (e, k, metrics) = engine(cluster.clone(), vec![]);
    assert_eq!(e.pass(true).await.unwrap(), PassOutcome::default());
    assert!(k.applied.lock().unwrap().is_empty(), "a restart keeps the last table");
    let err = e.pod_attached(local("a", "10.0.0.1")).await.unwrap_err();
    assert!(err.contains("not known yet"), "{err}");
    assert!(metrics.render("text/plain").1.contains("weft_policy_synced 0"));

    // Listed while an ADD waits: it goes on.
    let waiting = {
        let e = e.clone();
        tokio::spawn(async move { e.pod_attached(local("a", "10.0.0.1")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    cluster.change(|o| {
        o.synced = true;
        o.policies.push(policy("deny", json!({"podSelector": {}})));
    });
    waiting.await.unwrap().unwrap();
    let applied = k.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 1);
    assert!(
        applied[0].contains("add element inet weft-policy mg") && applied[0].contains("{ \"weft-a\" }"),
        "{}",
        applied[0]
    );
}

#[tokio::test]
async fn passes_apply_differences_and_resyncs_repair_drift() {
    let cluster = Cluster::new(true);
    cluster.change(|o| {
        o.policies.push(policy("deny", json!({"podSelector": {}})));
        o.put_pod(Arc::new(PolicyPod {
            namespace: "x".into(),
            name: "a".into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            ..PolicyPod::default()
        }));
    });
    let (e, k, metrics, pods) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1")]);
    let first = e.pass(true).await.unwrap();
    assert!(first.script.unwrap().starts_with("table inet weft-policy {}"));
    assert_eq!(e.pass(false).await.unwrap().script, None, "in step");
    // A new pod of this node: its map element, before its ADD answers.
    e.pod_attached(local("b", "10.0.0.2")).await.unwrap();
    let last = k.applied.lock().unwrap().last().unwrap().clone();
    let lines: Vec<&str> = last.lines().collect();
    assert_eq!(lines.len(), 2, "its member set's element and its hairpin pair: {last}");
    assert!(
        lines[0].starts_with("add element inet weft-policy mg") && lines[0].ends_with("{ \"weft-b\" }"),
        "{last}"
    );
    assert_eq!(
        lines[1],
        "add element inet weft-policy hairpin { \"weft-b\" . \"weft-b\" }"
    );
    // Its ADD is committed: the store lists it, and nothing changes.
    pods.lock().unwrap().push(local("b", "10.0.0.2"));
    assert_eq!(e.pass(false).await.unwrap().script, None);
    // The next ADD is added to the plan alone (nothing it was planned from moved).
    let out = e.pass_with(Some(&local("c", "10.0.0.3")), false).await.unwrap();
    assert!(out.incremental, "{out:?}");
    pods.lock().unwrap().push(local("c", "10.0.0.3"));
    assert_eq!(e.pass(false).await.unwrap().script, None, "the full plan agrees");
    // The kernel read back differs from the plan (a map element deleted): repaired.
    let mut holds = Observed::after(&e.latest().unwrap().desired);
    holds.ingress.clear();
    *k.holds.lock().unwrap() = holds;
    let out = e.pass(true).await.unwrap();
    assert!(out.repaired, "{out:?}");
    assert!(
        metrics
            .render("text/plain")
            .1
            .contains("weft_policy_changes_total{kind=\"repair\"} 1")
    );
}

#[tokio::test]
async fn an_invalid_policy_is_refused_alone_and_counted() {
    let cluster = Cluster::new(true);
    cluster.change(|o| {
        o.policies
            .push(policy("bad", json!({"podSelector": {}, "ingress": [{"from": [{}]}]})));
        o.policies.push(policy("deny", json!({"podSelector": {}})));
    });
    let (e, k, metrics) = engine(cluster.clone(), vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    assert!(
        metrics
            .render("text/plain")
            .1
            .contains("weft_policy_invalid{kind=\"NetworkPolicy\",namespace=\"x\",effect=\"fail_closed\"} 1")
    );
    assert_eq!(k.applied.lock().unwrap().len(), 1, "the valid one is enforced");
    cluster.change(|o| o.policies.retain(|p| p.object.metadata.name.as_deref() != Some("bad")));
    e.pass(false).await.unwrap();
    assert!(
        metrics
            .render("text/plain")
            .1
            .contains("weft_policy_invalid{kind=\"NetworkPolicy\",namespace=\"x\",effect=\"fail_closed\"} 0")
    );
}

/// What operators see: an explanation of a flow, a denied packet turned into an event
/// naming pods and policies, and the kernel's counters in the verdict metric.
#[tokio::test]
async fn explain_denies_and_verdicts() {
    let cluster = Cluster::new(true);
    let pod = |name: &str, ip: &str| {
        Arc::new(PolicyPod {
            namespace: "x".into(),
            name: name.into(),
            ips: vec![ip.parse().unwrap()],
            node: "n1".into(),
            ..PolicyPod::default()
        })
    };
    cluster.change(|o| {
        o.policies.push(policy("deny", json!({"podSelector": {}})));
        o.put_pod(pod("a", "10.0.0.1"));
        o.put_pod(pod("b", "10.0.0.2"));
    });
    let (e, k, metrics) = engine(cluster, vec![local("a", "10.0.0.1"), local("b", "10.0.0.2")]);
    assert!(
        e.explain("x/b", "x/a", PortProtocol::Tcp, 80).is_err(),
        "nothing before a pass"
    );
    e.pass(true).await.unwrap();
    let ex = e.explain("x/b", "x/a", PortProtocol::Tcp, 80).unwrap();
    assert_eq!((ex.src.as_str(), ex.dst.as_str()), ("x/b", "x/a"));
    assert!(!ex.verdict.passes());
    assert_eq!(ex.verdict.ingress.isolating, vec!["x/deny"]);
    assert_eq!(ex.verdict.ingress.allowed_by, None);
    assert!(
        e.explain("x/nope", "x/a", PortProtocol::Tcp, 80)
            .unwrap_err()
            .contains("no pod x/nope")
    );

    let group = e.latest().unwrap().desired.ingress["weft-a"].clone();
    let crate::names::Chain::Group { hash: group_hash, .. } = group.clone() else {
        panic!("{group} is no group chain")
    };
    let mut syn = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1];
    syn.extend_from_slice(&[0x9c, 0x40, 0, 80]);
    let ev = e.logged(&format!("weft deny {group}"), &syn).unwrap();
    assert_eq!((ev.src.as_str(), ev.dst.as_str()), ("x/b", "x/a"));
    assert_eq!(ev.policies, vec!["x/deny"]);
    assert_eq!(ev.direction, crate::Direction::Ingress);
    assert!(
        e.logged(&format!("weft deny {group}"), &syn).is_none(),
        "rate-limited per flow"
    );
    assert!(e.logged("someone else's prefix", &syn).is_none());
    assert_eq!(e.denies().recent(10).len(), 1);

    let counter = |n| {
        (
            Counter::Group {
                hash: group_hash.clone(),
                direction: crate::Direction::Ingress,
            },
            n,
        )
    };
    k.holds.lock().unwrap().counters.extend([counter(3)]);
    e.sample_verdicts().await;
    let page = metrics.render("text/plain").1;
    assert!(
        page.contains(
            "weft_policy_verdicts_total{direction=\"ingress\",action=\"deny\",namespace=\"x\",policy=\"deny\"} 3"
        ),
        "{page}"
    );
    k.holds.lock().unwrap().counters.extend([counter(5)]);
    e.sample_verdicts().await;
    assert!(metrics.render("text/plain").1.contains("policy=\"deny\"} 5"));
}

/// Pod `name` of namespace `x` on node n2, at `ip`.
fn remote(name: &str, ip: &str) -> Arc<PolicyPod> {
    Arc::new(PolicyPod {
        namespace: "x".into(),
        name: name.into(),
        ips: vec![ip.parse().unwrap()],
        node: "n2".into(),
        ..PolicyPod::default()
    })
}

/// Pod `name` of namespace `x` on node n2, at `ip`, labelled `role`.
fn remote_as(name: &str, ip: &str, role: &str) -> Arc<PolicyPod> {
    let mut p = (*remote(name, ip)).clone();
    p.labels = [("role".to_string(), role.to_string())].into();
    Arc::new(p)
}

/// Adds a policy that lets pods labelled `role: client` into every pod of `x`.
fn letting_clients_in(cluster: &Cluster) {
    cluster.change(|o| {
        o.policies.push(policy(
            "from-clients",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
        ));
    });
}

/// A synced cluster whose one policy lets every pod of namespace `x` in from any other.
fn allowing_all_within_x() -> Arc<Cluster> {
    let cluster = Cluster::new(true);
    cluster.change(|o| {
        o.policies.push(policy(
            "all",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
        ));
    });
    cluster
}

/// A pass of other nodes' pods takes this node's pods as unchanged while their listing
/// is (the same `Arc`, nothing pending): one that changed meanwhile plans the table
/// again, whether a pod came, went or changed.
#[tokio::test]
async fn pods_elsewhere_see_a_change_of_this_node_s_pods() {
    let cluster = allowing_all_within_x();
    let (e, _k, _, handle) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    cluster.change(|o| o.put_pod(remote("r1", "10.0.9.1")));
    assert!(e.pass(false).await.unwrap().incremental);
    cluster.change(|o| o.put_pod(remote("r2", "10.0.9.2")));
    assert!(e.pass(false).await.unwrap().incremental, "nothing of this node moved");
    let changes: [fn(&mut Vec<LocalPod>); 3] = [
        |l| l.push(local("b", "10.0.0.2")),
        |l| l[1].ips = vec!["10.0.0.3".parse().unwrap()],
        |l| {
            l.pop();
        },
    ];
    for (i, change) in changes.into_iter().enumerate() {
        change(&mut handle.lock().unwrap());
        cluster.change(|o| o.put_pod(remote(&format!("s{i}"), &format!("10.0.8.{i}"))));
        let out = e.pass(false).await.unwrap();
        assert!(!out.incremental, "change {i} of this node's pods: {out:?}");
        cluster.change(|o| o.put_pod(remote(&format!("t{i}"), &format!("10.0.7.{i}"))));
        assert!(e.pass(false).await.unwrap().incremental, "after change {i}");
    }
}

/// A new listing of the same pods (another `Arc`, another order: the store lists by
/// attachment) is the same pods to a pass of pods elsewhere; one with as many entries but
/// a pod twice and another missing is not.
#[tokio::test]
async fn a_listing_is_the_same_pods_in_any_order_but_not_with_one_twice() {
    let cluster = allowing_all_within_x();
    let (e, _k, _, handle) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1"), local("b", "10.0.0.2")]);
    e.pass(true).await.unwrap();
    handle.lock().unwrap().reverse();
    cluster.change(|o| o.put_pod(remote("r1", "10.0.9.1")));
    let out = e.pass(false).await.unwrap();
    assert!(out.incremental, "the same pods listed in another order: {out:?}");
    *handle.lock().unwrap() = vec![local("a", "10.0.0.1"), local("a", "10.0.0.1")];
    cluster.change(|o| o.put_pod(remote("r2", "10.0.9.2")));
    let out = e.pass(false).await.unwrap();
    assert!(!out.incremental, "pod b is gone, a listed twice: {out:?}");
}

/// An ADD that comes after pods elsewhere moved (a bring-up: nearly every ADD) takes
/// them in as set elements and adds its own pod alone, in one pass, instead of planning
/// the whole table again; a full pass afterwards finds nothing left to do.
#[tokio::test]
async fn an_add_after_pods_elsewhere_moved_is_still_added_alone() {
    let cluster = Cluster::new(true);
    let remote = |name: &str, ip: &str| remote_as(name, ip, "client");
    letting_clients_in(&cluster);
    let (e, k, _, pods) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    cluster.change(|o| o.put_pod(remote("r", "10.0.9.1")));
    let applied = k.applied.lock().unwrap().len();
    let out = e.pass_with(Some(&local("b", "10.0.0.2")), false).await.unwrap();
    assert!(out.incremental, "{out:?}");
    let script = out.script.unwrap();
    assert!(script.contains("{ 10.0.9.1 }"), "the pod elsewhere: {script}");
    assert!(script.contains("\"weft-b\""), "the ADD's pod: {script}");
    assert!(
        !script.contains("table inet weft-policy"),
        "never the whole table: {script}"
    );
    assert_eq!(k.applied.lock().unwrap().len(), applied + 2, "two small transactions");
    // Its ADD is committed; a namespace makes the next pass plan the whole table, which
    // finds it as the two small transactions left it.
    pods.lock().unwrap().push(local("b", "10.0.0.2"));
    cluster.change(|o| {
        o.namespaces.push(Arc::new(PolicyNamespace {
            name: "y".into(),
            ..PolicyNamespace::default()
        }))
    });
    let out = e.pass(false).await.unwrap();
    assert!(!out.incremental, "{out:?}");
    assert_eq!(out.script, None, "the full plan agrees");
    assert_eq!(k.applied.lock().unwrap().len(), applied + 2);
}

/// Pods that come, change or go elsewhere in the cluster cost set elements only, for
/// their own addresses, never a plan of the whole table; anything else (a namespace, a
/// policy) plans it all again, and a full pass afterwards finds nothing left to do.
#[tokio::test]
async fn pods_elsewhere_change_elements_only() {
    let cluster = Cluster::new(true);
    let remote = remote_as;
    letting_clients_in(&cluster);
    let (e, k, _) = engine(cluster.clone(), vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    cluster.change(|o| o.put_pod(remote("r", "10.0.9.1", "client")));
    let out = e.pass(false).await.unwrap();
    assert!(out.incremental, "{out:?}");
    let script = out.script.unwrap();
    assert!(
        script.starts_with("add element inet weft-policy s") && script.trim_end().ends_with("{ 10.0.9.1 }"),
        "{script}"
    );
    assert_eq!(script.lines().count(), 1, "{script}");
    cluster.change(|o| o.put_pod(remote("r", "10.0.9.1", "server")));
    let script = e.pass(false).await.unwrap().script.unwrap();
    assert!(script.starts_with("delete element inet weft-policy s"), "{script}");
    cluster.change(|o| o.pods.clear());
    assert_eq!(e.pass(false).await.unwrap().script, None, "gone, and it had nothing");
    let applied = k.applied.lock().unwrap().len();
    cluster.change(|o| {
        o.namespaces.push(Arc::new(PolicyNamespace {
            name: "y".into(),
            ..PolicyNamespace::default()
        }))
    });
    let out = e.pass(false).await.unwrap();
    assert!(!out.incremental, "a namespace plans the table again: {out:?}");
    assert_eq!(
        k.applied.lock().unwrap().len(),
        applied,
        "and finds the table as the changes of pods left it"
    );
}

/// A pod whose ADD placed its policies is planned by every pass until the store lists
/// it: a pass between the two never takes out what the ADD answered for. Detached (its
/// ADD failed afterwards), it goes.
/// The source's topologies moving (a lab writes a pod's status at each arrival) is no
/// change of the nodes: an ADD keeps its fast path (which never lists the node's pods)
/// and no full pass runs. A node that changes (node peers, node addresses) makes the
/// next ADD's pass a full one.
#[tokio::test]
async fn a_topology_change_is_no_change_of_the_nodes() {
    let cluster = Cluster::new(true);
    cluster.change(|o| {
        o.policies.push(policy("deny", json!({"podSelector": {}})));
        for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
            o.put_pod(Arc::new(PolicyPod {
                namespace: "x".into(),
                name: name.into(),
                ips: vec![ip.parse().unwrap()],
                ..PolicyPod::default()
            }));
        }
    });
    // Only a full pass (or a pass of pods only) lists the node's pods.
    let listed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = listed.clone();
    let pods: LocalPods = Arc::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(local_listing([local("a", "10.0.0.1")])) })
    });
    let e = engine_over(
        cluster.clone(),
        pods,
        FakeKernel::default(),
        &Metrics::new("test", "test"),
        Duration::from_secs(60),
    );
    e.pass(true).await.unwrap();
    let listings = || listed.load(std::sync::atomic::Ordering::SeqCst);
    let before = listings();
    cluster.topo.send_modify(|g| *g += 1);
    e.pod_attached(local("b", "10.0.0.2")).await.unwrap();
    assert_eq!(listings(), before, "b's ADD took the fast path");
    cluster.nodes.lock().unwrap().push(ClusterNode {
        name: "n2".into(),
        ..ClusterNode::default()
    });
    cluster.topo.send_modify(|g| *g += 1);
    e.pod_attached(local("c", "10.0.0.3")).await.unwrap();
    assert!(listings() > before, "a node changed: the ADD's pass planned it all");
}

#[tokio::test]
async fn a_pod_between_its_policies_and_its_commit_stays_planned() {
    let cluster = Cluster::new(true);
    cluster.change(|o| o.policies.push(policy("deny", json!({"podSelector": {}}))));
    let (e, k, _, _pods) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    e.pod_attached(local("b", "10.0.0.2")).await.unwrap();
    // A full pass (a new policy) before b's ADD commits: b stays.
    cluster.change(|o| o.policies.push(policy("deny-too", json!({"podSelector": {}}))));
    let script = e.pass(false).await.unwrap().script.unwrap();
    assert!(
        !script.contains("weft-b\" }\ndelete") && script.contains("\"weft-b\""),
        "{script}"
    );
    assert!(e.latest().unwrap().desired.ingress.contains_key("weft-b"));
    // Its ADD failed after all: it goes with the next pass.
    e.pod_detached("weft-b");
    let before = k.applied.lock().unwrap().len();
    e.pass(false).await.unwrap();
    assert!(!e.latest().unwrap().desired.ingress.contains_key("weft-b"));
    assert!(k.applied.lock().unwrap().len() > before);
}

/// A pod of another node, announced by that node at its ADD before the API has its
/// addresses: its addresses go into the sets at once (its labels are the API's), and
/// stay when the API confirms them. An announcement of the wrong node, outside the
/// node's ranges, of an unknown node or of this node's own pod is refused.
#[tokio::test]
async fn an_announced_pod_is_in_the_sets_before_the_api_has_its_address() {
    let cluster = Cluster::new(true);
    *cluster.nodes.lock().unwrap() = vec![ClusterNode {
        name: "n2".into(),
        pod_cidrs: vec!["10.0.2.0/24".parse().unwrap()],
        ..ClusterNode::default()
    }];
    let new = |ips: &[&str]| {
        Arc::new(PolicyPod {
            namespace: "x".into(),
            name: "client".into(),
            labels: [("role".to_string(), "client".to_string())].into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            node: "n2".into(),
            ..PolicyPod::default()
        })
    };
    cluster.change(|o| {
        o.policies.push(policy(
            "from-clients",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
        ));
        o.put_pod(new(&[]));
    });
    let (e, k, metrics) = engine(cluster.clone(), vec![local("a", "10.0.1.1")]);
    e.pass(true).await.unwrap();
    let announced = |name: &str, ip: &str| Announced {
        namespace: "x".into(),
        name: name.into(),
        ips: vec![ip.parse().unwrap()],
    };
    for (node, pod, why) in [
        ("n3", announced("client", "10.0.2.9"), "no such node"),
        ("n2", announced("client", "10.0.3.9"), "not in the node's pod ranges"),
        ("n1", announced("a", "10.0.2.9"), "a pod of this node"),
    ] {
        let err = e.pod_announced(node, pod).await.unwrap_err();
        assert!(err.contains(why), "{err}");
    }
    let before = k.applied.lock().unwrap().len();
    assert_eq!(
        e.pod_announced("n2", announced("client", "10.0.2.9")).await,
        Ok(Taken::Applied)
    );
    let applied = k.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), before + 1);
    assert!(
        applied[before].trim_end().ends_with("{ 10.0.2.9 }"),
        "{}",
        applied[before]
    );
    // The API confirms it: nothing changes.
    cluster.change(|o| o.put_pod(new(&["10.0.2.9"])));
    assert_eq!(e.pass(false).await.unwrap().script, None);
    assert_eq!(
        e.pod_announced("n2", announced("client", "10.0.2.9")).await,
        Ok(Taken::Known)
    );
    // Another pod the cache has no object of yet: kept, applied when the object comes.
    assert_eq!(
        e.pod_announced("n2", announced("later", "10.0.2.10")).await,
        Ok(Taken::Kept)
    );
    cluster.change(|o| {
        let mut p = (*new(&[])).clone();
        p.name = "later".into();
        o.put_pod(Arc::new(p));
    });
    let script = e.pass(false).await.unwrap().script.unwrap();
    assert!(script.trim_end().ends_with("{ 10.0.2.10 }"), "{script}");
    let page = metrics.render("text/plain").1;
    assert!(
        page.contains("weft_policy_announcements_total{result=\"refused\"} 3"),
        "{page}"
    );
}

/// Announcements that come while a pass runs are taken in together by the next pass:
/// five pods announced while the engine is busy cost one transaction with all five
/// addresses, each caller is told its pod is applied, and none is lost.
#[tokio::test]
async fn announcements_during_a_pass_share_the_next_one() {
    let cluster = Cluster::new(true);
    *cluster.nodes.lock().unwrap() = vec![ClusterNode {
        name: "n2".into(),
        pod_cidrs: vec!["10.0.2.0/24".parse().unwrap()],
        ..ClusterNode::default()
    }];
    cluster.change(|o| {
        o.policies.push(policy(
            "from-clients",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
        ));
        for i in 1..=5 {
            o.put_pod(Arc::new(PolicyPod {
                namespace: "x".into(),
                name: format!("c{i}"),
                labels: [("role".to_string(), "client".to_string())].into(),
                node: "n2".into(),
                ..PolicyPod::default()
            }));
        }
    });
    let (e, k, metrics) = engine(cluster.clone(), vec![local("a", "10.0.1.1")]);
    e.pass(true).await.unwrap();
    let passes = || {
        let page = metrics.render("text/plain").1;
        let line = page
            .lines()
            .find(|l| l.starts_with("weft_policy_pass_seconds_count"))
            .map(str::to_string);
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .expect("the pass histogram's count")
    };
    let (before, passes_before) = (k.applied.lock().unwrap().len(), passes());
    // A pass in progress: the engine's state is held.
    let busy = e.state.lock().await;
    let calls = futures::future::join_all((1..=5).map(|i| {
        e.pod_announced(
            "n2",
            Announced {
                namespace: "x".into(),
                name: format!("c{i}"),
                ips: vec![format!("10.0.2.{i}").parse().unwrap()],
            },
        )
    }));
    let pass_ends = async {
        while e.waiting_announcements() < 5 {
            tokio::task::yield_now().await;
        }
        drop(busy);
    };
    let (taken, ()) = tokio::join!(calls, pass_ends);
    assert!(taken.iter().all(|t| *t == Ok(Taken::Applied)), "{taken:?}");
    let applied = k.applied.lock().unwrap()[before..].to_vec();
    assert_eq!(applied.len(), 1, "one transaction for the five: {applied:?}");
    assert_eq!(passes(), passes_before + 1, "one pass for the five");
    for i in 1..=5 {
        assert!(applied[0].contains(&format!("10.0.2.{i}")), "{}", applied[0]);
    }
    assert_eq!(e.waiting_announcements(), 0);
    // One announced alone still gets its own pass.
    cluster.change(|o| {
        o.put_pod(Arc::new(PolicyPod {
            namespace: "x".into(),
            name: "c6".into(),
            labels: [("role".to_string(), "client".to_string())].into(),
            node: "n2".into(),
            ..PolicyPod::default()
        }))
    });
    e.pass(false).await.unwrap();
    let before = k.applied.lock().unwrap().len();
    let six = Announced {
        namespace: "x".into(),
        name: "c6".into(),
        ips: vec!["10.0.2.6".parse().unwrap()],
    };
    assert_eq!(e.pod_announced("n2", six).await, Ok(Taken::Applied));
    let applied = k.applied.lock().unwrap()[before..].to_vec();
    assert!(applied.len() == 1 && applied[0].contains("10.0.2.6"), "{applied:?}");
}

/// A policy object that does not decode is refused, and said: in the status, and
/// counted as refused (not enforced) in its namespace.
#[tokio::test]
async fn an_object_that_does_not_decode_is_said_refused() {
    let cluster = Cluster::new(true);
    cluster.change(|o| {
        o.unreadable.push(Arc::new(weft_topology::UnreadablePolicy {
            kind: "NetworkPolicy".into(),
            namespace: "x".into(),
            name: "typo".into(),
            error: "invalid type: string \"high\", expected i32".into(),
        }))
    });
    let (e, _, metrics) = engine(cluster, vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    let s = e.status();
    assert_eq!(s.invalid.len(), 1, "{:?}", s.invalid);
    assert!(
        s.invalid[0].starts_with("NetworkPolicy x/typo: (object): does not decode: invalid type")
            && s.invalid[0].ends_with("not enforced"),
        "{}",
        s.invalid[0]
    );
    let page = metrics.render("text/plain").1;
    assert!(
        page.contains("weft_policy_invalid{kind=\"NetworkPolicy\",namespace=\"x\",effect=\"refused\"} 1"),
        "{page}"
    );
}

/// kubelet reporting the address of a pod of this node (its Pod object gets
/// `status.podIPs`) changes nothing the view has of it: no pass plans the table again.
#[tokio::test]
async fn a_local_pods_reported_address_changes_nothing() {
    let cluster = Cluster::new(true);
    let object = |ips: &[&str]| {
        Arc::new(PolicyPod {
            namespace: "x".into(),
            name: "b".into(),
            labels: [("app".to_string(), "web".to_string())].into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            node: "n1".into(),
            ..PolicyPod::default()
        })
    };
    cluster.change(|o| {
        o.policies.push(policy("deny", json!({"podSelector": {}})));
        o.put_pod(object(&[]));
    });
    let (e, _, _, pods) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1")]);
    e.pass(true).await.unwrap();
    e.pod_attached(local("b", "10.0.0.2")).await.unwrap();
    pods.lock().unwrap().push(local("b", "10.0.0.2"));
    cluster.change(|o| o.put_pod(object(&["10.0.0.2"])));
    let out = e.pass(false).await.unwrap();
    assert!(out.incremental && out.script.is_none(), "{out:?}");
}

/// A DNS answer for a name a `domainNames` rule takes: its addresses go into the rule's
/// learnt set of their family (TTL at least the minimum, the name as comment) before
/// the answer goes on; `explain` then allows them. Other names, errors and garbage
/// are counted and learn nothing. A new rule's learnt set starts with what is learnt.
#[tokio::test]
async fn dns_answers_fill_learnt_sets_before_they_go_on() {
    use weft_fqdn::answer::build::{Rec, ResponseCode, response};
    let cluster = Cluster::new(true);
    let cnp =
        |name: &str, names: serde_json::Value| -> Arc<weft_topology::Strict<weft_topology::ClusterNetworkPolicy>> {
            Arc::new(
                serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
                "kind": "ClusterNetworkPolicy", "metadata": {"name": name},
                "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                         "egress": [{"action": "Accept", "to": [{"domainNames": names}]},
                                    {"action": "Deny", "to": [{"networks": ["0.0.0.0/0", "::/0"]}]}]}}))
                .unwrap(),
            )
        };
    cluster.change(|o| {
        o.cluster_policies.push(cnp("api", json!(["api.example.test"])));
        o.put_pod(Arc::new(PolicyPod {
            namespace: "x".into(),
            name: "a".into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            ..PolicyPod::default()
        }));
    });
    let (e, k, metrics, _) = engine_with(cluster.clone(), vec![local("a", "10.0.0.1")]);
    assert_eq!(*k.copy_dns_answers.lock().unwrap(), None);
    e.pass(true).await.unwrap();
    assert_eq!(
        *k.copy_dns_answers.lock().unwrap(),
        Some(true),
        "answers are held while a rule has names"
    );
    let before = k.applied.lock().unwrap().len();
    let ip: std::net::IpAddr = "192.0.2.10".parse().unwrap();
    let ip6: std::net::IpAddr = "2001:db8::10".parse().unwrap();
    let answer = response(
        "API.example.test.",
        ResponseCode::NoError,
        &[
            Rec::Addr("api.example.test.", 5, ip),
            Rec::Addr("api.example.test.", 600, ip6),
        ],
    );
    let first_from = crate::denies::now_ms();
    assert_eq!(e.dns_answer(&answer), "learnt");
    let written = k.applied.lock().unwrap()[before..].join("");
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), 2, "{written}");
    assert!(
        lines[0].starts_with("add element inet weft-policy f")
            && lines[0].ends_with("4 { 192.0.2.10 timeout 30000ms comment \"api.example.test\" }"),
        "a TTL of 5 s is held 30 s: {written}"
    );
    assert!(lines[1].contains("6 { 2001:db8::10 timeout 600000ms"), "{written}");
    let x = e.explain("x/a", "192.0.2.10", PortProtocol::Tcp, 443).unwrap();
    assert!(x.verdict.allowed(), "{x:?}");
    assert!(
        !e.explain("x/a", "192.0.2.11", PortProtocol::Tcp, 443)
            .unwrap()
            .verdict
            .allowed()
    );
    // The same answer again: nothing new to write in the same millisecond; later, only
    // the same addresses again, for as long as the answer says from then (the learnt
    // table extends them).
    let n = k.applied.lock().unwrap().len();
    assert_eq!(e.dns_answer(&answer), "learnt");
    let again = k.applied.lock().unwrap()[n..].join("");
    if crate::denies::now_ms() == first_from {
        assert_eq!(again, "", "nothing moved, nothing written");
    } else {
        for line in again.lines() {
            assert!(
                line.contains("{ 192.0.2.10 timeout 30000ms") || line.contains("{ 2001:db8::10 timeout 600000ms"),
                "only the answer's addresses again: {again}"
            );
        }
    }
    let other = response(
        "www.other.test.",
        ResponseCode::NoError,
        &[Rec::Addr("www.other.test.", 60, ip)],
    );
    assert_eq!(e.dns_answer(&other), "unmatched");
    assert_eq!(e.dns_answer(&[0, 1, 2]), "unreadable");
    let nx = response("api.example.test.", ResponseCode::NXDomain, &[]);
    assert_eq!(e.dns_answer(&nx), "ignored");
    let text = metrics.render("text/plain").1;
    assert!(
        text.contains("weft_policy_dns_answers_total{result=\"learnt\"} 2"),
        "{text}"
    );
    assert!(text.contains("weft_policy_learnt_addresses 2"), "{text}");
    // A second rule taking the same name: its new set starts with the learnt address.
    cluster.change(|o| o.cluster_policies.push(cnp("wild", json!(["*.example.test"]))));
    let n = k.applied.lock().unwrap().len();
    e.pass(false).await.unwrap();
    let written = k.applied.lock().unwrap()[n..].join("");
    assert!(
        written.lines().filter(|l| l.contains("192.0.2.10 timeout")).count() == 1,
        "the new set is filled: {written}"
    );
    // No rule with names left: answers go straight on.
    cluster.change(|o| o.cluster_policies.clear());
    e.pass(false).await.unwrap();
    assert_eq!(*k.copy_dns_answers.lock().unwrap(), Some(false));
}

/// The pods that changed between two snapshots, among many: added, gone, changed, and
/// not a pod replaced by an equal copy (a source may read an unchanged object anew).
#[test]
fn changed_pods_of_a_map_changed_in_place() {
    let old = weft_topology::policy_pods(
        (0..1000).map(|i| remote(&format!("p{i:04}"), &format!("10.1.{}.{}", i / 250, i % 250))),
    );
    let mut new = old.clone();
    new.remove(&("x".to_string(), "p0000".to_string()));
    new.insert(("x".to_string(), "p0500".to_string()), remote("p0500", "10.9.9.9"));
    new.insert(("x".to_string(), "p0700".to_string()), remote("p0700", "10.1.2.200"));
    new.insert(("x".to_string(), "p9999".to_string()), remote("p9999", "10.9.9.8"));
    let changes: Vec<(String, Option<Vec<std::net::IpAddr>>)> = changed_pods(&old, &new)
        .into_iter()
        .map(|((_, name), p)| (name, p.map(|p| p.ips.clone())))
        .collect();
    assert_eq!(
        changes,
        [
            ("p0000".to_string(), None),
            ("p0500".to_string(), Some(vec!["10.9.9.9".parse().unwrap()])),
            ("p9999".to_string(), Some(vec!["10.9.9.8".parse().unwrap()])),
        ]
    );
    assert!(changed_pods(&new, &new).is_empty(), "the same map");
}

/// The host interfaces of a listing, kept by the listings' difference, are what a count
/// over the whole listing finds: pods added, removed, moved to another interface, two
/// on one interface, and a listing that is not derived from the last.
#[test]
fn listed_interfaces_follow_the_listing() {
    fn pod(name: &str, ifname: &str) -> LocalPod {
        LocalPod {
            host_ifname: ifname.into(),
            ..local(name, "10.0.0.1")
        }
    }
    let whole = |l: &LocalListing| {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for p in l.values() {
            *counts.entry(p.host_ifname.clone()).or_default() += 1;
        }
        counts
    };
    let mut index = None;
    let mut listing: LocalListing = (0..300)
        .map(|i| (i, Arc::new(pod(&format!("p{i}"), &format!("h{i}")))))
        .collect();
    assert_eq!(*listed_interfaces(&mut index, &listing), whole(&listing));
    let steps: [fn(&mut LocalListing); 5] = [
        |l| {
            l.insert(300, Arc::new(pod("p300", "h300")));
        },
        |l| {
            l.remove(&7);
        },
        |l| {
            l.insert(8, Arc::new(pod("p8", "moved")));
        },
        // A second attachment on an interface already listed, then the first goes.
        |l| {
            l.insert(301, Arc::new(pod("p9b", "h9")));
        },
        |l| {
            l.remove(&9);
        },
    ];
    for step in steps {
        step(&mut listing);
        assert_eq!(*listed_interfaces(&mut index, &listing), whole(&listing));
    }
    assert_eq!(listed_interfaces(&mut index, &listing).get("h9"), Some(&1));
    assert!(!listed_interfaces(&mut index, &listing).contains_key("h7"));
    let fresh = local_listing([pod("q", "hq")]);
    assert_eq!(*listed_interfaces(&mut index, &fresh), whole(&fresh));
}

/// The run loop reads the kernel back at once, then once per resync interval; a due
/// resync waits while passes keep finding the cluster moved, and runs once it stood
/// still for the quiet time, or after one more interval whatever moves.
#[tokio::test(start_paused = true)]
async fn a_due_resync_waits_while_the_cluster_moves_for_at_most_one_more_interval() {
    use std::sync::atomic::Ordering::SeqCst;
    let cluster = Cluster::new(true);
    let kernel = FakeKernel::default();
    let pods: LocalPods = Arc::new(|| Box::pin(async { Ok(LocalListing::default()) }));
    let metrics = Metrics::new("test", "test");
    let e = Arc::new(engine_over(
        cluster.clone(),
        pods,
        kernel.clone(),
        &metrics,
        Duration::from_secs(10),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(e.clone().run(async {
        let _ = stopped.await;
    }));
    let reads = || kernel.observed.load(SeqCst);
    // The cluster changes every half second for `secs` seconds.
    let moving = |secs: u32| {
        let cluster = cluster.clone();
        async move {
            for _ in 0..secs * 2 {
                cluster.change(|_| {});
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(reads(), 1, "the first pass reads the kernel back");
    // From 0.1 s to 15.1 s: the resync due at 10 s waits.
    moving(15).await;
    assert_eq!(reads(), 1, "no resync while the cluster moves");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(reads(), 2, "the resync once the cluster stood still for a second");
    // Due again at about 25.6 s; moving from 16.6 s to 34.6 s, it waits.
    moving(18).await;
    assert_eq!(reads(), 2, "the second resync waits while the cluster moves");
    // Overdue by an interval at about 35.6 s: it runs, though the cluster moves.
    moving(2).await;
    assert_eq!(reads(), 3, "a resync overdue by an interval runs whatever moves");
    let _ = stop.send(());
    task.await.unwrap();
}
