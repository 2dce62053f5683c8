//! One node: the real plugin and weftd in a node namespace, through every CNI
//! command, crash, restart, fault and storm, host ports, several networks, and what
//! they show (metrics, traces, logs).
//!
//! One test binary, one module per area (each was a binary of its own): tests of one
//! area run beside each other, areas one after another ([`weft_tests::area`]).

mod cni;
mod concurrency;
mod crash;
mod del_spool;
mod disk_full;
mod drift;
mod hostports;
mod networks;
mod observability;
mod restart;
mod store_faults;
mod storm;
