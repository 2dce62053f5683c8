//! The benchmark and the load it measures, at a tiny size so they cannot rot
//! (no timing is asserted).
//!
//! One test binary, one module per area (each was a binary of its own): tests of one
//! area run beside each other, areas one after another ([`weft_tests::area`]).

mod bench;
mod load;
