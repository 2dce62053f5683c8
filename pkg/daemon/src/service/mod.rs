//! The whole gRPC surface of weftd in one file: the CNI relay service the plugin
//! calls, and the admin service `weftctl` calls. Each method decodes, delegates, and
//! maps the outcome to a status; nothing else happens here.

use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status};
use tracing::Instrument;
use weft_cni::args::{K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID};
use weft_cni::{CniError, Code};
use weft_link::{DownBy, Impairment, LinkChange, LinkView, WireReport};
use weft_rpc::admin::admin_server::Admin;
use weft_rpc::admin::{
    Call, CallsReply, CallsRequest, CaptureRequest, CapturedFrame as CapturedFrameMsg, ChangeSource as ChangeSourceMsg,
    HostPort as HostPortMsg, LinkInfo, LinkRef as LinkRefMsg, LinkResetRequest, LinkSetRequest, LinkShowReply,
    LinkShowRequest, LinkStateRequest, PolicyDeniesRequest, PolicyDeny, PolicyExplainReply, PolicyExplainRequest,
    PolicyState, PortsReply, PortsRequest, RangeUsage as RangeUsageMsg, StatusReply, StatusRequest,
    WireEnd as WireEndMsg, WiresReply, WiresRequest,
};
use weft_rpc::cnirpc::cni_server::Cni;
use weft_rpc::cnirpc::{AddResponse, CheckResponse, CniArgs, DelResponse, GcResponse, StatusResponse};
use weft_store::{SCHEMA_VERSION, Store};
use weft_telemetry::{CallInfo, CallLog, CniCallFields, Readiness};

use crate::call::CniCall;
use crate::capture::{Bounds, Captures};
use crate::changes::{ChangeSource, LinkChanges};
use crate::handler::Handler;
use crate::seams::{AdminState, Ipam, LinkError, LinkRef, PodNetworking, Wiring};
use crate::spool::DelSpool;

/// A CNI error as a status carrying it.
pub fn to_status(e: &CniError) -> Status {
    weft_rpc::cni_error_status(e)
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
        Err(join) => Err(CniError::new(Code::Internal, format!("the call's task failed: {join}"))),
    };
    if let Some(c) = call {
        match &outcome {
            Ok(_) => c.record_outcome(0, ""),
            Err(e) => c.record_outcome(e.code.number(), &format!("{}: {}", e.msg, e.details)),
        }
    }
    outcome.map_err(|e| to_status(&e))
}

/// The plugin's request in the handler's terms: the one place the protobuf request
/// becomes a [`CniCall`] (`path`, `CNI_PATH`, is not needed: the daemon runs no other
/// plugin).
impl From<CniArgs> for CniCall {
    fn from(a: CniArgs) -> Self {
        Self {
            container_id: a.container_id,
            netns: a.netns,
            ifname: a.ifname,
            args: a.args,
            config: a.stdin_data,
        }
    }
}

/// Takes the call's arguments and records what the call is about on its span (so
/// every log line inside carries the pod fields) and in the call log.
fn decode(command: &str, request: Request<CniArgs>) -> (Option<Arc<CallInfo>>, CniCall) {
    let call = request.extensions().get::<Arc<CallInfo>>().cloned();
    let args = CniCall::from(request.into_inner());
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

/// The `weft.admin.v1.Admin` service, reporting on node state `S` (the store, in the
/// daemon).
pub struct AdminService<S = Store> {
    state: S,
    node_name: String,
    started_at: i64,
    ready: Readiness,
    pending: Arc<dyn Fn() -> usize + Send + Sync>,
    calls: Arc<CallLog>,
    wiring: Option<Arc<dyn Wiring>>,
    node_network: Option<NodeNetworkReport>,
    del_spool: Option<Arc<DelSpool>>,
    captures: Captures,
    policy: Option<Arc<dyn PolicyAdmin>>,
    flows: Option<Arc<dyn FlowsAdmin>>,
    trace: Option<Arc<dyn TraceAdmin>>,
    changes: LinkChanges,
}

/// The frames of one capture as the admin service streams them.
pub type CaptureStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<CapturedFrameMsg, Status>> + Send>>;

/// Network policy as the admin service reports it: the daemon's engine answers, the
/// service only relays (in the admin API's own types).
pub trait PolicyAdmin: Send + Sync + 'static {
    /// The state for `weftctl status`.
    fn state(&self) -> PolicyState;
    /// Evaluates a new connection (`weftctl policy explain`); the error says why it
    /// cannot (an unknown pod, no pass yet).
    fn explain(&self, request: PolicyExplainRequest) -> Result<PolicyExplainReply, String>;
    /// The last `limit` denied flows (0: all kept), oldest first.
    fn denies(&self, limit: usize) -> Vec<PolicyDeny>;
    /// The denied flows from now on (a follower that falls behind loses the oldest).
    fn follow(&self) -> tokio::sync::broadcast::Receiver<PolicyDeny>;
    /// The addresses learnt from DNS answers for `domainNames` rules, by name.
    fn learnt(&self) -> Vec<weft_rpc::admin::LearntAddress>;
}

