//! Tests of `policy`.

use std::io::Write;

use serde_json::{Value, json};

use super::*;

/// The ClusterNetworkPolicy watches, by version.
const BETA: Kind = Kind::ClusterPolicies(0);
const ALPHA: Kind = Kind::ClusterPolicies(1);

/// Lists every kind (empty) into `cache`.
fn sync_all(cache: &PolicyCache) {
    let done = watcher::Event::<Pod>::InitDone;
    cache.on_event(
        Kind::Pods,
        &done,
        &mut Watch::default(),
        |st, _| &mut st.maps.pods,
        read_pod,
    );
    let done = watcher::Event::<Namespace>::InitDone;
    let mut watch = Watch::default();
    cache.on_event(
        Kind::Namespaces,
        &done,
        &mut watch,
        |st, _| &mut st.maps.namespaces,
        read_namespace,
    );
    list_policies(cache, &mut Watch::default(), vec![]);
    for kind in Kind::cluster_policies() {
        list_cluster_policies(cache, kind, &[]);
    }
}

/// Lists every kind but ClusterNetworkPolicy (empty) into `cache`.
fn sync_required(cache: &PolicyCache) {
    sync_all(cache);
    for kind in Kind::cluster_policies() {
        cache.lock().kinds[kind.index()].synced = false;
    }
    cache.update(|_| false);
}

/// A raw ClusterNetworkPolicy, as a watch at `version` gets it.
fn raw_cnp(version: &str, name: &str, priority: i32) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("policy.networking.k8s.io/{version}"), "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name, "resourceVersion": "1", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"tier": "Admin", "priority": priority, "subject": {"namespaces": {}}},
    }))
    .unwrap()
}

/// A raw NetworkPolicy.
fn raw_policy(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

/// The events of a (re)list of `objects`, as the watcher makes it.
fn relist<O>(objects: Vec<O>) -> Vec<watcher::Event<O>> {
    let mut events = vec![watcher::Event::Init];
    events.extend(objects.into_iter().map(watcher::Event::InitApply));
    events.push(watcher::Event::InitDone);
    events
}

/// One event of the ClusterNetworkPolicy watch `kind`, slimmed as the watch slims it.
fn cnp_event(
    cache: &PolicyCache,
    kind: Kind,
    watch: &mut Watch<String, Strict<ClusterNetworkPolicy>>,
    ev: watcher::Event<DynamicObject>,
) {
    let ev = ev.modify(slim_raw);
    cache.on_event(kind, &ev, watch, cluster_policies_at, read_cluster_policy);
}

/// A (re)list of the ClusterNetworkPolicies `names` at the version of `kind` (priority 1).
fn list_cluster_policies(cache: &PolicyCache, kind: Kind, names: &[&str]) {
    let Kind::ClusterPolicies(v) = kind else { unreachable!() };
    let objects = names.iter().map(|n| raw_cnp(CNP_VERSIONS[v], n, 1)).collect();
    list_cluster_objects(cache, kind, &mut Watch::default(), objects);
}

fn list_cluster_objects(
    cache: &PolicyCache,
    kind: Kind,
    watch: &mut Watch<String, Strict<ClusterNetworkPolicy>>,
    objects: Vec<DynamicObject>,
) {
    for ev in relist(objects) {
        cnp_event(cache, kind, watch, ev);
    }
}

/// A (re)list of raw NetworkPolicies.
fn list_policies(
    cache: &PolicyCache,
    watch: &mut Watch<(String, String), Strict<NetworkPolicy>>,
    objects: Vec<DynamicObject>,
) {
    for ev in relist(objects) {
        policy_event(cache, watch, ev);
    }
}

fn policy_event(
    cache: &PolicyCache,
    watch: &mut Watch<(String, String), Strict<NetworkPolicy>>,
    ev: watcher::Event<DynamicObject>,
) {
    let ev = ev.modify(slim_raw);
    cache.on_event(Kind::Policies, &ev, watch, |st, _| &mut st.maps.policies, read_policy);
}

/// The error a watcher reports for a list answered `code`.
fn list_failed(code: u16) -> watcher::Error {
    let status = kube::core::Status::failure("refused", "Refused").with_code(code);
    watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))
}

