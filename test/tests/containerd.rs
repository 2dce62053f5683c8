//! weft through a real container runtime: a private containerd 1.6 (CRI plugin, runc,
//! overlayfs) runs in a node namespace beside weftd, with weft as its only CNI network.
//! A pod sandbox is run, inspected, survives a crash and restart of weftd, and is
//! stopped and removed through CRI as the kubelet does it; the node must be left holding
//! nothing of weft's.
//!
//! Needs root and these Debian packages beyond Rust: `containerd` (with `ctr`), `runc`,
//! `containernetworking-plugins` (for `loopback`, which containerd runs for every pod's
//! `lo`), `gcc` and `libc6-dev` (the static pause binary), `protobuf-compiler` (the
//! `k8s-cri` crate's build), `iproute2`, `iputils-ping` and `util-linux` (`nsenter`).
//! Nothing is pulled: the sandbox ("pause") image is built here from `fixtures/pause.c`.
//!
//! A second test gives weft the `portMappings` capability, runs a busybox `httpd` in a
//! pod with a host port and reaches it through the node's addresses. Its workload image
//! is packed here from the static `/bin/busybox` of Debian's `busybox-static` package
//! (also needed).
//!
//! Everything containerd makes lives in one temporary directory (root, state, runc's
//! state, sockets, mounts), except each pod's network namespace, which containerd 1.6
//! mounts under `/var/run/netns/cni-*` and removes when the sandbox stops, and the
//! shims' sockets in `/run/containerd/s`. The sandbox's cgroups are put under a parent
//! named after that directory.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint};
use weft_tests::{Daemon, Netns, TempDir, bin, privileged, run, sh};

