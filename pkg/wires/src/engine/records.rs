//! The wire ends of this node as the store records them, as the run task keeps them
//! from one pass to the next: by id, and by the pod each belongs to, so a pass that
//! looks at a few pods finds their ends without going through every end of the node.

use std::collections::{BTreeSet, HashMap};

use weft_link::WireEnd;

use super::plan::{PodKey, owner};

/// The ends by id and by owning pod (the pod the end's interface is in); the two
/// always hold the same ends.
#[derive(Debug, Default, Clone)]
pub(crate) struct Records {
    by_id: HashMap<u64, WireEnd>,
    by_pod: HashMap<PodKey, BTreeSet<u64>>,
}

impl Records {
    /// End `id`, if recorded.
    pub(crate) fn get(&self, id: &u64) -> Option<&WireEnd> {
        self.by_id.get(id)
    }

    /// Records `r`, replacing the end of its id.
    pub(crate) fn insert(&mut self, r: WireEnd) {
        let id = r.id;
        let key = owner(&r);
        if let Some(old) = self.by_id.insert(id, r) {
            self.unindex(&owner(&old), id);
        }
        self.by_pod.entry(key).or_default().insert(id);
    }

    /// Forgets end `id`, returning it.
    pub(crate) fn remove(&mut self, id: &u64) -> Option<WireEnd> {
        let old = self.by_id.remove(id)?;
        self.unindex(&owner(&old), *id);
        Some(old)
    }

    fn unindex(&mut self, key: &PodKey, id: u64) {
        if let Some(ids) = self.by_pod.get_mut(key) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_pod.remove(key);
            }
        }
    }

    /// Every end.
    pub(crate) fn values(&self) -> impl Iterator<Item = &WireEnd> {
        self.by_id.values()
    }

    /// How many ends there are.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The ends of pod `key`.
    pub(crate) fn of_pod(&self, key: &PodKey) -> impl Iterator<Item = &WireEnd> {
        (self.by_pod.get(key).into_iter().flatten()).filter_map(|id| self.by_id.get(id))
    }
}

impl FromIterator<WireEnd> for Records {
    fn from_iter<I: IntoIterator<Item = WireEnd>>(iter: I) -> Self {
        let mut out = Records::default();
        for r in iter {
            out.insert(r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(id: u64, pod: &str) -> WireEnd {
        WireEnd {
            namespace: "lab".into(),
            link_uid: 1,
            local_pod: pod.into(),
            local_intf: "eth1".into(),
            peer_pod: "z".into(),
            peer_intf: "eth1".into(),
            peer_node: String::new(),
            kind: weft_link::LinkKind::Veth,
            id,
            peer_id: 0,
            state: weft_link::WireState::Up,
            vni: None,
            netns: String::new(),
        }
    }

    fn ids_of(r: &Records, pod: &str) -> Vec<u64> {
        r.of_pod(&("lab".into(), pod.into())).map(|e| e.id).collect()
    }

    #[test]
    fn ends_are_found_by_pod_as_they_come_move_and_go() {
        let mut r: Records = [end(1, "a"), end(2, "a"), end(3, "b")].into_iter().collect();
        assert_eq!((ids_of(&r, "a"), ids_of(&r, "b"), r.len()), (vec![1, 2], vec![3], 3));
        // Recorded again under another pod: found under that one only.
        r.insert(end(2, "b"));
        assert_eq!((ids_of(&r, "a"), ids_of(&r, "b")), (vec![1], vec![2, 3]));
        assert_eq!(r.remove(&1).map(|e| e.id), Some(1));
        assert!(ids_of(&r, "a").is_empty() && r.by_pod.len() == 1, "{r:?}");
        assert!(r.remove(&1).is_none());
        assert_eq!(r.get(&3).map(|e| e.local_pod.as_str()), Some("b"));
        let mut all: Vec<u64> = r.values().map(|e| e.id).collect();
        all.sort();
        assert_eq!(all, [2, 3]);
    }
}
