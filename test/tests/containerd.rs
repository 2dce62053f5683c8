//! weft through a real container runtime: a private containerd 1.6 (CRI plugin, runc,
//! overlayfs) runs in a node namespace beside weftd, with weft as its only CNI network.
//! A pod sandbox is run, inspected, stopped and removed through CRI as the kubelet does
//! it, and the node must be left holding nothing of weft's.
//!
//! Needs root and these Debian packages beyond Rust: `containerd` (with `ctr`), `runc`,
//! `containernetworking-plugins` (for `loopback`, which containerd runs for every pod's
//! `lo`), `gcc` and `libc6-dev` (the static pause binary), `protobuf-compiler` (the
//! `k8s-cri` crate's build), `iproute2`, `iputils-ping` and `util-linux` (`nsenter`).
//! Nothing is pulled: the sandbox ("pause") image is built here from `fixtures/pause.c`.
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
use weft_tests::{Daemon, TempDir, bin, privileged, run, sh};

/// The pod range weft allocates from in this test.
const POD_NET: Ipv4Addr = Ipv4Addr::new(10, 244, 77, 0);
const POD_PREFIX: u32 = 24;
/// The sandbox image containerd is told to use; it exists only as imported here.
const PAUSE_IMAGE: &str = "localhost/weft/pause:test";
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
    let daemon = Daemon::start("ctrd");
    let ctrd = Containerd::start(&daemon);
    eprintln!("containerd answering after {:.1?}", t0.elapsed());

    let image = pause_image(ctrd.dir());
    ctrd.import(&image);
    let cri = Cri::connect(&ctrd.socket());
    cri.wait_ready(&ctrd, &daemon);
    eprintln!("CRI ready, pause image imported after {:.1?}", t0.elapsed());

    // RunPodSandbox: containerd makes the pod's netns and runs CNI ADD through weft.
    let uid = random_uid();
    let name = "weft-ctrd-pod";
    let log_dir = ctrd.dir().join("pods").join(&uid);
    std::fs::create_dir_all(&log_dir).unwrap();
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.clone(),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: log_dir.to_str().unwrap().to_string(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: ctrd.cgroup_parent(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Pod as i32,
                    pid: cri::NamespaceMode::Pod as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
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
    fn start(daemon: &Daemon) -> Self {
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
        symlink(bin("weft"), p.join("cni/bin/weft")).unwrap();
        symlink(loopback, p.join("cni/bin/loopback")).unwrap();
        // containerd 1.6's libcni speaks at most CNI 1.0.0.
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "weft",
            "plugins": [{
                "type": "weft",
                "socket": daemon.socket(),
                "ranges": [format!("{POD_NET}/{POD_PREFIX}")],
                "mtu": 1500,
            }],
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
    /// the CRI plugin sees the imported sandbox image.
    fn wait_ready(&self, ctrd: &Containerd, daemon: &Daemon) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            let status = self.runtime(|mut c| async move { c.status(cri::StatusRequest { verbose: false }).await });
            let image = self.images(|mut c| async move {
                c.image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: PAUSE_IMAGE.to_string(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
            });
            match (status, image) {
                (Ok(s), Ok(i)) => {
                    let conds = s.status.map(|s| s.conditions).unwrap_or_default();
                    let ready = |t: &str| conds.iter().any(|c| c.r#type == t && c.status);
                    if ready("RuntimeReady") && ready("NetworkReady") && i.image.is_some() {
                        return;
                    }
                    last = format!("conditions {conds:?}, image {PAUSE_IMAGE} known: {}", i.image.is_some());
                }
                (s, i) => last = format!("Status: {:?}, ImageStatus: {:?}", s.err(), i.err()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("containerd's CRI did not become ready ({last})\n{}", diag(ctrd, daemon));
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

    let mut layer = tar::Builder::new(Vec::new());
    for (d, mode) in [
        ("dev", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("tmp", 0o1777),
    ] {
        let mut h = tar_header(tar::EntryType::Directory, mode, 0);
        layer.append_data(&mut h, format!("{d}/"), std::io::empty()).unwrap();
    }
    let mut h = tar_header(tar::EntryType::Regular, 0o755, pause.len() as u64);
    layer.append_data(&mut h, "pause", pause.as_slice()).unwrap();
    let layer = layer.into_inner().unwrap();

    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": ["/pause"],
            "User": "65535:65535",
            "WorkingDir": "/",
            "Env": ["PATH=/"],
        },
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
                "io.containerd.image.name": PAUSE_IMAGE,
                "org.opencontainers.image.ref.name": PAUSE_IMAGE,
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
    let path = dir.join("pause-oci.tar");
    std::fs::write(&path, archive.into_inner().unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
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
