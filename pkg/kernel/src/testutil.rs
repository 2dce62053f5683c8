//! Throw-away network namespaces for tests: each lives exactly as long as a parked
//! thread that created it, so nothing outlives the test, even when it fails.

use std::path::PathBuf;
use std::sync::mpsc;

use nix::sched::{CloneFlags, unshare};

/// A network namespace owned by a parked thread; dropped with it.
pub struct TempNetns {
    path: PathBuf,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TempNetns {
    /// Creates a new, empty network namespace.
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET): tests need root");
            let tid = nix::unistd::gettid();
            tx.send(PathBuf::from(format!("/proc/{}/task/{tid}/ns/net", std::process::id())))
                .unwrap();
            let _ = stop_rx.recv();
        });
        let path = rx.recv().expect("namespace thread started");
        Self {
            path,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// A path naming the namespace, usable as `CNI_NETNS` while this value lives.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn run<R: Send, F: FnOnce() -> R + Send>(&self, f: F) -> R {
        let ns = crate::NetNs::open(&self.path).expect("namespace is alive");
        crate::in_netns(&ns, || Ok(f())).expect("entered the namespace")
    }
}

impl Default for TempNetns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// True when privileged tests may run. Without root they fail loudly, unless
/// `WEFT_SKIP_PRIVILEGED=1` asks to skip them (then this returns false).
pub fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("WEFT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
        eprintln!("skipping a privileged test: not root and WEFT_SKIP_PRIVILEGED=1");
        return false;
    }
    panic!("this test needs root (network namespaces, netlink); set WEFT_SKIP_PRIVILEGED=1 to skip it explicitly");
}
