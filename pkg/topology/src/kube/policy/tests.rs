//! Tests of `policy`.

use serde_json::json;

use super::*;

/// Lists every kind (empty) into `cache`.
fn sync_all(cache: &PolicyCache) {
    let done = watcher::Event::<Pod>::InitDone;
    cache.on_event(Kind::Pods, &done, &mut None, |m| &mut m.pods, read_pod);
    let done = watcher::Event::<Namespace>::InitDone;
    cache.on_event(
        Kind::Namespaces,
        &done,
        &mut None,
        |m| &mut m.namespaces,
        read_namespace,
    );
    let done = watcher::Event::<NetworkPolicy>::InitDone;
    cache.on_event(Kind::Policies, &done, &mut None, |m| &mut m.policies, read_policy);
    list_cluster_policies(cache, &[]);
}

/// Lists every kind but ClusterNetworkPolicy (empty) into `cache`.
fn sync_required(cache: &PolicyCache) {
    sync_all(cache);
    cache.lock().kinds[Kind::ClusterPolicies as usize].synced = false;
    cache.update(|_| false);
}

/// A (re)list of ClusterNetworkPolicies finding `names`, as the watcher makes it.
fn list_cluster_policies(cache: &PolicyCache, names: &[&str]) {
    let mut relist = None;
    let mut events = vec![watcher::Event::Init];
    for name in names {
        let cnp = ClusterNetworkPolicy::new(name, Default::default());
        events.push(watcher::Event::InitApply(cnp));
    }
    events.push(watcher::Event::InitDone);
    for ev in &events {
        cache.on_event(
            Kind::ClusterPolicies,
            ev,
            &mut relist,
            |m| &mut m.cluster_policies,
            read_cluster_policy,
        );
    }
}

/// The error a watcher reports for a list answered `code`.
fn list_failed(code: u16) -> watcher::Error {
    let status = kube::core::Status::failure("refused", "Refused").with_code(code);
    watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))
}