fn cluster_policies(cache: &PolicyCache) -> Vec<String> {
    (cache.snapshot().cluster_policies.iter())
        .map(|c| c.object.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// The priority of the snapshot's ClusterNetworkPolicy `name` (as JSON: whatever the
/// type makes of it).
fn priority(cache: &PolicyCache, name: &str) -> Option<i64> {
    let o = cache.snapshot();
    let c = o
        .cluster_policies
        .iter()
        .find(|c| c.object.metadata.name.as_deref() == Some(name))?;
    serde_json::to_value(&c.object.spec).unwrap()["priority"].as_i64()
}

/// What `f` logs at INFO and above, one line per event.
fn logged(f: impl FnOnce()) -> Vec<String> {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .without_time()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_string).collect()
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
    cache.on_event(
        Kind::Pods,
        &init,
        &mut Watch::default(),
        |st, _| &mut st.maps.pods,
        read_pod,
    );
    policy_event(&cache, &mut Watch::default(), watcher::Event::Init);
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
    let mut watch = Watch::default();
    cache.on_event(
        Kind::Namespaces,
        &apply,
        &mut watch,
        |st, _| &mut st.maps.namespaces,
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

    // No CRD: listed, none, not stale; the watcher's error is expected. Synced once
    // both versions said so.
    for kind in [BETA, ALPHA] {
        cache.answered(kind, Some(404));
        assert!(cache.failed(kind, &list_failed(404)), "not warned about");
    }
    let o = cache.snapshot();
    assert!(o.synced && !o.stale && o.cluster_policies.is_empty(), "{o:?}");
    assert_eq!(*changes.borrow(), at + 1);
    // Asking again and finding nothing again changes nothing.
    cache.answered(BETA, Some(404));
    cache.answered(ALPHA, Some(404));
    assert_eq!(*changes.borrow(), at + 1);

    // The CRD is installed: the next list brings its objects, sorted.
    cache.answered(BETA, Some(200));
    list_cluster_policies(&cache, BETA, &["b", "a"]);
    assert_eq!(cluster_policies(&cache), ["a", "b"]);
    assert!(!cache.snapshot().stale);
    assert_eq!(*changes.borrow(), at + 2);

    // The CRD is deleted: its objects went with it.
    cache.answered(BETA, Some(404));
    let o = cache.snapshot();
    assert!(o.synced && !o.stale && o.cluster_policies.is_empty(), "{o:?}");
    assert_eq!(*changes.borrow(), at + 3);

    // Any other failure is a lost watch: stale, the last objects kept.
    cache.answered(BETA, Some(200));
    list_cluster_policies(&cache, BETA, &["a"]);
    cache.answered(BETA, Some(500));
    assert!(!cache.failed(BETA, &list_failed(500)));
    let o = cache.snapshot();
    assert!(o.stale && o.synced);
    assert_eq!(cluster_policies(&cache), ["a"]);
    cache.answered(BETA, Some(200));
    assert!(!cache.snapshot().stale);
}

#[test]
fn synced_waits_for_every_version_of_cluster_policies() {
    let cache = PolicyCache::new();
    sync_required(&cache);
    // Only v1beta1 served: listed, and v1alpha2 not yet answered.
    cache.answered(BETA, Some(200));
    list_cluster_policies(&cache, BETA, &["a"]);
    assert!(!cache.snapshot().synced, "v1alpha2 not answered yet");
    cache.answered(ALPHA, Some(404));
    let o = cache.snapshot();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(cluster_policies(&cache), ["a"]);

    // Only v1alpha2 served.
    let cache = PolicyCache::new();
    sync_required(&cache);
    cache.answered(BETA, Some(404));
    assert!(!cache.snapshot().synced);
    cache.answered(ALPHA, Some(200));
    list_cluster_policies(&cache, ALPHA, &["b"]);
    let o = cache.snapshot();
    assert!(o.synced && !o.stale, "{o:?}");
    assert_eq!(cluster_policies(&cache), ["b"]);
}

#[test]
fn both_versions_give_each_object_once_the_v1beta1_copy_first() {
    let cache = PolicyCache::new();
    sync_required(&cache);
    let (mut beta, mut alpha) = (Watch::default(), Watch::default());
    list_cluster_objects(
        &cache,
        BETA,
        &mut beta,
        vec![raw_cnp("v1beta1", "a", 1), raw_cnp("v1beta1", "b", 2)],
    );
    list_cluster_objects(
        &cache,
        ALPHA,
        &mut alpha,
        vec![
            raw_cnp("v1alpha2", "a", 1),
            raw_cnp("v1alpha2", "b", 20),
            raw_cnp("v1alpha2", "c", 3),
        ],
    );
    let o = cache.snapshot();
    assert!(o.synced && !o.stale);
    assert_eq!(cluster_policies(&cache), ["a", "b", "c"], "each once");
    assert_eq!(
        priority(&cache, "b"),
        Some(2),
        "the two copies differ: v1beta1's is read"
    );
    {
        // The same object at both versions is kept in memory once.
        let st = cache.lock();
        assert!(Arc::ptr_eq(&st.cluster_policies[0]["a"], &st.cluster_policies[1]["a"]));
    }

    // An update at v1beta1 wins; the same at v1alpha2 changes nothing more.
    let changes = cache.subscribe();
    let at = *changes.borrow();
    cnp_event(
        &cache,
        BETA,
        &mut beta,
        watcher::Event::Apply(raw_cnp("v1beta1", "a", 7)),
    );
    assert_eq!((priority(&cache, "a"), *changes.borrow()), (Some(7), at + 1));
    cnp_event(
        &cache,
        ALPHA,
        &mut alpha,
        watcher::Event::Apply(raw_cnp("v1alpha2", "a", 7)),
    );
    assert_eq!(*changes.borrow(), at + 1);
    // An update at v1alpha2 alone does not override v1beta1's copy.
    cnp_event(
        &cache,
        ALPHA,
        &mut alpha,
        watcher::Event::Apply(raw_cnp("v1alpha2", "b", 30)),
    );
    assert_eq!((priority(&cache, "b"), *changes.borrow()), (Some(2), at + 1));

    // Deleted at one version while the other still has it: kept (the other copy).
    cnp_event(
        &cache,
        BETA,
        &mut beta,
        watcher::Event::Delete(raw_cnp("v1beta1", "b", 2)),
    );
    assert_eq!(cluster_policies(&cache), ["a", "b", "c"]);
    assert_eq!(priority(&cache, "b"), Some(30), "v1alpha2's copy now");
    cnp_event(
        &cache,
        ALPHA,
        &mut alpha,
        watcher::Event::Delete(raw_cnp("v1alpha2", "b", 30)),
    );
    assert_eq!(cluster_policies(&cache), ["a", "c"]);
    // Deleted at v1alpha2 first: v1beta1's copy stays, nothing moves.
    let at = *changes.borrow();
    cnp_event(
        &cache,
        ALPHA,
        &mut alpha,
        watcher::Event::Delete(raw_cnp("v1alpha2", "a", 7)),
    );
    assert_eq!(
        (cluster_policies(&cache), *changes.borrow()),
        (vec!["a".into(), "c".into()], at)
    );

    // A version no longer served takes only its own copies: what the other has stays.
    cache.answered(ALPHA, Some(404));
    assert_eq!(cluster_policies(&cache), ["a"]);
    // Refused or unreachable after that: still none at that version (the last known).
    cache.answered(ALPHA, Some(403));
    cache.answered(ALPHA, None);
    cache.update(|st| st.merge_cluster_policies());
    assert_eq!(cluster_policies(&cache), ["a"]);
    // Served again: its copies count again (its watch goes on from them).
    cache.answered(ALPHA, Some(200));
    assert_eq!(cluster_policies(&cache), ["a", "c"]);
    cache.answered(ALPHA, Some(404));
    cache.answered(BETA, Some(404));
    let o = cache.snapshot();
    assert!(o.synced && !o.stale && o.cluster_policies.is_empty(), "{o:?}");
}

#[test]
fn the_log_names_the_version_not_served_and_says_once_when_neither_is() {
    let cache = PolicyCache::new();
    sync_required(&cache);
    let lines = logged(|| {
        cache.answered(BETA, Some(404));
        cache.answered(ALPHA, Some(404));
        // Asked again, found missing again: nothing more to say.
        cache.answered(BETA, Some(404));
        cache.answered(ALPHA, Some(404));
    });
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].contains("not served at policy.networking.k8s.io/v1beta1"),
        "{lines:#?}"
    );
    assert!(lines[1].contains("at any version weft reads"), "{lines:#?}");
    assert!(lines[1].contains("v1beta1, v1alpha2"), "{lines:#?}");

    // One version installed, then gone again; 403 on both is said once.
    let lines = logged(|| {
        cache.answered(ALPHA, Some(200));
        cache.answered(ALPHA, Some(404));
        cache.answered(BETA, Some(403));
        cache.answered(ALPHA, Some(403));
    });
    assert_eq!(lines.len(), 3 + 1, "{lines:#?}");
    assert!(
        lines[0].contains("served and readable now at policy.networking.k8s.io/v1alpha2"),
        "{lines:#?}"
    );
    assert!(lines[1].contains("at any version weft reads"), "{lines:#?}");
    assert!(
        lines[2].contains("403 Forbidden at policy.networking.k8s.io/v1beta1"),
        "{lines:#?}"
    );
    assert!(lines[3].contains("lost or refused"), "{lines:#?}");
}

