//! weft behind a real container runtime: a private containerd 1.6 (CRI plugin, runc,
//! overlayfs) in a node's network namespace, a CRI client to drive it as kubelet does,
//! guards for the sandboxes and containers a test makes, and the images it imports
//! (nothing is pulled: the sandbox image is built here from `fixtures/pause.c`).
//!
//! Everything containerd makes lives in one temporary directory (root, state, runc's
//! state, socket, mounts), except each pod's network namespace, which containerd 1.6
//! mounts under `/var/run/netns/cni-*` and removes when the sandbox stops, and the shims'
//! sockets in `/run/containerd/s`. Sandboxes' cgroups are put under a parent named after
//! that directory ([`Containerd::cgroup_parent`]), so all of it can be removed afterwards.
//!
//! Needs root, `containerd` (with `ctr`), `runc`, `gcc` and `libc6-dev` (the static pause
//! binary), `protobuf-compiler` (the `k8s-cri` crate's build) and `util-linux`.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint};

use crate::{Netns, TempDir, run};

/// How long one CRI call may take before it counts as failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// `PATH` for containerd, which looks up `runc` and `containerd-shim-runc-v2` there.
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The CRI condition that the runtime can run sandboxes and containers.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// The CRI condition that containerd has loaded a CNI network config.
pub const NETWORK_READY: &str = "NetworkReady";

// ---------------------------------------------------------------------------------
// containerd.

/// What runs on containerd's directory before containerd starts.
type Prepare<'a> = Box<dyn FnOnce(&Path) + 'a>;

/// How to start a [`Containerd`]; made by [`Containerd::builder`].
pub struct ContainerdBuilder<'a> {
    node: &'a Netns,
    sandbox_image: String,
    tag: String,
    cni_dirs: Option<(String, String)>,
    host_paths: Option<Vec<String>>,
    prepare: Option<Prepare<'a>>,
}

impl<'a> ContainerdBuilder<'a> {
    /// The tag in the temporary directory's name (`ctrd` unless set), to tell apart the
    /// leftovers of different tests.
    pub fn tag(mut self, tag: &str) -> Self {
        self.tag = tag.to_string();
        self
    }

    /// Where containerd looks for CNI plugins and network configs, as the node sees them.
    /// Unless set: `cni/bin` and `cni/conf` in containerd's directory, created empty for
    /// [`ContainerdBuilder::prepare`] to fill.
    pub fn cni_dirs(mut self, bin: &str, conf: &str) -> Self {
        self.cni_dirs = Some((bin.to_string(), conf.to_string()));
        self
    }

    /// Runs containerd in a mount namespace of its own (propagation from the host only)
    /// in which each of `paths` is bind-mounted from `<dir>/node/<path>`
    /// ([`Containerd::node_path`]), so a DaemonSet's hostPaths are used unchanged while
    /// the host's own directories stay untouched; then every mount is made shared within
    /// it, as on a node booted with systemd, so mounts made later (pod network namespaces
    /// under /run/netns) reach containers with HostToContainer propagation. Mount points
    /// missing on the host are created empty and removed afterwards.
    pub fn bind_host_paths(mut self, paths: &[String]) -> Self {
        self.host_paths = Some(paths.to_vec());
        self
    }

    /// Runs `f` on containerd's directory once its layout is made and before containerd
    /// starts, for what it must find at startup (a CNI plugin and network config).
    pub fn prepare(mut self, f: impl FnOnce(&Path) + 'a) -> Self {
        self.prepare = Some(Box::new(f));
        self
    }

