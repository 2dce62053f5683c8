//! weftd's flags and environment variables, and the [`NodeConfig`] they make.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use weft_node::NodeConfig;
use weft_node::config::WireTls;
use weft_telemetry::LogFormat;
use weft_topology::LinkKind;

/// The weft node daemon: serves CNI calls relayed by the `weft` plugin.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Args {
    /// Serve (the default), or take weft off this node.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// UNIX socket the plugin and weftctl connect to.
    #[arg(long, global = true, env = "WEFT_SOCKET", default_value = weft_cni::conf::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Directory holding the state database (weft.db).
    #[arg(long, global = true, env = "WEFT_STATE_DIR", default_value = "/var/lib/weft")]
    pub state_dir: PathBuf,
    /// Address of the HTTP endpoints (/healthz, /readyz, /metrics).
    #[arg(long, env = "WEFT_METRICS_ADDR", default_value = "0.0.0.0:9384")]
    metrics_addr: SocketAddr,
    /// This node's name (default: the hostname).
    #[arg(long, env = "WEFT_NODE_NAME")]
    node_name: Option<String>,
    /// Log format.
    #[arg(long, env = "WEFT_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Also forward host ports reached on 127.0.0.1 (enables `route_localnet`; packets
    /// to 127/8 from outside the node are then dropped).
    #[arg(long, env = "WEFT_HOSTPORTS_LOCALHOST")]
    hostports_localhost: bool,
    /// How often the kernel is checked against the store (host port table), seconds.
    #[arg(long, env = "WEFT_RECONCILE_INTERVAL", default_value_t = 60)]
    reconcile_interval: u64,
    /// How many finished CNI calls to keep for `weftctl calls`.
    #[arg(long, env = "WEFT_CALLS_HISTORY", default_value_t = 256)]
    calls_history: usize,
    /// Read Topology objects from YAML/JSON files in this directory instead of the
    /// Kubernetes API (labs outside a cluster; several daemons may share it).
    #[arg(long, env = "WEFT_TOPOLOGY_DIR")]
    topology_dir: Option<PathBuf>,
    /// Read Topology objects from the Kubernetes API (the default inside a cluster,
    /// where KUBERNETES_SERVICE_HOST is set).
    #[arg(long, env = "WEFT_KUBERNETES")]
    kubernetes: Option<bool>,
    /// TCP address of the node-to-node wire service (same port on every node).
    #[arg(long, env = "WEFT_WIRE_ADDR", default_value = "0.0.0.0:9385")]
    wire_addr: SocketAddr,
    /// Directory holding the wire port's mutual-TLS files, named as in a Kubernetes
    /// TLS Secret: ca.crt (the CA every node's certificate comes from), tls.crt and
    /// tls.key (this node's, naming it by its Node name or address). Changed files are
    /// used for new connections. Required for wires unless --wire-insecure.
    #[arg(long, env = "WEFT_WIRE_TLS_DIR", conflicts_with = "wire_insecure")]
    wire_tls_dir: Option<PathBuf>,
    /// Run the wire port in plaintext: any host at a node's address can then open
    /// frame streams into pods' links. For closed lab networks only.
    #[arg(long, env = "WEFT_WIRE_INSECURE")]
    wire_insecure: bool,
    /// This node's underlay address, the one peers reach it on (default: the Node's
    /// InternalIP, or the wire address when it is not a wildcard).
    #[arg(long, env = "WEFT_NODE_ADDRESS")]
    node_address: Option<IpAddr>,
    /// How links between pods on different nodes are carried unless the link says:
    /// `vxlan` (kernel VXLAN with unicast FDB entries) or `grpc` (frames carried by
    /// weftd over batched gRPC streams).
    #[arg(long, env = "WEFT_INTER_NODE_LINK", default_value = "vxlan", value_parser = inter_node_link)]
    inter_node_link: LinkKind,
    /// MTU of wire ends (VXLAN ends get this minus the encapsulation).
    #[arg(long, env = "WEFT_WIRE_MTU", default_value_t = 1500)]
    wire_mtu: u32,
    /// Keep the node ends of gRPC wire ends in network namespaces of their own,
    /// /run/netns/PREFIX0 to PREFIX<N-1> for N of `--wire-ends-shards` (made when first
    /// needed, kept across restarts), rather than in the node's: for nodes with
    /// thousands of gRPC ends, where every interface event in a namespace costs a walk
    /// over its packet sockets. Needs /run/netns shared with the host (Bidirectional
    /// mount propagation in a pod).
    #[arg(long, env = "WEFT_WIRE_ENDS_NETNS", value_parser = netns_prefix)]
    wire_ends_netns: Option<String>,
    /// How many namespaces `--wire-ends-netns` spreads the ends over (1 to 1024): more
    /// for more ends, as each interface event in a shard walks that shard's packet
    /// sockets. Keep it while the ends exist: under another count each end is built
    /// again (its link goes down and up once).
    #[arg(long, env = "WEFT_WIRE_ENDS_SHARDS", default_value_t = weft_kernel::packet::DEFAULT_SHARDS,
          value_parser = clap::value_parser!(u64).range(1..=weft_kernel::packet::MAX_SHARDS))]
    wire_ends_shards: u64,
    /// How pod traffic reaches pods on other nodes: `auto` (a direct route where the
    /// node is on-link, VXLAN elsewhere), `direct`, `vxlan`, or `none` (an external
    /// router carries pod ranges; weft only reports).
    #[arg(long, env = "WEFT_POD_ROUTING", value_enum, default_value = "auto")]
    pod_routing: weft_nodenet::PodRouting,
    /// UDP port of the VXLAN device that carries pod traffic between nodes (not the
    /// wire VXLANs' 4789).
    #[arg(long, env = "WEFT_POD_VXLAN_PORT", default_value_t = weft_nodenet::DEFAULT_VXLAN_PORT)]
    pod_vxlan_port: u16,
    /// VNI of that VXLAN device (the same on every node).
    #[arg(long, env = "WEFT_POD_VXLAN_VNI", default_value_t = weft_nodenet::DEFAULT_VXLAN_VNI,
          value_parser = clap::value_parser!(u32).range(1..16_777_216))]
    pod_vxlan_vni: u32,
    /// Masquerade pod traffic to anything outside every node's pod ranges (and the
    /// `--no-masquerade-cidr`s) to the node's address.
    #[arg(long, env = "WEFT_MASQUERADE", default_value_t = true, action = clap::ArgAction::Set)]
    masquerade: bool,
    /// A destination never masqueraded (repeatable; comma-separated in the variable).
    #[arg(long = "no-masquerade-cidr", env = "WEFT_NO_MASQUERADE_CIDRS", value_delimiter = ',')]
    no_masquerade_cidrs: Vec<ipnet::IpNet>,
    /// Export this node's podCIDRs for a routing daemon (BIRD, FRR): one `blackhole`
    /// route per range in this routing table, withdrawn when the range goes. Off when
    /// not given.
    #[arg(long, env = "WEFT_EXPORT_TABLE", value_parser = export_table)]
    export_table: Option<u32>,
    /// The routing protocol number the exported routes carry (not 0-3: `kernel`
    /// routes are ignored by FRR).
    #[arg(long, env = "WEFT_EXPORT_PROTOCOL", default_value_t = weft_kernel::NODE_ROUTE_PROTOCOL, value_parser = export_protocol)]
    export_protocol: u8,
    /// How long to wait at start for a previous weftd (still exiting) to release the
    /// state directory, seconds.
    #[arg(long, env = "WEFT_LOCK_WAIT", default_value_t = 30)]
    lock_wait: u64,
    /// How long a pod's ADD waits at most, in milliseconds, for the other nodes to put
    /// its addresses into their network-policy sets (a peer that does not answer is left
    /// out until it answers again); 0: new pods are not announced, other nodes learn of
    /// them from the API server.
    #[arg(long, env = "WEFT_POLICY_ANNOUNCE_TIMEOUT_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    policy_announce_timeout_ms: u64,
    /// The shortest time, in seconds, an address learnt from a DNS answer stays allowed
    /// by the ClusterNetworkPolicy `domainNames` rules that take its name, whatever the
    /// answer's TTL: an app connects a moment after its answer, and caches it a little
    /// past its TTL. Connections open when it ends are left alone.
    #[arg(long, env = "WEFT_POLICY_DNS_MIN_TTL", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=86_400))]
    policy_dns_min_ttl: u32,
    /// Record every connection of this node's pods as a flow (`weftctl flows`), from
    /// the node's conntrack table (turning its byte counters and timestamps on) and the
    /// policy deny log.
    #[arg(long, env = "WEFT_FLOWS", default_value_t = true, action = clap::ArgAction::Set)]
    flows: bool,
    /// How many ended flows the node keeps for `weftctl flows` (about 700 bytes each).
    #[arg(long, env = "WEFT_FLOWS_RING", default_value_t = weft_flows_ring_default(),
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    flows_ring: u64,
    /// How long 15 s flow aggregates are kept, seconds.
    #[arg(long, env = "WEFT_FLOWS_WINDOW", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(15..=86_400))]
    flows_window: u64,
    /// The conntrack event socket's receive buffer, bytes: a burst beyond it is dropped
    /// by the kernel, counted (`weft_flow_events_lost_total`) and recovered by a dump.
    #[arg(long, env = "WEFT_FLOWS_RECEIVE_BUFFER", default_value_t = 8 << 20,
          value_parser = clap::value_parser!(u64).range(4096..=1 << 30))]
    flows_receive_buffer: u64,
    /// Write every ended flow as a JSON line to this file (rotated by size), besides
    /// keeping it for `weftctl flows`.
    #[arg(long, env = "WEFT_FLOWS_FILE")]
    flows_file: Option<PathBuf>,
    /// The flow file's size at most before it is rotated (PATH.1, PATH.2, ...), bytes.
    #[arg(long, env = "WEFT_FLOWS_FILE_MAX_BYTES", default_value_t = 100 << 20,
          value_parser = clap::value_parser!(u64).range(4096..))]
    flows_file_max_bytes: u64,
    /// Rotated flow files kept.
    #[arg(long, env = "WEFT_FLOWS_FILE_KEEP", default_value_t = 5)]
    flows_file_keep: usize,
    /// Only flows matching KEY=VALUE go to the file (KEY: from, to, port, protocol,
    /// verdict, staged, policy, as `weftctl flows` reads them); repeat for more.
    #[arg(long, env = "WEFT_FLOWS_FILE_FILTER", value_delimiter = ',', value_name = "KEY=VALUE",
          value_parser = flow_criterion)]
    flows_file_filter: Vec<String>,
    /// Flow metrics per workload (`weft_workload_flow*`) for every namespace, not only
    /// those annotated `weft.dev/flow-metrics: workload`.
    #[arg(long, env = "WEFT_FLOWS_WORKLOAD_METRICS", default_value_t = false, action = clap::ArgAction::Set)]
    flows_workload_metrics: bool,
    /// Export flows as OTLP logs to the endpoint `OTEL_EXPORTER_OTLP_ENDPOINT` (or
    /// `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`) names: `flows`, one record per ended flow;
    /// `aggregates`, one per key of each closed 15 s bucket; `off`.
    #[arg(long, env = "WEFT_FLOWS_OTLP", value_enum, default_value_t = FlowsOtlp::Off)]
    flows_otlp: FlowsOtlp,
    /// Only flows (or aggregates) matching KEY=VALUE are exported over OTLP, as for
    /// `--flows-file-filter`; repeat for more.
    #[arg(long, env = "WEFT_FLOWS_OTLP_FILTER", value_delimiter = ',', value_name = "KEY=VALUE",
          value_parser = flow_criterion)]
    flows_otlp_filter: Vec<String>,
}

