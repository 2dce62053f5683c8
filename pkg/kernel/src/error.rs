//! Errors from kernel operations, classified so the daemon can pick the CNI code.

use std::io;
use std::net::IpAddr;

/// A failed kernel operation.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The pod's namespace path does not exist or is not a network namespace.
    #[error("network namespace {path}: {reason}")]
    InvalidNetns {
        /// The path given.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// The interface name asked for already exists in the pod's namespace.
    #[error("interface {ifname} already exists in the pod's network namespace")]
    InterfaceExists {
        /// The clashing name.
        ifname: String,
    },
    /// A netlink, sysctl or namespace call failed.
    #[error("{step}: {source}")]
    Os {
        /// What weft was doing.
        step: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// CHECK found a difference between what weft set up and what exists.
    #[error(transparent)]
    Drift(#[from] Drift),
}

/// The first difference CHECK finds between a pod's networking as weft set it up and
/// the kernel: which object, and how it differs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Drift {
    /// The pod's interface of that name has another MAC: not the one weft made.
    #[error("interface {ifname} in the pod is not the one weft made (another MAC); left alone")]
    ForeignInterface {
        /// The pod's interface.
        ifname: String,
    },
    /// The host end of the veth pair is gone.
    #[error("host interface {ifname} is missing")]
    HostInterfaceMissing {
        /// The host end.
        ifname: String,
    },
    /// The host end is down.
    #[error("host interface {ifname} is down")]
    HostInterfaceDown {
        /// The host end.
        ifname: String,
    },
    /// The pod's gateway address is not where the node holds it (the host end, or the
    /// node's gateway device).
    #[error("gateway {gateway} is missing on host interface {ifname}")]
    GatewayMissing {
        /// The gateway address.
        gateway: IpAddr,
        /// The interface of the node that should hold it.
        ifname: String,
    },
    /// The pod's permanent neighbour entry for a gateway the node holds is gone.
    #[error("neighbour entry of gateway {gateway} dev {ifname} is missing in the pod")]
    GatewayNeighbourMissing {
        /// The gateway.
        gateway: IpAddr,
        /// The pod's interface.
        ifname: String,
    },
    /// The host's route to the pod's address is gone.
    #[error("host route to {address} via {ifname} is missing")]
    HostRouteMissing {
        /// The pod's address.
        address: IpAddr,
        /// The host end.
        ifname: String,
    },
    /// The pod's interface is gone.
    #[error("interface {ifname} is missing in the pod")]
    PodInterfaceMissing {
        /// The pod's interface.
        ifname: String,
    },
    /// The pod's interface is down.
    #[error("interface {ifname} is down in the pod")]
    PodInterfaceDown {
        /// The pod's interface.
        ifname: String,
    },
    /// The pod's interface has another MAC than weft gave it.
    #[error("interface {ifname} has another MAC than weft gave it")]
    MacChanged {
        /// The pod's interface.
        ifname: String,
    },
    /// An address weft gave the pod is gone.
    #[error("address {address}/{prefix_len} is missing on {ifname}")]
    AddressMissing {
        /// The address.
        address: IpAddr,
        /// Its prefix length.
        prefix_len: u8,
        /// The pod's interface.
        ifname: String,
    },
    /// The pod's link route to its gateway is gone.
    #[error("route to gateway {gateway} dev {ifname} is missing in the pod")]
    GatewayRouteMissing {
        /// The gateway.
        gateway: IpAddr,
        /// The pod's interface.
        ifname: String,
    },
    /// The pod's default route through weft's gateway is gone.
    #[error("default route via {gateway} dev {ifname} is missing in the pod")]
    DefaultRouteMissing {
        /// The gateway.
        gateway: IpAddr,
        /// The pod's interface.
        ifname: String,
    },
    /// Another route weft installed in the pod is gone.
    #[error("route {route} dev {ifname} is missing in the pod")]
    RouteMissing {
        /// The route.
        route: crate::ptp::PodRoute,
        /// The pod's interface.
        ifname: String,
    },
}

impl KernelError {
    /// An OS error with the step it happened in.
    pub fn os(step: impl Into<String>, source: io::Error) -> Self {
        KernelError::Os {
            step: step.into(),
            source,
        }
    }

    /// The errno behind an [`KernelError::Os`], if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            KernelError::Os { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