/// The pod range weft allocates from in this test.
const POD_NET: Ipv4Addr = Ipv4Addr::new(10, 244, 77, 0);
const POD_PREFIX: u32 = 24;
/// The sandbox image containerd is told to use; it exists only as imported here.
const PAUSE_IMAGE: &str = "localhost/weft/pause:test";
/// The workload image of the host port test: static busybox with an index page.
const BUSYBOX_IMAGE: &str = "localhost/weft/busybox:test";
/// The host port the pod asks for through CRI, and the port its httpd listens on.
const HOST_PORT: u16 = 18082;
const CONTAINER_PORT: u16 = 8080;
/// A node address that outlives the pod (on the node's `lo`): the pod's gateway goes away
/// with its veth, so only this address shows that the port itself was closed.
const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// How long one CRI call may take before the test fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// `PATH` for containerd, which looks up `runc` and `containerd-shim-runc-v2` there.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[test]
fn containerd_runs_a_pod_sandbox_on_weft_and_tears_it_down() {
    if !privileged() {
        return;
    }
    let t0 = Instant::now();
    let mut daemon = Daemon::start("ctrd");
    let ctrd = Containerd::start(&daemon, CniSetup::default());
    eprintln!("containerd answering after {:.1?}", t0.elapsed());

    let image = pause_image(ctrd.dir());
    ctrd.import(&image);
    let cri = Cri::connect(&ctrd.socket());
    cri.wait_ready(&ctrd, &daemon, &[PAUSE_IMAGE]);
    eprintln!("CRI ready, pause image imported after {:.1?}", t0.elapsed());

    // RunPodSandbox: containerd makes the pod's netns and runs CNI ADD through weft.
    let uid = random_uid();
    let name = "weft-ctrd-pod";
    let config = sandbox_config(&ctrd, name, &uid);
    let t_run = Instant::now();
    let mut pod =
        Sandbox::run(&cri, config).unwrap_or_else(|e| panic!("RunPodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    eprintln!("RunPodSandbox took {:.1?}: sandbox {}", t_run.elapsed(), pod.id);

    // PodSandboxStatus: the address CRI reports, and the pod's network namespace.
    let id = pod.id.clone();
    let status = cri
        .runtime(|mut c| async move {
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: true,
            })
            .await
        })
        .unwrap_or_else(|e| panic!("PodSandboxStatus failed: {e}\n{}", diag(&ctrd, &daemon)));
    let st = status.status.as_ref().expect("PodSandboxStatus carries a status");
    assert_eq!(
        st.state,
        cri::PodSandboxState::SandboxReady as i32,
        "sandbox not ready: {st:?}"
    );
    let ip_text = st.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default();
    let ip: Ipv4Addr = ip_text.parse().unwrap_or_else(|_| {
        panic!(
            "CRI reports no IPv4 address for the pod ({st:?})\n{}",
            diag(&ctrd, &daemon)
        )
    });
    assert!(in_pod_range(ip), "pod address {ip} is outside {POD_NET}/{POD_PREFIX}");
    let netns = netns_of(&status.info);
    pod.netns = Some(netns.clone());
    let ns_text = netns.to_str().unwrap();
    assert!(
        ns_text.starts_with("/run/netns/cni-") || ns_text.starts_with("/var/run/netns/cni-"),
        "containerd put the pod's netns at an unexpected place: {ns_text}"
    );
    eprintln!("pod address {ip}, netns {}", netns.display());

    // The kernel agrees: the pod's eth0 holds exactly that address, with a default
    // route, and containerd's loopback network brought lo up beside it.
    let eth0 = in_netns(&netns, &["-4", "addr", "show", "eth0"]);
    let local: Vec<String> = eth0[0]["addr_info"]
        .as_array()
        .unwrap_or_else(|| panic!("no eth0 in the pod: {eth0}"))
        .iter()
        .map(|a| a["local"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        local,
        vec![ip.to_string()],
        "the pod's eth0 holds {local:?}, CRI reports {ip}"
    );
    let default = in_netns(&netns, &["-4", "route", "show", "default"]);
    assert_eq!(
        default.as_array().map(Vec::len),
        Some(1),
        "the pod has no IPv4 default route: {default}"
    );
    let lo = in_netns(&netns, &["link", "show", "lo"]);
    assert!(
        lo[0]["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP")),
        "the pod's lo is down: {lo}"
    );

    // The node side: one attachment, a route to the pod, and the pod answers.
    let s = daemon.status();
    assert_eq!(
        s["attachments"], 1,
        "weftd should hold exactly the pod's attachment: {s}"
    );
    let routes = daemon.node.weft_routes();
    assert!(
        routes
            .iter()
            .any(|r| r["dst"] == ip.to_string() || r["dst"] == format!("{ip}/32")),
        "no weft route to {ip} on the node: {routes:?}"
    );
    assert!(
        daemon.node.ping(&ip.to_string()),
        "the pod at {ip} does not answer a ping from the node"
    );

    // weftd crashes (SIGKILL) under the running sandbox: the pod keeps its network (all
    // kernel state) while the daemon is away, and the restarted daemon takes the
    // attachment over from its store without disturbing it.
    daemon.kill();
    assert!(
        daemon.node.ping(&ip.to_string()),
        "the pod at {ip} lost its network while weftd was down"
    );
    daemon.start_again();
    let s = daemon.status();
    assert_eq!(
        s["attachments"], 1,
        "the restarted weftd lost the pod's attachment: {s}"
    );
    assert!(
        daemon.node.ping(&ip.to_string()),
        "the pod at {ip} does not answer after weftd's restart"
    );
    let eth0_after = in_netns(&netns, &["-4", "addr", "show", "eth0"]);
    assert_eq!(
        eth0_after[0]["addr_info"][0]["local"].as_str(),
        Some(ip.to_string().as_str()),
        "the pod's address changed across weftd's restart: {eth0_after}"
    );

    // StopPodSandbox: CNI DEL with the netns, then containerd removes the netns.
    pod.stop()
        .unwrap_or_else(|e| panic!("StopPodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    assert!(
        !netns.exists(),
        "containerd left the pod's netns {} after stopping it",
        netns.display()
    );
    daemon.settle();
    let s = daemon.status();
    assert_eq!(s["attachments"], 0, "the attachment outlived StopPodSandbox: {s}");

    // RemovePodSandbox: a second CNI DEL, this time without a netns.
    pod.remove()
        .unwrap_or_else(|e| panic!("RemovePodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    let left = cri
        .runtime(|mut c| async move { c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }).await })
        .unwrap_or_else(|e| panic!("ListPodSandbox failed: {e}"));
    assert!(
        left.items.is_empty(),
        "sandboxes left after RemovePodSandbox: {:?}",
        left.items
    );
    daemon.assert_clean();
    eprintln!("pod sandbox run and removed; the whole test took {:.1?}", t0.elapsed());
}

#[test]
fn containerd_passes_host_ports_to_weft_and_they_reach_the_pod() {
    if !privileged() {
        return;
    }
    let t0 = Instant::now();
    let daemon = Daemon::start("ctrdhp");
    sh(daemon
        .node
        .cmd("ip")
        .args(["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"]));
    let ctrd = Containerd::start(
        &daemon,
        CniSetup {
            port_mappings: true,
            record_calls: true,
        },
    );
    // The page httpd serves, unique to this run.
    let page = format!("weft host port test {}\n", random_uid());
    ctrd.import(&pause_image(ctrd.dir()));
    ctrd.import(&busybox_image(ctrd.dir(), &page));
    let cri = Cri::connect(&ctrd.socket());
    cri.wait_ready(&ctrd, &daemon, &[PAUSE_IMAGE, BUSYBOX_IMAGE]);
    eprintln!(
        "CRI ready, pause and busybox images imported after {:.1?}",
        t0.elapsed()
    );

    // RunPodSandbox with a host port. The conflist only declares the capability, so a
    // mapping weft gets can only have come from containerd.
    let uid = random_uid();
    let name = "weft-ctrd-hostport";
    let mut config = sandbox_config(&ctrd, name, &uid);
    config.port_mappings = vec![cri::PortMapping {
        protocol: cri::Protocol::Tcp as i32,
        container_port: i32::from(CONTAINER_PORT),
        host_port: i32::from(HOST_PORT),
        host_ip: String::new(),
    }];
    let mut pod = Sandbox::run(&cri, config.clone())
        .unwrap_or_else(|e| panic!("RunPodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    let status = pod
        .status()
        .unwrap_or_else(|e| panic!("PodSandboxStatus failed: {e}\n{}", diag(&ctrd, &daemon)));
    let netns = netns_of(&status.info);
    pod.netns = Some(netns.clone());
    let ip: Ipv4Addr = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .and_then(|n| n.ip.parse().ok())
        .unwrap_or_else(|| panic!("CRI reports no IPv4 address for the pod: {status:?}"));
    eprintln!("sandbox {} at {ip} after {:.1?}", pod.id, t0.elapsed());

    // What containerd passed weft on ADD, and what weftd holds and wrote because of it.
    let adds = ctrd.cni_calls("ADD");
    assert_eq!(adds.len(), 1, "containerd should have run weft's ADD once: {adds:?}");
    let sent = &adds[0]["runtimeConfig"]["portMappings"];
    let sent_ports: Vec<(Value, Value, String)> = sent
        .as_array()
        .unwrap_or_else(|| panic!("containerd passed weft no runtimeConfig.portMappings: {}", adds[0]))
        .iter()
        .map(|m| {
            let protocol = field(m, "protocol").as_str().unwrap_or_default().to_ascii_lowercase();
            (
                field(m, "hostPort").clone(),
                field(m, "containerPort").clone(),
                protocol,
            )
        })
        .collect();
    assert_eq!(
        sent_ports,
        vec![(json!(HOST_PORT), json!(CONTAINER_PORT), "tcp".to_string())],
        "containerd passed weft other port mappings than CRI was given: {sent}"
    );
    let ports = held_ports(&daemon);
    let want = json!({
        "host_ip": "",
        "host_port": HOST_PORT,
        "protocol": "tcp",
        "container_ip": ip.to_string(),
        "container_port": CONTAINER_PORT,
        "pod_namespace": "default",
        "pod": name,
        "container_id": pod.id,
    });
    assert_eq!(ports, vec![want], "weftctl ports should list exactly the pod's mapping");
    let element = format!("tcp . {HOST_PORT} : {ip} . {CONTAINER_PORT}");
    let table = nft_table(&daemon);
    assert!(
        table.contains(&element),
        "no element {element:?} in weft's table:\n{table}"
    );

    // The workload: busybox httpd in the pod, first reached directly.
    let mut web = Container::create(&cri, &pod.id, &config, httpd_container())
        .unwrap_or_else(|e| panic!("CreateContainer failed: {e}\n{}", diag(&ctrd, &daemon)));
    web.start().unwrap_or_else(|e| {
        panic!(
            "StartContainer failed: {e}\n{}\n{}",
            web.describe(),
            diag(&ctrd, &daemon)
        )
    });
    let direct = format!("http://{ip}:{CONTAINER_PORT}/");
    let deadline = Instant::now() + Duration::from_secs(10);
    let served = loop {
        match curl(&daemon.node, &direct) {
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => break other,
        }
    };
    let served =
        served.unwrap_or_else(|e| panic!("httpd in the pod does not answer at {direct}: {e}\n{}", web.describe()));
    assert_eq!(served, page, "httpd served another page at {direct}");
    eprintln!("httpd answers after {:.1?}", t0.elapsed());

    // Through the host port, on the node's own addresses (the output hook).
    let gateway = Ipv4Addr::from(u32::from(POD_NET) + 1);
    let urls = [gateway, NODE_ADDR].map(|a| format!("http://{a}:{HOST_PORT}/"));
    for url in &urls {
        let body = curl(&daemon.node, url).unwrap_or_else(|e| {
            panic!(
                "the host port does not answer at {url} though httpd does at {direct}: {e}\n\
                 --- nft list table inet weft:\n{}\n{}",
                nft_table(&daemon),
                diag(&ctrd, &daemon)
            )
        });
        assert_eq!(body, page, "{url} served another page");
    }

    // Tear down as the kubelet does: the container, then the sandbox (CNI DEL).
    web.stop()
        .unwrap_or_else(|e| panic!("StopContainer failed: {e}\n{}", web.describe()));
    let state = web.status().map(|s| s.state);
    assert_eq!(
        state,
        Ok(cri::ContainerState::ContainerExited as i32),
        "httpd not exited after StopContainer: {}",
        web.describe()
    );
    pod.stop()
        .unwrap_or_else(|e| panic!("StopPodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    assert!(!netns.exists(), "containerd left the pod's netns {}", netns.display());
    pod.remove()
        .unwrap_or_else(|e| panic!("RemovePodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    web.removed = true;
    let containers = cri
        .runtime(|mut c| async move { c.list_containers(cri::ListContainersRequest { filter: None }).await })
        .unwrap_or_else(|e| panic!("ListContainers failed: {e}"));
    assert!(
        containers.containers.is_empty(),
        "containers left after RemovePodSandbox: {:?}",
        containers.containers
    );

    // The port is closed and weft holds nothing of it.
    for url in &urls {
        if let Ok(body) = curl(&daemon.node, url) {
            panic!("{url} still answers after the pod was removed: {body:?}");
        }
    }
    let ports = held_ports(&daemon);
    assert!(ports.is_empty(), "host ports left after RemovePodSandbox: {ports:?}");
    let table = nft_table(&daemon);
    assert!(
        !table.contains(&HOST_PORT.to_string()),
        "weft's table still mentions port {HOST_PORT}:\n{table}"
    );
    daemon.assert_clean();
    eprintln!("host port served and closed; the whole test took {:.1?}", t0.elapsed());
}

/// `key` of a port mapping as containerd spells it (`HostPort`) or as the CNI
/// conventions do (`hostPort`).
fn field<'v>(mapping: &'v Value, key: &str) -> &'v Value {
    let upper = format!("{}{}", key[..1].to_ascii_uppercase(), &key[1..]);
    mapping.get(key).or_else(|| mapping.get(&upper)).unwrap_or(&Value::Null)
}

/// `weftctl --json ports` for the daemon.
fn held_ports(daemon: &Daemon) -> Vec<Value> {
    let out = sh(Command::new(bin("weftctl"))
        .arg("--socket")
        .arg(daemon.socket())
        .args(["--json", "ports"]));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("weftctl --json ports printed no JSON list ({e}): {out}"))
}

/// `nft list table inet weft` in the node namespace.
fn nft_table(daemon: &Daemon) -> String {
    sh(daemon.node.cmd("nft").args(["list", "table", "inet", "weft"]))
}

/// The body `url` answers with from `ns`, or why there is none.
fn curl(ns: &Netns, url: &str) -> Result<String, String> {
    let out = run(ns.cmd("curl").args(["-sS", "-f", "--max-time", "3", url]));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "curl {url}: {} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))
    }
}

/// The namespaces of the pods and containers here: network, PIDs and IPC of the pod.
fn pod_namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Pod as i32,
        pid: cri::NamespaceMode::Pod as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// A pod sandbox config as the kubelet sends it, logging under the containerd directory.
fn sandbox_config(ctrd: &Containerd, name: &str, uid: &str) -> cri::PodSandboxConfig {
    let log_dir = ctrd.dir().join("pods").join(uid);
    std::fs::create_dir_all(&log_dir).unwrap();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: log_dir.to_str().unwrap().to_string(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: ctrd.cgroup_parent(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// busybox httpd serving the image's `/www` on [`CONTAINER_PORT`].
fn httpd_container() -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "httpd".to_string(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: BUSYBOX_IMAGE.to_string(),
            ..Default::default()
        }),
        command: vec!["/bin/httpd".to_string()],
        args: ["-f", "-p", &CONTAINER_PORT.to_string(), "-h", "/www"]
            .map(String::from)
            .to_vec(),
        log_path: "httpd.log".to_string(),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn in_pod_range(ip: Ipv4Addr) -> bool {
    let mask = u32::MAX << (32 - POD_PREFIX);
    let (a, net) = (u32::from(ip), u32::from(POD_NET));
    a & mask == net && a != net && a != net | !mask
}

/// `ip -j <args>` run inside the network namespace mounted at `netns`.
fn in_netns(netns: &Path, args: &[&str]) -> Value {
    let out = sh(Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-j"])
        .args(args));
    if out.trim().is_empty() {
        json!([])
    } else {
        serde_json::from_str(&out).expect("ip -j output")
    }
}

/// The pod's network namespace path, from the verbose PodSandboxStatus info: its OCI
/// runtime spec lists the namespaces the pause container joined.
fn netns_of(info: &HashMap<String, String>) -> PathBuf {
    let raw = info
        .get("info")
        .unwrap_or_else(|| panic!("no \"info\" in the verbose status: {info:?}"));
    let v: Value = serde_json::from_str(raw).expect("the verbose status info is JSON");
    let nss = v["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no runtimeSpec.linux.namespaces in the status info: {raw}"));
    let path = nss
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .unwrap_or_else(|| panic!("no network namespace path in {nss:?}"));
    PathBuf::from(path)
}

fn random_uid() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// The last lines of both logs, for failure messages.
fn diag(ctrd: &Containerd, daemon: &Daemon) -> String {
    format!(
        "--- containerd log (tail):\n{}\n--- weftd log (tail):\n{}",
        ctrd.log_tail(),
        tail(&daemon.log(), 40)
    )
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// How containerd's CNI network is set up.
#[derive(Default)]
struct CniSetup {
    /// Declares weft's `portMappings` capability, so containerd passes a sandbox's
    /// port mappings in `runtimeConfig`.
    port_mappings: bool,
    /// Runs weft through a wrapper that keeps what each call got on stdin, in
    /// `cni/calls/<command>-<pid>.json` (see [`Containerd::cni_calls`]).
    record_calls: bool,
}

/// A private containerd in the node namespace. Dropping it stops containerd, ends what
/// it started (containers, shims), unmounts what it mounted and removes its directory.
struct Containerd {
    child: Option<Child>,
    dir: TempDir,
    /// Shared directories the shims create (their sockets go to /run/containerd/s)
    /// that did not exist before: removed afterwards if they are empty again.
    made: Vec<PathBuf>,
}

impl Containerd {
    fn start(daemon: &Daemon, cni: CniSetup) -> Self {
        let dir = TempDir::new("ctrd");
        let p = dir.path();
        let made = ["/run/containerd", "/run/containerd/s"]
            .iter()
            .map(PathBuf::from)
            .filter(|d| !d.exists())
            .collect();
        for d in ["root", "state", "opt", "runc", "cni/bin", "cni/conf", "pods"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        // CNI: the weft plugin itself, and the reference loopback plugin, which
        // containerd runs for every pod's lo before the configured network.
        let loopback = Path::new("/usr/lib/cni/loopback");
        assert!(
            loopback.exists(),
            "{} is missing: install containernetworking-plugins",
            loopback.display()
        );
        if cni.record_calls {
            let calls = p.join("cni/calls");
            std::fs::create_dir_all(&calls).unwrap();
            let wrapper = format!(
                "#!/bin/sh\nin='{}'/\"$CNI_COMMAND-$$.json\"\ncat > \"$in\" && exec '{}' < \"$in\"\n",
                calls.display(),
                bin("weft").display()
            );
            std::fs::write(p.join("cni/bin/weft"), wrapper).unwrap();
            std::fs::set_permissions(p.join("cni/bin/weft"), std::fs::Permissions::from_mode(0o755)).unwrap();
        } else {
            symlink(bin("weft"), p.join("cni/bin/weft")).unwrap();
        }
        symlink(loopback, p.join("cni/bin/loopback")).unwrap();
        let mut weft = json!({
            "type": "weft",
            "socket": daemon.socket(),
            "ranges": [format!("{POD_NET}/{POD_PREFIX}")],
            "mtu": 1500,
        });
        if cni.port_mappings {
            weft["capabilities"] = json!({"portMappings": true});
        }
        // containerd 1.6's libcni speaks at most CNI 1.0.0.
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "weft",
            "plugins": [weft],
        });
        std::fs::write(p.join("cni/conf/10-weft.conflist"), conflist.to_string()).unwrap();

        let d = |s: &str| p.join(s).to_str().unwrap().to_string();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "{sock}"

[debug]
  level = "info"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    # root here lacks CAP_SYS_RESOURCE: runc could not lower oom_score_adj
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni_bin}"
      conf_dir = "{cni_conf}"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "{runc}"
          SystemdCgroup = false
"#,
            root = d("root"),
            state = d("state"),
            sock = d("containerd.sock"),
            opt = d("opt"),
            cni_bin = d("cni/bin"),
            cni_conf = d("cni/conf"),
            runc = d("runc"),
        );
        std::fs::write(p.join("config.toml"), config).unwrap();

        // nsenter joins only the node's network namespace. `ip netns exec` would also
        // give containerd a private mount namespace, and the pod netns it mounts under
        // /run/netns would then be invisible to weftd.
        let log = std::fs::File::create(p.join("containerd.log")).unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={}", daemon.node.path()))
            .arg("containerd")
            .arg("--config")
            .arg(p.join("config.toml"))
            .env("PATH", SYSTEM_PATH)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd (is the containerd package installed?)");
        let mut c = Self {
            child: Some(child),
            dir,
            made,
        };
        c.wait_serving(Duration::from_secs(20));
        c
    }

    fn wait_serving(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("containerd exited early ({st}):\n{}", self.log_tail());
            }
            if self.socket().exists() {
                let out = run(Command::new("ctr")
                    .arg("-a")
                    .arg(self.socket())
                    .args(["--timeout", "5s", "version"]));
                if out.status.success() {
                    return;
                }
                last = String::from_utf8_lossy(&out.stderr).into_owned();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "containerd did not answer within {limit:?} (last ctr error: {last}):\n{}",
            self.log_tail()
        );
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// The cgroup parent of the pod: named after the temporary directory, so it is
    /// recognisably this test's and can be removed afterwards.
    fn cgroup_parent(&self) -> String {
        format!("/{}", self.dir().file_name().unwrap().to_str().unwrap())
    }

    fn log_tail(&self) -> String {
        tail(
            &std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default(),
            60,
        )
    }

    /// What weft got on stdin in each `command` call, oldest first, when the calls are
    /// recorded ([`CniSetup::record_calls`]).
    fn cni_calls(&self, command: &str) -> Vec<Value> {
        let dir = self.dir().join("cni/calls");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{command}-")))
            .map(|e| e.path())
            .collect();
        files.sort_by_key(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok());
        files
            .iter()
            .map(|f| {
                let raw = std::fs::read_to_string(f).unwrap();
                serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {raw}", f.display()))
            })
            .collect()
    }

    /// Imports an OCI image-layout tar into the CRI plugin's namespace.
    fn import(&self, tar: &Path) {
        let out = run(Command::new("ctr")
            .arg("-a")
            .arg(self.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar));
        assert!(
            out.status.success(),
            "ctr images import failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
    }

    fn stop_containerd(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        if weft_tests::wait_exit(&mut child, Duration::from_secs(10)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Force-deletes every container runc still knows in this containerd's runc root
    /// (a sandbox the test could not remove through CRI).
    fn delete_containers(&self) {
        let Ok(namespaces) = std::fs::read_dir(self.dir().join("runc")) else {
            return;
        };
        for ns in namespaces.flatten() {
            let Ok(containers) = std::fs::read_dir(ns.path()) else {
                continue;
            };
            for c in containers.flatten() {
                let _ = Command::new("runc")
                    .env("PATH", SYSTEM_PATH)
                    .arg("--root")
                    .arg(ns.path())
                    .args(["delete", "--force"])
                    .arg(c.file_name())
                    .output();
            }
        }
    }

    /// Ends the shims serving this containerd, found by its socket on their command line.
    fn kill_shims(&self) {
        let sock = self.socket();
        let sock = sock.as_os_str().as_encoded_bytes();
        let ours: Vec<Pid> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                    return false;
                };
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                args[0].ends_with(b"containerd-shim-runc-v2") && args.contains(&sock)
            })
            .map(Pid::from_raw)
            .collect();
        for sig in [Signal::SIGTERM, Signal::SIGKILL] {
            let alive: Vec<Pid> = ours.iter().copied().filter(|p| kill(*p, None).is_ok()).collect();
            if alive.is_empty() {
                return;
            }
            for p in &alive {
                let _ = kill(*p, sig);
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline && alive.iter().any(|p| Path::new(&format!("/proc/{p}")).exists()) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Lazily unmounts everything mounted under the directory, deepest first.
    fn unmount_all(&self) {
        let prefix = format!("{}/", self.dir().display());
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// Removes the pod's (empty) parent cgroup from every hierarchy.
    fn remove_cgroups(&self) {
        let parent = self.cgroup_parent();
        let root = Path::new("/sys/fs/cgroup");
        let _ = std::fs::remove_dir(root.join(&parent[1..]));
        for h in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(h.path().join(&parent[1..]));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop_containerd();
        self.delete_containers();
        self.kill_shims();
        self.unmount_all();
        self.remove_cgroups();
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        // The TempDir field is dropped after this, removing the directory.
    }
}

/// A CRI client over containerd's socket, with a runtime to drive it from sync code.
struct Cri {
    rt: tokio::runtime::Runtime,
    channel: Channel,
}

impl Cri {
    fn connect(sock: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let path = sock.to_path_buf();
        let channel = rt
            .block_on(async move {
                Endpoint::from_static("http://[::]")
                    .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
            })
            .unwrap_or_else(|e| panic!("connecting to containerd's CRI at {}: {e}", sock.display()));
        Self { rt, channel }
    }

    /// One call on the runtime service, bounded by [`CALL_TIMEOUT`].
    fn runtime<T, F, Fut>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.block(f(RuntimeServiceClient::new(self.channel.clone())))
    }

    /// One call on the image service, bounded by [`CALL_TIMEOUT`].
    fn images<T, F, Fut>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce(ImageServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.block(f(ImageServiceClient::new(self.channel.clone())))
    }

    fn block<T>(&self, call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>) -> Result<T, String> {
        match self
            .rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, call).await })
        {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
        }
    }

    /// Waits until the runtime and its network are ready (the CNI config is loaded) and
    /// the CRI plugin sees the imported `images`.
    fn wait_ready(&self, ctrd: &Containerd, daemon: &Daemon, images: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            let status = self.runtime(|mut c| async move { c.status(cri::StatusRequest { verbose: false }).await });
            let known: Result<Vec<bool>, String> = images.iter().map(|i| self.image_known(i)).collect();
            match (status, known) {
                (Ok(s), Ok(known)) => {
                    let conds = s.status.map(|s| s.conditions).unwrap_or_default();
                    let ready = |t: &str| conds.iter().any(|c| c.r#type == t && c.status);
                    if ready("RuntimeReady") && ready("NetworkReady") && known.iter().all(|k| *k) {
                        return;
                    }
                    last = format!("conditions {conds:?}, images {images:?} known: {known:?}");
                }
                (s, i) => last = format!("Status: {:?}, ImageStatus: {:?}", s.err(), i.err()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("containerd's CRI did not become ready ({last})\n{}", diag(ctrd, daemon));
    }

    /// Whether the CRI plugin knows `image`.
    fn image_known(&self, image: &str) -> Result<bool, String> {
        let image = image.to_string();
        let r = self.images(|mut c| async move {
            c.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image,
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
        })?;
        Ok(r.image.is_some())
    }
}

/// A pod sandbox run through CRI. Dropping it before [`Sandbox::remove`] succeeded
/// stops and removes it (so CNI DEL runs), and unmounts its netns if that is left.
struct Sandbox<'a> {
    cri: &'a Cri,
    id: String,
    netns: Option<PathBuf>,
    removed: bool,
}

impl<'a> Sandbox<'a> {
    fn run(cri: &'a Cri, config: cri::PodSandboxConfig) -> Result<Self, String> {
        let r = cri.runtime(|mut c| async move {
            c.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        })?;
        Ok(Self {
            cri,
            id: r.pod_sandbox_id,
            netns: None,
            removed: false,
        })
    }

    /// The verbose PodSandboxStatus.
    fn status(&self) -> Result<cri::PodSandboxStatusResponse, String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: true,
            })
            .await
        })
    }

    fn stop(&self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id })
                .await
        })?;
        Ok(())
    }

    fn remove(&mut self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
        })?;
        self.removed = true;
        Ok(())
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.stop();
            let _ = self.remove();
        }
        // Only the netns containerd reported for this sandbox, and only if it is left.
        if let Some(ns) = self.netns.take().filter(|p| p.exists()) {
            let _ = nix::mount::umount2(&ns, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&ns);
        }
    }
}

