//! Pod traffic between nodes (the Kubernetes network model, without NAT): from the Node
//! objects (addresses, podCIDRs) weftd keeps a route to every other node's pod ranges,
//! direct where the node is on-link, otherwise through one unicast VXLAN device whose
//! FDB and neighbour entries come from the Node objects (no multicast, no flooding, no
//! learning: the Ganeti NBMA model with Node objects as the neighbour source). It also
//! masquerades pod traffic leaving the pod network and derives the pod MTU from the
//! underlay.
//!
//! Decisions are pure ([`plan()`], [`diff()`]) and the kernel sits behind
//! [`NodeKernel`], so the engine is unit-tested without root; [`HostKernel`] is the
//! real one. Everything weft programs is its own: routes carry protocol 75, FDB and
//! neighbour entries live on weft's own device, masquerade in weft's own table.

pub mod engine;
pub mod kernel;
pub mod masq;
pub mod metrics;
pub mod model;
pub mod plan;

pub use engine::{Failure, LocalRanges, NodeNetwork, NodeView, PassOutcome, run_pass, run_pass_with};
pub use kernel::{HostKernel, NodeKernel};
pub use masq::{MasqChange, MasqFound};
pub use metrics::NodeNetMetrics;
pub use model::*;
pub use plan::{diff, plan, vxlan_mac};
