//! The node-to-node `Wire` service: `Ends` (control) and `Frames` (the batched frame
//! stream of gRPC wires). Only nodes that run pods of the topologies may call.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status, Streaming};
use weft_rpc::wire::wire_server::{Wire, WireServer};
use weft_rpc::wire::{EndsReply, EndsRequest, FrameBatch};

use crate::dataplane::NODE_HEADER;
use crate::engine::Engine;

/// The `Wire` service over an [`Engine`].
pub struct WireService {
    engine: Arc<Engine>,
}

impl WireService {
    /// The tonic server for `engine`.
    pub fn server(engine: Arc<Engine>) -> WireServer<WireService> {
        WireServer::new(WireService { engine }).max_decoding_message_size(64 << 20)
    }

    /// The calling node: the address it claims must be the one it connects from and a
    /// node the topologies know.
    fn caller<T>(&self, req: &Request<T>, claimed: Option<&str>) -> Result<IpAddr, Status> {
        let remote = req
            .remote_addr()
            .map(|a| a.ip())
            .ok_or_else(|| Status::permission_denied("caller address unknown"))?;
        if let Some(c) = claimed {
            let c: IpAddr = c
                .parse()
                .map_err(|_| Status::invalid_argument(format!("bad node address {c:?}")))?;
            if c != remote {
                return Err(Status::permission_denied(format!("node {c} calls from {remote}")));
            }
        }
        if !self.engine.known_node(remote) {
            return Err(Status::permission_denied(format!(
                "{remote} runs no pod of any topology"
            )));
        }
        Ok(remote)
    }
}

type Batches = Pin<Box<dyn Stream<Item = Result<FrameBatch, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Wire for WireService {
    async fn ends(&self, req: Request<EndsRequest>) -> Result<Response<EndsReply>, Status> {
        let claimed = req.get_ref().from.as_ref().map(|h| h.address.clone());
        self.caller(&req, claimed.as_deref())?;
        Ok(Response::new(self.engine.ends(req.into_inner()).await))
    }

    type FramesStream = Batches;

    async fn frames(&self, req: Request<Streaming<FrameBatch>>) -> Result<Response<Batches>, Status> {
        let claimed = req
            .metadata()
            .get(NODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let peer = self.caller(&req, claimed.as_deref())?;
        let dp = self
            .engine
            .dataplane()
            .ok_or_else(|| Status::unavailable("node address not known yet"))?;
        let out = dp.accept(peer, req.into_inner());
        Ok(Response::new(Box::pin(futures::StreamExt::map(out, Ok))))
    }
}
