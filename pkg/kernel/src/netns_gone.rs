//! Which of many pods' network namespaces are gone, told by the kernel rather than by
//! a `stat` of every path at every look.
//!
//! The wire engine asks at every pass whether each attached pod's namespace still
//! exists (a namespace that vanished without a DEL takes its pod's links at once). With
//! a `stat` per pod that is work of the whole node at every pass, and passes come with
//! every ADD: quadratic in a lab's bring-up. Here a path seen present in a directory
//! that inotify watches stays known present until that directory reports it unlinked
//! or moved away; only paths not known present are looked at. A runtime removes a
//! namespace by unmounting and unlinking its file (`ip netns delete`, containerd,
//! CRI-O), and the unlink is queued on the inotify descriptor before it returns, so a
//! look that starts after a removal sees it, as a `stat` would.
//!
//! Only directories on local file systems whose unlinks inotify reports are watched
//! (tmpfs, ext2/3/4, xfs, btrfs); paths elsewhere (`/proc/<pid>/ns/net`, a network
//! file system) are looked at every time. If inotify cannot be had at all, or its
//! queue overflows, every path is looked at again.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::statfs::{self, FsType};

/// File systems whose unlinks inotify reports: the ones namespace files live on.
const WATCHABLE: [FsType; 5] = [
    statfs::TMPFS_MAGIC,
    statfs::EXT4_SUPER_MAGIC,
    statfs::XFS_SUPER_MAGIC,
    statfs::BTRFS_SUPER_MAGIC,
    FsType(0xEF51), // ext2's old magic; ext3 and ext4 share EXT4_SUPER_MAGIC
];

/// Tells which network namespace paths are gone, looking only at those it does not
/// know present (see the module documentation). Not thread-safe by itself: hold it
/// behind a lock.
#[derive(Debug)]
pub struct GoneNamespaces {
    /// None: inotify could not be had, and every path is looked at.
    inotify: Option<Inotify>,
    /// Each watched directory's spellings by its watch (`/var/run/netns` and
    /// `/run/netns` are one directory, one watch).
    dirs: HashMap<WatchDescriptor, Vec<PathBuf>>,
    /// Directories as spelled by the paths asked about: watched, or not watchable.
    seen_dirs: HashMap<PathBuf, Option<WatchDescriptor>>,
    /// Paths looked at and present, in watched directories, not reported removed since,
    /// as asked (a string's hash, not a path's walk of its components: thousands are
    /// asked about at every pass), each with its directory's watch and its file name.
    present: HashMap<String, (WatchDescriptor, OsString)>,
    /// The same paths by watch and file name, as a removal reports them (one file may
    /// be asked about in several spellings).
    by_name: HashMap<(WatchDescriptor, OsString), Vec<String>>,
    /// How many times a path known present may have gone (a removal reported, a
    /// watched directory gone, the queue overflowed): while it stands, every path
    /// known present still is, and only new paths need a look ([`GoneNamespaces::epoch`]).
    removals: u64,
    /// Whether a path asked about lies where it cannot be watched (looked at every
    /// time, so no epoch speaks for it): as of the last look at every path, and any
    /// new one since.
    unwatched: bool,
}

impl Default for GoneNamespaces {
    fn default() -> Self {
        Self::new()
    }
}

impl GoneNamespaces {
    /// A watcher with no directory watched yet.
    pub fn new() -> Self {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .inspect_err(
                |e| tracing::debug!(error = %e, "no inotify: every pod's namespace is looked at at every pass"),
            )
            .ok();
        Self {
            inotify,
            dirs: HashMap::new(),
            seen_dirs: HashMap::new(),
            present: HashMap::new(),
            by_name: HashMap::new(),
            removals: 0,
            unwatched: false,
        }
    }

    /// A number that moves whenever a path known present may have gone since; `None`
    /// when it cannot tell (no inotify, or a path asked about cannot be watched). While
    /// it stands, a caller that looked at every path before need look only at the new
    /// ones ([`GoneNamespaces::gone_new`]): a pass then costs what moved, not the node.
    pub fn epoch(&mut self) -> Option<u64> {
        self.take_events();
        (self.inotify.is_some() && !self.unwatched).then_some(self.removals)
    }

