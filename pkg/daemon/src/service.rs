//! The whole gRPC surface of weftd in one file: the CNI relay service the plugin
//! calls, and the admin service `weftctl` calls. Each method decodes, delegates, and
//! maps the outcome to a status; nothing else happens here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::{Request, Response, Status};
use tracing::Instrument;
use weft_cni::args::{K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID};
use weft_cni::{CniError, code};
use weft_rpc::admin::admin_server::Admin;
use weft_rpc::admin::{
    Call, CallsReply, CallsRequest, HostPort as HostPortMsg, PortsReply, PortsRequest, RangeUsage as RangeUsageMsg,
    StatusReply, StatusRequest, WireEnd as WireEndMsg, WiresReply, WiresRequest,
};
use weft_rpc::cnirpc::cni_server::Cni;
use weft_rpc::cnirpc::{AddResponse, CheckResponse, CniArgs, DelResponse, GcResponse, StatusResponse};
use weft_store::{SCHEMA_VERSION, Store};
use weft_telemetry::{CallInfo, CallLog, CniCallFields};

use crate::handler::Handler;
use crate::seams::{Ipam, PodNetworking, Wiring};

/// The gRPC code a CNI error travels under (tooling sees it; the plugin reads the
/// CNI error detail).
fn grpc_code(cni: u32) -> tonic::Code {
    match cni {
        code::INCOMPATIBLE_VERSION
        | code::UNSUPPORTED_FIELD
        | code::INVALID_ENV
        | code::DECODE
        | code::INVALID_CONFIG
        | code::INVALID_NETNS => tonic::Code::InvalidArgument,
        code::UNKNOWN_CONTAINER => tonic::Code::NotFound,
        code::TRY_AGAIN_LATER | code::NOT_AVAILABLE => tonic::Code::Unavailable,
        code::RANGE_EXHAUSTED => tonic::Code::ResourceExhausted,
        code::CHECK_FAILED => tonic::Code::FailedPrecondition,
        code::INTERFACE_EXISTS | code::ADDRESS_IN_USE | code::ROUTE_EXISTS => tonic::Code::AlreadyExists,
        _ => tonic::Code::Internal,
    }
}

/// A CNI error as a status carrying it.
pub fn to_status(e: &CniError) -> Status {
    weft_rpc::cni_error_status(
        grpc_code(e.code),
        &weft_rpc::CniError {
            code: e.code,
            msg: e.msg.clone(),
            details: e.details.clone(),
        },
    )
}

/// Runs a call on its own task, so a client that disconnects or times out cannot
/// cancel it half-way: an ADD either finishes or undoes itself. The task runs in the
/// call's span, and its outcome is recorded on the call.
async fn detached<T: Send + 'static>(
    call: Option<Arc<CallInfo>>,
    fut: impl Future<Output = Result<T, CniError>> + Send + 'static,
) -> Result<T, Status> {
    let outcome = match tokio::spawn(fut.in_current_span()).await {
        Ok(r) => r,
        Err(join) => Err(CniError::new(code::INTERNAL, format!("the call's task failed: {join}"))),
    };
    if let Some(c) = call {
        match &outcome {
            Ok(_) => c.record_outcome(0, ""),
            Err(e) => c.record_outcome(e.code, &format!("{}: {}", e.msg, e.details)),
        }
    }
    outcome.map_err(|e| to_status(&e))
}

/// Takes the call's arguments and records what the call is about on its span (so
/// every log line inside carries the pod fields) and in the call log.
fn decode(command: &str, request: Request<CniArgs>) -> (Option<Arc<CallInfo>>, CniArgs) {
    let call = request.extensions().get::<Arc<CallInfo>>().cloned();
    let args = request.into_inner();
    if let Some(c) = &call {
        let get = |k: &str| args.args.get(k).map_or("", String::as_str);
        c.record_cni(&CniCallFields {
            command,
            pod_namespace: get(K8S_POD_NAMESPACE),
            pod_name: get(K8S_POD_NAME),
            pod_uid: get(K8S_POD_UID),
            container_id: &args.container_id,
            netns: &args.netns,
            ifname: &args.ifname,
        });
    }
    (call, args)
}

/// The `weft.cnirpc.v1.CNI` service.
pub struct CniService<I, K> {
    handler: Arc<Handler<I, K>>,
}

impl<I, K> CniService<I, K> {
    /// Serves `handler`.
    pub fn new(handler: Arc<Handler<I, K>>) -> Self {
        Self { handler }
    }
}

#[tonic::async_trait]
impl<I: Ipam, K: PodNetworking> Cni for CniService<I, K> {
    async fn add(&self, request: Request<CniArgs>) -> Result<Response<AddResponse>, Status> {
        let (call, args) = decode("ADD", request);
        let h = self.handler.clone();
        let result = detached(call, async move { h.add(&args).await }).await?;
        Ok(Response::new(AddResponse { result }))
    }

    async fn del(&self, request: Request<CniArgs>) -> Result<Response<DelResponse>, Status> {
        let (call, args) = decode("DEL", request);
        let h = self.handler.clone();
        detached(call, async move { h.del(&args).await }).await?;
        Ok(Response::new(DelResponse {}))
    }

    async fn check(&self, request: Request<CniArgs>) -> Result<Response<CheckResponse>, Status> {
        let (call, args) = decode("CHECK", request);
        let h = self.handler.clone();
        detached(call, async move { h.check(&args).await }).await?;
        Ok(Response::new(CheckResponse {}))
    }

