//! `DirSource`'s policy objects: Pods, Namespaces, NetworkPolicies and
//! ClusterNetworkPolicies read from the lab's files (several documents per file, JSON
//! lists), bad files reported and skipped, and `policy_changes` moving only when the
//! snapshot changes.

use std::path::Path;
use std::sync::Arc;

use weft_topology::{DirSource, PolicyObjects, TopologySource};

const NODE: &str = "node-1";

/// Writes a file as the lab does: whole, through a rename (a reader never sees half).
fn write(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn pods(o: &PolicyObjects) -> Vec<String> {
    o.pods.values().map(|p| format!("{}/{}", p.namespace, p.name)).collect()
}

fn policies(o: &PolicyObjects) -> Vec<String> {
    (o.policies.iter())
        .map(|p| {
            let m = &p.object.metadata;
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or("?"),
                m.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

fn pod_yaml(namespace: &str, name: &str, app: &str, ip: &str, ready: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{namespace: {namespace}, name: {name}, labels: {{app: {app}}}}}\n\
         spec:\n  nodeName: {NODE}\n  containers:\n  - name: c\n    ports: [{{name: http, containerPort: 80}}]\n\
         status:\n  phase: Running\n  podIPs: [{{ip: {ip}}}]\n  conditions: [{{type: Ready, status: \"{ready}\"}}]\n"
    )
}

const NAMESPACES: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: web
  labels: {env: prod}
  annotations: {weft.dev/policy-mode: audit}
---
apiVersion: v1
kind: Namespace
metadata: {name: db}
";

const POLICY: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-web
  managedFields: [{manager: kubectl, operation: Apply}]
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
";

/// The lab's usual directory: pods and namespaces in one file each, several documents,
/// a policy (namespace left out: `default`), and the pods of another namespace as JSON.
fn lab(dir: &Path) {
    let pods = [
        pod_yaml("web", "b", "web", "10.244.1.5", "True"),
        pod_yaml("web", "a", "web", "10.244.1.4", "True"),
    ]
    .join("---\n");
    write(dir, "pods.yaml", &pods);
    write(dir, "namespaces.yml", NAMESPACES);
    write(dir, "policy.yaml", POLICY);
    write(
        dir,
        "db.json",
        r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "db", "name": "z"},
             "spec": {"containers": [{"name": "c"}]}, "status": {"podIP": "10.244.2.9"}},
            {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"namespace": "db", "name": "deny"}, "spec": {"podSelector": {}}}
        ]}"#,
    );
}

fn start(dir: &Path) -> Arc<DirSource> {
    DirSource::start(dir.to_path_buf(), NODE.into()).expect("start")
}

