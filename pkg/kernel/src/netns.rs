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
