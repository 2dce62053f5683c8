//! Parsing topology files: Kubernetes objects in YAML or JSON, several per file; the
//! `Topology` and `Node` objects are kept, and `Pod`, `Namespace`, `NetworkPolicy` and
//! `ClusterNetworkPolicy` objects as network policy reads them; anything unusable is
//! reported and skipped document by document.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde::Deserialize;
use serde_json::Value;

use super::file_err;
use crate::cnp::{CNP_GROUP, CNP_VERSIONS, cnp_api_version_known};
use crate::objects::{slim_cluster_policy, slim_policy};
use crate::strict::{self, Strict};
use crate::{
    ClusterNetworkPolicy, ClusterNode, PolicyNamespace, PolicyPod, SourceError, Topology, UnreadablePolicy, validate,
};

use crate::NAMESPACE_NAME_LABEL;

/// Something in the directory that could not be loaded and was left out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LoadProblem {
    /// The file.
    pub file: PathBuf,
    /// The object or document concerned (`Topology lab/r1`, `document at line 12`), if the
    /// problem is not with the whole file.
    pub object: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for LoadProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.object {
            Some(o) => write!(f, "{}: {o}: {}", self.file.display(), self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// What one topology file holds.
#[derive(Clone, Default, PartialEq)]
pub(super) struct FileObjects {
    /// Topology objects (shared with what is served while the file does not change).
    pub(super) topologies: Vec<Arc<Topology>>,
    /// `Node` objects.
    pub(super) nodes: Vec<ClusterNode>,
    /// `Pod` objects, as policy reads them (shared with the snapshots while the file
    /// does not change).
    pub(super) pods: Vec<Arc<PolicyPod>>,
    /// `Namespace` objects, as policy reads them.
    pub(super) namespaces: Vec<Arc<PolicyNamespace>>,
    /// `networking.k8s.io/v1` NetworkPolicy objects, with only what policy reads and
    /// the fields weft does not know named.
    pub(super) policies: Vec<Arc<Strict<NetworkPolicy>>>,
    /// ClusterNetworkPolicy objects (v1beta1 or v1alpha2), alike.
    pub(super) cluster_policies: Vec<Arc<Strict<ClusterNetworkPolicy>>>,
    /// Policy objects that do not decode.
    pub(super) unreadable: Vec<Arc<UnreadablePolicy>>,
    pub(super) problems: Vec<LoadProblem>,
}

pub(super) fn is_topology_file(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".yaml", ".yml", ".json"]
        .iter()
        .any(|ext| lower.ends_with(ext) && lower.len() > ext.len())
}

/// Reads every Topology of the topology files directly in `dir` (the files a
/// [`DirSource`] would serve, without its status overlay): for tools that describe a lab
/// with such a directory. Returns the valid ones and what was left out.
pub fn read_topologies(dir: &Path) -> Result<(Vec<Topology>, Vec<LoadProblem>), SourceError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| file_err(dir, e))?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| !n.starts_with('.') && is_topology_file(n))
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    let (mut topologies, mut problems) = (Vec::new(), Vec::new());
    for path in files {
        let bytes = std::fs::read(&path).map_err(|e| file_err(&path, e))?;
        let objects = parse_file(&path, &bytes);
        topologies.extend(objects.topologies.into_iter().map(Arc::unwrap_or_clone));
        problems.extend(objects.problems);
    }
    Ok((topologies, problems))
}

/// Parses the Topology objects of one YAML or JSON document stream (`path` names it in
/// problems and tells JSON from YAML by its extension).
pub fn parse_topologies(path: &Path, bytes: &[u8]) -> (Vec<Topology>, Vec<LoadProblem>) {
    let objects = parse_file(path, bytes);
    (
        objects.topologies.into_iter().map(Arc::unwrap_or_clone).collect(),
        objects.problems,
    )
}

