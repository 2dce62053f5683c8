//! Carriers: how one kind of link carries frames between two pods. The engine decides
//! *whether* an end should exist and where its peer is; the end's [`Carrier`] decides
//! *how*: what to build, when a built end is still right, how its carrier is held down
//! by intent, how it is impaired, what it keeps beyond its interface, and what a peer
//! node may offer for it.
//!
//! Each kind lives in its own module (`veth`, `vxlan`, `grpc`) and is registered once
//! in [`Carriers::standard`]. Adding a kind is one module, one [`LinkKind`] variant
//! and one line there; nothing else in the engine matches on the kind.

mod grpc;
mod veth;
mod vxlan;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use async_trait::async_trait;
use tracing::{info, warn};
use weft_kernel::KernelError;
use weft_kernel::wire::Emulated;
use weft_link::{DownBy, Impairment, LinkKind, WireEnd, WireState};
use weft_rpc::wire::{End, EndResult};

use super::pass::PassState;
use super::{Engine, LocalLink, LocalPod};
use crate::convert;
use crate::error::WireError;
use crate::kernel::WireKernel;
use crate::plane::GrpcPlane;

/// Where the other end of a link is, as the engine found it.
#[derive(Debug, Clone, Copy)]
pub enum Far<'a> {
    /// On this node: this pod builds both ends (the lower name builds).
    Pod(&'a LocalPod),
    /// On the node at this address.
    Node(IpAddr),
}

/// What a carrier works with during a pass: the engine's seams, what the pass has
/// recorded so far and what the run task remembers between passes. Only the run task
/// makes one, so a carrier never races another pass.
pub struct Cx<'a, P> {
    pub(super) engine: &'a Engine<P>,
    pub(super) pass: &'a mut PassState,
    pub(super) records: &'a mut HashMap<u64, WireEnd>,
    pub(super) me: IpAddr,
}

impl<P: GrpcPlane> Cx<'_, P> {
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
        self.records.insert(r.id, r);
        Ok(())
    }

    /// Removes an end before it is rebuilt (its peer is not told: the end comes back).
    pub async fn remove(&mut self, r: &WireEnd) {
        self.teardown(r, false).await;
    }

    /// Notes that end `id` is being (re)built: the next pass applies its settings afresh.
    pub fn rebuilt(&mut self, id: u64) {
        self.pass.applied.remove(&id);
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
        }
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
            .is_some_and(|l| l.remove(&(r.id & super::emulate::DETOUR_ID_BITS)));
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

/// How one kind of link is carried (see the module documentation). Methods with a
/// [`Cx`] run in the engine's pass; the others serve peer nodes or the start.
#[async_trait]
pub trait Carrier<P: GrpcPlane>: Send + Sync + 'static {
    /// The kind this carrier carries.
    fn kind(&self) -> LinkKind;

    /// Brings the local end of `at` where it should be, its peer being `far`: leaves a
    /// built end that is still right, repairs one that drifted, (re)builds otherwise,
    /// and records what it built with [`Cx::put`].
    async fn reconcile(&self, cx: &mut Cx<'_, P>, at: LocalLink<'_>, far: Far<'_>) -> Result<(), WireError>;

    /// The peer pod runs nowhere: by default the end is set down and kept for the
    /// peer's return.
    async fn peer_absent(&self, cx: &mut Cx<'_, P>, r: WireEnd) -> Result<(), WireError> {
        cx.set_down(r).await
    }

    /// Holds end `r`'s carrier where `want` says (`None`: up; `before`: as last
    /// applied, if known); returns whether the end exists.
    async fn hold(
        &self,
        cx: &mut Cx<'_, P>,
        r: &WireEnd,
        before: Option<Option<DownBy>>,
        want: Option<DownBy>,
    ) -> Result<bool, WireError>;

    /// Applies impairment `imp` to what end `r` sends; returns whether the end exists.
    /// By default with netem on the pod's interface (or a link detour).
    async fn impair(&self, cx: &mut Cx<'_, P>, r: &WireEnd, imp: Impairment) -> Result<bool, WireError> {
        cx.netem_or_detour(r, imp).await
    }

    /// Lets go of what the carrier keeps for end `r` beyond its interface and record
    /// (a worker), before the end is removed. Nothing by default.
    async fn release(&self, _cx: &mut Cx<'_, P>, _r: &WireEnd) {}

    /// Takes back an end the store holds when the engine starts (a worker the last
    /// process ran). Nothing by default: the kernel kept the end.
    async fn restore(&self, _engine: &Engine<P>, _r: &WireEnd) {}

    /// Answers a peer node that offers its end `end` of a link whose other end is
    /// pod `pod` here (`msg` as sent, `from` the caller's address). Accepted by
    /// default: the pass that follows builds this side.
    async fn offered(
        &self,
        _engine: &Engine<P>,
        _from: &str,
        _end: &WireEnd,
        _msg: &End,
        _pod: &LocalPod,
    ) -> EndResult {
        accept()
    }

    /// Whether the end's frame and byte counters are its interface's kernel counters
    /// (sampled before each scrape) rather than counted by a worker.
    fn kernel_counters(&self) -> bool {
        true
    }

    /// Why an end recorded but not built yet waits, for its link status.
    fn waiting(&self, peer_pod: &str) -> String {
        format!("waiting for the node of pod {peer_pod} to build its end")
    }
}

/// An accepted `Ends` result.
pub(super) fn accept() -> EndResult {
    EndResult {
        accepted: true,
        reason: String::new(),
    }
}

/// A refused `Ends` result, with why.
pub(super) fn refuse(reason: String) -> EndResult {
    EndResult {
        accepted: false,
        reason,
    }
}

/// The carriers an engine knows, one per kind.
pub struct Carriers<P> {
    by_kind: BTreeMap<LinkKind, Box<dyn Carrier<P>>>,
}

impl<P: GrpcPlane> Carriers<P> {
    /// weft's carriers: veth pairs on one node, VXLAN and gRPC across nodes.
    pub fn standard() -> Self {
        Carriers {
            by_kind: BTreeMap::new(),
        }
        .with(veth::Veth)
        .with(vxlan::Vxlan)
        .with(grpc::Grpc)
    }

    /// These carriers with `c` carrying its kind (replacing the one that did).
    pub fn with(mut self, c: impl Carrier<P>) -> Self {
        self.by_kind.insert(c.kind(), Box::new(c));
        self
    }

    /// The carrier of `kind`.
    ///
    /// # Panics
    /// When no carrier carries `kind`: [`Carriers::standard`] registers every kind
    /// (a unit test keeps it so), and [`Carriers::with`] only replaces.
    pub fn get(&self, kind: LinkKind) -> &dyn Carrier<P> {
        self.by_kind
            .get(&kind)
            .map(|c| &**c)
            .unwrap_or_else(|| panic!("no carrier registered for {kind} links"))
    }
}

#[cfg(test)]
mod tests;
