//! Egress by domain name, the parts that decide without a kernel: which names a
//! ClusterNetworkPolicy's `domainNames` allow ([`DomainPattern`]), what a DNS answer
//! says (its question, CNAME chain, addresses and TTLs: [`answer`]), and the table of
//! addresses learnt from answers, each allowed until its TTL ends ([`Learnt`]).

pub mod answer;
mod learnt;
mod pattern;

pub use answer::{Answer, Learned, read_response};
pub use learnt::{Learnt, LearntAddress, Limits, Outcome};
pub use pattern::DomainPattern;
