//! The wire engine: makes the kernel and the data plane match what the topologies say
//! for the pods of this node.
//!
//! One task does all the work, level-triggered: whenever anything changes (a pod comes
//! or goes, the topology source moves, a peer node calls, a timer fires) it runs a pass
//! that compares, for every link of every local pod, the end that should exist with the
//! end the store records, and builds, re-points, sets down or removes ends until they
//! agree. Because only that task touches wires, two pods arriving at once cannot race;
//! who builds a shared piece is decided by name, never by timing:
//! - same node: the pod with the lower name builds the veth pair for both;
//! - VXLAN across nodes: the pod with the lower name proposes the VNI to the peer's
//!   node (`Ends`), which holds it (unique per node in the store) or refuses it; the
//!   proposer then tries the next one;
//! - gRPC across nodes: each side builds its own veth end, read through a packet
//!   socket; frames carry derived ids.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};
use weft_kernel::{KernelError, NetNs, packet, wire as kwire};
use weft_rpc::wire::wire_client::WireClient;
use weft_rpc::wire::{End, EndResult, EndsReply, EndsRequest, Hello};
use weft_store::{Store, StoreError, WireRecord};
use weft_telemetry::Metrics;
use weft_telemetry::metrics::WireLabels;
use weft_topology::{Link, LinkKind, Topology, TopologySource, TopologyStatus, WireEnd};

use crate::dataplane::DataPlane;
use crate::ids::{derived_mac, derived_vni, next_vni, parse_mac, wire_id};

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
}

/// A pod of this node, as the daemon attached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    /// Its network namespace path.
    pub netns: String,
    /// Its sandbox's container id.
    pub container_id: String,
}

type PodKey = (String, String);

/// The wire engine of one node (see the module documentation).
pub struct Engine {
    cfg: EngineConfig,
    source: Arc<dyn TopologySource>,
    store: Store,
    metrics: Arc<Metrics>,
    dataplane: Mutex<Option<Arc<DataPlane>>>,
    pods: Mutex<BTreeMap<PodKey, LocalPod>>,
    kick: Notify,
    requested: AtomicU64,
    done: watch::Sender<u64>,
    /// Set by a pass that left work waiting on a peer, so the next comes sooner.
    retry: AtomicBool,
    /// Whether the wire-state resource holds what the store says: false at start (the
    /// resource may predate a crash) and after a failed write, so the next pass writes
    /// it even when no end changed.
    mirrored: AtomicBool,
    /// Kernel counters of veth and VXLAN ends as last sampled (counters grow by the
    /// difference, so a re-created interface never makes them go back).
    sampled: Mutex<HashMap<u64, weft_kernel::LinkStats>>,
}

/// What a link needs from this node, given where its peer is.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    /// Peer on this node: a veth pair, built by `builder`.
    Veth { peer: LocalPod, builder: bool },
    /// Peer on another node.
    Remote { kind: LinkKind, node: IpAddr },
    /// Peer not up anywhere (or not yet known).
    Absent,
}

fn kerr(e: KernelError) -> String {
    e.to_string()
}

fn serr(e: StoreError) -> String {
    e.to_string()
}

/// Runs blocking kernel work off the async workers (it may enter pod namespaces).
async fn blocking<R: Send + 'static>(f: impl FnOnce() -> Result<R, String> + Send + 'static) -> Result<R, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("kernel task: {e}"))?
}

fn address(cidr: &str) -> Option<(IpAddr, u8)> {
    if cidr.is_empty() {
        return None;
    }
    let net: ipnet::IpNet = cidr.parse().ok()?;
    Some((net.addr(), net.prefix_len()))
}

fn mac_of(given: Option<&str>, namespace: &str, pod: &str, intf: &str) -> [u8; 6] {
    given
        .and_then(parse_mac)
        .unwrap_or_else(|| derived_mac(namespace, pod, intf))
}

fn key_of(t: &Topology) -> PodKey {
    (
        t.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        t.metadata.name.clone().unwrap_or_default(),
    )
}

/// Removes an end's interface from its pod (if the pod still exists).
fn remove_iface(netns: &str, intf: &str) -> Result<(), String> {
    let Ok(ns) = NetNs::open(Path::new(netns)) else {
        return Ok(());
    };
    let mut nl = kwire::socket_in(&ns).map_err(kerr)?;
    kwire::remove(&mut nl, intf).map_err(kerr)?;
    Ok(())
}

fn set_iface_state(netns: &str, intf: &str, up: bool) -> Result<bool, String> {
    let Ok(ns) = NetNs::open(Path::new(netns)) else {
        return Ok(false);
    };
    let mut nl = kwire::socket_in(&ns).map_err(kerr)?;
    kwire::set_state(&mut nl, intf, up).map_err(kerr)
}

fn iface_exists(netns: &str, intf: &str) -> bool {
    let Ok(ns) = NetNs::open(Path::new(netns)) else {
        return false;
    };
    let Ok(mut nl) = kwire::socket_in(&ns) else {
        return false;
    };
    matches!(kwire::find(&mut nl, intf), Ok(Some(_)))
}