/// Parses one file into the objects weft cares about; what cannot be used is reported
/// and skipped, document by document.
pub(super) fn parse_file(path: &Path, bytes: &[u8]) -> FileObjects {
    let mut out = FileObjects::default();
    let problem = |object: Option<String>, reason: String| LoadProblem {
        file: path.to_path_buf(),
        object,
        reason,
    };
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            out.problems.push(problem(None, format!("not UTF-8: {e}")));
            return out;
        }
    };
    let json = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if json {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let mut n = 0;
        loop {
            let at = stream.byte_offset();
            match stream.next() {
                None => break,
                Some(Ok(v)) => {
                    n += 1;
                    add_object(v, &format!("object {n}"), &mut out, path);
                }
                Some(Err(e)) => {
                    // A syntax error leaves no way to find where the next value starts.
                    let line = text[..at].lines().count() + 1;
                    out.problems.push(problem(
                        Some(format!("object at line {line} and after")),
                        format!("does not parse: {e}"),
                    ));
                    break;
                }
            }
        }
    } else {
        for (line, doc) in yaml_documents(text) {
            match serde_yaml_ng::from_str::<Value>(doc) {
                Ok(v) => add_object(v, &format!("document at line {line}"), &mut out, path),
                Err(first) => {
                    // Parsed again behind as many empty lines as the document starts
                    // after, so the parser's line numbers are the file's. Only for a
                    // broken document: padding every one would make a file of many
                    // documents cost the square of its length (a lab of thousands of
                    // pods writes one document per pod).
                    let padded = format!("{}{doc}", "\n".repeat(line - 1));
                    let e = serde_yaml_ng::from_str::<Value>(&padded).err().unwrap_or(first);
                    out.problems.push(problem(
                        Some(format!("document at line {line}")),
                        format!("does not parse: {e}"),
                    ))
                }
            }
        }
    }
    out
}

/// Splits a YAML stream at its `---` lines, so a syntax error costs one document, not
/// the rest of the file (the YAML parser cannot resume after one). Returns each
/// document's first line (1-based) and text.
fn yaml_documents(text: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let is_marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if is_marker && offset > start {
            docs.push((start_line, &text[start..offset]));
            start = offset;
            start_line = i + 1;
        }
        offset += line.len();
    }
    if offset > start {
        docs.push((start_line, &text[start..]));
    }
    docs
}

