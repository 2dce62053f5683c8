//! Network namespaces: opening and checking a namespace path, and running work
//! inside one on a thread of its own ([`in_netns`], the only place a thread of weft's
//! enters a namespace) or in a child process ([`NetNs::enter_in_child`]).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use crate::KernelError;

const NSFS_MAGIC: i64 = 0x6e73_6673;
// NS_GET_NSTYPE = _IO(0xb7, 0x3)
nix::ioctl_none!(ns_get_nstype, 0xb7, 0x3);

/// An open network namespace.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    path: PathBuf,
}

impl NetNs {
    /// Opens `path` and checks that it is a network namespace (a file on nsfs whose
    /// namespace type is `CLONE_NEWNET`).
    pub fn open(path: &Path) -> Result<Self, KernelError> {
        let invalid = |reason: String| KernelError::InvalidNetns {
            path: path.display().to_string(),
            reason,
        };
        let file = File::open(path).map_err(|e| {
            invalid(match e.kind() {
                std::io::ErrorKind::NotFound => "does not exist".to_string(),
                _ => format!("cannot be opened: {e}"),
            })
        })?;
        let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| invalid(format!("statfs: {e}")))?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(invalid(format!(
                "is not a namespace file (filesystem magic {:#x})",
                fs.filesystem_type().0
            )));
        }
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd.
        let kind = unsafe { ns_get_nstype(file.as_raw_fd()) }.map_err(|e| invalid(format!("NS_GET_NSTYPE: {e}")))?;
        if kind != libc::CLONE_NEWNET {
            return Err(invalid("is a namespace, but not a network namespace".to_string()));
        }
        Ok(Self {
            fd: file.into(),
            path: path.to_path_buf(),
        })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self, KernelError> {
        Self::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw descriptor, for `IFLA_NET_NS_FD`.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Moves the calling thread into this namespace. Only for threads that will exit
    /// afterwards (see [`in_netns`]).
    fn enter(&self) -> Result<(), KernelError> {
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| KernelError::os(format!("entering network namespace {}", self.path.display()), e.into()))
    }

    /// Makes the process `cmd` spawns start inside this namespace: the child enters it
    /// between fork and exec, so no thread of the caller ever switches. The handle moves
    /// into the command and closes with it (its descriptor is close-on-exec).
    pub fn enter_in_child(self, cmd: &mut std::process::Command) {
        // SAFETY: the closure runs in the forked child before exec and only calls
        // setns(2), which is async-signal-safe; it allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
            });
        }
    }

    /// Whether two handles name the same namespace (same nsfs inode).
    pub fn same_as(&self, other: &NetNs) -> bool {
        let a = nix::sys::stat::fstat(self.fd.as_fd());
        let b = nix::sys::stat::fstat(other.fd.as_fd());
        matches!((a, b), (Ok(a), Ok(b)) if a.st_ino == b.st_ino && a.st_dev == b.st_dev)
    }
}

/// Runs `f` on a fresh OS thread that has entered `ns`, waits for it, and returns its
/// answer. The thread exits afterwards, so the namespace switch cannot leak.
pub fn in_netns<R, F>(ns: &NetNs, f: F) -> Result<R, KernelError>
where
    R: Send,
    F: FnOnce() -> Result<R, KernelError> + Send,
{
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("weft-netns".into())
            .spawn_scoped(s, || {
                ns.enter()?;
                f()
            })
            .map_err(|e| KernelError::os("spawning a namespace thread", e))?
            .join()
            .unwrap_or_else(|_| Err(KernelError::os("namespace thread", std::io::Error::other("panicked"))))
    })
}

/// Where named namespaces are mounted (iproute2's `NETNS_RUN_DIR`).
pub const RUN_DIR: &str = "/run/netns";

fn mount_error(what: impl Into<String>) -> impl FnOnce(nix::Error) -> KernelError {
    let what = what.into();
    move |e| KernelError::os(what, e.into())
}

