//! gRPC ends: each side builds its own pair and worker (no negotiation: frames carry
//! derived ids), and a restarted daemon re-attaches the pairs the kernel kept.

use std::collections::HashMap;
use std::net::IpAddr;

use tracing::{debug, info, warn};
use weft_link::{LinkKind, WireEnd, WireState};
use weft_topology::Link;

use super::plan;
use super::{Engine, LocalPod};
use crate::convert;
use crate::error::WireError;
use crate::ids::wire_id;
use crate::plane::GrpcPlane;

impl<P: GrpcPlane> Engine<P> {
    /// Re-attaches every gRPC end the store holds to its veth pair (kept by the kernel
    /// while weftd was away) under the same wire id, so frames resume where they stopped.
    pub(super) async fn restore_grpc_ends(&self) {
        let Ok(records) = self.store.run(|db| db.wires()).await else {
            return;
        };
        let Some(dp) = self.dataplane() else { return };
        for r in records.into_iter().filter(|r| r.kind == LinkKind::Grpc) {
            let Ok(peer) = r.peer_node.parse::<IpAddr>() else {
                continue;
            };
            let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
            let stats = match self.kernel(move |k| k.link_stats(&netns, &intf)).await {
                Ok(Some(st)) => st,
                Ok(None) => {
                    debug!(
                        wire = r.id,
                        error = "its pod end is gone",
                        "gRPC wire end not restored; the next pass rebuilds it"
                    );
                    continue;
                }
                Err(e) => {
                    debug!(wire = r.id, error = %e, "gRPC wire end not restored; the next pass rebuilds it");
                    continue;
                }
            };
            // The worker counts in memory, which died with the last process; the pod
            // end's kernel counters did not, so the wire's series continue from them
            // instead of dropping to zero.
            match dp.attach(convert::grpc_end(&r, peer)) {
                Ok(()) => {
                    self.seed_counters(&r, &stats);
                    info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, "gRPC wire end re-attached")
                }
                Err(WireError::DataPlane(e)) => {
                    self.seed_counters(&r, &stats);
                    warn!(wire = r.id, error = %e, "could not re-attach a gRPC wire end")
                }
                Err(e) => debug!(wire = r.id, error = %e, "gRPC wire end not restored; the next pass rebuilds it"),
            }
        }
    }

    /// Brings the gRPC end of `link` (pod `name`, peer on `node`) where it should be:
    /// up and attached, or rebuilt (pair and worker) when it is not.
    pub(super) async fn reconcile_grpc(
        &self,
        ns: &str,
        name: &str,
        pod: &LocalPod,
        link: &Link,
        node: IpAddr,
        records: &mut HashMap<u64, WireEnd>,
    ) -> Result<(), WireError> {
        let id = wire_id(ns, link.uid, name);
        let rec = records.get(&id).cloned();
        let dp = self.dataplane().ok_or(WireError::NoNodeAddress)?;
        let ok = rec.as_ref().is_some_and(|r| {
            r.kind == LinkKind::Grpc && r.netns == pod.netns && r.peer_node == node.to_string() && dp.attached(r.id)
        });
        if ok {
            let mut r = rec.expect("checked");
            if !r.state.is_up() {
                let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                self.kernel(move |k| k.set_interface_up(&netns, &intf, true)).await?;
                dp.set_up(r.id, true);
                r.state = WireState::Up;
                self.put(r, records).await?;
            }
            return Ok(());
        }
        if let Some(r) = &rec {
            dp.detach(r.id);
            if r.kind != LinkKind::Grpc || r.netns != pod.netns {
                self.teardown(r, false).await;
            }
        }
        let end = plan::local_spec(ns, name, &pod.netns, link, self.cfg.mtu);
        self.forget_applied(id);
        self.kernel(move |k| k.create_packet_end(&end, id)).await?;
        let r = plan::record(ns, name, &pod.netns, link, LinkKind::Grpc, node.to_string());
        dp.attach(convert::grpc_end(&r, node))?;
        self.put(r, records).await?;
        // Lets the peer's node know at once rather than at its next pass.
        let _ = self
            .call_ends(node, vec![plan::end_of(ns, name, link, LinkKind::Grpc, None)])
            .await;
        info!(wire = id, pod = %name, intf = %link.local_intf, peer = %node, "gRPC wire end built");
        Ok(())
    }
}
