//! Checks of what a lab file and `weftctl lab label/apply` give: label keys and values,
//! pods, namespaces and policies, as the API server would check them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::Value;
use weft_policy::problem::Cause;
use weft_topology::Strict;

use crate::spec::{NamespaceSpec, PodSpec};

/// Whether `s` is a DNS label (a namespace's name): 1-63 lower-case letters, digits or
/// '-', starting and ending with a letter or digit.
pub(super) fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS subdomain (an object's name, a label key's prefix).
pub(super) fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

/// A label's name part or value: 1-63 letters, digits, '-', '_' or '.', starting and
/// ending with a letter or digit.
pub(super) fn label_word(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Checks a label (or annotation) key as the API server does: `[prefix/]name`.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let ok = match k.split_once('/') {
        Some((prefix, name)) => !prefix.is_empty() && dns_subdomain(prefix) && label_word(name),
        None => label_word(k),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "label key {k:?}: an optional DNS prefix and '/', then 1-63 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// Checks a label value as the API server does (it may be empty).
pub fn check_label_value(k: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || label_word(v) {
        Ok(())
    } else {
        Err(format!(
            "label {k}={v:?}: values are empty or 1-63 letters, digits, '-', '_' or '.'"
        ))
    }
}

pub(super) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in labels {
        check_label_key(k)?;
        check_label_value(k, v)?;
    }
    Ok(())
}

/// Checks a pod's namespace, labels and ports, and writes its port protocols in
/// capitals, as the API has them.
pub(crate) fn check_pod(p: &mut PodSpec) -> Result<(), String> {
    if let Some(ns) = &p.namespace
        && !dns_label(ns)
    {
        return Err(format!("namespace {ns:?}: 1-63 lower-case letters, digits or '-'"));
    }
    check_labels(&p.labels)?;
    let mut names = BTreeSet::new();
    for port in &mut p.ports {
        port.protocol = port.protocol.to_ascii_uppercase();
        if !["TCP", "UDP", "SCTP"].contains(&port.protocol.as_str()) {
            return Err(format!(
                "port {}: protocol {:?} is not TCP, UDP or SCTP",
                port.container_port, port.protocol
            ));
        }
        if port.container_port == 0 {
            return Err("port 0: containerPort is 1 to 65535".into());
        }
        if port.name.is_empty() {
            continue;
        }
        // IANA_SVC_NAME, what a container port's name must be.
        let n = &port.name;
        let ok = n.len() <= 15
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && n.bytes().any(|b| b.is_ascii_lowercase())
            && !n.starts_with('-')
            && !n.ends_with('-')
            && !n.contains("--");
        if !ok {
            return Err(format!(
                "port name {n:?}: 1-15 lower-case letters, digits or '-', with a letter"
            ));
        }
        if !names.insert(n.clone()) {
            return Err(format!("port name {n:?} given twice"));
        }
    }
    Ok(())
}

/// Checks the lab file's `namespaces`.
pub(crate) fn check_namespaces(namespaces: &[NamespaceSpec]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for n in namespaces {
        if !dns_label(&n.name) || !seen.insert(&n.name) {
            return Err(format!(
                "namespace {:?}: names are unique, 1-63 lower-case letters, digits or '-'",
                n.name
            ));
        }
        check_labels(&n.labels).map_err(|e| format!("namespace {}: {e}", n.name))?;
        for k in n.annotations.keys() {
            check_label_key(k).map_err(|e| format!("namespace {}: annotation {e}", n.name))?;
        }
    }
    Ok(())
}

/// A policy's key as `lab apply` says it: `networkpolicy x/deny`,
/// `clusternetworkpolicy admin`.
pub(crate) fn shown(key: &str) -> String {
    match key.strip_prefix("clusternetworkpolicy/") {
        Some(name) => format!("clusternetworkpolicy {name}"),
        None => format!("networkpolicy {key}"),
    }
}

/// The kind of a cluster-wide policy the lab takes beside NetworkPolicy.
pub(super) const CNP_KIND: &str = "ClusterNetworkPolicy";

/// The apiVersions the lab takes a ClusterNetworkPolicy at, as an error names them:
/// those weftd reads ([`weft_topology::cnp::CNP_VERSIONS`], checked by
/// [`weft_topology::cnp::cnp_api_version_known`]).
pub(super) const CNP_API_VERSION: &str = "policy.networking.k8s.io/v1alpha2 or policy.networking.k8s.io/v1beta1";

/// Whether an object is a ClusterNetworkPolicy (cluster-scoped).
pub(super) fn is_cluster_policy(v: &Value) -> bool {
    v.get("kind").and_then(Value::as_str) == Some(CNP_KIND)
}

/// `<namespace>/<name>` of an object, `clusternetworkpolicy/<name>` of a
/// ClusterNetworkPolicy (cluster-scoped: no namespace, and never one a NetworkPolicy
/// could be mistaken for).
pub(crate) fn object_key(v: &Value) -> String {
    if is_cluster_policy(v) {
        let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        return format!("clusternetworkpolicy/{name}");
    }
    let ns = v
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    format!("{ns}/{name}")
}

/// The NetworkPolicies of one object (a `List` holds several), each with its namespace
/// filled in; any other kind is an error (`what` says where it was).
pub(crate) fn read_policies(v: Value, what: &str) -> Result<Vec<Value>, String> {
    if v.is_null() {
        return Ok(Vec::new());
    }
    if !v.is_object() {
        return Err(format!("{what}: not an object"));
    }
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let api_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    match kind.as_str() {
        "List" => {
            let mut out = Vec::new();
            let items = v.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            for (i, item) in items.into_iter().enumerate() {
                out.extend(read_policies(item, &format!("{what}, item {}", i + 1))?);
            }
            Ok(out)
        }
        "NetworkPolicy" if api_version == "networking.k8s.io/v1" => {
            if !dns_subdomain(name) || name.is_empty() {
                return Err(format!("{what}: NetworkPolicy name {name:?} is not a DNS subdomain"));
            }
            let mut v = v;
            if v.pointer("/metadata/namespace").and_then(Value::as_str).is_none() {
                v["metadata"]["namespace"] = "default".into();
            }
            Ok(vec![v])
        }
        "NetworkPolicy" => Err(format!(
            "{what}: NetworkPolicy {name}: apiVersion {api_version:?} is not networking.k8s.io/v1"
        )),
        CNP_KIND if weft_topology::cnp::cnp_api_version_known(api_version) => {
            if !dns_subdomain(name) || name.is_empty() {
                return Err(format!(
                    "{what}: ClusterNetworkPolicy name {name:?} is not a DNS subdomain"
                ));
            }
            let mut v = v;
            if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("namespace");
            }
            Ok(vec![v])
        }
        CNP_KIND => Err(format!(
            "{what}: ClusterNetworkPolicy {name}: apiVersion {api_version:?} is not {CNP_API_VERSION}"
        )),
        _ => Err(format!(
            "{what}: {} {name}: the lab takes NetworkPolicy and ClusterNetworkPolicy objects only",
            if kind.is_empty() {
                "an object without kind"
            } else {
                &kind
            }
        )),
    }
}

