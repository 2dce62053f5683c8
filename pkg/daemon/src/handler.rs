//! CNI semantics: what ADD, DEL, CHECK, STATUS and GC do, over the [`Ipam`] and
//! [`PodNetworking`] seams. Every input is validated before anything is touched; a
//! failed ADD undoes what it did; DEL and GC are idempotent.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{Instrument, info, warn};
use weft_cni::args::{K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID};
use weft_cni::{CNIResult, Cmd, CniError, HostIp, Interface, IpConfig, NetworkConfig, Route, code, result, validate};
use weft_failpoint::failpoint;
use weft_kernel::KernelError;
use weft_kernel::ptp::{PodAddress, PodNetwork};
use weft_portmap::{Entries, Hairpin, HostPort, Protocol};
use weft_rpc::cnirpc::CniArgs;
use weft_store::{
    Attachment, AttachmentKey, BeginAdd, Family, NewAttachment, PodRef, PortMapping, PortRequest, State, StoreError,
};

use crate::locks::{KeyedLocks, Teardowns};
use crate::naming;
use crate::seams::{Ipam, PodNetworking, WiredPod, Wiring};

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
}

fn store_err(e: StoreError) -> CniError {
    match e {
        StoreError::Exhausted { .. } => CniError::new(code::RANGE_EXHAUSTED, e.to_string()),
        StoreError::PortTaken { .. } => CniError::new(code::HOST_PORT_IN_USE, e.to_string()),
        StoreError::PortInvalid(_) => CniError::new(code::INVALID_CONFIG, e.to_string()),
        StoreError::Closed => CniError::new(code::TRY_AGAIN_LATER, "weftd is shutting down"),
        other => CniError::new(code::STORE, other.to_string()),
    }
}

fn kernel_err(e: KernelError) -> CniError {
    match e {
        KernelError::InvalidNetns { .. } => CniError::new(code::INVALID_NETNS, e.to_string()),
        KernelError::InterfaceExists { .. } => CniError::new(code::INTERFACE_EXISTS, e.to_string()),
        KernelError::Drift(m) => CniError::new(code::CHECK_FAILED, m),
        KernelError::Os { .. } => CniError::new(code::KERNEL, e.to_string()),
    }
}

/// The pod an attachment belongs to, from `CNI_ARGS`.
fn pod_ref(args: &CniArgs) -> PodRef {
    let get = |k: &str| args.args.get(k).cloned().unwrap_or_default();
    PodRef {
        namespace: get(K8S_POD_NAMESPACE),
        name: get(K8S_POD_NAME),
        uid: get(K8S_POD_UID),
    }
}

