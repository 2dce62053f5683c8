//! The seams the handler works through: node state ([`Ipam`]), the kernel
//! ([`PodNetworking`]) and the pod's links ([`Wiring`]); and what the admin service
//! reads of node state ([`AdminState`]). The daemon plugs in the SQLite store and the netlink driver;
//! tests plug in whatever they need to provoke.

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use weft_kernel::KernelError;
use weft_kernel::ptp::{PodNetwork, PodRoute, RouteRequest};
use weft_portmap::Entries;
use weft_store::{
    Attachment, AttachmentKey, BeginAdd, HeldPort, InstalledRoute, NewAttachment, RangeUsage, State, Store, StoreError,
};

/// Node state: attachments and the addresses they hold.
pub trait Ipam: Send + Sync + 'static {
    /// Records intent to attach and allocates addresses, or returns the existing record.
    fn begin_add(&self, spec: NewAttachment) -> impl Future<Output = Result<BeginAdd, StoreError>> + Send;
    /// Marks an attachment ready with its result and the routes it installed.
    fn finish_add(
        &self,
        id: i64,
        result_json: String,
        routes: Vec<InstalledRoute>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Removes an attachment and releases its addresses.
    fn remove(&self, id: i64) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Marks the attachment of `key` as being torn down and returns it.
    fn begin_del(&self, key: AttachmentKey) -> impl Future<Output = Result<Option<Attachment>, StoreError>> + Send;
    /// The attachment of `key`.
    fn get(&self, key: AttachmentKey) -> impl Future<Output = Result<Option<Attachment>, StoreError>> + Send;
    /// Every attachment of a container (the networks of one pod), in any state.
    fn container_attachments(
        &self,
        container_id: String,
    ) -> impl Future<Output = Result<Vec<Attachment>, StoreError>> + Send;
    /// Attachments, filtered by network and state.
    fn list(
        &self,
        network: Option<String>,
        state: Option<State>,
    ) -> impl Future<Output = Result<Vec<Attachment>, StoreError>> + Send;
    /// Usage of the given ranges.
    fn usage_of(&self, ranges: Vec<IpNet>) -> impl Future<Output = Result<Vec<RangeUsage>, StoreError>> + Send;
    /// Every host port held on the node.
    fn held_ports(&self) -> impl Future<Output = Result<Vec<HeldPort>, StoreError>> + Send;
    /// The gateways of the ranges some attachment, in any state, holds an address of:
    /// those the node must go on holding.
    fn gateways_in_use(&self) -> impl Future<Output = Result<Vec<IpAddr>, StoreError>> + Send;
}

impl Ipam for Store {
    async fn begin_add(&self, spec: NewAttachment) -> Result<BeginAdd, StoreError> {
        self.run(move |db| db.begin_add(&spec)).await
    }
    async fn finish_add(&self, id: i64, result_json: String, routes: Vec<InstalledRoute>) -> Result<(), StoreError> {
        self.run(move |db| db.finish_add(id, &result_json, &routes)).await
    }
    async fn remove(&self, id: i64) -> Result<(), StoreError> {
        self.run(move |db| db.remove(id)).await
    }
    async fn begin_del(&self, key: AttachmentKey) -> Result<Option<Attachment>, StoreError> {
        self.run(move |db| db.begin_del(&key)).await
    }
    async fn get(&self, key: AttachmentKey) -> Result<Option<Attachment>, StoreError> {
        self.run(move |db| db.get(&key)).await
    }
    async fn container_attachments(&self, container_id: String) -> Result<Vec<Attachment>, StoreError> {
        self.run(move |db| db.container_attachments(&container_id)).await
    }
    async fn list(&self, network: Option<String>, state: Option<State>) -> Result<Vec<Attachment>, StoreError> {
        self.run(move |db| db.list(network.as_deref(), state)).await
    }
    async fn usage_of(&self, ranges: Vec<IpNet>) -> Result<Vec<RangeUsage>, StoreError> {
        self.run(move |db| db.usage_of(&ranges)).await
    }
    async fn held_ports(&self) -> Result<Vec<HeldPort>, StoreError> {
        self.run(|db| db.ports()).await
    }
    async fn gateways_in_use(&self) -> Result<Vec<IpAddr>, StoreError> {
        self.run(|db| db.gateways_in_use()).await
    }
}

/// What `weftctl status` hears about node state: one read of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateSummary {
    /// Usage of every range the node has allocated from.
    pub ranges: Vec<RangeUsage>,
    /// Attachments that are set up (not being created or torn down).
    pub ready_attachments: u64,
}

