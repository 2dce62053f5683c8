//! Shared names: a node's flows name the same pods, namespaces, workloads, nodes and
//! policies over and over, and one decision covers many flows; each name and each
//! list of policies is held once, however many records and aggregates hold it.

use std::collections::HashSet;
use std::sync::Arc;

use crate::record::{Peer, PolicyHit};

/// The names and policy lists records hold.
#[derive(Default)]
pub struct Interner {
    strs: HashSet<Arc<str>>,
    hits: HashSet<Arc<[PolicyHit]>>,
}

impl Interner {
    /// The shared copy of `s`.
    pub fn str(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strs.get(s) {
            return a.clone();
        }
        let a: Arc<str> = s.into();
        self.strs.insert(a.clone());
        a
    }

    /// `p` with its names shared.
    pub fn peer(&mut self, p: &mut Peer) {
        p.namespace = self.str(&p.namespace);
        p.pod = self.str(&p.pod);
        p.workload = self.str(&p.workload);
        p.node = self.str(&p.node);
    }

    /// The shared copy of `hits`, its names shared too.
    pub fn hits(&mut self, mut hits: Vec<PolicyHit>) -> Arc<[PolicyHit]> {
        for h in &mut hits {
            h.kind = self.str(&h.kind);
            h.name = self.str(&h.name);
            h.rule_name = self.str(&h.rule_name);
        }
        if let Some(a) = self.hits.get(hits.as_slice()) {
            return a.clone();
        }
        let a: Arc<[PolicyHit]> = hits.into();
        self.hits.insert(a.clone());
        a
    }

    /// Forgets what nothing else holds any more (a pod gone, a policy deleted).
    pub fn prune(&mut self) {
        self.hits.retain(|a| Arc::strong_count(a) > 1);
        self.strs.retain(|a| Arc::strong_count(a) > 1);
    }

    /// How many names and policy lists are held.
    pub fn len(&self) -> usize {
        self.strs.len() + self.hits.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Effect, PolicySide};

    #[test]
    fn one_copy_each_and_forgotten_when_unused() {
        let mut i = Interner::default();
        let a = i.str("x/web");
        let b = i.str("x/web");
        assert!(Arc::ptr_eq(&a, &b));
        let hit = |name: &str| PolicyHit {
            domain: "".into(),
            side: PolicySide::Ingress,
            kind: "networkpolicy".into(),
            name: name.into(),
            rule: Some(0),
            rule_name: "".into(),
            effect: Effect::Allow,
        };
        let h1 = i.hits(vec![hit("x/p")]);
        let h2 = i.hits(vec![hit("x/p")]);
        assert!(Arc::ptr_eq(&h1, &h2));
        assert!(
            Arc::ptr_eq(&h1[0].name, &i.str("x/p")),
            "the names inside are shared too"
        );
        drop((a, b, h1, h2));
        i.prune();
        assert!(i.is_empty(), "nothing holds them: {}", i.len());
    }
}
