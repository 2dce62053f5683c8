//! New pods reachable at once: a node tells the others the addresses of a pod at its
//! ADD ([`Announcer`], before the ADD answers), and a node told so puts them in its
//! sets ([`PolicyEngine::pod_announced`]) before the API server has them (kubelet
//! reports `status.podIPs` only after the sandbox is up, and every watch then takes its
//! time): without this, a new pod's first connections to pods of other nodes that
//! allow it are dropped until the watch catches up.
//!
//! Never wider than the API would make it: an announcement gives addresses only, to a
//! Pod object the cache has (its labels are the API's, never the caller's), bound to
//! the announcing node (`spec.nodeName`), within that node's pod ranges; the caller's
//! node is who the transport says it is, never what the message says. Once the API has
//! the pod's addresses, they win and the announcement goes; one the API never confirms
//! goes after [`ANNOUNCED_TTL`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use imbl::ordmap::DiffItem;
use weft_topology::{PolicyObjects, PolicyPod};

use super::PolicyEngine;
use crate::kernel::PolicyKernel;

/// How long an announcement stands without the API confirming the pod's addresses.
pub const ANNOUNCED_TTL: Duration = Duration::from_secs(120);

/// A pod of a node, as that node announces it: its addresses, at its ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
}

/// How this node tells the others about a new pod of its own (at its ADD, which
/// answers once this returns: the implementation bounds how long it waits).
pub trait Announcer: Send + Sync + 'static {
    /// Tells every other node that `pod` has its addresses.
    fn announce(&self, pod: Announced) -> BoxFuture<'static, ()>;
}

/// What became of an announcement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Its addresses are in this node's sets now.
    Applied,
    /// Kept until the cache has the pod's object (its labels decide its sets).
    Kept,
    /// The API has the pod's addresses already: nothing to do.
    Known,
}

/// One announcement, with the patched object last made of it.
#[derive(Debug, Clone)]
struct Entry {
    node: String,
    ips: Vec<IpAddr>,
    at: Instant,
    /// The cache's object it patched and the patched one, reused while the cache's
    /// object stays the same (an unchanged `Arc` is how a pass sees nothing changed).
    patched: Option<(Arc<PolicyPod>, Arc<PolicyPod>)>,
}

/// Announcements taken by [`PolicyEngine::pod_announced`] and not yet taken in by a
/// pass, and how many were ever taken (an announcement's number is the count once it
/// was).
#[derive(Debug, Default)]
pub(super) struct Queue {
    waiting: Vec<((String, String), Entry)>,
    taken: u64,
}

/// The announcements a node holds, by pod.
#[derive(Debug, Default)]
pub(super) struct Announcements {
    entries: BTreeMap<(String, String), Entry>,
    /// The last patch: the cache's objects it was made from and what it made. Given
    /// again while neither they nor the entries moved (a pass comes far more often
    /// than either does); otherwise the next is made from it, for the pods that moved
    /// in the cache and the entries that came or went, not from every entry again
    /// (during a bring-up nearly every pass follows a move, and a patch of every entry
    /// made each pass cost in proportion to the pods announced, and shared no part of
    /// its map with the last one, so each pass's difference walked all of it).
    last: Option<(Arc<PolicyObjects>, Arc<PolicyObjects>)>,
    /// Pods whose entry came or went since the last patch.
    moved: BTreeSet<(String, String)>,
}

/// What a pod's entry makes of the cache's object of it.
enum Made {
    /// The object with the announced addresses.
    Patched(Arc<PolicyPod>),
    /// The cache's object as it is (or none): the entry waits for it.
    Waiting,
    /// The entry is moot (the API has addresses, the pod runs elsewhere, or its object
    /// went after it was seen): it goes.
    Moot,
}

impl Entry {
    /// What this entry makes of `raw`, the cache's object of its pod (the one rule of
    /// both the full and the partial patch).
    fn make(&mut self, raw: Option<&Arc<PolicyPod>>) -> Made {
        let Some(raw) = raw else {
            // Not in the cache yet (or gone before it was seen): kept until it is.
            return if self.patched.is_some() {
                Made::Moot
            } else {
                Made::Waiting
            };
        };
        if !raw.ips.is_empty() || raw.node != self.node {
            return Made::Moot;
        }
        Made::Patched(match &self.patched {
            Some((was, patched)) if Arc::ptr_eq(was, raw) => patched.clone(),
            _ => {
                let p = Arc::new(PolicyPod {
                    ips: self.ips.clone(),
                    ..(**raw).clone()
                });
                self.patched = Some((raw.clone(), p.clone()));
                p
            }
        })
    }
}

