//! Through a real runtime: containerd running pods on weft, and the install
//! path (the DaemonSet's init work, kubelet's view).
//!
//! One test binary, one module per area (each was a binary of its own): tests of one
//! area run beside each other, areas one after another ([`weft_tests::area`]).

mod containerd;
mod install;
