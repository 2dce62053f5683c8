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
//!   chain localnet_guard (filter, before dstnat)  drop packets to 127.0.0.0/8 from
//!                    outside, whenever route_localnet is on
//!   chain prerouting (nat, dstnat)  fib daddr type local  jump hostports
//!   chain output     (nat, dstnat)  loopback returns (127/8 unless --hostports-localhost,
//!                    ::1 always), then fib daddr type local  jump hostports
//!   chain hostports  dnat to <daddr . proto . dport> via the maps, specific host IP first
//!   set hairpin_v4 / hairpin_v6  ifname . address of every pod that has host ports
//!   chain postrouting (nat, srcnat) masquerade DNATed traffic from 127.0.0.0/8, and
//!                    DNATed traffic that goes back to the pod it came from (hairpin)
//! ```

mod elements;
mod mapping;
mod table;

pub use elements::{add, remove};
pub use mapping::{Entries, Hairpin, HostPort, Protocol};
pub use table::{Found, TABLE, compare, flush_udp_conntrack, install, matches, script};

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

/// The sysctl that makes 127.0.0.0/8 routable (IPv4 has it for every interface and
/// for `all`; the kernel ORs them, weft sets and watches `all`).
pub const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

/// Whether `route_localnet` is on in the caller's namespace now (unreadable counts as
/// on: a guard too many costs nothing).
pub fn localnet_routable() -> bool {
    weft_kernel::sysctl::read(ROUTE_LOCALNET).map_or(true, |v| v != "0")
}

/// How the table is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Also DNAT host ports reached on 127.0.0.0/8 (needs `route_localnet`, which
    /// weftd then enables). Without it, loopback traffic is never DNATed, so a client
    /// of 127.0.0.1 or ::1 is refused at once instead of hanging; ::1 never is (IPv6
    /// has no `route_localnet`).
    pub localhost: bool,
    /// Drop packets to 127.0.0.0/8 that arrive from outside the node, ahead of any
    /// DNAT: wanted whenever `route_localnet` is on, whoever turned it on.
    pub guard_localnet: bool,
}
