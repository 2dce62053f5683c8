//! Wires: point-to-point links between pods from Topology objects (a veth pair on one
//! node, VXLAN or a batched gRPC stream across nodes), kept in step with the topologies
//! by one engine per node, each end's state in the store so that a restart finds every
//! wire again under the same id.
//!
//! The engine (`engine`) decides; it reaches the kernel through [`WireKernel`], the
//! other nodes through [`Peers`] and the workers of gRPC ends through [`GrpcPlane`],
//! so its decisions are tested against fakes without root.

pub mod capture;
pub mod convert;
pub mod dataplane;
pub mod engine;
pub mod error;
pub mod ids;
pub mod kernel;
pub mod metrics;
pub mod peers;
pub mod plane;
pub mod service;

pub use convert::{counters, labels};
pub use engine::{
    Carrier, Carriers, Cx, Engine, EngineConfig, Far, LinkWaitTimeout, LocalLink, LocalPod, PlaneFactory, PodKey, Seams,
};
pub use error::{PeerError, WireError};
pub use kernel::{EndSpec, HostWireKernel, VxlanPeer, WireKernel};
pub use metrics::WireMetrics;
pub use peers::{GrpcPeers, Peers};
pub use plane::{GrpcEnd, GrpcPlane};
pub use service::WireService;
