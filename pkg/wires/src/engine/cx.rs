//! The pass's context and memory: what a carrier works with during a pass ([`Cx`]:
//! the engine's seams, the records the pass has so far, what the run task remembers)
//! and what the run task carries from one pass to the next ([`PassState`], with what
//! each end's emulation was last set to, [`Applied`]). A module of its own so the
//! carriers, the pass and the emulation all lean on it rather than on each other.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Instant;

use imbl::ordmap::DiffItem;
use tracing::{debug, info, warn};
use weft_kernel::KernelError;
use weft_kernel::wire::Emulated;
use weft_link::{DownBy, EndSettings, Impairment, LinkPhase, LinkStatus, WireEnd, WireState};
use weft_topology::Topologies;

use super::plan::{self, PodKey};
use super::records::Records;
use super::{Engine, Pods};
use crate::convert;
use crate::error::WireError;
use crate::kernel::WireKernel;
use crate::plane::GrpcPlane;

/// What a pass last applied to an end (`None`: not yet, or it failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    pub(crate) impairment: Option<Impairment>,
    pub(crate) down: Option<Option<DownBy>>,
}

/// How many links are in each phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkCounts([i64; 4]);

impl LinkCounts {
    /// Every phase, in the order counted.
    pub(crate) const PHASES: [LinkPhase; 4] = [LinkPhase::Pending, LinkPhase::Up, LinkPhase::Down, LinkPhase::Failed];

    fn slot(phase: LinkPhase) -> usize {
        match phase {
            LinkPhase::Pending => 0,
            LinkPhase::Up => 1,
            LinkPhase::Down => 2,
            LinkPhase::Failed => 3,
        }
    }

    /// Counts `links` in (`by` 1) or out (`by` -1).
    pub(crate) fn add(&mut self, links: &[LinkStatus], by: i64) {
        for l in links {
            self.0[Self::slot(l.state)] += by;
        }
    }

    /// How many links are in `phase`.
    pub(crate) fn get(&self, phase: LinkPhase) -> i64 {
        self.0[Self::slot(phase)]
    }
}

/// What the run task carries from one pass to the next.
#[derive(Debug, Default)]
pub(crate) struct PassState {
    /// Set by a pass that left work waiting (on a peer, a write), so the next comes
    /// sooner.
    pub(crate) retry: bool,
    /// Pods whose last attempt failed or whose status could not be written: the next
    /// pass looks at them again.
    pub(crate) retry_pods: BTreeSet<PodKey>,
    /// Whether the wire-state resource holds what the store says: false at start (the
    /// resource may predate a crash) and after a failed write, so the next pass writes
    /// it even when no end changed.
    pub(crate) mirrored: bool,
    /// When the wire-state resource was last written.
    pub(crate) mirrored_at: Option<Instant>,
    /// When a write of the wire-state resource held back by the least time between two
    /// (see `weft_topology::wire_state_interval`) is due: the run task wakes for it.
    pub(crate) mirror_due: Option<Instant>,
    /// What each end's emulation (impairment, carrier by intent) was last set to.
    pub(crate) applied: HashMap<u64, Applied>,
    /// Ends recorded built (not pending) that have no entry in `applied` yet, or whose
    /// entry was dropped to be set afresh: the next emulation visits them whichever
    /// pods it looks at. Every recorded end missing from `applied` is here, unless the
    /// records were read afresh from the store (then a pass goes through them all).
    pub(crate) unapplied: HashSet<u64>,
    /// Link detours found on the node at start (wire ids' low bits) that no pass has
    /// taken over or removed yet; `None` until the first pass lists them.
    pub(crate) leftover_detours: Option<HashSet<u64>>,
    /// Pods whose link states could not be written to their Topology status yet.
    pub(crate) links_unwritten: BTreeSet<PodKey>,
    /// The attached pods as the last pass looked at their namespaces.
    pub(crate) ns_seen: Pods,
    /// Those of them whose namespace was gone then (attached still, being collected).
    pub(crate) ns_gone: BTreeSet<PodKey>,
    /// The kernel's namespace epoch read before that look (`WireKernel::gone_epoch`).
    pub(crate) ns_epoch: Option<u64>,
    /// The Topologies as the last pass saw them (holding them keeps the map's shared
    /// structure alive: the next listing's difference from it skips what did not move).
    pub(crate) seen: Topologies,
    /// The topology source's change counter when `seen` was last brought up to date.
    pub(crate) source_seen: Option<u64>,
    /// Which pods list a link to each pod, for the topologies in `seen`.
    pub(crate) listers: plan::Listers,
    /// The wire ends as the store records them, kept from one pass to the next (each
    /// pass's writes go to both) and read afresh from the store by a pass of every pod,
    /// after another path wrote ends (`records_epoch`), or after a write of the pass's
    /// own may have missed the store (`records_doubtful`). None until the first pass.
    pub(crate) records: Option<Records>,
    /// The engine's records epoch when `records` were read.
    pub(crate) records_epoch: u64,
    /// Set when a removal could not be written to the store: the next pass reads it.
    pub(crate) records_doubtful: bool,
    /// The run-time settings as the last pass saw them.
    pub(crate) settings: HashMap<u64, EndSettings>,
    /// This node's address as the last pass knew it.
    pub(crate) me: Option<IpAddr>,
    /// When a pass last looked at every pod.
    pub(crate) last_full: Option<Instant>,
    /// When a pass last had pods to look at that moved (an ADD, a DEL, a Topology that
    /// changed): a due resync waits while they keep moving (see `pass::resync`).
    pub(crate) last_moved: Option<Instant>,
    /// Whether the last pass failed (the next looks at every pod).
    pub(crate) failed: bool,
    /// The pods alive (attached, their namespace there) as the last pass saw them.
    pub(crate) alive: Pods,
    /// How many links of the pods the pass reported are in each phase (the `links`
    /// gauge), kept as they move rather than counted over every link at each pass.
    pub(crate) link_counts: LinkCounts,
}

