//! The gRPC protocols of weft: the CNI relay (`cnirpc`) between plugin and daemon and
//! the admin service used by `weftctl`, generated from `proto/`; plus the helpers both
//! ends share: dialing the daemon's UNIX socket and carrying CNI errors in a status.

use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use tonic::transport::{Channel, Endpoint};

/// The CNI relay service and its messages (`weft.cnirpc.v1`).
pub mod cnirpc {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.cnirpc.v1");
}

/// The operator service of weftd (`weft.admin.v1`).
pub mod admin {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.admin.v1");
}

pub mod codec;

/// The node-to-node services (`weft.wire.v1`: `Wire`, and `Policy`, which announces new
/// pods' addresses), on [`codec::WireCodec`].
pub mod wire {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.wire.v1");
}

/// The standard gRPC rich-error envelope (`google.rpc.Status`).
pub mod rpc_status {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("google.rpc");
}

/// The wire form of a CNI error; plugin and daemon both work with [`weft_cni::CniError`]
/// and convert at the edge ([`cni_error_status`], [`cni_error_from_status`]).
pub use cnirpc::CniError as WireCniError;

/// Fully qualified protobuf name of [`WireCniError`], used as the `Any` type URL suffix.
pub const CNI_ERROR_TYPE_URL: &str = "type.googleapis.com/weft.cnirpc.v1.CNIError";

/// The gRPC code a CNI error travels under, by its class (gRPC tooling sees it; the
/// plugin reads the CNI error itself). Exhaustive: a new class is mapped here or
/// nothing builds.
pub fn grpc_code(class: weft_cni::Class) -> tonic::Code {
    use weft_cni::Class;
    match class {
        Class::InvalidArgument => tonic::Code::InvalidArgument,
        Class::NotFound => tonic::Code::NotFound,
        Class::Unavailable => tonic::Code::Unavailable,
        Class::ResourceExhausted => tonic::Code::ResourceExhausted,
        Class::FailedPrecondition => tonic::Code::FailedPrecondition,
        Class::AlreadyExists => tonic::Code::AlreadyExists,
        Class::Internal => tonic::Code::Internal,
    }
}

impl From<&weft_cni::CniError> for WireCniError {
    fn from(e: &weft_cni::CniError) -> Self {
        Self {
            code: e.code.number(),
            msg: e.msg.clone(),
            details: e.details.clone(),
        }
    }
}

impl From<WireCniError> for weft_cni::CniError {
    /// A code this build does not know (a newer daemon's) is reported as internal,
    /// with the daemon's number kept in the details.
    fn from(e: WireCniError) -> Self {
        match weft_cni::Code::from_number(e.code) {
            Some(code) => Self {
                code,
                msg: e.msg,
                details: e.details,
            },
            None => Self {
                code: weft_cni::Code::Internal,
                msg: e.msg,
                details: format!(
                    "{} (the daemon answered CNI code {}, unknown to this plugin)",
                    e.details, e.code
                ),
            },
        }
    }
}

/// Wraps a CNI error in a gRPC status: the code of its class for gRPC-level tooling,
/// and the CNI error itself as the single detail of a `google.rpc.Status`.
pub fn cni_error_status(err: &weft_cni::CniError) -> tonic::Status {
    let grpc = grpc_code(err.code.class());
    let wire = WireCniError::from(err);
    let envelope = rpc_status::Status {
        code: grpc as i32,
        message: wire.msg.clone(),
        details: vec![prost_types::Any {
            type_url: CNI_ERROR_TYPE_URL.to_string(),
            value: wire.encode_to_vec(),
        }],
    };
    let message = if wire.details.is_empty() {
        wire.msg.clone()
    } else {
        format!("{}: {}", wire.msg, wire.details)
    };
    tonic::Status::with_details(grpc, message, envelope.encode_to_vec().into())
}

/// Extracts the CNI error carried by a status made with [`cni_error_status`], if any.
pub fn cni_error_from_status(status: &tonic::Status) -> Option<weft_cni::CniError> {
    let envelope = rpc_status::Status::decode(status.details()).ok()?;
    envelope
        .details
        .iter()
        .find(|any| any.type_url == CNI_ERROR_TYPE_URL)
        .and_then(|any| WireCniError::decode(any.value.as_slice()).ok())
        .map(weft_cni::CniError::from)
}

/// How a client dials the daemon's socket.
#[derive(Debug, Clone)]
pub struct DialOptions {
    /// How long to keep retrying while the socket is missing or refuses connections
    /// (the daemon is restarting). Zero means one attempt.
    pub connect_window: Duration,
    /// Deadline for each call.
    pub call_timeout: Duration,
    /// A connection whose peer stops answering HTTP/2 pings for this long is dropped,
    /// so a hung daemon fails calls instead of stalling them until the deadline.
    pub keepalive_timeout: Duration,
}

