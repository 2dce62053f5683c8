//! The records the store keeps.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// What identifies an attachment: the CNI spec's (network name, container id, ifname).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttachmentKey {
    /// Network name from the config.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// The node's ready pods by attachment id (the listing's order), as
/// [`crate::Db::ready_pods`] lists them: a persistent map the store changes in place, so
/// two listings share all but the pods written between them (a copy costs a pointer, and
/// their difference, `imbl::OrdMap::diff`, skips the rest).
pub type ReadyPods = imbl::OrdMap<i64, std::sync::Arc<ReadyPod>>;

/// A ready pod of the node as [`crate::Db::ready_pods`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyPod {
    /// Its pod (namespace and name; the uid is not read).
    pub pod: PodRef,
    /// The host end of its interface.
    pub host_ifname: String,
    /// Its addresses, lowest first.
    pub addresses: Vec<IpAddr>,
}

/// The Kubernetes pod an attachment belongs to, from `CNI_ARGS` (empty when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`.
    pub uid: String,
}

impl PodRef {
    /// The pod's namespace as Kubernetes names it: `default` when the runtime gave
    /// none (the API server puts a pod created without one there), so a pod is the
    /// same to policy, wires and traces whether its runtime said `default` or nothing.
    pub fn namespace_or_default(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }

    /// The pod for people: `pod namespace/name`, `pod name` when the runtime gave no
    /// namespace (podman), or `container <id>` when it gave no name either.
    pub fn describe(&self, container_id: &str) -> String {
        match (self.namespace.is_empty(), self.name.is_empty()) {
            (_, true) => format!("container {container_id}"),
            (true, false) => format!("pod {}", self.name),
            (false, false) => format!("pod {}/{}", self.namespace, self.name),
        }
    }
}

/// Where an attachment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Intent recorded and addresses held; the kernel work is in progress or was
    /// interrupted by a crash (then the next start rolls it back).
    Creating,
    /// Fully set up.
    Ready,
    /// DEL accepted; the teardown is in progress or was interrupted (then the next
    /// start finishes it). Its addresses and interface name are not reused until then.
    Deleting,
}

impl State {
    /// The value stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Ready => "ready",
            State::Deleting => "deleting",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        match s {
            "creating" => State::Creating,
            "ready" => State::Ready,
            _ => State::Deleting,
        }
    }
}

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of a range.
    pub fn of(r: &IpNet) -> Self {
        match r {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// One address held by an attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The pod's address.
    pub address: IpAddr,
    /// The range it came from.
    pub range: IpNet,
    /// The range's gateway.
    pub gateway: IpAddr,
}

/// A route an attachment installed in the pod, through its gateway of that family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledRoute {
    /// The destination (`0.0.0.0/0`, `::/0` for a default route).
    pub dst: IpNet,
    /// The next hop: the gateway of the pod's range of `dst`'s family.
    pub gateway: IpAddr,
}

impl fmt::Display for InstalledRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}", self.dst, self.gateway)
    }
}

/// A pod attachment as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Row id.
    pub id: i64,
    /// The CNI key.
    pub key: AttachmentKey,
    /// `CNI_NETNS` at ADD time.
    pub netns: String,
    /// The pod, from `CNI_ARGS`.
    pub pod: PodRef,
    /// Name of the host-side veth.
    pub host_ifname: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// Life-cycle state.
    pub state: State,
    /// The ADD result (CNI 1.1.0 JSON) once ready.
    pub result: Option<String>,
    /// Held addresses, IPv4 first.
    pub addresses: Vec<Allocation>,
    /// Held host ports (released when DEL begins).
    pub ports: Vec<PortMapping>,
    /// The routes the ADD installed in the pod (empty until it is ready). An
    /// attachment made before weft recorded them has the default route through each
    /// of its gateways, which is what weft installed then.
    pub routes: Vec<InstalledRoute>,
    /// The MAC the runtime asked for on the pod's interface; `None`: derived from the
    /// key.
    pub pod_mac: Option<[u8; 6]>,
}

/// A host port a pod asks for (`runtimeConfig.portMappings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRequest {
    /// The node address to bind, `None` for every address (of each family the pod has,
    /// or only of `family`).
    pub host_ip: Option<IpAddr>,
    /// With no `host_ip`: bind only this family's addresses.
    pub family: Option<Family>,
    /// The port on the node.
    pub host_port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The port in the pod.
    pub container_port: u16,
}

/// A host port held by an attachment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortMapping {
    /// The node address bound, `None` for every address of the family.
    pub host_ip: Option<IpAddr>,
    /// The port on the node.
    pub host_port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The pod's address (its family is the mapping's).
    pub container_ip: IpAddr,
    /// The port in the pod.
    pub container_port: u16,
}

/// A host port with the pod that holds it (for listings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPort {
    /// The mapping.
    pub mapping: PortMapping,
    /// The attachment holding it.
    pub key: AttachmentKey,
    /// Its pod.
    pub pod: PodRef,
    /// The attachment's host-side interface.
    pub host_ifname: String,
}

/// What ADD asks the store to record.
#[derive(Debug, Clone)]
pub struct NewAttachment {
    /// The CNI key.
    pub key: AttachmentKey,
    /// `CNI_NETNS`.
    pub netns: String,
    /// The pod, from `CNI_ARGS`.
    pub pod: PodRef,
    /// Name of the host-side veth.
    pub host_ifname: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// Ranges to allocate from, in config order.
    pub ranges: Vec<IpNet>,
    /// Host ports to hold.
    pub ports: Vec<PortRequest>,
    /// Addresses the runtime asks for, at most one per family: each is allocated
    /// exactly, from the range of `ranges` that holds it, instead of the next free one.
    pub requested: Vec<IpAddr>,
    /// The MAC the runtime asks for on the pod's interface.
    pub pod_mac: Option<[u8; 6]>,
}

/// The outcome of [`crate::db::Db::begin_add`].
#[derive(Debug, Clone)]
pub enum BeginAdd {
    /// The key already has an attachment (in whatever state).
    Existing(Attachment),
    /// A new attachment in state `Creating`, with its addresses allocated.
    Created(Attachment),
}

/// Address usage of one range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeUsage {
    /// The range.
    pub range: IpNet,
    /// Its gateway.
    pub gateway: IpAddr,
    /// Addresses it can hand out.
    pub capacity: u64,
    /// Addresses allocated now.
    pub allocated: u64,
}

impl RangeUsage {
    /// Whether no address is left.
    pub fn is_full(&self) -> bool {
        self.allocated >= self.capacity
    }
}
