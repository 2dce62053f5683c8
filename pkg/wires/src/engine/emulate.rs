//! Link emulation: each pass brings every end's impairment (netem on what it sends, or
//! a link detour through weftd where the kernel has no netem) and carrier by intent
//! where the topology and the operator's run-time settings say, and operators change a
//! link at one end (`link_change`), the other end following on this node or, told over
//! `Ends`, on the peer's.
//!
//! What was applied to each end is remembered, so a pass touches the kernel only for
//! ends whose settings changed or that were (re)built; a restarted daemon applies
//! every end's settings once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use tracing::{info, warn};
use weft_link::{DownBy, EndNotFound, EndSettings, Impairment, LinkChange, LinkView, WireEnd, WireState};
use weft_rpc::wire::{Carrier as CarrierMsg, End, EndResult, LinkControl};

use super::Engine;
use super::cx::{Applied, Cx};
use super::plan::{self, PodKey};
use crate::convert;
use crate::error::WireError;
use crate::plane::GrpcPlane;

/// Which ends a pass's emulation visits (besides those never set or to be set afresh,
/// and those whose settings are not in force, which it always visits).
#[derive(Debug, Clone, Copy)]
pub(super) enum Visit<'a> {
    /// Every end: a pass of every pod.
    All,
    /// The ends of the pods a pass looked at. `fresh`: the records were read afresh
    /// from the store, so which were never set is found by going through them all.
    Pods { scope: &'a BTreeSet<PodKey>, fresh: bool },
}

impl<P: GrpcPlane> Engine<P> {
    /// The topology's impairment for what end `r` sends.
    fn topology_impairment(&self, r: &WireEnd) -> Impairment {
        let entry = |pod: &str| {
            self.source
                .topology(&r.namespace, pod)
                .and_then(|t| t.spec.links.iter().find(|l| l.uid == r.link_uid).cloned())
        };
        plan::topology_impairment(entry(&r.local_pod).as_ref(), entry(&r.peer_pod).as_ref())
    }

    /// Why end `id`'s settings are not in force, if they are not.
    fn problem(&self, id: u64) -> Option<String> {
        self.problems.lock().expect("problems lock").get(&id).cloned()
    }