impl Default for DialOptions {
    fn default() -> Self {
        Self {
            connect_window: Duration::from_millis(1500),
            call_timeout: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(2),
        }
    }
}

/// Dials the daemon's UNIX socket at `path` and returns a ready gRPC channel.
///
/// Connection failures that a restarting daemon produces (socket missing, connection
/// refused) are retried for `opts.connect_window`; the error returned afterwards is
/// the last one seen.
pub async fn dial_unix(path: &Path, opts: &DialOptions) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    let window = opts.connect_window;
    // The URI is required by the API but never resolved: the connector ignores it.
    let endpoint = Endpoint::from_static("http://weftd.invalid")
        .timeout(opts.call_timeout)
        .connect_timeout(window + Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(opts.keepalive_timeout)
        .keep_alive_while_idle(true);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = connect_with_retry(&path, window).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// One HTTP/2 connection to the daemon's socket, for a client that makes a call or two
/// and exits: the CNI plugin, exec'd for every pod. A tonic [`Channel`] would add a
/// buffer task, a reconnect layer and a load-balancing stack around the connection,
/// which a process that lives for one call pays for at every start and never uses.
/// Wrap it in a generated client with `with_origin(conn, UnixConnection::origin())`.
/// The connection keeps answering the daemon's pings while a call waits, and fails
/// the call when the daemon stops answering its own ([`DialOptions::keepalive_timeout`]);
/// the caller bounds each call by [`DialOptions::call_timeout`] itself.
#[derive(Debug, Clone)]
pub struct UnixConnection {
    send: hyper::client::conn::http2::SendRequest<tonic::body::Body>,
}

impl UnixConnection {
    /// The origin requests name: required by HTTP/2, never resolved.
    pub fn origin() -> tonic::transport::Uri {
        tonic::transport::Uri::from_static("http://weftd.invalid")
    }
}

/// Why [`connect_unix`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The socket could not be connected to (within the connect window).
    Socket(std::io::Error),
    /// The socket answered, but not as an HTTP/2 server.
    Handshake(hyper::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Socket(_) => f.write_str("connecting to the socket"),
            Self::Handshake(_) => f.write_str("the HTTP/2 handshake"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Socket(e) => Some(e),
            Self::Handshake(e) => Some(e),
        }
    }
}

/// Connects to the daemon's UNIX socket at `path` for a call or two ([`UnixConnection`]).
/// A missing socket or a refused connection is retried for `opts.connect_window`, as
/// [`dial_unix`] does. The connection is driven by a task on the current runtime.
pub async fn connect_unix(path: &Path, opts: &DialOptions) -> Result<UnixConnection, ConnectError> {
    let stream = connect_with_retry(path, opts.connect_window)
        .await
        .map_err(ConnectError::Socket)?;
    let (send, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(opts.keepalive_timeout)
        .keep_alive_while_idle(true)
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    // Ends with the connection; its error, if any, is the call's.
    tokio::spawn(conn);
    Ok(UnixConnection { send })
}

impl tower::Service<http::Request<tonic::body::Body>> for UnixConnection {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.send.send_request(req))
    }
}

