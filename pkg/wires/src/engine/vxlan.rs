//! VXLAN ends: keeping a built end pointed at its peer node, the VNI the two nodes
//! agree on (the proposer offers, the other node holds or refuses), and building the
//! end once it is agreed.

use std::collections::HashMap;
use std::net::IpAddr;

use tracing::{debug, info, warn};
use weft_link::{LinkKind, WireEnd};
use weft_rpc::wire::EndResult;
use weft_topology::Link;

use super::plan;
use super::{Engine, LocalLink};
use crate::error::WireError;
use crate::ids::{next_vni, wire_id};
use crate::plane::GrpcPlane;

/// How many VNIs a proposer tries before giving up for this pass.
const VNI_TRIES: usize = 64;

impl<P: GrpcPlane> Engine<P> {
    /// Brings the VXLAN end of `link` (pod `name`, peer on `node`) where it should be.
    pub(super) async fn reconcile_vxlan(
        &self,
        me: IpAddr,
        at: LocalLink<'_>,
        node: IpAddr,
        records: &mut HashMap<u64, WireEnd>,
    ) -> Result<(), WireError> {
        let LocalLink { ns, name, pod, link } = at;
        let id = wire_id(ns, link.uid, name);
        let rec = records.get(&id).cloned();
        let peer = plan::vxlan_peer(ns, link, node);
        // Already built and pointing at the right node?
        if let Some(r) = rec.as_ref().filter(|r| {
            r.kind == LinkKind::Vxlan && r.netns == pod.netns && r.vni.is_some() && r.peer_node == node.to_string()
        }) {
            let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
            let fdb = self.kernel(move |k| k.vxlan_fdb(&netns, &intf)).await?;
            if let Some(fdb) = fdb.filter(|_| r.state.is_up()) {
                if plan::fdb_points(&fdb, node, peer.mac) {
                    return Ok(());
                }
                // The end is there but someone removed or changed its unicast entries
                // (the record says where they point): put them back in place rather
                // than rebuilding the end under the pod.
                let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                self.kernel(move |k| k.point_vxlan(&netns, &intf, &peer)).await?;
                self.metrics
                    .repairs
                    .get_or_create(&weft_telemetry::metrics::RepairLabels { kind: "fdb" })
                    .inc();
                warn!(wire = id, pod = %name, intf = %link.local_intf, peer = %node, "VXLAN FDB entries had drifted and were restored");
                return Ok(());
            }
        }
        let vni = if plan::proposes(name, &link.peer_pod) {
            self.negotiate_vni(ns, name, link, node, rec.as_ref()).await?
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
            self.teardown(r, false).await;
        }
        let end = plan::local_spec(ns, name, &pod.netns, link, plan::vxlan_mtu(self.cfg.mtu, me));
        self.forget_applied(id);
        self.kernel(move |k| k.create_vxlan(&end, vni, me, &peer)).await?;
        let mut r = plan::record(ns, name, &pod.netns, link, LinkKind::Vxlan, node.to_string());
        r.vni = Some(vni);
        self.put(r, records).await?;
        info!(wire = id, pod = %name, intf = %link.local_intf, vni, peer = %node, "VXLAN wire end built");
        Ok(())
    }

    /// Offers VNIs to the peer's node, starting from the one this end holds (or the
    /// link's derived one), skipping those held here by another end, until one is
    /// accepted.
    async fn negotiate_vni(
        &self,
        ns: &str,
        name: &str,
        link: &Link,
        node: IpAddr,
        rec: Option<&WireEnd>,
    ) -> Result<u32, WireError> {
        let id = wire_id(ns, link.uid, name);
        let mut vni = plan::first_vni(rec, ns, link.uid);
        for _ in 0..VNI_TRIES {
            let holder = self.store.run(move |db| db.vni_holder(vni)).await?;
            if holder.is_some_and(|h| h != id) {
                vni = next_vni(vni);
                continue;
            }
            let end = plan::end_of(ns, name, link, LinkKind::Vxlan, Some(vni));
            let reply = self.call_ends(node, vec![end]).await?;
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
}
