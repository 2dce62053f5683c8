//! The fake server against kube clients: namespaced and cluster-wide lists and watches,
//! resources taken away, a resource served at two versions, HTTPS with and without the
//! token.

use super::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// A kube client for `endpoint` configured as a kubeconfig would: the CA file and a token.
async fn client(endpoint: &HttpsEndpoint, token: &str, dir: &std::path::Path) -> kube::Client {
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, &endpoint.ca_pem).unwrap();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
         clusters: [{{name: t, cluster: {{server: 'https://{}', certificate-authority: '{}'}}}}]\n\
         users: [{{name: t, user: {{token: '{token}'}}}}]\n\
         contexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n",
        endpoint.addr,
        ca.display()
    );
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn serves_pods_namespaces_and_policies_namespaced_and_across_namespaces() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let server = FakeApiServer::new();
    for (ns, name) in [("web", "a"), ("web", "b"), ("db", "a")] {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some(ns.into());
        pod.metadata.name = Some(name.into());
        server.put(&pod);
        let mut policy = NetworkPolicy::default();
        policy.metadata.namespace = Some(ns.into());
        policy.metadata.name = Some(format!("p-{name}"));
        server.put(&policy);
    }
    let mut ns = Namespace::default();
    ns.metadata.name = Some("web".into());
    server.put(&ns);
    let client = server.client();
    let lp = ListParams::default();

    let names = |l: Vec<Pod>| l.into_iter().map(|p| p.metadata.name.unwrap()).collect::<Vec<_>>();
    let all = Api::<Pod>::all(client.clone()).list(&lp).await.unwrap();
    assert_eq!(all.items.len(), 3);
    let web = Api::<Pod>::namespaced(client.clone(), "web").list(&lp).await.unwrap();
    assert_eq!(names(web.items), ["a", "b"]);
    let db = Api::<NetworkPolicy>::namespaced(client.clone(), "db")
        .list(&lp)
        .await
        .unwrap();
    assert_eq!(db.items.len(), 1);
    assert_eq!(
        Api::<NetworkPolicy>::all(client.clone())
            .list(&lp)
            .await
            .unwrap()
            .items
            .len(),
        3
    );

    // A Namespace is cluster-scoped: `namespaces/web` is the object itself, and it
    // carries the label the API server adds.
    let web = Api::<Namespace>::all(client.clone()).get("web").await.unwrap();
    let labels = web.metadata.labels.unwrap();
    assert_eq!(labels["kubernetes.io/metadata.name"], "web");
    assert_eq!(server.count("list pods"), 2);
    assert_eq!(server.count("list networkpolicies"), 2);
    assert_eq!(server.count("get namespaces"), 1);
}

#[tokio::test]
async fn serves_cluster_network_policies_and_takes_them_away_on_request() {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    use weft_topology::{ClusterNetworkPolicy, ClusterNetworkPolicySpec};
    let server = FakeApiServer::new();
    let mut cnp = ClusterNetworkPolicy::new("a", ClusterNetworkPolicySpec::default());
    cnp.metadata.namespace = Some("ignored".into());
    let stored = server.put(&cnp);
    assert_eq!(stored.metadata.namespace, None, "cluster-scoped");
    let api = Api::<ClusterNetworkPolicy>::all(server.client());
    let lp = ListParams::default();
    let list = api.list(&lp).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    let mut watch = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();

    // No CRD: the open watch ends, and everything is 404 until it is served again.
    server.unserve::<ClusterNetworkPolicy>();
    assert!(watch.next().await.is_none(), "the watch ends");
    let code = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.reason),
        e => panic!("{e:?}"),
    };
    assert_eq!(code(api.list(&lp).await.unwrap_err()), (404, "NotFound".into()));
    assert_eq!(code(api.get("a").await.unwrap_err()).0, 404);
    assert!(api.watch(&WatchParams::default(), "0").await.is_err());
    // Whoever installs the CRD again creates objects with it.
    server.put(&ClusterNetworkPolicy::new("b", ClusterNetworkPolicySpec::default()));
    server.serve::<ClusterNetworkPolicy>();
    assert_eq!(api.list(&lp).await.unwrap().items.len(), 2);

    // No RBAC: 403.
    let mut watch = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    assert!(matches!(watch.next().await, Some(Ok(WatchEvent::Added(_)))));
    server.forbid::<ClusterNetworkPolicy>();
    let (code, reason) = code(api.list(&lp).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    server.serve::<ClusterNetworkPolicy>();
    assert_eq!(api.list(&lp).await.unwrap().items.len(), 2);
    assert_eq!(
        server.count("list clusternetworkpolicies"),
        5,
        "refused requests are logged as asked"
    );
    assert_eq!(server.count("watch clusternetworkpolicies"), 3);
}

