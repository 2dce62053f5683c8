//! What a node daemon is started with: a plain struct, filled from flags by `weftd`
//! (or by hand in a test), with no parsing of its own.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use weft_topology::LinkKind;

/// Everything [`crate::Node::start`] needs to know; one field per `weftd` flag.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// UNIX socket the plugin and weftctl connect to.
    pub socket: PathBuf,
    /// Directory holding the state database (weft.db) and the daemon's lock.
    pub state_dir: PathBuf,
    /// Address of the HTTP endpoints (/healthz, /readyz, /metrics).
    pub metrics_addr: SocketAddr,
    /// This node's name.
    pub node_name: String,
    /// The version reported at start and recorded with the run.
    pub version: String,
    /// The commit the daemon was built from, reported beside the version.
    pub commit: String,
    /// Also forward host ports reached on 127.0.0.1 (enables `route_localnet`).
    pub hostports_localhost: bool,
    /// How often the kernel is checked against the store (at least a second); also the
    /// resync period of the wire engine and the node network.
    pub reconcile_interval: Duration,
    /// How many finished CNI calls to keep for `weftctl calls`.
    pub calls_history: usize,
    /// Read Topology and Node objects from files in this directory.
    pub topology_dir: Option<PathBuf>,
    /// Read them from the Kubernetes API; `None` means "when inside a cluster"
    /// (`KUBERNETES_SERVICE_HOST` set). Ignored when `topology_dir` is given.
    pub kubernetes: Option<bool>,
    /// TCP address of the node-to-node wire service.
    pub wire_addr: SocketAddr,
    /// How the wire port is protected; `None` (neither given) refuses to serve wires.
    pub wire_tls: Option<WireTls>,
    /// This node's underlay address, the one peers reach it on.
    pub node_address: Option<IpAddr>,
    /// How links between pods on different nodes are carried unless the link says.
    pub inter_node_link: LinkKind,
    /// MTU of wire ends.
    pub wire_mtu: u32,
    /// Keep the node ends of gRPC wire ends in shard namespaces with this prefix
    /// (see `weft_kernel::packet::NodeEnds`); `None`: in the node's.
    pub wire_ends_netns: Option<String>,
    /// How many shard namespaces `wire_ends_netns` spreads the ends over.
    pub wire_ends_shards: u64,
    /// How pod traffic reaches pods on other nodes.
    pub pod_routing: weft_nodenet::PodRouting,
    /// UDP port of the VXLAN device carrying pod traffic between nodes.
    pub pod_vxlan_port: u16,
    /// VNI of that VXLAN device.
    pub pod_vxlan_vni: u32,
    /// Masquerade pod traffic leaving the pod network to the node's address.
    pub masquerade: bool,
    /// Destinations never masqueraded.
    pub no_masquerade_cidrs: Vec<ipnet::IpNet>,
    /// Where this node's pod ranges are exported for a routing daemon, if anywhere.
    pub export: Option<weft_nodenet::RouteExport>,
    /// How long to wait at start for a previous daemon to release the state directory.
    pub lock_wait: Duration,
    /// How long a pod's ADD waits at most for the other nodes to take its addresses into
    /// their network-policy sets (see [`crate::announce`]); zero: pods are not announced.
    pub policy_announce_timeout: Duration,
    /// How flows are recorded (see [`crate::flows`]).
    pub flows: crate::flows::FlowsConfig,
    /// The shortest time an address learnt from a DNS answer is allowed for
    /// `domainNames` rules, in seconds, whatever its TTL.
    pub dns_min_ttl: u32,
}

/// How the node-to-node wire port is protected (`--wire-tls-dir` or `--wire-insecure`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireTls {
    /// Mutual TLS with the files of this directory (see `weft_wiretls::TlsDir`).
    Dir(PathBuf),
    /// Plaintext, chosen explicitly.
    Insecure,
}

impl NodeConfig {
    /// The period of every periodic pass: the configured interval, never below a
    /// second (an interval of 0 would spin).
    pub fn resync(&self) -> Duration {
        self.reconcile_interval.max(Duration::from_secs(1))
    }

    /// The address peers reach this node's wire service on: the one given, else the
    /// wire address when it is not a wildcard (else the engine asks the Node).
    pub fn wire_node_address(&self) -> Option<IpAddr> {
        self.node_address
            .or_else(|| (!self.wire_addr.ip().is_unspecified()).then(|| self.wire_addr.ip()))
    }

    /// The node network's configuration (routes to other nodes' pod ranges,
    /// masquerade, the pod MTU).
    pub fn node_network(&self) -> weft_nodenet::Config {
        weft_nodenet::Config {
            node_name: self.node_name.clone(),
            node_address: self.node_address,
            routing: self.pod_routing,
            vxlan_port: self.pod_vxlan_port,
            vxlan_vni: self.pod_vxlan_vni,
            masquerade: self.masquerade,
            no_masquerade: self.no_masquerade_cidrs.clone(),
            resync: self.resync(),
            export: self.export,
        }
    }

    /// The wire engine's configuration, its data plane on `runtime`, its port
    /// protected by `security`.
    pub fn wire_engine(
        &self,
        runtime: &weft_wires::dataplane::DataPlaneRuntime,
        security: weft_wiretls::WireSecurity,
    ) -> weft_wires::EngineConfig {
        weft_wires::EngineConfig {
            node_name: self.node_name.clone(),
            node_address: self.wire_node_address(),
            wire_port: self.wire_addr.port(),
            default_kind: self.inter_node_link,
            mtu: self.wire_mtu,
            resync: self.resync(),
            dataplane_runtime: Some(runtime.handle().clone()),
            security,
            node_ends: match &self.wire_ends_netns {
                None => weft_kernel::packet::NodeEnds::Here,
                Some(prefix) => weft_kernel::packet::NodeEnds::Shards {
                    prefix: prefix.clone(),
                    count: self.wire_ends_shards,
                },
            },
        }
    }

    /// The policy engine's configuration; an ADD waits up to `sync_wait` for the
    /// cluster's policy objects to be listed once.
    pub fn policy(&self, sync_wait: Duration) -> weft_policy::Config {
        weft_policy::Config {
            node_name: self.node_name.clone(),
            resync: self.resync(),
            sync_wait,
            learnt: weft_fqdn::Limits {
                min_ttl: self.dns_min_ttl,
                ..weft_fqdn::Limits::default()
            },
        }
    }
}
