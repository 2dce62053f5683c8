//! Multi-node labs on one machine (`weftctl lab`): a router namespace joining one
//! namespace per node, each node in its own subnet (so the underlay is routed, never
//! broadcast: the NBMA case), a weftd per node sharing one topology directory, and pods
//! as namespaces attached through the real plugin. Everything lives under a state
//! directory and is found again from it, so `up` is idempotent and restarts what is
//! missing (a crashed daemon), `check` tests every link, `down` removes it all.
//!
//! Here: loading a lab file into a [`Lab`] and what it names; bringing it up and down
//! in `up.rs`, its certificates in `certs.rs`, its checks in `checks.rs`; the file's
//! schema is `crate::spec`.

mod bgp;
mod certs;
mod checks;
mod dns;
pub use dns::{NAMES_BLOCK, NAMES_BLOCK6, NameCell, NameTable};
mod up;

pub use bgp::{EXPORT_TABLE, ROUTER_AS, node_config, router_config};

pub use checks::LinkCheck;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use weft_topology::Topology;

use crate::LabError;
use crate::process::alive;
use crate::spec::{LabSpec, NodeSpec, PodSpec, Underlay};

/// The address of the lab's "outside" namespace, standing for the internet: it routes
/// back to the nodes' underlay, never to pod ranges, so it answers pods only through
/// masquerade.
pub const OUTSIDE_ADDRESS: &str = "198.51.100.2";

const OUTSIDE_GATEWAY: &str = "198.51.100.1/24";

/// How many shard namespaces a lab node spreads its gRPC node ends over: 64 keeps a
/// shard at about 35 ends on a node of a 5,000-link lab (each interface event in a
/// shard walks its ends' packet sockets), where weftd's default of 16 had 140.
pub const WIRE_END_SHARDS: u64 = 64;

/// The outside's IPv6 address in a lab with IPv6 on a shared segment (documentation
/// space, as the internet's addresses would be), reached the same way.
pub const OUTSIDE_ADDRESS6: &str = "2001:db8:100::2";
const OUTSIDE_GATEWAY6: &str = "2001:db8:100::1/64";
/// The IPv6 prefix of a shared segment (`fd00:172:30::/64`), without its host part.
const SEGMENT6: &str = "fd00:172:30::";

/// A lab loaded from its file, with where its state lives.
#[derive(Debug, Clone)]
pub struct Lab {
    /// The description.
    pub spec: LabSpec,
    /// The Topology objects.
    pub topologies: Vec<Topology>,
    /// The lab file's NetworkPolicy objects (inline and from `policy_files`), checked,
    /// each with its namespace filled in.
    pub policies: Vec<serde_json::Value>,
    /// The namespace of each pod without one of its own, by name: its Topology's
    /// (looked up once, since a big lab asks for it per link end).
    implicit_namespaces: BTreeMap<String, String>,
    state: PathBuf,
    weftd: PathBuf,
    plugin: PathBuf,
    /// The lab file, absolute (a background scenario finds the lab through it).
    file: PathBuf,
    /// The scenario the bring-up starts, checked, absolute.
    scenario: Option<PathBuf>,
}

/// Reads and checks a lab's scenario file: it parses, and every link it names is an end
/// in a pod of the lab. Its absolute path.
fn check_scenario(file: &Path, spec: &LabSpec) -> Result<PathBuf, String> {
    let what = |e: &dyn std::fmt::Display| format!("scenario {}: {e}", file.display());
    let text = fs::read_to_string(file).map_err(|e| what(&e))?;
    let sc = weft_link::scenario::Scenario::from_yaml(&text).map_err(|e| what(&e))?;
    for c in sc.timeline().map_err(|e| what(&e))? {
        for l in &c.links {
            let end = l.split_once('/').map_or(l.as_str(), |(_, rest)| rest);
            let pod = end.split_once(':').map_or(end, |(pod, _)| pod);
            if !spec.pods.iter().any(|p| p.name == pod) {
                return Err(what(&format!(
                    "step {}: link {l}: pod {pod:?} is not in the lab",
                    c.step
                )));
            }
        }
    }
    std::path::absolute(file).map_err(|e| what(&e))
}

