//! One connection on the wire port, plaintext or TLS, as both tonic's server and its
//! client take it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A wire-port connection: the TCP stream, or the TLS session over it.
pub enum WireConn {
    /// `--wire-insecure`.
    Plain(TcpStream),
    /// Mutual TLS, either side.
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl WireConn {
    fn tcp(&self) -> &TcpStream {
        match self {
            WireConn::Plain(s) => s,
            WireConn::Tls(s) => s.get_ref().0,
        }
    }
}

/// The connection's addresses, as plain TCP gives them, so that the service reads the
/// caller's address the same way in both modes (the peer's identity was checked before
/// the connection was handed over).
impl Connected for WireConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        let tcp = self.tcp();
        TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        }
    }
}

impl AsyncRead for WireConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireConn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            WireConn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WireConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WireConn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            WireConn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WireConn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            WireConn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WireConn::Plain(s) => s.is_write_vectored(),
            WireConn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireConn::Plain(s) => Pin::new(s).poll_flush(cx),
            WireConn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireConn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            WireConn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
