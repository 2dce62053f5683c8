//! Named network namespaces (`/run/netns/<name>`), made the way `ip netns add` makes
//! them (a bind mount under a shared `/run/netns`) so every other tool sees them, and
//! removed on drop. Made in-process ([`weft_kernel::create_named`], which weftd uses
//! too) rather than by running `ip`: a lab of thousands of pods makes one per pod, and
//! `ip -n` copies the whole mount table (one mount per namespace) into a mount
//! namespace of its own at every call, a cost that grows with the lab.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

use weft_kernel::{NetNs, in_netns};

use crate::HarnessError;

/// Unmounts and removes the namespace at `/run/netns/<name>` (see
/// [`weft_kernel::delete_named`]).
fn unmount(name: &str) -> Result<(), HarnessError> {
    Ok(weft_kernel::delete_named(name)?)
}

/// A named network namespace; deleted on drop when this process created it and did
/// not [keep](NamedNetns::keep) it.
#[derive(Debug)]
pub struct NamedNetns {
    name: String,
    keep: bool,
}

impl NamedNetns {
    /// Creates the namespace `name` with `lo` up; fails if it exists.
    pub fn create(name: &str) -> Result<Self, HarnessError> {
        weft_kernel::create_named(name, || Ok(()))?;
        Ok(Self {
            name: name.to_string(),
            keep: false,
        })
    }

    /// A handle on an existing namespace `name`, which drop leaves in place.
    pub fn existing(name: &str) -> Self {
        Self {
            name: name.to_string(),
            keep: true,
        }
    }

    /// Whether a namespace `name` exists.
    pub fn exists(name: &str) -> bool {
        Path::new("/run/netns").join(name).exists()
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`, what a runtime passes as `CNI_NETNS`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Opens the namespace, checking that it is one.
    pub fn open(&self) -> Result<NetNs, HarnessError> {
        Ok(NetNs::open(Path::new(&self.path()))?)
    }

    /// Runs `f` inside the namespace (on a fresh thread that exits afterwards) and
    /// returns its answer. Sockets it creates keep the namespace wherever they are used.
    pub fn within<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, HarnessError> {
        let ns = self.open()?;
        Ok(in_netns(&ns, || Ok(f()))?)
    }

    /// A TCP listener bound to `addr` inside the namespace.
    pub fn bind_tcp(&self, addr: &str) -> Result<std::net::TcpListener, HarnessError> {
        self.within(|| std::net::TcpListener::bind(addr))?
            .map_err(|e| HarnessError::io(format!("binding {addr} in {}", self.name), e))
    }

    /// `argv` run inside the namespace through `ip netns exec`, as a person at a shell
    /// runs a tool there (with the namespace's own `/sys`). Processes of weft's own
    /// enter it without `ip` instead: see [`NamedNetns::enter_in_child`].
    pub fn command<I, S>(&self, argv: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    /// Makes `cmd`'s process start inside the namespace (it enters between fork and
    /// exec: no `ip` in between, so nothing is added to the process's start).
    pub fn enter_in_child(&self, cmd: &mut Command) -> Result<(), HarnessError> {
        self.open()?.enter_in_child(cmd);
        Ok(())
    }

    /// Pings `addr` from the namespace until it answers (true) or `within` has passed
    /// (false).
    pub fn wait_reachable(&self, addr: &str, within: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            if self.ping(addr, 1).is_some() {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// One ICMP echo from the namespace to `addr`: its round-trip time in
    /// milliseconds, when answered within `wait_secs`.
    pub fn ping(&self, addr: &str, wait_secs: u32) -> Option<f64> {
        let family = if addr.contains(':') { "-6" } else { "-4" };
        let out = self
            .command(["ping", family, "-n", "-c1", "-W", &wait_secs.to_string(), addr])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.split("time=").nth(1)?.split_whitespace().next()?.parse().ok()
    }

    /// Keeps the namespace after drop (for labs that outlive the command); its name.
    pub fn keep(mut self) -> String {
        self.keep = true;
        std::mem::take(&mut self.name)
    }

    /// Deletes the namespace now, created here or not (as a runtime does after DEL).
    pub fn delete(mut self) -> Result<(), HarnessError> {
        self.keep = true;
        unmount(&self.name)
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        if !self.keep && !self.name.is_empty() {
            let _ = unmount(&self.name);
        }
    }
}