/// What `--flows-otlp` exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlowsOtlp {
    /// Nothing.
    Off,
    /// Each ended flow.
    Flows,
    /// Each closed 15 s aggregate.
    Aggregates,
}

/// A filter of checked `KEY=VALUE` criteria.
fn flow_filter(criteria: &[String]) -> weft_flows::Filter {
    let mut filter = weft_flows::Filter::default();
    for c in criteria {
        // Checked when the flags were parsed (`flow_criterion`).
        let _ = filter.add(c);
    }
    filter
}

/// Checks one `KEY=VALUE` flow criterion at parse time.
fn flow_criterion(s: &str) -> Result<String, String> {
    weft_flows::Filter::default().add(s)?;
    Ok(s.to_string())
}

fn weft_flows_ring_default() -> u64 {
    weft_node::flows::FlowsConfig::default().ring as u64
}

/// What weftd does besides serving.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Take weft off this node (run in the node's network namespace, weftd stopped):
    /// its nftables tables, routes and VXLAN device go, the sysctls it changed go back
    /// to the values it found, its state directory, socket and DEL spool go. The CNI
    /// config and plugin binary stay (the installer's: remove them with it).
    Uninstall {
        /// Go on although pods are attached: their networking goes with weft.
        #[arg(long)]
        force: bool,
        /// Leave the state directory in place.
        #[arg(long)]
        keep_state: bool,
    },
}

