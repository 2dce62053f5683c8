//! Local clusters out of network namespaces, built from a lab file: a router, node
//! namespaces with a weftd each, pods attached through the real plugin, and checks that
//! the links between them carry traffic (`weftctl lab up/down/check`). The pieces it is
//! built from (named namespaces, node daemons, runtime-style plugin calls) are
//! `weft-harness`'s.

#![forbid(unsafe_code)]

pub mod cluster;

pub use cluster::{Lab, LabSpec, LinkCheck, NodeSpec, OUTSIDE_ADDRESS, PodSpec, Underlay};

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

/// What can go wrong building a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A command failed.
    #[error("{what}: {detail}")]
    Command {
        /// What was being done.
        what: String,
        /// Its output or error.
        detail: String,
    },
    /// An OS call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A namespace, daemon or plugin call of the harness failed.
    #[error(transparent)]
    Harness(#[from] weft_harness::HarnessError),
}

impl LabError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io {
            what: what.into(),
            source,
        }
    }
}