    /// Starts containerd and waits until it answers on its socket.
    pub fn start(self) -> Containerd {
        let dir = TempDir::new(&self.tag);
        let p = dir.path().to_path_buf();
        // Built before anything is spawned, so a failure from here on cleans up.
        let mut c = Containerd {
            child: None,
            dir,
            made: Vec::new(),
        };
        for d in ["/run/containerd", "/run/containerd/s"] {
            make_dirs(Path::new(d), &mut c.made);
        }
        for d in ["root", "state", "opt", "runc", "pods"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        let d = |s: &str| p.join(s).to_str().unwrap().to_string();
        let (cni_bin, cni_conf) = self.cni_dirs.unwrap_or_else(|| {
            std::fs::create_dir_all(p.join("cni/bin")).unwrap();
            std::fs::create_dir_all(p.join("cni/conf")).unwrap();
            (d("cni/bin"), d("cni/conf"))
        });
        let mut script = String::from("set -eu\n");
        for hp in self.host_paths.iter().flatten() {
            assert!(hp.starts_with('/') && !hp.contains('\''), "hostPath {hp:?}");
            let src = c.node_path(hp);
            std::fs::create_dir_all(&src).unwrap();
            make_dirs(Path::new(hp), &mut c.made);
            script += &format!("mount --bind '{}' '{hp}'\n", src.display());
        }
        script += "mount --make-rshared /\nexec containerd --config \"$1\"\n";
        if let Some(prepare) = self.prepare {
            prepare(&p);
        }

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
    sandbox_image = "{sandbox_image}"
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
            sandbox_image = self.sandbox_image,
            runc = d("runc"),
        );
        std::fs::write(p.join("config.toml"), config).unwrap();

        // nsenter joins only the node's network namespace: `ip netns exec` would also give
        // containerd a private mount namespace, and the pod netns it mounts under
        // /run/netns would then be invisible to a weftd outside it. With hostPaths bound,
        // weftd runs inside containerd's mount namespace and sees them there. nsenter and
        // unshare exec what follows, so the child is containerd itself.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.node.path()));
        if self.host_paths.is_some() {
            cmd.args([
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "sh",
                "-c",
                &script,
                "sh",
            ]);
        } else {
            cmd.args(["containerd", "--config"]);
        }
        let log = std::fs::File::create(p.join("containerd.log")).unwrap();
        let child = cmd
            .arg(p.join("config.toml"))
            .env("PATH", SYSTEM_PATH)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd (is the containerd package installed?)");
        c.child = Some(child);
        c.wait_serving(Duration::from_secs(20));
        c
    }
}

/// A private containerd in a node's network namespace. Dropping it stops containerd,
/// ends what it started (containers, shims), unmounts what it mounted, removes its
/// cgroup parent and its directory, and the host directories it had to create.
pub struct Containerd {
    child: Option<Child>,
    dir: TempDir,
    /// Directories created on the host (/run/containerd/s, mount points): removed
    /// afterwards, deepest first, if empty again.
    made: Vec<PathBuf>,
}

