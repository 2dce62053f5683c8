//! The wire engine: makes the kernel and the data plane match what the topologies say
//! for the pods of this node.
//!
//! One task (`pass`) does the wiring, level-triggered: whenever anything changes (a pod
//! comes or goes, the topology source moves, a peer node calls, a timer fires) it runs
//! a pass that compares, for every link of the pods that moved and the local pods
//! linked to them (of every local pod once per resync interval), the end that should
//! exist with the end the store records, and has the link's [`Carrier`] build,
//! re-point, set down or remove ends until they agree. Because only that task builds wires, two pods
//! arriving at once cannot race; who builds a shared piece is decided by name, never by
//! timing:
//! - same node: the pod with the lower name builds the veth pair for both;
//! - VXLAN across nodes: the pod with the lower name proposes the VNI to the peer's
//!   node (`Ends`), which holds it (unique per node in the store) or refuses it; the
//!   proposer then tries the next one;
//! - gRPC across nodes: each side builds its own veth end, read through a packet
//!   socket; frames carry derived ids.
//!
//! What the task remembers between passes is its own (`pass::PassState`). What other
//! paths share with it is named in [`Engine`]'s fields: the pods the daemon attached
//! (written by ADD and DEL), the pass requests, why an end's emulation is not in force
//! (read by the link views), and the counters the scrape path samples.
//!
//! The engine reaches the world through three seams: the kernel ([`WireKernel`]), the
//! other nodes ([`Peers`]) and the workers of gRPC ends ([`GrpcPlane`]); [`Seams`]
//! bundles them with the [`Carriers`]. Its modules: `plan` (the decisions, without
//! I/O), `pass` (the run task and the pass), `carrier` (one module per kind of link),
//! `ends` (the server side of `Ends`), `counters` (per-wire counters), `emulate`
//! (impairments and link state by intent, at each pass and at run time).

pub mod carrier;
mod counters;
mod cx;
mod emulate;
mod ends;
mod pass;
pub(crate) mod plan;
mod records;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tracing::warn;
use weft_kernel::KernelError;
use weft_link::{LinkStatus, WireEnd};
use weft_rpc::wire::{End, EndResult, EndsRequest, Hello};
use weft_store::{Store, StoreError};
use weft_telemetry::Metrics;
use weft_topology::{Link, LinkKind, TopologySource, TopologyStatus};

pub use carrier::{Carrier, Carriers, Far};
pub use cx::Cx;
pub(crate) use plan::Pods;

use crate::dataplane::DataPlane;
use crate::error::WireError;
use crate::kernel::{HostWireKernel, WireKernel};
use crate::metrics::WireMetrics;
use crate::peers::{GrpcPeers, Peers};
use crate::plane::GrpcPlane;
pub use plan::PodKey;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This node's name.
    pub node_name: String,
    /// This node's underlay address, when given rather than learnt from the source.
    pub node_address: Option<IpAddr>,
    /// TCP port of the wire service on every node.
    pub wire_port: u16,
    /// How links between nodes are carried unless a link says otherwise.
    pub default_kind: LinkKind,
    /// MTU of veth and gRPC wire ends (VXLAN ends get this minus the encapsulation).
    pub mtu: u32,
    /// Time between passes when nothing asks for one.
    pub resync: Duration,
    /// Where the data plane of gRPC wires runs: the handle of the node's
    /// [`DataPlaneRuntime`](crate::dataplane::DataPlaneRuntime), whose thread the wire
    /// server shares. None: the runtime [`Engine::start`] is called in.
    pub dataplane_runtime: Option<tokio::runtime::Handle>,
    /// How the wire port is protected, for the calls and streams this node opens.
    pub security: weft_wiretls::WireSecurity,
    /// Where the node ends of gRPC wire ends live (`--wire-ends-netns`).
    pub node_ends: weft_kernel::packet::NodeEnds,
}

