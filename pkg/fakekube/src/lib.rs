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
//! The test changes objects with [`FakeApiServer::put`] (or [`FakeApiServer::put_json`],
//! for an object with fields no Rust type has) and [`FakeApiServer::delete`], reads them
//! back with [`FakeApiServer::get`], cuts the watches of one resource with
//! [`FakeApiServer::disconnect`], takes a resource away as a cluster without its CRD
//! ([`FakeApiServer::unserve`], 404) or without the RBAC to read it
//! ([`FakeApiServer::forbid`], 403) until [`FakeApiServer::serve`], and checks what
//! clients asked with [`FakeApiServer::count`].
//!
//! ClusterNetworkPolicy is served at two versions, `policy.networking.k8s.io/v1beta1` and
//! `v1alpha2`, as one resource: as a real API server does for a CRD with several served
//! versions and no conversion webhook, an object written at either version is stored
//! once and listed, got and watched at every version served, its `apiVersion` rewritten
//! to the one asked for. Both are served at first; [`FakeApiServer::unserve_version`]
//! and [`FakeApiServer::serve_version`] change that one version at a time (a cluster
//! whose CRD serves one version, or where a version is added later).
//!
//! A client in the test process gets the router itself ([`FakeApiServer::client`]); a
//! process the test starts (weftd in a container, say) reaches it as a pod reaches the
//! real API server, over HTTPS with a bearer token, through
//! [`FakeApiServer::serve_https`]: a certificate from a fresh test CA, whose PEM goes
//! into the pod's `ca.crt`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::any;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;

mod http;
mod https;

use http::{object_key, serve};
pub use https::HttpsEndpoint;
use https::{Auth, authorize, test_certificates};

/// A resource the server knows.
struct Kind {
    api_version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
}

impl Kind {
    /// The version part of the apiVersion (`v1`, `v1beta1`).
    fn version(&self) -> &'static str {
        self.api_version.rsplit('/').next().unwrap_or(self.api_version)
    }

    /// This resource at this version, as refusals and watch cuts are kept: a resource
    /// served at several versions is one plural (one store) with one entry per version.
    fn id(&self) -> KindId {
        (self.plural, self.api_version)
    }
}

/// (plural, apiVersion): one served version of a resource.
type KindId = (&'static str, &'static str);

const KINDS: [Kind; 8] = [
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
    // One resource at two versions (see the module doc); v1beta1 is the Rust type's.
    Kind {
        api_version: "policy.networking.k8s.io/v1beta1",
        kind: "ClusterNetworkPolicy",
        plural: "clusternetworkpolicies",
        namespaced: false,
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

/// Every served version of the resource `kind` is one of.
fn versions_of(kind: &Kind) -> impl Iterator<Item = &'static Kind> + '_ {
    KINDS.iter().filter(move |k| k.plural == kind.plural)
}

/// The resource of Rust type `K` at `version` (panics for one the server does not serve).
fn kind_at<K: Resource<DynamicType = ()>>(version: &str) -> &'static Kind {
    let kind = kind_of::<K>();
    versions_of(kind)
        .find(|k| k.version() == version)
        .unwrap_or_else(|| panic!("the fake API server does not serve {} at {version}", kind.kind))
}

/// The served resource an object names with its `apiVersion` and `kind` (panics for one
/// the server does not serve).
fn kind_of_json(object: &Value) -> &'static Kind {
    let field = |f: &str| object[f].as_str().unwrap_or_default();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    KINDS
        .iter()
        .find(|k| k.api_version == api_version && k.kind == kind)
        .unwrap_or_else(|| panic!("the fake API server does not serve {kind} at {api_version:?}"))
}

/// `object` as the API server answers it at `kind`'s version: a resource served at
/// several versions is stored once, and each version shows its own `apiVersion`.
pub(crate) fn at_version(kind: &Kind, mut object: Value) -> Value {
    if let Some(fields) = object.as_object_mut() {
        fields.insert("apiVersion".into(), kind.api_version.into());
    }
    object
}

/// One line of the request log, with the apiVersion it was at (none for `unauthorized`).
struct Logged {
    line: String,
    api_version: Option<&'static str>,
}

