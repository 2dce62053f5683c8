//! The engine's seams in memory: a kernel per node holding pods' interfaces, a data
//! plane that only remembers which gRPC ends have workers, and peers that call the
//! other engines of the test in-process (optionally refusing VNIs or being down).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use futures::future::BoxFuture;
use weft_kernel::wire::{Emulated, FdbEntry};
use weft_kernel::{KernelError, LinkStats};
use weft_link::{Impairment, LinkKind};
use weft_rpc::wire::{EndResult, EndsRequest};
use weft_wires::{EndSpec, Engine, GrpcEnd, GrpcPlane, PeerError, Peers, VxlanPeer, WireError, WireKernel};

/// What kind of interface a fake one is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// One end of a veth pair; the other end is (netns, intf).
    Veth { peer: (String, String) },
    /// A VXLAN end.
    Vxlan { vni: u32, local: IpAddr },
    /// The pod end of a gRPC end's pair.
    Packet { id: u64 },
}

/// One interface in a fake pod.
#[derive(Debug, Clone)]
pub struct Iface {
    pub kind: Kind,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub up: bool,
    pub address: Option<(IpAddr, u8)>,
    pub fdb: Vec<FdbEntry>,
    pub stats: LinkStats,
    /// The emulation on what it sends (empty: none).
    pub impairment: Impairment,
    /// Its carrier is dropped by protodown (VXLAN ends).
    pub proto_down: bool,
}

#[derive(Default)]
struct State {
    pods: BTreeSet<String>,
    /// How many pods' namespaces went (the fake's namespace epoch).
    removals: u64,
    /// How many namespace paths the engine asked about, all asks together.
    asked: usize,
    ifaces: BTreeMap<(String, String), Iface>,
    /// Node ends of gRPC pairs, by wire id.
    node_ends: BTreeSet<u64>,
    /// Every creating procedure run, as "veth <netns>/<intf>", "vxlan …", "packet …".
    created: Vec<String>,
    /// Node ends of gRPC pairs set down.
    node_ends_down: BTreeSet<u64>,
    /// Every emulation procedure run, as "netem <netns>/<intf> <impairment>",
    /// "protodown …", "node-end <id> up|down", "admin <netns>/<intf> up|down".
    emulation: Vec<String>,
    /// Whether the kernel lacks netem (only a rate can be set with a qdisc).
    no_netem: bool,
    /// Link detours by wire id: the end's namespace and interface.
    detours: BTreeMap<u64, (String, String)>,
    /// Every presence check, as "<netns>/<intf>".
    checked: Vec<String>,
}

/// A node's kernel in memory.
#[derive(Default)]
pub struct FakeKernel {
    state: Mutex<State>,
}

fn enoent(what: &str) -> KernelError {
    KernelError::os(format!("fake: {what}"), std::io::Error::from_raw_os_error(libc::ENOENT))
}

impl State {
    fn remove(&mut self, netns: &str, intf: &str) -> bool {
        let Some(i) = self.ifaces.remove(&(netns.to_string(), intf.to_string())) else {
            return false;
        };
        match i.kind {
            // A veth end never outlives its peer.
            Kind::Veth { peer } => {
                self.ifaces.remove(&peer);
            }
            Kind::Packet { id } => {
                self.node_ends.remove(&id);
            }
            Kind::Vxlan { .. } => {}
        }
        true
    }

    fn pod(&self, netns: &str) -> Result<(), KernelError> {
        if self.pods.contains(netns) {
            Ok(())
        } else {
            Err(enoent(netns))
        }
    }

    fn put(&mut self, end: &EndSpec, kind: Kind) {
        self.ifaces.insert(
            (end.netns.clone(), end.intf.clone()),
            Iface {
                kind,
                mac: end.mac,
                mtu: end.mtu,
                up: true,
                address: end.address,
                fdb: Vec::new(),
                stats: LinkStats::default(),
                impairment: Impairment::default(),
                proto_down: false,
            },
        );
    }