/// A pod of this node, as the daemon attached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    /// Its network namespace path.
    pub netns: String,
    /// Its sandbox's container id.
    pub container_id: String,
}

/// A pod's links were not all up when its wait for them ran out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("links not up within {}: {}", humantime::format_duration(*.bound), list(.links))]
pub struct LinkWaitTimeout {
    /// How long was waited.
    pub bound: Duration,
    /// The links that were not up (all of the pod's known links if none was known
    /// to be pending), with why.
    pub links: Vec<LinkStatus>,
}

fn list(links: &[LinkStatus]) -> String {
    if links.is_empty() {
        return "no pass has reported them yet".into();
    }
    links.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// One link of one local pod, as a pass walks them.
#[derive(Debug, Clone, Copy)]
pub struct LocalLink<'a> {
    /// The topology's namespace.
    pub ns: &'a str,
    /// The pod's name.
    pub name: &'a str,
    /// The pod as attached.
    pub pod: &'a LocalPod,
    /// The link, as the pod's topology lists it.
    pub link: &'a Link,
}

impl LocalLink<'_> {
    /// The wire id of this pod's end of the link.
    pub fn id(&self) -> u64 {
        crate::ids::wire_id(self.ns, self.link.uid, self.name)
    }

    /// The record of this pod's end of the link as `kind` carries it, up, its peer
    /// on `peer_node` (empty on this node).
    pub fn record(&self, kind: LinkKind, peer_node: String) -> WireEnd {
        plan::record(self.ns, self.name, &self.pod.netns, self.link, kind, peer_node)
    }
}

/// Makes the data plane of gRPC wires once this node's address is known.
pub type PlaneFactory<P> = Box<dyn Fn(IpAddr) -> Arc<P> + Send + Sync>;

/// What the engine works through: the kernel, the other nodes, the workers of gRPC
/// ends (made once this node's address is known), and the carriers of each kind.
pub struct Seams<P> {
    /// The kernel of the node and its pods.
    pub kernel: Arc<dyn WireKernel>,
    /// The other nodes' wire services.
    pub peers: Arc<dyn Peers>,
    /// Makes the data plane for this node's address.
    pub plane: PlaneFactory<P>,
    /// How each kind of link is carried.
    pub carriers: Carriers<P>,
}

impl Seams<DataPlane> {
    /// The real ones: the host's kernel, gRPC to the other nodes' wire service on
    /// `cfg.wire_port`, and the data plane of weft's wire runtime.
    pub fn host(cfg: &EngineConfig, metrics: Arc<Metrics>) -> Self {
        let port = cfg.wire_port;
        let rt = cfg
            .dataplane_runtime
            .clone()
            .unwrap_or_else(tokio::runtime::Handle::current);
        let security = cfg.security.clone();
        let ends = cfg.node_ends.clone();
        Seams {
            kernel: Arc::new(HostWireKernel::new(ends.clone())),
            peers: Arc::new(GrpcPeers::new(port, security.clone())),
            plane: Box::new(move |local| {
                DataPlane::new(local, port, security.clone(), metrics.clone(), rt.clone(), ends.clone())
            }),
            carriers: Carriers::standard(),
        }
    }
}

