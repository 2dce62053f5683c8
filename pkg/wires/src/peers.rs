//! The peer seam of wires: how the engine calls the `Ends` RPC of another node (VNI
//! offers, "this end is gone", "this gRPC end is built"), as a trait ([`Peers`]) so
//! negotiation is tested against fake nodes, and its gRPC client ([`GrpcPeers`]).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures::future::BoxFuture;
use weft_rpc::wire::wire_client::WireClient;
use weft_rpc::wire::{EndResult, EndsRequest};

use weft_wiretls::{WireConnector, WireSecurity};

use crate::error::PeerError;

/// The other nodes' wire services, as the engine calls them.
pub trait Peers: Send + Sync + 'static {
    /// Calls `Ends` on the node at `node`; one result per end, in order.
    fn ends(&self, node: IpAddr, req: EndsRequest) -> BoxFuture<'_, Result<Vec<EndResult>, PeerError>>;
}

/// [`Peers`] over gRPC: a fresh connection per call to the wire service at `port` of
/// the node (calls are rare: a link coming, going or being renumbered), with the wire
/// port's security (mTLS: the callee must prove it is the node at that address).
#[derive(Debug, Clone)]
pub struct GrpcPeers {
    port: u16,
    connector: WireConnector,
}

impl GrpcPeers {
    /// Calls every node's wire service on TCP port `port`.
    pub fn new(port: u16, security: WireSecurity) -> Self {
        Self {
            port,
            connector: WireConnector::new(security),
        }
    }
}

impl Peers for GrpcPeers {
    fn ends(&self, node: IpAddr, req: EndsRequest) -> BoxFuture<'_, Result<Vec<EndResult>, PeerError>> {
        Box::pin(async move {
            let url = format!("http://{}", SocketAddr::new(node, self.port));
            let channel = tonic::transport::Endpoint::from_shared(url)
                .map_err(|e| PeerError::Endpoint(e.to_string()))?
                .connect_timeout(Duration::from_secs(1))
                .timeout(Duration::from_secs(3))
                .connect_with_connector(self.connector.clone())
                .await
                .map_err(|e| PeerError::Connect {
                    node,
                    reason: e.to_string(),
                })?;
            let reply = WireClient::new(channel).ends(req).await.map_err(|e| PeerError::Call {
                node,
                message: e.message().to_string(),
            })?;
            Ok(reply.into_inner().results)
        })
    }
}