impl PassState {
    /// The pods whose Topology is new, changed or gone since the last pass, noting
    /// `now` as seen (and their links in `listers`). Costs the topologies that moved:
    /// the source changes its map in place, so the two share the rest.
    pub(crate) fn moved(&mut self, now: Topologies) -> BTreeSet<PodKey> {
        let mut moved = BTreeSet::new();
        for d in self.seen.diff(&now) {
            let (old, new) = match d {
                DiffItem::Add(_, t) => (None, Some(t)),
                DiffItem::Remove(_, t) => (Some(t), None),
                DiffItem::Update { old, new } => (Some(old.1), Some(new.1)),
            };
            // Keyed as the engine keys pods, by what each Topology says of itself.
            if let Some(t) = old {
                let key = plan::key_of(t);
                self.listers.remove(&key, t);
                moved.insert(key);
            }
            if let Some(t) = new {
                let key = plan::key_of(t);
                self.listers.add(&key, t);
                moved.insert(key);
            }
        }
        self.seen = now;
        moved
    }

    /// The pods that came or went since the last pass (attached or detached, or their
    /// namespace appeared or vanished without either), noting `now` as alive: the local
    /// pods linked to one follow in the same pass.
    pub(crate) fn came_or_went(&mut self, now: &Pods) -> BTreeSet<PodKey> {
        // The same map as last time (no ADD, DEL or vanished namespace since): nothing.
        if self.alive.ptr_eq(now) {
            return BTreeSet::new();
        }
        // The maps share all but the paths an ADD, DEL or vanished namespace copied:
        // their difference skips what they share, not a walk over every pod of the
        // node (this comes at every ADD). A pod replaced in place neither came nor went.
        let changed = self
            .alive
            .diff(now)
            .filter_map(|d| match d {
                DiffItem::Add(k, _) | DiffItem::Remove(k, _) => Some(k.clone()),
                DiffItem::Update { .. } => None,
            })
            .collect();
        self.alive = now.clone();
        changed
    }

    /// The pods of the ends whose run-time settings are new, changed or gone since the
    /// last pass, noting `now` as seen.
    pub(crate) fn resettled(&mut self, now: &HashMap<u64, EndSettings>, records: &Records) -> BTreeSet<PodKey> {
        let ids = now
            .iter()
            .filter(|(id, s)| self.settings.get(id) != Some(s))
            .map(|(id, _)| id)
            .chain(self.settings.keys().filter(|id| !now.contains_key(id)));
        let pods = ids.filter_map(|id| records.get(id)).map(plan::owner).collect();
        self.settings = now.clone();
        pods
    }
}

