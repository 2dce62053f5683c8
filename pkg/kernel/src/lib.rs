//! Kernel plumbing for weft: opening network namespaces, one synchronous netlink
//! socket wrapper, sysctls, and the point-to-point ("ptp") pod network driver that
//! builds a pod's veth, addresses and routes.
//!
//! Everything here is blocking. A netlink socket belongs to the network namespace of
//! the thread that created it, and keeps it wherever it is used afterwards: a socket
//! for a pod's namespace is opened by a fresh OS thread that enters the namespace and
//! exits ([`in_netns`]), then used from the caller's thread. No thread is ever returned
//! to a pool in the wrong namespace; the daemon calls this crate from `spawn_blocking`,
//! never from an async worker.
//!
//! Steps of the pod driver are spans with target `weft::phase` (`veth`, `addresses`,
//! `routes`), which the daemon turns into phase metrics and trace spans.

mod bpf;
pub mod capture;
pub mod conntrack;
pub mod detour;
mod error;
pub mod hostends;
pub mod limits;
mod netem;
mod netlink;
mod netns;
pub mod netns_gone;
mod nfattr;
pub mod nflog;
pub mod nfqueue;
pub mod nft;
pub mod nftbatch;
pub mod nftset;
pub mod packet;
pub mod process;
pub mod ptp;
mod routing;
pub mod sysctl;
pub mod trace;
pub mod udp;
pub mod wire;

pub use error::{Drift, KernelError};
pub use netem::{Netem, NetemLoss, NetemSlot, Tbf, probability};
pub use netlink::{
    AliasedLink, BatchFailure, Link, LinkStats, NetfilterMessage, Netlink, NetlinkSocket, NewLink, Nfnetlink, Protocol,
    RouteEntry, Rtnetlink, VethPair, VxlanDevice,
};
pub use netns::{NetNs, create_named, delete_named, in_netns};
pub use netns_gone::GoneNamespaces;
pub use packet::{PacketSocket, tune_allocator};
pub use ptp::GATEWAY_DEVICE;
pub use routing::{ProtoRoute, RouteLookup, VxlanParams};

/// The route protocol number weft marks its routes with (`proto 74` in `ip route`),
/// so its routes can be told from everyone else's.
pub const ROUTE_PROTOCOL: u8 = 74;

/// The route protocol number of weft's routes to other nodes' pod ranges (`proto 75`):
/// apart from the pods' own routes (74), so the node network and the pod driver each
/// reconcile only their own.
pub const NODE_ROUTE_PROTOCOL: u8 = 75;

/// Turns on IPv4 and IPv6 forwarding in the calling thread's network namespace, which
/// point-to-point pod routing needs. IPv6 is skipped when the namespace has it disabled.
pub fn enable_forwarding() -> Result<(), KernelError> {
    sysctl::write("net/ipv4/ip_forward", "1")?;
    if std::path::Path::new("/proc/sys/net/ipv6/conf/all/forwarding").exists() {
        sysctl::write("net/ipv6/conf/all/forwarding", "1")?;
    }
    Ok(())
}

#[cfg(feature = "test-util")]
pub mod testutil;