fn cluster_policies(cache: &PolicyCache) -> Vec<String> {
    (cache.snapshot().cluster_policies.iter())
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[test]
fn failing_requests_make_the_snapshot_stale_until_one_succeeds() {
    let cache = PolicyCache::new();
    let changes = cache.subscribe();
    // Before every kind is listed, nothing is stale.
    cache.answered(Kind::Pods, Some(500));
    assert!(!cache.snapshot().stale && !cache.snapshot().synced);
    sync_all(&cache);
    assert!(cache.snapshot().synced);
    let at = *changes.borrow();

    cache.answered(Kind::Policies, None);
    assert!(cache.snapshot().stale);
    assert!(!cache.failed(Kind::Policies, &list_failed(500)), "warned about");
    // The watcher's `Init` before it lists again proves nothing.
    let init = watcher::Event::<Pod>::Init;
    cache.on_event(Kind::Pods, &init, &mut None, |m| &mut m.pods, read_pod);
    let init = watcher::Event::<NetworkPolicy>::Init;
    cache.on_event(Kind::Policies, &init, &mut None, |m| &mut m.policies, read_policy);
    assert!(cache.snapshot().stale);
    assert_eq!(*changes.borrow(), at + 1, "one bump for going stale");
    cache.answered(Kind::Policies, Some(200));
    assert!(!cache.snapshot().stale);
    assert_eq!(*changes.borrow(), at + 2, "one for coming back");

    // A required kind's 404 or 403 is a failure like any other.
    cache.answered(Kind::Policies, Some(404));
    assert!(cache.snapshot().stale);
    cache.answered(Kind::Pods, Some(403));
    assert!(!cache.failed(Kind::Pods, &list_failed(403)));
    cache.answered(Kind::Policies, Some(200));
    cache.answered(Kind::Pods, Some(200));
    assert!(!cache.snapshot().stale);

    // A stream error, then an object on the stream.
    cache.failed(Kind::Namespaces, &watcher::Error::NoResourceVersion);
    assert!(cache.snapshot().stale);
    let mut ns = Namespace::default();
    ns.metadata.name = Some("web".into());
    let apply = watcher::Event::Apply(ns);
    cache.on_event(
        Kind::Namespaces,
        &apply,
        &mut None,
        |m| &mut m.namespaces,
        read_namespace,
    );
    let o = cache.snapshot();
    assert!(!o.stale && o.namespaces.len() == 1);

    // A slow answer, counted until it comes.
    cache.slow(Kind::Pods, true);
    assert!(cache.snapshot().stale);
    cache.slow(Kind::Pods, false);
    assert!(!cache.snapshot().stale);
}

#[test]
fn cluster_policies_not_served_are_listed_as_none_and_come_when_served() {
    let cache = PolicyCache::new();
    let changes = cache.subscribe();
    sync_required(&cache);
    assert!(!cache.snapshot().synced, "waits for ClusterNetworkPolicies");
    let at = *changes.borrow();

    // No CRD: listed, none, not stale; the watcher's error is expected.
    cache.answered(Kind::ClusterPolicies, Some(404));
    assert!(
        cache.failed(Kind::ClusterPolicies, &list_failed(404)),
        "not warned about"
    );
    let o = cache.snapshot();
    assert!(o.synced && !o.stale && o.cluster_policies.is_empty(), "{o:?}");
    assert_eq!(*changes.borrow(), at + 1);
    // Asking again and finding nothing again changes nothing.
    cache.answered(Kind::ClusterPolicies, Some(404));
    assert_eq!(*changes.borrow(), at + 1);

    // The CRD is installed: the next list brings its objects, sorted.
    cache.answered(Kind::ClusterPolicies, Some(200));
    list_cluster_policies(&cache, &["b", "a"]);
    assert_eq!(cluster_policies(&cache), ["a", "b"]);
    assert!(!cache.snapshot().stale);
    assert_eq!(*changes.borrow(), at + 2);

    // The CRD is deleted: its objects went with it.
    cache.answered(Kind::ClusterPolicies, Some(404));
    let o = cache.snapshot();
    assert!(o.synced && !o.stale && o.cluster_policies.is_empty(), "{o:?}");
    assert_eq!(*changes.borrow(), at + 3);

    // Any other failure is a lost watch: stale, the last objects kept.
    cache.answered(Kind::ClusterPolicies, Some(200));
    list_cluster_policies(&cache, &["a"]);
    cache.answered(Kind::ClusterPolicies, Some(500));
    assert!(!cache.failed(Kind::ClusterPolicies, &list_failed(500)));
    let o = cache.snapshot();
    assert!(o.stale && o.synced);
    assert_eq!(cluster_policies(&cache), ["a"]);
    cache.answered(Kind::ClusterPolicies, Some(200));
    assert!(!cache.snapshot().stale);
}

#[test]
fn forbidden_cluster_policies_are_stale_and_keep_what_was_read() {
    // Never listed: none, synced (pods keep being networked), stale (it is not known).
    let cache = PolicyCache::new();
    sync_required(&cache);
    cache.answered(Kind::ClusterPolicies, Some(403));
    assert!(!cache.failed(Kind::ClusterPolicies, &list_failed(403)), "warned about");
    let o = cache.snapshot();
    assert!(o.synced && o.stale && o.cluster_policies.is_empty(), "{o:?}");
    cache.answered(Kind::ClusterPolicies, Some(200));
    list_cluster_policies(&cache, &["a"]);
    let o = cache.snapshot();
    assert!(o.synced && !o.stale);
    assert_eq!(cluster_policies(&cache), ["a"]);

    // Listed, then refused: the last ones stay enforced, stale.
    cache.answered(Kind::ClusterPolicies, Some(403));
    let o = cache.snapshot();
    assert!(o.synced && o.stale);
    assert_eq!(cluster_policies(&cache), ["a"]);
}

#[test]
fn an_unserved_kind_is_asked_for_again_slower_and_slower_up_to_the_recheck() {
    let cache = Arc::new(PolicyCache::new());
    let mut backoff = Recheck::new(cache.clone(), Kind::ClusterPolicies);
    // Served: kube's default (under a second at first).
    assert!(backoff.next().unwrap() < Duration::from_secs(2));
    backoff.reset();

    cache.answered(Kind::ClusterPolicies, Some(404));
    let mut delays = Vec::new();
    for _ in 0..9 {
        // The watcher resets its backoff at the `Init` before each list.
        backoff.reset();
        delays.push(backoff.next().unwrap().as_secs());
    }
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);

    // Served again: the next time it goes missing starts over.
    cache.answered(Kind::ClusterPolicies, Some(200));
    backoff.reset();
    cache.answered(Kind::ClusterPolicies, Some(403));
    assert_eq!(backoff.next(), Some(FIRST_RECHECK));
    // Only the optional kind is ever unserved.
    cache.answered(Kind::Pods, Some(404));
    assert!(!cache.unserved(Kind::Pods));
}

#[test]
fn a_slim_cluster_policy_keeps_its_identity_and_spec() {
    let mut p: ClusterNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {
            "name": "deny", "uid": "u4", "generation": 2, "resourceVersion": "12",
            "labels": {"team": "a"}, "annotations": {"note": "x"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {"tier": "Admin", "priority": 10, "subject": {"namespaces": {}},
                 "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]},
    }))
    .unwrap();
    let spec = p.spec.clone();
    slim_cluster_policy(&mut p);
    assert_eq!(
        serde_json::to_value(&p.metadata).unwrap(),
        json!({"name": "deny", "uid": "u4", "generation": 2})
    );
    assert_eq!(p.spec, spec);
}