/// What a carrier works with during a pass: the engine's seams, what the pass has
/// recorded so far and what the run task remembers between passes. Only the run task
/// makes one, so a carrier never races another pass.
pub struct Cx<'a, P> {
    pub(super) engine: &'a Engine<P>,
    pub(super) pass: &'a mut PassState,
    pub(super) records: &'a mut Records,
    pub(super) me: IpAddr,
    /// Ends built this pass that their peer nodes are told of at its end, by node: one
    /// `Ends` call per peer and pass, not one per end.
    pub(super) built: BTreeMap<IpAddr, Vec<weft_rpc::wire::End>>,
}

impl<P: GrpcPlane> Cx<'_, P> {
    /// Tells the node at `node` of end `end`, built by this pass, when the pass has
    /// built the rest (see [`Cx::tell_built`]): it need not wait for its next pass.
    pub fn built(&mut self, node: IpAddr, end: weft_rpc::wire::End) {
        self.built.entry(node).or_default().push(end);
    }

    /// Hands the ends this pass built to the engine's teller, which tells each peer
    /// node of those whose other end it holds, in one call, without the pass waiting
    /// for the answer. Best effort: the peer's own passes find the ends anyway.
    pub fn tell_built(&mut self) {
        let built = std::mem::take(&mut self.built);
        if !built.is_empty() && self.engine.built.try_send(built).is_err() {
            debug!("peer nodes not told of this pass's ends: the teller is behind or gone");
        }
    }

    /// This node's underlay address.
    pub fn me(&self) -> IpAddr {
        self.me
    }

    /// The MTU wire ends get (a carrier that encapsulates takes its overhead off).
    pub fn mtu(&self) -> u32 {
        self.engine.cfg.mtu
    }

    /// End `id` as the store records it, if it does.
    pub fn recorded(&self, id: u64) -> Option<&WireEnd> {
        self.records.get(&id)
    }

    /// Records an end (and its `up` gauge) in the store and in this pass's view.
    pub async fn put(&mut self, r: WireEnd) -> Result<(), WireError> {
        let stored = r.clone();
        self.engine.store.run(move |db| db.put_wire(&stored)).await?;
        let labels = convert::labels(&r);
        // What the wire-state resource shows of an end: written again when it moved.
        if self.records.get(&r.id).map(|o| (o.state, &o.peer_node)) != Some((r.state, &r.peer_node)) {
            self.pass.mirrored = false;
        }
        // Re-pointed (another peer node, kind or interface): the old series end here.
        if let Some(old) = self.records.get(&r.id).map(convert::labels)
            && old != labels
        {
            self.engine.metrics.remove_wire(&old);
        }
        self.engine
            .metrics
            .up
            .get_or_create(&labels)
            .set(i64::from(r.state.is_up()));
        // Built, and never set: the pass's emulation visits it whatever pods it looks at.
        if r.state != WireState::Pending && !self.pass.applied.contains_key(&r.id) {
            self.pass.unapplied.insert(r.id);
        }
        self.records.insert(r);
        Ok(())
    }

    /// Removes an end before it is rebuilt (its peer is not told: the end comes back).
    pub async fn remove(&mut self, r: &WireEnd) {
        self.teardown(r, false).await;
    }

    /// Notes that end `id` is being (re)built: the next pass applies its settings afresh.
    pub fn rebuilt(&mut self, id: u64) {
        self.pass.applied.remove(&id);
        self.pass.unapplied.insert(id);
    }

    /// Runs a kernel procedure off the async workers (it may enter pod namespaces).
    pub async fn kernel<R: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn WireKernel) -> Result<R, KernelError> + Send + 'static,
    ) -> Result<R, WireError> {
        self.engine.kernel(f).await
    }

    /// Removes an end: what its carrier keeps, its detour, its interface, its record;
    /// tells a remote peer when `tell_peer`.
    pub(super) async fn teardown(&mut self, r: &WireEnd, tell_peer: bool) {
        self.rebuilt(r.id);
        let carrier = self.engine.carriers.get(r.kind);
        carrier.release(self, r).await;
        if let Err(e) = self.end_detour(r).await {
            warn!(wire = r.id, error = %e, "could not remove a wire end's link detour");
        }
        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
        if let Err(e) = self.kernel(move |k| k.remove_interface(&netns, &intf)).await {
            warn!(wire = r.id, error = %e, "could not remove a wire end's interface");
        }
        let id = r.id;
        if let Err(e) = self.engine.store.run(move |db| db.remove_wire(id)).await {
            warn!(wire = r.id, error = %e, "could not forget a wire end");
            // The store may still hold it: the next pass reads the store again.
            self.pass.records_doubtful = true;
        }
        self.pass.mirrored = false;
        self.engine.metrics.remove_wire(&convert::labels(r));
        self.records.remove(&r.id);
        info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, kind = %r.kind, "wire end removed");
        if tell_peer
            && let Ok(node) = r.peer_node.parse::<IpAddr>()
            && let Err(e) = self.engine.call_ends(node, vec![convert::to_message(r, false)]).await
        {
            tracing::debug!(wire = r.id, error = %e, "could not tell the peer node; it sees the pod's status instead");
        }
    }

    /// Takes end `r`'s link detour away, if it has one (a worker here, or a pair an
    /// earlier run left): what the pod sends goes straight out again.
    pub(super) async fn end_detour(&mut self, r: &WireEnd) -> Result<(), WireError> {
        let worker = self.engine.plane.get().is_some_and(|dp| dp.undetour(r.id));
        let left = self
            .pass
            .leftover_detours
            .as_mut()
            .is_some_and(|l| l.remove(&(r.id & crate::ids::DETOUR_ID_BITS)));
        if worker || left {
            let (netns, intf, id) = (r.netns.clone(), r.local_intf.clone(), r.id);
            self.kernel(move |k| k.remove_detour(&netns, &intf, id)).await?;
            info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, "link detour removed");
        }
        Ok(())
    }

    /// Applies `imp` to what a kernel-carried end sends: netem on its pod's interface,
    /// or, on a kernel without netem, a worker of weftd's through the end's link
    /// detour. Returns whether the end exists.
    pub async fn netem_or_detour(&mut self, r: &WireEnd, imp: Impairment) -> Result<bool, WireError> {
        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
        match self.kernel(move |k| k.set_impairment(&netns, &intf, &imp)).await? {
            Emulated::NoSuchEnd => Ok(false),
            Emulated::Applied => {
                self.end_detour(r).await?;
                Ok(true)
            }
            Emulated::Unsupported => {
                let dp = self.engine.dataplane().ok_or_else(|| {
                    WireError::DataPlane(
                        "this kernel has no netem, and weftd can carry the link's emulation only once this node's address is known".into(),
                    )
                })?;
                let (netns, intf, id) = (r.netns.clone(), r.local_intf.clone(), r.id);
                if !self.kernel(move |k| k.detour(&netns, &intf, id)).await? {
                    return Ok(false);
                }
                dp.detour(r.id, imp, convert::labels(r))?;
                info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, "this kernel has no netem: weftd carries the end's frames through a link detour");
                Ok(true)
            }
        }
    }

    /// Sets a cross-node end down while its peer pod runs nowhere (kept for its return).
    pub async fn set_down(&mut self, mut r: WireEnd) -> Result<(), WireError> {
        if r.state == WireState::Down {
            return Ok(());
        }
        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
        self.kernel(move |k| k.set_interface_up(&netns, &intf, false)).await?;
        if let Some(dp) = self.engine.dataplane() {
            dp.set_up(r.id, false);
        }
        r.state = WireState::Down;
        info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, "peer gone: wire end down");
        self.put(r).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use weft_topology::Topology;

    fn pods(names: &[&str]) -> Pods {
        names
            .iter()
            .map(|n| {
                let pod = crate::LocalPod {
                    netns: format!("/run/netns/{n}"),
                    container_id: n.to_string(),
                };
                (("lab".to_string(), n.to_string()), pod)
            })
            .collect()
    }

    fn keys(names: &[&str]) -> BTreeSet<PodKey> {
        names.iter().map(|n| ("lab".to_string(), n.to_string())).collect()
    }

    fn topo(name: &str, peers: &[&str]) -> Arc<Topology> {
        let links = (peers.iter().enumerate())
            .map(|(i, p)| weft_topology::Link {
                uid: i as i64,
                peer_pod: p.to_string(),
                local_intf: format!("eth{i}"),
                peer_intf: "eth9".into(),
                local_ip: String::new(),
                peer_ip: String::new(),
                local_mac: None,
                peer_mac: None,
                kind: None,
                impair: Default::default(),
            })
            .collect();
        let mut t = Topology::new(
            name,
            weft_topology::TopologySpec {
                links,
                ..Default::default()
            },
        );
        t.metadata.namespace = Some("lab".into());
        Arc::new(t)
    }

    fn listing(st: &PassState, name: &str) -> Vec<String> {
        let key = ("lab".to_string(), name.to_string());
        st.listers.listing(&key).map(|k| k.1.clone()).collect()
    }

    /// The source's map as it would hold `ts`.
    fn map(ts: &[&Arc<Topology>]) -> Topologies {
        ts.iter()
            .map(|t| (plan::key_of(t), weft_topology::Held(Arc::clone(t))))
            .collect()
    }

    /// What moved between listings: a map changed in place (as a source changes its
    /// own), or one built anew from the same objects (nothing moved) or from others,
    /// with the index of who lists whom following either way.
    #[test]
    fn moved_topologies_by_the_maps_difference() {
        let mut st = PassState::default();
        let (a, b, c) = (topo("a", &["b"]), topo("b", &["a"]), topo("c", &[]));
        let first = map(&[&a, &b, &c]);
        assert_eq!(st.moved(first.clone()), keys(&["a", "b", "c"]));
        assert_eq!(st.moved(first.clone()), keys(&[]), "the same map");
        assert_eq!(listing(&st, "a"), ["b"]);
        // b now lists c instead of a, replaced in place.
        let b2 = topo("b", &["c"]);
        let mut next = first.clone();
        next.insert(plan::key_of(&b2), weft_topology::Held(b2.clone()));
        assert_eq!(st.moved(next.clone()), keys(&["b"]));
        assert_eq!(listing(&st, "a"), Vec::<String>::new());
        assert_eq!(listing(&st, "c"), ["b"]);
        // The same objects in a map built anew: nothing moved.
        assert_eq!(st.moved(map(&[&c, &a, &b2])), keys(&[]));
        // A new read of an unchanged object is a new object: it moved.
        let a_again = topo("a", &["b"]);
        assert_eq!(st.moved(map(&[&a_again, &b2, &c])), keys(&["a"]));
        // One went, one came, one replaced: every one of them.
        let c2 = topo("c", &["a"]);
        let d = topo("d", &[]);
        assert_eq!(st.moved(map(&[&c2, &d, &b2])), keys(&["a", "c", "d"]));
        assert_eq!(listing(&st, "a"), ["c"]);
        let d2 = topo("d", &["a"]);
        assert_eq!(st.moved(map(&[&c2, &d2, &b2])), keys(&["d"]));
        let mut by_a = listing(&st, "a");
        by_a.sort();
        assert_eq!(by_a, ["c", "d"]);
        assert_eq!(st.seen.len(), 3, "only what the last listing holds is kept");
    }

    /// The pods that came or went, on either side and at either end of the order, and
    /// none for the very same map.
    #[test]
    fn came_or_went_is_the_difference_both_ways() {
        let mut st = PassState::default();
        let first = pods(&["b", "d", "f"]);
        assert_eq!(st.came_or_went(&first), keys(&["b", "d", "f"]));
        assert_eq!(st.came_or_went(&first), keys(&[]), "the same map");
        let next = pods(&["a", "b", "e", "f", "g"]);
        assert_eq!(st.came_or_went(&next), keys(&["a", "d", "e", "g"]));
        assert_eq!(
            st.came_or_went(&pods(&["a", "b", "e", "f", "g"])),
            keys(&[]),
            "an equal map"
        );
        assert_eq!(st.came_or_went(&pods(&[])), keys(&["a", "b", "e", "f", "g"]));
    }

    /// A map derived from the last one (as the engine's is: ADDs and DELs change a
    /// copy that shares the rest) tells exactly the pods added and removed, wherever
    /// they fall among many; a pod replaced in place is neither.
    #[test]
    fn came_or_went_of_a_derived_map() {
        let mut st = PassState::default();
        let names: Vec<String> = (0..500).map(|i| format!("p{i:03}")).collect();
        let base = pods(&names.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(st.came_or_went(&base).len(), 500);
        let mut next = base.clone();
        next.remove(&("lab".to_string(), "p000".to_string()));
        next.remove(&("lab".to_string(), "p250".to_string()));
        next.insert(
            ("lab".to_string(), "p250x".to_string()),
            pods(&["p250x"]).values().next().unwrap().clone(),
        );
        next.insert(
            ("lab".to_string(), "p999".to_string()),
            pods(&["p999"]).values().next().unwrap().clone(),
        );
        let moved = crate::LocalPod {
            netns: "/run/netns/elsewhere".into(),
            container_id: "p100".into(),
        };
        next.insert(("lab".to_string(), "p100".to_string()), moved);
        assert_eq!(st.came_or_went(&next), keys(&["p000", "p250", "p250x", "p999"]));
        assert_eq!(st.came_or_went(&next), keys(&[]), "the same map");
    }
}
