//! Strict reading of policy objects: an object is decoded into its typed form and every
//! field the type does not know is recorded ([`Strict::unknown`]) instead of dropped, so
//! the policy engine can fail closed on exactly the part of a policy it cannot read.
//!
//! Why record rather than refuse at decoding: a field weft does not know may come from a
//! newer API than weft was built for, and upstream's rule for ClusterNetworkPolicy is to
//! fail closed on what is not understood, one peer or rule at a time; refusing the whole
//! object would drop its Deny rules with it. What a policy means with an unknown field
//! is the policy crate's to say; this module only makes sure nothing goes unseen.
//!
//! Unknown fields under `metadata` and `status` are not recorded: neither says anything
//! about what a policy allows (nor are `apiVersion` and `kind`, which callers check).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// An object as read, with the fields its type does not know.
#[derive(Debug, Clone, PartialEq)]
pub struct Strict<T> {
    /// The object (what its type knows of it).
    pub object: T,
    /// The paths of the fields that were not read, in the order met
    /// (`spec.egress[0].protocols[0].icmp`).
    pub unknown: Vec<String>,
}

impl<T> Strict<T> {
    /// An object with nothing unknown (built in code, not read).
    pub fn known(object: T) -> Self {
        Self {
            object,
            unknown: Vec::new(),
        }
    }
}

/// Decodes `value` into `T`, recording every field `T` does not know (see the module
/// doc for what is left out). Errors are the type's (a wrong type, a missing required
/// field), with the path where they happened.
pub fn decode<T: DeserializeOwned>(value: &Value) -> Result<Strict<T>, String> {
    Strict::<T>::deserialize(value).map_err(|e| e.to_string())
}

/// Any deserializer reads a `Strict<T>` strictly: the fields `T` does not know are
/// recorded, so no path into a policy object can skip them.
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Strict<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut unknown = Vec::new();
        let object = serde_ignored::deserialize(deserializer, |path| {
            let p = render(&path);
            if !ignored(&p) {
                unknown.push(p);
            }
        })?;
        Ok(Strict { object, unknown })
    }
}

/// Whether a path is one nothing policy reads depends on: metadata, status, and the
/// type's own `apiVersion` and `kind` (which the caller checks; kube's derived types
/// leave them to it).
fn ignored(path: &str) -> bool {
    let top = path.split(['.', '[']).next().unwrap_or_default();
    matches!(top, "metadata" | "status") || matches!(path, "apiVersion" | "kind")
}

/// A path as people write one: fields joined by dots, list indexes in brackets.
fn render(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", render(parent)),
        Path::Map { parent, key } => {
            let p = render(parent);
            if p.is_empty() {
                key.to_string()
            } else {
                format!("{p}.{key}")
            }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => render(parent),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use serde_json::json;

    use super::*;
    use crate::ClusterNetworkPolicy;

    #[test]
    fn unknown_fields_of_a_network_policy_are_named() {
        let s: Strict<NetworkPolicy> = decode(&json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "a", "namespace": "x", "somethingNew": 1},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}, "serviceAccount": "b"}],
                      "ports": [{"port": 80, "portz": 81}]}], "priority": 3},
            "status": {"conditions": []}
        }))
        .unwrap();
        assert_eq!(
            s.unknown,
            [
                "spec.ingress[0].from[0].serviceAccount",
                "spec.ingress[0].ports[0].portz",
                "spec.priority"
            ]
        );
        assert_eq!(s.object.metadata.name.as_deref(), Some("a"));
    }

    #[test]
    fn a_cluster_network_policy_reads_clean_or_names_what_it_lacks() {
        let clean = json!({
            "apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "c"},
            "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                     "ingress": [{"name": "r", "action": "Accept", "from": [{"namespaces": {}}],
                                  "protocols": [{"tcp": {"destinationPort": {"number": 81}}},
                                                {"udp": {"destinationPort": {"range": {"start": 1, "end": 9}}}},
                                                {"destinationNamedPort": "web"}]}]},
            "status": {"conditions": []}
        });
        let s: Strict<ClusterNetworkPolicy> = decode(&clean).unwrap();
        assert!(s.unknown.is_empty(), "{:?}", s.unknown);
        let mut odd = clean.clone();
        odd["spec"]["ingress"][0]["protocols"][0]["icmp"] = json!({"type": 8});
        odd["spec"]["ingress"][0]["from"][0]["serviceAccounts"] = json!({});
        let s: Strict<ClusterNetworkPolicy> = decode(&odd).unwrap();
        assert_eq!(
            s.unknown,
            [
                "spec.ingress[0].from[0].serviceAccounts",
                "spec.ingress[0].protocols[0].icmp"
            ]
        );
    }
}