#[test]
fn forbidden_cluster_policies_are_stale_and_keep_what_was_read() {
    // Never listed: none, synced (pods keep being networked), stale (it is not known).
    let cache = PolicyCache::new();
    sync_required(&cache);
    for kind in [BETA, ALPHA] {
        cache.answered(kind, Some(403));
        assert!(!cache.failed(kind, &list_failed(403)), "warned about");
    }
    let o = cache.snapshot();
    assert!(o.synced && o.stale && o.cluster_policies.is_empty(), "{o:?}");
    for kind in [BETA, ALPHA] {
        cache.answered(kind, Some(200));
        list_cluster_policies(&cache, kind, &["a"]);
    }
    let o = cache.snapshot();
    assert!(o.synced && !o.stale);
    assert_eq!(cluster_policies(&cache), ["a"]);

    // Listed, then refused: the last ones stay enforced, stale.
    cache.answered(BETA, Some(403));
    let o = cache.snapshot();
    assert!(o.synced && o.stale);
    assert_eq!(cluster_policies(&cache), ["a"]);
}

#[test]
fn an_unserved_kind_is_asked_for_again_slower_and_slower_up_to_the_recheck() {
    let cache = Arc::new(PolicyCache::new());
    let mut backoff = Recheck::new(cache.clone(), BETA);
    // Served: kube's default (under a second at first).
    assert!(backoff.next().unwrap() < Duration::from_secs(2));
    backoff.reset();

    cache.answered(BETA, Some(404));
    let mut delays = Vec::new();
    for _ in 0..9 {
        // The watcher resets its backoff at the `Init` before each list.
        backoff.reset();
        delays.push(backoff.next().unwrap().as_secs());
    }
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    // Each version on its own: v1alpha2 is served.
    let mut other = Recheck::new(cache.clone(), ALPHA);
    assert!(other.next().unwrap() < Duration::from_secs(2));

    // Served again: the next time it goes missing starts over.
    cache.answered(BETA, Some(200));
    backoff.reset();
    cache.answered(BETA, Some(403));
    assert_eq!(backoff.next(), Some(FIRST_RECHECK));
    // Only the optional kind is ever unserved.
    cache.answered(Kind::Pods, Some(404));
    assert!(!cache.unserved(Kind::Pods));
}

