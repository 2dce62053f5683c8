//! The wire port's dialler: TCP (no Nagle delay), then TLS with this node's certificate
//! when mTLS is on, as a connector for tonic's `Endpoint::connect_with_connector`.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::{WireConn, WireSecurity};

/// How long a connection may take to open (TCP and, with mTLS, the handshake).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often an idle [`WireConnector::channel`] pings its peer.
pub const KEEPALIVE: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is given up.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Dials `http://<address>:<port>` URIs on the wire port. The peer's certificate must
/// chain to the CA and name the node at that address (see [`crate::names_node`]).
#[derive(Clone, Debug)]
pub struct WireConnector {
    security: WireSecurity,
}

impl WireConnector {
    /// A connector with `security`.
    pub fn new(security: WireSecurity) -> Self {
        Self { security }
    }

    /// A channel to the wire port at `addr` through this connector: one HTTP/2
    /// connection that carries every call to that node, opened at the first call and
    /// opened again by itself after a failure, each call bounded by `call_timeout`.
    /// HTTP/2 pings while idle too, so a peer that went away without closing (a node
    /// that lost power) is found out between calls, not during one. Persistent rather
    /// than one per call: a node bringing up thousands of links calls its peers once
    /// per end, and a connection (and handshake, and a `TIME_WAIT` socket and a
    /// conntrack entry left behind) per call costs more as they pile up.
    pub fn channel(&self, addr: SocketAddr, call_timeout: Duration) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("an address and a port make a URI")
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(call_timeout)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_with_connector_lazy(self.clone())
    }

    /// Opens a connection to `addr`.
    pub async fn dial(&self, addr: SocketAddr) -> io::Result<WireConn> {
        // The certificate first: a node without one must not open a connection the peer
        // then counts as a failed handshake against itself.
        let config = match &self.security {
            WireSecurity::Insecure => None,
            WireSecurity::Mtls(dir) => Some(dir.client().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no usable wire TLS certificate in {} yet", dir.path().display()),
                )
            })?),
        };
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let Some(config) = config else {
            return Ok(WireConn::Plain(tcp));
        };
        let connector = tokio_rustls::TlsConnector::from(config);
        let tls = connector.connect(ServerName::IpAddress(addr.ip().into()), tcp).await?;
        Ok(WireConn::Tls(Box::new(tokio_rustls::TlsStream::Client(tls))))
    }
}

/// The address of a wire-port URI (its host must be an IP address).
fn address(uri: &Uri) -> io::Result<SocketAddr> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("not a wire address: {uri}"));
    let host = uri.host().ok_or_else(bad)?;
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| bad())?;
    Ok(SocketAddr::new(ip, uri.port_u16().ok_or_else(bad)?))
}

impl tower::Service<Uri> for WireConnector {
    type Response = TokioIo<WireConn>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<WireConn>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let me = self.clone();
        Box::pin(async move { Ok(TokioIo::new(me.dial(address(&uri)?).await?)) })
    }
}