impl Containerd {
    /// How to start a containerd in `node`'s network namespace whose CRI plugin uses
    /// `sandbox_image` (which must be imported: nothing is pulled).
    pub fn builder<'a>(node: &'a Netns, sandbox_image: &str) -> ContainerdBuilder<'a> {
        ContainerdBuilder {
            node,
            sandbox_image: sandbox_image.to_string(),
            tag: "ctrd".to_string(),
            cni_dirs: None,
            host_paths: None,
            prepare: None,
        }
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

    /// containerd's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where the node's `path` is, as seen from outside the node's mount namespace
    /// (see [`ContainerdBuilder::bind_host_paths`]).
    pub fn node_path(&self, path: &str) -> PathBuf {
        self.dir().join("node").join(path.trim_start_matches('/'))
    }

    /// containerd's socket, for CRI and `ctr`.
    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// The cgroup parent for sandboxes: named after the temporary directory, so it is
    /// recognisably this containerd's and is removed with it.
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.dir().file_name().unwrap().to_str().unwrap())
    }

    /// The last lines of containerd's log, headed as such, for failure messages.
    pub fn log_tail(&self) -> String {
        format!(
            "--- containerd log (tail):\n{}",
            tail(
                &std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default(),
                60
            )
        )
    }

    /// Imports an OCI image-layout tar into the CRI plugin's namespace, bounded.
    pub fn import(&self, tar: &Path) {
        let out = run(Command::new("timeout")
            .arg("300")
            .arg("ctr")
            .arg("-a")
            .arg(self.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar));
        assert!(
            out.status.success(),
            "ctr images import {} failed: {}{}\n{}",
            tar.display(),
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
        if crate::wait_exit(&mut child, Duration::from_secs(10)).is_none() {
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
                let _ = Command::new("timeout")
                    .arg("20")
                    .arg("runc")
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

    /// Lazily unmounts whatever the host's mount namespace has under the directory,
    /// deepest first (mounts in a node mount namespace of its own die with it).
    fn unmount_all(&self) {
        let prefix = format!("{}/", self.dir().display());
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
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

    /// Removes the sandboxes' (empty) parent cgroup from every hierarchy.
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

/// Creates `path` and any missing parent, recording each directory it created.
fn make_dirs(path: &Path, made: &mut Vec<PathBuf>) {
    let missing: Vec<&Path> = path.ancestors().take_while(|a| !a.exists()).collect();
    for d in missing.into_iter().rev() {
        std::fs::create_dir(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        made.push(d.to_path_buf());
    }
}

// ---------------------------------------------------------------------------------
// CRI.

/// A CRI client over containerd's socket, with a runtime to drive it from sync code.
pub struct Cri {
    rt: tokio::runtime::Runtime,
    channel: Channel,
}

impl Cri {
    /// Connects to the CRI services at `sock`.
    pub fn connect(sock: &Path) -> Self {
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
    pub fn runtime<T, F, Fut>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.block(f(RuntimeServiceClient::new(self.channel.clone())))
    }

    /// One call on the image service, bounded by [`CALL_TIMEOUT`].
    pub fn images<T, F, Fut>(&self, f: F) -> Result<T, String>
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

    /// The runtime's conditions (Status).
    pub fn conditions(&self) -> Result<Vec<v1::RuntimeCondition>, String> {
        let s = self.runtime(|mut c| async move { c.status(v1::StatusRequest { verbose: false }).await })?;
        Ok(s.status.map(|s| s.conditions).unwrap_or_default())
    }

    /// Waits up to `limit` until every condition in `conditions` ([`RUNTIME_READY`],
    /// [`NETWORK_READY`]) holds and the CRI plugin knows every image in `images`; an
    /// error tells what was seen last.
    pub fn wait_ready(&self, conditions: &[&str], images: &[&str], limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            let known: Result<Vec<bool>, String> = images.iter().map(|i| self.image_known(i)).collect();
            match (self.conditions(), known) {
                (Ok(conds), Ok(known)) => {
                    let holds = |t: &&str| conds.iter().any(|c| c.r#type == *t && c.status);
                    if conditions.iter().all(holds) && known.iter().all(|k| *k) {
                        return Ok(());
                    }
                    last = format!("conditions {conds:?}, images {images:?} known: {known:?}");
                }
                (s, i) => last = format!("Status: {:?}, ImageStatus: {:?}", s.err(), i.err()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last)
    }

    /// Whether the CRI plugin knows `image`.
    pub fn image_known(&self, image: &str) -> Result<bool, String> {
        let image = image.to_string();
        let r = self.images(|mut c| async move {
            c.image_status(v1::ImageStatusRequest {
                image: Some(v1::ImageSpec {
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
pub struct Sandbox<'a> {
    cri: &'a Cri,
    /// The sandbox's id.
    pub id: String,
    /// The pod's network namespace as containerd reported it (see [`sandbox_netns`]),
    /// if the test wants it cleaned up should containerd leave it.
    pub netns: Option<PathBuf>,
    removed: bool,
}

impl<'a> Sandbox<'a> {
    /// RunPodSandbox.
    pub fn run(cri: &'a Cri, config: v1::PodSandboxConfig) -> Result<Self, String> {
        let r = cri.runtime(|mut c| async move {
            c.run_pod_sandbox(v1::RunPodSandboxRequest {
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

    /// The verbose PodSandboxStatus (its `info` holds the runtime spec and pid).
    pub fn status(&self) -> Result<v1::PodSandboxStatusResponse, String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.pod_sandbox_status(v1::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: true,
            })
            .await
        })
    }

    /// StopPodSandbox: its containers stop and CNI DEL runs with the netns.
    pub fn stop(&self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.stop_pod_sandbox(v1::StopPodSandboxRequest { pod_sandbox_id: id })
                .await
        })?;
        Ok(())
    }

    /// RemovePodSandbox, with its containers.
    pub fn remove(&mut self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.remove_pod_sandbox(v1::RemovePodSandboxRequest { pod_sandbox_id: id })
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

/// A container created through CRI in a sandbox. Dropping it stops and removes it,
/// unless it was left to its sandbox ([`Container::leave_to_sandbox`]).
pub struct Container<'a> {
    cri: &'a Cri,
    /// The container's id.
    pub id: String,
    /// Where containerd writes the container's output.
    log: PathBuf,
    /// Gone, or left to be removed with its sandbox.
    left: bool,
}

impl<'a> Container<'a> {
    /// CreateContainer in the sandbox `sandbox_id` run with `sandbox`.
    pub fn create(
        cri: &'a Cri,
        sandbox_id: &str,
        sandbox: &v1::PodSandboxConfig,
        config: v1::ContainerConfig,
    ) -> Result<Self, String> {
        let log = Path::new(&sandbox.log_directory).join(&config.log_path);
        // containerd does not create the log's directory (`<name>/0.log` as kubelet names it).
        if let Some(d) = log.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        let request = v1::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox.clone()),
        };
        let r = cri.runtime(|mut c| async move { c.create_container(request).await })?;
        Ok(Self {
            cri,
            id: r.container_id,
            log,
            left: false,
        })
    }

    /// Leaves the container to its sandbox: dropping it no longer stops or removes it
    /// (as kubelet keeps an exited init container, or once RemovePodSandbox took it).
    pub fn leave_to_sandbox(&mut self) {
        self.left = true;
    }

    /// StartContainer.
    pub fn start(&self) -> Result<(), String> {
        let id = self.id.clone();
        self.cri
            .runtime(|mut c| async move { c.start_container(v1::StartContainerRequest { container_id: id }).await })?;
        Ok(())
    }

    /// ContainerStatus.
    pub fn status(&self) -> Result<v1::ContainerStatus, String> {
        let id = self.id.clone();
        let r = self.cri.runtime(|mut c| async move {
            c.container_status(v1::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
        })?;
        r.status.ok_or_else(|| "ContainerStatus carries no status".to_string())
    }

    /// StopContainer: SIGTERM, SIGKILL after `timeout` seconds.
    pub fn stop(&self, timeout: i64) -> Result<(), String> {
        let id = self.id.clone();
        self.cri.runtime(|mut c| async move {
            c.stop_container(v1::StopContainerRequest {
                container_id: id,
                timeout,
            })
            .await
        })?;
        Ok(())
    }

    /// Waits until the container has exited; its status. Panics after `limit`.
    pub fn wait_exited(&self, limit: Duration) -> v1::ContainerStatus {
        let deadline = Instant::now() + limit;
        loop {
            match self.status() {
                Ok(s) if s.state == v1::ContainerState::ContainerExited as i32 => return s,
                _ if Instant::now() > deadline => {
                    panic!("container did not exit within {limit:?}:\n{}", self.describe())
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The container's state and output, for failure messages.
    pub fn describe(&self) -> String {
        let state = match self.status() {
            Ok(s) => format!(
                "state {:?}, exit code {}, reason {:?}, message {:?}",
                v1::ContainerState::try_from(s.state),
                s.exit_code,
                s.reason,
                s.message
            ),
            Err(e) => format!("no status: {e}"),
        };
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!(
            "--- container {}: {state}\n--- its output (tail):\n{}",
            self.id,
            tail(&output, 40)
        )
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        if !self.left {
            let _ = self.stop(10);
            let id = self.id.clone();
            let _ = self.cri.runtime(|mut c| async move {
                c.remove_container(v1::RemoveContainerRequest { container_id: id })
                    .await
            });
        }
    }
}

/// The namespaces of an ordinary pod and its containers: network, PIDs and IPC of the
/// pod (not the node's).
pub fn pod_namespaces() -> v1::NamespaceOption {
    v1::NamespaceOption {
        network: v1::NamespaceMode::Pod as i32,
        pid: v1::NamespaceMode::Pod as i32,
        ipc: v1::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// An ordinary pod's sandbox config as kubelet sends it (namespace `default`, label
/// `app=<name>`), logging under `<containerd dir>/pods/<uid>` and with `ctrd`'s cgroup
/// parent, so containerd's cleanup covers it.
pub fn pod_sandbox_config(ctrd: &Containerd, name: &str, uid: &str) -> v1::PodSandboxConfig {
    let log_dir = ctrd.dir().join("pods").join(uid);
    std::fs::create_dir_all(&log_dir).unwrap();
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: log_dir.to_str().unwrap().to_string(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: ctrd.cgroup_parent(),
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `info` of a verbose PodSandboxStatus, as JSON.
fn status_info(info: &HashMap<String, String>) -> Result<Value, String> {
    let raw = info
        .get("info")
        .ok_or_else(|| format!("no \"info\" in the verbose status: {info:?}"))?;
    serde_json::from_str(raw).map_err(|e| format!("the status info is not JSON ({e}): {raw}"))
}

/// The pid of a sandbox's pause process, from the verbose PodSandboxStatus info.
pub fn sandbox_pid(info: &HashMap<String, String>) -> Result<i64, String> {
    let v = status_info(info)?;
    v["pid"]
        .as_i64()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("no pid in the status info: {v}"))
}

/// The pod's network namespace path, from the verbose PodSandboxStatus info: its OCI
/// runtime spec lists the namespaces the pause container joined.
pub fn sandbox_netns(info: &HashMap<String, String>) -> Result<PathBuf, String> {
    let v = status_info(info)?;
    let nss = v["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .ok_or_else(|| format!("no runtimeSpec.linux.namespaces in the status info: {v}"))?;
    nss.iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .map(PathBuf::from)
        .ok_or_else(|| format!("no network namespace path in {nss:?}"))
}

// ---------------------------------------------------------------------------------
// Images.

/// One entry of an image layer: a directory (path, mode), a file (path, mode, content)
/// or a symbolic link (path, target).
pub enum LayerEntry<'a> {
    /// A directory.
    Dir(&'a str, u32),
    /// A regular file.
    File(&'a str, u32, &'a [u8]),
    /// A symbolic link.
    Link(&'a str, &'a str),
}

/// Builds the sandbox image `reference`: `fixtures/pause.c` compiled statically, packed
/// as an OCI image layout in `dir/pause-oci.tar` for [`Containerd::import`].
pub fn pause_image(dir: &Path, reference: &str) -> PathBuf {
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
    let layer = [LayerEntry::File("pause", 0o755, &pause)];
    let config = json!({
        "Entrypoint": ["/pause"],
        "User": "65535:65535",
        "WorkingDir": "/",
        "Env": ["PATH=/"],
    });
    oci_image(&dir.join("pause-oci.tar"), reference, &layer, config)
}

/// The directories every image here gets before its own entries: where the runtime
/// mounts `/dev`, `/proc`, `/sys`, `/etc/hosts` and the like, and a `/tmp`.
const ROOT_DIRS: [LayerEntry<'static>; 5] = [
    LayerEntry::Dir("dev", 0o755),
    LayerEntry::Dir("etc", 0o755),
    LayerEntry::Dir("proc", 0o555),
    LayerEntry::Dir("sys", 0o555),
    LayerEntry::Dir("tmp", 0o1777),
];

/// Packs `entries`, after the root directories every image gets (`dev`, `etc`, `proc`,
/// `sys`, `tmp`), as the one uncompressed layer of an image named `reference` with the
/// image config's `config` section, as an OCI image layout in a tar at `path`.
pub fn oci_image(path: &Path, reference: &str, entries: &[LayerEntry], config: Value) -> PathBuf {
    let mut layer = tar::Builder::new(Vec::new());
    for e in ROOT_DIRS.iter().chain(entries) {
        match e {
            LayerEntry::Dir(name, mode) => {
                let mut h = tar_header(tar::EntryType::Directory, *mode, 0);
                layer.append_data(&mut h, format!("{name}/"), std::io::empty()).unwrap();
            }
            LayerEntry::File(name, mode, data) => {
                let mut h = tar_header(tar::EntryType::Regular, *mode, data.len() as u64);
                layer.append_data(&mut h, name, *data).unwrap();
            }
            LayerEntry::Link(name, target) => {
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

/// A header owned by root with a fixed mtime, so the same content makes the same image.
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

/// `sha256:<hex>` of `b`, as OCI names blobs.
pub fn digest(b: &[u8]) -> String {
    let hex: String = Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect();
    format!("sha256:{hex}")
}

/// Whether a 64-bit little-endian ELF executable names a program interpreter, that
/// is, is dynamically linked (anything else is taken as static): a dynamic binary
/// cannot run in an image without libc.
pub fn elf_has_interpreter(elf: &[u8]) -> bool {
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

// ---------------------------------------------------------------------------------
// Small helpers.

/// A random pod UID in the usual 8-4-4-4-12 form, so each run's pods are its own.
pub fn random_uid() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// The last `n` lines of `s`, for failure messages.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
