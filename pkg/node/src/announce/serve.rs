//! The server side: who may announce (a node of the cluster, at its own address), and
//! the node it is, handed with each pod to the policy engine.

use std::net::IpAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tonic::{Request, Response, Status};
use weft_daemon::service::{FlowsAdmin, FlowsStream};
use weft_policy::{Announced, PolicyEngine, PolicyKernel, Taken};
use weft_rpc::wire::policy_server::{Policy, PolicyServer};
use weft_rpc::wire::{
    AnnounceOutcome, AnnounceReply, AnnounceRequest, AnnounceResult, AnnouncedPod, PeerFlowsRequest, PeerTraceRequest,
};
use weft_topology::{ClusterNode, TopologySource};
use weft_wires::metrics::RejectLabels;

/// At most this many pods in one call: a node announces one pod per ADD, and each pod
/// may cost this node a policy pass.
pub const MAX_PODS: usize = 64;
/// At most this many addresses per pod (Kubernetes gives a pod one per family).
const MAX_IPS: usize = 8;
/// The largest request decoded (the wire port's `Wire` takes batches of frames; this
/// service never needs more than a few kilobytes).
pub const MAX_REQUEST: usize = 64 * 1024;
/// Longest namespace or pod name taken (a DNS subdomain).
const MAX_NAME: usize = 253;

/// What this node does with an announced pod: the policy engine's
/// [`PolicyEngine::pod_announced`], as a seam so that the transport is tested with a
/// peer that answers slowly.
pub trait Announcements: Send + Sync + 'static {
    /// Node `node` (as the connection proved it) announces `pod`.
    fn pod_announced(self: Arc<Self>, node: String, pod: Announced) -> BoxFuture<'static, Result<Taken, String>>;
}

impl<K: PolicyKernel> Announcements for PolicyEngine<K> {
    fn pod_announced(self: Arc<Self>, node: String, pod: Announced) -> BoxFuture<'static, Result<Taken, String>> {
        Box::pin(async move { PolicyEngine::pod_announced(&self, &node, pod).await })
    }
}

/// Why a call of `Policy` was refused (the `reason` of `weft_peer_rejected_total`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// As the `Wire` calls are refused (no address, a bad or mismatched claim); an
    /// address no Node object has is `unknown_node` too.
    Call(weft_wires::service::Refusal),
    /// Several Node objects have the caller's address: which node calls is not known.
    AmbiguousNode(IpAddr, Vec<String>),
    /// More pods in one call than [`MAX_PODS`] (the call is refused); a pod whose name
    /// or addresses do not read is counted so too, and refused alone.
    BadAnnouncement(String),
}

impl Refusal {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Call(r) => r.reason(),
            Refusal::AmbiguousNode(..) => "ambiguous_node",
            Refusal::BadAnnouncement(_) => "bad_announcement",
        }
    }

    /// The gRPC status the caller gets.
    pub fn status(&self) -> Status {
        match self {
            Refusal::Call(weft_wires::service::Refusal::UnknownNode(remote)) => Status::permission_denied(format!(
                "{remote} is no node of the cluster (no Node object has that address)"
            )),
            Refusal::Call(r) => r.status(),
            Refusal::AmbiguousNode(remote, names) => Status::permission_denied(format!(
                "{remote} is the address of several nodes ({}): which one calls is not known",
                names.join(", ")
            )),
            Refusal::BadAnnouncement(why) => Status::invalid_argument(why.clone()),
        }
    }
}

/// The name of the node that calls from `remote`, admitted as the `Wire` calls are
/// (`weft_wires::service::admit`: the address it claims, if any, must be the one it
/// connects from) but known by the Node objects alone: any node of the cluster may
/// announce, whether or not it runs pods of a topology.
pub fn caller(remote: Option<IpAddr>, claimed: Option<&str>, nodes: &[ClusterNode]) -> Result<String, Refusal> {
    let at = |ip: IpAddr| nodes.iter().filter(move |n| n.addresses.contains(&ip));
    let ip = weft_wires::service::admit(remote, claimed, |ip| at(ip).next().is_some()).map_err(Refusal::Call)?;
    let mut names: Vec<String> = at(ip).map(|n| n.name.clone()).collect();
    names.dedup();
    match <[String; 1]>::try_from(names) {
        Ok([name]) => Ok(name),
        Err(names) => Err(Refusal::AmbiguousNode(ip, names)),
    }
}

