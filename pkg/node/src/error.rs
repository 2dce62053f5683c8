//! Why a node daemon could not start. Each variant is one start-up step; its message
//! names the step, and the cause follows as the error's source.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::lock::LockError;

/// A start-up step that failed; the daemon does not serve.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The state directory could not be created.
    #[error("creating {}", path.display())]
    CreateStateDir {
        /// The state directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state directory's mode could not be set to 0700.
    #[error(transparent)]
    StateDirMode(std::io::Error),
    /// Another daemon holds the state directory, or its lock file cannot be opened.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The UNIX socket could not be claimed.
    #[error("binding {}", path.display())]
    BindSocket {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state database could not be opened.
    #[error("opening the state store {}", path.display())]
    OpenStore {
        /// The database file.
        path: PathBuf,
        /// Why.
        #[source]
        source: weft_store::StoreError,
    },
    /// The start of this run could not be recorded.
    #[error("recording the start")]
    BeginRun(#[source] weft_store::StoreError),
    /// A kernel setting weftd needs (IP forwarding, `route_localnet` with
    /// `--hostports-localhost`) could not be set, or one it no longer needs put back.
    #[error("settling sysctl {name}")]
    Sysctl {
        /// The setting.
        name: &'static str,
        /// Why.
        #[source]
        source: crate::sysctls::SysctlError,
    },
    /// What a crash interrupted could not be finished.
    #[error("start-up recovery: {step}: {reason}")]
    Recovery {
        /// The recovery step.
        step: RecoveryStep,
        /// The step's failure, as it reported it.
        reason: String,
    },
    /// The thread reading denied flows from the kernel (NFLOG) could not start.
    #[error("starting the deny log reader")]
    DenyLogReader(#[source] std::io::Error),
    /// The thread reading DNS answers for `domainNames` rules (NFQUEUE) could not
    /// start.
    #[error("starting the DNS answer reader")]
    DnsAnswerReader(#[source] std::io::Error),
    /// A flow export asked for could not start (no OTLP endpoint, an exporter that
    /// cannot be built).
    #[error("starting the flow export: {0}")]
    FlowExport(String),
    /// The thread reading conntrack for flows could not start.
    #[error("starting the flow reader")]
    FlowReader(#[source] std::io::Error),
    /// A blocking start-up task died before it finished (a panic).
    #[error("start-up task {what}")]
    TaskFailed {
        /// The task.
        what: String,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The pod VXLAN port is the one wire VXLANs use.
    #[error("--pod-vxlan-port {port} is the port wire VXLANs use; pick another (default {default})")]
    PodVxlanPort {
        /// The port asked for.
        port: u16,
        /// The default port.
        default: u16,
    },
    /// The topology directory could not be watched.
    #[error("reading topologies from {}: {error}", path.display())]
    TopologyDir {
        /// The directory.
        path: PathBuf,
        /// Why (its message is part of this one).
        error: weft_topology::SourceError,
    },
    /// No client for the Kubernetes API.
    #[error("connecting to the Kubernetes API")]
    Kubernetes(#[source] kube::Error),
    /// The node network's netlink socket could not be opened.
    #[error("opening netlink for pod routing")]
    PodRouting(#[source] weft_kernel::KernelError),
    /// The wire data plane's thread could not be started.
    #[error("starting the wire data plane's thread")]
    DataPlane(#[source] std::io::Error),
    /// The attachments to restore into the wire engine could not be read.
    #[error("listing attachments")]
    ListAttachments(#[source] weft_store::StoreError),
    /// The kernel could not be made to match the store before serving.
    #[error("start-up reconciliation")]
    Reconcile(#[source] weft_cni::CniError),
    /// The HTTP endpoints could not be bound.
    #[error("binding the HTTP endpoints on {addr}")]
    BindHttp {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Wires are served but neither `--wire-tls-dir` nor `--wire-insecure` was given.
    #[error(
        "the node-to-node wire port needs --wire-tls-dir DIR (ca.crt, tls.crt and tls.key of this node) or, for plaintext on a closed network, --wire-insecure"
    )]
    WireTlsUnset,
    /// The wire service could not be bound.
    #[error("binding the wire service on {addr}")]
    BindWire {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A step of start-up recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryStep {
    /// A new database: the pods weft set up before are read back from the kernel.
    Rebuild,
    /// ADDs and DELs a crash interrupted are finished or undone.
    Interrupted,
}

impl std::fmt::Display for RecoveryStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecoveryStep::Rebuild => "rebuilding the state from the kernel",
            RecoveryStep::Interrupted => "finishing interrupted calls",
        })
    }
}