/// Node state as the admin service reports it: the few reads it makes, so it can be
/// tested without a database.
pub trait AdminState: Send + Sync + 'static {
    /// Range usage and attachment count, read together.
    fn summary(&self) -> impl Future<Output = Result<StateSummary, StoreError>> + Send;
    /// Every host port held on the node, with the pod holding it.
    fn host_ports(&self) -> impl Future<Output = Result<Vec<HeldPort>, StoreError>> + Send;
    /// Where the state lives, for people (the database file).
    fn location(&self) -> String;
}

impl AdminState for Store {
    async fn summary(&self) -> Result<StateSummary, StoreError> {
        self.run(|db| {
            Ok(StateSummary {
                ranges: db.range_usage()?,
                ready_attachments: db.counts()?.1,
            })
        })
        .await
    }
    async fn host_ports(&self) -> Result<Vec<HeldPort>, StoreError> {
        self.run(|db| db.ports()).await
    }
    fn location(&self) -> String {
        self.path().display().to_string()
    }
}

/// The kernel side of pod networking.
pub trait PodNetworking: Send + Sync + 'static {
    /// Checks that `path` names a network namespace, before anything is touched.
    fn validate_netns(&self, path: PathBuf) -> impl Future<Output = Result<(), KernelError>> + Send;
    /// Builds a pod's networking with the routes `routes` asks for, all or nothing;
    /// returns the routes it installed.
    fn setup(
        &self,
        net: PodNetwork,
        routes: RouteRequest,
    ) -> impl Future<Output = Result<Vec<PodRoute>, KernelError>> + Send;
    /// Compares a pod's networking, with the routes its setup installed, with the kernel.
    fn check(&self, net: PodNetwork, routes: Vec<PodRoute>) -> impl Future<Output = Result<(), KernelError>> + Send;
    /// Brings a pod's networking, with the routes its setup installed, back to what it
    /// should be; names what was repaired.
    fn repair(
        &self,
        net: PodNetwork,
        routes: Vec<PodRoute>,
    ) -> impl Future<Output = Result<Vec<&'static str>, KernelError>> + Send;
    /// Cuts a pod off (fast); returns whether its host end existed.
    fn disconnect(&self, host_ifname: String) -> impl Future<Output = Result<bool, KernelError>> + Send;
    /// Removes a pod's veth pair (slow: waits for RCU); returns whether it existed.
    fn remove(&self, host_ifname: String) -> impl Future<Output = Result<bool, KernelError>> + Send;
    /// Stops holding the pods' gateways the node holds once for all its pods (IPv4) that
    /// are not in `in_use`, and whatever holds them once it holds none; returns the
    /// gateways let go. Never while a setup or repair runs (the handler's gateway lock).
    fn release_gateways(&self, in_use: Vec<IpAddr>) -> impl Future<Output = Result<Vec<IpAddr>, KernelError>> + Send;
    /// Makes host ports reach their pods.
    fn add_host_ports(&self, entries: Entries) -> impl Future<Output = Result<(), KernelError>> + Send;
    /// Stops host ports from reaching pods.
    fn remove_host_ports(&self, entries: Entries) -> impl Future<Output = Result<(), KernelError>> + Send;
    /// Makes the host port table hold exactly `entries`; returns whether it had to be
    /// rewritten.
    fn sync_host_ports(&self, entries: Entries) -> impl Future<Output = Result<TableSync, KernelError>> + Send;
}

/// What a sync of the host port table did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSync {
    /// Nothing: the table held what it should.
    InSync,
    /// Wrote it: there was none (a first start, or after a reboot).
    Created,
    /// Wrote it again for options that changed: other flags than the last weftd's, or
    /// `route_localnet` turned on or off (the table guards 127/8 while it is on).
    Reshaped,
    /// Wrote it again: it differed from the store under unchanged options (someone
    /// changed weft's table, or a crash cut a change short).
    Drifted,
}

/// [`PodNetworking`] on the real kernel, through the ptp driver and weft's nftables
/// table. Every call runs on the blocking pool; work inside a pod's namespace gets a
/// thread of its own there.
#[derive(Debug, Clone, Default)]
pub struct KernelNetworking {
    /// `--hostports-localhost`: host ports answer on 127.0.0.1 too.
    localhost: bool,
    /// The options of the last sync, to tell a change of options from drift.
    last: std::sync::Arc<std::sync::Mutex<Option<weft_portmap::Options>>>,
}