/// The `Policy` service over what takes announcements (the policy engine).
pub struct PolicyService<A> {
    sink: Arc<A>,
    source: Arc<dyn TopologySource>,
    rejected: Family<RejectLabels, Counter>,
    runtime: tokio::runtime::Handle,
    answers: PeerAnswers,
}

/// What this node answers the other nodes besides their announcements.
#[derive(Default)]
pub struct PeerAnswers {
    /// This node's flows, for the other nodes' cluster-wide listings.
    pub flows: Option<Arc<dyn FlowsAdmin>>,
    /// This node's traces, for the other nodes' probes.
    pub trace: Option<crate::trace::NodeTrace>,
}

impl<A: Announcements> PolicyService<A> {
    /// The tonic server: callers are known by `source`'s Node objects, refusals are
    /// counted in `rejected` (`weft_peer_rejected_total`), and the pods go to `sink` on
    /// `runtime` (the node's, not the wire data plane's thread the port is served on:
    /// a policy pass must not hold up frames).
    pub fn server(
        sink: Arc<A>,
        source: Arc<dyn TopologySource>,
        rejected: Family<RejectLabels, Counter>,
        runtime: tokio::runtime::Handle,
    ) -> PolicyServer<Self> {
        Self::with_answers(sink, source, rejected, runtime, PeerAnswers::default())
    }

    /// [`Self::server`] that also answers the other nodes' `Flows` calls from `flows`
    /// and their `Trace` calls through `trace` (without them, `Unimplemented`).
    pub fn with_answers(
        sink: Arc<A>,
        source: Arc<dyn TopologySource>,
        rejected: Family<RejectLabels, Counter>,
        runtime: tokio::runtime::Handle,
        answers: PeerAnswers,
    ) -> PolicyServer<Self> {
        PolicyServer::new(Self {
            sink,
            source,
            rejected,
            runtime,
            answers,
        })
        .max_decoding_message_size(MAX_REQUEST)
    }

    /// Counts and logs a refusal, and makes its status.
    fn refuse(&self, remote: Option<IpAddr>, r: Refusal) -> Status {
        self.rejected.get_or_create(&RejectLabels { reason: r.reason() }).inc();
        tracing::debug!(remote = ?remote, reason = r.reason(), "policy announcement refused");
        r.status()
    }
}

