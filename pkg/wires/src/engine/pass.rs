//! The run task and its pass: publish where this node's pods run, bring every link of
//! every local pod where the plan says (through the link's carrier), remove ends
//! nothing asks for, apply emulation, report and mirror the result.
//!
//! What the task remembers from one pass to the next ([`PassState`]) is owned by it
//! and lent to each pass; no other path reads or writes it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};
use weft_link::{EndSettings, LinkKind, LinkPhase, LinkStatus, WireEnd};

use super::carrier::{Cx, Far};
use super::emulate::Applied;
use super::plan::{self, Attempt, PodKey, Want};
use super::{Engine, LocalLink, LocalPod};
use crate::error::WireError;
use crate::ids::wire_id;
use crate::metrics::LinkStateLabels;
use crate::plane::GrpcPlane;

/// What the run task carries from one pass to the next.
#[derive(Debug, Default)]
pub(crate) struct PassState {
    /// Set by a pass that left work waiting (on a peer, a write), so the next comes
    /// sooner.
    pub(crate) retry: bool,
    /// Whether the wire-state resource holds what the store says: false at start (the
    /// resource may predate a crash) and after a failed write, so the next pass writes
    /// it even when no end changed.
    pub(crate) mirrored: bool,
    /// What each end's emulation (impairment, carrier by intent) was last set to.
    pub(crate) applied: HashMap<u64, Applied>,
    /// Link detours found on the node at start (wire ids' low bits) that no pass has
    /// taken over or removed yet; `None` until the first pass lists them.
    pub(crate) leftover_detours: Option<HashSet<u64>>,
    /// Pods whose link states could not be written to their Topology status yet.
    pub(crate) links_unwritten: BTreeSet<PodKey>,
}

