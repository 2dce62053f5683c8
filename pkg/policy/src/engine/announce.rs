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

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
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
    /// The last patch: the cache's objects it was made from and what it made, given
    /// again while neither they nor the entries moved (a pass comes far more often
    /// than either does, and each patch copies the cluster's list of pods).
    last: Option<(Arc<PolicyObjects>, Arc<PolicyObjects>)>,
}

impl Announcements {
    /// `objects` with the announced addresses of pods the API has no addresses of yet;
    /// announcements the API made moot (the pod has addresses, runs elsewhere, or is
    /// gone after its object was seen) or that expired go. The same `Arc` when nothing
    /// is patched.
    pub(super) fn patch(&mut self, objects: Arc<PolicyObjects>) -> Arc<PolicyObjects> {
        let before = self.entries.len();
        self.entries.retain(|_, e| e.at.elapsed() < ANNOUNCED_TTL);
        if self.entries.is_empty() {
            self.last = None;
            return objects;
        }
        if self.entries.len() != before {
            self.last = None;
        }
        if let Some((from, made)) = &self.last
            && Arc::ptr_eq(from, &objects)
        {
            return made.clone();
        }
        let from = objects.clone();
        let made = self.patch_anew(objects);
        self.last = Some((from, made.clone()));
        made
    }

    /// Takes in an announcement (a later one of a pod replaces an earlier).
    fn insert(&mut self, key: (String, String), entry: Entry) {
        self.entries.insert(key, entry);
        self.last = None;
    }

    /// [`Announcements::patch`] made anew.
    fn patch_anew(&mut self, objects: Arc<PolicyObjects>) -> Arc<PolicyObjects> {
        // A copy of the cache's map that shares all but the pods patched (`put_pod`).
        let mut patched_objects: Option<PolicyObjects> = None;
        let mut moot = Vec::new();
        for (key, e) in &mut self.entries {
            let Some(raw) = objects.pods.get(key) else {
                // Not in the cache yet (or gone before it was seen): kept until it is.
                if e.patched.is_some() {
                    moot.push(key.clone());
                }
                continue;
            };
            if !raw.ips.is_empty() || raw.node != e.node {
                moot.push(key.clone());
                continue;
            }
            let patched = match &e.patched {
                Some((was, patched)) if Arc::ptr_eq(was, raw) => patched.clone(),
                _ => {
                    let p = Arc::new(PolicyPod {
                        ips: e.ips.clone(),
                        ..(**raw).clone()
                    });
                    e.patched = Some((raw.clone(), p.clone()));
                    p
                }
            };
            patched_objects
                .get_or_insert_with(|| (*objects).clone())
                .put_pod(patched);
        }
        for key in moot {
            self.entries.remove(&key);
        }
        match patched_objects {
            Some(o) => Arc::new(o),
            None => objects,
        }
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
}
