//! What the node network engine decides about and observes: its configuration, the
//! state it wants the kernel in, the state it finds, and the changes between them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

/// A hardware address.
pub type Mac = [u8; 6];

/// Name of the one VXLAN device that carries pod traffic between nodes (short enough
/// that no pod host end, `weft` + 11 hex digits, can ever be named like it).
pub const VXLAN_DEVICE: &str = "weft-vxlan";

/// Default UDP port of the pod VXLAN device: not 4789, which wire VXLANs use, so the two
/// never share a socket (and so never compete for a VNI).
pub const DEFAULT_VXLAN_PORT: u16 = 8472;

/// Default VNI of the pod VXLAN device.
pub const DEFAULT_VXLAN_VNI: u32 = 1;

/// Bytes VXLAN adds to every packet over an IPv4 underlay (outer IPv4 20, UDP 8,
/// VXLAN 8, inner Ethernet 14).
pub const VXLAN_OVERHEAD_V4: u32 = 50;
/// The same over an IPv6 underlay (outer IPv6 header is 40 bytes).
pub const VXLAN_OVERHEAD_V6: u32 = 70;

/// How pod traffic reaches other nodes (`--pod-routing`, a lab's `pod_routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodRouting {
    /// `direct` where the peer's address is on-link, `vxlan` elsewhere.
    #[default]
    Auto,
    /// A route to each peer pod range via the peer's address (peers must be on-link).
    Direct,
    /// Every peer through the VXLAN device.
    Vxlan,
    /// Nothing: an external router carries pod ranges; weft only reports.
    None,
}

impl PodRouting {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PodRouting::Auto => "auto",
            PodRouting::Direct => "direct",
            PodRouting::Vxlan => "vxlan",
            PodRouting::None => "none",
        }
    }
}

/// The engine's configuration (weftd's flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name (its Node object's name).
    pub node_name: String,
    /// This node's underlay address when set by flag; otherwise its Node's first
    /// `InternalIP`.
    pub node_address: Option<IpAddr>,
    /// How peers are reached.
    pub routing: PodRouting,
    /// UDP port of the VXLAN device.
    pub vxlan_port: u16,
    /// VNI of the VXLAN device.
    pub vxlan_vni: u32,
    /// Whether pod traffic leaving the pod network is masqueraded.
    pub masquerade: bool,
    /// Destinations never masqueraded, beyond every node's pod ranges.
    pub no_masquerade: Vec<IpNet>,
    /// How often the kernel is checked against what it should hold.
    pub resync: Duration,
    /// Where this node's pod ranges are exported for a routing daemon (`--export-table`),
    /// if anywhere.
    pub export: Option<RouteExport>,
}

/// Where this node's pod ranges are exported: one `blackhole` route per podCIDR in a
/// table of its own, marked with a routing protocol, for BIRD or FRR to pick up and
/// announce (the node itself forwards by its main table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteExport {
    /// The routing table (`--export-table`).
    pub table: u32,
    /// The routing protocol number the routes carry (`--export-protocol`).
    pub protocol: u8,
}

impl RouteExport {
    /// Checks `table` and `protocol`: a table of weft's own, not one the kernel uses
    /// (0 unspecified, 253 default, 254 main, 255 local); a protocol a routing daemon
    /// takes (not 0 unspecified, 1 redirect, 2 `kernel`, which FRR ignores, 3 boot).
    pub fn new(table: u32, protocol: u8) -> Result<Self, String> {
        if matches!(table, 0 | 253..=255) {
            return Err(format!(
                "--export-table {table} is a table the kernel uses itself (0, 253 default, 254 main, 255 local); pick one of weft's own, e.g. 119"
            ));
        }
        if protocol <= 3 {
            return Err(format!(
                "--export-protocol {protocol} is reserved (0 unspec, 1 redirect, 2 kernel, 3 boot): routing daemons ignore or misread such routes; pick e.g. {}",
                weft_kernel::NODE_ROUTE_PROTOCOL
            ));
        }
        Ok(RouteExport { table, protocol })
    }
}

/// A route weft owns to a peer node's pod range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerRoute {
    /// The peer's pod range.
    pub dst: IpNet,
    /// The next hop: the peer's underlay address (`direct`), or the peer range's network
    /// address, resolved by a permanent neighbour entry on the VXLAN device (`vxlan`).
    pub gateway: IpAddr,
    /// Whether it goes out of the VXLAN device (`onlink`), or wherever the kernel
    /// reaches `gateway` (direct).
    pub over_vxlan: bool,
}

/// The VXLAN device as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    /// Its VNI.
    pub vni: u32,
    /// Its UDP port.
    pub port: u16,
    /// Its local underlay address (this node's).
    pub local: IpAddr,
    /// Its MAC, derived from the node name so peers know it without asking.
    pub mac: Mac,
    /// The underlay MTU minus the encapsulation.
    pub mtu: u32,
}

