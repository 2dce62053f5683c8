//! CNI semantics: what ADD, DEL, CHECK, STATUS and GC do, over the [`Ipam`] and
//! [`PodNetworking`] seams. Every input is validated before anything is touched; a
//! failed ADD undoes what it did; DEL and GC are idempotent.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::IpNet;
use tokio::sync::watch;
use tracing::{Instrument, info, warn};
use weft_cni::args::{IP, K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID, MAC};
use weft_cni::request::{self, Requested};
use weft_cni::spool::{self, SpooledDel};
use weft_cni::{CNIResult, Cmd, CniError, Code, HostIp, Interface, IpConfig, NetworkConfig, Route, result, validate};
use weft_failpoint::failpoint;
use weft_kernel::KernelError;
use weft_kernel::ptp::{self, PodAddress, PodNetwork, PodRoute, RouteRequest};
use weft_portmap::{Entries, Hairpin, HostPort, Protocol};
use weft_store::{
    Attachment, AttachmentKey, BeginAdd, Family, InstalledRoute, NewAttachment, PodRef, PortMapping, PortRequest,
    State, StoreError,
};

use crate::call::CniCall;
use crate::defaults::{self, PodDefaults};
use crate::locks::{KeyedLocks, Teardowns};
use crate::naming;
use crate::seams::{Ipam, POLICED_IFNAME, PodNetworking, PolicedPod, PolicyHook, TableSync, WiredPod, Wiring};
use crate::spool::DelSpool;

/// A span for one phase of a call; closed phases become
/// `weft_cni_phase_duration_seconds{phase=...}` observations and trace spans.
macro_rules! phase {
    ($name:literal) => {
        tracing::info_span!(target: "weft::phase", $name)
    };
}

/// Facts about the node the handler reports.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
}

/// Handles CNI calls. Cheap to share: wrap it in an `Arc`.
pub struct Handler<I, K> {
    ipam: Arc<I>,
    net: Arc<K>,
    locks: KeyedLocks,
    teardowns: Arc<Teardowns>,
    node: NodeInfo,
    wiring: Option<Arc<dyn Wiring>>,
    defaults: Option<watch::Receiver<PodDefaults>>,
    del_spool: Option<Arc<DelSpool>>,
    new_range: Option<NewRange>,
    policy: Option<Arc<dyn PolicyHook>>,
    /// Ranges ADDs gave addresses from since start (a new one is announced once).
    seen_ranges: std::sync::Mutex<HashSet<IpNet>>,
}

/// Called when an ADD gave an address from a range no ADD used since start.
pub type NewRange = Arc<dyn Fn() + Send + Sync>;

fn store_err(e: StoreError) -> CniError {
    match e {
        StoreError::Exhausted { .. } => CniError::new(Code::RangeExhausted, e.to_string()),
        StoreError::PortTaken { .. } => CniError::new(Code::HostPortInUse, e.to_string()),
        StoreError::PortInvalid(_) => CniError::new(Code::InvalidConfig, e.to_string()),
        StoreError::AddressTaken { .. } => CniError::new(Code::AddressInUse, e.to_string()),
        StoreError::AddressInvalid(_) => CniError::new(Code::InvalidConfig, e.to_string()),
        StoreError::Closed => CniError::new(Code::TryAgainLater, "weftd is shutting down"),
        StoreError::Panicked(_) => CniError::new(Code::Internal, e.to_string()),
        // A full disk (or a read-only, failing or damaged file) is the node's condition,
        // not the call's: the runtime retries, and the node answers not ready until the
        // store writes again.
        StoreError::Sqlite(cause) if e.cannot_write() => CniError::new(
            Code::TryAgainLater,
            format!("{STORE_CANNOT_WRITE}: {cause}; weftd takes pods again once it can write (see /readyz)"),
        ),
        other => CniError::new(Code::Store, other.to_string()),
    }
}

/// How the details of a CNI error start when the state store cannot be written.
pub const STORE_CANNOT_WRITE: &str = "the state store cannot be written";

fn kernel_err(e: KernelError) -> CniError {
    if ptp::is_route_conflict(&e)
        && let KernelError::Os { step, .. } = &e
    {
        return CniError::new(
            Code::RouteExists,
            format!(
                "{step}: the pod has a route to that destination already (another network of the pod, or its \
                 runtime, installed it); leave it out of `routes`, leave `defaultRoute` unset, and give each \
                 network of a pod its own ranges"
            ),
        );
    }
    match e {
        KernelError::InvalidNetns { .. } => CniError::new(Code::InvalidNetns, e.to_string()),
        KernelError::InterfaceExists { .. } => CniError::new(Code::InterfaceExists, e.to_string()),
        KernelError::Drift(d) => CniError::new(Code::CheckFailed, d.to_string()),
        KernelError::Os { .. } => CniError::new(Code::Kernel, e.to_string()),
    }
}

/// The pod an attachment belongs to, from `CNI_ARGS`.
fn pod_ref(args: &CniCall) -> PodRef {
    let get = |k: &str| args.args.get(k).cloned().unwrap_or_default();
    PodRef {
        namespace: get(K8S_POD_NAMESPACE),
        name: get(K8S_POD_NAME),
        uid: get(K8S_POD_UID),
    }
}

