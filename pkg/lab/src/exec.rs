//! Executing a CNI plugin the way a runtime does: a fresh process per call with the
//! `CNI_*` environment and the config on stdin, stdout captured, timed from fork to
//! exit.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{LabError, NamedNetns, netns::enter_in_child};

/// A plugin binary and where it runs.
#[derive(Debug, Clone)]
pub struct CniExec {
    /// The plugin binary.
    pub plugin: PathBuf,
    /// `CNI_PATH`.
    pub cni_path: String,
}

/// What one call produced.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    /// Exit status code (-1 when killed).
    pub code: i32,
    /// Stdout.
    pub stdout: Vec<u8>,
    /// Wall time from spawn to exit.
    pub elapsed: Duration,
}

impl ExecOutcome {
    /// Whether the call succeeded.
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

impl CniExec {
    /// A plugin at `plugin`, with `CNI_PATH` set to its directory.
    pub fn new(plugin: &Path) -> Self {
        let cni_path = plugin.parent().map(|p| p.display().to_string()).unwrap_or_default();
        Self {
            plugin: plugin.to_path_buf(),
            cni_path,
        }
    }

    /// Runs `command` for `container_id` with `netns` and `ifname`, the process placed
    /// in `node` (the plugin's host side is the node's namespace).
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &self,
        node: &NamedNetns,
        command: &str,
        container_id: &str,
        netns: &str,
        ifname: &str,
        cni_args: &str,
        config: &[u8],
    ) -> Result<ExecOutcome, LabError> {
        let mut cmd = Command::new(&self.plugin);
        // Runtimes pass their own environment; PATH is what plugins rely on (the
        // reference portmap execs iptables through it).
        cmd.env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_ARGS", cni_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if !netns.is_empty() {
            cmd.env("CNI_NETNS", netns);
        }
        enter_in_child(&mut cmd, node)?;
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| LabError::io(format!("starting {}", self.plugin.display()), e))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(config);
        }
        let out = child
            .wait_with_output()
            .map_err(|e| LabError::io("waiting for the plugin", e))?;
        Ok(ExecOutcome {
            code: out.status.code().unwrap_or(-1),
            stdout: out.stdout,
            elapsed: start.elapsed(),
        })
    }
}