/// Decodes the config for `cmd`, checks the container id and interface name, and
/// returns the config with the attachment's key: the common start of ADD, DEL, CHECK.
fn decode(args: &CniArgs, cmd: Cmd) -> Result<(NetworkConfig, AttachmentKey), CniError> {
    let conf = NetworkConfig::parse(&args.stdin_data, cmd)?;
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
fn pod_network(att: &Attachment) -> PodNetwork {
    let (host_mac, pod_mac) = naming::macs(&att.key.container_id, &att.key.ifname);
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

/// The CNI result (current layout) describing an attachment.
fn cni_result(att: &Attachment, net: &PodNetwork) -> CNIResult {
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
    let routes = att
        .addresses
        .iter()
        .map(|a| Route {
            dst: if a.address.is_ipv4() {
                "0.0.0.0/0".parse().unwrap()
            } else {
                "::/0".parse().unwrap()
            },
            gw: Some(a.gateway),
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
        }
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

    /// Waits until every accepted teardown has finished (used at shutdown).
    pub async fn drain_teardowns(&self) {
        self.teardowns.wait_all().await;
    }

    async fn check_netns(&self, path: &str) -> Result<(), CniError> {
        validate::netns_path(path)?;
        self.net.validate_netns(PathBuf::from(path)).await.map_err(kernel_err)
    }

    /// ADD: attach the pod, or return the stored result if it is attached already.
    pub async fn add(&self, args: &CniArgs) -> Result<Vec<u8>, CniError> {
        let (conf, key) = decode(args, Cmd::Add)?;
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
            mtu: conf.mtu,
            ranges: conf.ranges.clone(),
            ports: port_requests(&conf),
        };
        let begun = self.ipam.begin_add(spec.clone()).instrument(phase!("ipam")).await;
        let att = match begun.map_err(store_err)? {
            BeginAdd::Existing(att) if att.state == State::Ready => {
                let stored: CNIResult = att
                    .result
                    .as_deref()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .ok_or_else(|| CniError::new(code::STORE, format!("stored result of {key} is unreadable")))?;
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
                match self.ipam.begin_add(spec).await.map_err(store_err)? {
                    BeginAdd::Created(att) => att,
                    BeginAdd::Existing(_) => {
                        return Err(CniError::new(
                            code::INTERNAL,
                            format!("attachment {key} reappeared while replacing it"),
                        ));
                    }
                }
            }
            BeginAdd::Created(att) => att,
        };
        failpoint!("add.ipam");

        let net = pod_network(&att);
        if let Err(e) = self.net.setup(net.clone()).await {
            self.undo_add(&att).await;
            return Err(kernel_err(e));
        }
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
        let ours = cni_result(&att, &net);
        let json = serde_json::to_string(&ours).expect("CNI results serialize");
        failpoint!("add.commit");
        if let Err(e) = self
            .ipam
            .finish_add(att.id, json)
            .instrument(phase!("store_commit"))
            .await
        {
            let _ = self.net.remove(att.host_ifname.clone()).await;
            self.undo_add(&att).await;
            return Err(store_err(e));
        }
        failpoint!("add.done");
        info!(attachment = %key, host_ifname = %att.host_ifname, addresses = ?att.addresses.iter().map(|a| a.address).collect::<Vec<_>>(), "pod attached");
        if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&att)) {
            w.pod_added(pod).instrument(phase!("wires")).await;
        }
        Ok(result::render(
            conf.version,
            &result::merge_prev(conf.prev_result.as_ref(), &ours),
        ))
    }

    async fn undo_add(&self, att: &Attachment) {
        if let Err(e) = self.ipam.remove(att.id).await {
            // The row stays in state `creating`; the next start rolls it back.
            warn!(attachment = %att.key, error = %e, "could not release the addresses of a failed ADD");
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
    pub async fn del(&self, args: &CniArgs) -> Result<(), CniError> {
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
        let Some(att) = begun.map_err(store_err)? else {
            return Ok(());
        };
        failpoint!("del.intent");
        if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&att)) {
            w.pod_removed(pod).instrument(phase!("wires")).await;
        }
        self.start_teardown(att).await;
        Ok(())
    }

    /// Cuts the pod off now and finishes its teardown in the background.
    async fn start_teardown(&self, att: Attachment) -> Option<tokio::task::JoinHandle<()>> {
        let ticket = self.teardowns.start(&att.key)?;
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
            if self.teardowns.pending(&att.key) {
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
            match self.net.repair(pod_network(&att)).await {
                Ok(kinds) => {
                    for kind in kinds {
                        warn!(attachment = %att.key, kind, "kernel state had drifted from the store: repaired");
                        *repaired.entry(kind).or_default() += 1;
                    }
                }
                Err(e) => warn!(attachment = %att.key, error = %e, "could not repair the pod's networking"),
            }
        }
        if self.sync_host_ports().await? {
            warn!("the host port table had drifted from the store and was rewritten");
            *repaired.entry("hostports").or_default() += 1;
        }
        Ok(repaired)
    }

    /// Makes the kernel's host port table match the store; returns whether it had
    /// drifted (and was rewritten).
    pub async fn sync_host_ports(&self) -> Result<bool, CniError> {
        let held = self.ipam.held_ports().await.map_err(store_err)?;
        let mut all = Entries::default();
        for h in held {
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
    pub async fn check(&self, args: &CniArgs) -> Result<(), CniError> {
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
                    code::UNKNOWN_CONTAINER,
                    format!("weft has no attachment {key}"),
                ));
            }
        };
        if att.netns != args.netns {
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!("attachment {key} was made in {}, CHECK names {}", att.netns, args.netns),
            ));
        }
        if let Some(prev) = &conf.prev_result {
            for a in &att.addresses {
                if !prev.ips.iter().any(|ip| ip.address.addr() == a.address) {
                    return Err(CniError::new(
                        code::CHECK_FAILED,
                        format!("prevResult does not list the pod's address {}", a.address),
                    ));
                }
            }
        }
        self.net
            .check(pod_network(&att))
            .instrument(phase!("check"))
            .await
            .map_err(kernel_err)
    }

    /// STATUS: can ADD be served for this config? Code 50 when every range of one of
    /// its address families is full.
    pub async fn status(&self, args: &CniArgs) -> Result<(), CniError> {
        let conf = NetworkConfig::parse(&args.stdin_data, Cmd::Status)?;
        let usage = self.ipam.usage_of(conf.ranges.clone()).await.map_err(store_err)?;
        for v6 in [false, true] {
            let fam: Vec<_> = usage.iter().filter(|u| u.range.addr().is_ipv6() == v6).collect();
            if !fam.is_empty() && fam.iter().all(|u| u.is_full()) {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
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
    pub async fn gc(&self, args: &CniArgs) -> Result<u32, CniError> {
        let conf = NetworkConfig::parse(&args.stdin_data, Cmd::Gc)?;
        let Some(valid) = conf.valid_attachments.as_ref() else {
            return Err(CniError::new(
                code::INVALID_CONFIG,
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