/// The NetworkPolicies of a YAML (or JSON) text of several documents; `what` names it.
pub(crate) fn parse_policies(text: &str, what: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let at = format!("{what}, document {}", i + 1);
        let v = Value::deserialize(doc).map_err(|e| format!("{at}: does not parse: {e}"))?;
        out.extend(read_policies(v, &at)?);
    }
    Ok(out)
}

/// Checks a policy object as the API server would before storing it, and as weftd
/// will read it: its namespace exists, it decodes, and weft reads all of it. A field
/// weft does not know or a value the API refuses is an error naming every such field
/// (the object is refused, as `kubectl apply` with strict validation refuses it); what
/// the API takes but weft does not enforce yet is returned as a warning, with what
/// weft enforces instead.
pub(crate) fn check_policy(v: &Value, namespaces: &BTreeSet<String>) -> Result<Vec<String>, String> {
    let key = object_key(v);
    let read = if is_cluster_policy(v) {
        let c: Strict<weft_topology::ClusterNetworkPolicy> = serde_json::from_value(v.clone())
            .map_err(|e| format!("ClusterNetworkPolicy {key}: not a valid ClusterNetworkPolicy: {e}"))?;
        weft_policy::ClusterPolicy::read(&c).problems
    } else {
        let ns = key.split('/').next().unwrap_or_default();
        if !namespaces.contains(ns) {
            return Err(format!(
                "NetworkPolicy {key}: namespace {ns} is not in the lab (list it under `namespaces`)"
            ));
        }
        let np: Strict<k8s_openapi::api::networking::v1::NetworkPolicy> = serde_json::from_value(v.clone())
            .map_err(|e| format!("NetworkPolicy {key}: not a valid NetworkPolicy: {e}"))?;
        weft_policy::Policy::read(&np).problems
    };
    let (warnings, refused): (Vec<_>, Vec<_>) = read.into_iter().partition(|p| p.cause == Cause::Unsupported);
    if !refused.is_empty() {
        let lines: Vec<String> = refused.iter().map(|p| format!("{}: {}", p.field, p.reason)).collect();
        return Err(format!(
            "{}: refused ({}):\n  {}",
            refused[0].object(),
            if refused.iter().any(|p| p.cause == Cause::UnknownField) {
                "a field weft does not know is never ignored"
            } else {
                "the API server would refuse it"
            },
            lines.join("\n  ")
        ));
    }
    Ok(warnings.iter().map(|p| format!("warning: {p}")).collect())
}

/// A label change of `lab label`: `k=v` sets, `k-` removes.
pub fn parse_label_change(s: &str) -> Result<(String, Option<String>), String> {
    let (k, v) = match s.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => match s.strip_suffix('-') {
            Some(k) => (k, None),
            None => return Err(format!("{s:?}: give KEY=VALUE to set a label or KEY- to remove it")),
        },
    };
    check_label_key(k)?;
    if let Some(v) = &v {
        check_label_value(k, v)?;
    }
    Ok((k.to_string(), v))
}