impl Announcements {
    /// `objects` with the announced addresses of pods the API has no addresses of yet;
    /// announcements the API made moot (the pod has addresses, runs elsewhere, or is
    /// gone after its object was seen) or that expired go. The same `Arc` when nothing
    /// is patched.
    pub(super) fn patch(&mut self, objects: Arc<PolicyObjects>) -> Arc<PolicyObjects> {
        let moved = &mut self.moved;
        self.entries.retain(|key, e| {
            let live = e.at.elapsed() < ANNOUNCED_TTL;
            if !live {
                moved.insert(key.clone());
            }
            live
        });
        if self.entries.is_empty() {
            self.last = None;
            self.moved.clear();
            return objects;
        }
        let made = match self.last.take() {
            Some((from, made)) if Arc::ptr_eq(&from, &objects) && self.moved.is_empty() => made,
            Some((from, made)) => self.patch_from(&from, &made, &objects),
            None => self.patch_anew(&objects),
        };
        self.moved.clear();
        self.last = Some((objects.clone(), made.clone()));
        if self.entries.values().all(|e| e.patched.is_none()) {
            // Every entry waits for its pod's object: nothing patched.
            return objects;
        }
        made
    }

    /// Takes in an announcement (a later one of a pod replaces an earlier).
    fn insert(&mut self, key: (String, String), entry: Entry) {
        self.moved.insert(key.clone());
        self.entries.insert(key, entry);
    }

    /// [`Announcements::patch`] made anew: every entry against `objects`.
    fn patch_anew(&mut self, objects: &Arc<PolicyObjects>) -> Arc<PolicyObjects> {
        // A copy of the cache's map that shares all but the pods patched (`put_pod`).
        let mut patched_objects: Option<PolicyObjects> = None;
        let mut moot = Vec::new();
        for (key, e) in &mut self.entries {
            match e.make(objects.pods.get(key)) {
                Made::Patched(p) => patched_objects.get_or_insert_with(|| (**objects).clone()).put_pod(p),
                Made::Waiting => {}
                Made::Moot => moot.push(key.clone()),
            }
        }
        for key in moot {
            self.entries.remove(&key);
        }
        match patched_objects {
            Some(o) => Arc::new(o),
            None => objects.clone(),
        }
    }

    /// [`Announcements::patch`] made from the last patch, `made` of `from`: only the
    /// pods that differ between `from` and `objects`, and those whose entry came or
    /// went, are made again; every other pod's object and entry are as they were, so
    /// `made` has them right already.
    fn patch_from(
        &mut self,
        from: &PolicyObjects,
        made: &PolicyObjects,
        objects: &Arc<PolicyObjects>,
    ) -> Arc<PolicyObjects> {
        let mut keys: BTreeSet<(String, String)> = std::mem::take(&mut self.moved);
        keys.extend(from.pods.diff(&objects.pods).map(|d| match d {
            DiffItem::Add(k, _) | DiffItem::Update { new: (k, _), .. } | DiffItem::Remove(k, _) => k.clone(),
        }));
        let mut pods = made.pods.clone();
        for key in keys {
            let raw = objects.pods.get(&key);
            let made = match self.entries.get_mut(&key).map(|e| e.make(raw)) {
                Some(Made::Patched(p)) => Some(p),
                Some(Made::Moot) => {
                    self.entries.remove(&key);
                    raw.cloned()
                }
                Some(Made::Waiting) | None => raw.cloned(),
            };
            match made {
                Some(p) => {
                    pods.insert(key, p);
                }
                None => {
                    pods.remove(&key);
                }
            }
        }
        Arc::new(PolicyObjects {
            pods,
            ..(**objects).clone()
        })
    }
}

impl<K: PolicyKernel> PolicyEngine<K> {
    /// Moves the queued announcements into `state` (a later one of a pod replaces an
    /// earlier); returns how many were ever taken, which the pass records once it ends
    /// well.
    pub(super) fn take_announced(&self, state: &mut super::State) -> u64 {
        let mut q = self.queued.lock().expect("announcement queue lock");
        for (key, entry) in q.waiting.drain(..) {
            state.announced.insert(key, entry);
        }
        q.taken
    }

    /// Queues an announcement for the next pass; returns its number.
    fn queue_announced(&self, key: (String, String), entry: Entry) -> u64 {
        let mut q = self.queued.lock().expect("announcement queue lock");
        q.waiting.push((key, entry));
        q.taken += 1;
        q.taken
    }

    /// How many announcements wait for a pass.
    #[cfg(test)]
    pub(super) fn waiting_announcements(&self) -> usize {
        self.queued.lock().expect("announcement queue lock").waiting.len()
    }

