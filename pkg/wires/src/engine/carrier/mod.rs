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

use std::collections::BTreeMap;
use std::net::IpAddr;

use async_trait::async_trait;
use weft_link::{DownBy, Impairment, LinkKind, WireEnd};
use weft_rpc::wire::{End, EndResult};

use super::cx::Cx;
use super::{Engine, LocalLink, LocalPod};
use crate::error::WireError;
use crate::plane::GrpcPlane;

/// Where the other end of a link is, as the engine found it.
#[derive(Debug, Clone, Copy)]
pub enum Far<'a> {
    /// On this node: this pod builds both ends (the lower name builds).
    Pod(&'a LocalPod),
    /// On the node at this address.
    Node(IpAddr),
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
