//! The run task and its pass: publish where this node's pods run, bring every link of
//! the pods the pass looks at where the plan says (through the link's carrier), remove
//! ends nothing asks for, apply emulation, report and mirror the result.
//!
//! A pass looks at the pods that moved since the last one and the local pods linked to
//! them ([`plan::affected`]): pods attached or detached, pods whose Topology changed
//! (the source keeps an unchanged one's `Arc`, so a pointer tells), pods a peer node
//! spoke of, pods whose run-time settings changed, pods whose last attempt failed. Once
//! every resync interval (put off while pods keep moving, at most by one more interval:
//! [`resync`]), and when asked or when this node's address changes, a pass looks at
//! every pod and reads their kernel objects back, which repairs drift. So a
//! node of thousands of links wires each arriving pod in time of its own links, not of
//! the node's.
//!
//! What the task remembers from one pass to the next ([`PassState`]) is owned by it
//! and lent to each pass; no other path reads or writes it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imbl::ordmap::DiffItem;

use tracing::{debug, info, warn};
use weft_link::{EndSettings, LinkKind, LinkStatus, WireEnd, WireState};
use weft_topology::resync::{RESYNC_QUIET, Resync};

use super::carrier::Far;
use super::cx::{Cx, LinkCounts, PassState};
use super::emulate::Visit;
use super::plan::{self, Attempt, PodKey, Want};
use super::records::Records;
use super::{Engine, LocalLink, Pods};
use crate::error::WireError;
use crate::ids::wire_id;
use crate::metrics::{LinkStateLabels, PassLabels};
use crate::plane::GrpcPlane;

/// How long a pass moved by a change of the topology source waits for more changes
/// (unless one is asked for meanwhile): a remote pod's arrival reaches its local peers
/// this much later at most.
const SETTLE: Duration = Duration::from_millis(20);

/// When to look at every pod: [`weft_topology::resync`]'s rule (once per resync
/// interval, put off while pods keep moving for at most one more interval), with a
/// pass after a failed one looking at every pod at once.
fn resync(st: &PassState, interval: Duration, now: Instant) -> Resync {
    weft_topology::resync::resync(st.last_full.filter(|_| !st.failed), st.last_moved, interval, now)
}

/// The pod end `r` belongs to, as a borrowed pair.
fn owned(r: &WireEnd) -> (&str, &str) {
    (r.namespace.as_str(), r.local_pod.as_str())
}

