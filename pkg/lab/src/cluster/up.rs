//! Bringing a lab up (router, nodes, daemons, pods), crashing a node on purpose, running a command in one, and taking it all down.

use std::fs;
use std::time::{Duration, Instant};

use weft_harness::{CniExec, CniVars, DaemonConfig, NamedNetns, NodeDaemon, ip, wait_for_socket};

use super::{Lab, OUTSIDE_ADDRESS, OUTSIDE_ADDRESS6, OUTSIDE_GATEWAY, OUTSIDE_GATEWAY6, SEGMENT6};
use crate::LabError;

/// Sets one sysctl (`key=value`) inside namespace `ns`.
fn sysctl(ns: &str, setting: &str) -> Result<(), LabError> {
    ip(&["netns", "exec", ns, "sysctl", "-qw", setting])?;
    Ok(())
}
use crate::process::proc_stat;
use crate::spec::{NodeSpec, PodSpec, Underlay, WireSecurityMode};

impl Lab {
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
            sysctl(&router, "net.ipv4.ip_forward=1")?;
            if self.spec.underlay == Underlay::Shared {
                let gw = self.node_address(&self.spec.nodes[0]).0;
                ip(&["-n", &router, "link", "add", "seg", "mtu", &mtu, "type", "bridge"])?;
                ip(&["-n", &router, "addr", "add", &gw, "dev", "seg"])?;
                if let Some((gw6, _)) = self.node_address6(&self.spec.nodes[0]) {
                    ip(&["-n", &router, "-6", "addr", "add", &gw6, "dev", "seg", "nodad"])?;
                }
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
            if self.node_address6(&self.spec.nodes[0]).is_some() {
                // No duplicate address detection on the lab's own link: a tentative
                // link-local address would not do neighbour discovery for a second or
                // two, and the first IPv6 packets to the outside would be lost.
                sysctl(&router, "net.ipv6.conf.out.accept_dad=0")?;
                sysctl(&outside, "net.ipv6.conf.eth0.accept_dad=0")?;
            }
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
            if self.node_address6(&self.spec.nodes[0]).is_some() {
                // IPv6 to the internet too, where the nodes have an IPv6 underlay: the
                // router forwards, the outside routes back to the shared segment.
                sysctl(&router, "net.ipv6.conf.all.forwarding=1")?;
                ip(&[
                    "-n",
                    &router,
                    "-6",
                    "addr",
                    "add",
                    OUTSIDE_GATEWAY6,
                    "dev",
                    "out",
                    "nodad",
                ])?;
                let addr6 = format!("{OUTSIDE_ADDRESS6}/64");
                ip(&["-n", &outside, "-6", "addr", "add", &addr6, "dev", "eth0", "nodad"])?;
                let gw6 = OUTSIDE_GATEWAY6.split('/').next().unwrap_or_default();
                ip(&[
                    "-n",
                    &outside,
                    "-6",
                    "route",
                    "add",
                    &format!("{SEGMENT6}/64"),
                    "via",
                    gw6,
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
                if let Some((_, addr6)) = self.node_address6(n) {
                    // No duplicate address detection: the segment is the lab's own, and
                    // a tentative address would not answer for a second.
                    ip(&["-n", &ns, "-6", "addr", "add", &addr6, "dev", "uplink", "nodad"])?;
                }
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
                if let Some((gw6, _)) = self.node_address6(n) {
                    ip(&[
                        "-n",
                        &ns,
                        "-6",
                        "route",
                        "add",
                        "default",
                        "via",
                        gw6.split('/').next().unwrap_or_default(),
                    ])?;
                }
            }
            if self.daemon_pid(&n.name).is_none() {
                self.start_daemon(n)?;
                started.push(n.name.clone());
            }
        }
        self.start_dns()?;
        if self.spec.bgp {
            self.start_birds()?;
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
        if !running_before {
            self.start_scenario()?;
        }
        Ok(started)
    }

    /// Starts the lab's scenario in the background (a fresh bring-up only: `up` on a
    /// running lab leaves a scenario alone, finished or not), as `weftctl link scenario
    /// run` beside the lab's daemons, logging its steps as JSON lines to
    /// [`scenario_log`](Self::scenario_log).
    fn start_scenario(&self) -> Result<(), LabError> {
        let Some(file) = &self.scenario else {
            return Ok(());
        };
        if self.scenario_pid().is_some() {
            return Ok(());
        }
        let log = fs::File::create(self.scenario_log()).map_err(|e| LabError::io("creating the scenario log", e))?;
        let err = log
            .try_clone()
            .map_err(|e| LabError::io("creating the scenario log", e))?;
        let mut cmd = std::process::Command::new(self.weftd.with_file_name("weftctl"));
        cmd.env("WEFT_LAB_DIR", self.state.parent().unwrap_or(std::path::Path::new("/")))
            .args(["--json", "link", "scenario", "run"])
            .arg(file)
            .arg("--lab")
            .arg(&self.file)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err);
        // It outlives this command, as the daemons do.
        weft_kernel::process::own_session(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| LabError::io("starting the lab's scenario", e))?;
        let pid = child.id();
        let started = proc_stat(pid).map(|(_, t)| t).unwrap_or_default();
        fs::write(self.state.join("scenario.pid"), format!("{pid} {started}"))
            .map_err(|e| LabError::io("writing the scenario's pid", e))
    }

    /// Stops the lab's background scenario, if it runs (as Ctrl-C would: it logs where
    /// it stopped, and the links stay as its steps set them).
    pub fn stop_scenario(&self) {
        if let Some(pid) = self.scenario_pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.scenario_pid().is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
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
            self.spec.inter_node_link.to_string(),
            "--reconcile-interval".into(),
            self.spec.reconcile_interval.to_string(),
            "--pod-routing".into(),
            self.spec.pod_routing.as_str().into(),
        ];
        if let weft_kernel::packet::NodeEnds::Shards { prefix, count } = self.wire_ends(&n.name) {
            config.args.extend([
                "--wire-ends-netns".into(),
                prefix,
                "--wire-ends-shards".into(),
                count.to_string(),
            ]);
        }
        if self.spec.bgp {
            config
                .args
                .extend(["--export-table".into(), super::EXPORT_TABLE.to_string()]);
        }
        match self.spec.wire_security {
            WireSecurityMode::Mtls => {
                let tls = self.wire_tls_dir(&n.name);
                self.issue_node_cert(&n.name, &addr, &tls)?;
                config.args.extend(["--wire-tls-dir".into(), tls.display().to_string()]);
            }
            WireSecurityMode::Insecure => config.args.push("--wire-insecure".into()),
        }
        config.args.extend(self.spec.weftd_args.iter().cloned());
        // The daemon outlives this command: `down` (maybe another process) finds it
        // through the pid file.
        config.own_session = true;
        let node = NamedNetns::existing(&self.node_ns(&n.name));
        let pid = NodeDaemon::spawn(&node, config)?.detach().unwrap_or_default();
        let started = proc_stat(pid).map(|(_, t)| t).unwrap_or_default();
        fs::write(dir.join("weftd.pid"), format!("{pid} {started}")).map_err(|e| LabError::io("writing the pid", e))?;
        Ok(())
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
        // A runtime retries what the plugin calls transient (CNI code 11, "try again
        // later": a daemon restarting, say), as kubelet retries a sandbox; so does the
        // lab, a few times.
        let mut out = CniExec::new(&self.plugin).call(&node, &vars, &self.config(n))?;
        for attempt in 1..=4u64 {
            let transient = !out.ok()
                && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .is_ok_and(|v| v.get("code").and_then(serde_json::Value::as_u64) == Some(11));
            if !transient {
                break;
            }
            std::thread::sleep(Duration::from_millis(250 * attempt));
            out = CniExec::new(&self.plugin).call(&node, &vars, &self.config(n))?;
        }
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
        let reports = Reports::default();
        std::thread::scope(|scope| {
            for _ in 0..self.spec.parallel_attach.clamp(1, 64).min(self.spec.pods.len()) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(p) = self.spec.pods.get(i) else { break };
                        if failed.lock().expect("not poisoned").is_some() {
                            break;
                        }
                        let attached = self
                            .node(&p.node)
                            .and_then(|n| self.add_pod(n, p))
                            .and_then(|ips| reports.report(self, p, ips));
                        if let Err(e) = attached {
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

    /// Attaches pod `pod` (`NS/NAME`, or a unique `NAME`) on its node as `up` does (its
    /// network namespace made if missing, CNI ADD through the plugin) and returns its
    /// addresses without reporting them: for a pod added to `spec.pods` after the lab
    /// was loaded, whose caller reports them itself ([`Lab::report_pod_ips`]) when
    /// kubelet would, so what happens between the ADD's answer and that report can be
    /// watched (a benchmark of how soon a new pod is reachable).
    pub fn attach_unreported(&self, pod: &str) -> Result<Vec<std::net::IpAddr>, LabError> {
        let p = self.find_pod(pod)?;
        self.add_pod(self.node(&p.node)?, p)
    }

    /// Pod `p`'s network namespace (made if missing) and its ADD on node `n`; its
    /// addresses from the result.
    fn add_pod(&self, n: &NodeSpec, p: &PodSpec) -> Result<Vec<std::net::IpAddr>, LabError> {
        let ns = self.netns_of(p);
        if !NamedNetns::exists(&ns) {
            NamedNetns::create(&ns)?.keep();
        }
        // ADD is idempotent: an attached pod gets its stored result back.
        let result = self.cni(n, p, "ADD")?;
        Ok(crate::objects::result_ips(&result))
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
        self.stop_scenario();
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
        self.stop_birds();
        self.stop_dns();
        let mut names: Vec<String> = self.spec.pods.iter().map(|p| self.netns_of(p)).collect();
        names.extend(self.spec.nodes.iter().map(|n| self.node_ns(&n.name)));
        names.push(self.outside_ns());
        names.push(self.router());
        for ns in names {
            if NamedNetns::exists(&ns) {
                let _ = NamedNetns::existing(&ns).delete();
            }
        }
        // The daemons are gone: their shards hold nothing the pods still need.
        for n in &self.spec.nodes {
            if let Err(e) = self.wire_ends(&n.name).delete_shards() {
                eprintln!("weftctl lab down: {e}");
            }
        }
        let _ = fs::remove_dir_all(&self.state);
        crate::neigh::release(&self.state.display().to_string())
    }
}

/// Pods' addresses waiting to be reported by [`Lab::attach_all`]'s workers, as a group
/// commit: each worker queues its pod's and then, in turn, reports everything queued,
/// so its pod's is reported before it goes on, and the lab's state is written once per
/// turn rather than once per pod.
#[derive(Default)]
struct Reports<'a> {
    queued: std::sync::Mutex<Vec<(&'a PodSpec, Vec<std::net::IpAddr>)>>,
    turn: std::sync::Mutex<()>,
}

impl<'a> Reports<'a> {
    /// Its Pod object is written already; its addresses go into it after the ADD, as
    /// kubelet reports them.
    fn report(&self, lab: &Lab, p: &'a PodSpec, ips: Vec<std::net::IpAddr>) -> Result<(), LabError> {
        self.queued.lock().expect("not poisoned").push((p, ips));
        let _turn = self.turn.lock().expect("not poisoned");
        let batch = std::mem::take(&mut *self.queued.lock().expect("not poisoned"));
        lab.report_pods_ips(batch)
    }
}
