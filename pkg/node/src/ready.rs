//! When the node is ready (`/readyz`): once the topology and node caches are filled
//! (an ADD must find its topology) and, in a cluster, this node has its podCIDRs (an
//! ADD needs addresses to give); and for as long as the state store can write (a node
//! that cannot record an attachment cannot take pods).

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;
use weft_telemetry::Readiness;

/// What `/readyz` answers while the store cannot write.
pub const STORE_CANNOT_WRITE: &str = "the state store cannot be written";

/// Makes `ready` require `writable` (the store's [`weft_store::Store::writable`]) at
/// every `/readyz`, so a store that stops writing turns the node not ready at once and
/// one that writes again turns it back.
pub fn require_writable_store(ready: &Readiness, writable: impl Fn() -> bool + Send + Sync + 'static) {
    ready.require(STORE_CANNOT_WRITE, writable);
}

/// While the store cannot write, sends it a probe write every `every` until `stop`, so
/// a node whose disk has room again turns ready without waiting for a CNI call to write.
/// Each time the store turns writable again (through the probe or any other write),
/// runs `on_writable`: the node replays the DELs the store could not record meanwhile,
/// so their addresses are released at once rather than at the next reconcile pass.
pub async fn probe_unwritable_store<F, Fut>(
    store: weft_store::Store,
    every: Duration,
    stop: impl Future<Output = ()>,
    on_writable: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writable = Some(store.writable_watch());
    if let Some(w) = &mut writable {
        w.borrow_and_update();
    }
    tokio::pin!(stop);
    loop {
        let changed = async {
            match &mut writable {
                Some(w) => w.changed().await.map(|()| *w.borrow_and_update()),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            now = changed => {
                match now {
                    Ok(true) => on_writable().await,
                    Ok(false) => {}
                    // The store went down: nothing turns it writable again.
                    Err(_) => writable = None,
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        if store.writable() {
            continue;
        }
        match store.run(|db| db.probe_write()).await {
            Ok(()) => info!("the state store takes writes again"),
            Err(e) => tracing::debug!(error = %e, "the state store still cannot write"),
        }
    }
}

/// Sets `ready` once `caches_synced` says so and, when `need_ranges`, once `view` holds
/// this node's pod ranges; says once that it waits for them. Ends early (never ready)
/// when the node network stops.
pub fn when_synced(
    ready: Readiness,
    caches_synced: impl Fn() -> bool + Send + 'static,
    mut view: watch::Receiver<weft_nodenet::NodeView>,
    need_ranges: bool,
    node: String,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while !caches_synced() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        info!("topology and node caches synced");
        if need_ranges {
            let mut said = false;
            loop {
                if !view.borrow_and_update().ranges.is_empty() {
                    break;
                }
                if !said {
                    info!(node = %node, "waiting for this node's podCIDRs (spec.podCIDRs of its Node) before serving ADDs");
                    said = true;
                }
                if view.changed().await.is_err() {
                    return;
                }
            }
        }
        ready.set(true);
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn settle() -> tokio::time::Sleep {
        tokio::time::sleep(Duration::from_millis(300))
    }

    #[tokio::test]
    async fn ready_after_the_caches_and_then_the_pod_ranges() {
        let ready = Readiness::default();
        let synced = Arc::new(AtomicBool::new(false));
        let (tx, rx) = watch::channel(weft_nodenet::NodeView::default());
        let s = synced.clone();
        let task = when_synced(ready.clone(), move || s.load(Ordering::Relaxed), rx, true, "n1".into());
        settle().await;
        assert!(!ready.get(), "ready before the caches are filled");
        synced.store(true, Ordering::Relaxed);
        settle().await;
        assert!(!ready.get(), "ready without podCIDRs");
        tx.send_modify(|v| v.ranges = vec!["10.244.1.0/24".parse().unwrap()]);
        task.await.unwrap();
        assert!(ready.get());
    }

    #[tokio::test]
    async fn without_a_cluster_the_caches_are_enough() {
        let ready = Readiness::default();
        let (_tx, rx) = watch::channel(weft_nodenet::NodeView::default());
        when_synced(ready.clone(), || true, rx, false, "n1".into())
            .await
            .unwrap();
        assert!(ready.get());
    }

    #[tokio::test]
    async fn a_store_that_cannot_write_is_not_ready() {
        let ready = Readiness::default();
        ready.set(true);
        let writable = Arc::new(AtomicBool::new(true));
        let w = writable.clone();
        require_writable_store(&ready, move || w.load(Ordering::Relaxed));
        assert!(ready.get());
        writable.store(false, Ordering::Relaxed);
        assert_eq!(ready.failing(), Some(STORE_CANNOT_WRITE));
        assert!(!ready.get());
        writable.store(true, Ordering::Relaxed);
        assert!(ready.get());
    }

    /// A full disk, then room again: the probe's write turns the store writable, and
    /// `on_writable` runs once for it.
    #[tokio::test]
    async fn the_probe_turns_a_store_writable_again_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let store = weft_store::Store::open(&dir.path().join("weft.db")).unwrap();
        store.run(|db| db.begin_run("test").map(|_| ())).await.unwrap();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let calls = calls.clone();
            tokio::spawn(probe_unwritable_store(
                store.clone(),
                Duration::from_millis(50),
                async {
                    let _ = stopped.await;
                },
                move || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    async {}
                },
            ))
        };
        let full = store.run(|_| Err::<(), _>(weft_store::StoreError::disk_full())).await;
        assert!(full.is_err());
        assert!(!store.writable());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while calls.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(store.writable(), "the probe's write went through");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Writes that find it writable already do not call it again.
        store.run(|db| db.probe_write()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let _ = stop.send(());
        task.await.unwrap();
    }

    /// The check as the node wires it, over a real store that goes down.
    #[tokio::test]
    async fn a_real_store_without_its_writer_turns_the_node_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let die = Arc::new(AtomicBool::new(false));
        let observer: weft_store::Observer = {
            let die = die.clone();
            Arc::new(move |_| assert!(!die.load(Ordering::SeqCst), "the store goes down (test)"))
        };
        let store = weft_store::Store::open_observed(&dir.path().join("weft.db"), Some(observer)).unwrap();
        let ready = Readiness::default();
        ready.set(true);
        let s = store.clone();
        require_writable_store(&ready, move || s.writable());
        assert!(ready.get(), "a fresh store writes");
        die.store(true, Ordering::SeqCst);
        let _ = store.run(|db| db.counts()).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while ready.get() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ready.failing(), Some(STORE_CANNOT_WRITE));
        assert!(!ready.get());
    }
}
