//! gRPC ends: each side builds its own veth pair and worker (no negotiation: frames
//! carry derived ids), the worker counts and impairs, and a restarted daemon
//! re-attaches the pairs the kernel kept.

use std::net::IpAddr;

use async_trait::async_trait;
use tracing::{debug, info, warn};
use weft_link::{DownBy, Impairment, LinkKind, WireEnd, WireState};

use super::{Carrier, Cx, Far};
use crate::convert;
use crate::engine::{Engine, LocalLink, plan};
use crate::error::WireError;
use crate::ids::wire_id;
use crate::plane::GrpcPlane;

/// The gRPC carrier.
pub(super) struct Grpc;

/// Whether a gRPC end's node end is up where `want` says: taking it down makes the
/// pod end see `NO-CARRIER`, at either end of the link.
pub(super) fn node_end_up(want: Option<DownBy>) -> bool {
    want.is_none()
}

#[async_trait]
impl<P: GrpcPlane> Carrier<P> for Grpc {
    fn kind(&self) -> LinkKind {
        LinkKind::Grpc
    }

    /// Up and attached, or rebuilt (pair and worker) when it is not.
    async fn reconcile(&self, cx: &mut Cx<'_, P>, at: LocalLink<'_>, far: Far<'_>) -> Result<(), WireError> {
        let LocalLink { ns, name, pod, link } = at;
        let Far::Node(node) = far else {
            return Err(WireError::Invalid("a gRPC end's peer is on another node".into()));
        };
        let id = wire_id(ns, link.uid, name);
        let rec = cx.recorded(id).cloned();
        let dp = cx.engine.dataplane().ok_or(WireError::NoNodeAddress)?;
        let ok = rec.as_ref().is_some_and(|r| {
            r.kind == LinkKind::Grpc && r.netns == pod.netns && r.peer_node == node.to_string() && dp.attached(r.id)
        });
        if let Some(mut r) = rec.clone().filter(|_| ok) {
            if !r.state.is_up() {
                let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                cx.kernel(move |k| k.set_interface_up(&netns, &intf, true)).await?;
                dp.set_up(r.id, true);
                r.state = WireState::Up;
                cx.put(r).await?;
            }
            return Ok(());
        }
        if let Some(r) = &rec {
            dp.detach(r.id);
            if r.kind != LinkKind::Grpc || r.netns != pod.netns {
                cx.remove(r).await;
            }
        }
        let end = plan::local_spec(ns, name, &pod.netns, link, cx.mtu());
        cx.rebuilt(id);
        cx.kernel(move |k| k.create_packet_end(&end, id)).await?;
        let r = plan::record(ns, name, &pod.netns, link, LinkKind::Grpc, node.to_string());
        dp.attach(convert::grpc_end(&r, node))?;
        cx.put(r).await?;
        // Lets the peer's node know at once rather than at its next pass (with the
        // other ends this pass builds for it, at the pass's end).
        cx.built(node, plan::end_of(ns, name, link, LinkKind::Grpc, None));
        info!(wire = id, pod = %name, intf = %link.local_intf, peer = %node, "gRPC wire end built");
        Ok(())
    }

    async fn hold(
        &self,
        cx: &mut Cx<'_, P>,
        r: &WireEnd,
        before: Option<Option<DownBy>>,
        want: Option<DownBy>,
    ) -> Result<bool, WireError> {
        let (id, up) = (r.id, node_end_up(want));
        let exists = cx.kernel(move |k| k.set_node_end_up(id, up)).await?;
        // Taking the node end down ends its worker's reads; coming back up needs a
        // fresh socket.
        let was_down = matches!(before, Some(Some(_)));
        if exists
            && up
            && was_down
            && let (Some(dp), Ok(peer)) = (cx.engine.dataplane(), r.peer_node.parse::<IpAddr>())
        {
            dp.attach(convert::grpc_end(r, peer))?;
        }
        Ok(exists)
    }

    /// In the end's worker, which carries what the pod sends.
    async fn impair(&self, cx: &mut Cx<'_, P>, r: &WireEnd, imp: Impairment) -> Result<bool, WireError> {
        let Some(dp) = cx.engine.dataplane() else {
            return Ok(false);
        };
        dp.set_impairment(r.id, imp);
        Ok(true)
    }

    async fn release(&self, cx: &mut Cx<'_, P>, r: &WireEnd) {
        if let Some(dp) = cx.engine.dataplane() {
            dp.detach(r.id);
            dp.set_impairment(r.id, Impairment::default());
        }
    }

    /// Re-attaches the end to its veth pair (kept by the kernel while weftd was away)
    /// under the same wire id, so frames resume where they stopped.
    async fn restore(&self, engine: &Engine<P>, r: &WireEnd) {
        let Some(dp) = engine.dataplane() else { return };
        let Ok(peer) = r.peer_node.parse::<IpAddr>() else {
            return;
        };
        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
        let stats = match engine.kernel(move |k| k.link_stats(&netns, &intf)).await {
            Ok(Some(st)) => st,
            Ok(None) => {
                debug!(
                    wire = r.id,
                    error = "its pod end is gone",
                    "gRPC wire end not restored; the next pass rebuilds it"
                );
                return;
            }
            Err(e) => {
                debug!(wire = r.id, error = %e, "gRPC wire end not restored; the next pass rebuilds it");
                return;
            }
        };
        // The worker counts in memory, which died with the last process; the pod end's
        // kernel counters did not, so the wire's series continue from them instead of
        // dropping to zero.
        match dp.attach(convert::grpc_end(r, peer)) {
            Ok(()) => {
                engine.seed_counters(r, &stats);
                info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, "gRPC wire end re-attached")
            }
            Err(WireError::DataPlane(e)) => {
                engine.seed_counters(r, &stats);
                warn!(wire = r.id, error = %e, "could not re-attach a gRPC wire end")
            }
            Err(e) => debug!(wire = r.id, error = %e, "gRPC wire end not restored; the next pass rebuilds it"),
        }
    }

    fn kernel_counters(&self) -> bool {
        false
    }
}