#[test]
fn policy_objects_come_from_files_with_several_documents() {
    let dir = tempfile::tempdir().unwrap();
    lab(dir.path());
    let source = start(dir.path());
    assert!(source.problems().is_empty(), "{:?}", source.problems());
    let o = source.policy_objects();
    assert!(o.synced && !o.stale, "{o:?}");

    assert_eq!(pods(&o), ["db/z", "web/a", "web/b"]);
    assert_eq!(
        o.pods.values().next().expect("a pod").ips,
        ["10.244.2.9".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(o.pods.values().nth(1).expect("a pod").labels["app"], "web");
    assert_eq!(o.pods.values().nth(1).expect("a pod").ports[0].name, "http");
    assert_eq!(o.pods.values().nth(1).expect("a pod").node, NODE);

    let namespaces: Vec<_> = o.namespaces.iter().map(|n| (n.name.as_str(), n.audit)).collect();
    assert_eq!(namespaces, [("db", false), ("web", true)]);
    // The label the API server would have added.
    assert_eq!(o.namespaces[0].labels["kubernetes.io/metadata.name"], "db");
    assert_eq!(o.namespaces[1].labels["env"], "prod");

    assert_eq!(policies(&o), ["db/deny", "default/allow-web"]);
    assert_eq!(o.policies[1].object.metadata.managed_fields, None, "slimmed");

    // The policy objects are not topologies: nothing else is served.
    assert!(source.topologies().is_empty() && source.nodes().is_empty());
}

#[test]
fn a_bad_file_is_reported_and_skipped_and_the_others_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    lab(dir.path());
    // Not YAML at all, a Pod whose containers are not a list, a NetworkPolicy of an old
    // API group, and a duplicate of a pod of pods.yaml.
    write(dir.path(), "broken.yaml", "kind: [\n");
    write(
        dir.path(),
        "more.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {namespace: web, name: bad}\nspec: {containers: 7}\n---\n\
         apiVersion: extensions/v1beta1\nkind: NetworkPolicy\nmetadata: {name: old}\nspec: {podSelector: {}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {namespace: web, name: c}\nspec: {containers: [{name: c}]}\n",
    );
    write(
        dir.path(),
        "zz-dup.yaml",
        &pod_yaml("web", "a", "other", "10.244.9.9", "True"),
    );
    let source = start(dir.path());
    let problems: Vec<String> = source
        .problems()
        .iter()
        .map(|p| {
            let file = p.file.file_name().unwrap().to_string_lossy().into_owned();
            format!("{file}: {}", p.object.as_deref().unwrap_or("-"))
        })
        .collect();
    assert_eq!(
        problems,
        [
            "broken.yaml: document at line 1",
            "more.yaml: NetworkPolicy default/old (document at line 5)",
            "more.yaml: Pod web/bad (document at line 1)",
            "zz-dup.yaml: Pod web/a",
        ],
        "{:?}",
        source.problems()
    );
    assert!(source.problems()[3].reason.contains("pods.yaml"), "names the first one");

    let o = source.policy_objects();
    assert_eq!(pods(&o), ["db/z", "web/a", "web/b", "web/c"]);
    assert_eq!(
        o.pods.values().nth(1).expect("a pod").labels["app"],
        "web",
        "the first web/a wins"
    );
    assert_eq!(policies(&o), ["db/deny", "default/allow-web"]);
    assert_eq!(o.namespaces.len(), 2);
}

#[test]
fn policy_changes_moves_only_when_the_snapshot_changes() {
    let dir = tempfile::tempdir().unwrap();
    lab(dir.path());
    let source = start(dir.path());
    let policy_changes = source.policy_changes();
    let changes = source.changes();
    let (topology_changes, mut expected) = (*changes.borrow(), *policy_changes.borrow());
    // Reloads now (the watcher thread may too: a reload that finds nothing new moves
    // nothing, so the count is the same either way).
    let reload = || source.reload().expect("reload");

    // A pod relabelled and readdressed.
    let pod_file = |a_app: &str, a_ip: &str, ready: &str| {
        [
            pod_yaml("web", "b", "web", "10.244.1.5", ready),
            pod_yaml("web", "a", a_app, a_ip, ready),
        ]
        .join("---\n")
    };
    write(dir.path(), "pods.yaml", &pod_file("api", "10.244.1.4", "True"));
    reload();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected, "labels");
    assert_eq!(
        source.policy_objects().pods.values().nth(1).expect("a pod").labels["app"],
        "api"
    );
    write(dir.path(), "pods.yaml", &pod_file("api", "10.244.1.40", "True"));
    reload();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected, "podIPs");
    assert_eq!(
        source.policy_objects().pods.values().nth(1).expect("a pod").ips[0].to_string(),
        "10.244.1.40"
    );

    // Written again unchanged, or with only a status condition changed: nothing moves.
    write(dir.path(), "pods.yaml", &pod_file("api", "10.244.1.40", "True"));
    reload();
    write(dir.path(), "pods.yaml", &pod_file("api", "10.244.1.40", "False"));
    reload();
    assert_eq!(*policy_changes.borrow(), expected, "nothing policy reads changed");

    // A policy changed, then its file removed.
    write(dir.path(), "policy.yaml", &POLICY.replace("app: web", "app: api"));
    reload();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected, "policy spec");
    std::fs::remove_file(dir.path().join("policy.yaml")).unwrap();
    reload();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected, "policy file removed");
    assert_eq!(policies(&source.policy_objects()), ["db/deny"]);

    // A file gone bad keeps nothing of it (it is reported) and the rest works.
    write(dir.path(), "namespaces.yml", "kind: [\n");
    reload();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected, "namespaces file broken");
    assert!(source.policy_objects().namespaces.is_empty());
    assert_eq!(source.problems().len(), 1);
    assert_eq!(pods(&source.policy_objects()).len(), 3);

    // None of it moved the counter the topology and node engines wake on.
    assert_eq!(*changes.borrow(), topology_changes);
}

