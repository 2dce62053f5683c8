//! An in-process fake Kubernetes API server for tests: an axum [`Router`] handed to
//! [`kube::Client::new`] (no socket), serving `Topology`, `Node`, `WireState`, `Pod`,
//! `Namespace`, `NetworkPolicy` and `ClusterNetworkPolicy` with the list/watch semantics
//! kube's watchers rely on.
//!
//! What it does, as a real API server would:
//! - one global `resourceVersion`, bumped by every change; LIST answers carry it;
//! - WATCH (`?watch=true&resourceVersion=N`) streams newline-delimited JSON events
//!   (`ADDED`, `MODIFIED`, `DELETED`) of the changes after `N`, then stays open and pushes
//!   new ones until `timeoutSeconds`; with `allowWatchBookmarks=true` it sends a
//!   `BOOKMARK` when the test calls [`FakeApiServer::bookmark`]; a watch without a
//!   resourceVersion (or `0`) first sends the current objects as `ADDED`;
//! - a watch from a `resourceVersion` older than the last [`FakeApiServer::compact`] is
//!   answered with an `ERROR` event carrying a `410 Gone` Status (reason `Expired`), which
//!   makes a watcher relist;
//! - GET of one object, merge patches (`application/merge-patch+json`) and server-side
//!   apply (`application/apply-patch+yaml`, create-or-replace) of objects and of their
//!   `/status` subresource;
//! - field selectors `a.b=v` (`==` too, comma-separated), namespaced and all-namespaces
//!   paths;
//! - the label `kubernetes.io/metadata.name` on every Namespace written, and no
//!   namespace on a cluster-scoped object.
//!
//! The test changes objects with [`FakeApiServer::put`] and [`FakeApiServer::delete`],
//! reads them back with [`FakeApiServer::get`], cuts the watches of one resource with
//! [`FakeApiServer::disconnect`], takes a resource away as a cluster without its CRD
//! ([`FakeApiServer::unserve`], 404) or without the RBAC to read it
//! ([`FakeApiServer::forbid`], 403) until [`FakeApiServer::serve`], and checks what
//! clients asked with [`FakeApiServer::count`].
//!
//! A client in the test process gets the router itself ([`FakeApiServer::client`]); a
//! process the test starts (weftd in a container, say) reaches it as a pod reaches the
//! real API server, over HTTPS with a bearer token, through
//! [`FakeApiServer::serve_https`]: a certificate from a fresh test CA, whose PEM goes
//! into the pod's `ca.crt`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

/// A resource the server knows.
struct Kind {
    api_version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
}

const KINDS: [Kind; 7] = [
    Kind {
        api_version: "networkop.co.uk/v1beta1",
        kind: "Topology",
        plural: "topologies",
        namespaced: true,
    },
    Kind {
        api_version: "v1",
        kind: "Node",
        plural: "nodes",
        namespaced: false,
    },
    Kind {
        api_version: "weft.dev/v1alpha1",
        kind: "WireState",
        plural: "wirestates",
        namespaced: false,
    },
    Kind {
        api_version: "v1",
        kind: "Pod",
        plural: "pods",
        namespaced: true,
    },
    Kind {
        api_version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
    },
    Kind {
        api_version: "networking.k8s.io/v1",
        kind: "NetworkPolicy",
        plural: "networkpolicies",
        namespaced: true,
    },
    Kind {
        api_version: "policy.networking.k8s.io/v1alpha2",
        kind: "ClusterNetworkPolicy",
        plural: "clusternetworkpolicies",
        namespaced: false,
    },
];

/// The label the API server puts on every Namespace (policies select namespaces by name
/// through it).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The served resource of Rust type `K` (panics for a type the server does not serve).
fn kind_of<K: Resource<DynamicType = ()>>() -> &'static Kind {
    KINDS
        .iter()
        .find(|k| k.plural == K::plural(&()) && k.api_version == K::api_version(&()) && k.kind == K::kind(&()))
        .unwrap_or_else(|| panic!("the fake API server does not serve {}", K::kind(&())))
}