fn add_object(v: Value, what: &str, out: &mut FileObjects, path: &Path) {
    let problem = |object: String, reason: String| LoadProblem {
        file: path.to_path_buf(),
        object: Some(object),
        reason,
    };
    match v {
        Value::Null => return,
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                add_object(item, &format!("{what}, item {}", i + 1), out, path);
            }
            return;
        }
        Value::Object(_) => {}
        _ => {
            out.problems.push(problem(what.into(), "not an object".into()));
            return;
        }
    }
    let api_version = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match kind.as_str() {
        // `kubectl get -o yaml` output.
        "List" => {
            if let Some(Value::Array(items)) = v.get("items") {
                for (i, item) in items.iter().enumerate() {
                    add_object(item.clone(), &format!("{what}, item {}", i + 1), out, path);
                }
            }
        }
        "Topology" => {
            let label = |ns: &str| format!("Topology {ns}/{name} ({what})");
            if api_version != "networkop.co.uk/v1beta1" {
                let ns = v
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                out.problems.push(problem(
                    label(ns),
                    format!("apiVersion {api_version:?} is not networkop.co.uk/v1beta1"),
                ));
                return;
            }
            // A pod without links may come without a spec at all.
            let mut v = v;
            if let Some(obj) = v.as_object_mut() {
                obj.entry("spec").or_insert_with(|| serde_json::json!({}));
            }
            match Topology::deserialize(&v) {
                Ok(mut t) => {
                    let ns = t.metadata.namespace.get_or_insert_with(|| "default".into()).clone();
                    match validate(&t) {
                        Ok(()) => out.topologies.push(Arc::new(t)),
                        Err(errors) => out.problems.push(problem(label(&ns), errors.join("; "))),
                    }
                }
                Err(e) => {
                    let ns = v
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("default");
                    out.problems
                        .push(problem(label(ns), format!("not a valid Topology: {e}")));
                }
            }
        }
        "Node" if api_version == "v1" => match Node::deserialize(&v) {
            Ok(node) => out.nodes.extend(ClusterNode::from_node(&node)),
            Err(e) => out
                .problems
                .push(problem(format!("Node {name}"), format!("not a valid Node: {e}"))),
        },
        "Pod" if api_version == "v1" => match Pod::deserialize(&v) {
            Ok(pod) => match PolicyPod::from_pod(&pod) {
                Some(pod) => out.pods.push(Arc::new(pod)),
                None => out.problems.push(problem(format!("Pod ({what})"), "no name".into())),
            },
            Err(e) => {
                let label = format!("Pod {}/{name} ({what})", namespace_of(&v));
                out.problems.push(problem(label, format!("not a valid Pod: {e}")));
            }
        },
        "Namespace" if api_version == "v1" => match Namespace::deserialize(&v) {
            Ok(ns) => match PolicyNamespace::from_namespace(&ns) {
                Some(mut ns) => {
                    ns.labels.insert(NAMESPACE_NAME_LABEL.into(), ns.name.clone());
                    out.namespaces.push(Arc::new(ns));
                }
                None => out
                    .problems
                    .push(problem(format!("Namespace ({what})"), "no name".into())),
            },
            Err(e) => out.problems.push(problem(
                format!("Namespace {name} ({what})"),
                format!("not a valid Namespace: {e}"),
            )),
        },
        "NetworkPolicy" => {
            let label = format!("NetworkPolicy {}/{name} ({what})", namespace_of(&v));
            // One of an older API group would look enforced and be ignored: say so.
            if api_version != "networking.k8s.io/v1" {
                let reason = format!("apiVersion {api_version:?} is not networking.k8s.io/v1");
                out.problems.push(problem(label, reason));
                return;
            }
            match strict::decode::<NetworkPolicy>(&v) {
                Ok(policy) if policy.object.metadata.name.is_none() => {
                    out.problems.push(problem(label, "no name".into()))
                }
                Ok(mut policy) => {
                    slim_policy(&mut policy.object);
                    out.policies.push(Arc::new(policy));
                }
                Err(e) => {
                    out.unreadable.push(Arc::new(UnreadablePolicy {
                        kind: "NetworkPolicy".into(),
                        namespace: namespace_of(&v).to_string(),
                        name: name.clone(),
                        error: e.clone(),
                    }));
                    out.problems
                        .push(problem(label, format!("not a valid NetworkPolicy: {e}")))
                }
            }
        }
        "ClusterNetworkPolicy" => {
            let label = match name.as_str() {
                "" => format!("ClusterNetworkPolicy ({what})"),
                name => format!("ClusterNetworkPolicy {name} ({what})"),
            };
            // Another version (an older alpha, a later one) may differ in shape or meaning:
            // read as these, it would look enforced and not be.
            if !cnp_api_version_known(&api_version) {
                let reason = format!(
                    "apiVersion {api_version:?} is not {CNP_GROUP}/{}",
                    CNP_VERSIONS.join(format!(" or {CNP_GROUP}/").as_str())
                );
                out.problems.push(problem(label, reason));
                return;
            }
            match strict::decode::<ClusterNetworkPolicy>(&v) {
                Ok(policy) if policy.object.metadata.name.is_none() => {
                    out.problems.push(problem(label, "no name".into()))
                }
                Ok(mut policy) => {
                    slim_cluster_policy(&mut policy.object);
                    out.cluster_policies.push(Arc::new(policy));
                }
                Err(e) => {
                    out.unreadable.push(Arc::new(UnreadablePolicy {
                        kind: "ClusterNetworkPolicy".into(),
                        namespace: String::new(),
                        name: name.clone(),
                        error: e.clone(),
                    }));
                    out.problems
                        .push(problem(label, format!("not a valid ClusterNetworkPolicy: {e}")))
                }
            }
        }
        _ => tracing::debug!(file = %path.display(), kind, api_version, "ignoring an object weft does not use"),
    }
}