/// A container created through CRI in a sandbox. Dropping it before it was removed
/// stops and removes it.
struct Container<'a> {
    cri: &'a Cri,
    id: String,
    /// Where containerd writes the container's output.
    log: PathBuf,
    /// Removed, by RemoveContainer or with its sandbox.
    removed: bool,
}

impl<'a> Container<'a> {
    fn create(
        cri: &'a Cri,
        sandbox_id: &str,
        sandbox: &cri::PodSandboxConfig,
        config: cri::ContainerConfig,
    ) -> Result<Self, String> {
        let log = Path::new(&sandbox.log_directory).join(&config.log_path);
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox.clone()),
        };
        let r = cri.runtime(|mut c| async move { c.create_container(request).await })?;
        Ok(Self {
            cri,
            id: r.container_id,
            log,
            removed: false,
        })
    }

    fn start(&self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri
            .runtime(|mut c| async move { c.start_container(cri::StartContainerRequest { container_id: id }).await })?;
        Ok(())
    }

    fn status(&self) -> Result<cri::ContainerStatus, String> {
        let id = self.id.clone();
        let r = self.cri.runtime(|mut c| async move {
            c.container_status(cri::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
        })?;
        r.status.ok_or_else(|| "ContainerStatus carries no status".to_string())
    }

    /// StopContainer, giving the process 10 s after SIGTERM.
    fn stop(&self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.stop_container(cri::StopContainerRequest {
                container_id: id,
                timeout: 10,
            })
            .await
        })?;
        Ok(())
    }

    /// The container's state and output, for failure messages.
    fn describe(&self) -> String {
        let state = match self.status() {
            Ok(s) => format!(
                "state {:?}, exit code {}, reason {:?}, message {:?}",
                cri::ContainerState::try_from(s.state),
                s.exit_code,
                s.reason,
                s.message
            ),
            Err(e) => format!("no status: {e}"),
        };
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!(
            "--- container {}: {state}\n--- its output:\n{}",
            self.id,
            tail(&output, 20)
        )
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.stop();
            let id = self.id.clone();
            let _ = self.cri.runtime(|mut c| async move {
                c.remove_container(cri::RemoveContainerRequest { container_id: id })
                    .await
            });
        }
    }
}

