//! An ADD's path: what one pod adds to the last plan, computed alone. Usually that is
//! set elements and dispatch entries; the first pod of a new group (a combination of
//! policies the node had no pod of) also brings the chains, sets and counters the plan
//! lacks, built as a full plan would build them. A full plan is never needed for it.

use std::collections::{BTreeMap, BTreeSet};

use weft_topology::PolicyPod;

use crate::eval::ClusterView;
use crate::model::Direction;
use crate::names::{Chain, SetName};

use super::{Desired, Element, Planner};

/// What one pod adds to a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addition {
    /// Objects the plan lacks: new sets (with all their elements), chains, counters,
    /// and what they stand for.
    pub new: Desired,
    /// Elements to add to existing sets, by set.
    pub elements: BTreeMap<SetName, BTreeSet<Element>>,
    /// Egress dispatch entries to add: host interface to entry chain.
    pub egress: BTreeMap<String, Chain>,
    /// Ingress dispatch entries to add.
    pub ingress: BTreeMap<String, Chain>,
    /// Entry chains the dispatch did not have: each needs its member set and its rule
    /// in the dispatch chain of its direction.
    pub entries: BTreeSet<Chain>,
    /// Host interfaces new to the hairpin set.
    pub hairpin: BTreeSet<String>,
}

impl Addition {
    /// Whether it adds nothing at all.
    pub fn is_empty(&self) -> bool {
        self == &Addition::default()
    }

    /// Whether it is set elements only (no new object, no new entry chain).
    pub fn elements_only(&self) -> bool {
        self.new == Desired::default() && self.entries.is_empty()
    }
}

/// What pod `pod` (already in `view`, which `d` was planned from without it) adds to
/// `d`. `host_ifname` is set for a pod of this node.
pub fn addition(view: &ClusterView, d: &Desired, pod: &PolicyPod, host_ifname: Option<&str>) -> Addition {
    let mut out = Addition::default();
    if let Some(ifname) = host_ifname
        && !pod.host_network
    {
        let mut p = Planner::new(view, Some(d));
        for dir in Direction::BOTH {
            if let Some(entry) = p.entry(pod, dir) {
                match dir {
                    Direction::Egress => out.egress.insert(ifname.to_string(), entry),
                    Direction::Ingress => out.ingress.insert(ifname.to_string(), entry),
                };
            }
        }
        out.new = p.d;
        for dir in Direction::BOTH {
            let (add, have) = match dir {
                Direction::Egress => (&out.egress, &d.egress),
                Direction::Ingress => (&out.ingress, &d.ingress),
            };
            for chain in add.values() {
                if !have.values().any(|x| x == chain) {
                    out.entries.insert(chain.clone());
                }
            }
        }
        if !d.egress.contains_key(ifname)
            && !d.ingress.contains_key(ifname)
            && (out.egress.contains_key(ifname) || out.ingress.contains_key(ifname))
        {
            out.hairpin.insert(ifname.to_string());
        }
    }
    for (name, source) in &d.sources {
        let have = &d.sets[name].elements;
        let new: BTreeSet<Element> = source
            .elements(view, pod)
            .into_iter()
            .filter(|e| !have.contains(e))
            .collect();
        if !new.is_empty() {
            out.elements.insert(name.clone(), new);
        }
    }
    out
}

impl Addition {
    /// Applies it to `d`.
    pub fn apply_to(&self, d: &mut Desired) {
        for (set, elements) in &self.elements {
            if let Some(s) = d.sets.get_mut(set) {
                s.elements.extend(elements.iter().copied());
            }
        }
        let n = self.new.clone();
        d.sets.extend(n.sets);
        d.chains.extend(n.chains);
        d.counters.extend(n.counters);
        d.groups.extend(n.groups);
        d.policy_chains.extend(n.policy_chains);
        d.chain_of.extend(n.chain_of);
        d.cluster_rules.extend(n.cluster_rules);
        d.sources.extend(n.sources);
        d.learnt.extend(n.learnt);
        d.egress.extend(self.egress.clone());
        d.ingress.extend(self.ingress.clone());
    }
}