    /// Sets how this node tells the others about its new pods (none: it does not).
    pub fn set_announcer(&self, announcer: Arc<dyn Announcer>) {
        *self.announcer.lock().expect("announcer lock") = Some(announcer);
    }

    /// Tells the other nodes about a pod of this node whose policies are in place (its
    /// ADD answers once this returns).
    pub(super) async fn announce(&self, pod: &crate::eval::LocalPod) {
        let announcer = self.announcer.lock().expect("announcer lock").clone();
        if let Some(a) = announcer {
            a.announce(Announced {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                ips: pod.ips.clone(),
            })
            .await;
        }
    }

    /// Node `node` (as the transport identified it) announces its pod `pod`: its
    /// addresses go into this node's sets now if the cache has the pod's object, when
    /// it does otherwise. Refused (with why) when the node is not known, runs no such
    /// pod, or claims addresses outside its pod ranges, and for a pod of this node.
    pub async fn pod_announced(&self, node: &str, pod: Announced) -> Result<Taken, String> {
        let who = format!("{}/{}", pod.namespace, pod.name);
        let refused = |why: String| {
            self.metrics.announced("refused");
            Err(format!("pod {who} announced by node {node}: {why}"))
        };
        if node == self.cfg.node_name {
            return refused("a pod of this node is its store's to say".into());
        }
        let nodes = self.source.nodes();
        let Some(n) = nodes.iter().find(|n| n.name == node) else {
            return refused("no such node".into());
        };
        if pod.ips.is_empty() {
            return refused("no address".into());
        }
        if let Some(ip) = pod.ips.iter().find(|ip| !n.pod_cidrs.iter().any(|c| c.contains(*ip))) {
            return refused(format!("{ip} is not in the node's pod ranges"));
        }
        let objects = self.source.policy_objects();
        let known = objects.pod(&pod.namespace, &pod.name).cloned();
        if let Some(p) = &known {
            if p.node != node {
                return refused(format!("the pod runs on node {:?}", p.node));
            }
            if !p.ips.is_empty() {
                self.metrics.announced("known");
                return Ok(Taken::Known);
            }
        }
        let number = self.queue_announced(
            (pod.namespace.clone(), pod.name.clone()),
            Entry {
                node: node.to_string(),
                ips: pod.ips.clone(),
                at: Instant::now(),
                patched: None,
            },
        );
        if known.is_some() {
            // Announcements that came while a pass ran wait here together: the first
            // of them to get the lock takes them all into its pass, and the others
            // find theirs taken in and applied.
            let mut state = self.state.lock().await;
            if state.announced_upto < number {
                self.pass_locked(&mut state, None, false).await?;
            }
        }
        let taken = if known.is_some() { Taken::Applied } else { Taken::Kept };
        self.metrics.announced(if known.is_some() { "applied" } else { "kept" });
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, ips: &[&str]) -> Arc<PolicyPod> {
        Arc::new(PolicyPod {
            namespace: "x".into(),
            name: name.into(),
            node: node.into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            ..PolicyPod::default()
        })
    }

    fn entry(node: &str, ip: &str) -> Entry {
        Entry {
            node: node.into(),
            ips: vec![ip.parse().unwrap()],
            at: Instant::now(),
            patched: None,
        }
    }

