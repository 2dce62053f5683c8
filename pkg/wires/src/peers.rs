//! The peer seam of wires: how the engine calls the `Ends` RPC of another node (VNI
//! offers, "this end is gone", "this gRPC end is built"), as a trait ([`Peers`]) so
//! negotiation is tested against fake nodes, and its gRPC client ([`GrpcPeers`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::transport::Channel;
use weft_rpc::wire::wire_client::WireClient;
use weft_rpc::wire::{EndResult, EndsRequest};

use weft_wiretls::{WireConnector, WireSecurity};

use crate::error::PeerError;

/// The other nodes' wire services, as the engine calls them.
pub trait Peers: Send + Sync + 'static {
    /// Calls `Ends` on the node at `node`; one result per end, in order.
    fn ends(&self, node: IpAddr, req: EndsRequest) -> BoxFuture<'_, Result<Vec<EndResult>, PeerError>>;
}

/// How long one `Ends` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// [`Peers`] over gRPC: one persistent channel per node ([`WireConnector::channel`])
/// to its wire service at `port`, with the wire port's security (mTLS: the callee must
/// prove it is the node at that address). A node bringing links up calls its peers
/// once per gRPC end it builds; a channel that failed opens again by itself at the
/// next call.
#[derive(Debug, Clone)]
pub struct GrpcPeers {
    port: u16,
    connector: WireConnector,
    channels: Arc<Mutex<HashMap<IpAddr, Channel>>>,
}

impl GrpcPeers {
    /// Calls every node's wire service on TCP port `port`.
    pub fn new(port: u16, security: WireSecurity) -> Self {
        Self {
            port,
            connector: WireConnector::new(security),
            channels: Arc::default(),
        }
    }

    /// The channel to the node at `node`, made at its first call.
    fn channel(&self, node: IpAddr) -> Channel {
        let mut channels = self.channels.lock().expect("wire channels lock");
        channels
            .entry(node)
            .or_insert_with(|| self.connector.channel(SocketAddr::new(node, self.port), CALL_TIMEOUT))
            .clone()
    }
}

impl Peers for GrpcPeers {
    fn ends(&self, node: IpAddr, req: EndsRequest) -> BoxFuture<'_, Result<Vec<EndResult>, PeerError>> {
        Box::pin(async move {
            let reply = WireClient::new(self.channel(node)).ends(req).await.map_err(|e| {
                // A connection that could not be opened is the transport's error, which
                // tonic hands back as `Unavailable` with its source.
                if e.code() == tonic::Code::Unavailable {
                    PeerError::Connect {
                        node,
                        reason: e.message().to_string(),
                    }
                } else {
                    PeerError::Call {
                        node,
                        message: e.message().to_string(),
                    }
                }
            })?;
            Ok(reply.into_inner().results)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt;
    use tokio::net::TcpListener;
    use weft_rpc::wire::wire_server::{Wire, WireServer};
    use weft_rpc::wire::{End, EndsReply, FrameBatch};

    use super::*;

    /// A wire service that accepts every end it is told of.
    struct Accepting;

    #[tonic::async_trait]
    impl Wire for Accepting {
        async fn ends(&self, req: tonic::Request<EndsRequest>) -> Result<tonic::Response<EndsReply>, tonic::Status> {
            let results = (req.into_inner().ends.iter())
                .map(|_| EndResult {
                    accepted: true,
                    reason: String::new(),
                })
                .collect();
            Ok(tonic::Response::new(EndsReply { results }))
        }

        type FramesStream = futures::stream::BoxStream<'static, Result<FrameBatch, tonic::Status>>;

        async fn frames(
            &self,
            _: tonic::Request<tonic::Streaming<FrameBatch>>,
        ) -> Result<tonic::Response<Self::FramesStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
    }

    /// Calls to one node share one connection; a node that does not listen is a
    /// connection error, not a call's.
    #[tokio::test]
    async fn calls_to_a_node_share_one_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let incoming = futures::stream::unfold(listener, move |l| {
            let counted = counted.clone();
            async move {
                let conn = l.accept().await.map(|(s, _)| s);
                counted.fetch_add(1, Ordering::SeqCst);
                Some((conn, l))
            }
        })
        .boxed();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WireServer::new(Accepting))
                .serve_with_incoming(incoming),
        );
        let peers = GrpcPeers::new(addr.port(), WireSecurity::Insecure);
        for n in 1..=5 {
            let req = EndsRequest {
                from: None,
                ends: vec![End::default(); n],
            };
            let results = peers.ends(addr.ip(), req).await.expect("the node answers");
            assert_eq!(results.len(), n);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "five calls, one connection");

        // Nothing listens on the port the listener above does not hold any more.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let req = EndsRequest {
            from: None,
            ends: vec![End::default()],
        };
        let err = GrpcPeers::new(port, WireSecurity::Insecure)
            .ends(addr.ip(), req)
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, PeerError::Connect { .. }), "{err}");
    }
}