impl Logged {
    /// The line with its version, `list clusternetworkpolicies@v1beta1`.
    fn versioned(&self) -> String {
        match self.api_version {
            Some(v) => format!("{}@{}", self.line, v.rsplit('/').next().unwrap_or(v)),
            None => self.line.clone(),
        }
    }
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
    /// Per resource version, bumped by `disconnect` and `unserve`: open watches of an
    /// older generation end.
    cuts: BTreeMap<KindId, u64>,
    /// Resources whose list and watch requests wait (see `disconnect`).
    held: BTreeSet<&'static str>,
    /// Resource versions every request of which is refused with this code (see `unserve`).
    refused: BTreeMap<KindId, StatusCode>,
    /// What clients asked and what they were answered, e.g. "list topologies".
    log: Vec<Logged>,
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
        self.cuts.get(&kind.id()).copied().unwrap_or_default()
    }

    /// Logs a request (or answer) about `kind`: `what` and its plural (`list pods`).
    pub(crate) fn note(&mut self, what: &str, kind: &Kind, suffix: &str) {
        self.log.push(Logged {
            line: format!("{what} {}{suffix}", kind.plural),
            api_version: Some(kind.api_version),
        });
    }

    /// Logs something about no resource (`unauthorized`).
    pub(crate) fn note_plain(&mut self, line: &str) {
        self.log.push(Logged {
            line: line.to_string(),
            api_version: None,
        });
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

    /// Creates or replaces an object given as JSON, of the resource and version its
    /// `apiVersion` and `kind` name (panics for one the server does not serve), kept as
    /// given: fields no Rust type has, or of the wrong type, are stored and served as
    /// they are (a CRD's schema may allow what a client's types do not). Returns it as
    /// stored, with its uid and new resourceVersion.
    pub fn put_json(&self, object: Value) -> Value {
        let kind = kind_of_json(&object);
        self.shared.change(|s| s.write(kind, object))
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

    /// An object as stored, as raw JSON (to see exactly which fields are set), at `K`'s
    /// version.
    pub fn get_json<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) -> Option<Value> {
        let kind = kind_of::<K>();
        let object = (self.shared.store().objects)
            .get(&object_key(kind, namespace, name))
            .cloned()?;
        Some(at_version(kind, object))
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

    /// Ends the open watches of `K` (at every version) and holds its new list and watch
    /// requests until [`FakeApiServer::reconnect`] (a client cut off from the server for
    /// a while).
    pub fn disconnect<K: Resource<DynamicType = ()>>(&self) {
        let kind = kind_of::<K>();
        self.shared.change(|s| {
            s.held.insert(kind.plural);
            for v in versions_of(kind) {
                *s.cuts.entry(v.id()).or_default() += 1;
            }
        });
    }

    /// Lets the list and watch requests of `K` through again.
    pub fn reconnect<K: Resource<DynamicType = ()>>(&self) {
        let kind = kind_of::<K>();
        self.shared.change(|s| s.held.remove(kind.plural));
    }

    /// Makes `K` a resource this server does not have, at any version, as a cluster
    /// without its CRD: its open watches end and every request for it is answered `404
    /// NotFound` until [`FakeApiServer::serve`]. Its objects are kept, and
    /// [`FakeApiServer::put`] still works: the test plays whoever installs the CRD and
    /// creates objects with it.
    pub fn unserve<K: Resource<DynamicType = ()>>(&self) {
        self.refuse(versions_of(kind_of::<K>()), StatusCode::NOT_FOUND);
    }

    /// Stops serving `K` at `version` only (`v1alpha2`), as a CRD whose version is not
    /// (or no longer) served: requests at it are answered `404 NotFound` and its open
    /// watches end, the other versions go on, and the objects stay (they are the other
    /// versions' too) until [`FakeApiServer::serve_version`] or
    /// [`FakeApiServer::serve`]. Panics for a version the server does not know for `K`.
    pub fn unserve_version<K: Resource<DynamicType = ()>>(&self, version: &str) {
        self.refuse([kind_at::<K>(version)].into_iter(), StatusCode::NOT_FOUND);
    }

    /// Serves `K` at `version` again (a version added to the CRD): its objects are listed
    /// and watched at it, whichever version they were written at. Panics for a version
    /// the server does not know for `K`.
    pub fn serve_version<K: Resource<DynamicType = ()>>(&self, version: &str) {
        let id = kind_at::<K>(version).id();
        self.shared.change(|s| s.refused.remove(&id));
    }

    /// Refuses every request for `K`, at every version, with `403 Forbidden` (a
    /// ClusterRole without it: RBAC is per resource, not per version) until
    /// [`FakeApiServer::serve`]; its open watches end.
    pub fn forbid<K: Resource<DynamicType = ()>>(&self) {
        self.refuse(versions_of(kind_of::<K>()), StatusCode::FORBIDDEN);
    }

    /// Answers the requests for `K` again, at every version (after
    /// [`FakeApiServer::unserve`], [`FakeApiServer::unserve_version`] or
    /// [`FakeApiServer::forbid`]).
    pub fn serve<K: Resource<DynamicType = ()>>(&self) {
        let kind = kind_of::<K>();
        self.shared.change(|s| {
            for v in versions_of(kind) {
                s.refused.remove(&v.id());
            }
        });
    }

    fn refuse(&self, kinds: impl Iterator<Item = &'static Kind>, code: StatusCode) {
        self.shared.change(|s| {
            for kind in kinds {
                s.refused.insert(kind.id(), code);
                *s.cuts.entry(kind.id()).or_default() += 1;
            }
        });
    }

    /// How many requests or answers were logged as exactly `what`: `list P`, `watch P`,
    /// `get P`, `patch P` (`patch P/status`), `expired P` (a 410 sent), `bookmark P`,
    /// where `P` is the plural (`topologies`, `nodes`, `wirestates`, `pods`,
    /// `namespaces`, `networkpolicies`, `clusternetworkpolicies`), at any version; with
    /// `@V` after it (`list clusternetworkpolicies@v1alpha2`), those at version `V` only.
    /// A request refused (see [`FakeApiServer::unserve`]) is logged as asked.
    pub fn count(&self, what: &str) -> usize {
        let store = self.shared.store();
        let log = store.log.iter();
        if what.contains('@') {
            log.filter(|l| l.versioned() == what).count()
        } else {
            log.filter(|l| l.line == what).count()
        }
    }

    /// Everything logged so far (see [`FakeApiServer::count`]), oldest first, without
    /// versions (`list clusternetworkpolicies`).
    pub fn log(&self) -> Vec<String> {
        self.shared.store().log.iter().map(|l| l.line.clone()).collect()
    }

    /// [`FakeApiServer::log`] with the version of each request
    /// (`list clusternetworkpolicies@v1beta1`).
    pub fn versioned_log(&self) -> Vec<String> {
        self.shared.store().log.iter().map(Logged::versioned).collect()
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

#[cfg(test)]
mod tests;