/// A pod as the engine takes it, or why it cannot be.
fn announced(p: AnnouncedPod) -> Result<Announced, String> {
    let who = format!("{}/{}", p.namespace, p.name);
    for (what, v) in [("namespace", &p.namespace), ("name", &p.name)] {
        if v.is_empty() || v.len() > MAX_NAME {
            return Err(format!("pod {who}: bad {what}"));
        }
    }
    if p.ips.len() > MAX_IPS {
        return Err(format!("pod {who}: {} addresses, at most {MAX_IPS}", p.ips.len()));
    }
    let ips = p
        .ips
        .iter()
        .map(|s| s.parse::<IpAddr>().map_err(|_| format!("pod {who}: bad address {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Announced {
        namespace: p.namespace,
        name: p.name,
        ips,
    })
}

fn result(r: Result<Taken, String>) -> AnnounceResult {
    let (outcome, reason) = match r {
        Ok(Taken::Applied) => (AnnounceOutcome::Applied, String::new()),
        Ok(Taken::Kept) => (AnnounceOutcome::Kept, String::new()),
        Ok(Taken::Known) => (AnnounceOutcome::Known, String::new()),
        Err(why) => (AnnounceOutcome::Refused, why),
    };
    AnnounceResult {
        outcome: outcome as i32,
        reason,
    }
}

#[tonic::async_trait]
impl<A: Announcements> Policy for PolicyService<A> {
    type FlowsStream = FlowsStream;

    async fn flows(&self, req: Request<PeerFlowsRequest>) -> Result<Response<FlowsStream>, Status> {
        let remote = req.remote_addr().map(|a| a.ip());
        let claimed = req.get_ref().from.as_ref().map(|h| h.address.clone());
        let node = caller(remote, claimed.as_deref(), &self.source.nodes()).map_err(|r| self.refuse(remote, r))?;
        let Some(flows) = &self.answers.flows else {
            return Err(Status::unimplemented("this node records no flows"));
        };
        let mut request = req.into_inner().request.unwrap_or_default();
        // A peer answers for itself: never a fan-out of its own.
        request.cluster = false;
        tracing::debug!(peer = %node, "flows asked by a peer node");
        flows
            .flows(request)
            .map(Response::new)
            .map_err(Status::invalid_argument)
    }

    type TraceStream = crate::trace::PeerItems;

    async fn trace(&self, req: Request<PeerTraceRequest>) -> Result<Response<Self::TraceStream>, Status> {
        let remote = req.remote_addr().map(|a| a.ip());
        let claimed = req.get_ref().from.as_ref().map(|h| h.address.clone());
        let node = caller(remote, claimed.as_deref(), &self.source.nodes()).map_err(|r| self.refuse(remote, r))?;
        let Some(trace) = &self.answers.trace else {
            return Err(Status::unimplemented("this node traces no probes"));
        };
        let r = req.into_inner();
        let ip = |s: &str| {
            s.parse::<IpAddr>()
                .map_err(|_| Status::invalid_argument(format!("{s:?} is not an address")))
        };
        let (src, dst) = (ip(&r.src_ip)?, ip(&r.dst_ip)?);
        let probe = weft_kernel::trace::Probe::parse(&r.probe).map_err(Status::invalid_argument)?;
        tracing::info!(peer = %node, %src, %dst, %probe, "tracing a probe of a peer node");
        // The caller's own runtime would do as well; the node's keeps the wire port's
        // data plane free of the blocking kernel work's hand-offs.
        let _rt = self.runtime.enter();
        trace
            .watch(src, dst, probe, std::time::Duration::from_millis(u64::from(r.watch_ms)))
            .map(Response::new)
    }

    async fn announce(&self, req: Request<AnnounceRequest>) -> Result<Response<AnnounceReply>, Status> {
        let remote = req.remote_addr().map(|a| a.ip());
        let claimed = req.get_ref().from.as_ref().map(|h| h.address.clone());
        let node = caller(remote, claimed.as_deref(), &self.source.nodes()).map_err(|r| self.refuse(remote, r))?;
        let req = req.into_inner();
        if let Some(h) = req.from.as_ref().filter(|h| !h.node.is_empty() && h.node != node) {
            // Believed is the connection; a differing name is worth a word when an
            // operator wonders why a node's --node-name and its Node object disagree.
            tracing::debug!(node = %node, says = %h.node, "a peer node calls itself by another name than its Node object's");
        }
        let pods = req.pods;
        if pods.len() > MAX_PODS {
            let why = format!("{} pods in one call, at most {MAX_PODS}", pods.len());
            return Err(self.refuse(remote, Refusal::BadAnnouncement(why)));
        }
        let sink = self.sink.clone();
        let rejected = self.rejected.clone();
        // Finished even if the caller stops waiting: it still saves the pod's first
        // connections here once its ADD answered.
        let work = self.runtime.spawn(async move {
            let mut results = Vec::with_capacity(pods.len());
            for p in pods {
                let r = match announced(p) {
                    Ok(pod) => sink.clone().pod_announced(node.clone(), pod).await,
                    Err(why) => {
                        rejected
                            .get_or_create(&RejectLabels {
                                reason: "bad_announcement",
                            })
                            .inc();
                        Err(why)
                    }
                };
                if let Err(why) = &r {
                    tracing::debug!(node = %node, reason = %why, "announced pod refused");
                }
                results.push(result(r));
            }
            results
        });
        let results = work
            .await
            .map_err(|e| Status::internal(format!("taking the announcement failed: {e}")))?;
        Ok(Response::new(AnnounceReply { results }))
    }
}
