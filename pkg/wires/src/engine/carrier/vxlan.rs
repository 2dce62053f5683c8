//! VXLAN ends: keeping a built end pointed at its peer node, the VNI the two nodes
//! agree on (the proposer offers, the other node holds or refuses), and building the
//! end once it is agreed.

use async_trait::async_trait;
use tracing::{debug, info, warn};
use weft_link::{DownBy, LinkKind, WireEnd, WireState};
use weft_rpc::wire::{End, EndResult};
use weft_store::StoreError;
use weft_topology::Link;

use super::{Carrier, Cx, Far, accept, refuse};
use crate::engine::{Engine, LocalLink, LocalPod, plan};
use crate::error::WireError;
use crate::ids::{next_vni, wire_id};
use crate::plane::GrpcPlane;

/// How many VNIs a proposer tries before giving up for this pass.
const VNI_TRIES: usize = 64;

/// The VXLAN carrier.
pub(super) struct Vxlan;

/// Whether a VXLAN end's carrier is dropped (protodown) where `want` says: the end
/// drops it itself, at either end of the link.
pub(super) fn proto_down(want: Option<DownBy>) -> bool {
    want.is_some()
}

#[async_trait]
impl<P: GrpcPlane> Carrier<P> for Vxlan {
    fn kind(&self) -> LinkKind {
        LinkKind::Vxlan
    }

    async fn reconcile(&self, cx: &mut Cx<'_, P>, at: LocalLink<'_>, far: Far<'_>) -> Result<(), WireError> {
        let LocalLink { ns, name, pod, link } = at;
        let Far::Node(node) = far else {
            return Err(WireError::Invalid("a VXLAN end's peer is on another node".into()));
        };
        let id = wire_id(ns, link.uid, name);
        let rec = cx.recorded(id).cloned();
        let peer = plan::vxlan_peer(ns, link, node);
        // Already built and pointing at the right node?
        if let Some(r) = rec.as_ref().filter(|r| {
            r.kind == LinkKind::Vxlan && r.netns == pod.netns && r.vni.is_some() && r.peer_node == node.to_string()
        }) {
            let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
            let fdb = cx.kernel(move |k| k.vxlan_fdb(&netns, &intf)).await?;
            if let Some(fdb) = fdb.filter(|_| r.state.is_up()) {
                if plan::fdb_points(&fdb, node, peer.mac) {
                    return Ok(());
                }
                // The end is there but someone removed or changed its unicast entries
                // (the record says where they point): put them back in place rather
                // than rebuilding the end under the pod.
                let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                cx.kernel(move |k| k.point_vxlan(&netns, &intf, &peer)).await?;
                cx.engine
                    .metrics
                    .repairs
                    .get_or_create(&weft_telemetry::metrics::RepairLabels { kind: "fdb" })
                    .inc();
                warn!(wire = id, pod = %name, intf = %link.local_intf, peer = %node, "VXLAN FDB entries had drifted and were restored");
                return Ok(());
            }
        }
        let vni = if plan::proposes(name, &link.peer_pod) {
            negotiate_vni(cx.engine, ns, name, link, node, rec.as_ref()).await?
        } else {
            // The proposer's `Ends` call stores the agreed VNI in our record.
            match rec
                .as_ref()
                .filter(|r| r.kind == LinkKind::Vxlan && r.peer_node == node.to_string())
                .and_then(|r| r.vni)
            {
                Some(v) => v,
                None => {
                    debug!(pod = %name, intf = %link.local_intf, "waiting for the peer node to propose a VNI");
                    return Ok(());
                }
            }
        };
        if let Some(r) = &rec
            && (r.kind != LinkKind::Vxlan || r.netns != pod.netns || r.vni != Some(vni))
        {
            cx.remove(r).await;
        }
        let me = cx.me();
        let end = plan::local_spec(ns, name, &pod.netns, link, plan::vxlan_mtu(cx.mtu(), me));
        cx.rebuilt(id);
        cx.kernel(move |k| k.create_vxlan(&end, vni, me, &peer)).await?;
        let mut r = plan::record(ns, name, &pod.netns, link, LinkKind::Vxlan, node.to_string());
        r.vni = Some(vni);
        cx.put(r).await?;
        info!(wire = id, pod = %name, intf = %link.local_intf, vni, peer = %node, "VXLAN wire end built");
        Ok(())
    }