/// Builds the sandbox image: `fixtures/pause.c` compiled statically, packed as an OCI
/// image layout (one uncompressed layer) in a tar for `ctr images import`.
fn pause_image(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pause.c");
    let exe = dir.join("pause");
    let out = run(Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&exe)
        .arg(&src));
    assert!(
        out.status.success(),
        "compiling {} failed (gcc and libc6-dev are needed): {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let pause = std::fs::read(&exe).unwrap();
    let layer = [
        Entry::Dir("dev", 0o755),
        Entry::Dir("etc", 0o755),
        Entry::Dir("proc", 0o555),
        Entry::Dir("sys", 0o555),
        Entry::Dir("tmp", 0o1777),
        Entry::File("pause", 0o755, &pause),
    ];
    let config = json!({
        "Entrypoint": ["/pause"],
        "User": "65535:65535",
        "WorkingDir": "/",
        "Env": ["PATH=/"],
    });
    oci_image(&dir.join("pause-oci.tar"), PAUSE_IMAGE, &layer, config)
}

/// Builds the workload image: the static busybox of Debian's `busybox-static`, with
/// `/bin/sh` and `/bin/httpd` linked to it, and `page` as `/www/index.html`.
fn busybox_image(dir: &Path, page: &str) -> PathBuf {
    let src = Path::new("/bin/busybox");
    let busybox = std::fs::read(src)
        .unwrap_or_else(|e| panic!("reading {} ({e}): install the busybox-static package", src.display()));
    assert!(
        !elf_has_interpreter(&busybox),
        "{} is dynamically linked and cannot run in an image without libc: install busybox-static",
        src.display()
    );
    let layer = [
        Entry::Dir("bin", 0o755),
        Entry::Dir("dev", 0o755),
        Entry::Dir("etc", 0o755),
        Entry::Dir("proc", 0o555),
        Entry::Dir("sys", 0o555),
        Entry::Dir("tmp", 0o1777),
        Entry::Dir("www", 0o755),
        Entry::File("bin/busybox", 0o755, &busybox),
        Entry::Link("bin/sh", "busybox"),
        Entry::Link("bin/httpd", "busybox"),
        Entry::File("www/index.html", 0o644, page.as_bytes()),
    ];
    let config = json!({
        "Entrypoint": ["/bin/sh"],
        "WorkingDir": "/",
        "Env": ["PATH=/bin"],
    });
    oci_image(&dir.join("busybox-oci.tar"), BUSYBOX_IMAGE, &layer, config)
}