/// Decodes the config for `cmd`, checks the container id and interface name, and
/// returns the config with the attachment's key: the common start of ADD, DEL, CHECK.
fn decode(args: &CniCall, cmd: Cmd) -> Result<(NetworkConfig, AttachmentKey), CniError> {
    let conf = NetworkConfig::parse(&args.config, cmd)?;
    validate::container_id(&args.container_id)?;
    validate::ifname(&args.ifname)?;
    let key = AttachmentKey {
        network: conf.name.clone(),
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
    };
    Ok((conf, key))
}

/// The store's form of the host ports a config asks for.
fn port_requests(conf: &NetworkConfig) -> Vec<PortRequest> {
    conf.port_mappings
        .iter()
        .map(|m| {
            let (host_ip, family) = match m.host_ip {
                HostIp::Any => (None, None),
                HostIp::AnyV4 => (None, Some(Family::V4)),
                HostIp::AnyV6 => (None, Some(Family::V6)),
                HostIp::Addr(ip) => (Some(ip), None),
            };
            PortRequest {
                host_ip,
                family,
                host_port: m.host_port,
                protocol: m.protocol.clone(),
                container_port: m.container_port,
            }
        })
        .collect()
}

/// The kernel's form of one attachment's host ports: the map elements, and a hairpin
/// element for each pod address that is a target (so the pod reaches itself through
/// its own host port).
pub fn host_port_entries(host_ifname: &str, ports: &[PortMapping]) -> Entries {
    let mut e = Entries::default();
    for p in ports {
        let Some(protocol) = Protocol::parse(&p.protocol) else {
            continue;
        };
        e.ports.push(HostPort {
            host_ip: p.host_ip,
            host_port: p.host_port,
            protocol,
            container_ip: p.container_ip,
            container_port: p.container_port,
        });
        let h = Hairpin {
            ifname: host_ifname.to_string(),
            addr: p.container_ip,
        };
        if !e.hairpins.contains(&h) {
            e.hairpins.push(h);
        }
    }
    e
}

/// The kernel description of a stored attachment.
pub(crate) fn pod_network(att: &Attachment) -> PodNetwork {
    let (host_mac, derived) = naming::macs(&att.key.container_id, &att.key.ifname);
    let pod_mac = att.pod_mac.unwrap_or(derived);
    PodNetwork {
        netns: PathBuf::from(&att.netns),
        ifname: att.key.ifname.clone(),
        host_ifname: att.host_ifname.clone(),
        host_mac,
        pod_mac,
        mtu: att.mtu,
        addresses: att
            .addresses
            .iter()
            .map(|a| PodAddress {
                address: a.address,
                gateway: a.gateway,
            })
            .collect(),
        alias: format!("weft:{}", att.key),
    }
}

/// The kernel's form of a route the store keeps.
fn pod_route(r: &InstalledRoute) -> PodRoute {
    PodRoute {
        dst: r.dst.network(),
        prefix_len: r.dst.prefix_len(),
        gateway: r.gateway,
    }
}

/// The store's form of a route the kernel installed.
fn installed_route(r: &PodRoute) -> InstalledRoute {
    InstalledRoute {
        dst: IpNet::new(r.dst, r.prefix_len).expect("routes are built from valid prefixes"),
        gateway: r.gateway,
    }
}

/// The routes of a stored attachment, as the kernel checks and repairs them.
fn pod_routes(att: &Attachment) -> Vec<PodRoute> {
    att.routes.iter().map(pod_route).collect()
}

