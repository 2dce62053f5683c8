//! The one netlink socket wrapper weft uses: a blocking socket of one protocol family
//! (`NETLINK_ROUTE` for links, addresses, routes and neighbours; `NETLINK_NETFILTER`
//! for nftables batches) bound to the network namespace of the thread that created it,
//! with request/ACK, dump and batch helpers (`socket.rs`), and the handful of
//! operations weft needs over it, one file per kind of object: links (`link.rs`),
//! addresses (`addr.rs`), routes (`route.rs`), FDB and neighbour entries (`neigh.rs`).

mod addr;
mod link;
mod neigh;
mod route;
mod socket;

pub(crate) use addr::{address_message, host_prefix};
pub use link::{AliasedLink, Link, LinkStats, NewLink, VethPair, VxlanDevice};
pub use route::RouteEntry;
pub use socket::{BatchFailure, NetfilterMessage, Netlink, NetlinkSocket, Nfnetlink, Protocol, Rtnetlink};
