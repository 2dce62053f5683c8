//! Named network namespaces, node daemons inside them, and runtime-style plugin calls:
//! the one harness of the lab (`weft-lab`), the benchmarks (`weft-bench`) and the
//! integration tests (`weft-tests`).
//!
//! It is a crate of its own rather than a part of `weft-lab` because its users want
//! different things from it: the lab builds clusters out of a lab file and leaves them
//! running after `weftctl lab up` exits, the benchmarks time plugin calls and must pay
//! nothing for the rest, and the tests want every namespace and daemon gone when a test
//! ends, however it ends. What they share (making and removing a namespace, starting
//! weftd inside one and telling when it serves, executing a plugin with the `CNI_*`
//! environment and the config on stdin) lives here once; each keeps only its policy
//! (names, time limits, what a failure means).
//!
//! Nothing here switches a thread of the caller into a namespace: work runs inside one
//! through `weft_kernel::in_netns` (a fresh thread) and processes start inside one
//! through `weft_kernel::NetNs::enter_in_child` (between fork and exec).

// One `unsafe` block, allowed where it is: starting a lab's daemon in a session of
// its own (setsid between fork and exec).

mod daemon;
mod exec;
pub mod metrics;
mod netns;
mod process;

pub use daemon::{DaemonConfig, NodeDaemon, wait_for_socket};
pub use exec::{CallOptions, CniExec, CniVars, ExecOutcome, RUNTIME_PATH};
pub use netns::NamedNetns;
pub use process::{ChildGuard, ip, run, wait_exit};

/// What can go wrong setting up or driving a namespace, a daemon or a plugin call.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A command ran and failed, or a process did not do what was expected of it.
    #[error("{what}: {detail}")]
    Command {
        /// What was being done.
        what: String,
        /// Its output, or why it counts as failed.
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
    /// Opening or entering a namespace failed.
    #[error(transparent)]
    Kernel(#[from] weft_kernel::KernelError),
    /// A process ran past its time limit and was killed.
    #[error("{what} did not finish within {limit:?}")]
    TimedOut {
        /// The process.
        what: String,
        /// The limit it was given.
        limit: std::time::Duration,
    },
}

impl HarnessError {
    /// An OS error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io {
            what: what.into(),
            source,
        }
    }
}
