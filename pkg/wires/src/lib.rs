//! Wires: point-to-point links between pods from Topology objects (a veth pair on one
//! node, VXLAN or a batched gRPC stream across nodes), kept in step with the topologies
//! by one engine per node, each end's state in the store so that a restart finds every
//! wire again under the same id.

pub mod dataplane;
pub mod engine;
pub mod ids;
pub mod service;

pub use engine::{Engine, EngineConfig, LocalPod};
pub use service::WireService;