/// The wire engine of one node (see the module documentation); `P` is the data plane
/// of its gRPC ends. Its mutable fields are the ones the run task shares with other
/// paths, each saying with whom.
pub struct Engine<P = DataPlane> {
    cfg: EngineConfig,
    source: Arc<dyn TopologySource>,
    store: Store,
    metrics: Arc<WireMetrics>,
    kernel: Arc<dyn WireKernel>,
    peers: Arc<dyn Peers>,
    carriers: Carriers<P>,
    new_plane: PlaneFactory<P>,
    /// The data plane, made once this node's address is known.
    plane: OnceLock<Arc<P>>,
    /// The pods the daemon attached: ADD and DEL write, the pass and the `Ends`
    /// service read (a pass takes the map, not a copy of it).
    pods: Mutex<Pods>,
    /// Requests for passes (any path) and the passes done (the run task).
    passes: Passes,
    /// Why an end's emulation is not in force, per end that has a reason: the pass
    /// writes, the link views read.
    problems: Mutex<HashMap<u64, String>>,
    /// Kernel counters of veth and VXLAN ends as last sampled, used by the scrape path
    /// only (counters grow by the difference, so a re-created interface never makes
    /// them go back).
    sampled: Mutex<HashMap<u64, weft_kernel::LinkStats>>,
    /// Where each link of each local pod stood after the last pass (what the pods'
    /// Topology statuses say, and what ADDs waiting for their links watch): the pass
    /// publishes, readers subscribe.
    links: watch::Sender<BTreeMap<PodKey, Vec<LinkStatus>>>,
    /// Moved by every write of a wire end outside the run task (the `Ends` service):
    /// the run task keeps the ends between passes and reads the store again when this
    /// moved.
    records_epoch: AtomicU64,
    /// The ends each pass built, for the peer nodes to be told of (see [`tell`]): the
    /// run task sends, the teller task calls the peers.
    built: mpsc::Sender<Built>,
}

/// The ends one pass built whose other end a peer node holds, by that node.
type Built = BTreeMap<IpAddr, Vec<End>>;

/// How many passes' worth of built ends wait for the teller at most; past it a pass's
/// news is dropped (the peers' own passes find the ends all the same).
const BUILT_QUEUE: usize = 256;

/// Tells the peer nodes of the ends the passes built, in the order the passes built
/// them, off the passes' path: a pass (and the ADD waiting on it) does not wait for a
/// peer's answer, which under load is its scheduling, not its work. What queued while
/// a call was out goes in one call per peer. Ends when the engine does.
async fn tell<P: GrpcPlane>(engine: std::sync::Weak<Engine<P>>, mut rx: mpsc::Receiver<Built>) {
    while let Some(mut built) = rx.recv().await {
        while let Ok(more) = rx.try_recv() {
            for (node, ends) in more {
                built.entry(node).or_default().extend(ends);
            }
        }
        let Some(engine) = engine.upgrade() else { return };
        for (node, ends) in built {
            if let Err(e) = engine.call_ends(node, ends).await {
                tracing::debug!(peer = %node, error = %e, "could not tell a peer node of the ends built");
            }
        }
    }
}

/// Pass requests: any path asks for a pass (of every pod, or of the pods it names) and
/// may wait for one that started after its request; the run task takes what was asked
/// and says which requests its passes covered.
struct Passes {
    kick: Notify,
    requested: AtomicU64,
    done: watch::Sender<u64>,
    /// What the requests not taken yet asked the next pass to look at.
    asked: Mutex<Asked>,
}

/// What pass requests asked to be looked at, beyond what the pass finds moved itself.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    /// Every local pod, its kernel objects read back.
    pub(crate) all: bool,
    /// These pods (and the local pods linked to them).
    pub(crate) pods: BTreeSet<PodKey>,
}

impl Passes {
    fn new() -> Self {
        Passes {
            kick: Notify::new(),
            requested: AtomicU64::new(0),
            done: watch::channel(0).0,
            asked: Mutex::default(),
        }
    }

    /// Asks for a pass of every pod; returns the request's number.
    fn kick(&self) -> u64 {
        self.ask(|a| a.all = true)
    }

    /// Asks for a pass of `pods`; returns the request's number.
    fn kick_pods(&self, pods: impl IntoIterator<Item = PodKey>) -> u64 {
        self.ask(|a| a.pods.extend(pods))
    }

    /// Notes what is asked before the request is counted: a pass that counts the
    /// request has what it asked for.
    fn ask(&self, f: impl FnOnce(&mut Asked)) -> u64 {
        f(&mut self.asked.lock().expect("asked lock"));
        let n = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.kick.notify_one();
        n
    }

