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
//! containerd, the CRI client and the images come from [`weft_tests::cri`]; what
//! containerd makes lives in its temporary directory, weft's CNI plugin and network
//! config included (`cni/bin`, `cni/conf`).

use std::net::Ipv4Addr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::{Value, json};
use weft_tests::cri::{
    Container, Containerd, Cri, LayerEntry, NETWORK_READY, RUNTIME_READY, Sandbox, elf_has_interpreter, oci_image,
    pause_image, pod_namespaces, pod_sandbox_config, random_uid, sandbox_netns, tail,
};
use weft_tests::{Daemon, Netns, bin, privileged, run, sh};

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

#[test]
fn containerd_runs_a_pod_sandbox_on_weft_and_tears_it_down() {
    let _area = weft_tests::area("runtime::containerd");
    if !privileged() {
        return;
    }
    let t0 = Instant::now();
    let mut daemon = Daemon::start("ctrd");
    let ctrd = start_containerd(&daemon, CniSetup::default());
    eprintln!("containerd answering after {:.1?}", t0.elapsed());

    let image = pause_image(ctrd.dir(), PAUSE_IMAGE);
    ctrd.import(&image);
    let cri = Cri::connect(&ctrd.socket());
    cri.wait_ready(&[RUNTIME_READY, NETWORK_READY], &[PAUSE_IMAGE], Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("containerd's CRI did not become ready ({e})\n{}", diag(&ctrd, &daemon)));
    eprintln!("CRI ready, pause image imported after {:.1?}", t0.elapsed());

    // RunPodSandbox: containerd makes the pod's netns and runs CNI ADD through weft.
    let uid = random_uid();
    let name = "weft-ctrd-pod";
    let config = pod_sandbox_config(&ctrd, name, &uid);
    let t_run = Instant::now();
    let mut pod =
        Sandbox::run(&cri, config).unwrap_or_else(|e| panic!("RunPodSandbox failed: {e}\n{}", diag(&ctrd, &daemon)));
    eprintln!("RunPodSandbox took {:.1?}: sandbox {}", t_run.elapsed(), pod.id);

    // PodSandboxStatus: the address CRI reports, and the pod's network namespace.
    let status = pod
        .status()
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
    let netns = sandbox_netns(&status.info).unwrap_or_else(|e| panic!("{e}"));
    pod.netns = Some(netns.clone());
    let ns_text = netns.to_str().unwrap();
    assert!(
        ns_text.starts_with("/run/netns/cni-") || ns_text.starts_with("/var/run/netns/cni-"),
        "containerd put the pod's netns at an unexpected place: {ns_text}"
    );
    eprintln!("pod address {ip}, netns {}", netns.display());

    // The kernel agrees: the pod's eth0 holds exactly that address, with a default
    // route, and containerd's loopback network brought lo up beside it.
    let eth0 = ip_json_in(&netns, &["-4", "addr", "show", "eth0"]);
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
    let default = ip_json_in(&netns, &["-4", "route", "show", "default"]);
    assert_eq!(
        default.as_array().map(Vec::len),
        Some(1),
        "the pod has no IPv4 default route: {default}"
    );
    let lo = ip_json_in(&netns, &["link", "show", "lo"]);
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
    let eth0_after = ip_json_in(&netns, &["-4", "addr", "show", "eth0"]);
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
    let _area = weft_tests::area("runtime::containerd");
    if !privileged() {
        return;
    }
    let t0 = Instant::now();
    let daemon = Daemon::start("ctrdhp");
    sh(daemon
        .node
        .cmd("ip")
        .args(["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"]));
    let ctrd = start_containerd(
        &daemon,
        CniSetup {
            port_mappings: true,
            record_calls: true,
        },
    );
    // The page httpd serves, unique to this run.
    let page = format!("weft host port test {}\n", random_uid());
    ctrd.import(&pause_image(ctrd.dir(), PAUSE_IMAGE));
    ctrd.import(&busybox_image(ctrd.dir(), &page));
    let cri = Cri::connect(&ctrd.socket());
    cri.wait_ready(
        &[RUNTIME_READY, NETWORK_READY],
        &[PAUSE_IMAGE, BUSYBOX_IMAGE],
        Duration::from_secs(20),
    )
    .unwrap_or_else(|e| panic!("containerd's CRI did not become ready ({e})\n{}", diag(&ctrd, &daemon)));
    eprintln!(
        "CRI ready, pause and busybox images imported after {:.1?}",
        t0.elapsed()
    );

    // RunPodSandbox with a host port. The conflist only declares the capability, so a
    // mapping weft gets can only have come from containerd.
    let uid = random_uid();
    let name = "weft-ctrd-hostport";
    let mut config = pod_sandbox_config(&ctrd, name, &uid);
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
    let netns = sandbox_netns(&status.info).unwrap_or_else(|e| panic!("{e}"));
    pod.netns = Some(netns.clone());
    let ip: Ipv4Addr = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .and_then(|n| n.ip.parse().ok())
        .unwrap_or_else(|| panic!("CRI reports no IPv4 address for the pod: {status:?}"));
    eprintln!("sandbox {} at {ip} after {:.1?}", pod.id, t0.elapsed());

    // What containerd passed weft on ADD, and what weftd holds and wrote because of it.
    let adds = cni_calls(&ctrd, "ADD");
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
    web.stop(10)
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
    // The container went with its sandbox.
    web.leave_to_sandbox();
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
fn ip_json_in(netns: &Path, args: &[&str]) -> Value {
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

/// The last lines of both logs, for failure messages.
fn diag(ctrd: &Containerd, daemon: &Daemon) -> String {
    format!(
        "{}\n--- weftd log (tail):\n{}",
        ctrd.log_tail(),
        tail(&daemon.log(), 40)
    )
}

/// How containerd's CNI network is set up.
#[derive(Default)]
struct CniSetup {
    /// Declares weft's `portMappings` capability, so containerd passes a sandbox's
    /// port mappings in `runtimeConfig`.
    port_mappings: bool,
    /// Runs weft through a wrapper that keeps what each call got on stdin, in
    /// `cni/calls/<command>-<pid>.json` (see [`cni_calls`]).
    record_calls: bool,
}

/// Starts containerd in the daemon's node namespace with weft (and `loopback`) as its
/// CNI network, in `cni/` of containerd's directory.
fn start_containerd(daemon: &Daemon, cni: CniSetup) -> Containerd {
    Containerd::builder(&daemon.node, PAUSE_IMAGE)
        .prepare(move |dir| install_cni(dir, daemon, &cni))
        .start()
}

/// Puts weft's plugin and network config, and the reference loopback plugin, which
/// containerd runs for every pod's lo before the configured network, where containerd
/// looks for them (`cni/bin`, `cni/conf` under `dir`).
fn install_cni(p: &Path, daemon: &Daemon, cni: &CniSetup) {
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
}

/// What weft got on stdin in each `command` call, oldest first, when the calls are
/// recorded ([`CniSetup::record_calls`]).
fn cni_calls(ctrd: &Containerd, command: &str) -> Vec<Value> {
    let dir = ctrd.dir().join("cni/calls");
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
        LayerEntry::Dir("bin", 0o755),
        LayerEntry::Dir("www", 0o755),
        LayerEntry::File("bin/busybox", 0o755, &busybox),
        LayerEntry::Link("bin/sh", "busybox"),
        LayerEntry::Link("bin/httpd", "busybox"),
        LayerEntry::File("www/index.html", 0o644, page.as_bytes()),
    ];
    let config = json!({
        "Entrypoint": ["/bin/sh"],
        "WorkingDir": "/",
        "Env": ["PATH=/bin"],
    });
    oci_image(&dir.join("busybox-oci.tar"), BUSYBOX_IMAGE, &layer, config)
}
