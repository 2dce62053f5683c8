//! Veth pairs straight between two pods of one node: the pod with the lower name
//! builds both ends and records both.

use async_trait::async_trait;
use tracing::info;
use weft_link::{DownBy, LinkKind, WireEnd};

use super::{Carrier, Cx, Far};
use crate::engine::{LocalLink, plan};
use crate::error::WireError;
use crate::ids::wire_id;
use crate::plane::GrpcPlane;

/// The veth carrier.
pub(super) struct Veth;

/// Whether the named end's pod interface is up where `want` says: a veth pair has no
/// carrier switch, so the end named by the operator goes administratively down and its
/// peer sees `NO-CARRIER` (the peer's end stays up).
pub(super) fn admin_up(want: Option<DownBy>) -> bool {
    want != Some(DownBy::Named)
}

#[async_trait]
impl<P: GrpcPlane> Carrier<P> for Veth {
    fn kind(&self) -> LinkKind {
        LinkKind::Veth
    }

    /// Builds the pair (this pod builds) unless both ends are recorded and present.
    async fn reconcile(&self, cx: &mut Cx<'_, P>, at: LocalLink<'_>, far: Far<'_>) -> Result<(), WireError> {
        let LocalLink { ns, name, pod, link } = at;
        let Far::Pod(peer) = far else {
            return Err(WireError::Invalid(format!(
                "a veth link joins pods of one node; pod {} is on another",
                link.peer_pod
            )));
        };
        let id = wire_id(ns, link.uid, name);
        let peer_id = wire_id(ns, link.uid, &link.peer_pod);
        let rec = cx.recorded(id).cloned();
        let peer_rec = cx.recorded(peer_id).cloned();
        let a = plan::local_spec(ns, name, &pod.netns, link, cx.mtu());
        let b = plan::peer_spec(ns, &peer.netns, link, cx.mtu());
        let ours =
            |r: &Option<WireEnd>, netns: &str| r.as_ref().is_some_and(|r| r.kind == LinkKind::Veth && r.netns == netns);
        let intact = ours(&rec, &pod.netns) && ours(&peer_rec, &peer.netns) && {
            let (a, b) = (a.clone(), b.clone());
            cx.kernel(move |k| Ok(k.has_interface(&a.netns, &a.intf) && k.has_interface(&b.netns, &b.intf)))
                .await?
        };
        if intact {
            return Ok(());
        }
        for r in [rec, peer_rec].into_iter().flatten() {
            cx.remove(&r).await;
        }
        cx.rebuilt(id);
        cx.rebuilt(peer_id);
        cx.kernel(move |k| k.create_veth(&a, &b)).await?;
        let ours = plan::record(ns, name, &pod.netns, link, LinkKind::Veth, String::new());
        let theirs = plan::mirror(&ours, &peer.netns);
        cx.put(ours).await?;
        cx.put(theirs).await?;
        info!(namespace = ns, link = link.uid, a = %format!("{name}:{}", link.local_intf), b = %format!("{}:{}", link.peer_pod, link.peer_intf), "veth wire built");
        Ok(())
    }

    /// A pair dies with either pod anyway: it goes rather than waiting down.
    async fn peer_absent(&self, cx: &mut Cx<'_, P>, r: WireEnd) -> Result<(), WireError> {
        cx.remove(&r).await;
        Ok(())
    }

    async fn hold(
        &self,
        cx: &mut Cx<'_, P>,
        r: &WireEnd,
        _before: Option<Option<DownBy>>,
        want: Option<DownBy>,
    ) -> Result<bool, WireError> {
        let (netns, intf, up) = (r.netns.clone(), r.local_intf.clone(), admin_up(want));
        cx.kernel(move |k| k.set_interface_up(&netns, &intf, up)).await
    }
}