impl KernelNetworking {
    /// Pod networking on this namespace's kernel; `localhost` is
    /// `--hostports-localhost`.
    pub fn new(localhost: bool) -> Self {
        Self {
            localhost,
            last: Default::default(),
        }
    }

    /// The table's options now: 127/8 is guarded whenever `route_localnet` is on,
    /// whoever turned it on.
    fn options(&self) -> weft_portmap::Options {
        weft_portmap::Options {
            localhost: self.localhost,
            guard_localnet: self.localhost || weft_portmap::localnet_routable(),
        }
    }
}

fn portmap_err(e: weft_portmap::PortmapError) -> KernelError {
    match e {
        weft_portmap::PortmapError::Netlink { step, source } => KernelError::os(step, source),
        weft_portmap::PortmapError::Nft(m) => KernelError::os("nft", std::io::Error::other(m)),
    }
}

/// Runs kernel work on the blocking pool, inside the caller's span so its phase
/// spans belong to the call.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, KernelError> + Send + 'static,
) -> Result<R, KernelError> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .unwrap_or_else(|e| Err(KernelError::os("kernel task", std::io::Error::other(e.to_string()))))
}

impl PodNetworking for KernelNetworking {
    async fn validate_netns(&self, path: PathBuf) -> Result<(), KernelError> {
        weft_kernel::NetNs::open(&path).map(|_| ())
    }
    async fn setup(&self, net: PodNetwork, routes: RouteRequest) -> Result<Vec<PodRoute>, KernelError> {
        blocking(move || net.setup_routes(&routes)).await
    }
    async fn check(&self, net: PodNetwork, routes: Vec<PodRoute>) -> Result<(), KernelError> {
        blocking(move || net.check(&routes)).await
    }
    async fn repair(&self, net: PodNetwork, routes: Vec<PodRoute>) -> Result<Vec<&'static str>, KernelError> {
        blocking(move || net.repair(&routes)).await
    }
    async fn disconnect(&self, host_ifname: String) -> Result<bool, KernelError> {
        blocking(move || weft_kernel::ptp::disconnect(&host_ifname)).await
    }
    async fn remove(&self, host_ifname: String) -> Result<bool, KernelError> {
        blocking(move || weft_kernel::ptp::remove(&host_ifname)).await
    }
    async fn release_gateways(&self, in_use: Vec<IpAddr>) -> Result<Vec<IpAddr>, KernelError> {
        blocking(move || weft_kernel::ptp::release_gateways(&in_use)).await
    }
    async fn add_host_ports(&self, entries: Entries) -> Result<(), KernelError> {
        blocking(move || {
            weft_portmap::add(&entries).map_err(portmap_err)?;
            // Flows to these ports from before the mapping would keep missing the pod.
            weft_portmap::flush_udp_conntrack(&entries.ports);
            Ok(())
        })
        .await
    }
    async fn remove_host_ports(&self, entries: Entries) -> Result<(), KernelError> {
        blocking(move || {
            weft_portmap::remove(&entries).map_err(portmap_err)?;
            weft_portmap::flush_udp_conntrack(&entries.ports);
            Ok(())
        })
        .await
    }
    async fn sync_host_ports(&self, entries: Entries) -> Result<TableSync, KernelError> {
        let this = self.clone();
        blocking(move || {
            use weft_portmap::Found;
            let opts = this.options();
            let last = this.last.lock().expect("options lock").replace(opts);
            let outcome = match weft_portmap::compare(&entries, opts).map_err(portmap_err)? {
                Found::Same => return Ok(TableSync::InSync),
                Found::Absent if last.is_none() && entries.ports.is_empty() => TableSync::Created,
                Found::OtherRules if last != Some(opts) => TableSync::Reshaped,
                Found::Absent | Found::OtherRules | Found::OtherElements => TableSync::Drifted,
            };
            weft_portmap::install(&entries, opts).map_err(portmap_err)?;
            Ok(outcome)
        })
        .await
    }
}

/// A pod the wiring seam hears about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WiredPod {
    /// Its namespace (`K8S_POD_NAMESPACE`).
    pub namespace: String,
    /// Its name (`K8S_POD_NAME`).
    pub name: String,
    /// Its network namespace path.
    pub netns: String,
    /// Its sandbox's container id.
    pub container_id: String,
}

/// A pod of this node as network policy needs it before its ADD answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicedPod {
    /// Its namespace (`default` when the runtime gave none).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its addresses.
    pub ips: Vec<std::net::IpAddr>,
    /// The node side of its `eth0`.
    pub host_ifname: String,
}