/// The addresses of `eth0` in network namespace `netns` (global scope, IPv4 first).
pub(crate) fn netns_addresses(netns: &str) -> Vec<std::net::IpAddr> {
    let Ok(out) = Command::new("ip")
        .args(["-j", "-n", netns, "addr", "show", "dev", "eth0"])
        .output()
    else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut addrs: Vec<std::net::IpAddr> = v
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] == "global")
        .filter_map(|a| a["local"].as_str().and_then(|s| s.parse().ok()))
        .collect();
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs
}

/// The namespace of each pod that names none, by name: that of the first Topology of
/// its name which no pod with a namespace of its own claims, as before pods could name
/// one (a lab file whose Topologies are in `edge` keeps its pods there).
fn implicit_namespaces(pods: &[PodSpec], topologies: &[Topology]) -> BTreeMap<String, String> {
    let claimed: std::collections::BTreeSet<(&str, &str)> = pods
        .iter()
        .filter_map(|p| Some((p.namespace.as_deref()?, p.name.as_str())))
        .collect();
    let mut out = BTreeMap::new();
    for p in pods.iter().filter(|p| p.namespace.is_none()) {
        let ns = topologies
            .iter()
            .filter(|t| t.metadata.name.as_deref() == Some(p.name.as_str()))
            .map(|t| t.metadata.namespace.as_deref().unwrap_or("default"))
            .find(|ns| !claimed.contains(&(*ns, p.name.as_str())));
        if let Some(ns) = ns {
            out.insert(p.name.clone(), ns.to_string());
        }
    }
    out
}

/// The network namespace of a pod of lab `lab`: `<lab>-p-<pod>` for a pod that names no
/// namespace or `default` (the names labs had before namespaces), `<lab>-p-<ns>.<pod>`
/// otherwise; a dot is in neither a namespace's nor a lab pod's name, so no two pods
/// share one.
fn pod_netns(lab: &str, p: &PodSpec) -> String {
    match p.namespace.as_deref() {
        None | Some("default") => format!("{lab}-p-{}", p.name),
        Some(ns) => format!("{lab}-p-{ns}.{}", p.name),
    }
}

