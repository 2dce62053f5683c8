//! What weft could not read in a policy object, and what it does instead: the one place
//! that says how a policy is read when part of it is not understood. The rule is never
//! to read a policy wider than it is written:
//!
//! - a NetworkPolicy rule that cannot be read allows nothing; a NetworkPolicy whose
//!   spec (outside its rules) cannot be read isolates the pods it could select (its
//!   namespace's, when its pod selector is what cannot be read) and allows nothing;
//! - a ClusterNetworkPolicy rule that cannot be read fails closed as upstream says for
//!   its peers: an `Accept` rule matches nothing, a `Deny` or `Pass` rule denies all
//!   (network-policy-api, `ClusterNetworkPolicyIngressPeer`); a spec that cannot be read
//!   outside its rules makes every rule fail closed;
//! - what cannot be made safe so (a ClusterNetworkPolicy whose subject, tier or priority
//!   cannot be read: who it applies to, or where, is unknown) is refused: not enforced.
//!
//! Every such case is a [`Problem`] naming the object and the field, which the engine
//! logs, counts (`weft_policy_invalid`) and shows (`weftctl status`, `policy explain`),
//! and `weftctl lab apply` refuses.

use std::fmt;

use crate::direction::Direction;

/// Which kind of policy object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// `networking.k8s.io/v1` NetworkPolicy.
    NetworkPolicy,
    /// `policy.networking.k8s.io` ClusterNetworkPolicy.
    ClusterNetworkPolicy,
}

impl ObjectKind {
    /// The kind as the API spells it (the metric label too).
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::NetworkPolicy => "NetworkPolicy",
            ObjectKind::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        }
    }
}

/// A rule of a policy: its direction and its index in that direction's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleAt {
    /// The direction.
    pub direction: Direction,
    /// The index.
    pub index: usize,
}

impl fmt::Display for RuleAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.direction, self.index)
    }
}

/// What weft enforces in place of what it could not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Effect {
    /// The object is not enforced at all.
    Refused,
    /// A NetworkPolicy isolates the pods it could select and allows nothing.
    IsolatesOnly,
    /// A NetworkPolicy rule allows nothing.
    AllowsNothing(RuleAt),
    /// A ClusterNetworkPolicy `Accept` rule matches nothing.
    MatchesNothing(RuleAt),
    /// A ClusterNetworkPolicy `Deny` or `Pass` rule (or one whose action is unknown)
    /// denies all traffic that reaches it.
    DeniesAll(RuleAt),
    /// Every rule of a ClusterNetworkPolicy fails closed (Accept: nothing; Deny, Pass:
    /// all).
    AllRulesFailClosed,
    /// A policy whose mode is not known is enforced as written (never a preview that
    /// would leave it unenforced).
    EnforcedAsWritten,
}

impl Effect {
    /// The metric label: `refused` where nothing is enforced, `fail_closed` elsewhere.
    pub fn label(self) -> &'static str {
        match self {
            Effect::Refused => "refused",
            Effect::IsolatesOnly
            | Effect::AllowsNothing(_)
            | Effect::MatchesNothing(_)
            | Effect::DeniesAll(_)
            | Effect::AllRulesFailClosed
            | Effect::EnforcedAsWritten => "fail_closed",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::Refused => f.write_str("not enforced"),
            Effect::IsolatesOnly => f.write_str("it isolates the pods it could select and allows nothing"),
            Effect::AllowsNothing(r) => write!(f, "rule {r} allows nothing"),
            Effect::MatchesNothing(r) => write!(f, "Accept rule {r} matches nothing"),
            Effect::DeniesAll(r) => write!(f, "rule {r} denies all"),
            Effect::AllRulesFailClosed => {
                f.write_str("every rule fails closed (Accept rules match nothing, Deny and Pass rules deny all)")
            }
            Effect::EnforcedAsWritten => f.write_str("enforced as written"),
        }
    }
}

/// Why weft could not read something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// A field weft does not know (a newer API than weft's, or a typo).
    UnknownField,
    /// A value the API would refuse (the API server never stores it; a file may).
    Invalid,
    /// A form the API takes that weft does not enforce yet.
    Unsupported,
}

/// One thing weft could not read in a policy object, and what it does instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Problem {
    /// The object's kind.
    pub kind: ObjectKind,
    /// Its namespace (empty for a ClusterNetworkPolicy).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The field, as a path (`spec.egress[0].protocols[1]`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
    /// What weft enforces instead.
    pub effect: Effect,
    /// Why it could not be read.
    pub cause: Cause,
}

impl Problem {
    /// The object, as people name it: `NetworkPolicy ns/name`, `ClusterNetworkPolicy name`.
    pub fn object(&self) -> String {
        match self.kind {
            ObjectKind::NetworkPolicy => format!("NetworkPolicy {}/{}", self.namespace, self.name),
            ObjectKind::ClusterNetworkPolicy => format!("ClusterNetworkPolicy {}", self.name),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}; {}", self.object(), self.field, self.reason, self.effect)
    }
}

/// Where a field path points inside a policy: a rule (`spec.ingress[2]...`), or the
/// rest of the spec. A field outside `spec` counts as the spec's: nothing there is
/// weft's to skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Inside a rule.
    Rule(RuleAt),
    /// Anywhere else.
    Spec,
}

/// Where `path` (as [`weft_topology::strict`] writes paths) points.
pub(crate) fn place(path: &str) -> Place {
    let rest = path.strip_prefix("spec.").unwrap_or_default();
    for (word, direction) in [("ingress[", Direction::Ingress), ("egress[", Direction::Egress)] {
        if let Some(tail) = rest.strip_prefix(word)
            && let Some((n, _)) = tail.split_once(']')
            && let Ok(index) = n.parse()
        {
            return Place::Rule(RuleAt { direction, index });
        }
    }
    Place::Spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_point_at_rules_or_the_spec() {
        let rule = |d, i| Place::Rule(RuleAt { direction: d, index: i });
        assert_eq!(place("spec.ingress[3].from[0].x"), rule(Direction::Ingress, 3));
        assert_eq!(place("spec.egress[12]"), rule(Direction::Egress, 12));
        assert_eq!(place("spec.egressx[1]"), Place::Spec);
        assert_eq!(place("spec.subject.nodes"), Place::Spec);
        assert_eq!(place("spec2"), Place::Spec);
        assert_eq!(place("spec.ingress"), Place::Spec);
    }
}