#[tokio::test]
async fn serves_cluster_network_policies_at_two_versions_as_one_resource() {
    use futures::StreamExt;
    use kube::api::{ApiResource, DynamicObject, WatchEvent, WatchParams};
    use kube::core::GroupVersionKind;
    use weft_topology::{ClusterNetworkPolicy, ClusterNetworkPolicySpec};
    let server = FakeApiServer::new();
    server.put(&ClusterNetworkPolicy::new("a", ClusterNetworkPolicySpec::default()));
    // Written at the other version, with a field no Rust type has.
    let b = server.put_json(serde_json::json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "b", "namespace": "ignored"},
        "spec": {"tier": "Admin", "priority": 3, "subject": {"namespaces": {}}, "somethingNew": {"x": 1}},
    }));
    assert_eq!(b["metadata"]["resourceVersion"], "3");
    assert!(b["metadata"].get("namespace").is_none(), "cluster-scoped");
    let at = |version: &str| {
        let gvk = GroupVersionKind::gvk("policy.networking.k8s.io", version, "ClusterNetworkPolicy");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "clusternetworkpolicies");
        Api::<DynamicObject>::all_with(server.client(), &resource)
    };
    let (beta, alpha) = (at("v1beta1"), at("v1alpha2"));
    let lp = ListParams::default();
    let listed = |l: kube::core::ObjectList<DynamicObject>| {
        (l.items.into_iter())
            .map(|o| (o.metadata.name.unwrap(), o.types.unwrap().api_version))
            .collect::<Vec<_>>()
    };
    // Stored once, shown at each version with that version's apiVersion.
    for (api, version) in [(&beta, "v1beta1"), (&alpha, "v1alpha2")] {
        let want = ["a", "b"].map(|n| (n.to_string(), format!("policy.networking.k8s.io/{version}")));
        assert_eq!(listed(api.list(&lp).await.unwrap()), want);
    }
    let got = beta.get("b").await.unwrap();
    assert_eq!(got.data["spec"]["somethingNew"]["x"], 1, "kept as written");
    let json = server.get_json::<ClusterNetworkPolicy>(None, "b").unwrap();
    assert_eq!(json["apiVersion"], "policy.networking.k8s.io/v1beta1");

    // A watch at either version sees a change made at the other.
    let rv = server.resource_version().to_string();
    let mut alpha_watch = alpha.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    let mut beta_watch = beta.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    server.put(&ClusterNetworkPolicy::new("c", ClusterNetworkPolicySpec::default()));
    match alpha_watch.next().await {
        Some(Ok(WatchEvent::Added(o))) => {
            assert_eq!(o.metadata.name.as_deref(), Some("c"));
            assert_eq!(o.types.unwrap().api_version, "policy.networking.k8s.io/v1alpha2");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(beta_watch.next().await, Some(Ok(WatchEvent::Added(_)))));

    // One version taken away: its watch ends and it answers 404; the other goes on.
    server.unserve_version::<ClusterNetworkPolicy>("v1beta1");
    assert!(beta_watch.next().await.is_none(), "the v1beta1 watch ends");
    let code = |e: kube::Error| match e {
        kube::Error::Api(s) => s.code,
        e => panic!("{e:?}"),
    };
    assert_eq!(code(beta.list(&lp).await.unwrap_err()), 404);
    assert!(server.delete::<ClusterNetworkPolicy>(None, "a"));
    match alpha_watch.next().await {
        Some(Ok(WatchEvent::Deleted(o))) => assert_eq!(o.metadata.name.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
    assert_eq!(alpha.list(&lp).await.unwrap().items.len(), 2);
    server.unserve_version::<ClusterNetworkPolicy>("v1alpha2");
    assert_eq!(code(alpha.list(&lp).await.unwrap_err()), 404);
    server.serve_version::<ClusterNetworkPolicy>("v1beta1");
    assert_eq!(listed(beta.list(&lp).await.unwrap()).len(), 2);
    assert_eq!(code(alpha.list(&lp).await.unwrap_err()), 404);
    // `serve` serves every version again.
    server.serve::<ClusterNetworkPolicy>();
    assert_eq!(alpha.list(&lp).await.unwrap().items.len(), 2);

    assert_eq!(server.count("list clusternetworkpolicies@v1alpha2"), 5);
    assert_eq!(server.count("list clusternetworkpolicies@v1beta1"), 3);
    assert_eq!(
        server.count("list clusternetworkpolicies"),
        8,
        "{:?}",
        server.versioned_log()
    );
    assert_eq!(server.count("get clusternetworkpolicies@v1beta1"), 1);
}

#[test]
#[should_panic(expected = "does not serve ClusterNetworkPolicy at v2")]
fn a_version_the_server_does_not_know_is_refused_loudly() {
    FakeApiServer::new().unserve_version::<weft_topology::ClusterNetworkPolicy>("v2");
}

#[tokio::test]
async fn serves_over_https_with_the_token_and_refuses_without() {
    let server = FakeApiServer::new();
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    server.put(&node);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = server.serve_https(listener, "s3cret").unwrap();
    let dir = tempfile::tempdir().unwrap();

    let nodes: Api<Node> = Api::all(client(&endpoint, "s3cret", dir.path()).await);
    let list = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(server.count("list nodes"), 1);

    let wrong: Api<Node> = Api::all(client(&endpoint, "guess", dir.path()).await);
    let err = wrong.list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 401), "{err:?}");
    assert_eq!(server.count("unauthorized"), 1);
    assert_eq!(server.count("list nodes"), 1);

    // Dropping the endpoint stops serving.
    let addr = endpoint.addr;
    drop(endpoint);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