impl<P: GrpcPlane> Engine<P> {
    /// The run task: a pass whenever asked, the source changes or the timer fires
    /// (sooner while work waits on a peer). It owns the passes' memory.
    pub(super) async fn run(self: Arc<Self>) {
        let mut changes = self.source.changes();
        let mut st = PassState::default();
        loop {
            let want = self.passes.requested();
            st.retry = false;
            if let Err(e) = self.pass(&mut st).await {
                warn!(error = %e, "wire pass failed; retrying");
                st.retry = true;
            }
            self.passes.done(want);
            let wait = if st.retry {
                Duration::from_millis(500)
            } else {
                self.cfg.resync
            };
            tokio::select! {
                _ = self.passes.kicked() => {}
                r = changes.changed() => if r.is_err() { tokio::time::sleep(wait).await },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One pass over every link of every local pod.
    async fn pass(&self, st: &mut PassState) -> Result<(), WireError> {
        let Some(me) = self.node_address() else {
            debug!("node address not known yet; wires wait");
            st.retry = true;
            return Ok(());
        };
        // A pod whose namespace is gone is being collected by the daemon; its ends went
        // with the namespace and its records go as stale below.
        let pods: BTreeMap<PodKey, LocalPod> = self
            .pods()
            .into_iter()
            .filter(|(_, p)| self.kernel.pod_exists(&p.netns))
            .collect();
        let mut records: HashMap<u64, WireEnd> = self
            .store
            .run(|db| db.wires())
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let before: BTreeSet<_> = records.values().map(|r| (r.id, r.state, r.peer_node.clone())).collect();

        // Where this node's pods run: written for the other nodes to read.
        for ((ns, name), pod) in &pods {
            let Some(t) = self.source.topology(ns, name) else {
                continue;
            };
            // The links as the last pass left them; this pass's come at its end.
            let links = self
                .links
                .borrow()
                .get(&(ns.clone(), name.clone()))
                .cloned()
                .unwrap_or_else(|| t.status.as_ref().map(|s| s.links.clone()).unwrap_or_default());
            let want = plan::status_for(me, pod, t.status.as_ref(), links);
            if t.status.as_ref() != Some(&want)
                && let Err(e) = self.source.set_status(ns, name, want).await
            {
                warn!(pod = %format!("{ns}/{name}"), error = %e, "could not publish the pod's status");
                st.retry = true;
            }
        }

        let mut cx = Cx {
            engine: self,
            pass: st,
            records: &mut records,
            me,
        };
        let mut wanted: BTreeSet<u64> = BTreeSet::new();
        let mut attempts: HashMap<u64, Attempt> = HashMap::new();
        for ((ns, name), pod) in &pods {
            let Some(t) = self.source.topology(ns, name) else {
                continue;
            };
            for link in &t.spec.links {
                let want = plan::want(me, self.cfg.default_kind, ns, name, link, &pods, |n, p| {
                    self.source.topology(n, p)
                });
                let id = wire_id(ns, link.uid, name);
                wanted.insert(id);
                let mut builds_peer = None;
                match want {
                    // The other pod's pass builds the pair and writes both records.
                    Want::Veth { builder: false, .. } => {
                        attempts.entry(id).or_insert(Attempt::Done);
                        continue;
                    }
                    Want::Veth { builder: true, .. } => {
                        let peer_id = wire_id(ns, link.uid, &link.peer_pod);
                        wanted.insert(peer_id);
                        builds_peer = Some(peer_id);
                    }
                    Want::Remote { .. } | Want::Absent => {}
                }
                let absent = want == Want::Absent;
                let attempt = match self
                    .reconcile_link(&mut cx, LocalLink { ns, name, pod, link }, want)
                    .await
                {
                    Ok(()) if absent => Attempt::PeerAbsent,
                    Ok(()) => Attempt::Done,
                    Err(e) => {
                        warn!(pod = %format!("{ns}/{name}"), intf = %link.local_intf, link = link.uid, error = %e, "wire not ready; retrying");
                        cx.pass.retry = true;
                        Attempt::Failed {
                            transient: e.waits_on_peer(),
                            error: e.to_string(),
                        }
                    }
                };
                // The pair's other end stands or falls with this one.
                if let Some(peer_id) = builds_peer {
                    attempts.insert(peer_id, attempt.clone());
                }
                attempts.insert(id, attempt);
            }
        }

        // Ends nothing asks for any more: their pod left or the link was removed.
        let stale: Vec<WireEnd> = cx
            .records
            .values()
            .filter(|r| !wanted.contains(&r.id))
            .cloned()
            .collect();
        for r in stale {
            cx.teardown(&r, true).await;
            // A run-time setting lasts as long as its end: the link or the pod left.
            let id = r.id;
            if let Err(e) = self
                .store
                .run(move |db| db.put_link_settings(id, &EndSettings::default()))
                .await
            {
                warn!(wire = r.id, error = %e, "could not forget a wire end's link settings");
            }
        }

        // Impairments and carrier by intent, on every end built so far.
        let settings = self.emulate(&mut cx).await.unwrap_or_else(|_| {
            cx.pass.retry = true;
            HashMap::new()
        });
        self.report_links(me, &pods, cx.records, &attempts, &settings, cx.pass)
            .await;

        let after: BTreeSet<_> = records.values().map(|r| (r.id, r.state, r.peer_node.clone())).collect();
        if before != after || !std::mem::replace(&mut st.mirrored, true) {
            let ends = records.values().cloned().collect();
            if let Err(e) = self.source.set_wire_state(ends).await {
                debug!(error = %e, "could not mirror the wire state");
                st.mirrored = false;
            }
        }
        Ok(())
    }

    /// Brings one link of a local pod where `want` says, through its carrier.
    async fn reconcile_link(&self, cx: &mut Cx<'_, P>, at: LocalLink<'_>, want: Want) -> Result<(), WireError> {
        match want {
            Want::Veth { builder: false, .. } => Ok(()),
            // Two pods of one node are always joined by a veth pair.
            Want::Veth { peer, builder: true } => {
                self.carriers
                    .get(LinkKind::Veth)
                    .reconcile(cx, at, Far::Pod(&peer))
                    .await
            }
            Want::Remote { kind, node } => self.carriers.get(kind).reconcile(cx, at, Far::Node(node)).await,
            Want::Absent => {
                let id = wire_id(at.ns, at.link.uid, at.name);
                match cx.recorded(id).cloned() {
                    Some(r) => self.carriers.get(r.kind).peer_absent(cx, r).await,
                    None => Ok(()),
                }
            }
        }
    }

    /// Works out where each link of each local pod stands, writes a pod's Topology
    /// status when its links moved, and publishes the lot to waiting ADDs.
    async fn report_links(
        &self,
        me: IpAddr,
        pods: &BTreeMap<PodKey, LocalPod>,
        records: &HashMap<u64, WireEnd>,
        attempts: &HashMap<u64, Attempt>,
        settings: &HashMap<u64, EndSettings>,
        st: &mut PassState,
    ) {
        let before = self.links.borrow().clone();
        let mut now: BTreeMap<PodKey, Vec<LinkStatus>> = BTreeMap::new();
        for (key @ (ns, name), pod) in pods {
            let Some(t) = self.source.topology(ns, name) else {
                continue;
            };
            let links: Vec<LinkStatus> = t
                .spec
                .links
                .iter()
                .map(|link| {
                    let id = wire_id(ns, link.uid, name);
                    let attempt = attempts.get(&id).unwrap_or(&Attempt::Done);
                    let down = settings.get(&id).and_then(|s| s.down);
                    let rec = records.get(&id);
                    let waiting = rec
                        .map(|r| self.carriers.get(r.kind).waiting(&link.peer_pod))
                        .unwrap_or_default();
                    plan::link_status(name, link, rec, attempt, down, &waiting)
                })
                .collect();
            let stale = st.links_unwritten.remove(key);
            if stale || before.get(key) != Some(&links) {
                for l in &links {
                    let was = before.get(key).and_then(|b| b.iter().find(|o| o.uid == l.uid));
                    if was.map(|w| (w.state, &w.reason)) != Some((l.state, &l.reason)) {
                        info!(pod = %format!("{ns}/{name}"), intf = %l.local_intf, state = %l.state, reason = %l.reason, "link state");
                    }
                }
                let status = plan::status_for(me, pod, t.status.as_ref(), links.clone());
                if let Err(e) = self.source.set_status(ns, name, status).await {
                    warn!(pod = %format!("{ns}/{name}"), error = %e, "could not publish the pod's link states");
                    st.retry = true;
                    st.links_unwritten.insert(key.clone());
                }
            }
            now.insert(key.clone(), links);
        }
        for state in [LinkPhase::Pending, LinkPhase::Up, LinkPhase::Down, LinkPhase::Failed] {
            let n = now.values().flatten().filter(|l| l.state == state).count();
            self.metrics
                .links
                .get_or_create(&LinkStateLabels { state: state.as_str() })
                .set(n as i64);
        }
        self.links.send_replace(now);
    }
}
