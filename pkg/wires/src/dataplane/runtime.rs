//! The thread and runtime the data plane runs on, owned by whoever composes the node.

use std::future::Future;
use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Name of the data plane's thread (as `top -H` and `/proc/<pid>/task/*/comm` show it).
pub const THREAD_NAME: &str = "weft-wires";

/// How long stopping waits for blocking work started on the runtime (it starts none).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A current-thread Tokio runtime on a named OS thread of its own, for every task of
/// the data plane (the ends' readers, the frame streams) and the wire server. On one
/// thread a frame goes from pod to stream to socket (and back) without crossing
/// threads: on the daemon's work-stealing pool each hand-off between reader, HTTP/2
/// stream and connection task could wake the other worker (a futex and a context
/// switch); on one thread the daemons spent some 15% less CPU per gigabyte in the
/// two-node lab, and a frame's bytes stay in one core's cache.
///
/// The composing code starts one, gives its [`handle`](Self::handle) to the engine (and
/// so to [`DataPlane`](super::DataPlane)) and runs the wire server on it
/// ([`spawn`](Self::spawn)). [`shutdown`](Self::shutdown), or dropping it, stops the
/// runtime (what still runs there is dropped) and joins the thread.
#[derive(Debug)]
pub struct DataPlaneRuntime {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl DataPlaneRuntime {
    /// Starts the thread and its runtime.
    pub fn start() -> io::Result<Self> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready, started) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name(THREAD_NAME.into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            let _ = ready.send(Ok(rt.handle().clone()));
            // An error means the owner went without a word: stop all the same.
            let _ = rt.block_on(stopped);
            rt.shutdown_timeout(SHUTDOWN_GRACE);
        })?;
        match started.recv() {
            Ok(Ok(handle)) => Ok(Self {
                handle,
                stop: Some(stop),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other("the data plane's thread ended while starting"))
            }
        }
    }

    /// The handle tasks are spawned and sockets registered through.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `task` on this runtime; the wire server goes here, so that its connections
    /// and streams share the thread with the ends' readers.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }

    /// Stops the runtime, dropping the tasks still on it, and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // From a task of this very runtime the thread cannot be waited for: it
            // stops once that task returns.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for DataPlaneRuntime {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Tasks run on the runtime's own named thread, not the caller's.
    #[test]
    fn tasks_run_on_the_named_thread() {
        let rt = DataPlaneRuntime::start().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let me = std::thread::current();
            let _ = tx.send((me.name().map(str::to_string), me.id()));
        });
        let (name, id) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name.as_deref(), Some(THREAD_NAME));
        assert_ne!(id, std::thread::current().id());
        rt.shutdown();
    }

    /// Shutting down drops what still runs there and ends the thread: nothing is left
    /// behind holding the task's state, and the handle takes no more work.
    #[test]
    fn shutdown_stops_tasks_and_the_thread() {
        let rt = DataPlaneRuntime::start().unwrap();
        let held = Arc::new(());
        let (tx, rx) = std::sync::mpsc::channel();
        let state = held.clone();
        rt.spawn(async move {
            let _state = state;
            let _ = tx.send(());
            std::future::pending::<()>().await;
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(Arc::strong_count(&held), 2, "the task holds its state while it runs");
        let handle = rt.handle().clone();
        rt.shutdown();
        assert_eq!(Arc::strong_count(&held), 1, "the task was dropped");
        let late = handle.spawn(async { 1 });
        let probe = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert!(
            probe.block_on(late).unwrap_err().is_cancelled(),
            "a stopped runtime runs nothing"
        );
    }

    /// Dropping it stops it as well.
    #[test]
    fn drop_stops_the_runtime() {
        let rt = DataPlaneRuntime::start().unwrap();
        let held = Arc::new(());
        let state = held.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _state = state;
            let _ = tx.send(());
            std::future::pending::<()>().await;
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        drop(rt);
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