#[test]
fn an_unreadable_directory_keeps_the_objects_and_is_stale_until_readable() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("lab");
    std::fs::create_dir(&dir).unwrap();
    lab(&dir);
    let source = start(&dir);
    let policy_changes = source.policy_changes();
    let before = source.policy_objects();
    let moved = *policy_changes.borrow();

    let away = parent.path().join("away");
    std::fs::rename(&dir, &away).unwrap();
    assert!(source.reload().is_err());
    let during = source.policy_objects();
    assert!(during.stale && during.synced);
    assert_eq!(
        (&during.pods, &during.namespaces, &during.policies),
        (&before.pods, &before.namespaces, &before.policies),
        "the last objects stay"
    );
    assert_eq!(*policy_changes.borrow(), moved + 1, "stale is announced once");
    assert!(source.reload().is_err());
    assert_eq!(*policy_changes.borrow(), moved + 1);

    std::fs::rename(&away, &dir).unwrap();
    source.reload().expect("readable again");
    let after = source.policy_objects();
    assert!(!after.stale && after.synced);
    assert_eq!(*after, *before);
    assert_eq!(*policy_changes.borrow(), moved + 2);
}

const CLUSTER_POLICIES: &str = "\
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata:
  name: deny-db
  namespace: ignored
  labels: {team: a}
  managedFields: [{manager: kubectl, operation: Apply}]
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress:
  - name: no-db
    action: Deny
    from: [{namespaces: {matchLabels: {app: db}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline}
spec:
  tier: Baseline
  priority: 900
  subject: {namespaces: {}}
";

fn cluster_policies(o: &PolicyObjects) -> Vec<String> {
    (o.cluster_policies.iter())
        .map(|c| c.object.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[test]
fn cluster_policies_come_from_files_and_another_api_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    lab(dir.path());
    write(dir.path(), "cnp.yaml", CLUSTER_POLICIES);
    // AdminNetworkPolicy's group and version (read as v1alpha2 it would look enforced
    // and not be), one without a name, and a duplicate.
    write(
        dir.path(),
        "old.yaml",
        "apiVersion: policy.networking.k8s.io/v1alpha1\nkind: ClusterNetworkPolicy\nmetadata: {name: old}\n\
         spec: {tier: Admin, priority: 1, subject: {namespaces: {}}}\n---\n\
         apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {}\n\
         spec: {tier: Admin, priority: 1, subject: {namespaces: {}}}\n---\n\
         apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: baseline}\n\
         spec: {tier: Admin, priority: 2, subject: {namespaces: {}}}\n",
    );
    let source = start(dir.path());
    let problems: Vec<String> = (source.problems().iter())
        .map(|p| format!("{}: {}", p.object.as_deref().unwrap_or("-"), p.reason))
        .collect();
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0] == "ClusterNetworkPolicy (document at line 5): no name",
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("ClusterNetworkPolicy baseline: duplicate of the one in"),
        "{problems:?}"
    );
    assert_eq!(
        problems[2],
        "ClusterNetworkPolicy old (document at line 1): apiVersion \"policy.networking.k8s.io/v1alpha1\" \
         is not policy.networking.k8s.io/v1beta1 or policy.networking.k8s.io/v1alpha2"
    );

    let o = source.policy_objects();
    assert!(o.synced && !o.stale);
    assert_eq!(cluster_policies(&o), ["baseline", "deny-db"]);
    let deny = &o.cluster_policies[1];
    assert_eq!(deny.object.spec.priority, Some(10));
    assert_eq!(deny.object.spec.ingress[0].name, "no-db");
    assert_eq!(deny.object.metadata.namespace, None, "cluster-scoped");
    assert_eq!(deny.object.metadata.labels, None, "slimmed");
    assert_eq!(deny.object.metadata.managed_fields, None, "slimmed");
    assert_eq!(
        o.cluster_policies[0].object.spec.priority,
        Some(900),
        "the first baseline wins"
    );
    // The rest of the lab is there too.
    assert_eq!(policies(&o), ["db/deny", "default/allow-web"]);

    // A change moves policy_changes once, the same written again not at all, a removal once.
    let policy_changes = source.policy_changes();
    let mut expected = *policy_changes.borrow();
    write(
        dir.path(),
        "cnp.yaml",
        &CLUSTER_POLICIES.replace("priority: 10", "priority: 20"),
    );
    source.reload().unwrap();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected);
    assert_eq!(
        source.policy_objects().cluster_policies[1].object.spec.priority,
        Some(20)
    );
    write(
        dir.path(),
        "cnp.yaml",
        &CLUSTER_POLICIES
            .replace("priority: 10", "priority: 20")
            .replace("team: a", "team: b"),
    );
    source.reload().unwrap();
    assert_eq!(*policy_changes.borrow(), expected, "a label is not read");
    std::fs::remove_file(dir.path().join("cnp.yaml")).unwrap();
    source.reload().unwrap();
    expected += 1;
    assert_eq!(*policy_changes.borrow(), expected);
    // The duplicate in old.yaml is the one now.
    let o = source.policy_objects();
    assert_eq!(cluster_policies(&o), ["baseline"]);
    assert_eq!(o.cluster_policies[0].object.spec.priority, Some(2));
}