    fn point(&mut self, netns: &str, intf: &str, peer: &VxlanPeer) -> Result<(), KernelError> {
        let i = self
            .ifaces
            .get_mut(&(netns.to_string(), intf.to_string()))
            .ok_or_else(|| enoent(intf))?;
        for mac in [[0; 6], peer.mac] {
            i.fdb.retain(|(m, _)| *m != mac);
            i.fdb.push((mac, peer.vtep));
        }
        Ok(())
    }
}

impl FakeKernel {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake kernel lock")
    }

    /// A pod's namespace appears.
    pub fn add_pod(&self, netns: &str) {
        self.state().pods.insert(netns.into());
    }

    /// A pod's namespace goes, with every interface in it (and the veth peers of those).
    pub fn remove_pod(&self, netns: &str) {
        let mut s = self.state();
        s.pods.remove(netns);
        s.removals += 1;
        let gone: Vec<String> = s
            .ifaces
            .keys()
            .filter(|(n, _)| n == netns)
            .map(|(_, i)| i.clone())
            .collect();
        for intf in gone {
            s.remove(netns, &intf);
        }
        // A detour's pair goes with the pod's side of it.
        s.detours.retain(|_, (n, _)| n != netns);
    }

    /// From now on the kernel has no netem, as some kernels are built.
    pub fn without_netem(&self) {
        self.state().no_netem = true;
    }

    /// Where end `id`'s link detour is, if it has one.
    pub fn detour_of(&self, id: u64) -> Option<(String, String)> {
        self.state().detours.get(&id).cloned()
    }

    /// Leaves a link detour behind, as a run that ended would.
    pub fn leave_detour(&self, id: u64, netns: &str, intf: &str) {
        self.state().detours.insert(id, (netns.into(), intf.into()));
    }

    /// An interface, if there.
    pub fn iface(&self, netns: &str, intf: &str) -> Option<Iface> {
        self.state().ifaces.get(&(netns.to_string(), intf.to_string())).cloned()
    }

    /// Every interface of a pod, by name.
    pub fn ifaces_of(&self, netns: &str) -> BTreeMap<String, Iface> {
        self.state()
            .ifaces
            .iter()
            .filter(|((n, _), _)| n == netns)
            .map(|((_, i), f)| (i.clone(), f.clone()))
            .collect()
    }

    /// Removes an interface behind the engine's back (someone ran `ip link del`).
    pub fn yank(&self, netns: &str, intf: &str) {
        self.state().remove(netns, intf);
    }

    /// Sets an interface's counters.
    pub fn set_stats(&self, netns: &str, intf: &str, stats: LinkStats) {
        if let Some(i) = self.state().ifaces.get_mut(&(netns.to_string(), intf.to_string())) {
            i.stats = stats;
        }
    }

    /// Removes a VXLAN end's FDB entries behind the engine's back.
    pub fn flush_fdb(&self, netns: &str, intf: &str) {
        if let Some(i) = self.state().ifaces.get_mut(&(netns.to_string(), intf.to_string())) {
            i.fdb.clear();
        }
    }

    /// How many namespace paths the engine asked about so far (then forgets it).
    pub fn take_asked(&self) -> usize {
        std::mem::take(&mut self.state().asked)
    }

    /// The creating procedures run so far.
    pub fn created(&self) -> Vec<String> {
        self.state().created.clone()
    }

    /// The interfaces whose presence was checked so far (then forgets them).
    pub fn take_checked(&self) -> Vec<String> {
        std::mem::take(&mut self.state().checked)
    }

    /// The emulation procedures run so far (then forgets them).
    pub fn take_emulation(&self) -> Vec<String> {
        std::mem::take(&mut self.state().emulation)
    }

    /// Whether the node end of gRPC end `id` is down.
    pub fn node_end_down(&self, id: u64) -> bool {
        self.state().node_ends_down.contains(&id)
    }
}

