//! The data-plane seam of wires: what the engine asks of the workers that carry gRPC
//! wire ends and link detours ([`GrpcPlane`]), so its decisions are tested without packet sockets or
//! streams, and the one place it meets the real [`DataPlane`].

use std::net::IpAddr;
use std::sync::Arc;

use crate::dataplane::DataPlane;
use crate::error::WireError;
use crate::metrics::WireLabels;

/// A gRPC wire end to start a worker for (its pair built by the kernel seam).
#[derive(Debug, Clone)]
pub struct GrpcEnd {
    /// This end's wire id (its node end is named after it).
    pub id: u64,
    /// The peer end's wire id (frames are tagged with it).
    pub peer_id: u64,
    /// The peer's node.
    pub peer: IpAddr,
    /// The end's metric labels.
    pub labels: WireLabels,
    /// Whether frames flow (the peer pod is up).
    pub up: bool,
}

/// The workers of this node's gRPC wire ends.
pub trait GrpcPlane: Send + Sync + 'static {
    /// Opens the end's packet socket and starts (or replaces) its worker.
    fn attach(self: &Arc<Self>, end: GrpcEnd) -> Result<(), WireError>;
    /// Marks an end up or down (its peer pod came or went).
    fn set_up(&self, id: u64, up: bool);
    /// Stops an end's worker.
    fn detach(&self, id: u64);
    /// Whether an end has a worker.
    fn attached(&self, id: u64) -> bool;
    /// Emulates a link on what end `id`'s pod sends (empty: none), kept across
    /// re-attachments.
    fn set_impairment(&self, id: u64, imp: weft_link::Impairment);
    /// Emulates `imp` on what veth or VXLAN end `id` sends through its link detour
    /// (built by the kernel seam), starting the detour's worker or changing it in place.
    fn detour(&self, id: u64, imp: weft_link::Impairment, labels: WireLabels) -> Result<(), WireError>;
    /// Stops end `id`'s detour worker; returns whether it had one.
    fn undetour(&self, id: u64) -> bool;
    /// What weft's emulation did to what end `id` sent, if weft emulates it.
    fn emulation(&self, id: u64) -> Option<weft_link::EmulationCounts>;
}

impl GrpcPlane for DataPlane {
    fn attach(self: &Arc<Self>, end: GrpcEnd) -> Result<(), WireError> {
        let fd = self.node_ends().open(end.id)?;
        DataPlane::attach(self, end.id, end.peer_id, end.peer, fd, end.labels, end.up).map_err(WireError::DataPlane)
    }

    fn set_up(&self, id: u64, up: bool) {
        DataPlane::set_up(self, id, up)
    }

    fn detach(&self, id: u64) {
        DataPlane::detach(self, id)
    }

    fn attached(&self, id: u64) -> bool {
        DataPlane::attached(self, id)
    }

    fn set_impairment(&self, id: u64, imp: weft_link::Impairment) {
        DataPlane::set_impairment(self, id, imp)
    }

    fn detour(&self, id: u64, imp: weft_link::Impairment, labels: WireLabels) -> Result<(), WireError> {
        DataPlane::detour(self, id, imp, labels, || {
            weft_kernel::detour::open(id).map_err(std::io::Error::other)
        })
        .map_err(WireError::DataPlane)
    }

    fn undetour(&self, id: u64) -> bool {
        DataPlane::undetour(self, id)
    }

    fn emulation(&self, id: u64) -> Option<weft_link::EmulationCounts> {
        DataPlane::emulation(self, id)
    }
}