/// Pod ranges and exceptions of the egress masquerade.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasqSets {
    /// Every pod range of the cluster: traffic from them to anything else is
    /// masqueraded, traffic among them never.
    pub pods: BTreeSet<IpNet>,
    /// Destinations never masqueraded (`--no-masquerade-cidr`).
    pub exceptions: BTreeSet<IpNet>,
}

/// How one peer node is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerMode {
    /// Every pod range by a direct route.
    Direct,
    /// Every pod range through VXLAN.
    Vxlan,
    /// Some ranges each way (e.g. IPv4 on-link, IPv6 not).
    Mixed,
    /// `--pod-routing none`: left to an external router.
    None,
    /// Not at all (no podCIDRs, no address of a usable family, not on-link in `direct`).
    Unreachable,
}

impl PeerMode {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerMode::Direct => "direct",
            PeerMode::Vxlan => "vxlan",
            PeerMode::Mixed => "mixed",
            PeerMode::None => "none",
            PeerMode::Unreachable => "unreachable",
        }
    }

    /// Every mode, for metrics that report zero too.
    pub const ALL: [PeerMode; 5] = [
        PeerMode::Direct,
        PeerMode::Vxlan,
        PeerMode::Mixed,
        PeerMode::None,
        PeerMode::Unreachable,
    ];
}

/// What the engine decided about one peer node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReport {
    /// The node.
    pub name: String,
    /// How it is reached.
    pub mode: PeerMode,
    /// Why some of its ranges are not reached, if so.
    pub problem: Option<String>,
}

/// The state the kernel should be in, and what follows for pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Routes to peers' pod ranges.
    pub routes: BTreeSet<PeerRoute>,
    /// The VXLAN device, when some peer is reached through it.
    pub vxlan: Option<VxlanSpec>,
    /// Addresses on the VXLAN device (the network address of each local pod range), so
    /// traffic the node itself sends to remote pods leaves with an address the remote
    /// pods route back through VXLAN.
    pub vxlan_addresses: BTreeSet<IpAddr>,
    /// Unicast FDB entries: a peer's VXLAN MAC at its underlay address.
    pub fdb: BTreeSet<(Mac, IpAddr)>,
    /// Permanent neighbour entries: a peer range's next hop at the peer's VXLAN MAC.
    pub neighbours: BTreeSet<(IpAddr, Mac)>,
    /// The masquerade sets, when masquerade is on.
    pub masquerade: Option<MasqSets>,
    /// Every peer node and how it is reached.
    pub peers: Vec<PeerReport>,
    /// This node's pod ranges (its Node's podCIDRs); empty while unknown.
    pub ranges: Vec<IpNet>,
    /// An `unreachable` route for every pod range this node serves (its podCIDRs and
    /// the ranges of its network configs): below the per-pod routes, so traffic for an
    /// address no pod holds (a pod deleted while weftd was away, an address never
    /// given out) is answered on the node instead of following the default route out.
    pub unreachable: BTreeSet<IpNet>,
    /// The MTU pods get when their config sets none; `None` while the underlay is
    /// unknown.
    pub pod_mtu: Option<u32>,
    /// The pod ranges exported for a routing daemon (this node's podCIDRs), when
    /// export is on.
    pub exported: BTreeSet<IpNet>,
    /// Where they are exported (`None`: export is off, and nothing is read or
    /// withdrawn there).
    pub export: Option<RouteExport>,
}

/// A route of weft's found in the kernel.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObservedRoute {
    /// Destination.
    pub dst: IpNet,
    /// Next hop.
    pub gateway: Option<IpAddr>,
    /// Output link.
    pub oif: Option<u32>,
    /// Whether it is an `unreachable` route of one of this node's pod ranges.
    pub unreachable: bool,
}

/// The VXLAN device as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedVxlan {
    /// Interface index.
    pub index: u32,
    /// Its VNI, if it is a VXLAN device at all.
    pub vni: Option<u32>,
    /// Its UDP port.
    pub port: Option<u16>,
    /// Its local address.
    pub local: Option<IpAddr>,
    /// Its MAC.
    pub mac: Vec<u8>,
    /// Its MTU.
    pub mtu: u32,
    /// Whether it is up.
    pub up: bool,
}

/// What the kernel holds of weft's pod routing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Routes marked with weft's node route protocol.
    pub routes: Vec<ObservedRoute>,
    /// The VXLAN device, if it exists.
    pub vxlan: Option<ObservedVxlan>,
    /// Host addresses on the VXLAN device.
    pub vxlan_addresses: Vec<IpAddr>,
    /// Unicast FDB entries of the VXLAN device.
    pub fdb: Vec<(Mac, IpAddr)>,
    /// Neighbour entries of the VXLAN device.
    pub neighbours: Vec<(IpAddr, Mac)>,
    /// The ranges found exported (weft's blackhole routes in the export table), when
    /// export is on.
    pub exported: Vec<IpNet>,
}

