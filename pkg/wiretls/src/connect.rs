//! The wire port's dialler: TCP (no Nagle delay), then TLS with this node's certificate
//! when mTLS is on, as a connector for tonic's `Endpoint::connect_with_connector`.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::{WireConn, WireSecurity};

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
