//! The fake server against kube clients: namespaced and cluster-wide lists and watches,
//! resources taken away, HTTPS with and without the token.

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
