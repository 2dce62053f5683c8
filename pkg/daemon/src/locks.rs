//! Per-container serialisation, and the teardowns DEL has accepted but not finished.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use tokio::sync::{MutexGuard, watch};
use weft_store::AttachmentKey;

/// Calls for the same container run one at a time; calls for different containers run
/// in parallel. Keys are hashed onto a fixed set of locks, so memory stays bounded; two
/// containers sharing a lock only wait for each other.
pub struct KeyedLocks {
    buckets: Vec<tokio::sync::Mutex<()>>,
}

impl KeyedLocks {
    /// `n` locks (rounded up to at least 1).
    pub fn new(n: usize) -> Self {
        Self {
            buckets: (0..n.max(1)).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    /// Waits for and takes the lock of `container_id`.
    pub async fn lock(&self, container_id: &str) -> MutexGuard<'_, ()> {
        let mut h = DefaultHasher::new();
        container_id.hash(&mut h);
        let i = (h.finish() % self.buckets.len() as u64) as usize;
        self.buckets[i].lock().await
    }
}

/// Teardowns in flight: DEL answers once a pod is cut off and finishes removing its
/// veth (which waits for the kernel's RCU grace period) afterwards. Its addresses and
/// interface name stay reserved until then; an ADD for the same key waits here.
#[derive(Default)]
pub struct Teardowns {
    inflight: Mutex<HashMap<AttachmentKey, watch::Receiver<bool>>>,
}

/// Held by the task doing a teardown; finishing or dropping it wakes the waiters.
pub struct TeardownTicket {
    owner: Arc<Teardowns>,
    key: AttachmentKey,
    done: watch::Sender<bool>,
}

impl Teardowns {
    /// Registers a teardown of `key`; `None` when one is already in flight.
    pub fn start(self: &Arc<Self>, key: &AttachmentKey) -> Option<TeardownTicket> {
        let mut m = self.inflight.lock().expect("teardown map lock");
        if m.contains_key(key) {
            return None;
        }
        let (tx, rx) = watch::channel(false);
        m.insert(key.clone(), rx);
        Some(TeardownTicket {
            owner: self.clone(),
            key: key.clone(),
            done: tx,
        })
    }

    /// Whether a teardown of `key` is in flight.
    pub fn pending(&self, key: &AttachmentKey) -> bool {
        self.inflight.lock().expect("teardown map lock").contains_key(key)
    }

    /// How many teardowns are in flight.
    pub fn len(&self) -> usize {
        self.inflight.lock().expect("teardown map lock").len()
    }

    /// Whether none is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until no teardown of `key` is in flight.
    pub async fn wait(&self, key: &AttachmentKey) {
        let rx = self.inflight.lock().expect("teardown map lock").get(key).cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// Waits until every teardown in flight now has finished.
    pub async fn wait_all(&self) {
        let all: Vec<_> = self
            .inflight
            .lock()
            .expect("teardown map lock")
            .values()
            .cloned()
            .collect();
        for mut rx in all {
            let _ = rx.wait_for(|done| *done).await;
        }
    }
}

impl Drop for TeardownTicket {
    fn drop(&mut self) {
        self.owner.inflight.lock().expect("teardown map lock").remove(&self.key);
        let _ = self.done.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: &str) -> AttachmentKey {
        AttachmentKey {
            network: "n".into(),
            container_id: c.into(),
            ifname: "eth0".into(),
        }
    }

    #[tokio::test]
    async fn waiters_wake_when_the_ticket_drops() {
        let t = Arc::new(Teardowns::default());
        let ticket = t.start(&key("a")).unwrap();
        assert!(t.start(&key("a")).is_none());
        assert!(t.pending(&key("a")));
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.wait(&key("a")).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(ticket);
        waiter.await.unwrap();
        assert!(!t.pending(&key("a")));
        t.wait(&key("b")).await; // nothing in flight: returns at once
    }

    #[tokio::test]
    async fn same_container_serialises() {
        let l = KeyedLocks::new(8);
        let g = l.lock("x").await;
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), l.lock("x"))
                .await
                .is_err()
        );
        drop(g);
        let _g = l.lock("x").await;
    }
}