impl Lab {
    /// Loads a lab file; the binaries are looked for next to the running executable.
    pub fn load(path: &Path) -> Result<Lab, LabError> {
        let bad = |detail: String| LabError::Command {
            what: format!("lab {}", path.display()),
            detail,
        };
        let text = fs::read_to_string(path).map_err(|e| LabError::io(format!("reading {}", path.display()), e))?;
        let mut spec: LabSpec = serde_yaml_ng::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let name_ok = |n: &str, max: usize| {
            !n.is_empty() && n.len() <= max && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        };
        if !name_ok(&spec.name, 24) {
            return Err(bad(format!("name {:?}: 1-24 letters, digits or '-'", spec.name)));
        }
        if !spec.inter_node_link.crosses_nodes() {
            return Err(bad(format!(
                "inter_node_link {:?}: vxlan or grpc",
                spec.inter_node_link.as_str()
            )));
        }
        if spec.nodes.is_empty() || spec.nodes.len() > 250 {
            return Err(bad("nodes: 1 to 250 node names".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, n) in spec.nodes.iter_mut().enumerate() {
            // Network namespace names are the lab's name plus the node's: keep them short.
            if !name_ok(&n.name, 12) || !seen.insert(n.name.clone()) {
                return Err(bad(format!(
                    "node {:?}: names are unique, 1-12 letters, digits or '-'",
                    n.name
                )));
            }
            n.index = i;
            if spec.underlay == Underlay::Shared {
                // One segment: the router first, then the nodes in order.
                n.subnet = "172.30.0.0/24".parse().expect("valid");
            } else if n.subnet.addr().is_unspecified() {
                n.subnet = format!("172.30.{}.0/24", i + 1).parse().expect("valid");
            }
            if n.subnet.hosts().nth(1).is_none() {
                return Err(bad(format!(
                    "node {}: subnet {} has no room for two hosts",
                    n.name, n.subnet
                )));
            }
            if n.pod_range.is_empty() {
                n.pod_range = format!("10.244.{}.0/24", i + 1);
            }
            if spec.ipv6 && n.pod_range6.is_empty() {
                n.pod_range6 = format!("fd00:10:244:{:x}::/64", i + 1);
            }
            for r in [&n.pod_range, &n.pod_range6] {
                if !r.is_empty() && r.parse::<ipnet::IpNet>().is_err() {
                    return Err(bad(format!("node {}: pod range {r:?} is not a CIDR", n.name)));
                }
            }
        }
        if spec.bgp {
            if spec.underlay != Underlay::Routed {
                return Err(bad(
                    "bgp: true needs `underlay: routed` (BGP carries the ranges between subnets)".into(),
                ));
            }
            if spec.pod_routing != weft_nodenet::PodRouting::None {
                return Err(bad(format!(
                    "bgp: true needs `pod_routing: none` (the nodes route by what BGP teaches them), not {}",
                    spec.pod_routing.as_str()
                )));
            }
            if spec.ipv6 {
                return Err(bad(
                    "bgp: true carries IPv4 pod ranges only (the lab's BGP sessions are IPv4)".into(),
                ));
            }
        }
        if !(576..=65535).contains(&spec.underlay_mtu) {
            return Err(bad(format!("underlay_mtu {}: 576 to 65535", spec.underlay_mtu)));
        }
        for p in &mut spec.pods {
            // `lab exec NAME` takes a node or a pod: a pod never has a node's name.
            if !name_ok(&p.name, 40) || spec.nodes.iter().any(|n| n.name == p.name) {
                return Err(bad(format!(
                    "pod {:?}: 1-40 letters, digits or '-', and no node's name",
                    p.name
                )));
            }
            if !spec.nodes.iter().any(|n| n.name == p.node) {
                return Err(bad(format!("pod {}: node {:?} is not in `nodes`", p.name, p.node)));
            }
            crate::spec::checks::check_pod(p).map_err(|e| bad(format!("pod {}: {e}", p.name)))?;
        }
        crate::spec::checks::check_namespaces(&spec.namespaces).map_err(bad)?;
        let (mut topologies, mut problems) = (Vec::new(), Vec::new());
        if !spec.topologies.is_empty() {
            let inline = serde_json::to_vec(&spec.topologies).map_err(|e| bad(e.to_string()))?;
            let (t, p) = weft_topology::parse_topologies(Path::new("topologies.json"), &inline);
            topologies.extend(t);
            problems.extend(p);
        }
        if let Some(dir) = &spec.topology_dir {
            let dir = path.parent().unwrap_or(Path::new(".")).join(dir);
            let (t, p) = weft_topology::read_topologies(&dir).map_err(|e| bad(e.to_string()))?;
            topologies.extend(t);
            problems.extend(p);
        }
        if let Some(p) = problems.first() {
            return Err(bad(format!("topology: {p}")));
        }
        for t in &topologies {
            let pod = t.metadata.name.clone().unwrap_or_default();
            let ns = t.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            if !spec
                .pods
                .iter()
                .any(|p| p.name == pod && p.namespace.as_ref().is_none_or(|n| *n == ns))
            {
                return Err(bad(format!("topology {ns}/{pod}: no pod of that name in `pods`")));
            }
        }
        let implicit_namespaces = implicit_namespaces(&spec.pods, &topologies);
        // Pods are told apart by namespace and name, and each needs a network
        // namespace of its own.
        let (mut keys, mut netns) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for p in &spec.pods {
            let ns = p
                .namespace
                .clone()
                .or_else(|| implicit_namespaces.get(&p.name).cloned())
                .unwrap_or_else(|| "default".into());
            if !keys.insert((ns.clone(), p.name.clone())) {
                return Err(bad(format!("pod {ns}/{}: listed twice", p.name)));
            }
            if !netns.insert(pod_netns(&spec.name, p)) {
                return Err(bad(format!(
                    "pod {ns}/{}: a pod without `namespace:` (or in `default`) has that name too",
                    p.name
                )));
            }
        }
        let mut namespaces: std::collections::BTreeSet<String> =
            spec.namespaces.iter().map(|n| n.name.clone()).collect();
        namespaces.extend(keys.into_iter().map(|(ns, _)| ns));
        let mut policies = Vec::new();
        for (i, v) in spec.policies.iter().enumerate() {
            let what = format!("policies[{i}]");
            policies.extend(crate::spec::checks::read_policies(v.clone(), &what).map_err(bad)?);
        }
        for f in &spec.policy_files {
            let f = path.parent().unwrap_or(Path::new(".")).join(f);
            let text = fs::read_to_string(&f).map_err(|e| bad(format!("reading {}: {e}", f.display())))?;
            policies.extend(crate::spec::checks::parse_policies(&text, &f.display().to_string()).map_err(bad)?);
        }
        let mut policy_keys = std::collections::BTreeSet::new();
        for p in &policies {
            let key = crate::spec::checks::object_key(p);
            for warning in crate::spec::checks::check_policy(p, &namespaces).map_err(bad)? {
                eprintln!("{}: {warning}", path.display());
            }
            if !policy_keys.insert(key.clone()) {
                return Err(bad(format!("NetworkPolicy {key}: given twice")));
            }
        }
        let scenario = match &spec.scenario {
            Some(f) => Some(check_scenario(&path.parent().unwrap_or(Path::new(".")).join(f), &spec).map_err(bad)?),
            None => None,
        };
        let file = std::path::absolute(path).map_err(|e| LabError::io("finding the lab file", e))?;
        let exe = std::env::current_exe().map_err(|e| LabError::io("finding weftctl", e))?;
        let bin = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
        let state = std::env::var_os("WEFT_LAB_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/run/weft-lab"))
            .join(&spec.name);
        Ok(Lab {
            spec,
            topologies,
            policies,
            implicit_namespaces,
            state,
            weftd: bin.join("weftd"),
            plugin: bin.join("weft"),
            file,
            scenario,
        })
    }

    /// The pods that run on node `node`, each as [`Lab::pod_ref`] names it.
    pub fn pods_of(&self, node: &str) -> Vec<String> {
        self.spec
            .pods
            .iter()
            .filter(|p| p.node == node)
            .map(|p| self.pod_ref(p))
            .collect()
    }

    /// Moves pod `pod` (`NS/NAME`, or a unique `NAME`) to node `node` in this
    /// description (the next `up` attaches it there; detach it from the old node first).
    pub fn place(&mut self, pod: &str, node: &str) {
        if let Ok(i) = self.pod_index(pod) {
            self.spec.pods[i].node = node.to_string();
        }
    }

    /// Finds a pod by `NS/NAME`, or by `NAME` where only one pod has it (the error
    /// names the candidates otherwise).
    pub fn find_pod(&self, reference: &str) -> Result<&PodSpec, LabError> {
        self.pod_index(reference).map(|i| &self.spec.pods[i])
    }

    /// [`Lab::find_pod`]'s position in `spec.pods`.
    fn pod_index(&self, reference: &str) -> Result<usize, LabError> {
        let err = |detail: String| LabError::Command {
            what: format!("pod {reference}"),
            detail,
        };
        let pods = &self.spec.pods;
        if let Some((ns, name)) = reference.split_once('/') {
            return pods
                .iter()
                .position(|p| p.name == name && self.namespace_of(p) == ns)
                .ok_or_else(|| err(format!("no pod {name} in namespace {ns} of lab {}", self.spec.name)));
        }
        let found: Vec<usize> = (0..pods.len()).filter(|&i| pods[i].name == reference).collect();
        match found.as_slice() {
            [] => Err(err(format!("no such pod in lab {}", self.spec.name))),
            [i] => Ok(*i),
            many => Err(err(format!(
                "pods of that name are in several namespaces: {}; name one as NS/NAME",
                many.iter()
                    .map(|&i| format!("{}/{}", self.namespace_of(&pods[i]), reference))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// How commands name pod `p`: its name where no other pod has it, else `NS/NAME`.
    pub fn pod_ref(&self, p: &PodSpec) -> String {
        if self.spec.pods.iter().filter(|q| q.name == p.name).count() > 1 {
            format!("{}/{}", self.namespace_of(p), p.name)
        } else {
            p.name.clone()
        }
    }

    /// The Kubernetes namespace of pod `p`: its own, else its Topology's, else `default`.
    pub fn namespace_of(&self, p: &PodSpec) -> String {
        if let Some(ns) = &p.namespace {
            return ns.clone();
        }
        if let Some(ns) = self.implicit_namespaces.get(&p.name) {
            return ns.clone();
        }
        // A pod added to the description after loading.
        implicit_namespaces(std::slice::from_ref(p), &self.topologies)
            .remove(&p.name)
            .unwrap_or_else(|| "default".into())
    }

    /// The pod a Topology object describes (its namespace and name).
    fn pod_of_topology(&self, t: &Topology) -> Option<&PodSpec> {
        let name = t.metadata.name.as_deref()?;
        let ns = t.metadata.namespace.as_deref().unwrap_or("default");
        self.spec
            .pods
            .iter()
            .find(|p| p.name == name && self.namespace_of(p) == ns)
    }

    /// The network namespace of node `name`, or of pod `name` (`NS/NAME`, or a unique
    /// `NAME`).
    pub fn namespace_named(&self, name: &str) -> Option<String> {
        self.target_ns(name).ok()
    }

    /// [`Lab::namespace_named`], saying why when there is none.
    fn target_ns(&self, name: &str) -> Result<String, LabError> {
        if self.spec.nodes.iter().any(|n| n.name == name) {
            return Ok(self.node_ns(name));
        }
        self.find_pod(name).map(|p| self.netns_of(p)).map_err(|e| match e {
            LabError::Command { detail, .. } if !name.contains('/') && detail.starts_with("no such") => {
                LabError::Command {
                    what: name.to_string(),
                    detail: format!("no node or pod of that name in lab {}", self.spec.name),
                }
            }
            e => e,
        })
    }

    /// Uses these binaries instead of the ones next to weftctl.
    pub fn with_binaries(mut self, weftd: PathBuf, plugin: PathBuf) -> Self {
        self.weftd = weftd;
        self.plugin = plugin;
        self
    }

    fn node(&self, name: &str) -> Result<&NodeSpec, LabError> {
        self.spec
            .nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| LabError::Command {
                what: format!("node {name}"),
                detail: "not in the lab".into(),
            })
    }

    /// The name of the router namespace.
    pub fn router(&self) -> String {
        format!("{}-rt", self.spec.name)
    }

    /// The name of the "outside" namespace (the internet, reached only by masquerade).
    pub fn outside_ns(&self) -> String {
        format!("{}-out", self.spec.name)
    }

    /// Every node as a Node object would describe it: its underlay address and its pod
    /// ranges.
    pub fn node_objects(&self) -> Vec<weft_topology::ClusterNode> {
        self.spec
            .nodes
            .iter()
            .map(|n| weft_topology::ClusterNode {
                name: n.name.clone(),
                addresses: [self.address_of(&n.name), self.address6_of(&n.name)]
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.parse().ok())
                    .collect(),
                pod_cidrs: [&n.pod_range, &n.pod_range6]
                    .into_iter()
                    .filter_map(|r| r.parse().ok())
                    .collect(),
                // Lab nodes have no labels or external addresses.
                ..Default::default()
            })
            .collect()
    }

    /// Writes the lab's Node objects (what the daemons know of the cluster's nodes),
    /// only when they changed: every write makes each daemon reload. Tests pass other
    /// objects to readdress or remove a node.
    pub fn publish_nodes(&self, nodes: &[weft_topology::ClusterNode]) -> Result<(), LabError> {
        let dir = self.topology_dir();
        fs::create_dir_all(&dir).map_err(|e| LabError::io("creating the lab directory", e))?;
        let mut text = String::new();
        for n in nodes {
            text.push_str("---\n");
            text.push_str(
                &serde_yaml_ng::to_string(&crate::kinds::node(n)).map_err(|e| LabError::Command {
                    what: "writing the Node objects".into(),
                    detail: e.to_string(),
                })?,
            );
        }
        crate::kinds::write_file(&dir, "nodes.yaml", &text)?;
        Ok(())
    }

    /// The name of the namespace of node `node`.
    pub fn node_ns(&self, node: &str) -> String {
        format!("{}-{node}", self.spec.name)
    }

    /// Where the node ends of a node's gRPC wire ends live: [`WIRE_END_SHARDS`] shard
    /// namespaces named after the node's (its weftd's `--wire-ends-netns` and
    /// `--wire-ends-shards`), so a lab of thousands of gRPC links comes up in time
    /// near linear in its links (see `NodeEnds`).
    pub fn wire_ends(&self, node: &str) -> weft_kernel::packet::NodeEnds {
        weft_kernel::packet::NodeEnds::Shards {
            prefix: format!("{}-{node}-e", self.spec.name),
            count: WIRE_END_SHARDS,
        }
    }

    /// Keeps the lab's state (daemon directories, topology) under `dir` instead.
    pub fn with_state_dir(mut self, dir: PathBuf) -> Self {
        self.state = dir;
        self
    }

    /// The name of the network namespace of pod `pod` (`NS/NAME`, or a unique `NAME`;
    /// a name that is no pod's gets the name such a pod would have in `default`).
    pub fn pod_ns(&self, pod: &str) -> String {
        match self.find_pod(pod) {
            Ok(p) => self.netns_of(p),
            Err(_) => format!("{}-p-{}", self.spec.name, pod.rsplit('/').next().unwrap_or(pod)),
        }
    }

    /// The name of the network namespace of pod `p`.
    pub fn netns_of(&self, p: &PodSpec) -> String {
        pod_netns(&self.spec.name, p)
    }

    /// Where the lab keeps its state.
    pub(crate) fn state_dir(&self) -> &Path {
        &self.state
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.state.join("nodes").join(node)
    }

    /// The admin socket of node `node`'s weftd.
    pub fn socket(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("weftd.sock")
    }

    /// The node pod `pod` (`NS/NAME`, or a unique `NAME`) runs on.
    pub fn node_of(&self, pod: &str) -> Option<&str> {
        self.find_pod(pod).ok().map(|p| p.node.as_str())
    }

    /// The router's and the node's underlay addresses (with prefix): the router takes the
    /// subnet's first address; a node takes the second, or on a shared segment the
    /// `index + 2`-th.
    fn node_address(&self, n: &NodeSpec) -> (String, String) {
        let nth = match self.spec.underlay {
            Underlay::Routed => 1,
            Underlay::Shared => n.index + 1,
        };
        let mut hosts = n.subnet.hosts();
        let gw = hosts.next().expect("validated");
        let addr = hosts.nth(nth - 1).unwrap_or(gw);
        let p = n.subnet.prefix_len();
        (format!("{gw}/{p}"), format!("{addr}/{p}"))
    }

    /// The router's and the node's IPv6 underlay addresses (with prefix) on a shared
    /// segment of a lab with IPv6: `fd00:172:30::1` and `fd00:172:30::<index + 2>`, so
    /// the nodes' IPv6 pod ranges are routed directly too. `None` elsewhere (IPv6 pod
    /// ranges then cross an IPv4 underlay through VXLAN).
    fn node_address6(&self, n: &NodeSpec) -> Option<(String, String)> {
        (self.spec.underlay == Underlay::Shared && self.spec.ipv6)
            .then(|| (format!("{SEGMENT6}1/64"), format!("{SEGMENT6}{:x}/64", n.index + 2)))
    }

    /// The IPv6 underlay address of node `node`, when it has one (see `node_address6`).
    pub fn address6_of(&self, node: &str) -> Option<String> {
        let n = self.spec.nodes.iter().find(|n| n.name == node)?;
        Some(self.node_address6(n)?.1.split('/').next()?.to_string())
    }

    /// The underlay address of node `node`.
    pub fn address_of(&self, node: &str) -> Option<String> {
        let n = self.spec.nodes.iter().find(|n| n.name == node)?;
        Some(self.node_address(n).1.split('/').next()?.to_string())
    }

    /// The directory the daemons read topologies from.
    pub fn topology_dir(&self) -> PathBuf {
        self.state.join("topology")
    }

    /// Where the lab's background scenario logs its steps (JSON lines) and how it
    /// ended.
    pub fn scenario_log(&self) -> PathBuf {
        self.state.join("scenario.log")
    }

    /// The pid of the lab's background scenario, if it runs.
    pub fn scenario_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.state.join("scenario.pid")).ok()?;
        let mut parts = text.split_whitespace();
        let pid: u32 = parts.next()?.parse().ok()?;
        let started: u64 = parts.next()?.parse().ok()?;
        alive(pid, started).then_some(pid)
    }

    /// The pid of a node's weftd, if it runs.
    pub fn daemon_pid(&self, node: &str) -> Option<u32> {
        let text = fs::read_to_string(self.node_dir(node).join("weftd.pid")).ok()?;
        let mut parts = text.split_whitespace();
        let pid: u32 = parts.next()?.parse().ok()?;
        let started: u64 = parts.next()?.parse().ok()?;
        alive(pid, started).then_some(pid)
    }
}

#[cfg(test)]
mod tests;
