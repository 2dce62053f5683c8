//! The multi-node lab end to end (`weftctl lab`): one test binary, one module per area.
//! Labs share names, namespaces and the machine's two cores, so the tests of this
//! binary take `weft_tests::alone("lab")` first and run one at a time, as they did when
//! each area was a binary of its own.

mod basics;
mod bgp;
mod capture;
mod crash;
mod edges;
mod graph;
mod impair;
mod scale;
