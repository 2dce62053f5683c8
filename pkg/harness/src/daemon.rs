//! weftd running inside a node namespace, with its own socket, state and log.

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{HarnessError, NamedNetns, wait_exit};

/// How long a daemon may take to start serving before [`NodeDaemon::start`] gives up.
const START_LIMIT: Duration = Duration::from_secs(15);

/// How one weftd is started: its binary, paths, flags and environment.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Its socket (`--socket`).
    pub socket: PathBuf,
    /// Its state directory (`--state-dir`).
    pub state_dir: PathBuf,
    /// The file its output is appended to.
    pub log: PathBuf,
    /// `--node-name`.
    pub node_name: String,
    /// `--metrics-addr`, inside the node namespace.
    pub metrics_addr: String,
    /// Flags after the ones above.
    pub args: Vec<String>,
    /// Environment added to this process's.
    pub env: Vec<(String, String)>,
    /// A weftctl binary: when set, the daemon counts as serving once `weftctl status`
    /// answers, not as soon as its socket accepts (the socket is bound before start-up
    /// recovery, so a connection alone does not mean calls are served).
    pub status_probe: Option<PathBuf>,
    /// Start it in a session of its own, so it outlives a terminal the caller was
    /// started from (a lab's daemons stay up after `weftctl lab up` returns).
    pub own_session: bool,
    /// Give the state directory a file system of this size (`tmpfs` `size=`, as `4m`)
    /// that only this weftd sees: it runs in a mount namespace of its own, so the mount
    /// goes with the process and nothing is left mounted on the host. For a disk that
    /// fills up; the state is lost when the process ends, so a start again begins on an
    /// empty state. Reach it from outside through [`NodeDaemon::state_dir_seen`].
    pub state_fs_size: Option<String>,
}

impl DaemonConfig {
    /// weftd named `node_name` with its socket, state and log under `dir`, its metrics
    /// on 127.0.0.1:9384.
    pub fn under(weftd: &Path, dir: &Path, node_name: &str) -> Self {
        Self {
            weftd: weftd.to_path_buf(),
            socket: dir.join("weftd.sock"),
            state_dir: dir.join("state"),
            log: dir.join("weftd.log"),
            node_name: node_name.to_string(),
            metrics_addr: "127.0.0.1:9384".to_string(),
            args: Vec::new(),
            env: Vec::new(),
            status_probe: None,
            own_session: false,
            state_fs_size: None,
        }
    }

    /// The command that starts this weftd inside `node`, its output appended to the log.
    pub fn command(&self, node: &NamedNetns) -> Result<Command, HarnessError> {
        if let Some(dir) = self.log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
        }
        let open_log = || {
            File::options()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| HarnessError::io(format!("opening {}", self.log.display()), e))
        };
        let mut cmd = match &self.state_fs_size {
            None => Command::new(&self.weftd),
            Some(size) => {
                // Slave propagation: the mount never reaches the host's namespace, while
                // the pod namespaces mounted under /run/netns later still reach weftd's.
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "slave", "--", "sh", "-c"])
                    .arg(r#"mkdir -p "$1" && mount -t tmpfs -o "size=$2,mode=0700" weft-state "$1" && shift 2 && exec "$@""#)
                    .arg("sh")
                    .arg(&self.state_dir)
                    .arg(size)
                    .arg(&self.weftd);
                c
            }
        };
        cmd.arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(["--metrics-addr", &self.metrics_addr, "--node-name", &self.node_name])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(open_log()?)
            .stderr(open_log()?);
        node.enter_in_child(&mut cmd)?;
        if self.own_session {
            own_session(&mut cmd);
        }
        Ok(cmd)
    }
}

fn own_session(cmd: &mut Command) {
    weft_kernel::process::own_session(cmd);
}

