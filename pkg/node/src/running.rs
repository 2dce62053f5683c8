//! What a started node runs (servers, loops, threads), in the order the start-up steps
//! started them; [`Running::stop`] ends them in the reverse order, so whatever a part
//! depends on outlives it.

use std::future::Future;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// The node's running parts, each with how to wait for (or make) its end once the
/// node's stop signal has been sent.
#[derive(Default)]
pub struct Running(Vec<(&'static str, BoxFuture<'static, ()>)>);

impl Running {
    /// A task that ends by itself on the stop signal.
    pub fn task<T: Send + 'static>(&mut self, name: &'static str, task: JoinHandle<T>) {
        self.then(name, async move {
            let _ = task.await;
        });
    }

    /// A part whose end is `end` (awaited at shutdown, not before).
    pub fn then(&mut self, name: &'static str, end: impl Future<Output = ()> + Send + 'static) {
        self.0.push((name, Box::pin(end)));
    }

    /// The parts' names in start order.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|(n, _)| *n).collect()
    }

    /// Ends every part, the last started first, each in its own span.
    pub async fn stop(self) {
        for (name, end) in self.0.into_iter().rev() {
            end.instrument(tracing::info_span!("stop", part = name)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn parts_stop_in_reverse_start_order_and_not_before() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut r = Running::default();
        for name in ["runtime", "http", "grpc", "loop"] {
            let log = log.clone();
            r.then(name, async move { log.lock().unwrap().push(name) });
        }
        r.task("spawned", tokio::spawn(async {}));
        assert!(log.lock().unwrap().is_empty(), "nothing ends before stop");
        assert_eq!(r.names(), ["runtime", "http", "grpc", "loop", "spawned"]);
        r.stop().await;
        assert_eq!(*log.lock().unwrap(), ["loop", "grpc", "http", "runtime"]);
    }
}