#[test]
fn the_cluster_policy_watches_are_named_by_their_versions() {
    for (v, version) in CNP_VERSIONS.iter().enumerate() {
        assert!(Kind::ClusterPolicies(v).what().ends_with(version));
        assert_eq!(
            cluster_policy_resource(version).api_version,
            format!("{CNP_GROUP}/{version}")
        );
    }
    assert_eq!(Kind::cluster_policies().map(Kind::index).collect::<Vec<_>>(), [3, 4]);
}

#[test]
fn a_raw_policy_is_read_strictly_and_slimmed() {
    let mut o = raw_policy(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {
            "namespace": "web", "name": "allow", "uid": "u3", "generation": 4, "resourceVersion": "11",
            "labels": {"team": "a"}, "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            "annotations": {"weft.dev/policy-mode": "staged-removal", "other": "dropped"},
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {}, "serviceAccount": "b"}]}]},
        "status": {"conditions": [{"type": "x"}]},
    }));
    slim_raw(&mut o);
    assert_eq!(
        o.metadata.resource_version.as_deref(),
        Some("11"),
        "kept to warn once per change"
    );
    assert!(o.metadata.managed_fields.is_none() && o.data.get("status").is_none());
    let (key, read) = read_policy(&o).unwrap();
    assert_eq!(key, ("web".to_string(), "allow".to_string()));
    let p = read.unwrap();
    assert_eq!(p.unknown, ["spec.ingress[0].from[0].serviceAccount"]);
    assert_eq!(
        serde_json::to_value(&p.object.metadata).unwrap(),
        json!({"namespace": "web", "name": "allow", "uid": "u3", "generation": 4,
               "annotations": {"weft.dev/policy-mode": "staged-removal"}})
    );
    // Without a namespace: `default`, as the API server would.
    let o = raw_policy(json!({"metadata": {"name": "x"}, "spec": {"podSelector": {}}}));
    let (key, read) = read_policy(&o).unwrap();
    assert_eq!(key.0, "default");
    assert_eq!(read.unwrap().object.metadata.namespace.as_deref(), Some("default"));
    // Without a name: nothing.
    assert!(read_policy(&raw_policy(json!({"metadata": {}}))).is_none());

    let mut c = raw_cnp("v1alpha2", "deny", 5);
    c.data["spec"]["ingress"] = json!([{"action": "Deny", "from": [{"namespaces": {}, "serviceAccounts": {}}]}]);
    slim_raw(&mut c);
    let (key, read) = read_cluster_policy(&c).unwrap();
    let c = read.unwrap();
    assert_eq!(key, "deny");
    assert_eq!(serde_json::to_value(&c.object.spec).unwrap()["priority"], 5);
    assert_eq!(c.unknown, ["spec.ingress[0].from[0].serviceAccounts"]);
}

