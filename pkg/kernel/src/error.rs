//! Errors from kernel operations, classified so the daemon can pick the CNI code.

use std::io;

/// A failed kernel operation.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The pod's namespace path does not exist or is not a network namespace.
    #[error("network namespace {path}: {reason}")]
    InvalidNetns {
        /// The path given.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// The interface name asked for already exists in the pod's namespace.
    #[error("interface {ifname} already exists in the pod's network namespace")]
    InterfaceExists {
        /// The clashing name.
        ifname: String,
    },
    /// A netlink, sysctl or namespace call failed.
    #[error("{step}: {source}")]
    Os {
        /// What weft was doing.
        step: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// CHECK found a difference between what weft set up and what exists.
    #[error("{0}")]
    Drift(String),
}

impl KernelError {
    /// An OS error with the step it happened in.
    pub fn os(step: impl Into<String>, source: io::Error) -> Self {
        KernelError::Os {
            step: step.into(),
            source,
        }
    }

    /// The errno behind an [`KernelError::Os`], if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            KernelError::Os { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
