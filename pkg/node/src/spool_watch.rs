//! Spooled DELs replayed as they land. The plugin spools a DEL when it cannot reach
//! weftd; the start-up replay and the reconcile pass pick such files up, but a plugin
//! that gave up connecting just before weftd bound its socket writes its file just
//! after the start-up replay read the spool, and would wait for the next reconcile
//! pass. A watch (inotify, through `notify`) taken on the spool directory before the
//! start-up replay closes that window: every entry that lands after it is announced,
//! and replayed as soon as weftd serves.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;
use tracing::info;
use weft_daemon::spool::DelSpool;

use crate::metrics::NodeMetrics;

/// The DEL spool of the node's socket, counting its replays.
pub fn del_spool(config: &crate::config::NodeConfig, metrics: &NodeMetrics) -> Arc<DelSpool> {
    let replayed = metrics.del_spool_replayed.clone();
    Arc::new(
        DelSpool::new(weft_cni::spool::dir_for_socket(&config.socket)).on_replayed(Arc::new(move |n| {
            replayed.inc_by(n);
        })),
    )
}

/// A watch on the DEL spool directory, taken before the start-up replay reads it, so a
/// DEL spooled at any moment after is replayed at once ([`replay_as_they_land`]).
/// Without one (inotify unavailable), such a DEL waits for the reconcile pass, as the
/// warning says.
pub fn watch(spool: &DelSpool) -> Option<SpoolWatch> {
    match SpoolWatch::new(spool.dir()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %spool.dir().display(), error = %e, "cannot watch the DEL spool; a DEL spooled while weftd serves waits for the reconcile pass");
            None
        }
    }
}

/// Runs `replay` (the handler's replay of the spool) each time an entry lands, until
/// `stop`.
pub async fn replay_as_they_land<F, Fut>(watch: SpoolWatch, replay: F, stop: impl Future<Output = ()>)
where
    F: Fn() -> Fut,
    Fut: Future<Output = weft_daemon::spool::Replayed>,
{
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = watch.landed() => {
                let spooled = replay().await;
                if spooled.replayed + spooled.failed + spooled.set_aside > 0 {
                    info!(?spooled, "a DEL landed in the spool: replayed");
                }
            }
        }
    }
}

/// A watch on the DEL spool directory.
pub struct SpoolWatch {
    landed: Arc<Notify>,
    _watcher: notify::RecommendedWatcher,
}

impl SpoolWatch {
    /// Watches `dir` (made, root-only, when it is missing: the plugin would make it so).
    pub fn new(dir: &Path) -> Result<Self, notify::Error> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(notify::Error::io)?;
            std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .map_err(notify::Error::io)?;
        }
        let landed = Arc::new(Notify::new());
        let tell = landed.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let entry = match res {
                Ok(ev) => lands_an_entry(&ev),
                // An overflowed queue: only a replay can tell what is there.
                Err(_) => true,
            };
            if entry {
                tell.notify_one();
            }
        })?;
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
        Ok(SpoolWatch {
            landed,
            _watcher: watcher,
        })
    }

    /// Resolves once an entry has landed since the last call (or since the watch was
    /// taken, for the first): a notification is kept until it is awaited.
    pub async fn landed(&self) {
        self.landed.notified().await
    }
}

/// Whether an event is a spool entry appearing: written in place or renamed into the
/// directory (the plugin writes a temporary file and renames it to `*.del`).
fn lands_an_entry(ev: &notify::Event) -> bool {
    let kind = matches!(ev.kind, EventKind::Create(_) | EventKind::Modify(_) | EventKind::Any);
    kind && ev.paths.iter().any(|p| p.extension().is_some_and(|x| x == "del"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_entry_renamed_into_the_spool_is_announced_and_temporaries_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("del-spool");
        let watch = SpoolWatch::new(&spool).unwrap();
        assert!(spool.is_dir(), "made when missing");
        // A temporary file alone announces nothing.
        std::fs::write(spool.join(".tmp-1"), "x").unwrap();
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(300), watch.landed()).await;
        assert!(quiet.is_err(), "a temporary file is not an entry");
        // Renamed to an entry: announced, even though nobody was waiting yet.
        std::fs::rename(spool.join(".tmp-1"), spool.join("a.del")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.landed())
            .await
            .expect("the entry is announced");
    }
}