/// A namespace prefix: a file name under /run/netns once a shard number is added.
fn netns_prefix(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains('/') || s.starts_with('.') || s.len() > 240 {
        return Err(format!(
            "{s:?} is not a namespace name prefix (non-empty, no '/', not starting with '.', at most 240 bytes)"
        ));
    }
    Ok(s.to_string())
}

/// `--inter-node-link`: a link kind that crosses nodes.
fn inter_node_link(s: &str) -> Result<LinkKind, String> {
    match s.parse::<LinkKind>() {
        Ok(k) if k.crosses_nodes() => Ok(k),
        _ => Err(format!("{s:?}: vxlan or grpc")),
    }
}

/// `--export-table`: a table of weft's own.
fn export_table(s: &str) -> Result<u32, String> {
    let t: u32 = s.parse().map_err(|_| format!("{s:?} is not a table number"))?;
    weft_nodenet::RouteExport::new(t, weft_kernel::NODE_ROUTE_PROTOCOL).map(|e| e.table)
}

/// `--export-protocol`: a protocol a routing daemon takes.
fn export_protocol(s: &str) -> Result<u8, String> {
    let p: u8 = s.parse().map_err(|_| format!("{s:?} is not a protocol number 4-255"))?;
    weft_nodenet::RouteExport::new(119, p).map(|e| e.protocol)
}