/// Facts from the kernel that planning needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// MTU of the link holding this node's address.
    pub underlay_mtu: Option<u32>,
    /// For each peer address looked up: whether it is on-link (reached without a
    /// gateway).
    pub on_link: BTreeMap<IpAddr, bool>,
}

/// One change to the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Create the VXLAN device (and set it up).
    CreateVxlan(VxlanSpec),
    /// Delete the VXLAN device (with every route, FDB and neighbour entry on it).
    DeleteVxlan,
    /// Give the device its MAC.
    SetVxlanMac(Mac),
    /// Give the device its MTU.
    SetVxlanMtu(u32),
    /// Set the device up.
    SetVxlanUp,
    /// Add a host address to the device.
    AddAddress(IpAddr),
    /// Remove a host address from the device.
    DeleteAddress(IpAddr),
    /// Add a unicast FDB entry.
    AddFdb(Mac, IpAddr),
    /// Remove a unicast FDB entry.
    DeleteFdb(Mac, IpAddr),
    /// Add (or replace) a permanent neighbour entry.
    AddNeighbour(IpAddr, Mac),
    /// Remove a neighbour entry.
    DeleteNeighbour(IpAddr),
    /// Add a route.
    AddRoute(PeerRoute),
    /// Add the `unreachable` route of one of this node's pod ranges.
    AddUnreachable(IpNet),
    /// Remove a route.
    DeleteRoute(ObservedRoute),
    /// Export one of this node's pod ranges (a blackhole route in the export table).
    Export(IpNet, RouteExport),
    /// Withdraw an exported range.
    Withdraw(IpNet, RouteExport),
}

impl Change {
    /// The metric labels: what kind of entry, added or deleted.
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Change::CreateVxlan(_) | Change::SetVxlanMac(_) | Change::SetVxlanMtu(_) | Change::SetVxlanUp => {
                ("device", "add")
            }
            Change::DeleteVxlan => ("device", "delete"),
            Change::AddAddress(_) => ("address", "add"),
            Change::DeleteAddress(_) => ("address", "delete"),
            Change::AddFdb(..) => ("fdb", "add"),
            Change::DeleteFdb(..) => ("fdb", "delete"),
            Change::AddNeighbour(..) => ("neighbour", "add"),
            Change::DeleteNeighbour(_) => ("neighbour", "delete"),
            Change::AddRoute(_) | Change::AddUnreachable(_) => ("route", "add"),
            Change::DeleteRoute(_) => ("route", "delete"),
            Change::Export(..) => ("export", "add"),
            Change::Withdraw(..) => ("export", "delete"),
        }
    }
}

/// Formats a MAC the usual way.
pub fn mac_string(m: &Mac) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::CreateVxlan(s) => write!(
                f,
                "create {VXLAN_DEVICE} vni {} port {} local {} mac {} mtu {}",
                s.vni,
                s.port,
                s.local,
                mac_string(&s.mac),
                s.mtu
            ),
            Change::DeleteVxlan => write!(f, "delete {VXLAN_DEVICE}"),
            Change::SetVxlanMac(m) => write!(f, "set {VXLAN_DEVICE} mac {}", mac_string(m)),
            Change::SetVxlanMtu(m) => write!(f, "set {VXLAN_DEVICE} mtu {m}"),
            Change::SetVxlanUp => write!(f, "set {VXLAN_DEVICE} up"),
            Change::AddAddress(a) => write!(f, "add address {a} to {VXLAN_DEVICE}"),
            Change::DeleteAddress(a) => write!(f, "delete address {a} from {VXLAN_DEVICE}"),
            Change::AddFdb(m, d) => write!(f, "add fdb {} dst {d}", mac_string(m)),
            Change::DeleteFdb(m, d) => write!(f, "delete fdb {} dst {d}", mac_string(m)),
            Change::AddNeighbour(ip, m) => write!(f, "add neighbour {ip} lladdr {}", mac_string(m)),
            Change::DeleteNeighbour(ip) => write!(f, "delete neighbour {ip}"),
            Change::AddRoute(r) if r.over_vxlan => {
                write!(f, "add route {} via {} dev {VXLAN_DEVICE} onlink", r.dst, r.gateway)
            }
            Change::AddRoute(r) => write!(f, "add route {} via {}", r.dst, r.gateway),
            Change::AddUnreachable(dst) => write!(f, "add route unreachable {dst}"),
            Change::DeleteRoute(r) => match r.gateway {
                _ if r.unreachable => write!(f, "delete route unreachable {}", r.dst),
                Some(g) => write!(f, "delete route {} via {g}", r.dst),
                None => write!(f, "delete route {}", r.dst),
            },
            Change::Export(dst, e) => write!(f, "add route blackhole {dst} table {} proto {}", e.table, e.protocol),
            Change::Withdraw(dst, e) => {
                write!(f, "delete route blackhole {dst} table {} proto {}", e.table, e.protocol)
            }
        }
    }
}