#[test]
fn a_slim_pod_keeps_what_policy_reads_and_nothing_else() {
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "namespace": "web", "name": "a", "uid": "u1", "resourceVersion": "7",
            "labels": {"app": "web"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u0"}],
        },
        "spec": {
            "nodeName": "n1",
            "hostNetwork": true,
            "serviceAccountName": "sa",
            "volumes": [{"name": "v", "emptyDir": {}}],
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{
                "name": "web", "image": "nginx", "args": ["-g"],
                "env": [{"name": "A", "value": "b"}],
                "ports": [
                    {"name": "http", "containerPort": 8080, "hostPort": 80, "hostIP": "0.0.0.0"},
                    {"containerPort": 9000},
                ],
            }],
        },
        "status": {
            "phase": "Running",
            "hostIP": "172.30.0.2",
            "podIP": "10.244.1.4",
            "podIPs": [{"ip": "10.244.1.4"}, {"ip": "fd00::4"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": "web", "image": "nginx", "imageID": "sha256:x", "ready": true,
                "restartCount": 0, "state": {"running": {}},
            }],
        },
    }))
    .unwrap();
    let before = PolicyPod::from_pod(&pod).unwrap();
    slim_pod(&mut pod);
    assert_eq!(PolicyPod::from_pod(&pod).unwrap(), before, "policy reads the same");
    assert_eq!(
        serde_json::to_value(&pod).unwrap(),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": "web", "name": "a", "uid": "u1", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "n1",
                "hostNetwork": true,
                "containers": [{"name": "web", "ports": [{"name": "http", "containerPort": 8080}]}],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.244.1.4",
                "podIPs": [{"ip": "10.244.1.4"}, {"ip": "fd00::4"}],
            },
        })
    );
}

#[test]
fn a_slim_namespace_keeps_labels_and_the_policy_mode_only() {
    let mut ns: Namespace = serde_json::from_value(json!({
        "metadata": {
            "name": "web", "uid": "u2", "resourceVersion": "9",
            "labels": {"kubernetes.io/metadata.name": "web", "env": "prod"},
            "annotations": {"weft.dev/policy-mode": "audit", "owner": "team-a"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }))
    .unwrap();
    slim_namespace(&mut ns);
    assert_eq!(
        serde_json::to_value(&ns).unwrap(),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "web", "uid": "u2",
            "labels": {"kubernetes.io/metadata.name": "web", "env": "prod"},
            "annotations": {"weft.dev/policy-mode": "audit"},
        }})
    );
    assert!(PolicyNamespace::from_namespace(&ns).unwrap().audit);

    // Without the annotation, no annotations at all.
    let mut plain: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "db", "annotations": {"owner": "b"}}})).unwrap();
    slim_namespace(&mut plain);
    assert_eq!(plain.metadata.annotations, None);
}

#[test]
fn a_slim_policy_keeps_its_identity_and_spec() {
    let mut p: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {
            "namespace": "web", "name": "allow", "uid": "u3", "generation": 4, "resourceVersion": "11",
            "labels": {"team": "a"}, "annotations": {"note": "x"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }))
    .unwrap();
    let spec = p.spec.clone();
    slim_policy(&mut p);
    assert_eq!(
        serde_json::to_value(&p.metadata).unwrap(),
        json!({"namespace": "web", "name": "allow", "uid": "u3", "generation": 4})
    );
    assert_eq!(p.spec, spec);
}

#[test]
fn a_relist_swaps_in_only_what_it_listed_and_a_restarted_one_forgets_the_first_try() {
    let cache = PolicyCache::new();
    list_cluster_policies(&cache, &["a", "b"]);
    assert_eq!(cluster_policies(&cache), ["a", "b"]);
    // The next list no longer has `a`.
    list_cluster_policies(&cache, &["b"]);
    assert_eq!(cluster_policies(&cache), ["b"]);
    // A list that fails half-way starts over with `Init`: what it had gathered goes.
    let mut relist = None;
    let cnp = |n: &str| ClusterNetworkPolicy::new(n, Default::default());
    for ev in [
        watcher::Event::Init,
        watcher::Event::InitApply(cnp("x")),
        watcher::Event::Init,
        watcher::Event::InitApply(cnp("y")),
        watcher::Event::InitDone,
    ] {
        cache.on_event(
            Kind::ClusterPolicies,
            &ev,
            &mut relist,
            |m| &mut m.cluster_policies,
            read_cluster_policy,
        );
    }
    assert_eq!(cluster_policies(&cache), ["y"]);
    assert!(relist.is_none(), "nothing is kept once the list is swapped in");
}
