//! What the cluster says: meshnet-compatible `Topology` objects (one per pod, where
//! wires come from) and the cluster's nodes (addresses and pod ranges, where pod
//! routes come from), behind one trait ([`TopologySource`]) with two implementations:
//! [`KubeSource`] reads Kubernetes watch caches (reflectors) in a cluster, [`DirSource`]
//! reads YAML/JSON files in a directory for labs outside one. The daemon reads only the
//! cache on the hot path; it writes the pod's status (where it runs) and the node's
//! `WireState` mirror back through the same trait. Topologies that fail [`validate`] are
//! never served. [`crds_yaml`] renders the CRDs. The fake API server its kube source is
//! tested against is a crate of its own (`weft-fakekube`).

pub mod cnp;
pub mod crds;
pub mod dir;
pub mod kube;
pub mod node;
pub mod objects;
pub mod resync;
pub mod source;
pub mod strict;
pub mod types;
pub mod validate;

pub use self::kube::{FIELD_MANAGER, KubeSource};
pub use cnp::{ClusterNetworkPolicy, ClusterNetworkPolicySpec, CnpAction, CnpTier};
pub use crds::crds_yaml;
pub use dir::{DirSource, LoadProblem, parse_topologies, read_topologies};
pub use node::ClusterNode;
pub use objects::{
    NAMESPACE_NAME_LABEL, NamedPort, PolicyNamespace, PolicyObjects, PolicyPod, PolicyPods, PortProtocol,
    UnreadablePolicy, policy_pods,
};
pub use source::{Held, MemorySource, SourceError, Topologies, TopologySource};
pub use strict::Strict;
pub use types::*;
pub use validate::validate;