/// Refuses a route `gw` that cannot be the pod's next hop before anything is touched:
/// a weft pod has one neighbour, the host end, which holds the gateway of the pod's
/// range of each family; so a `gw` must be the gateway of one of `ranges`.
fn check_route_gateways(conf: &NetworkConfig, ranges: &[IpNet]) -> Result<(), CniError> {
    for r in &conf.routes {
        let Some(gw) = r.gw else { continue };
        let family: Vec<&IpNet> = ranges.iter().filter(|n| n.addr().is_ipv4() == gw.is_ipv4()).collect();
        if !family.iter().any(|n| weft_store::gateway(n) == gw) {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "`routes`: the route to {} names gw {gw}, but a pod's only next hop is the gateway of its range \
                     (the first address: {}); leave `gw` out",
                    r.dst,
                    if family.is_empty() {
                        "the network has no range of that family".to_string()
                    } else {
                        family
                            .iter()
                            .map(|n| format!("{} for {n}", weft_store::gateway(n)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// The routes an ADD asks the kernel for, through the pod's gateways: a default route
/// per family with `defaultRoute: true`, then the config's `routes` (those of a family
/// the pod has no address in are skipped: one config may serve single- and
/// dual-stack nodes). With `defaultRoute` unset, the kernel adds a default route for
/// each family the pod has none of yet, so a pod's first network gets them and a
/// second one does not.
fn route_request(conf: &NetworkConfig, att: &Attachment) -> Result<RouteRequest, CniError> {
    let of_family = |v6: bool| att.addresses.iter().find(|a| a.address.is_ipv6() == v6);
    let mut routes = Vec::new();
    if conf.default_route == Some(true) {
        for a in &att.addresses {
            let listed = conf
                .routes
                .iter()
                .any(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv6() == a.address.is_ipv6());
            if !listed {
                routes.push(PodRoute::default_via(a.gateway));
            }
        }
    }
    for r in &conf.routes {
        let Some(a) = of_family(r.dst.addr().is_ipv6()) else {
            continue;
        };
        if let Some(gw) = r.gw
            && gw != a.gateway
        {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "`routes`: the route to {} names gw {gw}, but the pod's address {} came from range {}, whose \
                     gateway {} is its only next hop; leave `gw` out",
                    r.dst, a.address, a.range, a.gateway
                ),
            ));
        }
        routes.push(PodRoute {
            dst: r.dst.network(),
            prefix_len: r.dst.prefix_len(),
            gateway: a.gateway,
        });
    }
    Ok(RouteRequest {
        routes,
        default_unless_present: conf.default_route.is_none(),
    })
}

/// Refuses a requested address outside every range before anything is touched,
/// naming where it was asked for and the ranges. (The store refuses the rest in the
/// ADD's transaction: an address that is no pod address of its range, or is taken.)
fn check_requested(req: &Requested, ranges: &[IpNet]) -> Result<(), CniError> {
    for r in &req.ips {
        if ranges.iter().any(|n| n.contains(&r.address)) {
            continue;
        }
        let family = if r.address.is_ipv4() { Family::V4 } else { Family::V6 };
        let same: Vec<String> = ranges
            .iter()
            .filter(|n| n.addr().is_ipv4() == r.address.is_ipv4())
            .map(ToString::to_string)
            .collect();
        return Err(CniError::new(
            Code::InvalidConfig,
            if same.is_empty() {
                format!(
                    "{} asks for {}, but the network has no {family} range (ranges: {})",
                    r.source,
                    r.address,
                    ranges.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                )
            } else {
                format!(
                    "{} asks for {}, which is outside every {family} range of the network: {}",
                    r.source,
                    r.address,
                    same.join(", ")
                )
            },
        ));
    }
    Ok(())
}

/// Refuses to return an attachment that exists already for an ADD asking for
/// another address or MAC than it has: the runtime would believe the pod has them.
fn check_existing_matches(att: &Attachment, req: &Requested) -> Result<(), CniError> {
    let differs = |what: String| {
        Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "attachment {} exists already with {what}; DEL it before asking for another",
                att.key
            ),
        ))
    };
    for r in &req.ips {
        if !att.addresses.iter().any(|a| a.address == r.address) {
            let held: Vec<String> = att.addresses.iter().map(|a| a.address.to_string()).collect();
            return differs(format!(
                "address {} ({} asks for {})",
                held.join(", "),
                r.source,
                r.address
            ));
        }
    }
    if let Some(mac) = req.mac {
        let has = att
            .pod_mac
            .unwrap_or_else(|| naming::macs(&att.key.container_id, &att.key.ifname).1);
        if has != mac {
            return differs(format!(
                "MAC {} (this ADD asks for {})",
                naming::mac_string(&has),
                naming::mac_string(&mac)
            ));
        }
    }
    Ok(())
}

/// The CNI result (current layout) describing an attachment and the routes it
/// installed.
pub(crate) fn cni_result(att: &Attachment, net: &PodNetwork, installed: &[InstalledRoute]) -> CNIResult {
    let interfaces = vec![
        Interface {
            name: net.host_ifname.clone(),
            mac: naming::mac_string(&net.host_mac),
            mtu: Some(net.mtu),
            sandbox: None,
            socket_path: None,
            pci_id: None,
        },
        Interface {
            name: net.ifname.clone(),
            mac: naming::mac_string(&net.pod_mac),
            mtu: Some(net.mtu),
            sandbox: Some(att.netns.clone()),
            socket_path: None,
            pci_id: None,
        },
    ];
    let ips = att
        .addresses
        .iter()
        .map(|a| IpConfig {
            interface: Some(1),
            address: ipnet::IpNet::new(a.address, if a.address.is_ipv4() { 32 } else { 128 }).expect("host prefix"),
            gateway: Some(a.gateway),
        })
        .collect();
    let routes = installed
        .iter()
        .map(|r| Route {
            dst: r.dst,
            gw: Some(r.gateway),
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        })
        .collect();
    CNIResult {
        interfaces,
        ips,
        routes,
        dns: None,
    }
}

impl<I, K> Handler<I, K> {
    /// Lets network configs leave `ranges` and `mtu` to the node: ADD and STATUS then
    /// use the node's pod ranges and pod MTU as `rx` holds them at the time of the
    /// call. Without it (a standalone node), a config must give `ranges`.
    pub fn with_pod_defaults(mut self, rx: watch::Receiver<PodDefaults>) -> Self {
        self.defaults = Some(rx);
        self
    }

    /// The ranges and MTU a config resolves to on this node for `cmd`.
    fn effective(&self, conf: &NetworkConfig, cmd: Cmd) -> Result<defaults::Effective, CniError> {
        let node = self.defaults.as_ref().map(|rx| rx.borrow().clone());
        defaults::resolve(conf, node.as_ref(), cmd)
    }
}

impl<I: Ipam, K: PodNetworking> Handler<I, K> {
    /// A handler over `ipam` and `net`.
    pub fn new(ipam: I, net: K, node: NodeInfo) -> Self {
        Self {
            ipam: Arc::new(ipam),
            net: Arc::new(net),
            locks: KeyedLocks::new(256),
            teardowns: Arc::new(Teardowns::default()),
            node,
            wiring: None,
            defaults: None,
            del_spool: None,
            new_range: None,
            policy: None,
            seen_ranges: Default::default(),
        }
    }