impl WireKernel for FakeKernel {
    fn gone<'a>(&self, netns: &[&'a str]) -> Vec<&'a str> {
        let mut st = self.state();
        st.asked += netns.len();
        netns.iter().copied().filter(|n| !st.pods.contains(*n)).collect()
    }

    fn gone_new<'a>(&self, netns: &[&'a str]) -> Vec<&'a str> {
        self.gone(netns)
    }

    fn gone_epoch(&self) -> Option<u64> {
        Some(self.state().removals)
    }

    fn has_interface(&self, netns: &str, intf: &str) -> bool {
        self.state().checked.push(format!("{netns}/{intf}"));
        self.iface(netns, intf).is_some()
    }

    fn create_veth(&self, a: &EndSpec, b: &EndSpec) -> Result<(), KernelError> {
        let mut s = self.state();
        s.pod(&a.netns)?;
        s.pod(&b.netns)?;
        s.remove(&a.netns, &a.intf);
        s.remove(&b.netns, &b.intf);
        s.put(
            a,
            Kind::Veth {
                peer: (b.netns.clone(), b.intf.clone()),
            },
        );
        s.put(
            b,
            Kind::Veth {
                peer: (a.netns.clone(), a.intf.clone()),
            },
        );
        s.created
            .push(format!("veth {}/{} {}/{}", a.netns, a.intf, b.netns, b.intf));
        Ok(())
    }

    fn create_vxlan(&self, end: &EndSpec, vni: u32, local: IpAddr, peer: &VxlanPeer) -> Result<(), KernelError> {
        let mut s = self.state();
        s.pod(&end.netns)?;
        let key = (end.netns.clone(), end.intf.clone());
        let keep = s
            .ifaces
            .get(&key)
            .is_some_and(|i| matches!(i.kind, Kind::Vxlan { .. }) && i.fdb.iter().any(|(m, _)| *m == [0; 6]));
        if keep {
            let i = s.ifaces.get_mut(&key).expect("checked");
            (i.mac, i.mtu, i.up, i.address) = (end.mac, end.mtu, true, end.address);
        } else {
            s.remove(&end.netns, &end.intf);
            s.put(end, Kind::Vxlan { vni, local });
            s.created.push(format!("vxlan {}/{} {vni}", end.netns, end.intf));
        }
        s.point(&end.netns, &end.intf, peer)
    }

    fn vxlan_fdb(&self, netns: &str, intf: &str) -> Result<Option<Vec<FdbEntry>>, KernelError> {
        let s = self.state();
        s.pod(netns)?;
        Ok(s.ifaces
            .get(&(netns.to_string(), intf.to_string()))
            .map(|i| i.fdb.clone()))
    }

    fn point_vxlan(&self, netns: &str, intf: &str, peer: &VxlanPeer) -> Result<(), KernelError> {
        let mut s = self.state();
        s.pod(netns)?;
        s.point(netns, intf, peer)
    }

    fn create_packet_end(&self, end: &EndSpec, id: u64) -> Result<(), KernelError> {
        let mut s = self.state();
        s.pod(&end.netns)?;
        let key = (end.netns.clone(), end.intf.clone());
        let whole = s.ifaces.get(&key).is_some_and(|i| i.kind == Kind::Packet { id }) && s.node_ends.contains(&id);
        if whole {
            let i = s.ifaces.get_mut(&key).expect("checked");
            (i.mac, i.mtu, i.up, i.address) = (end.mac, end.mtu, true, end.address);
        } else {
            s.remove(&end.netns, &end.intf);
            s.node_ends.insert(id);
            s.put(end, Kind::Packet { id });
            s.created.push(format!("packet {}/{}", end.netns, end.intf));
        }
        Ok(())
    }

    fn remove_interface(&self, netns: &str, intf: &str) -> Result<(), KernelError> {
        let mut s = self.state();
        if s.pods.contains(netns) {
            s.remove(netns, intf);
        }
        Ok(())
    }

    fn set_interface_up(&self, netns: &str, intf: &str, up: bool) -> Result<bool, KernelError> {
        let mut s = self.state();
        if !s.pods.contains(netns) {
            return Ok(false);
        }
        Ok(match s.ifaces.get_mut(&(netns.to_string(), intf.to_string())) {
            Some(i) => {
                i.up = up;
                true
            }
            None => false,
        })
    }

    fn link_stats(&self, netns: &str, intf: &str) -> Result<Option<LinkStats>, KernelError> {
        let s = self.state();
        s.pod(netns)?;
        Ok(s.ifaces.get(&(netns.to_string(), intf.to_string())).map(|i| i.stats))
    }

    fn set_impairment(&self, netns: &str, intf: &str, imp: &Impairment) -> Result<Emulated, KernelError> {
        let mut s = self.state();
        let no_netem = s.no_netem;
        let Some(i) = s.ifaces.get_mut(&(netns.to_string(), intf.to_string())) else {
            return Ok(Emulated::NoSuchEnd);
        };
        if no_netem && (Impairment { rate_bps: None, ..*imp }) != Impairment::default() {
            i.impairment = Impairment::default();
            s.emulation.push(format!("no netem {netns}/{intf} {imp}"));
            return Ok(Emulated::Unsupported);
        }
        i.impairment = *imp;
        s.emulation.push(format!("netem {netns}/{intf} {imp}"));
        Ok(Emulated::Applied)
    }

    fn detour(&self, netns: &str, intf: &str, id: u64) -> Result<bool, KernelError> {
        let mut s = self.state();
        if !s.ifaces.contains_key(&(netns.to_string(), intf.to_string())) {
            return Ok(false);
        }
        s.detours.insert(id, (netns.into(), intf.into()));
        s.emulation.push(format!("detour {netns}/{intf}"));
        Ok(true)
    }

    fn remove_detour(&self, netns: &str, intf: &str, id: u64) -> Result<bool, KernelError> {
        let mut s = self.state();
        s.emulation.push(format!("undetour {netns}/{intf}"));
        Ok(s.detours.remove(&id).is_some())
    }

    fn detours(&self) -> Result<Vec<u64>, KernelError> {
        Ok(self.state().detours.keys().map(|id| id & ((1 << 52) - 1)).collect())
    }

    fn set_proto_down(&self, netns: &str, intf: &str, down: bool) -> Result<bool, KernelError> {
        let mut s = self.state();
        let Some(i) = s.ifaces.get_mut(&(netns.to_string(), intf.to_string())) else {
            return Ok(false);
        };
        i.proto_down = down;
        s.emulation.push(format!("protodown {netns}/{intf} {down}"));
        Ok(true)
    }

    fn set_node_end_up(&self, id: u64, up: bool) -> Result<bool, KernelError> {
        let mut s = self.state();
        if !s.node_ends.contains(&id) {
            return Ok(false);
        }
        if up {
            s.node_ends_down.remove(&id);
        } else {
            s.node_ends_down.insert(id);
        }
        s.emulation
            .push(format!("node-end {id:x} {}", if up { "up" } else { "down" }));
        Ok(true)
    }
}

