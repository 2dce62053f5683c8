//! The node's servers: CNI and admin gRPC on the UNIX socket, the HTTP endpoints, and
//! the node-to-node services on TCP (the wire service, tuned for frame streams, on the
//! data plane's thread; beside it network policy's announcements). Each binds first, so a start-up error names the address, then serves on a
//! task of its own until `stop`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use weft_daemon::service::{AdminService, CniService};
use weft_daemon::{Handler, server};
use weft_rpc::admin::admin_server::AdminServer;
use weft_rpc::cnirpc::cni_server::CniServer;
use weft_telemetry::{CallLog, GrpcLayer, Metrics, Readiness, Refresh};
use weft_wires::{Engine, WireService};
use weft_wiretls::{TlsObserver, WireSecurity};

use crate::announce::PolicyService;
use crate::error::NodeError;
use crate::netpol;

/// Serves the CNI and admin services on `listener` (peers other than root are closed)
/// until `stop`, then lets calls in flight finish.
pub fn serve_socket<I: weft_daemon::Ipam, K: weft_daemon::PodNetworking>(
    listener: UnixListener,
    metrics: Arc<Metrics>,
    calls: Arc<CallLog>,
    handler: Arc<Handler<I, K>>,
    admin: AdminService,
    stop: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    // Cross-cutting behaviour of every call (span, metrics, access log, call log) is
    // this one layer; the services below know nothing of it.
    let grpc = tonic::transport::Server::builder()
        .layer(GrpcLayer::new(metrics, calls))
        .add_service(CniServer::new(CniService::new(handler)))
        .add_service(AdminServer::new(admin))
        .serve_with_incoming_shutdown(server::root_only(listener), stop);
    tokio::spawn(grpc)
}

/// Binds `addr` and serves `/healthz`, `/readyz` and `/metrics` until `stop`.
pub async fn serve_http(
    addr: SocketAddr,
    ready: Readiness,
    metrics: Arc<Metrics>,
    refresh: Refresh,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<std::io::Result<()>>, NodeError> {
    let http = weft_telemetry::bind_http(addr)
        .await
        .map_err(|source| NodeError::BindHttp { addr, source })?;
    Ok(tokio::spawn(weft_telemetry::serve_http(
        http,
        weft_telemetry::router(ready, metrics, Some(refresh)),
        stop,
    )))
}

/// The `weft.wire.v1.Policy` server weftd runs beside the wire service.
pub type PolicyServer = weft_rpc::wire::policy_server::PolicyServer<PolicyService<netpol::Engine>>;

/// Binds `addr` and serves the node-to-node wire service of `engine`, and `policy`
/// (new pods' addresses from the other nodes) when network policy runs, on the data
/// plane's runtime (`plane`) until `stop`; with mTLS, every connection proves first that
/// it is the node at its address (see `weft_wiretls::incoming`).
pub async fn serve_wires(
    addr: SocketAddr,
    engine: Arc<Engine>,
    security: WireSecurity,
    policy: Option<PolicyServer>,
    plane: &tokio::runtime::Handle,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<Result<(), tonic::transport::Error>>, NodeError> {
    let wire = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| NodeError::BindWire { addr, source })?;
    let observer: Arc<dyn TlsObserver> = engine.metrics().clone();
    let incoming = weft_wiretls::incoming(wire, security, observer, plane);
    // Frame streams carry batches of up to a megabyte: large windows and frames keep a
    // batch in one write (the acceptor turns Nagle off).
    let serve = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(8 << 20))
        .max_frame_size(Some(weft_wires::dataplane::H2_MAX_FRAME))
        .add_service(WireService::server(engine))
        .add_optional_service(policy)
        .serve_with_incoming_shutdown(incoming, stop);
    // On the wire data plane's own thread, beside the TAP readers.
    Ok(plane.spawn(serve))
}
