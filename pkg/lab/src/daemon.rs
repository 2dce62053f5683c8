//! A weftd running inside a node namespace, with its own socket, state and log.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::enter_in_child;
use crate::{LabError, NamedNetns};

/// Where a node daemon keeps its things.
#[derive(Debug, Clone)]
pub struct DaemonPaths {
    /// The weftd binary.
    pub weftd: PathBuf,
    /// Its socket.
    pub socket: PathBuf,
    /// Its state directory.
    pub state_dir: PathBuf,
    /// Its log file.
    pub log: PathBuf,
}

impl DaemonPaths {
    /// Socket, state and log under `dir`.
    pub fn under(weftd: &Path, dir: &Path) -> Self {
        Self {
            weftd: weftd.to_path_buf(),
            socket: dir.join("weftd.sock"),
            state_dir: dir.join("state"),
            log: dir.join("weftd.log"),
        }
    }
}

/// A running weftd; killed on drop unless stopped.
#[derive(Debug)]
pub struct NodeDaemon {
    child: Option<Child>,
    /// Its paths.
    pub paths: DaemonPaths,
}

impl NodeDaemon {
    /// Starts weftd in `node` with `extra` arguments and environment `env`, and waits
    /// until its socket answers.
    pub fn start(
        node: &NamedNetns,
        paths: DaemonPaths,
        node_name: &str,
        extra: &[String],
        env: &[(String, String)],
    ) -> Result<Self, LabError> {
        if let Some(dir) = paths.log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| LabError::io(format!("creating {}", dir.display()), e))?;
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&paths.log)
            .map_err(|e| LabError::io(format!("opening {}", paths.log.display()), e))?;
        let mut cmd = Command::new(&paths.weftd);
        cmd.arg("--socket")
            .arg(&paths.socket)
            .arg("--state-dir")
            .arg(&paths.state_dir)
            .args(["--metrics-addr", "127.0.0.1:9384", "--node-name", node_name])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        enter_in_child(&mut cmd, node)?;
        let child = cmd
            .spawn()
            .map_err(|e| LabError::io(format!("starting {}", paths.weftd.display()), e))?;
        let mut d = Self {
            child: Some(child),
            paths,
        };
        d.wait_serving(Duration::from_secs(15))?;
        Ok(d)
    }

    fn wait_serving(&mut self, limit: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.paths.socket).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                return Err(LabError::Command {
                    what: "weftd exited at start".into(),
                    detail: format!("{st}; see {}", self.paths.log.display()),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(LabError::Command {
            what: "weftd did not start serving".into(),
            detail: self.paths.log.display().to_string(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops weftd with SIGTERM (it finishes teardowns in flight) and waits.
    pub fn stop(mut self) -> Result<(), LabError> {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            c.wait().map_err(|e| LabError::io("waiting for weftd", e))?;
        }
        Ok(())
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
