//! The thread that notices changes: inotify events (debounced) and, should one be lost
//! or inotify be unavailable, a full rescan every 2 s.

use std::path::Path;
use std::sync::Weak;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};

use super::{Inner, WIRES_DIR};

/// How often the directory is rescanned whatever inotify says.
const RESCAN: Duration = Duration::from_secs(2);
/// How long to let a burst of file events settle before reloading (an editor's save is
/// several events; one reload is enough).
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Watches the directory and everything under it (`.status/<namespace>/` appear later).
pub(super) fn watch_dir(dir: &Path, events: std_mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    let wires = dir.join(WIRES_DIR);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let relevant = match res {
            Ok(ev) => relevant_event(&ev, &wires),
            // An overflowed queue or a failing watch: only a reload can tell what changed.
            Err(_) => true,
        };
        if relevant {
            let _ = events.send(());
        }
    })?;
    watcher.watch(dir, RecursiveMode::Recursive)?;
    Ok(watcher)
}

/// Whether an event may change what is served. Our own reads (opens, closes without
/// writing, access times) are not, or every reload would trigger the next.
fn relevant_event(ev: &notify::Event, wires: &Path) -> bool {
    match ev.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => return false,
        _ => {}
    }
    ev.paths.is_empty() || ev.paths.iter().any(|p| !p.starts_with(wires))
}

pub(super) fn reload_loop(inner: Weak<Inner>, rx: std_mpsc::Receiver<()>) {
    let mut next_rescan = Instant::now() + RESCAN;
    loop {
        let wait = next_rescan.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(()) => {
                std::thread::sleep(DEBOUNCE);
                loop {
                    match rx.try_recv() {
                        Ok(()) => continue,
                        Err(std_mpsc::TryRecvError::Empty) => break,
                        Err(std_mpsc::TryRecvError::Disconnected) => return,
                    }
                }
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = inner.reload() {
            tracing::warn!(dir = %inner.dir.display(), error = %e, "cannot read the topology directory; serving what was loaded before");
        }
        next_rescan = Instant::now() + RESCAN;
    }
}
