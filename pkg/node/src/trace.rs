//! `weftctl trace` in the node: a probe sent from a pod of this node, followed by
//! every node it crosses. This node arms its own watch and asks the others (over the
//! wire port's `Policy.Trace`) to arm theirs; once all say they are armed, it sends the
//! probe from inside the pod, and gathers each node's account: the rules and chain ends
//! the kernel ran it through, the route it took, and what each of weft's policy chains
//! stands for, beside what `policy explain` says of the same connection.
//!
//! The kernel work (`weft_kernel::trace`) and the other nodes are seams, so the order
//! of things (armed everywhere before the probe leaves, one trace at a time per node)
//! is tested without root.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use tonic::Status;
use weft_daemon::service::TraceAdmin;
use weft_kernel::trace::{Hop, Probe};
use weft_rpc::admin::{
    PolicyExplainReply, PolicyExplainRequest, TraceAnswer, TraceHop, TraceReply, TraceRequest, TraceStep,
};
use weft_rpc::wire::PeerTraceItem;
use weft_rpc::wire::peer_trace_item::Item;

/// How long another node watches once armed: the probe leaves within a second of the
/// last node saying it is armed, and crosses every node within milliseconds after.
pub const WATCH: Duration = Duration::from_millis(3000);
/// The longest watch another node may ask of this one.
pub const MAX_WATCH: Duration = Duration::from_secs(10);
/// How long another node has to say it is armed.
const ARM_WAIT: Duration = Duration::from_secs(5);
/// How long this node waits, after the probe's answer, for its own account (the last
/// lines of `nft monitor` arrive just after the packet).
const SETTLE: Duration = Duration::from_millis(300);

/// A watch armed in the node's namespace.
pub trait Watching: Send + 'static {
    /// Waits up to `for_at_most` for the probe to be seen here; whether it was.
    fn wait_seen(&self, for_at_most: Duration) -> bool;
    /// Disarms, and says what this node did with the probe (`None`: it did not cross).
    fn finish(self: Box<Self>) -> Option<Hop>;
}

/// The kernel side of a trace (blocking; called off the runtime's workers).
pub trait TraceKernel: Send + Sync + 'static {
    /// Arms a watch for `probe` from `src` to `dst` in the node's namespace.
    fn watch(&self, src: IpAddr, dst: IpAddr, probe: Probe) -> Result<Box<dyn Watching>, String>;
    /// Sends `probe` to `dst` from inside the namespace at `netns` (a pod's): whether
    /// it was answered, when that can be known.
    fn send(&self, netns: &str, dst: IpAddr, probe: Probe) -> Result<Option<bool>, String>;
}

/// The real kernel: `weft_kernel::trace`.
pub struct KernelTrace;

impl Watching for weft_kernel::trace::Watch {
    fn wait_seen(&self, for_at_most: Duration) -> bool {
        weft_kernel::trace::Watch::wait_seen(self, for_at_most)
    }
    fn finish(self: Box<Self>) -> Option<Hop> {
        weft_kernel::trace::Watch::finish(*self)
    }
}

impl TraceKernel for KernelTrace {
    fn watch(&self, src: IpAddr, dst: IpAddr, probe: Probe) -> Result<Box<dyn Watching>, String> {
        let table = format!("weft-trace-{}", std::process::id());
        weft_kernel::trace::Watch::start(&table, src, dst, probe)
            .map(|w| Box::new(w) as Box<dyn Watching>)
            .map_err(|e| e.to_string())
    }
    fn send(&self, netns: &str, dst: IpAddr, probe: Probe) -> Result<Option<bool>, String> {
        let ns = weft_kernel::NetNs::open(std::path::Path::new(netns)).map_err(|e| e.to_string())?;
        weft_kernel::trace::send_probe(&ns, dst, probe).map_err(|e| e.to_string())
    }
}

/// What the trace asks of network policy: the ends by name, the evaluation of the
/// connection, and what a step through weft's policy table stands for.
pub trait TracePolicy: Send + Sync + 'static {
    /// A pod (`namespace/name`) or an address: its name as reports write it and its
    /// addresses.
    fn resolve(&self, what: &str) -> Result<(String, Vec<IpAddr>), String>;
    /// `policy explain` of the connection.
    fn explain(&self, request: PolicyExplainRequest) -> Result<PolicyExplainReply, String>;
    /// What rule `rule` of chain `chain` of table `table` stands for.
    fn meaning(&self, table: &str, chain: &str, rule: &str) -> Option<String>;
}