    /// What was asked since the last pass took it.
    fn take_asked(&self) -> Asked {
        std::mem::take(&mut *self.asked.lock().expect("asked lock"))
    }

    /// Resolves when a pass is asked for.
    async fn kicked(&self) {
        self.kick.notified().await
    }

    /// The last request so far (a pass starting now covers it).
    fn requested(&self) -> u64 {
        self.requested.load(Ordering::Acquire)
    }

    /// A pass that covered every request up to `n` is done.
    fn done(&self, n: u64) {
        self.done.send_modify(|d| *d = (*d).max(n));
    }

    /// Waits (15 s at most) until a pass covering request `want` is done.
    async fn wait(&self, want: u64) {
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(15), done.wait_for(|d| *d >= want)).await;
    }
}

impl Engine {
    /// Creates the engine on the host's kernel and weft's data plane, restores the pods
    /// and gRPC ends the store knows and starts the reconcile task (in the current Tokio
    /// runtime).
    pub async fn start(
        cfg: EngineConfig,
        source: Arc<dyn TopologySource>,
        store: Store,
        metrics: Arc<Metrics>,
        pods: BTreeMap<PodKey, LocalPod>,
    ) -> Arc<Engine> {
        let seams = Seams::host(&cfg, metrics.clone());
        Engine::start_with(cfg, source, store, metrics, pods, seams).await
    }
}

impl<P: GrpcPlane> Engine<P> {
    /// [`Engine::start`] over the given seams.
    pub async fn start_with(
        cfg: EngineConfig,
        source: Arc<dyn TopologySource>,
        store: Store,
        metrics: Arc<Metrics>,
        pods: BTreeMap<PodKey, LocalPod>,
        seams: Seams<P>,
    ) -> Arc<Self> {
        let (built_tx, built_rx) = mpsc::channel(BUILT_QUEUE);
        let engine = Arc::new(Engine {
            cfg,
            source,
            store,
            metrics: metrics.families::<WireMetrics>(),
            kernel: seams.kernel,
            peers: seams.peers,
            carriers: seams.carriers,
            new_plane: seams.plane,
            plane: OnceLock::new(),
            pods: Mutex::new(pods.into_iter().collect()),
            passes: Passes::new(),
            problems: Mutex::default(),
            sampled: Mutex::default(),
            links: watch::channel(BTreeMap::new()).0,
            records_epoch: AtomicU64::new(0),
            built: built_tx,
        });
        engine.restore().await;
        tokio::spawn(tell(Arc::downgrade(&engine), built_rx));
        tokio::spawn(engine.clone().run());
        engine
    }

    /// This node's underlay address, once known.
    pub fn node_address(&self) -> Option<IpAddr> {
        self.cfg.node_address.or_else(|| self.source.node_address())
    }

    /// The data plane of gRPC wires (created once the node address is known).
    pub fn dataplane(&self) -> Option<Arc<P>> {
        if let Some(dp) = self.plane.get() {
            return Some(dp.clone());
        }
        let local = self.node_address()?;
        Some(self.plane.get_or_init(|| (self.new_plane)(local)).clone())
    }

    /// The pods the daemon attached, as they are now.
    fn pods(&self) -> Pods {
        self.pods.lock().expect("pods lock").clone()
    }

    /// Pod `key` as the daemon attached it, if it did.
    fn pod(&self, key: &PodKey) -> Option<LocalPod> {
        self.pods.lock().expect("pods lock").get(key).cloned()
    }

    /// Has each end the store holds taken back by its carrier (before the first pass).
    async fn restore(&self) {
        let Ok(records) = self.store.run(|db| db.wires()).await else {
            return;
        };
        for r in &records {
            self.carriers.get(r.kind).restore(self, r).await;
        }
    }