/// An object's namespace as the API server would have it.
fn namespace_of(v: &Value) -> &str {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    #[test]
    fn yaml_documents_split_at_markers_only() {
        let text = "a: 1\n---\nb: 2\n--- # c\nc: |\n  ---x\n----\n---";
        let docs = yaml_documents(text);
        assert_eq!(
            docs,
            vec![
                (1, "a: 1\n"),
                (2, "---\nb: 2\n"),
                (4, "--- # c\nc: |\n  ---x\n----\n"),
                (8, "---")
            ]
        );
        assert_eq!(yaml_documents("---\na: 1\n"), vec![(1, "---\na: 1\n")]);
        assert!(yaml_documents("").is_empty());
    }

    #[test]
    fn a_broken_document_costs_only_itself() {
        let text = "apiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: r1}\nspec: {links: []}\n---\nkind: [\n---\napiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: r2}\n";
        let out = parse_file(Path::new("x.yaml"), text.as_bytes());
        let names: Vec<_> = out
            .topologies
            .iter()
            .map(|t| t.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["r1", "r2"]);
        assert_eq!(out.problems.len(), 1, "{:?}", out.problems);
        let p = &out.problems[0];
        assert_eq!(p.object.as_deref(), Some("document at line 5"));
        // The parser's line numbers are the file's.
        assert!(p.reason.contains("line 7") || p.reason.contains("line 6"), "{p}");
    }

    #[test]
    fn json_lists_and_streams() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"networkop.co.uk/v1beta1","kind":"Topology","metadata":{"name":"r1","namespace":"x"},"spec":{"links":[]}}]}
        {"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},"status":{"addresses":[{"type":"Hostname","address":"n1"},{"type":"InternalIP","address":"10.1.0.1"}]}}
        {"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"},"status":{"addresses":[{"type":"InternalIP","address":"10.1.0.2"}]}}"#;
        let out = parse_file(Path::new("x.json"), text.as_bytes());
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        assert_eq!(out.topologies.len(), 1);
        assert_eq!(out.topologies[0].metadata.namespace.as_deref(), Some("x"));
        // Every Node is read (pod routes need the others too), with its InternalIP.
        let nodes: Vec<_> = out
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.addresses.clone()))
            .collect();
        assert_eq!(
            nodes,
            vec![
                ("n1", vec!["10.1.0.1".parse::<IpAddr>().unwrap()]),
                ("n2", vec!["10.1.0.2".parse::<IpAddr>().unwrap()])
            ]
        );
    }

    /// Node files keep what network policy's node peers read: labels and external
    /// addresses.
    #[test]
    fn node_labels_and_external_addresses_are_read() {
        let text = "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: a}}\n\
                    status: {addresses: [{type: InternalIP, address: 10.1.0.1}, {type: ExternalIP, address: 203.0.113.1}]}\n";
        let out = parse_file(Path::new("n.yaml"), text.as_bytes());
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        let n = &out.nodes[0];
        assert_eq!(n.labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(n.addresses, ["10.1.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(n.external_addresses, ["203.0.113.1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn unknown_kinds_are_ignored_and_bad_ones_reported() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: networkop.co.uk/v1alpha1\nkind: Topology\nmetadata: {name: r1}\n---\napiVersion: networkop.co.uk/v1beta1\nkind: Topology\nmetadata: {name: r2}\nspec: {links: [{uid: x}]}\n---\n42\n";
        let out = parse_file(Path::new("x.yml"), text.as_bytes());
        assert!(out.topologies.is_empty());
        let objects: Vec<_> = out.problems.iter().map(|p| p.object.clone().unwrap()).collect();
        assert_eq!(
            objects,
            [
                "Topology default/r1 (document at line 4)",
                "Topology default/r2 (document at line 8)",
                "document at line 13"
            ]
        );
    }

    #[test]
    fn only_topology_extensions() {
        assert!(is_topology_file("a.yaml") && is_topology_file("b.YML") && is_topology_file("c.json"));
        assert!(!is_topology_file("a.yaml~") && !is_topology_file(".yaml") && !is_topology_file("a.txt"));
    }
}
