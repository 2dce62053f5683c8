//! Executing a CNI plugin the way a runtime does: a fresh process per call with the
//! `CNI_*` environment (nothing else inherited) and the config on stdin, stdout
//! captured, timed from spawn to exit.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{HarnessError, NamedNetns};

/// The `PATH` a runtime gives plugins (the reference portmap execs iptables through it).
pub const RUNTIME_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The `CNI_*` variables of one call.
#[derive(Debug, Clone, Copy)]
pub struct CniVars<'a> {
    /// `CNI_COMMAND`.
    pub command: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// `CNI_NETNS`, left out when empty (as for DEL after the namespace is gone).
    pub netns: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// `CNI_ARGS`.
    pub args: &'a str,
}

impl<'a> CniVars<'a> {
    /// An ADD of the pod's `eth0` (what a runtime sends when a pod starts).
    pub fn add_eth0(container_id: &'a str, netns: &'a str, args: &'a str) -> Self {
        CniVars {
            command: "ADD",
            container_id,
            netns,
            ifname: "eth0",
            args,
        }
    }

    /// The variables as name and value, with `CNI_PATH` set to `cni_path`.
    pub fn pairs<'b>(&self, cni_path: &'b str) -> impl Iterator<Item = (&'static str, &'b str)> + use<'b>
    where
        'a: 'b,
    {
        [
            ("CNI_COMMAND", self.command),
            ("CNI_CONTAINERID", self.container_id),
            ("CNI_IFNAME", self.ifname),
            ("CNI_PATH", cni_path),
            ("CNI_ARGS", self.args),
        ]
        .into_iter()
        .chain((!self.netns.is_empty()).then_some(("CNI_NETNS", self.netns)))
    }

    /// The variables as owned name and value pairs, with `CNI_PATH` set to `cni_path`.
    pub fn env(&self, cni_path: &str) -> Vec<(String, String)> {
        self.pairs(cni_path)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// Where and how a call runs, beyond its environment and input.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallOptions<'a> {
    /// The namespace the plugin process starts in (the plugin's host side); the
    /// caller's when `None`.
    pub node: Option<&'a NamedNetns>,
    /// The user it runs as; the caller's when `None`.
    pub uid: Option<u32>,
    /// Capture stderr too (else it goes nowhere).
    pub capture_stderr: bool,
    /// Kill the plugin and fail when it runs longer than this. The watch costs a
    /// thread, so timed calls leave it unset.
    pub limit: Option<Duration>,
}

/// What one call produced.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    /// Exit status code (-1 when killed by a signal).
    pub code: i32,
    /// Stdout.
    pub stdout: Vec<u8>,
    /// Stderr, when captured.
    pub stderr: Vec<u8>,
    /// Wall time from spawn to exit.
    pub elapsed: Duration,
}

impl ExecOutcome {
    /// Whether the call succeeded.
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

/// A plugin binary, executed as a runtime executes it.
#[derive(Debug, Clone)]
pub struct CniExec {
    /// The plugin binary.
    pub plugin: PathBuf,
    /// `CNI_PATH` for [`CniExec::call`]: the plugin's directory.
    pub cni_path: String,
    /// `nsenter`, when [`CniExec::call`] goes through it into the node's namespace (as a
    /// runtime in another namespace execs a plugin) instead of the child entering the
    /// namespace itself before its exec.
    pub nsenter: Option<PathBuf>,
}

impl CniExec {
    /// The plugin at `plugin`, with `CNI_PATH` set to its directory.
    pub fn new(plugin: &Path) -> Self {
        let cni_path = plugin.parent().map(|p| p.display().to_string()).unwrap_or_default();
        Self {
            plugin: plugin.to_path_buf(),
            cni_path,
            nsenter: None,
        }
    }

    /// Calls go through `nsenter` (the binary at that path) into the node's network
    /// namespace: one more exec per call, as a runtime outside the node's namespace pays.
    pub fn through_nsenter(mut self, nsenter: Option<PathBuf>) -> Self {
        self.nsenter = nsenter;
        self
    }

    /// One call as a runtime makes it, inside `node`: `vars` and [`RUNTIME_PATH`] as
    /// the whole environment, `config` on stdin, stderr dropped.
    pub fn call(&self, node: &NamedNetns, vars: &CniVars<'_>, config: &[u8]) -> Result<ExecOutcome, HarnessError> {
        let env = std::iter::once(("PATH", RUNTIME_PATH)).chain(vars.pairs(&self.cni_path));
        self.run(
            env,
            config,
            CallOptions {
                node: Some(node),
                ..CallOptions::default()
            },
        )
    }

    /// Runs the plugin with exactly `env` as its environment and `stdin` as its input.
    pub fn run<I, K, V>(&self, env: I, stdin: &[u8], opts: CallOptions<'_>) -> Result<ExecOutcome, HarnessError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let through = self.nsenter.as_ref().zip(opts.node);
        let mut cmd = match through {
            Some((nsenter, node)) => {
                let mut c = Command::new(nsenter);
                c.arg(format!("--net={}", node.path())).arg("--").arg(&self.plugin);
                c
            }
            None => Command::new(&self.plugin),
        };
        cmd.env_clear()
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if opts.capture_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        // Only when asked: it makes std fork instead of posix_spawn.
        if let Some(uid) = opts.uid {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        }
        let start = Instant::now();
        let spawn = |cmd: &mut Command| {
            cmd.spawn()
                .map_err(|e| HarnessError::io(format!("starting {}", self.plugin.display()), e))
        };
        // Into the node's namespace: spawned from a thread that entered it, so the child
        // starts there without a hook between fork and exec, which would make std copy
        // the caller's whole address space (a lab of thousands of pods is a big caller)
        // instead of using posix_spawn.
        let mut child = match (opts.node, through) {
            (Some(node), None) => {
                let ns = node.open()?;
                weft_kernel::in_netns(&ns, || Ok(spawn(&mut cmd)))??
            }
            _ => spawn(&mut cmd)?,
        };
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin);
        }
        let out = match opts.limit {
            None => child.wait_with_output(),
            Some(limit) => {
                let pid = child.id();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(child.wait_with_output());
                });
                match rx.recv_timeout(limit) {
                    Ok(out) => out,
                    Err(_) => {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                        return Err(HarnessError::TimedOut {
                            what: self.plugin.display().to_string(),
                            limit,
                        });
                    }
                }
            }
        }
        .map_err(|e| HarnessError::io("waiting for the plugin", e))?;
        Ok(ExecOutcome {
            code: out.status.code().unwrap_or(-1),
            stdout: out.stdout,
            stderr: out.stderr,
            elapsed: start.elapsed(),
        })
    }
}
