//! Local clusters out of network namespaces, built from a lab file: a router, node
//! namespaces with a weftd each, pods attached through the real plugin, and checks that
//! the links between them carry traffic (`weftctl lab up/down/check`); the Kubernetes
//! objects network policy reads, as the lab's API server writes them (`objects`); and
//! which pods reach which (`matrix`). The pieces it is built from (named namespaces,
//! node daemons, runtime-style plugin calls) are `weft-harness`'s.

pub mod cluster;
pub mod generate;
pub mod graph;
pub mod kinds;
pub mod matrix;
pub mod neigh;
pub mod objects;
pub mod ping;
mod process;
pub mod spec;

pub use cluster::{
    EXPORT_TABLE, Lab, LinkCheck, NAMES_BLOCK, NAMES_BLOCK6, NameCell, NameTable, OUTSIDE_ADDRESS, OUTSIDE_ADDRESS6,
    ROUTER_AS, node_config, router_config,
};
pub use spec::{DnsRecord, LabSpec, NamespaceSpec, NodeSpec, PodPort, PodSpec, Underlay, WireSecurityMode};

/// A lab that is taken down when this is dropped (a benchmark or test that fails
/// half-way leaves no daemon or namespace behind). `weftctl lab up` does not use it: its
/// lab outlives the command.
#[derive(Debug)]
pub struct DownOnDrop(pub Lab);

impl std::ops::Deref for DownOnDrop {
    type Target = Lab;
    fn deref(&self) -> &Lab {
        &self.0
    }
}

impl std::ops::DerefMut for DownOnDrop {
    fn deref_mut(&mut self) -> &mut Lab {
        &mut self.0
    }
}

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        if let Err(e) = self.0.down() {
            eprintln!("taking the lab down: {e}");
        }
    }
}

/// What can go wrong building a lab: the harness's errors (a command, an OS call, a
/// namespace or daemon), since a lab is built out of nothing else.
pub type LabError = weft_harness::HarnessError;
