//! Local labs out of network namespaces: named namespaces, daemons running inside
//! them, and CNI plugins executed exactly as a container runtime executes them
//! (environment, config on stdin, stdout captured, exit status). Used by
//! `weftctl bench` and, later, `weftctl lab`.

pub mod cluster;
mod daemon;
mod exec;
mod netns;

pub use cluster::{Lab, LabSpec, LinkCheck, NodeSpec, OUTSIDE_ADDRESS, PodSpec, Underlay};
pub use daemon::{DaemonPaths, NodeDaemon};
pub use exec::{CniExec, ExecOutcome};
pub use netns::NamedNetns;

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
}

impl LabError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io {
            what: what.into(),
            source,
        }
    }
}