    /// A pod of this node was attached: wires it and waits for the pass that did it.
    pub async fn pod_added(&self, namespace: &str, name: &str, pod: LocalPod) {
        self.pods
            .lock()
            .expect("pods lock")
            .insert((namespace.into(), name.into()), pod);
        // A pod no Topology names, its own or another pod's as a peer, has no link for a
        // pass to build: every pod of a cluster that is not a lab. Its ADD does not wait
        // for a pass (0.2 ms); the next pass notes it all the same, and a Topology that
        // names it later moves a pass of its own.
        if !self.named_by_a_topology(namespace, name) {
            return;
        }
        self.pass_of_and_wait([(namespace.into(), name.into())]).await;
    }

    /// Whether a Topology names pod `name`: its own, or another's link to it.
    fn named_by_a_topology(&self, namespace: &str, name: &str) -> bool {
        self.source.topology(namespace, name).is_some()
            || self.source.topologies().values().any(|t| {
                t.metadata.namespace.as_deref().unwrap_or("default") == namespace
                    && t.spec.links.iter().any(|l| l.peer_pod == name)
            })
    }

    /// A pod of this node is being detached: removes its ends (telling their peers) and
    /// clears its status, then waits for the pass that did it.
    pub async fn pod_removed(&self, namespace: &str, name: &str, container_id: &str) {
        let gone = {
            let mut pods = self.pods.lock().expect("pods lock");
            let key = (namespace.to_string(), name.to_string());
            match pods.get(&key) {
                Some(p) if p.container_id == container_id => pods.remove(&key).is_some(),
                _ => false,
            }
        };
        if !gone {
            return;
        }
        if let Some(t) = self.source.topology(namespace, name) {
            let st = t.status.clone().unwrap_or_default();
            // Only clear what this node wrote: the pod may run elsewhere by now.
            if st.container_id == container_id
                && let Err(e) = self.source.set_status(namespace, name, TopologyStatus::default()).await
            {
                warn!(pod = %format!("{namespace}/{name}"), error = %e, "could not clear the topology status");
            }
        }
        // As at its ADD: a pod no Topology names and no wire end records has nothing
        // for a pass to take down (0.5 ms of a DEL's teardown on a node whose wire
        // engine is idle). A record that cannot be read counts as one.
        if !self.named_by_a_topology(namespace, name) {
            let holds_ends = self.wires().await.map_or(true, |ends| {
                ends.iter()
                    .any(|w| w.namespace == namespace && (w.local_pod == name || w.peer_pod == name))
            });
            if !holds_ends {
                return;
            }
        }
        self.pass_of_and_wait([(namespace.into(), name.into())]).await;
    }

    /// Waits until every link of pod `name` (in `namespace`) is up or down by intent,
    /// for as long as its Topology's `wait_for_links` says, or `default` (the network
    /// config's) when it says nothing. A pod without a Topology or links, or a zero
    /// wait, does not wait. Passes are asked for while waiting, so a peer that appears
    /// is seen at once. On time out, the links that are not up, with their reasons.
    pub async fn wait_links(
        &self,
        namespace: &str,
        name: &str,
        default: Option<Duration>,
    ) -> Result<(), LinkWaitTimeout> {
        let Some(t) = self.source.topology(namespace, name) else {
            return Ok(());
        };
        let bound = t.spec.link_wait().or(default).unwrap_or_default();
        if bound.is_zero() || t.spec.links.is_empty() {
            return Ok(());
        }
        let key: PodKey = (namespace.to_string(), name.to_string());
        let deadline = tokio::time::Instant::now() + bound;
        let mut rx = self.links.subscribe();
        loop {
            let uids: Vec<i64> = self
                .source
                .topology(namespace, name)
                .map(|t| t.spec.links.iter().map(|l| l.uid).collect())
                .unwrap_or_default();
            let known = rx.borrow_and_update().get(&key).cloned().unwrap_or_default();
            let unsettled: Vec<LinkStatus> = known.iter().filter(|l| !l.state.settled()).cloned().collect();
            let all_known = uids.iter().all(|u| known.iter().any(|l| l.uid == *u));
            if all_known && unsettled.is_empty() {
                return Ok(());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(LinkWaitTimeout {
                    bound,
                    links: if unsettled.is_empty() { known } else { unsettled },
                });
            }
            // A pass every second at most while waiting: a peer's arrival also kicks
            // one through the source, this only bounds a missed change.
            if tokio::time::timeout((deadline - now).min(Duration::from_secs(1)), rx.changed())
                .await
                .is_err()
            {
                self.passes.kick_pods([key.clone()]);
            }
        }
    }