/// Flow records as the admin service reports them: the daemon's flow reader answers
/// (filters, follow, aggregates), the service only relays.
pub trait FlowsAdmin: Send + Sync + 'static {
    /// The answer to a Flows request: its stats first, then the flows or aggregates,
    /// then (with follow) what opens and ends; the error says what in the request does
    /// not parse.
    fn flows(&self, request: weft_rpc::admin::FlowsRequest) -> Result<FlowsStream, String>;
}

/// Probe traces as the admin service reports them (`weftctl trace`): the daemon sends
/// the probe and gathers the nodes' accounts, the service only relays.
pub trait TraceAdmin: Send + Sync + 'static {
    /// Sends the probe of `request` from its source pod (of this node) and answers what
    /// every node did with it; the error's code says whose fault it is.
    fn trace(
        &self,
        request: weft_rpc::admin::TraceRequest,
    ) -> futures::future::BoxFuture<'static, Result<weft_rpc::admin::TraceReply, Status>>;
}

/// A Flows answer as the admin service streams it.
pub type FlowsStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<weft_rpc::admin::FlowsItem, Status>> + Send>>;

/// The denied flows as the admin service streams them.
pub type DenyStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<PolicyDeny, Status>> + Send>>;

/// Reports the pod network between nodes for `weftctl status` (the daemon knows it; the
/// admin service only relays it).
pub type NodeNetworkReport = Arc<dyn Fn() -> Option<weft_rpc::admin::NodeNetwork> + Send + Sync>;

impl<S: AdminState> AdminService<S> {
    /// Reports on `state` and the recent `calls`; `pending` counts teardowns in flight.
    pub fn new(
        state: S,
        node_name: String,
        started_at: i64,
        ready: Readiness,
        pending: Arc<dyn Fn() -> usize + Send + Sync>,
        calls: Arc<CallLog>,
    ) -> Self {
        Self {
            state,
            node_name,
            started_at,
            ready,
            pending,
            calls,
            wiring: None,
            node_network: None,
            del_spool: None,
            captures: Captures::default(),
            policy: None,
            flows: None,
            trace: None,
            changes: LinkChanges::default(),
        }
    }

    /// Keeps each link's last change in `changes` (and counts scenario steps there).
    pub fn with_link_changes(mut self, changes: LinkChanges) -> Self {
        self.changes = changes;
        self
    }