    /// An announcement fills in the addresses of a pod the API has none of, on its own
    /// node only, keeps the patched object while the cache's stays the same, and goes
    /// once the API has the addresses.
    #[test]
    fn announced_addresses_fill_in_until_the_api_has_them() {
        let mut a = Announcements::default();
        a.entries.insert(("x".into(), "new".into()), entry("n2", "10.0.2.9"));
        a.entries
            .insert(("x".into(), "elsewhere".into()), entry("n2", "10.0.2.8"));
        a.entries.insert(("x".into(), "later".into()), entry("n2", "10.0.2.7"));
        let o = Arc::new(PolicyObjects {
            pods: weft_topology::policy_pods([
                pod("elsewhere", "n3", &[]),
                pod("new", "n2", &[]),
                pod("old", "n2", &["10.0.2.1"]),
            ]),
            ..PolicyObjects::default()
        });
        let p1 = a.patch(o.clone());
        let at = |o: &PolicyObjects, name: &str| o.pod("x", name).expect("the pod").clone();
        assert_eq!(at(&p1, "new").ips, vec!["10.0.2.9".parse::<IpAddr>().unwrap()]);
        assert!(
            at(&p1, "elsewhere").ips.is_empty(),
            "the pod runs on another node: not taken"
        );
        assert!(Arc::ptr_eq(&at(&p1, "old"), &at(&o, "old")));
        assert_eq!(a.entries.len(), 2, "the moot one went; the one not seen yet stays");
        let p2 = a.patch(o.clone());
        assert!(Arc::ptr_eq(&p1, &p2), "nothing moved: the same objects, not a copy");
        // Another announcement: patched anew, keeping what was patched before.
        let o2 = Arc::new(PolicyObjects {
            pods: o.pods.update(("x".into(), "other".into()), pod("other", "n2", &[])),
            ..PolicyObjects::default()
        });
        a.insert(("x".into(), "other".into()), entry("n2", "10.0.2.6"));
        let p2 = a.patch(o2.clone());
        assert!(!Arc::ptr_eq(&p1, &p2));
        assert_eq!(at(&p2, "other").ips, vec!["10.0.2.6".parse::<IpAddr>().unwrap()]);
        assert!(Arc::ptr_eq(&at(&p1, "new"), &at(&p2, "new")), "the same patched object");
        let confirmed = Arc::new(PolicyObjects {
            pods: weft_topology::policy_pods([pod("new", "n2", &["10.0.2.9"])]),
            ..PolicyObjects::default()
        });
        let p3 = a.patch(confirmed.clone());
        assert!(Arc::ptr_eq(&p3, &confirmed), "nothing left to patch");
        assert_eq!(a.entries.len(), 1, "confirmed by the API: gone");
    }

    /// What one step of the property below does.
    #[derive(Debug, Clone)]
    enum Step {
        /// The cache gets (or replaces) pod `i` on node `node` (`n2` or `n3`), with an
        /// address or without.
        Cache { i: u8, on_n3: bool, with_ip: bool },
        /// The cache loses pod `i`.
        Gone { i: u8 },
        /// Node n2 announces pod `i`.
        Announce { i: u8 },
        /// Pod `i`'s announcement expires.
        Expire { i: u8 },
        /// A pass patches the cache's objects as they stand.
        Patch,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..12, any::<bool>(), any::<bool>()).prop_map(|(i, on_n3, with_ip)| Step::Cache { i, on_n3, with_ip }),
            (0u8..12).prop_map(|i| Step::Gone { i }),
            (0u8..12).prop_map(|i| Step::Announce { i }),
            (0u8..12).prop_map(|i| Step::Expire { i }),
            Just(Step::Patch),
            Just(Step::Patch),
        ]
    }

    proptest::proptest! {
        /// A patch made from the last one (the pods that moved and the entries that came
        /// or went) is the patch made anew from every entry: the same pods, and the
        /// same announcements left, whatever the order of moves.
        #[test]
        fn a_patch_made_from_the_last_is_the_patch_made_anew(steps in proptest::collection::vec(step(), 1..60)) {
            let key = |i: u8| ("x".to_string(), format!("p{i}"));
            let mut a = Announcements::default();
            let mut cache = PolicyObjects { synced: true, ..PolicyObjects::default() };
            for s in steps {
                match s {
                    Step::Cache { i, on_n3, with_ip } => {
                        let ip = format!("10.0.1.{i}");
                        let ips: &[&str] = if with_ip { &[&ip] } else { &[] };
                        cache.put_pod(pod(&key(i).1, if on_n3 { "n3" } else { "n2" }, ips));
                    }
                    Step::Gone { i } => {
                        cache.pods.remove(&key(i));
                    }
                    Step::Announce { i } => a.insert(key(i), entry("n2", &format!("10.0.2.{i}"))),
                    Step::Expire { i } => {
                        if let (Some(e), Some(past)) = (
                            a.entries.get_mut(&key(i)),
                            Instant::now().checked_sub(ANNOUNCED_TTL),
                        ) {
                            e.at = past;
                        }
                    }
                    Step::Patch => {
                        let objects = Arc::new(cache.clone());
                        let mut anew = Announcements {
                            entries: a.entries.clone(),
                            ..Announcements::default()
                        };
                        let want = anew.patch(objects.clone());
                        let got = a.patch(objects.clone());
                        proptest::prop_assert_eq!(&got.pods, &want.pods);
                        proptest::prop_assert_eq!(
                            a.entries.keys().collect::<Vec<_>>(),
                            anew.entries.keys().collect::<Vec<_>>()
                        );
                        proptest::prop_assert_eq!(Arc::ptr_eq(&got, &objects), Arc::ptr_eq(&want, &objects));
                        // Asked again with nothing moved: the same objects, not a copy.
                        proptest::prop_assert!(Arc::ptr_eq(&a.patch(objects), &got));
                    }
                }
            }
        }
    }
}