#[test]
fn an_unreadable_policy_is_left_out_warned_about_once_per_change_and_the_rest_read() {
    let cache = PolicyCache::new();
    sync_required(&cache);
    let mut watch = Watch::default();
    let policy = |name: &str, rv: &str, port: Value| {
        raw_policy(json!({
            "metadata": {"namespace": "web", "name": name, "resourceVersion": rv},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": port}]}]},
        }))
    };
    let names = |cache: &PolicyCache| {
        (cache.snapshot().policies.iter())
            .map(|p| p.object.metadata.name.clone().unwrap())
            .collect::<Vec<_>>()
    };
    // `port` must be a number or a string.
    let bad = policy("bad", "5", json!({"x": 1}));
    let lines = logged(|| list_policies(&cache, &mut watch, vec![policy("a", "1", json!(80)), bad.clone()]));
    assert_eq!(names(&cache), ["a"], "the rest of the list is read");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("web/bad") && lines[0].contains("left out"),
        "{lines:#?}"
    );
    assert!(
        lines[0].contains("expected IntOrString"),
        "the decoder's error: {lines:#?}"
    );

    // Listed again (a relist), unchanged: not warned about again.
    let lines = logged(|| list_policies(&cache, &mut watch, vec![policy("a", "1", json!(80)), bad.clone()]));
    assert!(lines.is_empty(), "{lines:#?}");
    // Changed, and still unreadable: warned about again, once.
    let lines = logged(|| {
        policy_event(
            &cache,
            &mut watch,
            watcher::Event::Apply(policy("bad", "6", json!([1]))),
        );
        policy_event(
            &cache,
            &mut watch,
            watcher::Event::Apply(policy("bad", "6", json!([1]))),
        );
    });
    assert_eq!(lines.len(), 1, "{lines:#?}");

    // Readable now: read; then an update that is not takes it out again.
    policy_event(
        &cache,
        &mut watch,
        watcher::Event::Apply(policy("bad", "7", json!(443))),
    );
    assert_eq!(names(&cache), ["a", "bad"]);
    let lines = logged(|| policy_event(&cache, &mut watch, watcher::Event::Apply(policy("a", "8", json!(true)))));
    assert_eq!(
        names(&cache),
        ["bad"],
        "its last readable version is not what is written"
    );
    assert_eq!(lines.len(), 1, "{lines:#?}");

    // Deleted, and created again as unreadable under the same name: warned about again.
    policy_event(
        &cache,
        &mut watch,
        watcher::Event::Delete(policy("a", "9", json!(true))),
    );
    assert!(watch.unreadable.is_empty());
    let lines = logged(|| policy_event(&cache, &mut watch, watcher::Event::Apply(policy("a", "8", json!(true)))));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    // Gone while the watch was away: a relist without it forgets it.
    list_policies(&cache, &mut watch, vec![policy("bad", "7", json!(443))]);
    assert!(watch.unreadable.is_empty());
    assert_eq!(names(&cache), ["bad"]);
}