    /// Traces probes through `trace`.
    pub fn with_trace(mut self, trace: Arc<dyn TraceAdmin>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Reports flow records from `flows`.
    pub fn with_flows(mut self, flows: Arc<dyn FlowsAdmin>) -> Self {
        self.flows = Some(flows);
        self
    }

    /// Reports network policy (status, explain, denies) from `policy`.
    pub fn with_policy(mut self, policy: Arc<dyn PolicyAdmin>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Holds link captures to `captures` (its limit, its gauge).
    pub fn with_captures(mut self, captures: Captures) -> Self {
        self.captures = captures;
        self
    }

    /// Reports how many DELs wait in `spool`.
    pub fn with_del_spool(mut self, spool: Arc<DelSpool>) -> Self {
        self.del_spool = Some(spool);
        self
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
impl<S: AdminState> Admin for AdminService<S> {
    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let summary = self
            .state
            .summary()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(StatusReply {
            node_name: self.node_name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
            ready: self.ready.get(),
            attachments: summary.ready_attachments,
            pending_teardowns: (self.pending)() as u64,
            ranges: summary
                .ranges
                .into_iter()
                .map(|u| RangeUsageMsg {
                    cidr: u.range.to_string(),
                    gateway: u.gateway.to_string(),
                    capacity: u.capacity,
                    allocated: u.allocated,
                })
                .collect(),
            state_path: self.state.location(),
            node_network: self.node_network.as_ref().and_then(|r| r()),
            schema_version: SCHEMA_VERSION,
            spooled_dels: self.del_spool.as_ref().map_or(0, |s| s.pending() as u64),
            policy: self.policy.as_ref().map(|p| p.state()),
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
            .state
            .host_ports()
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

    async fn link_set(&self, request: Request<LinkSetRequest>) -> Result<Response<LinkInfo>, Status> {
        let r = request.into_inner();
        let imp = Impairment::from_map(&r.impairment).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.link_change(r.link, LinkChange::Set(imp), r.source).await
    }

    async fn link_reset(&self, request: Request<LinkResetRequest>) -> Result<Response<LinkInfo>, Status> {
        let r = request.into_inner();
        self.link_change(r.link, LinkChange::Reset, r.source).await
    }

    async fn link_state(&self, request: Request<LinkStateRequest>) -> Result<Response<LinkInfo>, Status> {
        let r = request.into_inner();
        let change = if r.up { LinkChange::Up } else { LinkChange::Down };
        self.link_change(r.link, change, r.source).await
    }

    async fn link_show(&self, request: Request<LinkShowRequest>) -> Result<Response<LinkShowReply>, Status> {
        let Some(wiring) = &self.wiring else {
            return Ok(Response::new(LinkShowReply::default()));
        };
        let r = request.into_inner();
        let given = |s: String| (!s.is_empty()).then_some(s);
        let links = wiring
            .links(given(r.namespace), given(r.pod))
            .await
            .map_err(|e| link_status(&e))?
            .into_iter()
            .map(|v| self.link_message(v))
            .collect();
        Ok(Response::new(LinkShowReply { links }))
    }

    async fn wires(&self, _request: Request<WiresRequest>) -> Result<Response<WiresReply>, Status> {
        let Some(wiring) = &self.wiring else {
            return Ok(Response::new(WiresReply::default()));
        };
        let wires = wiring.wires().await.into_iter().map(wire_message).collect();
        Ok(Response::new(WiresReply { wires }))
    }

    type CaptureStream = CaptureStream;

    async fn capture(&self, request: Request<CaptureRequest>) -> Result<Response<CaptureStream>, Status> {
        let Some(wiring) = &self.wiring else {
            return Err(Status::failed_precondition("this daemon wires no pods"));
        };
        let r = request.into_inner();
        let link = r.link.unwrap_or_default();
        if link.pod.is_empty() || link.intf.is_empty() {
            return Err(Status::invalid_argument("name the link by its pod and interface"));
        }
        let what = format!("{}:{}", link.pod, link.intf);
        let target = LinkRef {
            namespace: (!link.namespace.is_empty()).then_some(link.namespace),
            pod: link.pod,
            intf: link.intf,
        };
        let bounds = Bounds::new(r.max_frames, r.max_bytes, r.max_duration_ms, r.snaplen);
        let permit = self.captures.try_start().ok_or_else(|| {
            Status::resource_exhausted(format!(
                "this node runs {} captures already, as many as it allows at once; end one first",
                self.captures.max()
            ))
        })?;
        let frames = wiring
            .capture(target, bounds.snaplen)
            .await
            .map_err(|e| link_status(&e))?;
        tracing::info!(capture = %what, ?bounds, "capture started");
        let frames = crate::capture::bounded(frames, bounds, permit, what).map(|f| {
            f.map(frame_message)
                .map_err(|e| Status::unavailable(format!("the capture ended: {e}")))
        });
        Ok(Response::new(Box::pin(frames)))
    }

    async fn policy_explain(
        &self,
        request: Request<PolicyExplainRequest>,
    ) -> Result<Response<PolicyExplainReply>, Status> {
        let policy = policy_of(&self.policy)?;
        policy
            .explain(request.into_inner())
            .map(Response::new)
            .map_err(Status::failed_precondition)
    }

    async fn policy_names(
        &self,
        _: Request<weft_rpc::admin::PolicyNamesRequest>,
    ) -> Result<Response<weft_rpc::admin::PolicyNamesReply>, Status> {
        let policy = policy_of(&self.policy)?;
        Ok(Response::new(weft_rpc::admin::PolicyNamesReply {
            node: self.node_name.clone(),
            addresses: policy.learnt(),
        }))
    }

    type FlowsStream = FlowsStream;

    async fn flows(&self, request: Request<weft_rpc::admin::FlowsRequest>) -> Result<Response<FlowsStream>, Status> {
        flows_of(&self.flows)?
            .flows(request.into_inner())
            .map(Response::new)
            .map_err(Status::invalid_argument)
    }

    async fn trace(
        &self,
        request: Request<weft_rpc::admin::TraceRequest>,
    ) -> Result<Response<weft_rpc::admin::TraceReply>, Status> {
        let trace = self
            .trace
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("this daemon traces no probes (it reads no cluster objects)"))?;
        trace.trace(request.into_inner()).await.map(Response::new)
    }

    type PolicyDeniesStream = DenyStream;

    async fn policy_denies(&self, request: Request<PolicyDeniesRequest>) -> Result<Response<DenyStream>, Status> {
        let policy = policy_of(&self.policy)?.clone();
        let r = request.into_inner();
        // Subscribed before the recent ones are read: none falls between the two.
        let live = r.follow.then(|| policy.follow());
        let recent = futures::stream::iter(policy.denies(r.limit as usize).into_iter().map(Ok));
        let stream: DenyStream = match live {
            None => Box::pin(recent),
            Some(rx) => Box::pin(recent.chain(futures::stream::unfold(rx, |mut rx| async move {
                loop {
                    match rx.recv().await {
                        Ok(d) => return Some((Ok(d), rx)),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }))),
        };
        Ok(Response::new(stream))
    }
}

/// The flows seam, or why there is none.
fn flows_of(f: &Option<Arc<dyn FlowsAdmin>>) -> Result<&Arc<dyn FlowsAdmin>, Status> {
    f.as_ref().ok_or_else(|| {
        Status::failed_precondition(
            "this daemon records no flows (it reads no cluster objects, or was started with --flows=false)",
        )
    })
}

/// The policy seam, or why there is none.
fn policy_of(p: &Option<Arc<dyn PolicyAdmin>>) -> Result<&Arc<dyn PolicyAdmin>, Status> {
    p.as_ref().ok_or_else(|| {
        Status::failed_precondition("this daemon enforces no network policy (it reads no cluster objects)")
    })
}

/// A captured frame as the admin API streams it.
fn frame_message(f: weft_link::CapturedFrame) -> CapturedFrameMsg {
    CapturedFrameMsg {
        unix_nanos: f.unix_nanos,
        outgoing: f.outgoing,
        original_length: f.original_len,
        data: f.data,
    }
}

impl<S: AdminState> AdminService<S> {
    /// Runs one operator change of a link through the wiring.
    async fn link_change(
        &self,
        link: Option<LinkRefMsg>,
        change: LinkChange,
        source: Option<ChangeSourceMsg>,
    ) -> Result<Response<LinkInfo>, Status> {
        let Some(wiring) = &self.wiring else {
            return Err(Status::failed_precondition("this daemon wires no pods"));
        };
        let link = link.unwrap_or_default();
        if link.pod.is_empty() || link.intf.is_empty() {
            return Err(Status::invalid_argument("name the link by its pod and interface"));
        }
        let target = LinkRef {
            namespace: (!link.namespace.is_empty()).then_some(link.namespace),
            pod: link.pod,
            intf: link.intf,
        };
        let what = match &change {
            LinkChange::Set(imp) if imp.is_empty() => "set no impairment".to_string(),
            LinkChange::Set(imp) => format!("set {imp}"),
            LinkChange::Reset => "reset".into(),
            LinkChange::Down => "down".into(),
            LinkChange::Up => "up".into(),
        };
        let view = wiring.link_change(target, change).await.map_err(|e| link_status(&e))?;
        let source = source.map_or_else(ChangeSource::default, |s| ChangeSource {
            scenario: s.scenario,
            step: s.step,
        });
        self.changes
            .record(&view.end.namespace, view.end.link_uid, &source, &what);
        Ok(Response::new(self.link_message(view)))
    }

    /// A wire end with its emulation settings as the admin API lists it (`weftctl
    /// link show`), with its last change made through this node.
    fn link_message(&self, v: LinkView) -> LinkInfo {
        let last = self.changes.last(&v.end.namespace, v.end.link_uid);
        let mut m = link_message(v);
        if let Some(c) = last {
            (m.last_change, m.last_change_ms) = (c.what, c.at_ms);
        }
        m
    }
}

/// A link error as the status the caller gets.
fn link_status(e: &LinkError) -> Status {
    match e {
        LinkError::NotFound(missing) => Status::not_found(missing.to_string()),
        LinkError::Unsupported { .. } | LinkError::Capture { .. } => Status::failed_precondition(e.to_string()),
        LinkError::Invalid(m) => Status::invalid_argument(m.clone()),
        LinkError::Failed(m) => Status::failed_precondition(m.clone()),
    }
}

/// A wire end with its emulation settings as the admin API lists it (`weftctl link show`).
fn link_message(v: LinkView) -> LinkInfo {
    let map = |i: &Impairment| i.to_map().into_iter().collect();
    LinkInfo {
        namespace: v.end.namespace.clone(),
        link_uid: v.end.link_uid,
        pod: v.end.local_pod.clone(),
        intf: v.end.local_intf.clone(),
        peer_pod: v.end.peer_pod.clone(),
        peer_intf: v.end.peer_intf.clone(),
        peer_node: v.end.peer_node.clone(),
        kind: v.end.kind.as_str().into(),
        state: v.end.state.as_str().into(),
        topology: map(&v.topology),
        active: map(&v.active),
        overridden: v.overridden,
        down: v.down.is_some(),
        down_by_peer: v.down == Some(DownBy::Peer),
        problem: v.problem.unwrap_or_default(),
        last_change: String::new(),
        last_change_ms: 0,
    }
}

/// A wire end with its counters as the admin API lists it (`weftctl wires`).
fn wire_message(w: WireReport) -> WireEndMsg {
    let (e, c) = (w.end, w.counters.unwrap_or_default());
    let emulation = w.emulation.map(|m| weft_rpc::admin::EmulationCounts {
        lost: m.lost,
        overflow: m.overflow,
        ecn_marked: m.ecn_marked,
        corrupted: m.corrupted,
        duplicated: m.duplicated,
        reordered: m.reordered,
    });
    WireEndMsg {
        id: e.id,
        peer_id: e.peer_id,
        namespace: e.namespace,
        link_uid: e.link_uid,
        pod: e.local_pod,
        intf: e.local_intf,
        peer_pod: e.peer_pod,
        peer_intf: e.peer_intf,
        peer_node: e.peer_node,
        kind: e.kind.as_str().into(),
        state: e.state.as_str().into(),
        vni: e.vni.unwrap_or(0),
        counted: w.counters.is_some(),
        tx_frames: c.tx_frames,
        tx_bytes: c.tx_bytes,
        rx_frames: c.rx_frames,
        rx_bytes: c.rx_bytes,
        dropped: c.dropped,
        reason: w.reason,
        emulation,
    }
}

#[cfg(test)]
mod tests;