/// (plural, namespace or "", name)
type Key = (&'static str, String, String);

/// One change, kept for watches.
struct Change {
    rv: u64,
    plural: &'static str,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// Watches must start at or after this resourceVersion (see `compact`).
    oldest: u64,
    /// Bumped by `bookmark`.
    bookmarks: u64,
    /// Per resource, bumped by `disconnect`: open watches of an older generation end.
    cuts: BTreeMap<&'static str, u64>,
    /// Resources whose list and watch requests wait (see `disconnect`).
    held: BTreeSet<&'static str>,
    /// Resources every request of which is refused with this code (see `unserve`).
    refused: BTreeMap<&'static str, StatusCode>,
    /// What clients asked and what they were answered, e.g. "list topologies".
    log: Vec<String>,
}

impl Store {
    /// Stores `object` as the new version of an object of `kind`, returning it as stored.
    fn write(&mut self, kind: &'static Kind, mut object: Value) -> Value {
        self.rv += 1;
        let meta = object["metadata"].as_object_mut().expect("an object with metadata");
        if kind.namespaced && meta.get("namespace").is_none_or(Value::is_null) {
            meta.insert("namespace".into(), "default".into());
        } else if !kind.namespaced {
            meta.remove("namespace");
        }
        if kind.kind == "Namespace" {
            let name = meta.get("name").cloned().unwrap_or_default();
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if !labels.is_object() {
                *labels = json!({});
            }
            labels[NAMESPACE_NAME_LABEL] = name;
        }
        let key = key(kind, &object);
        let old = self.objects.get(&key);
        let uid = old
            .or(Some(&object))
            .and_then(|o| o["metadata"]["uid"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("00000000-0000-4000-8000-{:012}", self.rv));
        let change = if old.is_some() { "MODIFIED" } else { "ADDED" };
        object["apiVersion"] = kind.api_version.into();
        object["kind"] = kind.kind.into();
        object["metadata"]["uid"] = uid.into();
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
        self.objects.insert(key, object.clone());
        self.record(kind, change, object.clone());
        object
    }

    /// Removes an object; the DELETED event carries the deletion's resourceVersion.
    fn remove(&mut self, kind: &'static Kind, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
        self.record(kind, "DELETED", object.clone());
        Some(object)
    }

    fn record(&mut self, kind: &'static Kind, change: &'static str, object: Value) {
        let (rv, plural) = (self.rv, kind.plural);
        self.history.push(Change {
            rv,
            plural,
            kind: change,
            object,
        });
    }

    fn cut(&self, kind: &Kind) -> u64 {
        self.cuts.get(kind.plural).copied().unwrap_or_default()
    }
}

fn key(kind: &'static Kind, object: &Value) -> Key {
    let field = |f: &str| object["metadata"][f].as_str().unwrap_or_default().to_string();
    let ns = if kind.namespaced {
        field("namespace")
    } else {
        String::new()
    };
    (kind.plural, ns, field("name"))
}

struct Shared {
    store: Mutex<Store>,
    /// Ticks after every change of the store, waking waiting requests and watches.
    changed: watch::Sender<()>,
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().expect("fake API server lock")
    }

    /// Changes the store and wakes whoever waits for a change.
    fn change<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let r = f(&mut self.store());
        self.changed.send_replace(());
        r
    }

    /// Waits while `disconnect` holds the requests of `kind`.
    async fn connected(&self, kind: &Kind) {
        let mut changed = self.changed.subscribe();
        while self.store().held.contains(kind.plural) {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }
}

/// A fake Kubernetes API server living in the test process; clones share one store.
#[derive(Clone)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeApiServer {
    /// An empty server (resourceVersion 1, no objects).
    pub fn new() -> Self {
        let store = Store {
            rv: 1,
            ..Store::default()
        };
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            changed: watch::channel(()).0,
        });
        Self { shared }
    }

    /// The server as an axum router, for `kube::Client::new` or any tower client.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/{version}/{*rest}", any(serve))
            .route("/apis/{group}/{version}/{*rest}", any(serve))
            .with_state(self.shared.clone())
    }

    /// A kube client talking to this server (default namespace `default`); needs a Tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.router(), "default")
    }

    /// Creates or replaces an object (namespace `default` if unset for a namespaced kind),
    /// returning it as stored, with its uid and new resourceVersion.
    pub fn put<K>(&self, object: &K) -> K
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let value = serde_json::to_value(object).expect("object serializes");
        let stored = self.shared.change(|s| s.write(kind_of::<K>(), value));
        serde_json::from_value(stored).expect("stored object deserializes")
    }

    /// Deletes an object (`namespace` is ignored for cluster-scoped kinds); whether it existed.
    pub fn delete<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) -> bool {
        let kind = kind_of::<K>();
        let key = object_key(kind, namespace, name);
        self.shared.change(|s| s.remove(kind, &key)).is_some()
    }

    /// An object as stored, if it exists.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let object = self.get_json::<K>(namespace, name)?;
        Some(serde_json::from_value(object).expect("stored object deserializes"))
    }

    /// An object as stored, as raw JSON (to see exactly which fields are set).
    pub fn get_json<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) -> Option<Value> {
        let kind = kind_of::<K>();
        self.shared
            .store()
            .objects
            .get(&object_key(kind, namespace, name))
            .cloned()
    }

    /// The current (global) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv
    }

    /// Forgets the history up to now: a watch asked to start from an older
    /// resourceVersion is answered `410 Gone` (open watches go on).
    pub fn compact(&self) {
        self.shared.change(|s| s.oldest = s.rv);
    }

    /// Sends a BOOKMARK with the current resourceVersion on every open watch that allows them.
    pub fn bookmark(&self) {
        self.shared.change(|s| s.bookmarks += 1);
    }

    /// Ends the open watches of `K` and holds its new list and watch requests until
    /// [`FakeApiServer::reconnect`] (a client cut off from the server for a while).
    pub fn disconnect<K: Resource<DynamicType = ()>>(&self) {
        let kind = kind_of::<K>();
        self.shared.change(|s| {
            s.held.insert(kind.plural);
            *s.cuts.entry(kind.plural).or_default() += 1;
        });
    }

    /// Lets the list and watch requests of `K` through again.
    pub fn reconnect<K: Resource<DynamicType = ()>>(&self) {
        let kind = kind_of::<K>();
        self.shared.change(|s| s.held.remove(kind.plural));
    }

    /// Makes `K` a resource this server does not have, as a cluster without its CRD: its
    /// open watches end and every request for it is answered `404 NotFound` until
    /// [`FakeApiServer::serve`]. Its objects are kept, and [`FakeApiServer::put`] still
    /// works: the test plays whoever installs the CRD and creates objects with it.
    pub fn unserve<K: Resource<DynamicType = ()>>(&self) {
        self.refuse(kind_of::<K>(), StatusCode::NOT_FOUND);
    }

    /// Refuses every request for `K` with `403 Forbidden` (a ClusterRole without it)
    /// until [`FakeApiServer::serve`]; its open watches end.
    pub fn forbid<K: Resource<DynamicType = ()>>(&self) {
        self.refuse(kind_of::<K>(), StatusCode::FORBIDDEN);
    }

    /// Answers the requests for `K` again (after [`FakeApiServer::unserve`] or
    /// [`FakeApiServer::forbid`]).
    pub fn serve<K: Resource<DynamicType = ()>>(&self) {
        let kind = kind_of::<K>();
        self.shared.change(|s| s.refused.remove(kind.plural));
    }

    fn refuse(&self, kind: &'static Kind, code: StatusCode) {
        self.shared.change(|s| {
            s.refused.insert(kind.plural, code);
            *s.cuts.entry(kind.plural).or_default() += 1;
        });
    }

    /// How many requests or answers were logged as exactly `what`: `list P`, `watch P`,
    /// `get P`, `patch P` (`patch P/status`), `expired P` (a 410 sent), `bookmark P`,
    /// where `P` is the plural (`topologies`, `nodes`, `wirestates`, `pods`,
    /// `namespaces`, `networkpolicies`, `clusternetworkpolicies`). A request refused
    /// (see [`FakeApiServer::unserve`]) is logged as asked.
    pub fn count(&self, what: &str) -> usize {
        self.shared.store().log.iter().filter(|l| *l == what).count()
    }

    /// Everything logged so far (see [`FakeApiServer::count`]), oldest first.
    pub fn log(&self) -> Vec<String> {
        self.shared.store().log.clone()
    }

    /// Serves this server over HTTPS on `listener` until the returned endpoint is
    /// dropped, as a real API server is reached from a pod: TLS with a server
    /// certificate for the listener's address (and the `kubernetes.default.svc` names)
    /// issued by a fresh test CA, and every request carrying `Authorization: Bearer
    /// <token>`; one without is answered `401` and logged as `unauthorized`.
    ///
    /// Bind the listener to the address clients use (not a wildcard): it may live in any
    /// network namespace. Must be called within a Tokio runtime, which serves it.
    pub fn serve_https(&self, listener: std::net::TcpListener, token: &str) -> std::io::Result<HttpsEndpoint> {
        let addr = listener.local_addr()?;
        let (ca_pem, cert, key) = test_certificates(addr.ip()).map_err(std::io::Error::other)?;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(std::io::Error::other)?
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .map_err(std::io::Error::other)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let auth = Auth {
            shared: self.shared.clone(),
            expected: format!("Bearer {token}"),
        };
        let app = self
            .router()
            .layer(axum::middleware::from_fn_with_state(auth, authorize));
        let task = tokio::spawn(async move {
            // Dropped with the task: every open connection (and watch) ends with it.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let tcp = match listener.accept().await {
                    Ok((tcp, _)) => tcp,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
                // Reap the finished ones so a long test does not pile them up.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(HttpsEndpoint {
            addr,
            ca_pem,
            token: token.to_string(),
            task,
        })
    }
}