/// A data plane that remembers which ends have workers, and whether each is up.
#[derive(Default)]
pub struct FakePlane {
    ends: Mutex<BTreeMap<u64, (GrpcEnd, bool)>>,
    /// How many times each end was attached.
    attaches: Mutex<BTreeMap<u64, usize>>,
    /// The emulation each end was given.
    impairments: Mutex<BTreeMap<u64, Impairment>>,
    /// The emulation each veth or VXLAN end's detour worker applies.
    detours: Mutex<BTreeMap<u64, Impairment>>,
    /// What each emulated end's emulation counted (set by a test).
    pub emulation: Mutex<BTreeMap<u64, weft_link::EmulationCounts>>,
}

impl FakePlane {
    /// The attached end `id` and whether it is up.
    pub fn end(&self, id: u64) -> Option<(GrpcEnd, bool)> {
        self.ends.lock().unwrap().get(&id).cloned()
    }

    /// The emulation end `id` was given last (empty when none).
    pub fn impairment(&self, id: u64) -> Impairment {
        self.impairments.lock().unwrap().get(&id).copied().unwrap_or_default()
    }

    /// The emulation end `id`'s detour worker applies, if it has one.
    pub fn detoured(&self, id: u64) -> Option<Impairment> {
        self.detours.lock().unwrap().get(&id).copied()
    }

