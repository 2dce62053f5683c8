//! Network policy for weft: NetworkPolicy and ClusterNetworkPolicy read into a checked
//! model, failing closed on what cannot be read ([`model`], [`cnp`], [`problem`],
//! [`selector`]), the reference evaluation of a flow ([`eval`]: what `weftctl policy
//! explain` says), and the compilation of the policies that apply to this node's pods
//! into typed rules over typed names ([`plan`], [`rule`], [`names`]) of weft's own
//! nftables table, written and read back in one place ([`nft`], [`kernel`]) and run by
//! an interpreter ([`interp`]) that the differential test holds to the evaluator; the
//! run loop ([`engine`]) keeps the kernel in step.

pub mod cnp;
pub mod denies;
pub mod direction;
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
    Announced, Announcer, Config, Explanation, Latest, LocalListing, LocalPods, PassOutcome, PolicyEngine, Status,
    Taken, local_listing,
};
pub use eval::{ClusterDecision, ClusterView, Endpoint, L4, LocalPod, NodeInfo, RuleRef, SideVerdict, Verdict};
pub use kernel::{LearntElement, NftKernel, PolicyKernel};
pub use metrics::PolicyMetrics;
pub use model::{Direction, Namespaces, Peer, Policy, PolicyId, PolicyMode, PortMatch, Ports, Read, Rule};
pub use nft::Observed;
pub use plan::{Desired, Element, Group, PolicyChain, SetKind, SetSpec, plan};
pub use problem::{Effect, ObjectKind, Problem, RuleAt};
pub use selector::{Labels, Requirement, Selector};
