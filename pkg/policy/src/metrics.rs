//! Network policy's metric families (`weft_policy_*`), registered with telemetry's
//! registry when the engine is built. Labels are bounded: namespaces, directions, kinds;
//! never pods or addresses.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use weft_telemetry::{Families, Metrics};

use crate::model::Direction;
use crate::plan::Desired;

/// A change the engine applied.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    /// `change` (the cluster changed) or `repair` (the kernel had drifted).
    pub kind: &'static str,
}

/// A direction.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `ingress` or `egress`.
    pub direction: &'static str,
}

/// Policy objects weft could not read whole.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct InvalidLabels {
    /// `NetworkPolicy` or `ClusterNetworkPolicy`.
    pub kind: &'static str,
    /// The object's namespace (empty for a ClusterNetworkPolicy).
    pub namespace: String,
    /// `refused` (not enforced) or `fail_closed` (enforced, closed where not read).
    pub effect: &'static str,
}

/// A verdict of the policy table.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    /// `ingress` or `egress`.
    pub direction: &'static str,
    /// `allow` (a rule of the policy accepted), `deny` (dropped: the policy isolates the
    /// pod and no rule of any isolating policy allowed, or a ClusterNetworkPolicy Deny
    /// rule matched), `audit` (a NetworkPolicy deny in an audit namespace: forwarded),
    /// `pass` (a ClusterNetworkPolicy Pass rule handed over to the next tier).
    pub action: &'static str,
    /// The policy's namespace (empty for a ClusterNetworkPolicy).
    pub namespace: String,
    /// The policy's name.
    pub policy: String,
}

/// What network policy counts; get it with `metrics.families::<PolicyMetrics>()`.
pub struct PolicyMetrics {
    /// `weft_policy_synced`: the cache has listed every kind once.
    pub synced: Gauge,
    /// `weft_policy_stale`: a watch is lost; the last known state is enforced.
    pub stale: Gauge,
    /// `weft_policy_changes_total{kind}`.
    pub changes: Family<ChangeLabels, Counter>,
    /// `weft_policy_failures_total`: transactions the kernel refused.
    pub failures: Counter,
    /// `weft_policy_pass_seconds`.
    pub pass_seconds: Histogram,
    /// `weft_policy_isolated_pods{direction}`: this node's pods some policy isolates.
    pub isolated_pods: Family<DirectionLabels, Gauge>,
    /// `weft_policy_invalid{kind, namespace, effect}`: policy objects weft could not
    /// read whole.
    pub invalid: Family<InvalidLabels, Gauge>,
    /// `weft_policy_verdicts_total{direction, action, namespace, policy}`: new
    /// connections (their first packets) each policy allowed, or denied as one of the
    /// policies isolating the pod.
    pub verdicts: Family<VerdictLabels, Counter>,
    /// `weft_policy_announcements_total{result}`: pods of other nodes announced by
    /// them at their ADD (`applied`, `kept` until the cache has the pod, `known` by the
    /// API already, `refused`).
    pub announcements: Family<ResultLabels, Counter>,
    /// `weft_policy_dns_answers_total{result}`: DNS answers to this node's pods the
    /// learner read (`learnt`: addresses went into a learnt set; `unmatched`: no
    /// `domainNames` rule takes the name; `ignored`: no answer to learn from, an error
    /// code or no question; `unreadable`: not DNS; `failed`: the sets could not be
    /// written).
    pub dns_answers: Family<ResultLabels, Counter>,
    /// `weft_policy_dns_held_total`: new connections a `domainNames` rule's hold kept
    /// until the answers before them were learnt (then released to the rules again).
    pub dns_held: Counter,
    /// `weft_policy_learnt_names` and `weft_policy_learnt_addresses`: what the node
    /// holds for `domainNames` rules.
    pub learnt_names: Gauge,
    /// See [`Self::learnt_names`].
    pub learnt_addresses: Gauge,
    /// `weft_policy_learnt_evictions_total`: addresses pushed out by a newer one of the
    /// same name (its per-name bound).
    pub learnt_evictions: Counter,
    /// `weft_policy_learnt_refused_total`: addresses refused over the node's bound.
    pub learnt_refused: Counter,
    /// Label sets last reported with invalid policies, to zero them once fixed.
    invalid_seen: Mutex<Vec<InvalidLabels>>,
}

/// What became of something.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The result.
    pub result: &'static str,
}