impl<P: GrpcPlane> Engine<P> {
    /// The run task: a pass whenever asked, the source changes or the timer fires
    /// (sooner while work waits on a peer), of every pod once per resync interval. It
    /// owns the passes' memory.
    pub(super) async fn run(self: Arc<Self>) {
        let mut changes = self.source.changes();
        let mut st = PassState::default();
        loop {
            let want = self.passes.requested();
            st.retry = false;
            let due = resync(&st, self.cfg.resync, Instant::now());
            let every = due == Resync::Now;
            if due == Resync::Waits {
                debug!("a resync is due; it waits until the pods stop moving");
            }
            st.failed = false;
            let started = Instant::now();
            let passed = self.pass(&mut st, every).await;
            // A pass asked to look at every pod does, whatever asked it.
            let scope = if every || st.last_full.is_some_and(|t| t >= started) {
                "every"
            } else {
                "pods"
            };
            self.metrics
                .pass_seconds
                .get_or_create(&PassLabels { scope })
                .observe(started.elapsed().as_secs_f64());
            if let Err(e) = passed {
                warn!(error = %e, "wire pass failed; retrying");
                st.retry = true;
                st.failed = true;
            }
            self.passes.done(want);
            let wait = if st.retry {
                Duration::from_millis(500)
            } else if due == Resync::Waits {
                RESYNC_QUIET
            } else {
                self.cfg.resync
            };
            let wait = st
                .mirror_due
                .map_or(wait, |d| wait.min(d.saturating_duration_since(Instant::now())));
            tokio::select! {
                _ = self.passes.kicked() => {}
                r = changes.changed() => if r.is_err() {
                    tokio::time::sleep(wait).await
                } else {
                    // A change of the source comes in bursts (every pod's arrival in a
                    // lab is a status write or two on every node): one pass for the
                    // burst, not one per write. A pass asked for (an ADD waiting on
                    // it) cuts the wait short.
                    tokio::select! {
                        _ = self.passes.kicked() => {}
                        _ = tokio::time::sleep(SETTLE) => {}
                    }
                },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The attached pods whose namespace is not gone. Every pod's namespace is looked at
    /// when `every`, or when the kernel's namespace epoch moved (or it has none) since
    /// the last look; otherwise only those of the pods attached or replaced since, and
    /// the pods found gone before stay gone: a look per pass at every pod of the node,
    /// at every ADD, made the bring-up quadratic.
    fn alive_pods(&self, st: &mut PassState, every: bool) -> Pods {
        // Read before the look: a namespace that goes during it moves the epoch, and
        // the next pass looks at every pod's again.
        let epoch = self.kernel.gone_epoch();
        let attached = self.pods();
        if every || epoch.is_none() || epoch != st.ns_epoch {
            let paths: Vec<&str> = attached.values().map(|p| p.netns.as_str()).collect();
            let gone: HashSet<&str> = self.kernel.gone(&paths).into_iter().collect();
            st.ns_gone = (attached.iter())
                .filter(|(_, p)| gone.contains(p.netns.as_str()))
                .map(|(k, _)| k.clone())
                .collect();
        } else {
            let mut fresh: Vec<(&PodKey, &str)> = Vec::new();
            for d in st.ns_seen.diff(&attached) {
                match d {
                    DiffItem::Add(k, p) | DiffItem::Update { new: (k, p), .. } => {
                        st.ns_gone.remove(k);
                        fresh.push((k, p.netns.as_str()));
                    }
                    DiffItem::Remove(k, _) => {
                        st.ns_gone.remove(k);
                    }
                }
            }
            if !fresh.is_empty() {
                let paths: Vec<&str> = fresh.iter().map(|(_, p)| *p).collect();
                let gone: HashSet<&str> = self.kernel.gone_new(&paths).into_iter().collect();
                st.ns_gone.extend(
                    fresh
                        .iter()
                        .filter(|(_, p)| gone.contains(p))
                        .map(|(k, _)| (*k).clone()),
                );
            }
        }
        st.ns_seen = attached.clone();
        st.ns_epoch = epoch;
        if st.ns_gone.is_empty() {
            attached
        } else {
            let mut alive = attached;
            for k in &st.ns_gone {
                alive.remove(k);
            }
            alive
        }
    }

    /// One pass over the links of the pods that moved (of every local pod when `every`
    /// or asked), see the module documentation.
    async fn pass(&self, st: &mut PassState, every: bool) -> Result<(), WireError> {
        // Taken before the pods are read: a request's pod is attached before it asks,
        // so what is taken here is in the pods read below (one asked after is left
        // for the next pass, which its request number waits for). Without an address
        // nothing is lost: the first pass that knows it looks at every pod.
        let asked = self.passes.take_asked();
        let Some(me) = self.node_address() else {
            debug!("node address not known yet; wires wait");
            st.retry = true;
            return Ok(());
        };
        let every = every || asked.all || st.me.replace(me) != Some(me);
        let settings = self.store.run(|db| db.link_settings()).await?;
        let (mut records, fresh) = self.records(st, every).await?;

        // The source's change counter, read before its topologies (a change after it
        // moves it again): while it stands, no topology moved, and the pass need not
        // go through the cluster's topologies to find none did.
        let generation = *self.source.changes().borrow();
        let mut seeds = if every || st.source_seen != Some(generation) {
            st.source_seen = Some(generation);
            st.moved(self.source.topologies())
        } else {
            BTreeSet::new()
        };
        seeds.extend(st.resettled(&settings, &records));
        seeds.extend(asked.pods);
        seeds.append(&mut st.retry_pods);
        // A pod whose namespace is gone is being collected by the daemon; its ends went
        // with the namespace and its records go as stale below (every pod asked about:
        // what its linked pods say follows at this pass, not at the next look at every
        // pod).
        let pods = self.alive_pods(st, every);
        seeds.extend(st.came_or_went(&pods));
        // Pods that moved and do not run here (any more): their ends, if any, are stale.
        let departed: Vec<&PodKey> = seeds.iter().filter(|k| !pods.contains_key(*k)).collect();
        let scope: BTreeSet<PodKey> = if every {
            st.last_full = Some(Instant::now());
            pods.keys().cloned().collect()
        } else {
            plan::affected(&pods, &seeds, |n, p| self.source.topology(n, p), &st.listers)
        };
        let moved = !scope.is_empty() || !departed.is_empty();
        if moved && !every {
            st.last_moved = Some(Instant::now());
        }
        // The pods looked at as borrowed pairs, to test ends by without allocating.
        let looked: HashSet<(&str, &str)> = scope.iter().map(|(n, p)| (n.as_str(), p.as_str())).collect();

        // Where this node's pods run: written for the other nodes to read.
        for key @ (ns, name) in &scope {
            let (Some(pod), Some(t)) = (pods.get(key), self.source.topology(ns, name)) else {
                continue;
            };
            // The links as the last pass left them; this pass's come at its end.
            let links = self
                .links
                .borrow()
                .get(key)
                .cloned()
                .unwrap_or_else(|| t.status.as_ref().map(|s| s.links.clone()).unwrap_or_default());
            let want = plan::status_for(me, pod, t.status.as_ref(), links);
            if t.status.as_ref() != Some(&want)
                && let Err(e) = self.source.set_status(ns, name, want).await
            {
                warn!(pod = %format!("{ns}/{name}"), error = %e, "could not publish the pod's status");
                st.retry = true;
                st.retry_pods.insert(key.clone());
            }
        }

        let mut cx = Cx {
            engine: self,
            pass: st,
            records: &mut records,
            me,
            built: BTreeMap::new(),
        };
        let mut attempts: HashMap<u64, Attempt> = HashMap::new();
        for key @ (ns, name) in &scope {
            let (Some(pod), Some(t)) = (pods.get(key), self.source.topology(ns, name)) else {
                continue;
            };
            for link in &t.spec.links {
                let want = plan::want(me, self.cfg.default_kind, ns, name, link, &pods, |n, p| {
                    self.source.topology(n, p)
                });
                let id = wire_id(ns, link.uid, name);
                let mut builds_peer = None;
                match want {
                    // The other pod's pass builds the pair and writes both records.
                    Want::Veth { builder: false, .. } => {
                        attempts.entry(id).or_insert(Attempt::Done);
                        continue;
                    }
                    Want::Veth { builder: true, .. } => {
                        builds_peer = Some(wire_id(ns, link.uid, &link.peer_pod));
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
                        cx.pass.retry_pods.insert(key.clone());
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

        // Ends nothing asks for any more: their pod left or the link was removed. Those of
        // the pods looked at and the pods that left, unless the records were read afresh
        // (a kept record's pod that stopped running here is among the pods that left).
        let candidates: Vec<&WireEnd> = if every || fresh {
            cx.records.values().collect()
        } else {
            (scope.iter().chain(departed.iter().copied()))
                .flat_map(|k| cx.records.of_pod(k))
                .collect()
        };
        // Whether an end's pod still runs here: asked of every end when the records were
        // read afresh (then a set of the pods pays), of the few ends not looked at
        // otherwise (a set of every pod would cost the node at every pass).
        let alive: Option<HashSet<(&str, &str)>> =
            (fresh && !every).then(|| pods.keys().map(|(n, p)| (n.as_str(), p.as_str())).collect());
        let runs_here = |r: &WireEnd| match &alive {
            Some(a) => a.contains(&owned(r)),
            None => pods.contains_key(&(r.namespace.clone(), r.local_pod.clone())),
        };
        let stale: Vec<WireEnd> = candidates
            .into_iter()
            .filter(|r| {
                (every || looked.contains(&owned(r)) || !runs_here(r))
                    && !plan::end_wanted(r, &pods, |n, p| self.source.topology(n, p))
            })
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

        cx.tell_built();

        // Impairments and carrier by intent, on the ends built so far.
        let visit = if every {
            Visit::All
        } else {
            Visit::Pods { scope: &scope, fresh }
        };
        if self.emulate(&mut cx, &settings, visit).await.is_err() {
            cx.pass.retry = true;
            cx.pass.failed = true;
        }
        self.report_links(me, &pods, &scope, &departed, cx.records, &attempts, &settings, cx.pass)
            .await;

        st.mirror_due = None;
        if !st.mirrored {
            let due = st
                .mirrored_at
                .map(|t| t + weft_topology::wire_state_interval(records.len()));
            if every || due.is_none_or(|d| Instant::now() >= d) {
                let ends = records.values().cloned().collect();
                st.mirrored_at = Some(Instant::now());
                st.mirrored = true;
                if let Err(e) = self.source.set_wire_state(ends).await {
                    debug!(error = %e, "could not mirror the wire state");
                    st.mirrored = false;
                    st.retry = true;
                }
            } else {
                // Written by the pass the run task wakes for then, if none comes sooner.
                st.mirror_due = due;
            }
        }
        st.records = Some(records);
        Ok(())
    }

    /// The wire ends as the store records them: those the last pass kept, or read
    /// afresh (see [`PassState::records`]; then `true`); a fresh read that differs from
    /// what was kept has the wire-state resource written again.
    async fn records(&self, st: &mut PassState, every: bool) -> Result<(Records, bool), WireError> {
        let epoch = self.records_epoch.load(std::sync::atomic::Ordering::Acquire);
        match st.records.take() {
            Some(kept) if !every && !st.records_doubtful && st.records_epoch == epoch => Ok((kept, false)),
            kept => {
                let fresh: Records = self.store.run(|db| db.wires()).await?.into_iter().collect();
                let shown = |m: &Records| -> BTreeSet<(u64, WireState, String)> {
                    m.values().map(|r| (r.id, r.state, r.peer_node.clone())).collect()
                };
                if kept.as_ref().is_none_or(|k| shown(k) != shown(&fresh)) {
                    st.mirrored = false;
                }
                st.records_epoch = epoch;
                st.records_doubtful = false;
                Ok((fresh, true))
            }
        }
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

    /// Works out where each link of the pods in `scope` (and of those whose status
    /// could not be written) stands, writes a pod's Topology status when its links
    /// moved, and publishes the lot to waiting ADDs.
    #[allow(clippy::too_many_arguments)]
    async fn report_links(
        &self,
        me: IpAddr,
        pods: &Pods,
        scope: &BTreeSet<PodKey>,
        departed: &[&PodKey],
        records: &Records,
        attempts: &HashMap<u64, Attempt>,
        settings: &HashMap<u64, EndSettings>,
        st: &mut PassState,
    ) {
        let unwritten = std::mem::take(&mut st.links_unwritten);
        let mut now: BTreeMap<PodKey, Vec<LinkStatus>> = BTreeMap::new();
        let mut gone: Vec<PodKey> = Vec::new();
        for key @ (ns, name) in scope.iter().chain(unwritten.difference(scope)) {
            let (Some(pod), Some(t)) = (pods.get(key), self.source.topology(ns, name)) else {
                gone.push(key.clone());
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
            let before = self.links.borrow().get(key).cloned();
            if unwritten.contains(key) || before.as_ref() != Some(&links) {
                for l in &links {
                    let was = before.as_ref().and_then(|b| b.iter().find(|o| o.uid == l.uid));
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
        // The pods that stopped running here are among those that left. A pass that
        // looked at every pod (as one of every pod does, and one follows a failed pass)
        // also drops any other pod not running here: its cost is the node's anyway.
        let counts = &mut st.link_counts;
        let every = scope.len() == pods.len();
        self.links.send_modify(|all| {
            if every {
                all.retain(|k, links| {
                    let keep = pods.contains_key(k);
                    if !keep {
                        counts.add(links, -1);
                    }
                    keep
                });
            }
            for k in departed.iter().copied().chain(&gone) {
                if let Some(old) = all.remove(k) {
                    counts.add(&old, -1);
                }
            }
            for (k, links) in now {
                counts.add(&links, 1);
                if let Some(old) = all.insert(k, links) {
                    counts.add(&old, -1);
                }
            }
        });
        for state in LinkCounts::PHASES {
            self.metrics
                .links
                .get_or_create(&LinkStateLabels { state: state.as_str() })
                .set(counts.get(state));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(full: Option<Instant>, moved: Option<Instant>, failed: bool) -> PassState {
        PassState {
            last_full: full,
            last_moved: moved,
            failed,
            ..PassState::default()
        }
    }

    /// A due resync waits while pods move, runs once they stood still for the quiet
    /// time or a second interval has gone by; the first pass and one after a failure
    /// look at every pod whatever moves.
    #[test]
    fn a_due_resync_waits_for_the_pods_to_stop_moving_for_at_most_an_interval() {
        let interval = Duration::from_secs(10);
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let full = Some(t0);
        // (last full look, last pods moved, last pass failed, now, expected, why)
        let cases = [
            (None, Some(0.0), false, 0.0, Resync::Now, "the first pass"),
            (full, None, false, 9.9, Resync::NotDue, "not due"),
            (full, None, false, 10.0, Resync::Now, "due, nothing moved"),
            (full, Some(9.5), false, 10.2, Resync::Waits, "pods moved 0.7 s ago"),
            (full, Some(9.0), false, 10.0, Resync::Now, "pods stood still 1 s"),
            (full, Some(19.9), false, 19.95, Resync::Waits, "moving, second interval"),
            (full, Some(19.99), false, 20.0, Resync::Now, "two intervals: runs"),
            (full, Some(10.0), true, 10.1, Resync::Now, "after a failed pass"),
            (full, Some(5.0), true, 5.1, Resync::Now, "failed, not due"),
        ];
        for (last_full, moved, failed, now, want, why) in cases {
            let st = state(last_full, moved.map(at), failed);
            assert_eq!(resync(&st, interval, at(now)), want, "{why}");
        }
    }
}