    /// Whether end `id` has a worker, attached exactly once.
    pub fn attached_once(&self, id: u64) -> bool {
        self.attached(id) && self.attaches.lock().unwrap().get(&id) == Some(&1)
    }
}

impl GrpcPlane for FakePlane {
    fn attach(self: &Arc<Self>, end: GrpcEnd) -> Result<(), WireError> {
        *self.attaches.lock().unwrap().entry(end.id).or_default() += 1;
        let up = end.up;
        self.ends.lock().unwrap().insert(end.id, (end, up));
        Ok(())
    }
    fn set_up(&self, id: u64, up: bool) {
        if let Some(e) = self.ends.lock().unwrap().get_mut(&id) {
            e.1 = up;
        }
    }
    fn detach(&self, id: u64) {
        self.ends.lock().unwrap().remove(&id);
    }
    fn attached(&self, id: u64) -> bool {
        self.ends.lock().unwrap().contains_key(&id)
    }
    fn set_impairment(&self, id: u64, imp: Impairment) {
        self.impairments.lock().unwrap().insert(id, imp);
    }
    fn detour(&self, id: u64, imp: Impairment, _labels: weft_wires::metrics::WireLabels) -> Result<(), WireError> {
        self.detours.lock().unwrap().insert(id, imp);
        Ok(())
    }
    fn undetour(&self, id: u64) -> bool {
        self.detours.lock().unwrap().remove(&id).is_some()
    }
    fn emulation(&self, id: u64) -> Option<weft_link::EmulationCounts> {
        self.emulation.lock().unwrap().get(&id).copied()
    }
}

/// One `Ends` call as a peer saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub from: String,
    pub to: IpAddr,
    pub req: EndsRequest,
}

/// The other nodes of the test, called in-process.
#[derive(Default)]
pub struct FakePeers {
    engines: Mutex<HashMap<IpAddr, Weak<Engine<FakePlane>>>>,
    /// VNIs every peer refuses (as if another end held them there).
    pub refuse: Mutex<BTreeSet<u32>>,
    /// Every call made.
    pub calls: Mutex<Vec<Call>>,
    /// When set, every call (once recorded) waits for a permit of this gate before it
    /// is answered: a peer node that does not answer yet.
    pub stall: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl FakePeers {
    /// Routes calls for `addr` to `engine` (replacing an earlier one).
    pub fn register(&self, addr: IpAddr, engine: &Arc<Engine<FakePlane>>) {
        self.engines.lock().unwrap().insert(addr, Arc::downgrade(engine));
    }

    /// The VNI offers made so far (present VXLAN ends), in order.
    pub fn offers(&self) -> Vec<(String, IpAddr, u32)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .flat_map(|c| {
                c.req
                    .ends
                    .iter()
                    .filter(|e| e.present && e.kind.parse() == Ok(LinkKind::Vxlan))
                    .map(|e| (c.from.clone(), c.to, e.vni))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl Peers for FakePeers {
    fn ends(&self, node: IpAddr, req: EndsRequest) -> BoxFuture<'_, Result<Vec<EndResult>, PeerError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(Call {
                from: req.from.as_ref().map(|h| h.node.clone()).unwrap_or_default(),
                to: node,
                req: req.clone(),
            });
            let gate = self.stall.lock().unwrap().clone();
            if let Some(gate) = gate {
                let _permit = gate.acquire().await;
            }
            let Some(engine) = self.engines.lock().unwrap().get(&node).and_then(Weak::upgrade) else {
                return Err(PeerError::Connect {
                    node,
                    reason: "no such node".into(),
                });
            };
            let refuse = self.refuse.lock().unwrap().clone();
            if let Some(e) = req.ends.iter().find(|e| e.present && refuse.contains(&e.vni)) {
                return Ok(vec![EndResult {
                    accepted: false,
                    reason: format!("VNI {} is taken on this node", e.vni),
                }]);
            }
            Ok(engine.ends(req).await.results)
        })
    }
}
