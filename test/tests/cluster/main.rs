//! Several nodes behind the in-process API server: node ranges, the cluster
//! network, network policy, the CRDs, waiting for links and hostile wire peers.
//!
//! One test binary, one module per area (each was a binary of its own): tests of one
//! area run beside each other, areas one after another ([`weft_tests::area`]).

mod cluster;
mod crds;
mod flows;
mod fqdn;
mod link_wait;
mod netpol;
mod node_ranges;
mod policy;
mod wire_attacks;