impl PolicyMetrics {
    /// Counts an announcement received, by what became of it.
    pub fn announced(&self, result: &'static str) {
        self.announcements.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts `n` verdicts.
    pub fn verdict(&self, direction: Direction, action: &'static str, namespace: &str, policy: &str, n: u64) {
        self.verdicts
            .get_or_create(&VerdictLabels {
                direction: direction.as_str(),
                action,
                namespace: namespace.to_string(),
                policy: policy.to_string(),
            })
            .inc_by(n);
    }

    /// Sets the isolated-pod gauges from a plan.
    pub fn isolated(&self, d: &Desired) {
        for (dir, n) in [
            (Direction::Ingress, d.ingress.len()),
            (Direction::Egress, d.egress.len()),
        ] {
            self.isolated_pods
                .get_or_create(&DirectionLabels {
                    direction: dir.as_str(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the invalid-policy gauges from `counts` (objects by label set), every label
    /// set seen before and not now back to zero.
    pub fn set_invalid(&self, counts: &HashMap<InvalidLabels, i64>) {
        let mut seen = self.invalid_seen.lock().expect("metrics lock");
        for l in seen.iter().filter(|l| !counts.contains_key(*l)) {
            self.invalid.get_or_create(l).set(0);
        }
        for (l, n) in counts {
            self.invalid.get_or_create(l).set(*n);
        }
        *seen = counts.keys().cloned().collect();
    }
}

impl Families for PolicyMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = PolicyMetrics {
            synced: Gauge::default(),
            stale: Gauge::default(),
            changes: Family::default(),
            failures: Counter::default(),
            // 100 µs .. ~3 s, doubling.
            pass_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            isolated_pods: Family::default(),
            invalid: Family::default(),
            verdicts: Family::default(),
            announcements: Family::default(),
            dns_answers: Family::default(),
            dns_held: Counter::default(),
            learnt_names: Gauge::default(),
            learnt_addresses: Gauge::default(),
            learnt_evictions: Counter::default(),
            learnt_refused: Counter::default(),
            invalid_seen: Mutex::default(),
        };
        metrics.register(
            "weft_policy_dns_answers",
            "DNS answers to this node's pods (and from a DNS server on it) read for domainNames rules, by result (learnt, unmatched, ignored, unreadable, failed)",
            m.dns_answers.clone(),
        );
        metrics.register(
            "weft_policy_dns_held",
            "New connections a domainNames rule held until the DNS answers before them were learnt",
            m.dns_held.clone(),
        );
        metrics.register(
            "weft_policy_learnt_names",
            "Names this node holds learnt addresses of, for domainNames rules",
            m.learnt_names.clone(),
        );
        metrics.register(
            "weft_policy_learnt_addresses",
            "Addresses this node learnt from DNS answers and still allows, for domainNames rules",
            m.learnt_addresses.clone(),
        );
        metrics.register(
            "weft_policy_learnt_evictions",
            "Learnt addresses pushed out by a newer one of the same name (the per-name bound)",
            m.learnt_evictions.clone(),
        );
        metrics.register(
            "weft_policy_learnt_refused",
            "Learnt addresses refused because the node holds its bound of them",
            m.learnt_refused.clone(),
        );
        metrics.register(
            "weft_policy_synced",
            "Whether the pods, namespaces and NetworkPolicies of the cluster have been listed (1) or not yet (0: nothing is changed)",
            m.synced.clone(),
        );
        metrics.register(
            "weft_policy_stale",
            "Whether a watch of policy objects is lost (1): the last known state stays enforced",
            m.stale.clone(),
        );
        metrics.register(
            "weft_policy_changes",
            "Transactions applied to the policy table, by kind (change, repair)",
            m.changes.clone(),
        );
        metrics.register(
            "weft_policy_failures",
            "Policy table transactions the kernel refused",
            m.failures.clone(),
        );
        metrics.register(
            "weft_policy_pass_seconds",
            "Time to plan and apply the policy table",
            m.pass_seconds.clone(),
        );
        metrics.register(
            "weft_policy_isolated_pods",
            "Pods of this node isolated by some NetworkPolicy, by direction",
            m.isolated_pods.clone(),
        );
        metrics.register(
            "weft_policy_invalid",
            "Policy objects weft could not read whole, by kind, namespace and effect (refused: not enforced; fail_closed: enforced, what was not read closed)",
            m.invalid.clone(),
        );
        metrics.register(
            "weft_policy_announcements",
            "Pods of other nodes announced by them at their ADD, by what became of them (applied, kept, known, refused)",
            m.announcements.clone(),
        );
        metrics.register(
            "weft_policy_verdicts",
            "New connections network policy decided, by direction, action (allow, deny, audit) and policy",
            m.verdicts.clone(),
        );
        m
    }
}