#[test]
fn a_slim_cluster_policy_keeps_its_identity_and_spec() {
    let mut p: ClusterNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {
            "name": "deny", "uid": "u4", "generation": 2, "resourceVersion": "12",
            "labels": {"team": "a"}, "annotations": {"note": "x", "weft.dev/policy-mode": "staged"},
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
        json!({"name": "deny", "uid": "u4", "generation": 2,
               "annotations": {"weft.dev/policy-mode": "staged"}})
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
            "labels": {"team": "a"}, "annotations": {"note": "x", "weft.dev/policy-mode": "staged-removal"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }))
    .unwrap();
    let spec = p.spec.clone();
    slim_policy(&mut p);
    assert_eq!(
        serde_json::to_value(&p.metadata).unwrap(),
        json!({"namespace": "web", "name": "allow", "uid": "u3", "generation": 4,
               "annotations": {"weft.dev/policy-mode": "staged-removal"}})
    );
    assert_eq!(p.spec, spec);
}

#[test]
fn a_relist_swaps_in_only_what_it_listed_and_a_restarted_one_forgets_the_first_try() {
    let cache = PolicyCache::new();
    list_cluster_policies(&cache, BETA, &["a", "b"]);
    assert_eq!(cluster_policies(&cache), ["a", "b"]);
    // The next list no longer has `a`.
    list_cluster_policies(&cache, BETA, &["b"]);
    assert_eq!(cluster_policies(&cache), ["b"]);
    // A list that fails half-way starts over with `Init`: what it had gathered goes.
    let mut watch = Watch::default();
    let cnp = |n: &str| raw_cnp("v1beta1", n, 1);
    for ev in [
        watcher::Event::Init,
        watcher::Event::InitApply(cnp("x")),
        watcher::Event::Init,
        watcher::Event::InitApply(cnp("y")),
        watcher::Event::InitDone,
    ] {
        cnp_event(&cache, BETA, &mut watch, ev);
    }
    assert_eq!(cluster_policies(&cache), ["y"]);
    assert!(watch.relist.is_none(), "nothing is kept once the list is swapped in");
}
