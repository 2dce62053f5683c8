//! Multi-node labs on one machine (`weftctl lab`): a router namespace joining one
//! namespace per node, each node in its own subnet (so the underlay is routed, never
//! broadcast: the NBMA case), a weftd per node sharing one topology directory, and pods
//! as namespaces attached through the real plugin. Everything lives under a state
//! directory and is found again from it, so `up` is idempotent and restarts what is
//! missing (a crashed daemon), `check` tests every link, `down` removes it all.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use weft_topology::{LinkKind, Topology, WireState};

use weft_harness::{CniExec, CniVars, DaemonConfig, NamedNetns, NodeDaemon, ip, wait_for_socket};

use crate::LabError;

/// A lab description (`examples/lab.yaml`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LabSpec {
    /// The lab's name: prefix of every namespace it creates.
    pub name: String,
    /// How links between nodes are carried unless a link says (`vxlan` or `grpc`).
    #[serde(default = "default_kind")]
    pub inter_node_link: String,
    /// The nodes: names, or objects naming their subnet and pod range too.
    pub nodes: Vec<NodeSpec>,
    /// The pods and the node each runs on.
    pub pods: Vec<PodSpec>,
    /// Topology objects written inline (meshnet/KNE objects, unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topologies: Vec<serde_json::Value>,
    /// A directory of Topology files (YAML or JSON), relative to the lab file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_dir: Option<PathBuf>,
    /// Kubernetes namespaces with their labels and annotations, for network policy; a
    /// namespace a pod uses exists whether it is listed or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceSpec>,
    /// NetworkPolicy objects (`networking.k8s.io/v1`) written inline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<serde_json::Value>,
    /// Files of NetworkPolicy objects (YAML or JSON, several documents each), relative
    /// to the lab file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_files: Vec<PathBuf>,
    /// Each daemon's `--reconcile-interval` in seconds: how soon kernel drift (a
    /// deleted route, veth or FDB entry) is repaired. Shorter than a node's default of
    /// 60 s, because a lab is where drift is made on purpose.
    #[serde(default = "default_reconcile_interval")]
    pub reconcile_interval: u64,
    /// How the nodes are joined: `routed` (each node in its own subnet behind the
    /// router: no shared broadcast domain, so pod traffic between nodes goes through
    /// VXLAN) or `shared` (every node on one segment, a bridge in the router namespace:
    /// direct routes).
    #[serde(default)]
    pub underlay: Underlay,
    /// MTU of every underlay link (the nodes' uplinks and the router's ends).
    #[serde(default = "default_underlay_mtu")]
    pub underlay_mtu: u32,
    /// Gives every node an IPv6 pod range too (`fd00:10:244:<i>::/64` unless a node
    /// names its own).
    #[serde(default)]
    pub ipv6: bool,
    /// Each daemon's `--pod-routing` (`auto`, `direct`, `vxlan`, `none`).
    #[serde(default = "default_pod_routing")]
    pub pod_routing: String,
    /// How the nodes' wire ports are protected: `mtls` (the default: the lab makes a
    /// CA and a certificate per node naming its name and address) or `insecure`
    /// (plaintext, `--wire-insecure`).
    #[serde(default)]
    pub wire_security: WireSecurityMode,
    /// How many pods `up` attaches (and `down` detaches) at a time. 1, the default,
    /// attaches them in the file's order, which labs about arrival order rely on; a
    /// big lab (`lab gen` writes 8) attaches as a runtime starting many pods does,
    /// since one at a time 500 pods took minutes.
    #[serde(default = "default_parallel_attach")]
    pub parallel_attach: usize,
}

fn default_parallel_attach() -> usize {
    1
}

/// How a lab's wire ports are protected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WireSecurityMode {
    /// Mutual TLS with lab-made certificates.
    #[default]
    Mtls,
    /// Plaintext.
    Insecure,
}

/// How the nodes of a lab are joined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Underlay {
    /// Each node in its own subnet behind the router.
    #[default]
    Routed,
    /// Every node on one segment.
    Shared,
}

fn default_kind() -> String {
    LinkKind::Vxlan.to_string()
}

fn default_underlay_mtu() -> u32 {
    1500
}

fn default_pod_routing() -> String {
    "auto".into()
}

/// The address of the lab's "outside" namespace, standing for the internet: it routes
/// back to the nodes' underlay, never to pod ranges, so it answers pods only through
/// masquerade.
pub const OUTSIDE_ADDRESS: &str = "198.51.100.2";
const OUTSIDE_GATEWAY: &str = "198.51.100.1/24";

fn default_reconcile_interval() -> u64 {
    10
}

