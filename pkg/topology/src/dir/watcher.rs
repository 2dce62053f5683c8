//! The thread that notices changes: inotify events (debounced) and, should one be lost
//! or inotify be unavailable, a full rescan every 2 s (or 100 times as long as the last
//! took, when longer). A burst of events that touched
//! object files and pods' status files only is served file by file; anything else (a
//! new namespace directory, a mounted ConfigMap's swap, an overflowed queue) reloads
//! the whole directory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};

use super::{Inner, STATUS_DIR, WIRES_DIR, is_topology_file};

/// How often the directory is rescanned whatever inotify says.
const RESCAN: Duration = Duration::from_secs(2);
/// How many times its own duration a full rescan waits before the next at least, with
/// inotify watching: the safety net for lost events then costs a node at most about
/// 0.1 % of a core however big the directory grows (a lab of thousands of pods takes
/// tens of milliseconds to read whole), rather than a share that grows with it. At 1 %
/// (100 times), a 5,000-link lab's bring-up still held a rescan every few seconds on
/// every node, each reading the whole directory: work that grew with the lab and with
/// the time it took.
const RESCAN_SHARE: u32 = 1000;
/// The longest the safety net waits, however long a rescan took.
const RESCAN_AT_MOST: Duration = Duration::from_secs(60);
/// The same share without inotify, when the rescan is how changes are seen at all:
/// about 1 % of a core.
const RESCAN_SHARE_UNWATCHED: u32 = 100;

/// When the next full rescan is due after one that took `took`, with inotify watching
/// the directory (`watched`) or not.
fn rescan_after(took: Duration, watched: bool) -> Duration {
    if watched {
        RESCAN.max(took.saturating_mul(RESCAN_SHARE)).min(RESCAN_AT_MOST)
    } else {
        RESCAN.max(took.saturating_mul(RESCAN_SHARE_UNWATCHED))
    }
}

/// How long to let a burst of file events settle before reloading (an editor's save is
/// several events; one reload is enough).
const DEBOUNCE: Duration = Duration::from_millis(50);

/// What a file event asks of the reload thread.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Change {
    /// The object file (top level) at this path was written or removed.
    Object(PathBuf),
    /// Pod `<namespace>/<pod>`'s status file at this path was written or removed.
    Status(PathBuf),
    /// Anything else: only a reload of the whole directory can tell what changed.
    Everything,
}

/// Watches the directory and everything under it (`.status/<namespace>/` appear later).
pub(super) fn watch_dir(dir: &Path, events: std_mpsc::Sender<Change>) -> notify::Result<notify::RecommendedWatcher> {
    let root = dir.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let changes = match res {
            Ok(ev) => classify(&ev, &root),
            // An overflowed queue or a failing watch: only a reload can tell what changed.
            Err(_) => vec![Change::Everything],
        };
        for c in changes {
            let _ = events.send(c);
        }
    })?;
    watcher.watch(dir, RecursiveMode::Recursive)?;
    Ok(watcher)
}

/// What an event may change of what is served (nothing for our own reads: opens,
/// closes without writing, access times, or every reload would trigger the next; nor
/// for the nodes' wire-state files, which nothing serves; nor for the temporary files
/// of a status write, whose rename to the status file is the event that counts).
fn classify(ev: &notify::Event, root: &Path) -> Vec<Change> {
    match ev.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return vec![],
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => return vec![],
        _ => {}
    }
    if ev.paths.is_empty() {
        return vec![Change::Everything];
    }
    let (wires, statuses) = (root.join(WIRES_DIR), root.join(STATUS_DIR));
    ev.paths
        .iter()
        .filter(|p| !p.starts_with(&wires))
        .filter_map(|p| match p.strip_prefix(&statuses) {
            Ok(rel) => {
                let parts: Vec<_> = rel.components().collect();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                match parts.len() {
                    2 if name.starts_with('.') => None,
                    2 if name.ends_with(".json") => Some(Change::Status(p.clone())),
                    _ => Some(Change::Everything),
                }
            }
            Err(_) => match p.strip_prefix(root).map(|rel| rel.components().count()) {
                Ok(1) => {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    if name.starts_with('.') {
                        // A writer's temporary file (its rename is the event that
                        // counts); any other hidden name may be a mounted ConfigMap's
                        // `..data` swapped under the symlinks the loader follows.
                        (!name.ends_with(".tmp")).then_some(Change::Everything)
                    } else if is_topology_file(name) {
                        Some(Change::Object(p.clone()))
                    } else {
                        // Never read.
                        None
                    }
                }
                _ => Some(Change::Everything),
            },
        })
        .collect()
}

