//! Kubernetes label selectors (`matchLabels` and `matchExpressions`), checked once when
//! a policy is read and then matched against label maps.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels of a pod or a namespace.
pub type Labels = BTreeMap<String, String>;

/// One requirement of `matchExpressions`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Requirement {
    /// The key is present with one of the values.
    In(String, BTreeSet<String>),
    /// The key is absent, or present with none of the values.
    NotIn(String, BTreeSet<String>),
    /// The key is present.
    Exists(String),
    /// The key is absent.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A label selector: every `matchLabels` pair and every requirement must hold. The
/// empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    /// `matchLabels`.
    pub labels: BTreeMap<String, String>,
    /// `matchExpressions`.
    pub requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector that matches everything (`{}`).
    pub fn everything() -> Self {
        Self::default()
    }

    /// Whether this is `{}`.
    pub fn is_everything(&self) -> bool {
        self.labels.is_empty() && self.requirements.is_empty()
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v)) && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Reads a Kubernetes selector, refusing what the API server would refuse: an
    /// unknown operator, `In`/`NotIn` without values, `Exists`/`DoesNotExist` with
    /// values, an empty key.
    pub fn from_k8s(s: &LabelSelector) -> Result<Self, String> {
        let mut out = Selector {
            labels: s.match_labels.clone().unwrap_or_default(),
            requirements: Vec::new(),
        };
        if out.labels.keys().any(String::is_empty) {
            return Err("matchLabels has an empty key".into());
        }
        for e in s.match_expressions.iter().flatten() {
            if e.key.is_empty() {
                return Err("matchExpressions has an empty key".into());
            }
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let r = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!("matchExpressions {} {}: needs values", e.key, e.operator));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!("matchExpressions {} {}: takes no values", e.key, e.operator));
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                other => return Err(format!("matchExpressions {}: unknown operator {other:?}", e.key)),
            };
            out.requirements.push(r);
        }
        Ok(out)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_everything() {
            return f.write_str("{}");
        }
        let mut parts: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for r in &self.requirements {
            let join = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
            parts.push(match r {
                Requirement::In(k, vs) => format!("{k} in ({})", join(vs)),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", join(vs)),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            });
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(ToString::to_string).collect()),
        }
    }

    fn sel(match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> Selector {
        Selector::from_k8s(&LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        })
        .unwrap()
    }

    /// Each operator against labels that have the key with a listed value, with
    /// another value, and without the key.
    #[test]
    fn operators_follow_the_kubernetes_truth_table() {
        let with_a = labels(&[("pod", "a")]);
        let with_x = labels(&[("pod", "x")]);
        let without = labels(&[("app", "web")]);
        let table = [
            ("In", vec!["a", "b"], [true, false, false]),
            ("NotIn", vec!["a", "b"], [false, true, true]),
            ("Exists", vec![], [true, true, false]),
            ("DoesNotExist", vec![], [false, false, true]),
        ];
        for (op, values, want) in table {
            let s = sel(&[], vec![expr("pod", op, &values)]);
            let got = [s.matches(&with_a), s.matches(&with_x), s.matches(&without)];
            assert_eq!(got, want, "{op} {values:?}");
        }
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold_and_empty_matches_all() {
        let s = sel(&[("pod", "a")], vec![expr("env", "In", &["prod"])]);
        assert!(s.matches(&labels(&[("pod", "a"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("pod", "a")])));
        assert!(!s.matches(&labels(&[("pod", "b"), ("env", "prod")])));
        assert!(Selector::everything().matches(&Labels::new()));
        assert!(sel(&[], vec![]).is_everything());
        assert_eq!(s.to_string(), "pod=a,env in (prod)");
    }

    #[test]
    fn selectors_the_api_server_refuses_are_refused() {
        for bad in [
            expr("pod", "In", &[]),
            expr("pod", "Exists", &["a"]),
            expr("pod", "Matches", &["a"]),
            expr("", "Exists", &[]),
        ] {
            let s = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![bad.clone()]),
            };
            assert!(Selector::from_k8s(&s).is_err(), "{bad:?}");
        }
    }
}
