//! Who may speak on the node-to-node wire port: mutual TLS between nodes.
//!
//! A node reads its CA, certificate and key from the three files of a Kubernetes TLS
//! Secret ([`CA_FILE`], [`CERT_FILE`], [`KEY_FILE`]) in one directory ([`TlsDir`]) and
//! picks up new files for new connections ([`TlsDir::server`], [`TlsDir::client`]); live streams keep the
//! session they have. Both ends prove who they are: a peer's certificate must chain to
//! the CA and name the node that sits at the address it connects from ([`names_node`]),
//! by the node's name (a DNS SAN, checked against the Node objects) or by that address
//! (an IP SAN); a node's certificate cannot speak for another node. [`incoming`] accepts
//! connections (bounded handshakes, refusals reported to a [`TlsObserver`]) and
//! [`WireConnector`] dials them. [`WireSecurity::Insecure`] is plaintext, for an explicit
//! opt-out only.
//!
//! With the `issue` feature, [`issue`] makes a CA and node certificates (the lab's, and
//! `weftctl certs`).

mod accept;
mod conn;
mod connect;
mod dir;
mod identity;
#[cfg(feature = "issue")]
pub mod issue;

use std::net::IpAddr;
use std::sync::Arc;

pub use accept::{HANDSHAKE_TIMEOUT, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_ADDRESS, incoming};
pub use conn::WireConn;
pub use connect::{CONNECT_TIMEOUT, KEEPALIVE, KEEPALIVE_TIMEOUT, WireConnector};
pub use dir::{CA_FILE, CERT_FILE, KEY_FILE, TlsDir, TlsError};
pub use identity::names_node;

/// How the wire port is protected.
#[derive(Clone)]
pub enum WireSecurity {
    /// Plaintext: any host that can reach the port and sits at a node's address is
    /// believed (`--wire-insecure`).
    Insecure,
    /// Mutual TLS with the certificates of a [`TlsDir`].
    Mtls(Arc<TlsDir>),
}

impl WireSecurity {
    /// The metric label of the mode: `mtls` or `insecure`.
    pub fn mode(&self) -> &'static str {
        match self {
            WireSecurity::Insecure => "insecure",
            WireSecurity::Mtls(_) => "mtls",
        }
    }
}

impl std::fmt::Debug for WireSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireSecurity::Insecure => f.write_str("Insecure"),
            WireSecurity::Mtls(d) => f.debug_tuple("Mtls").field(&d.path()).finish(),
        }
    }
}

/// The name of the node at an address, as the Node objects say (`None` when no Node
/// lists it); what certificates are checked against.
pub trait NodeNames: Send + Sync + 'static {
    /// The node that has `addr` among its addresses.
    fn node_at(&self, addr: IpAddr) -> Option<String>;
}

impl<F: Fn(IpAddr) -> Option<String> + Send + Sync + 'static> NodeNames for F {
    fn node_at(&self, addr: IpAddr) -> Option<String> {
        self(addr)
    }
}

/// Where the TLS layer reports what it refused and reloaded (the wires' metrics, in
/// weftd), so that this crate stays free of a metrics registry.
pub trait TlsObserver: Send + Sync + 'static {
    /// A connection was refused before it could make a call; `reason` is one of
    /// [`REFUSALS`].
    fn refused(&self, reason: &'static str);
    /// The files changed and were read again: `ok` says whether they were usable (when
    /// not, the previous certificates stay in use).
    fn reloaded(&self, ok: bool);
}

/// A [`TlsObserver`] that only logs (tests, tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl TlsObserver for NoObserver {
    fn refused(&self, _: &'static str) {}
    fn reloaded(&self, _: bool) {}
}

/// Why a connection was refused at the TLS layer (the `reason` label of
/// `weft_peer_rejected_total`): no client certificate; a certificate the CA did not
/// issue (or expired, or not for client use); a valid certificate naming another node
/// than the one at the caller's address; any other failed handshake (not TLS at all,
/// closed midway); a handshake not finished in [`HANDSHAKE_TIMEOUT`]; more than
/// [`MAX_HANDSHAKES`] handshakes at once from addresses that are no node, or more than
/// [`MAX_HANDSHAKES_PER_ADDRESS`] from one address; this node has no usable certificate
/// yet.
pub const REFUSALS: [&str; 7] = [
    "no_certificate",
    "bad_certificate",
    "identity_mismatch",
    "tls_handshake",
    "handshake_timeout",
    "handshake_overload",
    "no_local_certificate",
];
