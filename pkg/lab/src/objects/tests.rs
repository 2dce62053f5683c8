//! Tests of `objects`.

use super::*;

#[test]
fn label_changes_parse_as_kubectl_takes_them() {
    assert_eq!(
        parse_label_change("app=web").unwrap(),
        ("app".into(), Some("web".into()))
    );
    assert_eq!(parse_label_change("app=").unwrap(), ("app".into(), Some(String::new())));
    assert_eq!(parse_label_change("app-").unwrap(), ("app".into(), None));
    assert_eq!(
        parse_label_change("example.com/tier=db").unwrap(),
        ("example.com/tier".into(), Some("db".into()))
    );
    for bad in [
        "app",
        "-=x",
        "a b=c",
        "app=no spaces",
        "/x=y",
        "Example.com/x=y",
        "x=-y",
    ] {
        assert!(parse_label_change(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn policies_come_from_documents_and_lists_with_their_namespace() {
    let text = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a, namespace: x}\nspec: {podSelector: {}}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {name: b}\n  spec: {podSelector: {}}\n";
    let p = parse_policies(text, "f.yaml").unwrap();
    let keys: Vec<String> = p.iter().map(object_key).collect();
    assert_eq!(keys, ["x/a", "default/b"]);
    let namespaces: BTreeSet<String> = ["x".to_string()].into();
    assert!(check_policy(&p[0], &namespaces).is_ok());
    let e = check_policy(&p[1], &namespaces).unwrap_err();
    assert!(e.contains("namespace default is not in the lab"), "{e}");

    let e = parse_policies("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "f.yaml").unwrap_err();
    assert!(e.contains("NetworkPolicy and ClusterNetworkPolicy objects only"), "{e}");
    let e = parse_policies(
        "apiVersion: extensions/v1beta1\nkind: NetworkPolicy\nmetadata: {name: c}\n",
        "f.yaml",
    )
    .unwrap_err();
    assert!(e.contains("not networking.k8s.io/v1"), "{e}");
    // What weftd would refuse is refused here, naming the field.
    let bad = parse_policies(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: c, namespace: x}\nspec:\n  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]\n",
        "f.yaml",
    )
    .unwrap();
    let e = check_policy(&bad[0], &namespaces).unwrap_err();
    assert!(e.contains("ipBlock.cidr"), "{e}");
}

/// ClusterNetworkPolicies are cluster-scoped: keyed apart from any NetworkPolicy,
/// checked as weftd checks them, another apiVersion refused.
#[test]
fn cluster_network_policies_are_taken_too() {
    let text = "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: admin, namespace: x}\nspec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}\n";
    let p = parse_policies(text, "f.yaml").unwrap();
    assert_eq!(object_key(&p[0]), "clusternetworkpolicy/admin");
    assert!(p[0].pointer("/metadata/namespace").is_none(), "cluster-scoped");
    assert_eq!(shown(&object_key(&p[0])), "clusternetworkpolicy admin");
    assert!(check_policy(&p[0], &BTreeSet::new()).is_ok());
    let bad = parse_policies(&text.replace("priority: 1", "priority: 1001"), "f.yaml").unwrap();
    assert!(
        check_policy(&bad[0], &BTreeSet::new())
            .unwrap_err()
            .contains("spec.priority")
    );
    let e = parse_policies(&text.replace("v1alpha2", "v1alpha1"), "f.yaml").unwrap_err();
    assert!(e.contains("is not policy.networking.k8s.io/v1alpha2"), "{e}");
}

#[test]
fn add_results_give_addresses_ipv4_first() {
    let r = br#"{"cniVersion":"1.1.0","ips":[{"address":"fd00::5/128"},{"address":"10.244.1.5/32","gateway":"10.244.1.1"}]}"#;
    assert_eq!(
        result_ips(r),
        vec!["10.244.1.5".parse::<IpAddr>().unwrap(), "fd00::5".parse().unwrap()]
    );
    assert!(result_ips(b"not json").is_empty());
}

#[test]
fn pod_addresses_are_kept_one_file_per_pod_and_old_state_moves_there() {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let lab = Lab::load(&examples.join("lab.yaml"))
        .unwrap()
        .with_state_dir(dir.path().to_path_buf());
    fs::create_dir_all(lab.topology_dir()).unwrap();
    let (r1, r2) = (lab.find_pod("r1").unwrap(), lab.find_pod("r2").unwrap());
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // State as a weftctl before `pod-ips/` left it: the addresses move, the rest stays.
    fs::write(
        dir.path().join("objects.json"),
        r#"{"labels":{"pod/lab/r1":{"tier":"web"}},"pod_ips":{"lab/r1":["10.0.0.5"]}}"#,
    )
    .unwrap();
    lab.with_live(|live| {
        assert!(live.pod_ips.is_empty());
        assert_eq!(lab.labels_of(r1, live).get("tier").map(String::as_str), Some("web"));
        Ok(())
    })
    .unwrap();
    assert_eq!(lab.kept_pod_ips("lab", "r1"), [ip("10.0.0.5")]);
    let kept = fs::read_to_string(dir.path().join("objects.json")).unwrap();
    assert!(!kept.contains("pod_ips") && kept.contains("tier"), "{kept}");
    let object = lab.with_live(|live| Ok(lab.pod_object(r1, live))).unwrap();
    assert_eq!(object["status"]["podIP"], "10.0.0.5", "{object}");

    // Reported: in its file and in its Pod object; deleted: gone from both.
    lab.report_pod_ips(r2, vec![ip("10.0.0.6"), ip("fd00::6")]).unwrap();
    assert_eq!(lab.kept_pod_ips("lab", "r2"), [ip("10.0.0.6"), ip("fd00::6")]);
    let pod_file = lab.topology_dir().join(lab.pod_file(r2));
    assert!(fs::read_to_string(&pod_file).unwrap().contains("fd00::6"));
    lab.delete_pod_object(r2).unwrap();
    assert!(lab.kept_pod_ips("lab", "r2").is_empty());
    assert!(!pod_file.exists());

    // Published again with no pod attached (no namespace of theirs exists): no pod keeps
    // addresses, and no Pod object shows any.
    lab.report_pod_ips(r2, vec![ip("10.0.0.6")]).unwrap();
    lab.publish_objects().unwrap();
    assert!(lab.kept_pod_ips("lab", "r1").is_empty() && lab.kept_pod_ips("lab", "r2").is_empty());
    let left: Vec<_> = fs::read_dir(dir.path().join(POD_IPS_DIR)).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!fs::read_to_string(&pod_file).unwrap().contains("10.0.0.6"));
}