/// One node of a lab: just its name (`- n1`), or its name with the addresses to use.
#[derive(Debug, Clone, Serialize)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// The node's underlay subnet: the router takes the first address, the node the
    /// second (default `172.30.<i>.0/24` for the i-th node, from 1).
    pub subnet: Ipv4Net,
    /// The range the node's pods get their `eth0` address from (default
    /// `10.244.<i>.0/24`): its Node's first podCIDR.
    pub pod_range: String,
    /// Its IPv6 pod range, when the lab has IPv6 (default `fd00:10:244:<i>::/64`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_range6: String,
    /// Its position in the lab (from 0), which places it on a shared segment.
    #[serde(skip)]
    pub index: usize,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NodeForm {
    Name(String),
    Full {
        name: String,
        #[serde(default)]
        subnet: Option<Ipv4Net>,
        #[serde(default)]
        pod_range: Option<String>,
        #[serde(default)]
        pod_range6: Option<String>,
    },
}

impl<'de> Deserialize<'de> for NodeSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The defaults depend on the node's position, filled in by `Lab::load`; an
        // unspecified subnet is marked by the unspecified network until then.
        let unset: Ipv4Net = "0.0.0.0/32".parse().expect("literal");
        Ok(match NodeForm::deserialize(d)? {
            NodeForm::Name(name) => NodeSpec {
                name,
                subnet: unset,
                pod_range: String::new(),
                pod_range6: String::new(),
                index: 0,
            },
            NodeForm::Full {
                name,
                subnet,
                pod_range,
                pod_range6,
            } => NodeSpec {
                name,
                subnet: subnet.unwrap_or(unset),
                pod_range: pod_range.unwrap_or_default(),
                pod_range6: pod_range6.unwrap_or_default(),
                index: 0,
            },
        })
    }
}

/// One pod of a lab.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    /// The pod's name (its Topology's name).
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// Its Kubernetes namespace. Without one it is the namespace of its Topology (the
    /// first of its name), else `default`, as before namespaces could be given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its labels (what policies select it by).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its container ports (what a policy's named ports resolve to).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PodPort>,
}

/// A container port of a lab pod, as in a Pod's `spec.containers[].ports[]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodPort {
    /// The port's name (optional; a policy names ports by it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The port number.
    pub container_port: u16,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
}

fn default_protocol() -> String {
    "TCP".into()
}

/// A Kubernetes namespace of a lab.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSpec {
    /// Its name (a DNS label).
    pub name: String,
    /// Its labels (the lab adds `kubernetes.io/metadata.name`, as the API server does).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its annotations (`weft.dev/policy-mode: audit` puts its policies in audit mode).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

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
}

/// The outcome of checking one link from one side.
#[derive(Debug, Clone, Serialize)]
pub struct LinkCheck {
    /// `pod:intf`.
    pub from: String,
    /// `peer:intf`.
    pub to: String,
    /// How the link is carried (as the node's wire state says), `?` when unknown.
    pub kind: String,
    /// Whether the peer answered.
    pub ok: bool,
    /// The round-trip time of the echo that was answered, milliseconds.
    pub rtt_ms: Option<f64>,
    /// How long until the peer answered (or until giving up), milliseconds.
    pub waited_ms: u64,
    /// Why it failed, when it did: what the echoes met (no route, no reply to so many)
    /// and the state of the link's interface, so a failure says where to look.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// An operator took the link down (`weftctl link down`): not answering is
    /// expected, not a failure. Filled in by whoever can ask the nodes (`weftctl lab
    /// check`); the lab itself leaves it false.
    #[serde(default)]
    pub down_by_intent: bool,
}

/// A process's state letter and start time (in clock ticks since boot), from
/// `/proc/<pid>/stat`; the start time tells a process from a later one with its pid.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.first()?.chars().next()?, fields.get(19)?.parse().ok()?))
}