async fn connect_with_retry(path: &Path, window: Duration) -> std::io::Result<tokio::net::UnixStream> {
    let deadline = tokio::time::Instant::now() + window;
    let mut backoff = Duration::from_millis(20);
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && tokio::time::Instant::now() + backoff < deadline =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_error_round_trips_through_a_status() {
        let err = weft_cni::CniError::new(weft_cni::Code::RangeExhausted, "10.0.0.0/30 has no free address");
        let status = cni_error_status(&err);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(cni_error_from_status(&status), Some(err));
    }

    #[test]
    fn every_code_keeps_its_grpc_code() {
        use tonic::Code as G;
        use weft_cni::Code as C;
        // The table from before the codes were typed: a change here is a change of
        // what gRPC tooling and its metrics see.
        let want = [
            (C::IncompatibleVersion, G::InvalidArgument),
            (C::UnsupportedField, G::InvalidArgument),
            (C::UnknownContainer, G::NotFound),
            (C::InvalidEnv, G::InvalidArgument),
            (C::IoFailure, G::Internal),
            (C::Decode, G::InvalidArgument),
            (C::InvalidConfig, G::InvalidArgument),
            (C::InvalidNetns, G::InvalidArgument),
            (C::TryAgainLater, G::Unavailable),
            (C::NotAvailable, G::Unavailable),
            (C::Internal, G::Internal),
            (C::RangeExhausted, G::ResourceExhausted),
            (C::Kernel, G::Internal),
            (C::Store, G::Internal),
            (C::CheckFailed, G::FailedPrecondition),
            (C::InterfaceExists, G::AlreadyExists),
            (C::HostPortInUse, G::Internal),
            (C::AddressInUse, G::AlreadyExists),
            (C::RouteExists, G::AlreadyExists),
        ];
        assert_eq!(want.map(|(c, _)| c), C::ALL, "every code is in the table");
        for (c, g) in want {
            assert_eq!(grpc_code(c.class()), g, "{c:?}");
        }
    }

    #[test]
    fn an_unknown_code_from_a_newer_daemon_is_internal_with_its_number() {
        let wire = WireCniError {
            code: 150,
            msg: "something new".into(),
            details: "why".into(),
        };
        let e = weft_cni::CniError::from(wire);
        assert_eq!(e.code, weft_cni::Code::Internal);
        assert_eq!(e.msg, "something new");
        assert!(e.details.contains("CNI code 150"), "{}", e.details);
    }

    /// Answers ADD with the container id as its result and DEL with a CNI error.
    struct Echo;

    #[tonic::async_trait]
    impl cnirpc::cni_server::Cni for Echo {
        async fn add(
            &self,
            r: tonic::Request<cnirpc::CniArgs>,
        ) -> Result<tonic::Response<cnirpc::AddResponse>, tonic::Status> {
            Ok(tonic::Response::new(cnirpc::AddResponse {
                result: r.into_inner().container_id.into_bytes(),
            }))
        }
        async fn del(
            &self,
            _: tonic::Request<cnirpc::CniArgs>,
        ) -> Result<tonic::Response<cnirpc::DelResponse>, tonic::Status> {
            Err(cni_error_status(&weft_cni::CniError::new(
                weft_cni::Code::InvalidNetns,
                "no such netns",
            )))
        }
        async fn check(
            &self,
            _: tonic::Request<cnirpc::CniArgs>,
        ) -> Result<tonic::Response<cnirpc::CheckResponse>, tonic::Status> {
            Ok(tonic::Response::new(cnirpc::CheckResponse {}))
        }
        async fn status(
            &self,
            _: tonic::Request<cnirpc::CniArgs>,
        ) -> Result<tonic::Response<cnirpc::StatusResponse>, tonic::Status> {
            Ok(tonic::Response::new(cnirpc::StatusResponse {}))
        }
        async fn gc(
            &self,
            _: tonic::Request<cnirpc::CniArgs>,
        ) -> Result<tonic::Response<cnirpc::GcResponse>, tonic::Status> {
            Ok(tonic::Response::new(cnirpc::GcResponse { removed: 0 }))
        }
    }

    fn args(container_id: &str) -> cnirpc::CniArgs {
        cnirpc::CniArgs {
            container_id: container_id.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_unix_connection_carries_calls_and_their_cni_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weftd.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(cnirpc::cni_server::CniServer::new(Echo))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let conn = connect_unix(&path, &DialOptions::default()).await.unwrap();
        let mut client = cnirpc::cni_client::CniClient::with_origin(conn, UnixConnection::origin());
        for id in ["ctr-1", "ctr-2"] {
            let got = client.add(args(id)).await.unwrap().into_inner().result;
            assert_eq!(got, id.as_bytes(), "one connection, two calls");
        }
        let status = client.del(args("ctr-1")).await.unwrap_err();
        assert_eq!(
            cni_error_from_status(&status),
            Some(weft_cni::CniError::new(weft_cni::Code::InvalidNetns, "no such netns")),
            "the CNI error travels"
        );
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_socket_error_after_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let opts = DialOptions {
            connect_window: Duration::from_millis(50),
            ..Default::default()
        };
        match connect_unix(&dir.path().join("none.sock"), &opts).await {
            Err(ConnectError::Socket(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
            other => panic!("expected a socket error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_peer_that_accepts_and_never_answers_fails_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hung.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Accepts and holds the connection, reading nothing: a stopped daemon whose
        // socket still queues connections.
        let held = tokio::spawn(async move { listener.accept().await.map(|(s, _)| s) });
        let opts = DialOptions {
            keepalive_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let conn = connect_unix(&path, &opts).await.unwrap();
        let mut client = cnirpc::cni_client::CniClient::with_origin(conn, UnixConnection::origin());
        // The bound only keeps a broken keep-alive from hanging the test.
        let outcome = tokio::time::timeout(Duration::from_secs(20), client.add(args("ctr-1")))
            .await
            .expect("the keep-alive ends the call, not the test's bound");
        let status = outcome.unwrap_err();
        assert!(cni_error_from_status(&status).is_none(), "{status:?}");
        drop(held);
    }

    #[test]
    fn a_plain_status_carries_no_cni_error() {
        let status = tonic::Status::unavailable("gone");
        assert_eq!(cni_error_from_status(&status), None);
    }
}