/// The interface network policy applies to: the pod network's, as Kubernetes means it.
/// A pod's other networks (Multus' `net1`, ...) are not policed.
pub const POLICED_IFNAME: &str = "eth0";

/// Network policy (optional): a pod's policies are in the kernel before its ADD
/// answers, and a DEL is heard at once. Unlike wiring, a policy that cannot be put in
/// place fails the ADD: a pod never starts unpoliced.
pub trait PolicyHook: Send + Sync + 'static {
    /// Puts the policies of the pod being attached in place.
    fn pod_attached(&self, pod: PolicedPod) -> futures::future::BoxFuture<'_, Result<(), String>>;
    /// A pod of this node was detached (or its ADD failed after its policies were put
    /// in place): `host_ifname` was its host interface.
    fn pod_detached(&self, host_ifname: &str);
}

/// Point-to-point wires between pods (the third seam, optional): told when a pod of
/// this node is attached or detached; it builds or removes the pod's wires. Wiring
/// problems never fail a CNI call: the wiring retries on its own.
pub trait Wiring: Send + Sync + 'static {
    /// The pod is attached (its `eth0` is up): wire it.
    fn pod_added(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()>;
    /// The pod is being detached: remove its wire ends and tell their peers.
    fn pod_removed(&self, pod: WiredPod) -> futures::future::BoxFuture<'_, ()>;
    /// The wire ends of this node with their counters, for operators.
    fn wires(&self) -> futures::future::BoxFuture<'_, Vec<weft_link::WireReport>>;
    /// Changes the link whose end here is `link` at run time, at both ends (`weftctl
    /// link`); a wiring without link emulation refuses.
    fn link_change(
        &self,
        link: LinkRef,
        change: weft_link::LinkChange,
    ) -> futures::future::BoxFuture<'_, Result<weft_link::LinkView, LinkError>> {
        let _ = (link, change);
        Box::pin(async {
            Err(LinkError::Unsupported {
                what: "has no link emulation",
            })
        })
    }
    /// Waits until every link of the (just added) pod is up, for as long as its
    /// Topology says or else `default` (the network config's `waitForLinks`); the
    /// error says which links are not up and why. A wiring that cannot tell does not
    /// wait.
    fn wait_links(
        &self,
        pod: WiredPod,
        default: Option<std::time::Duration>,
    ) -> futures::future::BoxFuture<'_, Result<(), String>> {
        let _ = (pod, default);
        Box::pin(async { Ok(()) })
    }
    /// The wire ends of this node (of one namespace, one pod) with their emulation
    /// settings.
    fn links(
        &self,
        namespace: Option<String>,
        pod: Option<String>,
    ) -> futures::future::BoxFuture<'_, Result<Vec<weft_link::LinkView>, LinkError>> {
        let _ = (namespace, pod);
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Opens a capture of the link end `link` (its interface in the pod), each frame
    /// cut to `snaplen` bytes; frames come until the stream is dropped, which closes
    /// the capture. A wiring that cannot capture refuses.
    fn capture(&self, link: LinkRef, snaplen: u32) -> futures::future::BoxFuture<'_, Result<FrameStream, LinkError>> {
        let _ = (link, snaplen);
        Box::pin(async {
            Err(LinkError::Unsupported {
                what: "cannot capture links",
            })
        })
    }
}

/// The frames of one capture, as the wiring reads them; an error ends the capture (the
/// interface went away, or the socket failed).
pub type FrameStream = futures::stream::BoxStream<'static, std::io::Result<weft_link::CapturedFrame>>;

/// One link of a pod of this node, named by its end here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRef {
    /// Topology namespace; `None`: the only one with such a pod.
    pub namespace: Option<String>,
    /// The pod.
    pub pod: String,
    /// Its interface.
    pub intf: String,
}

/// Why a link change or listing failed, by whose fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No such link end on this node (or an ambiguous name).
    #[error(transparent)]
    NotFound(#[from] weft_link::EndNotFound),
    /// This daemon's wiring does not do what was asked (`what` it cannot do).
    #[error("this daemon {what}")]
    Unsupported {
        /// What it cannot do, as "has no link emulation".
        what: &'static str,
    },
    /// A capture could not be opened on the end.
    #[error("cannot capture {link}: {reason}")]
    Capture {
        /// The end, as `pod:intf`.
        link: String,
        /// What the kernel or the task said.
        reason: String,
    },
    /// The setting does not apply.
    #[error("{0}")]
    Invalid(String),
    /// The change could not be made (or only at one end).
    #[error("{0}")]
    Failed(String),
}
