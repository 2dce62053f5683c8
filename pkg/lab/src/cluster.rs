//! Multi-node labs on one machine (`weftctl lab`): a router namespace joining one
//! namespace per node, each node in its own subnet (so the underlay is routed, never
//! broadcast: the NBMA case), a weftd per node sharing one topology directory, and pods
//! as namespaces attached through the real plugin. Everything lives under a state
//! directory and is found again from it, so `up` is idempotent and restarts what is
//! missing (a crashed daemon), `check` tests every link, `down` removes it all.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use weft_topology::{Topology, WireState};

use crate::{CniExec, LabError, NamedNetns};

/// A lab description (`examples/lab.yaml`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LabSpec {
    /// The lab's name: prefix of every namespace it creates.
    pub name: String,
    /// How links between nodes are carried unless a link says (`vxlan` or `grpc`).
    #[serde(default = "default_kind")]
    pub inter_node_link: String,
    /// The nodes.
    pub nodes: Vec<NodeSpec>,
    /// Topology objects (meshnet/KNE files, unchanged), relative to the lab file.
    pub topology: PathBuf,
}

fn default_kind() -> String {
    "vxlan".into()
}

/// One node of a lab.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// The node's underlay subnet: the router takes the first address, the node the second.
    pub subnet: Ipv4Net,
    /// The range the node's pods get their `eth0` address from.
    pub pod_range: String,
    /// The pods that run on the node (Topology names).
    pub pods: Vec<String>,
}

/// A lab loaded from its file, with where its state lives.
#[derive(Debug, Clone)]
pub struct Lab {
    /// The description.
    pub spec: LabSpec,
    /// The Topology objects.
    pub topologies: Vec<Topology>,
    topology_text: String,
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
    /// How long until it did (or until giving up), milliseconds.
    pub millis: u64,
}

