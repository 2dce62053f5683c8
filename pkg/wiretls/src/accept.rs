//! The wire port's acceptor: TCP connections, then (with mTLS) a bounded handshake and
//! the caller's identity, before tonic sees a byte.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::{TlsDir, TlsObserver, WireConn, WireSecurity, names_node};

/// A handshake not finished in this time is dropped: a peer that opens a connection
/// and sends nothing holds nothing for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// At most this many handshakes from addresses that are no node run at once; a
/// connection beyond them is closed at once (counted), so a burst of connections costs
/// the node a bounded amount of CPU and memory while established streams keep flowing.
pub const MAX_HANDSHAKES: usize = 64;
/// At most this many handshakes from one address run at once. Addresses of nodes (by
/// the Node objects) are held to this limit only, outside [`MAX_HANDSHAKES`]: a host
/// that is no node, however many connections it opens and leaves idle, can never keep
/// a real peer from reconnecting.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 8;

/// The handshakes running, by source address and for non-node sources in all.
#[derive(Default)]
struct Slots {
    inner: Mutex<SlotCounts>,
}

#[derive(Default)]
struct SlotCounts {
    by_address: HashMap<IpAddr, usize>,
    strangers: usize,
}

/// One running handshake's place; given back when dropped.
struct Slot {
    slots: Arc<Slots>,
    address: IpAddr,
    stranger: bool,
}

impl Slots {
    /// A place for a handshake from `address` (`node`: it is a node's), or `None` when
    /// its limits are reached.
    fn take(self: &Arc<Self>, address: IpAddr, node: bool) -> Option<Slot> {
        let mut c = self.inner.lock().expect("slots lock");
        let mine = c.by_address.get(&address).copied().unwrap_or(0);
        if mine >= MAX_HANDSHAKES_PER_ADDRESS || (!node && c.strangers >= MAX_HANDSHAKES) {
            return None;
        }
        *c.by_address.entry(address).or_insert(0) += 1;
        if !node {
            c.strangers += 1;
        }
        Some(Slot {
            slots: self.clone(),
            address,
            stranger: !node,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.inner.lock().expect("slots lock");
        if let Some(n) = c.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                c.by_address.remove(&self.address);
            }
        }
        if self.stranger {
            c.strangers -= 1;
        }
    }
}

/// The connections of `listener` that may speak, for tonic's
/// `serve_with_incoming_shutdown`. Handshakes run as tasks on `rt`; what is refused is
/// closed and reported to `observer` with its reason. The accepting task ends when the
/// returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    security: WireSecurity,
    observer: Arc<dyn TlsObserver>,
    rt: &Handle,
) -> impl Stream<Item = io::Result<WireConn>> + Send + 'static {
    let (tx, rx) = mpsc::channel(MAX_HANDSHAKES);
    let spawner = rt.clone();
    rt.spawn(async move {
        let slots = Arc::new(Slots::default());
        loop {
            let (tcp, remote) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, mostly: wait instead of spinning.
                        tracing::warn!(error = %e, "accepting on the wire port failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let dir = match &security {
                WireSecurity::Insecure => {
                    if tx.send(Ok(WireConn::Plain(tcp))).await.is_err() {
                        return;
                    }
                    continue;
                }
                WireSecurity::Mtls(dir) => dir.clone(),
            };
            let node = dir.names().node_at(remote.ip()).is_some();
            let Some(slot) = slots.take(remote.ip(), node) else {
                observer.refused("handshake_overload");
                tracing::debug!(%remote, "wire connection refused: too many handshakes at once");
                continue;
            };
            let (tx, observer) = (tx.clone(), observer.clone());
            spawner.spawn(async move {
                let accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &dir)).await;
                drop(slot);
                match accepted {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(reason)) => {
                        observer.refused(reason);
                        tracing::debug!(%remote, reason, "wire connection refused");
                    }
                    Err(_) => {
                        observer.refused("handshake_timeout");
                        tracing::debug!(%remote, "wire connection refused: handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The TLS handshake with the current certificates, then the caller's identity.
async fn handshake(tcp: TcpStream, dir: &TlsDir) -> Result<WireConn, &'static str> {
    let remote = tcp.peer_addr().map_err(|_| "tls_handshake")?.ip();
    let config = dir.server().ok_or("no_local_certificate")?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let tls = acceptor.accept(tcp).await.map_err(|e| handshake_failure(&e))?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no_certificate")?;
    let node = dir.names().node_at(remote);
    if !names_node(cert, remote, node.as_deref()) {
        return Err("identity_mismatch");
    }
    Ok(WireConn::Tls(Box::new(tokio_rustls::TlsStream::Server(tls))))
}

/// The refusal reason of a failed handshake.
fn handshake_failure(e: &io::Error) -> &'static str {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::NoCertificatesPresented) => "no_certificate",
        Some(rustls::Error::InvalidCertificate(_)) => "bad_certificate",
        _ => "tls_handshake",
    }
}