/// Makes [`RUN_DIR`] a shared mount point, as `ip netns add` does, so that a namespace
/// mounted there is seen from every mount namespace (`ip netns exec`'s among them).
fn shared_run_dir() -> Result<(), KernelError> {
    use nix::mount::{MsFlags, mount};
    // Once per process is enough; a failure is tried again at the next create.
    static DONE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return Ok(());
    }
    std::fs::create_dir_all(RUN_DIR).map_err(|e| KernelError::os(format!("creating {RUN_DIR}"), e))?;
    let shared = || {
        mount(
            None::<&str>,
            RUN_DIR,
            Some("none"),
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    if let Err(nix::Error::EINVAL) = shared() {
        // Not a mount point yet: bind it onto itself first.
        mount(
            Some(RUN_DIR),
            RUN_DIR,
            Some("none"),
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(mount_error("making /run/netns a mount point"))?;
        shared().map_err(mount_error("making /run/netns a shared mount"))?;
    }
    *done = true;
    Ok(())
}

/// Whether `name` can name a namespace under [`RUN_DIR`].
fn valid_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name == "." || name == "..")
}

/// Creates the named network namespace `name` (`/run/netns/<name>`, a bind mount
/// under a shared `/run/netns`, as `ip netns add` makes it, so every other tool sees
/// it) with `lo` up, running `init` inside it before it is used; fails if it exists.
/// Made in-process rather than by running `ip`: `ip` copies the whole mount table into
/// a mount namespace of its own at every call, a cost that grows with the namespaces.
/// Nothing is left behind when a step fails.
pub fn create_named(name: &str, init: impl FnOnce() -> Result<(), KernelError> + Send) -> Result<PathBuf, KernelError> {
    use std::os::unix::fs::OpenOptionsExt;
    if !valid_name(name) {
        return Err(KernelError::InvalidNetns {
            path: name.to_string(),
            reason: "not a valid namespace name".into(),
        });
    }
    shared_run_dir()?;
    let path = Path::new(RUN_DIR).join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o0)
        .open(&path)
        .map_err(|e| KernelError::os(format!("creating network namespace {name}"), e))?;
    let made = mount_new(&path).and_then(|()| in_netns(&NetNs::open(&path)?, init));
    if let Err(e) = made {
        let _ = delete_named(name);
        return Err(e);
    }
    Ok(path)
}

/// Makes a new network namespace on a thread of its own and mounts it at `path` (an
/// empty file made for it), with `lo` up.
fn mount_new(path: &Path) -> Result<(), KernelError> {
    use nix::mount::{MsFlags, mount};
    let shown = path.display().to_string();
    std::thread::scope(|s| {
        s.spawn(|| -> Result<(), KernelError> {
            // Only this thread moves; it ends right after.
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(mount_error(format!("making {shown}")))?;
            let own = format!("/proc/self/task/{}/ns/net", nix::unistd::gettid());
            mount(Some(own.as_str()), path, Some("none"), MsFlags::MS_BIND, None::<&str>)
                .map_err(mount_error(format!("mounting {shown}")))?;
            let mut nl = crate::Netlink::new().map_err(|e| KernelError::os("opening netlink", e))?;
            let lo = nl
                .link_by_name("lo")
                .and_then(|lo| lo.ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENODEV)))
                .map_err(|e| KernelError::os(format!("finding lo in {shown}"), e))?;
            nl.set_up(lo.index, true)
                .map_err(|e| KernelError::os(format!("setting lo up in {shown}"), e))
        })
        .join()
        .unwrap_or_else(|_| {
            Err(KernelError::os(
                format!("making {shown}"),
                std::io::Error::other("panicked"),
            ))
        })
    })
}

/// Deletes the named namespace `name` (as `ip netns del`: processes and sockets still
/// in it keep it alive; the name goes at once). One that does not exist is no error.
pub fn delete_named(name: &str) -> Result<(), KernelError> {
    use nix::mount::{MntFlags, umount2};
    if !valid_name(name) {
        return Ok(());
    }
    let path = Path::new(RUN_DIR).join(name);
    match umount2(&path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
        Err(e) => return Err(mount_error(format!("unmounting {}", path.display()))(e)),
    }
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(KernelError::os(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}