    /// Where the links of this node's pods stood after the last pass.
    pub fn link_states(&self) -> BTreeMap<PodKey, Vec<LinkStatus>> {
        self.links.borrow().clone()
    }

    /// Asks for a pass of every pod (their kernel objects read back) and waits until
    /// one that started after the request is done.
    pub async fn pass_and_wait(&self) {
        self.passes.wait(self.passes.kick()).await
    }

    /// Asks for a pass of `pods` (and the local pods linked to them) and waits until
    /// one that started after the request is done.
    async fn pass_of_and_wait(&self, pods: impl IntoIterator<Item = PodKey>) {
        self.passes.wait(self.passes.kick_pods(pods)).await
    }

    /// Notes that a path other than the run task wrote a wire end to the store (after
    /// the write): the next pass reads the store again.
    fn records_written(&self) {
        self.records_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The wire ends this node holds.
    pub async fn wires(&self) -> Result<Vec<WireEnd>, StoreError> {
        self.store.run(|db| db.wires()).await
    }

    /// The wires' metric families (the wire service counts its refusals there).
    pub fn metrics(&self) -> &Arc<WireMetrics> {
        &self.metrics
    }

    /// Whether `addr` is a node some pod of the topologies runs on (the wire service
    /// talks to no one else).
    pub fn known_node(&self, addr: IpAddr) -> bool {
        // A Node object at that address counts as well as a topology status naming it:
        // a peer that calls before its pods' statuses reached this node's cache (every
        // start of a lab or a node) is a node all the same, not a stranger to refuse.
        self.source.nodes().iter().any(|n| n.addresses.contains(&addr))
            || self
                .source
                .topologies()
                .values()
                .filter_map(|t| t.status.as_ref())
                .any(|s| s.src_ip.parse::<IpAddr>().ok() == Some(addr))
    }

    /// Whether every local pod's topology is readable (used by readiness).
    pub fn ready(&self) -> bool {
        self.source.ready()
    }

    /// Pods of this node with a topology.
    pub fn wired_pods(&self) -> Vec<PodKey> {
        self.pods()
            .keys()
            .filter(|(ns, n)| self.source.topology(ns, n).is_some())
            .cloned()
            .collect()
    }

    /// Keys of the topologies (for diagnostics).
    pub fn topology_keys(&self) -> Vec<PodKey> {
        self.source.topologies().values().map(|t| plan::key_of(t)).collect()
    }

    /// Runs a kernel procedure off the async workers (it may enter pod namespaces).
    async fn kernel<R: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn WireKernel) -> Result<R, KernelError> + Send + 'static,
    ) -> Result<R, WireError> {
        let k = self.kernel.clone();
        Ok(tokio::task::spawn_blocking(move || f(&*k))
            .await
            .map_err(|e| WireError::Task(e.to_string()))??)
    }

    /// Calls the `Ends` RPC of the node at `node`.
    async fn call_ends(&self, node: IpAddr, ends: Vec<End>) -> Result<Vec<EndResult>, WireError> {
        let me = self.node_address().ok_or(WireError::NoNodeAddress)?;
        let req = EndsRequest {
            from: Some(Hello {
                node: self.cfg.node_name.clone(),
                address: me.to_string(),
            }),
            ends,
        };
        Ok(self.peers.ends(node, req).await?)
    }
}