/// The reload thread: a reload of what each burst of events changed, and a full rescan
/// when one is due (see [`rescan_after`]; `watched`: whether inotify watches the
/// directory).
pub(super) fn reload_loop(inner: Weak<Inner>, rx: std_mpsc::Receiver<Change>, watched: bool) {
    let mut next_rescan = Instant::now() + RESCAN;
    loop {
        let wait = next_rescan.saturating_duration_since(Instant::now());
        let mut burst = BTreeSet::new();
        match rx.recv_timeout(wait) {
            Ok(c) => {
                burst.insert(c);
                std::thread::sleep(DEBOUNCE);
                loop {
                    match rx.try_recv() {
                        Ok(c) => {
                            burst.insert(c);
                        }
                        Err(std_mpsc::TryRecvError::Empty) => break,
                        Err(std_mpsc::TryRecvError::Disconnected) => return,
                    }
                }
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {
                burst.insert(Change::Everything);
            }
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        let (mut objects, mut statuses): (Vec<&Path>, Vec<&Path>) = (vec![], vec![]);
        for c in &burst {
            match c {
                Change::Object(p) => objects.push(p),
                Change::Status(p) => statuses.push(p),
                Change::Everything => {}
            }
        }
        // A burst of object and status writes (every pod's arrival in a big lab is some)
        // costs the files written, not a read of every file of the directory. Objects
        // first: a Topology new to this burst takes its status along.
        if !burst.contains(&Change::Everything) && inner.reload_objects(&objects) && inner.reload_statuses(&statuses) {
            continue;
        }
        let started = Instant::now();
        if let Err(e) = inner.reload() {
            tracing::warn!(dir = %inner.dir.display(), error = %e, "cannot read the topology directory; serving what was loaded before");
        }
        next_rescan = Instant::now() + rescan_after(started.elapsed(), watched);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, RemoveKind, RenameMode};

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Event {
        let mut e = notify::Event::new(kind);
        e.paths = paths.iter().map(PathBuf::from).collect();
        e
    }

    #[test]
    fn a_slow_rescan_waits_longer_for_the_next() {
        assert_eq!(rescan_after(Duration::from_millis(1), true), RESCAN);
        assert_eq!(rescan_after(Duration::from_millis(3), true), Duration::from_secs(3));
        assert_eq!(rescan_after(Duration::from_millis(50), true), Duration::from_secs(50));
        assert_eq!(rescan_after(Duration::from_millis(200), true), RESCAN_AT_MOST);
        // Without inotify the rescan is how changes are seen: ten times as often.
        assert_eq!(rescan_after(Duration::from_millis(3), false), RESCAN);
        assert_eq!(rescan_after(Duration::from_millis(50), false), Duration::from_secs(5));
        assert_eq!(rescan_after(Duration::from_secs(1), false), Duration::from_secs(100));
    }

    #[test]
    fn status_writes_are_served_file_by_file_and_the_rest_reloads_all() {
        let root = Path::new("/lab");
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        assert_eq!(
            classify(
                &ev(rename, &["/lab/.status/x/.weft-1.tmp", "/lab/.status/x/a.json"]),
                root
            ),
            vec![Change::Status("/lab/.status/x/a.json".into())]
        );
        assert_eq!(
            classify(
                &ev(EventKind::Remove(RemoveKind::File), &["/lab/.status/x/a.json"]),
                root
            ),
            vec![Change::Status("/lab/.status/x/a.json".into())]
        );
        // A status write's temporary file, a node's wire state, our own reads: nothing.
        assert!(
            classify(
                &ev(EventKind::Create(CreateKind::File), &["/lab/.status/x/.weft-2.tmp"]),
                root
            )
            .is_empty()
        );
        assert!(classify(&ev(EventKind::Create(CreateKind::File), &["/lab/.wires/n1.json"]), root).is_empty());
        assert!(classify(&ev(EventKind::Access(AccessKind::Read), &["/lab/topo.yaml"]), root).is_empty());
        // An object file, file by file; a writer's temporary file and a file never read:
        // nothing.
        assert_eq!(
            classify(&ev(rename, &["/lab/.topo.yaml.tmp", "/lab/topo.yaml"]), root),
            vec![Change::Object("/lab/topo.yaml".into())]
        );
        assert_eq!(
            classify(
                &ev(
                    EventKind::Access(AccessKind::Close(AccessMode::Write)),
                    &["/lab/pods.JSON"]
                ),
                root
            ),
            vec![Change::Object("/lab/pods.JSON".into())]
        );
        assert!(classify(&ev(EventKind::Create(CreateKind::File), &["/lab/README.md"]), root).is_empty());
        // A new namespace directory, a ConfigMap's swap, a file in a subdirectory, the
        // directory itself, an event without paths: all.
        for e in [
            ev(rename, &["/lab/..data"]),
            ev(EventKind::Create(CreateKind::File), &["/lab/..2026_11_29/topo.yaml"]),
            ev(EventKind::Remove(RemoveKind::Folder), &["/lab"]),
            ev(EventKind::Create(CreateKind::Folder), &["/lab/.status/y"]),
            ev(EventKind::Other, &[]),
        ] {
            assert_eq!(classify(&e, root), vec![Change::Everything], "{e:?}");
        }
    }
}