fn run(cmd: &mut Command, what: &str) -> Result<String, LabError> {
    let out = cmd.output().map_err(|e| LabError::io(what.to_string(), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            what: what.into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn ip(args: &[&str]) -> Result<String, LabError> {
    run(Command::new("ip").args(args), &format!("ip {}", args.join(" ")))
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn alive(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(5).any(|w| w == b"weftd"))
}

impl Lab {
    /// Loads a lab file; the binaries are looked for next to the running executable.
    pub fn load(path: &Path) -> Result<Lab, LabError> {
        let text = fs::read_to_string(path).map_err(|e| LabError::io(format!("reading {}", path.display()), e))?;
        let spec: LabSpec = serde_yaml_ng::from_str(&text).map_err(|e| LabError::Command {
            what: format!("parsing {}", path.display()),
            detail: e.to_string(),
        })?;
        if spec.name.is_empty()
            || spec.name.len() > 24
            || !spec.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(LabError::Command {
                what: "lab name".into(),
                detail: format!("{:?}: 1-24 letters, digits or '-'", spec.name),
            });
        }
        let topo_path = path.parent().unwrap_or(Path::new(".")).join(&spec.topology);
        let topology_text =
            fs::read_to_string(&topo_path).map_err(|e| LabError::io(format!("reading {}", topo_path.display()), e))?;
        let mut topologies = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&topology_text) {
            let t = Topology::deserialize(doc).map_err(|e| LabError::Command {
                what: format!("parsing {}", topo_path.display()),
                detail: e.to_string(),
            })?;
            topologies.push(t);
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
            topology_text,
            state,
            weftd: bin.join("weftd"),
            plugin: bin.join("weft"),
        })
    }

    /// Uses these binaries instead of the ones next to weftctl.
    pub fn with_binaries(mut self, weftd: PathBuf, plugin: PathBuf) -> Self {
        self.weftd = weftd;
        self.plugin = plugin;
        self
    }

    fn router(&self) -> String {
        format!("{}-rt", self.spec.name)
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

    /// The name of the namespace of pod `pod`.
    pub fn pod_ns(&self, pod: &str) -> String {
        format!("{}-p-{pod}", self.spec.name)
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.state.join("nodes").join(node)
    }

    fn socket(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("weftd.sock")
    }

    fn node_address(n: &NodeSpec) -> (String, String) {
        let hosts: Vec<_> = n.subnet.hosts().take(2).collect();
        let p = n.subnet.prefix_len();
        (format!("{}/{p}", hosts[0]), format!("{}/{p}", hosts[1]))
    }

    /// The underlay address of node `node`.
    pub fn address_of(&self, node: &str) -> Option<String> {
        let n = self.spec.nodes.iter().find(|n| n.name == node)?;
        Some(Self::node_address(n).1.split('/').next()?.to_string())
    }

    /// The directory the daemons read topologies from.
    pub fn topology_dir(&self) -> PathBuf {
        self.state.join("topology")
    }

    /// The pid of a node's weftd, if it runs.
    pub fn daemon_pid(&self, node: &str) -> Option<u32> {
        let pid: u32 = fs::read_to_string(self.node_dir(node).join("weftd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        alive(pid).then_some(pid)
    }

    /// Builds what is missing: namespaces, underlay, daemons (restarting crashed
    /// ones), pods. Returns the nodes whose daemon it started.
    pub fn up(&self) -> Result<Vec<String>, LabError> {
        let topo_dir = self.topology_dir();
        fs::create_dir_all(&topo_dir).map_err(|e| LabError::io("creating the lab directory", e))?;
        fs::write(topo_dir.join("topology.yaml"), &self.topology_text)
            .map_err(|e| LabError::io("writing the topology", e))?;
        let router = self.router();
        if !netns_exists(&router) {
            NamedNetns::create(&router)?.keep();
            ip(&["netns", "exec", &router, "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        }
        let mut started = Vec::new();
        for n in &self.spec.nodes {
            let ns = self.node_ns(&n.name);
            let (gw, addr) = Self::node_address(n);
            if !netns_exists(&ns) {
                NamedNetns::create(&ns)?.keep();
                let rt_if = format!("u-{}", n.name);
                ip(&[
                    "-n", &router, "link", "add", &rt_if, "type", "veth", "peer", "name", "uplink", "netns", &ns,
                ])?;
                ip(&["-n", &router, "addr", "add", &gw, "dev", &rt_if])?;
                ip(&["-n", &router, "link", "set", &rt_if, "up"])?;
                ip(&["-n", &ns, "addr", "add", &addr, "dev", "uplink"])?;
                ip(&["-n", &ns, "link", "set", "uplink", "up"])?;
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
        for n in &self.spec.nodes {
            for pod in &n.pods {
                self.attach(n, pod)?;
            }
        }
        Ok(started)
    }

    fn start_daemon(&self, n: &NodeSpec) -> Result<(), LabError> {
        let dir = self.node_dir(&n.name);
        fs::create_dir_all(&dir).map_err(|e| LabError::io("creating the node directory", e))?;
        let addr = self.address_of(&n.name).unwrap_or_default();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("weftd.log"))
            .map_err(|e| LabError::io("opening the daemon log", e))?;
        let log2 = log.try_clone().map_err(|e| LabError::io("opening the daemon log", e))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node_ns(&n.name)])
            .arg(&self.weftd)
            .arg("--socket")
            .arg(self.socket(&n.name))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args([
                "--metrics-addr",
                "0.0.0.0:9384",
                "--node-name",
                &n.name,
                "--node-address",
                &addr,
            ])
            .arg("--topology-dir")
            .arg(self.topology_dir())
            .args(["--wire-addr", &format!("{addr}:9385")])
            .args([
                "--inter-node-link",
                &self.spec.inter_node_link,
                "--reconcile-interval",
                "10",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: setsid in the forked child only; the daemon outlives this command.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| LabError::io("starting weftd", e))?;
        fs::write(dir.join("weftd.pid"), child.id().to_string()).map_err(|e| LabError::io("writing the pid", e))?;
        Ok(())
    }

    fn wait_for_socket(&self, node: &str) -> Result<(), LabError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let sock = self.socket(node);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                return Ok(());
            }
            if self.daemon_pid(node).is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(LabError::Command {
            what: format!("starting weftd on {node}"),
            detail: format!("not serving; see {}", self.node_dir(node).join("weftd.log").display()),
        })
    }

    fn namespace_of(&self, pod: &str) -> String {
        self.topologies
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(pod))
            .and_then(|t| t.metadata.namespace.clone())
            .unwrap_or_else(|| "default".into())
    }

    fn config(&self, n: &NodeSpec) -> Vec<u8> {
        serde_json::json!({
            "cniVersion": "1.1.0", "name": "weft", "type": "weft",
            "socket": self.socket(&n.name), "ranges": [n.pod_range],
        })
        .to_string()
        .into_bytes()
    }

    fn cni(&self, n: &NodeSpec, pod: &str, command: &str) -> Result<(), LabError> {
        let ns = self.pod_ns(pod);
        let args = format!("K8S_POD_NAMESPACE={};K8S_POD_NAME={pod}", self.namespace_of(pod));
        let node = NamedNetns::existing(&self.node_ns(&n.name));
        let out = CniExec::new(&self.plugin).call(
            &node,
            command,
            &ns,
            &format!("/run/netns/{ns}"),
            "eth0",
            &args,
            &self.config(n),
        )?;
        if out.ok() {
            Ok(())
        } else {
            Err(LabError::Command {
                what: format!("CNI {command} of pod {pod} on {}", n.name),
                detail: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            })
        }
    }

    fn attach(&self, n: &NodeSpec, pod: &str) -> Result<(), LabError> {
        let ns = self.pod_ns(pod);
        if !netns_exists(&ns) {
            NamedNetns::create(&ns)?.keep();
        }
        // ADD is idempotent: an attached pod gets its stored result back.
        self.cni(n, pod, "ADD")
    }

    /// Detaches a pod (CNI DEL on its node) and removes its namespace, as a runtime
    /// does when a pod is deleted.
    pub fn remove_pod(&self, pod: &str) -> Result<(), LabError> {
        let n = self
            .spec
            .nodes
            .iter()
            .find(|n| n.pods.iter().any(|p| p == pod))
            .ok_or_else(|| LabError::Command {
                what: format!("removing {pod}"),
                detail: "no node runs it".into(),
            })?;
        self.cni(n, pod, "DEL")?;
        ip(&["netns", "del", &self.pod_ns(pod)])?;
        Ok(())
    }

    /// Sends SIGKILL to a node's weftd (pods and wires stay; `up` restarts it).
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
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
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

    /// Pings the peer address of every link with one from its pod, each until it
    /// answers or `within` has passed.
    pub fn check(&self, within: Duration) -> Vec<LinkCheck> {
        let mut out = Vec::new();
        for t in &self.topologies {
            let pod = t.metadata.name.clone().unwrap_or_default();
            for l in &t.spec.links {
                let Some(peer_ip) = l.peer_ip.split('/').next().filter(|s| !s.is_empty()) else {
                    continue;
                };
                let start = Instant::now();
                let mut ok = false;
                while !ok && start.elapsed() < within {
                    ok = Command::new("ip")
                        .args(["netns", "exec", &self.pod_ns(&pod), "ping", "-c1", "-W1", "-q", peer_ip])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success());
                    if !ok {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                out.push(LinkCheck {
                    kind: String::new(),
                    from: format!("{pod}:{}", l.local_intf),
                    to: format!("{}:{}", l.peer_pod, l.peer_intf),
                    ok,
                    millis: start.elapsed().as_millis() as u64,
                });
            }
        }
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

    /// Runs a command inside a pod.
    pub fn exec(&self, pod: &str, argv: &[String]) -> Result<std::process::ExitStatus, LabError> {
        Command::new("ip")
            .args(["netns", "exec", &self.pod_ns(pod)])
            .args(argv)
            .status()
            .map_err(|e| LabError::io("running the command", e))
    }

    /// Removes the lab: pods (through CNI DEL), daemons, namespaces, state.
    pub fn down(&self) -> Result<(), LabError> {
        for n in &self.spec.nodes {
            if self.daemon_pid(&n.name).is_some() {
                for pod in &n.pods {
                    if netns_exists(&self.pod_ns(pod))
                        && let Err(e) = self.cni(n, pod, "DEL")
                    {
                        eprintln!("weftctl lab down: {e}");
                    }
                }
            }
        }
        for n in &self.spec.nodes {
            if let Some(pid) = self.daemon_pid(&n.name) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let deadline = Instant::now() + Duration::from_secs(10);
                while alive(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if alive(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let mut names: Vec<String> = self
            .spec
            .nodes
            .iter()
            .flat_map(|n| n.pods.iter().map(|p| self.pod_ns(p)))
            .collect();
        names.extend(self.spec.nodes.iter().map(|n| self.node_ns(&n.name)));
        names.push(self.router());
        for ns in names {
            if netns_exists(&ns) {
                drop(NamedNetns::existing(&ns));
                let _ = ip(&["netns", "del", &ns]);
            }
        }
        let _ = fs::remove_dir_all(&self.state);
        Ok(())
    }
}
