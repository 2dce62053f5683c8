//! Host ports for weft: one nftables table of weft's own (`inet weft`) whose DNAT maps
//! hold every host port of the node, so the cost of a pod's ports is constant however
//! many other mappings exist.
//!
//! The table's chains and rules are written once (and rewritten whenever they drift)
//! by `nft -f`, the nftables project's own tool, in one atomic transaction
//! ([`install`]). Per pod, only map elements change, added and removed over netlink
//! ([`add`], [`remove`]); no rule is rebuilt on the hot path.
//!
//! ```text
//! table inet weft
//!   map hostports_v4     ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
//!   map hostports_v4_any             inet_proto . inet_service : ipv4_addr . inet_service
//!   map hostports_v6 / hostports_v6_any  (the same for IPv6)
//!   chain prerouting (nat, dstnat)  fib daddr type local  jump hostports
//!   chain output     (nat, dstnat)  fib daddr type local  jump hostports
//!   chain hostports  dnat to <daddr . proto . dport> via the maps, specific host IP first
//!   set hairpin_v4 / hairpin_v6  ifname . address of every pod that has host ports
//!   chain postrouting (nat, srcnat) masquerade DNATed traffic from 127.0.0.0/8, and
//!                    DNATed traffic that goes back to the pod it came from (hairpin)
//! ```

#![forbid(unsafe_code)]

mod elements;
mod mapping;
mod table;

pub use elements::{add, remove};
pub use mapping::{Entries, Hairpin, HostPort, Protocol};
pub use table::{TABLE, flush_udp_conntrack, install, matches, script};

/// A failed host-port operation.
#[derive(Debug, thiserror::Error)]
pub enum PortmapError {
    /// A netlink call failed.
    #[error("{step}: {source}")]
    Netlink {
        /// What weft was doing.
        step: &'static str,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// Running `nft` failed.
    #[error("nft: {0}")]
    Nft(String),
}

/// How the table is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Also DNAT host ports reached on 127.0.0.0/8 (needs `route_localnet`, which
    /// weftd then enables; packets to 127/8 arriving from outside are dropped).
    pub localhost: bool,
}