/// The fake API server served over HTTPS ([`FakeApiServer::serve_https`]); dropping it
/// stops serving and closes every connection.
pub struct HttpsEndpoint {
    /// Where it listens (a pod's `KUBERNETES_SERVICE_HOST` and `_PORT`).
    pub addr: std::net::SocketAddr,
    /// The test CA's certificate, PEM: a pod's service-account `ca.crt`.
    pub ca_pem: String,
    /// The bearer token requests must carry: a pod's service-account `token`.
    pub token: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A CA (self-signed) and a server certificate it issued for `ip` and the in-cluster
/// names of the API service: (CA PEM, server certificate DER, server key DER).
fn test_certificates(
    ip: std::net::IpAddr,
) -> Result<
    (
        String,
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ),
    rcgen::Error,
> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "weft test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);

    let names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut server = CertificateParams::new(names.map(String::from).to_vec())?;
    server.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    server.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = server.signed_by(&key, &issuer)?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    Ok((ca_pem, cert.der().clone(), key))
}

/// What [`authorize`] checks requests against.
#[derive(Clone)]
struct Auth {
    shared: Arc<Shared>,
    expected: String,
}

/// Lets a request through only with the expected bearer token, as the API server's
/// authentication does.
async fn authorize(
    AxumState(auth): AxumState<Auth>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if given != Some(auth.expected.as_str()) {
        auth.shared.store().log.push("unauthorized".to_string());
        return failure(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    next.run(request).await
}

fn object_key(kind: &'static Kind, namespace: Option<&str>, name: &str) -> Key {
    let ns = if kind.namespaced {
        namespace.unwrap_or("default")
    } else {
        ""
    };
    (kind.plural, ns.to_string(), name.to_string())
}

/// What a request is about, from its path.
struct Target {
    kind: &'static Kind,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

/// Parses `[namespaces/NS/]PLURAL[/NAME[/status]]` under `api_version`.
fn target(api_version: &str, rest: &str) -> Option<Target> {
    let mut segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let mut namespace = None;
    // `namespaces/NS/status` is a Namespace's status, not a kind `status` in NS.
    let in_namespace = segs.len() >= 3
        && segs[0] == "namespaces"
        && (KINDS.iter()).any(|k| k.namespaced && k.api_version == api_version && k.plural == segs[2]);
    if in_namespace {
        namespace = Some(segs[1].to_string());
        segs.drain(..2);
    }
    let kind = KINDS
        .iter()
        .find(|k| k.api_version == api_version && Some(&k.plural) == segs.first())?;
    let status = match segs.get(2) {
        None => false,
        Some(&"status") if segs.len() == 3 => true,
        Some(_) => return None,
    };
    if namespace.is_some() && !kind.namespaced {
        return None;
    }
    Some(Target {
        kind,
        namespace,
        name: segs.get(1).map(|s| s.to_string()),
        status,
    })
}

/// Which objects a list or watch wants.
struct Filter {
    kind: &'static Kind,
    namespace: Option<String>,
    /// `(JSON pointer, value)` pairs from the field selector.
    fields: Vec<(String, String)>,
}

impl Filter {
    fn new(t: &Target, selector: Option<&String>) -> Result<Filter, String> {
        let mut fields = Vec::new();
        for term in selector.map(|s| s.split(',')).into_iter().flatten() {
            let (path, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .filter(|(path, _)| !path.ends_with('!'))
                .ok_or_else(|| format!("unsupported field selector term {term:?}"))?;
            fields.push((format!("/{}", path.replace('.', "/")), value.to_string()));
        }
        Ok(Filter {
            kind: t.kind,
            namespace: t.namespace.clone(),
            fields,
        })
    }

    fn matches(&self, plural: &str, object: &Value) -> bool {
        let at = |p: &str| {
            object
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        plural == self.kind.plural
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| at("/metadata/namespace") == *ns)
            && self.fields.iter().all(|(p, v)| at(p) == *v)
    }
}

/// The one handler: routes on the parsed path and the method.
async fn serve(
    AxumState(shared): AxumState<Arc<Shared>>,
    Path(params): Path<HashMap<String, String>>,
    method: Method,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let api_version = match params.get("group") {
        Some(group) => format!("{group}/{}", params["version"]),
        None => params["version"].clone(),
    };
    let Some(t) = target(&api_version, &params["rest"]) else {
        return failure(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    match (method, &t.name) {
        (Method::GET, None) => match Filter::new(&t, query.get("fieldSelector")) {
            Ok(filter) if watching => watch_objects(shared, filter, &query).await,
            Ok(filter) => list(shared, filter).await,
            Err(e) => failure(StatusCode::BAD_REQUEST, "BadRequest", &e),
        },
        (Method::GET, Some(name)) => {
            let mut store = shared.store();
            store.log.push(format!("get {}", t.kind.plural));
            if let Some(refused) = refusal(&store, t.kind, "get") {
                return refused;
            }
            match store.objects.get(&object_key(t.kind, t.namespace.as_deref(), name)) {
                Some(object) => reply(StatusCode::OK, object),
                None => not_found(&t, name),
            }
        }
        (Method::PATCH, Some(name)) => patch(&shared, &t, name, &query, &headers, &body),
        _ => failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "not supported by the fake",
        ),
    }
}

async fn list(shared: Arc<Shared>, filter: Filter) -> Response {
    shared.store().log.push(format!("list {}", filter.kind.plural));
    shared.connected(filter.kind).await;
    if let Some(refused) = refusal(&shared.store(), filter.kind, "list") {
        return refused;
    }
    let store = shared.store();
    let items: Vec<&Value> = (store.objects.iter())
        .filter(|((plural, _, _), o)| filter.matches(plural, o))
        .map(|(_, o)| o)
        .collect();
    let list = json!({
        "apiVersion": filter.kind.api_version,
        "kind": format!("{}List", filter.kind.kind),
        "metadata": { "resourceVersion": store.rv.to_string() },
        "items": items,
    });
    reply(StatusCode::OK, &list)
}

/// An open watch: where it is in the history and what it still has to send.
struct Cursor {
    shared: Arc<Shared>,
    filter: Filter,
    changed: watch::Receiver<()>,
    /// The resourceVersion up to which changes were looked at.
    at: u64,
    /// For a watch without a resourceVersion: the current objects, sent as ADDED first.
    initial: VecDeque<Value>,
    /// A 410 to send, then end.
    expired: Option<Value>,
    /// Nothing more to send (after a 410).
    done: bool,
    /// The resource's `disconnect` generation when the watch opened: a newer one ends it.
    cut: u64,
    /// The last `bookmark` generation sent, if the client allows bookmarks.
    bookmarks: Option<u64>,
    /// When `timeoutSeconds` runs out and the server closes the watch.
    deadline: Instant,
}

enum Next {
    Line(Value),
    Wait,
    End,
}

impl Cursor {
    /// The next event to send, without waiting.
    fn next(&mut self) -> Next {
        let mut store = self.shared.store();
        self.changed.borrow_and_update();
        let plural = self.filter.kind.plural;
        if self.done || store.cut(self.filter.kind) != self.cut {
            return Next::End;
        }
        if let Some(status) = self.expired.take() {
            self.done = true;
            store.log.push(format!("expired {plural}"));
            return Next::Line(json!({ "type": "ERROR", "object": status }));
        }
        if let Some(object) = self.initial.pop_front() {
            return Next::Line(json!({ "type": "ADDED", "object": object }));
        }
        let at = self.at;
        let change = (store.history.iter()).find(|c| c.rv > at && self.filter.matches(c.plural, &c.object));
        if let Some(c) = change {
            self.at = c.rv;
            return Next::Line(json!({ "type": c.kind, "object": c.object }));
        }
        self.at = store.rv;
        match self.bookmarks {
            Some(seen) if seen < store.bookmarks => {
                self.bookmarks = Some(store.bookmarks);
                store.log.push(format!("bookmark {plural}"));
                let kind = self.filter.kind;
                let object = json!({
                    "apiVersion": kind.api_version,
                    "kind": kind.kind,
                    "metadata": { "resourceVersion": store.rv.to_string() },
                });
                Next::Line(json!({ "type": "BOOKMARK", "object": object }))
            }
            _ => Next::Wait,
        }
    }
}

async fn watch_objects(shared: Arc<Shared>, filter: Filter, query: &HashMap<String, String>) -> Response {
    let plural = filter.kind.plural;
    shared.store().log.push(format!("watch {plural}"));
    shared.connected(filter.kind).await;
    if let Some(refused) = refusal(&shared.store(), filter.kind, "watch") {
        return refused;
    }
    let from = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse::<u64>().ok())
        .filter(|&rv| rv > 0);
    let timeout = query.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(1800);
    let store = shared.store();
    let mut cursor = Cursor {
        shared: shared.clone(),
        changed: shared.changed.subscribe(),
        at: from.unwrap_or(store.rv),
        initial: VecDeque::new(),
        expired: None,
        done: false,
        cut: store.cut(filter.kind),
        bookmarks: (query.get("allowWatchBookmarks").map(String::as_str) == Some("true")).then_some(store.bookmarks),
        deadline: Instant::now() + Duration::from_secs(timeout),
        filter,
    };
    match from {
        Some(rv) if rv < store.oldest => {
            cursor.expired = Some(status_object(
                StatusCode::GONE,
                "Expired",
                &format!("too old resource version: {rv} ({})", store.oldest),
            ));
        }
        Some(_) => {}
        None => {
            cursor.initial = (store.objects.iter())
                .filter(|((p, _, _), o)| cursor.filter.matches(p, o))
                .map(|(_, o)| o.clone())
                .collect();
        }
    }
    drop(store);
    let lines = futures::stream::unfold(cursor, |mut cursor| async move {
        loop {
            match cursor.next() {
                Next::Line(event) => {
                    let mut line = serde_json::to_vec(&event).expect("event serializes");
                    line.push(b'\n');
                    return Some((Ok::<_, Infallible>(Bytes::from(line)), cursor));
                }
                Next::End => return None,
                Next::Wait => {
                    let (deadline, changed) = (cursor.deadline, &mut cursor.changed);
                    match tokio::time::timeout_at(deadline, changed.changed()).await {
                        Ok(Ok(())) => {}
                        _ => return None,
                    }
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(lines))
        .expect("a valid response")
}

fn patch(
    shared: &Shared,
    t: &Target,
    name: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let subresource = if t.status { "/status" } else { "" };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let apply = match content_type {
        "application/merge-patch+json" => false,
        "application/apply-patch+yaml" => true,
        other => {
            let msg = format!("the body of the request was in an unknown format: {other}");
            return failure(StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType", &msg);
        }
    };
    if apply && query.get("fieldManager").is_none_or(|m| m.is_empty()) {
        let msg = "PATCH requests with apply content type must have fieldManager set";
        return failure(StatusCode::BAD_REQUEST, "BadRequest", msg);
    }
    // JSON is YAML, so one parser reads both.
    let patch: Value = match serde_yaml_ng::from_slice(body) {
        Ok(Value::Object(p)) => Value::Object(p),
        Ok(_) => return failure(StatusCode::BAD_REQUEST, "BadRequest", "the patch is not an object"),
        Err(e) => return failure(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let key = object_key(t.kind, t.namespace.as_deref(), name);
    shared.change(|store| {
        store.log.push(format!("patch {}{subresource}", t.kind.plural));
        if let Some(refused) = refusal(store, t.kind, "patch") {
            return refused;
        }
        // `/status` changes only the status; the object itself, everything but the status.
        let mut object = match store.objects.get(&key) {
            // Server-side apply of the object itself creates it.
            None if apply && !t.status => with_status(patch, None),
            None => return not_found(t, name),
            Some(current) => {
                // Create-or-replace stands in for a real field-wise apply.
                let new = if apply { patch } else { merged(current, &patch) };
                if t.status {
                    with_status(current.clone(), new.get("status").cloned())
                } else {
                    with_status(new, current.get("status").cloned())
                }
            }
        };
        object["metadata"]["name"] = name.into();
        if let Some(ns) = &t.namespace {
            object["metadata"]["namespace"] = ns.as_str().into();
        }
        let stored = store.write(t.kind, object);
        reply(StatusCode::OK, &stored)
    })
}

fn with_status(mut object: Value, status: Option<Value>) -> Value {
    let fields = object.as_object_mut().expect("an object");
    match status {
        Some(status) => fields.insert("status".into(), status),
        None => fields.remove("status"),
    };
    object
}

fn merged(target: &Value, patch: &Value) -> Value {
    let mut target = target.clone();
    merge(&mut target, patch);
    target
}

/// RFC 7386 JSON merge patch: `null` removes, objects merge, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("made an object");
    for (k, v) in fields {
        if v.is_null() {
            target.remove(k);
        } else {
            merge(target.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn reply(code: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).expect("JSON serializes")))
        .expect("a valid response")
}

/// A `Status` object, as the API server reports failures.
fn status_object(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
}

fn failure(code: StatusCode, reason: &str, message: &str) -> Response {
    reply(code, &status_object(code, reason, message))
}

/// The answer to a request for `kind` while it is refused (see
/// [`FakeApiServer::unserve`]), worded as the API server words it.
fn refusal(store: &Store, kind: &Kind, verb: &str) -> Option<Response> {
    let code = *store.refused.get(kind.plural)?;
    if code == StatusCode::NOT_FOUND {
        return Some(failure(
            code,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let group = kind.api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let resource = match group {
        "" => kind.plural.to_string(),
        group => format!("{}.{group}", kind.plural),
    };
    let message = format!(
        "{resource} is forbidden: User \"system:serviceaccount:kube-system:weft\" cannot {verb} resource \
         \"{}\" in API group \"{group}\" at the cluster scope",
        kind.plural
    );
    Some(failure(code, "Forbidden", &message))
}

fn not_found(t: &Target, name: &str) -> Response {
    let group = t
        .kind
        .api_version
        .rsplit_once('/')
        .map(|(g, _)| format!(".{g}"))
        .unwrap_or_default();
    let message = format!("{}{group} \"{name}\" not found", t.kind.plural);
    failure(StatusCode::NOT_FOUND, "NotFound", &message)
}

#[cfg(test)]
mod tests {
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
}
