//! The whole gRPC surface of weftd in one file: the CNI relay service the plugin
//! calls, and the admin service `weftctl` calls. Each method decodes, delegates, and
//! maps the outcome to a status; nothing else happens here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::{Request, Response, Status};
use weft_cni::{CniError, code};
use weft_rpc::admin::admin_server::Admin;
use weft_rpc::admin::{RangeUsage as RangeUsageMsg, StatusReply, StatusRequest};
use weft_rpc::cnirpc::cni_server::Cni;
use weft_rpc::cnirpc::{
    AddResponse, CheckResponse, CniArgs, DelResponse, GcResponse, StatusResponse,
};
use weft_store::{SCHEMA_VERSION, Store};

use crate::handler::Handler;
use crate::seams::{Ipam, PodNetworking};

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
        code::INTERFACE_EXISTS => tonic::Code::AlreadyExists,
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
/// cancel it half-way: an ADD either finishes or undoes itself.
async fn detached<T: Send + 'static>(
    fut: impl Future<Output = Result<T, CniError>> + Send + 'static,
) -> Result<T, Status> {
    match tokio::spawn(fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_status(&e)),
        Err(join) => Err(to_status(&CniError::new(
            code::INTERNAL,
            format!("the call's task failed: {join}"),
        ))),
    }
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
        let (h, args) = (self.handler.clone(), request.into_inner());
        let result = detached(async move { h.add(&args).await }).await?;
        Ok(Response::new(AddResponse { result }))
    }

    async fn del(&self, request: Request<CniArgs>) -> Result<Response<DelResponse>, Status> {
        let (h, args) = (self.handler.clone(), request.into_inner());
        detached(async move { h.del(&args).await }).await?;
        Ok(Response::new(DelResponse {}))
    }

    async fn check(&self, request: Request<CniArgs>) -> Result<Response<CheckResponse>, Status> {
        self.handler
            .check(request.get_ref())
            .await
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(CheckResponse {}))
    }

    async fn status(&self, request: Request<CniArgs>) -> Result<Response<StatusResponse>, Status> {
        self.handler
            .status(request.get_ref())
            .await
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(StatusResponse {}))
    }

    async fn gc(&self, request: Request<CniArgs>) -> Result<Response<GcResponse>, Status> {
        let (h, args) = (self.handler.clone(), request.into_inner());
        let removed = detached(async move { h.gc(&args).await }).await?;
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
}

impl AdminService {
    /// Reports on `store`; `pending` counts teardowns in flight.
    pub fn new(
        store: Store,
        node_name: String,
        started_at: i64,
        ready: Arc<AtomicBool>,
        pending: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Self {
        Self {
            store,
            node_name,
            started_at,
            ready,
            pending,
        }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusReply>, Status> {
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
            schema_version: SCHEMA_VERSION,
        }))
    }
}
