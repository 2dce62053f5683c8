//! Answering requests: the path and query parsed into a target, then LIST, WATCH, GET,
//! PATCH and apply, and the Status objects of failures.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{KINDS, Key, Kind, Shared, Store, at_version};

pub(crate) fn object_key(kind: &'static Kind, namespace: Option<&str>, name: &str) -> Key {
    let ns = if kind.namespaced {
        namespace.unwrap_or("default")
    } else {
        ""
    };
    (kind.plural, ns.to_string(), name.to_string())
}

/// What a request is about, from its path.
pub(crate) struct Target {
    kind: &'static Kind,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

/// Parses `[namespaces/NS/]PLURAL[/NAME[/status]]` under `api_version`.
pub(crate) fn target(api_version: &str, rest: &str) -> Option<Target> {
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
pub(crate) struct Filter {
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
pub(crate) async fn serve(
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
            store.note("get", t.kind, "");
            if let Some(refused) = refusal(&store, t.kind, "get") {
                return refused;
            }
            match store.objects.get(&object_key(t.kind, t.namespace.as_deref(), name)) {
                Some(object) => reply(StatusCode::OK, &at_version(t.kind, object.clone())),
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

pub(crate) async fn list(shared: Arc<Shared>, filter: Filter) -> Response {
    shared.store().note("list", filter.kind, "");
    shared.connected(filter.kind).await;
    if let Some(refused) = refusal(&shared.store(), filter.kind, "list") {
        return refused;
    }
    let store = shared.store();
    let items: Vec<Value> = (store.objects.iter())
        .filter(|((plural, _, _), o)| filter.matches(plural, o))
        .map(|(_, o)| at_version(filter.kind, o.clone()))
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
pub(crate) struct Cursor {
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

pub(crate) enum Next {
    Line(Value),
    Wait,
    End,
}

impl Cursor {
    /// The next event to send, without waiting.
    fn next(&mut self) -> Next {
        let mut store = self.shared.store();
        self.changed.borrow_and_update();
        if self.done || store.cut(self.filter.kind) != self.cut {
            return Next::End;
        }
        if let Some(status) = self.expired.take() {
            self.done = true;
            store.note("expired", self.filter.kind, "");
            return Next::Line(json!({ "type": "ERROR", "object": status }));
        }
        if let Some(object) = self.initial.pop_front() {
            let object = at_version(self.filter.kind, object);
            return Next::Line(json!({ "type": "ADDED", "object": object }));
        }
        let at = self.at;
        let change = (store.history.iter()).find(|c| c.rv > at && self.filter.matches(c.plural, &c.object));
        if let Some(c) = change {
            self.at = c.rv;
            let object = at_version(self.filter.kind, c.object.clone());
            return Next::Line(json!({ "type": c.kind, "object": object }));
        }
        self.at = store.rv;
        match self.bookmarks {
            Some(seen) if seen < store.bookmarks => {
                self.bookmarks = Some(store.bookmarks);
                store.note("bookmark", self.filter.kind, "");
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

pub(crate) async fn watch_objects(shared: Arc<Shared>, filter: Filter, query: &HashMap<String, String>) -> Response {
    // The bookmarks as the request arrives: one the server makes after it was logged is
    // this watch's too, however long the request then takes to be served.
    let bookmarks_at_request = {
        let mut store = shared.store();
        store.note("watch", filter.kind, "");
        store.bookmarks
    };
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
        bookmarks: (query.get("allowWatchBookmarks").map(String::as_str) == Some("true"))
            .then_some(bookmarks_at_request),
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

pub(crate) fn patch(
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
        store.note("patch", t.kind, subresource);
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

pub(crate) fn with_status(mut object: Value, status: Option<Value>) -> Value {
    let fields = object.as_object_mut().expect("an object");
    match status {
        Some(status) => fields.insert("status".into(), status),
        None => fields.remove("status"),
    };
    object
}

pub(crate) fn merged(target: &Value, patch: &Value) -> Value {
    let mut target = target.clone();
    merge(&mut target, patch);
    target
}

/// RFC 7386 JSON merge patch: `null` removes, objects merge, anything else replaces.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
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

pub(crate) fn reply(code: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).expect("JSON serializes")))
        .expect("a valid response")
}

/// A `Status` object, as the API server reports failures.
pub(crate) fn status_object(code: StatusCode, reason: &str, message: &str) -> Value {
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

pub(crate) fn failure(code: StatusCode, reason: &str, message: &str) -> Response {
    reply(code, &status_object(code, reason, message))
}

/// The answer to a request for `kind` while it is refused (see
/// [`FakeApiServer::unserve`]), worded as the API server words it.
pub(crate) fn refusal(store: &Store, kind: &Kind, verb: &str) -> Option<Response> {
    let code = *store.refused.get(&kind.id())?;
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

pub(crate) fn not_found(t: &Target, name: &str) -> Response {
    let group = t
        .kind
        .api_version
        .rsplit_once('/')
        .map(|(g, _)| format!(".{g}"))
        .unwrap_or_default();
    let message = format!("{}{group} \"{name}\" not found", t.kind.plural);
    failure(StatusCode::NOT_FOUND, "NotFound", &message)
}
