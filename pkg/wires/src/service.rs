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
use crate::metrics::RejectLabels;

/// The `Wire` service over an [`Engine`].
pub struct WireService {
    engine: Arc<Engine>,
}

impl WireService {
    /// The tonic server for `engine`.
    pub fn server(engine: Arc<Engine>) -> WireServer<WireService> {
        WireServer::new(WireService { engine }).max_decoding_message_size(crate::dataplane::MAX_BATCH_MESSAGE)
    }

    /// The calling node, admitted by [`admit`]; a refusal is counted in
    /// `weft_peer_rejected_total{reason}` before it is answered.
    fn caller<T>(&self, req: &Request<T>, claimed: Option<&str>) -> Result<IpAddr, Status> {
        let remote = req.remote_addr().map(|a| a.ip());
        admit(remote, claimed, |ip| self.engine.known_node(ip)).map_err(|r| {
            self.engine
                .metrics()
                .rejected
                .get_or_create(&RejectLabels { reason: r.reason() })
                .inc();
            tracing::debug!(remote = ?remote, claimed, reason = r.reason(), "wire call refused");
            r.status()
        })
    }
}

/// Why a call on the wire port was refused (the `reason` of
/// `weft_peer_rejected_total`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The connection's address is unknown.
    NoAddress,
    /// The node address the caller claims does not parse.
    BadClaim(String),
    /// The caller claims another node's address than the one it connects from.
    AddressMismatch {
        /// What it claims.
        claimed: IpAddr,
        /// Where it connects from.
        remote: IpAddr,
    },
    /// The caller's address is no node that runs a pod of any topology.
    UnknownNode(IpAddr),
}

impl Refusal {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoAddress => "no_address",
            Refusal::BadClaim(_) => "bad_claim",
            Refusal::AddressMismatch { .. } => "address_mismatch",
            Refusal::UnknownNode(_) => "unknown_node",
        }
    }

    /// The gRPC status the caller gets.
    pub fn status(&self) -> Status {
        match self {
            Refusal::NoAddress => Status::permission_denied("caller address unknown"),
            Refusal::BadClaim(c) => Status::invalid_argument(format!("bad node address {c:?}")),
            Refusal::AddressMismatch { claimed, remote } => {
                Status::permission_denied(format!("node {claimed} calls from {remote}"))
            }
            Refusal::UnknownNode(remote) => Status::permission_denied(format!("{remote} runs no pod of any topology")),
        }
    }
}

/// Decides whether a call on the wire port comes from a node that may call: the
/// address it claims (if any) must be the one it connects from, and a node the
/// topologies know (`known`).
pub fn admit(remote: Option<IpAddr>, claimed: Option<&str>, known: impl Fn(IpAddr) -> bool) -> Result<IpAddr, Refusal> {
    let remote = remote.ok_or(Refusal::NoAddress)?;
    if let Some(c) = claimed {
        let c: IpAddr = c.parse().map_err(|_| Refusal::BadClaim(c.to_string()))?;
        if c != remote {
            return Err(Refusal::AddressMismatch { claimed: c, remote });
        }
    }
    if !known(remote) {
        return Err(Refusal::UnknownNode(remote));
    }
    Ok(remote)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_a_known_node_calling_from_its_own_address_is_admitted() {
        let known = |a: IpAddr| a == ip("10.0.0.2");
        assert_eq!(admit(Some(ip("10.0.0.2")), Some("10.0.0.2"), known), Ok(ip("10.0.0.2")));
        assert_eq!(admit(Some(ip("10.0.0.2")), None, known), Ok(ip("10.0.0.2")));
        let refused = [
            (admit(None, Some("10.0.0.2"), known), "no_address"),
            (admit(Some(ip("10.0.0.2")), Some("node-b"), known), "bad_claim"),
            (admit(Some(ip("10.0.0.9")), Some("10.0.0.2"), known), "address_mismatch"),
            (admit(Some(ip("10.0.0.9")), None, known), "unknown_node"),
        ];
        for (r, reason) in refused {
            let r = r.unwrap_err();
            assert_eq!(r.reason(), reason);
            assert_ne!(r.status().code(), tonic::Code::Ok);
        }
        let mismatch = admit(Some(ip("10.0.0.9")), Some("10.0.0.2"), known).unwrap_err();
        assert_eq!(mismatch.status().message(), "node 10.0.0.2 calls from 10.0.0.9");
    }
}
