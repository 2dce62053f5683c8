//! Named network namespaces (`/run/netns/<name>`), made with `ip netns add` so every
//! other tool sees them, and removed on drop.

use std::fs::File;
use std::os::fd::AsFd;
use std::process::Command;

use crate::LabError;

/// A named network namespace this process created; deleted on drop.
#[derive(Debug)]
pub struct NamedNetns {
    name: String,
    keep: bool,
}

fn ip(args: &[&str]) -> Result<(), LabError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| LabError::io(format!("running ip {}", args.join(" ")), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LabError::Command {
            what: format!("ip {}", args.join(" ")),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl NamedNetns {
    /// Creates the namespace `name` with `lo` up.
    pub fn create(name: &str) -> Result<Self, LabError> {
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_string(),
            keep: false,
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A handle on an existing namespace `name`, which drop leaves in place.
    pub fn existing(name: &str) -> Self {
        Self {
            name: name.to_string(),
            keep: true,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Opens the namespace file (for `setns`).
    pub fn open(&self) -> Result<File, LabError> {
        File::open(self.path()).map_err(|e| LabError::io(format!("opening {}", self.path()), e))
    }

    /// A TCP listener bound to `addr` inside the namespace (a short-lived thread
    /// creates the socket there; the socket keeps the namespace wherever it is used).
    pub fn bind_tcp(&self, addr: &str) -> Result<std::net::TcpListener, LabError> {
        let file = self.open()?;
        let bind_addr = addr.to_string();
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            std::net::TcpListener::bind(&bind_addr)
        })
        .join()
        .map_err(|_| LabError::io("binding in a namespace", std::io::Error::other("thread panicked")))?
        .map_err(|e| LabError::io(format!("binding {addr} in {}", self.name), e))
    }

    /// Keeps the namespace after drop (for labs that outlive the command).
    pub fn keep(mut self) -> String {
        self.keep = true;
        std::mem::take(&mut self.name)
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        if !self.keep && !self.name.is_empty() {
            let _ = ip(&["netns", "del", &self.name]);
        }
    }
}

/// Makes a command run inside `ns` (the child enters it between fork and exec).
pub fn enter_in_child(cmd: &mut Command, ns: &NamedNetns) -> Result<(), LabError> {
    let file = ns.open()?;
    // SAFETY: the closure runs in the forked child before exec and only calls setns,
    // which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
        });
    }
    Ok(())
}