    async fn hold(
        &self,
        cx: &mut Cx<'_, P>,
        r: &WireEnd,
        _before: Option<Option<DownBy>>,
        want: Option<DownBy>,
    ) -> Result<bool, WireError> {
        let (netns, intf, down) = (r.netns.clone(), r.local_intf.clone(), proto_down(want));
        cx.kernel(move |k| k.set_proto_down(&netns, &intf, down)).await
    }

    /// Holds the offered VNI for this node's end in the store (unique per node), or
    /// refuses it when another end holds it here; the pass that follows builds.
    async fn offered(&self, engine: &Engine<P>, from: &str, end: &WireEnd, msg: &End, pod: &LocalPod) -> EndResult {
        let Some(link) = engine
            .source
            .topology(&end.namespace, &end.peer_pod)
            .and_then(|t| t.spec.links.iter().find(|l| l.uid == end.link_uid).cloned())
        else {
            return refuse(format!("pod {} has no link {}", end.peer_pod, end.link_uid));
        };
        let id = end.peer_id;
        let mut r = plan::record(
            &end.namespace,
            &end.peer_pod,
            &pod.netns,
            &link,
            LinkKind::Vxlan,
            from.into(),
        );
        // The offered VNI, 0 included (what the caller proposed is what is held).
        r.vni = Some(msg.vni);
        r.state = WireState::Pending;
        // Keep a built end's record as is when the offer matches it (a repeated call).
        let existing = engine.store.run(move |db| db.wire(id)).await.ok().flatten();
        if existing
            .as_ref()
            .is_some_and(|e| e.vni == r.vni && e.peer_node == from && e.netns == pod.netns)
        {
            return accept();
        }
        if let Some(e) = existing.filter(|e| e.kind == LinkKind::Vxlan) {
            // Re-pointed or re-numbered: the pass rebuilds it from the new record.
            r.state = if e.state.is_up() { WireState::Pending } else { e.state };
        }
        let put = engine.store.run(move |db| db.put_wire(&r)).await;
        engine.records_written();
        match put {
            Ok(()) => accept(),
            Err(StoreError::VniTaken { vni, .. }) => refuse(format!("VNI {vni} is taken on this node")),
            Err(e) => refuse(e.to_string()),
        }
    }

    fn waiting(&self, peer_pod: &str) -> String {
        format!("agreeing on a VNI with the node of pod {peer_pod}")
    }
}

/// Offers VNIs to the peer's node, starting from the one this end holds (or the link's
/// derived one), skipping those held here by another end, until one is accepted.
async fn negotiate_vni<P: GrpcPlane>(
    engine: &Engine<P>,
    ns: &str,
    name: &str,
    link: &Link,
    node: std::net::IpAddr,
    rec: Option<&WireEnd>,
) -> Result<u32, WireError> {
    let id = wire_id(ns, link.uid, name);
    let mut vni = plan::first_vni(rec, ns, link.uid);
    for _ in 0..VNI_TRIES {
        let holder = engine.store.run(move |db| db.vni_holder(vni)).await?;
        if holder.is_some_and(|h| h != id) {
            vni = next_vni(vni);
            continue;
        }
        let end = plan::end_of(ns, name, link, LinkKind::Vxlan, Some(vni));
        let reply = engine.call_ends(node, vec![end]).await?;
        match reply.first() {
            Some(EndResult { accepted: true, .. }) => return Ok(vni),
            Some(EndResult { reason, .. }) => {
                debug!(vni, reason = %reason, "peer refused the VNI; trying the next");
                vni = next_vni(vni);
            }
            None => return Err(WireError::NoAnswer),
        }
    }
    Err(WireError::NoFreeVni)
}
