//! The run loop and the pass: publish where this node's pods run, bring every link of
//! every local pod where the plan says (veth pairs and peers going away here, VXLAN and
//! gRPC ends in their modules), remove ends nothing asks for, mirror the result.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{debug, info, warn};
use weft_link::{EndSettings, LinkKind, LinkPhase, LinkStatus, WireEnd, WireState};
use weft_topology::Link;

use super::plan::{self, Attempt, PodKey, Want};
use super::{Engine, LocalLink, LocalPod};
use crate::convert;
use crate::error::WireError;
use crate::ids::wire_id;
use crate::metrics::LinkStateLabels;
use crate::plane::GrpcPlane;

impl<P: GrpcPlane> Engine<P> {
    /// The reconcile task: a pass whenever asked, the source changes or the timer fires
    /// (sooner while work waits on a peer).
    pub(super) async fn run(self: Arc<Self>) {
        let mut changes = self.source.changes();
        loop {
            let want = self.requested.load(Ordering::Acquire);
            self.retry.store(false, Ordering::Relaxed);
            if let Err(e) = self.pass().await {
                warn!(error = %e, "wire pass failed; retrying");
                self.retry.store(true, Ordering::Relaxed);
            }
            self.done.send_modify(|d| *d = (*d).max(want));
            let wait = if self.retry.load(Ordering::Relaxed) {
                Duration::from_millis(500)
            } else {
                self.cfg.resync
            };
            tokio::select! {
                _ = self.kick.notified() => {}
                r = changes.changed() => if r.is_err() { tokio::time::sleep(wait).await },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One pass over every link of every local pod.
    async fn pass(&self) -> Result<(), WireError> {
        let Some(me) = self.node_address() else {
            debug!("node address not known yet; wires wait");
            self.retry.store(true, Ordering::Relaxed);
            return Ok(());
        };
        // A pod whose namespace is gone is being collected by the daemon; its ends went
        // with the namespace and its records go as stale below.
        let pods: BTreeMap<PodKey, LocalPod> = self
            .pods
            .lock()
            .expect("pods lock")
            .clone()
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
                self.retry.store(true, Ordering::Relaxed);
            }
        }

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
                    _ => {}
                }
                let absent = want == Want::Absent;
                let attempt = match self
                    .reconcile_link(me, LocalLink { ns, name, pod, link }, want, &mut records)
                    .await
                {
                    Ok(()) if absent => Attempt::PeerAbsent,
                    Ok(()) => Attempt::Done,
                    Err(e) => {
                        warn!(pod = %format!("{ns}/{name}"), intf = %link.local_intf, link = link.uid, error = %e, "wire not ready; retrying");
                        self.retry.store(true, Ordering::Relaxed);
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
        let stale: Vec<WireEnd> = records.values().filter(|r| !wanted.contains(&r.id)).cloned().collect();
        for r in stale {
            self.teardown(&r, true).await;
            // A run-time setting lasts as long as its end: the link or the pod left.
            let id = r.id;
            if let Err(e) = self
                .store
                .run(move |db| db.put_link_settings(id, &weft_link::EndSettings::default()))
                .await
            {
                warn!(wire = r.id, error = %e, "could not forget a wire end's link settings");
            }
            records.remove(&r.id);
        }

        // Impairments and carrier by intent, on every end built so far.
        let settings = self.emulate(&records).await.unwrap_or_else(|_| {
            self.retry.store(true, Ordering::Relaxed);
            HashMap::new()
        });
        self.report_links(me, &pods, &records, &attempts, &settings).await;

        let after: BTreeSet<_> = records.values().map(|r| (r.id, r.state, r.peer_node.clone())).collect();
        if before != after || !self.mirrored.swap(true, Ordering::AcqRel) {
            let ends = records.values().cloned().collect();
            if let Err(e) = self.source.set_wire_state(ends).await {
                debug!(error = %e, "could not mirror the wire state");
                self.mirrored.store(false, Ordering::Release);
            }
        }
        Ok(())
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
                    plan::link_status(name, link, records.get(&id), attempt, down)
                })
                .collect();
            let stale = self.links_unwritten.lock().expect("links lock").remove(key);
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
                    self.retry.store(true, Ordering::Relaxed);
                    self.links_unwritten.lock().expect("links lock").insert(key.clone());
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

    /// Brings one link of a local pod where `want` says.
    async fn reconcile_link(
        &self,
        me: IpAddr,
        at: LocalLink<'_>,
        want: Want,
        records: &mut HashMap<u64, WireEnd>,
    ) -> Result<(), WireError> {
        let LocalLink { ns, name, pod, link } = at;
        match want {
            Want::Veth { builder: false, .. } => Ok(()),
            Want::Veth { peer, builder: true } => self.reconcile_veth(ns, name, pod, &peer, link, records).await,
            Want::Absent => self.peer_absent(ns, name, link, records).await,
            Want::Remote {
                kind: LinkKind::Grpc,
                node,
            } => self.reconcile_grpc(ns, name, pod, link, node, records).await,
            Want::Remote { kind: _, node } => self.reconcile_vxlan(me, at, node, records).await,
        }
    }

    /// Builds the veth pair of a link between two pods of this node (this pod builds),
    /// unless both ends are recorded and present.
    async fn reconcile_veth(
        &self,
        ns: &str,
        name: &str,
        pod: &LocalPod,
        peer: &LocalPod,
        link: &Link,
        records: &mut HashMap<u64, WireEnd>,
    ) -> Result<(), WireError> {
        let id = wire_id(ns, link.uid, name);
        let peer_id = wire_id(ns, link.uid, &link.peer_pod);
        let rec = records.get(&id).cloned();
        let peer_rec = records.get(&peer_id).cloned();
        let a = plan::local_spec(ns, name, &pod.netns, link, self.cfg.mtu);
        let b = plan::peer_spec(ns, &peer.netns, link, self.cfg.mtu);
        let intact = rec
            .as_ref()
            .is_some_and(|r| r.kind == LinkKind::Veth && r.netns == pod.netns)
            && peer_rec
                .as_ref()
                .is_some_and(|r| r.kind == LinkKind::Veth && r.netns == peer.netns)
            && {
                let (a, b) = (a.clone(), b.clone());
                self.kernel(move |k| Ok(k.has_interface(&a.netns, &a.intf) && k.has_interface(&b.netns, &b.intf)))
                    .await?
            };
        if intact {
            return Ok(());
        }
        for r in [rec, peer_rec].into_iter().flatten() {
            self.teardown(&r, false).await;
            records.remove(&r.id);
        }
        self.forget_applied(id);
        self.forget_applied(peer_id);
        self.kernel(move |k| k.create_veth(&a, &b)).await?;
        let ours = plan::record(ns, name, &pod.netns, link, LinkKind::Veth, String::new());
        let theirs = plan::mirror(&ours, &peer.netns);
        self.put(ours, records).await?;
        self.put(theirs, records).await?;
        info!(namespace = ns, link = link.uid, a = %format!("{name}:{}", link.local_intf), b = %format!("{}:{}", link.peer_pod, link.peer_intf), "veth wire built");
        Ok(())
    }

    /// The peer pod is up nowhere: a veth pair goes (it dies with either pod anyway);
    /// an end to another node is set down and kept for the peer's return.
    async fn peer_absent(
        &self,
        ns: &str,
        name: &str,
        link: &Link,
        records: &mut HashMap<u64, WireEnd>,
    ) -> Result<(), WireError> {
        let Some(mut r) = records.get(&wire_id(ns, link.uid, name)).cloned() else {
            return Ok(());
        };
        if r.kind == LinkKind::Veth {
            self.teardown(&r, false).await;
            records.remove(&r.id);
            return Ok(());
        }
        if r.state != WireState::Down {
            let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
            self.kernel(move |k| k.set_interface_up(&netns, &intf, false)).await?;
            if let Some(dp) = self.dataplane() {
                dp.set_up(r.id, false);
            }
            r.state = WireState::Down;
            info!(wire = r.id, pod = %name, intf = %r.local_intf, "peer gone: wire end down");
            self.put(r, records).await?;
        }
        Ok(())
    }

    /// Records an end (and its `up` gauge) in the store and in this pass's view.
    pub(super) async fn put(&self, r: WireEnd, records: &mut HashMap<u64, WireEnd>) -> Result<(), WireError> {
        let stored = r.clone();
        self.store.run(move |db| db.put_wire(&stored)).await?;
        let labels = convert::labels(&r);
        // Re-pointed (another peer node, kind or interface): the old series end here.
        if let Some(old) = records.get(&r.id).map(convert::labels)
            && old != labels
        {
            self.metrics.remove_wire(&old);
        }
        self.metrics.up.get_or_create(&labels).set(i64::from(r.state.is_up()));
        records.insert(r.id, r);
        Ok(())
    }

    /// Removes an end: its interface, its worker, its record; tells a remote peer.
    pub(super) async fn teardown(&self, r: &WireEnd, tell_peer: bool) {
        self.forget_applied(r.id);
        if let Some(dp) = self.dataplane() {
            dp.detach(r.id);
            dp.set_impairment(r.id, weft_link::Impairment::default());
        }
        if let Err(e) = self.end_detour(r).await {
            warn!(wire = r.id, error = %e, "could not remove a wire end's link detour");
        }
        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
        if let Err(e) = self.kernel(move |k| k.remove_interface(&netns, &intf)).await {
            warn!(wire = r.id, error = %e, "could not remove a wire end's interface");
        }
        let id = r.id;
        if let Err(e) = self.store.run(move |db| db.remove_wire(id)).await {
            warn!(wire = r.id, error = %e, "could not forget a wire end");
        }
        self.metrics.remove_wire(&convert::labels(r));
        info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, kind = %r.kind, "wire end removed");
        if tell_peer
            && let Ok(node) = r.peer_node.parse::<IpAddr>()
            && let Err(e) = self.call_ends(node, vec![convert::to_message(r, false)]).await
        {
            debug!(wire = r.id, error = %e, "could not tell the peer node; it sees the pod's status instead");
        }
    }
}