impl Engine {
    /// Creates the engine, restores the pods and gRPC ends the store knows and starts the
    /// reconcile task (in the current Tokio runtime).
    pub async fn start(
        cfg: EngineConfig,
        source: Arc<dyn TopologySource>,
        store: Store,
        metrics: Arc<Metrics>,
        pods: BTreeMap<PodKey, LocalPod>,
    ) -> Arc<Engine> {
        let engine = Arc::new(Engine {
            cfg,
            source,
            store,
            metrics,
            dataplane: Mutex::new(None),
            pods: Mutex::new(pods),
            kick: Notify::new(),
            requested: AtomicU64::new(0),
            done: watch::channel(0).0,
            retry: AtomicBool::new(false),
            mirrored: AtomicBool::new(false),
            sampled: Mutex::default(),
        });
        engine.restore_grpc_ends().await;
        tokio::spawn(engine.clone().run());
        engine
    }

    /// This node's underlay address, once known.
    pub fn node_address(&self) -> Option<IpAddr> {
        self.cfg.node_address.or_else(|| self.source.node_address())
    }

    /// The data plane of gRPC wires (created once the node address is known).
    pub fn dataplane(&self) -> Option<Arc<DataPlane>> {
        let mut dp = self.dataplane.lock().expect("dataplane lock");
        if dp.is_none() {
            let local = self.node_address()?;
            *dp = Some(DataPlane::new(local, self.cfg.wire_port, self.metrics.clone()));
        }
        dp.clone()
    }