/// Whether a 64-bit little-endian ELF executable names a program interpreter, that
/// is, is dynamically linked (anything else is taken as static).
fn elf_has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || !elf.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let le16 = |o: usize| usize::from(u16::from_le_bytes([elf[o], elf[o + 1]]));
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (le16(0x36), le16(0x38));
    (0..count).any(|i| {
        let at = phoff + i * size;
        elf.get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap()) == PT_INTERP)
    })
}

/// One entry of an image layer: a directory, a file or a symbolic link (path, target).
enum Entry<'a> {
    Dir(&'a str, u32),
    File(&'a str, u32, &'a [u8]),
    Link(&'a str, &'a str),
}

/// Packs `entries` as the one uncompressed layer of an image named `reference` with
/// the image config's `config` section, as an OCI image layout in a tar at `path`.
fn oci_image(path: &Path, reference: &str, entries: &[Entry], config: Value) -> PathBuf {
    let mut layer = tar::Builder::new(Vec::new());
    for e in entries {
        match e {
            Entry::Dir(name, mode) => {
                let mut h = tar_header(tar::EntryType::Directory, *mode, 0);
                layer.append_data(&mut h, format!("{name}/"), std::io::empty()).unwrap();
            }
            Entry::File(name, mode, data) => {
                let mut h = tar_header(tar::EntryType::Regular, *mode, data.len() as u64);
                layer.append_data(&mut h, name, *data).unwrap();
            }
            Entry::Link(name, target) => {
                let mut h = tar_header(tar::EntryType::Symlink, 0o777, 0);
                layer.append_link(&mut h, name, target).unwrap();
            }
        }
    }
    let layer = layer.into_inner().unwrap();

    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    })
    .to_string()
    .into_bytes();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": digest(&layer),
            "size": layer.len(),
        }],
    })
    .to_string()
    .into_bytes();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {
                "io.containerd.image.name": reference,
                "org.opencontainers.image.ref.name": reference,
            },
        }],
    })
    .to_string()
    .into_bytes();

    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |name: String, data: &[u8]| {
        let mut h = tar_header(tar::EntryType::Regular, 0o644, data.len() as u64);
        archive.append_data(&mut h, name, data).unwrap();
    };
    add("oci-layout".to_string(), br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json".to_string(), &index);
    for blob in [&layer, &config, &manifest] {
        add(format!("blobs/sha256/{}", &digest(blob)["sha256:".len()..]), blob);
    }
    std::fs::write(path, archive.into_inner().unwrap()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path.to_path_buf()
}

fn tar_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn digest(b: &[u8]) -> String {
    let hex: String = Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect();
    format!("sha256:{hex}")
}