/// Whether the process recorded as `pid` (started at `started`) still runs. Its command
/// line is no help: between fork and exec the child still shows its parent's.
fn alive(pid: u32, started: u64) -> bool {
    proc_stat(pid).is_some_and(|(state, start)| start == started && state != 'Z' && state != 'X')
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
        if !spec.inter_node_link.parse().is_ok_and(LinkKind::crosses_nodes) {
            return Err(bad(format!(
                "inter_node_link {:?}: vxlan or grpc",
                spec.inter_node_link
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
        if !(576..=65535).contains(&spec.underlay_mtu) {
            return Err(bad(format!("underlay_mtu {}: 576 to 65535", spec.underlay_mtu)));
        }
        if !["auto", "direct", "vxlan", "none"].contains(&spec.pod_routing.as_str()) {
            return Err(bad(format!(
                "pod_routing {:?}: auto, direct, vxlan or none",
                spec.pod_routing
            )));
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
            crate::objects::check_pod(p).map_err(|e| bad(format!("pod {}: {e}", p.name)))?;
        }
        crate::objects::check_namespaces(&spec.namespaces).map_err(bad)?;
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
            policies.extend(crate::objects::read_policies(v.clone(), &what).map_err(bad)?);
        }
        for f in &spec.policy_files {
            let f = path.parent().unwrap_or(Path::new(".")).join(f);
            let text = fs::read_to_string(&f).map_err(|e| bad(format!("reading {}: {e}", f.display())))?;
            policies.extend(crate::objects::parse_policies(&text, &f.display().to_string()).map_err(bad)?);
        }
        let mut policy_keys = std::collections::BTreeSet::new();
        for p in &policies {
            let key = crate::objects::object_key(p);
            crate::objects::check_policy(p, &namespaces).map_err(bad)?;
            if !policy_keys.insert(key.clone()) {
                return Err(bad(format!("NetworkPolicy {key}: given twice")));
            }
        }
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

    fn router(&self) -> String {
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
                addresses: self
                    .address_of(&n.name)
                    .and_then(|a| a.parse().ok())
                    .into_iter()
                    .collect(),
                pod_cidrs: [&n.pod_range, &n.pod_range6]
                    .into_iter()
                    .filter_map(|r| r.parse().ok())
                    .collect(),
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
            let mut v = serde_json::to_value(n.to_node()).map_err(|e| LabError::Command {
                what: "writing the Node objects".into(),
                detail: e.to_string(),
            })?;
            v["apiVersion"] = "v1".into();
            v["kind"] = "Node".into();
            text.push_str("---\n");
            text.push_str(&serde_yaml_ng::to_string(&v).map_err(|e| LabError::Command {
                what: "writing the Node objects".into(),
                detail: e.to_string(),
            })?);
        }
        let file = dir.join("nodes.yaml");
        if fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            // Through a rename, so a daemon never reads half of it.
            let tmp = dir.join(".nodes.yaml.tmp");
            fs::write(&tmp, &text).map_err(|e| LabError::io("writing the Node objects", e))?;
            fs::rename(&tmp, &file).map_err(|e| LabError::io("writing the Node objects", e))?;
        }
        Ok(())
    }

    /// The name of the namespace of node `node`.
    pub fn node_ns(&self, node: &str) -> String {
        format!("{}-{node}", self.spec.name)
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

    /// The underlay address of node `node`.
    pub fn address_of(&self, node: &str) -> Option<String> {
        let n = self.spec.nodes.iter().find(|n| n.name == node)?;
        Some(self.node_address(n).1.split('/').next()?.to_string())
    }

    /// The directory the daemons read topologies from.
    pub fn topology_dir(&self) -> PathBuf {
        self.state.join("topology")
    }

    /// The pid of a node's weftd, if it runs.
    pub fn daemon_pid(&self, node: &str) -> Option<u32> {
        let text = fs::read_to_string(self.node_dir(node).join("weftd.pid")).ok()?;
        let mut parts = text.split_whitespace();
        let pid: u32 = parts.next()?.parse().ok()?;
        let started: u64 = parts.next()?.parse().ok()?;
        alive(pid, started).then_some(pid)
    }

    /// Builds what is missing: namespaces, underlay, daemons (restarting crashed
    /// ones), pods. Returns the nodes whose daemon it started.
    pub fn up(&self) -> Result<Vec<String>, LabError> {
        let topo_dir = self.topology_dir();
        fs::create_dir_all(&topo_dir).map_err(|e| LabError::io("creating the lab directory", e))?;
        let mut text = String::new();
        for t in &self.topologies {
            let doc = serde_yaml_ng::to_string(t).map_err(|e| LabError::Command {
                what: "writing the topology".into(),
                detail: e.to_string(),
            })?;
            text.push_str("---\n");
            text.push_str(&doc);
        }
        // Written only when it changed: every write makes each daemon reload.
        let file = topo_dir.join("topology.yaml");
        if fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            fs::write(&file, text).map_err(|e| LabError::io("writing the topology", e))?;
        }
        // Every node as a Node object, read by each daemon through the same directory
        // source a standalone node uses: the lab runs the code a cluster runs.
        let nodes = self.node_objects();
        self.publish_nodes(&nodes)?;
        // As the API server has a pod before kubelet runs its sandbox: the Namespaces,
        // the NetworkPolicies and every Pod (without addresses until its ADD) are there
        // before any ADD, so a daemon polices a new pod by its labels from the start.
        let running_before = self.spec.nodes.iter().any(|n| self.daemon_pid(&n.name).is_some());
        let pods_changed = self.publish_objects()?;
        let router = self.router();
        let mtu = self.spec.underlay_mtu.to_string();
        if !NamedNetns::exists(&router) {
            NamedNetns::create(&router)?.keep();
            ip(&["netns", "exec", &router, "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
            if self.spec.underlay == Underlay::Shared {
                let gw = self.node_address(&self.spec.nodes[0]).0;
                ip(&["-n", &router, "link", "add", "seg", "mtu", &mtu, "type", "bridge"])?;
                ip(&["-n", &router, "addr", "add", &gw, "dev", "seg"])?;
                ip(&["-n", &router, "link", "set", "seg", "up"])?;
            }
        }
        let outside = self.outside_ns();
        if !NamedNetns::exists(&outside) {
            // The internet: one address behind the router, a route back to the nodes'
            // underlay and none to pod ranges.
            NamedNetns::create(&outside)?.keep();
            ip(&[
                "-n", &router, "link", "add", "out", "type", "veth", "peer", "name", "eth0", "netns", &outside,
            ])?;
            ip(&["-n", &router, "addr", "add", OUTSIDE_GATEWAY, "dev", "out"])?;
            ip(&["-n", &router, "link", "set", "out", "up"])?;
            ip(&[
                "-n",
                &outside,
                "addr",
                "add",
                &format!("{OUTSIDE_ADDRESS}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &outside, "link", "set", "eth0", "up"])?;
            ip(&["-n", &outside, "link", "set", "lo", "up"])?;
            let mut subnets: Vec<String> = self.spec.nodes.iter().map(|n| n.subnet.trunc().to_string()).collect();
            subnets.dedup();
            for net in subnets {
                ip(&[
                    "-n",
                    &outside,
                    "route",
                    "add",
                    &net,
                    "via",
                    OUTSIDE_GATEWAY.split('/').next().unwrap_or_default(),
                ])?;
            }
        }
        let mut started = Vec::new();
        for n in &self.spec.nodes {
            let ns = self.node_ns(&n.name);
            let (gw, addr) = self.node_address(n);
            if !NamedNetns::exists(&ns) {
                NamedNetns::create(&ns)?.keep();
                let rt_if = format!("u-{}", n.name);
                ip(&[
                    "-n", &router, "link", "add", &rt_if, "mtu", &mtu, "type", "veth", "peer", "name", "uplink", "mtu",
                    &mtu, "netns", &ns,
                ])?;
                match self.spec.underlay {
                    Underlay::Routed => ip(&["-n", &router, "addr", "add", &gw, "dev", &rt_if])?,
                    Underlay::Shared => ip(&["-n", &router, "link", "set", &rt_if, "master", "seg"])?,
                };
                ip(&["-n", &router, "link", "set", &rt_if, "up"])?;
                ip(&["-n", &ns, "addr", "add", &addr, "dev", "uplink"])?;
                ip(&["-n", &ns, "link", "set", "uplink", "up"])?;
                ip(&["-n", &ns, "link", "set", "lo", "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "route",
                    "add",
                    "default",
                    "via",
                    gw.split('/').next().unwrap_or_default(),
                ])?;
            }
            if self.daemon_pid(&n.name).is_none() {
                self.start_daemon(n)?;
                started.push(n.name.clone());
            }
        }
        for n in &self.spec.nodes {
            self.wait_for_socket(&n.name)?;
        }
        // Before the pods resolve their peers: the neighbour table is the machine's,
        // and a big lab outgrows its default size (see `neigh`).
        let links: usize = self.topologies.iter().map(|t| t.spec.links.len()).sum::<usize>() / 2;
        // Best effort: where /proc/sys is read-only (some containers) small labs still
        // fit the default table.
        if let Err(e) = crate::neigh::reserve(
            &self.state.display().to_string(),
            crate::neigh::need(links, self.spec.pods.len(), self.spec.nodes.len()),
        ) {
            eprintln!("weftctl lab up: {e}; a lab this size may outgrow the neighbour table");
        }
        if pods_changed && running_before {
            // A running daemon sees the files within its reload's debounce (inotify);
            // a daemon started above read them at start.
            std::thread::sleep(crate::objects::SETTLE);
        }
        self.attach_all()?;
        Ok(started)
    }

    fn start_daemon(&self, n: &NodeSpec) -> Result<(), LabError> {
        let dir = self.node_dir(&n.name);
        fs::create_dir_all(&dir).map_err(|e| LabError::io("creating the node directory", e))?;
        let addr = self.address_of(&n.name).unwrap_or_default();
        let mut config = DaemonConfig::under(&self.weftd, &dir, &n.name);
        config.socket = self.socket(&n.name);
        config.metrics_addr = "0.0.0.0:9384".into();
        config.args = vec![
            "--node-address".into(),
            addr.clone(),
            "--topology-dir".into(),
            self.topology_dir().display().to_string(),
            "--wire-addr".into(),
            format!("{addr}:9385"),
            "--inter-node-link".into(),
            self.spec.inter_node_link.clone(),
            "--reconcile-interval".into(),
            self.spec.reconcile_interval.to_string(),
            "--pod-routing".into(),
            self.spec.pod_routing.clone(),
        ];
        match self.spec.wire_security {
            WireSecurityMode::Mtls => {
                let tls = self.wire_tls_dir(&n.name);
                self.issue_node_cert(&n.name, &addr, &tls)?;
                config.args.extend(["--wire-tls-dir".into(), tls.display().to_string()]);
            }
            WireSecurityMode::Insecure => config.args.push("--wire-insecure".into()),
        }
        // The daemon outlives this command: `down` (maybe another process) finds it
        // through the pid file.
        config.own_session = true;
        let node = NamedNetns::existing(&self.node_ns(&n.name));
        let pid = NodeDaemon::spawn(&node, config)?.detach().unwrap_or_default();
        let started = proc_stat(pid).map(|(_, t)| t).unwrap_or_default();
        fs::write(dir.join("weftd.pid"), format!("{pid} {started}")).map_err(|e| LabError::io("writing the pid", e))?;
        Ok(())
    }

    /// The directory of a node's wire TLS files (`--wire-tls-dir`).
    pub fn wire_tls_dir(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("wire-tls")
    }

    /// The lab's CA (certificate and key), made on first use.
    pub fn authority(&self) -> Result<weft_wiretls::issue::Authority, LabError> {
        let dir = self.state.join("ca");
        let tls = |e: weft_wiretls::TlsError| LabError::Command {
            what: "the lab's wire CA".into(),
            detail: e.to_string(),
        };
        if dir.join(weft_wiretls::issue::CA_KEY_FILE).exists() {
            return weft_wiretls::issue::Authority::load(&dir).map_err(tls);
        }
        let ca =
            weft_wiretls::issue::Authority::generate(&format!("weft lab {} wire CA", self.spec.name)).map_err(tls)?;
        ca.save(&dir).map_err(tls)?;
        Ok(ca)
    }

    /// Gives node `node` at `addr` a certificate of the lab's CA in `dir`, unless it
    /// has one there already (a restarted daemon keeps its identity).
    fn issue_node_cert(&self, node: &str, addr: &str, dir: &Path) -> Result<(), LabError> {
        if dir.join(weft_wiretls::CERT_FILE).exists() {
            return Ok(());
        }
        let ca = self.authority()?;
        let tls = |e: weft_wiretls::TlsError| LabError::Command {
            what: format!("issuing {node}'s wire certificate"),
            detail: e.to_string(),
        };
        let ip: std::net::IpAddr = addr.parse().map_err(|_| LabError::Command {
            what: format!("issuing {node}'s wire certificate"),
            detail: format!("{addr:?} is not an address"),
        })?;
        let cert = ca.issue(node, &[ip]).map_err(tls)?;
        weft_wiretls::issue::write_tls_dir(dir, ca.cert_pem(), &cert).map_err(tls)
    }

    fn wait_for_socket(&self, node: &str) -> Result<(), LabError> {
        if wait_for_socket(&self.socket(node), Duration::from_secs(20), || {
            self.daemon_pid(node).is_some()
        }) {
            return Ok(());
        }
        let log = self.node_dir(node).join("weftd.log");
        let text = fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Err(LabError::Command {
            what: format!("starting weftd on {node}"),
            detail: format!("not serving; {} ends with:\n{}", log.display(), tail.join("\n")),
        })
    }

    /// The node's network config: like a cluster's, without `ranges` (the node's
    /// daemon serves ADDs from its Node's podCIDRs) and without `mtu` (from the
    /// underlay).
    fn config(&self, n: &NodeSpec) -> Vec<u8> {
        serde_json::json!({
            "cniVersion": "1.1.0", "name": "weft", "type": "weft",
            "socket": self.socket(&n.name),
        })
        .to_string()
        .into_bytes()
    }

    /// Runs CNI `command` for pod `p` on node `n` and returns what the plugin printed.
    fn cni(&self, n: &NodeSpec, p: &PodSpec, command: &str) -> Result<Vec<u8>, LabError> {
        let ns = self.netns_of(p);
        let args = format!("K8S_POD_NAMESPACE={};K8S_POD_NAME={}", self.namespace_of(p), p.name);
        let node = NamedNetns::existing(&self.node_ns(&n.name));
        let vars = CniVars {
            command,
            container_id: &ns,
            netns: &format!("/run/netns/{ns}"),
            ifname: "eth0",
            args: &args,
        };
        let out = CniExec::new(&self.plugin).call(&node, &vars, &self.config(n))?;
        if out.ok() {
            Ok(out.stdout)
        } else {
            Err(LabError::Command {
                what: format!("CNI {command} of pod {}/{} on {}", self.namespace_of(p), p.name, n.name),
                detail: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            })
        }
    }

    /// Attaches every pod, `parallel_attach` at a time (in the file's order when 1),
    /// and reports the first failure.
    fn attach_all(&self) -> Result<(), LabError> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed: std::sync::Mutex<Option<LabError>> = std::sync::Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..self.spec.parallel_attach.clamp(1, 64).min(self.spec.pods.len()) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(p) = self.spec.pods.get(i) else { break };
                        if failed.lock().expect("not poisoned").is_some() {
                            break;
                        }
                        if let Err(e) = self.node(&p.node).and_then(|n| self.attach(n, p)) {
                            failed.lock().expect("not poisoned").get_or_insert(e);
                        }
                    }
                });
            }
        });
        match failed.into_inner().expect("not poisoned") {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn attach(&self, n: &NodeSpec, p: &PodSpec) -> Result<(), LabError> {
        let ns = self.netns_of(p);
        if !NamedNetns::exists(&ns) {
            NamedNetns::create(&ns)?.keep();
        }
        // ADD is idempotent: an attached pod gets its stored result back. Its Pod object
        // is written already; its addresses go into it after, as kubelet reports them.
        let result = self.cni(n, p, "ADD")?;
        self.report_pod_ips(p, crate::objects::result_ips(&result))
    }

    /// Detaches a pod (CNI DEL on its node) and removes its namespace and its Pod
    /// object, as a runtime and the API server do when a pod is deleted.
    pub fn remove_pod(&self, pod: &str) -> Result<(), LabError> {
        let p = self.find_pod(pod).map_err(|e| LabError::Command {
            what: format!("removing {pod}"),
            detail: e.to_string(),
        })?;
        let n = self.node(&p.node)?;
        self.cni(n, p, "DEL")?;
        NamedNetns::existing(&self.netns_of(p)).delete()?;
        self.delete_pod_object(p)
    }

    /// Sends SIGKILL to a node's weftd (pods and wires stay; `up` restarts it), and
    /// returns once it is gone: its process has exited and its state directory's lock
    /// is free, so an `up` right after starts the next daemon cleanly.
    pub fn crash(&self, node: &str) -> Result<(), LabError> {
        let pid = self.daemon_pid(node).ok_or_else(|| LabError::Command {
            what: format!("crashing {node}"),
            detail: "its weftd is not running".into(),
        })?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .map_err(|e| LabError::io("killing weftd", e.into()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.daemon_pid(node).is_some() || !self.state_unlocked(node) {
            if Instant::now() > deadline {
                return Err(LabError::Command {
                    what: format!("crashing {node}"),
                    detail: format!("weftd (pid {pid}) still holds its state 30 s after SIGKILL"),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Whether nobody holds the lock of a node's state directory (tried and released).
    fn state_unlocked(&self, node: &str) -> bool {
        let path = self.node_dir(node).join("state").join("weftd.lock");
        let Ok(file) = fs::OpenOptions::new().write(true).open(&path) else {
            return true;
        };
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
    }

    /// The addresses of a pod's `eth0` (global scope, IPv4 first); the pod is `NS/NAME`
    /// or a unique `NAME`.
    pub fn pod_addresses(&self, pod: &str) -> Vec<std::net::IpAddr> {
        netns_addresses(&self.pod_ns(pod))
    }

    /// Pings over the pod network rather than the wires, each until it answers or
    /// `within` has passed: from every pod, every pod on another node over `eth0` (every
    /// address family they share; kind `eth0`), every other node's address (`node`), and
    /// the outside namespace (`outside`, which answers only through masquerade).
    pub fn check_network(&self, within: Duration) -> Vec<LinkCheck> {
        // (source's network namespace, source, target, address, kind)
        let mut probes: Vec<(String, String, String, String, &'static str)> = Vec::new();
        // (pod, how it is named, its network namespace, its addresses)
        let pods: Vec<(&PodSpec, String, String, Vec<std::net::IpAddr>)> = self
            .spec
            .pods
            .iter()
            .map(|p| {
                let ns = self.netns_of(p);
                let addrs = netns_addresses(&ns);
                (p, self.pod_ref(p), ns, addrs)
            })
            .collect();
        for (p, me, ns, mine) in &pods {
            for (_, them, _, theirs) in pods.iter().filter(|(q, ..)| q.node != p.node) {
                for a in theirs {
                    if mine.iter().any(|b| b.is_ipv6() == a.is_ipv6()) {
                        let to = format!("{them}:eth0 {a}");
                        probes.push((ns.clone(), me.clone(), to, a.to_string(), "eth0"));
                    }
                }
            }
            for n in self.spec.nodes.iter().filter(|n| n.name != p.node) {
                if let Some(a) = self.address_of(&n.name) {
                    probes.push((ns.clone(), me.clone(), format!("node {} {a}", n.name), a, "node"));
                }
            }
            probes.push((
                ns.clone(),
                me.clone(),
                format!("outside {OUTSIDE_ADDRESS}"),
                OUTSIDE_ADDRESS.to_string(),
                "outside",
            ));
        }
        // In-process echoes, a bounded number of namespaces at a time (see `ping`): a
        // process per probe does not scale to the pods-squared probes of a big lab.
        let targets: Vec<(String, String)> = probes
            .iter()
            .map(|(ns, _, _, addr, _)| (ns.clone(), addr.clone()))
            .collect();
        let found = crate::ping::ping_all(&targets, within);
        probes
            .iter()
            .zip(found)
            .map(|((_, pod, to, _, kind), o)| LinkCheck {
                kind: (*kind).to_string(),
                from: format!("{pod}:eth0"),
                to: to.clone(),
                ok: o.rtt_ms.is_some(),
                rtt_ms: o.rtt_ms,
                waited_ms: o.waited_ms,
                reason: o.reason,
                down_by_intent: false,
            })
            .collect()
    }

    /// The wire kinds the nodes report, by `pod:intf`.
    fn kinds(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Ok(dir) = fs::read_dir(self.topology_dir().join(".wires")) else {
            return out;
        };
        for e in dir.flatten() {
            let Ok(text) = fs::read_to_string(e.path()) else {
                continue;
            };
            let Ok(ws) = serde_json::from_str::<WireState>(&text) else {
                continue;
            };
            for w in ws.status.map(|s| s.wires).unwrap_or_default() {
                out.insert(format!("{}:{}", w.local_pod, w.local_intf), w.kind.as_str().to_string());
            }
        }
        out
    }

    /// A pod interface's state as `ip` reports it (`missing`, `DOWN`, `UP
    /// NO-CARRIER`, its addresses), to say why a link did not answer.
    fn interface_state(&self, netns: &str, intf: &str) -> Option<String> {
        let out = Command::new("ip")
            .args(["-j", "-n", netns, "addr", "show", "dev", intf])
            .output()
            .ok()?;
        if !out.status.success() {
            return Some("missing".into());
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let l = v.get(0)?;
        let flags: Vec<&str> = l["flags"].as_array()?.iter().filter_map(|f| f.as_str()).collect();
        let addrs: Vec<String> = l["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| Some(format!("{}/{}", a["local"].as_str()?, a["prefixlen"].as_u64()?)))
            .collect();
        Some(format!(
            "state {} flags {} addresses [{}]",
            l["operstate"].as_str().unwrap_or("?"),
            flags.join(","),
            addrs.join(" ")
        ))
    }

    /// Pings the peer address of every link with one from its pod, each until it
    /// answers or `within` has passed since its pod's first echo.
    pub fn check(&self, within: Duration) -> Vec<LinkCheck> {
        // (pod, its network namespace, link, peer address)
        let links: Vec<(String, String, &weft_topology::Link, &str)> = self
            .topologies
            .iter()
            .flat_map(|t| {
                let pod = t.metadata.name.clone().unwrap_or_default();
                let netns = match self.pod_of_topology(t) {
                    Some(p) => self.netns_of(p),
                    None => format!("{}-p-{pod}", self.spec.name),
                };
                t.spec.links.iter().filter_map(move |l| {
                    let peer_ip = l.peer_ip.split('/').next().filter(|s| !s.is_empty())?;
                    Some((pod.clone(), netns.clone(), l, peer_ip))
                })
            })
            .collect();
        // In-process echoes, every link of a pod at once and a bounded number of pods
        // at a time, resent until answered within `within` (see `ping`): a `ping`
        // process per link end starved a 1,500-link lab of CPU until live links timed
        // out.
        let targets: Vec<(String, String)> = links
            .iter()
            .map(|(_, netns, _, peer_ip)| (netns.clone(), peer_ip.to_string()))
            .collect();
        let found = crate::ping::ping_all(&targets, within);
        let mut out: Vec<LinkCheck> = links
            .iter()
            .zip(found)
            .map(|((pod, netns, l, _), o)| {
                let reason = o.reason.map(|r| match self.interface_state(netns, &l.local_intf) {
                    Some(state) => format!("{r}; {}: {state}", l.local_intf),
                    None => r,
                });
                LinkCheck {
                    kind: String::new(),
                    from: format!("{pod}:{}", l.local_intf),
                    to: format!("{}:{}", l.peer_pod, l.peer_intf),
                    ok: o.rtt_ms.is_some(),
                    rtt_ms: o.rtt_ms,
                    waited_ms: o.waited_ms,
                    reason,
                    down_by_intent: false,
                }
            })
            .collect();
        // Read after the traffic: a link that answered has been mirrored by now, or
        // its other end has.
        let kinds = self.kinds();
        for c in &mut out {
            c.kind = kinds
                .get(&c.from)
                .or_else(|| kinds.get(&c.to))
                .cloned()
                .unwrap_or_else(|| "?".into());
        }
        out
    }

    /// Runs a command inside the namespace of a node or a pod (`NS/NAME`, or a unique
    /// `NAME`).
    pub fn exec(&self, name: &str, argv: &[String]) -> Result<std::process::ExitStatus, LabError> {
        let ns = self.target_ns(name).map_err(|e| LabError::Command {
            what: format!("exec in {name}"),
            detail: match e {
                LabError::Command { detail, .. } => detail,
                e => e.to_string(),
            },
        })?;
        NamedNetns::existing(&ns)
            .command(argv)
            .status()
            .map_err(|e| LabError::io("running the command", e))
    }

    /// Removes the lab: pods (through CNI DEL), daemons, namespaces, state.
    pub fn down(&self) -> Result<(), LabError> {
        // `parallel_attach` DELs at a time, as in `up`.
        let dels: Vec<(&NodeSpec, &PodSpec)> = self
            .spec
            .nodes
            .iter()
            .filter(|n| self.daemon_pid(&n.name).is_some())
            .flat_map(|n| self.spec.pods.iter().filter(|p| p.node == n.name).map(move |p| (n, p)))
            .filter(|(_, p)| NamedNetns::exists(&self.netns_of(p)))
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..self.spec.parallel_attach.clamp(1, 64).min(dels.len()) {
                scope.spawn(|| {
                    while let Some((n, pod)) = dels.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                        if let Err(e) = self.cni(n, pod, "DEL") {
                            eprintln!("weftctl lab down: {e}");
                        }
                    }
                });
            }
        });
        for n in &self.spec.nodes {
            if let Some(pid) = self.daemon_pid(&n.name) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let deadline = Instant::now() + Duration::from_secs(10);
                while self.daemon_pid(&n.name).is_some() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if self.daemon_pid(&n.name).is_some() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let mut names: Vec<String> = self.spec.pods.iter().map(|p| self.netns_of(p)).collect();
        names.extend(self.spec.nodes.iter().map(|n| self.node_ns(&n.name)));
        names.push(self.outside_ns());
        names.push(self.router());
        for ns in names {
            if NamedNetns::exists(&ns) {
                let _ = NamedNetns::existing(&ns).delete();
            }
        }
        let _ = fs::remove_dir_all(&self.state);
        crate::neigh::release(&self.state.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
    }

    /// Writes `text` as a lab file in a directory of its own and loads it.
    fn load_text(text: &str) -> Result<Lab, LabError> {
        let dir = std::env::temp_dir().join(format!("weft-lab-load-{}-{}", std::process::id(), text.len()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("lab.yaml");
        fs::write(&file, text).unwrap();
        let lab = Lab::load(&file);
        let _ = fs::remove_dir_all(&dir);
        lab
    }

    #[test]
    fn pods_without_a_namespace_keep_their_topology_namespace_and_netns() {
        let lab = Lab::load(&examples().join("lab.yaml")).unwrap();
        let r1 = lab.find_pod("r1").unwrap();
        assert_eq!(lab.namespace_of(r1), "lab", "the Topology's namespace");
        assert_eq!(lab.pod_ns("r1"), "wl-p-r1");
        assert_eq!(lab.pod_ns("lab/r1"), "wl-p-r1");
        // A pod without a Topology is in `default`.
        let shared = Lab::load(&examples().join("lab-shared.yaml")).unwrap();
        assert_eq!(shared.namespace_of(shared.find_pod("s1").unwrap()), "default");
        assert_eq!(shared.pods_of("n1"), ["s1", "s2"]);
    }

    #[test]
    fn the_policy_example_names_pods_by_namespace() {
        let lab = Lab::load(&examples().join("lab-policy.yaml")).unwrap();
        assert_eq!(lab.policies.len(), 2);
        assert_eq!(lab.pod_ns("x/a"), "wp-p-x.a");
        assert_eq!(lab.pod_ns("y/a"), "wp-p-y.a");
        assert_eq!(lab.node_of("y/a"), Some("n2"));
        assert_eq!(lab.node_of("c"), Some("n3"), "a name only one pod has");
        let e = lab.find_pod("a").unwrap_err().to_string();
        assert!(e.contains("x/a, y/a"), "{e}");
        assert!(lab.find_pod("z/a").is_err());
        // Names more than one pod has come with their namespace.
        assert_eq!(lab.pods_of("n2"), ["x/b", "y/a"]);
        assert_eq!(lab.pods_of("n3"), ["c", "y/b"]);
        assert_eq!(lab.namespace_names().into_iter().collect::<Vec<_>>(), ["x", "y"]);
        let expect = fs::read_to_string(examples().join("lab-policy.expect")).unwrap();
        let tables = crate::matrix::parse_tables(&expect).unwrap();
        assert_eq!(tables.len(), 2);
        assert_eq!(tables[1].title, "81/tcp IPv4");
        let policies = fs::read_to_string(examples().join("policies/allow-clients.yaml")).unwrap();
        let p = crate::objects::parse_policies(&policies, "allow-clients.yaml").unwrap();
        crate::objects::check_policy(&p[0], &lab.namespace_names()).unwrap();
    }

    #[test]
    fn pods_are_unique_by_namespace_and_name_and_network_namespace() {
        let base = "name: t\nnodes: [n1]\npods:\n";
        assert!(
            load_text(&format!(
                "{base}  - {{name: a, node: n1, namespace: x}}\n  - {{name: a, node: n1, namespace: y}}\n"
            ))
            .is_ok()
        );
        let e = load_text(&format!(
            "{base}  - {{name: a, node: n1, namespace: x}}\n  - {{name: a, node: n1, namespace: x}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("pod x/a: listed twice"), "{e}");
        // Both would be `t-p-a`.
        let e = load_text(&format!(
            "{base}  - {{name: a, node: n1}}\n  - {{name: a, node: n1, namespace: default}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("listed twice"), "{e}");
        for (bad, want) in [
            ("  - {name: a, node: n1, namespace: X}\n", "namespace \"X\""),
            ("  - {name: a, node: n1, labels: {'a b': c}}\n", "label key"),
            (
                "  - {name: a, node: n1, ports: [{containerPort: 80, protocol: ICMP}]}\n",
                "not TCP, UDP or SCTP",
            ),
            (
                "  - {name: a, node: n1, ports: [{name: HTTP, containerPort: 80}]}\n",
                "port name",
            ),
            ("  - {name: n1, node: n1}\n", "no node's name"),
        ] {
            let e = load_text(&format!("{base}{bad}")).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        // A policy's namespace must be the lab's.
        let policy = "policies:\n  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: p, namespace: z}, spec: {podSelector: {}}}\n";
        let e = load_text(&format!("{base}  - {{name: a, node: n1}}\n{policy}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("namespace z is not in the lab"), "{e}");
        let ok = format!("{base}  - {{name: a, node: n1}}\nnamespaces: [{{name: z}}]\n{policy}");
        assert_eq!(load_text(&ok).unwrap().policies[0]["metadata"]["namespace"], "z");
    }
}