    /// Re-attaches every gRPC end the store holds to its veth pair (kept by the kernel
    /// while weftd was away) under the same wire id, so frames resume where they stopped.
    async fn restore_grpc_ends(&self) {
        let Ok(records) = self.store.run(|db| db.wires()).await else {
            return;
        };
        let Some(dp) = self.dataplane() else { return };
        for r in records.into_iter().filter(|r| r.kind == "grpc") {
            let Ok(peer) = r.peer_node.parse::<IpAddr>() else {
                continue;
            };
            let (netns, intf, id) = (r.netns.clone(), r.local_intf.clone(), r.id);
            let fd = blocking(move || {
                let ns = NetNs::open(Path::new(&netns)).map_err(kerr)?;
                let mut nl = kwire::socket_in(&ns).map_err(kerr)?;
                let Some((_, stats)) = kwire::stats(&mut nl, &intf).map_err(kerr)? else {
                    return Err("its pod end is gone".into());
                };
                Ok((packet::open(id).map_err(kerr)?, stats))
            })
            .await;
            match fd {
                Ok((fd, stats)) => {
                    // The worker counts in memory, which died with the last process; the
                    // pod end's kernel counters did not, so the wire's series continue from
                    // them instead of dropping to zero.
                    self.seed_counters(&r, &stats);
                    match dp.attach(r.id, r.peer_id, peer, fd, self.labels(&r), r.state == "up") {
                        Ok(()) => {
                            info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, "gRPC wire end re-attached")
                        }
                        Err(e) => warn!(wire = r.id, error = %e, "could not re-attach a gRPC wire end"),
                    }
                }
                Err(e) => debug!(wire = r.id, error = %e, "gRPC wire end not restored; the next pass rebuilds it"),
            }
        }
    }

    /// Starts a re-attached gRPC end's frame and byte counters at its pod end's kernel
    /// counters (rx: written into the pod, tx: sent by the pod).
    fn seed_counters(&self, r: &WireRecord, st: &weft_kernel::LinkStats) {
        let labels = self.labels(r);
        for (direction, frames, bytes) in [("rx", st.rx_packets, st.rx_bytes), ("tx", st.tx_packets, st.tx_bytes)] {
            let l = weft_telemetry::metrics::WireDirLabels {
                wire: labels.clone(),
                direction,
            };
            self.metrics.wire_frames.get_or_create(&l).inc_by(frames);
            self.metrics.wire_bytes.get_or_create(&l).inc_by(bytes);
        }
    }

    fn labels(&self, r: &WireRecord) -> WireLabels {
        WireLabels {
            namespace: r.namespace.clone(),
            link_uid: r.link_uid.to_string(),
            pod: r.local_pod.clone(),
            intf: r.local_intf.clone(),
            peer_node: r.peer_node.clone(),
            kind: r.kind.clone(),
        }
    }

    /// A pod of this node was attached: wires it and waits for the pass that did it.
    pub async fn pod_added(&self, namespace: &str, name: &str, pod: LocalPod) {
        self.pods
            .lock()
            .expect("pods lock")
            .insert((namespace.into(), name.into()), pod);
        self.pass_and_wait().await;
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
        self.pass_and_wait().await;
    }

    /// Asks for a pass and waits until one that started after the request is done.
    pub async fn pass_and_wait(&self) {
        let want = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.kick.notify_one();
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(15), done.wait_for(|d| *d >= want)).await;
    }

    /// Brings the per-wire counters of kernel-carried ends (veth, VXLAN) up to date from
    /// their interfaces' counters; gRPC ends count in their workers. Called before
    /// each scrape.
    pub async fn sample_counters(&self) {
        let Ok(records) = self.store.run(|db| db.wires()).await else {
            return;
        };
        let kernel: Vec<WireRecord> = records.into_iter().filter(|r| r.kind != "grpc").collect();
        let Ok(stats) = interface_stats(&kernel).await else {
            return;
        };
        let mut sampled = self.sampled.lock().expect("sampled lock");
        for r in &kernel {
            let Some(now) = stats.get(&r.id) else { continue };
            let was = sampled.get(&r.id).copied().unwrap_or_default();
            let labels = self.labels(r);
            let grow = |a: u64, b: u64| if a >= b { a - b } else { a };
            for (dir, frames, bytes, drops) in [
                (
                    "rx",
                    grow(now.rx_packets, was.rx_packets),
                    grow(now.rx_bytes, was.rx_bytes),
                    grow(now.rx_dropped, was.rx_dropped),
                ),
                (
                    "tx",
                    grow(now.tx_packets, was.tx_packets),
                    grow(now.tx_bytes, was.tx_bytes),
                    grow(now.tx_dropped, was.tx_dropped),
                ),
            ] {
                let l = weft_telemetry::metrics::WireDirLabels {
                    wire: labels.clone(),
                    direction: dir,
                };
                self.metrics.wire_frames.get_or_create(&l).inc_by(frames);
                self.metrics.wire_bytes.get_or_create(&l).inc_by(bytes);
                if drops > 0 {
                    let reason = if dir == "rx" { "kernel_rx" } else { "kernel_tx" };
                    let d = weft_telemetry::metrics::WireDropLabels {
                        wire: labels.clone(),
                        reason,
                    };
                    self.metrics.wire_drops.get_or_create(&d).inc_by(drops);
                }
            }
            sampled.insert(r.id, *now);
        }
        sampled.retain(|id, _| stats.contains_key(id));
    }

    /// The wire ends this node holds.
    pub async fn wires(&self) -> Result<Vec<WireRecord>, StoreError> {
        self.store.run(|db| db.wires()).await
    }

    /// The wire ends this node holds, each with its interface's kernel counters (read
    /// now; `None` when the interface cannot be read). The kernel keeps them across
    /// daemon restarts, gRPC ends' pairs included, so they never start again from zero.
    pub async fn report(&self) -> Result<Vec<(WireRecord, Option<weft_kernel::LinkStats>)>, StoreError> {
        let records = self.wires().await?;
        let mut stats = interface_stats(&records).await.unwrap_or_default();
        Ok(records
            .into_iter()
            .map(|r| {
                let st = stats.remove(&r.id);
                (r, st)
            })
            .collect())
    }

    async fn run(self: Arc<Self>) {
        let mut changes = self.source.changes();
        loop {
            let want = self.requested.load(Ordering::Acquire);
            self.retry.store(false, Ordering::Relaxed);
            if let Err(e) = self.pass().await {
                warn!(error = %e, "wire pass failed; retrying");
                self.retry.store(true, Ordering::Relaxed);
            }
            self.done.send_modify(|d| *d = (*d).max(want));
            let wait = if self.retry.load(Ordering::Relaxed) {
                Duration::from_millis(500)
            } else {
                self.cfg.resync
            };
            tokio::select! {
                _ = self.kick.notified() => {}
                r = changes.changed() => if r.is_err() { tokio::time::sleep(wait).await },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One pass over every link of every local pod.
    async fn pass(&self) -> Result<(), String> {
        let Some(me) = self.node_address() else {
            debug!("node address not known yet; wires wait");
            self.retry.store(true, Ordering::Relaxed);
            return Ok(());
        };
        // A pod whose namespace is gone is being collected by the daemon; its ends went
        // with the namespace and its records go as stale below.
        let pods: BTreeMap<PodKey, LocalPod> = self
            .pods
            .lock()
            .expect("pods lock")
            .clone()
            .into_iter()
            .filter(|(_, p)| Path::new(&p.netns).exists())
            .collect();
        let mut records: HashMap<u64, WireRecord> = self
            .store
            .run(|db| db.wires())
            .await
            .map_err(serr)?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let before: BTreeSet<_> = records
            .values()
            .map(|r| (r.id, r.state.clone(), r.peer_node.clone()))
            .collect();

        // Where this node's pods run: written for the other nodes to read.
        for ((ns, name), pod) in &pods {
            let Some(t) = self.source.topology(ns, name) else {
                continue;
            };
            let want = TopologyStatus {
                src_ip: me.to_string(),
                net_ns: pod.netns.clone(),
                container_id: pod.container_id.clone(),
                skipped: t.status.as_ref().map(|s| s.skipped.clone()).unwrap_or_default(),
            };
            if t.status.as_ref() != Some(&want)
                && let Err(e) = self.source.set_status(ns, name, want).await
            {
                warn!(pod = %format!("{ns}/{name}"), error = %e, "could not publish the pod's status");
                self.retry.store(true, Ordering::Relaxed);
            }
        }

        let mut wanted: BTreeSet<u64> = BTreeSet::new();
        for ((ns, name), pod) in &pods {
            let Some(t) = self.source.topology(ns, name) else {
                continue;
            };
            for link in &t.spec.links {
                let id = wire_id(ns, link.uid, name);
                let want = self.want(me, ns, name, link, &pods);
                if let Want::Veth { builder: false, .. } = want {
                    // The other pod's pass builds the pair and writes both records.
                    wanted.insert(id);
                    continue;
                }
                wanted.insert(id);
                if let Want::Veth { builder: true, .. } = want {
                    wanted.insert(wire_id(ns, link.uid, &link.peer_pod));
                }
                if let Err(e) = self.reconcile_link(me, ns, name, pod, link, want, &mut records).await {
                    warn!(pod = %format!("{ns}/{name}"), intf = %link.local_intf, link = link.uid, error = %e, "wire not ready; retrying");
                    self.retry.store(true, Ordering::Relaxed);
                }
            }
        }

        // Ends nothing asks for any more: their pod left or the link was removed.
        let stale: Vec<WireRecord> = records.values().filter(|r| !wanted.contains(&r.id)).cloned().collect();
        for r in stale {
            self.teardown(&r, true).await;
            records.remove(&r.id);
        }

        let after: BTreeSet<_> = records
            .values()
            .map(|r| (r.id, r.state.clone(), r.peer_node.clone()))
            .collect();
        if before != after || !self.mirrored.swap(true, Ordering::AcqRel) {
            let ends = records.values().map(wire_end).collect();
            if let Err(e) = self.source.set_wire_state(ends).await {
                debug!(error = %e, "could not mirror the wire state");
                self.mirrored.store(false, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Decides what a link needs from where its peer is.
    fn want(&self, me: IpAddr, ns: &str, pod: &str, link: &Link, pods: &BTreeMap<PodKey, LocalPod>) -> Want {
        let peer_key = (ns.to_string(), link.peer_pod.clone());
        if let Some(peer) = pods.get(&peer_key) {
            // The peer builds when it lists the link too and its name is lower.
            let peer_lists = self
                .source
                .topology(ns, &link.peer_pod)
                .is_some_and(|t| t.spec.links.iter().any(|l| l.uid == link.uid));
            let builder = !peer_lists || pod < link.peer_pod.as_str();
            return Want::Veth {
                peer: peer.clone(),
                builder,
            };
        }
        let Some(peer_t) = self.source.topology(ns, &link.peer_pod) else {
            return Want::Absent;
        };
        let Some(st) = peer_t.status.as_ref().filter(|s| s.alive()) else {
            return Want::Absent;
        };
        let Ok(node) = st.src_ip.parse::<IpAddr>() else {
            return Want::Absent;
        };
        if node == me {
            // Says it runs here but this daemon has not attached it (yet, or any more).
            return Want::Absent;
        }
        let kind = match link.kind {
            Some(LinkKind::Vxlan) => LinkKind::Vxlan,
            Some(LinkKind::Grpc) => LinkKind::Grpc,
            _ => self.cfg.default_kind,
        };
        Want::Remote { kind, node }
    }

    fn record(&self, ns: &str, pod: &str, p: &LocalPod, link: &Link, kind: LinkKind, peer_node: String) -> WireRecord {
        WireRecord {
            id: wire_id(ns, link.uid, pod),
            namespace: ns.into(),
            link_uid: link.uid,
            local_pod: pod.into(),
            local_intf: link.local_intf.clone(),
            peer_pod: link.peer_pod.clone(),
            peer_intf: link.peer_intf.clone(),
            peer_id: wire_id(ns, link.uid, &link.peer_pod),
            kind: kind.as_str().into(),
            peer_node,
            vni: None,
            netns: p.netns.clone(),
            state: "up".into(),
        }
    }

    async fn put(&self, r: WireRecord, records: &mut HashMap<u64, WireRecord>) -> Result<(), String> {
        let stored = r.clone();
        self.store.run(move |db| db.put_wire(&stored)).await.map_err(serr)?;
        let labels = self.labels(&r);
        // Re-pointed (another peer node, kind or interface): the old series end here.
        if let Some(old) = records.get(&r.id).map(|o| self.labels(o))
            && old != labels
        {
            self.metrics.remove_wire(&old);
        }
        self.metrics
            .wire_up
            .get_or_create(&labels)
            .set(i64::from(r.state == "up"));
        records.insert(r.id, r);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn reconcile_link(
        &self,
        me: IpAddr,
        ns: &str,
        name: &str,
        pod: &LocalPod,
        link: &Link,
        want: Want,
        records: &mut HashMap<u64, WireRecord>,
    ) -> Result<(), String> {
        let id = wire_id(ns, link.uid, name);
        let peer_id = wire_id(ns, link.uid, &link.peer_pod);
        let rec = records.get(&id).cloned();
        match want {
            Want::Veth { builder: false, .. } => Ok(()),
            Want::Veth { peer, builder: true } => {
                let peer_rec = records.get(&peer_id).cloned();
                let intact = rec.as_ref().is_some_and(|r| r.kind == "veth" && r.netns == pod.netns)
                    && peer_rec
                        .as_ref()
                        .is_some_and(|r| r.kind == "veth" && r.netns == peer.netns)
                    && {
                        let (a, ai, b, bi) = (
                            pod.netns.clone(),
                            link.local_intf.clone(),
                            peer.netns.clone(),
                            link.peer_intf.clone(),
                        );
                        blocking(move || Ok(iface_exists(&a, &ai) && iface_exists(&b, &bi))).await?
                    };
                if intact {
                    return Ok(());
                }
                for r in [rec, peer_rec].into_iter().flatten() {
                    self.teardown(&r, false).await;
                    records.remove(&r.id);
                }
                let a_mac = mac_of(link.local_mac.as_deref(), ns, name, &link.local_intf);
                let b_mac = mac_of(link.peer_mac.as_deref(), ns, &link.peer_pod, &link.peer_intf);
                let (a, b) = (pod.netns.clone(), peer.netns.clone());
                let (ai, bi) = (link.local_intf.clone(), link.peer_intf.clone());
                let (a_ip, b_ip) = (address(&link.local_ip), address(&link.peer_ip));
                let mtu = self.cfg.mtu;
                blocking(move || {
                    let _ = remove_iface(&a, &ai);
                    let _ = remove_iface(&b, &bi);
                    let ans = NetNs::open(Path::new(&a)).map_err(kerr)?;
                    let bns = NetNs::open(Path::new(&b)).map_err(kerr)?;
                    kwire::veth_between(&ans, &ai, a_mac, &bns, &bi, b_mac, mtu).map_err(kerr)?;
                    kwire::configure(&mut kwire::socket_in(&ans).map_err(kerr)?, &ai, a_mac, mtu, a_ip, true)
                        .map_err(kerr)?;
                    kwire::configure(&mut kwire::socket_in(&bns).map_err(kerr)?, &bi, b_mac, mtu, b_ip, true)
                        .map_err(kerr)?;
                    Ok(())
                })
                .await?;
                let ours = self.record(ns, name, pod, link, LinkKind::Veth, String::new());
                let theirs = WireRecord {
                    id: peer_id,
                    local_pod: link.peer_pod.clone(),
                    local_intf: link.peer_intf.clone(),
                    peer_pod: name.into(),
                    peer_intf: link.local_intf.clone(),
                    peer_id: id,
                    netns: peer.netns.clone(),
                    ..ours.clone()
                };
                self.put(ours, records).await?;
                self.put(theirs, records).await?;
                info!(namespace = ns, link = link.uid, a = %format!("{name}:{}", link.local_intf), b = %format!("{}:{}", link.peer_pod, link.peer_intf), "veth wire built");
                Ok(())
            }
            Want::Absent => {
                let Some(mut r) = rec else { return Ok(()) };
                if r.kind == "veth" {
                    // A pair dies with either pod; nothing of it is left to keep.
                    self.teardown(&r, false).await;
                    records.remove(&r.id);
                    return Ok(());
                }
                if r.state != "down" {
                    let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                    blocking(move || set_iface_state(&netns, &intf, false)).await?;
                    if let Some(dp) = self.dataplane() {
                        dp.set_up(r.id, false);
                    }
                    r.state = "down".into();
                    info!(wire = r.id, pod = %name, intf = %r.local_intf, "peer gone: wire end down");
                    self.put(r, records).await?;
                }
                Ok(())
            }
            Want::Remote {
                kind: LinkKind::Grpc,
                node,
            } => {
                let dp = self.dataplane().ok_or("node address unknown")?;
                let ok = rec.as_ref().is_some_and(|r| {
                    r.kind == "grpc" && r.netns == pod.netns && r.peer_node == node.to_string() && dp.attached(r.id)
                });
                if ok {
                    let mut r = rec.expect("checked");
                    if r.state != "up" {
                        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                        blocking(move || set_iface_state(&netns, &intf, true)).await?;
                        dp.set_up(r.id, true);
                        r.state = "up".into();
                        self.put(r, records).await?;
                    }
                    return Ok(());
                }
                if let Some(r) = &rec {
                    dp.detach(r.id);
                    if r.kind != "grpc" || r.netns != pod.netns {
                        self.teardown(r, false).await;
                    }
                }
                let mac = mac_of(link.local_mac.as_deref(), ns, name, &link.local_intf);
                let (netns, intf, ip, mtu) = (
                    pod.netns.clone(),
                    link.local_intf.clone(),
                    address(&link.local_ip),
                    self.cfg.mtu,
                );
                let fd = blocking(move || {
                    let ns = NetNs::open(Path::new(&netns)).map_err(kerr)?;
                    let mut nl = kwire::socket_in(&ns).map_err(kerr)?;
                    let pod_end = kwire::find(&mut nl, &intf).map_err(kerr)?.is_some();
                    // A pair left by an earlier pass is taken over; anything else under
                    // either name (half a pair, a TAP of an older weft) is replaced.
                    if !(pod_end && packet::exists(id).map_err(kerr)?) {
                        if pod_end {
                            kwire::remove(&mut nl, &intf).map_err(kerr)?;
                        }
                        packet::remove(id).map_err(kerr)?;
                        packet::create(&ns, &intf, mac, mtu, id).map_err(kerr)?;
                    }
                    kwire::configure(&mut nl, &intf, mac, mtu, ip, true).map_err(kerr)?;
                    packet::open(id).map_err(kerr)
                })
                .await?;
                let r = self.record(ns, name, pod, link, LinkKind::Grpc, node.to_string());
                dp.attach(id, peer_id, node, fd, self.labels(&r), true)?;
                self.put(r, records).await?;
                // Lets the peer's node know at once rather than at its next pass.
                let _ = self
                    .call_ends(node, vec![self.end_of(ns, name, link, LinkKind::Grpc, 0, true)])
                    .await;
                info!(wire = id, pod = %name, intf = %link.local_intf, peer = %node, "gRPC wire end built");
                Ok(())
            }
            Want::Remote { kind: _, node } => self.reconcile_vxlan(me, ns, name, pod, link, node, rec, records).await,
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn reconcile_vxlan(
        &self,
        me: IpAddr,
        ns: &str,
        name: &str,
        pod: &LocalPod,
        link: &Link,
        node: IpAddr,
        rec: Option<WireRecord>,
        records: &mut HashMap<u64, WireRecord>,
    ) -> Result<(), String> {
        let id = wire_id(ns, link.uid, name);
        let peer_mac = mac_of(link.peer_mac.as_deref(), ns, &link.peer_pod, &link.peer_intf);
        let peer_ip = address(&link.peer_ip).map(|(a, _)| a);
        // Already built and pointing at the right node?
        if let Some(r) = rec
            .as_ref()
            .filter(|r| r.kind == "vxlan" && r.netns == pod.netns && r.vni.is_some() && r.peer_node == node.to_string())
        {
            let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
            let fdb = blocking(move || {
                let ns = NetNs::open(Path::new(&netns)).map_err(kerr)?;
                kwire::vxlan_fdb(&mut kwire::socket_in(&ns).map_err(kerr)?, &intf).map_err(kerr)
            })
            .await?;
            if let Some(fdb) = fdb.filter(|_| r.state == "up") {
                if fdb.contains(&([0; 6], node)) && fdb.contains(&(peer_mac, node)) {
                    return Ok(());
                }
                // The end is there but someone removed or changed its unicast entries
                // (the record says where they point): put them back in place rather
                // than rebuilding the end under the pod.
                let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
                blocking(move || {
                    let ns = NetNs::open(Path::new(&netns)).map_err(kerr)?;
                    let mut nl = kwire::socket_in(&ns).map_err(kerr)?;
                    kwire::point_vxlan(&mut nl, &intf, node, peer_mac, peer_ip).map_err(kerr)
                })
                .await?;
                self.metrics
                    .reconcile_repairs
                    .get_or_create(&weft_telemetry::metrics::RepairLabels { kind: "fdb" })
                    .inc();
                warn!(wire = id, pod = %name, intf = %link.local_intf, peer = %node, "VXLAN FDB entries had drifted and were restored");
                return Ok(());
            }
        }
        let proposer = name < link.peer_pod.as_str();
        let vni = if proposer {
            let mut vni = rec
                .as_ref()
                .and_then(|r| r.vni)
                .unwrap_or_else(|| derived_vni(ns, link.uid));
            let mut agreed = None;
            for _ in 0..64 {
                let holder = self.store.run(move |db| db.vni_holder(vni)).await.map_err(serr)?;
                if holder.is_some_and(|h| h != id) {
                    vni = next_vni(vni);
                    continue;
                }
                let end = self.end_of(ns, name, link, LinkKind::Vxlan, vni, true);
                let reply = self.call_ends(node, vec![end]).await?;
                match reply.first() {
                    Some(EndResult { accepted: true, .. }) => {
                        agreed = Some(vni);
                        break;
                    }
                    Some(EndResult { reason, .. }) => {
                        debug!(vni, reason = %reason, "peer refused the VNI; trying the next");
                        vni = next_vni(vni);
                    }
                    None => return Err("peer answered no result".into()),
                }
            }
            agreed.ok_or("no VNI both nodes have free")?
        } else {
            // The proposer's `Ends` call stores the agreed VNI in our record.
            match rec
                .as_ref()
                .filter(|r| r.kind == "vxlan" && r.peer_node == node.to_string())
                .and_then(|r| r.vni)
            {
                Some(v) => v,
                None => {
                    debug!(pod = %name, intf = %link.local_intf, "waiting for the peer node to propose a VNI");
                    return Ok(());
                }
            }
        };
        if let Some(r) = &rec
            && (r.kind != "vxlan" || r.netns != pod.netns || r.vni != Some(vni))
        {
            self.teardown(r, false).await;
        }
        let mac = mac_of(link.local_mac.as_deref(), ns, name, &link.local_intf);
        let overhead = if me.is_ipv6() { 70 } else { 50 };
        let mtu = self.cfg.mtu.saturating_sub(overhead);
        let (netns, intf, ip) = (pod.netns.clone(), link.local_intf.clone(), address(&link.local_ip));
        blocking(move || {
            let ns = NetNs::open(Path::new(&netns)).map_err(kerr)?;
            let mut nl = kwire::socket_in(&ns).map_err(kerr)?;
            let same = kwire::find(&mut nl, &intf).map_err(kerr)?.is_some()
                && kwire::vxlan_vtep(&mut nl, &intf).map_err(kerr)?.is_some();
            if !same {
                kwire::remove(&mut nl, &intf).map_err(kerr)?;
                kwire::vxlan_into(&ns, &intf, mac, vni, me, mtu).map_err(kerr)?;
            }
            kwire::configure(&mut nl, &intf, mac, mtu, ip, true).map_err(kerr)?;
            kwire::point_vxlan(&mut nl, &intf, node, peer_mac, peer_ip).map_err(kerr)?;
            Ok(())
        })
        .await?;
        let mut r = self.record(ns, name, pod, link, LinkKind::Vxlan, node.to_string());
        r.vni = Some(vni);
        self.put(r, records).await?;
        info!(wire = id, pod = %name, intf = %link.local_intf, vni, peer = %node, "VXLAN wire end built");
        Ok(())
    }

    fn end_of(&self, ns: &str, pod: &str, link: &Link, kind: LinkKind, vni: u32, present: bool) -> End {
        End {
            namespace: ns.into(),
            link_uid: link.uid,
            pod: pod.into(),
            peer_pod: link.peer_pod.clone(),
            kind: kind.as_str().into(),
            vni,
            present,
            wire_id: wire_id(ns, link.uid, pod),
        }
    }

    /// Calls the `Ends` RPC of the node at `node`.
    async fn call_ends(&self, node: IpAddr, ends: Vec<End>) -> Result<Vec<EndResult>, String> {
        let me = self.node_address().ok_or("node address unknown")?;
        let url = format!("http://{}", SocketAddr::new(node, self.cfg.wire_port));
        let channel = tonic::transport::Endpoint::from_shared(url)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(3))
            .connect()
            .await
            .map_err(|e| format!("connecting to {node}: {e}"))?;
        let req = EndsRequest {
            from: Some(Hello {
                node: self.cfg.node_name.clone(),
                address: me.to_string(),
            }),
            ends,
        };
        let reply = WireClient::new(channel)
            .ends(req)
            .await
            .map_err(|e| format!("Ends on {node}: {}", e.message()))?;
        Ok(reply.into_inner().results)
    }

    /// Removes an end: its interface, its worker, its record; tells a remote peer.
    async fn teardown(&self, r: &WireRecord, tell_peer: bool) {
        if let Some(dp) = self.dataplane() {
            dp.detach(r.id);
        }
        let (netns, intf) = (r.netns.clone(), r.local_intf.clone());
        if let Err(e) = blocking(move || remove_iface(&netns, &intf)).await {
            warn!(wire = r.id, error = %e, "could not remove a wire end's interface");
        }
        let id = r.id;
        if let Err(e) = self.store.run(move |db| db.remove_wire(id)).await {
            warn!(wire = r.id, error = %e, "could not forget a wire end");
        }
        self.metrics.remove_wire(&self.labels(r));
        info!(wire = r.id, pod = %r.local_pod, intf = %r.local_intf, kind = %r.kind, "wire end removed");
        if tell_peer && let Ok(node) = r.peer_node.parse::<IpAddr>() {
            let end = End {
                namespace: r.namespace.clone(),
                link_uid: r.link_uid,
                pod: r.local_pod.clone(),
                peer_pod: r.peer_pod.clone(),
                kind: r.kind.clone(),
                vni: 0,
                present: false,
                wire_id: r.id,
            };
            if let Err(e) = self.call_ends(node, vec![end]).await {
                debug!(wire = r.id, error = %e, "could not tell the peer node; it sees the pod's status instead");
            }
        }
    }

    /// Serves a peer node's `Ends` call (see `service`): VNI offers are held in the store
    /// (refused when the VNI is taken here), removals set the end down; the pass that
    /// follows does the kernel work.
    pub async fn ends(&self, req: EndsRequest) -> EndsReply {
        let from = req.from.unwrap_or_default();
        let mut results = Vec::with_capacity(req.ends.len());
        for end in req.ends {
            results.push(self.one_end(&from, end).await);
        }
        self.kick.notify_one();
        EndsReply { results }
    }

    async fn one_end(&self, from: &Hello, end: End) -> EndResult {
        let refuse = |reason: String| EndResult {
            accepted: false,
            reason,
        };
        let key = (end.namespace.clone(), end.peer_pod.clone());
        let Some(pod) = self.pods.lock().expect("pods lock").get(&key).cloned() else {
            return refuse(format!("pod {}/{} is not on this node", end.namespace, end.peer_pod));
        };
        let id = wire_id(&end.namespace, end.link_uid, &end.peer_pod);
        if !end.present {
            if let Some(dp) = self.dataplane() {
                dp.set_up(id, false);
            }
            let (store, netns) = (self.store.clone(), pod.netns.clone());
            let rec = store.run(move |db| db.wire(id)).await.ok().flatten();
            if let Some(mut r) = rec.filter(|r| r.kind != "veth") {
                let intf = r.local_intf.clone();
                let _ = blocking(move || set_iface_state(&netns, &intf, false)).await;
                r.state = "down".into();
                let _ = self.store.run(move |db| db.put_wire(&r)).await;
            }
            return EndResult {
                accepted: true,
                reason: String::new(),
            };
        }
        if end.kind != "vxlan" {
            return EndResult {
                accepted: true,
                reason: String::new(),
            };
        }
        let Some(link) = self
            .source
            .topology(&end.namespace, &end.peer_pod)
            .and_then(|t| t.spec.links.iter().find(|l| l.uid == end.link_uid).cloned())
        else {
            return refuse(format!("pod {} has no link {}", end.peer_pod, end.link_uid));
        };
        let mut r = self.record(
            &end.namespace,
            &end.peer_pod,
            &pod,
            &link,
            LinkKind::Vxlan,
            from.address.clone(),
        );
        r.vni = Some(end.vni);
        r.state = "pending".into();
        // Keep a built end's record as is when the offer matches it (a repeated call).
        let existing = self.store.run(move |db| db.wire(id)).await.ok().flatten();
        if existing
            .as_ref()
            .is_some_and(|e| e.vni == Some(end.vni) && e.peer_node == from.address && e.netns == pod.netns)
        {
            return EndResult {
                accepted: true,
                reason: String::new(),
            };
        }
        if let Some(e) = existing.filter(|e| e.kind == "vxlan") {
            // Re-pointed or re-numbered: the pass rebuilds it from the new record.
            r.state = if e.state == "up" { "pending".into() } else { e.state };
        }
        match self.store.run(move |db| db.put_wire(&r)).await {
            Ok(()) => EndResult {
                accepted: true,
                reason: String::new(),
            },
            Err(StoreError::VniTaken { vni, .. }) => refuse(format!("VNI {vni} is taken on this node")),
            Err(e) => refuse(e.to_string()),
        }
    }

    /// Whether `addr` is a node some pod of the topologies runs on (the wire service
    /// talks to no one else).
    pub fn known_node(&self, addr: IpAddr) -> bool {
        self.source
            .topologies()
            .iter()
            .filter_map(|t| t.status.as_ref())
            .any(|s| s.src_ip.parse::<IpAddr>().ok() == Some(addr))
    }

    /// Whether every local pod's topology is readable (used by readiness).
    pub fn ready(&self) -> bool {
        self.source.ready()
    }

    /// Pods of this node with a topology.
    pub fn wired_pods(&self) -> Vec<PodKey> {
        let pods = self.pods.lock().expect("pods lock").clone();
        pods.into_keys()
            .filter(|(ns, n)| self.source.topology(ns, n).is_some())
            .collect()
    }

    /// Keys of the topologies (for diagnostics).
    pub fn topology_keys(&self) -> Vec<PodKey> {
        self.source.topologies().iter().map(|t| key_of(t)).collect()
    }
}

/// Reads the kernel counters of the interfaces of `ends` (those that can be found).
async fn interface_stats(ends: &[WireRecord]) -> Result<HashMap<u64, weft_kernel::LinkStats>, String> {
    let ends: Vec<(u64, String, String)> = ends
        .iter()
        .map(|r| (r.id, r.netns.clone(), r.local_intf.clone()))
        .collect();
    blocking(move || {
        Ok(ends
            .into_iter()
            .filter_map(|(id, netns, intf)| {
                let ns = NetNs::open(Path::new(&netns)).ok()?;
                let mut nl = kwire::socket_in(&ns).ok()?;
                let (_, st) = kwire::stats(&mut nl, &intf).ok()??;
                Some((id, st))
            })
            .collect())
    })
    .await
}

fn wire_end(r: &WireRecord) -> WireEnd {
    WireEnd {
        namespace: r.namespace.clone(),
        link_uid: r.link_uid,
        local_pod: r.local_pod.clone(),
        local_intf: r.local_intf.clone(),
        peer_pod: r.peer_pod.clone(),
        peer_intf: r.peer_intf.clone(),
        peer_node: r.peer_node.clone(),
        kind: match r.kind.as_str() {
            "vxlan" => LinkKind::Vxlan,
            "grpc" => LinkKind::Grpc,
            _ => LinkKind::Veth,
        },
        local_id: r.id,
        peer_id: r.peer_id,
        state: r.state.clone(),
    }
}
