//! Network policy for weft: Kubernetes NetworkPolicy read into a checked model
//! ([`model`], [`selector`]), the reference evaluation of a flow ([`eval`]: what
//! `weftctl policy explain` says and what the kernel's rules are tested against), and
//! the compilation of the policies that select this node's pods into nftables sets and
//! chains of weft's own table.

pub mod cnp;
pub mod denies;
pub mod engine;
pub mod eval;
pub mod interp;
pub mod kernel;
pub mod metrics;
pub mod model;
pub mod names;
pub mod nft;
pub mod plan;
pub mod problem;
pub mod rule;
pub mod selector;

pub use cnp::{ClusterPeer, ClusterPolicy, ClusterRule};
pub use denies::{DenyEvent, DenyLog, Flow};
pub use engine::{
    Announced, Announcer, Config, Explanation, Latest, LocalPods, PassOutcome, PolicyEngine, Status, Taken,
};
pub use eval::{ClusterDecision, ClusterView, Endpoint, LocalPod, NodeInfo, RuleRef, SideVerdict, Verdict};
pub use kernel::{NftKernel, PolicyKernel};
pub use metrics::PolicyMetrics;
pub use model::{Direction, Namespaces, Peer, Policy, PolicyId, PortMatch, Ports, Read, Rule};
pub use nft::Observed;
pub use plan::{Desired, Element, Group, PolicyChain, SetKind, SetSpec, plan};
pub use problem::{Effect, ObjectKind, Problem, RuleAt};
pub use selector::{Labels, Requirement, Selector};