    async fn status(&self, request: Request<CniArgs>) -> Result<Response<StatusResponse>, Status> {
        let (call, args) = decode("STATUS", request);
        let h = self.handler.clone();
        detached(call, async move { h.status(&args).await }).await?;
        Ok(Response::new(StatusResponse {}))
    }

    async fn gc(&self, request: Request<CniArgs>) -> Result<Response<GcResponse>, Status> {
        let (call, args) = decode("GC", request);
        let h = self.handler.clone();
        let removed = detached(call, async move { h.gc(&args).await }).await?;
        Ok(Response::new(GcResponse { removed }))
    }
}

/// The `weft.admin.v1.Admin` service.
pub struct AdminService {
    store: Store,
    node_name: String,
    started_at: i64,
    ready: Arc<AtomicBool>,
    pending: Arc<dyn Fn() -> usize + Send + Sync>,
    calls: Arc<CallLog>,
    wiring: Option<Arc<dyn Wiring>>,
    node_network: Option<NodeNetworkReport>,
}

/// Reports the pod network between nodes for `weftctl status` (the daemon knows it; the
/// admin service only relays it).
pub type NodeNetworkReport = Arc<dyn Fn() -> Option<weft_rpc::admin::NodeNetwork> + Send + Sync>;

impl AdminService {
    /// Reports on `store` and the recent `calls`; `pending` counts teardowns in flight.
    pub fn new(
        store: Store,
        node_name: String,
        started_at: i64,
        ready: Arc<AtomicBool>,
        pending: Arc<dyn Fn() -> usize + Send + Sync>,
        calls: Arc<CallLog>,
    ) -> Self {
        Self {
            store,
            node_name,
            started_at,
            ready,
            pending,
            calls,
            wiring: None,
            node_network: None,
        }
    }

    /// Adds the pod network between nodes to the status report.
    pub fn with_node_network(mut self, report: NodeNetworkReport) -> Self {
        self.node_network = Some(report);
        self
    }

    /// Reports the wire ends of `wiring` too.
    pub fn with_wiring(mut self, wiring: Arc<dyn Wiring>) -> Self {
        self.wiring = Some(wiring);
        self
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let (usage, counts) = self
            .store
            .run(|db| Ok((db.range_usage()?, db.counts()?)))
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(StatusReply {
            node_name: self.node_name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
            ready: self.ready.load(Ordering::Relaxed),
            attachments: counts.1,
            pending_teardowns: (self.pending)() as u64,
            ranges: usage
                .into_iter()
                .map(|u| RangeUsageMsg {
                    cidr: u.range.to_string(),
                    gateway: u.gateway.to_string(),
                    capacity: u.capacity,
                    allocated: u.allocated,
                })
                .collect(),
            state_path: self.store.path().display().to_string(),
            node_network: self.node_network.as_ref().and_then(|r| r()),
            schema_version: SCHEMA_VERSION,
        }))
    }

    async fn calls(&self, request: Request<CallsRequest>) -> Result<Response<CallsReply>, Status> {
        let r = request.into_inner();
        let pod = (!r.pod.is_empty()).then_some(r.pod.as_str());
        let calls = self
            .calls
            .list(r.failed_only, pod)
            .into_iter()
            .map(|c| Call {
                finished_unix_ms: c.finished_unix_ms,
                command: c.command,
                pod_namespace: c.pod_namespace,
                pod_name: c.pod_name,
                ifname: c.ifname,
                container_id: c.container_id,
                netns: c.netns,
                duration_ms: c.duration_ms,
                cni_code: c.cni_code,
                grpc_code: c.grpc_code,
                trace_id: c.trace_id,
                error: c.error,
            })
            .collect();
        Ok(Response::new(CallsReply { calls }))
    }

    async fn ports(&self, _request: Request<PortsRequest>) -> Result<Response<PortsReply>, Status> {
        let held = self
            .store
            .run(|db| db.ports())
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let ports = held
            .into_iter()
            .map(|h| HostPortMsg {
                host_ip: h.mapping.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
                host_port: u32::from(h.mapping.host_port),
                protocol: h.mapping.protocol,
                container_ip: h.mapping.container_ip.to_string(),
                container_port: u32::from(h.mapping.container_port),
                pod_namespace: h.pod.namespace,
                pod_name: h.pod.name,
                container_id: h.key.container_id,
            })
            .collect();
        Ok(Response::new(PortsReply { ports }))
    }

    async fn wires(&self, _request: Request<WiresRequest>) -> Result<Response<WiresReply>, Status> {
        let Some(wiring) = &self.wiring else {
            return Ok(Response::new(WiresReply::default()));
        };
        let wires = wiring
            .wires()
            .await
            .into_iter()
            .map(|w| {
                let c = w.counters.unwrap_or_default();
                WireEndMsg {
                    id: w.id,
                    peer_id: w.peer_id,
                    namespace: w.namespace,
                    link_uid: w.link_uid,
                    pod: w.pod,
                    intf: w.intf,
                    peer_pod: w.peer_pod,
                    peer_intf: w.peer_intf,
                    peer_node: w.peer_node,
                    kind: w.kind,
                    state: w.state,
                    vni: w.vni,
                    counted: w.counters.is_some(),
                    tx_frames: c.tx_frames,
                    tx_bytes: c.tx_bytes,
                    rx_frames: c.rx_frames,
                    rx_bytes: c.rx_bytes,
                    dropped: c.dropped,
                }
            })
            .collect();
        Ok(Response::new(WiresReply { wires }))
    }
}