/// Topologies `lab/r1` and `lab/r2`, without links, in one file of `dir`.
fn two_topologies(dir: &Path) {
    let topo = |name: &str| {
        format!(
            "apiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {{name: {name}, namespace: lab}}\nspec: {{links: []}}\n"
        )
    };
    write(dir, "topology.yaml", &[topo("r1"), topo("r2")].join("---\n"));
}

/// A reload serves the very same Topology objects while neither their file nor their
/// status changed (holders compare them by pointer; a big lab reloads at every status
/// write), and a new object, with the new status, for the one whose status changed.
#[test]
fn unchanged_topologies_are_served_again_without_a_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    two_topologies(&dir);
    let src = start(&dir);
    let status = |ip: &str| weft_topology::TopologyStatus {
        src_ip: ip.into(),
        net_ns: "/run/netns/x".into(),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(src.set_status("lab", "r1", status("192.0.2.1"))).unwrap();
    rt.block_on(src.set_status("lab", "r2", status("192.0.2.2"))).unwrap();
    src.reload().unwrap();
    let (r1, r2) = (src.topology("lab", "r1").unwrap(), src.topology("lab", "r2").unwrap());
    assert_eq!(r1.status.as_ref().unwrap().src_ip, "192.0.2.1");
    src.reload().unwrap();
    assert!(
        Arc::ptr_eq(&r1, &src.topology("lab", "r1").unwrap()),
        "r1 unchanged: the same object"
    );
    rt.block_on(src.set_status("lab", "r2", status("192.0.2.3"))).unwrap();
    src.reload().unwrap();
    assert!(Arc::ptr_eq(&r1, &src.topology("lab", "r1").unwrap()));
    let now = src.topology("lab", "r2").unwrap();
    assert!(!Arc::ptr_eq(&r2, &now));
    assert_eq!(now.status.as_ref().unwrap().src_ip, "192.0.2.3");
}

/// Another daemon's status writes reach this one through the watch file by file: the
/// written pod's Topology gets its status, the others stay the very same objects; a
/// removed status file clears it, and one that is no status reloads the whole directory
/// (which serves the Topology without it).
#[test]
fn another_daemons_status_writes_are_served_file_by_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    two_topologies(&dir);
    let writer = DirSource::start(dir.clone(), "n1".into()).unwrap();
    let reader = DirSource::start(dir.clone(), "n2".into()).unwrap();
    let r2 = reader.topology("lab", "r2").unwrap();
    let status = weft_topology::TopologyStatus {
        src_ip: "192.0.2.1".into(),
        net_ns: "/run/netns/x".into(),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let src_ip = |s: &DirSource| {
        s.topology("lab", "r1")
            .unwrap()
            .status
            .as_ref()
            .map(|s| s.src_ip.clone())
    };
    let until = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !ok() {
            assert!(std::time::Instant::now() < deadline, "{what} not seen within 5 s");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };

    rt.block_on(writer.set_status("lab", "r1", status.clone())).unwrap();
    until("r1's status", &|| src_ip(&reader).as_deref() == Some("192.0.2.1"));
    assert!(Arc::ptr_eq(&r2, &reader.topology("lab", "r2").unwrap()), "r2 untouched");

    rt.block_on(writer.set_status("lab", "r1", Default::default())).unwrap();
    until("r1's status removed", &|| src_ip(&reader).is_none());

    rt.block_on(writer.set_status("lab", "r1", status)).unwrap();
    until("r1's status again", &|| src_ip(&reader).is_some());
    std::fs::write(dir.join(".status/lab/r1.json"), "not json").unwrap();
    until("the unreadable status dropped", &|| src_ip(&reader).is_none());
    assert!(
        reader
            .problems()
            .iter()
            .any(|p| p.file.ends_with(".status/lab/r1.json")),
        "{:?}",
        reader.problems()
    );
}
