//! An ADD's fast path: one pod's dispatch entries and set elements added to the last
//! plan, when it needs no chain the plan lacks.

use std::collections::{BTreeMap, BTreeSet};

use weft_topology::PolicyPod;

use crate::eval::ClusterView;
use crate::model::Direction;

use super::{Desired, Element, Planner};

/// What one pod adds to a plan: its elements in existing sets, and (for a pod of this
/// node) its entries in the dispatch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addition {
    /// Elements to add, by set.
    pub elements: BTreeMap<String, BTreeSet<Element>>,
    /// Egress dispatch entries to add: host interface to entry chain.
    pub egress: BTreeMap<String, String>,
    /// Ingress dispatch entries to add.
    pub ingress: BTreeMap<String, String>,
}

/// What pod `pod` (already in `view`, which `d` was planned from without it) adds to
/// `d`, when that is elements only: `None` when the pod needs a chain `d` does not have
/// (a new combination of policies), which only a full plan makes. `host_ifname` is set
/// for a pod of this node.
pub fn addition(view: &ClusterView, d: &Desired, pod: &PolicyPod, host_ifname: Option<&str>) -> Option<Addition> {
    let mut out = Addition::default();
    if let Some(ifname) = host_ifname {
        let mut names = Planner {
            view,
            fill: false,
            known: Some(d),
            d: Desired::default(),
        };
        for dir in Direction::BOTH {
            if let Some(entry) = names.entry(pod, dir) {
                match dir {
                    Direction::Egress => out.egress.insert(ifname.to_string(), entry),
                    Direction::Ingress => out.ingress.insert(ifname.to_string(), entry),
                };
            }
        }
        // Every chain and set the pod's entries need must be there already, and each
        // entry chain must be dispatched to (it is when another pod enters it that way:
        // only a full pass writes the dispatch).
        if names.d.chains.keys().any(|c| !d.chains.contains_key(c))
            || names.d.sets.keys().any(|s| !d.sets.contains_key(s))
            || out.egress.values().any(|c| !d.egress.values().any(|x| x == c))
            || out.ingress.values().any(|c| !d.ingress.values().any(|x| x == c))
        {
            return None;
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
    Some(out)
}

impl Addition {
    /// Applies it to `d`.
    pub fn apply_to(&self, d: &mut Desired) {
        for (set, elements) in &self.elements {
            if let Some(s) = d.sets.get_mut(set) {
                s.elements.extend(elements.iter().copied());
            }
        }
        d.egress.extend(self.egress.clone());
        d.ingress.extend(self.ingress.clone());
    }
}