    /// Records (or clears) why end `r`'s settings are not in force, logging a new reason
    /// once rather than at every pass.
    fn set_problem(&self, r: &WireEnd, problem: Option<String>) {
        let mut all = self.problems.lock().expect("problems lock");
        match problem {
            Some(p) => {
                if all.get(&r.id) != Some(&p) {
                    warn!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, error = %p, "could not apply the link's emulation; retrying at each pass");
                }
                all.insert(r.id, p);
            }
            None => {
                all.remove(&r.id);
            }
        }
    }

    /// Brings the built ends of the pass to their impairment and carrier by intent,
    /// through each end's carrier, going by the run-time `settings`: the ends `visit`
    /// names, and any other end never applied or whose emulation is not in force (an
    /// end the pass did not look at, applied as it should be, stays: neither its pod,
    /// its peer nor its settings moved). What it goes through is what the pass looked
    /// at, not every end of the node.
    pub(super) async fn emulate(
        &self,
        cx: &mut Cx<'_, P>,
        settings: &HashMap<u64, EndSettings>,
        visit: Visit<'_>,
    ) -> Result<(), WireError> {
        self.list_leftover_detours(cx).await?;
        let unapplied = std::mem::take(&mut cx.pass.unapplied);
        let ids: BTreeSet<u64> = match visit {
            Visit::All => cx.records.values().map(|r| r.id).collect(),
            Visit::Pods { scope, fresh } => {
                let problems: HashSet<u64> = self.problems.lock().expect("problems lock").keys().copied().collect();
                let mut ids: BTreeSet<u64> = (scope.iter().flat_map(|k| cx.records.of_pod(k)))
                    .map(|r| r.id)
                    .chain(unapplied)
                    .chain(problems)
                    .collect();
                if fresh {
                    let applied = &cx.pass.applied;
                    ids.extend(
                        cx.records
                            .values()
                            .filter(|r| !applied.contains_key(&r.id))
                            .map(|r| r.id),
                    );
                }
                ids
            }
        };
        for id in ids {
            // Pending (built later, and then visited) or gone.
            let Some(r) = cx.records.get(&id).filter(|r| r.state != WireState::Pending).cloned() else {
                continue;
            };
            let s = settings.get(&r.id).copied().unwrap_or_default();
            let want_imp = s.impairment.unwrap_or_else(|| self.topology_impairment(&r));
            let known = cx.pass.applied.get(&r.id).copied();
            let want = Applied {
                impairment: Some(want_imp),
                down: Some(s.down),
            };
            // An end nothing was ever set on is as it was built (up, unimpaired): a
            // start need not visit every such end's namespace, which at thousands of
            // ends would slow the first pass.
            let left_detour = cx
                .pass
                .leftover_detours
                .as_ref()
                .is_some_and(|l| l.contains(&(r.id & crate::ids::DETOUR_ID_BITS)));
            if known.is_none() && want_imp.is_empty() && s.down.is_none() && !left_detour {
                cx.pass.applied.insert(r.id, want);
                continue;
            }
            let mut a = known.unwrap_or_default();
            if a == want {
                continue;
            }
            let carrier = self.carriers.get(r.kind);
            let labels = convert::labels(&r);
            let mut problem = None;
            if a.down != Some(s.down) {
                match carrier.hold(cx, &r, a.down, s.down).await {
                    Ok(true) => {
                        a.down = Some(s.down);
                        self.metrics
                            .down_by_intent
                            .get_or_create(&labels)
                            .set(i64::from(s.down.is_some()));
                        if s.down.is_some() || a.impairment.is_some() {
                            info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, down = s.down.is_some(), "link state by intent applied");
                        }
                    }
                    Ok(false) => {}
                    Err(e) => problem = Some(e.to_string()),
                }
            }
            if a.impairment != Some(want_imp) {
                match carrier.impair(cx, &r, want_imp).await {
                    Ok(true) => {
                        if !want_imp.is_empty() || a.impairment.is_some() {
                            info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, impairment = %want_imp, "link impairment applied");
                        }
                        a.impairment = Some(want_imp);
                        self.metrics.set_impairment(&labels, &want_imp);
                    }
                    Ok(false) => {}
                    Err(e) => problem = Some(e.to_string()),
                }
            }
            self.set_problem(&r, problem);
            cx.pass.applied.insert(r.id, a);
        }
        Ok(())
    }

    /// Notes the link detours an earlier run left on this node, once: an end that no
    /// longer needs its detour is visited by the first pass even if it has no settings.
    async fn list_leftover_detours(&self, cx: &mut Cx<'_, P>) -> Result<(), WireError> {
        if cx.pass.leftover_detours.is_none() {
            let ids = self.kernel(|k| k.detours()).await?;
            cx.pass.leftover_detours = Some(ids.into_iter().collect());
        }
        Ok(())
    }

    /// The end `pod`:`intf` of this node (in namespace `ns`, or the only one that has
    /// such a pod).
    async fn named_end(&self, ns: Option<&str>, pod: &str, intf: &str) -> Result<WireEnd, WireError> {
        let ends: Vec<WireEnd> = self
            .wires()
            .await?
            .into_iter()
            .filter(|r| r.local_pod == pod && r.local_intf == intf && ns.is_none_or(|n| n == r.namespace))
            .collect();
        match ends.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(EndNotFound::Missing {
                namespace: ns.map(str::to_string),
                pod: pod.into(),
                intf: intf.into(),
            }
            .into()),
            many => Err(EndNotFound::Ambiguous {
                pod: pod.into(),
                intf: intf.into(),
                namespaces: many.iter().map(|r| r.namespace.clone()).collect(),
            }
            .into()),
        }
    }

    /// Where the frames of the end `pod`:`intf` of this node can be captured: the pod's
    /// namespace path and the end's interface in it. Every kind of end is an interface
    /// in the pod, so a capture there sees the link as the pod does.
    pub async fn capture_target(&self, ns: Option<&str>, pod: &str, intf: &str) -> Result<(String, String), WireError> {
        // A pending end may have its interface already (a gRPC end is built before its
        // peer answers): whether it can be captured is the kernel's to say.
        let r = self.named_end(ns, pod, intf).await?;
        Ok((r.netns, r.local_intf))
    }

    /// Changes the link whose end here is `pod`:`intf` at both ends (the other end on
    /// this node, or told to its node), keeps the change in the store, and returns the
    /// named end once a pass applied it.
    pub async fn link_change(
        &self,
        ns: Option<&str>,
        pod: &str,
        intf: &str,
        change: LinkChange,
    ) -> Result<LinkView, WireError> {
        if let LinkChange::Set(imp) = &change {
            imp.check().map_err(|e| WireError::Invalid(e.to_string()))?;
        }
        let r = self.named_end(ns, pod, intf).await?;
        let mut all = self.store.run(|db| db.link_settings()).await?;
        let here = all.remove(&r.id).unwrap_or_default();
        let there = all.remove(&r.peer_id).unwrap_or_default();
        let (mine, theirs) = plan::settle_change(&change, here, there);
        let id = r.id;
        self.store.run(move |db| db.put_link_settings(id, &mine)).await?;
        if r.kind.crosses_nodes() {
            self.tell_peer(&r, &change).await?;
        } else {
            let peer_id = r.peer_id;
            self.store.run(move |db| db.put_link_settings(peer_id, &theirs)).await?;
        }
        info!(pod = %pod, intf = %intf, change = ?change, "link changed by an operator");
        // The pass sees the settings move (the far end's too, on this node).
        self.pass_of_and_wait([plan::owner(&r)]).await;
        let topology = self.topology_impairment(&r);
        let problem = self.problem(r.id);
        let mut v = plan::view(r, topology, mine);
        v.problem = problem;
        Ok(v)
    }

    /// Tells the peer's node of end `r` to apply `change` to its end.
    async fn tell_peer(&self, r: &WireEnd, change: &LinkChange) -> Result<(), WireError> {
        let not_told = |reason: String| WireError::PeerNotTold {
            node: r.peer_node.clone(),
            reason,
        };
        let node: IpAddr = r
            .peer_node
            .parse()
            .map_err(|_| not_told("its address is not known".into()))?;
        let mut control = LinkControl::default();
        match change {
            LinkChange::Set(imp) => {
                control.set_impairment = true;
                control.impairment = imp.to_map().into_iter().collect();
            }
            LinkChange::Reset => control.reset_impairment = true,
            LinkChange::Down => control.carrier = CarrierMsg::Down as i32,
            LinkChange::Up => control.carrier = CarrierMsg::Up as i32,
        }
        // The end's own VNI: a node that predates `control` sees a repeated offer.
        let mut end = convert::to_message(r, true);
        end.control = Some(control);
        match self.call_ends(node, vec![end]).await {
            Ok(results) => match results.first() {
                Some(EndResult { accepted: true, .. }) => Ok(()),
                Some(EndResult { reason, .. }) => Err(not_told(reason.clone())),
                None => Err(not_told("no answer".into())),
            },
            Err(e) => Err(not_told(e.to_string())),
        }
    }

    /// Serves a peer node's change of the link whose end here is `id` (see
    /// [`link_change`](Self::link_change)).
    pub(super) async fn controlled(
        &self,
        id: u64,
        caller: &str,
        msg: &End,
        control: &LinkControl,
    ) -> Result<(), String> {
        let Some(end) = self.store.run(move |db| db.wire(id)).await.map_err(|e| e.to_string())? else {
            return Err(format!(
                "pod {}/{} has no end of link {} here",
                msg.namespace, msg.peer_pod, msg.link_uid
            ));
        };
        // Only the node holding the other end may change this one.
        if end.peer_node != caller {
            return Err(format!(
                "node {caller} does not hold the other end of {}:{} (its peer node is {:?})",
                end.local_pod, end.local_intf, end.peer_node
            ));
        }
        let mut s: EndSettings = self
            .store
            .run(|db| db.link_settings())
            .await
            .map_err(|e| e.to_string())?
            .remove(&id)
            .unwrap_or_default();
        if control.reset_impairment {
            s.impairment = None;
        } else if control.set_impairment {
            s.impairment = Some(Impairment::from_map(&control.impairment).map_err(|e| e.to_string())?);
        }
        match CarrierMsg::try_from(control.carrier) {
            Ok(CarrierMsg::Down) => s.down = Some(DownBy::Peer),
            Ok(CarrierMsg::Up) => s.down = None,
            _ => {}
        }
        self.store
            .run(move |db| db.put_link_settings(id, &s))
            .await
            .map_err(|e| e.to_string())?;
        info!(wire = id, pod = %msg.peer_pod, "link changed by the peer node");
        Ok(())
    }

    /// Every end of this node (of pod `pod` in namespace `ns`, when given) with its
    /// emulation settings.
    pub async fn links(&self, ns: Option<&str>, pod: Option<&str>) -> Result<Vec<LinkView>, WireError> {
        let settings = self.store.run(|db| db.link_settings()).await?;
        Ok(self
            .wires()
            .await?
            .into_iter()
            .filter(|r| ns.is_none_or(|n| n == r.namespace) && pod.is_none_or(|p| p == r.local_pod))
            .map(|r| {
                let s = settings.get(&r.id).copied().unwrap_or_default();
                let topology = self.topology_impairment(&r);
                let problem = self.problem(r.id);
                let mut v = plan::view(r, topology, s);
                v.problem = problem;
                v
            })
            .collect())
    }
}