/// The version and commit weftd reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("WEFT_COMMIT");

impl Args {
    /// Where the node's pod ranges are exported (`--export-table`, `--export-protocol`).
    pub fn export(&self) -> Option<weft_nodenet::RouteExport> {
        self.export_table.map(|table| weft_nodenet::RouteExport {
            table,
            protocol: self.export_protocol,
        })
    }

    /// The node's configuration (the log format stays here: telemetry is main's).
    pub fn config(self) -> NodeConfig {
        let export = self.export();
        NodeConfig {
            node_name: self.node_name.unwrap_or_else(hostname),
            version: VERSION.into(),
            commit: COMMIT.into(),
            socket: self.socket,
            state_dir: self.state_dir,
            metrics_addr: self.metrics_addr,
            hostports_localhost: self.hostports_localhost,
            reconcile_interval: Duration::from_secs(self.reconcile_interval),
            calls_history: self.calls_history,
            topology_dir: self.topology_dir,
            kubernetes: self.kubernetes,
            wire_addr: self.wire_addr,
            wire_tls: match (self.wire_tls_dir, self.wire_insecure) {
                (Some(dir), _) => Some(WireTls::Dir(dir)),
                (None, true) => Some(WireTls::Insecure),
                (None, false) => None,
            },
            node_address: self.node_address,
            inter_node_link: self.inter_node_link,
            wire_mtu: self.wire_mtu,
            wire_ends_netns: self.wire_ends_netns,
            wire_ends_shards: self.wire_ends_shards,
            pod_routing: self.pod_routing,
            pod_vxlan_port: self.pod_vxlan_port,
            pod_vxlan_vni: self.pod_vxlan_vni,
            masquerade: self.masquerade,
            no_masquerade_cidrs: self.no_masquerade_cidrs,
            export,
            lock_wait: Duration::from_secs(self.lock_wait),
            policy_announce_timeout: Duration::from_millis(self.policy_announce_timeout_ms),
            dns_min_ttl: self.policy_dns_min_ttl,
            flows: weft_node::flows::FlowsConfig {
                enabled: self.flows,
                ring: self.flows_ring as usize,
                window: Duration::from_secs(self.flows_window),
                receive_buffer: self.flows_receive_buffer as usize,
                file: self.flows_file.map(|path| weft_flows::export::FileExportConfig {
                    path,
                    max_bytes: self.flows_file_max_bytes,
                    keep: self.flows_file_keep,
                    filter: flow_filter(&self.flows_file_filter),
                }),
                workload_metrics: self.flows_workload_metrics,
                otlp: {
                    use weft_node::flows::otlp::{OtlpExportConfig, OtlpRecords};
                    let records = match self.flows_otlp {
                        FlowsOtlp::Off => None,
                        FlowsOtlp::Flows => Some(OtlpRecords::Flows),
                        FlowsOtlp::Aggregates => Some(OtlpRecords::Aggregates),
                    };
                    records.map(|records| OtlpExportConfig {
                        records,
                        filter: flow_filter(&self.flows_otlp_filter),
                    })
                },
                ..weft_node::flows::FlowsConfig::default()
            },
        }
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}
