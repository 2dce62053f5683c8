//! Flow records: every connection of a node's pods, from conntrack and the deny log,
//! attributed to pods, workloads and the policy that decided, kept in a bounded ring
//! and in 15 s aggregates, and filtered as `weftctl flows` asks.
//!
//! The engine decides nothing about the kernel itself: the node reads conntrack
//! (`weft_kernel::conntrack`) and the deny log and hands the entries to a [`Tracker`],
//! which asks the cluster through the [`Resolve`] seam (the node's policy view; a table
//! in tests) who each address is and what policy says.

pub mod aggregate;
pub mod attribution;
pub mod export;
pub mod filter;
pub mod intern;
pub mod otlp;
pub mod record;
pub mod tracker;
pub mod wire;

pub use aggregate::{AggKey, AggValue, Aggregate, Aggregates};
pub use filter::{EndpointSel, Filter};
pub use record::{
    Counters, Decision, Effect, EndReason, FlowKind, FlowRecord, Peer, PeerKind, PolicyHit, PolicySide, Staged,
    Verdict, parse_protocol, protocol_name,
};
pub use tracker::{Config, DeniedPacket, Gap, Resolve, Stats, Tracker};