    /// Adds network policy: an ADD of a pod's `eth0` answers only once its policies are
    /// in the kernel.
    pub fn with_policy(mut self, policy: Arc<dyn PolicyHook>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The pod network policy sees for `att`, if policy applies to it.
    fn policed(att: &Attachment) -> Option<PolicedPod> {
        (att.key.ifname == POLICED_IFNAME && !att.pod.name.is_empty()).then(|| PolicedPod {
            namespace: if att.pod.namespace.is_empty() {
                "default".into()
            } else {
                att.pod.namespace.clone()
            },
            name: att.pod.name.clone(),
            ips: att.addresses.iter().map(|a| a.address).collect(),
            host_ifname: att.host_ifname.clone(),
        })
    }

    /// Calls `f` when an ADD gives an address from a range no ADD used since start, so
    /// the node network takes up a range a network config brought (its unreachable
    /// route, masquerade) at once rather than at its next pass.
    pub fn on_new_range(mut self, f: NewRange) -> Self {
        self.new_range = Some(f);
        self
    }

    fn note_ranges(&self, att: &Attachment) {
        let Some(f) = &self.new_range else { return };
        let new = {
            let mut seen = self.seen_ranges.lock().expect("ranges lock");
            // Every range is recorded, not only up to the first new one.
            att.addresses.iter().filter(|a| seen.insert(a.range)).count() > 0
        };
        if new {
            f();
        }
    }

    /// Adds the DEL spool the plugin writes to while weftd is down: an ADD first
    /// replays a DEL spooled for its attachment (see [`crate::spool`]).
    pub fn with_del_spool(mut self, spool: Arc<DelSpool>) -> Self {
        self.del_spool = Some(spool);
        self
    }

    /// The DEL spool, if the handler has one.
    pub fn del_spool(&self) -> Option<&Arc<DelSpool>> {
        self.del_spool.as_ref()
    }

    /// Adds the wiring seam (pods with a Topology get their links after `eth0`).
    pub fn with_wiring(mut self, wiring: Arc<dyn Wiring>) -> Self {
        self.wiring = Some(wiring);
        self
    }

    fn wired_pod(att: &Attachment) -> Option<WiredPod> {
        (!att.pod.name.is_empty()).then(|| WiredPod {
            namespace: if att.pod.namespace.is_empty() {
                "default".into()
            } else {
                att.pod.namespace.clone()
            },
            name: att.pod.name.clone(),
            netns: att.netns.clone(),
            container_id: att.key.container_id.clone(),
        })
    }

    /// The node this handler serves.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The IPAM seam.
    pub fn ipam(&self) -> &I {
        &self.ipam
    }

    /// Teardowns accepted but not finished.
    pub fn pending_teardowns(&self) -> usize {
        self.teardowns.len()
    }

    /// Waits until every accepted teardown has finished (at shutdown, and after the
    /// start-up replay of the DEL spool).
    pub async fn drain_teardowns(&self) {
        self.teardowns.wait_all().await;
    }

    async fn check_netns(&self, path: &str) -> Result<(), CniError> {
        validate::netns_path(path)?;
        self.net.validate_netns(PathBuf::from(path)).await.map_err(kernel_err)
    }

    /// ADD: attach the pod, or return the stored result if it is attached already.
    pub async fn add(&self, args: &CniCall) -> Result<Vec<u8>, CniError> {
        let (conf, key) = decode(args, Cmd::Add)?;
        // A DEL of this attachment spooled while weftd was away came first.
        self.replay_spooled_del(&key).await?;
        let eff = self.effective(&conf, Cmd::Add)?;
        let asked = request::requested(
            &conf,
            args.args.get(IP).map(String::as_str),
            args.args.get(MAC).map(String::as_str),
        )?;
        check_requested(&asked, &eff.ranges)?;
        check_route_gateways(&conf, &eff.ranges)?;
        self.check_netns(&args.netns).await?;
        let _guard = async {
            let guard = self.locks.lock(&args.container_id).await;
            self.teardowns.wait(&key).await;
            guard
        }
        .instrument(phase!("lock_wait"))
        .await;
        failpoint!("add.lock");

        let spec = NewAttachment {
            key: key.clone(),
            netns: args.netns.clone(),
            pod: pod_ref(args),
            host_ifname: naming::host_ifname(&key.container_id, &key.ifname),
            mtu: eff.mtu,
            ranges: eff.ranges,
            ports: port_requests(&conf),
            requested: asked.ips.iter().map(|r| r.address).collect(),
            pod_mac: asked.mac,
        };
        let begun = self.begin_add(&spec).instrument(phase!("ipam")).await;
        let att = match begun? {
            BeginAdd::Existing(att) if att.state == State::Ready => {
                check_existing_matches(&att, &asked)?;
                let stored: CNIResult = att
                    .result
                    .as_deref()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .ok_or_else(|| CniError::new(Code::Store, format!("stored result of {key} is unreadable")))?;
                info!(attachment = %key, "ADD repeated: returning the stored result");
                return Ok(result::render(
                    conf.version,
                    &result::merge_prev(conf.prev_result.as_ref(), &stored),
                ));
            }
            BeginAdd::Existing(stale) => {
                // Left by an interrupted ADD or teardown: finish removing it, then start over.
                warn!(attachment = %key, state = stale.state.as_str(), "replacing an unfinished attachment");
                self.finish_teardown(&stale).await?;
                match self.begin_add(&spec).await? {
                    BeginAdd::Created(att) => att,
                    BeginAdd::Existing(_) => {
                        return Err(CniError::new(
                            Code::Internal,
                            format!("attachment {key} reappeared while replacing it"),
                        ));
                    }
                }
            }
            BeginAdd::Created(att) => att,
        };
        failpoint!("add.ipam");

        let routes = match route_request(&conf, &att) {
            Ok(r) => r,
            Err(e) => {
                self.undo_add(&att).await;
                return Err(e);
            }
        };
        let net = pod_network(&att);
        let installed: Vec<InstalledRoute> = match self.net.setup(net.clone(), routes).await {
            Ok(r) => r.iter().map(installed_route).collect(),
            Err(e) => {
                self.undo_add(&att).await;
                return Err(kernel_err(e));
            }
        };
        if !att.ports.is_empty() {
            let added = self
                .net
                .add_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                .instrument(phase!("nftables"))
                .await;
            if let Err(e) = added {
                let _ = self
                    .net
                    .remove_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                    .await;
                let _ = self.net.remove(att.host_ifname.clone()).await;
                self.undo_add(&att).await;
                return Err(kernel_err(e));
            }
            failpoint!("add.hostports");
        }
        if let (Some(policy), Some(pod)) = (&self.policy, Self::policed(&att)) {
            let placed = policy.pod_attached(pod).instrument(phase!("policy")).await;
            if let Err(why) = placed {
                if !att.ports.is_empty() {
                    let _ = self
                        .net
                        .remove_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                        .await;
                }
                let _ = self.net.remove(att.host_ifname.clone()).await;
                self.undo_add(&att).await;
                policy.pod_detached();
                return Err(CniError::new(
                    Code::TryAgainLater,
                    format!(
                        "{}: {why}; nothing was set up and the ADD can be retried",
                        att.pod.describe(&att.key.container_id)
                    ),
                ));
            }
        }
        let ours = cni_result(&att, &net, &installed);
        let json = serde_json::to_string(&ours).expect("CNI results serialize");
        failpoint!("add.commit");
        if let Err(e) = self
            .ipam
            .finish_add(att.id, json, installed)
            .instrument(phase!("store_commit"))
            .await
        {
            let _ = self.net.remove(att.host_ifname.clone()).await;
            self.undo_add(&att).await;
            return Err(store_err(e));
        }
        failpoint!("add.done");
        self.note_ranges(&att);
        info!(attachment = %key, host_ifname = %att.host_ifname, addresses = ?att.addresses.iter().map(|a| a.address).collect::<Vec<_>>(), "pod attached");
        if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&att)) {
            w.pod_added(pod.clone()).instrument(phase!("wires")).await;
            let waited = w
                .wait_links(pod.clone(), conf.wait_for_links)
                .instrument(phase!("wait_links"))
                .await;
            if let Err(why) = waited {
                warn!(attachment = %key, error = %why, "the pod's links did not come up in time: removing the attachment");
                self.abandon_add(&att, w.as_ref(), pod).await;
                return Err(CniError::new(
                    Code::TryAgainLater,
                    format!(
                        "{}: {why}; the attachment was removed and the ADD can be retried",
                        att.pod.describe(&att.key.container_id)
                    ),
                ));
            }
        }
        Ok(result::render(
            conf.version,
            &result::merge_prev(conf.prev_result.as_ref(), &ours),
        ))
    }

    /// Records the attachment and allocates its addresses. A requested address held by
    /// an attachment being torn down (a pod deleted and made again with the same
    /// address, as `podman run --ip` after `podman rm`) frees up within milliseconds:
    /// that teardown is waited for and the allocation tried once more, instead of
    /// refusing.
    async fn begin_add(&self, spec: &NewAttachment) -> Result<BeginAdd, CniError> {
        match self.ipam.begin_add(spec.clone()).await {
            Err(StoreError::AddressTaken {
                key, deleting: true, ..
            }) if self.teardowns.pending(&key) => {
                info!(attachment = %spec.key, holder = %key, "the requested address is being released: waiting for it");
                self.teardowns.wait(&key).await;
                self.ipam.begin_add(spec.clone()).await.map_err(store_err)
            }
            other => other.map_err(store_err),
        }
    }

    async fn undo_add(&self, att: &Attachment) {
        if let Err(e) = self.ipam.remove(att.id).await {
            // The row stays in state `creating`; the next start rolls it back.
            warn!(attachment = %att.key, error = %e, "could not release the addresses of a failed ADD");
        }
    }

    /// Takes back a finished ADD whose pod's links did not come up in time, as a DEL
    /// would (wires, host ports, veth, addresses), waiting for all of it, so the
    /// failed ADD leaves nothing behind.
    async fn abandon_add(&self, att: &Attachment, wiring: &dyn Wiring, pod: WiredPod) {
        if self.is_last_of_pod(att).await {
            wiring.pod_removed(pod).await;
        }
        match self.ipam.begin_del(att.key.clone()).await {
            Ok(Some(att)) => {
                if let Some(work) = self.start_teardown(att).await {
                    let _ = work.await;
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!(attachment = %att.key, error = %e, "could not record the removal of an abandoned ADD; the next start finishes it")
            }
        }
    }

    /// Removes the kernel side and the row of an attachment, waiting for both.
    async fn finish_teardown(&self, att: &Attachment) -> Result<(), CniError> {
        self.net.remove(att.host_ifname.clone()).await.map_err(kernel_err)?;
        self.ipam.remove(att.id).await.map_err(store_err)
    }

    /// DEL: detach the pod. Succeeds when there is nothing to remove. Answers once the
    /// pod is cut off; the veth pair is removed right after, and the addresses are
    /// released only when that is done.
    ///
    /// When the store cannot record the DEL (its disk is full), the DEL goes into the
    /// DEL spool, the pod is cut off and its veth pair removed, and DEL succeeds: the
    /// replay of the spool releases the addresses once the store writes again.
    pub async fn del(&self, args: &CniCall) -> Result<(), CniError> {
        self.del_with(args, true).await
    }

    /// DEL as the spool's replay does it: a store that cannot write fails it (the
    /// entry stays for the next replay) instead of spooling it again.
    pub(crate) async fn del_now(&self, args: &CniCall) -> Result<(), CniError> {
        self.del_with(args, false).await
    }

    async fn del_with(&self, args: &CniCall, may_spool: bool) -> Result<(), CniError> {
        let (_conf, key) = decode(args, Cmd::Del)?;
        let _guard = self
            .locks
            .lock(&args.container_id)
            .instrument(phase!("lock_wait"))
            .await;
        failpoint!("del.lock");
        if self.teardowns.pending(&key) {
            return Ok(());
        }
        let begun = self.ipam.begin_del(key.clone()).instrument(phase!("ipam")).await;
        let att = match begun {
            Ok(Some(att)) => att,
            Ok(None) => return Ok(()),
            Err(e) if may_spool && e.cannot_write() && self.del_spool().is_some() => {
                return self.spool_unrecorded_del(args, &key, e).await;
            }
            Err(e) => return Err(store_err(e)),
        };
        failpoint!("del.intent");
        if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&att))
            && self.is_last_of_pod(&att).await
        {
            w.pod_removed(pod).instrument(phase!("wires")).await;
        }
        self.start_teardown(att).await;
        Ok(())
    }

    /// Whether `att` is the last network of its pod that is not being torn down: the
    /// pod's wires go only with it (a DEL of `net1` leaves the pod and its links).
    async fn is_last_of_pod(&self, att: &Attachment) -> bool {
        match self.ipam.container_attachments(att.key.container_id.clone()).await {
            Ok(all) => !all.iter().any(|o| o.id != att.id && o.state != State::Deleting),
            Err(e) => {
                warn!(attachment = %att.key, error = %e, "cannot tell whether the pod has other networks; removing its wires");
                true
            }
        }
    }

    /// Cuts the pod off now and finishes its teardown in the background.
    async fn start_teardown(&self, att: Attachment) -> Option<tokio::task::JoinHandle<()>> {
        let ticket = self.teardowns.start(&att.key)?;
        self.cut_off(&att).await;
        if let Some(policy) = &self.policy {
            policy.pod_detached();
        }
        let (net, ipam) = (self.net.clone(), self.ipam.clone());
        let key = att.key.clone();
        let work = async move {
            match net.remove(att.host_ifname.clone()).await {
                Ok(_) => {
                    failpoint!("del.veth");
                    match ipam.remove(att.id).await {
                        Ok(()) => {
                            failpoint!("del.release");
                            info!(attachment = %key, "pod detached")
                        }
                        Err(e) => {
                            warn!(attachment = %key, error = %e, "veth removed but the row stays; retried at next start")
                        }
                    }
                }
                Err(e) => {
                    warn!(attachment = %key, error = %e, "could not remove the veth pair; retried at next start")
                }
            }
            drop(ticket);
        };
        Some(tokio::spawn(work.instrument(phase!("teardown"))))
    }

    /// A DEL the store failed to record because it cannot write: it goes into the DEL
    /// spool, which is replayed once the store writes again (and ahead of the pod's next
    /// ADD), and the kernel side goes now, so that the success DEL answers holds for
    /// everything but the rows. While the entry waits, reconcile neither rebuilds the
    /// pod's veth nor puts its host ports back. The spool lives beside the socket, on
    /// another file system than the state as a rule; when it cannot be written either,
    /// the DEL fails and the runtime retries it.
    async fn spool_unrecorded_del(
        &self,
        args: &CniCall,
        key: &AttachmentKey,
        cause: StoreError,
    ) -> Result<(), CniError> {
        let Some(spool) = self.del_spool() else {
            return Err(store_err(cause));
        };
        let del = SpooledDel {
            network: key.network.clone(),
            container_id: key.container_id.clone(),
            ifname: key.ifname.clone(),
            netns: args.netns.clone(),
            args: args.args.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            config: String::from_utf8_lossy(&args.config).into_owned(),
            spooled_at_ms: spool::now_ms(),
        };
        let dir = spool.dir().to_path_buf();
        let written = tokio::task::spawn_blocking(move || spool::write(&dir, &del))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(e) = written {
            let mut err = store_err(cause);
            err.details = format!("{}; the DEL could not be spooled either: {e}", err.details);
            return Err(err);
        }
        warn!(attachment = %key, error = %cause, "the state store cannot record this DEL: spooled until it can, the pod's networking goes now");
        match self.ipam.get(key.clone()).await {
            Ok(Some(att)) => {
                self.cut_off(&att).await;
                if let Err(e) = self.net.remove(att.host_ifname.clone()).await {
                    warn!(attachment = %key, error = %e, "could not remove the veth pair; the spooled DEL's replay retries");
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!(attachment = %key, error = %e, "cannot read the attachment; its veth pair goes when the spooled DEL is replayed")
            }
        }
        Ok(())
    }

    /// What DEL does to the kernel before it answers: the pod's host ports go and its
    /// host end is set down.
    async fn cut_off(&self, att: &Attachment) {
        // The ports were released in the store with the DEL; take them out of the
        // kernel before answering, so a new pod may have them at once.
        if !att.ports.is_empty() {
            let removed = self
                .net
                .remove_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                .instrument(phase!("nftables"))
                .await;
            if let Err(e) = removed {
                warn!(attachment = %att.key, error = %e, "could not remove host ports; the table sync will");
            }
            failpoint!("del.hostports");
            self.hand_over_host_ports(att).await;
        }
        if let Err(e) = self
            .net
            .disconnect(att.host_ifname.clone())
            .instrument(phase!("disconnect"))
            .await
        {
            warn!(attachment = %att.key, error = %e, "could not set the host end down; removing it anyway");
        }
        failpoint!("del.disconnect");
    }

    /// Points the kernel at the attachments that took over `att`'s host ports: another
    /// network of the same container that asked for the same mapping (the store handed
    /// it over when `att`'s DEL began).
    async fn hand_over_host_ports(&self, att: &Attachment) {
        let same = |m: &PortMapping, h: &PortMapping| {
            (m.host_ip, m.host_port, m.protocol.as_str(), m.container_ip.is_ipv6())
                == (h.host_ip, h.host_port, h.protocol.as_str(), h.container_ip.is_ipv6())
        };
        let held = match self.ipam.held_ports().await {
            Ok(h) => h,
            Err(e) => {
                warn!(attachment = %att.key, error = %e, "cannot read who holds the host ports now; the table sync will");
                return;
            }
        };
        let mut heirs = Entries::default();
        for h in held
            .iter()
            .filter(|h| h.key != att.key && att.ports.iter().any(|m| same(m, &h.mapping)))
        {
            let e = host_port_entries(&h.host_ifname, std::slice::from_ref(&h.mapping));
            heirs.ports.extend(e.ports);
            heirs.hairpins.extend(
                e.hairpins
                    .into_iter()
                    .filter(|x| !heirs.hairpins.contains(x))
                    .collect::<Vec<_>>(),
            );
        }
        if heirs.ports.is_empty() {
            return;
        }
        info!(attachment = %att.key, mappings = heirs.ports.len(), "host ports pass to another network of the container");
        if let Err(e) = self.net.add_host_ports(heirs).await {
            warn!(attachment = %att.key, error = %e, "could not hand the host ports over; the table sync will");
        }
    }

    /// Compares every attachment with the kernel and repairs what drifted (a deleted
    /// route, address or veth pair comes back), collects attachments whose network
    /// namespace is gone (their addresses are released and their wires removed), and
    /// rewrites the host port table if it differs from the store. Returns how many items
    /// of each kind it repaired (`veth`, `link_up`, `address`, `route`, `collected`,
    /// `hostports`). Runs at start, before serving, and every reconcile interval; each
    /// attachment is handled under its container's lock, so it never races a call.
    pub async fn reconcile(&self) -> Result<BTreeMap<&'static str, u64>, CniError> {
        let mut repaired: BTreeMap<&'static str, u64> = BTreeMap::new();
        let ready = self.ipam.list(None, Some(State::Ready)).await.map_err(store_err)?;
        for att in ready {
            let _guard = self.locks.lock(&att.key.container_id).await;
            // A DEL waiting in the spool has cut the pod off already: nothing to repair.
            if self.teardowns.pending(&att.key) || self.del_waits_in_spool(&att.key) {
                continue;
            }
            // Re-read under the lock: a DEL or an ADD may have come first.
            let current = self.ipam.get(att.key.clone()).await.map_err(store_err)?;
            let Some(att) = current.filter(|c| c.id == att.id && c.state == State::Ready) else {
                continue;
            };
            match self.net.validate_netns(PathBuf::from(&att.netns)).await {
                Ok(()) => {}
                Err(KernelError::InvalidNetns { reason, .. }) => {
                    warn!(attachment = %att.key, netns = %att.netns, reason = %reason, "the pod's network namespace is gone: collecting the attachment");
                    let Some(gone) = self.ipam.begin_del(att.key.clone()).await.map_err(store_err)? else {
                        continue;
                    };
                    if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&gone)) {
                        w.pod_removed(pod).await;
                    }
                    if let Some(task) = self.start_teardown(gone).await {
                        let _ = task.await;
                    }
                    *repaired.entry("collected").or_default() += 1;
                    continue;
                }
                Err(e) => {
                    warn!(attachment = %att.key, error = %e, "cannot check the pod's network namespace");
                    continue;
                }
            }
            match self.net.repair(pod_network(&att), pod_routes(&att)).await {
                Ok(kinds) => {
                    for kind in kinds {
                        warn!(attachment = %att.key, kind, "kernel state had drifted from the store: repaired");
                        *repaired.entry(kind).or_default() += 1;
                    }
                }
                Err(e) => warn!(attachment = %att.key, error = %e, "could not repair the pod's networking"),
            }
        }
        match self.sync_host_ports().await? {
            TableSync::InSync => {}
            TableSync::Created => info!("host port table created"),
            TableSync::Reshaped => info!("host port table rewritten for the current options"),
            TableSync::Drifted => {
                warn!("the host port table had drifted from the store and was rewritten");
                *repaired.entry("hostports").or_default() += 1;
            }
        }
        Ok(repaired)
    }

    /// Makes the kernel's host port table match the store; says what it found.
    pub async fn sync_host_ports(&self) -> Result<TableSync, CniError> {
        let held = self.ipam.held_ports().await.map_err(store_err)?;
        let mut all = Entries::default();
        // The host ports of a pod whose DEL waits in the spool went with that DEL.
        for h in held.into_iter().filter(|h| !self.del_waits_in_spool(&h.key)) {
            let e = host_port_entries(&h.host_ifname, std::slice::from_ref(&h.mapping));
            all.ports.extend(e.ports);
            for hp in e.hairpins {
                if !all.hairpins.contains(&hp) {
                    all.hairpins.push(hp);
                }
            }
        }
        self.net.sync_host_ports(all).await.map_err(kernel_err)
    }

    /// CHECK: compare the pod's networking with what weft set up.
    pub async fn check(&self, args: &CniCall) -> Result<(), CniError> {
        let (conf, key) = decode(args, Cmd::Check)?;
        self.check_netns(&args.netns).await?;
        let _guard = self
            .locks
            .lock(&args.container_id)
            .instrument(phase!("lock_wait"))
            .await;
        let found = self.ipam.get(key.clone()).instrument(phase!("ipam")).await;
        let att = match found.map_err(store_err)? {
            Some(a) if a.state == State::Ready && !self.teardowns.pending(&key) => a,
            _ => {
                return Err(CniError::new(
                    Code::UnknownContainer,
                    format!("weft has no attachment {key}"),
                ));
            }
        };
        if att.netns != args.netns {
            return Err(CniError::new(
                Code::CheckFailed,
                format!("attachment {key} was made in {}, CHECK names {}", att.netns, args.netns),
            ));
        }
        if let Some(prev) = &conf.prev_result {
            for a in &att.addresses {
                if !prev.ips.iter().any(|ip| ip.address.addr() == a.address) {
                    return Err(CniError::new(
                        Code::CheckFailed,
                        format!("prevResult does not list the pod's address {}", a.address),
                    ));
                }
            }
        }
        self.net
            .check(pod_network(&att), pod_routes(&att))
            .instrument(phase!("check"))
            .await
            .map_err(kernel_err)
    }

    /// STATUS: can ADD be served for this config? Code 50 when every range of one of
    /// its address families is full, or when it leaves the ranges to a node that has
    /// none yet.
    pub async fn status(&self, args: &CniCall) -> Result<(), CniError> {
        let conf = NetworkConfig::parse(&args.config, Cmd::Status)?;
        let eff = self.effective(&conf, Cmd::Status)?;
        let usage = self.ipam.usage_of(eff.ranges).await.map_err(store_err)?;
        for v6 in [false, true] {
            let fam: Vec<_> = usage.iter().filter(|u| u.range.addr().is_ipv6() == v6).collect();
            if !fam.is_empty() && fam.iter().all(|u| u.is_full()) {
                return Err(CniError::new(
                    Code::NotAvailable,
                    format!(
                        "every {} range is full: {}",
                        if v6 { "IPv6" } else { "IPv4" },
                        fam.iter().map(|u| u.range.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// GC: remove every attachment of the network the runtime no longer lists, and
    /// finish any teardown a crash interrupted. Returns how many were removed.
    pub async fn gc(&self, args: &CniCall) -> Result<u32, CniError> {
        let conf = NetworkConfig::parse(&args.config, Cmd::Gc)?;
        let Some(valid) = conf.valid_attachments.as_ref() else {
            return Err(CniError::new(
                Code::InvalidConfig,
                "GC needs `cni.dev/valid-attachments` in the config",
            ));
        };
        let valid: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let all = self.ipam.list(Some(conf.name.clone()), None).await.map_err(store_err)?;
        let mut removed = 0;
        for att in all {
            if valid.contains(&(att.key.container_id.as_str(), att.key.ifname.as_str())) {
                continue;
            }
            let _guard = self.locks.lock(&att.key.container_id).await;
            if self.teardowns.pending(&att.key) {
                continue;
            }
            // Re-read under the lock: a DEL may have raced us.
            let Some(current) = self.ipam.begin_del(att.key.clone()).await.map_err(store_err)? else {
                continue;
            };
            info!(attachment = %current.key, "GC removes an attachment the runtime no longer lists");
            if let Some(task) = self.start_teardown(current).await {
                let _ = task.await;
            }
            removed += 1;
        }
        Ok(removed)
    }
}