    /// Those of `paths`, every path the caller asks about, whose namespace file is
    /// gone (what is known of paths no longer asked about may be dropped).
    pub fn gone<'a>(&mut self, paths: &[&'a str]) -> Vec<&'a str> {
        self.unwatched = false;
        let gone = self.look(paths);
        // Paths of pods that left stay known until their files go; bounded by the
        // files of the watched directories, and cut back when far more than asked.
        if self.present.len() > 2 * paths.len() + 64 {
            let asked: HashSet<&str> = paths.iter().copied().collect();
            self.present.retain(|p, _| asked.contains(p.as_str()));
            self.by_name.retain(|_, spellings| {
                spellings.retain(|p| asked.contains(p.as_str()));
                !spellings.is_empty()
            });
        }
        gone
    }

    /// Those of `paths`, paths new since a look at every path, whose namespace file is
    /// gone; what is known of the others stays.
    pub fn gone_new<'a>(&mut self, paths: &[&'a str]) -> Vec<&'a str> {
        self.look(paths)
    }

    fn look<'a>(&mut self, paths: &[&'a str]) -> Vec<&'a str> {
        self.take_events();
        let mut gone = Vec::new();
        for &p in paths {
            if self.present.contains_key(p) {
                continue;
            }
            let path = Path::new(p);
            // The directory is watched before the path is looked at: a removal after
            // the look is then reported.
            let watch = self.watch_dir_of(path);
            if watch.is_none() {
                self.unwatched = true;
            }
            if path.exists() {
                if let (Some(wd), Some(name)) = (watch, path.file_name()) {
                    let key = (wd, name.to_os_string());
                    self.by_name.entry(key.clone()).or_default().push(p.to_string());
                    self.present.insert(p.to_string(), key);
                }
            } else {
                gone.push(p);
            }
        }
        gone
    }

    /// How many paths are known present (for tests).
    pub fn known_present(&self) -> usize {
        self.present.len()
    }

    /// The watch of `path`'s directory, if it is watched (watching it now if it can be).
    fn watch_dir_of(&mut self, path: &Path) -> Option<WatchDescriptor> {
        let inotify = self.inotify.as_ref()?;
        let dir = path.parent()?;
        if let Some(w) = self.seen_dirs.get(dir) {
            return *w;
        }
        let watchable = statfs::statfs(dir).is_ok_and(|s| WATCHABLE.contains(&s.filesystem_type()));
        let wd = if watchable {
            let mask = AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF
                | AddWatchFlags::IN_UNMOUNT
                | AddWatchFlags::IN_ONLYDIR;
            inotify
                .add_watch(dir, mask)
                .inspect_err(|e| tracing::debug!(dir = %dir.display(), error = %e, "cannot watch a namespace directory: its paths are looked at every pass"))
                .ok()
        } else {
            None
        };
        if let Some(wd) = wd {
            self.dirs.entry(wd).or_default().push(dir.to_path_buf());
        }
        self.seen_dirs.insert(dir.to_path_buf(), wd);
        wd
    }

    /// Forgets what the queued events say is gone.
    fn take_events(&mut self) {
        let Some(inotify) = &self.inotify else { return };
        let mut events = Vec::new();
        let mut lost = false;
        loop {
            match inotify.read_events() {
                Ok(batch) if !batch.is_empty() => events.extend(batch),
                // EAGAIN: nothing more queued.
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "reading inotify failed: every namespace is looked at again");
                    lost = true;
                    break;
                }
            }
        }
        if lost {
            self.forget_all();
        }
        for ev in events {
            if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                self.forget_all();
                continue;
            }
            if ev.mask.intersects(
                AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_UNMOUNT
                    | AddWatchFlags::IN_IGNORED,
            ) {
                // The directory itself went: watched again when next asked about.
                if let Some(dirs) = self.dirs.remove(&ev.wd) {
                    for d in dirs {
                        self.seen_dirs.remove(&d);
                    }
                }
                let present = &mut self.present;
                self.by_name.retain(|(wd, _), spellings| {
                    if *wd != ev.wd {
                        return true;
                    }
                    for p in spellings.iter() {
                        present.remove(p);
                    }
                    false
                });
                self.removals += 1;
                continue;
            }
            let Some(name) = ev.name else { continue };
            if let Some(spellings) = self.by_name.remove(&(ev.wd, name)) {
                for p in spellings {
                    self.present.remove(&p);
                }
                self.removals += 1;
            }
        }
    }

    fn forget_all(&mut self) {
        self.present.clear();
        self.by_name.clear();
        self.removals += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, b"").unwrap();
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn a_removed_file_is_gone_at_the_next_look_and_a_new_one_is_looked_at() {
        let dir = scratch_dir();
        let (a, b) = (file(&dir, "a"), file(&dir, "b"));
        let mut w = GoneNamespaces::new();
        assert!(w.gone(&[&a, &b]).is_empty());
        assert_eq!(w.known_present(), 2, "both are known present: not looked at again");
        std::fs::remove_file(&a).unwrap();
        assert_eq!(
            w.gone(&[&a, &b]),
            vec![a.as_str()],
            "the unlink is seen at the next look"
        );
        assert_eq!(w.gone(&[&a, &b]), vec![a.as_str()], "and stays seen");
        file(&dir, "a");
        assert!(w.gone(&[&a, &b]).is_empty(), "made again, it is present");
        // A rename away is a removal too.
        std::fs::rename(&b, dir.join("c")).unwrap();
        assert_eq!(w.gone(&[&a, &b]), vec![b.as_str()]);
        std::fs::remove_dir_all(&*dir).unwrap();
        assert_eq!(
            w.gone(&[&a, &b]),
            vec![a.as_str(), b.as_str()],
            "the directory went with them"
        );
    }

    /// One file asked about in two spellings is known present in both, and a removal
    /// reported once takes both.
    #[test]
    fn a_file_asked_about_in_two_spellings_goes_in_both() {
        let dir = scratch_dir();
        let a = file(&dir, "a");
        let also = format!("{}/./a", dir.display());
        let mut w = GoneNamespaces::new();
        assert!(w.gone(&[&a, &also]).is_empty());
        assert_eq!(w.known_present(), 2);
        std::fs::remove_file(&a).unwrap();
        assert_eq!(w.gone(&[&a, &also]), vec![a.as_str(), also.as_str()]);
        assert_eq!(w.known_present(), 0);
    }

    /// A named namespace as `ip netns` and runtimes keep one, a namespace bind-mounted
    /// on a file, and its removal as they do it: unmount, then unlink.
    #[test]
    fn a_named_namespace_unmounted_and_unlinked_is_gone() {
        if !crate::testutil::privileged() {
            return;
        }
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        let dir = scratch_dir();
        let ns = crate::testutil::TempNetns::new();
        let named = file(&dir, "pod");
        mount(
            Some(ns.path()),
            named.as_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let mut w = GoneNamespaces::new();
        assert!(w.gone(&[&named]).is_empty());
        assert_eq!(w.known_present(), 1);
        umount2(named.as_str(), MntFlags::MNT_DETACH).unwrap();
        std::fs::remove_file(&named).unwrap();
        assert_eq!(w.gone(&[&named]), vec![named.as_str()]);
    }

    #[test]
    fn paths_on_file_systems_without_unlink_events_are_looked_at_every_time() {
        let mut w = GoneNamespaces::new();
        let gone = format!("/proc/{}/ns/net", u32::MAX);
        assert_eq!(w.gone(&["/proc/self/ns/net", &gone]), vec![gone.as_str()]);
        assert_eq!(w.known_present(), 0, "procfs is never trusted to report");
    }

    /// A fresh directory under `base`, removed (anything mounted in it unmounted
    /// first) when the test ends, pass or fail.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
                let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            }
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A scratch directory of this test's own on a tmpfs where there is one
    /// (`/dev/shm` is on any Linux machine; the temporary directory may not be).
    fn scratch_dir() -> Scratch {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let d = Path::new(base).join(format!(
            "weft-gone-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        Scratch(d)
    }

    /// The epoch stands while every path known present still is, whatever new paths
    /// are looked at or files nobody asked about go; it moves once one known present
    /// goes, and a look at the new paths alone keeps what is known of the others.
    #[test]
    fn the_epoch_moves_only_when_a_path_known_present_may_have_gone() {
        let dir = scratch_dir();
        let (a, b, other) = (file(&dir, "a"), file(&dir, "b"), file(&dir, "other"));
        let mut w = GoneNamespaces::new();
        assert!(w.gone(&[&a, &b]).is_empty());
        let e0 = w.epoch().expect("a watched directory gives an epoch");
        let c = file(&dir, "c");
        assert!(w.gone_new(&[&c]).is_empty());
        assert_eq!(w.known_present(), 3, "a look at a new path keeps the others known");
        std::fs::remove_file(&other).unwrap();
        assert_eq!(w.epoch(), Some(e0), "a file nobody asked about went: the epoch stands");
        std::fs::remove_file(&a).unwrap();
        let e1 = w.epoch().expect("still watched");
        assert_ne!(e1, e0, "a path known present went: the epoch moved");
        assert_eq!(
            w.gone(&[&a, &b, &c]),
            vec![a.as_str()],
            "and a look at every path finds it"
        );
        assert_eq!(w.epoch(), Some(e1));
        let gone_dir = dir.join("x").join("y");
        let unwatchable = gone_dir.to_str().unwrap().to_string();
        assert_eq!(w.gone_new(&[&unwatchable]), vec![unwatchable.as_str()]);
        assert_eq!(w.epoch(), None, "a path that cannot be watched: no epoch speaks for it");
        assert!(w.gone(&[&b, &c]).is_empty());
        assert!(w.epoch().is_some(), "a look at every path without it: an epoch again");
        std::fs::remove_dir_all(&*dir).unwrap();
    }
}