/// Waits up to `limit` for something to accept connections on `socket`, giving up
/// early once `running` says the process that should serve it is gone. Whether it did.
pub fn wait_for_socket(socket: &Path, limit: Duration, mut running: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if UnixStream::connect(socket).is_ok() {
            return true;
        }
        if !running() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A weftd started by this process inside a node namespace; killed on drop.
#[derive(Debug)]
pub struct NodeDaemon {
    child: Option<Child>,
    node: NamedNetns,
    config: DaemonConfig,
}

impl NodeDaemon {
    /// Starts weftd in `node` without waiting for it to serve.
    pub fn spawn(node: &NamedNetns, config: DaemonConfig) -> Result<Self, HarnessError> {
        let mut d = Self {
            child: None,
            node: NamedNetns::existing(node.name()),
            config,
        };
        d.spawn_child()?;
        Ok(d)
    }

    /// Starts weftd in `node` and waits until it serves.
    pub fn start(node: &NamedNetns, config: DaemonConfig) -> Result<Self, HarnessError> {
        let mut d = Self::spawn(node, config)?;
        d.wait_serving(START_LIMIT)?;
        Ok(d)
    }

    fn spawn_child(&mut self) -> Result<(), HarnessError> {
        let child = self
            .config
            .command(&self.node)?
            .spawn()
            .map_err(|e| HarnessError::io(format!("starting {}", self.config.weftd.display()), e))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits up to `limit` until the daemon serves (see [`DaemonConfig::status_probe`]).
    pub fn wait_serving(&mut self, limit: Duration) -> Result<(), HarnessError> {
        if self.child.is_none() {
            return Err(HarnessError::Command {
                what: "waiting for weftd to serve".into(),
                detail: "it is not running".into(),
            });
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let child = &mut self.child;
            let connected = wait_for_socket(&self.config.socket, left, || {
                child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
            });
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(HarnessError::Command {
                    what: "weftd exited at start".into(),
                    detail: format!("{st}; see {}", self.config.log.display()),
                });
            }
            if connected && self.answers_status() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Command {
                    what: "weftd did not start serving".into(),
                    detail: self.config.log.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn answers_status(&self) -> bool {
        let Some(weftctl) = &self.config.status_probe else {
            return true;
        };
        Command::new(weftctl)
            .arg("--socket")
            .arg(&self.config.socket)
            .args(["--json", "status"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// How it is (and will next be) started.
    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// How it will next be started ([`NodeDaemon::start_again`]).
    pub fn config_mut(&mut self) -> &mut DaemonConfig {
        &mut self.config
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The state directory as this weftd sees it, as a path this process can use: with
    /// [`DaemonConfig::state_fs_size`], through its `/proc/<pid>/root` (`None` while it
    /// does not run); else the configured path.
    pub fn state_dir_seen(&self) -> Option<PathBuf> {
        if self.config.state_fs_size.is_none() {
            return Some(self.config.state_dir.clone());
        }
        let pid = self.pid()?;
        let inside = self
            .config
            .state_dir
            .strip_prefix("/")
            .unwrap_or(&self.config.state_dir);
        Some(PathBuf::from(format!("/proc/{pid}/root")).join(inside))
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<(), HarnessError> {
        let pid = self.pid().ok_or_else(|| HarnessError::Command {
            what: format!("signalling weftd with {sig}"),
            detail: "it is not running".into(),
        })?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
            .map_err(|e| HarnessError::io(format!("signalling weftd with {sig}"), e.into()))
    }

    /// SIGKILLs the daemon (a crash) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the daemon with SIGTERM (it finishes calls and teardowns in flight) and
    /// waits up to `limit` before killing it; its exit status, `None` when it was not
    /// running.
    pub fn stop(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        wait_exit(&mut c, limit).or_else(|| {
            let _ = c.kill();
            c.wait().ok()
        })
    }

    /// Waits up to `limit` for the daemon to exit on its own and reaps it; `None` when
    /// it still runs then (or was not running).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let st = wait_exit(self.child.as_mut()?, limit)?;
        self.child = None;
        Some(st)
    }

    /// Starts it again (on the same socket and state) after it exited, was stopped or
    /// killed, and waits until it serves.
    pub fn start_again(&mut self) -> Result<(), HarnessError> {
        self.spawn_again()?;
        self.wait_serving(START_LIMIT)
    }

    /// Starts the daemon again without waiting for it to serve (a test holds it at a
    /// pause point on the way; [`NodeDaemon::wait_serving`] waits after).
    pub fn spawn_again(&mut self) -> Result<(), HarnessError> {
        if self.child.is_some() {
            return Err(HarnessError::Command {
                what: "starting weftd again".into(),
                detail: "it is still running".into(),
            });
        }
        self.spawn_child()
    }

    /// Lets the daemon run on after this value is gone (a lab's daemons outlive
    /// `weftctl lab up`); its pid.
    pub fn detach(mut self) -> Option<u32> {
        self.child.take().map(|c| c.id())
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}