/// The node's policy engine as the trace's [`TracePolicy`].
pub struct EngineTracePolicy(pub Arc<crate::netpol::Engine>);

impl TracePolicy for EngineTracePolicy {
    fn resolve(&self, what: &str) -> Result<(String, Vec<IpAddr>), String> {
        self.0.resolve(what)
    }
    fn explain(&self, request: PolicyExplainRequest) -> Result<PolicyExplainReply, String> {
        crate::netpol::explain(&self.0, request)
    }
    fn meaning(&self, table: &str, chain: &str, rule: &str) -> Option<String> {
        self.0.trace_meaning(table, chain, rule)
    }
}

/// A pod of this node by namespace and name: its namespace's path and addresses, or
/// `None` when it does not run here.
pub type LocalPodLookup =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<Option<(String, Vec<IpAddr>)>, String>> + Send + Sync>;

/// The store's ready pod-network attachments as the trace's [`LocalPodLookup`].
pub fn local_pods(store: weft_store::Store) -> LocalPodLookup {
    Arc::new(move |namespace, name| {
        let store = store.clone();
        Box::pin(async move {
            let ready = store
                .run(|db| db.list(None, Some(weft_store::State::Ready)))
                .await
                .map_err(|e| format!("listing this node's pods: {e}"))?;
            Ok(ready
                .into_iter()
                .find(|a| {
                    a.key.ifname == weft_daemon::POLICED_IFNAME
                        && a.pod.namespace_or_default() == namespace
                        && a.pod.name == name
                })
                .map(|a| (a.netns, a.addresses.iter().map(|x| x.address).collect())))
        })
    })
}

/// What one other node says while it watches.
pub type PeerItems = Pin<Box<dyn Stream<Item = Result<PeerTraceItem, Status>> + Send>>;

/// The other nodes, for a trace: [`crate::announce::WireAnnouncer`] asks each over the
/// wire port.
pub trait PeerTrace: Send + Sync + 'static {
    /// Asks every other node at once to watch for the probe for `watch` once armed;
    /// each answer by its node's name, or why there is none.
    fn watch(
        &self,
        src: IpAddr,
        dst: IpAddr,
        probe: Probe,
        watch: Duration,
    ) -> BoxFuture<'static, Vec<(String, Result<PeerItems, String>)>>;
}

/// Traces of this node: the source side ([`TraceAdmin`]) and the watching side
/// (another node's probe, [`NodeTrace::watch`]).
#[derive(Clone)]
pub struct NodeTrace {
    inner: Arc<Inner>,
}

struct Inner {
    node: String,
    policy: Arc<dyn TracePolicy>,
    pods: LocalPodLookup,
    kernel: Arc<dyn TraceKernel>,
    peers: OnceLock<Arc<dyn PeerTrace>>,
    /// One trace at a time on a node, either side: two marking tables would each see
    /// the other's probe.
    busy: Arc<tokio::sync::Mutex<()>>,
}

fn step_message(s: &weft_kernel::trace::Step, policy: &dyn TracePolicy) -> TraceStep {
    TraceStep {
        meaning: policy.meaning(&s.table, &s.chain, &s.rule).unwrap_or_default(),
        table: s.table.clone(),
        chain: s.chain.clone(),
        rule: s.rule.clone(),
        verdict: s.verdict.clone(),
    }
}

/// A node's account as the API writes it, each step with what it stands for here.
fn hop_message(node: &str, h: &Hop, policy: &dyn TracePolicy) -> TraceHop {
    TraceHop {
        node: node.to_string(),
        iif: h.iif.clone(),
        oif: h.oif.clone(),
        route: h.route.clone(),
        steps: h.steps.iter().map(|s| step_message(s, policy)).collect(),
        dropped_at: h.dropped_at.map_or(0, |i| i as u32 + 1),
    }
}

fn blocking_failed(e: tokio::task::JoinError) -> Status {
    Status::internal(format!("the trace's kernel work failed: {e}"))
}

