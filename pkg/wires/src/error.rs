//! What can go wrong building or serving a wire, typed so the engine's log lines and
//! callers see which layer failed (kernel, store, peer node, data plane).

use std::net::IpAddr;

use weft_kernel::KernelError;
use weft_store::StoreError;

/// Why a wire could not be brought where it should be (the pass logs it and retries).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A kernel procedure failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The peer's node could not be asked.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// This node's underlay address is not known yet.
    #[error("node address unknown")]
    NoNodeAddress,
    /// The peer's node answered an `Ends` call without a result for the end.
    #[error("peer answered no result")]
    NoAnswer,
    /// Every VNI tried was taken on one node or the other.
    #[error("no VNI both nodes have free")]
    NoFreeVni,
    /// The data plane could not take a gRPC end.
    #[error("{0}")]
    DataPlane(String),
    /// An operator named a link this node holds no end of (or an ambiguous one).
    #[error(transparent)]
    NoSuchLink(#[from] weft_link::EndNotFound),
    /// An operator's setting does not apply.
    #[error("{0}")]
    Invalid(String),
    /// The local end changed but the peer's node refused or could not be reached.
    #[error("changed at this end, but the peer node {node} did not take it: {reason}")]
    PeerNotTold {
        /// The peer's node.
        node: String,
        /// What it (or the transport) said.
        reason: String,
    },
    /// A blocking kernel task died (panicked or was cancelled).
    #[error("kernel task: {0}")]
    Task(String),
}

impl WireError {
    /// Whether the wire waits on the peer's node (unreachable, not answering, not told)
    /// or on this node's address, rather than being refused here: a link in that case
    /// is pending, not failed.
    pub fn waits_on_peer(&self) -> bool {
        matches!(
            self,
            WireError::Peer(_) | WireError::NoNodeAddress | WireError::NoAnswer | WireError::PeerNotTold { .. }
        )
    }
}

/// Why an `Ends` call to another node failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No connection could be made.
    #[error("connecting to {node}: {reason}")]
    Connect {
        /// The node called.
        node: IpAddr,
        /// What the transport said.
        reason: String,
    },
    /// The node answered with an error.
    #[error("Ends on {node}: {message}")]
    Call {
        /// The node called.
        node: IpAddr,
        /// The status message it answered.
        message: String,
    },
}