impl NodeTrace {
    /// Traces of node `node`: ends resolved and explained by `policy`, source pods
    /// found by `pods`, the kernel work done by `kernel`.
    pub fn new(node: &str, policy: Arc<dyn TracePolicy>, pods: LocalPodLookup, kernel: Arc<dyn TraceKernel>) -> Self {
        NodeTrace {
            inner: Arc::new(Inner {
                node: node.to_string(),
                policy,
                pods,
                kernel,
                peers: OnceLock::new(),
                busy: Arc::default(),
            }),
        }
    }

    /// Lets traces ask the other nodes through `peers`.
    pub fn set_peers(&self, peers: Arc<dyn PeerTrace>) {
        let _ = self.inner.peers.set(peers);
    }

    fn try_busy(&self) -> Result<tokio::sync::OwnedMutexGuard<()>, Status> {
        self.inner.busy.clone().try_lock_owned().map_err(|_| {
            Status::unavailable(format!(
                "a trace is running on node {} already: try again in a few seconds",
                self.inner.node
            ))
        })
    }

    /// Another node's probe: arms a watch, says so, watches for `watch` (or until the
    /// caller goes away), then says what this node did with it.
    pub fn watch(&self, src: IpAddr, dst: IpAddr, probe: Probe, watch: Duration) -> Result<PeerItems, Status> {
        if src.is_ipv6() != dst.is_ipv6() {
            return Err(Status::invalid_argument(format!(
                "{src} and {dst} are of different families"
            )));
        }
        let watch = watch.min(MAX_WATCH);
        let busy = self.try_busy()?;
        let inner = self.inner.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<PeerTraceItem, Status>>(2);
        tokio::spawn(async move {
            let _busy = busy;
            let kernel = inner.kernel.clone();
            let armed = match tokio::task::spawn_blocking(move || kernel.watch(src, dst, probe)).await {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => {
                    let _ = tx.send(Err(Status::internal(format!("arming the trace: {e}")))).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(blocking_failed(e))).await;
                    return;
                }
            };
            let said = tx
                .send(Ok(PeerTraceItem {
                    item: Some(Item::Armed(true)),
                }))
                .await;
            if said.is_ok() {
                tokio::select! {
                    _ = tokio::time::sleep(watch) => {}
                    _ = tx.closed() => {}
                }
            }
            let hop = tokio::task::spawn_blocking(move || armed.finish()).await;
            let item = match hop {
                Ok(Some(h)) => Ok(PeerTraceItem {
                    item: Some(Item::Hop(hop_message(&inner.node, &h, inner.policy.as_ref()))),
                }),
                Ok(None) => return,
                Err(e) => Err(blocking_failed(e)),
            };
            let _ = tx.send(item).await;
        });
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|i| (i, rx))
        })))
    }

    /// Sends the probe of `r` from its source pod, which must run on this node, and
    /// gathers every node's account of it.
    async fn run(self, r: TraceRequest) -> Result<TraceReply, Status> {
        let inner = &self.inner;
        let probe = Probe::parse(&r.probe).map_err(Status::invalid_argument)?;
        if r.src.parse::<IpAddr>().is_ok() {
            return Err(Status::invalid_argument(format!(
                "{}: the source is a pod (namespace/name): the probe is sent from inside it",
                r.src
            )));
        }
        let (src, _) = inner.policy.resolve(&r.src).map_err(Status::failed_precondition)?;
        let (namespace, name) = src.split_once('/').unwrap_or(("default", &src));
        let (netns, src_ips) = (inner.pods)(namespace.to_string(), name.to_string())
            .await
            .map_err(Status::unavailable)?
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "pod {src} does not run on node {}: ask its own node's weftd (the probe leaves from inside the pod)",
                    inner.node
                ))
            })?;
        let (dst, dst_ips) = inner.policy.resolve(&r.dst).map_err(Status::failed_precondition)?;
        let (src_ip, dst_ip) = src_ips
            .iter()
            .find_map(|a| dst_ips.iter().find(|b| a.is_ipv6() == b.is_ipv6()).map(|b| (*a, *b)))
            .ok_or_else(|| Status::failed_precondition(format!("{src} and {dst} have no address of one family")))?;
        let expected = match probe {
            Probe::Tcp(port) | Probe::Udp(port) => inner
                .policy
                .explain(PolicyExplainRequest {
                    src: src.clone(),
                    dst: if r.dst.parse::<IpAddr>().is_ok() {
                        dst_ip.to_string()
                    } else {
                        dst.clone()
                    },
                    protocol: if matches!(probe, Probe::Tcp(_)) { "tcp" } else { "udp" }.into(),
                    port: u32::from(port),
                })
                .ok(),
            Probe::Icmp => None,
        };
        let _busy = self.try_busy()?;
        // Every node armed before the probe leaves: this one, then the others.
        let kernel = inner.kernel.clone();
        let local = tokio::task::spawn_blocking(move || kernel.watch(src_ip, dst_ip, probe))
            .await
            .map_err(blocking_failed)?
            .map_err(|e| Status::internal(format!("arming the trace on {}: {e}", inner.node)))?;
        let mut unwatched = Vec::new();
        let mut watching = Vec::new();
        match inner.peers.get() {
            None => {
                unwatched.push("the other nodes: not asked (this node does not reach them over the wire port)".into())
            }
            Some(peers) => {
                // Each node's word that it is armed, waited for at once.
                let firsts =
                    peers
                        .watch(src_ip, dst_ip, probe, WATCH)
                        .await
                        .into_iter()
                        .map(|(node, answer)| async move {
                            let mut items = answer.map_err(|why| format!("{node}: {why}"))?;
                            match tokio::time::timeout(ARM_WAIT, items.next()).await {
                                Ok(Some(Ok(PeerTraceItem {
                                    item: Some(Item::Armed(true)),
                                }))) => Ok((node, items)),
                                Ok(Some(Err(s))) => Err(format!("{node}: {:?}: {}", s.code(), s.message())),
                                Ok(_) => Err(format!("{node}: did not say it was armed")),
                                Err(_) => Err(format!("{node}: not armed within {ARM_WAIT:?}")),
                            }
                        });
                for first in futures::future::join_all(firsts).await {
                    match first {
                        Ok(w) => watching.push(w),
                        Err(why) => unwatched.push(why),
                    }
                }
            }
        }
        let kernel = inner.kernel.clone();
        let answered = tokio::task::spawn_blocking(move || kernel.send(&netns, dst_ip, probe))
            .await
            .map_err(blocking_failed)?
            .map_err(|e| Status::internal(format!("sending the probe from {src}: {e}")))?;
        let own = tokio::task::spawn_blocking(move || {
            local.wait_seen(SETTLE);
            std::thread::sleep(SETTLE);
            local.finish()
        })
        .await
        .map_err(blocking_failed)?;
        let mut hops: Vec<TraceHop> = own
            .iter()
            .map(|h| hop_message(&inner.node, h, inner.policy.as_ref()))
            .collect();
        let mut others = Vec::new();
        for (node, mut items) in watching {
            match tokio::time::timeout(WATCH + ARM_WAIT, items.next()).await {
                Ok(Some(Ok(PeerTraceItem {
                    item: Some(Item::Hop(h)),
                }))) => others.push(h),
                // The probe did not cross it.
                Ok(None) => {}
                Ok(Some(Err(s))) => unwatched.push(format!("{node}: {:?}: {}", s.code(), s.message())),
                Ok(Some(Ok(_))) => unwatched.push(format!("{node}: answered out of turn")),
                Err(_) => unwatched.push(format!("{node}: no account within {:?}", WATCH + ARM_WAIT)),
            }
        }
        others.sort_by(|a, b| a.node.cmp(&b.node));
        hops.extend(others);
        Ok(TraceReply {
            src,
            src_ip: src_ip.to_string(),
            dst,
            dst_ip: dst_ip.to_string(),
            probe: probe.to_string(),
            answer: match answered {
                None => TraceAnswer::Unknown,
                Some(true) => TraceAnswer::Answered,
                Some(false) => TraceAnswer::NotAnswered,
            } as i32,
            hops,
            expected,
            unwatched,
        })
    }
}

impl TraceAdmin for NodeTrace {
    fn trace(&self, request: TraceRequest) -> BoxFuture<'static, Result<TraceReply, Status>> {
        use tracing::Instrument;
        let span = tracing::info_span!("trace", src = %request.src, dst = %request.dst, probe = %request.probe);
        Box::pin(self.clone().run(request).instrument(span))
    }
}

#[cfg(test)]
mod tests;
